// The CUDA pipeline runner: its memory layout and refusals without a GPU; on
// a GPU, pipeline and data-parallel plans whose devices share it train as the
// CPU pipeline runner trains them.
#include "runtime/cuda/cuda_pipeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "partitioner/compile_pipeline.h"
#include "partitioner/search/tensor_parallel.h"
#include "passes/make_training.h"
#include "plan/pieces.h"
#include "runtime/cuda/cuda_executor.h"
#include "runtime/cpu/executor.h"
#include "runtime/cpu/pipeline_runner.h"
#include "strata_config.h"
#include "tests/runtime/projection_softmax.h"
#include "tools/zoo.h"

namespace strata::runtime {
namespace {

using serialization::InstrKind;

Graph gpt_forward(int64_t vocab = 64) {
  zoo::GptOptions o;
  o.layers = 4;
  o.hidden = 32;
  o.heads = 4;
  o.seq = 8;
  o.vocab = vocab;
  o.batch = 16; // split into micro-batches by the compiler
  return *zoo::make_gpt(o);
}

Graph mlp_forward() {
  zoo::MlpOptions o;
  o.batch = 16;
  o.input = 24;
  o.hidden = {32, 32, 32};
  o.classes = 10;
  return *zoo::make_mlp(o);
}

serialization::Plan compile(const Graph &forward, const std::string &optimizer,
                            partitioner::PipelineCompileOptions mesh) {
  passes::TrainingOptions training;
  training.optimizer = *passes::parse_optimizer(optimizer);
  auto plan = partitioner::compile_pipeline(forward, training, mesh);
  EXPECT_TRUE(plan.is_ok()) << plan.status().message();
  return std::move(plan).value();
}

partitioner::PipelineCompileOptions
mesh(int stages, int microbatches, int data_parallel = 1,
     partitioner::Schedule schedule = partitioner::Schedule::k1F1B) {
  partitioner::PipelineCompileOptions o;
  o.stages = stages;
  o.microbatches = microbatches;
  o.data_parallel = data_parallel;
  o.schedule = schedule;
  o.bucket_bytes = data_parallel > 1 ? 4096 : 0;
  return o;
}

// Tensor-parallel plans of testing_graphs::projection_softmax (compute priced
// slow): they hold TpAllToAll nodes.
serialization::Plan all_to_all_plan(int tp) {
  const Graph forward = testing_graphs::projection_softmax();
  passes::TrainingOptions training;
  training.optimizer = *passes::parse_optimizer("adamw:lr=0.05");
  auto plan = partitioner::compile_pipeline(forward, training,
                                            testing_graphs::slow_compute_tensor_parallel(tp));
  EXPECT_TRUE(plan.is_ok()) << plan.status().message();
  return std::move(plan).value();
}

bool cuda_built() { return cuda_unavailable_reason().find("built without") == std::string::npos; }

// Every region of every device is aligned, inside the allocation and apart
// from every other; each device's arena is its memory plan's, each send has
// staging for its tensor, and the batch's staging holds every micro-batch.
TEST(CudaPipelineLayout, EveryDeviceGetsItsOwnAlignedRegions) {
  if (!cuda_built()) GTEST_SKIP() << cuda_unavailable_reason();
  auto tp = mesh(2, 2);
  tp.tensor_parallel = 2;
  auto zero = mesh(2, 2, 2);
  zero.zero = 1;
  auto zero2 = zero;
  zero2.zero = 2;
  for (const auto &plan : {compile(gpt_forward(), "adamw:lr=0.01", mesh(4, 4)),
                           compile(mlp_forward(), "sgd:lr=0.1,momentum=0.9", mesh(2, 2, 2)),
                           compile(gpt_forward(), "sgd:lr=0.1,momentum=0.9", tp),
                           compile(mlp_forward(), "adamw:lr=0.01", zero),
                           compile(mlp_forward(), "adamw:lr=0.01", zero2)}) {
    for (bool split : {false, true}) {
      // Split: the even devices' GPU of a run over two (the odd ones elsewhere).
      std::vector<bool> local;
      for (size_t d = 0; split && d < plan.programs.size(); ++d)
        local.push_back(d % 2 == 0);
      SCOPED_TRACE(plan.graph.name() + " on " + std::to_string(plan.programs.size()) + " devices" +
                   (split ? ", the even ones on this GPU" : ""));
      auto layout = cuda_pipeline_layout(plan, 1 << 20, false, local);
      ASSERT_TRUE(layout.is_ok()) << layout.status().message();
      const Graph &g = plan.graph;
      const int64_t a = kGpuAlignment;
      struct Region {
        int64_t begin, end;
        std::string what;
      };
      std::vector<Region> regions;
      auto add = [&](int64_t offset, int64_t bytes, std::string what) {
        EXPECT_EQ(offset % a, 0) << what;
        EXPECT_GE(offset, 0) << what;
        EXPECT_LE(offset + bytes, layout->total) << what;
        if (bytes > 0) regions.push_back({offset, offset + bytes, std::move(what)});
      };
      ASSERT_EQ(layout->devices.size(), plan.programs.size());
      size_t sends = 0, any_sharded = 0;
      int64_t flags = 0; // every device's flags, one after another
      for (size_t d = 0; d < plan.programs.size(); ++d) {
        const auto &program = plan.programs[d];
        const auto &device = layout->devices[d];
        const std::string name = "device " + std::to_string(d);
        EXPECT_EQ(device.first_flag, flags) << name;
        if (split && !local[d]) { // on another GPU: nothing here
          EXPECT_EQ(device.arena_bytes, 0) << name;
          EXPECT_TRUE(device.held.empty()) << name;
          EXPECT_EQ(device.scratch, -1) << name;
          EXPECT_EQ(device.workspace, -1) << name;
          EXPECT_EQ(device.tp_staging, -1) << name;
          for (int64_t offset : device.send)
            EXPECT_EQ(offset, -1) << name;
          flags += static_cast<int64_t>(program.instructions.size());
          continue;
        }
        // Over NCCL a tensor-parallel member stages its column-block pieces.
        if (split && plan.pipeline->tensor_parallel > 1) {
          EXPECT_GT(device.tp_staging_bytes, 0) << name;
          add(device.tp_staging, device.tp_staging_bytes, name + " tensor-parallel staging");
        } else {
          EXPECT_EQ(device.tp_staging, -1) << name;
        }
        EXPECT_EQ(device.arena_bytes, program.arena_bytes) << name;
        add(device.arena, device.arena_bytes, name + " arena");
        ASSERT_EQ(device.held.size(), program.holds.size()) << name;
        const std::set<TensorId> sharded(program.sharded_holds.begin(),
                                         program.sharded_holds.end());
        any_sharded += sharded.size();
        const int64_t shards =
            program.shard_group < 0
                ? 1
                : static_cast<int64_t>(
                      plan.pipeline->groups[static_cast<size_t>(program.shard_group)].size());
        for (size_t k = 0; k < program.holds.size(); ++k) {
          EXPECT_EQ(device.held[k].first, program.holds[k]);
          // A ZeRO-1 shard is its share of the tensor.
          const int64_t bytes = g.tensor(program.holds[k]).type.size_bytes() /
                                (sharded.contains(program.holds[k]) ? shards : 1);
          add(device.held[k].second, bytes, name + " '" + g.tensor(program.holds[k]).name + "'");
          // The next region starts where this one ends, aligned (nothing between).
          if (k + 1 < program.holds.size()) {
            EXPECT_EQ(device.held[k + 1].second, (device.held[k].second + bytes + a - 1) / a * a);
          }
        }
        add(device.scratch, device.scratch_bytes, name + " scratch");
        add(device.workspace, layout->workspace_bytes, name + " workspace");
        flags += static_cast<int64_t>(program.instructions.size());
        ASSERT_EQ(device.send.size(), program.instructions.size());
        for (size_t i = 0; i < program.instructions.size(); ++i) {
          const auto &instr = program.instructions[i];
          if (instr.kind != InstrKind::kSend) {
            EXPECT_EQ(device.send[i], -1) << name << " instruction " << i;
            continue;
          }
          ++sends;
          add(device.send[i], g.tensor(instr.index).type.size_bytes(),
              name + " send " + std::to_string(i));
        }
      }
      EXPECT_GT(sends, 0u);
      EXPECT_EQ(any_sharded > 0, plan.pipeline->zero >= 1);
      // Then one "any flag set" int per device, and the GPU's.
      EXPECT_EQ(layout->instruction_flags, flags);
      EXPECT_EQ(layout->flag_count, flags + 1); // and the step's verdict
      add(layout->flags, layout->flag_count * static_cast<int64_t>(sizeof(int)), "the flags");
      const int64_t batch = int64_t{plan.pipeline->microbatches} * plan.pipeline->data_parallel;
      ASSERT_EQ(layout->input.size(), g.inputs().size());
      for (size_t k = 0; k < g.inputs().size(); ++k)
        add(layout->input[k], g.tensor(g.inputs()[k]).type.size_bytes() * batch,
            "the batch of '" + g.tensor(g.inputs()[k]).name + "'");
      std::sort(regions.begin(), regions.end(),
                [](const Region &x, const Region &y) { return x.begin < y.begin; });
      for (size_t r = 1; r < regions.size(); ++r)
        EXPECT_LE(regions[r - 1].end, regions[r].begin)
            << regions[r - 1].what << " overlaps " << regions[r].what;
    }
  }
}

TEST(CudaPipelineLayout, RefusesWhatItDoesNotRunYetSayingWhy) {
  if (!cuda_built()) GTEST_SKIP() << cuda_unavailable_reason();
  // ZeRO-1 runs on tensor-parallel pieces too: each replica holds its shard
  // of its member's piece.
  auto zero = mesh(1, 2, 2);
  zero.zero = 1;
  zero.tensor_parallel = 2;
  const serialization::Plan zero_tp = compile(gpt_forward(), "adamw:lr=0.01", zero);
  auto layout = cuda_pipeline_layout(zero_tp, 0);
  ASSERT_TRUE(layout.is_ok()) << layout.status().message();
  size_t sharded_pieces = 0;
  for (size_t d = 0; d < zero_tp.programs.size(); ++d)
    for (TensorId id : zero_tp.programs[d].sharded_holds)
      for (const auto &shard : zero_tp.pipeline->shards)
        sharded_pieces += shard.tensor == zero_tp.graph.tensor(id).name;
  EXPECT_GT(sharded_pieces, 0u);

  // Tensor parallelism runs: the runner moves the pieces itself, and runs
  // the vocabulary-parallel embedding and loss of a large vocabulary.
  auto tp = mesh(1, 2);
  tp.tensor_parallel = 2;
  layout = cuda_pipeline_layout(compile(gpt_forward(), "sgd:lr=0.1", tp), 0);
  EXPECT_TRUE(layout.is_ok()) << layout.status().message();
  const serialization::Plan vocab = compile(gpt_forward(4096), "sgd:lr=0.1", tp);
  EXPECT_TRUE(std::any_of(vocab.graph.nodes().begin(), vocab.graph.nodes().end(),
                          [](const Node &n) { return n.op == "VocabParallelCrossEntropy"; }));
  layout = cuda_pipeline_layout(vocab, 0);
  EXPECT_TRUE(layout.is_ok()) << layout.status().message();
  // An all-to-all (one split becoming another) runs too, through a staging
  // block per member.
  const serialization::Plan all_to_all = all_to_all_plan(2);
  EXPECT_TRUE(std::any_of(all_to_all.graph.nodes().begin(), all_to_all.graph.nodes().end(),
                          [](const Node &n) { return n.op == "TpAllToAll"; }));
  layout = cuda_pipeline_layout(all_to_all, 0);
  ASSERT_TRUE(layout.is_ok()) << layout.status().message();
  EXPECT_GE(layout->devices[0].tp_staging_bytes, int64_t{16 * 64 / 2 * 4});

  serialization::Plan single;
  single.graph = mlp_forward();
  layout = cuda_pipeline_layout(single, 0);
  ASSERT_FALSE(layout.is_ok());
  EXPECT_NE(layout.status().message().find("no pipeline"), std::string::npos);
}

TEST(CudaPipelineRunner, WithoutAGpuCreationSaysWhy) {
  const std::string reason = cuda_unavailable_reason();
  if (reason.empty()) GTEST_SKIP() << "a GPU is present: nothing to refuse";
  auto runner = CudaPipelineRunner::create(compile(mlp_forward(), "sgd:lr=0.1", mesh(2, 2)));
  ASSERT_FALSE(runner.is_ok());
  EXPECT_NE(runner.status().message().find(reason), std::string::npos) << runner.status().message();
}

// A plan written by hand with a scalar input, which no micro-batch can slice:
// refused by name before anything is placed on a GPU (with or without one;
// a build without the toolkit refuses every CUDA plan, so only the CPU's).
TEST(CudaPipelineRunner, RefusesAScalarInputItWouldCutIntoMicroBatches) {
  serialization::Plan plan = compile(mlp_forward(), "sgd:lr=0.1", mesh(2, 2));
  Tensor scale;
  scale.name = "scale";
  scale.type = TensorType{DType::kF32, {}};
  scale.kind = TensorKind::kInput;
  auto id = plan.graph.add_tensor(scale);
  ASSERT_TRUE(id.is_ok()) << id.status().message();
  plan.graph.add_input(*id);
  std::vector<Status> refusals = {PipelineRunner::create(plan).status()};
  if (cuda_built()) refusals.push_back(CudaPipelineRunner::create(plan).status());
  for (const Status &status : refusals) {
    ASSERT_FALSE(status.is_ok());
    EXPECT_NE(status.message().find("input 'scale' is a scalar (f32[]), but the plan cuts dim 0 "
                                    "of every input, the batch, into 2 micro-batches"),
              std::string::npos)
        << status.message();
  }
}

class CudaPipelineGpuTest : public ::testing::Test {
protected:
  void SetUp() override {
    const std::string reason = cuda_unavailable_reason();
    if (!reason.empty()) GTEST_SKIP() << reason;
  }
};

double relative_difference(const HostTensor &a, const HostTensor &b) {
  double worst = 0;
  const auto *x = reinterpret_cast<const float *>(a.data());
  const auto *y = reinterpret_cast<const float *>(b.data());
  for (int64_t i = 0; i < a.type.num_elements(); ++i)
    worst =
        std::max(worst, std::fabs(double{x[i]} - y[i]) / std::max(1.0, std::fabs(double{y[i]})));
  return worst;
}

// Three steps of `plan` on the CPU pipeline runner and on one GPU (eager and
// captured): the same losses and weights within `tolerance`, and the replayed
// steps bitwise those launched eagerly.
// With `gpu_list`, the plan's devices are spread over those GPUs (NCCL).
void expect_pipeline_matches(const serialization::Plan &plan, double tolerance,
                             const std::vector<int> &gpu_list = {}) {
  auto cpu = PipelineRunner::create(plan);
  ASSERT_TRUE(cpu.is_ok()) << cpu.status().message();
  std::vector<std::unique_ptr<CudaPipelineRunner>> gpus;
  for (bool graph : {false, true}) {
    CudaPipelineOptions options;
    options.cuda_graph = graph;
    options.gpus = gpu_list;
    options.timeout = std::chrono::seconds(60);
    auto gpu = CudaPipelineRunner::create(plan, options);
    ASSERT_TRUE(gpu.is_ok()) << gpu.status().message();
    gpus.push_back(std::move(gpu).value());
  }
  const Graph &g = plan.graph;
  const int64_t batch = int64_t{plan.pipeline->microbatches} * plan.pipeline->data_parallel;
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step + 1));
    const std::vector<HostTensor> inputs = random_inputs(g, 100 + step, batch);
    std::vector<HostTensor> expected, eager, replayed;
    ASSERT_TRUE((*cpu)->run(inputs, &expected).is_ok());
    Status status = gpus[0]->run(inputs, &eager);
    ASSERT_TRUE(status.is_ok()) << status.message();
    status = gpus[1]->run(inputs, &replayed);
    ASSERT_TRUE(status.is_ok()) << status.message();
    ASSERT_EQ(eager.size(), expected.size());
    for (size_t k = 0; k < expected.size(); ++k) {
      if (expected[k].type.dtype != DType::kF32) continue;
      EXPECT_LE(relative_difference(eager[k], expected[k]), tolerance) << "output " << k;
      EXPECT_EQ(std::memcmp(eager[k].data(), replayed[k].data(), eager[k].size_bytes()), 0)
          << "output " << k << ": replayed differs from eager";
    }
  }
  EXPECT_EQ(gpus[1]->replays(), 2);
  for (TensorId id = 0; id < g.num_tensors(); ++id) {
    const Tensor &t = g.tensor(id);
    if (t.kind != TensorKind::kParameter && t.kind != TensorKind::kState) continue;
    if (t.type.dtype != DType::kF32) continue;
    const HostTensor &want = (*cpu)->value(id);
    EXPECT_LE(relative_difference(gpus[0]->value(id), want), tolerance) << t.name;
    EXPECT_EQ(std::memcmp(gpus[0]->value(id).data(), gpus[1]->value(id).data(), want.size_bytes()),
              0)
        << t.name << ": replayed differs from eager";
  }
}

TEST_F(CudaPipelineGpuTest, FourStagePipelineOnOneGpuTrainsAsOnTheCpu) {
  expect_pipeline_matches(compile(gpt_forward(), "sgd:lr=0.1,momentum=0.9", mesh(4, 8)), 1e-4);
}

TEST_F(CudaPipelineGpuTest, InterleavedScheduleTrainsAsOnTheCpu) {
  auto options = mesh(4, 8, 1, partitioner::Schedule::kInterleaved);
  options.chunks = 2;
  expect_pipeline_matches(compile(gpt_forward(), "sgd:lr=0.1,momentum=0.9", options), 1e-4);
  // With recomputation: the clones run in their chunk's backward.
  auto recompute = mesh(2, 2, 1, partitioner::Schedule::kInterleaved);
  recompute.chunks = 2;
  recompute.recompute = true;
  expect_pipeline_matches(compile(gpt_forward(), "sgd:lr=0.1,momentum=0.9", recompute), 1e-4);
}

// The interleaved schedule with tensor-parallel groups at each position:
// the members run their position's chunks, their collectives on one GPU.
TEST_F(CudaPipelineGpuTest, TensorParallelInterleavedTrainsAsOnTheCpu) {
  auto options = mesh(2, 2, 1, partitioner::Schedule::kInterleaved);
  options.chunks = 2;
  options.tensor_parallel = 2;
  expect_pipeline_matches(compile(gpt_forward(), "sgd:lr=0.1,momentum=0.9", options), 1e-4);
}

TEST_F(CudaPipelineGpuTest, GpipeScheduleTrainsAsOnTheCpu) {
  expect_pipeline_matches(compile(mlp_forward(), "sgd:lr=0.1,momentum=0.9",
                                  mesh(2, 4, 1, partitioner::Schedule::kGPipe)),
                          1e-4);
}

TEST_F(CudaPipelineGpuTest, DataParallelBucketsTrainAsOnTheCpu) {
  expect_pipeline_matches(compile(mlp_forward(), "sgd:lr=0.1,momentum=0.9", mesh(2, 2, 2)), 1e-4);
  auto blocking = mesh(2, 2, 2);
  blocking.bucket_bytes = 0; // one all-reduce per gradient
  expect_pipeline_matches(compile(mlp_forward(), "sgd:lr=0.1,momentum=0.9", blocking), 1e-4);
}

// Tensor-parallel groups of two (their all-reduces, all-gathers and splits
// between members on one GPU), inside a pipeline and beside data parallelism.
TEST_F(CudaPipelineGpuTest, TensorParallelGroupsTrainAsOnTheCpu) {
  auto tp = mesh(2, 2);
  tp.tensor_parallel = 2;
  expect_pipeline_matches(compile(gpt_forward(), "sgd:lr=0.1,momentum=0.9", tp), 1e-4);
  auto dp_tp = mesh(1, 2, 2);
  dp_tp.tensor_parallel = 2;
  expect_pipeline_matches(compile(gpt_forward(), "adamw:lr=0.01", dp_tp), 1e-4);
  // A large vocabulary: the embedding table and the logits split by class
  // (Megatron-LM's vocabulary-parallel embedding and cross entropy).
  expect_pipeline_matches(compile(gpt_forward(4096), "sgd:lr=0.1,momentum=0.9", tp), 1e-4);
}

// The CUDA runners' all-to-all (2-D block copies by all_to_all_layout) moves
// every byte where the CPU runner's (copy_piece cuts and placements) does.
TEST(CudaAllToAll, BlockCopiesMatchTheCpuRunnersPieces) {
  for (int tp : {2, 4}) {
    const serialization::Plan plan = all_to_all_plan(tp);
    int checked = 0;
    for (const Node &node : plan.graph.nodes()) {
      if (node.op != "TpAllToAll") continue;
      ++checked;
      const TensorType &in = plan.graph.tensor(node.inputs[0]).type;
      const TensorType &out = plan.graph.tensor(node.outputs[0]).type;
      auto layout = plan::all_to_all_layout(node, in, out, tp);
      ASSERT_TRUE(layout.is_ok()) << layout.status().message();
      const auto parts = static_cast<size_t>(tp);
      const size_t bytes = static_cast<size_t>(in.size_bytes()), element = dtype_size(in.dtype);
      ASSERT_EQ(layout->block * parts, bytes);
      std::vector<std::vector<std::byte>> inputs(parts, std::vector<std::byte>(bytes));
      for (size_t m = 0; m < parts; ++m)
        for (size_t i = 0; i < bytes; ++i)
          inputs[m][i] = static_cast<std::byte>((m * 131 + i * 7 + i / 251) & 0xff);
      auto dim = [&](const char *name, const TensorType &type) {
        const auto axis = static_cast<int32_t>(node.int_attr(name).value_or(0));
        return axis < 0 ? axis + static_cast<int32_t>(type.rank()) : axis;
      };
      const serialization::PlanShard cut{"",
                                         {in.shape.begin(), in.shape.end()},
                                         dim("axis", in),
                                         node.int_attr("outer").value_or(1)};
      const serialization::PlanShard place{"",
                                           {out.shape.begin(), out.shape.end()},
                                           dim("from_axis", out),
                                           node.int_attr("from_outer").value_or(1)};
      // The CPU runner: block j of member m is copy_piece's piece j of its input.
      std::vector<std::vector<std::byte>> expected(parts, std::vector<std::byte>(bytes));
      for (size_t r = 0; r < parts; ++r)
        for (size_t j = 0; j < parts; ++j) {
          std::vector<std::byte> block(layout->block);
          plan::copy_piece(cut, tp, static_cast<int>(r), element, inputs[j].data(),
                                  block.data(), true);
          plan::copy_piece(place, tp, static_cast<int>(j), element, expected[r].data(),
                                  block.data(), false);
        }
      // The CUDA runners: 2-D copies of (rows, run) blocks through staging.
      auto copy_block = [](std::byte *to, size_t to_pitch, const std::byte *from, size_t from_pitch,
                           size_t width, size_t rows) {
        for (size_t row = 0; row < rows; ++row)
          std::memcpy(to + row * to_pitch, from + row * from_pitch, width);
      };
      const plan::PieceLayout &c = layout->cut, &pl = layout->place;
      std::vector<std::vector<std::byte>> staging(parts, std::vector<std::byte>(bytes)),
          got(parts, std::vector<std::byte>(bytes));
      for (size_t m = 0; m < parts; ++m)
        for (size_t j = 0; j < parts; ++j)
          copy_block(staging[m].data() + j * layout->block, c.run, inputs[m].data() + j * c.run,
                     parts * c.run, c.run, c.rows);
      for (size_t r = 0; r < parts; ++r)
        for (size_t j = 0; j < parts; ++j)
          copy_block(got[r].data() + j * pl.run, parts * pl.run,
                     staging[j].data() + r * layout->block, pl.run, pl.run, pl.rows);
      for (size_t r = 0; r < parts; ++r)
        EXPECT_TRUE(got[r] == expected[r]) << node.name << " member " << r << " of " << tp;
    }
    EXPECT_GT(checked, 0) << "tp " << tp;
  }
}

// TpAllToAll between members on one GPU: each member's input cut into
// blocks, each member's output placed from the others' blocks.
TEST_F(CudaPipelineGpuTest, AllToAllTrainsAsOnTheCpu) {
  for (int tp : {2, 4})
    expect_pipeline_matches(all_to_all_plan(tp), 1e-4);
}

// ZeRO-1: every replica keeps its shard of the optimizer state, gradients are
// reduce-scattered (blocking, or in buckets beside backward) and the updated
// shards all-gathered.
TEST_F(CudaPipelineGpuTest, ZeroOneShardsTrainAsOnTheCpu) {
  auto zero = mesh(2, 2, 2);
  zero.zero = 1;
  expect_pipeline_matches(compile(mlp_forward(), "adamw:lr=0.01", zero), 1e-4);
  zero.bucket_bytes = 0;
  expect_pipeline_matches(compile(mlp_forward(), "adamw:lr=0.01,clip=1", zero), 1e-4);
  // Shards of tensor-parallel pieces.
  auto zero_tp = mesh(1, 2, 2);
  zero_tp.zero = 1;
  zero_tp.tensor_parallel = 2;
  expect_pipeline_matches(compile(gpt_forward(), "adamw:lr=0.01", zero_tp), 1e-4);
}

// ZeRO-2: every micro-batch's gradients reduce-scattered as backward makes
// them (in place, then the device's shard added into its shard-sized sum on
// its stream), the shards updated and all-gathered.
TEST_F(CudaPipelineGpuTest, ZeroTwoShardsTrainAsOnTheCpu) {
  auto zero = mesh(2, 2, 2);
  zero.zero = 2;
  expect_pipeline_matches(compile(mlp_forward(), "adamw:lr=0.01", zero), 1e-4);
  zero.bucket_bytes = 0;
  expect_pipeline_matches(compile(mlp_forward(), "sgd:lr=0.1,momentum=0.9,clip=1", zero), 1e-4);
  auto zero_tp = mesh(1, 2, 2);
  zero_tp.zero = 2;
  zero_tp.tensor_parallel = 2;
  expect_pipeline_matches(compile(gpt_forward(), "adamw:lr=0.01", zero_tp), 1e-4);
}

// Elementwise chains a device runs back to back, run as one kernel, give
// bitwise the losses and weights of the nodes one by one.
TEST_F(CudaPipelineGpuTest, FusedChainsEqualTheNodesOneByOne) {
  const serialization::Plan plan = compile(gpt_forward(), "adamw:lr=0.01", mesh(2, 4));
  std::vector<std::unique_ptr<CudaPipelineRunner>> runners;
  for (bool fuse : {false, true}) {
    CudaPipelineOptions options;
    options.fuse = fuse;
    auto runner = CudaPipelineRunner::create(plan, options);
    ASSERT_TRUE(runner.is_ok()) << runner.status().message();
    runners.push_back(std::move(runner).value());
  }
  EXPECT_EQ(runners[0]->fused_chains(), 0);
  EXPECT_GT(runners[1]->fused_chains(), 0);
  for (int step = 0; step < 3; ++step) {
    const std::vector<HostTensor> inputs = random_inputs(plan.graph, 40 + step, 4);
    std::vector<HostTensor> plain, fused;
    ASSERT_TRUE(runners[0]->run(inputs, &plain).is_ok());
    ASSERT_TRUE(runners[1]->run(inputs, &fused).is_ok());
    EXPECT_EQ(std::memcmp(plain[0].data(), fused[0].data(), plain[0].size_bytes()), 0)
        << "loss, step " << step;
  }
  for (TensorId id = 0; id < plan.graph.num_tensors(); ++id) {
    if (plan.graph.tensor(id).kind != TensorKind::kParameter) continue;
    EXPECT_EQ(std::memcmp(runners[0]->value(id).data(), runners[1]->value(id).data(),
                          runners[0]->value(id).size_bytes()),
              0)
        << plan.graph.tensor(id).name;
  }
}

// Plans spread over two GPUs: stages talk over NCCL send/recv, data- and
// tensor-parallel groups with a member per GPU over NCCL collectives, and
// devices sharing a GPU as on one. NCCL sums in its own order: equal to the
// CPU's to rounding.
TEST_F(CudaPipelineGpuTest, PlansOverTwoGpusTrainAsOnTheCpu) {
  if (cuda_device_count() < 2)
    GTEST_SKIP() << "needs 2 GPUs (NCCL refuses two ranks on one); this machine has "
                 << cuda_device_count();
  const std::string sgd = "sgd:lr=0.1,momentum=0.9";
  expect_pipeline_matches(compile(gpt_forward(), sgd, mesh(2, 4)), 1e-4, {0, 1});
  expect_pipeline_matches(compile(mlp_forward(), sgd, mesh(2, 2, 2)), 1e-4, {0, 0, 1, 1});
  expect_pipeline_matches(compile(mlp_forward(), sgd, mesh(2, 2, 2)), 1e-4, {0, 1, 0, 1});
  auto blocking = mesh(1, 2, 2);
  blocking.bucket_bytes = 0;
  expect_pipeline_matches(compile(mlp_forward(), sgd, blocking), 1e-4, {0, 1});
  auto zero = mesh(1, 2, 2);
  zero.zero = 1;
  expect_pipeline_matches(compile(mlp_forward(), "adamw:lr=0.01", zero), 1e-4, {0, 1});
  zero.zero = 2;
  expect_pipeline_matches(compile(mlp_forward(), "adamw:lr=0.01", zero), 1e-4, {0, 1});
  auto tp = mesh(1, 2);
  tp.tensor_parallel = 2;
  expect_pipeline_matches(compile(gpt_forward(), sgd, tp), 1e-4, {0, 1});
  expect_pipeline_matches(compile(gpt_forward(4096), sgd, tp), 1e-4, {0, 1});
  expect_pipeline_matches(all_to_all_plan(2), 1e-4, {0, 1});
  // The interleaved schedule's tensor-parallel members on distinct GPUs.
  auto interleaved = mesh(2, 2, 1, partitioner::Schedule::kInterleaved);
  interleaved.chunks = 2;
  interleaved.tensor_parallel = 2;
  expect_pipeline_matches(compile(gpt_forward(), sgd, interleaved), 1e-4, {0, 1, 0, 1});
}

// A bad label on one GPU keeps every GPU's weights (the check flags are
// combined over NCCL before the first update), and the run names it.
TEST_F(CudaPipelineGpuTest, ABadLabelOnOneGpuKeepsEveryGpusWeights) {
  if (cuda_device_count() < 2)
    GTEST_SKIP() << "needs 2 GPUs; this machine has " << cuda_device_count();
  const serialization::Plan plan = compile(mlp_forward(), "sgd:lr=0.1", mesh(2, 2));
  CudaPipelineOptions options;
  options.gpus = {0, 1};
  auto gpu = CudaPipelineRunner::create(plan, options);
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().message();
  EXPECT_EQ((*gpu)->num_gpus(), 2);
  std::vector<HostTensor> inputs = random_inputs(plan.graph, 7, 2);
  std::map<TensorId, HostTensor> before;
  for (TensorId id = 0; id < plan.graph.num_tensors(); ++id)
    if (plan.graph.tensor(id).kind == TensorKind::kParameter) before[id] = (*gpu)->value(id);
  reinterpret_cast<int64_t *>(inputs[1].data())[5] = 1000; // 10 classes
  std::vector<HostTensor> outputs;
  Status status = (*gpu)->run(inputs, &outputs);
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("device 1 instruction"), std::string::npos) << status.message();
  for (const auto &[id, value] : before)
    EXPECT_EQ(std::memcmp((*gpu)->value(id).data(), value.data(), value.size_bytes()), 0)
        << plan.graph.tensor(id).name << " changed after a failed step";
}

// A plan larger than the GPU is out of memory, not a bug in strata.
TEST_F(CudaPipelineGpuTest, APlanLargerThanTheGpuIsResourceExhausted) {
  const serialization::Plan plan = compile(mlp_forward(), "sgd:lr=0.1", mesh(2, 2));
  CudaPipelineOptions options;
  options.workspace_bytes = int64_t{1} << 40; // per plan device: more than any GPU has
  auto gpu = CudaPipelineRunner::create(plan, options);
  ASSERT_FALSE(gpu.is_ok());
  EXPECT_EQ(gpu.status().code(), StatusCode::kResourceExhausted) << gpu.status().to_string();
  EXPECT_NE(gpu.status().message().find("out of GPU memory"), std::string::npos)
      << gpu.status().message();
}

TEST_F(CudaPipelineGpuTest, ABadLabelNamesTheDeviceAndInstruction) {
  const serialization::Plan plan = compile(mlp_forward(), "sgd:lr=0.1", mesh(2, 2));
  auto gpu = CudaPipelineRunner::create(plan);
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().message();
  std::vector<HostTensor> inputs = random_inputs(plan.graph, 3, 2);
  std::map<TensorId, HostTensor> before;
  for (TensorId id = 0; id < plan.graph.num_tensors(); ++id)
    if (plan.graph.tensor(id).kind == TensorKind::kParameter) before[id] = (*gpu)->value(id);
  reinterpret_cast<int64_t *>(inputs[1].data())[5] = 1000; // 10 classes
  std::vector<HostTensor> outputs;
  Status status = (*gpu)->run(inputs, &outputs);
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("device 1 instruction"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("label"), std::string::npos) << status.message();
  // No device applied its updates.
  for (const auto &[id, value] : before)
    EXPECT_EQ(std::memcmp((*gpu)->value(id).data(), value.data(), value.size_bytes()), 0)
        << plan.graph.tensor(id).name << " changed after a failed step";
  status = (*gpu)->run(random_inputs(plan.graph, 4, 2), &outputs);
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("earlier step"), std::string::npos) << status.message();
}

} // namespace
} // namespace strata::runtime
