// Finite-difference gradient checking, shared by the gradient tests of every op.
//
// check_gradients builds a graph from `build` over inputs with the given values,
// reduces its output to a scalar loss L = sum(output * R) with a fixed random R
// (so every output element matters, each with its own weight), appends the
// backward graph with passes::append_backward, and compares each analytic
// gradient dL/dx[i] of every floating-point input with the central difference
// (L(x + h e_i) - L(x - h e_i)) / 2h computed by running the forward graph.
// Integer inputs (indices, labels) are held fixed.
//
// Kernels compute in f32, so the comparison allows for f32 rounding: an element
// passes when |analytic - numeric| <= tolerance * max(1, max |numeric|).
#pragma once

#include <cmath>
#include <functional>
#include <random>

#include <gtest/gtest.h>

#include "graph/builder.h"
#include "ops/registry.h"
#include "passes/autodiff.h"
#include "runtime/cpu/executor.h"

namespace strata::testing {

using BuildFn = std::function<TensorId(GraphBuilder &, llvm::ArrayRef<TensorId>)>;

// Seeded normal values for a tensor of `type` (floats), scaled by `scale`.
inline HostTensor random_tensor(const TensorType &type, uint32_t seed, float scale = 1.0f) {
  HostTensor t = HostTensor::zeros(type);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  for (int64_t i = 0; i < type.num_elements(); ++i)
    t.as<float>()[i] = normal(rng);
  return t;
}

struct GradCheckOptions {
  double tolerance = 1e-2;
  double step = 1e-2;
};

inline void check_gradients(const BuildFn &build, std::vector<HostTensor> inputs,
                            GradCheckOptions options = {}) {
  const ops::OpRegistry &registry = ops::OpRegistry::global();
  GraphBuilder b("grad_check", registry);
  std::vector<TensorId> ids;
  for (size_t i = 0; i < inputs.size(); ++i)
    ids.push_back(b.input(str_cat("x", i), inputs[i].type.dtype, inputs[i].type.shape));
  TensorId out = build(b, ids);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  const TensorType out_type = b.type(out);
  ASSERT_EQ(out_type.dtype, DType::kF32) << "the checked graph must output f32";
  HostTensor weights = random_tensor(out_type, 1234);
  TensorId r = b.constant("R", DType::kF32, out_type.shape, weights.blob);
  TensorId weighted = b.op1("Mul", {out, r}, {}, "weighted");
  TensorId loss = b.op1("ReduceSum", {weighted}, {{"keepdims", int64_t{0}}}, "loss");
  b.output(loss);
  auto forward = std::move(b).finish();
  ASSERT_TRUE(forward.is_ok()) << forward.status().to_string();

  std::vector<TensorId> targets;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (is_floating(inputs[i].type.dtype)) targets.push_back(ids[i]);
  Graph training = *forward;
  auto grads = passes::append_backward(training, loss, targets);
  ASSERT_TRUE(grads.is_ok()) << grads.status().to_string();
  std::vector<TensorId> outputs{loss};
  for (const passes::Gradient &g : *grads)
    outputs.push_back(g.gradient);
  training.set_outputs(outputs);

  auto backward_exec = runtime::CpuExecutor::create(training);
  ASSERT_TRUE(backward_exec.is_ok()) << backward_exec.status().to_string();
  std::vector<HostTensor> analytic;
  Status run = (*backward_exec)->run(inputs, &analytic);
  ASSERT_TRUE(run.is_ok()) << run.to_string();

  auto forward_exec = runtime::CpuExecutor::create(*forward);
  ASSERT_TRUE(forward_exec.is_ok()) << forward_exec.status().to_string();
  auto loss_at = [&](std::vector<HostTensor> &values) {
    std::vector<HostTensor> result;
    Status s = (*forward_exec)->run(values, &result);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    return s.is_ok() ? static_cast<double>(result[0].as<float>()[0]) : NAN;
  };

  size_t grad_index = 1;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!is_floating(inputs[i].type.dtype)) continue;
    const HostTensor &grad = analytic[grad_index++];
    ASSERT_EQ(grad.type, inputs[i].type);
    // Perturb a copy so the caller's values stay intact.
    std::vector<HostTensor> values;
    for (const HostTensor &v : inputs) {
      HostTensor copy = HostTensor::zeros(v.type);
      std::memcpy(copy.data(), v.data(), v.size_bytes());
      values.push_back(copy);
    }
    float *x = values[i].as<float>();
    const int64_t n = inputs[i].type.num_elements();
    std::vector<double> numeric(n);
    double scale = 1.0;
    for (int64_t k = 0; k < n; ++k) {
      const float original = x[k];
      x[k] = original + static_cast<float>(options.step);
      double plus = loss_at(values);
      x[k] = original - static_cast<float>(options.step);
      double minus = loss_at(values);
      x[k] = original;
      numeric[k] = (plus - minus) / (2 * options.step);
      scale = std::max(scale, std::abs(numeric[k]));
    }
    for (int64_t k = 0; k < n; ++k)
      EXPECT_NEAR(grad.as<float>()[k], numeric[k], options.tolerance * scale)
          << "input x" << i << " element " << k;
  }
}

} // namespace strata::testing
