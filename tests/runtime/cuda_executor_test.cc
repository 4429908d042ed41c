// The CUDA executor against the CPU one. The op-coverage tests need no GPU;
// the rest skip, saying why, where no GPU is usable (no driver, no device).
#include "runtime/cuda/cuda_executor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "graph/builder.h"
#include "ops/registry.h"
#include "passes/make_training.h"
#include "runtime/cpu/executor.h"
#include "strata_config.h"
#include "tests/ops/cuda_op_cases.h"
#include "tools/zoo.h"

namespace strata::runtime {
namespace {

using test::describe;
using test::difference;
using test::one_node;
using test::op_cases;
using test::OpCase;

const ops::OpRegistry &registry() { return ops::OpRegistry::global(); }

Graph training_graph(Result<Graph> forward, const std::string &optimizer) {
  EXPECT_TRUE(forward.is_ok()) << forward.status().message();
  passes::TrainingOptions options;
  options.optimizer = *passes::parse_optimizer(optimizer);
  auto graph = passes::make_training_graph(*forward, options);
  EXPECT_TRUE(graph.is_ok()) << graph.status().message();
  return std::move(graph).value();
}

Graph mlp_graph() {
  zoo::MlpOptions mlp;
  mlp.batch = 16;
  mlp.input = 24;
  mlp.hidden = {32, 32};
  mlp.classes = 10;
  return training_graph(zoo::make_mlp(mlp), "sgd:lr=0.1,momentum=0.9");
}

Graph gpt_graph() {
  zoo::GptOptions gpt;
  gpt.layers = 2;
  gpt.hidden = 32;
  gpt.heads = 4;
  gpt.seq = 8;
  gpt.vocab = 64;
  gpt.batch = 2;
  // SGD: Adam's first steps move each weight by about lr * sign(gradient), so a
  // gradient near zero whose sign depends on summation order would move a
  // weight by 2 lr; AdamUpdate itself is compared op by op.
  return training_graph(zoo::make_gpt(gpt), "sgd:lr=0.05,momentum=0.9");
}

Graph convnet_graph() {
  zoo::ConvnetOptions convnet;
  convnet.batch = 4;
  convnet.image_size = 16;
  convnet.channels = {4, 8};
  return training_graph(zoo::make_convnet(convnet), "sgd:lr=0.05,momentum=0.9");
}

// ---- without a GPU ---------------------------------------------------------------

TEST(CudaOps, TheZooMlpAndGptTrainOnTheCudaBackend) {
  zoo::GptOptions gpt;
  gpt.hidden = 32;
  Graph clipped = training_graph(zoo::make_gpt(gpt), "adamw:lr=0.01,wd=0.1,clip=1");
  for (const Graph &graph : {mlp_graph(), gpt_graph(), clipped}) {
    Status status = check_cuda_ops(graph);
    if (cuda_unavailable_reason().find("built without") != std::string::npos)
      GTEST_SKIP() << cuda_unavailable_reason();
    EXPECT_TRUE(status.is_ok()) << graph.name() << ": " << status.message();
  }
}

TEST(CudaOps, TheZooConvnetTrainsOnTheCudaBackendWithCudnn) {
  if (!STRATA_HAVE_CUDA || !STRATA_HAVE_CUDNN) GTEST_SKIP() << "this build has no cuDNN";
  zoo::ConvnetOptions convnet;
  Status status = check_cuda_ops(training_graph(zoo::make_convnet(convnet), "sgd:lr=0.1"));
  EXPECT_TRUE(status.is_ok()) << status.message();
}

TEST(CudaOps, MissingKernelsAreListedAllAtOnceWithTheirNodes) {
  if (cuda_unavailable_reason().find("built without") != std::string::npos)
    GTEST_SKIP() << cuda_unavailable_reason();
  GraphBuilder b("mixed", registry());
  TensorId x = b.input("x", DType::kF32, {4, 6});
  const std::vector<Attribute> pair = {{"parts", int64_t{2}}};
  b.output(b.op1("TpCopy", {x}, pair, "copy_a"));
  b.output(b.op1("TpAllReduce", {b.op1("Relu", {x}, {}, "fine")}, pair, "sum_a"));
  b.output(b.op1("TpAllReduce", {x}, pair, "sum_b"));
  b.output(b.op1("Relu", {b.input("h", DType::kBF16, {4})}, {}, "half"));
  b.output(b.op1("ReduceSum", {b.input("n", DType::kI64, {4})}, {}, "count"));
  b.output(
      b.op1("Conv2d",
            {b.input("img", DType::kF32, {1, 2, 6, 6}), b.input("w", DType::kF32, {3, 2, 3, 3})},
            {{"pads", AttrValue{std::vector<int64_t>{0, 0, 1, 1}}}}, "same_pad"));
  b.output(b.op1("Gather",
                 {b.input("table", DType::kF32, {8, 4}), b.input("ids", DType::kI64, {3})}, pair,
                 "vocab_piece"));
  auto graph = std::move(b).finish();
  ASSERT_TRUE(graph.is_ok()) << graph.status().message();
  Status status = check_cuda_ops(*graph);
  ASSERT_FALSE(status.is_ok());
  const std::string text(status.message());
  EXPECT_NE(text.find("TpCopy ('copy_a')"), std::string::npos) << text;
  EXPECT_NE(text.find("TpAllReduce ('sum_a', 'sum_b')"), std::string::npos) << text;
  EXPECT_NE(text.find("Relu on bf16 ('half')"), std::string::npos) << text;
  EXPECT_NE(text.find("ReduceSum on i64 ('count')"), std::string::npos) << text;
  EXPECT_NE(text.find("Conv2d with asymmetric pads ('same_pad')"), std::string::npos) << text;
  EXPECT_NE(text.find("--backend cpu"), std::string::npos) << text;
  // A piece of a split table needs a tensor-parallel group (the pipeline
  // runner's), not a single device.
  EXPECT_NE(text.find("Gather of a tensor split over 2 members outside a tensor-parallel group "
                      "of 2 ('vocab_piece')"),
            std::string::npos)
      << text;
  EXPECT_TRUE(check_cuda_ops(*graph, {}, 2).message().find("vocab_piece") == std::string::npos);
  // Nodes the backend runs are not listed.
  EXPECT_EQ(text.find("'fine'"), std::string::npos) << text;
  // Nor those a runner runs itself.
  status = check_cuda_ops(*graph, [](const Node &node) { return node.op == "TpAllReduce"; });
  ASSERT_FALSE(status.is_ok());
  EXPECT_EQ(std::string(status.message()).find("TpAllReduce"), std::string::npos)
      << status.message();
  EXPECT_NE(std::string(status.message()).find("TpCopy ('copy_a')"), std::string::npos);
}

// The executor's one GPU allocation, laid out without a GPU: aligned regions
// that do not overlap, one per weight, staged input and output, scratch where
// an op asks for it, and nothing wasted past the last region's alignment.
TEST(CudaExecutor, LayoutIsAlignedTightAndDisjoint) {
  if (cuda_unavailable_reason().find("built without") != std::string::npos)
    GTEST_SKIP() << cuda_unavailable_reason();
  for (const Graph &graph : {gpt_graph(), convnet_graph()}) {
    SCOPED_TRACE(graph.name());
    auto layout = cuda_layout(graph, 1 << 20);
    ASSERT_TRUE(layout.is_ok()) << layout.status().message();
    const CudaLayout &l = *layout;
    std::vector<std::pair<int64_t, int64_t>> regions = {{0, l.plan.arena_bytes}};
    for (TensorId id = 0; id < graph.num_tensors(); ++id) {
      const TensorKind kind = graph.tensor(id).kind;
      const bool held = kind == TensorKind::kParameter || kind == TensorKind::kState ||
                        kind == TensorKind::kConstant;
      EXPECT_EQ(l.tensor[id] >= 0, held) << graph.tensor(id).name;
      if (held) regions.push_back({l.tensor[id], graph.tensor(id).type.size_bytes()});
    }
    ASSERT_EQ(l.order.size(), static_cast<size_t>(graph.num_nodes()));
    int scratch_nodes = 0;
    for (size_t s = 0; s < l.order.size(); ++s) {
      const Node &node = graph.node(l.order[s]);
      if (l.constant[s] >= 0) {
        EXPECT_TRUE(node.inputs.empty()) << node.name;
        regions.push_back({l.constant[s], graph.tensor(node.outputs[0]).type.size_bytes()});
      }
      if (l.scratch[s] >= 0) {
        ++scratch_nodes;
        regions.push_back({l.scratch[s], l.scratch_bytes[s]});
      }
      // The ops that need room besides their outputs have it.
      if (node.op == "LayerNormGrad" || node.op == "SoftmaxCrossEntropy") {
        EXPECT_GT(l.scratch_bytes[s], 0) << node.name;
      }
    }
    EXPECT_GT(scratch_nodes, 0);
    ASSERT_EQ(l.input.size(), graph.inputs().size());
    for (size_t k = 0; k < l.input.size(); ++k)
      regions.push_back({l.input[k], graph.tensor(graph.inputs()[k]).type.size_bytes()});
    ASSERT_EQ(l.output.size(), graph.outputs().size());
    for (size_t k = 0; k < l.output.size(); ++k)
      regions.push_back({l.output[k], graph.tensor(graph.outputs()[k]).type.size_bytes()});
    regions.push_back({l.workspace, 1 << 20});
    regions.push_back({l.flags, static_cast<int64_t>((l.order.size() + 1) * sizeof(int))});
    std::sort(regions.begin(), regions.end());
    for (size_t i = 0; i < regions.size(); ++i) {
      EXPECT_EQ(regions[i].first % kCudaAlignment, 0) << "region at " << regions[i].first;
      if (i + 1 < regions.size()) {
        EXPECT_LE(regions[i].first + regions[i].second, regions[i + 1].first)
            << "region at " << regions[i].first << " overlaps the next";
      }
    }
    const int64_t end = regions.back().first + regions.back().second;
    EXPECT_GE(l.total, end);
    EXPECT_LT(l.total - end, kCudaAlignment);
    // Nothing but alignment between regions.
    int64_t used = 0;
    for (const auto &[offset, bytes] : regions)
      used += (bytes + kCudaAlignment - 1) / kCudaAlignment * kCudaAlignment;
    EXPECT_EQ(used, l.total);
  }
}

// With guard bytes (the cross-backend test's layout): every intermediate has
// its own region, and each region is followed by at least the guard, inside
// the gap before the next one.
// --precision bf16: one staging region, aligned and apart from the rest, holds
// the largest GEMM's operands in bf16 (A, then B at the next 256 bytes); f32
// runs reserve none.
TEST(CudaExecutor, Bf16LayoutStagesTheLargestGemmsOperands) {
  if (cuda_unavailable_reason().find("built without") != std::string::npos)
    GTEST_SKIP() << cuda_unavailable_reason();
  const Graph graph = gpt_graph();
  auto f32 = cuda_layout(graph, 1 << 20);
  auto bf16 = cuda_layout(graph, 1 << 20, 0, true);
  ASSERT_TRUE(f32.is_ok() && bf16.is_ok());
  EXPECT_EQ(f32->bf16, -1);
  EXPECT_EQ(f32->bf16_bytes, 0);
  int64_t largest = 0;
  for (const Node &node : graph.nodes()) {
    if (node.op != "MatMul" && node.op != "Gemm") continue;
    const int64_t a = graph.tensor(node.inputs[0]).type.num_elements();
    const int64_t b = graph.tensor(node.inputs[1]).type.num_elements();
    // Both operands in half precision, then f16's scales.
    largest = std::max(largest, (a * 2 + 255) / 256 * 256 + (b * 2 + 255) / 256 * 256 + 256);
  }
  EXPECT_GT(largest, 0);
  EXPECT_EQ(bf16->bf16_bytes, largest);
  EXPECT_EQ(bf16->bf16 % kCudaAlignment, 0);
  EXPECT_GE(bf16->bf16, bf16->workspace + bf16->workspace_bytes);
  EXPECT_LE(bf16->bf16 + bf16->bf16_bytes, bf16->flags);
  EXPECT_EQ(bf16->total - f32->total,
            (largest + kCudaAlignment - 1) / kCudaAlignment * kCudaAlignment);
}

// With fusion, each chain's output never shares bytes with what the chain
// reads (its kernel reads its operands while writing it).
TEST(CudaExecutor, FusedChainsWriteApartFromWhatTheyRead) {
  if (cuda_unavailable_reason().find("built without") != std::string::npos)
    GTEST_SKIP() << cuda_unavailable_reason();
  const Graph graph = gpt_graph();
  auto layout = cuda_layout(graph, 1 << 20, 0, false, true);
  ASSERT_TRUE(layout.is_ok()) << layout.status().message();
  ASSERT_FALSE(layout->chains.empty());
  EXPECT_TRUE(cuda_layout(graph, 1 << 20)->chains.empty()); // fuse off
  const std::vector<int64_t> &offset = layout->plan.offsets;
  for (const auto &chain : layout->chains) {
    const TensorId out = graph.node(chain.back()).outputs[0];
    ASSERT_GE(offset[out], 0);
    const int64_t out_end = offset[out] + graph.tensor(out).type.size_bytes();
    for (NodeId id : chain)
      for (TensorId in : graph.node(id).inputs) {
        if (offset[in] < 0 || graph.tensor(in).producer == kNoNode) continue;
        if (std::find(chain.begin(), chain.end(), graph.tensor(in).producer) != chain.end())
          continue; // the chain's own intermediate, never written
        const int64_t end = offset[in] + graph.tensor(in).type.size_bytes();
        EXPECT_TRUE(end <= offset[out] || out_end <= offset[in])
            << graph.tensor(in).name << " and " << graph.tensor(out).name << " overlap";
      }
  }
}

TEST(CudaExecutor, GuardedLayoutSurroundsEveryBuffer) {
  if (cuda_unavailable_reason().find("built without") != std::string::npos)
    GTEST_SKIP() << cuda_unavailable_reason();
  Graph graph = mlp_graph();
  auto layout = cuda_layout(graph, 4096, 64);
  ASSERT_TRUE(layout.is_ok()) << layout.status().message();
  const CudaLayout &l = *layout;
  EXPECT_EQ(l.plan.arena_bytes, 0);
  std::vector<std::pair<int64_t, int64_t>> data; // offset, bytes
  for (TensorId id = 0; id < graph.num_tensors(); ++id) {
    const TensorKind kind = graph.tensor(id).kind;
    EXPECT_EQ(l.tensor[id] >= 0, kind != TensorKind::kInput) << graph.tensor(id).name;
    if (l.tensor[id] >= 0) data.push_back({l.tensor[id], graph.tensor(id).type.size_bytes()});
  }
  for (size_t k = 0; k < l.input.size(); ++k)
    data.push_back({l.input[k], graph.tensor(graph.inputs()[k]).type.size_bytes()});
  ASSERT_EQ(l.guards.size(),
            data.size() + graph.outputs().size() + 2 +
                static_cast<size_t>(std::count_if(l.scratch.begin(), l.scratch.end(),
                                                  [](int64_t s) { return s >= 0; })) +
                static_cast<size_t>(std::count_if(l.constant.begin(), l.constant.end(),
                                                  [](int64_t s) { return s >= 0; })));
  std::sort(data.begin(), data.end());
  for (const CudaLayout::Guard &guard : l.guards) {
    EXPECT_GE(guard.bytes, 64) << guard.after;
    EXPECT_EQ((guard.offset + guard.bytes) % kCudaAlignment, 0) << guard.after;
    // No buffer starts inside a guard.
    for (const auto &[offset, bytes] : data)
      EXPECT_FALSE(offset >= guard.offset && offset < guard.offset + guard.bytes) << guard.after;
  }
  EXPECT_NE(std::find_if(l.guards.begin(), l.guards.end(),
                         [](const CudaLayout::Guard &g) {
                           return g.after.find("tensor 'fc0'") != std::string::npos;
                         }),
            l.guards.end());
}

TEST(CudaExecutor, WithoutAGpuCreationSaysWhy) {
  const std::string reason = cuda_unavailable_reason();
  if (reason.empty()) GTEST_SKIP() << "a GPU is present: nothing to refuse";
  auto created = CudaExecutor::create(mlp_graph());
  ASSERT_FALSE(created.is_ok());
  EXPECT_NE(created.status().message().find(reason), std::string::npos)
      << created.status().message();
}

// ---- on a GPU --------------------------------------------------------------------

class CudaGpuTest : public ::testing::Test {
protected:
  void SetUp() override {
    const std::string reason = cuda_unavailable_reason();
    if (!reason.empty()) GTEST_SKIP() << reason;
  }
};

double max_difference(const HostTensor &a, const HostTensor &b) {
  EXPECT_EQ(a.type, b.type);
  if (!(a.type == b.type) || a.type.dtype != DType::kF32) return 0;
  const float *x = reinterpret_cast<const float *>(a.data());
  const float *y = reinterpret_cast<const float *>(b.data());
  double worst = 0;
  for (int64_t i = 0; i < a.type.num_elements(); ++i)
    worst = std::max(worst, difference(x[i], y[i]));
  return worst;
}

// The cases of EveryOpMatchesTheCpu are valid graphs the CPU runs, and cover
// every op the CUDA backend has (Identity, Flatten, Squeeze and Unsqueeze
// share Reshape's copy).
TEST(CudaOps, TheOpCasesCoverTheBackendAndRunOnTheCpu) {
  std::vector<std::string_view> covered;
  for (const OpCase &c : op_cases()) {
    SCOPED_TRACE(describe(c));
    Graph graph = one_node(c);
    auto cpu = CpuExecutor::create(graph);
    ASSERT_TRUE(cpu.is_ok()) << cpu.status().message();
    std::vector<HostTensor> outputs;
    Status status = (*cpu)->run(random_inputs(graph, 7), &outputs);
    EXPECT_TRUE(status.is_ok()) << status.message();
    EXPECT_TRUE(check_cuda_ops(graph).is_ok() ||
                cuda_unavailable_reason().find("built without") != std::string::npos)
        << check_cuda_ops(graph).message();
    covered.push_back(registry().find(c.op)->name);
  }
  for (std::string_view op : cuda_backend_ops()) {
    if (op != "Identity" && op != "Flatten" && op != "Squeeze" && op != "Unsqueeze") {
      EXPECT_NE(std::find(covered.begin(), covered.end(), op), covered.end()) << op;
    }
  }
}

TEST_F(CudaGpuTest, EveryOpMatchesTheCpu) {
  for (const OpCase &c : op_cases()) {
    SCOPED_TRACE(describe(c));
    Graph graph = one_node(c);
    std::vector<HostTensor> inputs = random_inputs(graph, 7);
    if (c.positive)
      for (HostTensor &t : inputs)
        if (t.type.dtype == DType::kF32)
          for (int64_t i = 0; i < t.type.num_elements(); ++i) {
            float *v = reinterpret_cast<float *>(t.data()) + i;
            *v = std::fabs(*v) + 0.1f;
          }
    auto cpu = CpuExecutor::create(graph);
    ASSERT_TRUE(cpu.is_ok()) << cpu.status().message();
    std::vector<HostTensor> expected, got;
    ASSERT_TRUE((*cpu)->run(inputs, &expected).is_ok());
    // Pooling and batch norm both through cuDNN (where it fits) and through
    // strata's kernels.
    const bool cudnn_choice =
        c.op.find("Pool2d") != std::string::npos || c.op.rfind("BatchNormalization", 0) == 0;
    for (int pass = 0; pass < (cudnn_choice ? 4 : 2); ++pass) {
      const bool cuda_graph = pass % 2 == 1;
      CudaExecutorOptions options;
      options.cuda_graph = cuda_graph;
      options.cudnn_pool_norm = pass < 2;
      SCOPED_TRACE(str_cat(cuda_graph ? "captured" : "eager",
                           options.cudnn_pool_norm ? "" : ", strata's pool/norm kernels"));
      options.guard_bytes = 256; // every buffer guarded; checked after each run
      auto gpu = CudaExecutor::create(graph, options);
      ASSERT_TRUE(gpu.is_ok()) << gpu.status().message();
      for (int run = 0; run < 3; ++run) { // eager, captured, replayed
        Status status = (*gpu)->run(inputs, &got);
        ASSERT_TRUE(status.is_ok()) << status.message();
        status = (*gpu)->check_guards();
        EXPECT_TRUE(status.is_ok()) << status.message();
        ASSERT_EQ(got.size(), expected.size());
        for (size_t k = 0; k < got.size(); ++k) {
          if (got[k].type.dtype != DType::kF32) {
            EXPECT_EQ(std::memcmp(got[k].data(), expected[k].data(), got[k].size_bytes()), 0);
            continue;
          }
          EXPECT_LE(max_difference(got[k], expected[k]), c.tolerance) << "output " << k;
        }
      }
    }
  }
}

TEST_F(CudaGpuTest, DeviceChecksNameTheNode) {
  OpCase c{"SoftmaxCrossEntropy", {}, {{DType::kF32, {4, 5}}, {DType::kI64, {4}}}};
  Graph graph = one_node(c);
  std::vector<HostTensor> inputs = random_inputs(graph, 1);
  reinterpret_cast<int64_t *>(inputs[1].data())[2] = 9; // 5 classes
  auto gpu = CudaExecutor::create(graph);
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().message();
  std::vector<HostTensor> outputs;
  Status status = (*gpu)->run(inputs, &outputs);
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("node 'node' (SoftmaxCrossEntropy)"), std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find("label"), std::string::npos) << status.message();
}

// A step larger than the GPU is out of memory, not a bug in strata, and says
// how much it asked for and of which GPU; the failure is not reported again
// to the next executor on that GPU.
TEST_F(CudaGpuTest, AStepLargerThanTheGpuIsResourceExhausted) {
  const Graph graph = mlp_graph();
  CudaExecutorOptions options;
  options.workspace_bytes = int64_t{1} << 40; // 1 TiB: more than any GPU has
  auto created = CudaExecutor::create(graph, options);
  ASSERT_FALSE(created.is_ok());
  const Status &status = created.status();
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.to_string();
  for (const char *part : {"CUDA executor for graph '", "CUDA allocating 1.00 TiB (",
                           " bytes) on GPU 0: out of GPU memory ("})
    EXPECT_NE(status.message().find(part), std::string::npos) << status.message();
  auto next = CudaExecutor::create(graph);
  ASSERT_TRUE(next.is_ok()) << next.status().message();
  std::vector<HostTensor> outputs;
  const Status run = (*next)->run(random_inputs(graph, 3), &outputs);
  EXPECT_TRUE(run.is_ok()) << run.message();
}

// A training step with a bad label fails naming the loss node and, as on the
// CPU, changes no weight; the next good step trains as usual.
TEST_F(CudaGpuTest, AFailedStepChangesNoWeight) {
  Graph graph = mlp_graph();
  for (bool cuda_graph : {false, true}) {
    CudaExecutorOptions options;
    options.cuda_graph = cuda_graph;
    auto gpu = CudaExecutor::create(graph, options);
    ASSERT_TRUE(gpu.is_ok()) << gpu.status().message();
    std::vector<HostTensor> outputs;
    for (int step = 0; step < 2; ++step) // eager, then captured
      ASSERT_TRUE((*gpu)->run(random_inputs(graph, step), &outputs).is_ok());
    std::vector<HostTensor> before;
    for (TensorId id = 0; id < graph.num_tensors(); ++id)
      before.push_back((*gpu)->value(id));
    std::vector<HostTensor> bad = random_inputs(graph, 5);
    reinterpret_cast<int64_t *>(bad[1].data())[0] = 1000; // 10 classes
    Status status = (*gpu)->run(bad, &outputs);
    ASSERT_FALSE(status.is_ok());
    EXPECT_NE(status.message().find("(SoftmaxCrossEntropy"), std::string::npos) << status.message();
    for (TensorId id = 0; id < graph.num_tensors(); ++id) {
      const Tensor &t = graph.tensor(id);
      if (t.kind != TensorKind::kParameter && t.kind != TensorKind::kState) continue;
      const HostTensor &after = (*gpu)->value(id);
      EXPECT_EQ(std::memcmp(after.data(), before[id].data(), after.size_bytes()), 0) << t.name;
    }
    EXPECT_TRUE((*gpu)->run(random_inputs(graph, 6), &outputs).is_ok());
  }
}

// Four training steps on both backends: the same losses and weights.
void expect_training_matches(const Graph &graph, double tolerance, bool bitwise_replay) {
  auto cpu = CpuExecutor::create(graph);
  ASSERT_TRUE(cpu.is_ok()) << cpu.status().message();
  CudaExecutorOptions eager_options;
  eager_options.cuda_graph = false;
  auto eager = CudaExecutor::create(graph, eager_options);
  auto replayed = CudaExecutor::create(graph);
  ASSERT_TRUE(eager.is_ok()) << eager.status().message();
  ASSERT_TRUE(replayed.is_ok()) << replayed.status().message();
  for (uint64_t step = 0; step < 4; ++step) {
    std::vector<HostTensor> inputs = random_inputs(graph, 100 + step);
    std::vector<HostTensor> a, b, c;
    ASSERT_TRUE((*cpu)->run(inputs, &a).is_ok());
    Status status = (*eager)->run(inputs, &b);
    ASSERT_TRUE(status.is_ok()) << status.message();
    status = (*replayed)->run(inputs, &c);
    ASSERT_TRUE(status.is_ok()) << status.message();
    EXPECT_LE(max_difference(b[0], a[0]), tolerance) << "loss, step " << step;
    if (bitwise_replay) {
      EXPECT_EQ(std::memcmp(b[0].data(), c[0].data(), b[0].size_bytes()), 0)
          << "replay and eager differ at step " << step;
    }
  }
  // Step 1 eager, step 2 captured, steps 3 and 4 replayed.
  EXPECT_EQ((*replayed)->replays(), 2);
  for (TensorId id = 0; id < graph.num_tensors(); ++id) {
    const Tensor &t = graph.tensor(id);
    if (t.kind != TensorKind::kParameter && t.kind != TensorKind::kState) continue;
    EXPECT_LE(max_difference((*eager)->value(id), (*cpu)->value(id)), tolerance) << t.name;
    const HostTensor &x = (*eager)->value(id);
    const HostTensor &y = (*replayed)->value(id);
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size_bytes()), 0) << t.name;
  }
}

// The bf16 GEMM multiplies the operands rounded to bf16 exactly (their
// products fit f32) and sums in f32: the CPU's f32 product of the same rounded
// operands agrees to f32 summation-order error.
float round_to_bf16(float x) {
  uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  bits += 0x7FFFu + ((bits >> 16) & 1u); // to nearest, ties to even
  bits &= 0xFFFF0000u;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

TEST_F(CudaGpuTest, Bf16GemmsMultiplyTheRoundedOperands) {
  const std::vector<OpCase> cases = {
      {"MatMul", {}, {{DType::kF32, {2, 3, 40, 24}}, {DType::kF32, {2, 3, 24, 16}}}},
      {"MatMul", {}, {{DType::kF32, {4, 40, 24}}, {DType::kF32, {24, 16}}}},
      {"Gemm",
       {{"trans_b", int64_t{1}}, {"beta", 0.5}},
       {{DType::kF32, {40, 24}}, {DType::kF32, {16, 24}}, {DType::kF32, {16}}}}};
  for (const OpCase &c : cases) {
    SCOPED_TRACE(describe(c));
    Graph graph = one_node(c);
    std::vector<HostTensor> inputs = random_inputs(graph, 11), rounded = inputs;
    for (size_t k = 0; k < 2; ++k) {
      rounded[k] = HostTensor::zeros(inputs[k].type);
      for (int64_t i = 0; i < inputs[k].type.num_elements(); ++i)
        rounded[k].as<float>()[i] = round_to_bf16(inputs[k].as<float>()[i]);
    }
    auto cpu = CpuExecutor::create(graph);
    ASSERT_TRUE(cpu.is_ok());
    std::vector<HostTensor> expected, unrounded, got;
    ASSERT_TRUE((*cpu)->run(rounded, &expected).is_ok());
    ASSERT_TRUE((*cpu)->run(inputs, &unrounded).is_ok());
    CudaExecutorOptions options;
    options.bf16 = true;
    auto gpu = CudaExecutor::create(graph, options);
    ASSERT_TRUE(gpu.is_ok()) << gpu.status().message();
    Status status = (*gpu)->run(inputs, &got);
    ASSERT_TRUE(status.is_ok()) << status.message();
    EXPECT_LE(max_difference(got[0], expected[0]), 1e-5);
    // And bf16 is really used: the unrounded product is further away.
    EXPECT_GT(max_difference(got[0], unrounded[0]), 1e-4);
  }
}

// The shift that puts an operand's largest magnitude just under 2^14.
int f16_shift_of(const float *x, int64_t n) {
  float amax = 0;
  for (int64_t i = 0; i < n; ++i)
    amax = std::max(amax, std::fabs(x[i]));
  int e = 0;
  std::frexp(amax, &e);
  return amax > 0 ? 14 - e : 0;
}

// A's and B's shifts as the CUDA backend caps them: their sum at most 100,
// both giving way alike.
std::pair<int, int> capped_f16_shifts(int a, int b) {
  const int excess = a + b - 100;
  if (excess <= 0) return {a, b};
  return {a - excess / 2, b - (excess - excess / 2)};
}

// x rounded to f16 after scaling the whole operand by 2^s (s from the two
// functions above, as the CUDA backend does), and scaled back: f16's 11-bit
// rounding at any magnitude, without its range limits.
std::vector<float> round_to_scaled_f16(const float *x, int64_t n, int s) {
  // f16 rounding to nearest even: 11 significant bits down to 2^-14, a fixed
  // quantum of 2^-24 below (subnormals), infinity past 65504.
  auto to_f16 = [](float v) {
    if (!std::isfinite(v) || v == 0.0f) return v;
    int exponent = 0;
    std::frexp(v, &exponent);
    const float quantum = std::ldexp(1.0f, std::max(exponent, -13) - 11);
    const float r = std::nearbyint(v / quantum) * quantum;
    return std::fabs(r) > 65504.0f ? std::copysign(INFINITY, v) : r;
  };
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    out[static_cast<size_t>(i)] = std::ldexp(to_f16(std::ldexp(x[i], s)), -s);
  return out;
}

// Under --precision f16 a GEMM's operands are scaled into f16's range: tiny
// operands (where plain f16 keeps a few bits, or none) and huge ones (where
// it overflows) multiply as their 11-bit roundings, and alpha and beta stay
// as given.
TEST_F(CudaGpuTest, F16GemmsScaleTheirOperandsIntoRange) {
  const std::vector<OpCase> cases = {
      {"MatMul", {}, {{DType::kF32, {2, 3, 40, 24}}, {DType::kF32, {2, 3, 24, 16}}}},
      {"Gemm",
       {{"trans_b", int64_t{1}}, {"alpha", 0.25}, {"beta", 0.5}},
       {{DType::kF32, {40, 24}}, {DType::kF32, {16, 24}}, {DType::kF32, {16}}}}};
  for (const OpCase &c : cases)
    // A's and B's magnitudes. 3e-19 twice: both shifts near 76, whose sum
    // would unscale by 2^-152 (zero in f32, where the product, ~1e-36, is
    // not): they are capped. 1e-30 and 1e-3: shifts near 113 and 23, capped
    // alike so both stay in f16's normal range.
    for (const auto &[ma, mb] :
         {std::pair{1e-6f, 1e-6f}, std::pair{1.0f, 1.0f}, std::pair{1e6f, 1e6f},
          std::pair{3e-19f, 3e-19f}, std::pair{1e-30f, 1e-3f}}) {
      SCOPED_TRACE(describe(c) + " at " + std::to_string(ma) + ", " + std::to_string(mb));
      Graph graph = one_node(c);
      std::vector<HostTensor> inputs = random_inputs(graph, 12);
      if (inputs.size() > 2) // C at the product's magnitude
        for (int64_t i = 0; i < inputs[2].type.num_elements(); ++i)
          inputs[2].as<float>()[i] *= ma * mb;
      int shifts[2];
      for (size_t k = 0; k < 2; ++k) {
        float *x = inputs[k].as<float>();
        const int64_t n = inputs[k].type.num_elements();
        for (int64_t i = 0; i < n; ++i)
          x[i] *= k == 0 ? ma : mb;
        shifts[k] = f16_shift_of(x, n);
      }
      std::vector<HostTensor> scaled = inputs, plain = inputs;
      std::tie(shifts[0], shifts[1]) = capped_f16_shifts(shifts[0], shifts[1]);
      for (size_t k = 0; k < 2; ++k) {
        const float *x = inputs[k].as<float>();
        const int64_t n = inputs[k].type.num_elements();
        const std::vector<float> s = round_to_scaled_f16(x, n, shifts[k]);
        const std::vector<float> p = round_to_scaled_f16(x, n, 0);
        scaled[k] = HostTensor::zeros(inputs[k].type);
        plain[k] = HostTensor::zeros(inputs[k].type);
        std::copy(s.begin(), s.end(), scaled[k].as<float>());
        std::copy(p.begin(), p.end(), plain[k].as<float>());
      }
      auto cpu = CpuExecutor::create(graph);
      ASSERT_TRUE(cpu.is_ok());
      std::vector<HostTensor> expected, unscaled, got;
      std::vector<HostTensor> exact;
      ASSERT_TRUE((*cpu)->run(scaled, &expected).is_ok());
      ASSERT_TRUE((*cpu)->run(plain, &unscaled).is_ok());
      ASSERT_TRUE((*cpu)->run(inputs, &exact).is_ok());
      CudaExecutorOptions options;
      options.f16 = true;
      auto gpu = CudaExecutor::create(graph, options);
      ASSERT_TRUE(gpu.is_ok()) << gpu.status().message();
      Status status = (*gpu)->run(inputs, &got);
      ASSERT_TRUE(status.is_ok()) << status.message();
      double largest = 0;
      for (int64_t i = 0; i < expected[0].type.num_elements(); ++i)
        largest = std::max(largest, std::fabs(double{expected[0].as<float>()[i]}));
      ASSERT_GT(largest, 0);
      EXPECT_LE(max_difference(got[0], expected[0]) / largest, 1e-5);
      // Scaled, the operands keep f16's 11 bits: the product is the f32 one
      // but for their rounding.
      EXPECT_LE(max_difference(expected[0], exact[0]) / largest, 2e-2);
      // Plain f16 loses the tiny operands' bits and overflows on the huge
      // ones (inf, NaN); scaled, nothing is lost.
      if (ma != 1.0f || mb != 1.0f) {
        bool lost = false;
        for (int64_t i = 0; i < expected[0].type.num_elements(); ++i)
          lost = lost || !(std::fabs(unscaled[0].as<float>()[i] - expected[0].as<float>()[i]) <=
                           1e-3 * largest);
        EXPECT_TRUE(lost);
      }
    }
}

// Mixed precision (bf16, or scaled f16) trains within `tolerance` of the
// CPU's f32 (losses and weights after 4 steps) and replays bitwise.
void expect_half_training_close(bool f16, double tolerance) {
  for (const Graph &graph : {mlp_graph(), gpt_graph()}) {
    SCOPED_TRACE(graph.name());
    auto cpu = CpuExecutor::create(graph);
    ASSERT_TRUE(cpu.is_ok());
    CudaExecutorOptions options;
    options.bf16 = !f16;
    options.f16 = f16;
    options.cuda_graph = false;
    auto eager = CudaExecutor::create(graph, options);
    options.cuda_graph = true;
    auto replayed = CudaExecutor::create(graph, options);
    ASSERT_TRUE(eager.is_ok() && replayed.is_ok());
    for (uint64_t step = 0; step < 4; ++step) {
      std::vector<HostTensor> inputs = random_inputs(graph, 100 + step), a, b, c;
      ASSERT_TRUE((*cpu)->run(inputs, &a).is_ok());
      ASSERT_TRUE((*eager)->run(inputs, &b).is_ok());
      ASSERT_TRUE((*replayed)->run(inputs, &c).is_ok());
      EXPECT_LE(max_difference(b[0], a[0]), tolerance) << "loss, step " << step;
      EXPECT_EQ(std::memcmp(b[0].data(), c[0].data(), b[0].size_bytes()), 0);
    }
    for (TensorId id = 0; id < graph.num_tensors(); ++id) {
      const Tensor &t = graph.tensor(id);
      if (t.kind != TensorKind::kParameter || t.type.dtype != DType::kF32) continue;
      EXPECT_LE(max_difference((*eager)->value(id), (*cpu)->value(id)), tolerance) << t.name;
    }
  }
}

TEST_F(CudaGpuTest, Bf16TrainingStaysCloseToF32) { expect_half_training_close(false, 2e-2); }

// f16 keeps 11 bits to bf16's 8: closer.
TEST_F(CudaGpuTest, F16TrainingStaysCloseToF32) {
  expect_half_training_close(true, 1e-2);
  CudaExecutorOptions both;
  both.bf16 = both.f16 = true;
  auto refused = CudaExecutor::create(mlp_graph(), both);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("not both"), std::string::npos);
}

// Elementwise chains run as one kernel give bitwise the losses and weights of
// the same nodes run one by one (the GPT training graph has six: the scores'
// scale and mask, the biases and residual adds).
// node_times: every node that launches work gets a positive time, nodes a
// fused chain runs get 0, and the timed step is a real step (the weights
// move as in a plain one).
TEST_F(CudaGpuTest, NodeTimesTimeEveryLaunchedNode) {
  const Graph graph = gpt_graph();
  auto timed = CudaExecutor::create(graph);
  auto plain = CudaExecutor::create(graph);
  ASSERT_TRUE(timed.is_ok() && plain.is_ok());
  const std::vector<HostTensor> inputs = random_inputs(graph, 5);
  auto times = (*timed)->node_times(inputs);
  ASSERT_TRUE(times.is_ok()) << times.status().message();
  ASSERT_EQ(times->size(), static_cast<size_t>(graph.num_nodes()));
  size_t zero = 0;
  for (NodeId n = 0; n < graph.num_nodes(); ++n) {
    EXPECT_GE((*times)[n], 0.0) << graph.node(n).name;
    zero += (*times)[n] == 0.0;
  }
  EXPECT_LT(zero, static_cast<size_t>(graph.num_nodes()) / 2);
  std::vector<HostTensor> out;
  ASSERT_TRUE((*plain)->run(inputs, &out).is_ok());
  for (TensorId id = 0; id < graph.num_tensors(); ++id) {
    if (graph.tensor(id).kind != TensorKind::kParameter) continue;
    EXPECT_EQ(max_difference((*timed)->value(id), (*plain)->value(id)), 0.0)
        << graph.tensor(id).name;
  }
}

TEST_F(CudaGpuTest, FusedChainsEqualTheNodesOneByOne) {
  for (const Graph &graph : {gpt_graph()}) {
    SCOPED_TRACE(graph.name());
    CudaExecutorOptions options;
    options.fuse = false;
    auto plain = CudaExecutor::create(graph, options);
    options.fuse = true;
    auto fused = CudaExecutor::create(graph, options);
    ASSERT_TRUE(plain.is_ok() && fused.is_ok());
    EXPECT_EQ((*plain)->fused_chains(), 0);
    EXPECT_GT((*fused)->fused_chains(), 0);
    for (uint64_t step = 0; step < 3; ++step) {
      std::vector<HostTensor> inputs = random_inputs(graph, 100 + step), a, b;
      ASSERT_TRUE((*plain)->run(inputs, &a).is_ok());
      ASSERT_TRUE((*fused)->run(inputs, &b).is_ok());
      EXPECT_EQ(std::memcmp(a[0].data(), b[0].data(), a[0].size_bytes()), 0) << "step " << step;
    }
    for (TensorId id = 0; id < graph.num_tensors(); ++id) {
      const Tensor &t = graph.tensor(id);
      if (t.kind != TensorKind::kParameter && t.kind != TensorKind::kState) continue;
      const HostTensor &x = (*plain)->value(id);
      EXPECT_EQ(std::memcmp(x.data(), (*fused)->value(id).data(), x.size_bytes()), 0) << t.name;
    }
  }
}

// A chain that puts the running value on the right of Sub and Div, reads a
// rank-padded broadcast operand and a scalar, and uses Clip's bounds and the
// tanh GeluGrad.
Graph tricky_chain() {
  GraphBuilder b("chain", registry());
  TensorId x = b.input("x", DType::kF32, {4, 6});
  TensorId row = b.input("row", DType::kF32, {6});
  TensorId s = b.input("s", DType::kF32, {});
  TensorId t = b.op1("Sub", {row, x}, {}, "sub");
  t = b.op1("Div", {s, t}, {}, "div");
  t = b.op1("Clip", {t}, {{"min", -2.0}, {"max", 2.0}}, "clip");
  t = b.op1("GeluGrad", {x, t}, {{"approximate", std::string("tanh")}}, "gelu_grad");
  t = b.op1("Sub", {row, t}, {}, "sub2");
  b.output(b.op1("Mul", {t, t}, {}, "square"));
  auto graph = std::move(b).finish();
  EXPECT_TRUE(graph.is_ok()) << graph.status().message();
  return graph.is_ok() ? std::move(graph).value() : Graph("broken");
}

// The premises of the GPU test below: a valid graph the CPU runs, one chain.
TEST(CudaExecutor, TheTrickyChainIsOneChainOfSix) {
  if (cuda_unavailable_reason().find("built without") != std::string::npos)
    GTEST_SKIP() << cuda_unavailable_reason();
  const Graph graph = tricky_chain();
  auto cpu = CpuExecutor::create(graph);
  ASSERT_TRUE(cpu.is_ok()) << cpu.status().message();
  std::vector<HostTensor> outputs;
  ASSERT_TRUE((*cpu)->run(random_inputs(graph, 5), &outputs).is_ok());
  auto layout = cuda_layout(graph, 1 << 20, 0, false, true);
  ASSERT_TRUE(layout.is_ok()) << layout.status().message();
  ASSERT_EQ(layout->chains.size(), 1u);
  EXPECT_EQ(layout->chains[0].size(), 6u);
}

// Fused, that chain is bitwise the nodes one by one.
TEST_F(CudaGpuTest, AFusedChainKeepsOperandOrderBroadcastsAndAttributes) {
  const Graph graph = tricky_chain();
  const std::vector<HostTensor> inputs = random_inputs(graph, 5);
  CudaExecutorOptions options;
  options.fuse = false;
  auto plain = CudaExecutor::create(graph, options);
  options.fuse = true;
  auto fused = CudaExecutor::create(graph, options);
  ASSERT_TRUE(plain.is_ok() && fused.is_ok());
  EXPECT_EQ((*fused)->fused_chains(), 1);
  std::vector<HostTensor> a, c;
  ASSERT_TRUE((*plain)->run(inputs, &a).is_ok());
  ASSERT_TRUE((*fused)->run(inputs, &c).is_ok());
  EXPECT_EQ(std::memcmp(a[0].data(), c[0].data(), a[0].size_bytes()), 0);
}

// Pow with a one-element exponent of 2 or 1 is the exact product (x * x, or
// x) on the CPU; so on the GPU, node by node and fused into a chain.
TEST_F(CudaGpuTest, PowOfAScalarTwoOrOneIsTheCpusExactProduct) {
  GraphBuilder b("pow", registry());
  TensorId x = b.input("x", DType::kF32, {4099});
  TensorId e = b.input("e", DType::kF32, {});
  TensorId y = b.op1("Pow", {x, e}, {}, "pow");
  b.output(b.op1("Add", {y, x}, {}, "add"));
  auto graph = std::move(b).finish();
  ASSERT_TRUE(graph.is_ok()) << graph.status().message();
  std::vector<HostTensor> inputs = random_inputs(*graph, 11);
  auto cpu = CpuExecutor::create(*graph);
  ASSERT_TRUE(cpu.is_ok());
  for (float exponent : {2.0f, 1.0f, 3.0f}) {
    *reinterpret_cast<float *>(inputs[1].data()) = exponent;
    std::vector<HostTensor> expected, got;
    ASSERT_TRUE((*cpu)->run(inputs, &expected).is_ok());
    for (bool fuse : {false, true}) {
      SCOPED_TRACE(str_cat("exponent ", exponent, fuse ? ", fused" : ""));
      CudaExecutorOptions options;
      options.fuse = fuse;
      auto gpu = CudaExecutor::create(*graph, options);
      ASSERT_TRUE(gpu.is_ok()) << gpu.status().message();
      EXPECT_EQ((*gpu)->fused_chains(), fuse ? 1 : 0);
      ASSERT_TRUE((*gpu)->run(inputs, &got).is_ok());
      if (exponent == 3.0f) {
        EXPECT_LE(max_difference(got[0], expected[0]), 1e-5);
        continue;
      }
      EXPECT_EQ(std::memcmp(got[0].data(), expected[0].data(), got[0].size_bytes()), 0);
    }
  }
}

// Gelu and GeluGrad, erf and tanh forms, run the CPU kernels' own math
// (ops/kernels/gelu_math.h) on the GPU: bit for bit over the whole range,
// tails, zeros and infinities included (NaN in, NaN out).
TEST_F(CudaGpuTest, GeluIsTheCpusBitForBit) {
  constexpr int64_t kN = 4801;
  GraphBuilder b("gelu", registry());
  TensorId x = b.input("x", DType::kF32, {kN});
  TensorId dy = b.input("dy", DType::kF32, {kN});
  for (const char *form : {"none", "tanh"}) {
    const std::vector<Attribute> attrs = {{"approximate", std::string(form)}};
    b.output(b.op1("Gelu", {x}, attrs, str_cat("gelu_", form)));
    b.output(b.op1("GeluGrad", {dy, x}, attrs, str_cat("gelu_grad_", form)));
  }
  auto graph = std::move(b).finish();
  ASSERT_TRUE(graph.is_ok()) << graph.status().message();
  std::vector<HostTensor> inputs = random_inputs(*graph, 5);
  float *xs = reinterpret_cast<float *>(inputs[0].data());
  for (int64_t i = 0; i < kN - 5; ++i)
    xs[i] = -12.0f + 24.0f * static_cast<float>(i) / static_cast<float>(kN - 6);
  const float specials[5] = {-0.0f, std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::quiet_NaN(), 1e-30f};
  std::copy(specials, specials + 5, xs + kN - 5);
  auto cpu = CpuExecutor::create(*graph);
  ASSERT_TRUE(cpu.is_ok());
  std::vector<HostTensor> expected, got;
  ASSERT_TRUE((*cpu)->run(inputs, &expected).is_ok());
  for (bool fuse : {false, true}) {
    CudaExecutorOptions options;
    options.fuse = fuse;
    auto gpu = CudaExecutor::create(*graph, options);
    ASSERT_TRUE(gpu.is_ok()) << gpu.status().message();
    ASSERT_TRUE((*gpu)->run(inputs, &got).is_ok());
    ASSERT_EQ(got.size(), 4u);
    for (size_t k = 0; k < got.size(); ++k) {
      const float *want = reinterpret_cast<const float *>(expected[k].data());
      const float *have = reinterpret_cast<const float *>(got[k].data());
      int64_t differing = 0;
      for (int64_t i = 0; i < kN; ++i) {
        if (std::isnan(want[i]) && std::isnan(have[i])) continue;
        if (std::memcmp(&want[i], &have[i], sizeof(float)) != 0 && differing++ < 3)
          ADD_FAILURE() << "output " << k << " x = " << xs[i] << ": cpu " << want[i] << ", gpu "
                        << have[i];
      }
      EXPECT_EQ(differing, 0) << "output " << k;
    }
  }
}

// Max pooling through cuDNN and through strata's kernels on what random
// inputs never hold: tied maxima (zeros after a ReLU; the gradient goes to
// the first) and a plane of -inf. Both give the CPU's bits, or the test says
// where cuDNN differs.
TEST_F(CudaGpuTest, MaxPoolTiesAndInfinitiesAreTheCpus) {
  GraphBuilder b("pool_ties", registry());
  TensorId x = b.input("x", DType::kF32, {1, 2, 6, 6});
  TensorId dy = b.input("dy", DType::kF32, {1, 2, 3, 3});
  const std::vector<Attribute> window = {{"kernel_shape", std::vector<int64_t>{2, 2}},
                                         {"strides", std::vector<int64_t>{2, 2}}};
  b.output(b.op1("MaxPool2d", {x}, window, "pool"));
  b.output(b.op1("MaxPool2dGrad", {dy, x}, window, "pool_grad"));
  auto graph = std::move(b).finish();
  ASSERT_TRUE(graph.is_ok()) << graph.status().message();
  std::vector<HostTensor> inputs = random_inputs(*graph, 9);
  float *xs = inputs[0].as<float>();
  for (int64_t i = 0; i < 36; ++i) // plane 0: ties of zeros, a few positives
    xs[i] = i % 5 == 0 ? 0.5f * static_cast<float>(i % 3) : 0.0f;
  for (int64_t i = 36; i < 72; ++i) // plane 1: -inf throughout
    xs[i] = -std::numeric_limits<float>::infinity();
  auto cpu = CpuExecutor::create(*graph);
  ASSERT_TRUE(cpu.is_ok());
  std::vector<HostTensor> expected, got;
  ASSERT_TRUE((*cpu)->run(inputs, &expected).is_ok());
  for (bool cudnn : {true, false}) {
    SCOPED_TRACE(cudnn ? "cuDNN" : "strata's kernels");
    CudaExecutorOptions options;
    options.cudnn_pool_norm = cudnn;
    auto gpu = CudaExecutor::create(*graph, options);
    ASSERT_TRUE(gpu.is_ok()) << gpu.status().message();
    ASSERT_TRUE((*gpu)->run(inputs, &got).is_ok());
    for (size_t k = 0; k < 2; ++k)
      for (int64_t i = 0; i < got[k].type.num_elements(); ++i)
        EXPECT_EQ(got[k].as<float>()[i], expected[k].as<float>()[i])
            << (k == 0 ? "output " : "gradient ") << i;
  }
}

// A bool byte other than 0 or 1 casts to 1, as on the CPU.
TEST_F(CudaGpuTest, CastReadsAnyNonZeroBoolByteAsTrue) {
  GraphBuilder b("cast", registry());
  TensorId x = b.input("x", DType::kBool, {4});
  b.output(b.op1("Cast", {x}, {{"to", std::string("f32")}}, "cast"));
  auto graph = std::move(b).finish();
  ASSERT_TRUE(graph.is_ok()) << graph.status().message();
  HostTensor flags = HostTensor::zeros(TensorType{DType::kBool, {4}});
  const uint8_t bytes[4] = {0, 1, 2, 255};
  std::memcpy(flags.data(), bytes, 4);
  auto gpu = CudaExecutor::create(*graph);
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().message();
  std::vector<HostTensor> got;
  ASSERT_TRUE((*gpu)->run({flags}, &got).is_ok());
  const float *y = reinterpret_cast<const float *>(got[0].data());
  EXPECT_EQ(std::vector<float>(y, y + 4), (std::vector<float>{0, 1, 1, 1}));
}

TEST_F(CudaGpuTest, MlpTrainsAsOnTheCpu) { expect_training_matches(mlp_graph(), 1e-4, true); }

TEST_F(CudaGpuTest, GptTrainsAsOnTheCpu) { expect_training_matches(gpt_graph(), 1e-4, true); }

TEST_F(CudaGpuTest, ConvnetTrainsAsOnTheCpu) {
  if (!STRATA_HAVE_CUDNN) GTEST_SKIP() << "this build has no cuDNN";
  expect_training_matches(convnet_graph(), 1e-4, true);
}

} // namespace
} // namespace strata::runtime
