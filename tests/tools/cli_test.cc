// End-to-end tests of the `strata` binary: each test runs it as a user would, in
// a scratch folder, and checks exit status, stdout, stderr and the files written.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "graph/builder.h"
#include "ops/registry.h"
#include "runtime/cuda/cuda_executor.h"
#include "serialization/model_io.h"
#include "serialization/npy.h"
#include "serialization/plan_io.h"
#include "tests/tools/cli_util.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using testing::Outcome;
using testing::quote;
using testing::read_file;
using testing::strata_binary;
using testing::write_file;

class CliTest : public ::testing::Test {
protected:
  void SetUp() override {
    const auto *info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           str_cat("strata_cli_", ::getpid(), "_", info->test_suite_name(), "_", info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ASSERT_TRUE(fs::exists(strata_binary())) << strata_binary() << " is not built";
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // Runs `strata args...` in the scratch folder.
  Outcome strata(const std::vector<std::string> &args) {
    std::string command = quote(strata_binary().string());
    for (const std::string &arg : args)
      command += " " + quote(arg);
    return testing::run_in(dir_, command);
  }

  fs::path path(const std::string &name) const { return dir_ / name; }

  void make_gpt(const std::string &file) {
    Outcome zoo = strata({"zoo", "gpt", "--layers", "2", "--hidden", "128", "--heads", "4", "--seq",
                          "32", "--vocab", "512", "-o", file});
    ASSERT_EQ(zoo.code, 0) << zoo.err;
  }

  // m.strata: a small MLP (batch 8), and with `train_plan` t.splan, its
  // training plan with the default optimizer.
  void make_mlp(const char *train_plan = nullptr) {
    Outcome zoo =
        strata({"zoo", "mlp", "--batch", "8", "--input", "16", "--hidden", "16", "-o", "m.strata"});
    ASSERT_EQ(zoo.code, 0) << zoo.err;
    if (train_plan == nullptr) return;
    Outcome compile = strata({"compile", "m.strata", "--train", "-o", train_plan});
    ASSERT_EQ(compile.code, 0) << compile.err;
  }

  fs::path dir_;
};

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

constexpr int64_t B = 2, S = 32, H = 128, V = 512, L = 2, NH = 4;
constexpr int64_t kGptParams = V * H + S * H + L * (12 * H * H + 13 * H) + 2 * H;

TEST_F(CliTest, GptZooInspectRun) {
  Outcome zoo = strata({"zoo", "gpt", "--layers", "2", "--hidden", "128", "--heads", "4", "--seq",
                        "32", "--vocab", "512", "-o", "m.strata"});
  ASSERT_EQ(zoo.code, 0) << zoo.err;
  EXPECT_TRUE(zoo.err.empty()) << zoo.err;
  EXPECT_NE(zoo.out.find("m.strata"), std::string::npos) << zoo.out;
  EXPECT_NE(zoo.out.find("466,432 parameters"), std::string::npos) << zoo.out;
  ASSERT_TRUE(fs::exists(path("m.strata")));

  Outcome inspect = strata({"inspect", "m.strata"});
  ASSERT_EQ(inspect.code, 0) << inspect.err;
  EXPECT_NE(inspect.out.find("tokens: i64[2, 32]"), std::string::npos) << inspect.out;
  EXPECT_NE(inspect.out.find("logits: f32[2, 32, 512]"), std::string::npos) << inspect.out;
  EXPECT_NE(inspect.out.find("466,432 (466.4K)"), std::string::npos) << inspect.out;
  EXPECT_NE(inspect.out.find("MatMul"), std::string::npos) << inspect.out;
  EXPECT_NE(inspect.out.find("more nodes"), std::string::npos) << inspect.out;

  Outcome all = strata({"inspect", "m.strata", "--all"});
  ASSERT_EQ(all.code, 0) << all.err;
  EXPECT_EQ(all.out.find("more nodes"), std::string::npos);
  EXPECT_NE(all.out.find("layer1.mlp.fc2"), std::string::npos);

  Outcome run = strata({"run", "m.strata", "--output", "y.npy"});
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_NE(run.out.find("median"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("arena"), std::string::npos) << run.out;
  auto y = serialization::read_npy(path("y.npy").string());
  ASSERT_TRUE(y.is_ok()) << y.status().to_string();
  EXPECT_EQ(y->type, (TensorType{DType::kF32, {B, S, V}}));
  for (int64_t i = 0; i < y->type.num_elements(); ++i)
    ASSERT_TRUE(std::isfinite(y->as<float>()[i])) << i;
}

TEST_F(CliTest, InspectJsonCarriesTheNumbers) {
  ASSERT_NO_FATAL_FAILURE(make_gpt("m.strata"));
  Outcome o = strata({"inspect", "m.strata", "--format", "json"});
  ASSERT_EQ(o.code, 0) << o.err;
  nlohmann::json j = nlohmann::json::parse(o.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << o.out;
  EXPECT_EQ(j["name"], "gpt");
  EXPECT_EQ(j["parameters"].get<int64_t>(), kGptParams);
  EXPECT_EQ(j["parameter_bytes"].get<int64_t>(), 4 * kGptParams);
  ASSERT_EQ(j["outputs"].size(), 1u);
  EXPECT_EQ(j["outputs"][0]["shape"], nlohmann::json::array({B, S, V}));
  EXPECT_EQ(j["inputs"][0]["dtype"], "i64");

  // The total is the sum over nodes, and the MatMuls match the hand count.
  double total = 0, matmul = 0;
  for (const auto &node : j["nodes"]) {
    total += node["flops"].get<double>();
    if (node["op"] == "MatMul") matmul += node["flops"].get<double>();
  }
  EXPECT_DOUBLE_EQ(j["flops"].get<double>(), total);
  double hand =
      L * (2.0 * B * S * 12 * H * H + 2 * (2.0 * B * NH * S * S * (H / NH))) + 2.0 * B * S * H * V;
  EXPECT_DOUBLE_EQ(matmul, hand);
  double share = 0;
  for (const auto &op : j["ops"])
    share += op["share"].get<double>();
  EXPECT_NEAR(share, 1.0, 1e-9);
}

// A name that is not UTF-8 text is refused when the model loads, with the
// bytes escaped, so no report (JSON least of all) meets it; a path that is
// not UTF-8 still gives a JSON report.
TEST_F(CliTest, InspectJsonOfNamesThatAreNotUtf8) {
  GraphBuilder b("bad_names", ops::OpRegistry::global());
  TensorId x = b.input("x", DType::kF32, {2, 3});
  b.output(b.op1("Relu", {x}, {}, "act\xff"));
  auto graph = std::move(b).finish();
  ASSERT_TRUE(graph.is_ok()) << graph.status().to_string();
  ASSERT_TRUE(serialization::save_model(*graph, path("bad.strata").string()).is_ok());
  ASSERT_TRUE(serialization::save_model(*graph, path("bad.json").string()).is_ok());
  for (const char *file : {"bad.strata", "bad.json"}) {
    Outcome o = strata({"inspect", file, "--format", "json"});
    expect_one_line_error(o, str_cat(file, ": tensor 1: field name 'act\\xff' is not valid UTF-8"));
    EXPECT_EQ(o.out, "") << file;
  }

  ASSERT_NO_FATAL_FAILURE(make_mlp());
  fs::copy_file(path("m.strata"), path("m\xfe.strata"));
  Outcome renamed = strata({"inspect", "m\xfe.strata", "--format", "json"});
  ASSERT_EQ(renamed.code, 0) << renamed.err;
  nlohmann::json j = nlohmann::json::parse(renamed.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << renamed.out;
  EXPECT_EQ(j["file"], "m\xef\xbf\xbd.strata");
}

TEST_F(CliTest, InspectDotAndOutputFile) {
  ASSERT_NO_FATAL_FAILURE(make_gpt("m.strata"));
  Outcome o = strata({"inspect", "m.strata", "--format", "dot", "-o", "m.dot"});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(read_file(path("m.dot")).find("digraph"), std::string::npos);
  Outcome bad = strata({"inspect", "m.strata", "--format", "yaml"});
  expect_one_line_error(bad, "yaml");
}

TEST_F(CliTest, ConvertRoundTripIsByteIdentical) {
  ASSERT_NO_FATAL_FAILURE(make_gpt("a.strata"));
  ASSERT_EQ(strata({"convert", "a.strata", "-o", "b.json"}).code, 0);
  ASSERT_EQ(strata({"convert", "b.json", "-o", "c.strata"}).code, 0);
  ASSERT_EQ(strata({"convert", "c.strata", "-o", "d.json"}).code, 0);
  std::string a = read_file(path("a.strata")), c = read_file(path("c.strata"));
  EXPECT_FALSE(a.empty());
  EXPECT_TRUE(a == c) << "binary -> json -> binary changed the bytes";
  EXPECT_TRUE(read_file(path("b.json")) == read_file(path("d.json")));
  // The zoo can write JSON directly, and it is the same model.
  Outcome zoo = strata({"zoo", "gpt", "--layers", "2", "--hidden", "128", "--heads", "4", "--seq",
                        "32", "--vocab", "512", "-o", "e.json"});
  ASSERT_EQ(zoo.code, 0) << zoo.err;
  EXPECT_TRUE(read_file(path("e.json")) == read_file(path("b.json")));
}

TEST_F(CliTest, MissingFileNamesIt) {
  expect_one_line_error(strata({"inspect", "nope.strata"}), "nope.strata");
  expect_one_line_error(strata({"run", "nope.strata"}), "nope.strata");
  expect_one_line_error(strata({"convert", "nope.json", "-o", "x.strata"}), "nope.json");
  EXPECT_FALSE(fs::exists(path("x.strata")));
}

TEST_F(CliTest, CorruptFileNamesIt) {
  write_file(path("garbage.strata"), "this is not a flatbuffer, just some text of some length");
  expect_one_line_error(strata({"inspect", "garbage.strata"}), "garbage.strata");
  write_file(path("garbage.json"), "{\"nodes\": [1, 2,");
  expect_one_line_error(strata({"inspect", "garbage.json"}), "garbage.json");
  // A real model cut in half.
  ASSERT_NO_FATAL_FAILURE(make_gpt("whole.strata"));
  std::string bytes = read_file(path("whole.strata"));
  write_file(path("half.strata"), std::string_view(bytes).substr(0, bytes.size() / 2));
  expect_one_line_error(strata({"run", "half.strata"}), "half.strata");
}

TEST_F(CliTest, UsageErrors) {
  expect_one_line_error(strata({"frobnicate"}), "unknown command 'frobnicate'");
  expect_one_line_error(strata({"zoo", "resnet", "-o", "r.strata"}), "resnet");
  expect_one_line_error(strata({}));
  expect_one_line_error(strata({"zoo"}));
  expect_one_line_error(strata({"zoo", "gpt"}), "--output"); // -o is required
  expect_one_line_error(strata({"zoo", "gpt", "--layers", "two", "-o", "m.strata"}), "layers");
  expect_one_line_error(strata({"inspect"}), "FILE");
  expect_one_line_error(strata({"run", "m.strata", "--repeat", "0"}), "repeat");
  // A misspelt option is named, with the nearest one the command has.
  Outcome typo = strata({"run", "t.splan", "--step", "2"});
  expect_one_line_error(typo, "unknown option --step for `strata run` (did you mean --steps?)");
  EXPECT_EQ(typo.code, 2);
  expect_one_line_error(strata({"zoo", "gpt", "--hiden=64", "-o", "m.strata"}),
                        "unknown option --hiden for `strata zoo gpt` (did you mean --hidden?)");
  expect_one_line_error(strata({"inspect", "m.strata", "--frobnicate"}),
                        "unknown option --frobnicate for `strata inspect` (see");
}

TEST_F(CliTest, BadZooOptionsAreErrors) {
  expect_one_line_error(strata({"zoo", "gpt", "--hidden", "100", "--heads", "3", "-o", "m.strata"}),
                        "heads");
  EXPECT_FALSE(fs::exists(path("m.strata")));
  expect_one_line_error(strata({"zoo", "convnet", "--image-size", "30", "-o", "c.strata"}),
                        "divisible");
}

// Numbers beyond what an option means are refused by the command line, naming
// the flag and its range, before any work: --devices 2^31 once reached the
// cluster model as a negative count (an assertion, or SIGFPE), a seq of 2^31
// made the GPT's mask allocation wrap around, --seed -1 became 2^64 - 1, and
// a number beyond int64 became the largest one.
TEST_F(CliTest, NumbersOutOfRangeNameTheFlagAndTheRange) {
  ASSERT_NO_FATAL_FAILURE(make_mlp("t.splan"));
  const struct {
    std::vector<std::string> args;
    std::string cause;
  } cases[] = {
      {{"compile", "m.strata", "--train", "--auto", "--devices", "2147483648", "-o", "a.splan"},
       "--devices: Value 2147483648 not in range 1 to 4096"},
      {{"compile", "m.strata", "--train", "--auto", "--devices", "4294967296", "-o", "a.splan"},
       "--devices: Value 4294967296 not in range 1 to 4096"},
      {{"compile", "m.strata", "--train", "--auto", "--devices", "-1", "-o", "a.splan"},
       "--devices: Value -1 not in range 1 to 4096"},
      {{"compile", "m.strata", "--train", "--microbatches", "99999999999999999999", "-o",
        "a.splan"},
       "--microbatches: Value 99999999999999999999 not in range 1 to 1048576"},
      {{"zoo", "gpt", "--seq", "2147483648", "-o", "g.strata"},
       "--seq: Value 2147483648 not in range 1 to 16383"},
      {{"zoo", "gpt", "--layers", "4097", "--hidden", "8", "--heads", "1", "--seq", "4", "--vocab",
        "8", "-o", "g.strata"},
       "--layers: Value 4097 not in range 1 to 4096"},
      {{"zoo", "mlp", "--batch", "99999999999999999999", "-o", "g.strata"},
       "--batch: Value 99999999999999999999 not in range 1 to 2147483647"},
      {{"zoo", "mlp", "--hidden", "16,0", "-o", "g.strata"},
       "--hidden: Value 0 not in range 1 to 2147483647"},
      {{"zoo", "convnet", "--fc-hidden", "-1", "-o", "g.strata"},
       "--fc-hidden: Value -1 not in range 0 to 2147483647"},
      {{"zoo", "mlp", "--seed", "-1", "-o", "g.strata"},
       "--seed: '-1' is not an integer from 0 to 18446744073709551615"},
      {{"run", "m.strata", "--seed", "18446744073709551616"},
       "--seed: '18446744073709551616' is not an integer from 0 to 18446744073709551615"},
      // (A training plan, which refused these only after loading, if at all.)
      {{"run", "t.splan", "--repeat", "99999999999999999999"},
       "--repeat: Value 99999999999999999999 not in range 1 to 1048576"},
      {{"run", "t.splan", "--warmup", "1048577"},
       "--warmup: Value 1048577 not in range 0 to 1048576"},
      {{"run", "m.strata", "--gpu", "4294967296"},
       "--gpu: Value 4294967296 not in range 0 to 2147483647"},
      {{"run", "m.strata", "--steps", "99999999999999999999"},
       "--steps: Value 99999999999999999999 not in range 1 to 1099511627776"},
      // (Once read as the largest int64: a save never due.)
      {{"run", "m.strata", "--checkpoint-every", "99999999999999999999"},
       "--checkpoint-every: Value 99999999999999999999 not in range 0 to 1099511627776"},
      {{"run", "m.strata", "--checkpoint-every", "-1"},
       "--checkpoint-every: Value -1 not in range 0 to 1099511627776"},
      {{"inspect", "m.strata", "--nodes", "99999999999999999999"},
       "--nodes: '99999999999999999999' is not an integer from 0 to 9223372036854775807"},
  };
  for (const auto &c : cases) {
    Outcome o = strata(c.args);
    expect_one_line_error(o, c.cause);
    EXPECT_EQ(o.code, 2) << c.cause; // a usage error, found before any work
    EXPECT_FALSE(fs::exists(path("a.splan")));
    EXPECT_FALSE(fs::exists(path("g.strata")));
  }
  // The largest seed is a seed.
  Outcome seeded = strata({"zoo", "mlp", "--seed", "18446744073709551615", "-o", "g.strata"});
  EXPECT_EQ(seeded.code, 0) << seeded.err;
}

TEST_F(CliTest, HelpForEverySubcommand) {
  std::vector<std::vector<std::string>> commands = {
      {"--help"},
      {"zoo", "--help"},
      {"zoo", "mlp", "--help"},
      {"zoo", "convnet", "--help"},
      {"zoo", "gpt", "--help"},
      {"convert", "--help"},
      {"inspect", "--help"},
      {"run", "--help"},
      {"compile", "--help"},
      {"simulate", "--help"},
      {"verify", "--help"},
      {"ops", "--help"},
  };
  for (const auto &args : commands) {
    Outcome o = strata(args);
    std::string what = args.size() > 1 ? args[args.size() - 2] : "strata";
    EXPECT_EQ(o.code, 0) << what << ": " << o.err;
    EXPECT_NE(o.out.find("Usage"), std::string::npos) << what << ": " << o.out;
    EXPECT_NE(o.out.find("Example"), std::string::npos) << what << ": " << o.out;
  }
  // Each subcommand's help is its own, not the top-level one.
  EXPECT_NE(strata({"zoo", "gpt", "--help"}).out.find("--heads"), std::string::npos);
  EXPECT_NE(strata({"run", "--help"}).out.find("--warmup"), std::string::npos);
  EXPECT_NE(strata({"inspect", "--help"}).out.find("--format"), std::string::npos);
}

TEST_F(CliTest, VersionAndOps) {
  Outcome v = strata({"--version"});
  EXPECT_EQ(v.code, 0);
  EXPECT_TRUE(v.out.starts_with("strata ")) << v.out;
  Outcome ops = strata({"ops"});
  ASSERT_EQ(ops.code, 0) << ops.err;
  for (const ops::OpDef *def : ops::OpRegistry::global().all())
    EXPECT_NE(ops.out.find(std::string(def->name)), std::string::npos) << def->name;
  EXPECT_NE(ops.out.find("MatMul"), std::string::npos);
  Outcome verbose = strata({"ops", "--verbose"});
  ASSERT_EQ(verbose.code, 0);
  EXPECT_NE(verbose.out.find("trans_b"), std::string::npos);
}

// --backend cuda: single-device plans on one GPU. Without a GPU the run is
// refused with the reason; options for the GPU need it; multi-device plans are
// refused. (Ops without CUDA kernels: tests/runtime/cuda_executor_test.cc.)
TEST_F(CliTest, CudaBackendRunsOrSaysWhyNot) {
  ASSERT_EQ(strata({"zoo", "mlp", "--input", "12", "--hidden", "16", "--classes", "4", "--batch",
                    "8", "-o", "mlp.strata"})
                .code,
            0);
  ASSERT_EQ(strata({"compile", "mlp.strata", "--train", "-o", "mlp.splan"}).code, 0);

  ASSERT_EQ(strata({"compile", "mlp.strata", "--train", "--mesh", "1x1x2", "-o", "pp.splan"}).code,
            0);
  const std::string reason = runtime::cuda_unavailable_reason();

  expect_one_line_error(strata({"run", "mlp.splan", "--tf32"}), "--tf32 needs --backend cuda");
  expect_one_line_error(strata({"run", "mlp.splan", "--no-cuda-graph"}),
                        "--no-cuda-graph needs --backend cuda");
  expect_one_line_error(strata({"run", "mlp.splan", "--precision", "bf16"}),
                        "--precision bf16 needs --backend cuda");
  expect_one_line_error(strata({"run", "mlp.splan", "--precision", "f16"}),
                        "--precision f16 needs --backend cuda");
  expect_one_line_error(strata({"run", "mlp.splan", "--backend", "cuda", "--precision", "f8"}),
                        "--precision");
  expect_one_line_error(strata({"run", "mlp.splan", "--pool-norm", "strata"}),
                        "--pool-norm needs --backend cuda");
  expect_one_line_error(strata({"run", "mlp.splan", "--backend", "cuda", "--pool-norm", "miopen"}),
                        "--pool-norm");
  ASSERT_EQ(strata({"compile", "mlp.strata", "--train", "--optimizer", "adamw:lr=0.01", "--mesh",
                    "2x1x1", "--zero", "1", "-o", "zero.splan"})
                .code,
            0);
  Outcome zero_gpu = strata({"run", "zero.splan", "--backend", "cuda", "--steps", "2"});
  if (reason.empty()) {
    EXPECT_EQ(zero_gpu.code, 0) << zero_gpu.err;
  } else {
    expect_one_line_error(zero_gpu, reason);
  }
  expect_one_line_error(strata({"run", "pp.splan", "--backend", "cuda", "--trace", "t.json"}),
                        "--trace records the CPU devices");
  // A pipeline plan of one device is named as such, not as several.
  ASSERT_EQ(strata({"compile", "mlp.strata", "--train", "--mesh", "1x1x1", "-o", "one.splan"}).code,
            0);
  expect_one_line_error(strata({"run", "one.splan", "--op-times"}),
                        "is a pipeline plan of 1 device (compile it without --mesh");
  // --op-times on the CPU: five more steps, each node's median, summed per op
  // type; the rows add up to the total and their shares to 100%.
  Outcome cpu_times = strata({"run", "mlp.splan", "--steps", "2", "--op-times"});
  ASSERT_EQ(cpu_times.code, 0) << cpu_times.err;
  const size_t table = cpu_times.out.find("op times   5 more runs, CPU time per op type");
  ASSERT_NE(table, std::string::npos) << cpu_times.out;
  {
    std::istringstream lines(cpu_times.out.substr(table));
    std::string line;
    std::getline(lines, line); // the title
    std::getline(lines, line); // the column names
    double sum_ms = 0, sum_share = 0, total = -1;
    std::set<std::string> ops;
    while (std::getline(lines, line)) {
      std::istringstream fields(line);
      std::string op;
      fields >> op;
      if (op == "total") {
        fields >> total;
        break;
      }
      long long nodes = 0;
      double ms = 0, share = 0;
      fields >> nodes >> ms >> share;
      ASSERT_TRUE(fields && nodes > 0 && ms >= 0) << line; // 0.0000: under 50 ns
      ops.insert(op);
      sum_ms += ms;
      sum_share += share;
    }
    // Each row is rounded to 1e-4 ms.
    EXPECT_NEAR(sum_ms, total, 1e-4 * static_cast<double>(ops.size() + 1)) << cpu_times.out;
    EXPECT_NEAR(sum_share, 100.0, 0.1 * static_cast<double>(ops.size())) << cpu_times.out;
    EXPECT_TRUE(ops.count("Gemm") && ops.count("AdamUpdate") + ops.count("SgdUpdate") > 0)
        << cpu_times.out;
  }
  // --op-times: a one-device plan's nodes timed on the GPU.
  expect_one_line_error(strata({"run", "pp.splan", "--backend", "cuda", "--op-times"}),
                        "is a pipeline plan of 2 devices");
  Outcome timed = strata({"run", "mlp.splan", "--backend", "cuda", "--steps", "2", "--op-times"});
  if (reason.empty()) {
    ASSERT_EQ(timed.code, 0) << timed.err;
    EXPECT_NE(timed.out.find("op times"), std::string::npos) << timed.out;
    EXPECT_NE(timed.out.find("Gemm"), std::string::npos) << timed.out;
  } else {
    expect_one_line_error(timed, reason);
  }
  // --gpus: a pipeline plan's devices on GPUs, one index per device.
  expect_one_line_error(strata({"run", "pp.splan", "--gpus", "0,1"}),
                        "--gpus needs --backend cuda");
  expect_one_line_error(strata({"run", "mlp.splan", "--backend", "cuda", "--gpus", "0"}),
                        "this plan has one device");
  expect_one_line_error(
      strata({"run", "pp.splan", "--backend", "cuda", "--gpus", "0,1", "--gpu", "1"}),
      "--gpus or --gpu, not both");
  expect_one_line_error(strata({"run", "pp.splan", "--backend", "cuda", "--gpus", "0,x"}),
                        "entry 1 ('x') is not a GPU index");
  Outcome too_many = strata({"run", "pp.splan", "--backend", "cuda", "--gpus", "0,1,2"});
  expect_one_line_error(too_many, reason.empty() ? "lists 3 GPU(s); the plan has 2" : reason);
  // A pipeline plan runs its devices on one GPU, as the CPU runs them.
  Outcome pp_gpu = strata({"run", "pp.splan", "--backend", "cuda", "--steps", "3"});
  if (reason.empty()) {
    ASSERT_EQ(pp_gpu.code, 0) << pp_gpu.err;
    EXPECT_NE(pp_gpu.out.find("runs all 2 plan devices"), std::string::npos) << pp_gpu.out;
  } else {
    expect_one_line_error(pp_gpu, reason);
  }

  Outcome gpu = strata({"run", "mlp.splan", "--backend", "cuda", "--steps", "3"});
  Outcome eager =
      strata({"run", "mlp.splan", "--backend", "cuda", "--steps", "3", "--no-cuda-graph"});
  if (!reason.empty()) {
    expect_one_line_error(gpu, reason);
    return;
  }
  ASSERT_EQ(gpu.code, 0) << gpu.err;
  ASSERT_EQ(eager.code, 0) << eager.err;
  Outcome cpu = strata({"run", "mlp.splan", "--steps", "3"});
  ASSERT_EQ(cpu.code, 0) << cpu.err;
  // The losses (printed to 4 decimals): the CPU's within the last digit,
  // replayed and eager alike to the digit.
  auto losses = [](const std::string &out) {
    std::vector<double> values;
    for (size_t at = out.find("loss "); at != std::string::npos; at = out.find("loss ", at + 1))
      values.push_back(std::atof(out.c_str() + at + 5));
    return values;
  };
  const std::vector<double> on_gpu = losses(gpu.out), on_cpu = losses(cpu.out);
  ASSERT_EQ(on_gpu.size(), on_cpu.size()) << gpu.out << cpu.out;
  for (size_t i = 0; i < on_gpu.size(); ++i)
    EXPECT_NEAR(on_gpu[i], on_cpu[i], 1.5e-4) << gpu.out << cpu.out;
  EXPECT_EQ(losses(eager.out), on_gpu);
  // The host's time to issue a step, over the steps after capture (one of 3);
  // the CPU runners do not measure it.
  EXPECT_NE(gpu.out.find("us per step to issue it (median of the last 1 step: the batch copied "
                         "in, the captured step replayed)"),
            std::string::npos)
      << gpu.out;
  EXPECT_NE(eager.out.find("every kernel launched)"), std::string::npos) << eager.out;
  EXPECT_NE(pp_gpu.out.find("\nhost "), std::string::npos) << pp_gpu.out;
  EXPECT_EQ(cpu.out.find("\nhost "), std::string::npos) << cpu.out;
  Outcome pp_cpu = strata({"run", "pp.splan", "--steps", "3"});
  ASSERT_EQ(pp_cpu.code, 0) << pp_cpu.err;
  const std::vector<double> pp_on_gpu = losses(pp_gpu.out), pp_on_cpu = losses(pp_cpu.out);
  ASSERT_EQ(pp_on_gpu.size(), pp_on_cpu.size()) << pp_gpu.out << pp_cpu.out;
  for (size_t i = 0; i < pp_on_gpu.size(); ++i)
    EXPECT_NEAR(pp_on_gpu[i], pp_on_cpu[i], 1.5e-4) << pp_gpu.out << pp_cpu.out;
}

TEST_F(CliTest, RunWithInputFiles) {
  ASSERT_NO_FATAL_FAILURE(make_gpt("m.strata"));
  HostTensor tokens = HostTensor::zeros({DType::kI64, {B, S}});
  for (int64_t i = 0; i < B * S; ++i)
    tokens.as<int64_t>()[i] = (i * 37) % V;
  ASSERT_TRUE(serialization::write_npy(path("tokens.npy").string(), tokens).is_ok());
  Outcome named = strata({"run", "m.strata", "--input", "tokens=tokens.npy", "-o", "a.npy"});
  ASSERT_EQ(named.code, 0) << named.err;
  Outcome positional = strata({"run", "m.strata", "--input", "tokens.npy", "--repeat", "3",
                               "--warmup", "0", "-o", "b.npy"});
  ASSERT_EQ(positional.code, 0) << positional.err;
  EXPECT_NE(positional.out.find("over 3 runs"), std::string::npos) << positional.out;
  std::string a = read_file(path("a.npy"));
  EXPECT_FALSE(a.empty());
  EXPECT_TRUE(a == read_file(path("b.npy"))) << "same inputs, different outputs";
  // Random inputs differ from these tokens, and so do the logits.
  ASSERT_EQ(strata({"run", "m.strata", "-o", "c.npy"}).code, 0);
  EXPECT_FALSE(a == read_file(path("c.npy")));
}

TEST_F(CliTest, RunWithWrongInputNamesIt) {
  ASSERT_NO_FATAL_FAILURE(make_gpt("m.strata"));
  HostTensor wrong_shape = HostTensor::zeros({DType::kI64, {3, 5}});
  ASSERT_TRUE(serialization::write_npy(path("wrong.npy").string(), wrong_shape).is_ok());
  Outcome o = strata({"run", "m.strata", "--input", "tokens=wrong.npy"});
  expect_one_line_error(o, "tokens");
  EXPECT_NE(o.err.find("[3, 5]"), std::string::npos) << o.err;
  expect_one_line_error(strata({"run", "m.strata", "--input", "wrong.npy"}), "tokens");

  HostTensor wrong_dtype = HostTensor::zeros({DType::kF32, {B, S}});
  ASSERT_TRUE(serialization::write_npy(path("floats.npy").string(), wrong_dtype).is_ok());
  expect_one_line_error(strata({"run", "m.strata", "--input", "floats.npy"}), "tokens");
  expect_one_line_error(strata({"run", "m.strata", "--input", "missing.npy"}), "missing.npy");
  expect_one_line_error(strata({"run", "m.strata", "--input", "wrong.npy", "--input", "wrong.npy"}),
                        "too many");
  // A misspelt input name is named as such, not as a missing file.
  expect_one_line_error(strata({"run", "m.strata", "--input", "token=wrong.npy"}),
                        "the model has no input 'token' (its inputs: tokens)");
}

// A model far beyond this host's memory (4 TB of weights, drawn by
// initializers, so the file is small) is refused by size before anything is
// allocated, instead of a bare "out of memory" or the OOM killer.
TEST_F(CliTest, RunBeyondTheHostsMemorySaysHowMuch) {
  ASSERT_EQ(strata({"zoo", "mlp", "--batch", "1", "--input", "1000000", "--hidden", "1000000",
                    "--classes", "2", "-o", "big.strata"})
                .code,
            0);
  Outcome run = strata({"run", "big.strata"});
  expect_one_line_error(run, "needs 3.64 TiB of memory (3.64 TiB of weights and state, ");
  EXPECT_NE(run.err.find("of activations); this host has "), std::string::npos) << run.err;
}

TEST_F(CliTest, SeveralOutputsGoToADirectory) {
  // A hand-built model with two outputs, one with a '/' in its name.
  GraphBuilder b("two_outputs", ops::OpRegistry::global());
  TensorId x = b.input("x", DType::kF32, {2, 3});
  b.output(b.op1("Relu", {x}, {}, "act/relu"));
  b.output(b.op1("Neg", {x}, {}, "neg"));
  auto graph = std::move(b).finish();
  ASSERT_TRUE(graph.is_ok()) << graph.status().to_string();
  ASSERT_TRUE(serialization::save_model(*graph, path("two.json").string()).is_ok());

  HostTensor input = HostTensor::zeros({DType::kF32, {2, 3}});
  for (int i = 0; i < 6; ++i)
    input.as<float>()[i] = static_cast<float>(i) - 2.5f;
  ASSERT_TRUE(serialization::write_npy(path("x.npy").string(), input).is_ok());

  expect_one_line_error(strata({"run", "two.json", "--input", "x.npy", "--output", "y.npy"}),
                        "--output-dir");
  Outcome o = strata({"run", "two.json", "--input", "x=x.npy", "--output-dir", "out"});
  ASSERT_EQ(o.code, 0) << o.err;
  auto relu = serialization::read_npy(path("out/act_relu.npy").string());
  auto neg = serialization::read_npy(path("out/neg.npy").string());
  ASSERT_TRUE(relu.is_ok()) << relu.status().to_string();
  ASSERT_TRUE(neg.is_ok()) << neg.status().to_string();
  for (int i = 0; i < 6; ++i) {
    float v = input.as<float>()[i];
    EXPECT_EQ(relu->as<float>()[i], v > 0 ? v : 0.0f);
    EXPECT_EQ(neg->as<float>()[i], -v);
  }
}

// Outputs whose names give one file name ('a/b' and 'a_b' both become
// a_b.npy) are refused before the model runs, naming both; nothing is written.
TEST_F(CliTest, OutputsThatWouldShareAFileAreRefused) {
  GraphBuilder b("clash", ops::OpRegistry::global());
  TensorId x = b.input("x", DType::kF32, {2, 3});
  b.output(b.op1("Relu", {x}, {}, "a/b"));
  b.output(b.op1("Neg", {x}, {}, "a_b"));
  auto graph = std::move(b).finish();
  ASSERT_TRUE(graph.is_ok()) << graph.status().to_string();
  ASSERT_TRUE(serialization::save_model(*graph, path("clash.json").string()).is_ok());
  Outcome o = strata({"run", "clash.json", "--output-dir", "out"});
  expect_one_line_error(o, "--output-dir out: outputs 'a/b' and 'a_b' would both be written to "
                           "a_b.npy");
  EXPECT_EQ(o.out, "");
  EXPECT_FALSE(fs::exists(path("out")));
}

TEST_F(CliTest, MlpAndConvnetFromTheZoo) {
  Outcome mlp = strata({"zoo", "mlp", "--batch", "4", "--input", "20", "--hidden", "16,8",
                        "--classes", "3", "-o", "mlp.json"});
  ASSERT_EQ(mlp.code, 0) << mlp.err;
  EXPECT_NE(mlp.out.find(str_cat((20 * 16 + 16) + (16 * 8 + 8) + (8 * 3 + 3), " parameters")),
            std::string::npos)
      << mlp.out;
  Outcome run = strata({"run", "mlp.json", "--output-dir", "out"});
  ASSERT_EQ(run.code, 0) << run.err;
  auto y = serialization::read_npy(path("out/head.npy").string());
  ASSERT_TRUE(y.is_ok()) << y.status().to_string();
  EXPECT_EQ(y->type, (TensorType{DType::kF32, {4, 3}}));

  Outcome deep = strata({"zoo", "mlp", "--width", "8", "--depth", "3", "-o", "deep.strata"});
  ASSERT_EQ(deep.code, 0) << deep.err;

  Outcome cnn = strata({"zoo", "convnet", "--batch", "2", "--image-size", "16", "--channels", "4,8",
                        "-o", "cnn.strata"});
  ASSERT_EQ(cnn.code, 0) << cnn.err;
  Outcome cnn_run = strata({"run", "cnn.strata", "-o", "logits.npy"});
  ASSERT_EQ(cnn_run.code, 0) << cnn_run.err;
  auto logits = serialization::read_npy(path("logits.npy").string());
  ASSERT_TRUE(logits.is_ok()) << logits.status().to_string();
  EXPECT_EQ(logits->type, (TensorType{DType::kF32, {2, 10}}));
}

TEST_F(CliTest, ExampleModelsRun) {
  const char *source = std::getenv("STRATA_SOURCE_ROOT");
  if (source == nullptr) GTEST_SKIP() << "STRATA_SOURCE_ROOT is not set (run through meson test)";
  fs::path examples = fs::path(source) / "examples";
  int found = 0;
  if (fs::exists(examples)) {
    for (const auto &entry : fs::directory_iterator(examples)) {
      std::string ext = entry.path().extension().string();
      if (ext != ".json" && ext != ".strata") continue;
      // Only model files: cluster specs and other JSON live here too.
      if (!serialization::load_model(entry.path().string()).is_ok()) continue;
      ++found;
      Outcome inspect = strata({"inspect", entry.path().string()});
      EXPECT_EQ(inspect.code, 0) << entry.path() << ": " << inspect.err;
      Outcome run = strata({"run", entry.path().string(), "--output-dir", "out"});
      EXPECT_EQ(run.code, 0) << entry.path() << ": " << run.err;
    }
  }
  if (found == 0) GTEST_SKIP() << "no example models in " << examples;
}

// The losses printed by a training run, in step order ("step 3/20  loss 2.1234 ...").
std::vector<double> printed_losses(const std::string &out) {
  std::vector<double> losses;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    if (!line.starts_with("step ")) continue;
    size_t at = line.find("  loss ");
    if (at == std::string::npos) continue;
    losses.push_back(std::stod(line.substr(at + 7)));
  }
  return losses;
}

TEST_F(CliTest, CompileAndTrainMlpLossFalls) {
  ASSERT_EQ(strata({"zoo", "mlp", "--batch", "16", "--input", "32", "--hidden", "64", "--classes",
                    "10", "-o", "mlp.strata"})
                .code,
            0);
  Outcome compile = strata({"compile", "mlp.strata", "--train", "--loss", "softmax_cross_entropy",
                            "--optimizer", "sgd:lr=0.1", "-o", "t.splan"});
  ASSERT_EQ(compile.code, 0) << compile.err;
  for (const char *field : {"wrote t.splan", "fingerprint", "parameters   2,762", "opt. state",
                            "activation arena", "FLOPs", "per step"})
    EXPECT_NE(compile.out.find(field), std::string::npos) << field << "\n" << compile.out;

  Outcome run = strata({"run", "t.splan", "--steps", "20"});
  ASSERT_EQ(run.code, 0) << run.err;
  std::vector<double> losses = printed_losses(run.out);
  ASSERT_EQ(losses.size(), 20u) << run.out;
  EXPECT_LT(losses.back(), losses.front()) << run.out;
  EXPECT_NE(run.out.find("step 20/20  loss "), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("steps/s)"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("done       20 steps"), std::string::npos) << run.out;
  // The plan's FLOPs per step, as compile counted them, and the rate reached.
  auto flops_line = [](const std::string &out, const std::string &label) {
    const size_t at = out.find(label);
    return at == std::string::npos
               ? std::string()
               : out.substr(at + label.size(), out.find(" per step", at) - at - label.size());
  };
  EXPECT_FALSE(flops_line(run.out, "compute    ").empty()) << run.out;
  EXPECT_EQ(flops_line(run.out, "compute    "), flops_line(compile.out, "FLOPs        "));
  EXPECT_NE(run.out.find("FLOP/s\n"), std::string::npos) << run.out;
  // The steady state: the median step after the first two; no host line on
  // the CPU.
  const size_t steady = run.out.find("\nsteady     ");
  ASSERT_NE(steady, std::string::npos) << run.out;
  EXPECT_GT(std::atof(run.out.c_str() + steady + 12), 0.0) << run.out;
  EXPECT_NE(run.out.find(" ms per step (median of the last 18 steps)\n", steady), std::string::npos)
      << run.out;
  EXPECT_EQ(run.out.find("\nhost "), std::string::npos) << run.out;

  // --log-every prints fewer lines; the last step is always printed.
  Outcome sparse = strata({"run", "t.splan", "--steps", "7", "--log-every", "3"});
  ASSERT_EQ(sparse.code, 0) << sparse.err;
  EXPECT_EQ(printed_losses(sparse.out).size(), 3u) << sparse.out;
}

// The end of a training run sets the plan's predictions beside the run: a
// pipeline plan's step and each device's busy time and arena, a one-device
// plan's arena, and the peak RSS. On the CPU the arenas are the planned ones.
TEST_F(CliTest, RunSetsThePlansPredictionsBesideWhatItMeasured) {
  make_mlp("t.splan");
  ASSERT_EQ(strata({"compile", "m.strata", "--train", "--mesh", "1x1x2", "--microbatches", "2",
                    "-o", "pp.splan"})
                .code,
            0);
  auto positive = [](const std::string &number) { return std::atof(number.c_str()) > 0; };
  const std::regex rss("\nmemory     peak RSS [0-9.]+ [KMG]iB \\(this process\\)\n");

  Outcome pp = strata({"run", "pp.splan", "--steps", "5"});
  ASSERT_EQ(pp.code, 0) << pp.err;
  std::smatch step;
  ASSERT_TRUE(std::regex_search(pp.out, step,
                                std::regex("\npredicted  step ([0-9.]+) ms \\(bubble ([0-9.]+)%\\) "
                                           "against measured ([0-9.]+) ms \\(x([0-9.]+)\\)\n")))
      << pp.out;
  EXPECT_TRUE(positive(step[1]) && positive(step[3]) && positive(step[4])) << pp.out;
  // The measured step is the `steady` line's.
  EXPECT_NE(pp.out.find(str_cat("\nsteady     ", step[3].str(), " ms per step")), std::string::npos)
      << pp.out;
  std::vector<testing::DeviceRow> rows = testing::device_rows(pp.out);
  ASSERT_EQ(rows.size(), 2u) << pp.out;
  for (int d = 0; d < 2; ++d) {
    const testing::DeviceRow &row = rows[static_cast<size_t>(d)];
    EXPECT_EQ(row.device, d) << pp.out;
    EXPECT_GT(row.predicted_busy_ms, 0) << pp.out;
    EXPECT_GT(row.measured_busy_ms, 0) << pp.out;
    EXPECT_TRUE(positive(row.planned_arena) && positive(row.held)) << pp.out;
    EXPECT_EQ(row.allocated_arena, row.planned_arena) << pp.out;
  }
  EXPECT_TRUE(std::regex_search(pp.out, rss)) << pp.out;

  // Timed by the device clock too.
  Outcome clocked = strata({"run", "pp.splan", "--steps", "4", "--clock", "device"});
  ASSERT_EQ(clocked.code, 0) << clocked.err;
  EXPECT_TRUE(std::regex_search(clocked.out,
                                std::regex("\npredicted  step [0-9.]+ ms \\(bubble [0-9.]+%\\) "
                                           "against measured [0-9.]+ ms \\(x[0-9.]+\\) by the "
                                           "wall clock, [0-9.]+ ms \\(x[0-9.]+\\) by the device "
                                           "clock\n")))
      << clocked.out;
  // Two steps are no steady state: the memory is measured, the time is not.
  Outcome short_run = strata({"run", "pp.splan", "--steps", "2"});
  ASSERT_EQ(short_run.code, 0) << short_run.err;
  EXPECT_NE(short_run.out.find("; nothing measured to set beside it"), std::string::npos)
      << short_run.out;
  rows = testing::device_rows(short_run.out);
  ASSERT_EQ(rows.size(), 2u) << short_run.out;
  for (const testing::DeviceRow &row : rows) {
    EXPECT_EQ(row.measured_busy_ms, -1.0) << short_run.out;
    EXPECT_EQ(row.allocated_arena, row.planned_arena) << short_run.out;
  }

  // One device: no predicted time, the arena planned and allocated.
  Outcome one = strata({"run", "t.splan", "--steps", "3"});
  ASSERT_EQ(one.code, 0) << one.err;
  EXPECT_EQ(one.out.find("\npredicted "), std::string::npos) << one.out;
  EXPECT_TRUE(testing::device_rows(one.out).empty()) << one.out;
  std::smatch memory;
  ASSERT_TRUE(std::regex_search(
      one.out, memory,
      std::regex("\nmemory     activation arena ([0-9.]+ [KMG]?i?B) planned, ([0-9.]+ [KMG]?i?B) "
                 "allocated; weights and state ([0-9.]+ [KMG]?i?B); peak RSS [0-9.]+ [KMG]iB "
                 "\\(this process\\)\n")))
      << one.out;
  EXPECT_TRUE(positive(memory[1]) && positive(memory[3])) << one.out;
  EXPECT_EQ(memory[1].str(), memory[2].str()) << one.out;
}

TEST_F(CliTest, CompileIsReproducibleAndPlansConvertAndInspect) {
  ASSERT_EQ(
      strata({"zoo", "mlp", "--batch", "4", "--input", "8", "--hidden", "8", "-o", "m.json"}).code,
      0);
  std::vector<std::string> compile = {"compile",
                                      "m.json",
                                      "--train",
                                      "--loss",
                                      "mse",
                                      "--optimizer",
                                      "adamw:lr=3e-4,wd=0.1,clip=1,schedule=cosine,total=100",
                                      "-o",
                                      "a.splan"};
  ASSERT_EQ(strata(compile).code, 0);
  compile[compile.size() - 1] = "b.splan";
  ASSERT_EQ(strata(compile).code, 0);
  EXPECT_EQ(read_file(path("a.splan")), read_file(path("b.splan")));

  Outcome to_json = strata({"convert", "a.splan", "-o", "a.splan.json"});
  ASSERT_EQ(to_json.code, 0) << to_json.err;
  EXPECT_TRUE(read_file(path("a.splan.json")).starts_with("{\n  \"plan_version\": 5"));
  ASSERT_EQ(strata({"convert", "a.splan.json", "-o", "c.splan"}).code, 0);
  EXPECT_EQ(read_file(path("a.splan")), read_file(path("c.splan")));

  Outcome inspect = strata({"inspect", "a.splan"});
  ASSERT_EQ(inspect.code, 0) << inspect.err;
  for (const char *field : {"mode         train", "fingerprint", "loss         mse",
                            "adamw:lr=3e-04", "clip=1", "device cpu:0", "targets f32[4, 10]"})
    EXPECT_NE(inspect.out.find(field), std::string::npos) << field << "\n" << inspect.out;
  // The MLP has no elementwise chain to fuse (every activation is read by
  // backward); the GPT's training graph has a pair per bias and residual.
  EXPECT_EQ(inspect.out.find("fusion"), std::string::npos) << inspect.out;
  ASSERT_EQ(strata({"zoo", "gpt", "--layers", "2", "--hidden", "16", "--heads", "2", "--seq", "8",
                    "--vocab", "32", "--batch", "2", "-o", "g.json"})
                .code,
            0);
  ASSERT_EQ(strata({"compile", "g.json", "--train", "-o", "g.splan"}).code, 0);
  Outcome gpt = strata({"inspect", "g.splan"});
  ASSERT_EQ(gpt.code, 0) << gpt.err;
  EXPECT_NE(gpt.out.find("fusion       6 elementwise chains (12 nodes, the longest 2)"),
            std::string::npos)
      << gpt.out;
  Outcome json = strata({"inspect", "a.splan", "--format", "json"});
  ASSERT_EQ(json.code, 0) << json.err;
  auto parsed = nlohmann::json::parse(json.out);
  EXPECT_EQ(parsed["mode"], "Train");
  EXPECT_EQ(parsed["model"]["schema_version"], 2);

  // An inference plan runs like its model.
  ASSERT_EQ(strata({"compile", "m.json", "-o", "i.splan"}).code, 0);
  Outcome infer = strata({"run", "i.splan"});
  ASSERT_EQ(infer.code, 0) << infer.err;
  EXPECT_NE(infer.out.find("output     head f32[4, 10]"), std::string::npos) << infer.out;

  expect_one_line_error(
      strata({"compile", "m.json", "--train", "--optimizer", "rmsprop", "-o", "x.splan"}),
      "--optimizer");
  expect_one_line_error(
      strata({"compile", "m.json", "--train", "--loss-input", "nope", "-o", "x.splan"}), "'nope'");
  // compile's output file is -o, as everywhere else; --output says so.
  expect_one_line_error(strata({"compile", "m.json", "--train", "--output", "x.splan"}),
                        "compile writes its plan with -o FILE");
  expect_one_line_error(strata({"compile", "m.json", "--train"}), "-o FILE is required");
}

TEST_F(CliTest, CheckpointAndResumeMatchAnUninterruptedRun) {
  ASSERT_NO_FATAL_FAILURE(make_mlp());
  ASSERT_EQ(
      strata({"compile", "m.strata", "--train", "--optimizer", "adam:lr=0.01", "-o", "t.splan"})
          .code,
      0);
  Outcome straight = strata({"run", "t.splan", "--steps", "6", "--checkpoint", "full"});
  ASSERT_EQ(straight.code, 0) << straight.err;
  Outcome half =
      strata({"run", "t.splan", "--steps", "3", "--checkpoint", "part", "--checkpoint-every", "1"});
  ASSERT_EQ(half.code, 0) << half.err;
  Outcome resumed =
      strata({"run", "t.splan", "--steps", "6", "--resume", "part", "--checkpoint", "part"});
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("resumed    part at step 3"), std::string::npos) << resumed.out;
  EXPECT_EQ(read_file(path("full/model-step6.safetensors")),
            read_file(path("part/model-step6.safetensors")));
  // Only the last checkpoint's file is left.
  EXPECT_FALSE(fs::exists(path("part/model-step3.safetensors")));
  // The losses of steps 4..6 are the same too.
  std::vector<double> a = printed_losses(straight.out), b = printed_losses(resumed.out);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(a[3 + i], b[i]);
  auto manifest = nlohmann::json::parse(read_file(path("part/manifest.json")));
  EXPECT_EQ(manifest["step"], 6);
  // inspect reads the folder: its step, layout and tensors, checksums checked.
  Outcome shown = strata({"inspect", "part"});
  ASSERT_EQ(shown.code, 0) << shown.err;
  EXPECT_NE(shown.out.find("checkpoint part at step 6"), std::string::npos) << shown.out;
  EXPECT_NE(shown.out.find("layout     one device"), std::string::npos) << shown.out;
  EXPECT_NE(shown.out.find("adam:lr=0.01"), std::string::npos) << shown.out;
  Outcome report = strata({"inspect", "part", "--format", "json"});
  ASSERT_EQ(report.code, 0) << report.err;
  auto facts = nlohmann::json::parse(report.out);
  EXPECT_EQ(facts["step"], 6);
  EXPECT_EQ(facts["parameters"]["tensors"].get<size_t>() + facts["state"]["tensors"].get<size_t>(),
            facts["tensors"].size());
  for (const auto &t : facts["tensors"])
    EXPECT_EQ(t["stored"], "whole") << t.dump();
  expect_one_line_error(strata({"inspect", "part", "--format", "dot"}), "checkpoint folder");

  // A checkpoint of another optimizer (the error names it), and a damaged
  // one, are refused.
  ASSERT_EQ(
      strata({"compile", "m.strata", "--train", "--optimizer", "sgd:lr=0.01", "-o", "other.splan"})
          .code,
      0);
  expect_one_line_error(strata({"run", "other.splan", "--steps", "8", "--resume", "part"}),
                        "trained with optimizer 'adam:lr=0.01");
  std::string weights = read_file(path("part/model-step6.safetensors"));
  write_file(path("part/model-step6.safetensors"), weights.substr(0, weights.size() / 2));
  expect_one_line_error(strata({"run", "t.splan", "--steps", "8", "--resume", "part"}),
                        "model-step6.safetensors");
  // A resume from a folder without a checkpoint is refused before the new
  // --checkpoint folder is made.
  expect_one_line_error(
      strata({"run", "t.splan", "--steps", "8", "--resume", "nothing", "--checkpoint", "new"}),
      "--resume nothing: not a checkpoint folder");
  EXPECT_FALSE(fs::exists(path("new")));
}

// A --checkpoint folder may hold the user's own weights: saves replace only
// strata's files, and the user's stay byte for byte.
TEST_F(CliTest, CheckpointKeepsTheUsersFiles) {
  ASSERT_NO_FATAL_FAILURE(make_mlp("t.splan"));
  fs::create_directories(path("ck"));
  const std::vector<std::string> user_files = {"model.safetensors", "model_pretrained.safetensors",
                                               "model-best.safetensors"};
  for (const std::string &name : user_files)
    write_file(path("ck/" + name), "the user's " + name);
  Outcome run =
      strata({"run", "t.splan", "--steps", "2", "--checkpoint", "ck", "--checkpoint-every", "1"});
  ASSERT_EQ(run.code, 0) << run.err;
  for (const std::string &name : user_files)
    EXPECT_EQ(read_file(path("ck/" + name)), "the user's " + name) << name;
  EXPECT_TRUE(fs::exists(path("ck/model-step2.safetensors")));
  EXPECT_FALSE(fs::exists(path("ck/model-step1.safetensors")));
}

// Ctrl-C or SIGTERM during training: the step in flight ends, the checkpoint
// is saved at it, the process ends by the signal (128 + it in a shell), and the run
// continues from there. The loop waits for the header's last line in the
// run's output file: lines are not held back when stdout is a file (with
// --log-every past the last step, nothing else would fill the buffer).
TEST_F(CliTest, SignalsEndTrainingAfterTheStepWithACheckpoint) {
  ASSERT_NO_FATAL_FAILURE(make_mlp("t.splan"));
  for (const char *signal : {"INT", "TERM"}) {
    SCOPED_TRACE(signal);
    const std::string ckpt = std::string("ck_") + signal;
    // In a subshell: run_in's `cd DIR && ...` must hold for all of it. A
    // background job of a non-interactive shell starts with SIGINT ignored,
    // which strata respects, so python gives the run SIGINT's default back.
    // Every wait is bounded; a run that does not stop is killed.
    const std::string script =
        "(python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "os.execv(sys.argv[1], sys.argv[1:])' " +
        quote(strata_binary().string()) +
        " run t.splan --steps 100000000 --log-every 1000000000 --checkpoint " + ckpt +
        " >run.out 2>run.err & pid=$!; i=0; while [ $i -lt 600 ]; do "
        "if grep -q '^data ' run.out 2>/dev/null; then echo seen >seen.txt; break; fi; "
        "sleep 0.1; i=$((i+1)); done; kill -" +
        signal +
        " $pid; i=0; while kill -0 $pid 2>/dev/null && [ $i -lt 600 ]; do sleep 0.1; "
        "i=$((i+1)); done; kill -KILL $pid 2>/dev/null; wait $pid; echo $? >run.code)";
    // The shell truncates run.out in the background job, maybe after the
    // loop's first look: the last iteration's header must not be seen.
    for (const char *name : {"seen.txt", "run.out", "run.err", "run.code"})
      fs::remove(path(name));
    ASSERT_EQ(testing::run_in(dir_, script).code, 0);
    EXPECT_TRUE(fs::exists(path("seen.txt"))) << "the header did not reach run.out within 60 s";
    const std::string err = read_file(path("run.err")), out = read_file(path("run.out"));
    EXPECT_EQ(std::stoi(read_file(path("run.code"))), std::string(signal) == "INT" ? 130 : 143)
        << err;
    const std::string stopped = std::string("stopped by SIG") + signal + " after step ";
    const size_t at = err.find(stopped);
    ASSERT_NE(at, std::string::npos) << err;
    const int64_t step = std::stoll(err.substr(at + stopped.size()));
    EXPECT_NE(err.find("; continue with --resume " + ckpt), std::string::npos) << err;
    EXPECT_NE(out.find("checkpoint " + ckpt + " (step " + std::to_string(step) + ")"),
              std::string::npos)
        << out;
    auto manifest = nlohmann::json::parse(read_file(path(ckpt + "/manifest.json")));
    EXPECT_EQ(manifest["step"], step);
    Outcome resumed = strata({"run", "t.splan", "--steps", std::to_string(step + 2), "--resume",
                              ckpt, "--checkpoint", ckpt});
    ASSERT_EQ(resumed.code, 0) << resumed.err;
    EXPECT_NE(resumed.out.find("resumed    " + ckpt + " at step " + std::to_string(step)),
              std::string::npos)
        << resumed.out;
    EXPECT_EQ(printed_losses(resumed.out).size(), 2u) << resumed.out;
  }
}

// Two trainers on one --checkpoint folder: the second is refused before its
// first step, naming the folder and the first one's pid, and leaves the
// folder to the first; once the first has ended, the folder is free again.
TEST_F(CliTest, CheckpointFolderTakesOneTrainerAtATime) {
  ASSERT_NO_FATAL_FAILURE(make_mlp("t.splan"));
  const std::string binary = quote(strata_binary().string());
  // The first run holds the folder from before its header's `data` line
  // until SIGTERM ends it (after a save). Every wait is bounded.
  const std::string script =
      "(" + binary +
      " run t.splan --steps 100000000 --log-every 1000000000 --checkpoint ck >first.out "
      "2>first.err & pid=$!; echo $pid >first.pid; i=0; while [ $i -lt 600 ]; do "
      "if grep -q '^data ' first.out 2>/dev/null; then break; fi; sleep 0.1; i=$((i+1)); done; " +
      binary +
      " run t.splan --steps 2 --checkpoint ck >second.out 2>second.err; echo $? >second.code; "
      "kill -TERM $pid; i=0; while kill -0 $pid 2>/dev/null && [ $i -lt 600 ]; do sleep 0.1; "
      "i=$((i+1)); done; kill -KILL $pid 2>/dev/null; wait $pid; echo $? >first.code)";
  ASSERT_EQ(testing::run_in(dir_, script).code, 0);
  Outcome second;
  second.code = std::stoi(read_file(path("second.code")));
  second.out = read_file(path("second.out"));
  second.err = read_file(path("second.err"));
  std::string first_pid = read_file(path("first.pid"));
  first_pid = first_pid.substr(0, first_pid.find('\n'));
  const std::string refusal =
      "--checkpoint: ck: the checkpoint folder is in use by another strata run (pid " + first_pid;
  expect_one_line_error(second, refusal + " on ");
  EXPECT_EQ(second.out.find("step 1/"), std::string::npos) << second.out;
  // The first run saved where it stopped, and the folder is free for the next.
  EXPECT_EQ(std::stoi(read_file(path("first.code"))), 143) << read_file(path("first.err"));
  auto manifest = nlohmann::json::parse(read_file(path("ck/manifest.json")));
  const int64_t step = manifest["step"].get<int64_t>();
  Outcome resumed = strata({"run", "t.splan", "--steps", std::to_string(step + 1), "--resume", "ck",
                            "--checkpoint", "ck"});
  ASSERT_EQ(resumed.code, 0) << resumed.err;
}

// A --checkpoint folder that cannot be created (a name longer than the file
// system allows) is refused before the first step, with the path and the
// system's reason, not after the last.
TEST_F(CliTest, CheckpointFolderIsCreatedBeforeTheFirstStep) {
  ASSERT_NO_FATAL_FAILURE(make_mlp("t.splan"));
  const std::string too_long = "ck/" + std::string(300, 'n');
  Outcome o = strata({"run", "t.splan", "--steps", "2", "--checkpoint", too_long});
  expect_one_line_error(o, "--checkpoint: " + too_long +
                               ": cannot create the checkpoint folder: File name too long");
  EXPECT_EQ(o.out.find("step 1/"), std::string::npos) << o.out;
  // A folder that can be made is made (with its lock) before training.
  Outcome made = strata({"run", "t.splan", "--steps", "1", "--checkpoint", "new/ck"});
  ASSERT_EQ(made.code, 0) << made.err;
  EXPECT_TRUE(fs::exists(path("new/ck/.strata.lock")));
  EXPECT_TRUE(fs::exists(path("new/ck/model-step1.safetensors")));
}

// A save killed mid-write (or by a second Ctrl-C) leaves its temporary file
// behind; the next run on the folder removes strata's own, and only those.
TEST_F(CliTest, NextRunRemovesTemporariesOfAKilledSave) {
  ASSERT_NO_FATAL_FAILURE(make_mlp("t.splan"));
  ASSERT_EQ(strata({"run", "t.splan", "--steps", "2", "--checkpoint", "ck"}).code, 0);
  const std::vector<std::string> stale = {".model-step3.safetensors.tmp.Zx81Qp",
                                          ".manifest.json.tmp.Ab12Cd"};
  for (const std::string &name : stale)
    write_file(path("ck/" + name), "half a save");
  write_file(path("ck/.notes.tmp.Ab12Cd"), "the user's");
  Outcome resumed =
      strata({"run", "t.splan", "--steps", "4", "--resume", "ck", "--checkpoint", "ck"});
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  for (const std::string &name : stale)
    EXPECT_FALSE(fs::exists(path("ck/" + name))) << name;
  EXPECT_EQ(read_file(path("ck/.notes.tmp.Ab12Cd")), "the user's");
  EXPECT_TRUE(fs::exists(path("ck/model-step4.safetensors")));
}

// An empty --checkpoint or --resume is a mistake (an unset shell variable),
// not the option left out: it is refused, naming the option, before any step.
// A device thread that stalls (here: sleeps an hour at an instruction) cannot
// be stopped; the run names it and ends within twice --timeout instead of
// waiting for it past the timeout and the user's SIGTERM.
TEST_F(CliTest, StalledDeviceThreadEndsTheRun) {
  ASSERT_EQ(strata({"zoo", "mlp", "-o", "mlp.strata"}).code, 0);
  ASSERT_EQ(strata({"compile", "mlp.strata", "--train", "--mesh", "1x1x2", "--microbatches", "2",
                    "-o", "t.splan"})
                .code,
            0);
  Outcome o = testing::run_in(dir_, "STRATA_FAULT=stall:1:1:3 timeout -s KILL 60 " +
                                        quote(strata_binary().string()) +
                                        " run t.splan --steps 3 --timeout 1");
  EXPECT_EQ(o.code, 1) << o.err;
  EXPECT_LT(o.seconds, 10.0);
  EXPECT_NE(o.err.find("device 1 did not stop within 1 s"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("timed out after 1 s"), std::string::npos) << o.err;
}

// A run refused for its data or its runner leaves no checkpoint folder.
TEST_F(CliTest, ARefusedRunCreatesNoCheckpointFolder) {
  ASSERT_NO_FATAL_FAILURE(make_mlp("t.splan"));
  fs::create_directories(path("empty_data"));
  Outcome o = strata({"run", "t.splan", "--data", "empty_data", "--checkpoint", "new_ckpt"});
  expect_one_line_error(o, "a data folder needs <input>.npy");
  EXPECT_FALSE(fs::exists(path("new_ckpt")));
}

TEST_F(CliTest, EmptyPathsAreRefused) {
  ASSERT_NO_FATAL_FAILURE(make_mlp("t.splan"));
  for (const char *flag : {"--checkpoint", "--resume", "--data", "--trace"}) {
    SCOPED_TRACE(flag);
    Outcome o = strata({"run", "t.splan", "--steps", "1", flag, ""});
    expect_one_line_error(o, std::string(flag) + ": the path is empty");
    EXPECT_EQ(o.out.find("step 1/"), std::string::npos) << o.out;
  }
  // Flags that an empty value used to turn off without a word.
  ASSERT_EQ(strata({"zoo", "mlp", "-o", "m.strata"}).code, 0);
  const std::vector<std::vector<std::string>> commands = {
      {"run", "m.strata", "--output", ""},     {"run", "m.strata", "--output-dir", ""},
      {"inspect", "m.strata", "--output", ""}, {"simulate", "t.splan", "--trace", ""},
      {"calibrate", "--output", ""},
  };
  for (const auto &command : commands) {
    SCOPED_TRACE(command[0] + " " + command[2]);
    Outcome o = strata(command);
    expect_one_line_error(o, command[2] + ": the path is empty");
  }
}

// What a command will write is checked before it works: a checkpoint folder
// it cannot create or that holds another run's checkpoint, a trace in a
// missing folder, an output that is its own input, a model named as a plan.
// Options the file's kind does not read are refused rather than ignored.
TEST_F(CliTest, OutputsAreCheckedBeforeTheWork) {
  ASSERT_NO_FATAL_FAILURE(make_mlp("t.splan"));
  ASSERT_EQ(strata({"compile", "m.strata", "--train", "--mesh", "1x1x2", "-o", "pp.splan"}).code,
            0);
  ASSERT_EQ(strata({"run", "t.splan", "--steps", "3", "--checkpoint", "ck"}).code, 0);
  const std::string manifest = read_file(path("ck/manifest.json"));
  auto before_any_step = [](const Outcome &o, std::string_view cause) {
    expect_one_line_error(o, cause);
    EXPECT_EQ(o.out.find("step 1/"), std::string::npos) << o.out;
  };
  // A fresh run into a folder holding a checkpoint would replace it.
  before_any_step(strata({"run", "t.splan", "--steps", "2", "--checkpoint", "ck"}),
                  "--checkpoint ck already holds a checkpoint");
  before_any_step(strata({"run", "pp.splan", "--steps", "2", "--checkpoint", "ck"}),
                  "continue it with --resume ck");
  EXPECT_EQ(read_file(path("ck/manifest.json")), manifest);
  // Resuming it, or saving elsewhere, is fine.
  EXPECT_EQ(strata({"run", "t.splan", "--steps", "4", "--resume", "ck", "--checkpoint", "ck"}).code,
            0);
  EXPECT_EQ(
      strata({"run", "t.splan", "--steps", "4", "--resume", "ck", "--checkpoint", "ck2"}).code, 0);
  before_any_step(strata({"run", "t.splan", "--steps", "2", "--checkpoint", "m.strata/ck"}),
                  "is a file, not a folder");
  before_any_step(strata({"run", "pp.splan", "--steps", "2", "--trace", "no/such/t.json"}),
                  "folder no/such does not exist");
  before_any_step(strata({"run", "pp.splan", "--steps", "2", "--trace", "ck"}), "is a folder");
  EXPECT_FALSE(fs::exists(path("m.strata/ck")));
  // A command does not replace its own input.
  const std::string model = read_file(path("m.strata"));
  for (std::vector<std::string> args :
       {std::vector<std::string>{"convert", "m.strata", "-o", "./m.strata"},
        {"compile", "m.strata", "--train", "-o", "m.strata"},
        {"inspect", "m.strata", "-o", "m.strata"},
        {"run", "m.strata", "-o", "m.strata"}})
    expect_one_line_error(strata(args), "is the input m.strata");
  EXPECT_EQ(read_file(path("m.strata")), model);
  expect_one_line_error(strata({"convert", "m.strata", "-o", "m.splan"}), "name plans");
  EXPECT_FALSE(fs::exists(path("m.splan")));
  // Options for the other kind of file.
  expect_one_line_error(strata({"run", "m.strata", "--steps", "5"}),
                        "--steps is for training plans; m.strata is a model");
  expect_one_line_error(strata({"run", "m.strata", "--checkpoint", "ck3"}), "--checkpoint");
  EXPECT_FALSE(fs::exists(path("ck3")));
  expect_one_line_error(strata({"run", "t.splan", "--repeat", "5"}),
                        "--repeat is for running a model; t.splan is a training plan");
  expect_one_line_error(strata({"run", "t.splan", "--output-dir", "od"}), "--output-dir");
  EXPECT_FALSE(fs::exists(path("od")));
  for (const char *file : {"m.strata", "t.splan"}) {
    Outcome comm = strata({"inspect", file, "--comm"});
    expect_one_line_error(comm, "--comm lists a pipeline plan's transfers");
    EXPECT_EQ(comm.out, "") << comm.out; // refused before the report
  }
  expect_one_line_error(strata({"inspect", "pp.splan", "--comm", "--format", "json"}),
                        "--comm adds to the text report");
  // inspect -o through a link replaces the file it names and keeps the link;
  // /dev/stdout and - are stdout.
  fs::create_symlink("report.txt", path("link.txt"));
  ASSERT_EQ(strata({"inspect", "m.strata", "-o", "link.txt"}).code, 0);
  EXPECT_TRUE(fs::is_symlink(path("link.txt")));
  EXPECT_NE(read_file(path("report.txt")).find("parameters"), std::string::npos);
  Outcome to_stdout = strata({"inspect", "m.strata", "-o", "-"});
  ASSERT_EQ(to_stdout.code, 0) << to_stdout.err;
  EXPECT_EQ(to_stdout.out, read_file(path("report.txt")));
}

TEST_F(CliTest, GptTrainingFromTheIssue) {
  ASSERT_EQ(strata({"zoo", "gpt", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "16",
                    "--vocab", "128", "-o", "m.strata"})
                .code,
            0);
  Outcome compile = strata({"compile", "m.strata", "--train", "--loss", "softmax_cross_entropy",
                            "--optimizer", "adamw:lr=1e-3", "-o", "t.splan"});
  ASSERT_EQ(compile.code, 0) << compile.err;
  Outcome run = strata({"run", "t.splan", "--steps", "30"});
  ASSERT_EQ(run.code, 0) << run.err;
  std::vector<double> losses = printed_losses(run.out);
  ASSERT_EQ(losses.size(), 30u) << run.out;
  // Average over the 8 cycled batches: first pass against the last.
  double first = 0, last = 0;
  for (size_t i = 0; i < 8; ++i) {
    first += losses[i];
    last += losses[losses.size() - 8 + i];
  }
  EXPECT_LT(last, first) << run.out;
}

// A pipeline plan edited after compile (one update dropped: that stage's
// weights would never move) loads as a file, but every command that reads
// it refuses it, naming the device and the update.
TEST_F(CliTest, EditedPipelinePlansAreRefused) {
  ASSERT_EQ(
      strata({"zoo", "mlp", "--batch", "8", "--input", "8", "--hidden", "8,8", "-o", "m.strata"})
          .code,
      0);
  Outcome compile = strata({"compile", "m.strata", "--train", "--mesh", "1x1x2", "--microbatches",
                            "2", "-o", "pp.splan"});
  ASSERT_EQ(compile.code, 0) << compile.err;
  auto plan = serialization::load_plan(path("pp.splan").string());
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  auto &instrs = plan->programs[0].instructions;
  auto update = std::find_if(instrs.begin(), instrs.end(), [](const auto &instr) {
    return instr.kind == serialization::InstrKind::kUpdate;
  });
  ASSERT_NE(update, instrs.end());
  instrs.erase(update);
  ASSERT_TRUE(serialization::save_plan(*plan, path("bad.splan").string()).is_ok());
  ASSERT_TRUE(serialization::load_plan(path("bad.splan").string()).is_ok());
  for (const std::vector<std::string> &command :
       std::vector<std::vector<std::string>>{{"inspect", "bad.splan"},
                                             {"run", "bad.splan", "--steps", "1"},
                                             {"simulate", "bad.splan"},
                                             {"convert", "bad.splan", "-o", "bad.splan.json"}})
    expect_one_line_error(strata(command), "bad.splan: device 0 (stage 0): never applies update ");
}

// The issue's pipeline walk-through, small: compile a 4-stage 1F1B plan,
// inspect it, train it on 4 device threads with a trace, re-predict it for
// another cluster; the losses equal the single-device plan's with the same
// micro-batches.
TEST_F(CliTest, PipelineCompileInspectRunTraceSimulate) {
  ASSERT_EQ(strata({"zoo", "gpt", "--layers", "4", "--hidden", "32", "--heads", "2", "--seq", "8",
                    "--vocab", "64", "--batch", "8", "-o", "m.strata"})
                .code,
            0);
  Outcome compile =
      strata({"compile", "m.strata", "--train", "--optimizer", "adamw:lr=1e-3", "--mesh", "1x1x4",
              "--microbatches", "8", "--schedule", "1f1b", "-o", "pp.splan"});
  ASSERT_EQ(compile.code, 0) << compile.err;
  EXPECT_NE(compile.out.find("pipeline     4 stages x 8 micro-batches, schedule 1f1b"),
            std::string::npos)
      << compile.out;
  Outcome inspect = strata({"inspect", "pp.splan"});
  ASSERT_EQ(inspect.code, 0) << inspect.err;
  EXPECT_NE(inspect.out.find("predicted    step"), std::string::npos) << inspect.out;
  EXPECT_NE(inspect.out.find("(p-1)/(m+p-1) = 27.3%"), std::string::npos) << inspect.out;
  for (const char *stage : {"\n    0 ", "\n    1 ", "\n    2 ", "\n    3 "})
    EXPECT_NE(inspect.out.find(stage), std::string::npos) << stage << inspect.out;

  Outcome comm = strata({"inspect", "pp.splan", "--comm"});
  ASSERT_EQ(comm.code, 0) << comm.err;
  EXPECT_NE(comm.out.find("activation from"), std::string::npos) << comm.out;
  EXPECT_NE(comm.out.find("new value of 'wte'"), std::string::npos) << comm.out;
  // The same facts as JSON: one entry per transfer the text lists.
  Outcome report = strata({"inspect", "pp.splan", "--format", "report"});
  ASSERT_EQ(report.code, 0) << report.err;
  const auto facts = nlohmann::json::parse(report.out);
  EXPECT_EQ(facts["pipeline"]["stages"], 4);
  EXPECT_EQ(facts["stages"].size(), 4u);
  const std::string listed = comm.out.substr(comm.out.find("transfers    ") + 13);
  EXPECT_EQ(facts["transfers"].size(), std::stoul(listed)) << comm.out;
  Outcome dot = strata({"inspect", "pp.splan", "--format", "dot"});
  ASSERT_EQ(dot.code, 0) << dot.err;
  EXPECT_NE(dot.out.find("stage2 -> stage3"), std::string::npos) << dot.out;
  Outcome predicted = strata({"inspect", "pp.splan", "--format", "trace", "-o", "predicted.json"});
  ASSERT_EQ(predicted.code, 0) << predicted.err;
  EXPECT_NE(read_file(path("predicted.json")).find("\"name\": \"B7\""), std::string::npos);

  Outcome run = strata({"run", "pp.splan", "--steps", "3", "--trace", "t.json"});
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_EQ(printed_losses(run.out).size(), 3u) << run.out;
  const std::string trace = read_file(path("t.json"));
  EXPECT_NE(trace.find("device 3 (stage 3)"), std::string::npos);
  EXPECT_NE(trace.find("\"name\": \"F7\""), std::string::npos);
  // Timed by the device clock: the same losses, and the step on a core per device.
  Outcome clocked =
      strata({"run", "pp.splan", "--steps", "3", "--clock", "device", "--trace", "td.json"});
  ASSERT_EQ(clocked.code, 0) << clocked.err;
  EXPECT_EQ(printed_losses(clocked.out), printed_losses(run.out)) << clocked.out;
  EXPECT_TRUE(std::regex_search(clocked.out, std::regex("device +[0-9.]+ ms per step on a core "
                                                        "per device \\(the device clock, "
                                                        "which the trace uses too")))
      << clocked.out;
  EXPECT_NE(read_file(path("td.json")).find("\"name\": \"F7\""), std::string::npos);
  // Interleaved: two model chunks per device, the same losses.
  Outcome interleaved = strata({"compile", "m.strata", "--train", "--optimizer", "adamw:lr=1e-3",
                                "--mesh", "1x1x4", "--microbatches", "8", "--schedule",
                                "interleaved", "--chunks", "2", "-o", "pi.splan"});
  ASSERT_EQ(interleaved.code, 0) << interleaved.err;
  EXPECT_NE(interleaved.out.find("schedule interleaved (2 model chunks per device)"),
            std::string::npos)
      << interleaved.out;
  EXPECT_NE(interleaved.out.find("(p-1)/(vm+p-1) = 15.8%"), std::string::npos) << interleaved.out;
  Outcome run_interleaved = strata({"run", "pi.splan", "--steps", "3", "--trace", "ti.json"});
  ASSERT_EQ(run_interleaved.code, 0) << run_interleaved.err;
  EXPECT_EQ(printed_losses(run_interleaved.out), printed_losses(run.out)) << run_interleaved.out;
  EXPECT_NE(read_file(path("ti.json")).find("\"name\": \"F7 c1\""), std::string::npos);
  EXPECT_NE(read_file(path("ti.json")).find("device 1 (stages 1, 5)"), std::string::npos);
  Outcome inspect_interleaved = strata({"inspect", "pi.splan"});
  ASSERT_EQ(inspect_interleaved.code, 0) << inspect_interleaved.err;
  EXPECT_NE(inspect_interleaved.out.find("pipeline position s run stages s, s+4, ... (of 8)"),
            std::string::npos)
      << inspect_interleaved.out;
  Outcome dot_interleaved = strata({"inspect", "pi.splan", "--format", "dot"});
  ASSERT_EQ(dot_interleaved.code, 0) << dot_interleaved.err;
  EXPECT_NE(dot_interleaved.out.find("device 1\\nstages 1, 5"), std::string::npos)
      << dot_interleaved.out;
  Outcome simulate_interleaved = strata({"simulate", "pi.splan"});
  ASSERT_EQ(simulate_interleaved.code, 0) << simulate_interleaved.err;
  EXPECT_NE(simulate_interleaved.out.find("interleaved, 2 chunks per device"), std::string::npos)
      << simulate_interleaved.out;

  // Zero-bubble H1: the same losses, a smaller predicted bubble.
  Outcome zb = strata({"compile", "m.strata", "--train", "--optimizer", "adamw:lr=1e-3", "--mesh",
                       "1x1x4", "--microbatches", "8", "--schedule", "zb-h1", "-o", "zb.splan"});
  ASSERT_EQ(zb.code, 0) << zb.err;
  EXPECT_NE(zb.out.find("schedule zb-h1"), std::string::npos) << zb.out;
  EXPECT_NE(zb.out.find("(p-1)/(3m+p-1) = 11.1% with F = B = W"), std::string::npos) << zb.out;
  Outcome run_zb = strata({"run", "zb.splan", "--steps", "3", "--trace", "tz.json"});
  ASSERT_EQ(run_zb.code, 0) << run_zb.err;
  EXPECT_EQ(printed_losses(run_zb.out), printed_losses(run.out)) << run_zb.out;
  // The trace names the weight halves W.
  EXPECT_NE(read_file(path("tz.json")).find("\"name\": \"W7\""), std::string::npos);
  EXPECT_EQ(read_file(path("t.json")).find("\"name\": \"W7\""), std::string::npos);
  // With fewer micro-batches than stages device 1 runs each W right after
  // its B: still named W.
  ASSERT_EQ(strata({"compile", "m.strata", "--train", "--optimizer", "adamw:lr=1e-3", "--mesh",
                    "1x1x4", "--microbatches", "2", "--schedule", "zb-h1", "-o", "zb2.splan"})
                .code,
            0);
  ASSERT_EQ(strata({"run", "zb2.splan", "--steps", "1", "--trace", "tz2.json"}).code, 0);
  EXPECT_NE(read_file(path("tz2.json"))
                .find("\"name\": \"W0\", \"cat\": \"backward\", \"ph\": \"X\", \"pid\": 0, "
                      "\"tid\": 1,"),
            std::string::npos);

  // The same micro-batches on one device: the same losses, bitwise (printed).
  ASSERT_EQ(strata({"compile", "m.strata", "--train", "--optimizer", "adamw:lr=1e-3",
                    "--microbatches", "8", "-o", "one.splan"})
                .code,
            0);
  Outcome one = strata({"run", "one.splan", "--steps", "3"});
  ASSERT_EQ(one.code, 0) << one.err;
  EXPECT_EQ(printed_losses(one.out), printed_losses(run.out)) << one.out << run.out;

  const char *source = std::getenv("STRATA_SOURCE_ROOT");
  if (source == nullptr) GTEST_SKIP() << "STRATA_SOURCE_ROOT is not set (run through meson test)";
  Outcome simulate =
      strata({"simulate", "pp.splan", "--cluster",
              (fs::path(source) / "examples" / "clusters" / "h100-8x-nvlink.json").string()});
  ASSERT_EQ(simulate.code, 0) << simulate.err;
  EXPECT_NE(simulate.out.find("cluster    h100-8x-nvlink"), std::string::npos) << simulate.out;
  EXPECT_NE(simulate.out.find("bubble"), std::string::npos) << simulate.out;
}

// `steps` losses printed by both runs, equal to 1e-4 (as printed).
void expect_same_losses(const Outcome &run, const Outcome &one, size_t steps) {
  std::vector<double> got = printed_losses(run.out), want = printed_losses(one.out);
  ASSERT_EQ(got.size(), steps) << run.out;
  ASSERT_EQ(want.size(), steps) << one.out;
  for (size_t i = 0; i < steps; ++i)
    EXPECT_NEAR(got[i], want[i], 1e-4) << run.out << one.out;
}

// --mesh 2x1x2: two replicas of a two-stage pipeline on four device threads
// train like one device on the whole batch.
TEST_F(CliTest, DataParallelPipeline) {
  ASSERT_EQ(strata({"zoo", "mlp", "--batch", "16", "--hidden", "32,32", "-o", "m.strata"}).code, 0);
  Outcome compile =
      strata({"compile", "m.strata", "--train", "--optimizer", "sgd:lr=0.1,momentum=0.9", "--mesh",
              "2x1x2", "--microbatches", "2", "-o", "dp.splan"});
  ASSERT_EQ(compile.code, 0) << compile.err;
  EXPECT_NE(compile.out.find("data par.    2 replicas of every stage"), std::string::npos)
      << compile.out;
  EXPECT_NE(compile.out.find("all-reduce"), std::string::npos) << compile.out;
  // The algorithm the compiler picked for each group, in the summary and on
  // every gradient's row of `inspect --comm`.
  const std::string algorithms = "(ring|tree|recursive-doubling|rabenseifner)";
  EXPECT_TRUE(std::regex_search(compile.out, std::regex("all-reduced per stage \\(" + algorithms)))
      << compile.out;
  Outcome dp_comm = strata({"inspect", "dp.splan", "--comm"});
  ASSERT_EQ(dp_comm.code, 0) << dp_comm.err;
  EXPECT_TRUE(
      std::regex_search(dp_comm.out, std::regex("summed over the replicas.*; " + algorithms)))
      << dp_comm.out;
  Outcome run = strata({"run", "dp.splan", "--steps", "4"});
  ASSERT_EQ(run.code, 0) << run.err;
  // ZeRO-1 trains to the same losses as plain data parallelism.
  Outcome zero = strata({"compile", "m.strata", "--train", "--optimizer", "sgd:lr=0.1,momentum=0.9",
                         "--mesh", "2x1x2", "--microbatches", "2", "--zero", "1", "-o", "z.splan"});
  ASSERT_EQ(zero.code, 0) << zero.err;
  EXPECT_NE(zero.out.find("optimizer state sharded (ZeRO-1)"), std::string::npos) << zero.out;
  Outcome zero_run = strata({"run", "z.splan", "--steps", "4"});
  ASSERT_EQ(zero_run.code, 0) << zero_run.err;
  EXPECT_EQ(printed_losses(zero_run.out), printed_losses(run.out)) << zero_run.out << run.out;
  expect_one_line_error(strata({"compile", "m.strata", "--train", "--zero", "1", "-o", "x.splan"}),
                        "--zero 1 shards the optimizer state over data-parallel replicas");
  // ZeRO-2 keeps the gradients as shards too: the same losses to rounding (it
  // sums over the replicas before the micro-batches), each reduce-scatter
  // explained.
  Outcome zero2 =
      strata({"compile", "m.strata", "--train", "--optimizer", "sgd:lr=0.1,momentum=0.9", "--mesh",
              "2x1x2", "--microbatches", "2", "--zero", "2", "-o", "z2.splan"});
  ASSERT_EQ(zero2.code, 0) << zero2.err;
  EXPECT_NE(zero2.out.find("gradients reduce-scattered every micro-batch and kept as shards "
                           "(ZeRO-2)"),
            std::string::npos)
      << zero2.out;
  Outcome zero2_run = strata({"run", "z2.splan", "--steps", "4"});
  ASSERT_EQ(zero2_run.code, 0) << zero2_run.err;
  expect_same_losses(zero2_run, run, 4);
  Outcome zero2_comm = strata({"inspect", "z2.splan", "--comm"});
  ASSERT_EQ(zero2_comm.code, 0) << zero2_comm.err;
  EXPECT_NE(zero2_comm.out.find("shard-sized sum (ZeRO-2)"), std::string::npos) << zero2_comm.out;
  expect_one_line_error(strata({"compile", "m.strata", "--train", "--zero", "2", "-o", "x.splan"}),
                        "--zero 2 shards the gradients and optimizer state over data-parallel "
                        "replicas");
  EXPECT_NE(strata({"compile", "--help"}).out.find("ZeRO-2"), std::string::npos);
  // ZeRO-3 prefetches its gathers unless told not to: the same losses as
  // ZeRO-2 either way, and the compile summary says which.
  for (const bool prefetch : {true, false}) {
    std::vector<std::string> args = {
        "compile", "m.strata", "--train",        "--optimizer", "sgd:lr=0.1,momentum=0.9",
        "--mesh",  "2x1x2",    "--microbatches", "2",           "--zero",
        "3",       "-o",       "z3.splan"};
    if (!prefetch) args.insert(args.end() - 2, "--no-prefetch");
    Outcome zero3 = strata(args);
    ASSERT_EQ(zero3.code, 0) << zero3.err;
    EXPECT_NE(zero3.out.find(prefetch ? "gathered on the communication stream one batch ahead"
                                      : "gathered right before use"),
              std::string::npos)
        << zero3.out;
    Outcome zero3_run = strata({"run", "z3.splan", "--steps", "4"});
    ASSERT_EQ(zero3_run.code, 0) << zero3_run.err;
    EXPECT_EQ(printed_losses(zero3_run.out), printed_losses(zero2_run.out)) << zero3_run.out;
  }
  expect_one_line_error(strata({"compile", "m.strata", "--train", "--mesh", "2x1x1",
                                "--no-prefetch", "-o", "x.splan"}),
                        "--no-prefetch is for --zero 3");
  ASSERT_EQ(strata({"compile", "m.strata", "--train", "--optimizer", "sgd:lr=0.1,momentum=0.9",
                    "-o", "one.splan"})
                .code,
            0);
  Outcome one = strata({"run", "one.splan", "--steps", "4"});
  ASSERT_EQ(one.code, 0) << one.err;
  expect_same_losses(run, one, 4);

  // Gradient buckets (on by default): --bucket-mb 0 reduces each gradient
  // after backward instead, with the same bits; inspect --comm lists buckets.
  EXPECT_NE(compile.out.find("buckets      gradients summed in buckets of up to 25.00 MiB"),
            std::string::npos)
      << compile.out;
  Outcome small =
      strata({"compile", "m.strata", "--train", "--optimizer", "sgd:lr=0.1,momentum=0.9", "--mesh",
              "2x1x2", "--microbatches", "2", "--bucket-mb", "0.001", "-o", "small.splan"});
  ASSERT_EQ(small.code, 0) << small.err;
  Outcome comm = strata({"inspect", "small.splan", "--comm"});
  ASSERT_EQ(comm.code, 0) << comm.err;
  EXPECT_NE(comm.out.find("gradient bucket 1 ("), std::string::npos) << comm.out;
  EXPECT_NE(comm.out.find("overlapping the rest of backward"), std::string::npos) << comm.out;
  Outcome none =
      strata({"compile", "m.strata", "--train", "--optimizer", "sgd:lr=0.1,momentum=0.9", "--mesh",
              "2x1x2", "--microbatches", "2", "--bucket-mb", "0", "-o", "none.splan"});
  ASSERT_EQ(none.code, 0) << none.err;
  EXPECT_EQ(none.out.find("buckets "), std::string::npos) << none.out;
  for (const char *plan : {"small.splan", "none.splan"}) {
    Outcome again = strata({"run", plan, "--steps", "4"});
    ASSERT_EQ(again.code, 0) << again.err;
    EXPECT_EQ(printed_losses(again.out), printed_losses(run.out)) << plan << again.out;
  }
  expect_one_line_error(strata({"compile", "m.strata", "--train", "--mesh", "2x1x1", "--bucket-mb",
                                "-1", "-o", "x.splan"}),
                        "--bucket-mb");
}

// --mesh 2x2x2: tensor-parallel groups of two inside a data-parallel pipeline
// (eight device threads) train like one device; inspect says what is split.
TEST_F(CliTest, TensorParallelMesh) {
  ASSERT_EQ(strata({"zoo", "gpt", "--layers", "2", "--hidden", "32", "--heads", "4", "--seq", "8",
                    "--vocab", "64", "--batch", "8", "-o", "g.strata"})
                .code,
            0);
  Outcome compile = strata({"compile", "g.strata", "--train", "--optimizer", "sgd:lr=0.1", "--mesh",
                            "2x2x2", "--microbatches", "2", "-o", "tp.splan"});
  ASSERT_EQ(compile.code, 0) << compile.err;
  EXPECT_NE(compile.out.find("tensor par.  2 devices per group"), std::string::npos) << compile.out;
  EXPECT_NE(compile.out.find(" TpAll"), std::string::npos) << compile.out;
  Outcome comm = strata({"inspect", "tp.splan", "--comm"});
  ASSERT_EQ(comm.code, 0) << comm.err;
  EXPECT_NE(comm.out.find("  TpAll"), std::string::npos) << comm.out;
  Outcome run = strata({"run", "tp.splan", "--steps", "3"});
  ASSERT_EQ(run.code, 0) << run.err;
  ASSERT_EQ(
      strata({"compile", "g.strata", "--train", "--optimizer", "sgd:lr=0.1", "-o", "one.splan"})
          .code,
      0);
  Outcome one = strata({"run", "one.splan", "--steps", "3"});
  ASSERT_EQ(one.code, 0) << one.err;
  expect_same_losses(run, one, 3);
  // --split-activations: partial sums reduce-scattered, the same losses.
  Outcome split = strata({"compile", "g.strata", "--train", "--optimizer", "sgd:lr=0.1", "--mesh",
                          "1x2x1", "--split-activations", "-o", "sa.splan"});
  ASSERT_EQ(split.code, 0) << split.err;
  Outcome split_comm = strata({"inspect", "sa.splan", "--comm"});
  EXPECT_NE(split_comm.out.find("TpReduceScatter: "), std::string::npos) << split_comm.out;
  Outcome split_run = strata({"run", "sa.splan", "--steps", "3"});
  ASSERT_EQ(split_run.code, 0) << split_run.err;
  expect_same_losses(split_run, one, 3);
  // The interleaved schedule with tensor-parallel pairs at each position.
  Outcome interleaved = strata({"compile", "g.strata", "--train", "--optimizer", "sgd:lr=0.1",
                                "--mesh", "1x2x2", "--microbatches", "2", "--schedule",
                                "interleaved", "--chunks", "2", "-o", "ti.splan"});
  ASSERT_EQ(interleaved.code, 0) << interleaved.err;
  EXPECT_NE(interleaved.out.find("tensor par.  2 devices per group"), std::string::npos)
      << interleaved.out;
  Outcome interleaved_run = strata({"run", "ti.splan", "--steps", "3", "--trace", "ti.json"});
  ASSERT_EQ(interleaved_run.code, 0) << interleaved_run.err;
  expect_same_losses(interleaved_run, one, 3);
  EXPECT_NE(read_file(path("ti.json")).find("device 1 (stages 0, 2 member 1)"), std::string::npos);
}

// --recompute: the plan says what it recomputes, needs less activation memory
// and prints the same losses.
TEST_F(CliTest, RecomputeKeepsTheLosses) {
  ASSERT_EQ(strata({"zoo", "gpt", "--layers", "2", "--hidden", "32", "--heads", "2", "--seq", "16",
                    "--vocab", "64", "--batch", "8", "-o", "g.strata"})
                .code,
            0);
  Outcome plain = strata({"compile", "g.strata", "--train", "--mesh", "1x1x2", "--microbatches",
                          "4", "-o", "p.splan"});
  ASSERT_EQ(plain.code, 0) << plain.err;
  Outcome recompute = strata({"compile", "g.strata", "--train", "--mesh", "1x1x2", "--microbatches",
                              "4", "--recompute", "-o", "r.splan"});
  ASSERT_EQ(recompute.code, 0) << recompute.err;
  EXPECT_NE(recompute.out.find("forward nodes recomputed in backward"), std::string::npos)
      << recompute.out;
  Outcome a = strata({"run", "p.splan", "--steps", "3"});
  Outcome b = strata({"run", "r.splan", "--steps", "3"});
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_EQ(printed_losses(a.out), printed_losses(b.out)) << a.out << b.out;
  // The interleaved schedule recomputes too, to the same losses.
  Outcome interleaved =
      strata({"compile", "g.strata", "--train", "--mesh", "1x1x2", "--microbatches", "4",
              "--schedule", "interleaved", "--chunks", "2", "--recompute", "-o", "ir.splan"});
  ASSERT_EQ(interleaved.code, 0) << interleaved.err;
  EXPECT_NE(interleaved.out.find("forward nodes recomputed in backward"), std::string::npos)
      << interleaved.out;
  Outcome c = strata({"run", "ir.splan", "--steps", "3"});
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_EQ(printed_losses(a.out), printed_losses(c.out)) << a.out << c.out;
  expect_one_line_error(strata({"compile", "g.strata", "--recompute", "-o", "x.splan"}), "--train");
}

TEST_F(CliTest, AutoSearchExplainsAndTrains) {
  ASSERT_EQ(strata({"zoo", "gpt", "--layers", "4", "--hidden", "32", "--heads", "2", "--seq", "8",
                    "--vocab", "64", "--batch", "8", "-o", "m.strata"})
                .code,
            0);
  Outcome compile = strata({"compile", "m.strata", "--train", "--auto", "--devices", "4",
                            "--explain", "-o", "auto.splan"});
  ASSERT_EQ(compile.code, 0) << compile.err;
  EXPECT_NE(compile.out.find("candidates compiled and simulated"), std::string::npos)
      << compile.out;
  EXPECT_NE(compile.out.find("rank  candidate"), std::string::npos) << compile.out;
  EXPECT_NE(compile.out.find("chosen       dp="), std::string::npos) << compile.out;
  Outcome run = strata({"run", "auto.splan", "--steps", "2"});
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_EQ(printed_losses(run.out).size(), 2u) << run.out;
  expect_one_line_error(
      strata({"compile", "m.strata", "--train", "--auto", "--mesh", "1x1x2", "-o", "x.splan"}),
      "excludes");
}

// strata verify: every kind of plan the CLI compiles trains like its
// one-device reference (the same step, the same micro-batches, on one
// device), bitwise where strata promises it, whether that reference is
// lowered from the plan's own graph or compiled again from the model. A
// tensor-parallel plan, whose graph is one member's share, needs the model.
TEST_F(CliTest, VerifyPassesOnEveryPlanKind) {
  ASSERT_EQ(strata({"zoo", "gpt", "--layers", "2", "--hidden", "32", "--heads", "4", "--seq", "8",
                    "--vocab", "64", "--batch", "8", "-o", "g.strata"})
                .code,
            0);
  struct Case {
    const char *plan;
    std::vector<std::string> flags;
    bool bitwise;
  };
  const std::vector<Case> cases = {
      {"one.splan", {}, true},
      {"pp.splan", {"--mesh", "1x1x2", "--microbatches", "2"}, true},
      {"gpipe.splan", {"--mesh", "1x1x2", "--microbatches", "2", "--schedule", "gpipe"}, true},
      {"inter.splan",
       {"--mesh", "1x1x2", "--microbatches", "2", "--schedule", "interleaved"},
       true},
      {"re.splan", {"--mesh", "1x1x2", "--microbatches", "2", "--recompute"}, true},
      {"zb.splan", {"--mesh", "1x1x2", "--microbatches", "4", "--schedule", "zb-h1"}, true},
      {"dp.splan", {"--mesh", "2x1x1"}, false}, // gradient buckets, the default
      {"flat.splan", {"--mesh", "2x1x1", "--bucket-mb", "0"}, false},
      {"zero.splan", {"--mesh", "2x1x1", "--zero", "1"}, false},
  };
  for (const Case &c : cases) {
    std::vector<std::string> compile = {"compile", "g.strata", "--train", "--optimizer",
                                        "sgd:lr=0.1,momentum=0.9"};
    compile.insert(compile.end(), c.flags.begin(), c.flags.end());
    compile.push_back("-o");
    compile.push_back(c.plan);
    Outcome compiled = strata(compile);
    ASSERT_EQ(compiled.code, 0) << c.plan << ": " << compiled.err;
    for (const bool with_model : {false, true}) {
      std::vector<std::string> verify = {"verify", c.plan, "--steps", "3"};
      if (with_model) {
        verify.push_back("--model");
        verify.push_back("g.strata");
      }
      Outcome o = strata(verify);
      const std::string what =
          str_cat(c.plan, with_model ? " --model g.strata" : "", ":\n", o.out, o.err);
      EXPECT_EQ(o.code, 0) << what;
      EXPECT_NE(o.out.find("step 3/3  loss "), std::string::npos) << what;
      EXPECT_NE(o.out.find("pass       3 steps, every loss and tensor "), std::string::npos)
          << what;
      EXPECT_EQ(o.out.find("pass       3 steps, every loss and tensor bitwise equal") !=
                    std::string::npos,
                c.bitwise)
          << what;
    }
  }

  Outcome tp = strata({"compile", "g.strata", "--train", "--optimizer", "sgd:lr=0.1,momentum=0.9",
                       "--mesh", "1x2x1", "-o", "tp.splan"});
  ASSERT_EQ(tp.code, 0) << tp.err;
  expect_one_line_error(strata({"verify", "tp.splan"}),
                        "give the model it was compiled from with --model");
  Outcome verified = strata({"verify", "tp.splan", "--model", "g.strata", "--steps", "3"});
  EXPECT_EQ(verified.code, 0) << verified.out << verified.err;
  EXPECT_NE(verified.out.find("2-device tensor-parallel groups"), std::string::npos)
      << verified.out;
  EXPECT_NE(verified.out.find("pass       3 steps, every loss and tensor within 1e-05 (relative)"),
            std::string::npos)
      << verified.out;
  // Another model is not the plan's.
  ASSERT_EQ(strata({"zoo", "mlp", "--batch", "8", "-o", "m.strata"}).code, 0);
  expect_one_line_error(strata({"verify", "tp.splan", "--model", "m.strata"}),
                        "m.strata is not the model tp.splan was compiled from");
}

// A plan whose embedded graph was edited after compile (weight decay slipped
// into one parameter's update) loads and trains; against the model it was
// compiled from it fails, naming the first step that went wrong and the
// tensor farthest off there.
TEST_F(CliTest, VerifyNamesTheStepAndTensorOfAWrongPlan) {
  ASSERT_EQ(strata({"zoo", "gpt", "--layers", "2", "--hidden", "32", "--heads", "4", "--seq", "8",
                    "--vocab", "64", "--batch", "8", "-o", "g.strata"})
                .code,
            0);
  Outcome compile = strata({"compile", "g.strata", "--train", "--optimizer", "sgd:lr=0.1", "--mesh",
                            "1x1x2", "--microbatches", "2", "-o", "pp.splan"});
  ASSERT_EQ(compile.code, 0) << compile.err;
  auto plan = serialization::load_plan(path("pp.splan").string());
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  std::string edited; // a parameter drawn from normal(0, std): not zero at the first step
  for (NodeId id = 0; id < plan->graph.num_nodes() && edited.empty(); ++id) {
    if (plan->graph.node(id).op != "SgdUpdate") continue;
    const Tensor &param = plan->graph.tensor(plan->graph.node(id).inputs[0]);
    if (param.initializer.kind != Initializer::Kind::kNormal) continue;
    edited = param.name;
    plan->graph.mutable_node(id).set_attr("weight_decay", 0.5);
  }
  ASSERT_FALSE(edited.empty());
  ASSERT_TRUE(serialization::save_plan(*plan, path("bad.splan").string()).is_ok());
  ASSERT_TRUE(serialization::load_plan(path("bad.splan").string()).is_ok());

  Outcome good = strata({"verify", "pp.splan", "--model", "g.strata", "--steps", "3"});
  EXPECT_EQ(good.code, 0) << good.out << good.err;
  Outcome bad = strata({"verify", "bad.splan", "--model", "g.strata", "--steps", "3"});
  EXPECT_EQ(bad.code, 1) << bad.out << bad.err;
  expect_one_line_error(bad, str_cat("bad.splan: step 1: tensor '", edited,
                                     "' differs from the one-device reference's by "));
  EXPECT_NE(bad.err.find("over the tolerance 0 (bitwise)"), std::string::npos) << bad.err;
  EXPECT_NE(bad.out.find("step 3/3  loss "), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("<- over the tolerance"), std::string::npos) << bad.out;
  // A tolerance that admits the edit passes it.
  Outcome loose =
      strata({"verify", "bad.splan", "--model", "g.strata", "--steps", "1", "--tolerance", "0.5"});
  EXPECT_EQ(loose.code, 0) << loose.out << loose.err;
  EXPECT_NE(loose.out.find("tolerance  0.5 (relative): given by --tolerance"), std::string::npos)
      << loose.out;

  // What verify refuses, naming the option or the file.
  Outcome negative = strata({"verify", "pp.splan", "--tolerance", "-1"});
  expect_one_line_error(negative, "--tolerance: Value -1 not in range");
  EXPECT_EQ(negative.code, 2);
  expect_one_line_error(strata({"verify", "pp.splan", "--steps", "0"}),
                        "--steps: Value 0 not in range 1 to");
  expect_one_line_error(strata({"verify", "pp.splan", "--model", "bad.splan"}),
                        "--model bad.splan is a plan");
  ASSERT_EQ(strata({"compile", "g.strata", "-o", "infer.splan"}).code, 0);
  expect_one_line_error(strata({"verify", "infer.splan"}), "infer.splan is an inference plan");
  expect_one_line_error(strata({"verify", "nope.splan"}), "nope.splan");
}

TEST_F(CliTest, PipelineOptionErrors) {
  ASSERT_EQ(strata({"zoo", "mlp", "--batch", "6", "-o", "m.strata"}).code, 0);
  expect_one_line_error(strata({"compile", "m.strata", "--mesh", "1x1x2", "-o", "p.splan"}),
                        "--mesh");
  expect_one_line_error(
      strata({"compile", "m.strata", "--train", "--mesh", "1x0x2", "-o", "p.splan"}), "DPxTPxPP");
  expect_one_line_error(
      strata({"compile", "m.strata", "--train", "--mesh", "1x1", "-o", "p.splan"}), "DPxTPxPP");
  expect_one_line_error(
      strata({"compile", "m.strata", "--train", "--microbatches", "4", "-o", "p.splan"}),
      "input 'x' has batch 6, which 4 micro-batches do not divide");
  // Gradient buckets need replicas to all-reduce over.
  expect_one_line_error(
      strata({"compile", "m.strata", "--train", "--bucket-mb", "5", "-o", "p.splan"}),
      "--bucket-mb groups the data-parallel replicas' gradient all-reduces; without --mesh one");
  expect_one_line_error(strata({"compile", "m.strata", "--train", "--mesh", "1x1x2", "--bucket-mb",
                                "5", "-o", "p.splan"}),
                        "this mesh has one replica");
  EXPECT_FALSE(fs::exists(path("p.splan")));
  // With replicas the count is theirs times the micro-batches: the error says so.
  expect_one_line_error(strata({"compile", "m.strata", "--train", "--mesh", "2x1x1",
                                "--microbatches", "2", "-o", "p.splan"}),
                        "cut into 2 micro-batches for each of 2 replicas (4 slices)");
  expect_one_line_error(strata({"compile", "m.strata", "--train", "--mesh", "1x1x2",
                                "--stage-boundaries", "no_such_node", "-o", "p.splan"}),
                        "no_such_node");
  // A schedule without a pipeline would be ignored.
  for (const char *schedule : {"gpipe", "zb-h1"})
    expect_one_line_error(
        strata({"compile", "m.strata", "--train", "--schedule", schedule, "-o", "p.splan"}),
        str_cat("--schedule ", schedule, " orders the micro-batches of a pipeline"));
  EXPECT_FALSE(fs::exists(path("p.splan")));
  ASSERT_EQ(strata({"compile", "m.strata", "--train", "-o", "t.splan"}).code, 0);
  expect_one_line_error(strata({"run", "t.splan", "--trace", "t.json"}), "--trace");
  expect_one_line_error(strata({"compile", "m.strata", "--train", "--mesh", "1x1x2", "--chunks",
                                "2", "-o", "p.splan"}),
                        "--chunks cuts the model into chunks per device for --schedule "
                        "interleaved, not 1f1b (the default)");
  expect_one_line_error(
      strata({"compile", "m.strata", "--train", "--mesh", "1x1x2", "--microbatches", "3",
              "--schedule", "interleaved", "-o", "p.splan"}),
      "--microbatches 3 is not a multiple of 2");
  expect_one_line_error(
      strata({"compile", "m.strata", "--train", "--schedule", "interleaved", "-o", "p.splan"}),
      "a pipeline of 2 or more stages (--mesh 1x1xP)");
  EXPECT_FALSE(fs::exists(path("p.splan")));
  expect_one_line_error(strata({"run", "m.strata", "--clock", "device"}),
                        "--clock device is for training plans");
  expect_one_line_error(strata({"run", "t.splan", "--clock", "device"}),
                        "--clock device times a pipeline plan's devices; this plan has one device");
  expect_one_line_error(strata({"simulate", "t.splan"}), "not a pipeline plan");
}

} // namespace
} // namespace strata
