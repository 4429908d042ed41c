// Tests of the shape ops against plain references, on every dtype, with guard
// bytes around every buffer (see op_test_util.h). Shape ops only move bytes, so
// every comparison is exact.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "tests/ops/op_test_util.h"

namespace strata::ops {
namespace {

using namespace strata::ops::testing;

// Random tensors with every element distinct in its low bytes, so a misplaced
// element cannot go unnoticed.
TestTensor numbered(DType dtype, Shape shape, std::mt19937 &rng) {
  TestTensor t = zeros(dtype, std::move(shape));
  for (uint8_t &byte : t.bytes)
    byte = static_cast<uint8_t>(rng());
  if (dtype == DType::kBool)
    for (uint8_t &byte : t.bytes)
      byte &= 1;
  return t;
}

// Element `i` of `t` as raw bytes.
std::vector<uint8_t> element(const TestTensor &t, int64_t i) {
  size_t size = dtype_size(t.type.dtype);
  return std::vector<uint8_t>(t.bytes.begin() + i * size, t.bytes.begin() + (i + 1) * size);
}

// A tensor of `shape` whose element at each multi-index is `source` element
// `pick(index)`.
TestTensor gather_reference(const TestTensor &source, Shape shape,
                            const std::function<int64_t(const Shape &)> &pick) {
  TestTensor out = zeros(source.type.dtype, shape);
  size_t size = dtype_size(source.type.dtype);
  for (int64_t i = 0; i < out.num_elements(); ++i) {
    std::vector<uint8_t> bytes = element(source, pick(unravel(i, shape)));
    std::copy(bytes.begin(), bytes.end(), out.bytes.begin() + i * size);
  }
  return out;
}

int64_t flat_index(const Shape &index, llvm::ArrayRef<int64_t> shape) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d)
    flat = flat * shape[d] + index[d];
  return flat;
}

TestTensor with_shape(TestTensor t, Shape shape) {
  t.type.shape = std::move(shape);
  return t;
}

TEST(ShapeTest, ReshapeFlattenSqueezeUnsqueezeKeepBytes) {
  std::mt19937 rng(1);
  struct Case {
    const char *op;
    Shape in;
    std::vector<Attribute> attrs;
    Shape out;
  };
  const Case cases[] = {
      {"Reshape", {2, 3, 4}, {ints_attr("shape", {4, -1})}, {4, 6}},
      {"Reshape", {2, 3, 4}, {ints_attr("shape", {0, -1})}, {2, 12}},
      {"Reshape", {2, 3, 4}, {ints_attr("shape", {-1})}, {24}},
      {"Reshape", {2, 3, 4}, {ints_attr("shape", {0, 0, 2, 2})}, {2, 3, 2, 2}},
      {"Reshape", {}, {ints_attr("shape", {1, 1})}, {1, 1}},
      {"Reshape", {1}, {ints_attr("shape", {})}, {}},
      {"Reshape", {4, 0}, {ints_attr("shape", {0, 0, 7})}, {4, 0, 7}}, // 0 copies dims
      {"Reshape", {0, 3}, {ints_attr("shape", {0, 5})}, {0, 5}},
      {"Flatten", {2, 3, 4}, {}, {2, 12}},
      {"Flatten", {2, 3, 4}, {int_attr("axis", 0)}, {1, 24}},
      {"Flatten", {2, 3, 4}, {int_attr("axis", 3)}, {24, 1}},
      {"Flatten", {2, 3, 4}, {int_attr("axis", -1)}, {6, 4}},
      {"Flatten", {}, {int_attr("axis", 0)}, {1, 1}},
      {"Squeeze", {1, 3, 1, 2}, {}, {3, 2}},
      {"Squeeze", {1, 3, 1, 2}, {ints_attr("axes", {-2})}, {1, 3, 2}},
      {"Squeeze", {1}, {}, {}},
      {"Squeeze", {}, {}, {}},
      {"Unsqueeze", {3, 2}, {ints_attr("axes", {0, 3})}, {1, 3, 2, 1}},
      {"Unsqueeze", {3, 2}, {ints_attr("axes", {-1})}, {3, 2, 1}},
      {"Unsqueeze", {3, 2}, {ints_attr("axes", {1})}, {3, 1, 2}},
      {"Unsqueeze", {}, {ints_attr("axes", {0, 1})}, {1, 1}},
  };
  for (const Case &c : cases) {
    for (DType dtype : kAllDTypes) {
      TestTensor x = numbered(dtype, c.in, rng);
      TestTensor y = run_one(c.op, {x}, c.attrs);
      expect_same_tensor(y, with_shape(x, c.out),
                         str_cat(c.op, " ", shape_to_string(c.in), " ", dtype_name(dtype)));
    }
  }
}

TEST(ShapeTest, TransposeMatchesReference) {
  std::mt19937 rng(2);
  struct Case {
    Shape in;
    std::vector<int64_t> perm; // empty: the default
  };
  std::vector<Case> cases = {{{5, 7}, {}},
                             {{}, {}},
                             {{0, 3}, {1, 0}},
                             {{1, 3, 1, 2}, {2, 3, 0, 1}},
                             {{3, 1, 4, 2}, {3, 1, 0, 2}},
                             {{37, 45}, {1, 0}},
                             {{2, 3, 4, 5}, {0, 1, 3, 2}},
                             {{2, 3, 4, 5}, {}},
                             {{6}, {0}}};
  std::vector<int64_t> perm3 = {0, 1, 2};
  do {
    cases.push_back({{2, 3, 4}, perm3});
  } while (std::next_permutation(perm3.begin(), perm3.end()));
  for (const Case &c : cases) {
    std::vector<int64_t> perm = c.perm;
    if (perm.empty())
      for (int64_t d = static_cast<int64_t>(c.in.size()) - 1; d >= 0; --d)
        perm.push_back(d);
    Shape out_shape;
    for (int64_t p : perm)
      out_shape.push_back(c.in[p]);
    for (DType dtype : kAllDTypes) {
      TestTensor x = numbered(dtype, c.in, rng);
      std::vector<Attribute> attrs;
      if (!c.perm.empty()) attrs.push_back(ints_attr("perm", c.perm));
      TestTensor y = run_one("Transpose", {x}, attrs);
      TestTensor expected = gather_reference(x, out_shape, [&](const Shape &out_index) {
        Shape in_index(c.in.size(), 0);
        for (size_t d = 0; d < perm.size(); ++d)
          in_index[perm[d]] = out_index[d];
        return flat_index(in_index, c.in);
      });
      expect_same_tensor(y, expected,
                         str_cat("Transpose ", shape_to_string(c.in), " perm ",
                                 shape_to_string(perm), " ", dtype_name(dtype)));
    }
  }
}

TEST(ShapeTest, ConcatAndSplitMatchReference) {
  std::mt19937 rng(3);
  struct Case {
    std::vector<Shape> pieces;
    int64_t axis;
  };
  const Case cases[] = {
      {{{2, 3}, {4, 3}}, 0},
      {{{2, 3}, {2, 1}, {2, 0}, {2, 5}}, 1},
      {{{2, 3, 4}, {2, 2, 4}}, -2},
      {{{2, 3, 4}, {2, 3, 1}, {2, 3, 2}}, -1},
      {{{5}}, 0},
      {{{0, 2}, {0, 2}}, 1},
      {{{1, 1}, {1, 1}, {1, 1}}, 0},
  };
  for (const Case &c : cases) {
    for (DType dtype : kAllDTypes) {
      std::vector<TestTensor> inputs;
      for (const Shape &shape : c.pieces)
        inputs.push_back(numbered(dtype, shape, rng));
      const int64_t rank = static_cast<int64_t>(c.pieces[0].size());
      const int64_t axis = c.axis < 0 ? c.axis + rank : c.axis;
      Shape out_shape = c.pieces[0];
      std::vector<int64_t> sizes = {c.pieces[0][axis]};
      for (size_t i = 1; i < c.pieces.size(); ++i) {
        out_shape[axis] += c.pieces[i][axis];
        sizes.push_back(c.pieces[i][axis]);
      }
      // Reference: the output element at `index` comes from the piece whose range
      // along axis holds index[axis].
      TestTensor expected = zeros(dtype, out_shape);
      const size_t esize = dtype_size(dtype);
      for (int64_t i = 0; i < expected.num_elements(); ++i) {
        Shape index = unravel(i, out_shape);
        size_t piece = 0;
        while (index[axis] >= c.pieces[piece][axis]) {
          index[axis] -= c.pieces[piece][axis];
          ++piece;
        }
        std::vector<uint8_t> bytes = element(inputs[piece], flat_index(index, c.pieces[piece]));
        std::copy(bytes.begin(), bytes.end(), expected.bytes.begin() + i * esize);
      }
      std::string what = str_cat("axis ", c.axis, " ", dtype_name(dtype), " pieces ",
                                 c.pieces.size(), " first ", shape_to_string(c.pieces[0]));
      TestTensor joined = run_one("Concat", inputs, {int_attr("axis", c.axis)});
      expect_same_tensor(joined, expected, str_cat("Concat ", what));

      RunResult split =
          run_op("Split", {expected}, {int_attr("axis", c.axis), ints_attr("split", sizes)});
      ASSERT_TRUE(split.status.is_ok()) << split.status.to_string();
      ASSERT_EQ(split.outputs.size(), inputs.size());
      for (size_t i = 0; i < inputs.size(); ++i)
        expect_same_tensor(split.outputs[i], inputs[i], str_cat("Split ", what, " output ", i));
    }
  }
}

// Reference Slice, written from the ONNX definition: positions below zero count
// from the end, then clamp; indices are enumerated one step at a time.
std::vector<int64_t> slice_indices(int64_t dim, int64_t start, int64_t end, int64_t step) {
  auto adjust = [&](int64_t p) -> int64_t {
    if (p < 0) p = p <= std::numeric_limits<int64_t>::min() + dim ? -1 : p + dim;
    return p;
  };
  start = adjust(start);
  end = adjust(end);
  std::vector<int64_t> out;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, dim);
    end = std::clamp<int64_t>(end, 0, dim);
    for (int64_t i = start; i < end; i += step) {
      out.push_back(i);
      if (step > dim) break;
    }
  } else if (dim > 0) {
    start = std::clamp<int64_t>(start, 0, dim - 1);
    end = std::clamp<int64_t>(end, -1, dim - 1);
    for (int64_t i = start; i > end; i += step) {
      out.push_back(i);
      if (-(step + 1) >= dim) break;
    }
  }
  return out;
}

TEST(ShapeTest, SliceMatchesReference) {
  std::mt19937 rng(4);
  const Shape shape = {6, 5, 4};
  const int64_t kBig = std::numeric_limits<int64_t>::max();
  const int64_t kSmall = std::numeric_limits<int64_t>::min();
  const std::vector<int64_t> positions = {0, 1, 3, 5, 6, 9, -1, -2, -6, -9, kBig, kSmall};
  const std::vector<int64_t> steps = {1, 2, 3, -1, -2, -4, kBig, kSmall};
  for (int trial = 0; trial < 300; ++trial) {
    // A random subset of axes, in random order, sometimes negative.
    std::vector<int64_t> axes = {0, 1, 2};
    std::shuffle(axes.begin(), axes.end(), rng);
    axes.resize(1 + rng() % 3);
    std::vector<int64_t> starts, ends, step_values, attr_axes;
    for (int64_t axis : axes) {
      starts.push_back(positions[rng() % positions.size()]);
      ends.push_back(positions[rng() % positions.size()]);
      step_values.push_back(steps[rng() % steps.size()]);
      attr_axes.push_back(rng() % 2 ? axis : axis - 3);
    }
    std::vector<std::vector<int64_t>> picked(3);
    for (int64_t d = 0; d < 3; ++d) {
      picked[d].resize(shape[d]);
      std::iota(picked[d].begin(), picked[d].end(), 0);
    }
    for (size_t i = 0; i < axes.size(); ++i)
      picked[axes[i]] = slice_indices(shape[axes[i]], starts[i], ends[i], step_values[i]);
    Shape out_shape;
    for (const auto &p : picked)
      out_shape.push_back(static_cast<int64_t>(p.size()));
    DType dtype = kAllDTypes[trial % 6];
    TestTensor x = numbered(dtype, shape, rng);
    TestTensor expected = gather_reference(x, out_shape, [&](const Shape &index) {
      Shape in_index;
      for (size_t d = 0; d < 3; ++d)
        in_index.push_back(picked[d][index[d]]);
      return flat_index(in_index, shape);
    });
    std::vector<Attribute> attrs = {ints_attr("starts", starts), ints_attr("ends", ends),
                                    ints_attr("axes", attr_axes)};
    bool unit_steps =
        std::all_of(step_values.begin(), step_values.end(), [](int64_t s) { return s == 1; });
    if (!unit_steps || trial % 2) attrs.push_back(ints_attr("steps", step_values));
    TestTensor y = run_one("Slice", {x}, attrs);
    expect_same_tensor(y, expected,
                       str_cat("Slice starts ", shape_to_string(starts), " ends ",
                               shape_to_string(ends), " axes ", shape_to_string(attr_axes),
                               " steps ", shape_to_string(step_values)));
    if (::testing::Test::HasFailure()) break;
  }
}

TEST(ShapeTest, SliceDefaultsAndEdgeCases) {
  std::mt19937 rng(5);
  TestTensor x = numbered(DType::kF32, {4, 3}, rng);
  // Default axes are 0..n-1 and default steps are 1.
  TestTensor y = run_one("Slice", {x}, {ints_attr("starts", {1, 1}), ints_attr("ends", {3, 3})});
  EXPECT_EQ(y.type.shape, (Shape{2, 2}));
  EXPECT_EQ(element(y, 0), element(x, 4));
  EXPECT_EQ(element(y, 3), element(x, 8));
  // Empty result, and slicing a dimension of size 0.
  EXPECT_EQ(run_one("Slice", {x}, {ints_attr("starts", {3}), ints_attr("ends", {1})}).type.shape,
            (Shape{0, 3}));
  TestTensor empty = zeros(DType::kI64, {0, 2});
  EXPECT_EQ(run_one("Slice", {empty},
                    {ints_attr("starts", {0}), ints_attr("ends", {5}), ints_attr("steps", {-1})})
                .type.shape,
            (Shape{0, 2}));
  // A scalar with no slicing at all.
  TestTensor scalar = numbered(DType::kI32, {}, rng);
  expect_same_tensor(run_one("Slice", {scalar}, {ints_attr("starts", {}), ints_attr("ends", {})}),
                     scalar);
}

TEST(ShapeTest, GatherMatchesReference) {
  std::mt19937 rng(6);
  struct Case {
    Shape data;
    Shape indices;
    int64_t axis;
  };
  const Case cases[] = {
      {{5, 3}, {4}, 0},    {{5, 3}, {2, 2}, 1},     {{5, 3}, {}, 0}, {{5, 3}, {}, -1},
      {{2, 6, 3}, {7}, 1}, {{2, 6, 3}, {3, 1}, -1}, {{4}, {0}, 0},   {{4}, {10}, 0},
      {{3, 0}, {2}, 0},    {{1000, 8}, {300}, 0},
  };
  for (const Case &c : cases) {
    const int64_t rank = static_cast<int64_t>(c.data.size());
    const int64_t axis = c.axis < 0 ? c.axis + rank : c.axis;
    const int64_t bound = c.data[axis];
    for (DType index_dtype : {DType::kI32, DType::kI64}) {
      for (DType dtype : kAllDTypes) {
        TestTensor data = numbered(dtype, c.data, rng);
        TestTensor indices = random_tensor(index_dtype, c.indices, rng, static_cast<double>(-bound),
                                           static_cast<double>(bound - 1));
        Shape out_shape(c.data.begin(), c.data.begin() + axis);
        out_shape.append(c.indices.begin(), c.indices.end());
        out_shape.append(c.data.begin() + axis + 1, c.data.end());
        const int64_t index_rank = static_cast<int64_t>(c.indices.size());
        TestTensor expected = gather_reference(data, out_shape, [&](const Shape &out_index) {
          Shape index_position(out_index.begin() + axis, out_index.begin() + axis + index_rank);
          int64_t value = static_cast<int64_t>(indices.get(flat_index(index_position, c.indices)));
          if (value < 0) value += bound;
          Shape in_index(out_index.begin(), out_index.begin() + axis);
          in_index.push_back(value);
          in_index.append(out_index.begin() + axis + index_rank, out_index.end());
          return flat_index(in_index, c.data);
        });
        TestTensor y = run_one("Gather", {data, indices}, {int_attr("axis", c.axis)});
        expect_same_tensor(y, expected,
                           str_cat("Gather ", shape_to_string(c.data), " indices ",
                                   shape_to_string(c.indices), " axis ", c.axis, " ",
                                   dtype_name(dtype), " ", dtype_name(index_dtype)));
      }
    }
  }
}

TEST(ShapeTest, GatherOutOfRangeIndexIsAnError) {
  TestTensor data = zeros(DType::kF32, {4, 2});
  for (int64_t bad : {4, -5, 1000}) {
    TestTensor indices = typed_tensor<int64_t>(DType::kI64, {3}, {0, bad, 1});
    RunResult result = run_op("Gather", {data, indices});
    EXPECT_EQ(result.status.code(), StatusCode::kOutOfRange);
    expect_error(result.status, {"Gather", std::to_string(bad), "4"});
  }
  TestTensor i32 = typed_tensor<int32_t>(DType::kI32, {1}, {-7});
  expect_error(run_op("Gather", {data, i32}).status, {"Gather", "-7", "size 4"});
}

// A table split by rows over `parts` members (Megatron-LM's vocabulary-parallel
// embedding): each member's lookups hold its rows and zeros for the others',
// so the members' outputs sum to the whole table's; the gradient's pieces join
// into the whole gradient. Indices are checked against the whole table.
TEST(ShapeTest, GatherFromATableSplitByRowsSumsToTheWholeGather) {
  std::mt19937 rng(4242);
  for (int64_t axis : {0, 1}) {
    const Shape shape = axis == 0 ? Shape{12, 3} : Shape{2, 12, 3};
    TestTensor table = random_tensor(DType::kF32, shape, rng);
    TestTensor indices = typed_tensor<int64_t>(DType::kI64, {2, 4}, {0, 11, -1, 5, 6, -12, 3, 5});
    TestTensor whole = run_one("Gather", {table, indices}, {int_attr("axis", axis)});
    TestTensor dy = random_tensor(DType::kF32, whole.type.shape, rng);
    const std::vector<int64_t> dims(shape.begin(), shape.end());
    TestTensor whole_grad =
        run_one("GatherGrad", {dy, indices}, {int_attr("axis", axis), ints_attr("shape", dims)});
    for (int64_t parts : {2, 3, 4}) {
      const std::string what = str_cat("axis ", axis, ", ", parts, " parts");
      std::vector<double> sum(static_cast<size_t>(whole.num_elements()), 0.0);
      std::vector<TestTensor> grads;
      std::vector<int64_t> piece_dims = dims;
      piece_dims[static_cast<size_t>(axis)] /= parts;
      for (int r = 0; r < parts; ++r) {
        const Member member{static_cast<int>(parts), r};
        TestTensor mine = run_one("Gather", {piece_of(table, axis, parts, r), indices},
                                  {int_attr("axis", axis), int_attr("parts", parts)}, member);
        for (int64_t i = 0; i < mine.num_elements(); ++i)
          sum[static_cast<size_t>(i)] += mine.get(i);
        grads.push_back(run_one(
            "GatherGrad", {dy, indices},
            {int_attr("axis", axis), ints_attr("shape", piece_dims), int_attr("parts", parts)},
            member));
      }
      // One member holds each row: the sum is exact.
      expect_close(whole, sum, 0, 0, what);
      expect_close(whole_grad, joined(grads, axis), 0, 0, what + " gradient");
    }
  }
  // Indices beyond the whole table, and a member outside its group.
  TestTensor piece = zeros(DType::kF32, {6, 3});
  RunResult bad = run_op("Gather", {piece, typed_tensor<int64_t>(DType::kI64, {1}, {12})},
                         {int_attr("parts", 2)}, Member{2, 1});
  expect_error(bad.status, {"Gather", "12", "size 12"});
  bad = run_op("Gather", {piece, typed_tensor<int64_t>(DType::kI64, {1}, {0})},
               {int_attr("parts", 2)});
  expect_error(bad.status, {"Gather", "split over 2", "group of 1"});
}

TEST(ShapeTest, ConstantWritesValuesInEveryDtype) {
  const std::vector<double> values = {0, 1.5, -2, 3.75, 100, -0.25};
  for (DType dtype : kAllDTypes) {
    std::string name(dtype_name(dtype));
    TestTensor full = run_one(
        "Constant", {},
        {string_attr("dtype", name), ints_attr("shape", {2, 3}), floats_attr("value", values)});
    ASSERT_EQ(full.type, (TensorType{dtype, {2, 3}}));
    TestTensor expected = zeros(dtype, {2, 3});
    for (int64_t i = 0; i < 6; ++i)
      expected.set(i, is_integer(dtype) ? std::trunc(values[i]) : values[i]);
    expect_same_tensor(full, expected, str_cat("Constant ", name));

    TestTensor fill = run_one(
        "Constant", {},
        {string_attr("dtype", name), ints_attr("shape", {5}), floats_attr("value", {-3.5})});
    std::vector<double> fill_expected(5, dtype == DType::kBool ? 1.0
                                         : is_floating(dtype)  ? -3.5
                                                               : -3.0);
    expect_close(fill, fill_expected, 0, 0, str_cat("Constant fill ", name));
  }
  // Defaults: f32, scalar.
  TestTensor scalar = run_one("Constant", {}, {floats_attr("value", {2.5})});
  EXPECT_EQ(scalar.type, (TensorType{DType::kF32, {}}));
  expect_close(scalar, {2.5}, 0, 0, "Constant scalar");
  // Integer values given as ints are accepted for a floats attribute.
  TestTensor from_ints =
      run_one("Constant", {},
              {string_attr("dtype", "i64"), ints_attr("shape", {2}), ints_attr("value", {7, -9})});
  EXPECT_EQ(from_ints.as<int64_t>()[1], -9);
}

// A Constant of integers holds each value truncated toward zero; NaN,
// infinity and values beyond the dtype have no such value (the kernel would
// write 0 or the dtype's limit) and are refused when the node is checked,
// naming the element and the value. Floating and bool constants take them.
TEST(ShapeTest, ConstantOfIntegersRefusesValuesWithoutOne) {
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  const struct {
    const char *dtype;
    std::vector<double> values;
    std::string cause;
  } cases[] = {
      {"i64", {1, nan}, "Constant: attribute 'value'[1] = nan has no i64 value (not finite)"},
      {"i64", {nan}, "Constant: attribute 'value'[0] = nan has no i64 value (not finite)"},
      {"i32", {-inf, 2}, "Constant: attribute 'value'[0] = -inf has no i32 value (not finite)"},
      {"i32",
       {2147483648.0, 0},
       "attribute 'value'[0] = 2.14748e+09 has no i32 value (out of range)"},
      {"i64", {0, 1e19}, "attribute 'value'[1] = 1e+19 has no i64 value (out of range)"},
  };
  for (const auto &c : cases)
    expect_error(infer("Constant", {},
                       {string_attr("dtype", c.dtype),
                        ints_attr("shape", {static_cast<int64_t>(c.values.size())}),
                        floats_attr("value", c.values)})
                     .status(),
                 {c.cause}, c.cause);
  // The limits themselves, and NaN where the dtype has it.
  for (const auto &[dtype, value] :
       std::vector<std::pair<std::string, double>>{{"i32", 2147483647.9},
                                                   {"i32", -2147483648.9},
                                                   {"i64", -9223372036854775808.0},
                                                   {"f32", nan},
                                                   {"f16", -inf},
                                                   {"bool", nan}}) {
    auto ok = infer("Constant", {}, {string_attr("dtype", dtype), floats_attr("value", {value})});
    EXPECT_TRUE(ok.is_ok()) << dtype << " " << value << ": " << ok.status().message();
  }
}

TEST(ShapeTest, InferenceErrorsNameTheProblem) {
  TensorType x{DType::kF32, {2, 3, 4}};
  expect_error(infer("Reshape", {x}, {ints_attr("shape", {5, 5})}).status(),
               {"Reshape", "[2, 3, 4]", "[5, 5]"});
  expect_error(infer("Reshape", {x}, {ints_attr("shape", {-1, -1})}).status(),
               {"Reshape", "more than one -1"});
  expect_error(infer("Reshape", {x}, {ints_attr("shape", {5, -1})}).status(),
               {"Reshape", "[2, 3, 4]", "[5, -1]"});
  expect_error(infer("Reshape", {x}, {ints_attr("shape", {1, 1, 1, 0})}).status(),
               {"Reshape", "dimension 3"});
  expect_error(infer("Reshape", {x}).status(), {"Reshape", "'shape'"});
  expect_error(infer("Flatten", {x}, {int_attr("axis", 4)}).status(), {"Flatten", "'axis'", "4"});
  expect_error(infer("Transpose", {x}, {ints_attr("perm", {0, 0, 1})}).status(),
               {"Transpose", "perm", "[0, 0, 1]", "permutation"});
  expect_error(infer("Transpose", {x}, {ints_attr("perm", {1, 0})}).status(),
               {"Transpose", "[1, 0]", "[2, 3, 4]"});
  TensorType y{DType::kF32, {2, 5, 4}};
  TensorType z{DType::kF32, {3, 5, 4}};
  expect_error(infer("Concat", {x, z}, {int_attr("axis", 1)}).status(),
               {"Concat", "input 1", "[3, 5, 4]", "[2, 3, 4]"});
  ASSERT_TRUE(infer("Concat", {x, y}, {int_attr("axis", 1)}).is_ok());
  expect_error(
      infer("Concat", {x, TensorType{DType::kI32, {2, 3, 4}}}, {int_attr("axis", 0)}).status(),
      {"Concat", "input 1", "i32"});
  expect_error(infer("Concat", {x}, {int_attr("axis", 3)}).status(), {"Concat", "'axis'", "3"});
  expect_error(infer("Concat", {x}).status(), {"Concat", "'axis'"});
  expect_error(infer("Split", {x}, {int_attr("axis", 1), ints_attr("split", {1, 1})}).status(),
               {"Split", "sums to 2", "3", "[2, 3, 4]"});
  expect_error(infer("Split", {x}, {ints_attr("split", {3, -1})}).status(), {"Split", "-1"});
  // Sizes whose sum would overflow int64 are refused, not summed.
  expect_error(infer("Split", {x},
                     {int_attr("axis", 1),
                      ints_attr("split", {int64_t{1} << 62, int64_t{1} << 62, int64_t{1} << 62})})
                   .status(),
               {"Split", "sums past dimension 1", "[2, 3, 4]"});
  expect_error(infer("Slice", {x},
                     {ints_attr("starts", {0}), ints_attr("ends", {1}), ints_attr("axes", {3})})
                   .status(),
               {"Slice", "'axes'", "3"});
  expect_error(
      infer("Slice", {x},
            {ints_attr("starts", {0, 0}), ints_attr("ends", {1, 1}), ints_attr("axes", {1, -2})})
          .status(),
      {"Slice", "'axes'", "repeats"});
  expect_error(infer("Slice", {x}, {ints_attr("starts", {0}), ints_attr("ends", {1, 2})}).status(),
               {"Slice", "'ends'"});
  expect_error(infer("Slice", {x},
                     {ints_attr("starts", {0}), ints_attr("ends", {1}), ints_attr("steps", {0})})
                   .status(),
               {"Slice", "'steps'"});
  expect_error(infer("Squeeze", {x}, {ints_attr("axes", {1})}).status(),
               {"Squeeze", "axis 1", "[2, 3, 4]"});
  expect_error(infer("Unsqueeze", {x}, {ints_attr("axes", {4, 0, 6})}).status(),
               {"Unsqueeze", "'axes'", "6"});
  expect_error(infer("Gather", {x, TensorType{DType::kF32, {2}}}).status(),
               {"Gather", "input 1", "f32"});
  expect_error(infer("Gather", {x, TensorType{DType::kI32, {2}}}, {int_attr("axis", -4)}).status(),
               {"Gather", "'axis'", "-4"});
  expect_error(
      infer("Constant", {}, {ints_attr("shape", {2, 2}), floats_attr("value", {1, 2})}).status(),
      {"Constant", "'value'", "2", "4"});
  expect_error(
      infer("Constant", {}, {string_attr("dtype", "f64"), floats_attr("value", {1})}).status(),
      {"Constant", "'dtype'", "f64"});
  expect_error(
      infer("Constant", {}, {ints_attr("shape", {-2}), floats_attr("value", {1})}).status(),
      {"Constant", "negative"});
}

TEST(ShapeTest, ShapeOpsCostNoFlops) {
  TensorType x{DType::kF32, {2, 3, 4}};
  for (const char *op : {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity"}) {
    OpCost cost = OpRegistry::global().cost(make_node(op), {x}, {x});
    EXPECT_EQ(cost.flops, 0) << op;
    EXPECT_EQ(cost.bytes_written, 96) << op;
  }
}

} // namespace
} // namespace strata::ops
