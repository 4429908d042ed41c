// End-to-end tests of `strata reshard` and `strata export`: checkpoints
// written by one plan's layout, rewritten for another plan of the same model
// (and resumed there as if the run had never changed layout), or written out
// as .safetensors files, one or Hugging Face's shards and index, read back
// and compared with the checkpoint. Each test runs the binary in a scratch
// folder, as cli_test does.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "serialization/checkpoint.h"
#include "serialization/npy.h"
#include "serialization/plan_io.h"
#include "serialization/safetensors.h"
#include "tests/tools/cli_util.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using testing::Outcome;
using testing::quote;
using testing::read_file;
using testing::strata_binary;

// The tensors of the tests' MLP (--hidden 16), by name.
const std::set<std::string> kMlpParameters = {"fc0.bias", "fc0.weight", "head.bias", "head.weight"};

class CheckpointCliTest : public ::testing::Test {
protected:
  void SetUp() override {
    const auto *info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           str_cat("strata_ckpt_", ::getpid(), "_", info->test_suite_name(), "_", info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ASSERT_TRUE(fs::exists(strata_binary())) << strata_binary() << " is not built";
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  Outcome strata(const std::vector<std::string> &args) {
    std::string command = quote(strata_binary().string());
    for (const std::string &arg : args)
      command += " " + quote(arg);
    return testing::run_in(dir_, command);
  }

  fs::path path(const std::string &name) const { return dir_ / name; }

  void ok(const std::vector<std::string> &args) {
    Outcome o = strata(args);
    ASSERT_EQ(o.code, 0) << args[0] << ": " << o.err;
  }

  // m.strata: an MLP x f32[8, 16] -> `hidden` -> 4 classes.
  void make_mlp(const std::string &hidden, const std::string &file = "m.strata") {
    ASSERT_NO_FATAL_FAILURE(ok({"zoo", "mlp", "--batch", "8", "--input", "16", "--hidden", hidden,
                                "--classes", "4", "-o", file}));
  }

  // A training plan of `model` with `optimizer` and the extra options.
  void compile(const std::string &model, const std::string &optimizer,
               std::vector<std::string> options, const std::string &plan) {
    std::vector<std::string> args = {"compile", model, "--train", "--optimizer", optimizer};
    args.insert(args.end(), options.begin(), options.end());
    args.insert(args.end(), {"-o", plan});
    ASSERT_NO_FATAL_FAILURE(ok(args));
  }

  // data/x.npy and data/labels.npy: 4 fixed batches of the MLP's whole step.
  void write_data() {
    fs::create_directories(path("data"));
    HostTensor x = HostTensor::zeros(TensorType{DType::kF32, {4, 8, 16}});
    for (int64_t i = 0; i < x.type.num_elements(); ++i)
      x.as<float>()[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 0.1));
    HostTensor labels = HostTensor::zeros(TensorType{DType::kI64, {4, 8}});
    for (int64_t i = 0; i < labels.type.num_elements(); ++i)
      labels.as<int64_t>()[i] = (i * 7 + 3) % 4;
    ASSERT_TRUE(serialization::write_npy(path("data/x.npy").string(), x).is_ok());
    ASSERT_TRUE(serialization::write_npy(path("data/labels.npy").string(), labels).is_ok());
  }

  serialization::Checkpoint read_checkpoint(const std::string &name) {
    auto checkpoint = serialization::read_checkpoint(path(name).string(), "");
    EXPECT_TRUE(checkpoint.is_ok()) << name << ": " << checkpoint.status().to_string();
    return checkpoint.is_ok() ? std::move(checkpoint).value() : serialization::Checkpoint{};
  }

  serialization::Plan read_plan(const std::string &name) {
    auto plan = serialization::load_plan(path(name).string());
    EXPECT_TRUE(plan.is_ok()) << name << ": " << plan.status().to_string();
    return plan.is_ok() ? std::move(plan).value() : serialization::Plan{};
  }

  std::map<std::string, HostTensor> read_safetensors(const std::string &name) {
    auto tensors = serialization::read_safetensors(path(name).string());
    EXPECT_TRUE(tensors.is_ok()) << name << ": " << tensors.status().to_string();
    return tensors.is_ok() ? std::move(tensors).value() : std::map<std::string, HostTensor>{};
  }

  // Every file in folder `name` with its bytes.
  std::map<std::string, std::string> snapshot(const std::string &name) {
    std::map<std::string, std::string> files;
    for (const auto &entry : fs::directory_iterator(path(name)))
      files[entry.path().filename().string()] = read_file(entry.path());
    return files;
  }

  fs::path dir_;
};

class ReshardTest : public CheckpointCliTest {};
class ExportTest : public CheckpointCliTest {};

// A failed command: non-zero exit and exactly one line `strata: error: ...`.
void expect_one_line_error(const Outcome &o, std::string_view must_mention = "") {
  EXPECT_NE(o.code, 0);
  EXPECT_TRUE(o.err.starts_with("strata: error: ")) << o.err;
  ASSERT_FALSE(o.err.empty());
  EXPECT_EQ(o.err.back(), '\n') << o.err;
  EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;
  if (!must_mention.empty()) {
    EXPECT_NE(o.err.find(must_mention), std::string::npos)
        << "error does not mention '" << must_mention << "': " << o.err;
  }
}

std::vector<double> printed_losses(const std::string &out) {
  std::vector<double> losses;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    if (!line.starts_with("step ")) continue;
    const size_t at = line.find("  loss ");
    if (at != std::string::npos) losses.push_back(std::stod(line.substr(at + 7)));
  }
  return losses;
}

bool same_bits(const HostTensor &a, const HostTensor &b) {
  return a.type == b.type && a.size_bytes() == b.size_bytes() &&
         (a.size_bytes() == 0 || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

// max |got - want| / max |want| (as strata verify measures a tensor).
double relative_difference(const HostTensor &got, const HostTensor &want) {
  double largest = 0, scale = 0;
  for (int64_t i = 0; i < want.type.num_elements(); ++i) {
    largest = std::max(largest, std::fabs(got.element(i) - want.element(i)));
    scale = std::max(scale, std::fabs(want.element(i)));
  }
  return largest / std::max(scale, 1e-30);
}

std::set<std::string> names_of(const std::map<std::string, HostTensor> &tensors) {
  std::set<std::string> names;
  for (const auto &entry : tensors)
    names.insert(entry.first);
  return names;
}

// A two-stage pipeline's checkpoint, resharded for two data-parallel
// replicas, resumes there and ends where an unbroken run of the replicas
// ends (the two layouts add the same two micro-batches' gradients, so the
// runs agree but for rounding: 1e-6, SGD with momentum).
TEST_F(ReshardTest, APipelineCheckpointResumesOnReplicasLikeAnUnbrokenRun) {
  ASSERT_NO_FATAL_FAILURE(make_mlp("32,32"));
  ASSERT_NO_FATAL_FAILURE(write_data());
  const std::string sgd = "sgd:lr=0.05,momentum=0.9";
  ASSERT_NO_FATAL_FAILURE(
      compile("m.strata", sgd, {"--mesh", "1x1x2", "--microbatches", "2"}, "a.splan"));
  ASSERT_NO_FATAL_FAILURE(compile("m.strata", sgd, {"--mesh", "2x1x1"}, "b.splan"));
  ASSERT_NO_FATAL_FAILURE(
      ok({"run", "a.splan", "--steps", "2", "--data", "data", "--checkpoint", "ck_a"}));

  Outcome reshard = strata({"reshard", "ck_a", "--plan", "b.splan", "-o", "ck_b"});
  ASSERT_EQ(reshard.code, 0) << reshard.err;
  EXPECT_NE(reshard.out.find("step 2"), std::string::npos) << reshard.out;
  EXPECT_NE(reshard.out.find("strata run b.splan --resume ck_b"), std::string::npos) << reshard.out;
  // One process's checkpoint of plan B at step 2, every tensor A saved, bit for bit.
  const serialization::Plan b = read_plan("b.splan");
  const serialization::Checkpoint a_saved = read_checkpoint("ck_a");
  const serialization::Checkpoint resharded = read_checkpoint("ck_b");
  EXPECT_EQ(resharded.step, 2);
  EXPECT_EQ(resharded.ranks, 1);
  EXPECT_EQ(resharded.fingerprint, b.fingerprint);
  EXPECT_EQ(resharded.layout.model, b.model_fingerprint);
  EXPECT_EQ(resharded.layout.optimizer, b.optimizer);
  EXPECT_EQ(names_of(resharded.tensors), names_of(a_saved.tensors));
  for (const auto &[name, record] : resharded.layout.tensors)
    EXPECT_FALSE(record.cut.has_value()) << name;
  for (const auto &[name, tensor] : a_saved.tensors) {
    auto it = resharded.tensors.find(name);
    ASSERT_NE(it, resharded.tensors.end()) << name;
    EXPECT_TRUE(same_bits(it->second, tensor)) << name;
  }

  Outcome resumed = strata({"run", "b.splan", "--steps", "4", "--data", "data", "--resume", "ck_b",
                            "--checkpoint", "ck_b"});
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("resumed    ck_b at step 2"), std::string::npos) << resumed.out;
  Outcome unbroken =
      strata({"run", "b.splan", "--steps", "4", "--data", "data", "--checkpoint", "ck_full"});
  ASSERT_EQ(unbroken.code, 0) << unbroken.err;
  const std::vector<double> rest = printed_losses(resumed.out), all = printed_losses(unbroken.out);
  ASSERT_EQ(rest.size(), 2u) << resumed.out;
  ASSERT_EQ(all.size(), 4u) << unbroken.out;
  for (size_t i = 0; i < 2; ++i)
    EXPECT_NEAR(rest[i], all[2 + i], 1e-4) << resumed.out << unbroken.out;

  const serialization::Checkpoint after = read_checkpoint("ck_b");
  const serialization::Checkpoint want = read_checkpoint("ck_full");
  EXPECT_EQ(after.step, 4);
  EXPECT_EQ(want.step, 4);
  EXPECT_EQ(names_of(after.tensors), names_of(want.tensors));
  ASSERT_FALSE(want.tensors.empty());
  for (const auto &[name, tensor] : want.tensors) {
    auto it = after.tensors.find(name);
    ASSERT_NE(it, after.tensors.end()) << name;
    ASSERT_EQ(it->second.type, tensor.type) << name;
    EXPECT_LE(relative_difference(it->second, tensor), 1e-6) << name;
  }
}

// A plan of another model or optimizer, an inference plan, a missing
// checkpoint and a folder that holds a checkpoint are refused with one line
// saying which, and nothing is written.
TEST_F(ReshardTest, RefusesAnotherModelOrOptimizerAndAFolderWithACheckpoint) {
  ASSERT_NO_FATAL_FAILURE(make_mlp("32,32"));
  const std::string sgd = "sgd:lr=0.05,momentum=0.9";
  ASSERT_NO_FATAL_FAILURE(
      compile("m.strata", sgd, {"--mesh", "1x1x2", "--microbatches", "2"}, "a.splan"));
  ASSERT_NO_FATAL_FAILURE(compile("m.strata", sgd, {"--mesh", "2x1x1"}, "b.splan"));
  ASSERT_NO_FATAL_FAILURE(ok({"run", "a.splan", "--steps", "2", "--checkpoint", "ck_a"}));
  const auto ck_a = snapshot("ck_a");

  // Another model: the same layout of an MLP of other widths.
  ASSERT_NO_FATAL_FAILURE(make_mlp("32,16", "other.strata"));
  ASSERT_NO_FATAL_FAILURE(compile("other.strata", sgd, {"--mesh", "2x1x1"}, "other.splan"));
  Outcome model = strata({"reshard", "ck_a", "--plan", "other.splan", "-o", "out_model"});
  expect_one_line_error(model, "ck_a/manifest.json");
  EXPECT_NE(model.err.find("model"), std::string::npos) << model.err;
  EXPECT_FALSE(fs::exists(path("out_model")));

  // Another optimizer: the error names both optimizer strings.
  ASSERT_NO_FATAL_FAILURE(compile("m.strata", "adam:lr=0.01", {"--mesh", "2x1x1"}, "adam.splan"));
  const std::string ours = read_plan("a.splan").optimizer;
  const std::string theirs = read_plan("adam.splan").optimizer;
  ASSERT_FALSE(ours.empty());
  ASSERT_NE(ours, theirs);
  Outcome optimizer = strata({"reshard", "ck_a", "--plan", "adam.splan", "-o", "out_optimizer"});
  expect_one_line_error(optimizer, ours);
  EXPECT_NE(optimizer.err.find(theirs), std::string::npos) << optimizer.err;
  EXPECT_FALSE(fs::exists(path("out_optimizer")));

  // An inference plan, a folder that is no checkpoint.
  ASSERT_NO_FATAL_FAILURE(ok({"compile", "m.strata", "-o", "infer.splan"}));
  expect_one_line_error(strata({"reshard", "ck_a", "--plan", "infer.splan", "-o", "out_infer"}),
                        "inference plan");
  EXPECT_FALSE(fs::exists(path("out_infer")));
  expect_one_line_error(strata({"reshard", "nowhere", "--plan", "b.splan", "-o", "out_missing"}),
                        "nowhere");
  EXPECT_FALSE(fs::exists(path("out_missing")));

  // A folder holding a checkpoint, another run's or the input itself.
  ASSERT_NO_FATAL_FAILURE(ok({"run", "b.splan", "--steps", "1", "--checkpoint", "ck_b"}));
  const auto ck_b = snapshot("ck_b");
  expect_one_line_error(strata({"reshard", "ck_a", "--plan", "b.splan", "-o", "ck_b"}),
                        "-o ck_b already holds a checkpoint");
  EXPECT_EQ(snapshot("ck_b"), ck_b);
  expect_one_line_error(strata({"reshard", "ck_a", "--plan", "b.splan", "-o", "ck_a"}),
                        "it is the checkpoint being resharded");
  EXPECT_EQ(snapshot("ck_a"), ck_a);
}

TEST_F(ReshardTest, HelpSaysHowToResume) {
  Outcome o = strata({"reshard", "--help"});
  ASSERT_EQ(o.code, 0) << o.err;
  for (const char *text : {"Usage", "Example", "--plan", "--resume", "layout record"})
    EXPECT_NE(o.out.find(text), std::string::npos) << text << "\n" << o.out;
}

// The parameters alone, under the model's names, bit for bit the
// checkpoint's; --with-optimizer adds every state tensor.
TEST_F(ExportTest, WritesTheParametersUnderTheirNames) {
  ASSERT_NO_FATAL_FAILURE(make_mlp("16"));
  ASSERT_NO_FATAL_FAILURE(
      compile("m.strata", "adam:lr=0.01", {"--mesh", "1x1x2", "--microbatches", "2"}, "t.splan"));
  ASSERT_NO_FATAL_FAILURE(ok({"run", "t.splan", "--steps", "2", "--checkpoint", "ck"}));
  const serialization::Checkpoint checkpoint = read_checkpoint("ck");
  std::set<std::string> parameters;
  for (const auto &[name, record] : checkpoint.layout.tensors)
    if (record.parameter) parameters.insert(name);
  EXPECT_EQ(parameters, kMlpParameters);

  Outcome o = strata({"export", "ck", "-o", "w.safetensors"});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("4 parameters"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("wrote      w.safetensors"), std::string::npos) << o.out;
  EXPECT_FALSE(fs::exists(path("w.safetensors.index.json")));
  const auto weights = read_safetensors("w.safetensors");
  EXPECT_EQ(names_of(weights), kMlpParameters);
  for (const auto &[name, tensor] : weights)
    EXPECT_TRUE(same_bits(tensor, checkpoint.tensors.at(name))) << name;
  // The header says the format, as PyTorch's writers do.
  const std::string bytes = read_file(path("w.safetensors"));
  ASSERT_GE(bytes.size(), 8u);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i)
    header_size = header_size << 8 | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  const auto header = nlohmann::json::parse(bytes.substr(8, header_size), nullptr, false);
  ASSERT_FALSE(header.is_discarded());
  ASSERT_TRUE(header.contains("__metadata__")) << header.dump();
  EXPECT_EQ(header.at("__metadata__").value("format", std::string()), "pt");

  Outcome full = strata({"export", "ck", "-o", "full.safetensors", "--with-optimizer"});
  ASSERT_EQ(full.code, 0) << full.err;
  EXPECT_NE(full.out.find("optimizer state tensors"), std::string::npos) << full.out;
  const auto everything = read_safetensors("full.safetensors");
  EXPECT_EQ(names_of(everything), names_of(checkpoint.tensors));
  EXPECT_TRUE(everything.contains("optimizer.step"));
  EXPECT_GT(everything.size(), weights.size());
  for (const auto &[name, tensor] : everything)
    EXPECT_TRUE(same_bits(tensor, checkpoint.tensors.at(name))) << name;
}

// Above --max-shard-size: Hugging Face's files and index, packed in name
// order, a tensor over the limit alone; the files of an earlier export that
// a loader could take for the new one are removed.
TEST_F(ExportTest, ShardsAboveTheLimitWithAnIndex) {
  ASSERT_NO_FATAL_FAILURE(make_mlp("16"));
  ASSERT_NO_FATAL_FAILURE(
      compile("m.strata", "adam:lr=0.01", {"--mesh", "1x1x2", "--microbatches", "2"}, "t.splan"));
  ASSERT_NO_FATAL_FAILURE(ok({"run", "t.splan", "--steps", "2", "--checkpoint", "ck"}));
  const serialization::Checkpoint checkpoint = read_checkpoint("ck");
  ASSERT_NO_FATAL_FAILURE(ok({"export", "ck", "-o", "w.safetensors"}));

  constexpr uint64_t kLimit = 1000;
  Outcome o = strata({"export", "ck", "-o", "w.safetensors", "--max-shard-size", "1000"});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("and the index w.safetensors.index.json"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("removed    w.safetensors"), std::string::npos) << o.out;
  EXPECT_FALSE(fs::exists(path("w.safetensors")));
  const auto index = nlohmann::json::parse(read_file(path("w.safetensors.index.json")));
  const auto &weight_map = index.at("weight_map");
  std::set<std::string> files;
  std::set<std::string> mapped;
  uint64_t expected_total = 0;
  for (const auto &item : weight_map.items()) {
    mapped.insert(item.key());
    files.insert(item.value().get<std::string>());
    expected_total += checkpoint.tensors.at(item.key()).size_bytes();
  }
  EXPECT_EQ(mapped, kMlpParameters);
  EXPECT_EQ(index.at("metadata").at("total_size").get<uint64_t>(), expected_total);
  const size_t n = files.size();
  ASSERT_GE(n, 2u) << index.dump();
  // Exactly w-00001-of-0000N ... w-0000N-of-0000N, each tensor in one of them.
  std::vector<std::vector<std::string>> in_file; // the tensors of each file
  std::vector<uint64_t> sizes;                   // and their bytes
  for (size_t k = 1; k <= n; ++k) {
    char name[64];
    std::snprintf(name, sizeof name, "w-%05zu-of-%05zu.safetensors", k, n);
    ASSERT_TRUE(files.contains(name)) << name << " " << index.dump();
    const auto shard = read_safetensors(name);
    ASSERT_FALSE(shard.empty()) << name;
    in_file.emplace_back();
    uint64_t bytes = 0;
    for (const auto &[tensor_name, tensor] : shard) {
      EXPECT_EQ(weight_map.value(tensor_name, std::string()), std::string(name)) << tensor_name;
      EXPECT_TRUE(same_bits(tensor, checkpoint.tensors.at(tensor_name))) << tensor_name;
      in_file.back().push_back(tensor_name);
      bytes += tensor.size_bytes();
    }
    EXPECT_TRUE(bytes <= kLimit || shard.size() == 1) << name << ": " << bytes << " bytes";
    sizes.push_back(bytes);
  }
  // In name order, and greedy: each file's first tensor did not fit into the one before.
  std::vector<std::string> order;
  for (const auto &names : in_file)
    order.insert(order.end(), names.begin(), names.end());
  EXPECT_EQ(order.size(), kMlpParameters.size());
  EXPECT_TRUE(std::is_sorted(order.begin(), order.end()));
  for (size_t k = 0; k + 1 < n; ++k)
    EXPECT_GT(sizes[k] + checkpoint.tensors.at(in_file[k + 1].front()).size_bytes(), kLimit) << k;
  // fc0.weight (f32[16, 16] or its transpose: 1 KiB) is over the limit, alone in its file.
  bool alone = false;
  for (const auto &names : in_file)
    alone = alone || (names.size() == 1 && names[0] == "fc0.weight");
  EXPECT_TRUE(alone);

  // Back to one file: the index and the shards go.
  Outcome single = strata({"export", "ck", "-o", "w.safetensors"});
  ASSERT_EQ(single.code, 0) << single.err;
  EXPECT_TRUE(fs::exists(path("w.safetensors")));
  EXPECT_FALSE(fs::exists(path("w.safetensors.index.json")));
  for (const std::string &file : files)
    EXPECT_FALSE(fs::exists(path(file))) << file;
}

// Sizes as Hugging Face writes them; anything else is a usage error naming
// the option, and nothing is written.
TEST_F(ExportTest, RefusesBadSizesOutputsAndCheckpointsWithoutALayout) {
  ASSERT_NO_FATAL_FAILURE(make_mlp("16"));
  ASSERT_NO_FATAL_FAILURE(compile("m.strata", "sgd:lr=0.1", {}, "t.splan"));
  ASSERT_NO_FATAL_FAILURE(ok({"run", "t.splan", "--steps", "1", "--checkpoint", "ck"}));
  for (const char *size : {"500MB", "5GB", "2GiB", "1024", "1.5kb"}) {
    Outcome o = strata({"export", "ck", "-o", "w.safetensors", "--max-shard-size", size});
    EXPECT_EQ(o.code, 0) << size << ": " << o.err;
  }
  for (const char *size : {"0", "0GB", "abc", "-5", "5XB", "1.2.3", "GB", "99999999999TB"}) {
    Outcome o = strata({"export", "ck", "-o", "bad.safetensors", "--max-shard-size", size});
    expect_one_line_error(o, "--max-shard-size");
    EXPECT_EQ(o.code, 2) << size;
  }
  EXPECT_FALSE(fs::exists(path("bad.safetensors")));
  expect_one_line_error(strata({"export", "ck", "-o", "w.bin"}), ".safetensors");
  EXPECT_FALSE(fs::exists(path("w.bin")));
  // Over the checkpoint's own data file.
  const std::string data = read_checkpoint("ck").file_of.begin()->second;
  const auto before = snapshot("ck");
  expect_one_line_error(strata({"export", "ck", "-o", "ck/" + data}), "is the input");
  EXPECT_EQ(snapshot("ck"), before);

  // A checkpoint without a layout record (as format 2 wrote them).
  HostTensor w = HostTensor::zeros(TensorType{DType::kF32, {2}});
  ASSERT_TRUE(serialization::write_checkpoint(path("old").string(), {{"w", w}}, "f", 3).is_ok());
  Outcome old = strata({"export", "old", "-o", "old.safetensors"});
  expect_one_line_error(old, "old/manifest.json");
  for (const char *text : {"layout record", "strata run PLAN --resume old", "--steps 4"})
    EXPECT_NE(old.err.find(text), std::string::npos) << text << ": " << old.err;
  EXPECT_FALSE(fs::exists(path("old.safetensors")));
}

TEST_F(ExportTest, HelpSaysHowToLoadIt) {
  Outcome o = strata({"export", "--help"});
  ASSERT_EQ(o.code, 0) << o.err;
  for (const char *text : {"Usage", "Example", "--max-shard-size", "--with-optimizer",
                           "load_state_dict", "index.json", "5GB"})
    EXPECT_NE(o.out.find(text), std::string::npos) << text << "\n" << o.out;
}

} // namespace
} // namespace strata
