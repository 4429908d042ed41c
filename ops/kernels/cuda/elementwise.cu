// Elementwise CUDA kernels: unary maps, broadcast binaries, broadcast copies,
// transposes, and the optimizer updates. Compiled with --fmad=false so each
// a * b + c rounds twice, as the CPU kernels do.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "ops/kernels/cuda/grid.cuh"
#include "ops/kernels/cuda/launch.h"
#include "ops/kernels/gelu_math.h"

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace strata::cuda {
namespace {

// Gelu's math is the CPU kernels' (ops/kernels/gelu_math.h): the same bits.
__device__ float gelu_erf(float x) { return ops::gelu::gelu_erf_f32(x); }
__device__ float gelu_erf_grad(float x) { return ops::gelu::gelu_erf_grad_f32(x); }
__device__ float gelu_tanh(float x) { return ops::gelu::gelu_tanh_f32(x); }
__device__ float gelu_tanh_grad(float x) { return ops::gelu::gelu_tanh_grad_f32(x); }

__device__ float apply_unary(Unary op, float v, float a, float b) {
  float r = v;
  switch (op) {
  case Unary::kRelu: r = v < 0.0f ? 0.0f : v; break;
  case Unary::kGeluErf: r = gelu_erf(v); break;
  case Unary::kGeluTanh: r = gelu_tanh(v); break;
  case Unary::kTanh: r = tanhf(v); break;
  case Unary::kSigmoid: r = 1.0f / (1.0f + expf(-v)); break;
  case Unary::kExp: r = expf(v); break;
  case Unary::kLog: r = logf(v); break;
  case Unary::kSqrt: r = sqrtf(v); break;
  case Unary::kNeg: r = -v; break;
  case Unary::kErf: r = erff(v); break;
  case Unary::kClip:
    r = v < a ? a : v;
    r = r > b ? b : r;
    break;
  case Unary::kScale: r = a * v; break;
  }
  return r;
}

__global__ void unary_kernel(Unary op, const float *x, float *y, int64_t n, float a, float b) {
  STRATA_GRID_STRIDE(i, n) { y[i] = apply_unary(op, x[i], a, b); }
}

// The offset of element `i` of `shape` in an operand read through `strides`.
__device__ int64_t offset_of(int64_t i, const Dims &shape, const Dims &strides) {
  int64_t offset = 0;
  for (int d = shape.rank - 1; d >= 0; --d) {
    const int64_t extent = shape.d[d];
    offset += (i % extent) * strides.d[d];
    i /= extent;
  }
  return offset;
}

__device__ float apply(Binary op, float l, float r, float a, float b) {
  switch (op) {
  case Binary::kAdd: return l + r;
  case Binary::kSub: return l - r;
  case Binary::kMul: return l * r;
  case Binary::kDiv: return l / r;
  case Binary::kPow: return powf(l, r);
  case Binary::kPowScalar: return r == 2.0f ? l * l : r == 1.0f ? l : powf(l, r);
  case Binary::kReluGrad: return r > 0.0f ? l : 0.0f;
  case Binary::kGeluErfGrad: return l * gelu_erf_grad(r);
  case Binary::kGeluTanhGrad: return l * gelu_tanh_grad(r);
  case Binary::kTanhGrad: return l * (1.0f - r * r);
  case Binary::kSigmoidGrad: return l * r * (1.0f - r);
  case Binary::kClipGrad: return r >= a && r <= b ? l : 0.0f;
  }
  return 0.0f;
}

__global__ void binary_kernel(Binary op, const float *lhs, Dims lhs_strides, const float *rhs,
                              Dims rhs_strides, float *out, Dims shape, int64_t n, float a,
                              float b) {
  STRATA_GRID_STRIDE(i, n) {
    out[i] = apply(op, lhs[offset_of(i, shape, lhs_strides)], rhs[offset_of(i, shape, rhs_strides)],
                   a, b);
  }
}

__global__ void fused_kernel(Fused p, float *out, int64_t n) {
  STRATA_GRID_STRIDE(i, n) {
    float v = 0.0f;
    for (int s = 0; s < p.steps; ++s) {
      const FusedStep &step = p.step[s];
      auto operand = [&](int k) {
        if (k < 0) return v;
        const int64_t at = p.mode[k] == 0   ? i
                           : p.mode[k] == 1 ? 0
                                            : offset_of(i, p.shape, p.strides[k]);
        return p.input[k][at];
      };
      v = step.binary ? apply(static_cast<Binary>(step.op), operand(step.lhs), operand(step.rhs),
                              step.a, step.b)
                      : apply_unary(static_cast<Unary>(step.op), operand(step.lhs), step.a, step.b);
    }
    out[i] = v;
  }
}

// Same-shape operands: no index arithmetic.
__global__ void binary_dense_kernel(Binary op, const float *lhs, const float *rhs, float *out,
                                    int64_t n, float a, float b) {
  STRATA_GRID_STRIDE(i, n) { out[i] = apply(op, lhs[i], rhs[i], a, b); }
}

template <typename T>
__global__ void binary_int_kernel(Binary op, const T *lhs, Dims lhs_strides, const T *rhs,
                                  Dims rhs_strides, T *out, Dims shape, int64_t n) {
  using U = std::make_unsigned_t<T>;
  STRATA_GRID_STRIDE(i, n) {
    const U l = static_cast<U>(lhs[offset_of(i, shape, lhs_strides)]);
    const U r = static_cast<U>(rhs[offset_of(i, shape, rhs_strides)]);
    out[i] = static_cast<T>(op == Binary::kAdd ? l + r : op == Binary::kSub ? l - r : l * r);
  }
}

__global__ void broadcast_kernel(const float *x, Dims strides, float *out, Dims shape, int64_t n) {
  STRATA_GRID_STRIDE(i, n) { out[i] = x[offset_of(i, shape, strides)]; }
}

template <typename T>
__global__ void strided_copy_kernel(const T *x, int64_t base, Dims strides, T *y, Dims shape,
                                    int64_t n) {
  STRATA_GRID_STRIDE(i, n) { y[i] = x[base + offset_of(i, shape, strides)]; }
}

template <typename T>
__global__ void strided_scatter_kernel(const T *x, Dims shape, T *y, int64_t base, Dims strides,
                                       int64_t n) {
  STRATA_GRID_STRIDE(i, n) { y[base + offset_of(i, shape, strides)] = x[i]; }
}

template <typename T>
__global__ void where_kernel(const uint8_t *cond, Dims cs, const T *x, Dims xs, const T *z, Dims zs,
                             T *y, Dims shape, int64_t n) {
  STRATA_GRID_STRIDE(i, n) {
    y[i] = cond[offset_of(i, shape, cs)] != 0 ? x[offset_of(i, shape, xs)]
                                              : z[offset_of(i, shape, zs)];
  }
}

// Element types by size: copies move bytes.
template <template <typename> class Launch, typename... Args>
cudaError_t by_size(int element_bytes, Args... args) {
  switch (element_bytes) {
  case 1: Launch<uint8_t>()(args...); break;
  case 2: Launch<uint16_t>()(args...); break;
  case 4: Launch<uint32_t>()(args...); break;
  case 8: Launch<uint64_t>()(args...); break;
  default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

template <typename T> struct StridedCopy {
  void operator()(const void *x, int64_t base, Dims strides, void *y, Dims shape, int64_t n,
                  cudaStream_t stream) {
    STRATA_LAUNCH(strided_copy_kernel, grid_for(n), kThreads, 0, stream)
    (static_cast<const T *>(x), base, strides, static_cast<T *>(y), shape, n);
  }
};
template <typename T> struct StridedScatter {
  void operator()(const void *x, Dims shape, void *y, int64_t base, Dims strides, int64_t n,
                  cudaStream_t stream) {
    STRATA_LAUNCH(strided_scatter_kernel, grid_for(n), kThreads, 0, stream)
    (static_cast<const T *>(x), shape, static_cast<T *>(y), base, strides, n);
  }
};
template <typename T> struct Where {
  void operator()(const uint8_t *cond, Dims cs, const void *x, Dims xs, const void *z, Dims zs,
                  void *y, Dims shape, int64_t n, cudaStream_t stream) {
    STRATA_LAUNCH(where_kernel, grid_for(n), kThreads, 0, stream)
    (cond, cs, static_cast<const T *>(x), xs, static_cast<const T *>(z), zs, static_cast<T *>(y),
     shape, n);
  }
};

// Float to integer: truncate toward zero, saturate, NaN to 0 (as the CPU).
template <typename I> __device__ I saturating(float v) {
  if (v != v) return 0;
  constexpr bool wide = sizeof(I) == 8;
  constexpr float limit = wide ? 9223372036854775808.0f : 2147483648.0f;
  if (v >= limit) return static_cast<I>(wide ? INT64_MAX : INT32_MAX);
  if (v <= -limit) return static_cast<I>(wide ? INT64_MIN : INT32_MIN);
  return static_cast<I>(v);
}

template <typename From, typename To> __device__ To convert(From v, Elem to) {
  if (to == Elem::kBool) return static_cast<To>(v != From(0));
  // A bool byte other than 0 or 1 still reads as true (1), as on the CPU.
  if constexpr (std::is_same_v<From, uint8_t>) return static_cast<To>(v != 0);
  if constexpr (std::is_same_v<From, float> && std::is_integral_v<To>) {
    return saturating<To>(v);
  } else {
    return static_cast<To>(v);
  }
}

template <typename From, typename To>
__global__ void cast_kernel(const From *x, To *y, Elem to, int64_t n) {
  STRATA_GRID_STRIDE(i, n) { y[i] = convert<From, To>(x[i], to); }
}

template <typename From>
cudaError_t cast_from(const From *x, void *y, Elem to, int64_t n, cudaStream_t stream) {
  switch (to) {
  case Elem::kF32:
    STRATA_LAUNCH(cast_kernel, grid_for(n), kThreads, 0, stream)(x, static_cast<float *>(y), to, n);
    break;
  case Elem::kI32:
    STRATA_LAUNCH(cast_kernel, grid_for(n), kThreads, 0, stream)
    (x, static_cast<int32_t *>(y), to, n);
    break;
  case Elem::kI64:
    STRATA_LAUNCH(cast_kernel, grid_for(n), kThreads, 0, stream)
    (x, static_cast<int64_t *>(y), to, n);
    break;
  case Elem::kBool:
    STRATA_LAUNCH(cast_kernel, grid_for(n), kThreads, 0, stream)
    (x, static_cast<uint8_t *>(y), to, n);
    break;
  }
  return cudaGetLastError();
}

__global__ void any_flag_kernel(const int *flags, int64_t n, int *any) {
  int set = 0;
  for (int64_t i = 0; i < n; ++i)
    set |= flags[i] != 0;
  *any = set;
}

template <typename T>
__global__ void guarded_copy_kernel(T *dst, const T *src, int64_t n, const int *any) {
  if (*any != 0) return;
  STRATA_GRID_STRIDE(i, n) { dst[i] = src[i]; }
}

// Dropout's mask hash (ops_elementwise.cc): splitmix64's finalizer over a
// counter keyed by (seed, step).
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

__device__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void dropout_kernel(const float *x, float *y, int64_t n, uint64_t seed,
                               const void *step_in, int step_bytes, uint64_t threshold,
                               float scale) {
  int64_t step = 0;
  if (step_in != nullptr)
    step = step_bytes == 4 ? static_cast<int64_t>(*static_cast<const int32_t *>(step_in))
                           : *static_cast<const int64_t *>(step_in);
  const uint64_t key = mix64(seed * kGolden + mix64(static_cast<uint64_t>(step) + kGolden));
  STRATA_GRID_STRIDE(i, n) {
    const uint64_t u = mix64(key + (static_cast<uint64_t>(i) + 1) * kGolden) >> 40;
    y[i] = u >= threshold ? x[i] * scale : 0.0f;
  }
}

int64_t count(const Dims &shape) {
  int64_t n = 1;
  for (int d = 0; d < shape.rank; ++d)
    n *= shape.d[d];
  return n;
}

bool dense(const Dims &strides, const Dims &shape) {
  int64_t expected = 1;
  for (int d = shape.rank - 1; d >= 0; --d) {
    if (shape.d[d] != 1 && strides.d[d] != expected) return false;
    expected *= shape.d[d];
  }
  return true;
}

__global__ void learning_rate_kernel(Schedule s, const int64_t *step_in, float *lr) {
  const int64_t step = *step_in > 0 ? *step_in : 0;
  double value = s.base_lr;
  if (step < s.warmup) {
    value = s.base_lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup);
  } else if (s.cosine) {
    double progress =
        static_cast<double>(step - s.warmup) / static_cast<double>(s.total - s.warmup);
    progress = progress < 0.0 ? 0.0 : (progress > 1.0 ? 1.0 : progress);
    value = s.min_lr + 0.5 * (s.base_lr - s.min_lr) * (1.0 + cos(3.141592653589793 * progress));
  }
  *lr = static_cast<float>(value);
}

__global__ void sgd_kernel(SgdParams p, const float *param, const float *grad, const float *lr,
                           const float *buf, const int64_t *step, float *new_param, float *new_buf,
                           int64_t n) {
  const float neg_lr = -*lr;
  const float keep = p.keep;
  const bool first = step != nullptr && *step == 0;
  STRATA_GRID_STRIDE(i, n) {
    float g = grad[i];
    if (p.weight_decay != 0.0f) g = g + p.weight_decay * param[i];
    if (buf == nullptr) {
      new_param[i] = param[i] + neg_lr * g;
      continue;
    }
    float b;
    if (first) {
      b = g;
    } else {
      b = buf[i] * p.momentum;
      b = b + keep * g;
    }
    new_buf[i] = b;
    const float d = p.nesterov ? g + p.momentum * b : b;
    new_param[i] = param[i] + neg_lr * d;
  }
}

__global__ void adam_kernel(AdamParams p, const float *param, const float *grad, const float *m,
                            const float *v, const float *lr_in, const int64_t *step_in,
                            float *new_param, float *new_m, float *new_v, int64_t n,
                            int *bad_step) {
  if (*step_in < 0) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *bad_step = 1;
    STRATA_GRID_STRIDE(i, n) {
      new_param[i] = param[i];
      new_m[i] = m[i];
      new_v[i] = v[i];
    }
    return;
  }
  // The scalars PyTorch computes in double, rounded to f32 once.
  const double lr = *lr_in;
  const double t = static_cast<double>(*step_in) + 1.0;
  const double bias_correction1 = 1.0 - pow(p.beta1, t);
  const double bias_correction2 = 1.0 - pow(p.beta2, t);
  const float neg_step_size = static_cast<float>(-(lr / bias_correction1));
  const float bias_correction2_sqrt = static_cast<float>(sqrt(bias_correction2));
  const float decay = static_cast<float>(1.0 - lr * p.weight_decay);
  const float wd = static_cast<float>(p.weight_decay);
  const float b1 = static_cast<float>(p.beta1), b2 = static_cast<float>(p.beta2);
  const float one_minus_b1 = static_cast<float>(1.0 - p.beta1);
  const float one_minus_b2 = static_cast<float>(1.0 - p.beta2);
  const float eps = static_cast<float>(p.epsilon);
  STRATA_GRID_STRIDE(i, n) {
    float pi = param[i];
    float g = grad[i];
    if (p.decoupled)
      pi = pi * decay;
    else if (wd != 0.0f)
      g = g + wd * pi;
    float mi = m[i] * b1;
    mi = mi + one_minus_b1 * g;
    float vi = v[i] * b2;
    vi = vi + one_minus_b2 * g * g;
    const float denom = sqrtf(vi) / bias_correction2_sqrt + eps;
    new_m[i] = mi;
    new_v[i] = vi;
    new_param[i] = pi + neg_step_size * mi / denom;
  }
}

} // namespace

cudaError_t unary(Unary op, const float *x, float *y, int64_t n, float a, float b,
                  cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  STRATA_LAUNCH(unary_kernel, grid_for(n), kThreads, 0, stream)(op, x, y, n, a, b);
  return cudaGetLastError();
}

cudaError_t binary(Binary op, const float *lhs, const Dims &lhs_strides, const float *rhs,
                   const Dims &rhs_strides, float *out, const Dims &shape, float a, float b,
                   cudaStream_t stream) {
  const int64_t n = count(shape);
  if (n == 0) return cudaSuccess;
  if (dense(lhs_strides, shape) && dense(rhs_strides, shape))
    STRATA_LAUNCH(binary_dense_kernel, grid_for(n), kThreads, 0, stream)
    (op, lhs, rhs, out, n, a, b);
  else
    STRATA_LAUNCH(binary_kernel, grid_for(n), kThreads, 0, stream)
    (op, lhs, lhs_strides, rhs, rhs_strides, out, shape, n, a, b);
  return cudaGetLastError();
}

cudaError_t binary_int(Binary op, const void *lhs, const Dims &lhs_strides, const void *rhs,
                       const Dims &rhs_strides, void *out, const Dims &shape, int bytes,
                       cudaStream_t stream) {
  const int64_t n = count(shape);
  if (n == 0) return cudaSuccess;
  if (op != Binary::kAdd && op != Binary::kSub && op != Binary::kMul) return cudaErrorInvalidValue;
  if (bytes == 4)
    STRATA_LAUNCH(binary_int_kernel, grid_for(n), kThreads, 0, stream)
    (op, static_cast<const int32_t *>(lhs), lhs_strides, static_cast<const int32_t *>(rhs),
     rhs_strides, static_cast<int32_t *>(out), shape, n);
  else if (bytes == 8)
    STRATA_LAUNCH(binary_int_kernel, grid_for(n), kThreads, 0, stream)
    (op, static_cast<const int64_t *>(lhs), lhs_strides, static_cast<const int64_t *>(rhs),
     rhs_strides, static_cast<int64_t *>(out), shape, n);
  else
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t broadcast_copy(const float *x, const Dims &strides, float *out, const Dims &shape,
                           cudaStream_t stream) {
  const int64_t n = count(shape);
  if (n == 0) return cudaSuccess;
  STRATA_LAUNCH(broadcast_kernel, grid_for(n), kThreads, 0, stream)(x, strides, out, shape, n);
  return cudaGetLastError();
}

cudaError_t transpose(const void *x, const Dims &in_shape, const int *perm, void *y,
                      int element_bytes, cudaStream_t stream) {
  Dims in_strides, out_shape, strides;
  in_strides.rank = out_shape.rank = strides.rank = in_shape.rank;
  int64_t stride = 1;
  for (int d = in_shape.rank - 1; d >= 0; --d) {
    in_strides.d[d] = stride;
    stride *= in_shape.d[d];
  }
  for (int i = 0; i < in_shape.rank; ++i) {
    out_shape.d[i] = in_shape.d[perm[i]];
    strides.d[i] = in_strides.d[perm[i]];
  }
  return strided_copy(x, 0, strides, y, out_shape, element_bytes, stream);
}

cudaError_t learning_rate(const Schedule &schedule, const int64_t *step, float *lr,
                          cudaStream_t stream) {
  STRATA_LAUNCH(learning_rate_kernel, 1, 1, 0, stream)(schedule, step, lr);
  return cudaGetLastError();
}

cudaError_t sgd(const SgdParams &p, const float *param, const float *grad, const float *lr,
                const float *buf, const int64_t *step, float *new_param, float *new_buf, int64_t n,
                cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  STRATA_LAUNCH(sgd_kernel, grid_for(n), kThreads, 0, stream)
  (p, param, grad, lr, buf, step, new_param, new_buf, n);
  return cudaGetLastError();
}

cudaError_t adam(const AdamParams &p, const float *param, const float *grad, const float *m,
                 const float *v, const float *lr, const int64_t *step, float *new_param,
                 float *new_m, float *new_v, int64_t n, int *bad_step, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  STRATA_LAUNCH(adam_kernel, grid_for(n), kThreads, 0, stream)
  (p, param, grad, m, v, lr, step, new_param, new_m, new_v, n, bad_step);
  return cudaGetLastError();
}

cudaError_t strided_copy(const void *x, int64_t base, const Dims &strides, void *y,
                         const Dims &shape, int element_bytes, cudaStream_t stream) {
  const int64_t n = count(shape);
  if (n == 0) return cudaSuccess;
  return by_size<StridedCopy>(element_bytes, x, base, strides, y, shape, n, stream);
}

cudaError_t strided_scatter(const void *x, const Dims &shape, void *y, int64_t base,
                            const Dims &strides, int element_bytes, cudaStream_t stream) {
  const int64_t n = count(shape);
  if (n == 0) return cudaSuccess;
  return by_size<StridedScatter>(element_bytes, x, shape, y, base, strides, n, stream);
}

cudaError_t where(const uint8_t *cond, const Dims &cond_strides, const void *x,
                  const Dims &x_strides, const void *z, const Dims &z_strides, void *y,
                  const Dims &shape, int element_bytes, cudaStream_t stream) {
  const int64_t n = count(shape);
  if (n == 0) return cudaSuccess;
  return by_size<Where>(element_bytes, cond, cond_strides, x, x_strides, z, z_strides, y, shape, n,
                        stream);
}

cudaError_t cast(const void *x, Elem from, void *y, Elem to, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (from) {
  case Elem::kF32: return cast_from(static_cast<const float *>(x), y, to, n, stream);
  case Elem::kI32: return cast_from(static_cast<const int32_t *>(x), y, to, n, stream);
  case Elem::kI64: return cast_from(static_cast<const int64_t *>(x), y, to, n, stream);
  case Elem::kBool: return cast_from(static_cast<const uint8_t *>(x), y, to, n, stream);
  }
  return cudaErrorInvalidValue;
}

namespace {
__global__ void to_bf16_kernel(const float *x, __nv_bfloat16 *y, int64_t n) {
  STRATA_GRID_STRIDE(i, n) { y[i] = __float2bfloat16_rn(x[i]); }
}
} // namespace

cudaError_t to_bf16(const float *x, uint16_t *y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  STRATA_LAUNCH(to_bf16_kernel, grid_for(n), kThreads, 0, stream)
  (x, reinterpret_cast<__nv_bfloat16 *>(y), n);
  return cudaGetLastError();
}

namespace {

// The power of two an operand of largest finite magnitude `amax` is scaled
// by: amax 2^s < 2^14 (every scaled element finite, whatever the operand's
// range); 0 for an operand without a finite non-zero element.
__device__ int f16_shift(unsigned amax_bits) {
  const float amax = __uint_as_float(amax_bits);
  if (!(amax > 0.0f) || !isfinite(amax)) return 0;
  int e = 0;
  frexpf(amax, &e); // amax = m 2^e, 0.5 <= m < 1
  return 14 - e;    // in [-115, 162]: x 2^s stays finite, as it is at most 2^14
}

// The shifts of A and B (`amax` holds both). The product is unscaled by
// alpha 2^-(s_A + s_B), which must stay a normal float: where tiny operands
// would push s_A + s_B past kF16MostShift, both shifts give way alike. Fully
// shifted, each operand's largest magnitude sits just under 2^14, 28 binades
// above f16's smallest normal, so an even cut keeps both in range longest:
// until their product is below 2^-128, beyond f32's own normal range.
constexpr int kF16MostShift = 100;
__device__ void f16_shifts(const unsigned *amax, int *s_a, int *s_b) {
  int a = f16_shift(amax[0]), b = f16_shift(amax[1]);
  const int excess = a + b - kF16MostShift;
  if (excess > 0) {
    a -= excess / 2;
    b -= excess - excess / 2;
  }
  *s_a = a;
  *s_b = b;
}

// Each block reduces its threads' maxima (warps, then the block's first
// warp) and raises the result once.
__global__ void f16_amax_kernel(const float *x, int64_t n, unsigned *amax_bits) {
  __shared__ float warps[kThreads / 32];
  float m = 0.0f;
  // Finite magnitudes only: an inf (or NaN) element is inf (NaN) whatever the
  // scale, and must not keep the operand's finite values from being scaled.
  STRATA_GRID_STRIDE(i, n) {
    const float a = fabsf(x[i]);
    if (a <= FLT_MAX) m = fmaxf(m, a);
  }
  for (int offset = 16; offset > 0; offset /= 2)
    m = fmaxf(m, __shfl_down_sync(0xffffffffu, m, offset));
  if ((threadIdx.x & 31) == 0) warps[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x >= 32) return;
  m = threadIdx.x < kThreads / 32 ? warps[threadIdx.x] : 0.0f;
  for (int offset = 16; offset > 0; offset /= 2)
    m = fmaxf(m, __shfl_down_sync(0xffffffffu, m, offset));
  if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(m));
}

__global__ void to_f16_scaled_kernel(const float *x, __half *y, int64_t n, const unsigned *amax,
                                     int operand) {
  int s_a = 0, s_b = 0;
  f16_shifts(amax, &s_a, &s_b);
  const int s = operand == 0 ? s_a : s_b;
  STRATA_GRID_STRIDE(i, n) { y[i] = __float2half_rn(ldexpf(x[i], s)); }
}

__global__ void f16_gemm_scalars_kernel(const unsigned *amax, float alpha, float beta,
                                        float *scalars) {
  int s_a = 0, s_b = 0;
  f16_shifts(amax, &s_a, &s_b);
  scalars[0] = ldexpf(alpha, -(s_a + s_b));
  scalars[1] = beta;
}

} // namespace

cudaError_t f16_amax(const float *x, int64_t n, unsigned *amax_bits, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  STRATA_LAUNCH(f16_amax_kernel, grid_for(n), kThreads, 0, stream)(x, n, amax_bits);
  return cudaGetLastError();
}

cudaError_t to_f16_scaled(const float *x, uint16_t *y, int64_t n, const unsigned *amax, int operand,
                          cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  STRATA_LAUNCH(to_f16_scaled_kernel, grid_for(n), kThreads, 0, stream)
  (x, reinterpret_cast<__half *>(y), n, amax, operand);
  return cudaGetLastError();
}

cudaError_t f16_gemm_scalars(const unsigned *amax, float alpha, float beta, float *scalars,
                             cudaStream_t stream) {
  STRATA_LAUNCH(f16_gemm_scalars_kernel, 1, 1, 0, stream)(amax, alpha, beta, scalars);
  return cudaGetLastError();
}

cudaError_t fused_elementwise(const Fused &program, float *out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (program.steps < 1 || program.steps > kMaxFused || program.inputs > kMaxFused)
    return cudaErrorInvalidValue;
  STRATA_LAUNCH(fused_kernel, grid_for(n), kThreads, 0, stream)(program, out, n);
  return cudaGetLastError();
}

cudaError_t any_flag(const int *flags, int64_t n, int *any, cudaStream_t stream) {
  STRATA_LAUNCH(any_flag_kernel, 1, 1, 0, stream)(flags, n, any);
  return cudaGetLastError();
}

cudaError_t guarded_copy(void *dst, const void *src, int64_t bytes, const int *any,
                         cudaStream_t stream) {
  if (bytes <= 0) return cudaSuccess;
  if (bytes % 4 == 0)
    STRATA_LAUNCH(guarded_copy_kernel, grid_for(bytes / 4), kThreads, 0, stream)
    (static_cast<uint32_t *>(dst), static_cast<const uint32_t *>(src), bytes / 4, any);
  else
    STRATA_LAUNCH(guarded_copy_kernel, grid_for(bytes), kThreads, 0, stream)
    (static_cast<uint8_t *>(dst), static_cast<const uint8_t *>(src), bytes, any);
  return cudaGetLastError();
}

cudaError_t dropout(const float *x, float *y, int64_t n, uint64_t seed, const void *step,
                    int step_bytes, uint64_t threshold, float scale, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  STRATA_LAUNCH(dropout_kernel, grid_for(n), kThreads, 0, stream)
  (x, y, n, seed, step, step_bytes, threshold, scale);
  return cudaGetLastError();
}

} // namespace strata::cuda
