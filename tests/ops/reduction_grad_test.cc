// Gradient rules of the reductions and the softmax family, checked against
// central finite differences, plus direct tests of ReduceMaxGrad, SoftmaxGrad and
// LogSoftmaxGrad.
#include <cmath>

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

using Attrs = std::vector<Attribute>;

void check_unary(std::string_view op, Attrs attrs, HostTensor x) {
  SCOPED_TRACE(std::string(op));
  check_gradients(
      [&](GraphBuilder &b, llvm::ArrayRef<TensorId> in) { return b.op1(op, {in[0]}, attrs); },
      {std::move(x)});
}

TEST(ReductionGradTest, SumAndMean) {
  for (const char *op : {"ReduceSum", "ReduceMean"}) {
    check_unary(op, {}, normal({2, 3, 4}, 1));
    check_unary(op, {{"axes", std::vector<int64_t>{1}}}, normal({2, 3, 4}, 2));
    check_unary(op, {{"axes", std::vector<int64_t>{0, -1}}, {"keepdims", int64_t{0}}},
                normal({2, 3, 4}, 3));
    check_unary(op, {{"keepdims", int64_t{0}}}, normal({5}, 4));
  }
}

// Distinct values spaced at least 0.1 apart, so the finite-difference step never
// changes which element is the maximum.
HostTensor spaced(Shape shape, uint32_t seed) {
  HostTensor t = HostTensor::zeros({DType::kF32, std::move(shape)});
  const int64_t n = t.type.num_elements();
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i)
    order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937(seed));
  for (int64_t i = 0; i < n; ++i)
    t.as<float>()[order[i]] = -1.0f + 0.1f * static_cast<float>(i);
  return t;
}

TEST(ReductionGradTest, MaxAwayFromTies) {
  check_unary("ReduceMax", {}, spaced({3, 4}, 5));
  check_unary("ReduceMax", {{"axes", std::vector<int64_t>{1}}}, spaced({2, 5, 3}, 6));
  check_unary("ReduceMax", {{"axes", std::vector<int64_t>{0, 2}}, {"keepdims", int64_t{0}}},
              spaced({2, 3, 4}, 7));
}

TEST(ReductionGradTest, SoftmaxAndLogSoftmax) {
  for (const char *op : {"Softmax", "LogSoftmax"}) {
    check_unary(op, {}, normal({3, 5}, 8));
    check_unary(op, {{"axis", int64_t{1}}}, normal({2, 4, 3}, 9));
    check_unary(op, {{"axis", int64_t{0}}}, normal({4, 2}, 10));
  }
}

// Direct kernel tests.

TEST(ReduceMaxGradTest, FirstMaximumTakesTheGradient) {
  // Rows: [1, 3, 3] (tie: the first 3 wins), [5, -1, 2].
  TestTensor x = tensor(DType::kF32, {2, 3}, {1, 3, 3, 5, -1, 2});
  TestTensor dy = tensor(DType::kF32, {2}, {10, 20});
  expect_close(run_one("ReduceMaxGrad", {dy, x}, {ints_attr("axes", {1}), int_attr("keepdims", 0)}),
               {0, 10, 0, 20, 0, 0}, 0, 0);
  // Over axis 0 with keepdims.
  TestTensor dy0 = tensor(DType::kF32, {1, 3}, {1, 2, 3});
  expect_close(run_one("ReduceMaxGrad", {dy0, x}, {ints_attr("axes", {0})}), {0, 2, 3, 1, 0, 0}, 0,
               0);
  // All axes.
  TestTensor dy_all = tensor(DType::kF32, {1, 1}, {7});
  expect_close(run_one("ReduceMaxGrad", {dy_all, x}), {0, 0, 0, 7, 0, 0}, 0, 0);
  expect_error(run_op("ReduceMaxGrad", {dy, x}, {ints_attr("axes", {0})}).status,
               {"ReduceMaxGrad", "dY"});
}

TEST(SoftmaxGradTest, MatchesReference) {
  std::mt19937 rng(11);
  for (int64_t axis : {0, 1, 2}) {
    SCOPED_TRACE(axis);
    Shape shape{2, 3, 4};
    TestTensor x = random_tensor(DType::kF32, shape, rng, -2, 2);
    TestTensor dy = random_tensor(DType::kF32, shape, rng, -1, 1);
    TestTensor y = run_one("Softmax", {x}, {int_attr("axis", axis)});
    TestTensor log_y = run_one("LogSoftmax", {x}, {int_attr("axis", axis)});
    std::vector<double> expected(24), expected_log(24);
    for (int64_t i = 0; i < 24; ++i) {
      Shape index = unravel(i, shape);
      double dot = 0, sum = 0;
      for (int64_t j = 0; j < shape[axis]; ++j) {
        Shape other = index;
        other[axis] = j;
        const int64_t k = broadcast_flat(other, shape);
        dot += dy.get(k) * y.get(k);
        sum += dy.get(k);
      }
      expected[i] = y.get(i) * (dy.get(i) - dot);
      expected_log[i] = dy.get(i) - std::exp(log_y.get(i)) * sum;
    }
    expect_close(run_one("SoftmaxGrad", {dy, y}, {int_attr("axis", axis)}), expected, 1e-6, 1e-5,
                 "SoftmaxGrad");
    expect_close(run_one("LogSoftmaxGrad", {dy, log_y}, {int_attr("axis", axis)}), expected_log,
                 1e-6, 1e-5, "LogSoftmaxGrad");
  }
  TestTensor a = zeros(DType::kF32, {2, 3});
  expect_error(run_op("SoftmaxGrad", {a, zeros(DType::kF32, {3, 2})}).status,
               {"SoftmaxGrad", "same type"});
  expect_error(run_op("LogSoftmaxGrad", {a, a}, {int_attr("axis", 2)}).status,
               {"LogSoftmaxGrad", "axis"});
}

} // namespace
} // namespace strata
