// Gradient rules of the shape family, checked against central finite
// differences, plus direct tests of Expand, SliceGrad and GatherGrad.
#include <gtest/gtest.h>

#include "tests/ops/op_test_util.h"
#include "tests/passes/grad_check.h"

namespace strata {
namespace {

using strata::testing::check_gradients;
using namespace strata::ops::testing;

HostTensor normal(Shape shape, uint32_t seed) {
  return strata::testing::random_tensor({DType::kF32, std::move(shape)}, seed);
}

template <typename T> HostTensor integers(DType dtype, Shape shape, std::vector<T> values) {
  HostTensor t = HostTensor::zeros({dtype, std::move(shape)});
  std::memcpy(t.data(), values.data(), values.size() * sizeof(T));
  return t;
}

using Attrs = std::vector<Attribute>;

void check_unary(std::string_view op, Attrs attrs, Shape shape, uint32_t seed) {
  SCOPED_TRACE(std::string(op));
  check_gradients(
      [&](GraphBuilder &b, llvm::ArrayRef<TensorId> x) { return b.op1(op, {x[0]}, attrs); },
      {normal(std::move(shape), seed)});
}

TEST(ShapeGradTest, ReshapeFlattenSqueezeUnsqueeze) {
  check_unary("Reshape", {{"shape", std::vector<int64_t>{4, -1}}}, {2, 3, 2}, 1);
  check_unary("Flatten", {{"axis", int64_t{2}}}, {2, 3, 2}, 2);
  check_unary("Squeeze", {}, {2, 1, 3, 1}, 3);
  check_unary("Squeeze", {{"axes", std::vector<int64_t>{-1}}}, {2, 1, 3, 1}, 4);
  check_unary("Unsqueeze", {{"axes", std::vector<int64_t>{0, 3}}}, {2, 3}, 5);
  check_unary("Identity", {}, {3}, 6);
}

TEST(ShapeGradTest, Transpose) {
  check_unary("Transpose", {}, {2, 3, 4}, 7);
  check_unary("Transpose", {{"perm", std::vector<int64_t>{1, 2, 0}}}, {2, 3, 4}, 8);
  check_unary("Transpose", {{"perm", std::vector<int64_t>{0, 2, 3, 1}}}, {2, 1, 3, 2}, 9);
}

TEST(ShapeGradTest, ConcatAndSplit) {
  check_gradients(
      [](GraphBuilder &b, llvm::ArrayRef<TensorId> x) {
        return b.op1("Concat", {x[0], x[1], x[2]}, {{"axis", int64_t{-1}}});
      },
      {normal({2, 3}, 10), normal({2, 1}, 11), normal({2, 4}, 12)});
  check_unary("Concat", {{"axis", int64_t{0}}}, {3, 2}, 13);
  // Every Split output used: the gradient is the concatenation.
  check_gradients(
      [](GraphBuilder &b, llvm::ArrayRef<TensorId> x) {
        auto parts =
            b.op("Split", {x[0]}, {{"axis", int64_t{1}}, {"split", std::vector<int64_t>{1, 3, 2}}});
        TensorId t = b.op1("Transpose", {parts[1]});
        TensorId joined = b.op1("Concat", {parts[2], parts[0]}, {{"axis", int64_t{1}}});
        return b.op1("Add", {b.op1("ReduceSum", {t}), b.op1("ReduceSum", {joined})});
      },
      {normal({2, 6}, 14)});
  // Only the middle output reaches the loss: the others get zeros.
  check_gradients(
      [](GraphBuilder &b, llvm::ArrayRef<TensorId> x) {
        auto parts =
            b.op("Split", {x[0]}, {{"axis", int64_t{0}}, {"split", std::vector<int64_t>{1, 2, 1}}});
        return b.op1("Mul", {parts[1], parts[1]});
      },
      {normal({4, 3}, 15)});
}

TEST(ShapeGradTest, Slice) {
  check_unary("Slice",
              {{"starts", std::vector<int64_t>{1, 0}},
               {"ends", std::vector<int64_t>{3, 5}},
               {"steps", std::vector<int64_t>{1, 2}}},
              {4, 5}, 16);
  check_unary("Slice",
              {{"starts", std::vector<int64_t>{-1}},
               {"ends", std::vector<int64_t>{-100}},
               {"axes", std::vector<int64_t>{-1}},
               {"steps", std::vector<int64_t>{-2}}},
              {2, 3, 5}, 17);
}

TEST(ShapeGradTest, GatherIsAScatterAddIntoData) {
  // Repeated and negative indices: rows used twice get the sum of both.
  check_gradients(
      [](GraphBuilder &b, llvm::ArrayRef<TensorId> x) {
        return b.op1("Gather", {x[0], x[1]});
      },
      {normal({5, 3}, 18), integers<int64_t>(DType::kI64, {2, 2}, {0, 3, -2, 0})});
  check_gradients(
      [](GraphBuilder &b, llvm::ArrayRef<TensorId> x) {
        return b.op1("Gather", {x[0], x[1]}, {{"axis", int64_t{1}}});
      },
      {normal({2, 4, 3}, 19), integers<int32_t>(DType::kI32, {3}, {1, 1, 3})});
}

TEST(ShapeGradTest, ExpandAndConstant) {
  check_unary("Expand", {{"shape", std::vector<int64_t>{2, 3, 4}}}, {3, 1}, 20);
  check_unary("Expand", {{"shape", std::vector<int64_t>{1, 1}}}, {2, 3}, 21);
  check_gradients(
      [](GraphBuilder &b, llvm::ArrayRef<TensorId> x) {
        TensorId c =
            b.op1("Constant", {},
                  {{"shape", std::vector<int64_t>{3}}, {"value", std::vector<double>{1, 2, 3}}});
        return b.op1("Mul", {x[0], c});
      },
      {normal({2, 3}, 22)});
}

// Direct kernel tests.

TEST(ExpandTest, BroadcastsLikeNumPyOnAnyDtype) {
  TestTensor x = tensor(DType::kI64, {3, 1}, {1, 2, 3});
  TestTensor y = run_one("Expand", {x}, {ints_attr("shape", {2, 1, 2})});
  EXPECT_EQ(y.type.to_string(), TensorType(DType::kI64, {2, 3, 2}).to_string());
  expect_close(y, {1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}, 0, 0);
  std::mt19937 rng(3);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBool, DType::kI32}) {
    TestTensor v = random_tensor(dtype, {1, 4, 1}, rng, -3, 3);
    TestTensor out = run_one("Expand", {v}, {ints_attr("shape", {2, 1, 4, 3})});
    std::vector<double> expected;
    for (int64_t i = 0; i < 24; ++i)
      expected.push_back(v.get(broadcast_flat(unravel(i, {2, 1, 4, 3}), {1, 4, 1})));
    expect_close(out, expected, 0, 0, dtype_name(dtype));
  }
  // The target shape may be smaller (size 1) where X is larger.
  EXPECT_EQ(run_one("Expand", {x}, {ints_attr("shape", {1})}).type.to_string(),
            TensorType(DType::kI64, {3, 1}).to_string());
  expect_error(run_op("Expand", {x}, {ints_attr("shape", {2, 2})}).status, {"Expand", "shape"});
  expect_error(run_op("Expand", {x}, {ints_attr("shape", {-1})}).status, {"Expand", "negative"});
}

TEST(SliceGradTest, ScattersIntoZeros) {
  std::mt19937 rng(4);
  TestTensor dy = random_tensor(DType::kF32, {2, 2}, rng);
  // X [4, 5], Slice starts [1, 4] ends [4, 0] steps [2, -3] reads rows 1, 3 and
  // columns 4, 1.
  TestTensor dx = run_one("SliceGrad", {dy},
                          {ints_attr("shape", {4, 5}), ints_attr("starts", {1, 4}),
                           ints_attr("ends", {4, 0}), ints_attr("steps", {2, -3})});
  std::vector<double> expected(20, 0.0);
  expected[1 * 5 + 4] = dy.get(0);
  expected[1 * 5 + 1] = dy.get(1);
  expected[3 * 5 + 4] = dy.get(2);
  expected[3 * 5 + 1] = dy.get(3);
  expect_close(dx, expected, 0, 0);
  expect_error(
      run_op("SliceGrad", {dy},
             {ints_attr("shape", {4, 5}), ints_attr("starts", {0}), ints_attr("ends", {2})})
          .status,
      {"SliceGrad", "dY"});
}

TEST(GatherGradTest, AccumulatesRepeatedIndices) {
  TestTensor dy = tensor(DType::kF32, {3, 2}, {1, 2, 3, 4, 5, 6});
  TestTensor idx = typed_tensor<int64_t>(DType::kI64, {3}, {2, 0, -1});
  TestTensor dx = run_one("GatherGrad", {dy, idx}, {ints_attr("shape", {3, 2})});
  expect_close(dx, {3, 4, 0, 0, 6, 8}, 0, 0);
  // Along axis 1.
  TestTensor dy1 = tensor(DType::kF32, {2, 2}, {1, 2, 3, 4});
  TestTensor idx1 = typed_tensor<int32_t>(DType::kI32, {2}, {1, 1});
  expect_close(
      run_one("GatherGrad", {dy1, idx1}, {int_attr("axis", 1), ints_attr("shape", {2, 3})}),
      {0, 3, 0, 0, 7, 0}, 0, 0);
  TestTensor bad = typed_tensor<int64_t>(DType::kI64, {3}, {0, 3, 1});
  expect_error(run_op("GatherGrad", {dy, bad}, {ints_attr("shape", {3, 2})}).status,
               {"GatherGrad", "out of range"});
  expect_error(run_op("GatherGrad", {dy, idx}, {ints_attr("shape", {3, 5})}).status,
               {"GatherGrad", "dY"});
}

} // namespace
} // namespace strata
