// The training formats: state tensors and updates in model files, plan files
// (canonical bytes, JSON form, robustness, meaning checks) and checkpoints.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

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

// A tiny training graph keeps every-byte loops fast: y = x * w, mse, sgd.
Graph tiny_training_graph() {
  passes::TrainingOptions options;
  options.loss = "mse";
  options.optimizer = *passes::parse_optimizer("sgd:lr=0.1");
  zoo::MlpOptions mlp;
  mlp.batch = 1;
  mlp.input = 2;
  mlp.hidden = {};
  mlp.classes = 1;
  auto graph = passes::make_training_graph(*zoo::make_mlp(mlp), options);
  EXPECT_TRUE(graph.is_ok()) << graph.status().message();
  return std::move(graph).value();
}

bool is_held_kind(TensorKind kind) {
  return kind == TensorKind::kParameter || kind == TensorKind::kState ||
         kind == TensorKind::kConstant;
}

// A two-stage, two-micro-batch pipeline plan over `graph`: the nodes split in
// half by a topological order, and on each device a few instructions of every
// kind, slots and holds. Not a schedule anyone could run: only what the
// loader checks has to hold.
Plan make_pipeline_plan(Graph graph) {
  Plan plan = make_plan(std::move(graph));
  const Graph &g = plan.graph;
  auto order = g.topological_order();
  EXPECT_TRUE(order.is_ok());
  EXPECT_GE(order->size(), 2u);
  EXPECT_FALSE(g.updates().empty());
  size_t half = order->size() / 2;
  NodeId boundary = (*order)[half - 1];
  TensorId sent = g.node(boundary).outputs[0];

  PlanPipeline pipe;
  pipe.stages = 2;
  pipe.microbatches = 2;
  pipe.schedule = "1f1b";
  pipe.node_stage.assign(g.num_nodes(), 1);
  for (size_t k = 0; k < half; ++k)
    pipe.node_stage[(*order)[k]] = 0;
  pipe.boundaries = {g.node(boundary).name};
  pipe.cluster_json = "{\"name\": \"two \\\"cpus\\\"\",\n \"devices\": []}\n";
  pipe.predicted_step_s = 0.1 + 1e-15; // shortest exact form in JSON
  pipe.predicted_bubble = 1.0 / 3.0;

  plan.devices = {{0, "cpu"}, {1, "cpu"}};
  plan.programs.clear();
  for (uint32_t d = 0; d < 2; ++d) {
    PlanProgram program;
    program.device = d;
    for (int32_t mb = 0; mb < pipe.microbatches; ++mb) {
      if (d == 1) program.instructions.push_back({InstrKind::kRecv, mb, sent, 0});
      for (NodeId n : *order)
        if (pipe.node_stage[n] == static_cast<int32_t>(d))
          program.instructions.push_back({InstrKind::kCompute, mb, n, -1});
      if (d == 0) program.instructions.push_back({InstrKind::kSend, mb, sent, 1});
      program.instructions.push_back({InstrKind::kAccumulate, mb, sent, -1});
    }
    program.instructions.push_back({InstrKind::kScale, -1, sent, -1});
    program.instructions.push_back(
        {InstrKind::kUpdate, -1, static_cast<uint32_t>(d % g.updates().size()), -1});
    for (int32_t mb = -1; mb < pipe.microbatches; ++mb)
      program.slots.push_back({sent, mb, 64 * (mb + 1)});
    // The last slot ends the arena exactly.
    program.arena_bytes = program.slots.back().offset + g.tensor(sent).type.size_bytes();
    for (TensorId t = 0; t < g.num_tensors(); ++t)
      if (is_held_kind(g.tensor(t).kind) && (d == 0 || t % 2 == 1)) program.holds.push_back(t);
    EXPECT_FALSE(program.holds.empty());
    program.predicted_busy_s = 0.25 * (d + 1);
    plan.programs.push_back(std::move(program));
  }
  plan.pipeline = std::move(pipe);
  return plan;
}

// The index of the first instruction of `kind` in program `device`.
size_t first_instruction(const Plan &plan, uint32_t device, InstrKind kind) {
  const auto &list = plan.programs[device].instructions;
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i].kind == kind) return i;
  ADD_FAILURE() << "no " << instr_kind_name(kind) << " on device " << device;
  return 0;
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
      // An arena larger than every tensor side by side, twice: refused before
      // anything allocates it.
      {[](Plan &p) { p.programs[0].arena_bytes = int64_t{1} << 40; },
       "field programs[0].arena_bytes = 1099511627776 is more than the "},
      // A buffer off the memory plan's 64-byte grid (kernels would write
      // floats at an address their type cannot have).
      {[](Plan &p) {
         std::vector<int64_t> &offsets = p.programs[0].offsets;
         for (size_t t = 0; t < offsets.size(); ++t)
           if (offsets[t] >= 0 &&
               offsets[t] + 4 + p.graph.tensor(static_cast<TensorId>(t)).type.size_bytes() <=
                   p.programs[0].arena_bytes) {
             offsets[t] += 4;
             return;
           }
         FAIL() << "no buffer to move";
       },
       "is not at a multiple of 64 bytes, as every buffer of a memory plan is"},
      // Names that are not UTF-8 text, in the model and in the plan's own
      // fields (JSON reports would throw on them).
      {[](Plan &p) { ASSERT_TRUE(p.graph.rename_tensor(0, "x\xff").is_ok()); },
       "field model: tensor 0: field name 'x\\xff' is not valid UTF-8"},
      {[](Plan &p) { p.graph.mutable_node(0).op = std::string("Mat\0Mul", 7); },
       "field model: node 0: field op 'Mat\\x00Mul' holds a NUL byte"},
      {[](Plan &p) { p.loss = "lo\xc3"; }, "field loss 'lo\\xc3' is not valid UTF-8"},
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
  // The tiny graph as a revision 1 plan and as a revision 2 pipeline plan.
  for (bool pipelined : {false, true}) {
    SCOPED_TRACE(pipelined ? "pipeline plan" : "plan");
    Plan plan =
        pipelined ? make_pipeline_plan(tiny_training_graph()) : make_plan(tiny_training_graph());
    auto bytes = plan_to_flatbuffer(plan);
    ASSERT_TRUE(bytes.is_ok());
    auto good = load_plan_from_buffer(*bytes, "p.splan", ".");
    ASSERT_TRUE(good.is_ok()) << good.status().message();
    ASSERT_EQ(good->pipeline.has_value(), pipelined);
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
}

TEST(PipelinePlanTest, BinaryAndJsonRoundTripsAreByteIdentical) {
  Plan plan = make_pipeline_plan(tiny_training_graph());
  auto bytes = plan_to_flatbuffer(plan);
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().message();
  EXPECT_EQ(*plan_to_flatbuffer(make_pipeline_plan(tiny_training_graph())), *bytes);
  auto loaded = load_plan_from_buffer(*bytes, "p.splan", ".");
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  ASSERT_TRUE(loaded->pipeline.has_value());
  EXPECT_EQ(*loaded->pipeline, *plan.pipeline);
  EXPECT_EQ(loaded->devices, plan.devices);
  EXPECT_EQ(loaded->programs, plan.programs);
  EXPECT_EQ(*plan_to_flatbuffer(*loaded), *bytes);

  auto json = plan_to_json(plan);
  ASSERT_TRUE(json.is_ok()) << json.status().message();
  EXPECT_TRUE(json->starts_with("{\n  \"plan_version\": 5,")) << json->substr(0, 40);
  for (const char *text :
       {"\"pipeline\": {", "\"schedule\": \"1f1b\"", "\"kind\": \"Send\"", "\"kind\": \"Recv\"",
        "\"kind\": \"Accumulate\"", "\"kind\": \"Scale\"", "\"kind\": \"Update\"",
        "\"kind\": \"Compute\"", "\"slots\": [", "\"holds\": [",
        "\"predicted_step_s\": 0.100000000000001", "\"predicted_busy_s\": 0.5"})
    EXPECT_NE(json->find(text), std::string::npos) << text;
  // Pipeline programs have no order or offsets.
  EXPECT_EQ(json->find("\"order\""), std::string::npos);
  EXPECT_EQ(json->find("\"offsets\""), std::string::npos);
  auto from_json = load_plan_from_json(*json, "p.splan.json", ".");
  ASSERT_TRUE(from_json.is_ok()) << from_json.status().message();
  EXPECT_EQ(*from_json->pipeline, *plan.pipeline);
  EXPECT_EQ(from_json->programs, plan.programs);
  EXPECT_EQ(*plan_to_flatbuffer(*from_json), *bytes);
  EXPECT_EQ(*plan_to_json(*from_json), *json);

  // Through files, both forms.
  TempDir dir;
  ASSERT_TRUE(save_plan(plan, dir.file("p.splan")).is_ok());
  ASSERT_TRUE(save_plan(plan, dir.file("p.splan.json")).is_ok());
  auto binary_file = load_plan(dir.file("p.splan"));
  auto json_file = load_plan(dir.file("p.splan.json"));
  ASSERT_TRUE(binary_file.is_ok()) << binary_file.status().message();
  ASSERT_TRUE(json_file.is_ok()) << json_file.status().message();
  EXPECT_EQ(*plan_to_flatbuffer(*binary_file), *bytes);
  EXPECT_EQ(*plan_to_flatbuffer(*json_file), *bytes);
  EXPECT_TRUE(file_is_plan(dir.file("p.splan.json")));

  // A pipeline with one micro-batch and one stage is still a pipeline plan.
  Plan single = make_plan(tiny_training_graph());
  single.programs[0].order.clear();
  single.programs[0].offsets.clear();
  PlanPipeline one;
  one.schedule = "gpipe";
  one.node_stage.assign(single.graph.num_nodes(), 0);
  single.pipeline = one;
  auto single_bytes = plan_to_flatbuffer(single);
  ASSERT_TRUE(single_bytes.is_ok());
  auto single_loaded = load_plan_from_buffer(*single_bytes, "one.splan", ".");
  ASSERT_TRUE(single_loaded.is_ok()) << single_loaded.status().message();
  EXPECT_EQ(*single_loaded->pipeline, one);
  EXPECT_EQ(single_loaded->programs, single.programs);
  auto single_json = plan_to_json(single);
  ASSERT_TRUE(single_json.is_ok());
  auto single_from_json = load_plan_from_json(*single_json, "one.splan.json", ".");
  ASSERT_TRUE(single_from_json.is_ok()) << single_from_json.status().message();
  EXPECT_EQ(*plan_to_flatbuffer(*single_from_json), *single_bytes);
}

TEST(PipelinePlanTest, PlansWithoutAPipelineWriteNoPipelineFields) {
  Plan plan = make_plan(tiny_training_graph());
  auto json = plan_to_json(plan);
  ASSERT_TRUE(json.is_ok());
  EXPECT_TRUE(json->starts_with("{\n  \"plan_version\": 5,")) << json->substr(0, 40);
  for (const char *field : {"pipeline", "instructions", "slots", "holds", "predicted"})
    EXPECT_EQ(json->find(field), std::string::npos) << field;
  auto bytes = plan_to_flatbuffer(plan);
  ASSERT_TRUE(bytes.is_ok());
  auto loaded = load_plan_from_buffer(*bytes, "p.splan", ".");
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  EXPECT_FALSE(loaded->pipeline.has_value());
  EXPECT_EQ(loaded->programs, plan.programs);
  EXPECT_EQ(*plan_to_flatbuffer(*loaded), *bytes);
  // A file of revision 1 (no digest) still loads.
  auto revision_one =
      load_plan_from_json(testing::as_plan_revision(*json, 1), "old.splan.json", ".");
  ASSERT_TRUE(revision_one.is_ok()) << revision_one.status().message();
  EXPECT_EQ(revision_one->programs, plan.programs);

  // A pipeline in a file that claims revision 1 is refused, and so is a
  // revision newer than this build's.
  auto pipeline_json = plan_to_json(make_pipeline_plan(tiny_training_graph()));
  ASSERT_TRUE(pipeline_json.is_ok());
  std::string old = testing::as_plan_revision(*pipeline_json, 1);
  auto refused = load_plan_from_json(old, "old.splan.json", ".");
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("old.splan.json"), std::string::npos);
  EXPECT_NE(refused.status().message().find("field pipeline: the file has plan version 1"),
            std::string::npos)
      << refused.status().message();
  std::string newer = *pipeline_json;
  newer.replace(newer.find("\"plan_version\": 5"), 17, "\"plan_version\": 6");
  auto too_new = load_plan_from_json(newer, "new.splan.json", ".");
  ASSERT_FALSE(too_new.is_ok());
  EXPECT_NE(too_new.status().message().find("plan version 6"), std::string::npos)
      << too_new.status().message();
}

// Issue 29: a plan whose embedded model was edited loaded and trained other
// weights. The digest of the model, recomputed at load, refuses it.
TEST(PipelinePlanTest, AnEditedEmbeddedModelIsRefused) {
  auto json = plan_to_json(make_pipeline_plan(tiny_training_graph()));
  ASSERT_TRUE(json.is_ok());
  ASSERT_TRUE(load_plan_from_json(*json, "p.splan.json", ".").is_ok());
  auto refused = [&](const std::string &text, const std::string &expected) {
    auto loaded = load_plan_from_json(text, "p.splan.json", ".");
    ASSERT_FALSE(loaded.is_ok()) << expected;
    EXPECT_NE(loaded.status().message().find("p.splan.json"), std::string::npos);
    EXPECT_NE(loaded.status().message().find(expected), std::string::npos)
        << loaded.status().message();
  };
  // A weight's initializer: mean 0 -> 1, a model that loads on its own.
  std::string edited = *json;
  const std::string normal = "\"kind\": \"Normal\", \"a\": 0.0";
  ASSERT_NE(edited.find(normal), std::string::npos);
  edited.replace(edited.find(normal), normal.size(), "\"kind\": \"Normal\", \"a\": 1.0");
  refused(edited, "field model: the embedded model's SHA-256 is ");
  // The digest itself damaged, missing, or in a file of an older revision.
  const size_t digest = json->find("\"graph_digest\": \"") + 17;
  std::string flipped = *json;
  flipped[digest] = flipped[digest] == '0' ? '1' : '0';
  refused(flipped, "it was written with: the model was edited or corrupted");
  std::string missing = testing::as_plan_revision(*json, 1);
  missing.replace(missing.find("\"plan_version\": 1"), 17, "\"plan_version\": 5");
  refused(missing, "field graph_digest is missing");
  std::string older = *json;
  older.replace(older.find("\"plan_version\": 5"), 17, "\"plan_version\": 4");
  refused(older, "field graph_digest: the file has plan version 4");
}

TEST(PipelinePlanTest, MeaningErrorsNameTheField) {
  const Plan good = make_pipeline_plan(tiny_training_graph());
  const Graph &g = good.graph;
  const uint32_t nodes = static_cast<uint32_t>(g.num_nodes());
  const uint32_t tensors = static_cast<uint32_t>(g.num_tensors());
  const uint32_t updates = static_cast<uint32_t>(g.updates().size());
  TensorId intermediate = good.programs[0].slots[0].tensor;
  ASSERT_EQ(g.tensor(intermediate).kind, TensorKind::kIntermediate);
  const size_t compute0 = first_instruction(good, 0, InstrKind::kCompute);
  const size_t send0 = first_instruction(good, 0, InstrKind::kSend);
  const size_t recv1 = first_instruction(good, 1, InstrKind::kRecv);
  const size_t accumulate0 = first_instruction(good, 0, InstrKind::kAccumulate);
  const size_t scale1 = first_instruction(good, 1, InstrKind::kScale);
  const size_t update1 = first_instruction(good, 1, InstrKind::kUpdate);
  auto at = [](uint32_t program, size_t instruction) {
    return str_cat("field programs[", program, "].instructions[", instruction, "]");
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();

  struct Case {
    std::function<void(Plan &)> edit;
    std::string expected;
  };
  std::vector<Case> cases = {
      // The pipeline table.
      {[](Plan &p) { p.pipeline->stages = 0; }, "field pipeline.stages = 0"},
      {[](Plan &p) { p.programs[1].arena_bytes = int64_t{1} << 40; },
       "field programs[1].arena_bytes = 1099511627776 is more than the "},
      {[](Plan &p) {
         p.programs[0].arena_bytes += 4;
         p.programs[0].slots[0].offset += 4;
       },
       "field programs[0].slots[0].offset = "},
      {[](Plan &p) { p.pipeline->stages = 3; }, "field pipeline.stages = 3"},
      {[](Plan &p) {
         p.devices[1].index = 2;
         p.programs[1].device = 2;
       },
       "field programs[1].device = 2"},
      {[](Plan &p) { p.pipeline->microbatches = 0; }, "field pipeline.microbatches"},
      {[](Plan &p) { p.pipeline->schedule = "zigzag"; }, "field pipeline.schedule"},
      {[](Plan &p) { p.pipeline->schedule = "interleaved"; }, "field pipeline.chunks = 1"},
      {[](Plan &p) { p.pipeline->node_stage.pop_back(); }, "field pipeline.node_stage has"},
      {[](Plan &p) { p.pipeline->node_stage[0] = 2; }, "field pipeline.node_stage[0] = 2"},
      {[](Plan &p) { p.pipeline->node_stage[0] = -1; }, "field pipeline.node_stage[0] = -1"},
      {[](Plan &p) { p.pipeline->boundaries.clear(); }, "field pipeline.boundaries has 0"},
      {[](Plan &p) { p.pipeline->boundaries[0] = "nope"; }, "field pipeline.boundaries[0]"},
      {[](Plan &p) {
         const Graph &graph = p.graph;
         for (NodeId n = 0; n < graph.num_nodes(); ++n)
           if (p.pipeline->node_stage[n] == 1) p.pipeline->boundaries[0] = graph.node(n).name;
       },
       "' is in stage 1, not stage 0"},
      {[](Plan &p) { p.pipeline->predicted_step_s = -1; }, "field pipeline.predicted_step_s"},
      {[=](Plan &p) { p.pipeline->predicted_step_s = nan; }, "field pipeline.predicted_step_s"},
      {[](Plan &p) { p.pipeline->predicted_bubble = 1.5; }, "field pipeline.predicted_bubble"},
      // Programs of a pipeline plan.
      {[](Plan &p) { p.programs[0].order = {0}; }, "field programs[0].order"},
      {[](Plan &p) { p.programs[1].offsets = {-1}; }, "field programs[1].offsets"},
      {[](Plan &p) { p.programs[0].arena_bytes = -8; }, "field programs[0].arena_bytes"},
      {[](Plan &p) { p.programs[1].predicted_busy_s = -0.5; },
       "field programs[1].predicted_busy_s"},
      {[=](Plan &p) { p.programs[0].predicted_busy_s = nan; },
       "field programs[0].predicted_busy_s"},
      // Instructions.
      {[=](Plan &p) { p.programs[0].instructions[compute0].kind = static_cast<InstrKind>(42); },
       at(0, compute0) + ".kind has unknown value 42"},
      {[=](Plan &p) { p.programs[0].instructions[compute0].index = nodes; },
       at(0, compute0) + ": compute of node"},
      {[=](Plan &p) { p.programs[0].instructions[compute0].microbatch = 2; },
       at(0, compute0) + ": compute on micro-batch 2"},
      {[=](Plan &p) { p.programs[0].instructions[send0].index = tensors; },
       at(0, send0) + ": send of tensor"},
      {[=](Plan &p) { p.programs[0].instructions[send0].peer = 0; },
       at(0, send0) + ": send to device 0, which is itself"},
      {[=](Plan &p) { p.programs[0].instructions[send0].peer = 2; },
       at(0, send0) + ": send to device 2, which is not a device"},
      {[=](Plan &p) { p.programs[0].instructions[send0].microbatch = -2; },
       at(0, send0) + ": send on micro-batch -2"},
      {[=](Plan &p) { p.programs[1].instructions[recv1].peer = 1; },
       at(1, recv1) + ": recv from device 1, which is itself"},
      {[=](Plan &p) { p.programs[1].instructions[recv1].peer = -1; },
       at(1, recv1) + ": recv from device -1"},
      {[=](Plan &p) { p.programs[1].instructions[recv1].index = tensors; },
       at(1, recv1) + ": recv of tensor"},
      {[=](Plan &p) { p.programs[0].instructions[accumulate0].microbatch = -1; },
       at(0, accumulate0) + ": accumulate on micro-batch -1"},
      {[=](Plan &p) { p.programs[0].instructions[accumulate0].index = tensors; },
       at(0, accumulate0) + ": accumulate of tensor"},
      {[=](Plan &p) { p.programs[1].instructions[scale1].index = tensors + 5; },
       at(1, scale1) + ": scale of tensor"},
      {[=](Plan &p) { p.programs[1].instructions[update1].index = updates; },
       at(1, update1) + ": update " + std::to_string(updates)},
      // Slots.
      {[=](Plan &p) { p.programs[0].slots[1].tensor = tensors; },
       "field programs[0].slots[1].tensor"},
      {[](Plan &p) { p.programs[0].slots[1].microbatch = 2; },
       "field programs[0].slots[1].microbatch"},
      {[](Plan &p) { p.programs[1].slots[0].microbatch = -2; },
       "field programs[1].slots[0].microbatch"},
      {[](Plan &p) { p.programs[1].slots[2].offset = -64; },
       "field programs[1].slots[2].offset = -64"},
      {[](Plan &p) { p.programs[1].slots[2].offset = p.programs[1].arena_bytes; },
       "field programs[1].slots[2].offset"},
      {[](Plan &p) { p.programs[0].arena_bytes -= 1; }, "field programs[0].slots[2].offset"},
      // Holds.
      {[=](Plan &p) { p.programs[0].holds.push_back(tensors); }, "field programs[0].holds["},
      {[=](Plan &p) { p.programs[1].holds = {intermediate}; },
       str_cat("field programs[1].holds[0]: tensor '", g.tensor(intermediate).name,
               "' has kind intermediate")},
      {[](Plan &p) { p.programs[0].holds.push_back(p.programs[0].holds.back()); },
       "strictly increasing"},
      {[](Plan &p) { std::reverse(p.programs[0].holds.begin(), p.programs[0].holds.end()); },
       "field programs[0].holds[1]"},
  };
  // Revision 2 fields in a plan without a pipeline.
  auto v1_case = [](std::function<void(PlanProgram &)> edit, std::string expected) {
    return Case{[edit](Plan &p) {
                  Plan v1 = make_plan(p.graph);
                  edit(v1.programs[0]);
                  p = std::move(v1);
                },
                std::move(expected)};
  };
  cases.push_back(v1_case([](PlanProgram &q) { q.instructions.push_back({}); },
                          "field programs[0].instructions has 1 entries"));
  cases.push_back(
      v1_case([](PlanProgram &q) { q.slots.push_back({}); }, "field programs[0].slots"));
  cases.push_back(v1_case([](PlanProgram &q) { q.holds.push_back(1); }, "field programs[0].holds"));
  cases.push_back(v1_case([](PlanProgram &q) { q.predicted_busy_s = 1; },
                          "field programs[0].predicted_busy_s"));

  for (const Case &c : cases) {
    SCOPED_TRACE(c.expected);
    Plan plan = good;
    c.edit(plan);
    auto bytes = plan_to_flatbuffer(plan);
    ASSERT_TRUE(bytes.is_ok());
    auto loaded = load_plan_from_buffer(*bytes, "bad.splan", ".");
    ASSERT_FALSE(loaded.is_ok());
    EXPECT_NE(loaded.status().message().find("bad.splan: "), std::string::npos)
        << loaded.status().message();
    EXPECT_NE(loaded.status().message().find(c.expected), std::string::npos)
        << loaded.status().message();
    // The JSON form carries the same bad value to the same check.
    auto json = plan_to_json(plan);
    ASSERT_TRUE(json.is_ok());
    auto from_json = load_plan_from_json(*json, "bad.splan.json", ".");
    ASSERT_FALSE(from_json.is_ok());
    EXPECT_NE(from_json.status().message().find("bad.splan.json: "), std::string::npos)
        << from_json.status().message();
    EXPECT_NE(from_json.status().message().find(c.expected), std::string::npos)
        << from_json.status().message();
  }
  // The message of the brief's example, whole.
  Plan itself = good;
  itself.programs[1].instructions[recv1].kind = InstrKind::kSend;
  itself.programs[1].instructions[recv1].peer = 1;
  auto loaded = load_plan_from_buffer(*plan_to_flatbuffer(itself), "plan.splan", ".");
  ASSERT_FALSE(loaded.is_ok());
  EXPECT_EQ(loaded.status().message(), str_cat("plan.splan: field programs[1].instructions[", recv1,
                                               "]: send to device 1, which is itself"));
}

// An edit of a good plan and the text its load error must contain.
struct Case {
  std::function<void(Plan &)> edit;
  std::string expected;
};

// Every edited plan fails to load (from its binary form) with its text.
void expect_refused(const Plan &plan, const std::vector<Case> &cases) {
  for (const Case &c : cases) {
    Plan bad = plan;
    c.edit(bad);
    auto result = load_plan_from_buffer(*plan_to_flatbuffer(bad), "bad.splan", ".");
    ASSERT_FALSE(result.is_ok()) << c.expected;
    EXPECT_NE(result.status().message().find(c.expected), std::string::npos)
        << result.status().message();
  }
}

// Data parallelism: one stage replicated on two devices that all-reduce.
Plan make_data_parallel_plan() {
  Plan plan = make_pipeline_plan(tiny_training_graph());
  plan.pipeline->stages = 1;
  plan.pipeline->data_parallel = 2;
  plan.pipeline->boundaries.clear();
  std::fill(plan.pipeline->node_stage.begin(), plan.pipeline->node_stage.end(), 0);
  plan.pipeline->groups = {{0, 1}};
  const TensorId grad = plan.programs[0].slots[0].tensor;
  for (auto &program : plan.programs)
    program.instructions.push_back({InstrKind::kAllReduce, -1, grad, 0});
  return plan;
}

TEST(PipelinePlanTest, DataParallelFieldsRoundTripAndAreChecked) {
  const Plan plan = make_data_parallel_plan();
  auto bytes = plan_to_flatbuffer(plan);
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().message();
  auto loaded = load_plan_from_buffer(*bytes, "dp.splan", ".");
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  EXPECT_EQ(*loaded->pipeline, *plan.pipeline);
  EXPECT_EQ(loaded->programs, plan.programs);
  auto json = plan_to_json(plan);
  ASSERT_TRUE(json.is_ok());
  EXPECT_NE(json->find("\"data_parallel\": 2"), std::string::npos) << *json;
  EXPECT_NE(json->find("\"groups\": [{\"devices\": [0, 1]}]"), std::string::npos) << *json;
  // A group's algorithm round trips.
  Plan ring = plan;
  ring.pipeline->group_algorithms = {"ring"};
  auto ring_loaded = load_plan_from_buffer(*plan_to_flatbuffer(ring), "ring.splan", ".");
  ASSERT_TRUE(ring_loaded.is_ok()) << ring_loaded.status().message();
  EXPECT_EQ(ring_loaded->pipeline->group_algorithms, std::vector<std::string>{"ring"});
  auto ring_json = plan_to_json(ring);
  ASSERT_TRUE(ring_json.is_ok());
  EXPECT_NE(ring_json->find("\"algorithm\": \"ring\""), std::string::npos) << *ring_json;
  // Every algorithm the runtime runs (runtime/comm/collectives.h) round trips.
  for (const char *name : {"ring", "tree", "recursive-doubling", "rabenseifner"}) {
    Plan named = plan;
    named.pipeline->group_algorithms = {name};
    auto named_bytes = plan_to_flatbuffer(named);
    ASSERT_TRUE(named_bytes.is_ok()) << name << ": " << named_bytes.status().message();
    auto named_loaded = load_plan_from_buffer(*named_bytes, "named.splan", ".");
    ASSERT_TRUE(named_loaded.is_ok()) << name << ": " << named_loaded.status().message();
    EXPECT_EQ(named_loaded->pipeline->group_algorithms, std::vector<std::string>{name});
    auto named_json = plan_to_json(named);
    ASSERT_TRUE(named_json.is_ok()) << name;
    auto named_from_json = load_plan_from_json(*named_json, "named.splan.json", ".");
    ASSERT_TRUE(named_from_json.is_ok()) << name << ": " << named_from_json.status().message();
    EXPECT_EQ(named_from_json->pipeline->group_algorithms, std::vector<std::string>{name});
  }
  auto from_json = load_plan_from_json(*json, "dp.splan.json", ".");
  ASSERT_TRUE(from_json.is_ok()) << from_json.status().message();
  EXPECT_EQ(*plan_to_flatbuffer(*from_json), *bytes);

  const size_t last = plan.programs[1].instructions.size() - 1;
  std::vector<Case> cases = {
      {[](Plan &p) { p.pipeline->data_parallel = 0; }, "field pipeline.data_parallel = 0"},
      {[](Plan &p) { p.pipeline->data_parallel = 3; }, "x data_parallel = 3"},
      {[](Plan &p) { p.pipeline->groups = {{0}}; }, "field pipeline.groups[0] has 1 devices"},
      {[](Plan &p) {
         p.pipeline->groups = {{0, 2}};
       },
       "field pipeline.groups[0].devices[1] = 2"},
      {[](Plan &p) {
         p.pipeline->groups = {{1, 0}};
       },
       "is not strictly increasing"},
      {[=](Plan &p) { p.programs[1].instructions[last].peer = 1; },
       str_cat("field programs[1].instructions[", last, "]: all-reduce over group 1")},
      // ZeRO-1 fields.
      {[=](Plan &p) { p.programs[1].instructions[last].kind = InstrKind::kReduceScatter; },
       "reduce-scatter needs pipeline.zero = 1"},
      {[](Plan &p) { p.pipeline->zero = 4; }, "field pipeline.zero = 4; expected 0, 1, 2 or 3"},
      // ZeRO-3's instruction needs ZeRO-3.
      {[=](Plan &p) { p.programs[1].instructions[last].kind = InstrKind::kGatherParam; },
       "gather-param needs pipeline.zero = 3"},
      {[=](Plan &p) { p.programs[1].instructions[last].kind = InstrKind::kStartGather; },
       "start-gather needs pipeline.zero = 3"},
      {[=](Plan &p) { p.programs[1].instructions[last].kind = InstrKind::kWaitGather; },
       "wait-gather needs pipeline.zero = 3"},
      // ZeRO-2's instruction needs ZeRO-2.
      {[=](Plan &p) {
         p.programs[1].instructions[last].kind = InstrKind::kReduceScatterAccumulate;
       },
       "reduce-scatter-accumulate needs pipeline.zero = 2"},
      {[](Plan &p) { p.pipeline->group_algorithms = {"butterfly"}; },
       "field pipeline.groups[0].algorithm is 'butterfly'; expected ring, tree, "
       "recursive-doubling, rabenseifner or nothing"},
      {[](Plan &p) {
         p.programs[0].sharded_holds = {p.programs[0].holds[0]};
         p.programs[0].shard_group = 0;
       },
       "field programs[0].sharded_holds needs pipeline.zero = 1"},
      {[](Plan &p) {
         p.pipeline->zero = 1;
         p.programs[0].sharded_holds = {p.programs[0].holds[0]};
         p.programs[0].shard_group = 3;
       },
       "field programs[0].shard_group = 3"},
      {[](Plan &p) { p.programs[0].shard_group = 0; }, "shard_group = 0 without sharded_holds"},
  };
  expect_refused(plan, cases);
  // A device outside the group it all-reduces over.
  Plan outside = plan;
  outside.pipeline->data_parallel = 3;
  outside.devices.push_back({2, "cpu"});
  outside.programs.push_back(plan.programs[1]);
  outside.programs[2].device = 2;
  auto result = load_plan_from_buffer(*plan_to_flatbuffer(outside), "bad.splan", ".");
  ASSERT_FALSE(result.is_ok());
  EXPECT_NE(result.status().message().find("which does not include device 2"), std::string::npos)
      << result.status().message();
}

// Gradient buckets (revision 3): the data-parallel plan with its all-reduce
// as a bucket started and waited for.
TEST(PipelinePlanTest, GradientBucketsRoundTripAndAreChecked) {
  Plan plan = make_data_parallel_plan();
  const TensorId grad = plan.programs[0].slots[0].tensor;
  for (auto &program : plan.programs) {
    program.instructions.back() = {InstrKind::kStartBucket, -1, 0, 0};
    program.instructions.push_back({InstrKind::kWaitBucket, -1, 0, 0});
    program.buckets = {{{grad}, false}};
  }
  plan.pipeline->bucket_bytes = 1024;
  auto bytes = plan_to_flatbuffer(plan);
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().message();
  auto loaded = load_plan_from_buffer(*bytes, "buckets.splan", ".");
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  EXPECT_EQ(*loaded->pipeline, *plan.pipeline);
  EXPECT_EQ(loaded->programs, plan.programs);
  auto json = plan_to_json(plan);
  ASSERT_TRUE(json.is_ok());
  EXPECT_NE(json->find("\"plan_version\": 5"), std::string::npos) << *json;
  EXPECT_NE(json->find("\"bucket_bytes\": 1024"), std::string::npos) << *json;
  EXPECT_NE(json->find("\"buckets\": ["), std::string::npos) << *json;
  EXPECT_NE(json->find(str_cat("{\"tensors\": [", grad, "], \"reduce_scatter\": false}")),
            std::string::npos)
      << *json;
  EXPECT_NE(json->find("\"kind\": \"StartBucket\""), std::string::npos) << *json;
  auto from_json = load_plan_from_json(*json, "buckets.splan.json", ".");
  ASSERT_TRUE(from_json.is_ok()) << from_json.status().message();
  EXPECT_EQ(*plan_to_flatbuffer(*from_json), *bytes);
  // Without buckets the same plan writes none.
  auto plain = plan_to_json(make_data_parallel_plan());
  ASSERT_TRUE(plain.is_ok());
  EXPECT_EQ(plain->find("\"buckets\""), std::string::npos);

  const size_t start = plan.programs[1].instructions.size() - 2, wait = start + 1;
  const TensorId weight = plan.programs[1].holds[0];
  std::vector<Case> cases = {
      {[=](Plan &p) { p.programs[1].instructions[start].index = 1; },
       str_cat("field programs[1].instructions[", start,
               "]: start-bucket 1, but the program has 1 buckets")},
      {[=](Plan &p) { p.programs[1].instructions.pop_back(); },
       "field programs[1].buckets[0] is never waited for"},
      {[=](Plan &p) {
         std::swap(p.programs[1].instructions[start], p.programs[1].instructions[wait]);
       },
       "waits for bucket 0 before it is started"},
      {[=](Plan &p) { p.programs[1].instructions.push_back(p.programs[1].instructions[wait]); },
       "bucket 0 is waited for twice"},
      {[=](Plan &p) { p.programs[1].buckets[0].tensors = {weight}; }, "is not an f32 intermediate"},
      {[=](Plan &p) { p.programs[1].buckets.push_back(p.programs[1].buckets[0]); },
       "field programs[1].buckets[1] is never started"},
      {[=](Plan &p) {
         p.programs[1].buckets[0].tensors = {grad, grad};
       },
       "is in two buckets"},
      {[=](Plan &p) { p.programs[1].buckets[0].reduce_scatter = true; },
       "reduce_scatter needs pipeline.zero = 1"},
      {[=](Plan &p) { p.programs[1].buckets[0].tensors.clear(); }, "has no tensors"},
      {[](Plan &p) { p.pipeline->bucket_bytes = -1; }, "field pipeline.bucket_bytes = -1"},
  };
  expect_refused(plan, cases);
}

TEST(PipelinePlanTest, InstructionKindNames) {
  EXPECT_EQ(instr_kind_name(InstrKind::kCompute), "compute");
  EXPECT_EQ(instr_kind_name(InstrKind::kSend), "send");
  EXPECT_EQ(instr_kind_name(InstrKind::kRecv), "recv");
  EXPECT_EQ(instr_kind_name(InstrKind::kAccumulate), "accumulate");
  EXPECT_EQ(instr_kind_name(InstrKind::kScale), "scale");
  EXPECT_EQ(instr_kind_name(InstrKind::kUpdate), "update");
  EXPECT_EQ(instr_kind_name(InstrKind::kAllReduce), "all-reduce");
  EXPECT_EQ(instr_kind_name(InstrKind::kStartBucket), "start-bucket");
  EXPECT_EQ(instr_kind_name(InstrKind::kWaitBucket), "wait-bucket");
  EXPECT_EQ(instr_kind_name(InstrKind::kReduceScatterAccumulate), "reduce-scatter-accumulate");
  EXPECT_EQ(instr_kind_name(InstrKind::kGatherParam), "gather-param");
  EXPECT_EQ(instr_kind_name(InstrKind::kStartGather), "start-gather");
  EXPECT_EQ(instr_kind_name(InstrKind::kWaitGather), "wait-gather");
}

// Writes `dir`/manifest.json by hand, listing `files` under `step` and
// `ranks`: a manifest commit_checkpoint would refuse to write.
void write_manifest(const std::string &dir, int64_t step, int ranks,
                    const std::vector<CheckpointFile> &files) {
  std::string text = str_cat("{\"format\": \"strata-checkpoint\", \"format_version\": 2, "
                             "\"fingerprint\": \"f\", \"step\": ",
                             step, ", \"ranks\": ", ranks, ", \"files\": [");
  for (size_t i = 0; i < files.size(); ++i)
    text += str_cat(i ? ", " : "", "{\"name\": \"", files[i].name, "\", \"size\": ", files[i].size,
                    ", \"sha256\": \"", files[i].sha256, "\"}");
  text += "]}\n";
  ASSERT_TRUE(write_file_atomically(dir + "/" + kCheckpointManifestFile, text).is_ok());
}

// Format 3: the manifest records the model, optimizer, layout and every
// tensor's whole type and cut; a record that does not hold together is
// refused naming the field.
TEST(CheckpointTest, TheLayoutRecordRoundTripsAndIsChecked) {
  TempDir dir;
  CheckpointLayout layout;
  layout.model = std::string(64, 'a');
  layout.optimizer = "adam:lr=0.001";
  layout.description = "mesh 1x2x1 (DPxTPxPP), 1 micro-batch, 1f1b, 2 ranks";
  layout.tensors["w"] = {true, {DType::kF32, {4, 6}}, TensorCut{1, 1, 2}};
  layout.tensors["w.m"] = {false, {DType::kF32, {4, 6}}, TensorCut{1, 1, 2}};
  layout.tensors["optimizer.step"] = {false, {DType::kI64, {}}, std::nullopt};
  std::map<std::string, HostTensor> tensors;
  tensors.emplace("w@tp0of2", HostTensor::zeros({DType::kF32, {4, 3}}));
  std::string ck = dir.file("ck");
  ASSERT_TRUE(write_checkpoint(ck, tensors, "abc", 3, layout).is_ok());
  auto read = read_checkpoint(ck, "abc");
  ASSERT_TRUE(read.is_ok()) << read.status().message();
  EXPECT_EQ(read->layout, layout);

  const std::string manifest = ck + "/manifest.json";
  std::string text;
  {
    std::ifstream in(manifest);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  struct Case {
    std::string from, to, expect;
  };
  for (const Case &c : std::vector<Case>{
           {"\"parts\": 2", "\"parts\": 0", "tensors['w'].cut.parts"},
           {"\"parts\": 2", "\"parts\": 5", "does not cut into 5"},
           {"\"dtype\": \"i64\"", "\"dtype\": \"i65\"", "tensors['optimizer.step'].dtype"},
           {"\"role\": \"parameter\"", "\"role\": \"weight\"", "tensors['w'].role"},
           {"\"model\": ", "\"modle\": ", "field model"},
       }) {
    std::string edited = text;
    const size_t at = edited.find(c.from);
    ASSERT_NE(at, std::string::npos) << c.from;
    edited.replace(at, c.from.size(), c.to);
    std::ofstream(manifest, std::ios::trunc) << edited;
    auto refused = read_checkpoint(ck, "abc");
    ASSERT_FALSE(refused.is_ok()) << c.to;
    EXPECT_NE(refused.status().message().find(c.expect), std::string::npos)
        << refused.status().message();
    EXPECT_NE(refused.status().message().find("manifest.json"), std::string::npos);
  }
  // Without a record (format 2 and writers that give none) it reads empty.
  ASSERT_TRUE(write_checkpoint(dir.file("plain"), tensors, "abc", 1).is_ok());
  auto plain = read_checkpoint(dir.file("plain"), "abc");
  ASSERT_TRUE(plain.is_ok()) << plain.status().message();
  EXPECT_TRUE(plain->layout.empty());
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
  std::string weights = ck + "/model-step7.safetensors";
  {
    std::fstream file(weights, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-1, std::ios::end);
    file.put('\x7f');
  }
  auto corrupt = read_checkpoint(ck, "abc");
  ASSERT_FALSE(corrupt.is_ok());
  EXPECT_NE(corrupt.status().message().find("model-step7.safetensors"), std::string::npos);
  EXPECT_NE(corrupt.status().message().find("SHA-256"), std::string::npos);

  // Truncated weights: the size names the file.
  std::filesystem::resize_file(weights, 20);
  auto truncated = read_checkpoint(ck, "abc");
  ASSERT_FALSE(truncated.is_ok());
  EXPECT_NE(truncated.status().message().find("model-step7.safetensors"), std::string::npos);
  EXPECT_NE(truncated.status().message().find("truncated"), std::string::npos);

  auto missing = read_checkpoint(dir.file("nothing"), "abc");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("manifest.json"), std::string::npos);
}

// A save cut short after its data files leaves the previous checkpoint whole;
// the next commit removes files no manifest lists.
TEST(CheckpointTest, InterruptedSaveKeepsThePreviousCheckpoint) {
  TempDir dir;
  const std::string ck = dir.file("ck");
  HostTensor w = HostTensor::zeros({DType::kF32, {4}});
  w.as<float>()[0] = 1;
  ASSERT_TRUE(write_checkpoint(ck, {{"w", w}}, "f", 3).is_ok());
  // Step 4: rank 0 of 2 wrote its file, then the job died before the commit.
  w.as<float>()[0] = 2;
  ASSERT_TRUE(write_checkpoint_file(ck, checkpoint_file_name(4, 0, 2), {{"w", w}}).is_ok());
  auto previous = read_checkpoint(ck, "f");
  ASSERT_TRUE(previous.is_ok()) << previous.status().message();
  EXPECT_EQ(previous->step, 3);
  EXPECT_EQ(previous->tensors.at("w").as<float>()[0], 1.0f);

  // Two ranks' files, committed: both read, the stale ones are gone.
  HostTensor b = HostTensor::zeros({DType::kF32, {2}});
  auto a_file = write_checkpoint_file(ck, checkpoint_file_name(5, 0, 2), {{"w", w}});
  auto b_file = write_checkpoint_file(ck, checkpoint_file_name(5, 1, 2), {{"b", b}});
  ASSERT_TRUE(a_file.is_ok() && b_file.is_ok());
  ASSERT_TRUE(commit_checkpoint(ck, "f", 5, 2, {*a_file, *b_file}).is_ok());
  auto both = read_checkpoint(ck, "f");
  ASSERT_TRUE(both.is_ok()) << both.status().message();
  EXPECT_EQ(both->step, 5);
  EXPECT_EQ(both->ranks, 2);
  EXPECT_EQ(both->tensors.size(), 2u);
  EXPECT_EQ(both->file_of.at("b"), checkpoint_file_name(5, 1, 2));
  EXPECT_FALSE(std::filesystem::exists(ck + "/" + checkpoint_file_name(3, 0, 1)));
  EXPECT_FALSE(std::filesystem::exists(ck + "/" + checkpoint_file_name(4, 0, 2)));

  // A tensor in two files, and a file name that leaves the folder, are refused.
  auto first = write_checkpoint_file(ck, checkpoint_file_name(6, 0, 2), {{"w", w}});
  auto again = write_checkpoint_file(ck, checkpoint_file_name(6, 1, 2), {{"w", w}});
  ASSERT_TRUE(first.is_ok() && again.is_ok());
  ASSERT_TRUE(commit_checkpoint(ck, "f", 6, 2, {*first, *again}).is_ok());
  auto twice = read_checkpoint(ck, "f");
  ASSERT_FALSE(twice.is_ok());
  EXPECT_NE(twice.status().message().find("tensor 'w' is also in"), std::string::npos)
      << twice.status().message();
  CheckpointFile escape = *first;
  escape.name = "../elsewhere.safetensors";
  Status refused = commit_checkpoint(ck, "f", 7, 1, {escape});
  EXPECT_NE(refused.message().find("cannot commit '../elsewhere.safetensors'"), std::string::npos)
      << refused.message();
  write_manifest(ck, 7, 1, {escape});
  auto escaped = read_checkpoint(ck, "f");
  ASSERT_FALSE(escaped.is_ok());
  EXPECT_NE(escaped.status().message().find("files[0].name"), std::string::npos)
      << escaped.status().message();
}

// A manifest's step and ranks say which files it lists: model-step<K>-rank<R>-
// of<N>.safetensors belongs to step K of a save by N ranks, and a save by N
// ranks has one file of each rank. A manifest that says otherwise (edited by
// hand, or pieced together from two saves) is refused before any file is read,
// naming the entry.
TEST(CheckpointTest, ManifestStepAndRanksMustFitItsFiles) {
  TempDir dir;
  const std::string ck = dir.file("ck");
  const HostTensor w = HostTensor::zeros({DType::kF32, {4}});
  const HostTensor b = HostTensor::zeros({DType::kF32, {2}});
  auto rank0 = write_checkpoint_file(ck, checkpoint_file_name(5, 0, 2), {{"w", w}});
  auto rank1 = write_checkpoint_file(ck, checkpoint_file_name(5, 1, 2), {{"b", b}});
  auto alone = write_checkpoint_file(ck, checkpoint_file_name(5, 0, 1), {{"w", w}, {"b", b}});
  auto stray = write_checkpoint_file(ck, "model-step5-rank2-of2.safetensors", {{"b", b}});
  ASSERT_TRUE(rank0.is_ok() && rank1.is_ok() && alone.is_ok() && stray.is_ok());
  const struct {
    int64_t step;
    int ranks;
    std::vector<CheckpointFile> files;
    std::string cause;
  } cases[] = {
      {6, 2, {*rank0, *rank1}, "files[0] is model-step5-rank0-of2.safetensors, a file of step 5"},
      {5, 3, {*rank0, *rank1}, "files[0] is model-step5-rank0-of2.safetensors, a file of 2 ranks"},
      {5, 2, {*alone, *rank1}, "files[0] is model-step5.safetensors, a file of 1 rank"},
      {5, 1, {*rank0}, "files[0] is model-step5-rank0-of2.safetensors, a file of 2 ranks"},
      {5, 2, {*rank0, *rank0}, "files[0] and files[1] are both rank 0's file"},
      {5, 2, {*rank0}, "no file of rank 1 (model-step5-rank1-of2.safetensors) is listed"},
      {5,
       2,
       {*rank0, *stray},
       "files[1] is model-step5-rank2-of2.safetensors, of rank 2 of only 2"},
  };
  for (const auto &c : cases) {
    write_manifest(ck, c.step, c.ranks, c.files);
    auto read = read_checkpoint(ck, "f");
    ASSERT_FALSE(read.is_ok()) << c.cause;
    EXPECT_NE(read.status().message().find(ck +
                                           "/manifest.json: field files does not fit fields "
                                           "step (" +
                                           std::to_string(c.step) + ") and ranks (" +
                                           std::to_string(c.ranks) + "): " + c.cause),
              std::string::npos)
        << read.status().message();
    // The commit refuses to write such a manifest in the first place.
    Status refused = commit_checkpoint(ck, "f", c.step, c.ranks, c.files);
    EXPECT_NE(refused.message().find(": " + c.cause), std::string::npos) << refused.message();
  }
  // What fits reads.
  write_manifest(ck, 5, 2, {*rank1, *rank0});
  auto both = read_checkpoint(ck, "f");
  ASSERT_TRUE(both.is_ok()) << both.status().message();
  EXPECT_EQ(both->tensors.size(), 2u);
  write_manifest(ck, 5, 1, {*alone});
  EXPECT_TRUE(read_checkpoint(ck, "f").is_ok());
}

// Ranks that do not share a filesystem (or were given different folders)
// each save into a folder of their own: rank 0, which commits, would list
// files its folder lacks. The commit refuses, naming each file that is not
// there as written and the rank that wrote it, and the previous checkpoint
// stays the folder's.
TEST(CheckpointTest, CommitRefusesFilesTheFolderLacks) {
  TempDir dir;
  const std::string ck = dir.file("ck"), other_host = dir.file("other-host");
  const HostTensor w = HostTensor::zeros({DType::kF32, {4}});
  const HostTensor b = HostTensor::zeros({DType::kF32, {2}});
  ASSERT_TRUE(write_checkpoint(ck, {{"w", w}, {"b", b}}, "f", 1).is_ok());
  auto rank0 = write_checkpoint_file(ck, checkpoint_file_name(2, 0, 3), {{"w", w}});
  auto rank1 = write_checkpoint_file(other_host, checkpoint_file_name(2, 1, 3), {{"b", b}});
  auto rank2 = write_checkpoint_file(other_host, checkpoint_file_name(2, 2, 3), {});
  ASSERT_TRUE(rank0.is_ok() && rank1.is_ok() && rank2.is_ok());
  Status refused = commit_checkpoint(ck, "f", 2, 3, {*rank0, *rank1, *rank2});
  ASSERT_FALSE(refused.is_ok());
  const std::string &message = refused.message();
  EXPECT_NE(message.find(ck + ": the manifest would list files this folder lacks as written: "
                              "rank 1's model-step2-rank1-of3.safetensors is missing; rank 2's "
                              "model-step2-rank2-of3.safetensors is missing (no shared "
                              "filesystem?"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("rank 0's"), std::string::npos) << message;
  auto previous = read_checkpoint(ck, "f");
  ASSERT_TRUE(previous.is_ok()) << previous.status().message();
  EXPECT_EQ(previous->step, 1);

  // A file of that name but not as its rank wrote it (another save's, cut short).
  const std::string name1 = checkpoint_file_name(2, 1, 3), name2 = checkpoint_file_name(2, 2, 3);
  std::filesystem::copy_file(other_host + "/" + name1, ck + "/" + name1);
  std::filesystem::resize_file(ck + "/" + name1, rank1->size - 1);
  std::filesystem::copy_file(other_host + "/" + name2, ck + "/" + name2);
  refused = commit_checkpoint(ck, "f", 2, 3, {*rank0, *rank1, *rank2});
  EXPECT_NE(refused.message().find("rank 1's model-step2-rank1-of3.safetensors has " +
                                   std::to_string(rank1->size - 1) + " bytes here, not the " +
                                   std::to_string(rank1->size) + " written (no shared"),
            std::string::npos)
      << refused.message();
  EXPECT_EQ(read_checkpoint(ck, "f")->step, 1);

  // Once every file is here as written, the commit goes through.
  std::filesystem::copy_file(other_host + "/" + name1, ck + "/" + name1,
                             std::filesystem::copy_options::overwrite_existing);
  ASSERT_TRUE(commit_checkpoint(ck, "f", 2, 3, {*rank0, *rank1, *rank2}).is_ok());
  auto committed = read_checkpoint(ck, "f");
  ASSERT_TRUE(committed.is_ok()) << committed.status().message();
  EXPECT_EQ(committed->step, 2);
  EXPECT_EQ(committed->ranks, 3);

  // One process: the file it wrote is gone before the commit.
  auto lone = write_checkpoint_file(ck, checkpoint_file_name(3, 0, 1), {{"w", w}, {"b", b}});
  ASSERT_TRUE(lone.is_ok());
  std::filesystem::remove(ck + "/" + lone->name);
  refused = commit_checkpoint(ck, "f", 3, 1, {*lone});
  EXPECT_NE(refused.message().find(ck +
                                   ": the manifest would list files this folder lacks as written: "
                                   "model-step3.safetensors is missing"),
            std::string::npos)
      << refused.message();
  EXPECT_EQ(refused.message().find("shared"), std::string::npos) << refused.message();
  EXPECT_EQ(read_checkpoint(ck, "f")->step, 2);
}

// A commit removes only what strata wrote: the files the replaced manifest
// listed and unlisted files under strata's own data-file names. A user's
// weights in the same folder (model.safetensors, model_pretrained.safetensors)
// stay, byte for byte.
TEST(CheckpointTest, CommitKeepsFilesStrataDidNotWrite) {
  TempDir dir;
  const std::string ck = dir.file("ck");
  std::filesystem::create_directories(ck);
  const std::vector<std::string> user_files = {"model.safetensors", "model_pretrained.safetensors",
                                               "model-final.safetensors",
                                               "model-step2.safetensors.bak", "notes.txt"};
  for (const std::string &name : user_files) {
    std::ofstream out(ck + "/" + name, std::ios::binary);
    out << "the user's " << name;
  }
  HostTensor w = HostTensor::zeros({DType::kF32, {4}});
  ASSERT_TRUE(write_checkpoint(ck, {{"w", w}}, "f", 1).is_ok());
  ASSERT_TRUE(write_checkpoint(ck, {{"w", w}}, "f", 2).is_ok());
  EXPECT_FALSE(std::filesystem::exists(ck + "/model-step1.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(ck + "/model-step2.safetensors"));
  // A file the replaced manifest listed goes, whatever its name.
  auto listed = write_checkpoint_file(ck, "weights.safetensors", {{"w", w}});
  ASSERT_TRUE(listed.is_ok()) << listed.status().message();
  ASSERT_TRUE(commit_checkpoint(ck, "f", 3, 1, {*listed}).is_ok());
  EXPECT_FALSE(std::filesystem::exists(ck + "/model-step2.safetensors"));
  ASSERT_TRUE(write_checkpoint(ck, {{"w", w}}, "f", 4).is_ok());
  EXPECT_FALSE(std::filesystem::exists(ck + "/weights.safetensors"));
  auto read = read_checkpoint(ck, "f");
  ASSERT_TRUE(read.is_ok()) << read.status().message();
  EXPECT_EQ(read->step, 4);
  for (const std::string &name : user_files) {
    std::ifstream in(ck + "/" + name, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text, "the user's " + name) << name;
  }

  EXPECT_TRUE(is_checkpoint_data_name("model-step5.safetensors"));
  EXPECT_TRUE(is_checkpoint_data_name(checkpoint_file_name(12, 3, 4)));
  for (const char *name :
       {"model.safetensors", "model_pretrained.safetensors", "model-step.safetensors",
        "model-stepx.safetensors", "model-step5-rank-of4.safetensors",
        "model-step5-rank1.safetensors", "model-step5.safetensors.bak", ".model-step5.safetensors"})
    EXPECT_FALSE(is_checkpoint_data_name(name)) << name;
}

// A checkpoint folder is one run's at a time: the lock creates the folder,
// a second taker is refused at once with the folder and the holder's pid, and
// the lock goes with its object (a moved one still holds it).
TEST(CheckpointTest, LockKeepsOneRunPerFolder) {
  TempDir dir;
  const std::string ck = dir.file("runs/ck");
  const std::string pid = "pid " + std::to_string(::getpid());
  {
    auto held = CheckpointLock::acquire(ck);
    ASSERT_TRUE(held.is_ok()) << held.status().message();
    EXPECT_TRUE(std::filesystem::is_directory(ck));
    EXPECT_TRUE(std::filesystem::exists(ck + "/" + kCheckpointLockFile));
    auto second = CheckpointLock::acquire(ck);
    ASSERT_FALSE(second.is_ok());
    const std::string &message = second.status().message();
    EXPECT_NE(message.find(ck + ": the checkpoint folder is in use by another strata run ("),
              std::string::npos)
        << message;
    EXPECT_NE(message.find(pid), std::string::npos) << message;
    CheckpointLock moved = std::move(held).value();
    EXPECT_FALSE(CheckpointLock::acquire(ck).is_ok());
  }
  auto again = CheckpointLock::acquire(ck);
  ASSERT_TRUE(again.is_ok()) << again.status().message();
  EXPECT_TRUE(write_checkpoint(ck, {{"w", HostTensor::zeros({DType::kF32, {2}})}}, "f", 1).is_ok());

  // A folder that cannot be created: the path and the system's reason.
  const std::string too_long = dir.file(std::string(300, 'n'));
  auto refused = CheckpointLock::acquire(too_long);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find(too_long + ": cannot create the checkpoint folder: "),
            std::string::npos)
      << refused.status().message();
}

// A save killed mid-write leaves its temporary file; the next run to lock
// the folder removes every one of strata's exact patterns, and nothing else.
TEST(CheckpointTest, LockRemovesStaleTemporaries) {
  TempDir dir;
  const std::string ck = dir.file("ck");
  ASSERT_TRUE(write_checkpoint(ck, {{"w", HostTensor::zeros({DType::kF32, {2}})}}, "f", 1).is_ok());
  const std::vector<std::string> stale = {
      ".model-step2.safetensors.tmp.AbC123", ".model-step2-rank1-of4.safetensors.tmp.x9Y8z7",
      ".manifest.json.tmp.QwErTy", ".strata-write-check.a1b2c3"};
  const std::vector<std::string> others = {
      ".model.safetensors.tmp.AbC123",       ".model-step2.safetensors.tmp.AbC1234",
      ".model-step2.safetensors.tmp.Ab-123", ".notes.txt.tmp.AbC123",
      "model-step2.safetensors.tmp.AbC123",  ".manifest.json.tmp.AbC12"};
  auto write = [&](const std::string &name, const char *text) {
    std::ofstream out(ck + "/" + name, std::ios::binary);
    out << text;
  };
  for (const std::string &name : stale)
    write(name, "partial");
  for (const std::string &name : others)
    write(name, "not strata's");
  auto lock = CheckpointLock::acquire(ck);
  ASSERT_TRUE(lock.is_ok()) << lock.status().message();
  for (const std::string &name : stale)
    EXPECT_FALSE(std::filesystem::exists(ck + "/" + name)) << name;
  for (const std::string &name : others)
    EXPECT_TRUE(std::filesystem::exists(ck + "/" + name)) << name;
  auto read = read_checkpoint(ck, "f");
  ASSERT_TRUE(read.is_ok()) << read.status().message();
  EXPECT_EQ(read->step, 1);
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
          dir.file("ck/model-step1.safetensors") +
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
