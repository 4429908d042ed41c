// Tests of the reductions and the softmax family against plain references
// computed in double, with guard bytes around every buffer (see op_test_util.h).
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "tests/ops/op_test_util.h"

namespace strata::ops {
namespace {

using namespace strata::ops::testing;

enum class Kind { kSum, kMean, kMax };

// Reference reduction: every input element is folded into the output element
// whose index is its index with the reduced dims zeroed.
std::vector<double> reference_reduce(const TestTensor &x, const std::vector<bool> &reduced,
                                     Kind kind, Shape *out_shape_keepdims) {
  const Shape &shape = x.type.shape;
  Shape out_shape;
  for (size_t d = 0; d < shape.size(); ++d)
    out_shape.push_back(reduced[d] ? 1 : shape[d]);
  const int64_t out_count = num_elements(out_shape);
  const double init = kind == Kind::kMax ? -std::numeric_limits<double>::infinity() : 0.0;
  std::vector<double> acc(out_count, init);
  std::vector<int64_t> count(out_count, 0);
  for (int64_t i = 0; i < x.num_elements(); ++i) {
    Shape index = unravel(i, shape);
    for (size_t d = 0; d < shape.size(); ++d)
      if (reduced[d]) index[d] = 0;
    int64_t o = broadcast_flat(index, out_shape);
    double v = x.get(i);
    if (kind == Kind::kMax)
      acc[o] = std::isnan(v) || std::isnan(acc[o]) ? NAN : std::max(acc[o], v);
    else
      acc[o] += v;
    ++count[o];
  }
  if (kind == Kind::kMean)
    for (int64_t o = 0; o < out_count; ++o)
      acc[o] = count[o] == 0 ? NAN : acc[o] / static_cast<double>(count[o]);
  *out_shape_keepdims = out_shape;
  return acc;
}

TEST(ReductionTest, ReducesMatchReferenceOverEveryAxisSubset) {
  std::mt19937 rng(7);
  const Shape shapes[] = {{2, 3, 4}, {5, 1, 7}, {3, 0, 2}, {1, 1, 1}, {4, 33, 5}};
  const std::pair<const char *, Kind> ops[] = {
      {"ReduceSum", Kind::kSum}, {"ReduceMean", Kind::kMean}, {"ReduceMax", Kind::kMax}};
  for (const Shape &shape : shapes) {
    const int64_t rank = static_cast<int64_t>(shape.size());
    for (int mask = 0; mask < (1 << rank); ++mask) {
      std::vector<int64_t> axes;
      std::vector<bool> reduced(rank);
      for (int64_t d = 0; d < rank; ++d) {
        reduced[d] = mask == 0 || (mask >> d & 1);
        if (mask >> d & 1) axes.push_back(d % 2 ? d - rank : d); // mix negative axes in
      }
      for (const auto &[op, kind] : ops) {
        for (int keepdims : {1, 0}) {
          TestTensor x = random_tensor(DType::kF32, shape, rng, -2, 2);
          std::vector<Attribute> attrs = {int_attr("keepdims", keepdims)};
          if (!axes.empty() || keepdims == 0) attrs.push_back(ints_attr("axes", axes));
          Shape keep_shape;
          std::vector<double> expected = reference_reduce(x, reduced, kind, &keep_shape);
          TestTensor y = run_one(op, {x}, attrs);
          Shape expected_shape;
          for (int64_t d = 0; d < rank; ++d)
            if (!reduced[d] || keepdims) expected_shape.push_back(keep_shape[d]);
          EXPECT_EQ(y.type, (TensorType{DType::kF32, expected_shape})) << op;
          double tolerance = kind == Kind::kMax ? 0 : 1e-6;
          expect_close(y, expected, tolerance, tolerance,
                       str_cat(op, " ", shape_to_string(shape), " axes ", shape_to_string(axes),
                               " keepdims ", keepdims));
        }
      }
    }
  }
}

TEST(ReductionTest, ScalarsLongRowsAndSpecialValues) {
  std::mt19937 rng(8);
  TestTensor scalar = tensor(DType::kF32, {}, {3.5});
  for (const char *op : {"ReduceSum", "ReduceMean", "ReduceMax"}) {
    TestTensor y = run_one(op, {scalar});
    EXPECT_EQ(y.type.shape, Shape{}) << op;
    expect_close(y, {3.5}, 0, 0, op);
  }
  // A long row: the double accumulator keeps the sum accurate.
  TestTensor row = random_tensor(DType::kF32, {100003}, rng, 0, 1);
  double sum = 0;
  for (double v : row.values())
    sum += v;
  expect_close(run_one("ReduceSum", {row}), {sum}, 0, 1e-7, "long ReduceSum");
  expect_close(run_one("ReduceMean", {row}, {int_attr("keepdims", 0)}), {sum / 100003}, 0, 1e-7,
               "long ReduceMean");
  // NaN wins in ReduceMax; -inf is the max of nothing.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  TestTensor with_nan = tensor(DType::kF32, {2, 3}, {1, nan, 2, -1, -2, -3});
  expect_close(run_one("ReduceMax", {with_nan}, {ints_attr("axes", {1})}), {nan, -1}, 0, 0,
               "ReduceMax NaN");
  TestTensor empty = zeros(DType::kF32, {2, 0});
  expect_close(run_one("ReduceMax", {empty}, {ints_attr("axes", {1})}), {-INFINITY, -INFINITY}, 0,
               0, "ReduceMax empty");
  expect_close(run_one("ReduceSum", {empty}, {ints_attr("axes", {1})}), {0, 0}, 0, 0,
               "ReduceSum empty");
}

TEST(ReductionTest, ResultsAreBitwiseDeterministic) {
  std::mt19937 rng(9);
  TestTensor x = random_tensor(DType::kF32, {64, 333}, rng, -1e3, 1e3);
  for (const char *op : {"ReduceSum", "ReduceMean", "Softmax", "LogSoftmax"})
    for (int64_t axis : {0, 1}) {
      std::vector<Attribute> attrs;
      if (op[0] == 'R')
        attrs.push_back(ints_attr("axes", {axis}));
      else
        attrs.push_back(int_attr("axis", axis));
      TestTensor first = run_one(op, {x}, attrs);
      for (int run = 0; run < 3; ++run)
        expect_same_tensor(run_one(op, {x}, attrs), first, op);
    }
}

// Reference softmax along `axis`, in double.
std::vector<double> reference_softmax(const TestTensor &x, int64_t axis, bool log) {
  const Shape &shape = x.type.shape;
  std::vector<double> out(x.num_elements());
  Shape strides = contiguous_strides(shape);
  for (int64_t i = 0; i < x.num_elements(); ++i) {
    Shape index = unravel(i, shape);
    int64_t base = i - index[axis] * strides[axis];
    double max = -INFINITY;
    for (int64_t j = 0; j < shape[axis]; ++j)
      max = std::max(max, x.get(base + j * strides[axis]));
    double sum = 0;
    for (int64_t j = 0; j < shape[axis]; ++j)
      sum += std::exp(x.get(base + j * strides[axis]) - max);
    double v = x.get(i);
    out[i] = log ? v - max - std::log(sum) : std::exp(v - max) / sum;
  }
  return out;
}

TEST(ReductionTest, SoftmaxAndLogSoftmaxMatchReference) {
  std::mt19937 rng(10);
  const std::pair<Shape, int64_t> cases[] = {
      {{3, 4, 5}, 0},  {{3, 4, 5}, 1}, {{3, 4, 5}, 2}, {{3, 4, 5}, -1},
      {{3, 4, 5}, -3}, {{1, 10}, -1},  {{7}, 0},       {{1}, 0},
      {{2, 1, 3}, 1},  {{0, 4}, 1},    {{5, 300}, 1},  {{300, 5}, 0},
  };
  for (const auto &[shape, axis] : cases) {
    for (bool log : {false, true}) {
      const char *op = log ? "LogSoftmax" : "Softmax";
      TestTensor x = random_tensor(DType::kF32, shape, rng, -10, 10);
      std::vector<Attribute> attrs;
      if (axis != -1) attrs.push_back(int_attr("axis", axis));
      TestTensor y = run_one(op, {x}, attrs);
      EXPECT_EQ(y.type, x.type);
      const int64_t rank = static_cast<int64_t>(shape.size());
      expect_close(y, reference_softmax(x, axis < 0 ? axis + rank : axis, log), 1e-6, 1e-5,
                   str_cat(op, " ", shape_to_string(shape), " axis ", axis));
    }
  }
}

TEST(ReductionTest, SoftmaxIsStableForLargeInputs) {
  TestTensor x = tensor(DType::kF32, {2, 3}, {1000, 1001, 1002, -1000, -1001, -INFINITY});
  for (int64_t axis : {1, 0}) {
    expect_close(run_one("Softmax", {x}, {int_attr("axis", axis)}),
                 reference_softmax(x, axis, false), 1e-6, 1e-5, "Softmax large");
    expect_close(run_one("LogSoftmax", {x}, {int_attr("axis", axis)}),
                 reference_softmax(x, axis, true), 1e-6, 1e-5, "LogSoftmax large");
  }
}

TEST(ReductionTest, UnsupportedDtypesAreRefusedByName) {
  TestTensor i = zeros(DType::kI32, {3});
  RunResult sum = run_op("ReduceSum", {i});
  EXPECT_EQ(sum.status.code(), StatusCode::kUnimplemented);
  expect_error(sum.status, {"ReduceSum", "i32"});
  TestTensor h = zeros(DType::kBF16, {3});
  RunResult softmax = run_op("Softmax", {h});
  EXPECT_EQ(softmax.status.code(), StatusCode::kUnimplemented);
  expect_error(softmax.status, {"Softmax", "bf16"});
}

TEST(ReductionTest, InferenceErrorsNameTheProblem) {
  TensorType x{DType::kF32, {2, 3, 4}};
  expect_error(infer("ReduceSum", {x}, {ints_attr("axes", {3})}).status(),
               {"ReduceSum", "'axes'", "3", "[2, 3, 4]"});
  expect_error(infer("ReduceMax", {x}, {ints_attr("axes", {1, -2})}).status(),
               {"ReduceMax", "'axes'", "repeats"});
  expect_error(infer("ReduceMean", {TensorType{DType::kI32, {2}}}).status(),
               {"ReduceMean", "floating"});
  expect_error(infer("ReduceSum", {x}, {int_attr("keepdims", 2)}).status(),
               {"ReduceSum", "'keepdims'"});
  expect_error(infer("Softmax", {x}, {int_attr("axis", -4)}).status(), {"Softmax", "'axis'", "-4"});
  expect_error(infer("LogSoftmax", {TensorType{DType::kF32, {}}}).status(),
               {"LogSoftmax", "'axis'"});
  expect_error(infer("Softmax", {TensorType{DType::kI64, {2}}}).status(), {"Softmax", "floating"});
  expect_error(infer("ReduceSum", {x}, {float_attr("keepdims", 1.0)}).status(),
               {"ReduceSum", "keepdims", "int"});
}

TEST(ReductionTest, CostCountsFlopsPerInputElement) {
  TensorType x{DType::kF32, {8, 16}};
  TensorType y{DType::kF32, {8, 1}};
  EXPECT_EQ(OpRegistry::global().cost(make_node("ReduceSum"), {x}, {y}).flops, 128);
  EXPECT_EQ(OpRegistry::global().cost(make_node("Softmax"), {x}, {x}).flops, 4 * 128);
}

} // namespace
} // namespace strata::ops
