// Elementwise ops: NumPy-broadcasting binary arithmetic, unary math and
// activations, Clip, Cast, Identity and Dropout, their gradient rules, and the
// backward helper ops those rules use (ReluGrad, TanhGrad, SigmoidGrad, GeluGrad,
// ClipGrad).
//
// Binary kernels reduce any broadcast to one plan: the output's dimensions with
// size-1 dimensions dropped and neighbours merged wherever both inputs walk them
// as one run. The innermost merged dimension then reads each input either
// contiguously (stride 1) or as one repeated value (stride 0), so every inner loop
// is a plain loop the compiler vectorizes. Equal shapes and scalar operands
// collapse to a single such loop.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ops/kernels/cpu/parallel.h"
#include "ops/kernels/gelu_math.h"
#include "ops/registry.h"

namespace strata::ops {
namespace {

using TypeList = llvm::SmallVector<TensorType, 2>;

// ---------------------------------------------------------------------------
// Broadcasting plan

struct BroadcastPlan {
  Shape dims;     // merged output dimensions, outermost first; never empty
  Shape stride_a; // element strides of A per merged dimension (0 = broadcast)
  Shape stride_b;
};

// Strides of `shape` aligned to the right against an output of rank `rank`:
// a dimension that is missing or of size 1 gets stride 0.
Shape aligned_strides(llvm::ArrayRef<int64_t> shape, size_t rank) {
  Shape strides(rank, 0);
  Shape own = contiguous_strides(shape);
  size_t offset = rank - shape.size();
  for (size_t i = 0; i < shape.size(); ++i)
    strides[offset + i] = shape[i] == 1 ? 0 : own[i];
  return strides;
}

BroadcastPlan plan_broadcast(llvm::ArrayRef<int64_t> a, llvm::ArrayRef<int64_t> b,
                             llvm::ArrayRef<int64_t> out) {
  Shape sa = aligned_strides(a, out.size());
  Shape sb = aligned_strides(b, out.size());
  BroadcastPlan plan;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == 1) continue;
    if (!plan.dims.empty() && plan.stride_a.back() == sa[i] * out[i] &&
        plan.stride_b.back() == sb[i] * out[i]) {
      plan.dims.back() *= out[i];
      plan.stride_a.back() = sa[i];
      plan.stride_b.back() = sb[i];
      continue;
    }
    plan.dims.push_back(out[i]);
    plan.stride_a.push_back(sa[i]);
    plan.stride_b.push_back(sb[i]);
  }
  if (plan.dims.empty()) {
    plan.dims.push_back(1);
    plan.stride_a.push_back(0);
    plan.stride_b.push_back(0);
  }
  return plan;
}

// Loops over contiguous arrays. Each runs blocks of kBlock elements with a fixed
// trip count and then the tail: with non-aliasing (__restrict) pointers, GCC
// vectorizes such blocks even at -O2, whose cost model refuses loops that would
// need a scalar epilogue.
constexpr int64_t kBlock = 8;

template <typename In, typename Out, typename F>
inline void map_unary_run(const In *__restrict x, Out *__restrict out, int64_t n, F f) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    for (int64_t j = 0; j < kBlock; ++j)
      out[i + j] = f(x[i + j]);
  for (; i < n; ++i)
    out[i] = f(x[i]);
}

// out[i] = f(x[i]), large maps split over the CPU threads.
template <typename In, typename Out, typename F>
inline void map_unary(const In *x, Out *out, int64_t n, F f) {
  cpu::parallel_for_items(n, 1, [&](int64_t begin, int64_t end) {
    map_unary_run(x + begin, out + begin, end - begin, f);
  });
}

template <typename T, typename F>
inline void map_binary_run(const T *__restrict a, const T *__restrict b, T *__restrict out,
                           int64_t n, F f) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    for (int64_t j = 0; j < kBlock; ++j)
      out[i + j] = f(a[i + j], b[i + j]);
  for (; i < n; ++i)
    out[i] = f(a[i], b[i]);
}

// out[i] = f(a[i], b[i]), large maps split over the CPU threads.
template <typename T, typename F>
inline void map_binary(const T *a, const T *b, T *out, int64_t n, F f) {
  cpu::parallel_for_items(n, 1, [&](int64_t begin, int64_t end) {
    map_binary_run(a + begin, b + begin, out + begin, end - begin, f);
  });
}

// out[i] = f(a[i * step_a], b[i * step_b]) for i < n, where each step is 0 or 1.
template <typename T, typename F>
inline void binary_run(const T *a, int64_t step_a, const T *b, int64_t step_b, T *out, int64_t n,
                       F f) {
  if (step_a == 1 && step_b == 1) {
    map_binary(a, b, out, n, f);
  } else if (step_a == 1) {
    const T bv = *b;
    map_unary(a, out, n, [bv, f](T v) { return f(v, bv); });
  } else if (step_b == 1) {
    const T av = *a;
    map_unary(b, out, n, [av, f](T v) { return f(av, v); });
  } else {
    const T value = f(*a, *b);
    std::fill(out, out + n, value);
  }
}

template <typename T, typename F>
void broadcast_binary(const T *a, llvm::ArrayRef<int64_t> shape_a, const T *b,
                      llvm::ArrayRef<int64_t> shape_b, T *out, llvm::ArrayRef<int64_t> shape_out,
                      F f) {
  int64_t total = num_elements(shape_out);
  if (total == 0) return;
  if (shape_a == shape_b) {
    binary_run(a, 1, b, 1, out, total, f);
    return;
  }
  BroadcastPlan plan = plan_broadcast(shape_a, shape_b, shape_out);
  const size_t rank = plan.dims.size();
  const int64_t inner = plan.dims.back();
  const int64_t step_a = plan.stride_a.back();
  const int64_t step_b = plan.stride_b.back();
  Shape index(rank, 0);
  int64_t offset_a = 0;
  int64_t offset_b = 0;
  for (int64_t done = 0; done < total; done += inner) {
    binary_run(a + offset_a, step_a, b + offset_b, step_b, out + done, inner, f);
    // Advance the odometer over the outer dimensions.
    for (size_t d = rank - 1; d-- > 0;) {
      offset_a += plan.stride_a[d];
      offset_b += plan.stride_b[d];
      if (++index[d] < plan.dims[d]) break;
      offset_a -= plan.stride_a[d] * plan.dims[d];
      offset_b -= plan.stride_b[d] * plan.dims[d];
      index[d] = 0;
    }
  }
}

Status no_kernel(const KernelContext &context, DType dtype) {
  return unimplemented(context.def.name, ": no CPU kernel for dtype ", dtype_name(dtype));
}

// Signed integer arithmetic that wraps around instead of overflowing.
template <typename T> inline T wrap_add(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
}
template <typename T> inline T wrap_sub(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
}
template <typename T> inline T wrap_mul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
}

enum class BinaryOp { kAdd, kSub, kMul, kDiv, kPow };

template <BinaryOp kOp, typename T> Status binary_typed(const KernelContext &context) {
  const ConstTensorView &a = context.inputs[0];
  const ConstTensorView &b = context.inputs[1];
  const TensorView &y = context.outputs[0];
  auto run = [&](auto f) {
    broadcast_binary(a.as<T>(), a.shape(), b.as<T>(), b.shape(), y.as<T>(), y.shape(), f);
  };
  if constexpr (std::is_floating_point_v<T>) {
    if constexpr (kOp == BinaryOp::kAdd) run([](T x, T z) { return x + z; });
    if constexpr (kOp == BinaryOp::kSub) run([](T x, T z) { return x - z; });
    if constexpr (kOp == BinaryOp::kMul) run([](T x, T z) { return x * z; });
    if constexpr (kOp == BinaryOp::kDiv) run([](T x, T z) { return x / z; });
    if constexpr (kOp == BinaryOp::kPow) {
      // A scalar exponent of 1 or 2 (a variance's square, its gradient's
      // slope): the exact products PyTorch uses too, not a general pow.
      const T e = b.num_elements() == 1 ? b.as<T>()[0] : T{0};
      if (b.num_elements() == 1 && e == T{2})
        run([](T x, T) { return x * x; });
      else if (b.num_elements() == 1 && e == T{1})
        run([](T x, T) { return x; });
      else
        run([](T x, T z) { return std::pow(x, z); });
    }
  } else {
    if constexpr (kOp == BinaryOp::kAdd) run([](T x, T z) { return wrap_add(x, z); });
    if constexpr (kOp == BinaryOp::kSub) run([](T x, T z) { return wrap_sub(x, z); });
    if constexpr (kOp == BinaryOp::kMul) run([](T x, T z) { return wrap_mul(x, z); });
    if constexpr (kOp == BinaryOp::kDiv) {
      const T *divisor = b.as<T>();
      for (int64_t i = 0, n = b.num_elements(); i < n; ++i)
        if (divisor[i] == 0)
          return invalid_argument(context.def.name, ": integer division by zero (input 1 element ",
                                  i, ")");
      // Truncates toward zero; the one overflowing case (min / -1) wraps.
      run([](T x, T z) { return z == -1 ? wrap_sub(T{0}, x) : static_cast<T>(x / z); });
    }
  }
  return Status::ok();
}

template <BinaryOp kOp> Status binary_kernel(const KernelContext &context) {
  DType dtype = context.inputs[0].dtype();
  switch (dtype) {
  case DType::kF32: return binary_typed<kOp, float>(context);
  case DType::kI32:
    if constexpr (kOp != BinaryOp::kPow) return binary_typed<kOp, int32_t>(context);
    break;
  case DType::kI64:
    if constexpr (kOp != BinaryOp::kPow) return binary_typed<kOp, int64_t>(context);
    break;
  default: break;
  }
  return no_kernel(context, dtype);
}

// ---------------------------------------------------------------------------
// Inference

TypeList one(DType dtype, Shape shape) { return TypeList{TensorType{dtype, std::move(shape)}}; }

Result<TypeList> infer_binary_arith(const Node &, const OpDef &def,
                                    llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_same_dtype(def, inputs));
  if (inputs[0].dtype == DType::kBool)
    return invalid_argument(def.name, ": input 0 must be numeric, got bool");
  if (def.name == "Pow") RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  Result<Shape> shape = broadcast_shapes(inputs[0].shape, inputs[1].shape);
  if (!shape.is_ok())
    return std::move(shape).take_status().with_context(str_cat(def.name, ": inputs 0 and 1"));
  return one(inputs[0].dtype, std::move(*shape));
}

Result<TypeList> infer_same(const Node &, const OpDef &, llvm::ArrayRef<TensorType> inputs) {
  return TypeList{inputs[0]};
}

Result<TypeList> infer_float_unary(const Node &, const OpDef &def,
                                   llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  return TypeList{inputs[0]};
}

Result<TypeList> infer_neg(const Node &, const OpDef &def, llvm::ArrayRef<TensorType> inputs) {
  if (inputs[0].dtype == DType::kBool)
    return invalid_argument(def.name, ": input 0 must be numeric, got bool");
  return TypeList{inputs[0]};
}

Result<TypeList> infer_gelu(const Node &node, const OpDef &def, llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  std::string approximate = AttrReader(node, def).get_string("approximate");
  if (approximate != "none" && approximate != "tanh")
    return invalid_argument(def.name,
                            ": attribute 'approximate' must be \"none\" or \"tanh\", got \"",
                            approximate, "\"");
  return TypeList{inputs[0]};
}

Result<TypeList> infer_clip(const Node &node, const OpDef &def, llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  AttrReader attrs(node, def);
  double lo = attrs.get_float("min");
  double hi = attrs.get_float("max");
  if (std::isnan(lo) || std::isnan(hi))
    return invalid_argument(def.name, ": attributes 'min' and 'max' must not be NaN");
  return TypeList{inputs[0]};
}

Result<TypeList> infer_cast(const Node &node, const OpDef &def, llvm::ArrayRef<TensorType> inputs) {
  std::string to = AttrReader(node, def).get_string("to");
  std::optional<DType> dtype = parse_dtype(to);
  if (!dtype)
    return invalid_argument(def.name, ": attribute 'to' = \"", to,
                            "\" is not a dtype (expected f32, f16, bf16, i32, i64 or bool)");
  return one(*dtype, inputs[0].shape);
}

Result<TypeList> infer_dropout(const Node &node, const OpDef &def,
                               llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  AttrReader attrs(node, def);
  double ratio = attrs.get_float("ratio");
  if (!(ratio >= 0.0 && ratio < 1.0))
    return invalid_argument(def.name, ": attribute 'ratio' = ", ratio, " must be in [0, 1)");
  int64_t training = attrs.get_int("training");
  if (training != 0 && training != 1)
    return invalid_argument(def.name, ": attribute 'training' = ", training, " must be 0 or 1");
  if (inputs.size() > 1 && (!is_integer(inputs[1].dtype) || inputs[1].num_elements() != 1))
    return invalid_argument(def.name, ": input 1 (step) must be an i32 or i64 scalar, got ",
                            inputs[1].to_string());
  return TypeList{inputs[0]};
}

// Backward helpers read (dY, V) where V is X or Y of the forward op: both of one
// floating type, which is also the output's.
Result<TypeList> infer_grad_pair(const Node &, const OpDef &def,
                                 llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  if (!(inputs[0] == inputs[1]))
    return invalid_argument(def.name, ": input 0 (dY) ", inputs[0].to_string(), " and input 1 ",
                            inputs[1].to_string(), " must have the same type");
  return TypeList{inputs[0]};
}

Result<TypeList> infer_gelu_grad(const Node &node, const OpDef &def,
                                 llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(infer_gelu(node, def, inputs).status());
  return infer_grad_pair(node, def, inputs);
}

Result<TypeList> infer_clip_grad(const Node &node, const OpDef &def,
                                 llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(infer_clip(node, def, inputs).status());
  return infer_grad_pair(node, def, inputs);
}

// ---------------------------------------------------------------------------
// Unary kernels

template <typename F> Status unary_f32(const KernelContext &context, F f) {
  const ConstTensorView &x = context.inputs[0];
  if (x.dtype() != DType::kF32) return no_kernel(context, x.dtype());
  map_unary(x.as<float>(), context.outputs[0].as<float>(), x.num_elements(), f);
  return Status::ok();
}

Status neg_kernel(const KernelContext &context) {
  const ConstTensorView &x = context.inputs[0];
  const TensorView &y = context.outputs[0];
  const int64_t n = x.num_elements();
  switch (x.dtype()) {
  case DType::kF32: return unary_f32(context, [](float v) { return -v; });
  case DType::kI32:
    map_unary(x.as<int32_t>(), y.as<int32_t>(), n,
              [](int32_t v) { return wrap_sub(int32_t{0}, v); });
    return Status::ok();
  case DType::kI64:
    map_unary(x.as<int64_t>(), y.as<int64_t>(), n,
              [](int64_t v) { return wrap_sub(int64_t{0}, v); });
    return Status::ok();
  default: return no_kernel(context, x.dtype());
  }
}

Status sqrt_kernel(const KernelContext &c) {
  return unary_f32(c, [](float v) { return std::sqrt(v); });
}
Status exp_kernel(const KernelContext &c) {
  return unary_f32(c, [](float v) { return std::exp(v); });
}
Status log_kernel(const KernelContext &c) {
  return unary_f32(c, [](float v) { return std::log(v); });
}
Status erf_kernel(const KernelContext &c) {
  return unary_f32(c, [](float v) { return std::erf(v); });
}
// NaN passes through (NaN < 0 is false).
Status relu_kernel(const KernelContext &c) {
  return unary_f32(c, [](float v) { return v < 0.0f ? 0.0f : v; });
}
Status tanh_kernel(const KernelContext &c) {
  return unary_f32(c, [](float v) { return std::tanh(v); });
}
// 1 / (1 + e^-x): e^-x overflows to +inf for very negative x, giving exactly 0.
Status sigmoid_kernel(const KernelContext &c) {
  return unary_f32(c, [](float v) { return 1.0f / (1.0f + std::exp(-v)); });
}

// ---------------------------------------------------------------------------
// Gelu kernels: the math is ops/kernels/gelu_math.h's, shared with CUDA.

using gelu::exp_f32;
using gelu::gelu_erf_f32;
using gelu::gelu_erf_grad_f32;
using gelu::gelu_tanh_f32;
using gelu::gelu_tanh_grad_f32;
#if defined(__SSE2__)
using gelu::Vf;
#endif

// out[i] = f(x[i]) (dy == nullptr) or dy[i] * f(x[i]), with f one of the templates
// above, passed as a generic lambda.
template <typename F>
inline void map_gelu(const float *__restrict x, const float *__restrict dy, float *__restrict out,
                     int64_t n, F f) {
#if defined(__SSE2__)
  auto block = [&](int64_t i, size_t bytes) {
    Vf v{}, g{};
    std::memcpy(&v, x + i, bytes);
    Vf y = f(v);
    if (dy != nullptr) {
      std::memcpy(&g, dy + i, bytes);
      y = g * y;
    }
    std::memcpy(out + i, &y, bytes);
  };
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    block(i, sizeof(Vf)); // constant size: plain vector loads and stores
  if (i < n) block(i, static_cast<size_t>(n - i) * sizeof(float)); // zero-padded tail
#else
  for (int64_t i = 0; i < n; ++i)
    out[i] = dy != nullptr ? dy[i] * f(x[i]) : f(x[i]);
#endif
}

Status gelu_kernel(const KernelContext &context) {
  const ConstTensorView &x = context.inputs[0];
  if (x.dtype() != DType::kF32) return no_kernel(context, x.dtype());
  float *out = context.outputs[0].as<float>();
  if (context.attrs().get_string("approximate") == "tanh")
    map_gelu(x.as<float>(), nullptr, out, x.num_elements(),
             [](auto v) { return gelu_tanh_f32(v); });
  else
    map_gelu(x.as<float>(), nullptr, out, x.num_elements(), [](auto v) { return gelu_erf_f32(v); });
  return Status::ok();
}

// min(max(x, lo), hi), written so that NaN passes through; lo > hi gives hi.
Status clip_kernel(const KernelContext &context) {
  AttrReader attrs = context.attrs();
  const float lo = static_cast<float>(attrs.get_float("min"));
  const float hi = static_cast<float>(attrs.get_float("max"));
  return unary_f32(context, [lo, hi](float v) {
    float y = v < lo ? lo : v;
    return y > hi ? hi : y;
  });
}

Status identity_kernel(const KernelContext &context) {
  // An empty tensor may have no buffer at all: memcpy takes no null pointer.
  if (const auto bytes = static_cast<size_t>(context.inputs[0].type->size_bytes()); bytes > 0)
    std::memcpy(context.outputs[0].data, context.inputs[0].data, bytes);
  return Status::ok();
}

// The training mask of Dropout. Element i of a run is kept when the top 24 bits
// of hash(seed, step, i), read as an integer u in [0, 2^24), satisfy
// u >= floor(ratio * 2^24); kept elements are scaled by 1 / (1 - ratio). The hash
// is counter-based, built from the splitmix64 finalizer `mix64`:
//   key  = mix64(seed * G + mix64(step + G))     (G = 0x9E3779B97F4A7C15)
//   hash = mix64(key + (i + 1) * G)
// so the mask depends only on (seed, step, i): not on the values, the dtype or how
// the work is split. A different step (the optional input 1) gives a fresh mask,
// and running Dropout with the same attributes and step on dY reproduces exactly
// the forward mask and scale, which is Dropout's gradient.
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Status dropout_kernel(const KernelContext &context) {
  AttrReader attrs = context.attrs();
  if (attrs.get_int("training") == 0) return identity_kernel(context);
  const ConstTensorView &x = context.inputs[0];
  if (x.dtype() != DType::kF32) return no_kernel(context, x.dtype());
  int64_t step = 0;
  if (context.inputs.size() > 1) {
    const ConstTensorView &s = context.inputs[1];
    step = s.dtype() == DType::kI32 ? int64_t{*s.as<int32_t>()} : *s.as<int64_t>();
  }
  const double ratio = attrs.get_float("ratio");
  const auto threshold = static_cast<uint64_t>(ratio * double(uint64_t{1} << 24));
  const auto scale = static_cast<float>(1.0 / (1.0 - ratio));
  const uint64_t key = mix64(static_cast<uint64_t>(attrs.get_int("seed")) * kGolden +
                             mix64(static_cast<uint64_t>(step) + kGolden));
  const float *in = x.as<float>();
  float *out = context.outputs[0].as<float>();
  for (int64_t i = 0, n = x.num_elements(); i < n; ++i) {
    const uint64_t u = mix64(key + (static_cast<uint64_t>(i) + 1) * kGolden) >> 40;
    out[i] = u >= threshold ? in[i] * scale : 0.0f;
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------
// Backward helper kernels: out[i] = f(dY[i], V[i]).

template <typename F> Status grad_pair_f32(const KernelContext &context, F f) {
  const ConstTensorView &dy = context.inputs[0];
  if (dy.dtype() != DType::kF32) return no_kernel(context, dy.dtype());
  map_binary(dy.as<float>(), context.inputs[1].as<float>(), context.outputs[0].as<float>(),
             dy.num_elements(), f);
  return Status::ok();
}

// dX = dY where X > 0 (the derivative at 0 is taken as 0).
Status relu_grad_kernel(const KernelContext &c) {
  return grad_pair_f32(c, [](float dy, float x) { return x > 0.0f ? dy : 0.0f; });
}
// dX = dY (1 - Y^2), from Y = tanh(X).
Status tanh_grad_kernel(const KernelContext &c) {
  return grad_pair_f32(c, [](float dy, float y) { return dy * (1.0f - y * y); });
}
// dX = dY Y (1 - Y), from Y = sigmoid(X).
Status sigmoid_grad_kernel(const KernelContext &c) {
  return grad_pair_f32(c, [](float dy, float y) { return dy * y * (1.0f - y); });
}

// dX = dY * Gelu'(X), inputs dY and X.
Status gelu_grad_kernel(const KernelContext &context) {
  const ConstTensorView &dy = context.inputs[0];
  if (dy.dtype() != DType::kF32) return no_kernel(context, dy.dtype());
  const float *x = context.inputs[1].as<float>();
  float *out = context.outputs[0].as<float>();
  if (context.attrs().get_string("approximate") == "tanh")
    map_gelu(x, dy.as<float>(), out, dy.num_elements(),
             [](auto v) { return gelu_tanh_grad_f32(v); });
  else
    map_gelu(x, dy.as<float>(), out, dy.num_elements(),
             [](auto v) { return gelu_erf_grad_f32(v); });
  return Status::ok();
}

// dX = dY where min <= X <= max (the bounds themselves pass the gradient), else 0.
Status clip_grad_kernel(const KernelContext &context) {
  AttrReader attrs = context.attrs();
  const float lo = static_cast<float>(attrs.get_float("min"));
  const float hi = static_cast<float>(attrs.get_float("max"));
  return grad_pair_f32(context,
                       [lo, hi](float dy, float x) { return x >= lo && x <= hi ? dy : 0.0f; });
}

// ---------------------------------------------------------------------------
// Cast
//
// Conversions: between floating types through f32 (rounding to nearest even);
// floating to integer truncates toward zero, saturates at the integer's range and
// maps NaN to 0; integer to integer wraps (two's complement); anything to bool is
// value != 0 (NaN is true); bool to anything is 0 or 1.

template <DType D> struct Storage;
template <> struct Storage<DType::kF32> { using type = float; };
template <> struct Storage<DType::kF16> { using type = uint16_t; };
template <> struct Storage<DType::kBF16> { using type = uint16_t; };
template <> struct Storage<DType::kI32> { using type = int32_t; };
template <> struct Storage<DType::kI64> { using type = int64_t; };
template <> struct Storage<DType::kBool> { using type = uint8_t; };

constexpr bool floating_dtype(DType d) {
  return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16;
}

template <DType D> inline float load_float(typename Storage<D>::type v) {
  if constexpr (D == DType::kF16)
    return f16_to_float(v);
  else if constexpr (D == DType::kBF16)
    return bf16_to_float(v);
  else
    return v;
}

template <DType D> inline typename Storage<D>::type store_float(float v) {
  if constexpr (D == DType::kF16)
    return float_to_f16(v);
  else if constexpr (D == DType::kBF16)
    return float_to_bf16(v);
  else
    return v;
}

// Truncates toward zero, saturating at I's range; NaN gives 0. Works for float
// and double sources.
template <typename I, typename F> inline I saturating_int(F v) {
  if (std::isnan(v)) return 0;
  // 2^(bits-1) is exact in F; anything at or past it (or at or below its
  // negation) saturates, and everything strictly between truncates into range.
  constexpr F kLimit = static_cast<F>(uint64_t{1} << (sizeof(I) * 8 - 1));
  if (v >= kLimit) return std::numeric_limits<I>::max();
  if (v <= -kLimit) return std::numeric_limits<I>::min();
  return static_cast<I>(v);
}

template <DType To, DType From>
inline typename Storage<To>::type cast_value(typename Storage<From>::type v) {
  using Out = typename Storage<To>::type;
  if constexpr (To == From) {
    if constexpr (To == DType::kBool)
      return v != 0;
    else
      return v;
  } else if constexpr (From == DType::kBool) {
    if constexpr (floating_dtype(To))
      return store_float<To>(v != 0 ? 1.0f : 0.0f);
    else
      return static_cast<Out>(v != 0);
  } else if constexpr (floating_dtype(From)) {
    float f = load_float<From>(v);
    if constexpr (To == DType::kBool)
      return f != 0.0f;
    else if constexpr (floating_dtype(To))
      return store_float<To>(f);
    else
      return saturating_int<Out>(f);
  } else { // From is an integer
    if constexpr (To == DType::kBool)
      return v != 0;
    else if constexpr (floating_dtype(To))
      return store_float<To>(static_cast<float>(v));
    else
      return static_cast<Out>(v);
  }
}

template <DType To, DType From> void cast_loop(const void *in, void *out, int64_t n) {
  using In = typename Storage<From>::type;
  map_unary(static_cast<const In *>(in), static_cast<typename Storage<To>::type *>(out), n,
            [](In v) { return cast_value<To, From>(v); });
}

template <DType To> void cast_from(DType from, const void *in, void *out, int64_t n) {
  switch (from) {
  case DType::kF32: return cast_loop<To, DType::kF32>(in, out, n);
  case DType::kF16: return cast_loop<To, DType::kF16>(in, out, n);
  case DType::kBF16: return cast_loop<To, DType::kBF16>(in, out, n);
  case DType::kI32: return cast_loop<To, DType::kI32>(in, out, n);
  case DType::kI64: return cast_loop<To, DType::kI64>(in, out, n);
  case DType::kBool: return cast_loop<To, DType::kBool>(in, out, n);
  }
}

Status cast_kernel(const KernelContext &context) {
  const ConstTensorView &x = context.inputs[0];
  const TensorView &y = context.outputs[0];
  const int64_t n = x.num_elements();
  switch (y.dtype()) {
  case DType::kF32: cast_from<DType::kF32>(x.dtype(), x.data, y.data, n); break;
  case DType::kF16: cast_from<DType::kF16>(x.dtype(), x.data, y.data, n); break;
  case DType::kBF16: cast_from<DType::kBF16>(x.dtype(), x.data, y.data, n); break;
  case DType::kI32: cast_from<DType::kI32>(x.dtype(), x.data, y.data, n); break;
  case DType::kI64: cast_from<DType::kI64>(x.dtype(), x.data, y.data, n); break;
  case DType::kBool: cast_from<DType::kBool>(x.dtype(), x.data, y.data, n); break;
  }
  return Status::ok();
}

// Where: Y = condition ? X : Z, the three broadcast together. Any element type
// for X and Z (copied as bytes).
Status where_kernel(const KernelContext &context) {
  const TensorView &y = context.outputs[0];
  const Shape &out = y.type->shape;
  const size_t rank = out.size();
  std::array<Shape, 3> strides;
  for (size_t k = 0; k < 3; ++k)
    strides[k] = aligned_strides(context.inputs[k].type->shape, rank);
  const size_t width = dtype_size(y.dtype());
  const auto *cond = reinterpret_cast<const uint8_t *>(context.inputs[0].data);
  const auto *x = reinterpret_cast<const std::byte *>(context.inputs[1].data);
  const auto *z = reinterpret_cast<const std::byte *>(context.inputs[2].data);
  auto *dst = reinterpret_cast<std::byte *>(y.data);
  const int64_t n = y.num_elements();
  Shape index(rank, 0);
  std::array<int64_t, 3> at = {0, 0, 0};
  for (int64_t e = 0; e < n; ++e) {
    const std::byte *src = cond[at[0]] ? x + at[1] * static_cast<int64_t>(width)
                                       : z + at[2] * static_cast<int64_t>(width);
    std::memcpy(dst + e * static_cast<int64_t>(width), src, width);
    // Advance the multi-index, innermost first.
    for (size_t d = rank; d-- > 0;) {
      ++index[d];
      for (size_t k = 0; k < 3; ++k)
        at[k] += strides[k][d];
      if (index[d] < out[d]) break;
      for (size_t k = 0; k < 3; ++k)
        at[k] -= strides[k][d] * out[d];
      index[d] = 0;
    }
  }
  return Status::ok();
}

Result<TypeList> infer_where(const Node &, const OpDef &def, llvm::ArrayRef<TensorType> inputs) {
  if (inputs[0].dtype != DType::kBool)
    return invalid_argument(def.name, ": input 0 (the condition) must be bool, got ",
                            inputs[0].to_string());
  if (inputs[1].dtype != inputs[2].dtype)
    return invalid_argument(def.name, ": inputs 1 and 2 must have one dtype, got ",
                            inputs[1].to_string(), " and ", inputs[2].to_string());
  Result<Shape> shape = broadcast_shapes(inputs[0].shape, inputs[1].shape);
  if (shape.is_ok()) shape = broadcast_shapes(*shape, inputs[2].shape);
  if (!shape.is_ok())
    return std::move(shape).take_status().with_context(str_cat(def.name, ": inputs"));
  return one(inputs[1].dtype, std::move(*shape));
}

// ---------------------------------------------------------------------------
// Gradient rules

// A scalar constant of `dtype` (it broadcasts against anything).
TensorId scalar_of(GradContext &c, double value, DType dtype, std::string_view what) {
  return c.builder.op1(
      "Constant", {},
      {{"dtype", std::string(dtype_name(dtype))}, {"value", std::vector<double>{value}}},
      c.grad_name(what));
}

DType dtype_of(GradContext &c, TensorId id) { return c.type(id).dtype; }

// Sets input i's gradient to `grad` summed down to that input's shape.
void set_reduced(GradContext &c, size_t i, TensorId grad, std::string_view what) {
  const Shape shape = c.type(c.input(i)).shape; // a copy: the graph grows below
  c.input_grads[i] = reduce_to_shape(c, grad, shape, what);
}

Status add_grad(GradContext &c) {
  const TensorId dy = c.output_grads[0];
  if (c.needs_input_grad[0]) set_reduced(c, 0, dy, "a");
  if (c.needs_input_grad[1]) set_reduced(c, 1, dy, "b");
  return Status::ok();
}

Status sub_grad(GradContext &c) {
  const TensorId dy = c.output_grads[0];
  if (c.needs_input_grad[0]) set_reduced(c, 0, dy, "a");
  if (c.needs_input_grad[1]) {
    set_reduced(c, 1, dy, "b");
    c.input_grads[1] = c.builder.op1("Neg", {c.input_grads[1]}, {}, c.grad_name("b.neg"));
  }
  return Status::ok();
}

// The gradient flows to X where the condition holds and to Z elsewhere.
Status where_grad(GradContext &c) {
  GraphBuilder &b = c.builder;
  const TensorId dy = c.output_grads[0];
  const TensorId zero = scalar_of(c, 0.0, c.type(dy).dtype, "zero");
  if (c.needs_input_grad[1])
    set_reduced(c, 1, b.op1("Where", {c.input(0), dy, zero}, {}, c.grad_name("x.where")), "x");
  if (c.needs_input_grad[2])
    set_reduced(c, 2, b.op1("Where", {c.input(0), zero, dy}, {}, c.grad_name("z.where")), "z");
  return Status::ok();
}

Status mul_grad(GradContext &c) {
  GraphBuilder &b = c.builder;
  const TensorId dy = c.output_grads[0];
  if (c.needs_input_grad[0])
    set_reduced(c, 0, b.op1("Mul", {dy, c.input(1)}, {}, c.grad_name("a.mul")), "a");
  if (c.needs_input_grad[1])
    set_reduced(c, 1, b.op1("Mul", {dy, c.input(0)}, {}, c.grad_name("b.mul")), "b");
  return Status::ok();
}

// Y = A / B: dA = dY / B; dB = -dY A / B^2 = -dY Y / B.
Status div_grad(GradContext &c) {
  GraphBuilder &b = c.builder;
  const TensorId dy = c.output_grads[0];
  if (c.needs_input_grad[0])
    set_reduced(c, 0, b.op1("Div", {dy, c.input(1)}, {}, c.grad_name("a.div")), "a");
  if (c.needs_input_grad[1]) {
    TensorId dy_y = b.op1("Mul", {dy, c.output(0)}, {}, c.grad_name("b.mul"));
    TensorId quotient = b.op1("Div", {dy_y, c.input(1)}, {}, c.grad_name("b.div"));
    set_reduced(c, 1, b.op1("Neg", {quotient}, {}, c.grad_name("b.neg")), "b");
  }
  return Status::ok();
}

// Y = A^B: dA = dY B A^(B-1); dB = dY Y ln(A) (NaN where A < 0, as the math says).
Status pow_grad(GradContext &c) {
  GraphBuilder &b = c.builder;
  const TensorId dy = c.output_grads[0];
  const DType dtype = dtype_of(c, c.input(0));
  if (c.needs_input_grad[0]) {
    TensorId one = scalar_of(c, 1.0, dtype, "a.one");
    TensorId exponent = b.op1("Sub", {c.input(1), one}, {}, c.grad_name("a.exponent"));
    TensorId power = b.op1("Pow", {c.input(0), exponent}, {}, c.grad_name("a.pow"));
    TensorId slope = b.op1("Mul", {c.input(1), power}, {}, c.grad_name("a.slope"));
    set_reduced(c, 0, b.op1("Mul", {dy, slope}, {}, c.grad_name("a.mul")), "a");
  }
  if (c.needs_input_grad[1]) {
    TensorId log = b.op1("Log", {c.input(0)}, {}, c.grad_name("b.log"));
    TensorId slope = b.op1("Mul", {c.output(0), log}, {}, c.grad_name("b.slope"));
    set_reduced(c, 1, b.op1("Mul", {dy, slope}, {}, c.grad_name("b.mul")), "b");
  }
  return Status::ok();
}

Status neg_grad(GradContext &c) {
  if (c.needs_input_grad[0])
    c.input_grads[0] = c.builder.op1("Neg", {c.output_grads[0]}, {}, c.grad_name("neg"));
  return Status::ok();
}

// Identity and inference-mode Dropout pass the gradient through.
Status pass_through_grad(GradContext &c) {
  if (c.needs_input_grad[0]) c.input_grads[0] = c.output_grads[0];
  return Status::ok();
}

// Y = sqrt(X): dX = dY / (2 Y).
Status sqrt_grad(GradContext &c) {
  if (!c.needs_input_grad[0]) return Status::ok();
  GraphBuilder &b = c.builder;
  TensorId half = scalar_of(c, 0.5, dtype_of(c, c.input(0)), "half");
  TensorId scaled = b.op1("Mul", {c.output_grads[0], half}, {}, c.grad_name("mul"));
  c.input_grads[0] = b.op1("Div", {scaled, c.output(0)}, {}, c.grad_name("div"));
  return Status::ok();
}

// Y = e^X: dX = dY Y.
Status exp_grad(GradContext &c) {
  if (c.needs_input_grad[0])
    c.input_grads[0] =
        c.builder.op1("Mul", {c.output_grads[0], c.output(0)}, {}, c.grad_name("mul"));
  return Status::ok();
}

// Y = ln X: dX = dY / X.
Status log_grad(GradContext &c) {
  if (c.needs_input_grad[0])
    c.input_grads[0] =
        c.builder.op1("Div", {c.output_grads[0], c.input(0)}, {}, c.grad_name("div"));
  return Status::ok();
}

// Y = erf(X): dX = dY (2 / sqrt(pi)) e^(-X^2).
Status erf_grad(GradContext &c) {
  if (!c.needs_input_grad[0]) return Status::ok();
  GraphBuilder &b = c.builder;
  const TensorId x = c.input(0);
  TensorId square = b.op1("Mul", {x, x}, {}, c.grad_name("square"));
  TensorId negated = b.op1("Neg", {square}, {}, c.grad_name("neg"));
  TensorId gauss = b.op1("Exp", {negated}, {}, c.grad_name("exp"));
  TensorId coefficient = scalar_of(c, 1.1283791670955126, dtype_of(c, x), "two_over_sqrt_pi");
  TensorId slope = b.op1("Mul", {gauss, coefficient}, {}, c.grad_name("slope"));
  c.input_grads[0] = b.op1("Mul", {c.output_grads[0], slope}, {}, c.grad_name("mul"));
  return Status::ok();
}

// dX = <helper>(dY, X or Y), copying the forward node's attributes.
template <const char *kHelper, bool kUsesOutput> Status helper_grad(GradContext &c) {
  if (!c.needs_input_grad[0]) return Status::ok();
  const TensorId v = kUsesOutput ? c.output(0) : c.input(0);
  c.input_grads[0] =
      c.builder.op1(kHelper, {c.output_grads[0], v}, c.node.attrs, c.grad_name(kHelper));
  return Status::ok();
}
constexpr char kReluGrad[] = "ReluGrad";
constexpr char kTanhGrad[] = "TanhGrad";
constexpr char kSigmoidGrad[] = "SigmoidGrad";
constexpr char kGeluGrad[] = "GeluGrad";
constexpr char kClipGrad[] = "ClipGrad";

// Between floating types the gradient is cast back; to or from an integer or bool
// nothing flows.
Status cast_grad(GradContext &c) {
  const DType from = dtype_of(c, c.input(0));
  const DType to = dtype_of(c, c.output(0));
  if (!c.needs_input_grad[0] || !is_floating(from) || !is_floating(to)) return Status::ok();
  c.input_grads[0] = c.builder.op1("Cast", {c.output_grads[0]},
                                   {{"to", std::string(dtype_name(from))}}, c.grad_name("cast"));
  return Status::ok();
}

// Training Dropout: the mask depends only on (seed, step, index), so Dropout with
// the same attributes and step applied to dY applies the same mask and scale.
Status dropout_grad(GradContext &c) {
  if (!c.needs_input_grad[0]) return Status::ok();
  if (c.attrs().get_int("training") == 0) return pass_through_grad(c);
  llvm::SmallVector<TensorId, 2> inputs{c.output_grads[0]};
  if (c.node.inputs.size() > 1) inputs.push_back(c.input(1));
  c.input_grads[0] = c.builder.op1("Dropout", inputs, c.node.attrs, c.grad_name("dropout"));
  return Status::ok();
}

OpCost identity_cost(const Node &node, const OpDef &def, llvm::ArrayRef<TensorType> inputs,
                     llvm::ArrayRef<TensorType> outputs) {
  OpCost cost = elementwise_cost(node, def, inputs, outputs);
  cost.flops = 0;
  return cost;
}

// ---------------------------------------------------------------------------
// The table

// A map fused chains may hold, which micro-batching and tensor parallelism
// split like its inputs.
constexpr OpTraits kForwardMap{.elementwise = Elementwise::kFusable,
                               .batch = BatchRule::kElementwise,
                               .shard = ShardRule::kElementwise};

OpDef binary(std::string_view name, std::string_view summary, CpuKernelFn kernel, GradFn grad,
             Linearity linearity = Linearity::kNone) {
  OpDef def{name, summary, 2, 2, {}, infer_binary_arith, nullptr, kernel, grad};
  def.traits = kForwardMap;
  def.traits.linearity = linearity;
  return def;
}

OpDef unary(std::string_view name, std::string_view summary, CpuKernelFn kernel, GradFn grad,
            InferFn infer = infer_float_unary) {
  OpDef def{name, summary, 1, 1, {}, infer, nullptr, kernel, grad};
  def.traits = kForwardMap;
  return def;
}

// A backward helper: (dY, V) -> dX, 2 FLOPs-ish per element (default cost).
// Fused chains hold it; only gradient rules add it.
OpDef grad_pair(std::string_view name, std::string_view summary, CpuKernelFn kernel,
                InferFn infer = infer_grad_pair) {
  OpDef def{name, summary, 2, 2, {}, infer, nullptr, kernel, nullptr};
  def.traits = {.elementwise = Elementwise::kFusable,
                .batch = BatchRule::kNotForward,
                .shard = ShardRule::kReplicated};
  return def;
}

std::vector<OpDef> make_table() {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<OpDef> table;
  table.push_back(binary("Add", "C = A + B with NumPy broadcasting", binary_kernel<BinaryOp::kAdd>,
                         add_grad, Linearity::kJoint));
  table.push_back(binary("Sub", "C = A - B with NumPy broadcasting", binary_kernel<BinaryOp::kSub>,
                         sub_grad, Linearity::kJoint));
  table.push_back(binary("Mul", "C = A * B with NumPy broadcasting", binary_kernel<BinaryOp::kMul>,
                         mul_grad, Linearity::kEachInput));
  table.push_back(binary("Div", "C = A / B with NumPy broadcasting (integers truncate)",
                         binary_kernel<BinaryOp::kDiv>, div_grad, Linearity::kFirstInput));
  table.push_back(
      binary("Pow", "C = A ^ B with NumPy broadcasting", binary_kernel<BinaryOp::kPow>, pow_grad));
  OpDef neg = unary("Neg", "Y = -X", neg_kernel, neg_grad, infer_neg);
  neg.traits.linearity = Linearity::kJoint;
  table.push_back(std::move(neg));
  table.push_back(OpDef{"Where",
                        "Y = X where the condition holds, else Z, broadcast together",
                        3,
                        3,
                        {},
                        infer_where,
                        nullptr,
                        where_kernel,
                        where_grad});
  table.back().traits = {.elementwise = Elementwise::kUnfused,
                         .batch = BatchRule::kElementwise,
                         .shard = ShardRule::kElementwise};
  table.push_back(unary("Sqrt", "Y = sqrt(X)", sqrt_kernel, sqrt_grad));
  table.push_back(unary("Exp", "Y = e^X", exp_kernel, exp_grad));
  table.push_back(unary("Log", "Y = ln(X)", log_kernel, log_grad));
  table.push_back(unary("Erf", "Y = erf(X)", erf_kernel, erf_grad));
  table.push_back(unary("Relu", "Y = max(X, 0)", relu_kernel, helper_grad<kReluGrad, false>));
  table.push_back(unary("Tanh", "Y = tanh(X)", tanh_kernel, helper_grad<kTanhGrad, true>));
  table.push_back(
      unary("Sigmoid", "Y = 1 / (1 + e^-X)", sigmoid_kernel, helper_grad<kSigmoidGrad, true>));
  const AttrSpec approximate{"approximate", AttrType::kString, AttrValue{std::string("none")},
                             "\"none\" (exact, with erf) or \"tanh\""};
  OpDef gelu = unary("Gelu", "Gaussian error linear unit", gelu_kernel,
                     helper_grad<kGeluGrad, false>, infer_gelu);
  gelu.attrs = {approximate};
  table.push_back(std::move(gelu));
  const std::vector<AttrSpec> clip_attrs = {
      {"max", AttrType::kFloat, AttrValue{kInf}, "upper bound"},
      {"min", AttrType::kFloat, AttrValue{-kInf}, "lower bound"}};
  OpDef clip = unary("Clip", "Y = min(max(X, min), max)", clip_kernel,
                     helper_grad<kClipGrad, false>, infer_clip);
  clip.attrs = clip_attrs;
  table.push_back(std::move(clip));
  OpDef cast = unary("Cast", "Y = X converted to dtype `to`", cast_kernel, cast_grad, infer_cast);
  cast.attrs = {
      {"to", AttrType::kString, std::nullopt, "target dtype: f32, f16, bf16, i32, i64 or bool"}};
  cast.traits.elementwise = Elementwise::kUnfused;
  table.push_back(std::move(cast));
  OpDef identity = unary("Identity", "Y = X", identity_kernel, pass_through_grad, infer_same);
  identity.cost = identity_cost;
  identity.traits.elementwise = Elementwise::kUnfused;
  identity.traits.linearity = Linearity::kJoint;
  table.push_back(std::move(identity));
  OpDef dropout = unary("Dropout",
                        "Y = X at inference; in training, X masked by hash(seed, step, index) "
                        "and scaled by 1 / (1 - ratio)",
                        dropout_kernel, dropout_grad, infer_dropout);
  dropout.max_inputs = 2;
  dropout.attrs = {{"ratio", AttrType::kFloat, AttrValue{0.5}, "probability of dropping"},
                   {"seed", AttrType::kInt, AttrValue{int64_t{0}}, "seed of the mask hash"},
                   {"training", AttrType::kInt, AttrValue{int64_t{0}}, "1 in training mode"}};
  // A piece would draw another mask (keyed by the flat index): never sharded.
  dropout.traits = {.elementwise = Elementwise::kUnfused,
                    .batch = BatchRule::kDropout,
                    .shard = ShardRule::kReplicated,
                    .integer_inputs = 1u << 1}; // the step counter
  table.push_back(std::move(dropout));

  // Backward helpers.
  table.push_back(
      grad_pair("ReluGrad", "dX = dY where X > 0, else 0 (inputs dY, X)", relu_grad_kernel));
  table.push_back(
      grad_pair("TanhGrad", "dX = dY * (1 - Y^2) (inputs dY, Y = tanh(X))", tanh_grad_kernel));
  table.push_back(grad_pair("SigmoidGrad", "dX = dY * Y * (1 - Y) (inputs dY, Y = sigmoid(X))",
                            sigmoid_grad_kernel));
  OpDef gelu_grad =
      grad_pair("GeluGrad", "dX = dY * Gelu'(X) (inputs dY, X)", gelu_grad_kernel, infer_gelu_grad);
  gelu_grad.attrs = {approximate};
  table.push_back(std::move(gelu_grad));
  OpDef clip_grad = grad_pair("ClipGrad", "dX = dY where min <= X <= max, else 0 (inputs dY, X)",
                              clip_grad_kernel, infer_clip_grad);
  clip_grad.attrs = clip_attrs;
  table.push_back(std::move(clip_grad));
  return table;
}

} // namespace

std::span<const OpDef> elementwise_ops() {
  static const std::vector<OpDef> table = make_table();
  return table;
}

} // namespace strata::ops
