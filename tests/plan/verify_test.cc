// plan::verify_plan: every plan the compiler writes verifies, for every
// schedule, mesh, ZeRO-1 and 2, gradient buckets and recomputation; and every edit
// or corruption that the file loader lets through (it checks fields one by
// one) is refused, naming the device, the instruction, and the node, tensor,
// update or field at fault.
#include <algorithm>
#include <cstddef>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "graph/builder.h"
#include "ops/registry.h"
#include "partitioner/compile_pipeline.h"
#include "plan/instructions.h"
#include "plan/verify.h"
#include "serialization/plan_io.h"
#include "tests/runtime/projection_softmax.h"
#include "tools/zoo.h"

namespace strata::plan {
namespace {

using partitioner::PipelineCompileOptions;
using partitioner::Schedule;
using serialization::InstrKind;
using serialization::Plan;
using serialization::PlanInstruction;

Graph mlp() {
  zoo::MlpOptions o;
  o.batch = 16;
  o.input = 12;
  o.hidden = {16, 16, 16};
  o.classes = 5;
  return *zoo::make_mlp(o);
}

// Every size divisible by 2 and 3: ZeRO-1 shards every update of it.
Graph even_mlp() {
  zoo::MlpOptions o;
  o.batch = 12;
  o.input = 12;
  o.hidden = {12, 12, 12};
  o.classes = 6;
  return *zoo::make_mlp(o);
}

Graph gpt(int64_t vocab = 64) {
  zoo::GptOptions o;
  o.layers = vocab > 64 ? 2 : 4;
  o.hidden = vocab > 64 ? 16 : 32;
  o.heads = 2;
  o.seq = 8;
  o.vocab = vocab;
  o.batch = 8;
  return *zoo::make_gpt(o);
}

Graph convnet() {
  zoo::ConvnetOptions o;
  o.batch = 8;
  o.in_channels = 3;
  o.image_size = 8;
  o.channels = {8, 8};
  o.fc_hidden = 16;
  o.classes = 4;
  return *zoo::make_convnet(o);
}

// Batch statistics: the running mean and variance are state updated from
// the (one) micro-batch's values, accumulated buffers that nothing scales.
Graph batch_norm() {
  GraphBuilder b("bn", ops::OpRegistry::global());
  const TensorId x = b.input("x", DType::kF32, {4, 3, 4, 4});
  auto parameter = [&](const char *name, Initializer::Kind kind) {
    return b.parameter(name, DType::kF32, {3}, Initializer{kind});
  };
  const TensorId scale = parameter("bn.scale", Initializer::Kind::kOnes);
  const TensorId bias = parameter("bn.bias", Initializer::Kind::kZeros);
  const TensorId mean = parameter("bn.running_mean", Initializer::Kind::kZeros);
  const TensorId var = parameter("bn.running_var", Initializer::Kind::kOnes);
  const TensorId y = b.op1("BatchNormalization", {x, scale, bias, mean, var}, {}, "bn");
  b.output(b.op1("Relu", {y}, {}, "relu"));
  return std::move(b).finish().value();
}

passes::TrainingOptions training(const std::string &optimizer = "sgd:lr=0.1,momentum=0.9",
                                 const std::string &loss = "softmax_cross_entropy") {
  passes::TrainingOptions options;
  options.optimizer = *passes::parse_optimizer(optimizer);
  options.loss = loss;
  return options;
}

PipelineCompileOptions mesh(int dp, int tp, int pp, int microbatches,
                            Schedule schedule = Schedule::k1F1B) {
  PipelineCompileOptions options;
  options.data_parallel = dp;
  options.tensor_parallel = tp;
  options.stages = pp;
  options.microbatches = microbatches;
  options.schedule = schedule;
  return options;
}

struct Shape {
  std::string name;
  Graph forward;
  passes::TrainingOptions training;
  PipelineCompileOptions options;
};

// Plans of every kind the compiler builds.
std::vector<Shape> shapes() {
  std::vector<Shape> out;
  auto add = [&](std::string name, Graph forward, passes::TrainingOptions options,
                 PipelineCompileOptions pipeline,
                 const std::function<void(PipelineCompileOptions &)> &edit = {}) {
    if (edit) edit(pipeline);
    out.push_back({std::move(name), std::move(forward), std::move(options), std::move(pipeline)});
  };
  auto buckets = [](int64_t bytes) {
    return [bytes](PipelineCompileOptions &o) { o.bucket_bytes = bytes; };
  };
  auto zero = [](int64_t bytes, int stage = 1) {
    return [bytes, stage](PipelineCompileOptions &o) {
      o.zero = stage;
      o.bucket_bytes = bytes;
    };
  };
  auto chunks = [](int v, bool recompute = false) {
    return [v, recompute](PipelineCompileOptions &o) {
      o.chunks = v;
      o.recompute = recompute;
    };
  };
  auto recompute = [](PipelineCompileOptions &o) { o.recompute = true; };
  const int64_t kDefault = partitioner::kDefaultBucketBytes;
  const Schedule gpipe = Schedule::kGPipe, interleaved = Schedule::kInterleaved;

  add("mlp on one device", mlp(), training(), mesh(1, 1, 1, 1));
  add("mlp gpipe pp=2 M=4", mlp(), training(), mesh(1, 1, 2, 4, gpipe));
  add("mlp 1f1b pp=4 M=8", mlp(), training(), mesh(1, 1, 4, 8));
  add("mlp mse adam pp=2 M=2", mlp(), training("adam:lr=0.01", "mse"), mesh(1, 1, 2, 2));
  add("mlp dp=2 pp=2 M=2 one bucket", mlp(), training(), mesh(2, 1, 2, 2));
  add("mlp dp=2 pp=2 M=2 small buckets", mlp(), training(), mesh(2, 1, 2, 2), buckets(512));
  add("mlp dp=2 pp=2 M=2 no buckets", mlp(), training(), mesh(2, 1, 2, 2), buckets(0));
  add("mlp dp=2 M=1", mlp(), training(), mesh(2, 1, 1, 1));
  add("mlp dp=3 pp=4 gpipe M=1", even_mlp(), training(), mesh(3, 1, 4, 1, gpipe));
  add("mlp zero dp=3 pp=2 small buckets", even_mlp(), training("adamw:lr=0.01"), mesh(3, 1, 2, 2),
      zero(512));
  add("mlp zero dp=2 pp=2 no buckets", even_mlp(), training("adamw:lr=0.01"), mesh(2, 1, 2, 2),
      zero(0));
  add("mlp zero clip dp=2 pp=2", mlp(), training("adamw:lr=0.01,clip=0.05"), mesh(2, 1, 2, 2),
      zero(kDefault));
  add("mlp zero clip dp=2 pp=2 no buckets", mlp(), training("sgd:lr=0.1,momentum=0.9,clip=0.05"),
      mesh(2, 1, 2, 2), zero(0));
  add("mlp zero2 dp=3 pp=2 small buckets", even_mlp(), training("adamw:lr=0.01"), mesh(3, 1, 2, 2),
      zero(512, 2));
  add("mlp zero2 dp=2 M=1", mlp(), training(), mesh(2, 1, 1, 1), zero(kDefault, 2));
  add("mlp zero2 dp=2 pp=2 gpipe M=3 no buckets", even_mlp(), training(), mesh(2, 1, 2, 3, gpipe),
      zero(0, 2));
  add("mlp zero2 plain sgd", mlp(), training("sgd:lr=0.1"), mesh(2, 1, 1, 2), zero(kDefault, 2));
  add("mlp zero2 clip dp=2 pp=2", mlp(), training("adamw:lr=0.01,clip=0.05"), mesh(2, 1, 2, 2),
      zero(kDefault, 2));
  add("batch norm", batch_norm(), training("sgd:lr=0.1", "mse"), mesh(1, 1, 1, 1));
  add("gpt pp=4 M=4 adamw clip", gpt(), training("adamw:lr=0.01,wd=0.1,clip=1"), mesh(1, 1, 4, 4));
  add("gpt interleaved", gpt(), training(), mesh(1, 1, 2, 4, interleaved), chunks(2));
  add("gpt interleaved dp=2", gpt(), training(), mesh(2, 1, 2, 2, interleaved), chunks(2));
  add("gpt interleaved zero", gpt(), training("adamw:lr=0.01"), mesh(2, 1, 2, 2, interleaved),
      [](PipelineCompileOptions &o) {
        o.chunks = 2;
        o.zero = 1;
      });
  add("gpt interleaved zero2", gpt(), training("adamw:lr=0.01"), mesh(2, 1, 2, 2, interleaved),
      [](PipelineCompileOptions &o) {
        o.chunks = 2;
        o.zero = 2;
      });
  add("gpt interleaved recompute", gpt(), training(), mesh(1, 1, 2, 4, interleaved),
      chunks(2, true));
  add("gpt interleaved 3 chunks clip", gpt(), training("adamw:lr=0.01,clip=1"),
      mesh(1, 1, 2, 2, interleaved), chunks(3));
  add("gpt recompute 1f1b", gpt(), training("adamw:lr=0.01"), mesh(1, 1, 2, 4), recompute);
  add("gpt recompute gpipe", gpt(), training(), mesh(1, 1, 2, 4, gpipe), recompute);
  add("gpt recompute zero dp=2", gpt(), training(), mesh(2, 1, 2, 2),
      [](PipelineCompileOptions &o) {
        o.recompute = true;
        o.zero = 1;
      });
  add("gpt tp=2 pp=2", gpt(), training(), mesh(1, 2, 2, 2));
  add("gpt tp=2 recompute", gpt(), training("adamw:lr=0.01"), mesh(1, 2, 2, 4), recompute);
  add("gpt dp=2 tp=2 pp=2 zero", gpt(), training("adamw:lr=0.001"), mesh(2, 2, 2, 2),
      zero(kDefault));
  add("gpt dp=2 tp=2 pp=2 zero2 recompute", gpt(), training("adamw:lr=0.001"), mesh(2, 2, 2, 2),
      [](PipelineCompileOptions &o) {
        o.recompute = true;
        o.zero = 2;
      });
  add("mlp dp=2 zero3", mlp(), training("adamw:lr=0.01"), mesh(2, 1, 1, 2),
      [](PipelineCompileOptions &o) { o.zero = 3; });
  add("mlp dp=2 zero3 without prefetch", mlp(), training("adamw:lr=0.01"), mesh(2, 1, 1, 2),
      [](PipelineCompileOptions &o) {
        o.zero = 3;
        o.prefetch = false;
      });
  add("gpt dp=2 pp=2 zero3", gpt(), training("sgd:lr=0.1,momentum=0.9"), mesh(2, 1, 2, 2),
      [](PipelineCompileOptions &o) { o.zero = 3; });
  add("gpt tp=2 split activations", gpt(), training(), mesh(1, 2, 2, 2),
      [](PipelineCompileOptions &o) { o.split_activations = true; });
  add("gpt tp=2 clip", gpt(), training("sgd:lr=0.1,momentum=0.9,clip=0.05"), mesh(1, 2, 2, 2));
  add("vocabulary-parallel gpt tp=2 pp=2", gpt(4096), training(), mesh(1, 2, 2, 2));
  add("vocabulary-parallel gpt dp=2 tp=2 zero", gpt(4096), training(), mesh(2, 2, 1, 2),
      zero(kDefault));
  add("convnet dp=2 tp=2 pp=2 zero", convnet(), training("adamw:lr=0.001"), mesh(2, 2, 2, 2),
      zero(kDefault));
  add("all-to-all tp=2", testing_graphs::projection_softmax(), training("adamw:lr=0.05"),
      testing_graphs::slow_compute_tensor_parallel(2));
  return out;
}

TEST(VerifyPlanTest, EveryCompiledPlanVerifies) {
  std::set<InstrKind> kinds;
  for (const Shape &shape : shapes()) {
    SCOPED_TRACE(shape.name);
    auto plan = partitioner::compile_pipeline(shape.forward, shape.training, shape.options);
    ASSERT_TRUE(plan.is_ok()) << plan.status().message();
    const Status status = verify_plan(*plan);
    EXPECT_TRUE(status.is_ok()) << status.message();
    // And as read back from its file.
    plan->model_fingerprint = plan->fingerprint = std::string(64, 'a');
    auto bytes = serialization::plan_to_flatbuffer(*plan);
    ASSERT_TRUE(bytes.is_ok()) << bytes.status().message();
    auto loaded = serialization::load_plan_from_buffer(*bytes, "p.splan", ".");
    ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
    const Status again = verify_plan(*loaded);
    EXPECT_TRUE(again.is_ok()) << again.message();
    for (const auto &program : plan->programs)
      for (const PlanInstruction &instr : program.instructions)
        kinds.insert(instr.kind);
  }
  // The shapes reach every kind of instruction.
  EXPECT_EQ(kinds.size(), static_cast<size_t>(InstrKind::kWaitGather) + 1);
}

// A training plan without a pipeline is checked for its loss kind too.
TEST(VerifyPlanTest, PlansWithoutAPipelineHaveTheirLossKind) {
  Plan plan;
  plan.mode = Plan::Mode::kTrain;
  auto graph = passes::make_training_graph(mlp(), training("sgd:lr=0.1", "mse"));
  ASSERT_TRUE(graph.is_ok()) << graph.status().message();
  plan.graph = std::move(graph).value();
  plan.loss = "loss";
  plan.loss_kind = "mse";
  EXPECT_TRUE(verify_plan(plan).is_ok());
  plan.loss_kind = "softmax_cross_entropy";
  const Status status = verify_plan(plan);
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("field loss_kind is 'softmax_cross_entropy', but the loss "
                                  "'loss' is not computed from a graph input 'labels'"),
            std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find("it reads 'targets', as mse does"), std::string::npos)
      << status.message();
}

// Edits of a good two-stage plan (the MLP, 2 micro-batches, 1F1B).
class VerifyCorruptionTest : public ::testing::Test {
protected:
  void SetUp() override {
    auto compiled = partitioner::compile_pipeline(mlp(), training(), mesh(1, 1, 2, 2));
    ASSERT_TRUE(compiled.is_ok()) << compiled.status().message();
    good_ = std::move(compiled).value();
    good_.model_fingerprint = good_.fingerprint = std::string(64, 'a');
    ASSERT_TRUE(verify_plan(good_).is_ok());
  }

  // verify_plan refuses `bad` with a message holding each of `parts`. With
  // `loads`, the file of it still loads: the loader alone would let it run.
  static void expect_refused(const Plan &bad, const std::vector<std::string> &parts,
                             bool loads = true) {
    const Status status = verify_plan(bad);
    ASSERT_FALSE(status.is_ok()) << "verify_plan accepts it";
    for (const std::string &part : parts)
      EXPECT_NE(status.message().find(part), std::string::npos)
          << "'" << part << "' is not in: " << status.message();
    if (!loads) return;
    auto bytes = serialization::plan_to_flatbuffer(bad);
    ASSERT_TRUE(bytes.is_ok()) << bytes.status().message();
    auto loaded = serialization::load_plan_from_buffer(*bytes, "bad.splan", ".");
    ASSERT_TRUE(loaded.is_ok()) << "the loader refuses it already: " << loaded.status().message();
    EXPECT_EQ(verify_plan(*loaded).message(), status.message());
  }

  // Device d's instruction i as errors name it.
  static std::string at(const Plan &plan, size_t d, size_t i) {
    return str_cat("device ", d, " (", device_role(*plan.pipeline, static_cast<int64_t>(d)),
                   ") instruction ", i, " (",
                   describe_instruction(plan.graph, plan.programs[d].instructions[i]), ")");
  }

  // The first instruction of device d, from `from` on, that `accept` takes;
  // the program's size when there is none.
  static size_t find(const Plan &plan, size_t d,
                     const std::function<bool(const PlanInstruction &)> &accept, size_t from = 0) {
    const auto &instrs = plan.programs[d].instructions;
    for (size_t i = from; i < instrs.size(); ++i)
      if (accept(instrs[i])) return i;
    return instrs.size();
  }

  static auto kind_is(InstrKind kind, int32_t microbatch = -2) {
    return [kind, microbatch](const PlanInstruction &instr) {
      return instr.kind == kind && (microbatch == -2 || instr.microbatch == microbatch);
    };
  }

  static void erase(Plan &plan, size_t d, size_t i) {
    auto &instrs = plan.programs[d].instructions;
    instrs.erase(instrs.begin() + static_cast<std::ptrdiff_t>(i));
  }

  // Inserts a copy of instruction i right after it.
  static void duplicate(Plan &plan, size_t d, size_t i) {
    auto &instrs = plan.programs[d].instructions;
    const PlanInstruction copy = instrs[i];
    instrs.insert(instrs.begin() + static_cast<std::ptrdiff_t>(i + 1), copy);
  }

  Plan good_;
};

TEST_F(VerifyCorruptionTest, RemovedCompute) {
  Plan bad = good_;
  const size_t i = find(bad, 0, kind_is(InstrKind::kCompute, 1));
  ASSERT_LT(i, bad.programs[0].instructions.size());
  const Node &node = bad.graph.node(bad.programs[0].instructions[i].index);
  const std::string expected =
      str_cat("device 0 (stage 0): never computes node '", node.name, "' (", node.op, ") for mb 1");
  erase(bad, 0, i);
  expect_refused(bad, {expected});
}

TEST_F(VerifyCorruptionTest, DuplicatedCompute) {
  Plan bad = good_;
  const size_t i = find(bad, 1, kind_is(InstrKind::kCompute, 0));
  ASSERT_LT(i, bad.programs[1].instructions.size());
  duplicate(bad, 1, i);
  const std::string name = bad.graph.node(bad.programs[1].instructions[i].index).name;
  expect_refused(bad, {str_cat(at(bad, 1, i + 1), ": computes node '", name,
                               "' mb 0 a second time (first at instruction ", i, ")")});
}

TEST_F(VerifyCorruptionTest, ComputeMovedBeforeItsInputExists) {
  Plan bad = good_;
  const Graph &g = bad.graph;
  auto &instrs = bad.programs[0].instructions;
  // A Relu of micro-batch 0, moved before the Gemm that computes its input.
  const size_t relu = find(bad, 0, [&](const PlanInstruction &instr) {
    return instr.kind == InstrKind::kCompute && instr.microbatch == 0 &&
           g.node(instr.index).op == "Relu";
  });
  ASSERT_LT(relu, instrs.size());
  const TensorId input = g.node(instrs[relu].index).inputs[0];
  const NodeId producer = g.tensor(input).producer;
  const size_t gemm = find(bad, 0, [&](const PlanInstruction &instr) {
    return instr.kind == InstrKind::kCompute && instr.microbatch == 0 && instr.index == producer;
  });
  ASSERT_LT(gemm, relu);
  const PlanInstruction moved = instrs[relu];
  erase(bad, 0, relu);
  instrs.insert(instrs.begin() + static_cast<std::ptrdiff_t>(gemm), moved);
  expect_refused(bad, {str_cat(at(bad, 0, gemm), ": reads '", g.tensor(input).name,
                               "' mb 0 before anything on the device writes it; its producer '",
                               g.node(producer).name, "' (", g.node(producer).op,
                               ") has not run on mb 0 before it")});
}

TEST_F(VerifyCorruptionTest, RemovedUpdate) {
  Plan bad = good_;
  const size_t i = find(bad, 0, kind_is(InstrKind::kUpdate));
  ASSERT_LT(i, bad.programs[0].instructions.size());
  const uint32_t u = bad.programs[0].instructions[i].index;
  const std::string target = bad.graph.tensor(bad.graph.updates()[u].target).name;
  erase(bad, 0, i);
  expect_refused(bad, {str_cat("device 0 (stage 0): never applies update ", u, " of '", target,
                               "', which the device holds")});
}

TEST_F(VerifyCorruptionTest, DuplicatedUpdate) {
  Plan bad = good_;
  const size_t i = find(bad, 0, kind_is(InstrKind::kUpdate));
  ASSERT_LT(i, bad.programs[0].instructions.size());
  const uint32_t u = bad.programs[0].instructions[i].index;
  const std::string target = bad.graph.tensor(bad.graph.updates()[u].target).name;
  duplicate(bad, 0, i);
  expect_refused(bad, {str_cat(at(bad, 0, i + 1), ": applies update ", u, " of '", target,
                               "' a second time (first at instruction ", i, ")")});
}

TEST_F(VerifyCorruptionTest, RemovedAccumulate) {
  Plan bad = good_;
  const size_t i = find(bad, 1, kind_is(InstrKind::kAccumulate, 1));
  ASSERT_LT(i, bad.programs[1].instructions.size());
  const TensorId t = bad.programs[1].instructions[i].index;
  erase(bad, 1, i);
  // Its scale then divides the sum of one micro-batch by two.
  const size_t scale = find(bad, 1, [&](const PlanInstruction &instr) {
    return instr.kind == InstrKind::kScale && instr.index == t;
  });
  ASSERT_LT(scale, bad.programs[1].instructions.size());
  expect_refused(bad, {str_cat(at(bad, 1, scale), ": scales '", bad.graph.tensor(t).name,
                               "' after 1 of its 2 micro-batches were accumulated")});
}

TEST_F(VerifyCorruptionTest, DuplicatedAccumulate) {
  Plan bad = good_;
  const size_t i = find(bad, 1, kind_is(InstrKind::kAccumulate, 1));
  ASSERT_LT(i, bad.programs[1].instructions.size());
  const TensorId t = bad.programs[1].instructions[i].index;
  duplicate(bad, 1, i);
  expect_refused(bad, {str_cat(at(bad, 1, i + 1), ": accumulates '", bad.graph.tensor(t).name,
                               "' mb 1 a second time (first at instruction ", i, ")")});
}

TEST_F(VerifyCorruptionTest, RemovedScale) {
  Plan bad = good_;
  const size_t i = find(bad, 0, kind_is(InstrKind::kScale));
  ASSERT_LT(i, bad.programs[0].instructions.size());
  const TensorId t = bad.programs[0].instructions[i].index;
  erase(bad, 0, i);
  // The first once-per-step reader then reads the sum, not the mean.
  const size_t reader = find(
      bad, 0,
      [&](const PlanInstruction &instr) {
        if (instr.kind == InstrKind::kSend) return instr.index == t && instr.microbatch < 0;
        if (instr.kind == InstrKind::kUpdate) return bad.graph.updates()[instr.index].value == t;
        if (instr.kind != InstrKind::kCompute || instr.microbatch >= 0) return false;
        const auto &inputs = bad.graph.node(instr.index).inputs;
        return std::find(inputs.begin(), inputs.end(), t) != inputs.end();
      },
      i);
  ASSERT_LT(reader, bad.programs[0].instructions.size());
  expect_refused(bad, {str_cat(at(bad, 0, reader), ": reads '", bad.graph.tensor(t).name,
                               "' (step) before its mean over the micro-batches (scale)")});
}

TEST_F(VerifyCorruptionTest, DuplicatedScale) {
  Plan bad = good_;
  const size_t i = find(bad, 0, kind_is(InstrKind::kScale));
  ASSERT_LT(i, bad.programs[0].instructions.size());
  const TensorId t = bad.programs[0].instructions[i].index;
  duplicate(bad, 0, i);
  expect_refused(bad, {str_cat(at(bad, 0, i + 1), ": scales '", bad.graph.tensor(t).name,
                               "' a second time (first at instruction ", i, ")")});
}

TEST_F(VerifyCorruptionTest, EmptiedPrograms) {
  // With no instructions at all the plan "trains" to a loss of 0.
  Plan bad = good_;
  for (auto &program : bad.programs)
    program.instructions.clear();
  expect_refused(bad,
                 {"device 0 (stage 0): the program computes none of the ", " nodes of its stage"});
}

TEST_F(VerifyCorruptionTest, MicroBatchesTheProgramsDoNotCover) {
  Plan bad = good_;
  bad.pipeline->microbatches = 4;
  expect_refused(bad,
                 {"field pipeline.microbatches = 4, but the programs compute micro-batches 0..1"});
}

TEST_F(VerifyCorruptionTest, LossKindOfAnotherLoss) {
  Plan bad = good_;
  bad.loss_kind = "mse";
  expect_refused(bad, {"field loss_kind is 'mse', but the loss 'loss' is not computed from a "
                       "graph input 'targets'",
                       "it reads 'labels', as softmax_cross_entropy does"});
}

TEST_F(VerifyCorruptionTest, ZeroWithoutReplicas) {
  Plan bad = good_;
  bad.pipeline->zero = 1;
  expect_refused(bad, {"field pipeline.zero = 1 shards optimizer state over the data-parallel "
                       "replicas, but pipeline.data_parallel = 1"});
}

TEST_F(VerifyCorruptionTest, SendOfAnotherTensor) {
  Plan bad = good_;
  const Graph &g = bad.graph;
  auto &instrs = bad.programs[0].instructions;
  const size_t i = find(bad, 0, kind_is(InstrKind::kSend));
  ASSERT_LT(i, instrs.size());
  const PlanInstruction send = instrs[i];
  // The index of another tensor device 0 computes but never sends, as a
  // flipped bit of the index would name.
  TensorId other = kInvalidTensor;
  for (TensorId t = 0; t < g.num_tensors() && other == kInvalidTensor; ++t) {
    const NodeId producer = g.tensor(t).producer;
    if (t == send.index || producer == kNoNode || bad.pipeline->node_stage[producer] != 0) continue;
    if (find(bad, 0, [&](const PlanInstruction &instr) {
          return instr.kind == InstrKind::kSend && instr.index == t;
        }) == instrs.size())
      other = t;
  }
  ASSERT_NE(other, kInvalidTensor);
  instrs[i].index = other;
  std::string expected;
  if (other < send.index) {
    expected =
        str_cat(at(bad, 0, i), ": device 1 never receives it (no recv of '", g.tensor(other).name,
                "' ", microbatch_text(send.microbatch), " from device 0)");
  } else {
    const size_t recv = find(bad, 1, [&](const PlanInstruction &instr) {
      return instr.kind == InstrKind::kRecv && instr.index == send.index &&
             instr.microbatch == send.microbatch;
    });
    ASSERT_LT(recv, bad.programs[1].instructions.size());
    expected = str_cat(at(bad, 1, recv), ": device 0 never sends '", g.tensor(send.index).name,
                       "' ", microbatch_text(send.microbatch), " to it");
  }
  expect_refused(bad, {expected});
}

TEST_F(VerifyCorruptionTest, SlotBeyondTheArena) {
  // A file with it does not load; a plan built in memory is refused too.
  Plan bad = good_;
  auto &program = bad.programs[0];
  auto slot = std::find_if(program.slots.begin(), program.slots.end(), [&](const auto &s) {
    return bad.graph.tensor(s.tensor).type.size_bytes() > 0;
  });
  ASSERT_NE(slot, program.slots.end());
  slot->offset = program.arena_bytes;
  expect_refused(bad,
                 {str_cat("device 0 (stage 0): slot ", slot - program.slots.begin(), " ('",
                          bad.graph.tensor(slot->tensor).name, "' "),
                  str_cat(" at offset ", program.arena_bytes, " is outside the ",
                          program.arena_bytes, "-byte arena")},
                 /*loads=*/false);
}

TEST_F(VerifyCorruptionTest, SlotsOfBuffersLiveTogetherOverlap) {
  // A Relu's output placed on its input: both live at the Relu.
  Plan bad = good_;
  const Graph &g = bad.graph;
  auto &program = bad.programs[0];
  const size_t relu = find(bad, 0, [&](const PlanInstruction &instr) {
    return instr.kind == InstrKind::kCompute && instr.microbatch == 0 &&
           g.node(instr.index).op == "Relu";
  });
  ASSERT_LT(relu, program.instructions.size());
  const Node &node = g.node(program.instructions[relu].index);
  auto slot_of = [&](TensorId t) {
    return std::find_if(program.slots.begin(), program.slots.end(),
                        [&](const auto &s) { return s.tensor == t && s.microbatch == 0; });
  };
  auto input = slot_of(node.inputs[0]), output = slot_of(node.outputs[0]);
  ASSERT_NE(input, program.slots.end());
  ASSERT_NE(output, program.slots.end());
  ASSERT_NE(input->offset, output->offset);
  output->offset = input->offset;
  expect_refused(bad, {"device 0 (stage 0): buffers '",
                       str_cat("'", g.tensor(node.inputs[0]).name, "' mb 0 (bytes "),
                       str_cat("'", g.tensor(node.outputs[0]).name, "' mb 0 (bytes "),
                       "share bytes of the arena while both are live"});
}

// ZeRO-1: an update that runs on the device's shard (ComputeShard), flipped
// to run whole, would read the gradient of which the device has only its
// reduce-scattered shard.
TEST_F(VerifyCorruptionTest, ShardedUpdateRunWhole) {
  auto compiled = partitioner::compile_pipeline(even_mlp(), training(), [] {
    PipelineCompileOptions options = mesh(2, 1, 1, 2);
    options.zero = 1;
    return options;
  }());
  ASSERT_TRUE(compiled.is_ok()) << compiled.status().message();
  Plan bad = std::move(compiled).value();
  bad.model_fingerprint = bad.fingerprint = std::string(64, 'a');
  auto &instrs = bad.programs[0].instructions;
  const size_t i = find(bad, 0, [&](const PlanInstruction &instr) {
    return instr.kind == InstrKind::kComputeShard && bad.graph.node(instr.index).op == "SgdUpdate";
  });
  ASSERT_LT(i, instrs.size());
  const TensorId gradient = bad.graph.node(instrs[i].index).inputs[1];
  instrs[i].kind = InstrKind::kCompute;
  instrs[i].peer = -1;
  expect_refused(bad, {str_cat(at(bad, 0, i), ": reads '", bad.graph.tensor(gradient).name,
                               "', of which the device keeps only its reduce-scattered shard")});
}

// ZeRO-2: a plan whose devices reduce-scatter each sharded gradient into their
// shard every micro-batch (the MLP, 2 replicas, 2 micro-batches).
Plan zero_two_plan() {
  PipelineCompileOptions options = mesh(2, 1, 1, 2);
  options.zero = 2;
  auto compiled = partitioner::compile_pipeline(even_mlp(), training(), options);
  EXPECT_TRUE(compiled.is_ok()) << compiled.status().message();
  Plan plan = std::move(compiled).value();
  plan.model_fingerprint = plan.fingerprint = std::string(64, 'a');
  return plan;
}

// Its JSON form names the instruction and the stage and reads back the same
// (step buffers that are shards fit the arena as shards).
TEST(VerifyPlanTest, ZeroTwoPlansRoundTripThroughJson) {
  const Plan plan = zero_two_plan();
  auto json = serialization::plan_to_json(plan);
  ASSERT_TRUE(json.is_ok()) << json.status().message();
  EXPECT_NE(json->find("\"kind\": \"ReduceScatterAccumulate\""), std::string::npos);
  EXPECT_NE(json->find("\"zero\": 2"), std::string::npos);
  auto loaded = serialization::load_plan_from_json(*json, "z2.splan.json", ".");
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  EXPECT_EQ(loaded->programs, plan.programs);
  EXPECT_EQ(*loaded->pipeline, *plan.pipeline);
  EXPECT_TRUE(verify_plan(*loaded).is_ok()) << verify_plan(*loaded).message();
}

// A reduce-scatter of mb 1 removed: the sum the device scales holds one of its
// two micro-batches.
TEST_F(VerifyCorruptionTest, RemovedReduceScatterAccumulate) {
  Plan bad = zero_two_plan();
  ASSERT_TRUE(verify_plan(bad).is_ok()) << verify_plan(bad).message();
  const size_t i = find(bad, 0, kind_is(InstrKind::kReduceScatterAccumulate, 1));
  ASSERT_LT(i, bad.programs[0].instructions.size());
  const TensorId t = bad.programs[0].instructions[i].index;
  erase(bad, 0, i);
  const size_t scale = find(bad, 0, [&](const PlanInstruction &instr) {
    return instr.kind == InstrKind::kScale && instr.index == t;
  });
  ASSERT_LT(scale, bad.programs[0].instructions.size());
  expect_refused(bad, {str_cat(at(bad, 0, scale), ": scales '", bad.graph.tensor(t).name,
                               "' after 1 of its 2 micro-batches were accumulated")});
}

// ZeRO-3: the MLP, 2 replicas, 2 micro-batches; parameters held as shards
// and gathered before each block that reads them (with `prefetch`, started
// on the communication stream one group ahead).
Plan zero_three_plan(bool prefetch = false) {
  PipelineCompileOptions options = mesh(2, 1, 1, 2);
  options.zero = 3;
  options.prefetch = prefetch;
  auto compiled = partitioner::compile_pipeline(even_mlp(), training(), options);
  EXPECT_TRUE(compiled.is_ok()) << compiled.status().message();
  Plan plan = std::move(compiled).value();
  plan.model_fingerprint = plan.fingerprint = std::string(64, 'a');
  return plan;
}

// The first compute of device d after instruction `from` that reads `t`.
size_t first_reader(const Plan &plan, size_t d, TensorId t, size_t from) {
  const auto &instrs = plan.programs[d].instructions;
  for (size_t i = from; i < instrs.size(); ++i) {
    if (instrs[i].kind != InstrKind::kCompute) continue;
    const auto &inputs = plan.graph.node(instrs[i].index).inputs;
    if (std::find(inputs.begin(), inputs.end(), t) != inputs.end()) return i;
  }
  return instrs.size();
}

TEST(VerifyPlanTest, ZeroThreePlansRoundTripThroughJson) {
  const Plan plan = zero_three_plan();
  EXPECT_TRUE(verify_plan(plan).is_ok()) << verify_plan(plan).message();
  auto json = serialization::plan_to_json(plan);
  ASSERT_TRUE(json.is_ok()) << json.status().message();
  EXPECT_NE(json->find("\"kind\": \"GatherParam\""), std::string::npos);
  EXPECT_NE(json->find("\"zero\": 3"), std::string::npos);
  auto loaded = serialization::load_plan_from_json(*json, "z3.splan.json", ".");
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  EXPECT_EQ(loaded->programs, plan.programs);
  EXPECT_TRUE(verify_plan(*loaded).is_ok()) << verify_plan(*loaded).message();
}

// A parameter's gather for mb 0's forward removed: its reader reads a
// parameter the device holds only as a shard.
TEST_F(VerifyCorruptionTest, RemovedGatherParam) {
  Plan bad = zero_three_plan();
  ASSERT_TRUE(verify_plan(bad).is_ok()) << verify_plan(bad).message();
  const size_t i = find(bad, 0, kind_is(InstrKind::kGatherParam, 0));
  ASSERT_LT(i, bad.programs[0].instructions.size());
  const TensorId t = bad.programs[0].instructions[i].index;
  erase(bad, 0, i);
  const size_t reader = first_reader(bad, 0, t, i);
  ASSERT_LT(reader, bad.programs[0].instructions.size());
  expect_refused(
      bad, {str_cat(at(bad, 0, reader), ": reads '", bad.graph.tensor(t).name, "'"), "shard"});
}

// The gather moved after its first reader: that reader comes before it.
TEST_F(VerifyCorruptionTest, GatherParamAfterItsReader) {
  Plan bad = zero_three_plan();
  const size_t i = find(bad, 1, kind_is(InstrKind::kGatherParam, 0));
  ASSERT_LT(i, bad.programs[1].instructions.size());
  const TensorId t = bad.programs[1].instructions[i].index;
  const size_t reader = first_reader(bad, 1, t, i);
  ASSERT_LT(reader, bad.programs[1].instructions.size());
  auto &instrs = bad.programs[1].instructions;
  const PlanInstruction gather = instrs[i];
  instrs.erase(instrs.begin() + static_cast<std::ptrdiff_t>(i));
  instrs.insert(instrs.begin() + static_cast<std::ptrdiff_t>(reader), gather);
  expect_refused(bad, {str_cat(at(bad, 1, reader - 1), ": reads '", bad.graph.tensor(t).name,
                               "', which the device holds only as its ZeRO-3 shard, before a "
                               "gather of it for block 0 (GatherParam) comes first")});
}

TEST(VerifyPlanTest, PrefetchedZeroThreePlansRoundTripThroughJson) {
  const Plan plan = zero_three_plan(true);
  EXPECT_TRUE(verify_plan(plan).is_ok()) << verify_plan(plan).message();
  auto json = serialization::plan_to_json(plan);
  ASSERT_TRUE(json.is_ok()) << json.status().message();
  EXPECT_NE(json->find("\"kind\": \"StartGather\""), std::string::npos);
  EXPECT_NE(json->find("\"kind\": \"WaitGather\""), std::string::npos);
  EXPECT_EQ(json->find("\"kind\": \"GatherParam\""), std::string::npos);
  auto loaded = serialization::load_plan_from_json(*json, "z3.splan.json", ".");
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  EXPECT_EQ(loaded->programs, plan.programs);
}

// A prefetch's wait removed: the first reader of the buffer reads it while
// the stream may still be filling it.
TEST_F(VerifyCorruptionTest, RemovedWaitGather) {
  Plan bad = zero_three_plan(true);
  const size_t i = find(bad, 0, kind_is(InstrKind::kWaitGather, 2));
  ASSERT_LT(i, bad.programs[0].instructions.size());
  const PlanInstruction wait = bad.programs[0].instructions[i];
  const size_t start = find(bad, 0, [&](const PlanInstruction &instr) {
    return instr.kind == InstrKind::kStartGather && instr.index == wait.index &&
           instr.microbatch == wait.microbatch;
  });
  erase(bad, 0, i);
  const size_t reader = first_reader(bad, 0, wait.index, i);
  ASSERT_LT(reader, bad.programs[0].instructions.size());
  expect_refused(bad, {str_cat(at(bad, 0, reader), ": reads '", bad.graph.tensor(wait.index).name,
                               "' mb 2 while the gather instruction ", start,
                               " started still fills it (no WaitGather of it comes first)")});
}

// A prefetch's start removed: its wait waits for nothing.
TEST_F(VerifyCorruptionTest, WaitGatherWithoutItsStart) {
  Plan bad = zero_three_plan(true);
  const size_t i = find(bad, 1, kind_is(InstrKind::kStartGather, 1));
  ASSERT_LT(i, bad.programs[1].instructions.size());
  const PlanInstruction start = bad.programs[1].instructions[i];
  erase(bad, 1, i);
  const size_t wait = find(bad, 1, [&](const PlanInstruction &instr) {
    return instr.kind == InstrKind::kWaitGather && instr.index == start.index &&
           instr.microbatch == start.microbatch;
  });
  ASSERT_LT(wait, bad.programs[1].instructions.size());
  expect_refused(bad, {str_cat(at(bad, 1, wait), ": waits for the gather of '",
                               bad.graph.tensor(start.index).name,
                               "' mb 1, which no StartGather before it started")});
}

// A zero field that says 2 for a plan that gathers parameters.
TEST_F(VerifyCorruptionTest, GatherParamNeedsZeroThree) {
  Plan bad = zero_three_plan();
  bad.pipeline->zero = 2;
  expect_refused(bad,
                 {"gathers parameters from shards (GatherParam, ZeRO-3), but field "
                  "pipeline.zero = 2"},
                 false);
}

TEST_F(VerifyCorruptionTest, DuplicatedReduceScatterAccumulate) {
  Plan bad = zero_two_plan();
  const size_t i = find(bad, 1, kind_is(InstrKind::kReduceScatterAccumulate, 0));
  ASSERT_LT(i, bad.programs[1].instructions.size());
  const TensorId t = bad.programs[1].instructions[i].index;
  duplicate(bad, 1, i);
  expect_refused(bad,
                 {str_cat(at(bad, 1, i + 1), ": reduce-scatters '", bad.graph.tensor(t).name,
                          "' mb 0 into its shard a second time (first at instruction ", i, ")")});
}

// The shard sum turned into a whole one: an accumulate of a tensor whose step
// buffer the device keeps only as its shard.
TEST_F(VerifyCorruptionTest, ReduceScatterAccumulateRunWhole) {
  Plan bad = zero_two_plan();
  auto &instrs = bad.programs[0].instructions;
  const size_t first = find(bad, 0, kind_is(InstrKind::kReduceScatterAccumulate, 0));
  ASSERT_LT(first, instrs.size());
  const TensorId t = instrs[first].index;
  const size_t second = find(
      bad, 0,
      [&](const PlanInstruction &instr) {
        return instr.kind == InstrKind::kReduceScatterAccumulate && instr.index == t &&
               instr.microbatch == 1;
      },
      first);
  ASSERT_LT(second, instrs.size());
  instrs[second] = {InstrKind::kAccumulate, 1, t, -1};
  expect_refused(bad, {str_cat(at(bad, 0, second), ": accumulates '", bad.graph.tensor(t).name,
                               "' whole, but the device keeps only its shard of that sum")});
}

// The zero field against the programs: ZeRO-2 without its instruction, and
// the instruction in a ZeRO-1 plan (which the loader refuses already).
TEST_F(VerifyCorruptionTest, ZeroTwoFieldAndInstructionsAgree) {
  auto compiled = partitioner::compile_pipeline(even_mlp(), training(), [] {
    PipelineCompileOptions options = mesh(2, 1, 1, 2);
    options.zero = 1;
    return options;
  }());
  ASSERT_TRUE(compiled.is_ok()) << compiled.status().message();
  Plan bad = std::move(compiled).value();
  bad.model_fingerprint = bad.fingerprint = std::string(64, 'a');
  bad.pipeline->zero = 2;
  expect_refused(bad, {"field pipeline.zero = 2, but no program reduce-scatters a gradient into "
                       "its shard every micro-batch (ReduceScatterAccumulate)"});
  Plan other = zero_two_plan();
  other.pipeline->zero = 1;
  expect_refused(other,
                 {"a program reduce-scatters gradients into shards every micro-batch "
                  "(ReduceScatterAccumulate, ZeRO-2), but field pipeline.zero = 1"},
                 /*loads=*/false);
  Plan single = good_;
  single.pipeline->zero = 2;
  expect_refused(single, {"field pipeline.zero = 2 shards optimizer state and gradients over the "
                          "data-parallel replicas, but pipeline.data_parallel = 1"});
}

} // namespace
} // namespace strata::plan
