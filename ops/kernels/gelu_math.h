// Gelu and its gradient (erf and tanh forms) in f32, from + - * /, compares
// and bit operations only: shared by the CPU kernels (ops_elementwise.cc; T is
// float or a 4-lane SSE vector) and the CUDA kernels (T = float). Neither
// contracts a * b + c into an FMA (x86-64's baseline has none; the CUDA
// kernels build with --fmad=false), so an input gives the same bits on both.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define STRATA_HD __host__ __device__
#else
#define STRATA_HD
#endif

namespace strata::ops::gelu {

// Vectorizable float math for the Gelu kernels
//
// std::erf / std::exp / std::tanh are opaque libm calls, so loops over them stay
// scalar, and GCC will not if-convert the selects a branch-free version needs
// (-ftrapping-math: it threads them into branches holding FP arithmetic). So the
// helpers are templates over T = float or, where SSE2 exists, a 4-lane GCC vector
// (Vf). On SSE2 targets every element, tail included, goes through the Vf code, so
// the same input always gives the same bits; other targets run the float code.
#if defined(__SSE2__) && !defined(__CUDACC__)
using Vf = float __attribute__((vector_size(16)));
using Vu = uint32_t __attribute__((vector_size(16)));
using Vi = int32_t __attribute__((vector_size(16)));
inline Vu as_bits(Vf v) {
  Vu u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}
inline Vf from_bits(Vu u) {
  Vf v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}
inline Vu shift_right_signed(Vu v) {
  Vi i;
  std::memcpy(&i, &v, sizeof i);
  i = i >> 1;
  std::memcpy(&v, &i, sizeof v);
  return v;
}
#endif
STRATA_HD inline uint32_t as_bits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
#endif
}
STRATA_HD inline float from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float v;
  std::memcpy(&v, &u, sizeof v);
  return v;
#endif
}
STRATA_HD inline uint32_t shift_right_signed(uint32_t v) {
  return static_cast<uint32_t>(static_cast<int32_t>(v) >> 1);
}
template <typename T> STRATA_HD inline T splat(float c) { return T{} + c; }
template <typename T> STRATA_HD inline T abs_f(T v) { return from_bits(as_bits(v) & 0x7fffffffu); }

// e^x to about 1 ulp on the whole float range (NaN in, NaN out).
// e^x = 2^n e^r with n = round(x / ln 2) and r = x - n ln 2, |r| <= ln2 / 2; ln 2 is
// split in two (Cody-Waite) so r is exact, and e^r is the Cephes expf minimax
// polynomial. n comes out of the rounding trick's bits (no float-to-int conversion,
// which NaN would make undefined), and 2^n is applied as two normal factors
// 2^(n>>1) 2^(n - n>>1), so results over- and underflow like the real e^x:
// x is clamped below at -104.5, where e^x already rounds to 0, and above at the
// largest float whose e^x is finite, larger x giving +inf by a select.
template <typename T> STRATA_HD inline T exp_f32(T x) {
  constexpr float kMax = 88.72283172607421875f; // ln(FLT_MAX) rounded down
  constexpr float kMin = -104.5f;
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f; // 1.5 * 2^23: adding it rounds to an integer
  // Written so that NaN fails both comparisons and passes through.
  T xc = x > kMax ? splat<T>(kMax) : x;
  xc = xc < kMin ? splat<T>(kMin) : xc;
  const T shifted = xc * kLog2e + kRound;
  const T n = shifted - kRound;
  const T r = (xc - n * kLn2Hi) - n * kLn2Lo;
  T p = 1.9875691500e-4f * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  // n in [-151, 129]; unsigned arithmetic, so even NaN's garbage n is defined.
  const auto ni = as_bits(shifted) - as_bits(kRound);
  const auto n1 = shift_right_signed(ni); // floor(n / 2)
  const auto n2 = ni - n1;
  const T y = p * from_bits((n1 + 127u) << 23) * from_bits((n2 + 127u) << 23);
  return x > kMax ? splat<T>(from_bits(0x7f800000u)) : y; // +inf
}

// erfc(|z|) by Abramowitz & Stegun 7.1.26: t P(t) e^{-z^2} with t = 1 / (1 + p|z|),
// absolute error <= 1.5e-7 (plus float rounding). Also returns e^{-z^2} in *gauss.
template <typename T> STRATA_HD inline T erfc_abs_f32(T z, T *gauss) {
  const T a = abs_f(z);
  const T t = 1.0f / (1.0f + 0.3275911f * a);
  const T e = exp_f32(-(a * a));
  T poly = 1.061405429f * t - 1.453152027f;
  poly = poly * t + 1.421413741f;
  poly = poly * t - 0.284496736f;
  poly = poly * t + 0.254829592f;
  *gauss = e;
  return poly * t * e;
}

// Beyond this |x| every Gelu variant is its limit in float: Gelu(x) = x or -0,
// Gelu'(x) = 1 or 0. Selecting the limit keeps +-inf (and huge |x|, where x^3
// overflows) from producing inf * 0 = NaN.
constexpr float kGeluSaturate = 9.0f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluTanhA = 0.044715f;

// Phi(x) = 0.5 erfc(-x / sqrt 2); for x < 0 that is the erfc term itself, so the
// left tail carries no cancellation. *gauss = e^{-x^2/2}.
template <typename T> STRATA_HD inline T normal_cdf_f32(T x, T *gauss) {
  const T q = erfc_abs_f32(x * kInvSqrt2, gauss);
  return x < 0.0f ? 0.5f * q : 1.0f - 0.5f * q;
}

// x Phi(x)
template <typename T> STRATA_HD inline T gelu_erf_f32(T x) {
  T gauss;
  const T y = x * normal_cdf_f32(x, &gauss);
  return x < -kGeluSaturate ? splat<T>(-0.0f) : y;
}

// d/dx x Phi(x) = Phi(x) + x phi(x)
template <typename T> STRATA_HD inline T gelu_erf_grad_f32(T x) {
  T gauss;
  const T cdf = normal_cdf_f32(x, &gauss);
  const T d = cdf + x * kInvSqrt2Pi * gauss;
  const T limit = x > 0.0f ? splat<T>(1.0f) : splat<T>(0.0f);
  return abs_f(x) > kGeluSaturate ? limit : d;
}

// 0.5 x (1 + tanh u) = x sigmoid(2u) = x / (1 + e^{-2u}), u = k (x + a x^3): no
// tanh and no cancellation near tanh u = -1.
template <typename T> STRATA_HD inline T gelu_tanh_f32(T x) {
  const T u = kSqrt2OverPi * (x + kGeluTanhA * x * x * x);
  const T y = x / (1.0f + exp_f32(-2.0f * u));
  return x < -kGeluSaturate ? splat<T>(-0.0f) : y;
}

// With s = sigmoid(2u) = 1 / (1 + e), e = e^{-2u}: 0.5 (1 + tanh u) = s and
// 0.5 (1 - tanh^2 u) = 2 s (1 - s) = 2 s^2 e, so
// d/dx = s + 2 x s^2 e k (1 + 3 a x^2).
template <typename T> STRATA_HD inline T gelu_tanh_grad_f32(T x) {
  const T u = kSqrt2OverPi * (x + kGeluTanhA * x * x * x);
  const T e = exp_f32(-2.0f * u);
  const T s = 1.0f / (1.0f + e);
  const T du = kSqrt2OverPi * (1.0f + 3.0f * kGeluTanhA * x * x);
  const T d = s + 2.0f * x * (s * s * e) * du;
  const T limit = x > 0.0f ? splat<T>(1.0f) : splat<T>(0.0f);
  return abs_f(x) > kGeluSaturate ? limit : d;
}

} // namespace strata::ops::gelu
