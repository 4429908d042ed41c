// Gradient rules of the elementwise family, checked against central finite
// differences, plus direct tests of the backward helper ops (ReluGrad, TanhGrad,
// SigmoidGrad, GeluGrad, ClipGrad) and of Dropout's training form.
#include <cmath>
#include <limits>
#include <set>

#include <gtest/gtest.h>

#include "tests/ops/op_test_util.h"
#include "tests/passes/grad_check.h"

namespace strata {
namespace {

using strata::testing::check_gradients;
using strata::testing::GradCheckOptions;
using namespace strata::ops::testing;

HostTensor normal(Shape shape, uint32_t seed, float scale = 1.0f) {
  return strata::testing::random_tensor({DType::kF32, std::move(shape)}, seed, scale);
}

// Values whose magnitudes lie in [lo, hi] with random signs (or all positive):
// keeps inputs away from kinks and domain edges.
HostTensor away_from_zero(Shape shape, uint32_t seed, float lo, float hi, bool positive = false) {
  HostTensor t = HostTensor::zeros({DType::kF32, std::move(shape)});
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> magnitude(lo, hi);
  for (int64_t i = 0; i < t.type.num_elements(); ++i)
    t.as<float>()[i] = magnitude(rng) * (positive || (rng() & 1) ? 1.0f : -1.0f);
  return t;
}

TensorId unary(GraphBuilder &b, TensorId x, std::string_view op,
               std::vector<Attribute> attrs = {}) {
  return b.op1(op, {x}, std::move(attrs));
}

TEST(ElementwiseGradTest, BinaryArithmeticWithBroadcasting) {
  for (const char *op : {"Add", "Sub", "Mul"}) {
    SCOPED_TRACE(op);
    check_gradients(
        [op](GraphBuilder &b, llvm::ArrayRef<TensorId> x) {
          return b.op1(op, {x[0], x[1]});
        },
        {normal({2, 3, 4}, 1), normal({3, 1}, 2)});
    check_gradients(
        [op](GraphBuilder &b, llvm::ArrayRef<TensorId> x) {
          return b.op1(op, {x[0], x[1]});
        },
        {normal({}, 3), normal({2, 5}, 4)});
  }
}

TEST(ElementwiseGradTest, Div) {
  check_gradients(
      [](GraphBuilder &b, llvm::ArrayRef<TensorId> x) {
        return b.op1("Div", {x[0], x[1]});
      },
      {normal({2, 3}, 5), away_from_zero({3}, 6, 0.5f, 2.0f)});
}

TEST(ElementwiseGradTest, PowBothInputs) {
  check_gradients(
      [](GraphBuilder &b, llvm::ArrayRef<TensorId> x) {
        return b.op1("Pow", {x[0], x[1]});
      },
      {away_from_zero({2, 3}, 7, 0.5f, 2.0f, true), normal({3}, 8)}, {.tolerance = 2e-2});
}

TEST(ElementwiseGradTest, SmoothUnaryOps) {
  struct Case {
    const char *op;
    HostTensor input;
    double tolerance;
  };
  std::vector<Case> cases = {
      {"Neg", normal({3, 4}, 10), 1e-2},
      {"Identity", normal({3, 4}, 11), 1e-2},
      {"Sqrt", away_from_zero({3, 4}, 12, 0.5f, 3.0f, true), 1e-2},
      {"Exp", normal({3, 4}, 13), 1e-2},
      {"Log", away_from_zero({3, 4}, 14, 0.5f, 3.0f, true), 1e-2},
      {"Erf", normal({3, 4}, 15), 1e-2},
      {"Tanh", normal({3, 4}, 16), 1e-2},
      {"Sigmoid", normal({3, 4}, 17), 1e-2},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.op);
    check_gradients(
        [&](GraphBuilder &b, llvm::ArrayRef<TensorId> x) { return unary(b, x[0], c.op); },
        {c.input}, {.tolerance = c.tolerance});
  }
}

TEST(ElementwiseGradTest, ReluAwayFromZero) {
  check_gradients(
      [](GraphBuilder &b, llvm::ArrayRef<TensorId> x) { return unary(b, x[0], "Relu"); },
      {away_from_zero({4, 5}, 20, 0.1f, 2.0f)});
}

TEST(ElementwiseGradTest, GeluBothForms) {
  for (const char *form : {"none", "tanh"}) {
    SCOPED_TRACE(form);
    check_gradients(
        [form](GraphBuilder &b, llvm::ArrayRef<TensorId> x) {
          return unary(b, x[0], "Gelu", {{"approximate", std::string(form)}});
        },
        {normal({4, 5}, 21, 2.0f)});
  }
}

TEST(ElementwiseGradTest, ClipAwayFromBounds) {
  // Bounds at +-1; values in [0.1, 0.8] or [1.2, 2] in magnitude.
  HostTensor x = away_from_zero({4, 5}, 22, 0.1f, 0.8f);
  for (int64_t i = 0; i < 20; i += 3)
    x.as<float>()[i] += x.as<float>()[i] > 0 ? 1.1f : -1.1f;
  check_gradients(
      [](GraphBuilder &b, llvm::ArrayRef<TensorId> in) {
        return unary(b, in[0], "Clip", {{"min", -1.0}, {"max", 1.0}});
      },
      {x});
}

TEST(ElementwiseGradTest, CastBetweenFloatsAndThroughIntegers) {
  // f32 -> f32 passes the gradient; through an integer nothing flows (the values
  // sit mid-way between integers so the finite difference sees a flat function).
  check_gradients(
      [](GraphBuilder &b, llvm::ArrayRef<TensorId> x) {
        return unary(b, x[0], "Cast", {{"to", std::string("f32")}});
      },
      {normal({3, 2}, 23)});
  HostTensor halves = HostTensor::zeros({DType::kF32, {6}});
  for (int i = 0; i < 6; ++i)
    halves.as<float>()[i] = static_cast<float>(i) - 2.5f;
  check_gradients(
      [](GraphBuilder &b, llvm::ArrayRef<TensorId> x) {
        TensorId i = unary(b, x[0], "Cast", {{"to", std::string("i32")}});
        TensorId back = unary(b, i, "Cast", {{"to", std::string("f32")}});
        return b.op1("Add", {back, b.op1("Mul", {x[0], x[0]})});
      },
      {halves});
}

TEST(ElementwiseGradTest, InferenceDropoutPassesTheGradient) {
  check_gradients(
      [](GraphBuilder &b, llvm::ArrayRef<TensorId> x) { return unary(b, x[0], "Dropout"); },
      {normal({3, 3}, 24)});
}

HostTensor step_tensor(int64_t step) {
  HostTensor t = HostTensor::zeros({DType::kI64, {}});
  *t.as<int64_t>() = step;
  return t;
}

TEST(ElementwiseGradTest, TrainingDropoutGradientAppliesTheSameMask) {
  check_gradients(
      [](GraphBuilder &b, llvm::ArrayRef<TensorId> x) {
        return b.op1("Dropout", {x[0], x[1]},
                     {{"ratio", 0.4}, {"training", int64_t{1}}, {"seed", int64_t{7}}});
      },
      {normal({6, 7}, 25), step_tensor(3)});
}

std::vector<Attribute> training(double ratio, int64_t seed) {
  return {float_attr("ratio", ratio), int_attr("training", 1), int_attr("seed", seed)};
}

TEST(DropoutTest, MaskIsDeterministicAndChangesWithStepAndSeed) {
  TestTensor x = tensor(DType::kF32, {1000}, std::vector<double>(1000, 1.0));
  TestTensor step1 = typed_tensor<int64_t>(DType::kI64, {}, {1});
  TestTensor step2 = typed_tensor<int64_t>(DType::kI64, {}, {2});
  TestTensor a = run_one("Dropout", {x, step1}, training(0.5, 3));
  TestTensor again = run_one("Dropout", {x, step1}, training(0.5, 3));
  TestTensor other_step = run_one("Dropout", {x, step2}, training(0.5, 3));
  TestTensor other_seed = run_one("Dropout", {x, step1}, training(0.5, 4));
  TestTensor no_step = run_one("Dropout", {x}, training(0.5, 3));
  expect_same_tensor(again, a, "same seed and step");
  EXPECT_FALSE(other_step.bytes == a.bytes);
  EXPECT_FALSE(other_seed.bytes == a.bytes);
  EXPECT_FALSE(no_step.bytes == a.bytes); // no step input means step 0
  // An i32 step reads the same as an i64 one.
  TestTensor step1_i32 = typed_tensor<int32_t>(DType::kI32, {}, {1});
  expect_same_tensor(run_one("Dropout", {x, step1_i32}, training(0.5, 3)), a, "i32 step");
}

TEST(DropoutTest, KeepsAboutOneMinusRatioAndScalesKeptValues) {
  std::mt19937 rng(5);
  const int64_t n = 200000;
  TestTensor x = random_tensor(DType::kF32, {n}, rng, 0.5, 2.0);
  for (double ratio : {0.0, 0.1, 0.5, 0.9}) {
    SCOPED_TRACE(ratio);
    TestTensor y = run_one("Dropout", {x}, training(ratio, 11));
    const float scale = static_cast<float>(1.0 / (1.0 - ratio));
    int64_t kept = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float v = y.as<float>()[i];
      if (v == 0.0f) continue;
      ++kept;
      ASSERT_EQ(v, x.as<float>()[i] * scale) << "element " << i;
    }
    // Binomial standard deviation is at most sqrt(n / 4) ~ 224 elements.
    EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - ratio, 0.005);
  }
}

TEST(DropoutTest, InferenceIsIdentityEvenWithAStep) {
  std::mt19937 rng(6);
  TestTensor x = random_tensor(DType::kF32, {64}, rng);
  TestTensor step = typed_tensor<int64_t>(DType::kI64, {}, {9});
  expect_same_tensor(run_one("Dropout", {x, step}, {float_attr("ratio", 0.5)}), x);
}

// Direct tests of the backward helpers against references in double.
void check_helper(std::string_view op, std::vector<Attribute> attrs, const TestTensor &dy,
                  const TestTensor &v, double (*reference)(double dy, double v)) {
  std::vector<double> expected;
  for (int64_t i = 0; i < dy.num_elements(); ++i)
    expected.push_back(reference(dy.get(i), v.get(i)));
  expect_close(run_one(op, {dy, v}, std::move(attrs)), expected, 1e-6, 1e-5, op);
}

double gelu_exact(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST(BackwardHelperTest, MatchReferences) {
  std::mt19937 rng(7);
  TestTensor dy = random_tensor(DType::kF32, {5, 7}, rng, -2, 2);
  TestTensor x = random_tensor(DType::kF32, {5, 7}, rng, -3, 3);
  TestTensor y01 = random_tensor(DType::kF32, {5, 7}, rng, 0, 1);
  TestTensor ym = random_tensor(DType::kF32, {5, 7}, rng, -1, 1);
  check_helper("ReluGrad", {}, dy, x, [](double g, double v) { return v > 0 ? g : 0.0; });
  check_helper("TanhGrad", {}, dy, ym, [](double g, double v) { return g * (1 - v * v); });
  check_helper("SigmoidGrad", {}, dy, y01, [](double g, double v) { return g * v * (1 - v); });
  check_helper("ClipGrad", {float_attr("min", -1), float_attr("max", 2)}, dy, x,
               [](double g, double v) { return v >= -1 && v <= 2 ? g : 0.0; });
  // Gelu derivatives: central differences of the forward formula in double.
  check_helper("GeluGrad", {}, dy, x, [](double g, double v) {
    return g * (gelu_exact(v + 1e-6) - gelu_exact(v - 1e-6)) / 2e-6;
  });
  check_helper("GeluGrad", {string_attr("approximate", "tanh")}, dy, x, [](double g, double v) {
    return g * (gelu_tanh(v + 1e-6) - gelu_tanh(v - 1e-6)) / 2e-6;
  });
  // ReluGrad at exactly 0 gives 0.
  TestTensor zero = zeros(DType::kF32, {1});
  TestTensor one = tensor(DType::kF32, {1}, {1.0});
  expect_close(run_one("ReluGrad", {one, zero}), {0.0}, 0, 0);
}

// GeluGrad over a dense sweep of [-10, 10] (step 1e-4) plus extremes, against the
// closed-form derivatives in double: |dx - ref| <= 1e-6 + 1e-6 |ref|. At +-inf the
// derivative is its limit (1 / 0); NaN gives NaN.
TEST(BackwardHelperTest, GeluGradDenseSweep) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> xs;
  for (int i = -100000; i <= 100000; ++i)
    xs.push_back(static_cast<float>(i * 1e-4));
  for (double v : {1e-40, -1e-40, 20.0, -20.0, 1e30, -1e30, 3.4e38, -3.4e38, inf, -inf, nan})
    xs.push_back(v);
  const auto n = static_cast<int64_t>(xs.size());
  TestTensor x = tensor(DType::kF32, {n}, xs);
  TestTensor dy = tensor(DType::kF32, {n}, std::vector<double>(xs.size(), 1.0));
  const auto limit = [](double v, double d) {
    return std::isnan(v) ? v : std::fabs(v) > 20 ? (v > 0 ? 1.0 : 0.0) : d;
  };
  std::vector<double> exact, approx;
  for (double v : x.values()) {
    const double k = std::sqrt(2.0 / M_PI), a = 0.044715;
    const double t = std::tanh(k * (v + a * v * v * v));
    exact.push_back(limit(v, 0.5 * std::erfc(-v / std::sqrt(2.0)) +
                                 v * std::exp(-0.5 * v * v) / std::sqrt(2.0 * M_PI)));
    approx.push_back(limit(v, 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k * (1 + 3 * a * v * v)));
  }
  expect_close(run_one("GeluGrad", {dy, x}), exact, 1e-6, 1e-6, "GeluGrad none");
  expect_close(run_one("GeluGrad", {dy, x}, {string_attr("approximate", "tanh")}), approx, 1e-6,
               1e-6, "GeluGrad tanh");
}

TEST(BackwardHelperTest, RejectMismatchedInputs) {
  TestTensor a = zeros(DType::kF32, {2, 3});
  TestTensor b = zeros(DType::kF32, {3});
  expect_error(run_op("ReluGrad", {a, b}).status, {"ReluGrad", "same type"});
  expect_error(run_op("TanhGrad", {zeros(DType::kI32, {2}), zeros(DType::kI32, {2})}).status,
               {"TanhGrad", "floating"});
  expect_error(run_op("GeluGrad", {a, a}, {string_attr("approximate", "fast")}).status,
               {"GeluGrad", "approximate"});
}

} // namespace
} // namespace strata

namespace strata {
namespace {

// Where: the gradient goes to X where the condition holds, to Z elsewhere, each
// summed back over its broadcast dims.
TEST(ElementwiseGradTest, WhereRoutesByTheCondition) {
  HostTensor cond = HostTensor::zeros({DType::kBool, {2, 1, 4}});
  for (int i = 0; i < 8; ++i)
    cond.as<uint8_t>()[i] = (i * 5) % 3 == 0;
  check_gradients(
      [](GraphBuilder &b, llvm::ArrayRef<TensorId> x) {
        return b.op1("Where", {x[0], x[1], x[2]});
      },
      {cond, normal({2, 3, 4}, 7), normal({4}, 8)});
}

} // namespace
} // namespace strata
