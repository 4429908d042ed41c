// The training formats: state tensors and updates in model files, plan files
// (canonical bytes, JSON form, robustness, meaning checks) and checkpoints.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "passes/make_training.h"
#include "passes/plan_memory.h"
#include "serialization/checkpoint.h"
#include "serialization/model_io.h"
#include "serialization/plan_io.h"
#include "serialization/safetensors.h"
#include "serialization/sha256.h"
#include "test_util.h"
#include "tools/zoo.h"

namespace strata::serialization {
namespace {

using testing::TempDir;

Graph small_mlp() {
  zoo::MlpOptions options;
  options.batch = 4;
  options.input = 6;
  options.hidden = {5};
  options.classes = 3;
  auto graph = zoo::make_mlp(options);
  EXPECT_TRUE(graph.is_ok()) << graph.status().message();
  return std::move(graph).value();
}

Graph training_graph(const std::string &optimizer = "adamw:lr=0.01,wd=0.1") {
  passes::TrainingOptions options;
  options.optimizer = *passes::parse_optimizer(optimizer);
  auto graph = passes::make_training_graph(small_mlp(), options);
  EXPECT_TRUE(graph.is_ok()) << graph.status().message();
  return std::move(graph).value();
}

Plan make_plan(Graph graph) {
  Plan plan;
  plan.mode = Plan::Mode::kTrain;
  plan.graph = std::move(graph);
  plan.loss = "loss";
  plan.loss_kind = "softmax_cross_entropy";
  plan.optimizer = "adamw:lr=0.01,wd=0.1";
  plan.model_fingerprint = sha256_hex(std::string_view("model"));
  plan.fingerprint = plan_fingerprint({}, "mode=train\n");
  auto order = plan.graph.topological_order();
  EXPECT_TRUE(order.is_ok());
  auto memory = passes::plan_memory(plan.graph, *order);
  EXPECT_TRUE(memory.is_ok());
  plan.devices.push_back({0, "cpu"});
  plan.programs.push_back({0, *order, memory->arena_bytes, memory->offsets});
  return plan;
}

TEST(Sha256Test, KnownDigests) {
  EXPECT_EQ(sha256_hex(std::string_view("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex(std::string_view("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(
      sha256_hex(std::string_view("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
      "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(ModelStateTest, StateTensorsAndUpdatesRoundTrip) {
  Graph graph = training_graph();
  ASSERT_FALSE(graph.updates().empty());
  auto bytes = model_to_flatbuffer(graph);
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().message();
  auto loaded = load_model_from_buffer(*bytes, "train.strata", ".");
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  EXPECT_EQ(loaded->updates().vec(), graph.updates().vec());
  size_t states = 0;
  for (TensorId id = 0; id < graph.num_tensors(); ++id) {
    EXPECT_EQ(loaded->tensor(id).kind, graph.tensor(id).kind);
    states += graph.tensor(id).kind == TensorKind::kState;
  }
  EXPECT_GT(states, 0u);
  // Canonical: the loaded graph writes the same bytes, and so does its JSON.
  EXPECT_EQ(*model_to_flatbuffer(*loaded), *bytes);
  auto json = model_to_json(graph);
  ASSERT_TRUE(json.is_ok());
  EXPECT_NE(json->find("\"schema_version\": 2"), std::string::npos);
  EXPECT_NE(json->find("\"updates\": ["), std::string::npos);
  EXPECT_NE(json->find("\"kind\": \"State\""), std::string::npos);
  auto from_json = load_model_from_json(*json, "train.json", ".");
  ASSERT_TRUE(from_json.is_ok()) << from_json.status().message();
  EXPECT_EQ(*model_to_flatbuffer(*from_json), *bytes);
}

TEST(ModelStateTest, ModelsWithoutStateStayRevisionOne) {
  auto json = model_to_json(small_mlp());
  ASSERT_TRUE(json.is_ok());
  EXPECT_NE(json->find("\"schema_version\": 1"), std::string::npos);
  EXPECT_EQ(json->find("updates"), std::string::npos);
}

TEST(ModelStateTest, BadUpdatesAreRefusedNamingTheField) {
  auto json = model_to_json(training_graph());
  ASSERT_TRUE(json.is_ok());
  std::string text = *json;
  size_t at = text.find("{\"target\": ");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 11, "{\"target\": 99999");
  auto loaded = load_model_from_json(text, "bad.json", ".");
  ASSERT_FALSE(loaded.is_ok());
  EXPECT_NE(loaded.status().message().find("bad.json"), std::string::npos);
  EXPECT_NE(loaded.status().message().find("updates[0].target"), std::string::npos)
      << loaded.status().message();

  // State tensors in a file that claims revision 1.
  std::string old = *json;
  old.replace(old.find("\"schema_version\": 2"), 19, "\"schema_version\": 1");
  auto refused = load_model_from_json(old, "old.json", ".");
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("version 2"), std::string::npos);
}

TEST(PlanTest, BinaryRoundTripIsByteIdentical) {
  Plan plan = make_plan(training_graph());
  auto bytes = plan_to_flatbuffer(plan);
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().message();
  // The same inputs give the same bytes.
  EXPECT_EQ(*plan_to_flatbuffer(make_plan(training_graph())), *bytes);
  auto loaded = load_plan_from_buffer(*bytes, "t.splan", ".");
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  EXPECT_EQ(loaded->mode, Plan::Mode::kTrain);
  EXPECT_EQ(loaded->loss, "loss");
  EXPECT_EQ(loaded->optimizer, plan.optimizer);
  EXPECT_EQ(loaded->fingerprint, plan.fingerprint);
  EXPECT_EQ(loaded->devices, plan.devices);
  EXPECT_EQ(loaded->programs, plan.programs);
  EXPECT_EQ(loaded->producer, std::string("strata ") + STRATA_VERSION);
  EXPECT_EQ(*plan_to_flatbuffer(*loaded), *bytes);
}

TEST(PlanTest, JsonRoundTripAndFileSniffing) {
  TempDir dir;
  Plan plan = make_plan(training_graph());
  std::string binary = dir.file("t.splan"), json = dir.file("t.splan.json");
  ASSERT_TRUE(save_plan(plan, binary).is_ok());
  ASSERT_TRUE(save_plan(plan, json).is_ok());
  auto from_json = load_plan(json);
  ASSERT_TRUE(from_json.is_ok()) << from_json.status().message();
  EXPECT_EQ(*plan_to_flatbuffer(*from_json), *plan_to_flatbuffer(plan));
  // A plan's JSON starts with plan_version, whatever the file is called.
  std::filesystem::copy_file(json, dir.file("renamed.json"));
  EXPECT_TRUE(file_is_plan(dir.file("renamed.json")));
  std::filesystem::copy_file(binary, dir.file("renamed.bin"));
  EXPECT_TRUE(file_is_plan(dir.file("renamed.bin")));
  ASSERT_TRUE(save_model(small_mlp(), dir.file("m.json")).is_ok());
  ASSERT_TRUE(save_model(small_mlp(), dir.file("m.strata")).is_ok());
  EXPECT_FALSE(file_is_plan(dir.file("m.json")));
  EXPECT_FALSE(file_is_plan(dir.file("m.strata")));
  // A model is not a plan, and says so.
  auto wrong = load_plan_from_buffer(*model_to_flatbuffer(small_mlp()), "m.strata", ".");
  ASSERT_FALSE(wrong.is_ok());
  EXPECT_NE(wrong.status().message().find("not a plan"), std::string::npos);
}

TEST(PlanTest, MeaningErrorsNameTheField) {
  struct Case {
    std::function<void(Plan &)> edit;
    std::string expected;
  };
  std::vector<Case> cases = {
      {[](Plan &p) { p.loss = "nope"; }, "field loss"},
      {[](Plan &p) { p.loss_kind = "hinge"; }, "field loss_kind"},
      {[](Plan &p) { p.fingerprint = "xyz"; }, "field fingerprint"},
      {[](Plan &p) { p.devices[0].kind = "tpu"; }, "field devices[0].kind"},
      {[](Plan &p) { p.programs[0].device = 7; }, "field programs[0].device"},
      {[](Plan &p) { p.programs[0].order.pop_back(); }, "field programs[0].order"},
      {[](Plan &p) { std::swap(p.programs[0].order[0], p.programs[0].order.back()); },
       "field programs[0].order["},
      {[](Plan &p) { p.programs[0].arena_bytes = 8; }, "field programs[0].offsets["},
      {[](Plan &p) { p.programs[0].offsets.pop_back(); }, "field programs[0].offsets"},
  };
  for (const Case &c : cases) {
    Plan plan = make_plan(training_graph());
    c.edit(plan);
    auto bytes = plan_to_flatbuffer(plan);
    ASSERT_TRUE(bytes.is_ok());
    auto loaded = load_plan_from_buffer(*bytes, "bad.splan", ".");
    ASSERT_FALSE(loaded.is_ok()) << c.expected;
    EXPECT_NE(loaded.status().message().find("bad.splan"), std::string::npos);
    EXPECT_NE(loaded.status().message().find(c.expected), std::string::npos)
        << loaded.status().message();
  }
}

TEST(PlanTest, TruncatedAndCorruptedPlansNeverCrash) {
  // A tiny plan keeps every-byte loops fast: y = x * w.
  passes::TrainingOptions options;
  options.loss = "mse";
  options.optimizer = *passes::parse_optimizer("sgd:lr=0.1");
  zoo::MlpOptions mlp;
  mlp.batch = 1;
  mlp.input = 2;
  mlp.hidden = {};
  mlp.classes = 1;
  auto graph = passes::make_training_graph(*zoo::make_mlp(mlp), options);
  ASSERT_TRUE(graph.is_ok()) << graph.status().message();
  auto bytes = plan_to_flatbuffer(make_plan(std::move(graph).value()));
  ASSERT_TRUE(bytes.is_ok());
  ASSERT_TRUE(load_plan_from_buffer(*bytes, "p.splan", ".").is_ok());
  for (size_t length = 0; length < bytes->size(); ++length) {
    auto loaded =
        load_plan_from_buffer(llvm::ArrayRef<uint8_t>(*bytes).take_front(length), "p.splan", ".");
    ASSERT_FALSE(loaded.is_ok()) << "length " << length;
    EXPECT_NE(loaded.status().message().find("p.splan"), std::string::npos);
  }
  size_t accepted = 0;
  for (size_t i = 0; i < bytes->size(); ++i) {
    std::vector<uint8_t> flipped = *bytes;
    flipped[i] ^= 0xff;
    auto loaded = load_plan_from_buffer(flipped, "p.splan", ".");
    if (loaded.is_ok()) {
      ++accepted; // a flip can land in padding or a value that is still valid
    } else {
      EXPECT_NE(loaded.status().message().find("p.splan"), std::string::npos);
    }
  }
  EXPECT_LT(accepted, bytes->size());
}

TEST(CheckpointTest, RoundTripAndRefusals) {
  TempDir dir;
  std::map<std::string, HostTensor> tensors;
  HostTensor w = HostTensor::zeros({DType::kF32, {2, 3}});
  for (int i = 0; i < 6; ++i)
    w.as<float>()[i] = 0.5f * static_cast<float>(i);
  HostTensor step = HostTensor::zeros({DType::kI64, {}});
  step.as<int64_t>()[0] = 7;
  tensors.emplace("w", w);
  tensors.emplace("optimizer.step", step);
  std::string ck = dir.file("ck");
  ASSERT_TRUE(write_checkpoint(ck, tensors, "abc", 7).is_ok());
  auto read = read_checkpoint(ck, "abc");
  ASSERT_TRUE(read.is_ok()) << read.status().message();
  EXPECT_EQ(read->step, 7);
  ASSERT_EQ(read->tensors.size(), 2u);
  EXPECT_EQ(std::memcmp(read->tensors.at("w").data(), w.data(), w.size_bytes()), 0);
  EXPECT_EQ(read->tensors.at("optimizer.step").as<int64_t>()[0], 7);

  auto wrong_plan = read_checkpoint(ck, "def");
  ASSERT_FALSE(wrong_plan.is_ok());
  EXPECT_NE(wrong_plan.status().message().find("fingerprint"), std::string::npos);

  // Corrupt one byte of the weights: the checksum names the file.
  std::string weights = ck + "/model.safetensors";
  {
    std::fstream file(weights, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-1, std::ios::end);
    file.put('\x7f');
  }
  auto corrupt = read_checkpoint(ck, "abc");
  ASSERT_FALSE(corrupt.is_ok());
  EXPECT_NE(corrupt.status().message().find("model.safetensors"), std::string::npos);
  EXPECT_NE(corrupt.status().message().find("SHA-256"), std::string::npos);

  // Truncated weights: the size names the file.
  std::filesystem::resize_file(weights, 20);
  auto truncated = read_checkpoint(ck, "abc");
  ASSERT_FALSE(truncated.is_ok());
  EXPECT_NE(truncated.status().message().find("model.safetensors"), std::string::npos);
  EXPECT_NE(truncated.status().message().find("truncated"), std::string::npos);

  auto missing = read_checkpoint(dir.file("nothing"), "abc");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("manifest.json"), std::string::npos);
}

TEST(CheckpointTest, WeightsAreReadableAsPlainSafetensors) {
  if (!testing::python_has("numpy")) GTEST_SKIP() << "the system Python has no NumPy";
  TempDir dir;
  HostTensor w = HostTensor::zeros({DType::kF32, {3}});
  w.as<float>()[2] = 2.5f;
  ASSERT_TRUE(write_checkpoint(dir.file("ck"), {{"layer.w", w}}, "f", 1).is_ok());
  std::string output;
  int rc = testing::run_python(
      "import json, struct, numpy as np\n"
      "b = open('" +
          dir.file("ck/model.safetensors") +
          "', 'rb').read()\n"
          "n = struct.unpack('<Q', b[:8])[0]\n"
          "h = json.loads(b[8:8 + n])\n"
          "s, e = h['layer.w']['data_offsets']\n"
          "print(h['layer.w']['dtype'], np.frombuffer(b[8 + n + s:8 + n + e], '<f4').tolist())\n",
      &output);
  EXPECT_EQ(rc, 0) << output;
  EXPECT_EQ(output, "F32 [0.0, 0.0, 2.5]\n");
}

} // namespace
} // namespace strata::serialization
