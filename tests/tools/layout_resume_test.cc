// Checkpoints free of layout, end to end (plan/checkpoint_layout.h): a
// checkpoint written by one plan of a model resumes on a plan of any other
// layout of the same model and optimizer (mesh, schedule, ZeRO stage, rank
// count), and the two runs together end where one device training straight
// through ends. Each case trains plan A for 2 steps, resumes plan B from its
// checkpoint for 2 more and compares B's checkpoint with the unbroken 4-step
// run of the one-device plan: every tensor in both, of one type, and within a
// relative 1e-5 (largest difference over the largest value), since the plans
// add in other orders than one device. The data is the same for every plan:
// the synthetic batches of seed 0 are drawn whole, then split over replicas
// and micro-batches.
//
// LayoutResumeTest runs every device as a thread of one process (the tools
// suite); LayoutResumeMpiTest runs plans under mpirun (the mpi suite) and
// skips itself, saying why, without an MPI build or mpirun. The checkpoints
// are read with serialization::read_checkpoint and their pieces joined here
// from the layout record alone (not with plan::join_checkpoint), so that
// the test checks the record as well as the runs.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "graph/host_tensor.h"
#include "runtime/comm/mpi_world.h"
#include "serialization/checkpoint.h"
#include "serialization/plan_io.h"
#include "tests/tools/cli_util.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using testing::Outcome;
using testing::quote;
using testing::strata_binary;

// As `strata verify` compares a plan's tensors with one device's.
constexpr double kTolerance = 1e-5;
// The model and options every plan of the pairs is compiled from: a GPT whose
// widths split over 4 tensor-parallel members (hidden 32, 4 heads, MLP 128,
// vocabulary 64) and whose batch of 8 splits over 4 replicas or 2 replicas
// of 2 micro-batches; SGD with momentum, so ZeRO-1 has state to shard.
const std::vector<std::string> kGpt = {"zoo",     "gpt", "--layers", "2",       "--hidden", "32",
                                       "--heads", "4",   "--seq",    "8",       "--vocab",  "64",
                                       "--batch", "8",   "-o",       "g.strata"};
const std::vector<std::string> kOptimizer = {"--optimizer", "sgd:lr=0.1,momentum=0.9"};

std::string mpirun_path() {
  if (const char *path = std::getenv("STRATA_MPIRUN"); path && *path) return path;
  for (const char *dir : {"/usr/bin", "/usr/local/bin"})
    if (fs::exists(fs::path(dir) / "mpirun")) return (fs::path(dir) / "mpirun").string();
  return {};
}

std::string command_of(const std::vector<std::string> &args) {
  std::string command = quote(strata_binary().string());
  for (const std::string &arg : args)
    command += " " + quote(arg);
  return command;
}

// Runs `command` in `dir`; mpirun refuses root without these (CI containers
// run as root), and they change nothing else.
Outcome shell_in(const fs::path &dir, const std::string &command) {
  return testing::run_in(
      dir, "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 && " + command);
}

std::string joined(const std::vector<std::string> &words) {
  std::string text;
  for (const std::string &word : words)
    text += (text.empty() ? "" : " ") + word;
  return text;
}

// "step 3/4  loss 2.6554" lines: the loss of each step printed.
std::map<int64_t, double> losses(const std::string &out) {
  std::map<int64_t, double> found;
  static const std::regex line(R"(step (\d+)/\d+  loss (\S+))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator();
       ++it)
    found[std::stoll((*it)[1].str())] = std::strtod((*it)[2].str().c_str(), nullptr);
  return found;
}

// The line `strata run --resume CKPT` prints: "resumed    CKPT at step K",
// and after a checkpoint of another layout " (resharded from DESCRIPTION)".
struct Resumed {
  bool found = false;     // the line, with this folder and step
  bool resharded = false; // with " (resharded from ...)"
  std::string from;       // the description of the layout that wrote it
  std::string rest;       // what followed the step
};

Resumed resumed_line(const std::string &out, const std::string &checkpoint, int64_t step) {
  const std::string head = str_cat("resumed    ", checkpoint, " at step ", step);
  Resumed line;
  size_t at = out.find(head);
  while (at != std::string::npos && at != 0 && out[at - 1] != '\n')
    at = out.find(head, at + 1);
  if (at == std::string::npos) return line;
  const size_t end = out.find('\n', at);
  line.rest = out.substr(at + head.size(),
                         end == std::string::npos ? std::string::npos : end - at - head.size());
  const std::string open = " (resharded from ";
  if (!line.rest.empty() && !line.rest.starts_with(open)) return line; // another step: "at step 20"
  line.found = true;
  if (line.rest.starts_with(open) && line.rest.ends_with(")") &&
      line.rest.size() > open.size() + 1) {
    line.resharded = true;
    line.from = line.rest.substr(open.size(), line.rest.size() - open.size() - 1);
  }
  return line;
}

std::vector<std::byte> bytes_of(const HostTensor &tensor) {
  if (tensor.size_bytes() == 0) return {};
  return std::vector<std::byte>(tensor.data(), tensor.data() + tensor.size_bytes());
}

HostTensor tensor_of(const TensorType &type, const std::vector<std::byte> &bytes) {
  HostTensor tensor = HostTensor::zeros(type);
  if (!bytes.empty()) std::memcpy(tensor.data(), bytes.data(), bytes.size());
  return tensor;
}

// Every tensor of `checkpoint` (read from `dir`) whole, by name, put together
// from the layout record alone: ZeRO-1 shards "<piece>@shard<i>of<n>" are
// flat runs of their piece's bytes, in order; tensor-parallel pieces
// "<name>@tp<m>of<T>" are cut as plan::copy_piece cuts them: the whole
// tensor along the record's `dim` viewed as [outer, T, m], member m's piece
// the runs of its index. What cannot be put together is a failure of the
// test, named. The whole tensors are then exactly the record's tensors, at
// its types.
std::map<std::string, HostTensor> whole_tensors(const serialization::Checkpoint &checkpoint,
                                                const fs::path &dir) {
  static const std::regex piece_name(R"((.*?)(@tp(\d+)of(\d+))?(@shard(\d+)of(\d+))?)");
  const auto &record = checkpoint.layout.tensors;
  std::map<std::string, HostTensor> whole;
  // The shards of each piece or tensor (its name less "@shard<i>of<n>").
  std::map<std::string, std::map<int, const HostTensor *>> shards;
  std::map<std::string, int> shard_count;
  // Tensor-parallel pieces and sharded tensors, as bytes once shards are joined.
  std::map<std::string, std::vector<std::byte>> pieces;
  for (const auto &[name, tensor] : checkpoint.tensors) {
    std::smatch m;
    if (!std::regex_match(name, m, piece_name)) {
      ADD_FAILURE() << dir << ": tensor '" << name << "' is not a name a checkpoint holds";
      continue;
    }
    const std::string key = m[1].str() + m[2].str();
    if (m[5].matched) {
      const int count = std::stoi(m[7].str());
      const auto it = shard_count.emplace(key, count).first;
      if (it->second != count)
        ADD_FAILURE() << dir << ": tensor '" << name << "': the shards of '" << key
                      << "' disagree on their count (" << it->second << " and " << count << ")";
      shards[key][std::stoi(m[6].str())] = &tensor;
    } else if (m[2].matched) {
      pieces[key] = bytes_of(tensor);
    } else {
      whole.emplace(name, tensor);
    }
  }
  for (const auto &[key, parts] : shards) {
    const int count = shard_count.at(key);
    if (static_cast<int>(parts.size()) != count || parts.begin()->first != 0 ||
        parts.rbegin()->first != count - 1) {
      ADD_FAILURE() << dir << ": '" << key << "' is stored as " << parts.size() << " of its "
                    << count << " shards";
      continue;
    }
    if (pieces.contains(key) || whole.contains(key)) {
      ADD_FAILURE() << dir << ": '" << key << "' is stored both in shards and without";
      continue;
    }
    std::vector<std::byte> bytes;
    for (const auto &[i, part] : parts) {
      const std::vector<std::byte> run = bytes_of(*part);
      bytes.insert(bytes.end(), run.begin(), run.end());
    }
    pieces[key] = std::move(bytes);
  }

  // Tensor-parallel pieces by tensor and member.
  std::map<std::string, std::map<int, std::vector<std::byte>>> members;
  std::map<std::string, int> member_count;
  for (auto &[key, bytes] : pieces) {
    std::smatch m;
    std::regex_match(key, m, piece_name);
    const std::string name = m[1].str();
    const auto found = record.find(name);
    if (found == record.end()) {
      ADD_FAILURE() << dir << ": '" << key << "' is a piece of '" << name
                    << "', which the layout record lacks";
      continue;
    }
    const TensorType &type = found->second.type;
    if (!m[2].matched) { // ZeRO-1 shards of a whole tensor
      if (static_cast<int64_t>(bytes.size()) != type.size_bytes()) {
        ADD_FAILURE() << dir << ": the shards of '" << name << "' hold " << bytes.size()
                      << " bytes, but it is " << type.to_string();
        continue;
      }
      whole.emplace(name, tensor_of(type, bytes));
      continue;
    }
    const int count = std::stoi(m[4].str());
    const auto it = member_count.emplace(name, count).first;
    if (it->second != count)
      ADD_FAILURE() << dir << ": the pieces of '" << name << "' disagree on their count";
    members[name][std::stoi(m[3].str())] = std::move(bytes);
  }
  for (const auto &[name, parts] : members) {
    const serialization::CheckpointTensor &tensor = record.at(name);
    const int count = member_count.at(name);
    if (!tensor.cut || tensor.cut->parts != count) {
      ADD_FAILURE() << dir << ": '" << name << "' is stored in " << count
                    << " tensor-parallel pieces, but the layout record "
                    << (tensor.cut ? str_cat("cuts it in ", tensor.cut->parts)
                                   : std::string("does not cut it"));
      continue;
    }
    if (static_cast<int>(parts.size()) != count || parts.begin()->first != 0 ||
        parts.rbegin()->first != count - 1) {
      ADD_FAILURE() << dir << ": '" << name << "' is stored as " << parts.size() << " of its "
                    << count << " tensor-parallel pieces";
      continue;
    }
    const TensorType &type = tensor.type;
    int64_t dim = tensor.cut->dim;
    if (dim < 0) dim += type.rank();
    const int64_t outer = tensor.cut->outer;
    if (dim < 0 || dim >= type.rank() || outer < 1 ||
        type.shape[static_cast<size_t>(dim)] % (outer * count) != 0) {
      ADD_FAILURE() << dir << ": the layout record cuts '" << name << "' (" << type.to_string()
                    << ") along dim " << tensor.cut->dim << " with outer " << outer << " in "
                    << count << ", which does not divide it";
      continue;
    }
    int64_t before = 1, after = 1;
    for (int64_t d = 0; d < type.rank(); ++d) {
      if (d < dim) before *= type.shape[static_cast<size_t>(d)];
      if (d > dim) after *= type.shape[static_cast<size_t>(d)];
    }
    const int64_t rows = before * outer;
    const auto run = static_cast<size_t>(type.shape[static_cast<size_t>(dim)] / outer / count *
                                         after * static_cast<int64_t>(dtype_size(type.dtype)));
    HostTensor full = HostTensor::zeros(type);
    bool complete = true;
    for (const auto &[member, bytes] : parts) {
      if (bytes.size() != static_cast<size_t>(rows) * run) {
        ADD_FAILURE() << dir << ": piece " << member << " of " << count << " of '" << name
                      << "' holds " << bytes.size() << " bytes, but a piece of " << type.to_string()
                      << " cut so is " << static_cast<size_t>(rows) * run;
        complete = false;
        break;
      }
      if (run == 0) continue;
      for (int64_t row = 0; row < rows; ++row)
        std::memcpy(full.data() + static_cast<size_t>(row * count + member) * run,
                    bytes.data() + static_cast<size_t>(row) * run, run);
    }
    if (complete) whole.emplace(name, std::move(full));
  }

  // The record is of the tensors the checkpoint holds, at their whole types.
  EXPECT_FALSE(checkpoint.layout.empty()) << dir << " has no layout record";
  for (const auto &[name, tensor] : whole) {
    const auto found = record.find(name);
    if (found == record.end()) {
      ADD_FAILURE() << dir << ": tensor '" << name << "' is not in the layout record";
      continue;
    }
    EXPECT_TRUE(found->second.type == tensor.type)
        << dir << ": tensor '" << name << "' is " << tensor.type.to_string()
        << " but the layout record says " << found->second.type.to_string();
  }
  for (const auto &[name, tensor] : record) {
    if (!whole.contains(name) && !members.contains(name))
      ADD_FAILURE() << dir << ": the layout record has tensor '" << name
                    << "', which the checkpoint does not hold";
  }
  return whole;
}

// The largest difference over the largest value of `want` (infinite where a
// value is not finite and the two differ).
double relative_difference(const HostTensor &got, const HostTensor &want) {
  double largest = 0, scale = 0;
  for (int64_t i = 0; i < want.type.num_elements(); ++i) {
    const double a = got.element(i), b = want.element(i);
    if (a == b) {
      if (std::isfinite(b)) scale = std::max(scale, std::fabs(b));
      continue;
    }
    const double d = std::fabs(a - b);
    if (!std::isfinite(d)) return std::numeric_limits<double>::infinity();
    largest = std::max(largest, d);
    scale = std::max(scale, std::fabs(b));
  }
  return largest == 0 ? 0 : largest / std::max(scale, 1e-30);
}

// What the pairs share, made once per process: the model, the plans compiled
// from it (by their flags), and the one-device plan's unbroken runs of 2 and
// 4 steps, with their checkpoints.
struct Shared {
  fs::path dir;
  std::string error;                     // why it could not be made
  std::string straight_out;              // stdout of the unbroken 4-step run
  std::map<std::string, fs::path> plans; // compile flags -> plan file
};

fs::path made_shared_dir; // removed after the tests, unless one failed

Shared make_shared_files() {
  Shared made;
  made.dir = fs::temp_directory_path() / str_cat("strata_layout_", ::getpid(), "_shared");
  fs::remove_all(made.dir);
  fs::create_directories(made.dir);
  made_shared_dir = made.dir;
  auto step = [&](const std::vector<std::string> &args) {
    Outcome o = shell_in(made.dir, command_of(args));
    if (o.code != 0 && made.error.empty())
      made.error = str_cat("strata ", joined(args), " failed: ", o.out, o.err);
    return o;
  };
  step(kGpt);
  std::vector<std::string> compile = {"compile", "g.strata", "--train"};
  compile.insert(compile.end(), kOptimizer.begin(), kOptimizer.end());
  compile.insert(compile.end(), {"-o", "one.splan"});
  step(compile);
  made.plans[""] = made.dir / "one.splan";
  made.straight_out = step({"run", "one.splan", "--steps", "4", "--checkpoint", "straight4"}).out;
  step({"run", "one.splan", "--steps", "2", "--checkpoint", "straight2"});
  return made;
}

Shared &shared() {
  static Shared made = make_shared_files();
  return made;
}

// Removes the shared folder once every test passed.
class SharedCleanup : public ::testing::Environment {
public:
  void TearDown() override {
    if (!made_shared_dir.empty() && ::testing::UnitTest::GetInstance()->Passed())
      fs::remove_all(made_shared_dir);
  }
};
[[maybe_unused]] ::testing::Environment *const kSharedCleanup =
    ::testing::AddGlobalTestEnvironment(new SharedCleanup);

class LayoutResumeTest : public ::testing::Test {
protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(strata_binary())) << strata_binary() << " is not built";
    const auto *info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           str_cat("strata_layout_", ::getpid(), "_", info->test_suite_name(), "_", info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure() && !dir_.empty()) fs::remove_all(dir_);
  }

  Outcome strata(const std::vector<std::string> &args) { return shell_in(dir_, command_of(args)); }

  // `mpirun -np ranks strata args...`, bounded at 120 s.
  Outcome mpirun(int ranks, const std::vector<std::string> &args) {
    return shell_in(dir_, str_cat("timeout -k 5 120 ", quote(mpirun_path()),
                                  " --oversubscribe -np ", ranks, " ", command_of(args)));
  }

  // `strata run plan args...` in one process (ranks 0) or under mpirun.
  Outcome run(const fs::path &plan, int ranks, const std::vector<std::string> &args) {
    std::vector<std::string> all = {"run", plan.string()};
    all.insert(all.end(), args.begin(), args.end());
    return ranks == 0 ? strata(all) : mpirun(ranks, all);
  }

  // The shared GPT's plan compiled with `flags` (and kOptimizer); empty, with
  // a failure, where compile failed.
  fs::path plan(const std::vector<std::string> &flags) {
    Shared &s = shared();
    const std::string key = joined(flags);
    if (const auto found = s.plans.find(key); found != s.plans.end()) return found->second;
    const std::string file = str_cat("p", s.plans.size(), ".splan");
    std::vector<std::string> args = {"compile", "g.strata", "--train"};
    args.insert(args.end(), kOptimizer.begin(), kOptimizer.end());
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), {"-o", file});
    Outcome o = shell_in(s.dir, command_of(args));
    if (o.code != 0) {
      ADD_FAILURE() << "strata " << joined(args) << ": " << o.out << o.err;
      return {};
    }
    return s.plans[key] = s.dir / file;
  }

  // The checkpoint in `got` (this test's folder) against `want` (the shared
  // folder's): both at `step`, of one model and optimizer, and their whole
  // tensors the same names, types and values within kTolerance.
  void expect_same_weights(const std::string &got, const std::string &want, int64_t step) {
    const fs::path got_dir = dir_ / got, want_dir = shared().dir / want;
    auto left = serialization::read_checkpoint(got_dir.string(), "");
    auto right = serialization::read_checkpoint(want_dir.string(), "");
    ASSERT_TRUE(left.is_ok()) << left.status().to_string();
    ASSERT_TRUE(right.is_ok()) << right.status().to_string();
    EXPECT_EQ(left->step, step) << got_dir;
    EXPECT_EQ(right->step, step) << want_dir;
    EXPECT_EQ(left->layout.model, right->layout.model);
    EXPECT_EQ(left->layout.optimizer, right->layout.optimizer);
    const std::map<std::string, HostTensor> a = whole_tensors(*left, got_dir);
    const std::map<std::string, HostTensor> b = whole_tensors(*right, want_dir);
    EXPECT_FALSE(b.empty()) << want_dir;
    for (const auto &[name, tensor] : b)
      if (!a.contains(name))
        ADD_FAILURE() << got_dir << " lacks tensor '" << name << "' of " << want_dir;
    for (const auto &[name, tensor] : a) {
      const auto other = b.find(name);
      if (other == b.end()) {
        ADD_FAILURE() << got_dir << " has tensor '" << name << "', which " << want_dir << " lacks";
        continue;
      }
      if (!(tensor.type == other->second.type)) {
        ADD_FAILURE() << "tensor '" << name << "' is " << tensor.type.to_string() << " in "
                      << got_dir << " but " << other->second.type.to_string() << " in " << want_dir;
        continue;
      }
      EXPECT_LE(relative_difference(tensor, other->second), kTolerance)
          << "tensor '" << name << "' of " << got_dir << " against " << want_dir;
    }
  }

  // B's run printed steps 3 and 4, its last loss the unbroken run's (as
  // printed, to 4 decimals).
  void expect_last_losses(const Outcome &resumed) {
    const std::map<int64_t, double> got = losses(resumed.out);
    const std::map<int64_t, double> want = losses(shared().straight_out);
    ASSERT_EQ(got.size(), 2u) << resumed.out;
    ASSERT_TRUE(got.contains(4) && want.contains(4)) << resumed.out << shared().straight_out;
    EXPECT_NEAR(got.at(4), want.at(4), 2e-4) << resumed.out << shared().straight_out;
  }

  // Plan A (`a_flags`) trains 2 steps into ck_a, plan B resumes it for 2 more
  // into ck_b, each in one process (ranks 0) or under mpirun. B says it
  // resumed at step 2; `resharded`: from a layout described with each of
  // `described`. ck_b is the unbroken run's checkpoint.
  void expect_pair(const std::vector<std::string> &a_flags, int a_ranks,
                   const std::vector<std::string> &b_flags, int b_ranks, bool resharded,
                   const std::vector<std::string> &described) {
    const fs::path a = plan(a_flags), b = plan(b_flags);
    ASSERT_FALSE(a.empty() || b.empty());
    Outcome first = run(a, a_ranks, {"--steps", "2", "--checkpoint", "ck_a"});
    ASSERT_EQ(first.code, 0) << first.out << first.err;
    Outcome second = run(b, b_ranks, {"--steps", "4", "--resume", "ck_a", "--checkpoint", "ck_b"});
    ASSERT_EQ(second.code, 0) << second.out << second.err;
    const Resumed line = resumed_line(second.out, "ck_a", 2);
    ASSERT_TRUE(line.found) << second.out;
    if (resharded) {
      EXPECT_TRUE(line.resharded) << "after 'at step 2': '" << line.rest << "'";
    }
    if (line.resharded) {
      for (const std::string &text : described)
        EXPECT_NE(line.from.find(text), std::string::npos)
            << "resharded from '" << line.from << "' does not mention '" << text << "'";
    }
    expect_last_losses(second);
    expect_same_weights("ck_b", "straight4", 4);
  }

  fs::path dir_;
};

TEST_F(LayoutResumeTest, PipelineToDataParallel) {
  ASSERT_TRUE(shared().error.empty()) << shared().error;
  expect_pair({"--mesh", "1x1x2", "--microbatches", "2"}, 0, {"--mesh", "2x1x1"}, 0, true,
              {"mesh 1x1x2"});
}

TEST_F(LayoutResumeTest, TensorParallelTwoToFour) {
  ASSERT_TRUE(shared().error.empty()) << shared().error;
  expect_pair({"--mesh", "1x2x1"}, 0, {"--mesh", "1x4x1"}, 0, true, {"mesh 1x2x1"});
}

TEST_F(LayoutResumeTest, ZeroOnToOff) {
  ASSERT_TRUE(shared().error.empty()) << shared().error;
  expect_pair({"--mesh", "2x1x1", "--zero", "1"}, 0, {"--mesh", "2x1x1"}, 0, true,
              {"mesh 2x1x1", "ZeRO"});
}

TEST_F(LayoutResumeTest, FourReplicasToTwo) {
  ASSERT_TRUE(shared().error.empty()) << shared().error;
  expect_pair({"--mesh", "4x1x1"}, 0, {"--mesh", "2x1x1"}, 0, true, {"mesh 4x1x1"});
}

TEST_F(LayoutResumeTest, ManyDevicesToOne) {
  ASSERT_TRUE(shared().error.empty()) << shared().error;
  expect_pair({"--mesh", "2x1x2", "--microbatches", "2"}, 0, {}, 0, true, {"mesh 2x1x2"});
}

// The refusals: the layout may differ, the model and optimizer may not. Each
// error names what differs, and no step runs.
class LayoutRefusalTest : public LayoutResumeTest {
protected:
  void SetUp() override {
    LayoutResumeTest::SetUp();
    if (HasFatalFailure()) return;
    for (const char *hidden : {"16", "24"}) {
      Outcome zoo = strata({"zoo", "mlp", "--batch", "8", "--input", "16", "--hidden", hidden, "-o",
                            str_cat("m", hidden, ".strata")});
      ASSERT_EQ(zoo.code, 0) << zoo.err;
    }
    Outcome compile = strata({"compile", "m16.strata", "--train", "--optimizer", "sgd:lr=0.01",
                              "--mesh", "2x1x1", "-o", "sgd.splan"});
    ASSERT_EQ(compile.code, 0) << compile.err;
    Outcome trained = strata({"run", "sgd.splan", "--steps", "2", "--checkpoint", "ck"});
    ASSERT_EQ(trained.code, 0) << trained.err;
  }

  serialization::Plan load(const std::string &file) {
    auto plan = serialization::load_plan((dir_ / file).string());
    EXPECT_TRUE(plan.is_ok()) << plan.status().to_string();
    return plan.is_ok() ? std::move(plan).value() : serialization::Plan{};
  }

  void expect_refused(const Outcome &o) {
    EXPECT_NE(o.code, 0) << o.out;
    EXPECT_NE(o.err.find("strata: error: "), std::string::npos) << o.err;
    EXPECT_EQ(o.out.find("step 3/"), std::string::npos) << o.out;
  }
};

TEST_F(LayoutRefusalTest, AnotherOptimizerIsNamed) {
  Outcome compile = strata(
      {"compile", "m16.strata", "--train", "--optimizer", "adam:lr=0.01", "-o", "adam.splan"});
  ASSERT_EQ(compile.code, 0) << compile.err;
  const std::string mine = load("adam.splan").optimizer, theirs = load("sgd.splan").optimizer;
  ASSERT_FALSE(mine.empty() || theirs.empty());
  ASSERT_NE(mine, theirs);
  Outcome o =
      strata({"run", "adam.splan", "--steps", "4", "--resume", "ck", "--checkpoint", "ck2"});
  expect_refused(o);
  EXPECT_NE(o.err.find(mine), std::string::npos) << "no '" << mine << "' in " << o.err;
  EXPECT_NE(o.err.find(theirs), std::string::npos) << "no '" << theirs << "' in " << o.err;
}

TEST_F(LayoutRefusalTest, AnotherModelIsNamed) {
  Outcome compile = strata(
      {"compile", "m24.strata", "--train", "--optimizer", "sgd:lr=0.01", "-o", "other.splan"});
  ASSERT_EQ(compile.code, 0) << compile.err;
  const std::string mine = load("other.splan").model_fingerprint,
                    theirs = load("sgd.splan").model_fingerprint;
  ASSERT_GE(mine.size(), 8u);
  ASSERT_GE(theirs.size(), 8u);
  ASSERT_NE(mine, theirs);
  Outcome o =
      strata({"run", "other.splan", "--steps", "4", "--resume", "ck", "--checkpoint", "ck2"});
  expect_refused(o);
  EXPECT_NE(o.err.find("model"), std::string::npos) << o.err;
  // The SHA-256 of either model, whole or its first 8 hex digits.
  EXPECT_TRUE(o.err.find(mine.substr(0, 8)) != std::string::npos ||
              o.err.find(theirs.substr(0, 8)) != std::string::npos)
      << "neither model's SHA-256 (" << mine << ", " << theirs << ") in " << o.err;
}

// Plans run by MPI ranks: skipped without an MPI build or mpirun.
class LayoutResumeMpiTest : public LayoutResumeTest {
protected:
  void SetUp() override {
    if (!runtime::mpi_built()) GTEST_SKIP() << "strata was built without MPI (no Open MPI found)";
    if (mpirun_path().empty()) GTEST_SKIP() << "mpirun is not installed (scripts/setup adds it)";
    LayoutResumeTest::SetUp();
  }
};

// Threads to ranks: the same plan on 2 ranks (what it resharded from, if it
// says, is the same mesh), then to a ZeRO-1 plan whose ranks save their
// shards of the optimizer state.
TEST_F(LayoutResumeMpiTest, ThreadsToRanks) {
  ASSERT_TRUE(shared().error.empty()) << shared().error;
  ASSERT_NO_FATAL_FAILURE(
      expect_pair({"--mesh", "2x1x1"}, 0, {"--mesh", "2x1x1"}, 2, false, {"mesh 2x1x1"}));
  auto written = serialization::read_checkpoint((dir_ / "ck_b").string(), "");
  ASSERT_TRUE(written.is_ok()) << written.status().to_string();
  EXPECT_EQ(written->ranks, 2);

  fs::remove_all(dir_ / "ck_a");
  fs::remove_all(dir_ / "ck_b");
  ASSERT_NO_FATAL_FAILURE(expect_pair({"--mesh", "2x1x1"}, 0, {"--mesh", "2x1x1", "--zero", "1"}, 2,
                                      true, {"mesh 2x1x1"}));
  auto sharded = serialization::read_checkpoint((dir_ / "ck_b").string(), "");
  ASSERT_TRUE(sharded.is_ok()) << sharded.status().to_string();
  EXPECT_EQ(sharded->ranks, 2);
  int shards = 0;
  for (const auto &[name, tensor] : sharded->tensors)
    shards += name.find("@shard") != std::string::npos;
  EXPECT_GT(shards, 0) << "the ranks' ZeRO-1 shards";
}

// Ranks to one device: a tensor-parallel pair on 2 ranks saves its pieces
// ("<name>@tp<m>of2"), which put together by the record are one device's
// weights after 2 steps; the one-device plan resumes them.
TEST_F(LayoutResumeMpiTest, TensorParallelRanksToOneDevice) {
  ASSERT_TRUE(shared().error.empty()) << shared().error;
  const fs::path tp = plan({"--mesh", "1x2x1"}), one = plan({});
  ASSERT_FALSE(tp.empty() || one.empty());
  Outcome first = run(tp, 2, {"--steps", "2", "--checkpoint", "ck_a"});
  ASSERT_EQ(first.code, 0) << first.out << first.err;
  auto pieces = serialization::read_checkpoint((dir_ / "ck_a").string(), "");
  ASSERT_TRUE(pieces.is_ok()) << pieces.status().to_string();
  EXPECT_EQ(pieces->ranks, 2);
  int cut = 0;
  for (const auto &[name, tensor] : pieces->tensors)
    cut += name.find("@tp") != std::string::npos;
  EXPECT_GT(cut, 0) << "no tensor-parallel pieces in ck_a";
  expect_same_weights("ck_a", "straight2", 2);
  // inspect says how each tensor is stored.
  Outcome shown = strata({"inspect", "ck_a", "--all"});
  ASSERT_EQ(shown.code, 0) << shown.err;
  EXPECT_NE(shown.out.find("2 tensor-parallel pieces"), std::string::npos) << shown.out;
  EXPECT_NE(shown.out.find("mesh 1x2x1 (DPxTPxPP), 1 micro-batch, 1f1b, 2 ranks"),
            std::string::npos)
      << shown.out;

  Outcome second = run(one, 0, {"--steps", "4", "--resume", "ck_a", "--checkpoint", "ck_b"});
  ASSERT_EQ(second.code, 0) << second.out << second.err;
  const Resumed line = resumed_line(second.out, "ck_a", 2);
  ASSERT_TRUE(line.found) << second.out;
  EXPECT_TRUE(line.resharded) << "after 'at step 2': '" << line.rest << "'";
  for (const char *text : {"mesh 1x2x1", "2 ranks"})
    EXPECT_NE(line.from.find(text), std::string::npos)
        << "resharded from '" << line.from << "' does not mention '" << text << "'";
  expect_last_losses(second);
  expect_same_weights("ck_b", "straight4", 4);
}

} // namespace
} // namespace strata
