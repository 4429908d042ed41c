// Tests of make_training_graph (passes/make_training.cc) with BatchNormalization:
// the training form, the running-statistics updates (PyTorch semantics: momentum
// 0.1 by default, the running variance taking the unbiased batch variance) and
// the running mean/var becoming untrained state.
#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

#include "graph/builder.h"
#include "ops/registry.h"
#include "passes/autodiff.h"
#include "passes/make_training.h"
#include "runtime/cpu/executor.h"

namespace strata {
namespace {

constexpr int64_t kN = 4, kC = 2, kH = 3, kW = 3;

std::shared_ptr<const Blob> f32_blob(const std::vector<float> &values) {
  return Blob::copy_of(values.data(), values.size() * sizeof(float));
}

HostTensor f32_tensor(Shape shape, const std::vector<float> &values) {
  HostTensor t = HostTensor::zeros(TensorType{DType::kF32, std::move(shape)});
  std::memcpy(t.data(), values.data(), values.size() * sizeof(float));
  return t;
}

std::vector<float> values_of(const HostTensor &t) {
  const int64_t n = t.type.num_elements();
  return std::vector<float>(t.as<float>(), t.as<float>() + n);
}

const std::vector<float> kMean0 = {0.5f, -0.25f};
const std::vector<float> kVar0 = {1.5f, 2.0f};

// X [N, C, H, W] -> BatchNormalization -> Y. The running mean is a parameter
// with data and the running var a constant, as models exported for inference
// carry them; `momentum` < 0 leaves the attribute at its default.
Graph bn_graph(double momentum = -1.0) {
  GraphBuilder b("bn", ops::OpRegistry::global());
  TensorId x = b.input("x", DType::kF32, {kN, kC, kH, kW});
  TensorId scale =
      b.parameter("bn.scale", DType::kF32, {kC}, Initializer{Initializer::Kind::kOnes});
  TensorId bias = b.parameter("bn.bias", DType::kF32, {kC}, Initializer{Initializer::Kind::kZeros});
  TensorId mean = b.parameter("bn.running_mean", DType::kF32, {kC}, f32_blob(kMean0));
  TensorId var = b.constant("bn.running_var", DType::kF32, {kC}, f32_blob(kVar0));
  std::vector<Attribute> attrs;
  if (momentum >= 0) attrs.push_back({"momentum", momentum});
  b.output(b.op1("BatchNormalization", {x, scale, bias, mean, var}, attrs, "bn"));
  return std::move(b).finish().value();
}

// The batch fed at `step`: channels with different offsets and spreads.
std::vector<float> batch_for(int step) {
  std::vector<float> x(kN * kC * kH * kW);
  for (size_t i = 0; i < x.size(); ++i) {
    const int64_t c = static_cast<int64_t>(i / (kH * kW)) % kC;
    x[i] = static_cast<float>((c + 1) * std::sin(0.37 * static_cast<double>(i) + step) + 0.5 * c -
                              0.3 * step);
  }
  return x;
}

std::vector<float> targets_for(int step) {
  std::vector<float> t(kN * kC * kH * kW);
  for (size_t i = 0; i < t.size(); ++i)
    t[i] = static_cast<float>(std::cos(0.11 * static_cast<double>(i) * (step + 1)));
  return t;
}

// PyTorch's BatchNorm2d running-statistics update, in double.
void reference_update(const std::vector<float> &x, double momentum, std::vector<double> &mean,
                      std::vector<double> &var) {
  const double count = kN * kH * kW;
  for (int64_t c = 0; c < kC; ++c) {
    double sum = 0, squares = 0;
    for (int64_t n = 0; n < kN; ++n)
      for (int64_t i = 0; i < kH * kW; ++i)
        sum += x[(n * kC + c) * kH * kW + i];
    const double batch_mean = sum / count;
    for (int64_t n = 0; n < kN; ++n)
      for (int64_t i = 0; i < kH * kW; ++i) {
        const double d = x[(n * kC + c) * kH * kW + i] - batch_mean;
        squares += d * d;
      }
    const double unbiased = squares / (count - 1);
    mean[c] = (1 - momentum) * mean[c] + momentum * batch_mean;
    var[c] = (1 - momentum) * var[c] + momentum * unbiased;
  }
}

void train_and_check(double momentum_attr, double momentum) {
  Graph forward = bn_graph(momentum_attr);
  passes::TrainingOptions options;
  options.loss = "mse";
  options.optimizer = passes::parse_optimizer("sgd:lr=0.5,momentum=0.9").value();
  auto training = passes::make_training_graph(forward, options);
  ASSERT_TRUE(training.is_ok()) << training.status().to_string();

  // The forward graph is untouched: inference keeps training = 0 and the kinds.
  const Node &forward_bn = forward.node(*forward.find_node("bn"));
  EXPECT_EQ(forward_bn.int_attr("training").value_or(0), 0);
  EXPECT_EQ(forward.tensor(*forward.find_tensor("bn.running_mean")).kind, TensorKind::kParameter);
  EXPECT_EQ(forward.tensor(*forward.find_tensor("bn.running_var")).kind, TensorKind::kConstant);

  const Graph &g = *training;
  EXPECT_EQ(g.node(*g.find_node("bn")).int_attr("training"), 1);
  const TensorId mean = *g.find_tensor("bn.running_mean");
  const TensorId var = *g.find_tensor("bn.running_var");
  const TensorId scale = *g.find_tensor("bn.scale");
  const TensorId bias = *g.find_tensor("bn.bias");
  EXPECT_EQ(g.tensor(mean).kind, TensorKind::kState);
  EXPECT_EQ(g.tensor(var).kind, TensorKind::kState);
  // Only gamma and beta are trained: the running stats have no optimizer state.
  EXPECT_EQ(passes::trainable_parameters(g), (std::vector<TensorId>{scale, bias}));
  EXPECT_TRUE(g.find_tensor("bn.scale.momentum").has_value());
  EXPECT_TRUE(g.find_tensor("bn.bias.momentum").has_value());
  int running_updates = 0;
  for (TensorId id = 0; id < g.num_tensors(); ++id) {
    const std::string &name = g.tensor(id).name;
    if (g.tensor(id).kind == TensorKind::kState && name.starts_with("bn.running_") && id != mean &&
        id != var)
      ADD_FAILURE() << "optimizer state for a running statistic: " << name;
  }
  for (const StateUpdate &update : g.updates())
    running_updates += update.target == mean || update.target == var;
  EXPECT_EQ(running_updates, 2);

  auto executor = runtime::CpuExecutor::create(g);
  ASSERT_TRUE(executor.is_ok()) << executor.status().to_string();
  std::vector<double> ref_mean(kMean0.begin(), kMean0.end());
  std::vector<double> ref_var(kVar0.begin(), kVar0.end());
  const std::vector<float> scale0 = values_of((*executor)->value(scale));
  const std::vector<float> bias0 = values_of((*executor)->value(bias));
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> x = batch_for(step);
    std::vector<HostTensor> outputs;
    Status status = (*executor)->run(
        {f32_tensor({kN, kC, kH, kW}, x), f32_tensor({kN, kC, kH, kW}, targets_for(step))},
        &outputs);
    ASSERT_TRUE(status.is_ok()) << status.to_string();
    reference_update(x, momentum, ref_mean, ref_var);
    const std::vector<float> got_mean = values_of((*executor)->value(mean));
    const std::vector<float> got_var = values_of((*executor)->value(var));
    for (int64_t c = 0; c < kC; ++c) {
      EXPECT_NEAR(got_mean[c], ref_mean[c], 1e-5 * (1 + std::abs(ref_mean[c])))
          << "step " << step << " channel " << c;
      EXPECT_NEAR(got_var[c], ref_var[c], 1e-5 * (1 + std::abs(ref_var[c])))
          << "step " << step << " channel " << c;
    }
  }
  // Gamma and beta still train.
  const std::vector<float> scale3 = values_of((*executor)->value(scale));
  const std::vector<float> bias3 = values_of((*executor)->value(bias));
  for (int64_t c = 0; c < kC; ++c) {
    EXPECT_NE(scale3[c], scale0[c]) << c;
    EXPECT_NE(bias3[c], bias0[c]) << c;
  }
}

TEST(MakeTrainingBatchNorm, RunningStatisticsMatchPyTorch) { train_and_check(-1.0, 0.1); }

TEST(MakeTrainingBatchNorm, UsesTheMomentumAttribute) { train_and_check(0.25, 0.25); }

TEST(MakeTrainingBatchNorm, RejectsRunningStatsThatCannotBeUpdated) {
  passes::TrainingOptions options;
  options.loss = "mse";
  {
    GraphBuilder b("fed", ops::OpRegistry::global());
    TensorId x = b.input("x", DType::kF32, {kN, kC});
    TensorId mean = b.input("mean", DType::kF32, {kC});
    TensorId scale = b.parameter("scale", DType::kF32, {kC}, Initializer{Initializer::Kind::kOnes});
    TensorId bias = b.parameter("bias", DType::kF32, {kC}, Initializer{Initializer::Kind::kZeros});
    TensorId var = b.constant("var", DType::kF32, {kC}, f32_blob(kVar0));
    b.output(b.op1("BatchNormalization", {x, scale, bias, mean, var}, {}, "bn"));
    auto training = passes::make_training_graph(std::move(b).finish().value(), options);
    ASSERT_FALSE(training.is_ok());
    EXPECT_NE(training.status().message().find("running mean 'mean'"), std::string::npos)
        << training.status().message();
    EXPECT_NE(training.status().message().find("a graph input"), std::string::npos)
        << training.status().message();
  }
  {
    // Two nodes sharing one running mean would update it twice.
    GraphBuilder b("shared", ops::OpRegistry::global());
    TensorId x = b.input("x", DType::kF32, {kN, kC});
    TensorId scale = b.parameter("scale", DType::kF32, {kC}, Initializer{Initializer::Kind::kOnes});
    TensorId bias = b.parameter("bias", DType::kF32, {kC}, Initializer{Initializer::Kind::kZeros});
    TensorId mean = b.constant("mean", DType::kF32, {kC}, f32_blob(kMean0));
    TensorId var1 = b.constant("var1", DType::kF32, {kC}, f32_blob(kVar0));
    TensorId var2 = b.constant("var2", DType::kF32, {kC}, f32_blob(kVar0));
    TensorId y = b.op1("BatchNormalization", {x, scale, bias, mean, var1}, {}, "bn1");
    b.output(b.op1("BatchNormalization", {y, scale, bias, mean, var2}, {}, "bn2"));
    auto training = passes::make_training_graph(std::move(b).finish().value(), options);
    ASSERT_FALSE(training.is_ok());
    EXPECT_NE(training.status().message().find("is read elsewhere too"), std::string::npos)
        << training.status().message();
  }
}

TEST(BatchNormStats, MeanAndUnbiasedVariance) {
  GraphBuilder b("stats", ops::OpRegistry::global());
  TensorId x = b.input("x", DType::kF32, {2, 1, 2});
  auto outs = b.op("BatchNormStats", {x});
  ASSERT_EQ(outs.size(), 2u);
  b.output(outs[0]);
  b.output(outs[1]);
  auto executor = runtime::CpuExecutor::create(std::move(b).finish().value());
  ASSERT_TRUE(executor.is_ok()) << executor.status().to_string();
  std::vector<HostTensor> outputs;
  ASSERT_TRUE((*executor)->run({f32_tensor({2, 1, 2}, {1, 2, 3, 6})}, &outputs).is_ok());
  EXPECT_FLOAT_EQ(outputs[0].as<float>()[0], 3.0f);
  // Squares 4 + 1 + 0 + 9 = 14 over n - 1 = 3.
  EXPECT_FLOAT_EQ(outputs[1].as<float>()[0], 14.0f / 3.0f);

  // One value per channel has no unbiased variance (PyTorch errors too).
  GraphBuilder one("one", ops::OpRegistry::global());
  TensorId single = one.input("x", DType::kF32, {1, 3});
  one.op("BatchNormStats", {single});
  auto built = std::move(one).finish();
  ASSERT_FALSE(built.is_ok());
  EXPECT_NE(built.status().message().find("more than one"), std::string::npos)
      << built.status().message();
}

} // namespace
} // namespace strata
