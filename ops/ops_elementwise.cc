// Elementwise ops: NumPy-broadcasting binary arithmetic, unary math and
// activations, Clip, Cast, Identity and Dropout (inference form).
//
// Binary kernels reduce any broadcast to one plan: the output's dimensions with
// size-1 dimensions dropped and neighbours merged wherever both inputs walk them
// as one run. The innermost merged dimension then reads each input either
// contiguously (stride 1) or as one repeated value (stride 0), so every inner loop
// is a plain loop the compiler vectorizes. Equal shapes and scalar operands
// collapse to a single such loop.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

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

// out[i] = f(x[i])
template <typename In, typename Out, typename F>
inline void map_unary(const In *__restrict x, Out *__restrict out, int64_t n, F f) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    for (int64_t j = 0; j < kBlock; ++j)
      out[i + j] = f(x[i + j]);
  for (; i < n; ++i)
    out[i] = f(x[i]);
}

// out[i] = f(a[i], b[i])
template <typename T, typename F>
inline void map_binary(const T *__restrict a, const T *__restrict b, T *__restrict out, int64_t n,
                       F f) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    for (int64_t j = 0; j < kBlock; ++j)
      out[i + j] = f(a[i + j], b[i + j]);
  for (; i < n; ++i)
    out[i] = f(a[i], b[i]);
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
    if constexpr (kOp == BinaryOp::kPow) run([](T x, T z) { return std::pow(x, z); });
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
  return TypeList{inputs[0]};
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

Status gelu_kernel(const KernelContext &context) {
  if (context.attrs().get_string("approximate") == "tanh") {
    // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    constexpr float kSqrt2OverPi = 0.7978845608028654f;
    return unary_f32(context, [](float v) {
      return 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
    });
  }
  // 0.5 x (1 + erf(x / sqrt 2))
  constexpr float kInvSqrt2 = 0.7071067811865476f;
  return unary_f32(context, [](float v) { return 0.5f * v * (1.0f + std::erf(v * kInvSqrt2)); });
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
  std::memcpy(context.outputs[0].data, context.inputs[0].data,
              static_cast<size_t>(context.inputs[0].type->size_bytes()));
  return Status::ok();
}

Status dropout_kernel(const KernelContext &context) {
  if (context.attrs().get_int("training") != 0)
    return unimplemented(context.def.name, ": training=1 (random mask) has no CPU kernel yet");
  return identity_kernel(context);
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

OpCost identity_cost(const Node &node, const OpDef &def, llvm::ArrayRef<TensorType> inputs,
                     llvm::ArrayRef<TensorType> outputs) {
  OpCost cost = elementwise_cost(node, def, inputs, outputs);
  cost.flops = 0;
  return cost;
}

// ---------------------------------------------------------------------------
// The table

OpDef binary(std::string_view name, std::string_view summary, CpuKernelFn kernel) {
  return OpDef{name, summary, 2, 2, {}, infer_binary_arith, nullptr, kernel};
}

OpDef unary(std::string_view name, std::string_view summary, CpuKernelFn kernel,
            InferFn infer = infer_float_unary) {
  return OpDef{name, summary, 1, 1, {}, infer, nullptr, kernel};
}

std::vector<OpDef> make_table() {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<OpDef> table;
  table.push_back(
      binary("Add", "C = A + B with NumPy broadcasting", binary_kernel<BinaryOp::kAdd>));
  table.push_back(
      binary("Sub", "C = A - B with NumPy broadcasting", binary_kernel<BinaryOp::kSub>));
  table.push_back(
      binary("Mul", "C = A * B with NumPy broadcasting", binary_kernel<BinaryOp::kMul>));
  table.push_back(binary("Div", "C = A / B with NumPy broadcasting (integers truncate)",
                         binary_kernel<BinaryOp::kDiv>));
  table.push_back(
      binary("Pow", "C = A ^ B with NumPy broadcasting", binary_kernel<BinaryOp::kPow>));
  table.push_back(unary("Neg", "Y = -X", neg_kernel, infer_neg));
  table.push_back(unary("Sqrt", "Y = sqrt(X)", sqrt_kernel));
  table.push_back(unary("Exp", "Y = e^X", exp_kernel));
  table.push_back(unary("Log", "Y = ln(X)", log_kernel));
  table.push_back(unary("Erf", "Y = erf(X)", erf_kernel));
  table.push_back(unary("Relu", "Y = max(X, 0)", relu_kernel));
  table.push_back(unary("Tanh", "Y = tanh(X)", tanh_kernel));
  table.push_back(unary("Sigmoid", "Y = 1 / (1 + e^-X)", sigmoid_kernel));
  OpDef gelu = unary("Gelu", "Gaussian error linear unit", gelu_kernel, infer_gelu);
  gelu.attrs = {{"approximate", AttrType::kString, AttrValue{std::string("none")},
                 "\"none\" (exact, with erf) or \"tanh\""}};
  table.push_back(std::move(gelu));
  OpDef clip = unary("Clip", "Y = min(max(X, min), max)", clip_kernel, infer_clip);
  clip.attrs = {{"max", AttrType::kFloat, AttrValue{kInf}, "upper bound"},
                {"min", AttrType::kFloat, AttrValue{-kInf}, "lower bound"}};
  table.push_back(std::move(clip));
  OpDef cast = unary("Cast", "Y = X converted to dtype `to`", cast_kernel, infer_cast);
  cast.attrs = {
      {"to", AttrType::kString, std::nullopt, "target dtype: f32, f16, bf16, i32, i64 or bool"}};
  table.push_back(std::move(cast));
  OpDef identity = unary("Identity", "Y = X", identity_kernel, infer_same);
  identity.cost = identity_cost;
  table.push_back(std::move(identity));
  OpDef dropout = unary("Dropout", "Y = X at inference; random masking in training", dropout_kernel,
                        infer_dropout);
  dropout.attrs = {{"ratio", AttrType::kFloat, AttrValue{0.5}, "probability of dropping"},
                   {"training", AttrType::kInt, AttrValue{int64_t{0}}, "1 in training mode"}};
  table.push_back(std::move(dropout));
  return table;
}

} // namespace

std::span<const OpDef> elementwise_ops() {
  static const std::vector<OpDef> table = make_table();
  return table;
}

} // namespace strata::ops
