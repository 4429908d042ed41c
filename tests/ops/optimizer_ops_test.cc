// Tests of the optimizer ops (ops_optimizer.cc): each kernel runs several steps,
// feeding its outputs back as the next step's inputs, against a double-precision
// reference that spells out PyTorch's update formulas.
#include <cmath>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "tests/ops/op_test_util.h"

namespace strata::ops::testing {
namespace {

constexpr double kTol = 2e-6; // f32 kernel against a double reference

TestTensor f32(Shape shape, const std::vector<double> &values) {
  return tensor(DType::kF32, std::move(shape), values);
}
TestTensor lr_tensor(double lr) { return f32({}, {lr}); }
TestTensor step_tensor(int64_t step) { return typed_tensor<int64_t>(DType::kI64, {}, {step}); }

const std::vector<double> kParam = {0.5, -1.25, 2.0, 0.0, -0.75, 1.5};
// A different gradient for each step.
std::vector<double> gradient_at(int step) {
  std::vector<double> g(kParam.size());
  for (size_t i = 0; i < g.size(); ++i)
    g[i] = std::sin(0.7 * static_cast<double>(i) + 1.3 * step) * (1.0 + 0.1 * step);
  return g;
}

// torch.optim.SGD, one step, in double.
struct SgdRef {
  double lr, momentum = 0, dampening = 0, wd = 0;
  bool nesterov = false;
  std::vector<double> param = {}, buf = {};
  void step(const std::vector<double> &grad, bool first) {
    if (buf.empty()) buf.assign(param.size(), 0.0);
    for (size_t i = 0; i < param.size(); ++i) {
      double g = grad[i] + wd * param[i];
      if (momentum != 0) {
        buf[i] = first ? g : momentum * buf[i] + (1 - dampening) * g;
        g = nesterov ? g + momentum * buf[i] : buf[i];
      }
      param[i] -= lr * g;
    }
  }
};

// torch.optim.Adam / AdamW, one step, in double; `t` counts from 1.
struct AdamRef {
  double lr, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, wd = 0;
  bool decoupled = false;
  std::vector<double> param = {}, m = {}, v = {};
  void step(const std::vector<double> &grad, int64_t t) {
    if (m.empty()) m.assign(param.size(), 0.0);
    if (v.empty()) v.assign(param.size(), 0.0);
    const double bc1 = 1 - std::pow(beta1, static_cast<double>(t));
    const double bc2 = 1 - std::pow(beta2, static_cast<double>(t));
    for (size_t i = 0; i < param.size(); ++i) {
      double g = grad[i];
      if (decoupled)
        param[i] *= 1 - lr * wd;
      else
        g += wd * param[i];
      m[i] = beta1 * m[i] + (1 - beta1) * g;
      v[i] = beta2 * v[i] + (1 - beta2) * g * g;
      const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + eps;
      param[i] -= lr / bc1 * m[i] / denom;
    }
  }
};

// Runs `steps` SGD steps through the kernel (feeding outputs back) and the
// reference, comparing after each.
void check_sgd(SgdRef ref, int steps, bool with_step_input) {
  std::vector<Attribute> attrs = {
      float_attr("momentum", ref.momentum), float_attr("dampening", ref.dampening),
      int_attr("nesterov", ref.nesterov ? 1 : 0), float_attr("weight_decay", ref.wd)};
  const Shape shape = {2, 3};
  TestTensor param = f32(shape, ref.param);
  TestTensor buf = zeros(DType::kF32, shape);
  for (int s = 0; s < steps; ++s) {
    const std::vector<double> grad = gradient_at(s);
    std::vector<TestTensor> inputs = {param, f32(shape, grad), lr_tensor(ref.lr)};
    if (ref.momentum != 0) inputs.push_back(buf);
    if (with_step_input) inputs.push_back(step_tensor(s));
    RunResult result = run_op("SgdUpdate", inputs, attrs);
    ASSERT_TRUE(result.status.is_ok()) << result.status.to_string();
    ASSERT_EQ(result.outputs.size(), ref.momentum != 0 ? 2u : 1u);
    ref.step(grad, with_step_input && s == 0);
    const std::string what = str_cat("step ", s);
    expect_close(result.outputs[0], ref.param, kTol, kTol, what + " param");
    param = result.outputs[0];
    if (ref.momentum != 0) {
      expect_close(result.outputs[1], ref.buf, kTol, kTol, what + " buffer");
      buf = result.outputs[1];
    }
  }
}

TEST(SgdUpdateTest, PlainWithWeightDecay) {
  check_sgd(SgdRef{.lr = 0.1, .wd = 0.01, .param = kParam}, 4, false);
  check_sgd(SgdRef{.lr = 0.05, .param = kParam}, 3, false);
}

TEST(SgdUpdateTest, MomentumFirstStepCopiesTheGradient) {
  // With dampening, PyTorch's first buffer is the gradient itself, not
  // (1 - dampening) * gradient: the step input tells the kernel it is step 0.
  SgdRef ref{.lr = 0.1, .momentum = 0.9, .dampening = 0.5, .wd = 0.1, .param = kParam};
  check_sgd(ref, 5, true);

  const Shape shape = {2, 3};
  RunResult first = run_op("SgdUpdate",
                           {f32(shape, kParam), f32(shape, gradient_at(0)), lr_tensor(0.1),
                            zeros(DType::kF32, shape), step_tensor(0)},
                           {float_attr("momentum", 0.9), float_attr("dampening", 0.5)});
  ASSERT_TRUE(first.status.is_ok()) << first.status.to_string();
  expect_close(first.outputs[1], f32(shape, gradient_at(0)).values(), 0, 0, "buffer after step 0");
  // Without the step input the zero buffer is blended: (1 - dampening) * g.
  RunResult blended = run_op(
      "SgdUpdate",
      {f32(shape, kParam), f32(shape, gradient_at(0)), lr_tensor(0.1), zeros(DType::kF32, shape)},
      {float_attr("momentum", 0.9), float_attr("dampening", 0.5)});
  ASSERT_TRUE(blended.status.is_ok()) << blended.status.to_string();
  std::vector<double> half = gradient_at(0);
  for (double &x : half)
    x *= 0.5;
  expect_close(blended.outputs[1], half, 1e-7, 1e-7, "blended buffer");
}

TEST(SgdUpdateTest, MomentumWithoutDampening) {
  check_sgd(SgdRef{.lr = 0.1, .momentum = 0.9, .param = kParam}, 5, true);
  check_sgd(SgdRef{.lr = 0.1, .momentum = 0.9, .param = kParam}, 5, false);
}

TEST(SgdUpdateTest, NesterovWithWeightDecay) {
  check_sgd(SgdRef{.lr = 0.05, .momentum = 0.8, .wd = 0.05, .nesterov = true, .param = kParam}, 6,
            true);
}

TEST(SgdUpdateTest, RejectsInconsistentInputs) {
  const TensorType p{DType::kF32, {2, 3}};
  const TensorType lr{DType::kF32, {}};
  const TensorType step{DType::kI64, {}};
  expect_error(infer("SgdUpdate", {p, p, lr}, {float_attr("momentum", 0.9)}).status(),
               {"SgdUpdate", "'momentum'", "buffer"});
  expect_error(infer("SgdUpdate", {p, p, lr, p}).status(), {"SgdUpdate", "buffer", "0"});
  expect_error(infer("SgdUpdate", {p, p, lr}, {int_attr("nesterov", 1)}).status(),
               {"SgdUpdate", "nesterov"});
  expect_error(
      infer("SgdUpdate", {p, p, lr, p},
            {float_attr("momentum", 0.9), float_attr("dampening", 0.1), int_attr("nesterov", 1)})
          .status(),
      {"nesterov", "dampening"});
  expect_error(infer("SgdUpdate", {p, TensorType{DType::kF32, {3, 2}}, lr}).status(),
               {"SgdUpdate", "grad", "[3, 2]"});
  expect_error(infer("SgdUpdate", {p, p, TensorType{DType::kF32, {2}}}).status(),
               {"SgdUpdate", "lr", "scalar"});
  expect_error(infer("SgdUpdate", {p, p, lr, p, lr}, {float_attr("momentum", 0.9)}).status(),
               {"SgdUpdate", "step", "i64"});
  auto ok = infer("SgdUpdate", {p, p, lr, p, step}, {float_attr("momentum", 0.9)});
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(ok->size(), 2u);
}

// Runs Adam steps first_step .. first_step + steps - 1 from the given moments.
void check_adam(AdamRef ref, int64_t first_step, int steps) {
  std::vector<Attribute> attrs = {float_attr("beta1", ref.beta1), float_attr("beta2", ref.beta2),
                                  float_attr("epsilon", ref.eps),
                                  float_attr("weight_decay", ref.wd),
                                  int_attr("decoupled", ref.decoupled ? 1 : 0)};
  const Shape shape = {6};
  if (ref.m.empty()) ref.m.assign(ref.param.size(), 0.0);
  if (ref.v.empty()) ref.v.assign(ref.param.size(), 0.0);
  TestTensor param = f32(shape, ref.param), m = f32(shape, ref.m), v = f32(shape, ref.v);
  for (int s = 0; s < steps; ++s) {
    const int64_t step = first_step + s;
    const std::vector<double> grad = gradient_at(s);
    RunResult result = run_op(
        "AdamUpdate", {param, f32(shape, grad), m, v, lr_tensor(ref.lr), step_tensor(step)}, attrs);
    ASSERT_TRUE(result.status.is_ok()) << result.status.to_string();
    ASSERT_EQ(result.outputs.size(), 3u);
    ref.step(grad, step + 1);
    const std::string what = str_cat("step ", step);
    expect_close(result.outputs[0], ref.param, 1e-5, 1e-5, what + " param");
    expect_close(result.outputs[1], ref.m, kTol, kTol, what + " m");
    expect_close(result.outputs[2], ref.v, kTol, kTol, what + " v");
    param = result.outputs[0];
    m = result.outputs[1];
    v = result.outputs[2];
  }
}

TEST(AdamUpdateTest, BiasCorrectionAtStepZero) {
  // At step 0 the corrected update is lr * g / (|g| + eps'): about lr * sign(g).
  const Shape shape = {6};
  const std::vector<double> grad = gradient_at(0);
  RunResult result =
      run_op("AdamUpdate", {f32(shape, kParam), f32(shape, grad), zeros(DType::kF32, shape),
                            zeros(DType::kF32, shape), lr_tensor(0.01), step_tensor(0)});
  ASSERT_TRUE(result.status.is_ok()) << result.status.to_string();
  std::vector<double> expected = kParam;
  for (size_t i = 0; i < expected.size(); ++i)
    expected[i] -= 0.01 * grad[i] / (std::fabs(grad[i]) + 1e-8);
  expect_close(result.outputs[0], expected, 1e-6, 1e-6, "param");
  check_adam(AdamRef{.lr = 0.01, .param = kParam}, 0, 5);
}

TEST(AdamUpdateTest, BiasCorrectionAtStepTen) {
  // Moments as if ten steps had been taken.
  AdamRef ref{.lr = 0.003, .beta1 = 0.8, .beta2 = 0.99, .param = kParam};
  ref.m = {0.1, -0.2, 0.3, 0.05, -0.01, 0.2};
  ref.v = {0.02, 0.04, 0.09, 0.001, 0.0004, 0.03};
  check_adam(ref, 10, 3);
}

TEST(AdamUpdateTest, CoupledWeightDecayEntersTheMoments) {
  check_adam(AdamRef{.lr = 0.01, .wd = 0.1, .param = kParam}, 0, 5);
  // m after step 0 is (1 - beta1) * (g + wd * param).
  const Shape shape = {6};
  RunResult result =
      run_op("AdamUpdate",
             {f32(shape, kParam), f32(shape, gradient_at(0)), zeros(DType::kF32, shape),
              zeros(DType::kF32, shape), lr_tensor(0.01), step_tensor(0)},
             {float_attr("weight_decay", 0.1)});
  ASSERT_TRUE(result.status.is_ok());
  std::vector<double> m(6);
  for (size_t i = 0; i < 6; ++i)
    m[i] = 0.1 * (gradient_at(0)[i] + 0.1 * kParam[i]);
  expect_close(result.outputs[1], m, 1e-7, 1e-6, "m");
}

TEST(AdamUpdateTest, AdamWDecouplesWeightDecay) {
  check_adam(AdamRef{.lr = 0.01, .wd = 0.1, .decoupled = true, .param = kParam}, 0, 5);
  // The moments see only the gradient; the parameter shrinks by 1 - lr * wd
  // before the Adam step. A zero gradient leaves only the decay.
  const Shape shape = {6};
  RunResult result =
      run_op("AdamUpdate",
             {f32(shape, kParam), zeros(DType::kF32, shape), zeros(DType::kF32, shape),
              zeros(DType::kF32, shape), lr_tensor(0.5), step_tensor(3)},
             {float_attr("weight_decay", 0.2), int_attr("decoupled", 1)});
  ASSERT_TRUE(result.status.is_ok());
  std::vector<double> decayed = kParam;
  for (double &x : decayed)
    x *= 1 - 0.5 * 0.2;
  expect_close(result.outputs[0], decayed, 1e-7, 1e-6, "param");
  expect_close(result.outputs[1], std::vector<double>(6, 0.0), 0, 0, "m");
}

TEST(AdamUpdateTest, RejectsBadInputs) {
  const TensorType p{DType::kF32, {4}};
  const TensorType lr{DType::kF32, {}};
  const TensorType step{DType::kI64, {}};
  expect_error(infer("AdamUpdate", {p, p, p, p, lr, lr}).status(), {"AdamUpdate", "step", "i64"});
  expect_error(infer("AdamUpdate", {p, p, TensorType{DType::kF32, {2, 2}}, p, lr, step}).status(),
               {"AdamUpdate", "m"});
  expect_error(infer("AdamUpdate", {p, p, p, p, lr, step}, {float_attr("beta2", 1.0)}).status(),
               {"AdamUpdate", "'beta2'"});
  expect_error(infer("AdamUpdate", {p, p, p, p, lr}).status(), {"AdamUpdate", "6", "5"});
}

// Hyperparameters outside their range are refused when the node is checked,
// naming the op, the attribute and the value: an epsilon of 0 divides by zero
// where a moment is 0, NaN and infinite rates poison every weight, and a flag
// other than 0 or 1 would be read as 1 by one backend and refused by another.
TEST(OptimizerOpsTest, RefuseHyperparametersOutsideTheirRange) {
  const TensorType p{DType::kF32, {4}};
  const TensorType lr{DType::kF32, {}};
  const TensorType step{DType::kI64, {}};
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  const std::vector<TensorType> adam = {p, p, p, p, lr, step};
  for (double eps : {0.0, -1e-8, nan, inf})
    expect_error(
        infer("AdamUpdate", adam, {float_attr("epsilon", eps)}).status(),
        {"AdamUpdate: attribute 'epsilon' = " + str_cat(eps) + " must be a finite number > 0"});
  expect_error(infer("AdamUpdate", adam, {float_attr("weight_decay", -0.1)}).status(),
               {"AdamUpdate: attribute 'weight_decay' = -0.1 must be a finite number >= 0"});
  expect_error(infer("AdamUpdate", adam, {float_attr("weight_decay", nan)}).status(),
               {"AdamUpdate: attribute 'weight_decay' = nan"});
  expect_error(infer("AdamUpdate", adam, {int_attr("decoupled", 2)}).status(),
               {"AdamUpdate: attribute 'decoupled' = 2 must be 0 or 1"});

  const std::vector<TensorType> sgd = {p, p, lr, p};
  expect_error(infer("SgdUpdate", sgd, {float_attr("momentum", nan)}).status(),
               {"SgdUpdate: attribute 'momentum' = nan must be a finite number >= 0"});
  expect_error(infer("SgdUpdate", sgd, {float_attr("momentum", inf)}).status(),
               {"SgdUpdate: attribute 'momentum' = inf"});
  expect_error(infer("SgdUpdate", {p, p, lr}, {float_attr("weight_decay", -1)}).status(),
               {"SgdUpdate: attribute 'weight_decay' = -1 must be a finite number >= 0"});
  expect_error(
      infer("SgdUpdate", sgd, {float_attr("momentum", 0.9), float_attr("dampening", nan)}).status(),
      {"SgdUpdate: attribute 'dampening' = nan is not finite"});
  expect_error(infer("SgdUpdate", {p, p, lr}, {int_attr("nesterov", -1)}).status(),
               {"SgdUpdate: attribute 'nesterov' = -1 must be 0 or 1"});

  for (double base : {0.0, -1.0, nan, inf})
    expect_error(
        infer("LearningRate", {step}, {float_attr("base_lr", base)}).status(),
        {"LearningRate: attribute 'base_lr' = " + str_cat(base) + " must be a finite number > 0"});
  expect_error(infer("LearningRate", {step},
                     {float_attr("base_lr", 0.1), string_attr("schedule", "cosine"),
                      int_attr("total_steps", 10), float_attr("min_lr", 0.5)})
                   .status(),
               {"LearningRate: attribute 'min_lr' = 0.5 is more than 'base_lr' = 0.1"});
  expect_error(
      infer("LearningRate", {step}, {float_attr("base_lr", 0.1), float_attr("min_lr", -0.01)})
          .status(),
      {"LearningRate: attribute 'min_lr' = -0.01 must be a finite number >= 0"});
  expect_error(
      infer("LearningRate", {step}, {float_attr("base_lr", 0.1), int_attr("total_steps", -5)})
          .status(),
      {"LearningRate: attribute 'total_steps' = -5 is negative"});
  // The edges are in range.
  EXPECT_TRUE(infer("LearningRate", {step},
                    {float_attr("base_lr", 0.1), string_attr("schedule", "cosine"),
                     int_attr("total_steps", 10), float_attr("min_lr", 0.1)})
                  .is_ok());
  EXPECT_TRUE(
      infer("AdamUpdate", adam, {float_attr("beta1", 0.0), float_attr("epsilon", 1e-30)}).is_ok());
}

double lr_at(int64_t step, std::vector<Attribute> attrs) {
  TestTensor out = run_one("LearningRate", {step_tensor(step)}, std::move(attrs));
  EXPECT_EQ(out.type.to_string(), (TensorType{DType::kF32, {}}).to_string());
  return out.num_elements() == 1 ? out.get(0) : NAN;
}

TEST(LearningRateTest, ConstantWithWarmup) {
  std::vector<Attribute> attrs = {float_attr("base_lr", 0.1), int_attr("warmup_steps", 4)};
  EXPECT_FLOAT_EQ(lr_at(0, attrs), 0.025f);
  EXPECT_FLOAT_EQ(lr_at(1, attrs), 0.05f);
  EXPECT_FLOAT_EQ(lr_at(3, attrs), 0.1f);
  EXPECT_FLOAT_EQ(lr_at(4, attrs), 0.1f);
  EXPECT_FLOAT_EQ(lr_at(1000, attrs), 0.1f);
  EXPECT_FLOAT_EQ(lr_at(7, {float_attr("base_lr", 0.3)}), 0.3f);
}

TEST(LearningRateTest, CosineWithWarmup) {
  std::vector<Attribute> attrs = {float_attr("base_lr", 1.0), string_attr("schedule", "cosine"),
                                  int_attr("warmup_steps", 10), int_attr("total_steps", 110),
                                  float_attr("min_lr", 0.1)};
  EXPECT_FLOAT_EQ(lr_at(0, attrs), 0.1f);
  EXPECT_FLOAT_EQ(lr_at(9, attrs), 1.0f);
  EXPECT_FLOAT_EQ(lr_at(10, attrs), 1.0f);                                                  // start
  EXPECT_FLOAT_EQ(lr_at(35, attrs), static_cast<float>(0.1 + 0.45 * (1 + std::sqrt(0.5)))); // 1/4
  EXPECT_FLOAT_EQ(lr_at(60, attrs), 0.55f); // midpoint
  EXPECT_FLOAT_EQ(lr_at(110, attrs), 0.1f); // end
  EXPECT_FLOAT_EQ(lr_at(500, attrs), 0.1f); // past the end
  // Without warm-up, cosine starts at base_lr.
  EXPECT_FLOAT_EQ(lr_at(0, {float_attr("base_lr", 2.0), string_attr("schedule", "cosine"),
                            int_attr("total_steps", 4)}),
                  2.0f);
}

TEST(LearningRateTest, RejectsBadAttributes) {
  const TensorType step{DType::kI64, {}};
  expect_error(infer("LearningRate", {step}).status(), {"LearningRate", "'base_lr'"});
  expect_error(
      infer("LearningRate", {step}, {float_attr("base_lr", 1), string_attr("schedule", "linear")})
          .status(),
      {"LearningRate", "'schedule'", "linear"});
  expect_error(infer("LearningRate", {step},
                     {float_attr("base_lr", 1), string_attr("schedule", "cosine"),
                      int_attr("warmup_steps", 5), int_attr("total_steps", 5)})
                   .status(),
               {"LearningRate", "total_steps", "warmup_steps"});
  expect_error(
      infer("LearningRate", {TensorType{DType::kF32, {}}}, {float_attr("base_lr", 1)}).status(),
      {"LearningRate", "step", "i64"});
}

TEST(GlobalNormScaleTest, BelowAndAboveTheClip) {
  // Global norm of [3, 4] and [12] is 13.
  TestTensor a = f32({2}, {3, 4});
  TestTensor b = f32({1, 1}, {12});
  TestTensor scale = run_one("GlobalNormScale", {a, b}, {float_attr("max_norm", 1.0)});
  EXPECT_EQ(scale.type.to_string(), (TensorType{DType::kF32, {}}).to_string());
  expect_close(scale, {1.0 / (13.0 + 1e-6)}, 0, 1e-7, "above");
  scale = run_one("GlobalNormScale", {a, b}, {float_attr("max_norm", 6.5)});
  expect_close(scale, {6.5 / (13.0 + 1e-6)}, 0, 1e-7, "half");
  // Below the clip the scale is exactly 1.
  scale = run_one("GlobalNormScale", {a, b}, {float_attr("max_norm", 100.0)});
  expect_close(scale, {1.0}, 0, 0, "below");
  // Zero gradients: no division by zero.
  scale = run_one("GlobalNormScale", {zeros(DType::kF32, {3})}, {float_attr("max_norm", 1.0)});
  expect_close(scale, {1.0}, 0, 0, "zero");
  expect_error(infer("GlobalNormScale", {a.type}, {float_attr("max_norm", 0.0)}).status(),
               {"GlobalNormScale", "'max_norm'"});
  expect_error(
      infer("GlobalNormScale", {a.type, TensorType{DType::kI32, {2}}}, {float_attr("max_norm", 1)})
          .status(),
      {"GlobalNormScale", "input 1"});
}

// The split form: per-stage SumOfSquares pairs combined by NormScale give the
// same scale as GlobalNormScale over all gradients.
TEST(GlobalNormScaleTest, SplitFormMatches) {
  TestTensor a = f32({2}, {3, 4});
  TestTensor b = f32({1, 1}, {12});
  TestTensor c = f32({3}, {0.1f, -0.2f, 0.3f});
  TestTensor first = run_one("SumOfSquares", {a, b}, {});
  EXPECT_EQ(first.type.to_string(), (TensorType{DType::kF32, {2}}).to_string());
  // hi + lo is the double sum: 9 + 16 + 144 = 169 (exact in f32, lo = 0).
  expect_close(first, {169.0, 0.0}, 0, 0, "pair");
  TestTensor second = run_one("SumOfSquares", {c}, {});
  // 0.1^2 + 0.2^2 + 0.3^2 in double from f32 inputs is not a float: lo keeps most
  // of the rest (hi + lo holds about 48 bits).
  const double exact = 0.1f * static_cast<double>(0.1f) + 0.2f * static_cast<double>(0.2f) +
                       0.3f * static_cast<double>(0.3f);
  const float *pair = second.as<float>();
  EXPECT_NE(pair[1], 0.0f);
  EXPECT_NEAR(static_cast<double>(pair[0]) + static_cast<double>(pair[1]), exact, exact * 1e-13);
  for (double max_norm : {1.0, 6.5, 100.0}) {
    TestTensor split = run_one("NormScale", {first, second}, {float_attr("max_norm", max_norm)});
    TestTensor whole = run_one("GlobalNormScale", {a, b, c}, {float_attr("max_norm", max_norm)});
    EXPECT_EQ(split.bytes, whole.bytes) << max_norm;
  }
  expect_error(infer("NormScale", {b.type}, {float_attr("max_norm", 1.0)}).status(),
               {"NormScale", "input 0", "f32[2]"});
  expect_error(infer("NormScale", {first.type}, {float_attr("max_norm", -1.0)}).status(),
               {"NormScale", "'max_norm'"});
}

TEST(OptimizerOpsTest, RefuseNonF32Kernels) {
  const Shape shape = {2};
  TestTensor p = zeros(DType::kF16, shape);
  RunResult result = run_op("SgdUpdate", {p, p, lr_tensor(0.1)});
  expect_error(result.status, {"SgdUpdate", "f16"});
}

} // namespace
} // namespace strata::ops::testing
