#include "runtime/cpu/executor.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <unistd.h>

#include <gtest/gtest.h>

#include "graph/builder.h"
#include "ops/registry.h"
#include "runtime/random.h"
#include "serialization/safetensors.h"

namespace strata::runtime {
namespace {

const OpResolver &registry() { return ops::OpRegistry::global(); }

std::shared_ptr<const Blob> floats_blob(const std::vector<float> &values) {
  return Blob::copy_of(values.data(), values.size() * sizeof(float));
}

HostTensor make_tensor(DType dtype, Shape shape, const void *values) {
  HostTensor t = HostTensor::zeros({dtype, std::move(shape)});
  if (t.size_bytes() > 0) std::memcpy(t.data(), values, t.size_bytes());
  return t;
}
HostTensor floats(Shape shape, const std::vector<float> &values) {
  HostTensor t = make_tensor(DType::kF32, std::move(shape), values.data());
  EXPECT_EQ(t.type.num_elements(), static_cast<int64_t>(values.size()));
  return t;
}

std::vector<float> values_of(const HostTensor &t) {
  return std::vector<float>(t.as<float>(), t.as<float>() + t.type.num_elements());
}

Graph finish(GraphBuilder &&builder) {
  auto graph = std::move(builder).finish();
  EXPECT_TRUE(graph.is_ok()) << graph.status().to_string();
  return graph.is_ok() ? std::move(graph).value() : Graph();
}

std::unique_ptr<CpuExecutor> make_executor(Graph graph, ExecutorOptions options = {}) {
  auto executor = CpuExecutor::create(std::move(graph), options);
  EXPECT_TRUE(executor.is_ok()) << executor.status().to_string();
  return executor.is_ok() ? std::move(executor).value() : nullptr;
}

bool bitwise_equal(const HostTensor &a, const HostTensor &b) {
  return a.type == b.type && a.size_bytes() == b.size_bytes() &&
         std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

// relu(x @ w + b) with x [2, 3], w [3, 4], b [4].
Graph mlp_graph() {
  GraphBuilder b("mlp", registry());
  TensorId x = b.input("x", DType::kF32, {2, 3});
  TensorId w =
      b.parameter("w", DType::kF32, {3, 4}, floats_blob({1, 0, -1, 2, 0, 1, 1, -2, 1, 1, 0, 1}));
  TensorId bias = b.parameter("b", DType::kF32, {4}, floats_blob({0.5f, -1, 0, -10}));
  TensorId h = b.op1("MatMul", {x, w}, {}, "matmul");
  TensorId y = b.op1("Add", {h, bias}, {}, "add");
  b.output(b.op1("Relu", {y}, {}, "relu"));
  return finish(std::move(b));
}

TEST(CpuExecutor, MlpMatchesHandComputedReference) {
  auto executor = make_executor(mlp_graph());
  ASSERT_NE(executor, nullptr);
  EXPECT_EQ(executor->weight_bytes(), (12 + 4) * 4);
  const std::vector<float> x = {1, 2, 3, -1, 0, 2};
  std::vector<HostTensor> outputs;
  ASSERT_TRUE(executor->run({floats({2, 3}, x)}, &outputs).is_ok());
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(outputs[0].type, (TensorType{DType::kF32, {2, 4}}));
  // Reference computed by hand loops.
  const float w[3][4] = {{1, 0, -1, 2}, {0, 1, 1, -2}, {1, 1, 0, 1}};
  const float bias[4] = {0.5f, -1, 0, -10};
  std::vector<float> expected;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      float acc = bias[j];
      for (int k = 0; k < 3; ++k)
        acc += x[i * 3 + k] * w[k][j];
      expected.push_back(std::max(acc, 0.0f));
    }
  EXPECT_EQ(values_of(outputs[0]), expected);
  // Row 0: [4.5, 4, 1, 0]; row 1: [1.5, 1, 1, 0] (the last column is clipped).
  EXPECT_EQ(expected, (std::vector<float>{4.5f, 4, 1, 0, 1.5f, 1, 1, 0}));
}

TEST(CpuExecutor, Diamond) {
  // a = relu(x); out = a * a - (a + 1)
  GraphBuilder b("diamond", registry());
  TensorId x = b.input("x", DType::kF32, {5});
  TensorId a = b.op1("Relu", {x}, {}, "a");
  TensorId left = b.op1("Mul", {a, a}, {}, "left");
  TensorId right = b.op1("Add", {a, b.scalar(1.0f)}, {}, "right");
  b.output(b.op1("Sub", {left, right}, {}, "join"));
  auto executor = make_executor(finish(std::move(b)));
  ASSERT_NE(executor, nullptr);
  std::vector<HostTensor> outputs;
  ASSERT_TRUE(executor->run({floats({5}, {-2, 0, 1, 2, 3})}, &outputs).is_ok());
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(values_of(outputs[0]), (std::vector<float>{-1, -1, -1, 1, 5}));
}

TEST(CpuExecutor, OutputAlsoReadByLaterNodes) {
  // y = x + x is an output and also feeds a chain long enough that its bytes
  // would be reused if the planner forgot it is an output.
  GraphBuilder b("reuse", registry());
  TensorId x = b.input("x", DType::kF32, {4});
  TensorId y = b.op1("Add", {x, x}, {}, "double");
  b.output(y);
  TensorId z = y;
  for (int i = 0; i < 6; ++i)
    z = b.op1("Mul", {z, b.scalar(2.0f, "two_" + std::to_string(i))});
  b.output(z);
  auto executor = make_executor(finish(std::move(b)));
  ASSERT_NE(executor, nullptr);
  std::vector<HostTensor> outputs;
  ASSERT_TRUE(executor->run({floats({4}, {1, -2, 0.5f, 3})}, &outputs).is_ok());
  ASSERT_EQ(outputs.size(), 2u);
  EXPECT_EQ(values_of(outputs[0]), (std::vector<float>{2, -4, 1, 6}));
  EXPECT_EQ(values_of(outputs[1]), (std::vector<float>{128, -256, 64, 384}));
}

TEST(CpuExecutor, OutputsThatAreParametersOrInputsAreCopies) {
  GraphBuilder b("passthrough", registry());
  TensorId x = b.input("x", DType::kF32, {3});
  TensorId w = b.parameter("w", DType::kF32, {3}, floats_blob({7, 8, 9}));
  b.output(w);
  b.output(b.op1("Add", {x, w}, {}, "sum"));
  b.output(x);
  auto executor = make_executor(finish(std::move(b)));
  ASSERT_NE(executor, nullptr);
  HostTensor input = floats({3}, {1, 2, 3});
  std::vector<HostTensor> outputs;
  ASSERT_TRUE(executor->run({input}, &outputs).is_ok());
  ASSERT_EQ(outputs.size(), 3u);
  EXPECT_EQ(values_of(outputs[0]), (std::vector<float>{7, 8, 9}));
  EXPECT_EQ(values_of(outputs[1]), (std::vector<float>{8, 10, 12}));
  EXPECT_EQ(values_of(outputs[2]), (std::vector<float>{1, 2, 3}));
  EXPECT_NE(outputs[2].blob, input.blob); // a copy, not the caller's buffer
  // Changing a returned parameter must not change the executor's weights.
  outputs[0].as<float>()[0] = -1;
  ASSERT_TRUE(executor->run({input}, &outputs).is_ok());
  EXPECT_EQ(values_of(outputs[0]), (std::vector<float>{7, 8, 9}));
}

TEST(CpuExecutor, InputCountAndTypeErrorsNameTheInput) {
  auto executor = make_executor(mlp_graph());
  ASSERT_NE(executor, nullptr);
  std::vector<HostTensor> outputs;
  Status none = executor->run({}, &outputs);
  EXPECT_EQ(none.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.message().find("1 inputs, got 0"), std::string::npos) << none.message();

  Status shape = executor->run({floats({3, 2}, {1, 2, 3, 4, 5, 6})}, &outputs);
  EXPECT_EQ(shape.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(shape.message().find("'x'"), std::string::npos) << shape.message();
  EXPECT_NE(shape.message().find("f32[2, 3]"), std::string::npos) << shape.message();
  EXPECT_NE(shape.message().find("f32[3, 2]"), std::string::npos) << shape.message();

  const int32_t ints[6] = {};
  Status dtype = executor->run({make_tensor(DType::kI32, {2, 3}, ints)}, &outputs);
  EXPECT_FALSE(dtype.is_ok());
  EXPECT_NE(dtype.message().find("i32[2, 3]"), std::string::npos) << dtype.message();
}

Graph gather_graph() {
  GraphBuilder b("lookup", registry());
  TensorId table = b.parameter("table", DType::kF32, {4, 2}, floats_blob({0, 1, 2, 3, 4, 5, 6, 7}));
  TensorId ids = b.input("ids", DType::kI64, {3});
  b.output(b.op1("Gather", {table, ids}, {}, "embed"));
  return finish(std::move(b));
}

TEST(CpuExecutor, KernelErrorNamesTheNode) {
  auto executor = make_executor(gather_graph());
  ASSERT_NE(executor, nullptr);
  std::vector<HostTensor> outputs;
  const int64_t good[3] = {3, 0, 1};
  ASSERT_TRUE(executor->run({make_tensor(DType::kI64, {3}, good)}, &outputs).is_ok());
  EXPECT_EQ(values_of(outputs[0]), (std::vector<float>{6, 7, 0, 1, 2, 3}));
  const int64_t bad[3] = {0, 7, 1};
  Status status = executor->run({make_tensor(DType::kI64, {3}, bad)}, &outputs);
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("node 'embed' (Gather)"), std::string::npos) << status.message();
}

TEST(CpuExecutor, InvalidGraphIsRefusedWithContext) {
  Graph graph("broken");
  Tensor x;
  x.name = "x";
  x.type = {DType::kF32, {2}};
  x.kind = TensorKind::kInput;
  TensorId id = *graph.add_tensor(x);
  graph.add_input(id);
  // No outputs: the verifier refuses it.
  auto executor = CpuExecutor::create(std::move(graph));
  ASSERT_FALSE(executor.is_ok());
  EXPECT_NE(executor.status().message().find("'broken'"), std::string::npos)
      << executor.status().message();
}

TEST(CpuExecutor, WeightThatCannotBeMaterializedIsNamed) {
  GraphBuilder b("bad_weight", registry());
  TensorId x = b.input("x", DType::kI32, {3});
  TensorId w = b.parameter("int_weight", DType::kI32, {3},
                           Initializer{Initializer::Kind::kNormal, 0.0, 1.0, 1});
  b.output(b.op1("Add", {x, w}));
  auto executor = CpuExecutor::create(finish(std::move(b)));
  ASSERT_FALSE(executor.is_ok());
  EXPECT_NE(executor.status().message().find("'int_weight'"), std::string::npos)
      << executor.status().message();
}

// An MLP with drawn weights, run twice on the same random inputs.
Graph random_mlp_graph() {
  GraphBuilder b("random_mlp", registry());
  TensorId x = b.input("x", DType::kF32, {8, 32});
  TensorId h = x;
  for (int layer = 0; layer < 3; ++layer) {
    std::string n = std::to_string(layer);
    TensorId w = b.parameter(
        "w" + n, DType::kF32, {32, 32},
        Initializer{Initializer::Kind::kNormal, 0.0, 0.2, static_cast<uint64_t>(100 + layer)});
    TensorId bias = b.parameter(
        "b" + n, DType::kF32, {32},
        Initializer{Initializer::Kind::kUniform, -0.1, 0.1, static_cast<uint64_t>(200 + layer)});
    h = b.op1("Relu", {b.op1("Add", {b.op1("MatMul", {h, w}), bias})});
  }
  b.output(h);
  return finish(std::move(b));
}

TEST(CpuExecutor, TwoRunsAreBitwiseEqual) {
  Graph graph = random_mlp_graph();
  auto executor = make_executor(graph);
  ASSERT_NE(executor, nullptr);
  auto inputs = random_inputs(executor->graph(), 5);
  std::vector<HostTensor> first, second;
  ASSERT_TRUE(executor->run(inputs, &first).is_ok());
  ASSERT_TRUE(executor->run(inputs, &second).is_ok());
  ASSERT_EQ(first.size(), 1u);
  EXPECT_TRUE(bitwise_equal(first[0], second[0]));
  // A second executor of the same graph draws the same weights.
  auto other = make_executor(graph);
  ASSERT_NE(other, nullptr);
  std::vector<HostTensor> third;
  ASSERT_TRUE(other->run(inputs, &third).is_ok());
  EXPECT_TRUE(bitwise_equal(first[0], third[0]));
  // And the output is not trivially zero.
  int nonzero = 0;
  for (float v : values_of(first[0]))
    nonzero += v != 0.0f;
  EXPECT_GT(nonzero, 0);
}

TEST(CpuExecutor, DeepChainReusesArena) {
  GraphBuilder b("chain", registry());
  TensorId x = b.input("x", DType::kF32, {16, 16});
  for (int i = 0; i < 30; ++i)
    x = b.op1(i % 2 ? "Relu" : "Neg", {x});
  b.output(x);
  auto executor = make_executor(finish(std::move(b)));
  ASSERT_NE(executor, nullptr);
  const auto &plan = executor->memory_plan();
  EXPECT_LT(plan.arena_bytes, plan.naive_bytes);
  EXPECT_EQ(plan.arena_bytes, 2 * 16 * 16 * 4);
  std::vector<float> in(256);
  for (int i = 0; i < 256; ++i)
    in[i] = static_cast<float>(i % 7) - 3;
  std::vector<HostTensor> outputs;
  ASSERT_TRUE(executor->run({floats({16, 16}, in)}, &outputs).is_ok());
  // Neg then Relu, 15 times: relu(-x), then relu(-relu(-x)) = 0 thereafter.
  for (float v : values_of(outputs[0]))
    EXPECT_EQ(v, 0.0f);
}

TEST(Materialize, InitializersFollowTheCounterBasedGenerator) {
  Tensor t;
  t.name = "w";
  t.kind = TensorKind::kParameter;
  t.type = {DType::kF32, {3, 5}};
  t.initializer = {Initializer::Kind::kNormal, 1.0, 0.5, 42};
  auto value = materialize(t, ".");
  ASSERT_TRUE(value.is_ok()) << value.status().to_string();
  for (int i = 0; i < 15; ++i)
    EXPECT_EQ(value->as<float>()[i],
              static_cast<float>(1.0 + 0.5 * random_normal(42, static_cast<uint64_t>(i))));

  t.type = {DType::kI32, {4}};
  t.initializer = {Initializer::Kind::kOnes, 0, 0, 0};
  value = materialize(t, ".");
  ASSERT_TRUE(value.is_ok());
  EXPECT_EQ(value->as<int32_t>()[3], 1);

  t.initializer = {Initializer::Kind::kUniform, 0, 1, 3};
  value = materialize(t, ".");
  ASSERT_FALSE(value.is_ok());
  EXPECT_NE(value.status().message().find("'w'"), std::string::npos) << value.status().message();

  t.initializer = {};
  value = materialize(t, ".");
  ASSERT_FALSE(value.is_ok());
  EXPECT_NE(value.status().message().find("'w'"), std::string::npos);

  t.type = {DType::kF32, {2}};
  t.data = floats_blob({1, 2, 3}); // one element too many
  EXPECT_FALSE(materialize(t, ".").is_ok());
  t.data = floats_blob({1, 2});
  value = materialize(t, ".");
  ASSERT_TRUE(value.is_ok());
  EXPECT_EQ(values_of(*value), (std::vector<float>{1, 2}));
}

TEST(Materialize, ExternalDataFromSafetensors) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("strata_executor_test_" + std::to_string(getpid()));
  fs::create_directories(dir / "weights");
  HostTensor stored = floats({2, 2}, {1.5f, -2, 3, 4});
  ASSERT_TRUE(serialization::write_safetensors((dir / "weights" / "w.safetensors").string(),
                                               {{"layer.w", stored}})
                  .is_ok());

  GraphBuilder b("external", registry());
  TensorId x = b.input("x", DType::kF32, {2, 2});
  TensorId w = b.parameter("w", DType::kF32, {2, 2}, Initializer{});
  b.output(b.op1("Add", {x, w}));
  Graph graph = finish(std::move(b));
  graph.mutable_tensor(w).external = ExternalData{"weights/w.safetensors", "layer.w"};

  ExecutorOptions options;
  options.model_dir = dir.string();
  auto executor = make_executor(graph, options);
  ASSERT_NE(executor, nullptr);
  std::vector<HostTensor> outputs;
  ASSERT_TRUE(executor->run({floats({2, 2}, {1, 1, 1, 1})}, &outputs).is_ok());
  EXPECT_EQ(values_of(outputs[0]), (std::vector<float>{2.5f, -1, 4, 5}));

  // A missing key is an error naming the tensor; so is a path leaving the folder.
  Tensor missing = graph.tensor(w);
  missing.external->key = "nope";
  auto result = materialize(missing, dir.string());
  ASSERT_FALSE(result.is_ok());
  EXPECT_NE(result.status().message().find("'w'"), std::string::npos);
  missing.external = ExternalData{"../w.safetensors", "layer.w"};
  EXPECT_FALSE(materialize(missing, dir.string()).is_ok());
  fs::remove_all(dir);
}

TEST(RandomInputs, IndicesStayInTheirBounds) {
  GraphBuilder b("indices", registry());
  TensorId rows = b.parameter("rows", DType::kF32, {7, 3}, Initializer{Initializer::Kind::kZeros});
  TensorId cols = b.parameter("cols", DType::kF32, {3, 9}, Initializer{Initializer::Kind::kZeros});
  TensorId row_ids = b.input("row_ids", DType::kI64, {200});
  TensorId col_ids = b.input("col_ids", DType::kI32, {200});
  TensorId logits = b.input("logits", DType::kF32, {200, 11});
  TensorId labels = b.input("labels", DType::kI32, {200});
  TensorId other = b.input("other", DType::kI32, {200});
  b.output(b.op1("Gather", {rows, row_ids}));
  b.output(b.op1("Gather", {cols, col_ids}, {{"axis", int64_t{-1}}}));
  b.output(b.op1("SoftmaxCrossEntropy", {logits, labels}));
  b.output(b.op1("Add", {other, other}));
  Graph graph = finish(std::move(b));
  auto inputs = random_inputs(graph, 11);
  ASSERT_EQ(inputs.size(), 5u);
  for (size_t k = 0; k < inputs.size(); ++k)
    EXPECT_EQ(inputs[k].type, graph.tensor(graph.inputs()[k]).type);

  auto check_range = [](const HostTensor &t, int64_t bound) {
    int64_t lo = bound, hi = -1;
    for (int64_t i = 0; i < t.type.num_elements(); ++i) {
      int64_t v = t.type.dtype == DType::kI64 ? t.as<int64_t>()[i] : t.as<int32_t>()[i];
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    EXPECT_EQ(lo, 0);
    EXPECT_EQ(hi, bound - 1); // 200 draws reach both ends with overwhelming odds
  };
  check_range(inputs[0], 7);
  check_range(inputs[1], 9);
  check_range(inputs[3], 11);
  check_range(inputs[4], 2);

  // Floats: normal-ish, deterministic in the seed, different across seeds.
  double sum_sq = 0;
  for (float v : values_of(inputs[2]))
    sum_sq += v * v;
  EXPECT_NEAR(sum_sq / 2200, 1.0, 0.15);
  auto again = random_inputs(graph, 11);
  auto other_seed = random_inputs(graph, 12);
  for (size_t k = 0; k < inputs.size(); ++k)
    EXPECT_TRUE(bitwise_equal(inputs[k], again[k]));
  EXPECT_FALSE(bitwise_equal(inputs[2], other_seed[2]));
}

TEST(RandomInputs, InputsOfOneGraphDiffer) {
  GraphBuilder b("two", registry());
  TensorId x = b.input("x", DType::kF32, {64});
  TensorId y = b.input("y", DType::kF32, {64});
  b.output(b.op1("Add", {x, y}));
  auto inputs = random_inputs(finish(std::move(b)), 3);
  ASSERT_EQ(inputs.size(), 2u);
  EXPECT_FALSE(bitwise_equal(inputs[0], inputs[1]));
}

} // namespace
} // namespace strata::runtime
