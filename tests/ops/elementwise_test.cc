// Tests of the elementwise ops against plain references computed in double, with
// guard bytes around every buffer (see op_test_util.h).
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numbers>

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include "graph/host_tensor.h"
#include "ops/kernels/gelu_math.h"

#include "tests/ops/op_test_util.h"

namespace strata::ops {
namespace {

using namespace strata::ops::testing;

struct ShapePair {
  Shape a, b;
};

// Broadcasting cases, including scalars, size-1 dims, empty tensors and shapes
// where neither side is a scalar or equal.
const std::vector<ShapePair> &broadcast_cases() {
  static const std::vector<ShapePair> cases = {
      {{2, 3}, {2, 3}},
      {{2, 3}, {}},
      {{}, {2, 3}},
      {{}, {}},
      {{1}, {1}},
      {{4, 1, 3}, {5, 1}},
      {{1}, {3, 1, 2}},
      {{2, 1, 4, 1}, {1, 3, 1, 5}},
      {{7, 33}, {33}},
      {{7, 33}, {7, 1}},
      {{0, 3}, {1, 3}},
      {{3, 1}, {1, 0}},
      {{2, 3, 4, 5}, {3, 1, 5}},
      {{1, 1}, {1}},
      {{65}, {1}},
  };
  return cases;
}

// C = f(A, B) with NumPy broadcasting, in double.
std::vector<double> reference_binary(const TestTensor &a, const TestTensor &b,
                                     llvm::ArrayRef<int64_t> out_shape,
                                     const std::function<double(double, double)> &f) {
  std::vector<double> out;
  for (int64_t i = 0; i < num_elements(out_shape); ++i) {
    Shape index = unravel(i, out_shape);
    out.push_back(
        f(a.get(broadcast_flat(index, a.type.shape)), b.get(broadcast_flat(index, b.type.shape))));
  }
  return out;
}

struct BinaryCase {
  const char *op;
  std::function<double(double, double)> f;
  double lo_a, hi_a, lo_b, hi_b; // input ranges
  double rtol;
};

TEST(ElementwiseTest, BinaryF32MatchesReferenceWithBroadcasting) {
  std::mt19937 rng(1234);
  const BinaryCase cases[] = {
      {"Add", [](double a, double b) { return a + b; }, -3, 3, -3, 3, 1e-6},
      {"Sub", [](double a, double b) { return a - b; }, -3, 3, -3, 3, 1e-6},
      {"Mul", [](double a, double b) { return a * b; }, -3, 3, -3, 3, 1e-6},
      {"Div", [](double a, double b) { return a / b; }, -3, 3, 0.5, 2, 1e-6},
      {"Pow", [](double a, double b) { return std::pow(a, b); }, 0.1, 3, -2, 2, 1e-5},
  };
  for (const BinaryCase &c : cases) {
    for (const ShapePair &shapes : broadcast_cases()) {
      TestTensor a = random_tensor(DType::kF32, shapes.a, rng, c.lo_a, c.hi_a);
      TestTensor b = random_tensor(DType::kF32, shapes.b, rng, c.lo_b, c.hi_b);
      if (std::string_view(c.op) == "Div") // also negative divisors
        for (int64_t i = 0; i < b.num_elements(); ++i)
          if (rng() & 1) b.set(i, -b.get(i));
      TestTensor c_out = run_one(c.op, {a, b});
      Shape expected_shape = *broadcast_shapes(shapes.a, shapes.b);
      ASSERT_EQ(c_out.type.shape, expected_shape) << c.op;
      expect_close(c_out, reference_binary(a, b, expected_shape, c.f), 1e-6, c.rtol,
                   str_cat(c.op, " ", shape_to_string(shapes.a), " ", shape_to_string(shapes.b)));
    }
  }
}

// A scalar exponent of 2 is the exact square and of 1 the value itself
// (negative bases, zeros, infinities and NaN included); other exponents use pow.
TEST(ElementwiseTest, PowBySquaringAndIdentity) {
  const std::vector<double> values = {-3.5,
                                      -1e-20,
                                      -0.0,
                                      0.0,
                                      1.5,
                                      1e20,
                                      3e38,
                                      std::numeric_limits<double>::infinity(),
                                      -std::numeric_limits<double>::infinity(),
                                      std::numeric_limits<double>::quiet_NaN()};
  const auto n = static_cast<int64_t>(values.size());
  TestTensor x = ops::testing::tensor(DType::kF32, {n}, values);
  for (double e : {2.0, 1.0, 3.0}) {
    TestTensor y = run_one("Pow", {x, ops::testing::tensor(DType::kF32, {}, {e})});
    for (int64_t i = 0; i < n; ++i) {
      const float v = x.as<float>()[i];
      const float want = e == 2.0 ? v * v : e == 1.0 ? v : std::pow(v, 3.0f);
      const float got = y.as<float>()[i];
      EXPECT_TRUE(std::memcmp(&got, &want, sizeof got) == 0 || (got != got && want != want))
          << v << " ^ " << e << ": " << got << " vs " << want;
    }
  }
}

TEST(ElementwiseTest, BinaryIntegersAreExact) {
  std::mt19937 rng(99);
  for (DType dtype : {DType::kI32, DType::kI64}) {
    for (const char *op : {"Add", "Sub", "Mul", "Div"}) {
      for (const ShapePair &shapes : broadcast_cases()) {
        TestTensor a = random_tensor(dtype, shapes.a, rng, -1000, 1000);
        TestTensor b = random_tensor(dtype, shapes.b, rng, -1000, 1000);
        for (int64_t i = 0; i < b.num_elements(); ++i)
          if (b.get(i) == 0) b.set(i, 7);
        TestTensor c = run_one(op, {a, b});
        auto f = [op](double x, double y) -> double {
          auto ix = static_cast<int64_t>(x), iy = static_cast<int64_t>(y);
          switch (op[0]) {
          case 'A': return static_cast<double>(ix + iy);
          case 'S': return static_cast<double>(ix - iy);
          case 'M': return static_cast<double>(ix * iy);
          default: return static_cast<double>(ix / iy); // truncates toward zero
          }
        };
        expect_close(c, reference_binary(a, b, c.type.shape, f), 0, 0,
                     str_cat(op, " ", dtype_name(dtype), " ", shape_to_string(shapes.a), " ",
                             shape_to_string(shapes.b)));
      }
    }
  }
}

TEST(ElementwiseTest, IntegerOverflowWrapsAndDivisionByZeroFails) {
  constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
  constexpr int32_t kMin = std::numeric_limits<int32_t>::min();
  TestTensor a = typed_tensor<int32_t>(DType::kI32, {3}, {kMax, kMin, 7});
  TestTensor b = typed_tensor<int32_t>(DType::kI32, {3}, {1, -1, -2});
  TestTensor sum = run_one("Add", {a, b});
  EXPECT_EQ(sum.as<int32_t>()[0], kMin);
  TestTensor quotient = run_one("Div", {a, b});
  EXPECT_EQ(quotient.as<int32_t>()[1], kMin); // kMin / -1 wraps
  EXPECT_EQ(quotient.as<int32_t>()[2], -3);   // truncation toward zero
  TestTensor negated = run_one("Neg", {a});
  EXPECT_EQ(negated.as<int32_t>()[1], kMin);
  TestTensor zero = typed_tensor<int32_t>(DType::kI32, {3}, {1, 0, 2});
  RunResult divided = run_op("Div", {a, zero});
  expect_error(divided.status, {"Div", "division by zero"});
}

struct UnaryCase {
  const char *op;
  std::function<double(double)> f;
  double lo, hi;
  double atol, rtol;
  std::vector<Attribute> attrs = {};
};

double gelu_tanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}

TEST(ElementwiseTest, UnaryF32MatchesReference) {
  std::mt19937 rng(42);
  const UnaryCase cases[] = {
      {"Neg", [](double x) { return -x; }, -5, 5, 0, 0},
      {"Sqrt", [](double x) { return std::sqrt(x); }, 0, 10, 0, 1e-6},
      {"Exp", [](double x) { return std::exp(x); }, -10, 10, 0, 2e-6},
      {"Log", [](double x) { return std::log(x); }, 1e-3, 100, 1e-6, 1e-6},
      {"Erf", [](double x) { return std::erf(x); }, -3, 3, 1e-6, 1e-6},
      {"Relu", [](double x) { return x < 0 ? 0 : x; }, -5, 5, 0, 0},
      {"Tanh", [](double x) { return std::tanh(x); }, -5, 5, 1e-6, 1e-6},
      {"Sigmoid", [](double x) { return 1 / (1 + std::exp(-x)); }, -20, 20, 1e-6, 1e-6},
      {"Gelu", [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }, -5, 5, 1e-6,
       1e-6},
      {"Gelu",
       [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); },
       -5,
       5,
       1e-6,
       1e-6,
       {string_attr("approximate", "none")}},
      {"Gelu", gelu_tanh, -5, 5, 1e-6, 1e-6, {string_attr("approximate", "tanh")}},
      {"Clip", [](double x) { return x; }, -5, 5, 0, 0},
      {"Clip",
       [](double x) { return std::min(std::max(x, -1.0), 0.5); },
       -5,
       5,
       0,
       0,
       {float_attr("min", -1.0), float_attr("max", 0.5)}},
      {"Clip",
       [](double x) { return std::max(x, 0.0); },
       -5,
       5,
       0,
       0,
       {int_attr("min", 0)}}, // an integer where a float is expected is accepted
      {"Clip",
       [](double) { return 1.0; },
       -5,
       5,
       0,
       0,
       {float_attr("min", 2.0), float_attr("max", 1.0)}}, // min > max gives max
      {"Identity", [](double x) { return x; }, -5, 5, 0, 0},
      {"Dropout", [](double x) { return x; }, -5, 5, 0, 0},
      {"Dropout",
       [](double x) { return x; },
       -5,
       5,
       0,
       0,
       {float_attr("ratio", 0.9), int_attr("training", 0)}},
  };
  const Shape shapes[] = {{}, {1}, {17}, {3, 5, 7}, {0, 4}, {1000}};
  for (const UnaryCase &c : cases) {
    for (const Shape &shape : shapes) {
      TestTensor x = random_tensor(DType::kF32, shape, rng, c.lo, c.hi);
      TestTensor y = run_one(c.op, {x}, c.attrs);
      EXPECT_EQ(y.type, x.type) << c.op;
      std::vector<double> expected;
      for (double v : x.values())
        expected.push_back(c.f(v));
      expect_close(y, expected, c.atol, c.rtol, str_cat(c.op, " ", shape_to_string(shape)));
    }
  }
}

// Gelu uses vectorized erf / exp approximations. Bound tested: for every x of a
// dense sweep of [-10, 10] (step 1e-4, 200001 points) plus extremes and
// subnormals, |gelu(x) - ref(x)| <= 1e-6 + 1e-6 |ref(x)| (<= 2e-6 max(1, |ref|)),
// ref in double; +inf -> +inf, -inf -> 0, NaN -> NaN; and the result does not
// depend on where an element sits in the tensor (vector body vs tail).
TEST(ElementwiseTest, GeluDenseSweepAndSpecialValues) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> xs;
  for (int i = -100000; i <= 100000; ++i)
    xs.push_back(static_cast<float>(i * 1e-4));
  for (double v : {1e-40, -1e-40, 1.4e-45, -1.4e-45, 1e-30, -1e-30, 20.0, -20.0, 88.8, -88.8, 1e30,
                   -1e30, 3.4e38, -3.4e38})
    xs.push_back(v);
  const auto exact = [](double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); };
  for (const char *form : {"none", "tanh"}) {
    const bool tanh_form = std::string(form) == "tanh";
    TestTensor x = tensor(DType::kF32, {static_cast<int64_t>(xs.size())}, xs);
    TestTensor y = run_one("Gelu", {x}, {string_attr("approximate", form)});
    std::vector<double> expected;
    for (double v : x.values())
      expected.push_back(tanh_form ? (v < -20 ? 0.0 : gelu_tanh(v)) : exact(v));
    expect_close(y, expected, 1e-6, 1e-6, str_cat("Gelu ", form));
    // Special values, at every offset within a short tensor.
    const std::vector<double> special = {inf, -inf, nan, 0.0, -0.0, 1.0};
    for (size_t shift = 0; shift < special.size(); ++shift) {
      std::vector<double> in(special.size());
      for (size_t i = 0; i < in.size(); ++i)
        in[(i + shift) % in.size()] = special[i];
      TestTensor out = run_one("Gelu", {tensor(DType::kF32, {static_cast<int64_t>(in.size())}, in)},
                               {string_attr("approximate", form)});
      for (size_t i = 0; i < in.size(); ++i) {
        const double a = out.get(static_cast<int64_t>(i));
        if (std::isnan(in[i]))
          EXPECT_TRUE(std::isnan(a)) << form;
        else if (in[i] == inf)
          EXPECT_EQ(a, inf) << form;
        else if (in[i] == -inf)
          EXPECT_EQ(a, 0.0) << form;
        else
          EXPECT_NEAR(a, tanh_form ? gelu_tanh(in[i]) : exact(in[i]), 1e-6) << form;
      }
    }
    // Same input, same bits, at any position (block body or tail).
    TestTensor one =
        run_one("Gelu", {tensor(DType::kF32, {1}, {0.3})}, {string_attr("approximate", form)});
    TestTensor many = run_one("Gelu", {tensor(DType::kF32, {7}, std::vector<double>(7, 0.3))},
                              {string_attr("approximate", form)});
    for (int64_t i = 0; i < 7; ++i)
      EXPECT_EQ(many.get(i), one.get(0)) << form;
  }
}

// The CUDA kernels evaluate gelu_math.h's templates one float at a time; the
// CPU kernels four lanes at a time. The two must give the same bits (the CUDA
// backend's Gelu parity rests on it): the float instantiation against the
// registry's kernels over a dense sweep, both forms, values and gradients.
TEST(ElementwiseTest, GeluScalarMathIsTheKernelsBitForBit) {
  std::vector<double> xs;
  for (int i = -130000; i <= 130000; ++i)
    xs.push_back(static_cast<float>(i * 1e-4));
  for (double v : {-0.0, 1e-40, -1e-40, 20.0, -20.0, 88.8, -88.8, 1e30, -1e30})
    xs.push_back(v);
  const auto n = static_cast<int64_t>(xs.size());
  TestTensor x = tensor(DType::kF32, {n}, xs);
  TestTensor ones = tensor(DType::kF32, {n}, std::vector<double>(xs.size(), 1.0));
  for (const char *form : {"none", "tanh"}) {
    const bool tanh_form = std::string(form) == "tanh";
    TestTensor y = run_one("Gelu", {x}, {string_attr("approximate", form)});
    TestTensor dx = run_one("GeluGrad", {ones, x}, {string_attr("approximate", form)});
    int64_t differing = 0;
    for (int64_t i = 0; i < n; ++i) {
      const auto v = static_cast<float>(xs[static_cast<size_t>(i)]);
      const float value = tanh_form ? gelu::gelu_tanh_f32(v) : gelu::gelu_erf_f32(v);
      const float slope = tanh_form ? gelu::gelu_tanh_grad_f32(v) : gelu::gelu_erf_grad_f32(v);
      const float kernel_value = static_cast<float>(y.get(i));
      const float kernel_slope = static_cast<float>(dx.get(i));
      if (std::memcmp(&value, &kernel_value, sizeof(float)) != 0 ||
          std::memcmp(&slope, &kernel_slope, sizeof(float)) != 0)
        ++differing;
    }
    EXPECT_EQ(differing, 0) << form;
  }
}

TEST(ElementwiseTest, SpecialValues) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  TestTensor x = tensor(DType::kF32, {5}, {nan, inf, -inf, -100, 100});
  expect_close(run_one("Relu", {x}), {nan, inf, 0, 0, 100}, 0, 0, "Relu");
  expect_close(run_one("Sigmoid", {x}), {nan, 1, 0, 0, 1}, 1e-30, 0, "Sigmoid");
  expect_close(run_one("Tanh", {x}), {nan, 1, -1, -1, 1}, 0, 0, "Tanh");
  expect_close(run_one("Clip", {x}, {float_attr("min", -1), float_attr("max", 1)}),
               {nan, 1, -1, -1, 1}, 0, 0, "Clip");
  expect_close(run_one("Exp", {x}), {nan, inf, 0, std::exp(-100.0), inf}, 1e-45, 1e-6, "Exp");
}

TEST(ElementwiseTest, IntegerNeg) {
  std::mt19937 rng(5);
  for (DType dtype : {DType::kI32, DType::kI64}) {
    TestTensor x = random_tensor(dtype, {4, 9}, rng, -1000000, 1000000);
    std::vector<double> expected;
    for (double v : x.values())
      expected.push_back(-v);
    expect_close(run_one("Neg", {x}), expected, 0, 0, dtype_name(dtype));
  }
}

TEST(ElementwiseTest, IdentityCopiesEveryDtype) {
  std::mt19937 rng(6);
  for (DType dtype : kAllDTypes)
    for (const Shape &shape : {Shape{}, Shape{3, 7}, Shape{0}}) {
      TestTensor x = random_tensor(dtype, shape, rng, -100, 100);
      expect_same_tensor(run_one("Identity", {x}), x, dtype_name(dtype));
    }
}

// Reference for Cast: the rules of docs/ops.md, written directly.
double reference_cast(double v, DType from, DType to) {
  switch (to) {
  case DType::kBool: return v != 0 || std::isnan(v) ? 1 : 0;
  case DType::kF32: return static_cast<float>(v);
  case DType::kF16: return f16_to_float(float_to_f16(static_cast<float>(v)));
  case DType::kBF16: return bf16_to_float(float_to_bf16(static_cast<float>(v)));
  case DType::kI32:
  case DType::kI64: {
    const double lo = to == DType::kI32 ? -2147483648.0 : -9223372036854775808.0;
    const double hi = to == DType::kI32 ? 2147483647.0 : 9223372036854775807.0;
    if (std::isnan(v)) return 0;
    if (!is_floating(from)) // integer to integer wraps
      return to == DType::kI32 ? static_cast<double>(static_cast<int32_t>(static_cast<int64_t>(v)))
                               : v;
    double t = std::trunc(v);
    return t < lo ? lo : t > hi ? hi : t;
  }
  }
  return 0;
}

TEST(ElementwiseTest, CastBetweenEveryPairOfDtypes) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> float_values = {0,     -0.0,   1,   -1,   2.5, -2.5, 0.3,
                                            -7.75, 1000.5, 3e9, -3e9, inf, -inf, nan};
  const std::vector<double> int_values = {0, 1, -1, 7, -100, 123456, 16777217, -2147483648.0};
  for (DType from : kAllDTypes) {
    TestTensor x;
    if (is_floating(from)) {
      x = tensor(from, {static_cast<int64_t>(float_values.size())}, float_values);
    } else if (from == DType::kBool) {
      x = typed_tensor<uint8_t>(DType::kBool, {4}, {0, 1, 2, 0}); // any nonzero byte is true
    } else {
      x = tensor(from, {static_cast<int64_t>(int_values.size())}, int_values);
    }
    if (from == DType::kI64) { // wraps to 3 in i32; rounds in f32
      x.bytes.resize(x.bytes.size() + 8);
      x.type.shape[0] += 1;
      x.as<int64_t>()[x.num_elements() - 1] = (int64_t{1} << 40) + 3;
    }
    for (DType to : kAllDTypes) {
      TestTensor y = run_one("Cast", {x}, {string_attr("to", std::string(dtype_name(to)))});
      ASSERT_EQ(y.type, (TensorType{to, x.type.shape}));
      std::vector<double> expected;
      for (double v : x.values())
        expected.push_back(reference_cast(v, from, to));
      expect_close(y, expected, 0, 0, str_cat("Cast ", dtype_name(from), " -> ", dtype_name(to)));
      if (to == DType::kBool) { // bool outputs are exactly 0 or 1
        for (int64_t i = 0; i < y.num_elements(); ++i)
          EXPECT_LE(y.as<uint8_t>()[i], 1);
      }
    }
  }
}

// The training form is tested in elementwise_grad_test.cc; here only the checks.
TEST(ElementwiseTest, DropoutRejectsBadAttributesAndStep) {
  TestTensor x = zeros(DType::kF32, {4});
  expect_error(run_op("Dropout", {x}, {int_attr("training", 2)}).status, {"Dropout", "training"});
  expect_error(run_op("Dropout", {x}, {float_attr("ratio", 1.5)}).status, {"Dropout", "ratio"});
  expect_error(run_op("Dropout", {x, zeros(DType::kF32, {})}).status, {"Dropout", "step"});
}

TEST(ElementwiseTest, UnsupportedDtypesAreRefusedByName) {
  TestTensor h = zeros(DType::kF16, {3});
  for (const char *op : {"Exp", "Relu", "Sqrt", "Neg"}) {
    RunResult result = run_op(op, {h});
    EXPECT_EQ(result.status.code(), StatusCode::kUnimplemented) << op;
    expect_error(result.status, {op, "f16"});
  }
  RunResult add = run_op("Add", {h, h});
  EXPECT_EQ(add.status.code(), StatusCode::kUnimplemented);
  expect_error(add.status, {"Add", "f16"});
}

TEST(ElementwiseTest, InferenceErrorsNameTheProblem) {
  TensorType f23{DType::kF32, {2, 3}};
  TensorType f4{DType::kF32, {4}};
  TensorType i23{DType::kI32, {2, 3}};
  expect_error(infer("Add", {f23, f4}).status(), {"Add", "[2, 3]", "[4]"});
  expect_error(infer("Mul", {f23, i23}).status(), {"Mul", "input 1", "i32", "f32"});
  expect_error(infer("Pow", {i23, i23}).status(), {"Pow", "floating"});
  expect_error(infer("Sqrt", {i23}).status(), {"Sqrt", "input 0", "floating"});
  expect_error(
      infer("Add", {TensorType{DType::kBool, {2}}, TensorType{DType::kBool, {2}}}).status(),
      {"Add", "bool"});
  expect_error(infer("Cast", {f23}, {string_attr("to", "f8")}).status(), {"Cast", "'to'", "f8"});
  expect_error(infer("Cast", {f23}).status(), {"Cast", "'to'"});
  expect_error(infer("Gelu", {f23}, {string_attr("approximate", "fast")}).status(),
               {"Gelu", "approximate", "fast"});
  expect_error(infer("Add", {f23}).status(), {"Add", "2"});
  // Accepted types.
  ASSERT_TRUE(infer("Add", {i23, i23}).is_ok());
  EXPECT_EQ(
      (*infer("Sub", {TensorType{DType::kF32, {4, 1, 3}}, TensorType{DType::kF32, {5, 1}}}))[0],
      (TensorType{DType::kF32, {4, 5, 3}}));
  EXPECT_EQ((*infer("Cast", {f23}, {string_attr("to", "bf16")}))[0],
            (TensorType{DType::kBF16, {2, 3}}));
}

TEST(ElementwiseTest, CostCountsOneFlopPerOutputElement) {
  Node add = make_node("Add");
  TensorType a{DType::kF32, {8, 4}}, b{DType::kF32, {4}};
  OpCost cost = OpRegistry::global().cost(add, {a, b}, {a});
  EXPECT_EQ(cost.flops, 32);
  EXPECT_EQ(cost.bytes_read, 4 * (32 + 4));
  EXPECT_EQ(cost.bytes_written, 4 * 32);
  EXPECT_EQ(OpRegistry::global().cost(make_node("Identity"), {a}, {a}).flops, 0);
}

// The harness itself: a kernel that writes one element past its output must be
// caught by the guard check, and one that skips an element by the comparison.
Status overrunning_kernel(const KernelContext &context) {
  float *out = context.outputs[0].as<float>();
  for (int64_t i = 0; i <= context.outputs[0].num_elements(); ++i)
    out[i] = 1.0f;
  return Status::ok();
}

TEST(ElementwiseTest, HarnessCatchesOverrunsAndUnwrittenOutputs) {
  OpDef bad = *OpRegistry::global().find("Relu");
  bad.cpu_kernel = overrunning_kernel;
  TestTensor x = tensor(DType::kF32, {3}, {1, 1, 1});
  TensorType type = x.type;
  EXPECT_NONFATAL_FAILURE(run_kernel(bad, make_node("Relu"), {x}, {type}), "outside its buffer");
  bad.cpu_kernel = [](const KernelContext &) { return Status::ok(); }; // writes nothing
  TestTensor one = tensor(DType::kF32, {1}, {1});
  TensorType one_type = one.type;
  EXPECT_NONFATAL_FAILURE(
      expect_close(run_kernel(bad, make_node("Relu"), {one}, {one_type}).outputs[0], {1}, 0, 0),
      "expected 1");
}

} // namespace
} // namespace strata::ops

namespace strata {
namespace {

TEST(ElementwiseTest, WhereBroadcastsAllThreeInputs) {
  const ops::OpRegistry &registry = ops::OpRegistry::global();
  GraphBuilder b("where", registry);
  HostTensor cond = HostTensor::zeros({DType::kBool, {3, 1}});
  cond.as<uint8_t>()[0] = 1;
  cond.as<uint8_t>()[2] = 1;
  HostTensor x = HostTensor::zeros({DType::kI64, {1, 4}});
  for (int i = 0; i < 4; ++i)
    x.as<int64_t>()[i] = 10 + i;
  HostTensor z = HostTensor::zeros({DType::kI64, {}});
  z.as<int64_t>()[0] = -1;
  TensorId c = b.constant("c", DType::kBool, {3, 1}, cond.blob);
  TensorId xi = b.constant("x", DType::kI64, {1, 4}, x.blob);
  TensorId zi = b.constant("z", DType::kI64, {}, z.blob);
  TensorId y = b.op1("Where", {c, xi, zi});
  ASSERT_TRUE(b.status().is_ok()) << b.status().message();
  EXPECT_EQ(b.type(y).to_string(), "i64[3, 4]");
  const Node &node = b.graph().node(0);
  const ops::OpDef *def = registry.find("Where");
  std::vector<ops::ConstTensorView> in = {
      {cond.data(), &b.type(c)}, {x.data(), &b.type(xi)}, {z.data(), &b.type(zi)}};
  HostTensor out = HostTensor::zeros(b.type(y));
  std::vector<ops::TensorView> outs = {{out.data(), &b.type(y)}};
  ASSERT_TRUE(def->cpu_kernel({node, *def, in, outs}).is_ok());
  const int64_t expected[12] = {10, 11, 12, 13, -1, -1, -1, -1, 10, 11, 12, 13};
  for (int i = 0; i < 12; ++i)
    EXPECT_EQ(out.as<int64_t>()[i], expected[i]) << i;
  // A condition that is not bool is refused.
  GraphBuilder bad("bad", registry);
  TensorId f = bad.constant("f", DType::kI64, {1, 4}, x.blob);
  bad.op1("Where", {f, f, f});
  EXPECT_NE(bad.status().message().find("must be bool"), std::string::npos)
      << bad.status().message();
}

} // namespace
} // namespace strata
