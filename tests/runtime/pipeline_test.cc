// Pipeline parallelism, end to end: a pipeline plan run on P device threads
// gives the same losses and weights as one device.
//
//  - Against the single-device, full-batch Trainer (the reference): relative
//    1e-5, since micro-batching changes the order of the batch reductions.
//  - Against the single-device plan with the same micro-batches (P = 1): bitwise,
//    for both schedules and every P, since every device runs the same kernels on
//    the same data and gradients accumulate in micro-batch order everywhere.
//  - With one micro-batch: bitwise against the full-batch reference.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include <unistd.h>

#include <gtest/gtest.h>

#include "graph/builder.h"
#include "ops/kernels/cpu/gemm.h"
#include "ops/registry.h"
#include "partitioner/compile_pipeline.h"
#include "partitioner/search/auto_plan.h"
#include "passes/recompute.h"
#include "plan/instructions.h"
#include "plan/memory.h"
#include "plan/pieces.h"
#include "runtime/cpu/pipeline_runner.h"
#include "runtime/trainer.h"
#include "tests/runtime/projection_softmax.h"
#include "tests/serialization/test_util.h"
#include "tools/zoo.h"

namespace strata::runtime {
namespace {

using partitioner::Schedule;

constexpr int kSteps = 3;
constexpr uint64_t kDataSeed = 11;

struct TrainRun {
  std::vector<double> losses;
  std::map<std::string, HostTensor> state;
};

Graph mlp() {
  zoo::MlpOptions o;
  o.batch = 16;
  o.input = 12;
  o.hidden = {16, 16, 16};
  o.classes = 5;
  return *zoo::make_mlp(o);
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

Graph gpt() {
  zoo::GptOptions o;
  o.layers = 4;
  o.hidden = 32;
  o.heads = 2;
  o.seq = 8;
  o.vocab = 64;
  o.batch = 8;
  return *zoo::make_gpt(o);
}

passes::TrainingOptions training(const std::string &optimizer = "sgd:lr=0.1,momentum=0.9") {
  passes::TrainingOptions options;
  options.optimizer = *passes::parse_optimizer(optimizer);
  return options;
}

TrainRun train(Trainer &trainer) {
  TrainRun run;
  for (int s = 0; s < kSteps; ++s) {
    auto loss = trainer.train_step();
    EXPECT_TRUE(loss.is_ok()) << loss.status().message();
    run.losses.push_back(loss.is_ok() ? *loss : NAN);
  }
  run.state = trainer.state();
  return run;
}

TrainRun reference(const Graph &forward, const passes::TrainingOptions &options) {
  Graph graph = *passes::make_training_graph(forward, options);
  Dataset data = synthetic_dataset(graph, kDataSeed);
  auto trainer = Trainer::create(std::move(graph), "loss", std::move(data));
  EXPECT_TRUE(trainer.is_ok()) << trainer.status().message();
  return train(**trainer);
}

Result<serialization::Plan> compile(const Graph &forward, const passes::TrainingOptions &options,
                                    int stages, int microbatches, Schedule schedule,
                                    int data_parallel = 1, int zero = 0, int tensor_parallel = 1,
                                    bool recompute = false,
                                    int64_t bucket_bytes = partitioner::kDefaultBucketBytes) {
  partitioner::PipelineCompileOptions pipeline;
  pipeline.bucket_bytes = bucket_bytes;
  pipeline.recompute = recompute;
  pipeline.zero = zero;
  pipeline.tensor_parallel = tensor_parallel;
  pipeline.stages = stages;
  pipeline.data_parallel = data_parallel;
  pipeline.microbatches = microbatches;
  pipeline.schedule = schedule;
  return partitioner::compile_pipeline(forward, options, pipeline);
}

TrainRun run_plan(const serialization::Plan &plan, const PipelineRunnerOptions &options = {},
                  std::unique_ptr<Trainer> *keep = nullptr);

TrainRun pipelined(const Graph &forward, const passes::TrainingOptions &options, int stages,
                   int microbatches, Schedule schedule, int data_parallel = 1, int zero = 0,
                   int tensor_parallel = 1, bool recompute = false) {
  auto plan = compile(forward, options, stages, microbatches, schedule, data_parallel, zero,
                      tensor_parallel, recompute);
  EXPECT_TRUE(plan.is_ok()) << plan.status().message();
  if (!plan.is_ok()) return {};
  EXPECT_EQ(plan->programs.size(), static_cast<size_t>(stages * data_parallel * tensor_parallel));
  return run_plan(*plan);
}

// Trains `plan` kSteps steps on the synthetic data; `keep` receives the
// trainer (and its runner) where given.
TrainRun run_plan(const serialization::Plan &plan, const PipelineRunnerOptions &options,
                  std::unique_ptr<Trainer> *keep) {
  auto runner = PipelineRunner::create(plan, options);
  EXPECT_TRUE(runner.is_ok()) << runner.status().message();
  if (!runner.is_ok()) return {};
  Dataset data =
      synthetic_dataset(plan.graph, kDataSeed, 8,
                        int64_t{plan.pipeline->microbatches} * plan.pipeline->data_parallel);
  auto trainer = Trainer::create(std::move(runner).value(), "loss", std::move(data));
  EXPECT_TRUE(trainer.is_ok()) << trainer.status().message();
  if (!trainer.is_ok()) return {};
  TrainRun run = train(**trainer);
  if (keep != nullptr) *keep = std::move(trainer).value();
  return run;
}

// Largest |a - b| / max|b| over a tensor.
double relative_error(const HostTensor &a, const HostTensor &b) {
  if (a.type.dtype != DType::kF32) return std::memcmp(a.data(), b.data(), a.size_bytes()) ? 1 : 0;
  const float *x = a.as<float>(), *y = b.as<float>();
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < a.type.num_elements(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(x[i]) - y[i]));
    scale = std::max(scale, std::abs(static_cast<double>(y[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

void expect_close(const TrainRun &got, const TrainRun &want, double tolerance,
                  const std::string &what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t s = 0; s < want.losses.size(); ++s)
    EXPECT_NEAR(got.losses[s], want.losses[s], tolerance * std::abs(want.losses[s]))
        << what << " step " << s + 1;
  ASSERT_EQ(got.state.size(), want.state.size()) << what;
  for (const auto &[name, value] : want.state) {
    auto it = got.state.find(name);
    ASSERT_NE(it, got.state.end()) << what << ": " << name;
    ASSERT_EQ(it->second.type, value.type) << what << ": " << name;
    EXPECT_LE(relative_error(it->second, value), tolerance) << what << ": " << name;
  }
}

void expect_bitwise(const TrainRun &got, const TrainRun &want, const std::string &what) {
  ASSERT_EQ(got.losses, want.losses) << what;
  ASSERT_EQ(got.state.size(), want.state.size()) << what;
  for (const auto &[name, value] : want.state) {
    auto it = got.state.find(name);
    ASSERT_NE(it, got.state.end()) << what << ": " << name;
    ASSERT_EQ(it->second.size_bytes(), value.size_bytes()) << what << ": " << name;
    EXPECT_EQ(std::memcmp(it->second.data(), value.data(), value.size_bytes()), 0)
        << what << ": " << name << " differs";
  }
}

// Trains `plan` 4 steps straight, and 2 steps, a checkpoint, a fresh runner
// restored from it and 2 more steps; the two must end bitwise equal. Returns the
// uninterrupted run's state.
std::map<std::string, HostTensor> expect_resume_is_bitwise(const serialization::Plan &plan,
                                                           const std::string &what) {
  const int64_t splits = int64_t{plan.pipeline->microbatches} * plan.pipeline->data_parallel;
  auto make = [&] {
    auto runner = PipelineRunner::create(plan);
    EXPECT_TRUE(runner.is_ok()) << runner.status().message();
    TrainerOptions options;
    options.fingerprint = what;
    auto trainer = Trainer::create(std::move(runner).value(), "loss",
                                   synthetic_dataset(plan.graph, kDataSeed, 8, splits), options);
    EXPECT_TRUE(trainer.is_ok()) << trainer.status().message();
    return std::move(trainer).value();
  };
  auto straight = make();
  for (int s = 0; s < 4; ++s)
    EXPECT_TRUE(straight->train_step().is_ok()) << what;
  const auto dir =
      std::filesystem::temp_directory_path() / str_cat("strata_resume_", ::getpid(), "_", what);
  std::filesystem::remove_all(dir);
  auto first = make();
  for (int s = 0; s < 2; ++s)
    EXPECT_TRUE(first->train_step().is_ok()) << what;
  EXPECT_TRUE(first->save_checkpoint(dir.string()).is_ok()) << what;
  auto second = make();
  EXPECT_TRUE(second->restore_checkpoint(dir.string()).is_ok()) << what;
  EXPECT_EQ(second->step(), 2) << what;
  for (int s = 0; s < 2; ++s)
    EXPECT_TRUE(second->train_step().is_ok()) << what;
  std::filesystem::remove_all(dir);
  TrainRun a{{}, straight->state()}, b{{}, second->state()};
  expect_bitwise(b, a, what + ": resumed vs uninterrupted");
  return a.state;
}

// One step of `plan` in which `device` sleeps 1.5 s at `instruction`, with a
// 300 ms timeout: the step's status, how long it took, and a second step's.
struct StalledStep {
  Status status;
  std::chrono::steady_clock::duration elapsed{};
  Status again;
};
StalledStep run_stalled(const serialization::Plan &plan, int device, size_t instruction) {
  PipelineRunnerOptions options;
  options.timeout = std::chrono::milliseconds(300);
  PipelineRunnerOptions::Fault fault;
  fault.kind = PipelineRunnerOptions::Fault::Kind::kStall;
  fault.device = device;
  fault.instruction = instruction;
  fault.stall = std::chrono::milliseconds(1500);
  options.fault = fault;
  auto runner = *PipelineRunner::create(plan, options);
  auto data = synthetic_dataset(
      plan.graph, 0, 1, int64_t{plan.pipeline->microbatches} * plan.pipeline->data_parallel);
  std::vector<HostTensor> outputs;
  StalledStep out;
  const auto start = std::chrono::steady_clock::now();
  out.status = runner->run(data.batches[0], &outputs);
  out.elapsed = std::chrono::steady_clock::now() - start;
  out.again = runner->run(data.batches[0], &outputs);
  return out;
}

class PipelineTest : public ::testing::Test {
protected:
  // One GEMM thread everywhere, so the reference and each device thread
  // compute with the same blocking.
  void SetUp() override { ops::cpu::set_gemm_num_threads(1); }
  void TearDown() override { ops::cpu::set_gemm_num_threads(0); }

  void check_model(const Graph &forward, const passes::TrainingOptions &options) {
    const TrainRun want = reference(forward, options);
    ASSERT_EQ(want.losses.size(), static_cast<size_t>(kSteps));
    for (int M : {1, 4, 8}) {
      const TrainRun one_device = pipelined(forward, options, 1, M, Schedule::k1F1B);
      expect_close(one_device, want, 1e-5, str_cat("P=1 M=", M));
      if (M == 1) expect_bitwise(one_device, want, "P=1 M=1 vs the full-batch trainer");
      for (int P : {2, 4})
        for (Schedule schedule : {Schedule::kGPipe, Schedule::k1F1B, Schedule::kZeroBubbleH1}) {
          const std::string what =
              str_cat("P=", P, " M=", M, " ", partitioner::schedule_name(schedule));
          const TrainRun got = pipelined(forward, options, P, M, schedule);
          expect_bitwise(got, one_device, what + " vs P=1");
          expect_close(got, want, 1e-5, what + " vs the full-batch trainer");
        }
    }
  }
};

TEST_F(PipelineTest, MlpMatchesOneDevice) { check_model(mlp(), training()); }

// ZB-H1 runs the same nodes as 1F1B, the weight halves later, and
// accumulates in the same order: the same bits with replicas, ZeRO's three
// stages, tensor parallelism and recomputation, and a smaller predicted
// bubble (the cool-down waits for B halves only).
TEST_F(PipelineTest, ZeroBubbleH1HasTheBitsOf1F1B) {
  const auto options = training("adamw:lr=0.01,clip=1");
  struct Mesh {
    int pp, dp, zero, tp;
    bool recompute;
  };
  for (const Mesh m : {Mesh{4, 1, 0, 1, false}, Mesh{2, 2, 1, 1, false}, Mesh{2, 2, 2, 1, false},
                       Mesh{2, 2, 3, 1, false}, Mesh{2, 1, 0, 2, false}, Mesh{3, 1, 0, 1, true}}) {
    const std::string what = str_cat("pp=", m.pp, " dp=", m.dp, " zero=", m.zero, " tp=", m.tp,
                                     m.recompute ? " recompute" : "");
    const TrainRun one =
        pipelined(gpt(), options, m.pp, 4, Schedule::k1F1B, m.dp, m.zero, m.tp, m.recompute);
    const TrainRun zb = pipelined(gpt(), options, m.pp, 4, Schedule::kZeroBubbleH1, m.dp, m.zero,
                                  m.tp, m.recompute);
    expect_bitwise(zb, one, what);
  }
  auto one = compile(gpt(), options, 4, 8, Schedule::k1F1B);
  auto zb = compile(gpt(), options, 4, 8, Schedule::kZeroBubbleH1);
  ASSERT_TRUE(one.is_ok() && zb.is_ok());
  EXPECT_EQ(zb->pipeline->schedule, "zb-h1");
  EXPECT_LT(zb->pipeline->predicted_bubble, one->pipeline->predicted_bubble);
  // The lowered plan's memory is checked against the device's: ZB-H1 keeps
  // more than the stage search assumed for 1F1B.
  int64_t most = 0;
  for (size_t d = 0; d < zb->programs.size(); ++d)
    most = std::max(most, plan::device_memory(*zb, d));
  partitioner::PipelineCompileOptions tight;
  tight.stages = 4;
  tight.microbatches = 8;
  tight.schedule = Schedule::kZeroBubbleH1;
  tight.cluster = partitioner::default_cpu_cluster(4);
  tight.cluster->device.memory_bytes = most;
  EXPECT_TRUE(partitioner::compile_pipeline(gpt(), options, tight).is_ok());
  tight.cluster->device.memory_bytes = most - 1;
  auto refused = partitioner::compile_pipeline(gpt(), options, tight);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find(" needs "), std::string::npos)
      << refused.status().message();
  // Every stage but the first splits its backward: its programs differ.
  for (size_t d = 1; d < 3; ++d) {
    std::vector<uint32_t> a, b;
    for (const auto &instr : one->programs[d].instructions)
      if (instr.kind == serialization::InstrKind::kCompute) a.push_back(instr.index);
    for (const auto &instr : zb->programs[d].instructions)
      if (instr.kind == serialization::InstrKind::kCompute) b.push_back(instr.index);
    EXPECT_EQ(a.size(), b.size()) << "device " << d;
    EXPECT_NE(a, b) << "device " << d;
  }
}

TEST_F(PipelineTest, GptMatchesOneDevice) { check_model(gpt(), training()); }

TEST_F(PipelineTest, GptWithAdamWAndClippingMatchesOneDevice) {
  // Clipping needs the norm of every stage's gradients: each stage sums its own
  // squares (SumOfSquares) and the clip scale is NormScale of those, so eight
  // bytes per stage cross, not the gradients. AdamW keeps a step counter every
  // stage holds a copy of.
  const auto options = training("adamw:lr=0.01,wd=0.1,clip=1");
  auto plan = compile(gpt(), options, 4, 4, Schedule::k1F1B);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  const auto clip = plan->graph.find_node("optimizer.clip_scale");
  ASSERT_TRUE(clip.has_value());
  EXPECT_EQ(plan->graph.node(*clip).op, "NormScale");
  EXPECT_EQ(plan->graph.node(*clip).inputs.size(), 4u);
  for (const auto &row :
       partitioner::explain_transfers(plan->graph, plan->programs, {}, plan::zero_costs()))
    if (row.why.starts_with("once per step")) {
      EXPECT_LE(row.bytes, 8) << plan->graph.tensor(row.tensor).name;
    }
  const TrainRun want = reference(gpt(), options);
  const TrainRun got = pipelined(gpt(), options, 4, 4, Schedule::k1F1B);
  expect_bitwise(got, pipelined(gpt(), options, 1, 4, Schedule::k1F1B), "P=4 vs P=1");
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t s = 0; s < want.losses.size(); ++s)
    EXPECT_NEAR(got.losses[s], want.losses[s], 1e-5 * std::abs(want.losses[s]));
}

// Data parallelism (--mesh DPx1xPP): replicas of every stage on their share of
// the batch, gradients all-reduced per stage. Within 1e-5 of one device; and
// bitwise the same for every pipeline depth with the same replicas and
// micro-batches (the all-reduce sums in replica order on every stage).
TEST_F(PipelineTest, DataParallelMatchesOneDevice) {
  for (const Graph &forward : {mlp(), gpt()}) {
    const auto options = training();
    const TrainRun want = reference(forward, options);
    for (int M : {1, 2}) {
      const TrainRun flat = pipelined(forward, options, 1, M, Schedule::k1F1B, 2);
      expect_close(flat, want, 1e-5, str_cat(forward.name(), " dp=2 pp=1 M=", M));
      const TrainRun deep = pipelined(forward, options, 2, M, Schedule::k1F1B, 2);
      expect_bitwise(deep, flat, str_cat(forward.name(), " dp=2 pp=2 vs pp=1, M=", M));
      const TrainRun gpipe = pipelined(forward, options, 2, M, Schedule::kGPipe, 2);
      expect_bitwise(gpipe, flat, str_cat(forward.name(), " dp=2 pp=2 gpipe, M=", M));
    }
    expect_close(pipelined(forward, options, 1, 2, Schedule::k1F1B, 4), want, 1e-5,
                 str_cat(forward.name(), " dp=4"));
  }
  // AdamW with clipping: the clipping norm reads the all-reduced gradients.
  const auto adamw = training("adamw:lr=0.01,wd=0.1,clip=1");
  const TrainRun want = reference(gpt(), adamw);
  const TrainRun got = pipelined(gpt(), adamw, 2, 2, Schedule::k1F1B, 2);
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t s = 0; s < want.losses.size(); ++s)
    EXPECT_NEAR(got.losses[s], want.losses[s], 1e-5 * std::abs(want.losses[s]));
}

// ZeRO-1: each replica updates its shard of the parameters with its shard of
// the optimizer state; the result is bitwise the plain data-parallel one (the
// reduce-scatter sums in the same device order as the all-reduce, and the update
// is elementwise), with less optimizer state per device.
TEST_F(PipelineTest, ZeroOneMatchesDataParallelBitwiseWithLessState) {
  for (const Graph &forward : {mlp(), gpt()})
    for (const char *optimizer : {"adamw:lr=0.01,wd=0.1", "sgd:lr=0.1,momentum=0.9"}) {
      const auto options = training(optimizer);
      for (int P : {1, 2})
        for (int M : {1, 2}) {
          const std::string what = str_cat(forward.name(), " ", optimizer, " pp=", P, " M=", M);
          const TrainRun plain = pipelined(forward, options, P, M, Schedule::k1F1B, 2, 0);
          const TrainRun zero = pipelined(forward, options, P, M, Schedule::k1F1B, 2, 1);
          expect_bitwise(zero, plain, what);
        }
      auto plain = compile(forward, options, 2, 2, Schedule::k1F1B, 2, 0);
      auto sharded = compile(forward, options, 2, 2, Schedule::k1F1B, 2, 1);
      ASSERT_TRUE(plain.is_ok() && sharded.is_ok());
      size_t sharded_tensors = 0;
      for (size_t d = 0; d < sharded->programs.size(); ++d) {
        sharded_tensors += sharded->programs[d].sharded_holds.size();
        EXPECT_LT(plan::device_memory(*sharded, d), plan::device_memory(*plain, d))
            << forward.name() << " " << optimizer << " device " << d;
      }
      EXPECT_GT(sharded_tensors, 0u);
    }
}

// Tensor parallelism (--mesh DPxTPxPP): every mesh with dp, tp, pp in {1, 2}
// and ZeRO off, 1 and 2 trains the MLP, the convnet and the GPT to within 1e-5
// of one device (the row-split matmuls sum their partial products over the
// group, a different order than one device). The pieces are joined back into
// the full tensors for the comparison.
TEST_F(PipelineTest, EveryMeshMatchesOneDevice) {
  for (const Graph &forward : {mlp(), convnet(), gpt()}) {
    const auto options = training();
    const TrainRun want = reference(forward, options);
    for (int dp : {1, 2})
      for (int tp : {1, 2})
        for (int pp : {1, 2})
          for (int zero : {0, 1, 2}) {
            if (zero > 0 && dp == 1) continue;
            const std::string what =
                str_cat(forward.name(), " mesh ", dp, "x", tp, "x", pp, " zero ", zero);
            expect_close(pipelined(forward, options, pp, 2, Schedule::k1F1B, dp, zero, tp), want,
                         1e-5, what);
          }
    // The tensor-parallel plans do split work: some parameters are in pieces.
    auto plan = compile(forward, options, 1, 1, Schedule::k1F1B, 1, 0, 2);
    ASSERT_TRUE(plan.is_ok()) << plan.status().message();
    EXPECT_FALSE(plan->pipeline->shards.empty()) << forward.name();
    size_t collectives = 0;
    for (const Node &node : plan->graph.nodes())
      collectives += node.op == "TpAllReduce" || node.op == "TpAllGather";
    EXPECT_GT(collectives, 0u) << forward.name();
  }
  // Four members (the GPT's 2 heads no longer split: the search finds
  // another way) and AdamW, whose moments are held in pieces like their
  // parameters. Adam turns rounding noise on gradients that are zero in exact
  // arithmetic (the key bias: softmax ignores a shift) into +-lr steps, so, as
  // for plain data parallelism, the losses match to 1e-5 and the weights to 2e-3.
  const auto adamw = training("adamw:lr=0.01,wd=0.1");
  const TrainRun want = reference(gpt(), adamw);
  for (int tp : {2, 4}) {
    const TrainRun got = pipelined(gpt(), adamw, 1, 1, Schedule::k1F1B, 1, 0, tp);
    expect_close(got, want, 2e-3, str_cat("gpt tp=", tp, " adamw"));
    ASSERT_EQ(got.losses.size(), want.losses.size());
    for (size_t s = 0; s < want.losses.size(); ++s)
      EXPECT_NEAR(got.losses[s], want.losses[s], 1e-5 * std::abs(want.losses[s])) << tp;
  }
}

// --split-activations: reduce-scattered partial sums (TpReduceScatter, whose
// backward is an all-gather) train like one device.
TEST_F(PipelineTest, SplitActivationsMatchOneDevice) {
  const Graph forward = gpt();
  const auto options = training();
  const TrainRun want = reference(forward, options);
  for (int stages : {1, 2}) {
    partitioner::PipelineCompileOptions pipeline;
    pipeline.stages = stages;
    pipeline.microbatches = 2;
    pipeline.tensor_parallel = 2;
    pipeline.split_activations = true;
    auto plan = partitioner::compile_pipeline(forward, options, pipeline);
    ASSERT_TRUE(plan.is_ok()) << plan.status().message();
    int scatters = 0;
    for (const Node &node : plan->graph.nodes())
      scatters += node.op == "TpReduceScatter";
    EXPECT_GT(scatters, 0) << "pp=" << stages;
    expect_close(run_plan(*plan), want, 1e-5, str_cat("tp=2 pp=", stages, " split activations"));
  }
}

// An all-to-all (TpAllToAll: one split becomes another, over point-to-point
// messages; its gradient is the reverse all-to-all) trains like one device.
// Compute is priced slow so that splitting the softmax pays for moving the
// split from the projection's columns to the rows.
TEST_F(PipelineTest, AllToAllMatchesOneDevice) {
  const Graph forward = testing_graphs::projection_softmax();
  const auto options = training("adamw:lr=0.05");
  const TrainRun want = reference(forward, options);
  for (int tp : {2, 4}) {
    auto plan = partitioner::compile_pipeline(forward, options,
                                              testing_graphs::slow_compute_tensor_parallel(tp));
    ASSERT_TRUE(plan.is_ok()) << plan.status().message();
    int all_to_all = 0;
    for (const Node &node : plan->graph.nodes())
      all_to_all += node.op == "TpAllToAll";
    // Each forward one has its backward one.
    EXPECT_GT(all_to_all, 0) << "tp=" << tp;
    EXPECT_EQ(all_to_all % 2, 0) << "tp=" << tp;
    expect_close(run_plan(*plan), want, 1e-5, str_cat("tp=", tp, " all-to-all"));
  }
}

// Megatron-LM's vocabulary-parallel embedding and cross entropy, found by the
// search on a GPT whose vocabulary is large against its hidden size: the tied
// table split by rows, the lookup's partial sums all-reduced, the logits split
// by class into the loss. Every member computes the same loss from every
// member's three numbers per row; the runs match one device.
TEST_F(PipelineTest, VocabularyParallelEmbeddingAndLossMatchOneDevice) {
  zoo::GptOptions o;
  o.layers = 2;
  o.hidden = 16;
  o.heads = 2;
  o.seq = 8;
  o.vocab = 4096;
  o.batch = 8;
  const Graph forward = *zoo::make_gpt(o);
  const auto options = training();
  const TrainRun want = reference(forward, options);
  struct Mesh {
    int dp, tp, pp, zero;
  };
  for (const Mesh m : {Mesh{1, 2, 1, 0}, Mesh{1, 4, 1, 0}, Mesh{1, 2, 2, 0}, Mesh{2, 2, 1, 1}}) {
    const std::string what = str_cat("dp=", m.dp, " tp=", m.tp, " pp=", m.pp, " zero=", m.zero);
    auto plan = compile(forward, options, m.pp, 2, Schedule::k1F1B, m.dp, m.zero, m.tp);
    ASSERT_TRUE(plan.is_ok()) << what << ": " << plan.status().message();
    const Graph &g = plan->graph;
    ASSERT_TRUE(g.find_node("loss").has_value()) << what;
    EXPECT_EQ(g.node(*g.find_node("loss")).op, "VocabParallelCrossEntropy") << what;
    EXPECT_EQ(g.node(*g.find_node("embed.tokens")).int_attr("parts"), m.tp) << what;
    EXPECT_EQ(g.tensor(*g.find_tensor("logits")).type.shape.back(), o.vocab / m.tp) << what;
    expect_close(run_plan(*plan), want, 1e-5, what);
  }
  // --profile times nodes on one device, which cannot run a member's: refused by name.
  partitioner::PipelineCompileOptions profiled;
  profiled.tensor_parallel = 2;
  profiled.profile = [](const Graph &g) -> Result<std::vector<double>> {
    return std::vector<double>(g.num_nodes(), 1e-6);
  };
  auto refused = partitioner::compile_pipeline(forward, options, profiled);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("--profile"), std::string::npos)
      << refused.status().message();
}

TEST_F(PipelineTest, TensorParallelCheckpointsResumeBitwise) {
  auto plan = compile(gpt(), training("adamw:lr=0.01"), 2, 2, Schedule::k1F1B, 1, 0, 2);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  const auto state = expect_resume_is_bitwise(*plan, "tp2");
  // The checkpoint holds whole tensors, at the model's shapes.
  const Graph forward = gpt();
  for (const Tensor &t : forward.tensors())
    if (t.kind == TensorKind::kParameter) {
      ASSERT_TRUE(state.contains(t.name)) << t.name;
      EXPECT_EQ(state.at(t.name).type, t.type) << t.name;
    }
}

// A tensor-parallel plan survives its file (binary and JSON) and the loader
// checks its fields.
TEST_F(PipelineTest, TensorParallelPlansRoundTripAndAreChecked) {
  auto plan = compile(gpt(), training(), 2, 2, Schedule::k1F1B, 1, 0, 2);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  ASSERT_FALSE(plan->pipeline->shards.empty());
  plan->model_fingerprint = std::string(64, 'a'); // the CLI fills these in
  plan->fingerprint = std::string(64, 'b');
  auto bytes = serialization::plan_to_flatbuffer(*plan);
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().message();
  auto loaded = serialization::load_plan_from_buffer(*bytes, "tp.splan", ".");
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  EXPECT_EQ(*loaded->pipeline, *plan->pipeline);
  EXPECT_EQ(loaded->programs, plan->programs);
  auto json = serialization::plan_to_json(*plan);
  ASSERT_TRUE(json.is_ok());
  EXPECT_NE(json->find("\"tensor_parallel\": 2"), std::string::npos);
  auto from_json = serialization::load_plan_from_json(*json, "tp.splan.json", ".");
  ASSERT_TRUE(from_json.is_ok()) << from_json.status().message();
  EXPECT_EQ(*serialization::plan_to_flatbuffer(*from_json), *bytes);

  struct Case {
    std::function<void(serialization::Plan &)> edit;
    std::string expected;
  };
  std::vector<Case> cases = {
      {[](serialization::Plan &p) { p.pipeline->tensor_parallel = 0; },
       "field pipeline.tensor_parallel = 0"},
      {[](serialization::Plan &p) { p.pipeline->tensor_parallel = 4; }, "x tensor_parallel = 4"},
      {[](serialization::Plan &p) { p.pipeline->tp_groups_begin = 7; },
       "field pipeline.tp_groups_begin = 7"},
      {[](serialization::Plan &p) { p.pipeline->shards[0].dim = 9; }, "field pipeline.shards[0]"},
      {[](serialization::Plan &p) { p.pipeline->shards[0].full_shape[0] += 1; },
       "does not fit the piece"},
      {[](serialization::Plan &p) { p.pipeline->shards[0].tensor = "nothing"; },
       "names tensor 'nothing'"},
  };
  for (const Case &c : cases) {
    serialization::Plan bad = *plan;
    c.edit(bad);
    auto result = serialization::load_plan_from_buffer(*serialization::plan_to_flatbuffer(bad),
                                                       "bad.splan", ".");
    ASSERT_FALSE(result.is_ok()) << c.expected;
    EXPECT_NE(result.status().message().find(c.expected), std::string::npos)
        << result.status().message();
  }
}

// Clipping over pieces: each member's squares of its gradient pieces are summed
// over the group, the replicated parameters' gradients count once. A small
// max_norm makes the clip act on every step.
TEST_F(PipelineTest, TensorParallelClipsLikeOneDevice) {
  const auto options = training("sgd:lr=0.1,momentum=0.9,clip=0.05");
  const TrainRun want = reference(gpt(), options);
  for (int pp : {1, 2}) {
    auto plan = compile(gpt(), options, pp, 2, Schedule::k1F1B, 1, 0, 2);
    ASSERT_TRUE(plan.is_ok()) << plan.status().message();
    size_t reduced = 0;
    for (const Node &node : plan->graph.nodes())
      reduced += node.op == "TpAllReduce" && node.inputs.size() == 1 &&
                 plan->graph.node(plan->graph.tensor(node.inputs[0]).producer).op == "SumOfSquares";
    EXPECT_EQ(reduced, static_cast<size_t>(pp)) << "one per stage";
    expect_close(pipelined(gpt(), options, pp, 2, Schedule::k1F1B, 1, 0, 2), want, 1e-5,
                 str_cat("tp=2 pp=", pp, " clip"));
  }
  // Without the group sum the clip would differ: one device's unclipped run is far.
  const TrainRun unclipped = reference(gpt(), training());
  EXPECT_GT(std::abs(unclipped.losses.back() - want.losses.back()), 1e-4);
}

// --recompute: the same kernels on the same inputs, later; bitwise the same
// training on every mesh, and less activation memory on every device of a
// pipeline with micro-batches in flight.
TEST_F(PipelineTest, RecomputeIsBitwiseAndNeedsLessMemory) {
  for (const Graph &forward : {mlp(), gpt()}) {
    const auto options = training("adamw:lr=0.01");
    for (int tp : {1, 2})
      for (int pp : {1, 2})
        for (Schedule schedule : {Schedule::kGPipe, Schedule::k1F1B, Schedule::kZeroBubbleH1}) {
          const std::string what = str_cat(forward.name(), " tp=", tp, " pp=", pp, " ",
                                           partitioner::schedule_name(schedule));
          expect_bitwise(pipelined(forward, options, pp, 4, schedule, 1, 0, tp, true),
                         pipelined(forward, options, pp, 4, schedule, 1, 0, tp, false), what);
        }
  }
  auto plain = compile(gpt(), training(), 2, 4, Schedule::k1F1B);
  auto recomputed = compile(gpt(), training(), 2, 4, Schedule::k1F1B, 1, 0, 1, true);
  ASSERT_TRUE(plain.is_ok() && recomputed.is_ok());
  for (size_t d = 0; d < plain->programs.size(); ++d)
    EXPECT_LT(recomputed->programs[d].arena_bytes, plain->programs[d].arena_bytes) << d;
  // Data parallelism and ZeRO-1 with recomputation still match one device.
  expect_close(pipelined(gpt(), training(), 2, 2, Schedule::k1F1B, 2, 1, 1, true),
               reference(gpt(), training()), 1e-5, "gpt dp=2 pp=2 zero1 recompute");
}

// strata simulate on the plan's own cluster reproduces compile's prediction:
// both price each group's collectives with the algorithm the plan records.
TEST_F(PipelineTest, SimulateReproducesTheCompiledPrediction) {
  for (int zero : {0, 1, 2}) {
    auto plan = compile(gpt(), training(), 2, 2, Schedule::k1F1B, 2, zero, 2);
    ASSERT_TRUE(plan.is_ok()) << plan.status().message();
    auto cluster = partitioner::parse_cluster(plan->pipeline->cluster_json, "plan");
    ASSERT_TRUE(cluster.is_ok()) << cluster.status().message();
    auto sim = partitioner::simulate_plan(*plan, *cluster);
    ASSERT_TRUE(sim.is_ok()) << sim.status().message();
    EXPECT_DOUBLE_EQ(sim->step_time, plan->pipeline->predicted_step_s) << zero;
  }
}

TEST_F(PipelineTest, ZeroOneCheckpointsHoldTheWholeState) {
  auto plan = compile(gpt(), training("adamw:lr=0.01"), 1, 2, Schedule::k1F1B, 2, 1);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  const auto state = expect_resume_is_bitwise(*plan, "ZeRO-1");
  // The checkpoint holds full moments (put together from the shards).
  EXPECT_EQ(state.at("wte.adam_m").type, plan->graph.tensor(*plan->graph.find_tensor("wte")).type);
}

// Three replicas: the ring, the tree and recursive doubling (with the fold)
// add in different orders, so the plan's groups all add in one of them;
// every pipeline depth, and ZeRO-1, then gives the same bits.
TEST_F(PipelineTest, ThreeReplicasGiveTheSameBitsAtEveryDepth) {
  zoo::MlpOptions o;
  o.batch = 12;
  o.input = 12;
  o.hidden = {16, 16, 16};
  o.classes = 5;
  const Graph forward = *zoo::make_mlp(o);
  const auto options = training();
  const TrainRun want = reference(forward, options);
  for (int M : {1, 2}) {
    const TrainRun flat = pipelined(forward, options, 1, M, Schedule::k1F1B, 3);
    expect_close(flat, want, 1e-5, str_cat("dp=3 pp=1 M=", M));
    expect_bitwise(pipelined(forward, options, 2, M, Schedule::k1F1B, 3), flat,
                   str_cat("dp=3 pp=2 vs pp=1, M=", M));
    expect_bitwise(pipelined(forward, options, 4, M, Schedule::kGPipe, 3), flat,
                   str_cat("dp=3 pp=4 vs pp=1, M=", M));
    expect_bitwise(pipelined(forward, options, 2, M, Schedule::k1F1B, 3, 1), flat,
                   str_cat("dp=3 pp=2 zero1 vs pp=1, M=", M));
  }
}

TEST_F(PipelineTest, ZeroOneThatShardsNothingIsRefused) {
  // With clipping and tensor parallelism every update reads a clipped
  // gradient summed over pieces, which ZeRO-1 does not shard yet: a clear
  // error instead of a plain data-parallel plan.
  auto plan = compile(gpt(), training("adamw:lr=0.01,clip=1"), 1, 1, Schedule::k1F1B, 2, 1, 2);
  ASSERT_FALSE(plan.is_ok());
  EXPECT_NE(plan.status().message().find("--zero 1: no optimizer update can run on shards"),
            std::string::npos)
      << plan.status().message();
}

// ZeRO-1 (and 2) with clipping: the clipped gradient and its update run on the
// shard, each shard's sum of squares is summed over the replicas for the norm;
// the result is one device's within 1e-5 (AdamW's weights within 1e-4: Adam
// divides by the root of tiny second moments, which amplifies the last bits
// of a sum taken in another order, as it does for plain data parallelism),
// at every depth, and the state is held as shards.
TEST_F(PipelineTest, ZeroWithClippingMatchesOneDevice) {
  for (const char *optimizer : {"adamw:lr=0.01,clip=0.05", "sgd:lr=0.1,momentum=0.9,clip=0.05"}) {
    const bool adam = std::string_view(optimizer).starts_with("adam");
    const auto options = training(optimizer);
    for (const Graph &forward : {mlp(), gpt()}) {
      const TrainRun want = reference(forward, options);
      for (const auto &[stages, zero] : std::vector<std::pair<int, int>>{{1, 1}, {2, 1}, {2, 2}}) {
        auto plan = compile(forward, options, stages, 2, Schedule::k1F1B, 2, zero);
        ASSERT_TRUE(plan.is_ok()) << plan.status().message();
        size_t sharded = 0, shard_sums = 0;
        for (const auto &program : plan->programs) {
          sharded += program.sharded_holds.size();
          for (const auto &instr : program.instructions)
            shard_sums += instr.kind == serialization::InstrKind::kComputeShard &&
                          plan->graph.node(instr.index).op == "SumOfSquares";
        }
        EXPECT_GT(sharded, 0u) << optimizer;
        EXPECT_GT(shard_sums, 0u) << optimizer;
        const TrainRun got = run_plan(*plan);
        const std::string what = str_cat(optimizer, " pp=", stages, " dp=2 zero", zero);
        expect_close(got, want, adam ? 1e-4 : 1e-5, what);
        ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
        for (size_t k = 0; k < want.losses.size(); ++k)
          EXPECT_NEAR(got.losses[k], want.losses[k], 1e-5 * std::abs(want.losses[k])) << what;
      }
    }
  }
}

// A ZeRO-2 plan's shape: on every device each sharded gradient is
// reduce-scattered into its shard once per micro-batch and summed no other
// way (no accumulation of it, no collective or bucket of it at the step).
void expect_zero_two_plan(const serialization::Plan &plan, const std::string &what) {
  using serialization::InstrKind;
  ASSERT_EQ(plan.pipeline->zero, 2) << what;
  size_t scattered = 0;
  for (const auto &program : plan.programs) {
    std::map<TensorId, int> per_tensor;
    for (const auto &instr : program.instructions)
      if (instr.kind == InstrKind::kReduceScatterAccumulate) ++per_tensor[instr.index];
    scattered += per_tensor.size();
    for (const auto &[t, count] : per_tensor) {
      EXPECT_EQ(count, plan.pipeline->microbatches) << what << ": " << plan.graph.tensor(t).name;
      for (const auto &instr : program.instructions) {
        const bool other_sum = instr.index == t && (instr.kind == InstrKind::kAccumulate ||
                                                    instr.kind == InstrKind::kAllReduce ||
                                                    instr.kind == InstrKind::kReduceScatter);
        EXPECT_FALSE(other_sum) << what << ": " << plan::describe_instruction(plan.graph, instr);
      }
      for (const auto &bucket : program.buckets) {
        EXPECT_FALSE(bucket.reduce_scatter) << what;
        EXPECT_EQ(std::count(bucket.tensors.begin(), bucket.tensors.end(), t), 0) << what;
      }
    }
  }
  EXPECT_GT(scattered, 0u) << what;
}

// ZeRO-2: each micro-batch's sharded gradients are reduce-scattered as soon as
// backward computes them and every replica sums only its shard, so the sums
// over the replicas come before those over the micro-batches: the losses and
// weights are plain data parallelism's within 1e-6 (with one micro-batch and
// two replicas the sums are ZeRO-1's, so its bits), for 2 and 4 replicas,
// with and without a stage split, with SGD-momentum and AdamW. Adam turns
// rounding noise in gradients that are zero in exact arithmetic (the GPT's
// key bias: softmax ignores a shift) into +-lr steps, so the GPT trains with
// AdamW on one micro-batch, where the sums are the same.
TEST_F(PipelineTest, ZeroTwoMatchesDataParallel) {
  struct Case {
    bool gpt;
    const char *optimizer;
    int dp, stages, microbatches;
  };
  const char *adamw = "adamw:lr=0.01,wd=0.1", *sgd = "sgd:lr=0.1,momentum=0.9";
  std::vector<Case> cases;
  for (const char *optimizer : {adamw, sgd}) {
    for (int stages : {1, 2})
      for (int microbatches : {1, 2})
        cases.push_back({false, optimizer, 2, stages, microbatches});
    cases.push_back({false, optimizer, 4, 1, 4});
    cases.push_back({false, optimizer, 4, 2, 2});
  }
  for (int stages : {1, 2}) {
    cases.push_back({true, sgd, 2, stages, 2});
    cases.push_back({true, adamw, 2, stages, 1});
  }
  cases.push_back({true, sgd, 4, 1, 2});
  for (const Case &c : cases) {
    const Graph forward = c.gpt ? gpt() : mlp();
    const auto options = training(c.optimizer);
    const std::string what = str_cat(forward.name(), " ", c.optimizer, " dp=", c.dp,
                                     " pp=", c.stages, " M=", c.microbatches);
    auto plan = compile(forward, options, c.stages, c.microbatches, Schedule::k1F1B, c.dp, 2);
    ASSERT_TRUE(plan.is_ok()) << what << ": " << plan.status().message();
    expect_zero_two_plan(*plan, what);
    const TrainRun zero = run_plan(*plan);
    const TrainRun plain =
        pipelined(forward, options, c.stages, c.microbatches, Schedule::k1F1B, c.dp, 0);
    expect_close(zero, plain, 1e-6, what + " zero2 vs zero0");
    if (c.microbatches == 1 && c.dp == 2) {
      const TrainRun one =
          pipelined(forward, options, c.stages, c.microbatches, Schedule::k1F1B, c.dp, 1);
      expect_bitwise(zero, one, what + " zero2 vs zero1");
    }
  }
}

// ZeRO-2's memory plan: a sharded gradient's whole buffer lives only from its
// producer to its reduce-scatter in each micro-batch, its sum is a shard of
// 1/DP of it, and each update is applied as soon as its values are final, so
// with micro-batches every device needs less than under ZeRO-1, which needs
// no more than plain data parallelism (the activation arena plus what the
// device holds). With one micro-batch the plan as a whole needs less, and a
// device at most one shard more (its last gradient whole beside its shard).
TEST_F(PipelineTest, ZeroTwoNeedsLessMemoryThanZeroOne) {
  for (const Graph &forward : {mlp(), gpt()})
    for (const char *optimizer : {"adamw:lr=0.01", "sgd:lr=0.1,momentum=0.9"})
      for (int stages : {1, 2})
        for (int microbatches : {1, 2}) {
          const auto options = training(optimizer);
          const std::string what =
              str_cat(forward.name(), " ", optimizer, " pp=", stages, " M=", microbatches, " dp=2");
          std::vector<serialization::Plan> plans;
          for (int zero : {0, 1, 2}) {
            auto plan = compile(forward, options, stages, microbatches, Schedule::k1F1B, 2, zero);
            ASSERT_TRUE(plan.is_ok())
                << what << " zero " << zero << ": " << plan.status().message();
            plans.push_back(std::move(plan).value());
          }
          expect_zero_two_plan(plans[2], what);
          int64_t total_one = 0, total_two = 0;
          for (size_t d = 0; d < plans[0].programs.size(); ++d) {
            const int64_t none = plan::device_memory(plans[0], d),
                          one = plan::device_memory(plans[1], d),
                          two = plan::device_memory(plans[2], d);
            total_one += one;
            total_two += two;
            EXPECT_LE(one, none) << what << " device " << d;
            if (microbatches > 1) {
              EXPECT_LT(two, one) << what << " device " << d;
              EXPECT_LT(plans[2].programs[d].arena_bytes, plans[1].programs[d].arena_bytes)
                  << what << " device " << d;
              continue;
            }
            // One micro-batch: a stage whose peak is its last gradient holds it
            // whole and its shard at once, so it may need up to that shard more.
            int64_t shard = 0;
            for (const auto &instr : plans[2].programs[d].instructions)
              if (instr.kind == serialization::InstrKind::kReduceScatterAccumulate)
                shard = std::max(shard, plans[2].graph.tensor(instr.index).type.size_bytes() / 2);
            EXPECT_LE(two, one + shard) << what << " device " << d;
          }
          EXPECT_LT(total_two, total_one) << what;
        }
  // The runner allocates what the plan says.
  auto plan = compile(gpt(), training("adamw:lr=0.01"), 2, 2, Schedule::k1F1B, 2, 2);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  auto runner = PipelineRunner::create(*plan);
  ASSERT_TRUE(runner.is_ok()) << runner.status().message();
  const auto allocations = (*runner)->allocations();
  for (size_t d = 0; d < plan->programs.size(); ++d) {
    EXPECT_EQ(allocations[d].arena, plan->programs[d].arena_bytes) << "device " << d;
    EXPECT_EQ(allocations[d].arena + allocations[d].held, plan::device_memory(*plan, d))
        << "device " << d;
  }
}

// ZeRO-2 without optimizer state (plain SGD): only the gradients are sharded.
// With the interleaved schedule: every chunk's gradients, every micro-batch.
TEST_F(PipelineTest, ZeroTwoShardsGradientsWithoutStateAndInterleaved) {
  const auto plain_sgd = training("sgd:lr=0.1");
  auto plan = compile(mlp(), plain_sgd, 1, 2, Schedule::k1F1B, 2, 2);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  for (const auto &program : plan->programs)
    EXPECT_TRUE(program.sharded_holds.empty());
  expect_zero_two_plan(*plan, "plain sgd");
  expect_close(run_plan(*plan), pipelined(mlp(), plain_sgd, 1, 2, Schedule::k1F1B, 2, 0), 1e-6,
               "plain sgd zero2 vs zero0");
  // ZeRO-1 has nothing to shard there.
  EXPECT_FALSE(compile(mlp(), plain_sgd, 1, 2, Schedule::k1F1B, 2, 1).is_ok());

  partitioner::PipelineCompileOptions interleaved;
  interleaved.stages = 2;
  interleaved.microbatches = 2;
  interleaved.data_parallel = 2;
  interleaved.schedule = Schedule::kInterleaved;
  interleaved.chunks = 2;
  const auto options = training();
  interleaved.zero = 2;
  auto sharded = partitioner::compile_pipeline(gpt(), options, interleaved);
  ASSERT_TRUE(sharded.is_ok()) << sharded.status().message();
  expect_zero_two_plan(*sharded, "gpt interleaved");
  interleaved.zero = 0;
  auto plain = partitioner::compile_pipeline(gpt(), options, interleaved);
  ASSERT_TRUE(plain.is_ok()) << plain.status().message();
  expect_close(run_plan(*sharded), run_plan(*plain), 1e-6, "gpt interleaved zero2 vs zero0");
}

TEST_F(PipelineTest, ZeroTwoCheckpointsResumeBitwise) {
  auto plan = compile(gpt(), training("adamw:lr=0.01"), 2, 2, Schedule::k1F1B, 2, 2);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  const auto state = expect_resume_is_bitwise(*plan, "ZeRO-2");
  // The checkpoint holds full moments (put together from the shards).
  EXPECT_EQ(state.at("wte.adam_m").type, plan->graph.tensor(*plan->graph.find_tensor("wte")).type);
}

// A ZeRO-3 plan's shape: every device gathers some parameter it holds as its
// shard, each at most once per block, and no all-gather of a new value
// follows the update of a gathered parameter.
void expect_zero_three_plan(const serialization::Plan &plan, const std::string &what) {
  using serialization::InstrKind;
  ASSERT_EQ(plan.pipeline->zero, 3) << what;
  for (const auto &program : plan.programs) {
    std::set<std::pair<TensorId, int32_t>> blocks;
    std::set<TensorId> gathered;
    for (const auto &instr : program.instructions) {
      if (!serialization::fills_gathered(instr.kind)) continue;
      EXPECT_TRUE(blocks.insert({instr.index, instr.microbatch}).second)
          << what << ": " << plan::describe_instruction(plan.graph, instr);
      gathered.insert(instr.index);
      EXPECT_TRUE(std::binary_search(program.sharded_holds.begin(), program.sharded_holds.end(),
                                     instr.index))
          << what << ": " << plan.graph.tensor(instr.index).name;
    }
    EXPECT_FALSE(gathered.empty()) << what << " device " << program.device;
    for (const auto &instr : program.instructions) {
      if (instr.kind != InstrKind::kAllGather) continue;
      const NodeId producer = plan.graph.tensor(instr.index).producer;
      ASSERT_NE(producer, kNoNode) << what;
      EXPECT_FALSE(gathered.contains(plan.graph.node(producer).inputs[0]))
          << what << ": " << plan::describe_instruction(plan.graph, instr);
    }
  }
}

// ZeRO-3: parameters held as shards and gathered whole before each block
// that reads them; the gathered values are the parameters' own bits and the
// gradients go as in ZeRO-2, so the run is ZeRO-2's, bit for bit, and plain
// data parallelism's within 1e-6, for 2 and 4 replicas, one and two
// micro-batches and stages, SGD-momentum and AdamW.
TEST_F(PipelineTest, ZeroThreeMatchesZeroTwoBitwise) {
  struct Case {
    bool gpt;
    const char *optimizer;
    int dp, stages, microbatches;
  };
  const char *adamw = "adamw:lr=0.01,wd=0.1", *sgd = "sgd:lr=0.1,momentum=0.9";
  std::vector<Case> cases;
  for (const char *optimizer : {adamw, sgd}) {
    for (int stages : {1, 2})
      for (int microbatches : {1, 2})
        cases.push_back({false, optimizer, 2, stages, microbatches});
    cases.push_back({false, optimizer, 4, 1, 2});
    cases.push_back({false, optimizer, 4, 2, 1});
  }
  cases.push_back({true, sgd, 2, 2, 2});
  cases.push_back({true, adamw, 2, 1, 1});
  for (const Case &c : cases) {
    const Graph forward = c.gpt ? gpt() : mlp();
    const auto options = training(c.optimizer);
    const std::string what = str_cat(forward.name(), " ", c.optimizer, " dp=", c.dp,
                                     " pp=", c.stages, " M=", c.microbatches);
    auto plan = compile(forward, options, c.stages, c.microbatches, Schedule::k1F1B, c.dp, 3);
    ASSERT_TRUE(plan.is_ok()) << what << ": " << plan.status().message();
    expect_zero_three_plan(*plan, what);
    const TrainRun three = run_plan(*plan);
    const TrainRun two =
        pipelined(forward, options, c.stages, c.microbatches, Schedule::k1F1B, c.dp, 2);
    expect_bitwise(three, two, what + " zero3 vs zero2");
    const TrainRun plain =
        pipelined(forward, options, c.stages, c.microbatches, Schedule::k1F1B, c.dp, 0);
    expect_close(three, plain, 1e-6, what + " zero3 vs zero0");
  }
}

// ZeRO-3 prefetch: every gather but the first run's is started on the
// communication stream before a compute that comes ahead of its wait, and
// the training is bitwise that of gathering each right before its reader,
// for one more layer's parameters in the arena at most.
TEST_F(PipelineTest, ZeroThreePrefetchOverlapsAndKeepsTheBits) {
  using serialization::InstrKind;
  for (int stages : {1, 2}) {
    const std::string what = str_cat("gpt pp=", stages);
    auto options = training("adamw:lr=0.01");
    partitioner::PipelineCompileOptions pipeline;
    pipeline.zero = 3;
    pipeline.stages = stages;
    pipeline.data_parallel = 2;
    pipeline.microbatches = 2;
    auto prefetched = partitioner::compile_pipeline(gpt(), options, pipeline);
    pipeline.prefetch = false;
    auto blocking = partitioner::compile_pipeline(gpt(), options, pipeline);
    ASSERT_TRUE(prefetched.is_ok() && blocking.is_ok()) << what;
    for (const auto &program : prefetched->programs) {
      size_t starts = 0, overlapped = 0, plain = 0;
      std::map<std::pair<TensorId, int32_t>, size_t> started;
      bool computed = false;
      for (size_t i = 0; i < program.instructions.size(); ++i) {
        const auto &instr = program.instructions[i];
        const std::pair<TensorId, int32_t> key{instr.index, instr.microbatch};
        if (instr.kind == InstrKind::kGatherParam) ++plain;
        if (instr.kind == InstrKind::kStartGather) {
          ++starts;
          started[key] = i;
        }
        if (instr.kind == InstrKind::kWaitGather) {
          ASSERT_TRUE(started.contains(key)) << what << " instruction " << i;
          for (size_t k = started[key]; k < i; ++k)
            computed = computed || program.instructions[k].kind == InstrKind::kCompute;
          if (computed) ++overlapped;
          computed = false;
        }
      }
      EXPECT_EQ(plain, 0u) << what;
      EXPECT_GT(starts, 0u) << what;
      // The first batch (one task of the stream: consecutive StartGathers)
      // is started alone, and the second right after the first run's waits:
      // the first wait does not wait for two batches.
      const auto &instrs = program.instructions;
      size_t i = 0;
      while (i < instrs.size() && instrs[i].kind != InstrKind::kStartGather)
        ++i;
      while (i < instrs.size() && instrs[i].kind == InstrKind::kStartGather)
        ++i;
      ASSERT_LT(i, instrs.size()) << what;
      EXPECT_EQ(instrs[i].kind, InstrKind::kWaitGather) << what;
      while (i < instrs.size() && instrs[i].kind == InstrKind::kWaitGather)
        ++i;
      ASSERT_LT(i, instrs.size()) << what;
      EXPECT_EQ(instrs[i].kind, InstrKind::kStartGather) << what << ": the second batch";
      const auto d = static_cast<size_t>(program.device);
      EXPECT_GE(plan::device_memory(*prefetched, d), plan::device_memory(*blocking, d)) << what;
    }
    for (const auto &program : blocking->programs)
      for (const auto &instr : program.instructions)
        EXPECT_NE(instr.kind, InstrKind::kStartGather) << what;
    expect_bitwise(run_plan(*prefetched), run_plan(*blocking), what + " prefetch vs none");
    // The stream gathers while the device computes: the trace shows it.
    PipelineRunnerOptions traced;
    traced.trace = true;
    std::unique_ptr<Trainer> keep;
    run_plan(*prefetched, traced, &keep);
    ASSERT_TRUE(keep);
    const auto *runner = dynamic_cast<const PipelineRunner *>(&keep->runner());
    ASSERT_NE(runner, nullptr);
    for (size_t d = 0; d < prefetched->programs.size(); ++d) {
      size_t gathers_on_stream = 0;
      for (const plan::TraceSpan &span : runner->spans()[d])
        if (span.stream &&
            prefetched->programs[d].instructions[span.instruction].kind == InstrKind::kStartGather)
          ++gathers_on_stream;
      EXPECT_GT(gathers_on_stream, 0u) << what << " device " << d;
    }
  }
}

// ZeRO-3's memory: each device holds 1/DP of its sharded parameters and the
// arena adds only the gathered buffers live at once (one layer's, around its
// use), so every device needs less than under ZeRO-2, and the runner
// allocates what the plan says.
TEST_F(PipelineTest, ZeroThreeNeedsLessMemoryThanZeroTwo) {
  for (const Graph &forward : {mlp(), gpt()})
    for (const char *optimizer : {"adamw:lr=0.01", "sgd:lr=0.1,momentum=0.9"})
      for (int dp : {2, 4})
        for (int microbatches : {1, 2}) {
          const auto options = training(optimizer);
          const std::string what =
              str_cat(forward.name(), " ", optimizer, " M=", microbatches, " dp=", dp);
          auto two = compile(forward, options, 1, microbatches, Schedule::k1F1B, dp, 2);
          ASSERT_TRUE(two.is_ok()) << what << ": " << two.status().message();
          auto three = compile(forward, options, 1, microbatches, Schedule::k1F1B, dp, 3);
          ASSERT_TRUE(three.is_ok()) << what << ": " << three.status().message();
          int64_t total_two = 0, total_three = 0;
          for (size_t d = 0; d < three->programs.size(); ++d) {
            const int64_t bytes_two = plan::device_memory(*two, d),
                          bytes_three = plan::device_memory(*three, d);
            EXPECT_LT(bytes_three, bytes_two) << what << " device " << d;
            total_two += bytes_two;
            total_three += bytes_three;
          }
          EXPECT_LT(total_three, total_two) << what;
        }
  auto plan = compile(gpt(), training("adamw:lr=0.01"), 1, 2, Schedule::k1F1B, 2, 3);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  auto runner = PipelineRunner::create(*plan);
  ASSERT_TRUE(runner.is_ok()) << runner.status().message();
  const auto allocations = (*runner)->allocations();
  for (size_t d = 0; d < plan->programs.size(); ++d) {
    EXPECT_EQ(allocations[d].arena, plan->programs[d].arena_bytes) << "device " << d;
    EXPECT_EQ(allocations[d].arena + allocations[d].held, plan::device_memory(*plan, d))
        << "device " << d;
  }
}

// A ZeRO-3 checkpoint holds whole parameters (joined from the shards) and
// resuming cuts them into shards again: bitwise.
TEST_F(PipelineTest, ZeroThreeCheckpointsResumeBitwise) {
  auto plan = compile(gpt(), training("adamw:lr=0.01"), 2, 2, Schedule::k1F1B, 2, 3);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  expect_zero_three_plan(*plan, "gpt zero3");
  const auto state = expect_resume_is_bitwise(*plan, "ZeRO-3");
  for (const auto &program : plan->programs)
    for (TensorId t : program.sharded_holds) {
      const Tensor &tensor = plan->graph.tensor(t);
      if (tensor.kind != TensorKind::kParameter) continue;
      ASSERT_TRUE(state.contains(tensor.name)) << tensor.name;
      EXPECT_EQ(state.at(tensor.name).type, tensor.type) << tensor.name;
    }
}

TEST_F(PipelineTest, DataParallelPlansAreCheckedForMissingCollectives) {
  // Without buckets: one blocking all-reduce per gradient.
  auto plan = compile(mlp(), training(), 2, 2, Schedule::k1F1B, 2, 0, 1, false, 0);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  ASSERT_EQ(plan->programs.size(), 4u);
  ASSERT_EQ(plan->pipeline->groups.size(), 2u);
  EXPECT_EQ(plan->pipeline->groups[0], (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(plan->pipeline->groups[1], (std::vector<int32_t>{2, 3}));
  // Each group reduces with the algorithm the cost model prices lowest.
  ASSERT_EQ(plan->pipeline->group_algorithms.size(), 2u);
  for (const std::string &algorithm : plan->pipeline->group_algorithms) {
    EXPECT_TRUE(algorithm == "ring" || algorithm == "tree" || algorithm == "recursive-doubling" ||
                algorithm == "rabenseifner")
        << algorithm;
  }
  auto is_all_reduce = [](const auto &i) { return i.kind == serialization::InstrKind::kAllReduce; };
  // Replica 1 of stage 0 (device 1) skips its first all-reduce: its second one
  // meets device 0's first, a different tensor.
  auto broken = plan->programs;
  auto &instrs = broken[1].instructions;
  instrs.erase(std::find_if(instrs.begin(), instrs.end(), is_all_reduce));
  Status status = plan::check_deadlock(plan->graph, broken, plan->pipeline->groups);
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("mismatched collective: device 1 instruction"), std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find("from device 0 as collective number 0 of group 0"),
            std::string::npos)
      << status.message();
  // Device 1 skips its last all-reduce: device 0 waits for it forever.
  broken = plan->programs;
  auto &last = broken[1].instructions;
  last.erase(std::find_if(last.rbegin(), last.rend(), is_all_reduce).base() - 1);
  status = plan::check_deadlock(plan->graph, broken, plan->pipeline->groups);
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("deadlock: device 0 instruction"), std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find("device 1 of the group has finished without it"),
            std::string::npos)
      << status.message();
}

// Four replicas (a power of two: recursive doubling and halving fold
// nothing): each algorithm forced on every group trains to the ring's weights
// within 1e-6 (the sums associate differently); recursive doubling and
// Rabenseifner add along the same tree, so they agree bitwise, with ZeRO-1
// (recursive-halving reduce-scatters) and with buckets too. The compiler's own
// choice gives the same bits at every pipeline depth.
TEST_F(PipelineTest, FourReplicasTrainAlikeWithEveryAlgorithm) {
  zoo::MlpOptions o;
  o.batch = 16;
  o.input = 12;
  o.hidden = {16, 16};
  o.classes = 8; // every size divisible by 4: ZeRO-1 shards all of them
  const Graph forward = *zoo::make_mlp(o);
  const auto options = training();
  auto forced = [&](const char *algorithm, int zero, int64_t bucket_bytes) {
    auto plan = compile(forward, options, 1, 2, Schedule::k1F1B, 4, zero, 1, false, bucket_bytes);
    EXPECT_TRUE(plan.is_ok()) << plan.status().message();
    if (!plan.is_ok()) return TrainRun{};
    EXPECT_EQ(plan->pipeline->group_algorithms.size(), 1u);
    for (auto &name : plan->pipeline->group_algorithms)
      name = algorithm;
    return run_plan(*plan);
  };
  const TrainRun ring = forced("ring", 0, 0);
  ASSERT_EQ(ring.losses.size(), static_cast<size_t>(kSteps));
  expect_close(ring, reference(forward, options), 1e-5, "dp=4 ring vs the full-batch trainer");
  for (int zero : {0, 1})
    for (int64_t bucket_bytes : {int64_t{0}, int64_t{512}}) {
      const std::string what = str_cat("dp=4 zero=", zero, " bucket_bytes=", bucket_bytes);
      const TrainRun tree = forced("tree", zero, bucket_bytes);
      const TrainRun doubling = forced("recursive-doubling", zero, bucket_bytes);
      const TrainRun rabenseifner = forced("rabenseifner", zero, bucket_bytes);
      expect_close(tree, ring, 1e-6, what + ": tree vs ring");
      expect_close(doubling, ring, 1e-6, what + ": recursive-doubling vs ring");
      expect_close(rabenseifner, ring, 1e-6, what + ": rabenseifner vs ring");
      expect_bitwise(rabenseifner, doubling, what + ": rabenseifner vs recursive-doubling");
    }
  expect_bitwise(pipelined(forward, options, 2, 2, Schedule::k1F1B, 4),
                 pipelined(forward, options, 1, 2, Schedule::k1F1B, 4),
                 "dp=4 pp=2 vs pp=1, the compiler's choice");
}

// The compiler picks each data-parallel group's algorithm by the cost model:
// with four replicas, recursive doubling (lg p steps) where latency dominates
// and Rabenseifner (the ring's bandwidth in 2 lg p steps) where bytes do.
TEST_F(PipelineTest, TheCompilerPicksEachGroupsAlgorithmByTheCostModel) {
  const std::vector<std::pair<double, std::string>> cases = {{1e-3, "recursive-doubling"},
                                                             {1e-9, "rabenseifner"}};
  for (const auto &[latency, want] : cases) {
    partitioner::PipelineCompileOptions pipeline;
    pipeline.stages = 2;
    pipeline.data_parallel = 4;
    pipeline.microbatches = 2;
    pipeline.bucket_bytes = 0;
    partitioner::ClusterSpec cluster = partitioner::default_cpu_cluster(8);
    cluster.intra_node.latency_s = latency;
    pipeline.cluster = cluster;
    auto plan = partitioner::compile_pipeline(mlp(), training(), pipeline);
    ASSERT_TRUE(plan.is_ok()) << plan.status().message();
    ASSERT_EQ(plan->pipeline->group_algorithms.size(), 2u);
    for (const std::string &algorithm : plan->pipeline->group_algorithms) {
      EXPECT_EQ(algorithm, want) << "latency " << latency << " s";
    }
  }
}

// Gradient buckets: reduced on a communication stream while backward goes on,
// with the same bits as reducing each gradient alone, for every algorithm.
TEST_F(PipelineTest, GradientBucketsOverlapBackwardAndKeepTheBits) {
  zoo::MlpOptions o;
  o.batch = 12;
  o.input = 12;
  // Sizes 3 does not divide (16 x 5, 16): the ring's chunks of a packed
  // bucket are not an even split of it.
  o.hidden = {16, 16, 16};
  o.classes = 5;
  const Graph odd = *zoo::make_mlp(o);
  o.hidden = {12, 12, 12};
  o.classes = 6; // every size divisible by 2 and 3: ZeRO-1 shards all of them
  const Graph even = *zoo::make_mlp(o);
  const auto options = training("adamw:lr=0.01");
  // 512-byte buckets: several per device (a layer's weight is 576 to 1024 bytes).
  constexpr int64_t kSmall = 512;
  for (const auto &[dp, pp, zero] :
       std::vector<std::tuple<int, int, int>>{{2, 1, 0}, {2, 2, 0}, {3, 1, 0}, {3, 2, 1}}) {
    const Graph &forward = zero == 1 ? even : odd;
    for (const char *algorithm : {"", "ring", "tree", "recursive-doubling", "rabenseifner"}) {
      const std::string what = str_cat("dp=", dp, " pp=", pp, " zero=", zero, " '", algorithm, "'");
      auto bucketed = compile(forward, options, pp, 2, Schedule::k1F1B, dp, zero, 1, false, kSmall);
      auto plain = compile(forward, options, pp, 2, Schedule::k1F1B, dp, zero, 1, false, 0);
      ASSERT_TRUE(bucketed.is_ok()) << what << ": " << bucketed.status().message();
      ASSERT_TRUE(plain.is_ok()) << what << ": " << plain.status().message();
      for (auto *plan : {&*bucketed, &*plain})
        for (auto &name : plan->pipeline->group_algorithms)
          name = algorithm;
      EXPECT_EQ(bucketed->pipeline->bucket_bytes, kSmall);
      EXPECT_EQ(plain->pipeline->bucket_bytes, 0);
      for (const auto &program : bucketed->programs) {
        ASSERT_GE(program.buckets.size(), 2u) << what;
        const auto &instrs = program.instructions;
        // The first bucket starts before the device's last backward computation,
        // and every bucket is waited for before its tensors are scaled.
        size_t first_start = instrs.size(), last_compute = 0;
        for (size_t i = 0; i < instrs.size(); ++i) {
          if (instrs[i].kind == serialization::InstrKind::kStartBucket)
            first_start = std::min(first_start, i);
          if (instrs[i].kind == serialization::InstrKind::kCompute && instrs[i].microbatch == 1)
            last_compute = i;
          if (instrs[i].kind == serialization::InstrKind::kScale) {
            bool waited = false;
            for (size_t j = 0; j < i && !waited; ++j)
              if (instrs[j].kind == serialization::InstrKind::kWaitBucket)
                for (TensorId t : program.buckets[instrs[j].index].tensors)
                  waited = waited || t == instrs[i].index;
            EXPECT_TRUE(waited) << what << ": device " << program.device << " scales '"
                                << bucketed->graph.tensor(instrs[i].index).name
                                << "' before its bucket is reduced";
          }
          EXPECT_NE(instrs[i].kind, serialization::InstrKind::kAllReduce) << what;
        }
        EXPECT_LT(first_start, last_compute) << what << ": device " << program.device;
        if (zero == 1) {
          bool scatters = false;
          for (const auto &bucket : program.buckets)
            scatters = scatters || bucket.reduce_scatter;
          EXPECT_TRUE(scatters) << what;
        }
      }
      expect_bitwise(run_plan(*bucketed), run_plan(*plain), what + ": buckets vs none");
    }
  }
}

// The simulator runs buckets on a stream of their own: on slow links the
// bucketed plan is predicted faster than reducing after backward, and a
// bucket one replica never starts is a named deadlock.
TEST_F(PipelineTest, GradientBucketsArePredictedAndChecked) {
  partitioner::PipelineCompileOptions pipeline;
  pipeline.stages = 1;
  pipeline.data_parallel = 2;
  pipeline.microbatches = 1; // buckets overlap the last micro-batch's backward: all of it
  pipeline.bucket_bytes = 4096;
  partitioner::ClusterSpec cluster = partitioner::default_cpu_cluster(2);
  cluster.intra_node.bandwidth_Bps = 2e8; // every gradient's sum costs about a layer's backward
  pipeline.cluster = cluster;
  auto bucketed = partitioner::compile_pipeline(gpt(), training(), pipeline);
  pipeline.bucket_bytes = 0;
  auto plain = partitioner::compile_pipeline(gpt(), training(), pipeline);
  ASSERT_TRUE(bucketed.is_ok()) << bucketed.status().message();
  ASSERT_TRUE(plain.is_ok()) << plain.status().message();
  EXPECT_LT(bucketed->pipeline->predicted_step_s, 0.9 * plain->pipeline->predicted_step_s)
      << bucketed->pipeline->predicted_step_s << " vs " << plain->pipeline->predicted_step_s;

  const auto &groups = bucketed->pipeline->groups;
  auto is_start = [](const auto &i) { return i.kind == serialization::InstrKind::kStartBucket; };
  auto is_wait = [](const auto &i) { return i.kind == serialization::InstrKind::kWaitBucket; };
  // Device 1 never starts its last bucket (and never waits for it): device 0
  // waits for it forever.
  auto broken = bucketed->programs;
  auto &instrs = broken[1].instructions;
  instrs.erase(std::find_if(instrs.rbegin(), instrs.rend(), is_wait).base() - 1);
  instrs.erase(std::find_if(instrs.rbegin(), instrs.rend(), is_start).base() - 1);
  Status status = plan::check_deadlock(bucketed->graph, broken, groups);
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("deadlock: device 0 instruction"), std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find("wait for gradient bucket"), std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find("device 1 of the group has finished without starting it"),
            std::string::npos)
      << status.message();
  // Device 1 skips its first start: its second bucket meets device 0's first.
  broken = bucketed->programs;
  broken[1].instructions.erase(
      std::find_if(broken[1].instructions.begin(), broken[1].instructions.end(), is_start));
  status = plan::check_deadlock(bucketed->graph, broken, groups);
  ASSERT_FALSE(status.is_ok());
  EXPECT_TRUE(status.message().find("mismatched gradient bucket") != std::string::npos ||
              status.message().find("waits for a bucket it never started") != std::string::npos)
      << status.message();
}

// A replica that stalls before starting a bucket: the other replica's
// communication stream gives up after the timeout, and the step ends with an
// error naming the bucket instead of hanging.
TEST_F(PipelineTest, StalledBucketEndsTheStepAfterTheTimeout) {
  auto plan = compile(mlp(), training(), 1, 2, Schedule::k1F1B, 2, 0, 1, false, 1024);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  const auto &instrs = plan->programs[1].instructions;
  const size_t start = static_cast<size_t>(
      std::find_if(instrs.begin(), instrs.end(),
                   [](const auto &i) { return i.kind == serialization::InstrKind::kStartBucket; }) -
      instrs.begin());
  ASSERT_LT(start, instrs.size());
  const StalledStep stalled = run_stalled(*plan, 1, start);
  const Status &status = stalled.status;
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("gradient bucket 0"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("timed out"), std::string::npos) << status.message();
  EXPECT_LT(stalled.elapsed, std::chrono::milliseconds(1500 + 2000));
  EXPECT_FALSE(stalled.again.is_ok());
}

TEST_F(PipelineTest, OneFOneBNeedsLessMemoryThanGPipe) {
  // Activations large next to the weights: sequence 64, 16 samples.
  zoo::GptOptions o;
  o.layers = 4;
  o.hidden = 32;
  o.heads = 2;
  o.seq = 64;
  o.vocab = 64;
  o.batch = 16;
  const Graph forward = *zoo::make_gpt(o);
  for (int M : {8, 16}) {
    auto gpipe = compile(forward, training(), 4, M, Schedule::kGPipe);
    auto one_f_one_b = compile(forward, training(), 4, M, Schedule::k1F1B);
    ASSERT_TRUE(gpipe.is_ok()) << gpipe.status().message();
    ASSERT_TRUE(one_f_one_b.is_ok()) << one_f_one_b.status().message();
    // GPipe keeps every micro-batch's activations until its backward; 1F1B keeps
    // at most P - s on stage s, so stage 0 holds 4 instead of M.
    EXPECT_GT(gpipe->programs[0].arena_bytes, one_f_one_b->programs[0].arena_bytes * 3 / 2)
        << "M=" << M;
    for (size_t d = 0; d < 4; ++d)
      EXPECT_LE(one_f_one_b->programs[d].arena_bytes, gpipe->programs[d].arena_bytes)
          << "M=" << M << " device " << d;
    // The runner allocates exactly the planned arenas, and holds what the
    // plan says each device needs besides.
    auto runner = PipelineRunner::create(*one_f_one_b);
    ASSERT_TRUE(runner.is_ok());
    const auto allocations = (*runner)->allocations();
    ASSERT_EQ(allocations.size(), 4u);
    for (size_t d = 0; d < 4; ++d) {
      EXPECT_EQ((*runner)->arena_bytes()[d], one_f_one_b->programs[d].arena_bytes);
      EXPECT_EQ(allocations[d].arena, one_f_one_b->programs[d].arena_bytes) << "device " << d;
      EXPECT_EQ(allocations[d].arena + allocations[d].held, plan::device_memory(*one_f_one_b, d))
          << "device " << d;
    }
  }
}

TEST_F(PipelineTest, ScheduleShapes) {
  auto plan = compile(mlp(), training(), 4, 8, Schedule::k1F1B);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  auto phases = *plan::analyze_phases(plan->graph, 8);
  // The sequence of (forward?, micro-batch) blocks device d runs.
  for (int d = 0; d < 4; ++d) {
    std::vector<std::pair<bool, int>> blocks;
    for (const auto &instr : plan->programs[static_cast<size_t>(d)].instructions) {
      if (instr.kind != serialization::InstrKind::kCompute || instr.microbatch < 0) continue;
      const bool forward = phases.node_phase[instr.index] == plan::Phase::kForward;
      if (blocks.empty() || blocks.back() != std::pair{forward, instr.microbatch})
        blocks.push_back({forward, instr.microbatch});
    }
    // Warm-up P - 1 - d forwards, then one forward one backward, then the rest.
    std::vector<std::pair<bool, int>> want;
    const int warmup = 3 - d;
    for (int k = 0; k < warmup; ++k)
      want.push_back({true, k});
    for (int k = 0; k + warmup < 8; ++k) {
      want.push_back({true, k + warmup});
      want.push_back({false, k});
    }
    for (int k = 8 - warmup; k < 8; ++k)
      want.push_back({false, k});
    EXPECT_EQ(blocks, want) << "device " << d;
  }
  EXPECT_GT(plan->pipeline->predicted_step_s, 0);
  // With equal stages the bubble is about (p - 1) / (m + p - 1) = 3 / 11.
  EXPECT_GT(plan->pipeline->predicted_bubble, 0.1);
  EXPECT_LT(plan->pipeline->predicted_bubble, 0.6);
}

TEST_F(PipelineTest, DeadlockCheckNamesBothSides) {
  auto plan = compile(mlp(), training(), 2, 2, Schedule::k1F1B);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  ASSERT_TRUE(plan::check_deadlock(plan->graph, plan->programs).is_ok());

  // Device 0 sends its first activation only at the very end: device 1 waits
  // for it while device 0 waits for a gradient device 1 cannot produce.
  auto broken = plan->programs;
  auto &instrs = broken[0].instructions;
  auto send = std::find_if(instrs.begin(), instrs.end(),
                           [](const auto &i) { return i.kind == serialization::InstrKind::kSend; });
  ASSERT_NE(send, instrs.end());
  auto moved = *send;
  instrs.erase(send);
  instrs.push_back(moved);
  Status status = plan::check_deadlock(plan->graph, broken);
  ASSERT_FALSE(status.is_ok());
  // Device 0 waits for a gradient from device 1, which waits for the activation
  // device 0 now sends last. The report follows the waits to device 1's receive
  // and names both devices, both instructions and the tensor.
  EXPECT_NE(status.message().find(str_cat("deadlock: device 1 instruction 0 (recv '",
                                          plan->graph.tensor(moved.index).name,
                                          "' mb 0 from device 0) waits forever")),
            std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find(str_cat("device 0 sends it only at instruction ",
                                          instrs.size() - 1, " but is blocked at instruction")),
            std::string::npos)
      << status.message();

  // Programs out of device order are refused, not run against the wrong peers.
  auto swapped = plan->programs;
  std::swap(swapped[0], swapped[1]);
  status = plan::check_deadlock(plan->graph, swapped);
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("device order"), std::string::npos) << status.message();
  auto reordered = *plan;
  reordered.programs = swapped;
  auto refused = PipelineRunner::create(reordered);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("device order"), std::string::npos);
  // The runner checks a loaded plan for deadlocks before any thread waits.
  reordered.programs = broken;
  refused = PipelineRunner::create(reordered);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("deadlock"), std::string::npos);

  // A send nobody receives.
  broken = plan->programs;
  auto &recvs = broken[1].instructions;
  std::vector<serialization::PlanInstruction> kept;
  bool dropped = false;
  for (const auto &i : recvs) {
    if (!dropped && i.kind == serialization::InstrKind::kRecv && i.microbatch == 1) {
      dropped = true;
      continue;
    }
    kept.push_back(i);
  }
  recvs = kept;
  status = plan::check_deadlock(plan->graph, broken);
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("is never received by device 1"), std::string::npos)
      << status.message();
}

TEST_F(PipelineTest, FailingDeviceEndsTheStepWithANamedError) {
  auto plan = compile(mlp(), training(), 4, 4, Schedule::k1F1B);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  PipelineRunnerOptions options;
  options.timeout = std::chrono::milliseconds(5000);
  options.fault = PipelineRunnerOptions::Fault{};
  options.fault->device = 2;
  options.fault->instruction = 3;
  auto runner = *PipelineRunner::create(*plan, options);
  auto data = synthetic_dataset(plan->graph, 0, 1, 4);
  std::vector<HostTensor> outputs;
  const auto start = std::chrono::steady_clock::now();
  Status status = runner->run(data.batches[0], &outputs);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("device 2"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("instruction 3"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("injected fault"), std::string::npos) << status.message();
  // The others stop at once, not after the timeout.
  EXPECT_LT(elapsed, std::chrono::milliseconds(4000));
  // No busy time is told of a failed step.
  for (double busy : runner->busy_seconds())
    EXPECT_EQ(busy, -1.0);
  // The runner refuses to go on from a half-done step.
  EXPECT_FALSE(runner->run(data.batches[0], &outputs).is_ok());
}

TEST_F(PipelineTest, StalledDeviceEndsTheStepAfterTheTimeout) {
  auto plan = compile(mlp(), training(), 2, 2, Schedule::k1F1B);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  const StalledStep stalled = run_stalled(*plan, 0, 0);
  const Status &status = stalled.status;
  const auto elapsed = stalled.elapsed;
  ASSERT_FALSE(status.is_ok());
  // Device 1 gives up waiting for device 0 after the timeout and names both.
  EXPECT_NE(status.message().find("device 1"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("from device 0"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("timed out"), std::string::npos) << status.message();
  // The stalled thread is joined when it wakes; nothing waits past that.
  EXPECT_LT(elapsed, std::chrono::milliseconds(1500 + 2000));
}

TEST_F(PipelineTest, TraceShowsEveryDevice) {
  auto plan = compile(mlp(), training(), 2, 4, Schedule::k1F1B);
  ASSERT_TRUE(plan.is_ok());
  PipelineRunnerOptions options;
  options.trace = true;
  auto runner = *PipelineRunner::create(*plan, options);
  auto data = synthetic_dataset(plan->graph, 0, 1, 4);
  std::vector<HostTensor> outputs;
  ASSERT_TRUE(runner->run(data.batches[0], &outputs).is_ok());
  const std::string trace = runner->trace_json();
  EXPECT_NE(trace.find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(trace.find("device 1 (stage 1)"), std::string::npos);
  EXPECT_NE(trace.find("\"name\": \"F3\""), std::string::npos);
  EXPECT_NE(trace.find("\"name\": \"B3\""), std::string::npos);
  EXPECT_NE(trace.find("\"name\": \"optimizer\""), std::string::npos);
  for (const auto &spans : runner->spans())
    EXPECT_FALSE(spans.empty());
  // Every device thread's CPU time in the step.
  ASSERT_EQ(runner->busy_seconds().size(), 2u);
  for (double busy : runner->busy_seconds())
    EXPECT_GT(busy, 0);

  // Data parallelism: each device's communication stream has a track of its
  // own with its buckets' reductions.
  auto dp = compile(mlp(), training(), 1, 2, Schedule::k1F1B, 2, 0, 1, false, 1024);
  ASSERT_TRUE(dp.is_ok()) << dp.status().message();
  auto dp_runner = *PipelineRunner::create(*dp, options);
  auto dp_data = synthetic_dataset(dp->graph, 0, 1, 4);
  ASSERT_TRUE(dp_runner->run(dp_data.batches[0], &outputs).is_ok());
  const std::string dp_trace = dp_runner->trace_json();
  EXPECT_NE(dp_trace.find("\"device 1 communication\""), std::string::npos) << dp_trace;
  EXPECT_NE(dp_trace.find("\"name\": \"gradient bucket 0 over group 0\""), std::string::npos)
      << dp_trace;
  EXPECT_NE(dp_trace.find("wait for gradient bucket 0"), std::string::npos) << dp_trace;
  size_t stream_spans = 0;
  for (const auto &span : dp_runner->spans()[1])
    stream_spans += span.stream;
  EXPECT_EQ(stream_spans, dp->programs[1].buckets.size());
}

// The device clock (runtime/comm/device_clock.h) changes how time is told, not
// what is computed: the same bits as the wall clock. In its trace each
// device's instructions follow one another, a receive ends no earlier than
// its message was sent, and the step lasts until the last device is done.
TEST_F(PipelineTest, DeviceClockKeepsTheBitsAndJoinsDevicesAtMessages) {
  PipelineRunnerOptions options;
  options.trace = true;
  options.clock = PipelineRunnerOptions::Clock::kDevice;
  for (const auto &[stages, replicas] : std::vector<std::pair<int, int>>{{4, 1}, {2, 2}}) {
    const std::string what = str_cat(stages, " stages x ", replicas, " replicas");
    auto plan = compile(gpt(), training("adamw:lr=1e-3"), stages, 4, Schedule::k1F1B, replicas, 0,
                        1, false, 1024);
    ASSERT_TRUE(plan.is_ok()) << what << ": " << plan.status().message();
    std::unique_ptr<Trainer> trainer;
    expect_bitwise(run_plan(*plan, options, &trainer), run_plan(*plan), what);
    ASSERT_NE(trainer, nullptr);
    const auto &runner = dynamic_cast<const PipelineRunner &>(trainer->runner());
    EXPECT_GT(runner.device_step_seconds(), 0) << what;
    const auto &spans = runner.spans();
    double step_start = 0;
    for (int64_t step = 1; step <= kSteps; ++step) {
      // (source, destination, tensor, micro-batch) -> when it was sent
      std::map<std::tuple<int, int, uint32_t, int32_t>, double> sent;
      double step_end = step_start;
      for (size_t d = 0; d < spans.size(); ++d) {
        double last = step_start;
        for (const auto &span : spans[d]) {
          if (span.step != step) continue;
          step_end = std::max(step_end, span.end_s);
          if (span.stream) continue;
          EXPECT_GE(span.start_s, last) << what << ": device " << d << " step " << step;
          EXPECT_GE(span.end_s, span.start_s) << what;
          last = span.end_s;
          const auto &instr = plan->programs[d].instructions[span.instruction];
          if (instr.kind == serialization::InstrKind::kSend)
            sent[{static_cast<int>(d), instr.peer, instr.index, instr.microbatch}] = span.start_s;
        }
      }
      size_t receives = 0;
      for (size_t d = 0; d < spans.size(); ++d)
        for (const auto &span : spans[d]) {
          const auto &instr = plan->programs[d].instructions[span.instruction];
          if (span.step != step || span.stream || instr.kind != serialization::InstrKind::kRecv)
            continue;
          auto it = sent.find({instr.peer, static_cast<int>(d), instr.index, instr.microbatch});
          ASSERT_NE(it, sent.end()) << what;
          EXPECT_GE(span.end_s, it->second)
              << what << ": device " << d << " received " << plan->graph.tensor(instr.index).name
              << " before device " << instr.peer << " sent it";
          ++receives;
        }
      EXPECT_EQ(receives, sent.size()) << what;
      EXPECT_GT(receives, 0u) << what;
      step_start = step_end;
    }
    // The last step's length is the one reported.
    double last_start = 1e300, last_end = 0;
    for (const auto &device_spans : spans)
      for (const auto &span : device_spans)
        if (span.step == kSteps) {
          last_start = std::min(last_start, span.start_s);
          last_end = std::max(last_end, span.end_s);
        }
    EXPECT_GE(runner.device_step_seconds(), last_end - last_start) << what;
  }
  PipelineRunnerOptions threads = options;
  threads.gemm_threads = 2;
  auto plan = compile(mlp(), training(), 2, 2, Schedule::k1F1B);
  ASSERT_TRUE(plan.is_ok());
  auto refused = PipelineRunner::create(*plan, threads);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("one GEMM thread per device, not 2"), std::string::npos)
      << refused.status().message();
}

Result<serialization::Plan> compile_interleaved(const Graph &forward, int stages, int chunks,
                                                int microbatches, int data_parallel = 1,
                                                int zero = 0, int tensor_parallel = 1,
                                                bool recompute = false) {
  partitioner::PipelineCompileOptions pipeline;
  pipeline.recompute = recompute;
  pipeline.stages = stages;
  pipeline.data_parallel = data_parallel;
  pipeline.zero = zero;
  pipeline.tensor_parallel = tensor_parallel;
  pipeline.microbatches = microbatches;
  pipeline.schedule = Schedule::kInterleaved;
  pipeline.chunks = chunks;
  return partitioner::compile_pipeline(forward, training("adamw:lr=1e-3"), pipeline);
}

// Interleaved 1F1B (Megatron-LM's virtual pipeline stages): `chunks` model
// chunks per device, virtual stage k on device k mod P. Every chunk runs its
// backwards in micro-batch order, so the result is 1F1B's bit for bit (without
// clipping, whose norm sums per-stage partials); the pipeline fills faster,
// so the predicted bubble is smaller.
TEST_F(PipelineTest, InterleavedMatchesOneFOneBBitwiseWithASmallerBubble) {
  zoo::GptOptions six;
  six.layers = 4;
  six.hidden = 32;
  six.heads = 2;
  six.seq = 8;
  six.vocab = 64;
  six.batch = 6; // for 3 stages
  const Graph gpt6 = *zoo::make_gpt(six);
  for (const auto &[P, v, M] : std::vector<std::tuple<int, int, int>>{
           {2, 2, 2}, {2, 2, 4}, {4, 2, 8}, {2, 3, 4}, {2, 4, 4}, {3, 2, 3}, {3, 2, 6}}) {
    const std::string what = str_cat("P=", P, " chunks=", v, " M=", M);
    const Graph model = P == 3 ? gpt6 : gpt();
    auto interleaved = compile_interleaved(model, P, v, M);
    ASSERT_TRUE(interleaved.is_ok()) << what << ": " << interleaved.status().message();
    auto plain = compile(model, training("adamw:lr=1e-3"), P, M, Schedule::k1F1B);
    ASSERT_TRUE(plain.is_ok()) << what << ": " << plain.status().message();
    EXPECT_EQ(interleaved->programs.size(), static_cast<size_t>(P)) << what;
    EXPECT_EQ(interleaved->pipeline->chunks, v) << what;
    EXPECT_EQ(interleaved->pipeline->boundaries.size(), static_cast<size_t>(P * v - 1)) << what;
    EXPECT_EQ(*std::max_element(interleaved->pipeline->node_stage.begin(),
                                interleaved->pipeline->node_stage.end()),
              P * v - 1)
        << what;
    EXPECT_LT(interleaved->pipeline->predicted_bubble, plain->pipeline->predicted_bubble) << what;
    expect_bitwise(run_plan(*interleaved), run_plan(*plain), what + ": interleaved vs 1f1b");
  }
  // With data-parallel replicas (gradient buckets; ZeRO-1): the replicas of
  // each pipeline position run its chunks, reducing over their group.
  for (const int zero : {0, 1}) {
    const std::string what = str_cat("P=2 chunks=2 M=2 DP=2 zero=", zero);
    auto interleaved = compile_interleaved(gpt(), 2, 2, 2, 2, zero);
    ASSERT_TRUE(interleaved.is_ok()) << what << ": " << interleaved.status().message();
    auto plain = compile(gpt(), training("adamw:lr=1e-3"), 2, 2, Schedule::k1F1B, 2, zero);
    ASSERT_TRUE(plain.is_ok()) << what << ": " << plain.status().message();
    EXPECT_EQ(interleaved->programs.size(), 4u) << what;
    expect_bitwise(run_plan(*interleaved), run_plan(*plain), what + ": interleaved vs 1f1b");
  }
}

// Tensor-parallel groups at every pipeline position of the interleaved
// schedule: the members of a position run its chunks on their pieces, their
// collectives over the position's group. Bitwise 1F1B on the same mesh (the
// same graph, the same sums in the same order), and one device's result to
// the rounding tensor parallelism itself brings.
TEST_F(PipelineTest, InterleavedWithTensorParallelismMatchesOneFOneBBitwise) {
  for (const auto &[dp, tp, M, zero] :
       std::vector<std::tuple<int, int, int, int>>{{1, 2, 2, 0}, {1, 2, 4, 0}, {2, 2, 2, 1}}) {
    const std::string what = str_cat("mesh ", dp, "x", tp, "x2 chunks=2 M=", M, " zero=", zero);
    auto interleaved = compile_interleaved(gpt(), 2, 2, M, dp, zero, tp);
    ASSERT_TRUE(interleaved.is_ok()) << what << ": " << interleaved.status().message();
    auto plain = compile(gpt(), training("adamw:lr=1e-3"), 2, M, Schedule::k1F1B, dp, zero, tp);
    ASSERT_TRUE(plain.is_ok()) << what << ": " << plain.status().message();
    const auto &pipeline = *interleaved->pipeline;
    EXPECT_EQ(interleaved->programs.size(), static_cast<size_t>(2 * dp * tp)) << what;
    EXPECT_EQ(pipeline.chunks, 2) << what;
    EXPECT_EQ(pipeline.tensor_parallel, tp) << what;
    EXPECT_FALSE(pipeline.shards.empty()) << what;
    for (int k = 0; k < 2 * dp; ++k) {
      std::vector<int32_t> members;
      for (int m = 0; m < tp; ++m)
        members.push_back(k * tp + m);
      EXPECT_EQ(pipeline.groups[static_cast<size_t>(pipeline.tp_groups_begin + k)], members)
          << what;
    }
    EXPECT_EQ(plan::device_role(pipeline, 1),
              dp == 1 ? "stages 0, 2 member 1" : "stages 0, 2 replica 0 member 1")
        << what;
    const TrainRun got = run_plan(*interleaved);
    expect_bitwise(got, run_plan(*plain), what + ": interleaved vs 1f1b");
    if (zero == 0 && M == 2) {
      const TrainRun want = reference(gpt(), training("adamw:lr=1e-3"));
      ASSERT_EQ(got.losses.size(), want.losses.size());
      for (size_t step = 0; step < want.losses.size(); ++step)
        EXPECT_NEAR(got.losses[step], want.losses[step], 1e-5 * std::abs(want.losses[step]))
            << what;
      expect_close(got, want, 2e-3, what + ": interleaved vs one device");
    }
  }
  // Through both file forms, and run from the file as compiled.
  auto plan = compile_interleaved(gpt(), 2, 2, 2, 1, 0, 2);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  plan->model_fingerprint = plan->fingerprint = std::string(64, 'a');
  auto bytes = serialization::plan_to_flatbuffer(*plan);
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().message();
  auto loaded = serialization::load_plan_from_buffer(*bytes, "ti.splan", ".");
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  EXPECT_EQ(*loaded->pipeline, *plan->pipeline);
  auto json = serialization::plan_to_json(*plan);
  ASSERT_TRUE(json.is_ok()) << json.status().message();
  auto from_json = serialization::load_plan_from_json(*json, "ti.splan.json", ".");
  ASSERT_TRUE(from_json.is_ok()) << from_json.status().message();
  EXPECT_EQ(*serialization::plan_to_flatbuffer(*from_json), *bytes);
}

// Recomputation under the interleaved schedule: a device runs its later
// chunk's backward before its earlier chunk's, so every activation that
// crosses a virtual stage is kept, never recomputed (no clone reads across
// stages); the rest is recomputed as under 1F1B, bitwise the same result
// with less activation memory. Eight chunks cut the 4-layer GPT inside
// recomputation's segments: there a clone read across stages deadlocked.
TEST_F(PipelineTest, InterleavedRecomputationIsBitwise) {
  for (const auto &[tp, v] : std::vector<std::pair<int, int>>{{1, 2}, {1, 4}, {1, 8}, {2, 2}}) {
    const std::string what = str_cat("P=2 chunks=", v, " M=4 tp=", tp);
    auto recomputed = compile_interleaved(gpt(), 2, v, 4, 1, 0, tp, true);
    ASSERT_TRUE(recomputed.is_ok()) << what << ": " << recomputed.status().message();
    auto plain = compile_interleaved(gpt(), 2, v, 4, 1, 0, tp);
    ASSERT_TRUE(plain.is_ok()) << what << ": " << plain.status().message();
    const Graph &g = recomputed->graph;
    const auto &stage = recomputed->pipeline->node_stage;
    size_t clones = 0;
    for (NodeId id = 0; id < g.num_nodes(); ++id) {
      if (!g.node(id).name.ends_with(passes::kRecomputeSuffix)) continue;
      ++clones;
      for (TensorId out : g.node(id).outputs)
        for (NodeId reader = 0; reader < g.num_nodes(); ++reader)
          for (TensorId in : g.node(reader).inputs) {
            if (in != out) continue;
            EXPECT_EQ(stage[reader], stage[id])
                << what << ": " << g.node(reader).name << " reads " << g.node(id).name;
          }
    }
    EXPECT_GT(clones, 0u) << what;
    const TrainRun got = run_plan(*recomputed);
    expect_bitwise(got, run_plan(*plain), what + ": recomputed vs not");
    if (tp == 1) {
      auto one = compile(gpt(), training("adamw:lr=1e-3"), 2, 4, Schedule::k1F1B, 1, 0, 1, true);
      ASSERT_TRUE(one.is_ok()) << one.status().message();
      expect_bitwise(got, run_plan(*one), what + ": interleaved vs 1f1b, both recomputed");
    }
    // Less activation memory where the chunks hold whole layers; cut into
    // eight virtual stages, the 4-layer GPT keeps nearly every activation
    // as a stage input, and the clones cost more than they save.
    if (v != 2) continue;
    int64_t recomputed_bytes = 0, plain_bytes = 0;
    for (size_t d = 0; d < plain->programs.size(); ++d) {
      EXPECT_LE(recomputed->programs[d].arena_bytes, plain->programs[d].arena_bytes) << what;
      recomputed_bytes += recomputed->programs[d].arena_bytes;
      plain_bytes += plain->programs[d].arena_bytes;
    }
    EXPECT_LT(recomputed_bytes, plain_bytes) << what;
  }
}

// Device 0 of P = 2 with 2 chunks and 4 micro-batches runs its blocks in the
// order of Narayanan et al. 2021 (figure 4) and Megatron-LM: 4 warm-up
// forwards (chunk 0 then chunk 1, two micro-batches each), alternating after,
// backwards of the last chunk first.
TEST_F(PipelineTest, InterleavedRunsMegatronsOrder) {
  auto plan = compile_interleaved(gpt(), 2, 2, 4);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  auto phases = plan::analyze_phases(plan->graph, 4);
  ASSERT_TRUE(phases.is_ok());
  auto blocks = [&](int device) {
    std::vector<std::string> out;
    for (const auto &instr : plan->programs[static_cast<size_t>(device)].instructions) {
      if (instr.kind != serialization::InstrKind::kCompute || instr.microbatch < 0) continue;
      const bool backward = phases->node_phase[instr.index] == plan::Phase::kBackward;
      const std::string block = str_cat(backward ? "B" : "F", instr.microbatch, "c",
                                        plan->pipeline->node_stage[instr.index] / 2);
      if (out.empty() || out.back() != block) out.push_back(block);
    }
    return out;
  };
  EXPECT_EQ(blocks(0), (std::vector<std::string>{"F0c0", "F1c0", "F0c1", "F1c1", "F2c0", "B0c1",
                                                 "F3c0", "B1c1", "F2c1", "B0c0", "F3c1", "B1c0",
                                                 "B2c1", "B3c1", "B2c0", "B3c0"}));
  EXPECT_EQ(blocks(1), (std::vector<std::string>{"F0c0", "F1c0", "F0c1", "B0c1", "F1c1", "B1c1",
                                                 "F2c0", "B0c0", "F3c0", "B1c0", "F2c1", "B2c1",
                                                 "F3c1", "B3c1", "B2c0", "B3c0"}));
  // The plan keeps its chunks through both file forms.
  plan->model_fingerprint = plan->fingerprint = std::string(64, 'a');
  auto bytes = serialization::plan_to_flatbuffer(*plan);
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().message();
  auto loaded = serialization::load_plan_from_buffer(*bytes, "i.splan", ".");
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  EXPECT_EQ(loaded->pipeline->chunks, 2);
  EXPECT_EQ(loaded->pipeline->schedule, "interleaved");
  auto json = serialization::plan_to_json(*plan);
  ASSERT_TRUE(json.is_ok());
  EXPECT_NE(json->find("\"chunks\": 2"), std::string::npos);
  EXPECT_NE(json->find("\"plan_version\": 5"), std::string::npos);
  auto from_json = serialization::load_plan_from_json(*json, "i.splan.json", ".");
  ASSERT_TRUE(from_json.is_ok()) << from_json.status().message();
  EXPECT_EQ(*serialization::plan_to_flatbuffer(*from_json), *bytes);
  // Chunks on a schedule without them, or under an older revision, are refused.
  std::string edited = *json;
  edited.replace(edited.find("\"schedule\": \"interleaved\""), 25, "\"schedule\": \"1f1b\"");
  auto wrong = serialization::load_plan_from_json(edited, "i.splan.json", ".");
  ASSERT_FALSE(wrong.is_ok());
  EXPECT_NE(wrong.status().message().find("field pipeline.chunks = 2 with schedule 1f1b"),
            std::string::npos)
      << wrong.status().message();
  edited = serialization::testing::as_plan_revision(*json, 3);
  auto old = serialization::load_plan_from_json(edited, "i.splan.json", ".");
  ASSERT_FALSE(old.is_ok());
  EXPECT_NE(old.status().message().find("interleaved plans need version 4"), std::string::npos)
      << old.status().message();
}

TEST_F(PipelineTest, InterleavedOptionsAreChecked) {
  auto expect_error = [](const Result<serialization::Plan> &plan, const std::string &text) {
    ASSERT_FALSE(plan.is_ok()) << text;
    EXPECT_NE(plan.status().message().find(text), std::string::npos) << plan.status().message();
  };
  expect_error(compile_interleaved(gpt(), 2, 2, 3), "--microbatches 3 is not a multiple of 2");
  expect_error(compile_interleaved(gpt(), 2, 1, 2), "needs --chunks 2 to 1024");
  expect_error(compile_interleaved(gpt(), 1, 2, 2), "a pipeline of 2 or more stages");
  partitioner::PipelineCompileOptions pipeline;
  pipeline.stages = 2;
  pipeline.microbatches = 2;
  pipeline.schedule = Schedule::kInterleaved;
  pipeline.chunks = 2;
  pipeline.schedule = Schedule::k1F1B;
  expect_error(partitioner::compile_pipeline(gpt(), training(), pipeline),
               "--chunks 2 cuts the model into chunks per device for --schedule interleaved");
  // A device holds all its chunks: memory that fits one chunk but not the
  // device's two is refused, naming the device.
  pipeline.schedule = Schedule::kInterleaved;
  auto fits = partitioner::compile_pipeline(gpt(), training(), pipeline);
  ASSERT_TRUE(fits.is_ok()) << fits.status().message();
  int64_t most = 0;
  for (size_t d = 0; d < fits->programs.size(); ++d)
    most = std::max(most, plan::device_memory(*fits, d));
  partitioner::ClusterSpec small = partitioner::default_cpu_cluster(2);
  small.device.memory_bytes = most * 3 / 4;
  pipeline.cluster = small;
  expect_error(partitioner::compile_pipeline(gpt(), training(), pipeline), " (2 chunks) needs ");
}

TEST_F(PipelineTest, CheckpointAndResumeMatchAnUninterruptedRun) {
  auto plan = compile(gpt(), training("adamw:lr=0.01"), 2, 4, Schedule::k1F1B);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  const auto state = expect_resume_is_bitwise(*plan, "pipeline");
  // Every copy of a shared tensor was restored: the tied embedding is held by
  // the first and the last stage, and the resumed run stays bitwise equal only
  // if both got the checkpoint's value.
  EXPECT_GT(state.count("wte"), 0u);
}

// What crosses the boundary of a 2-stage GPT, and why: the residual stream
// forward, its (summed) gradient backward, the tied embedding's gradient from
// the head, and once per step the learning rate and the new values of copies.
TEST_F(PipelineTest, TransfersAreExplained) {
  auto plan = compile(gpt(), training("adamw:lr=0.01"), 2, 2, Schedule::k1F1B);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  const auto rows =
      partitioner::explain_transfers(plan->graph, plan->programs, {}, plan::zero_costs());
  int activations = 0, gradients = 0, copies = 0, per_step = 0;
  for (const auto &row : rows) {
    const std::string &name = plan->graph.tensor(row.tensor).name;
    if (row.why.starts_with("activation")) {
      ++activations;
      EXPECT_EQ(row.from, 0) << name;
      EXPECT_EQ(row.count, 2) << name; // every micro-batch
      EXPECT_EQ(name, plan->pipeline->boundaries[0]);
    } else if (row.why.starts_with("gradient")) {
      ++gradients;
      EXPECT_EQ(row.from, 1) << name;
    } else if (row.why.starts_with("new value of")) {
      ++copies;
    } else if (row.why.starts_with("once per step")) {
      ++per_step;
    }
    EXPECT_GT(row.bytes, 0) << name;
  }
  EXPECT_EQ(activations, 1);
  // The residual stream's gradient (its two contributions summed on stage 1)
  // and the head's contribution to the tied embedding's gradient.
  EXPECT_EQ(gradients, 2);
  EXPECT_EQ(copies, 2);   // wte and the step counter
  EXPECT_EQ(per_step, 1); // the learning rate
}

// A plan file that loads must run or fail with an error: never crash, read
// or write out of bounds (the sanitizer build runs this too, on every 4th
// byte) or hang. Every byte of a small data-parallel pipeline plan is flipped
// in turn; the plans that still load are created and stepped once.
// A plan whose devices need more than this host has is refused by size
// before anything is allocated.
TEST_F(PipelineTest, DevicesBeyondTheHostsMemoryAreRefusedBySize) {
  auto plan = compile(mlp(), training(), 2, 2, Schedule::k1F1B);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  plan->programs[1].arena_bytes = int64_t{1} << 50; // 1 PiB
  auto runner = PipelineRunner::create(*plan);
  ASSERT_FALSE(runner.is_ok());
  EXPECT_EQ(runner.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(runner.status().message().find("the pipeline's 2 devices in this process need 1.00 PiB "
                                           "of memory (activations, weights and optimizer "
                                           "state; the largest, device 1, 1.00 PiB); this host "
                                           "has "),
            std::string::npos)
      << runner.status().message();
}

TEST_F(PipelineTest, CorruptedPlansThatLoadRunOrFailCleanly) {
  zoo::MlpOptions o;
  o.batch = 8;
  o.input = 4;
  o.hidden = {6};
  o.classes = 3;
  auto plan = compile(*zoo::make_mlp(o), training(), 2, 2, Schedule::k1F1B, 2);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  plan->model_fingerprint = plan->fingerprint = std::string(64, 'a');
  auto bytes = serialization::plan_to_flatbuffer(*plan);
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().message();
  auto good = serialization::load_plan_from_buffer(*bytes, "p.splan", ".");
  ASSERT_TRUE(good.is_ok()) << good.status().message();
  PipelineRunnerOptions options;
  options.timeout = std::chrono::milliseconds(2000);
#if defined(__SANITIZE_ADDRESS__)
  constexpr size_t kStride = 4;
#else
  constexpr size_t kStride = 1;
#endif
  size_t loaded = 0, created = 0, ran = 0;
  for (size_t i = 0; i < bytes->size(); i += kStride) {
    std::vector<uint8_t> flipped = *bytes;
    flipped[i] ^= 0xff;
    auto corrupt = serialization::load_plan_from_buffer(flipped, "p.splan", ".");
    if (!corrupt.is_ok()) continue;
    ++loaded;
    auto runner = PipelineRunner::create(*corrupt, options);
    if (!runner.is_ok()) continue;
    ++created;
    std::vector<HostTensor> batch, outputs;
    for (const TensorType &type : (*runner)->batch_types())
      batch.push_back(HostTensor::zeros(type));
    const auto start = std::chrono::steady_clock::now();
    Status status = (*runner)->run(batch, &outputs);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << "byte " << i;
    if (status.is_ok()) ++ran;
  }
  std::printf("%zu bytes: %zu flips load, %zu create a runner, %zu run a step\n", bytes->size(),
              loaded, created, ran);
  EXPECT_LT(loaded, bytes->size());
}

TEST_F(PipelineTest, MicroBatchesMustDivideTheBatch) {
  auto plan = compile(mlp(), training(), 2, 3, Schedule::k1F1B);
  ASSERT_FALSE(plan.is_ok());
  EXPECT_NE(plan.status().message().find("16"), std::string::npos) << plan.status().message();
}

} // namespace
} // namespace strata::runtime
