// Optimizer ops: one training step's parameter update as pure graph ops.
//
// None of these ops works in place: each returns the new parameter (and the new
// optimizer state) as fresh tensors, and the graph's state updates copy them back
// after the run. The arithmetic follows PyTorch 1.13's single-tensor
// torch.optim.SGD / Adam / AdamW step closely, operation for operation: scalars
// that PyTorch computes in Python (bias corrections, step size, decay factor) are
// computed in double here and rounded to f32 once, and every elementwise step is
// done in f32 in the same order, so results agree with PyTorch to rounding.
//
// The step counter is an i64 scalar holding the number of steps taken BEFORE the
// current one (0 on the first step).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "ops/kernels/cpu/parallel.h"
#include "ops/registry.h"

namespace strata::ops {
namespace {

using TypeList = llvm::SmallVector<TensorType, 2>;

// ---------------------------------------------------------------------------
// Type checks shared by the infer functions

Status expect_scalar(const OpDef &def, llvm::ArrayRef<TensorType> inputs, size_t index,
                     std::string_view what, DType dtype) {
  const TensorType &type = inputs[index];
  if (type.dtype != dtype || type.num_elements() != 1)
    return invalid_argument(def.name, ": input ", index, " (", what, ") must be a ",
                            dtype_name(dtype), " scalar, got ", type.to_string());
  return Status::ok();
}

Status expect_like_param(const OpDef &def, llvm::ArrayRef<TensorType> inputs, size_t index,
                         std::string_view what) {
  if (!(inputs[index] == inputs[0]))
    return invalid_argument(def.name, ": input ", index, " (", what, ") is ",
                            inputs[index].to_string(), " but the parameter is ",
                            inputs[0].to_string());
  return Status::ok();
}

Status f32_only(const KernelContext &context) {
  if (context.inputs[0].dtype() != DType::kF32)
    return unimplemented(context.def.name, ": no CPU kernel for dtype ",
                         dtype_name(context.inputs[0].dtype()));
  return Status::ok();
}

// A finite attribute of at least `low` (a rate, a decay), named with its
// value where it is not.
Status expect_at_least(const Node &node, const OpDef &def, std::string_view name, double low) {
  const double value = AttrReader(node, def).get_float(name);
  if (!(value >= low) || !std::isfinite(value))
    return invalid_argument(def.name, ": attribute '", name, "' = ", value,
                            " must be a finite number >= ", low);
  return Status::ok();
}

// An attribute that is 0 or 1.
Status expect_flag(const Node &node, const OpDef &def, std::string_view name) {
  const int64_t value = AttrReader(node, def).get_int(name);
  if (value != 0 && value != 1)
    return invalid_argument(def.name, ": attribute '", name, "' = ", value, " must be 0 or 1");
  return Status::ok();
}

float read_f32_scalar(const ConstTensorView &view) { return *view.as<float>(); }
int64_t read_i64_scalar(const ConstTensorView &view) { return *view.as<int64_t>(); }

// ---------------------------------------------------------------------------
// SgdUpdate(param, grad, lr[, momentum_buf[, step]]) -> new_param[, new_buf]

Result<TypeList> infer_sgd(const Node &node, const OpDef &def, llvm::ArrayRef<TensorType> inputs) {
  AttrReader attrs(node, def);
  const double momentum = attrs.get_float("momentum");
  const double dampening = attrs.get_float("dampening");
  const bool nesterov = attrs.get_int("nesterov") != 0;
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  RETURN_IF_ERROR(expect_like_param(def, inputs, 1, "grad"));
  RETURN_IF_ERROR(expect_scalar(def, inputs, 2, "lr", DType::kF32));
  RETURN_IF_ERROR(expect_at_least(node, def, "momentum", 0));
  RETURN_IF_ERROR(expect_at_least(node, def, "weight_decay", 0));
  RETURN_IF_ERROR(expect_flag(node, def, "nesterov"));
  if (!std::isfinite(dampening))
    return invalid_argument(def.name, ": attribute 'dampening' = ", dampening, " is not finite");
  const bool has_buffer = inputs.size() >= 4;
  if (momentum != 0 && !has_buffer)
    return invalid_argument(def.name, ": attribute 'momentum' = ", momentum,
                            " needs a momentum buffer (input 3)");
  if (momentum == 0 && has_buffer)
    return invalid_argument(def.name,
                            ": a momentum buffer (input 3) is given but attribute 'momentum' is 0");
  if (nesterov && (momentum <= 0 || dampening != 0))
    return invalid_argument(def.name,
                            ": attribute 'nesterov' needs momentum > 0 and dampening = 0");
  if (has_buffer) RETURN_IF_ERROR(expect_like_param(def, inputs, 3, "momentum_buf"));
  if (inputs.size() >= 5) RETURN_IF_ERROR(expect_scalar(def, inputs, 4, "step", DType::kI64));
  TypeList out{inputs[0]};
  if (has_buffer) out.push_back(inputs[0]);
  return out;
}

OpCost sgd_cost(const Node &node, const OpDef &def, llvm::ArrayRef<TensorType> inputs,
                llvm::ArrayRef<TensorType> outputs) {
  OpCost cost = elementwise_cost(node, def, inputs, outputs);
  AttrReader attrs(node, def);
  double per_element = 2; // p - lr * d
  if (attrs.get_float("weight_decay") != 0) per_element += 2;
  if (attrs.get_float("momentum") != 0) per_element += 3;
  if (attrs.get_int("nesterov") != 0) per_element += 2;
  cost.flops = per_element * static_cast<double>(inputs[0].num_elements());
  return cost;
}

void sgd_range(const KernelContext &context, int64_t begin, int64_t end, float momentum,
               float weight_decay, float keep, bool nesterov, float neg_lr, bool has_buffer,
               bool first);

Status sgd_kernel(const KernelContext &context) {
  RETURN_IF_ERROR(f32_only(context));
  AttrReader attrs = context.attrs();
  const float momentum = static_cast<float>(attrs.get_float("momentum"));
  const float weight_decay = static_cast<float>(attrs.get_float("weight_decay"));
  const float keep = static_cast<float>(1.0 - attrs.get_float("dampening"));
  const bool nesterov = attrs.get_int("nesterov") != 0;
  const float neg_lr = -read_f32_scalar(context.inputs[2]);
  const bool has_buffer = context.inputs.size() >= 4;
  // PyTorch starts the buffer as a copy of the first gradient; without a step
  // input every step blends (the same when dampening is 0 and the buffer is zero).
  const bool first = context.inputs.size() >= 5 && read_i64_scalar(context.inputs[4]) == 0;

  const int64_t n = context.inputs[0].num_elements();
  // Elements [begin, end); large parameters split over the CPU threads.
  cpu::parallel_for_items(n, 1, [&](int64_t begin, int64_t end) {
    sgd_range(context, begin, end, momentum, weight_decay, keep, nesterov, neg_lr, has_buffer,
              first);
  });
  return Status::ok();
}

void sgd_range(const KernelContext &context, int64_t begin, int64_t end, float momentum,
               float weight_decay, float keep, bool nesterov, float neg_lr, bool has_buffer,
               bool first) {
  const float *__restrict param = context.inputs[0].as<float>() + begin;
  const float *__restrict grad = context.inputs[1].as<float>() + begin;
  float *__restrict new_param = context.outputs[0].as<float>() + begin;
  const int64_t n = end - begin;
  if (!has_buffer) {
    for (int64_t i = 0; i < n; ++i) {
      float g = grad[i];
      if (weight_decay != 0) g = g + weight_decay * param[i];
      new_param[i] = param[i] + neg_lr * g;
    }
    return;
  }
  const float *__restrict buf = context.inputs[3].as<float>() + begin;
  float *__restrict new_buf = context.outputs[1].as<float>() + begin;
  for (int64_t i = 0; i < n; ++i) {
    float g = grad[i];
    if (weight_decay != 0) g = g + weight_decay * param[i];
    float b;
    if (first) {
      b = g;
    } else {
      b = buf[i] * momentum;
      b = b + keep * g;
    }
    new_buf[i] = b;
    const float d = nesterov ? g + momentum * b : b;
    new_param[i] = param[i] + neg_lr * d;
  }
}

// ---------------------------------------------------------------------------
// AdamUpdate(param, grad, m, v, lr, step) -> new_param, new_m, new_v

Result<TypeList> infer_adam(const Node &node, const OpDef &def, llvm::ArrayRef<TensorType> inputs) {
  AttrReader attrs(node, def);
  for (const char *name : {"beta1", "beta2"}) {
    const double beta = attrs.get_float(name);
    if (!(beta >= 0 && beta < 1))
      return invalid_argument(def.name, ": attribute '", name, "' = ", beta, " is outside [0, 1)");
  }
  // The update divides by sqrt(v) + epsilon, and v is 0 where the gradient
  // has been: only a positive epsilon keeps it finite.
  const double epsilon = attrs.get_float("epsilon");
  if (!(epsilon > 0) || !std::isfinite(epsilon))
    return invalid_argument(def.name, ": attribute 'epsilon' = ", epsilon,
                            " must be a finite number > 0");
  RETURN_IF_ERROR(expect_at_least(node, def, "weight_decay", 0));
  RETURN_IF_ERROR(expect_flag(node, def, "decoupled"));
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  RETURN_IF_ERROR(expect_like_param(def, inputs, 1, "grad"));
  RETURN_IF_ERROR(expect_like_param(def, inputs, 2, "m"));
  RETURN_IF_ERROR(expect_like_param(def, inputs, 3, "v"));
  RETURN_IF_ERROR(expect_scalar(def, inputs, 4, "lr", DType::kF32));
  RETURN_IF_ERROR(expect_scalar(def, inputs, 5, "step", DType::kI64));
  return TypeList{inputs[0], inputs[0], inputs[0]};
}

OpCost adam_cost(const Node &node, const OpDef &def, llvm::ArrayRef<TensorType> inputs,
                 llvm::ArrayRef<TensorType> outputs) {
  OpCost cost = elementwise_cost(node, def, inputs, outputs);
  // Moments 4 + 5, sqrt, divide, add eps, divide, multiply-add, decay 2.
  cost.flops = 16.0 * static_cast<double>(inputs[0].num_elements());
  return cost;
}

// The per-element Adam/AdamW update, in f32, in PyTorch's operation order. The
// SSE path does the same IEEE operations (multiply, add, sqrt, divide: all
// correctly rounded) four lanes at a time, so it matches the scalar loop bitwise.
enum class AdamDecay { kDecoupled, kL2, kNone };
struct AdamScalars {
  float decay, wd, b1, b2, one_minus_b1, one_minus_b2, bias_correction2_sqrt, eps, neg_step_size;
};
struct AdamArrays {
  const float *__restrict param;
  const float *__restrict grad;
  const float *__restrict m;
  const float *__restrict v;
  float *__restrict new_param;
  float *__restrict new_m;
  float *__restrict new_v;
};

template <AdamDecay kDecay> void adam_loop(const AdamScalars &k, const AdamArrays &a, int64_t n) {
  int64_t i = 0;
#if defined(__SSE2__)
  const __m128 decay = _mm_set1_ps(k.decay), wd = _mm_set1_ps(k.wd);
  const __m128 b1 = _mm_set1_ps(k.b1), b2 = _mm_set1_ps(k.b2);
  const __m128 one_minus_b1 = _mm_set1_ps(k.one_minus_b1);
  const __m128 one_minus_b2 = _mm_set1_ps(k.one_minus_b2);
  const __m128 bias_correction2_sqrt = _mm_set1_ps(k.bias_correction2_sqrt);
  const __m128 eps = _mm_set1_ps(k.eps), neg_step_size = _mm_set1_ps(k.neg_step_size);
  for (; i + 4 <= n; i += 4) {
    __m128 p = _mm_loadu_ps(a.param + i);
    __m128 g = _mm_loadu_ps(a.grad + i);
    if constexpr (kDecay == AdamDecay::kDecoupled) p = _mm_mul_ps(p, decay);
    if constexpr (kDecay == AdamDecay::kL2) g = _mm_add_ps(g, _mm_mul_ps(wd, p));
    __m128 mi = _mm_mul_ps(_mm_loadu_ps(a.m + i), b1);
    mi = _mm_add_ps(mi, _mm_mul_ps(one_minus_b1, g));
    __m128 vi = _mm_mul_ps(_mm_loadu_ps(a.v + i), b2);
    vi = _mm_add_ps(vi, _mm_mul_ps(_mm_mul_ps(one_minus_b2, g), g));
    const __m128 denom = _mm_add_ps(_mm_div_ps(_mm_sqrt_ps(vi), bias_correction2_sqrt), eps);
    _mm_storeu_ps(a.new_m + i, mi);
    _mm_storeu_ps(a.new_v + i, vi);
    _mm_storeu_ps(a.new_param + i, _mm_add_ps(p, _mm_div_ps(_mm_mul_ps(neg_step_size, mi), denom)));
  }
#endif
  for (; i < n; ++i) {
    float p = a.param[i];
    float g = a.grad[i];
    if constexpr (kDecay == AdamDecay::kDecoupled) p = p * k.decay;
    if constexpr (kDecay == AdamDecay::kL2) g = g + k.wd * p;
    float mi = a.m[i] * k.b1;
    mi = mi + k.one_minus_b1 * g;
    float vi = a.v[i] * k.b2;
    vi = vi + k.one_minus_b2 * g * g;
    const float denom = std::sqrt(vi) / k.bias_correction2_sqrt + k.eps;
    a.new_m[i] = mi;
    a.new_v[i] = vi;
    a.new_param[i] = p + k.neg_step_size * mi / denom;
  }
}

Status adam_kernel(const KernelContext &context) {
  RETURN_IF_ERROR(f32_only(context));
  AttrReader attrs = context.attrs();
  const double beta1 = attrs.get_float("beta1");
  const double beta2 = attrs.get_float("beta2");
  const double weight_decay = attrs.get_float("weight_decay");
  const bool decoupled = attrs.get_int("decoupled") != 0;
  const double lr = read_f32_scalar(context.inputs[4]);
  const int64_t step = read_i64_scalar(context.inputs[5]);
  if (step < 0) return invalid_argument(context.def.name, ": step ", step, " is negative");

  // The scalars PyTorch computes in Python double precision.
  const double t = static_cast<double>(step) + 1.0;
  const double bias_correction1 = 1.0 - std::pow(beta1, t);
  const double bias_correction2 = 1.0 - std::pow(beta2, t);
  const float neg_step_size = static_cast<float>(-(lr / bias_correction1));
  const float bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const float decay = static_cast<float>(1.0 - lr * weight_decay);
  const float wd = static_cast<float>(weight_decay);
  const float b1 = static_cast<float>(beta1);
  const float b2 = static_cast<float>(beta2);
  const float one_minus_b1 = static_cast<float>(1.0 - beta1);
  const float one_minus_b2 = static_cast<float>(1.0 - beta2);
  const float eps = static_cast<float>(attrs.get_float("epsilon"));

  const float *__restrict param = context.inputs[0].as<float>();
  const float *__restrict grad = context.inputs[1].as<float>();
  const float *__restrict m = context.inputs[2].as<float>();
  const float *__restrict v = context.inputs[3].as<float>();
  float *__restrict new_param = context.outputs[0].as<float>();
  float *__restrict new_m = context.outputs[1].as<float>();
  float *__restrict new_v = context.outputs[2].as<float>();
  const int64_t n = context.inputs[0].num_elements();
  const AdamScalars k{
      decay, wd, b1, b2, one_minus_b1, one_minus_b2, bias_correction2_sqrt, eps, neg_step_size};
  cpu::parallel_for_items(n, 1, [&](int64_t b, int64_t e) {
    const AdamArrays a{param + b, grad + b, m + b, v + b, new_param + b, new_m + b, new_v + b};
    if (decoupled)
      adam_loop<AdamDecay::kDecoupled>(k, a, e - b);
    else if (wd != 0)
      adam_loop<AdamDecay::kL2>(k, a, e - b);
    else
      adam_loop<AdamDecay::kNone>(k, a, e - b);
  });
  return Status::ok();
}

// ---------------------------------------------------------------------------
// LearningRate(step) -> lr

struct ScheduleAttrs {
  double base_lr;
  bool cosine;
  int64_t warmup;
  int64_t total;
  double min_lr;
};

Result<ScheduleAttrs> read_schedule(const Node &node, const OpDef &def) {
  AttrReader attrs(node, def);
  ScheduleAttrs s;
  s.base_lr = attrs.get_float("base_lr");
  const std::string schedule = attrs.get_string("schedule");
  if (schedule != "constant" && schedule != "cosine")
    return invalid_argument(def.name, ": attribute 'schedule' = \"", schedule,
                            "\" is not a schedule (expected \"constant\" or \"cosine\")");
  s.cosine = schedule == "cosine";
  s.warmup = attrs.get_int("warmup_steps");
  s.total = attrs.get_int("total_steps");
  s.min_lr = attrs.get_float("min_lr");
  if (!(s.base_lr > 0) || !std::isfinite(s.base_lr))
    return invalid_argument(def.name, ": attribute 'base_lr' = ", s.base_lr,
                            " must be a finite number > 0");
  RETURN_IF_ERROR(expect_at_least(node, def, "min_lr", 0));
  if (s.min_lr > s.base_lr)
    return invalid_argument(def.name, ": attribute 'min_lr' = ", s.min_lr,
                            " is more than 'base_lr' = ", s.base_lr);
  if (s.warmup < 0)
    return invalid_argument(def.name, ": attribute 'warmup_steps' = ", s.warmup, " is negative");
  if (s.total < 0)
    return invalid_argument(def.name, ": attribute 'total_steps' = ", s.total, " is negative");
  if (s.cosine && s.total <= s.warmup)
    return invalid_argument(def.name, ": schedule \"cosine\" needs total_steps (", s.total,
                            ") > warmup_steps (", s.warmup, ")");
  return s;
}

Result<TypeList> infer_learning_rate(const Node &node, const OpDef &def,
                                     llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(read_schedule(node, def).status());
  RETURN_IF_ERROR(expect_scalar(def, inputs, 0, "step", DType::kI64));
  return TypeList{TensorType{DType::kF32, {}}};
}

double schedule_value(const ScheduleAttrs &s, int64_t step) {
  if (step < s.warmup)
    return s.base_lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup);
  if (!s.cosine) return s.base_lr;
  double progress = static_cast<double>(step - s.warmup) / static_cast<double>(s.total - s.warmup);
  progress = std::clamp(progress, 0.0, 1.0);
  return s.min_lr + 0.5 * (s.base_lr - s.min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

Status learning_rate_kernel(const KernelContext &context) {
  ASSIGN_OR_RETURN(ScheduleAttrs s, read_schedule(context.node, context.def));
  const int64_t step = std::max<int64_t>(read_i64_scalar(context.inputs[0]), 0);
  *context.outputs[0].as<float>() = static_cast<float>(schedule_value(s, step));
  return Status::ok();
}

OpCost scalar_cost(const Node &node, const OpDef &def, llvm::ArrayRef<TensorType> inputs,
                   llvm::ArrayRef<TensorType> outputs) {
  OpCost cost = elementwise_cost(node, def, inputs, outputs);
  cost.flops = 10;
  return cost;
}

// ---------------------------------------------------------------------------
// GlobalNormScale(g0, g1, ...) -> scale

Status expect_positive_max_norm(const Node &node, const OpDef &def) {
  const double max_norm = AttrReader(node, def).get_float("max_norm");
  if (!(max_norm > 0))
    return invalid_argument(def.name, ": attribute 'max_norm' = ", max_norm, " must be positive");
  return Status::ok();
}

// min(1, max_norm / (norm + 1e-6)) from the sum of squares, in double.
float clip_scale(double sum_of_squares, double max_norm) {
  return static_cast<float>(std::min(max_norm / (std::sqrt(sum_of_squares) + 1e-6), 1.0));
}

// Sums of squares in double, tensor by tensor and element by element in order,
// so the result does not depend on threading or vector width.
Result<double> sum_of_squares(const KernelContext &context) {
  double sum = 0;
  for (size_t k = 0; k < context.inputs.size(); ++k) {
    const ConstTensorView &g = context.inputs[k];
    if (g.dtype() != DType::kF32)
      return unimplemented(context.def.name, ": no CPU kernel for dtype ", dtype_name(g.dtype()),
                           " (input ", k, ")");
    const float *data = g.as<float>();
    double part = 0;
    for (int64_t i = 0, n = g.num_elements(); i < n; ++i)
      part += static_cast<double>(data[i]) * static_cast<double>(data[i]);
    sum += part;
  }
  return sum;
}

Result<TypeList> infer_global_norm_scale(const Node &node, const OpDef &def,
                                         llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_positive_max_norm(node, def));
  for (size_t i = 0; i < inputs.size(); ++i)
    RETURN_IF_ERROR(expect_floating(def, inputs, i));
  return TypeList{TensorType{DType::kF32, {}}};
}

OpCost global_norm_scale_cost(const Node &node, const OpDef &def, llvm::ArrayRef<TensorType> inputs,
                              llvm::ArrayRef<TensorType> outputs) {
  OpCost cost = elementwise_cost(node, def, inputs, outputs);
  cost.flops = 4;
  for (const TensorType &t : inputs)
    cost.flops += 2.0 * static_cast<double>(t.num_elements());
  return cost;
}

Status global_norm_scale_kernel(const KernelContext &context) {
  ASSIGN_OR_RETURN(double sum, sum_of_squares(context));
  *context.outputs[0].as<float>() = clip_scale(sum, context.attrs().get_float("max_norm"));
  return Status::ok();
}

// SumOfSquares(g0, g1, ...) -> f32[2]: the sum of every element squared, in
// double, as the pair (hi, lo) = (float(sum), float(sum - hi)), which keeps about
// 48 bits of the double. What one pipeline stage contributes to a global norm.

Result<TypeList> infer_sum_of_squares(const Node &node, const OpDef &def,
                                      llvm::ArrayRef<TensorType> inputs) {
  for (size_t i = 0; i < inputs.size(); ++i)
    RETURN_IF_ERROR(expect_floating(def, inputs, i));
  return TypeList{TensorType{DType::kF32, {2}}};
}

Status sum_of_squares_kernel(const KernelContext &context) {
  ASSIGN_OR_RETURN(double sum, sum_of_squares(context));
  float *out = context.outputs[0].as<float>();
  out[0] = static_cast<float>(sum);
  out[1] = static_cast<float>(sum - static_cast<double>(out[0]));
  return Status::ok();
}

// NormScale(s0, s1, ...) -> scale: GlobalNormScale from partial sums of squares
// (SumOfSquares pairs), added in double in input order.

Result<TypeList> infer_norm_scale(const Node &node, const OpDef &def,
                                  llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_positive_max_norm(node, def));
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!(inputs[i] == TensorType{DType::kF32, {2}}))
      return invalid_argument(def.name, ": input ", i, " is ", inputs[i].to_string(),
                              "; expected a SumOfSquares pair f32[2]");
  return TypeList{TensorType{DType::kF32, {}}};
}

Status norm_scale_kernel(const KernelContext &context) {
  double sum = 0;
  for (const ConstTensorView &pair : context.inputs)
    sum += static_cast<double>(pair.as<float>()[0]) + static_cast<double>(pair.as<float>()[1]);
  *context.outputs[0].as<float>() = clip_scale(sum, context.attrs().get_float("max_norm"));
  return Status::ok();
}

// ---------------------------------------------------------------------------
// The table

std::vector<OpDef> make_table() {
  std::vector<OpDef> table;
  const AttrValue zero_f{0.0};
  const AttrValue zero_i{int64_t{0}};

  OpDef sgd{"SgdUpdate",
            "new_param[, new_buf] = one SGD step (PyTorch torch.optim.SGD semantics)",
            3,
            5,
            {{"dampening", AttrType::kFloat, zero_f, "momentum dampening"},
             {"momentum", AttrType::kFloat, zero_f, "momentum factor; 0: no buffer"},
             {"nesterov", AttrType::kInt, zero_i, "1: Nesterov momentum"},
             {"weight_decay", AttrType::kFloat, zero_f, "L2 penalty added to the gradient"}},
            infer_sgd,
            sgd_cost,
            sgd_kernel};
  sgd.traits.integer_inputs = 1u << 4; // the step counter
  table.push_back(std::move(sgd));

  OpDef adam{"AdamUpdate",
             "new_param, new_m, new_v = one Adam or AdamW step (PyTorch semantics)",
             6,
             6,
             {{"beta1", AttrType::kFloat, AttrValue{0.9}, "first-moment decay"},
              {"beta2", AttrType::kFloat, AttrValue{0.999}, "second-moment decay"},
              {"decoupled", AttrType::kInt, zero_i, "1: AdamW (decoupled weight decay)"},
              {"epsilon", AttrType::kFloat, AttrValue{1e-8}, "added to the denominator"},
              {"weight_decay", AttrType::kFloat, zero_f, "weight decay"}},
             infer_adam,
             adam_cost,
             adam_kernel};
  adam.traits.integer_inputs = 1u << 5; // the step counter
  table.push_back(std::move(adam));

  OpDef lr{"LearningRate",
           "lr = the schedule's learning rate at step `step`",
           1,
           1,
           {{"base_lr", AttrType::kFloat, std::nullopt, "peak learning rate"},
            {"min_lr", AttrType::kFloat, zero_f, "cosine: final learning rate"},
            {"schedule", AttrType::kString, AttrValue{std::string("constant")},
             "\"constant\" or \"cosine\""},
            {"total_steps", AttrType::kInt, zero_i, "cosine: step where the decay ends"},
            {"warmup_steps", AttrType::kInt, zero_i, "linear warm-up length"}},
           infer_learning_rate,
           scalar_cost,
           learning_rate_kernel};
  lr.traits.integer_inputs = 1u << 0; // the step counter
  table.push_back(std::move(lr));

  OpDef clip{"GlobalNormScale",
             "scale = min(1, max_norm / (global L2 norm of the inputs + 1e-6))",
             1,
             1 << 20,
             {{"max_norm", AttrType::kFloat, std::nullopt, "largest allowed global norm"}},
             infer_global_norm_scale,
             global_norm_scale_cost,
             global_norm_scale_kernel};
  table.push_back(std::move(clip));

  OpDef squares{"SumOfSquares",
                "(hi, lo) = the sum of every input element squared, in double, as two f32",
                1,
                1 << 20,
                {},
                infer_sum_of_squares,
                global_norm_scale_cost,
                sum_of_squares_kernel};
  table.push_back(std::move(squares));

  OpDef norm{"NormScale",
             "scale = min(1, max_norm / (sqrt(sum of the SumOfSquares inputs) + 1e-6))",
             1,
             1 << 20,
             {{"max_norm", AttrType::kFloat, std::nullopt, "largest allowed global norm"}},
             infer_norm_scale,
             scalar_cost,
             norm_scale_kernel};
  table.push_back(std::move(norm));
  // Every op of this family is once-per-step work, which the optimizer adds
  // after micro-batching and tensor parallelism.
  for (OpDef &def : table) {
    def.once_per_step = true;
    def.traits.batch = BatchRule::kNotForward;
    def.traits.shard = ShardRule::kReplicated;
  }
  return table;
}

} // namespace

std::span<const OpDef> optimizer_ops() {
  static const std::vector<OpDef> table = make_table();
  return table;
}

} // namespace strata::ops
