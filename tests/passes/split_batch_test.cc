// Tests of split_batch (passes/split_batch.cc): the zoo models rebuilt at batch
// B / M have the expected shapes, keep every name, id and value source, and give
// on the M slices of a batch exactly what the full-batch graph gives on the whole
// batch; a training step per micro-batch averages to the full batch's step; and
// graphs whose batch cannot be split are refused with an error naming the input
// or node.
#include <algorithm>
#include <cmath>
#include <cstring>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "graph/builder.h"
#include "graph/verifier.h"
#include "ops/registry.h"
#include "passes/make_training.h"
#include "passes/split_batch.h"
#include "runtime/cpu/executor.h"
#include "tools/zoo.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

const ops::OpRegistry &registry() { return ops::OpRegistry::global(); }

Shape shape_of(const Graph &g, std::string_view tensor) {
  std::optional<TensorId> id = g.find_tensor(tensor);
  EXPECT_TRUE(id.has_value()) << tensor;
  return id ? g.tensor(*id).type.shape : Shape{};
}

std::vector<int64_t> shape_attr(const Graph &g, std::string_view node) {
  std::optional<NodeId> id = g.find_node(node);
  EXPECT_TRUE(id.has_value()) << node;
  return id ? g.node(*id).ints_attr("shape").value_or(std::vector<int64_t>{})
            : std::vector<int64_t>{};
}

// Slice `part` of `parts` equal slices of `t` along `dim`.
HostTensor slice(const HostTensor &t, int64_t dim, int64_t part, int64_t parts) {
  TensorType type = t.type;
  const int64_t n = type.shape[dim] / parts;
  type.shape[dim] = n;
  HostTensor out = HostTensor::zeros(type);
  const int64_t outer = num_elements(llvm::ArrayRef<int64_t>(t.type.shape).take_front(dim));
  const int64_t inner = num_elements(llvm::ArrayRef<int64_t>(t.type.shape).drop_front(dim + 1)) *
                        static_cast<int64_t>(dtype_size(type.dtype));
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(out.data() + o * n * inner, t.data() + (o * t.type.shape[dim] + part * n) * inner,
                static_cast<size_t>(n * inner));
  return out;
}

// The largest |a - b| / max(1, |a|) over the elements of two f32 tensors.
double max_relative_difference(const HostTensor &a, const HostTensor &b) {
  EXPECT_EQ(a.type, b.type);
  double worst = 0;
  for (int64_t i = 0, n = a.type.num_elements(); i < n; ++i) {
    const double x = a.as<float>()[i], y = b.as<float>()[i];
    worst = std::max(worst, std::abs(x - y) / std::max(1.0, std::abs(x)));
  }
  return worst;
}

std::vector<HostTensor> run(const Graph &g, const std::vector<HostTensor> &inputs) {
  auto executor = runtime::CpuExecutor::create(g);
  EXPECT_TRUE(executor.is_ok()) << executor.status().to_string();
  std::vector<HostTensor> outputs;
  if (!executor.is_ok()) return outputs;
  Status status = (*executor)->run(inputs, &outputs);
  EXPECT_TRUE(status.is_ok()) << status.to_string();
  return outputs;
}

// Runs `full` on random inputs and `split` on each of the M slices of them along
// dim 0; each output's slice along `output_dims[k]` (default 0) must match.
void expect_same_results(const Graph &full, const Graph &split, int64_t m,
                         std::vector<int64_t> output_dims = {}, uint64_t seed = 7) {
  std::vector<HostTensor> inputs = runtime::random_inputs(full, seed);
  std::vector<HostTensor> expected = run(full, inputs);
  ASSERT_EQ(expected.size(), full.outputs().size());
  output_dims.resize(expected.size(), 0);
  for (int64_t part = 0; part < m; ++part) {
    std::vector<HostTensor> slices;
    for (const HostTensor &t : inputs)
      slices.push_back(slice(t, 0, part, m));
    std::vector<HostTensor> got = run(split, slices);
    ASSERT_EQ(got.size(), expected.size());
    for (size_t k = 0; k < got.size(); ++k) {
      HostTensor want = slice(expected[k], output_dims[k], part, m);
      EXPECT_LE(max_relative_difference(want, got[k]), 1e-6)
          << "output " << k << " of micro-batch " << part << " of " << m;
    }
  }
}

Graph split_or_die(const Graph &g, int64_t m) {
  Result<Graph> split = passes::split_batch(g, m);
  EXPECT_TRUE(split.is_ok()) << split.status().to_string();
  if (!split.is_ok()) return g;
  Status verified = verify_graph(*split, registry());
  EXPECT_TRUE(verified.is_ok()) << verified.to_string();
  return std::move(split).value();
}

std::string split_error(const Graph &g, int64_t m) {
  Result<Graph> split = passes::split_batch(g, m);
  EXPECT_FALSE(split.is_ok());
  return split.is_ok() ? std::string() : split.status().message();
}

// Everything but types and shape attributes is the full-batch graph's.
void expect_same_structure(const Graph &full, const Graph &split) {
  EXPECT_EQ(split.name(), full.name());
  ASSERT_EQ(split.num_tensors(), full.num_tensors());
  ASSERT_EQ(split.num_nodes(), full.num_nodes());
  for (TensorId id = 0; id < full.num_tensors(); ++id) {
    const Tensor &a = full.tensor(id), &b = split.tensor(id);
    EXPECT_EQ(b.name, a.name);
    EXPECT_EQ(b.kind, a.kind);
    EXPECT_EQ(b.producer, a.producer);
    EXPECT_EQ(b.data, a.data) << a.name;
    EXPECT_EQ(b.external, a.external);
    EXPECT_EQ(b.initializer, a.initializer) << a.name;
    EXPECT_EQ(b.type.dtype, a.type.dtype);
    EXPECT_EQ(b.type.rank(), a.type.rank());
    if (a.kind != TensorKind::kInput && a.kind != TensorKind::kIntermediate) {
      EXPECT_EQ(b.type, a.type) << a.name;
    }
  }
  for (NodeId id = 0; id < full.num_nodes(); ++id) {
    const Node &a = full.node(id), &b = split.node(id);
    EXPECT_EQ(b.name, a.name);
    EXPECT_EQ(b.op, a.op);
    EXPECT_EQ(b.inputs, a.inputs);
    EXPECT_EQ(b.outputs, a.outputs);
    ASSERT_EQ(b.attrs.size(), a.attrs.size()) << a.name;
    for (size_t i = 0; i < a.attrs.size(); ++i) {
      EXPECT_EQ(b.attrs[i].name, a.attrs[i].name);
      if (a.attrs[i].name != "shape") {
        EXPECT_EQ(b.attrs[i], a.attrs[i]) << a.name;
      }
    }
  }
  EXPECT_EQ(split.inputs(), full.inputs());
  EXPECT_EQ(split.outputs(), full.outputs());
  EXPECT_EQ(split.updates(), full.updates());
}

// ---------------------------------------------------------------------------
// The zoo.

class SplitZooTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(SplitZooTest, Mlp) {
  const int64_t m = GetParam();
  zoo::MlpOptions o;
  o.batch = 8;
  o.input = 24;
  o.hidden = {16, 12};
  o.classes = 5;
  Graph full = zoo::make_mlp(o).value();
  Graph split = split_or_die(full, m);
  const int64_t b = o.batch / m;
  EXPECT_EQ(shape_of(split, "x"), (Shape{b, 24}));
  EXPECT_EQ(shape_of(split, "fc0.relu"), (Shape{b, 16}));
  EXPECT_EQ(split.tensor(split.outputs()[0]).type.shape, (Shape{b, 5}));
  expect_same_structure(full, split);
  expect_same_results(full, split, m);
}

TEST_P(SplitZooTest, Convnet) {
  const int64_t m = GetParam();
  zoo::ConvnetOptions o;
  o.batch = 8;
  o.image_size = 8;
  o.channels = {4, 8};
  o.fc_hidden = 16;
  o.classes = 5;
  Graph full = zoo::make_convnet(o).value();
  Graph split = split_or_die(full, m);
  const int64_t b = o.batch / m;
  EXPECT_EQ(shape_of(split, "image"), (Shape{b, 3, 8, 8}));
  EXPECT_EQ(shape_of(split, "conv1.pool"), (Shape{b, 8, 2, 2}));
  EXPECT_EQ(shape_of(split, "flatten"), (Shape{b, 32}));
  EXPECT_EQ(split.tensor(split.outputs()[0]).type.shape, (Shape{b, 5}));
  expect_same_structure(full, split);
  expect_same_results(full, split, m);
}

TEST_P(SplitZooTest, Gpt) {
  const int64_t m = GetParam();
  zoo::GptOptions o;
  o.layers = 2;
  o.hidden = 32;
  o.heads = 4;
  o.seq = 8;
  o.vocab = 64;
  o.batch = 4;
  Graph full = zoo::make_gpt(o).value();
  Graph split = split_or_die(full, m);
  const int64_t b = o.batch / m, S = o.seq, H = o.hidden, NH = o.heads, HD = H / NH, V = o.vocab;
  EXPECT_EQ(shape_of(split, "tokens"), (Shape{b, S}));
  EXPECT_EQ(split.tensor(split.outputs()[0]).type.shape, (Shape{b, S, V}));
  // Reshape's shape attribute is rewritten; Transpose moves the batch to dim 1.
  EXPECT_EQ(shape_attr(split, "layer0.attn.split_heads"), (std::vector<int64_t>{b, S, 3, NH, HD}));
  EXPECT_EQ(shape_attr(split, "layer1.attn.merge_heads"), (std::vector<int64_t>{b, S, H}));
  EXPECT_EQ(shape_of(split, "layer0.attn.heads_first"), (Shape{3, b, NH, S, HD}));
  EXPECT_EQ(shape_of(split, "layer0.attn.q"), (Shape{b, NH, S, HD}));
  EXPECT_EQ(shape_of(split, "layer0.attn.softmax"), (Shape{b, NH, S, S}));
  EXPECT_EQ(shape_of(split, "layer1.attn.seq_first"), (Shape{b, S, NH, HD}));
  // Tensors that do not depend on the input keep their full types.
  EXPECT_EQ(shape_of(split, "attn.causal_mask"), (Shape{S, S}));
  EXPECT_EQ(shape_of(split, "wte"), (Shape{V, H}));
  expect_same_structure(full, split);
  expect_same_results(full, split, m);
  // The full graph is untouched.
  EXPECT_EQ(shape_attr(full, "layer0.attn.split_heads"),
            (std::vector<int64_t>{o.batch, S, 3, NH, HD}));
}

INSTANTIATE_TEST_SUITE_P(Microbatches, SplitZooTest, ::testing::Values(1, 2, 4),
                         [](const auto &info) { return "M" + std::to_string(info.param); });

TEST(SplitBatchTest, OneMicrobatchIsAnIdenticalCopy) {
  zoo::GptOptions o;
  o.layers = 1;
  Graph full = zoo::make_gpt(o).value();
  Graph copy = split_or_die(full, 1);
  expect_same_structure(full, copy);
  for (TensorId id = 0; id < full.num_tensors(); ++id)
    EXPECT_EQ(copy.tensor(id).type, full.tensor(id).type);
  for (NodeId id = 0; id < full.num_nodes(); ++id)
    EXPECT_EQ(copy.node(id).attrs, full.node(id).attrs);
}

// The intended use: one training step per micro-batch (fresh weights each time),
// averaged, is the full batch's step. With plain SGD the updated weights are
// linear in the gradient, so their mean over micro-batches is the full step's.
void expect_steps_average_to_full_step(const Graph &forward, int64_t m) {
  passes::TrainingOptions options;
  options.optimizer.lr = 0.5;
  Graph full = passes::make_training_graph(forward, options).value();
  Graph split = passes::make_training_graph(split_or_die(forward, m), options).value();
  std::vector<HostTensor> inputs = runtime::random_inputs(full, 11);

  auto full_exec = std::move(runtime::CpuExecutor::create(full)).value();
  std::vector<HostTensor> full_loss;
  ASSERT_TRUE(full_exec->run(inputs, &full_loss).is_ok());

  std::vector<TensorId> params;
  for (TensorId id = 0; id < full.num_tensors(); ++id)
    if (full.tensor(id).kind == TensorKind::kParameter) params.push_back(id);
  std::vector<std::vector<double>> mean(params.size());
  for (size_t p = 0; p < params.size(); ++p)
    mean[p].assign(static_cast<size_t>(full.tensor(params[p]).type.num_elements()), 0.0);
  double loss = 0;
  for (int64_t part = 0; part < m; ++part) {
    std::vector<HostTensor> slices;
    for (const HostTensor &t : inputs)
      slices.push_back(slice(t, 0, part, m));
    auto exec = std::move(runtime::CpuExecutor::create(split)).value();
    std::vector<HostTensor> outputs;
    Status status = exec->run(slices, &outputs);
    ASSERT_TRUE(status.is_ok()) << status.to_string();
    loss += outputs[0].as<float>()[0] / static_cast<double>(m);
    for (size_t p = 0; p < params.size(); ++p) {
      const float *w = exec->value(params[p]).as<float>();
      for (size_t i = 0; i < mean[p].size(); ++i)
        mean[p][i] += w[i] / static_cast<double>(m);
    }
  }
  EXPECT_NEAR(loss, full_loss[0].as<float>()[0], 1e-5 * std::max(1.0, std::abs(loss)));
  for (size_t p = 0; p < params.size(); ++p) {
    const float *w = full_exec->value(params[p]).as<float>();
    double worst = 0;
    for (size_t i = 0; i < mean[p].size(); ++i)
      worst = std::max(worst, std::abs(mean[p][i] - w[i]) / std::max(1.0, std::abs(double(w[i]))));
    EXPECT_LE(worst, 1e-5) << full.tensor(params[p]).name;
  }
}

TEST(SplitBatchTest, MicrobatchTrainingStepsAverageToTheFullStepMlp) {
  zoo::MlpOptions o;
  o.batch = 8;
  o.input = 12;
  o.hidden = {10};
  o.classes = 4;
  expect_steps_average_to_full_step(zoo::make_mlp(o).value(), 4);
}

TEST(SplitBatchTest, MicrobatchTrainingStepsAverageToTheFullStepGpt) {
  zoo::GptOptions o;
  o.layers = 1;
  o.hidden = 16;
  o.heads = 2;
  o.seq = 4;
  o.vocab = 32;
  o.batch = 4;
  expect_steps_average_to_full_step(zoo::make_gpt(o).value(), 2);
}

// ---------------------------------------------------------------------------
// Shape attributes and batch tracking on small graphs.

TEST(SplitBatchTest, RewritesReshapeShapesWithInferredAndCopiedDims) {
  GraphBuilder b("g", registry());
  TensorId x = b.input("x", DType::kF32, {6, 4, 3});
  // [B, S, H] -> [B*S, H] (-1) -> [B, S*H] (literal B) -> [B, S, H] (0 copies B).
  TensorId rows = b.op1("Reshape", {x}, {{"shape", std::vector<int64_t>{-1, 3}}}, "rows");
  TensorId wide = b.op1("Reshape", {rows}, {{"shape", std::vector<int64_t>{6, 12}}}, "wide");
  TensorId back = b.op1("Reshape", {wide}, {{"shape", std::vector<int64_t>{0, 4, 3}}}, "back");
  TensorId y = b.op1("Relu", {back}, {}, "y");
  b.output(y);
  Graph full = std::move(b).finish().value();
  Graph split = split_or_die(full, 3);
  EXPECT_EQ(shape_of(split, "rows"), (Shape{8, 3}));
  EXPECT_EQ(shape_attr(split, "rows"), (std::vector<int64_t>{-1, 3}));
  EXPECT_EQ(shape_of(split, "wide"), (Shape{2, 12}));
  EXPECT_EQ(shape_attr(split, "wide"), (std::vector<int64_t>{2, 12}));
  EXPECT_EQ(shape_attr(split, "back"), (std::vector<int64_t>{0, 4, 3}));
  EXPECT_EQ(shape_of(split, "y"), (Shape{2, 4, 3}));
  expect_same_structure(full, split);
  expect_same_results(full, split, 3);
}

TEST(SplitBatchTest, RewritesExpandAndFollowsTheBatchThroughTranspose) {
  GraphBuilder b("g", registry());
  TensorId x = b.input("x", DType::kF32, {4, 1, 3});
  TensorId wide = b.op1("Expand", {x}, {{"shape", std::vector<int64_t>{4, 5, 3}}}, "wide");
  // Leading 1s in Expand's shape and a broadcast batch-less operand.
  TensorId more = b.op1("Expand", {wide}, {{"shape", std::vector<int64_t>{1, 1, 5, 1}}}, "more");
  TensorId bias = b.parameter("bias", DType::kF32, {5, 3}, Initializer{Initializer::Kind::kOnes});
  TensorId sum = b.op1("Add", {more, bias}, {}, "sum");
  TensorId t = b.op1("Transpose", {sum}, {{"perm", std::vector<int64_t>{2, 3, 1, 0}}}, "t");
  b.output(t);
  Graph full = std::move(b).finish().value();
  Graph split = split_or_die(full, 2);
  EXPECT_EQ(shape_attr(split, "wide"), (std::vector<int64_t>{2, 5, 3}));
  EXPECT_EQ(shape_attr(split, "more"), (std::vector<int64_t>{1, 1, 5, 1}));
  EXPECT_EQ(shape_of(split, "more"), (Shape{1, 2, 5, 3}));
  EXPECT_EQ(shape_of(split, "t"), (Shape{5, 3, 2, 1}));
  expect_same_results(full, split, 2, {2});
}

TEST(SplitBatchTest, ReductionsAndSoftmaxAwayFromTheBatchAreKept) {
  GraphBuilder b("g", registry());
  TensorId x = b.input("x", DType::kF32, {4, 3, 5});
  TensorId mean = b.op1("ReduceMean", {x}, {{"axes", std::vector<int64_t>{-1}}}, "mean");
  TensorId sum = b.op1("ReduceSum", {x},
                       {{"axes", std::vector<int64_t>{1, 2}}, {"keepdims", int64_t{0}}}, "sum");
  TensorId soft = b.op1("Softmax", {x}, {{"axis", int64_t{1}}}, "soft");
  b.output(mean);
  b.output(sum);
  b.output(soft);
  Graph full = std::move(b).finish().value();
  Graph split = split_or_die(full, 4);
  EXPECT_EQ(shape_of(split, "mean"), (Shape{1, 3, 1}));
  EXPECT_EQ(shape_of(split, "sum"), (Shape{1}));
  expect_same_results(full, split, 4);
}

// ---------------------------------------------------------------------------
// Errors.

TEST(SplitBatchErrorTest, MicrobatchesBelowOne) {
  Graph g = zoo::make_mlp({}).value();
  EXPECT_THAT(split_error(g, 0), HasSubstr("at least 1, got 0"));
  EXPECT_THAT(split_error(g, -2), HasSubstr("at least 1, got -2"));
}

TEST(SplitBatchErrorTest, IndivisibleBatch) {
  zoo::GptOptions o;
  o.batch = 6;
  o.layers = 1;
  EXPECT_EQ(split_error(zoo::make_gpt(o).value(), 4),
            "input 'tokens' has batch 6, which 4 micro-batches do not divide");
}

TEST(SplitBatchErrorTest, InputsWithDifferentBatches) {
  GraphBuilder b("g", registry());
  TensorId x = b.input("x", DType::kF32, {4, 3});
  TensorId y = b.input("y", DType::kF32, {2, 3});
  b.output(b.op1("Relu", {x}));
  b.output(b.op1("Relu", {y}));
  EXPECT_EQ(split_error(std::move(b).finish().value(), 2),
            "input 'y' has batch 2 but input 'x' has batch 4; dim 0 of every input must be the "
            "batch");
}

TEST(SplitBatchErrorTest, ScalarInput) {
  GraphBuilder b("g", registry());
  TensorId x = b.input("x", DType::kF32, {4, 3});
  TensorId s = b.input("temperature", DType::kF32, {});
  b.output(b.op1("Mul", {x, s}));
  EXPECT_THAT(split_error(std::move(b).finish().value(), 2),
              HasSubstr("input 'temperature' is a scalar (f32[])"));
}

TEST(SplitBatchErrorTest, NoInputs) {
  GraphBuilder b("g", registry());
  TensorId w = b.parameter("w", DType::kF32, {4}, Initializer{Initializer::Kind::kOnes});
  b.output(b.op1("Relu", {w}));
  EXPECT_THAT(split_error(std::move(b).finish().value(), 2), HasSubstr("has no inputs"));
}

Graph batch_norm_graph() {
  GraphBuilder b("bn", registry());
  TensorId x = b.input("x", DType::kF32, {4, 2, 3, 3});
  auto param = [&](std::string name, Initializer::Kind kind) {
    return b.parameter(std::move(name), DType::kF32, {2}, Initializer{kind});
  };
  TensorId scale = param("bn1.scale", Initializer::Kind::kOnes);
  TensorId bias = param("bn1.bias", Initializer::Kind::kZeros);
  TensorId mean = param("bn1.mean", Initializer::Kind::kZeros);
  TensorId var = param("bn1.var", Initializer::Kind::kOnes);
  b.output(b.op1("BatchNormalization", {x, scale, bias, mean, var}, {}, "bn1"));
  return std::move(b).finish().value();
}

TEST(SplitBatchErrorTest, BatchNormalizationWithMicrobatches) {
  EXPECT_EQ(split_error(batch_norm_graph(), 2),
            "node 'bn1' (BatchNormalization) normalizes over the batch; micro-batches would "
            "change its statistics");
  // One micro-batch is the full batch: nothing changes.
  EXPECT_TRUE(passes::split_batch(batch_norm_graph(), 1).is_ok());
}

// x [4, 3] -> `build` -> output.
template <typename F> Graph one_op_graph(F build, Shape shape = {4, 3}) {
  GraphBuilder b("g", registry());
  TensorId x = b.input("x", DType::kF32, shape);
  b.output(build(b, x));
  Result<Graph> g = std::move(b).finish();
  EXPECT_TRUE(g.is_ok()) << g.status().to_string();
  return std::move(g).value();
}

TEST(SplitBatchErrorTest, ReductionOverTheBatch) {
  Graph mean = one_op_graph([](GraphBuilder &b, TensorId x) {
    return b.op1("ReduceMean", {x}, {{"axes", std::vector<int64_t>{0}}}, "batch_mean");
  });
  EXPECT_THAT(split_error(mean, 2),
              HasSubstr("cannot split the batch through node 'batch_mean' (ReduceMean): reduces "
                        "over axis 0 of input 'x' f32[4, 3], which carries the batch"));
  Graph all = one_op_graph([](GraphBuilder &b, TensorId x) {
    return b.op1("ReduceSum", {x}, {{"keepdims", int64_t{0}}}, "total");
  });
  EXPECT_THAT(split_error(all, 2),
              HasSubstr("node 'total' (ReduceSum): reduces over every dim of input 'x'"));
  // The batch moved by a Transpose is still found.
  Graph moved = one_op_graph([](GraphBuilder &b, TensorId x) {
    TensorId t = b.op1("Transpose", {x}, {}, "t");
    return b.op1("ReduceMax", {t}, {{"axes", std::vector<int64_t>{-1}}}, "max");
  });
  EXPECT_THAT(split_error(moved, 2),
              HasSubstr("node 'max' (ReduceMax): reduces over axis -1 of input 't' f32[3, 4]"));
}

TEST(SplitBatchErrorTest, SoftmaxAlongTheBatch) {
  Graph g = one_op_graph([](GraphBuilder &b, TensorId x) {
    return b.op1("Softmax", {x}, {{"axis", int64_t{0}}}, "soft");
  });
  EXPECT_THAT(split_error(g, 2), HasSubstr("node 'soft' (Softmax): normalizes along axis 0"));
}

TEST(SplitBatchErrorTest, ContractionOverTheBatch) {
  // x^T x sums over the samples: the output no longer carries the batch.
  Graph g = one_op_graph([](GraphBuilder &b, TensorId x) {
    return b.op1("Gemm", {x, x}, {{"trans_a", int64_t{1}}}, "gram");
  });
  EXPECT_THAT(split_error(g, 2),
              HasSubstr("node 'gram' (Gemm): output 'gram' f32[3, 3] does not carry the batch"));
}

TEST(SplitBatchErrorTest, OuterProductOverTheBatch) {
  Graph g = one_op_graph([](GraphBuilder &b, TensorId x) {
    return b.op1("Gemm", {x, x}, {{"trans_b", int64_t{1}}}, "pairs");
  });
  EXPECT_THAT(split_error(g, 2),
              HasSubstr("node 'pairs' (Gemm): output 'pairs' would change in more than one dim, "
                        "from f32[4, 4] to f32[2, 2]"));
}

TEST(SplitBatchErrorTest, SelectingOrJoiningSamples) {
  Graph slice = one_op_graph([](GraphBuilder &b, TensorId x) {
    return b.op1("Slice", {x},
                 {{"ends", std::vector<int64_t>{2}}, {"starts", std::vector<int64_t>{0}}},
                 "first_two");
  });
  EXPECT_THAT(split_error(slice, 2), HasSubstr("node 'first_two' (Slice): slices axis 0"));
  Graph concat = one_op_graph([](GraphBuilder &b, TensorId x) {
    return b.op1("Concat", {x, x}, {{"axis", int64_t{0}}}, "twice");
  });
  EXPECT_THAT(split_error(concat, 2), HasSubstr("node 'twice' (Concat): joins along axis 0"));
  Graph gather = one_op_graph([](GraphBuilder &b, TensorId x) {
    TensorId t = b.op1("Transpose", {x}, {}, "t");
    TensorId idx = b.constant("idx", DType::kI64, {1}, Blob::zeroed(8));
    return b.op1("Gather", {t, idx}, {{"axis", int64_t{1}}}, "pick");
  });
  EXPECT_THAT(split_error(gather, 2), HasSubstr("node 'pick' (Gather): gathers along axis 1"));
  // A Slice that keeps the whole batch dim is fine.
  Graph whole = one_op_graph([](GraphBuilder &b, TensorId x) {
    return b.op1(
        "Slice", {x},
        {{"ends", std::vector<int64_t>{INT64_MAX, 2}}, {"starts", std::vector<int64_t>{0, 1}}},
        "cols");
  });
  Graph split = split_or_die(whole, 2);
  EXPECT_EQ(shape_of(split, "cols"), (Shape{2, 1}));
}

TEST(SplitBatchErrorTest, ReshapeThatInterleavesTheBatch) {
  // [B, H] -> [H, B] -> [H*B]: the micro-batches are not contiguous in the result.
  Graph reshape = one_op_graph([](GraphBuilder &b, TensorId x) {
    TensorId t = b.op1("Transpose", {x}, {}, "t");
    return b.op1("Reshape", {t}, {{"shape", std::vector<int64_t>{12}}}, "flat");
  });
  EXPECT_THAT(split_error(reshape, 2),
              HasSubstr("cannot split the batch through node 'flat' (Reshape): no dim of its "
                        "output f32[12] starts at the batch dim 1 of input 't' f32[3, 4]"));
  Graph flatten = one_op_graph([](GraphBuilder &b, TensorId x) {
    TensorId t = b.op1("Transpose", {x}, {}, "t");
    return b.op1("Flatten", {t}, {{"axis", int64_t{0}}}, "flat");
  });
  EXPECT_THAT(split_error(flatten, 2),
              HasSubstr("node 'flat' (Flatten): the batch dim 1 of input 't' f32[3, 4] is not the "
                        "outermost part of dim 1"));
}

TEST(SplitBatchErrorTest, TrainingDropout) {
  Graph g = one_op_graph([](GraphBuilder &b, TensorId x) {
    return b.op1("Dropout", {x}, {{"training", int64_t{1}}, {"ratio", 0.25}}, "drop");
  });
  EXPECT_THAT(split_error(g, 2), HasSubstr("node 'drop' (Dropout): training-mode Dropout"));
  // Inference-mode Dropout is the identity.
  Graph inference = one_op_graph([](GraphBuilder &b, TensorId x) {
    return b.op1("Dropout", {x}, {{"ratio", 0.25}}, "drop");
  });
  EXPECT_TRUE(passes::split_batch(inference, 2).is_ok());
}

TEST(SplitBatchErrorTest, BackwardOps) {
  // A training graph is split before make_training_graph, not after.
  zoo::MlpOptions o;
  o.batch = 4;
  o.input = 6;
  o.hidden = {5};
  o.classes = 3;
  Graph training =
      passes::make_training_graph(zoo::make_mlp(o).value(), passes::TrainingOptions{}).value();
  EXPECT_THAT(split_error(training, 2), HasSubstr("split the forward graph before"));
}

TEST(SplitBatchErrorTest, TensorParallelCollectives) {
  // Tensor parallelism adds them after micro-batching.
  Graph g = one_op_graph([](GraphBuilder &b, TensorId x) {
    return b.op1("TpAllReduce", {x}, {{"parts", int64_t{2}}}, "sum");
  });
  EXPECT_THAT(split_error(g, 2),
              HasSubstr("node 'sum' (TpAllReduce) of graph 'g' is a tensor-parallel collective: "
                        "split_batch rebuilds forward graphs; split the forward graph before "
                        "shard_tensor_parallel"));
}

TEST(SplitBatchErrorTest, AnOpWithoutABatchRule) {
  // Micro-batching fails closed: an op that does not say how the batch goes
  // through it could mix samples unseen, so its node is refused.
  Graph g = one_op_graph([](GraphBuilder &b, TensorId x) { return b.op1("Relu", {x}, {}, "mix"); });
  const Node &node = g.node(*g.find_node("mix"));
  ops::OpDef undeclared = *registry().find("Relu");
  undeclared.traits.batch = ops::BatchRule::kUndeclared;
  const Status refused = passes::check_batch_rule(node, undeclared, g);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(),
              HasSubstr("node 'mix' (Relu) of graph 'g' declares no batch rule: micro-batching "
                        "cannot tell whether it keeps samples apart"));
  // With its rule the node passes, and the graph splits.
  EXPECT_TRUE(passes::check_batch_rule(node, *registry().find("Relu"), g).is_ok());
  EXPECT_EQ(shape_of(split_or_die(g, 2), "mix"), (Shape{2, 3}));
}

TEST(SplitBatchErrorTest, BatchSizedConstantOperand) {
  // A constant spelled at the full batch cannot follow the split.
  Graph g = one_op_graph([](GraphBuilder &b, TensorId x) {
    TensorId c = b.parameter("c", DType::kF32, {4, 3}, Initializer{Initializer::Kind::kOnes});
    return b.op1("Add", {x, c}, {}, "sum");
  });
  EXPECT_THAT(split_error(g, 2), HasSubstr("cannot split the batch through node 'sum' (Add): "));
}

} // namespace
} // namespace strata
