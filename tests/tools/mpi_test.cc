// The `mpi` suite: strata run under mpirun, as users start it. Each test
// compiles plans with the strata binary, runs them threaded and over MPI
// ranks (Open MPI, --oversubscribe), and compares losses and checkpoints bit
// for bit; the failure tests inject a fault on one rank (STRATA_FAULT) and
// check that every surviving rank ends with an error naming the lost rank,
// within the timeout plus 10 s. Skipped, saying why, without mpirun or
// without an MPI build.
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "runtime/comm/mpi_world.h"
#include "runtime/cuda/cuda_executor.h"
#include "runtime/cuda/nccl_bootstrap.h"
#include "serialization/checkpoint.h"
#include "tests/tools/cli_util.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using testing::Outcome;
using testing::quote;
using testing::read_file;
using testing::strata_binary;

std::string mpirun_path() {
  if (const char *path = std::getenv("STRATA_MPIRUN"); path && *path) return path;
  for (const char *dir : {"/usr/bin", "/usr/local/bin"})
    if (fs::exists(fs::path(dir) / "mpirun")) return (fs::path(dir) / "mpirun").string();
  return {};
}

// "step 3/3  loss 2.6554" lines -> the losses as printed.
std::vector<std::string> losses(const std::string &out) {
  std::vector<std::string> found;
  std::regex line(R"(step \d+/\d+  loss (\S+))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator();
       ++it)
    found.push_back((*it)[1]);
  return found;
}

int count_of(const std::string &text, const std::string &what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
    ++n;
  return n;
}

class MpiTest : public ::testing::Test {
protected:
  void SetUp() override {
    if (!runtime::mpi_built()) GTEST_SKIP() << "strata was built without MPI (no Open MPI found)";
    if (mpirun_path().empty()) GTEST_SKIP() << "mpirun is not installed (scripts/setup adds it)";
    const auto *info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / str_cat("strata_mpi_", ::getpid(), "_", info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure() && !dir_.empty()) fs::remove_all(dir_);
  }

  Outcome shell(const std::string &command) {
    // mpirun refuses root without these; CI containers run as root.
    return testing::run_in(
        dir_, "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 && " + command);
  }

  std::string strata_command(const std::vector<std::string> &args) {
    std::string command = quote(strata_binary().string());
    for (const std::string &arg : args)
      command += " " + quote(arg);
    return command;
  }

  Outcome strata(const std::vector<std::string> &args) { return shell(strata_command(args)); }

  // `mpirun -np N strata args...`, bounded by `limit` seconds in all.
  Outcome mpirun(int ranks, const std::vector<std::string> &args, int limit = 120,
                 const std::string &env = "") {
    return shell(str_cat(env, " timeout -k 5 ", limit, " ", quote(mpirun_path()),
                         " --oversubscribe -np ", ranks, " ", strata_command(args)));
  }

  void compile(const std::string &model, const std::string &plan,
               const std::vector<std::string> &options) {
    std::vector<std::string> args = {"compile", model, "--train", "-o", plan};
    args.insert(args.end(), options.begin(), options.end());
    Outcome o = strata(args);
    ASSERT_EQ(o.code, 0) << o.err;
  }

  void zoo(const std::vector<std::string> &args) {
    Outcome o = strata(args);
    ASSERT_EQ(o.code, 0) << o.err;
  }

  // Every tensor of two checkpoints, bitwise (pieces put back together).
  void expect_same_checkpoints(const std::string &a, const std::string &b) {
    auto left = serialization::read_checkpoint((dir_ / a).string(), "");
    auto right = serialization::read_checkpoint((dir_ / b).string(), "");
    ASSERT_TRUE(left.is_ok()) << left.status().message();
    ASSERT_TRUE(right.is_ok()) << right.status().message();
    EXPECT_EQ(left->step, right->step);
    EXPECT_EQ(left->fingerprint, right->fingerprint);
    auto whole = [](const serialization::Checkpoint &c) {
      std::map<std::string, std::string> bytes;
      std::map<std::string, std::map<int, std::string>> pieces;
      for (const auto &[name, t] : c.tensors) {
        std::string data(reinterpret_cast<const char *>(t.data()), t.size_bytes());
        const size_t at = name.rfind("@shard");
        if (at == std::string::npos) {
          bytes[name] = data;
          continue;
        }
        pieces[name.substr(0, at)][std::atoi(name.c_str() + at + 6)] = data;
      }
      for (const auto &[name, parts] : pieces)
        for (const auto &[i, data] : parts)
          bytes[name] += data;
      return bytes;
    };
    auto l = whole(*left), r = whole(*right);
    ASSERT_EQ(l.size(), r.size());
    for (const auto &[name, data] : l) {
      ASSERT_TRUE(r.contains(name)) << name;
      EXPECT_TRUE(r.at(name) == data) << "tensor '" << name << "' differs";
    }
  }

  // Threaded run vs `ranks` MPI ranks: the same losses, bitwise the same
  // checkpoint after 3 steps.
  // `env` goes before mpirun; `placed`, if given, must be how the run's
  // `pipeline` line ends.
  void expect_equivalent(const std::string &plan, int ranks, std::vector<std::string> extra = {},
                         const std::string &env = "", const std::string &placed = "") {
    fs::remove_all(dir_ / "ck_mpi");
    fs::remove_all(dir_ / "ck_threads");
    Outcome threads = strata({"run", plan, "--steps", "3", "--checkpoint", "ck_threads"});
    ASSERT_EQ(threads.code, 0) << threads.err;
    std::vector<std::string> args = {"run", plan, "--steps", "3", "--checkpoint", "ck_mpi"};
    args.insert(args.end(), extra.begin(), extra.end());
    Outcome mpi = mpirun(ranks, args, 120, env);
    ASSERT_EQ(mpi.code, 0) << mpi.out << mpi.err;
    if (!placed.empty()) {
      EXPECT_NE(mpi.out.find(placed + "\n"), std::string::npos) << mpi.out;
    }
    EXPECT_EQ(losses(mpi.out), losses(threads.out)) << mpi.out << "\nvs\n" << threads.out;
    EXPECT_EQ(losses(mpi.out).size(), 3u) << mpi.out;
    // Rank 0 prints every rank's devices as measured there, and each rank's
    // peak RSS.
    const std::vector<testing::DeviceRow> rows = testing::device_rows(mpi.out);
    EXPECT_EQ(rows.size(), testing::device_rows(threads.out).size()) << mpi.out;
    EXPECT_GE(rows.size(), static_cast<size_t>(ranks)) << mpi.out;
    for (const testing::DeviceRow &row : rows) {
      EXPECT_GT(row.measured_busy_ms, 0) << mpi.out;
      EXPECT_EQ(row.allocated_arena, row.planned_arena) << mpi.out;
    }
    EXPECT_NE(mpi.out.find(str_cat("(rank ", ranks - 1, ")\n")), std::string::npos) << mpi.out;
    expect_same_checkpoints("ck_threads", "ck_mpi");
    auto manifest = serialization::read_checkpoint((dir_ / "ck_mpi").string(), "");
    ASSERT_TRUE(manifest.is_ok());
    EXPECT_EQ(manifest->ranks, ranks);
  }

  fs::path dir_;
};

// What the launcher's environment says, without a launcher.
TEST(MpiLaunchTest, ReadsTheLaunchersEnvironment) {
  for (const char *var :
       {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"})
    unsetenv(var);
  EXPECT_FALSE(runtime::detect_mpi_launch());
  setenv("PMI_RANK", "3", 1);
  setenv("PMI_SIZE", "8", 1);
  setenv("SLURM_LOCALID", "1", 1);
  auto slurm = runtime::detect_mpi_launch();
  ASSERT_TRUE(slurm);
  EXPECT_EQ(slurm->rank, 3);
  EXPECT_EQ(slurm->size, 8);
  EXPECT_EQ(slurm->local_rank, 1);
  setenv("PMI_RANK", "8", 1); // out of range: not a launch
  EXPECT_FALSE(runtime::detect_mpi_launch());
  setenv("OMPI_COMM_WORLD_RANK", "2", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);
  auto ompi = runtime::detect_mpi_launch();
  ASSERT_TRUE(ompi);
  EXPECT_EQ(ompi->rank, 2);
  EXPECT_EQ(ompi->size, 4);
  EXPECT_EQ(ompi->local_rank, 0);
  for (const char *var : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
                          "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"})
    unsetenv(var);
}

TEST_F(MpiTest, MlpPipelineAndDataParallelMatchThreads) {
  zoo({"zoo", "mlp", "-o", "mlp.strata"});
  compile("mlp.strata", "pp2.splan", {"--mesh", "1x1x2", "--microbatches", "4"});
  compile("mlp.strata", "dp2pp2.splan", {"--mesh", "2x1x2", "--microbatches", "2"});
  expect_equivalent("pp2.splan", 2);
  fs::remove_all(dir_ / "ck_mpi");
  fs::remove_all(dir_ / "ck_threads");
  expect_equivalent("dp2pp2.splan", 4);
  fs::remove_all(dir_ / "ck_mpi");
  fs::remove_all(dir_ / "ck_threads");
  // Two devices per rank: threads inside ranks, MPI between them.
  expect_equivalent("dp2pp2.splan", 2, {"--devices-per-rank", "2"});
}

TEST_F(MpiTest, MlpZeroShardsMatchThreads) {
  zoo({"zoo", "mlp", "-o", "mlp.strata"});
  compile(
      "mlp.strata", "zero.splan",
      {"--mesh", "2x1x1", "--microbatches", "2", "--zero", "1", "--optimizer", "adamw:lr=1e-3"});
  expect_equivalent("zero.splan", 2);
  // Each rank wrote its own pieces of the sharded optimizer state.
  auto checkpoint = serialization::read_checkpoint((dir_ / "ck_mpi").string(), "");
  ASSERT_TRUE(checkpoint.is_ok());
  int pieces = 0;
  for (const auto &[name, file] : checkpoint->file_of)
    if (name.find("@shard") != std::string::npos) ++pieces;
  EXPECT_GT(pieces, 0);
}

// ZeRO-2: every micro-batch's gradients reduce-scattered between the ranks
// into each one's shard; the same bits as threads, the state in shards.
TEST_F(MpiTest, MlpZeroTwoShardsMatchThreads) {
  zoo({"zoo", "mlp", "-o", "mlp.strata"});
  compile(
      "mlp.strata", "zero2.splan",
      {"--mesh", "2x1x2", "--microbatches", "2", "--zero", "2", "--optimizer", "adamw:lr=1e-3"});
  expect_equivalent("zero2.splan", 4);
  auto checkpoint = serialization::read_checkpoint((dir_ / "ck_mpi").string(), "");
  ASSERT_TRUE(checkpoint.is_ok());
  int pieces = 0;
  for (const auto &[name, file] : checkpoint->file_of)
    if (name.find("@shard") != std::string::npos) ++pieces;
  EXPECT_GT(pieces, 0);
}

// ZeRO-3: the parameters held as each rank's shard and all-gathered between
// the ranks before every forward and backward block; the same bits as
// threads, the parameters checkpointed in shards.
TEST_F(MpiTest, MlpZeroThreeShardsMatchThreads) {
  zoo({"zoo", "mlp", "-o", "mlp.strata"});
  compile(
      "mlp.strata", "zero3.splan",
      {"--mesh", "2x1x2", "--microbatches", "2", "--zero", "3", "--optimizer", "adamw:lr=1e-3"});
  expect_equivalent("zero3.splan", 4);
  auto checkpoint = serialization::read_checkpoint((dir_ / "ck_mpi").string(), "");
  ASSERT_TRUE(checkpoint.is_ok());
  int pieces = 0;
  for (const auto &[name, file] : checkpoint->file_of)
    if (name.find("@shard") != std::string::npos) ++pieces;
  EXPECT_GT(pieces, 0);
}

// Ranks on one host sum buckets straight from each other's memory in the
// MPI window, or (their memory kept private) in rounds staged in their
// segments: either way the bits of threads, for an all-reduce over 2 ranks
// and a ZeRO-1 reduce-scatter over 4.
TEST_F(MpiTest, LargeBucketsInSharedMemoryMatchThreads) {
  zoo({"zoo", "mlp", "--hidden", "1024,1024", "-o", "wide.strata"}); // 7.4 MB of gradients
  compile("wide.strata", "dp2.splan", {"--mesh", "2x1x1"});
  // The runs need well under 1 GiB of /dev/shm; a host with less keeps the
  // memory private, and the line must say so.
  struct statvfs shm = {};
  const bool room = ::statvfs("/dev/shm", &shm) == 0 &&
                    static_cast<double>(shm.f_bavail) * static_cast<double>(shm.f_frsize) > 1e9;
  const std::string shared =
      room ? "(devices), memory shared by the ranks on a host" : "x 1 CPU thread (devices)";
  expect_equivalent("dp2.splan", 2, {}, "", shared);
  expect_equivalent("dp2.splan", 2, {}, "STRATA_DEBUG_PRIVATE_MEMORY=1",
                    "x 1 CPU thread (devices)");
  compile("wide.strata", "zero1.splan",
          {"--mesh", "4x1x1", "--zero", "1", "--optimizer", "adamw:lr=1e-3"});
  expect_equivalent("zero1.splan", 4, {}, "", shared);
  expect_equivalent("zero1.splan", 4, {}, "STRATA_DEBUG_PRIVATE_MEMORY=1");
}

// Four members' tensor-parallel sums are each element added in rank order,
// ((x0 + x1) + x2) + x3, on ranks as on threads: the same bits.
TEST_F(MpiTest, FourWayTensorParallelSumsMatchThreads) {
  // Hidden 128: every layer's weights in pieces, 8 all-reduces per step.
  zoo({"zoo", "gpt", "--layers", "2", "--hidden", "128", "--heads", "4", "--seq", "16", "--vocab",
       "64", "--batch", "4", "-o", "gpt.strata"});
  compile("gpt.strata", "tp4.splan", {"--mesh", "1x4x1"});
  Outcome threads = strata({"run", "tp4.splan", "--steps", "3", "--checkpoint", "ck_threads"});
  ASSERT_EQ(threads.code, 0) << threads.err;
  Outcome mpi = mpirun(4, {"run", "tp4.splan", "--steps", "3", "--checkpoint", "ck_mpi"});
  ASSERT_EQ(mpi.code, 0) << mpi.out << mpi.err;
  EXPECT_EQ(losses(mpi.out), losses(threads.out)) << mpi.out << "\nvs\n" << threads.out;
  // The weights, pieces joined: the same bytes.
  for (const char *ck : {"ck_threads", "ck_mpi"}) {
    Outcome exported = strata({"export", ck, "-o", str_cat(ck, ".safetensors")});
    ASSERT_EQ(exported.code, 0) << exported.err;
  }
  EXPECT_EQ(testing::read_file(dir_ / "ck_threads.safetensors"),
            testing::read_file(dir_ / "ck_mpi.safetensors"));
}

TEST_F(MpiTest, GptPipelinesMatchThreads) {
  zoo({"zoo", "gpt", "--layers", "2", "--hidden", "64", "--heads", "2", "--seq", "16", "--vocab",
       "128", "--batch", "8", "-o", "gpt.strata"});
  compile("gpt.strata", "pp4.splan", {"--mesh", "1x1x4", "--microbatches", "4"});
  expect_equivalent("pp4.splan", 4);
  compile("gpt.strata", "zb4.splan",
          {"--mesh", "1x1x4", "--microbatches", "4", "--schedule", "zb-h1"});
  expect_equivalent("zb4.splan", 4);
  fs::remove_all(dir_ / "ck_mpi");
  fs::remove_all(dir_ / "ck_threads");
  compile("gpt.strata", "dp2pp2.splan",
          {"--mesh", "2x1x2", "--microbatches", "2", "--schedule", "gpipe"});
  expect_equivalent("dp2pp2.splan", 2, {"--devices-per-rank", "2"});
}

// Tensor-parallel groups across ranks: the same losses as threads, and
// checkpoints whose pieces ("<name>@tp<m>of<T>", with ZeRO-1 also
// "...@shard<i>of<n>") resume in one process, and the other way round.
TEST_F(MpiTest, TensorParallelMatchesThreadsAndResumesAcross) {
  zoo({"zoo", "gpt", "--layers", "2", "--hidden", "32", "--heads", "4", "--seq", "8", "--vocab",
       "64", "--batch", "8", "-o", "gpt.strata"});
  compile("gpt.strata", "tp.splan", {"--mesh", "1x2x2", "--microbatches", "2"});
  compile("gpt.strata", "tpz.splan",
          {"--mesh", "2x2x1", "--zero", "1", "--optimizer", "adamw:lr=1e-3"});
  for (const char *plan : {"tp.splan", "tpz.splan"}) {
    Outcome threads = strata({"run", plan, "--steps", "4"});
    ASSERT_EQ(threads.code, 0) << threads.err;
    const std::vector<std::string> all = losses(threads.out);
    ASSERT_EQ(all.size(), 4u) << threads.out;
    fs::remove_all(dir_ / "ck");
    Outcome mpi = mpirun(4, {"run", plan, "--steps", "3", "--checkpoint", "ck"});
    ASSERT_EQ(mpi.code, 0) << mpi.out << mpi.err;
    EXPECT_EQ(losses(mpi.out), std::vector<std::string>(all.begin(), all.begin() + 3)) << plan;
    // The ranks' pieces, resumed by threads.
    Outcome resumed = strata({"run", plan, "--steps", "4", "--resume", "ck"});
    ASSERT_EQ(resumed.code, 0) << resumed.err;
    EXPECT_EQ(losses(resumed.out), std::vector<std::string>{all[3]}) << plan << resumed.out;
    // Whole tensors from threads, resumed by ranks.
    fs::remove_all(dir_ / "ck_threads");
    ASSERT_EQ(strata({"run", plan, "--steps", "3", "--checkpoint", "ck_threads"}).code, 0);
    Outcome back = mpirun(
        2, {"run", plan, "--steps", "4", "--resume", "ck_threads", "--devices-per-rank", "2"});
    ASSERT_EQ(back.code, 0) << back.out << back.err;
    EXPECT_EQ(losses(back.out), std::vector<std::string>{all[3]}) << plan << back.out;
  }
  auto checkpoint = serialization::read_checkpoint((dir_ / "ck").string(), "");
  ASSERT_TRUE(checkpoint.is_ok());
  int nested = 0;
  for (const auto &[name, file] : checkpoint->file_of)
    nested += name.find("@tp") != std::string::npos && name.find("@shard") != std::string::npos;
  EXPECT_GT(nested, 0) << "ZeRO-1 shards of tensor-parallel pieces";
}

TEST_F(MpiTest, ResumesAcrossWorldSizes) {
  zoo({"zoo", "mlp", "-o", "mlp.strata"});
  compile("mlp.strata", "dp.splan", {"--mesh", "2x1x2", "--microbatches", "2"});
  Outcome straight = strata({"run", "dp.splan", "--steps", "4", "--checkpoint", "ck_straight"});
  ASSERT_EQ(straight.code, 0) << straight.err;
  // 2 steps on 4 ranks, 1 on 2 ranks, 1 in one process: the same weights.
  Outcome a = mpirun(4, {"run", "dp.splan", "--steps", "2", "--checkpoint", "ck"});
  ASSERT_EQ(a.code, 0) << a.err;
  Outcome b = mpirun(2, {"run", "dp.splan", "--steps", "3", "--resume", "ck", "--checkpoint", "ck",
                         "--devices-per-rank", "2"});
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_NE(b.out.find("resumed    ck at step 2"), std::string::npos) << b.out;
  Outcome c = strata({"run", "dp.splan", "--steps", "4", "--resume", "ck", "--checkpoint", "ck"});
  ASSERT_EQ(c.code, 0) << c.err;
  expect_same_checkpoints("ck_straight", "ck");
  EXPECT_EQ(losses(straight.out).back(), losses(c.out).back());
}

TEST_F(MpiTest, MismatchedPlanEndsEveryRank) {
  zoo({"zoo", "mlp", "-o", "mlp.strata"});
  zoo({"zoo", "mlp", "--hidden", "1024,1024", "-o", "wide.strata"});
  compile("mlp.strata", "a.splan", {"--mesh", "1x1x2", "--microbatches", "2"});
  // A bucket of 7.4 MB: this rank asks for a shared window at start-up, the
  // other for none, before the plans are compared.
  compile("wide.strata", "b.splan", {"--mesh", "2x1x1"});
  Outcome o = shell(str_cat("timeout -k 5 60 ", quote(mpirun_path()), " --oversubscribe -np 1 ",
                            strata_command({"run", "a.splan", "--timeout", "5"}), " : -np 1 ",
                            strata_command({"run", "b.splan", "--timeout", "5"})));
  EXPECT_NE(o.code, 0);
  EXPECT_LT(o.seconds, 15.0);
  // Both ranks say what differs and who has what.
  EXPECT_EQ(count_of(o.err, "the ranks disagree on the plan fingerprint"), 2) << o.err;
  EXPECT_NE(o.err.find("rank 0 (a.splan"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("rank 1 (b.splan"), std::string::npos) << o.err;
}

// Ranks that share the plan but not the run's settings would train on mixed
// batches or save at different steps: each difference is named at start-up.
TEST_F(MpiTest, MismatchedRunSettingsEndEveryRank) {
  zoo({"zoo", "mlp", "-o", "mlp.strata"});
  compile("mlp.strata", "a.splan", {"--mesh", "1x1x2", "--microbatches", "2"});
  for (const std::string folder : {"d0", "d1"}) {
    fs::create_directories(dir_ / folder);
    std::ofstream(dir_ / folder / "input.npy") << folder;
  }
  auto rank = [&](const std::string &seed, const std::string &data, const std::string &ck) {
    return strata_command(
        {"run", "a.splan", "--timeout", "5", "--seed", seed, "--data", data, "--checkpoint", ck});
  };
  Outcome o = shell(str_cat("timeout -k 5 60 ", quote(mpirun_path()), " --oversubscribe -np 1 ",
                            rank("1", "d0", "ck0"), " : -np 1 ", rank("2", "d1", "ck1")));
  EXPECT_NE(o.code, 0);
  EXPECT_LT(o.seconds, 15.0);
  for (const std::string what : {"--seed", "--data", "--checkpoint folder"})
    EXPECT_EQ(count_of(o.err, "disagree on the " + what + ":"), 2) << what << "\n" << o.err;
  EXPECT_NE(o.err.find("rank 0 (a.splan on "), std::string::npos) << o.err;
  EXPECT_EQ(o.err.find("disagree on the --steps"), std::string::npos) << o.err;
  EXPECT_FALSE(fs::exists(dir_ / "ck0") || fs::exists(dir_ / "ck1"));
}

TEST_F(MpiTest, WrongRankCountIsRefused) {
  zoo({"zoo", "mlp", "-o", "mlp.strata"});
  compile("mlp.strata", "pp4.splan", {"--mesh", "1x1x4", "--microbatches", "4"});
  Outcome o = mpirun(2, {"run", "pp4.splan", "--timeout", "5"}, 60);
  EXPECT_NE(o.code, 0);
  EXPECT_EQ(count_of(o.err, "needs 4 ranks, but the launcher started 2"), 2) << o.err;
  EXPECT_NE(o.err.find("--devices-per-rank 2"), std::string::npos) << o.err;
}

// NCCL's bootstrap: rank 0's unique id reaches every rank intact.
TEST_F(MpiTest, UniqueIdReachesEveryRank) {
  const fs::path probe = strata_binary().parent_path().parent_path() / "tests/tools/mpi_probe";
  ASSERT_TRUE(fs::exists(probe)) << probe;
  Outcome o = shell(str_cat("timeout -k 5 60 ", quote(mpirun_path()), " --oversubscribe -np 3 ",
                            quote(probe.string())));
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  std::regex line(R"(rank (\d) of 3: id ([0-9a-f]+) \((\d+) bytes\))");
  std::set<std::string> ids;
  int ranks = 0;
  for (auto it = std::sregex_iterator(o.out.begin(), o.out.end(), line);
       it != std::sregex_iterator(); ++it) {
    ++ranks;
    ids.insert((*it)[2]);
    EXPECT_EQ((*it)[3], "128");
  }
  EXPECT_EQ(ranks, 3) << o.out;
  EXPECT_EQ(ids.size(), 1u) << o.out;
  EXPECT_NE(*ids.begin(), std::string(256, '0'));
  // With NCCL each rank then makes its communicator from the id: it works on a
  // GPU machine; elsewhere every rank fails at once with NCCL's reason.
  if (!runtime::nccl_built() || o.out.find("nccl init") == std::string::npos) return;
  std::regex init(R"(rank \d nccl init: (ok|NCCL communicator init \(rank \d of 3\) failed: .+))");
  int inits = 0;
  for (auto it = std::sregex_iterator(o.out.begin(), o.out.end(), init);
       it != std::sregex_iterator(); ++it)
    ++inits;
  EXPECT_EQ(inits, 3) << o.out;
  EXPECT_LT(o.seconds, 20.0);
}

// A pipeline on GPUs across ranks: each rank takes the GPU of its local rank
// and the ranks talk over NCCL. It trains as the CPU run does on a machine
// with a GPU per rank; elsewhere every rank ends with the reason at once.
TEST_F(MpiTest, CudaPipelineAcrossRanksTrainsOrSaysWhyNot) {
  zoo({"zoo", "mlp", "-o", "mlp.strata"});
  compile("mlp.strata", "pp2.splan", {"--mesh", "1x1x2", "--microbatches", "4"});
  Outcome pinned = mpirun(2, {"run", "pp2.splan", "--backend", "cuda", "--gpu", "1"}, 60);
  EXPECT_NE(pinned.code, 0);
  EXPECT_NE(pinned.err.find("drop --gpu/--gpus"), std::string::npos) << pinned.err;
  Outcome gpu =
      mpirun(2, {"run", "pp2.splan", "--backend", "cuda", "--steps", "3", "--timeout", "30"}, 120);
  const std::string reason = runtime::cuda_unavailable_reason();
  if (!reason.empty()) {
    EXPECT_NE(gpu.code, 0);
    EXPECT_EQ(count_of(gpu.err, reason), 2) << gpu.err;
    return;
  }
  if (runtime::cuda_device_count() < 2) {
    EXPECT_NE(gpu.code, 0);
    EXPECT_NE(gpu.err.find("start at most one process per GPU"), std::string::npos) << gpu.err;
    return;
  }
  ASSERT_EQ(gpu.code, 0) << gpu.err;
  EXPECT_NE(gpu.out.find("processes, NCCL between their GPUs"), std::string::npos) << gpu.out;
  Outcome cpu = strata({"run", "pp2.splan", "--steps", "3"});
  ASSERT_EQ(cpu.code, 0) << cpu.err;
  const std::vector<std::string> on_gpu = losses(gpu.out), on_cpu = losses(cpu.out);
  ASSERT_EQ(on_gpu.size(), on_cpu.size()) << gpu.out << cpu.out;
  for (size_t i = 0; i < on_gpu.size(); ++i)
    EXPECT_NEAR(std::stod(on_gpu[i]), std::stod(on_cpu[i]), 2e-4) << "step " << i + 1;
}

// The injected faults: device 1 (rank 1) at step 2, instruction 3.
class MpiFailureTest : public MpiTest {
protected:
  void SetUp() override {
    MpiTest::SetUp();
    if (IsSkipped()) return;
    zoo({"zoo", "mlp", "-o", "mlp.strata"});
    compile("mlp.strata", "dp.splan", {"--mesh", "2x1x2", "--microbatches", "2"});
  }
  static constexpr int kTimeout = 4;
  Outcome run_with_fault(const std::string &fault) {
    return mpirun(4, {"run", "dp.splan", "--steps", "5", "--timeout", str_cat(kTimeout)},
                  kTimeout + 30, "STRATA_FAULT=" + fault);
  }
  // Every rank but `lost` printed one error that names rank `lost`.
  // No process of the job outlives it: mpirun ended every rank. (Every
  // process the test starts works in its scratch folder.)
  void expect_no_orphans() {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    std::string left;
    std::error_code error;
    for (const auto &entry : fs::directory_iterator("/proc", error)) {
      const std::string pid = entry.path().filename().string();
      if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
      std::error_code ignored;
      if (fs::read_symlink(entry.path() / "cwd", ignored) == dir_)
        left += str_cat(pid, " (", read_file(entry.path() / "comm"), ") ");
    }
    EXPECT_TRUE(left.empty()) << "processes left behind: " << left;
  }

  // `whereabouts`: the rank died silently, so the report says where it was
  // last heard from; otherwise its own error names the step and instruction.
  void expect_survivors_report(const Outcome &o, int lost, const std::string &must_mention,
                               bool whereabouts = true) {
    EXPECT_NE(o.code, 0);
    EXPECT_LT(o.seconds, kTimeout + 10.0) << o.err;
    expect_no_orphans();
    for (int r = 0; r < 4; ++r) {
      if (r == lost) continue;
      std::regex line(str_cat("strata: error: rank ", r, " of 4[^\\n]*"));
      std::smatch m;
      ASSERT_TRUE(std::regex_search(o.err, m, line)) << "rank " << r << " said nothing:\n" << o.err;
      const std::string text = m.str();
      EXPECT_NE(text.find(str_cat("rank ", lost, " ")), std::string::npos) << text;
      EXPECT_NE(text.find(must_mention), std::string::npos) << text;
      // Where the lost rank was: an instruction of a step, or between steps
      // when that was its last report.
      if (!whereabouts) {
        EXPECT_NE(text.find("step 2, instruction 3 ("), std::string::npos) << text;
        continue;
      }
      EXPECT_TRUE(std::regex_search(
          text, std::regex(str_cat(
                    "rank ", lost, R"( \(devices \d+\) was last heard from [0-9.]+ s ago, at )",
                    R"((step \d+, instruction \d+ \(|the end of step \d+|start-up))"))))
          << text;
    }
  }
};

TEST_F(MpiFailureTest, KilledRankIsNamedByEverySurvivor) {
  Outcome o = run_with_fault("kill:1:2:3");
  expect_survivors_report(o, 1, "a rank was lost: rank 1");
}

// Rank 2 acts as if no liveness answer reached it (as when its MPI progress
// stopped after rank 1 died, which CI saw once): the ranks on its host are
// still told apart by whether their processes exist.
TEST_F(MpiFailureTest, KilledRankIsNamedByARankWhoseMpiIsStuck) {
  Outcome o = mpirun(4, {"run", "dp.splan", "--steps", "5", "--timeout", str_cat(kTimeout)},
                     kTimeout + 30, "STRATA_FAULT=kill:1:2:3 STRATA_DEBUG_DEAF_RANK=2");
  expect_survivors_report(o, 1, "a rank was lost: rank 1");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(o.err, m, std::regex("strata: error: rank 2 of 4[^\\n]*")));
  EXPECT_TRUE(
      std::regex_search(m.str(), std::regex(R"(, and its process \(pid \d+\) has ended\. )")))
      << m.str();
  EXPECT_EQ(m.str().find("rank 0 ("), std::string::npos) << m.str();
  EXPECT_EQ(m.str().find("rank 3 ("), std::string::npos) << m.str();
}

// The survivors wait for a stalled rank 1 in a meeting through shared memory
// (a bucket of 7.4 MB is summed in rounds in the segments), not in a
// message: they still declare it lost.
TEST_F(MpiFailureTest, StalledRankIsDeclaredLostFromASharedMemoryMeeting) {
  zoo({"zoo", "mlp", "--hidden", "1024,1024", "-o", "wide.strata"});
  compile("wide.strata", "wide.splan", {"--mesh", "4x1x1"});
  Outcome o = mpirun(4, {"run", "wide.splan", "--steps", "5", "--timeout", str_cat(kTimeout)},
                     kTimeout + 30, "STRATA_FAULT=stop:1:2:3 STRATA_DEBUG_PRIVATE_MEMORY=1");
  expect_survivors_report(o, 1, "rank 1 is lost: nothing heard from it for ");
  EXPECT_NE(o.err.find("shared-memory barrier"), std::string::npos) << o.err;
}

TEST_F(MpiFailureTest, RankThatExitsIsNamedByEverySurvivor) {
  Outcome o = run_with_fault("exit:1:2:3");
  expect_survivors_report(o, 1, "a rank was lost: rank 1");
}

TEST_F(MpiFailureTest, StalledRankIsDeclaredLost) {
  Outcome o = run_with_fault("stop:1:2:3");
  expect_survivors_report(o, 1, "rank 1 is lost: nothing heard from it for ");
  EXPECT_GE(o.seconds, kTimeout * 0.9);
}

TEST_F(MpiFailureTest, ErrorOnOneRankEndsEveryRank) {
  Outcome o = run_with_fault("error:1:2:3");
  expect_survivors_report(o, 1, "device 1 (stage 0 replica 1) on rank 1 failed", false);
  EXPECT_NE(o.err.find("injected fault"), std::string::npos) << o.err;
}

TEST_F(MpiFailureTest, RankThatNeverStartsEndsTheJob) {
  Outcome o = run_with_fault("nostart:2");
  EXPECT_NE(o.code, 0);
  EXPECT_LT(o.seconds, kTimeout + 10.0) << o.err;
  EXPECT_GE(count_of(o.err, "MPI start-up did not finish within 4 s"), 1) << o.err;
  expect_no_orphans();
  EXPECT_NE(o.err.find("never started"), std::string::npos) << o.err;
}

// A checkpoint folder another run holds: rank 0, which locks the folder for
// the job, is refused before the first step with the holder's pid, and every
// rank ends. Once the folder is free, the four ranks of one job share it
// (only rank 0 takes the lock).
TEST_F(MpiFailureTest, LockedCheckpointFolderEndsEveryRank) {
  const std::vector<std::string> args = {"run", "dp.splan",  "--steps",        "2", "--checkpoint",
                                         "ck",  "--timeout", str_cat(kTimeout)};
  {
    auto held = serialization::CheckpointLock::acquire((dir_ / "ck").string());
    ASSERT_TRUE(held.is_ok()) << held.status().message();
    Outcome o = mpirun(4, args, kTimeout + 30);
    EXPECT_NE(o.code, 0);
    EXPECT_LT(o.seconds, kTimeout + 10.0) << o.err;
    EXPECT_NE(o.err.find(str_cat("rank 0 of 4: --checkpoint: ck: the checkpoint folder is in use "
                                 "by another strata run (pid ",
                                 ::getpid(), " on ")),
              std::string::npos)
        << o.err;
    EXPECT_EQ(o.out.find("step 1/"), std::string::npos) << o.out;
    EXPECT_FALSE(fs::exists(dir_ / "ck" / serialization::kCheckpointManifestFile));
    expect_no_orphans();
  }
  Outcome o = mpirun(4, args, kTimeout + 30);
  ASSERT_EQ(o.code, 0) << o.err;
  auto checkpoint = serialization::read_checkpoint((dir_ / "ck").string(), "");
  ASSERT_TRUE(checkpoint.is_ok()) << checkpoint.status().message();
  EXPECT_EQ(checkpoint->step, 2);
  EXPECT_EQ(checkpoint->ranks, 4);
}

// Ranks without a shared filesystem each save into a folder of their own:
// rank 1's file of step 2 is removed once written, as rank 0 on another host
// would not see it. The commit fails on every rank, which once all reported
// success with a manifest listing a file rank 0 did not have; the error
// names the file and the rank, and the step-1 checkpoint stays.
TEST_F(MpiFailureTest, CheckpointFileRankZeroLacksEndsEveryRank) {
  Outcome o = mpirun(4,
                     {"run", "dp.splan", "--steps", "3", "--checkpoint", "ck", "--checkpoint-every",
                      "1", "--timeout", str_cat(kTimeout)},
                     kTimeout + 30, "STRATA_FAULT=ckptlose:1:2");
  EXPECT_NE(o.code, 0);
  EXPECT_LT(o.seconds, kTimeout + 10.0) << o.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(o.err, m, std::regex("strata: error: rank 0 of 4[^\\n]*")))
      << o.err;
  EXPECT_NE(m.str().find("checkpoint ck at step 2 was not committed (the previous one stays)"),
            std::string::npos)
      << m.str();
  EXPECT_NE(m.str().find("rank 1's model-step2-rank1-of4.safetensors is missing (no shared "
                         "filesystem?"),
            std::string::npos)
      << m.str();
  EXPECT_EQ(o.out.find("step 3/"), std::string::npos) << o.out;
  expect_no_orphans();
  auto checkpoint = serialization::read_checkpoint((dir_ / "ck").string(), "");
  ASSERT_TRUE(checkpoint.is_ok()) << checkpoint.status().message();
  EXPECT_EQ(checkpoint->step, 1);
}

TEST_F(MpiFailureTest, KillDuringCheckpointKeepsThePreviousOne) {
  // Rank 2 dies after writing its file of the step-2 checkpoint, before the
  // commit: step 1's checkpoint stays, and a run resumes from it.
  Outcome o = mpirun(4,
                     {"run", "dp.splan", "--steps", "3", "--checkpoint", "ck", "--checkpoint-every",
                      "1", "--timeout", str_cat(kTimeout)},
                     kTimeout + 30, "STRATA_FAULT=ckptkill:2:2");
  EXPECT_NE(o.code, 0);
  auto checkpoint = serialization::read_checkpoint((dir_ / "ck").string(), "");
  ASSERT_TRUE(checkpoint.is_ok()) << checkpoint.status().message();
  EXPECT_EQ(checkpoint->step, 1);
  Outcome resumed = mpirun(4, {"run", "dp.splan", "--steps", "3", "--resume", "ck"});
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("resumed    ck at step 1"), std::string::npos) << resumed.out;
  Outcome straight = strata({"run", "dp.splan", "--steps", "3"});
  EXPECT_EQ(losses(resumed.out).back(), losses(straight.out).back());
}

} // namespace
} // namespace strata
