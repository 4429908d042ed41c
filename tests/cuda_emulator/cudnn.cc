// cuDNN's descriptor API on the host, for the CUDA emulator (see
// cuda_emulator.h): the convolutions, pooling and batch norm strata calls, in
// NCHW f32, computed in double on the handle's stream. Convolution shapes
// that do not fit are CUDNN_STATUS_BAD_PARAM, and the algorithm queries
// offer a non-deterministic algorithm, one that needs more workspace than
// any, and a usable one, in that order: running either of the first two is
// refused, so the caller's choice is checked.
#include <cudnn.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tests/cuda_emulator/cuda_emulator.h"
#include "tests/cuda_emulator/state.h"

namespace strata::cuda_emulator {
namespace {

struct Handle {
  cudaStream_t stream = nullptr;
};
struct Tensor {
  int n = 0, c = 0, h = 0, w = 0;
  size_t size() const { return static_cast<size_t>(n) * c * h * w; }
};
struct Filter {
  int k = 0, c = 0, h = 0, w = 0;
};
struct Conv {
  int pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1, dil_h = 1, dil_w = 1, groups = 1;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};
struct Pool {
  cudnnPoolingMode_t mode = CUDNN_POOLING_MAX;
  int kh = 1, kw = 1, pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1;
};

template <typename T, typename D> T &of(D descriptor) { return *reinterpret_cast<T *>(descriptor); }

cudnnStatus_t bad(std::string message) {
  detail::note("cuDNN: " + message);
  return CUDNN_STATUS_BAD_PARAM;
}

// Y's shape for X, W and the convolution; "" if they fit.
std::string conv_error(const Tensor &x, const Filter &w, const Conv &v, const Tensor &y) {
  if (v.groups < 1 || x.c != w.c * v.groups || w.k % v.groups != 0)
    return "channels do not split into the groups";
  const int oh = (x.h + 2 * v.pad_h - v.dil_h * (w.h - 1) - 1) / v.stride_h + 1;
  const int ow = (x.w + 2 * v.pad_w - v.dil_w * (w.w - 1) - 1) / v.stride_w + 1;
  if (y.n != x.n || y.c != w.k || y.h != oh || y.w != ow)
    return "Y is " + std::to_string(y.n) + "x" + std::to_string(y.c) + "x" + std::to_string(y.h) +
           "x" + std::to_string(y.w) + ", the convolution gives " + std::to_string(x.n) + "x" +
           std::to_string(w.k) + "x" + std::to_string(oh) + "x" + std::to_string(ow);
  return "";
}

// Calls f(n, m, oy, ox, ci, ky, kx, x index, w index) for every product term
// of the convolution (cross-correlation, groups) that falls inside X.
template <typename F>
void each_term(const Tensor &x, const Filter &w, const Conv &v, const Tensor &y, F f) {
  const int per_group_out = w.k / v.groups;
  for (int n = 0; n < y.n; ++n)
    for (int m = 0; m < y.c; ++m) {
      const int g = m / per_group_out;
      for (int oy = 0; oy < y.h; ++oy)
        for (int ox = 0; ox < y.w; ++ox)
          for (int ci = 0; ci < w.c; ++ci)
            for (int ky = 0; ky < w.h; ++ky) {
              const int iy = oy * v.stride_h - v.pad_h + ky * v.dil_h;
              if (iy < 0 || iy >= x.h) continue;
              for (int kx = 0; kx < w.w; ++kx) {
                const int ix = ox * v.stride_w - v.pad_w + kx * v.dil_w;
                if (ix < 0 || ix >= x.w) continue;
                const size_t xi =
                    ((static_cast<size_t>(n) * x.c + g * w.c + ci) * x.h + iy) * x.w + ix;
                const size_t wi = ((static_cast<size_t>(m) * w.c + ci) * w.h + ky) * w.w + kx;
                const size_t yi = ((static_cast<size_t>(n) * y.c + m) * y.h + oy) * y.w + ox;
                f(xi, wi, yi);
              }
            }
    }
}

// out = alpha * value + beta * out (beta 0: out not read), per element.
void blend(float *out, const std::vector<double> &value, float alpha, float beta) {
  for (size_t i = 0; i < value.size(); ++i)
    out[i] = static_cast<float>(alpha * value[i] + (beta == 0 ? 0.0 : beta * out[i]));
}

// The offers of an algorithm query, in cuDNN's order (fastest first): a
// non-deterministic algorithm, one that needs more workspace than any run
// has, and `usable`; running either of the first two is refused (check_algo).
template <typename Perf, typename Algo>
void offer(Perf *perf, int requested, int *returned, Algo racy, Algo greedy, Algo usable) {
  const Perf offers[3] = {
      {racy, CUDNN_STATUS_SUCCESS, 0.1f, 0, CUDNN_NON_DETERMINISTIC, CUDNN_FMA_MATH, {}},
      {greedy,
       CUDNN_STATUS_SUCCESS,
       0.2f,
       size_t{1} << 50,
       CUDNN_DETERMINISTIC,
       CUDNN_FMA_MATH,
       {}},
      {usable, CUDNN_STATUS_SUCCESS, 0.3f, 0, CUDNN_DETERMINISTIC, CUDNN_FMA_MATH, {}}};
  *returned = std::min(requested, 3);
  for (int i = 0; i < *returned; ++i)
    perf[i] = offers[i];
}

template <typename Algo> cudnnStatus_t check_algo(Algo chosen, Algo usable) {
  return chosen == usable ? CUDNN_STATUS_SUCCESS
                          : bad("an algorithm the query offered as non-deterministic or needing "
                                "more workspace than given");
}

cudnnStatus_t run(cudnnHandle_t handle, const char *what, std::function<void()> work) {
  const cudaError_t error = enqueue(of<Handle>(handle).stream, what, std::move(work));
  return error == cudaSuccess ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_EXECUTION_FAILED;
}

// The window of output (oy, ox) clipped to X: [y0, y1) x [x0, x1), and its
// size with padding.
struct Window {
  int y0, y1, x0, x1, padded;
};
Window window(const Pool &p, const Tensor &x, int oy, int ox) {
  const int ys = oy * p.stride_h - p.pad_h, xs = ox * p.stride_w - p.pad_w;
  Window w{std::max(ys, 0), std::min(ys + p.kh, x.h), std::max(xs, 0), std::min(xs + p.kw, x.w),
           p.kh * p.kw};
  return w;
}

// A descriptor or handle: a T behind cuDNN's opaque pointer.
template <typename T, typename D> cudnnStatus_t make(D *d) {
  *d = reinterpret_cast<D>(new T);
  return CUDNN_STATUS_SUCCESS;
}
template <typename T, typename D> cudnnStatus_t drop(D d) {
  delete reinterpret_cast<T *>(d);
  return CUDNN_STATUS_SUCCESS;
}

} // namespace
} // namespace strata::cuda_emulator

using namespace strata::cuda_emulator;

extern "C" {

const char *cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
  case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS (emulated)";
  case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM (emulated)";
  case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED (emulated)";
  case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED (emulated)";
  default: return "a cuDNN error (emulated)";
  }
}

cudnnStatus_t cudnnCreate(cudnnHandle_t *d) { return make<Handle>(d); }
cudnnStatus_t cudnnDestroy(cudnnHandle_t d) { return drop<Handle>(d); }
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  of<Handle>(handle).stream = stream;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *d) { return make<Tensor>(d); }
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d) { return drop<Tensor>(d); }
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t format,
                                         cudnnDataType_t type, int n, int c, int h, int w) {
  if (format != CUDNN_TENSOR_NCHW || type != CUDNN_DATA_FLOAT)
    return bad("a tensor other than NCHW f32 (not emulated)");
  if (n <= 0 || c <= 0 || h <= 0 || w <= 0) return bad("a tensor dim below 1");
  of<Tensor>(d) = {n, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *d) { return make<Filter>(d); }
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d) { return drop<Filter>(d); }
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t type,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w) {
  if (format != CUDNN_TENSOR_NCHW || type != CUDNN_DATA_FLOAT)
    return bad("a filter other than NCHW f32 (not emulated)");
  if (k <= 0 || c <= 0 || h <= 0 || w <= 0) return bad("a filter dim below 1");
  of<Filter>(d) = {k, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *d) {
  return make<Conv>(d);
}
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d) {
  return drop<Conv>(d);
}
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int pad_h, int pad_w,
                                              int u, int v, int dil_h, int dil_w,
                                              cudnnConvolutionMode_t mode, cudnnDataType_t type) {
  if (mode != CUDNN_CROSS_CORRELATION || type != CUDNN_DATA_FLOAT)
    return bad("a convolution other than f32 cross-correlation (not emulated)");
  if (pad_h < 0 || pad_w < 0 || u < 1 || v < 1 || dil_h < 1 || dil_w < 1)
    return bad("negative padding, or a stride or dilation below 1");
  Conv &c = of<Conv>(d);
  c.pad_h = pad_h, c.pad_w = pad_w, c.stride_h = u, c.stride_w = v, c.dil_h = dil_h,
  c.dil_w = dil_w;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t d, int groups) {
  if (groups < 1) return bad("a group count below 1");
  of<Conv>(d).groups = groups;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t math) {
  of<Conv>(d).math = math;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t, cudnnTensorDescriptor_t x,
                                                     cudnnFilterDescriptor_t w,
                                                     cudnnConvolutionDescriptor_t v,
                                                     cudnnTensorDescriptor_t y, int requested,
                                                     int *returned,
                                                     cudnnConvolutionFwdAlgoPerf_t *perf) {
  const std::string error = conv_error(of<Tensor>(x), of<Filter>(w), of<Conv>(v), of<Tensor>(y));
  if (!error.empty()) return bad(error);
  offer(perf, requested, returned, CUDNN_CONVOLUTION_FWD_ALGO_FFT, CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
        CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t, cudnnFilterDescriptor_t w,
                                                          cudnnTensorDescriptor_t dy,
                                                          cudnnConvolutionDescriptor_t v,
                                                          cudnnTensorDescriptor_t dx, int requested,
                                                          int *returned,
                                                          cudnnConvolutionBwdDataAlgoPerf_t *perf) {
  const std::string error = conv_error(of<Tensor>(dx), of<Filter>(w), of<Conv>(v), of<Tensor>(dy));
  if (!error.empty()) return bad(error);
  offer(perf, requested, returned, CUDNN_CONVOLUTION_BWD_DATA_ALGO_0,
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t v, cudnnFilterDescriptor_t dw, int requested, int *returned,
    cudnnConvolutionBwdFilterAlgoPerf_t *perf) {
  const std::string error = conv_error(of<Tensor>(x), of<Filter>(dw), of<Conv>(v), of<Tensor>(dy));
  if (!error.empty()) return bad(error);
  offer(perf, requested, returned, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void *alpha,
                                      cudnnTensorDescriptor_t xd, const void *x,
                                      cudnnFilterDescriptor_t wd, const void *w,
                                      cudnnConvolutionDescriptor_t vd,
                                      cudnnConvolutionFwdAlgo_t algo, void *, size_t,
                                      const void *beta, cudnnTensorDescriptor_t yd, void *y) {
  const Tensor tx = of<Tensor>(xd), ty = of<Tensor>(yd);
  const Filter tw = of<Filter>(wd);
  const Conv v = of<Conv>(vd);
  const std::string error = conv_error(tx, tw, v, ty);
  if (!error.empty()) return bad(error);
  if (cudnnStatus_t refused = check_algo(algo, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM))
    return refused;
  const float a = *static_cast<const float *>(alpha), b = *static_cast<const float *>(beta);
  return run(handle, "cudnnConvolutionForward", [=] {
    std::vector<double> sum(ty.size(), 0.0);
    const auto *xs = static_cast<const float *>(x), *ws = static_cast<const float *>(w);
    each_term(tx, tw, v, ty, [&](size_t xi, size_t wi, size_t yi) {
      sum[yi] += static_cast<double>(xs[xi]) * ws[wi];
    });
    blend(static_cast<float *>(y), sum, a, b);
  });
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void *alpha,
                                           cudnnFilterDescriptor_t wd, const void *w,
                                           cudnnTensorDescriptor_t dyd, const void *dy,
                                           cudnnConvolutionDescriptor_t vd,
                                           cudnnConvolutionBwdDataAlgo_t algo, void *, size_t,
                                           const void *beta, cudnnTensorDescriptor_t dxd,
                                           void *dx) {
  const Tensor tx = of<Tensor>(dxd), ty = of<Tensor>(dyd);
  const Filter tw = of<Filter>(wd);
  const Conv v = of<Conv>(vd);
  const std::string error = conv_error(tx, tw, v, ty);
  if (!error.empty()) return bad(error);
  if (cudnnStatus_t refused = check_algo(algo, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1)) return refused;
  const float a = *static_cast<const float *>(alpha), b = *static_cast<const float *>(beta);
  return run(handle, "cudnnConvolutionBackwardData", [=] {
    std::vector<double> sum(tx.size(), 0.0);
    const auto *dys = static_cast<const float *>(dy), *ws = static_cast<const float *>(w);
    each_term(tx, tw, v, ty, [&](size_t xi, size_t wi, size_t yi) {
      sum[xi] += static_cast<double>(dys[yi]) * ws[wi];
    });
    blend(static_cast<float *>(dx), sum, a, b);
  });
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void *alpha,
                                             cudnnTensorDescriptor_t xd, const void *x,
                                             cudnnTensorDescriptor_t dyd, const void *dy,
                                             cudnnConvolutionDescriptor_t vd,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void *, size_t,
                                             const void *beta, cudnnFilterDescriptor_t dwd,
                                             void *dw) {
  const Tensor tx = of<Tensor>(xd), ty = of<Tensor>(dyd);
  const Filter tw = of<Filter>(dwd);
  const Conv v = of<Conv>(vd);
  const std::string error = conv_error(tx, tw, v, ty);
  if (!error.empty()) return bad(error);
  if (cudnnStatus_t refused = check_algo(algo, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1)) return refused;
  const float a = *static_cast<const float *>(alpha), b = *static_cast<const float *>(beta);
  return run(handle, "cudnnConvolutionBackwardFilter", [=] {
    std::vector<double> sum(static_cast<size_t>(tw.k) * tw.c * tw.h * tw.w, 0.0);
    const auto *dys = static_cast<const float *>(dy), *xs = static_cast<const float *>(x);
    each_term(tx, tw, v, ty, [&](size_t xi, size_t wi, size_t yi) {
      sum[wi] += static_cast<double>(dys[yi]) * xs[xi];
    });
    blend(static_cast<float *>(dw), sum, a, b);
  });
}

cudnnStatus_t cudnnAddTensor(cudnnHandle_t handle, const void *alpha, cudnnTensorDescriptor_t ad,
                             const void *a, const void *beta, cudnnTensorDescriptor_t cd, void *c) {
  const Tensor ta = of<Tensor>(ad), tc = of<Tensor>(cd);
  // A is broadcast over C: each dim equal or 1.
  if ((ta.n != tc.n && ta.n != 1) || (ta.c != tc.c && ta.c != 1) || (ta.h != tc.h && ta.h != 1) ||
      (ta.w != tc.w && ta.w != 1))
    return bad("A does not broadcast over C");
  const float s = *static_cast<const float *>(alpha), t = *static_cast<const float *>(beta);
  return run(handle, "cudnnAddTensor", [=] {
    const auto *as = static_cast<const float *>(a);
    auto *cs = static_cast<float *>(c);
    for (int n = 0; n < tc.n; ++n)
      for (int ch = 0; ch < tc.c; ++ch)
        for (int h = 0; h < tc.h; ++h)
          for (int w = 0; w < tc.w; ++w) {
            const size_t ai =
                ((static_cast<size_t>(ta.n == 1 ? 0 : n) * ta.c + (ta.c == 1 ? 0 : ch)) * ta.h +
                 (ta.h == 1 ? 0 : h)) *
                    ta.w +
                (ta.w == 1 ? 0 : w);
            float &out = cs[((static_cast<size_t>(n) * tc.c + ch) * tc.h + h) * tc.w + w];
            out =
                static_cast<float>(static_cast<double>(s) * as[ai] + static_cast<double>(t) * out);
          }
  });
}

cudnnStatus_t cudnnCreatePoolingDescriptor(cudnnPoolingDescriptor_t *d) { return make<Pool>(d); }
cudnnStatus_t cudnnDestroyPoolingDescriptor(cudnnPoolingDescriptor_t d) { return drop<Pool>(d); }
cudnnStatus_t cudnnSetPooling2dDescriptor(cudnnPoolingDescriptor_t d, cudnnPoolingMode_t mode,
                                          cudnnNanPropagation_t nan, int kh, int kw, int pad_h,
                                          int pad_w, int stride_h, int stride_w) {
  if (nan != CUDNN_PROPAGATE_NAN) return bad("NaNs not propagated (not emulated)");
  if (mode != CUDNN_POOLING_MAX_DETERMINISTIC &&
      mode != CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING &&
      mode != CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING)
    return bad("a pooling mode not emulated");
  if (kh < 1 || kw < 1 || pad_h < 0 || pad_w < 0 || stride_h < 1 || stride_w < 1)
    return bad("a window below 1, negative padding or a stride below 1");
  of<Pool>(d) = {mode, kh, kw, pad_h, pad_w, stride_h, stride_w};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetPooling2dForwardOutputDim(cudnnPoolingDescriptor_t d,
                                                cudnnTensorDescriptor_t x, int *n, int *c, int *h,
                                                int *w) {
  const Pool &p = of<Pool>(d);
  const Tensor &t = of<Tensor>(x);
  *n = t.n;
  *c = t.c;
  *h = 1 + (t.h + 2 * p.pad_h - p.kh) / p.stride_h;
  *w = 1 + (t.w + 2 * p.pad_w - p.kw) / p.stride_w;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnPoolingForward(cudnnHandle_t handle, cudnnPoolingDescriptor_t d,
                                  const void *alpha, cudnnTensorDescriptor_t xd, const void *x,
                                  const void *beta, cudnnTensorDescriptor_t yd, void *y) {
  const Pool p = of<Pool>(d);
  const Tensor tx = of<Tensor>(xd), ty = of<Tensor>(yd);
  if (ty.n != tx.n || ty.c != tx.c || ty.h != 1 + (tx.h + 2 * p.pad_h - p.kh) / p.stride_h ||
      ty.w != 1 + (tx.w + 2 * p.pad_w - p.kw) / p.stride_w)
    return bad("Y is not the pooled size of X");
  const float a = *static_cast<const float *>(alpha), b = *static_cast<const float *>(beta);
  return run(handle, "cudnnPoolingForward", [=] {
    const auto *xs = static_cast<const float *>(x);
    std::vector<double> out(ty.size());
    for (int plane = 0; plane < tx.n * tx.c; ++plane)
      for (int oy = 0; oy < ty.h; ++oy)
        for (int ox = 0; ox < ty.w; ++ox) {
          const Window win = window(p, tx, oy, ox);
          double value = p.mode == CUDNN_POOLING_MAX_DETERMINISTIC
                             ? -std::numeric_limits<double>::infinity()
                             : 0.0;
          int count = 0;
          for (int iy = win.y0; iy < win.y1; ++iy)
            for (int ix = win.x0; ix < win.x1; ++ix) {
              const float v = xs[(static_cast<size_t>(plane) * tx.h + iy) * tx.w + ix];
              if (p.mode == CUDNN_POOLING_MAX_DETERMINISTIC) {
                if (std::isnan(v) || v > value) value = v;
                if (std::isnan(value)) break;
              } else {
                value += v;
              }
              ++count;
            }
          if (p.mode == CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING) value /= win.padded;
          if (p.mode == CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING) value /= std::max(count, 1);
          out[(static_cast<size_t>(plane) * ty.h + oy) * ty.w + ox] = value;
        }
    blend(static_cast<float *>(y), out, a, b);
  });
}

cudnnStatus_t cudnnPoolingBackward(cudnnHandle_t handle, cudnnPoolingDescriptor_t d,
                                   const void *alpha, cudnnTensorDescriptor_t yd, const void *y,
                                   cudnnTensorDescriptor_t, const void *dy,
                                   cudnnTensorDescriptor_t xd, const void *x, const void *beta,
                                   cudnnTensorDescriptor_t, void *dx) {
  const Pool p = of<Pool>(d);
  const Tensor tx = of<Tensor>(xd), ty = of<Tensor>(yd);
  const float a = *static_cast<const float *>(alpha), b = *static_cast<const float *>(beta);
  return run(handle, "cudnnPoolingBackward", [=] {
    const auto *xs = static_cast<const float *>(x), *ys = static_cast<const float *>(y),
               *dys = static_cast<const float *>(dy);
    std::vector<double> grad(tx.size(), 0.0);
    for (int plane = 0; plane < tx.n * tx.c; ++plane)
      for (int oy = 0; oy < ty.h; ++oy)
        for (int ox = 0; ox < ty.w; ++ox) {
          const Window win = window(p, tx, oy, ox);
          const size_t o = (static_cast<size_t>(plane) * ty.h + oy) * ty.w + ox;
          int count = 0;
          for (int iy = win.y0; iy < win.y1; ++iy)
            count += win.x1 - win.x0;
          bool routed = false;
          for (int iy = win.y0; iy < win.y1 && !routed; ++iy)
            for (int ix = win.x0; ix < win.x1 && !routed; ++ix) {
              const size_t i = (static_cast<size_t>(plane) * tx.h + iy) * tx.w + ix;
              if (p.mode == CUDNN_POOLING_MAX_DETERMINISTIC) {
                // The first element equal to Y (a NaN Y: the first NaN).
                if (xs[i] == ys[o] || (std::isnan(xs[i]) && std::isnan(ys[o]))) {
                  grad[i] += dys[o];
                  routed = true;
                }
              } else {
                const int divisor =
                    p.mode == CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING ? win.padded : count;
                grad[i] += static_cast<double>(dys[o]) / divisor;
              }
            }
        }
    blend(static_cast<float *>(dx), grad, a, b);
  });
}

cudnnStatus_t cudnnBatchNormalizationForwardInference(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    cudnnTensorDescriptor_t xd, const void *x, cudnnTensorDescriptor_t, void *y,
    cudnnTensorDescriptor_t, const void *scale, const void *bias, const void *mean, const void *var,
    double epsilon) {
  if (mode != CUDNN_BATCHNORM_SPATIAL) return bad("a batch norm mode not emulated");
  if (epsilon < 0) return bad("a negative epsilon");
  const Tensor t = of<Tensor>(xd);
  const float a = *static_cast<const float *>(alpha), b = *static_cast<const float *>(beta);
  return run(handle, "cudnnBatchNormalizationForwardInference", [=] {
    const auto *xs = static_cast<const float *>(x), *g = static_cast<const float *>(scale),
               *bs = static_cast<const float *>(bias), *m = static_cast<const float *>(mean),
               *v = static_cast<const float *>(var);
    std::vector<double> out(t.size());
    const size_t inner = static_cast<size_t>(t.h) * t.w;
    for (int n = 0; n < t.n; ++n)
      for (int c = 0; c < t.c; ++c)
        for (size_t i = 0; i < inner; ++i) {
          const size_t at = (static_cast<size_t>(n) * t.c + c) * inner + i;
          out[at] = g[c] * (xs[at] - static_cast<double>(m[c])) / std::sqrt(v[c] + epsilon) + bs[c];
        }
    blend(static_cast<float *>(y), out, a, b);
  });
}

cudnnStatus_t cudnnBatchNormalizationForwardTraining(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    cudnnTensorDescriptor_t xd, const void *x, cudnnTensorDescriptor_t, void *y,
    cudnnTensorDescriptor_t, const void *scale, const void *bias, double, void *running_mean,
    void *running_var, double epsilon, void *save_mean, void *save_inv_var) {
  if (mode != CUDNN_BATCHNORM_SPATIAL) return bad("a batch norm mode not emulated");
  if (epsilon < 0) return bad("a negative epsilon");
  if (running_mean || running_var || save_mean || save_inv_var)
    return bad("running or saved statistics (not emulated)");
  const Tensor t = of<Tensor>(xd);
  const float a = *static_cast<const float *>(alpha), b = *static_cast<const float *>(beta);
  return run(handle, "cudnnBatchNormalizationForwardTraining", [=] {
    const auto *xs = static_cast<const float *>(x), *g = static_cast<const float *>(scale),
               *bs = static_cast<const float *>(bias);
    std::vector<double> out(t.size());
    const size_t inner = static_cast<size_t>(t.h) * t.w, count = inner * t.n;
    for (int c = 0; c < t.c; ++c) {
      double sum = 0, squares = 0;
      for (int n = 0; n < t.n; ++n)
        for (size_t i = 0; i < inner; ++i)
          sum += xs[(static_cast<size_t>(n) * t.c + c) * inner + i];
      const double mean = sum / count;
      for (int n = 0; n < t.n; ++n)
        for (size_t i = 0; i < inner; ++i) {
          const double d = xs[(static_cast<size_t>(n) * t.c + c) * inner + i] - mean;
          squares += d * d;
        }
      const double inv = 1.0 / std::sqrt(squares / count + epsilon);
      for (int n = 0; n < t.n; ++n)
        for (size_t i = 0; i < inner; ++i) {
          const size_t at = (static_cast<size_t>(n) * t.c + c) * inner + i;
          out[at] = g[c] * (xs[at] - mean) * inv + bs[c];
        }
    }
    blend(static_cast<float *>(y), out, a, b);
  });
}

cudnnStatus_t cudnnBatchNormalizationBackward(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alpha_data, const void *beta_data,
    const void *alpha_param, const void *beta_param, cudnnTensorDescriptor_t xd, const void *x,
    cudnnTensorDescriptor_t, const void *dy, cudnnTensorDescriptor_t, void *dx,
    cudnnTensorDescriptor_t, const void *scale, void *dscale, void *dbias, double epsilon,
    const void *saved_mean, const void *saved_inv_var) {
  if (mode != CUDNN_BATCHNORM_SPATIAL) return bad("a batch norm mode not emulated");
  if (epsilon < 0) return bad("a negative epsilon");
  if (saved_mean || saved_inv_var) return bad("saved statistics (not emulated)");
  const Tensor t = of<Tensor>(xd);
  const float ad = *static_cast<const float *>(alpha_data),
              bd = *static_cast<const float *>(beta_data),
              ap = *static_cast<const float *>(alpha_param),
              bp = *static_cast<const float *>(beta_param);
  return run(handle, "cudnnBatchNormalizationBackward", [=] {
    const auto *xs = static_cast<const float *>(x), *dys = static_cast<const float *>(dy),
               *g = static_cast<const float *>(scale);
    std::vector<double> grad(t.size()), ds(t.c), db(t.c);
    const size_t inner = static_cast<size_t>(t.h) * t.w, count = inner * t.n;
    auto at = [&](int n, int c, size_t i) {
      return (static_cast<size_t>(n) * t.c + c) * inner + i;
    };
    for (int c = 0; c < t.c; ++c) {
      double sum = 0, squares = 0;
      for (int n = 0; n < t.n; ++n)
        for (size_t i = 0; i < inner; ++i)
          sum += xs[at(n, c, i)];
      const double mean = sum / count;
      for (int n = 0; n < t.n; ++n)
        for (size_t i = 0; i < inner; ++i)
          squares += (xs[at(n, c, i)] - mean) * (xs[at(n, c, i)] - mean);
      const double inv = 1.0 / std::sqrt(squares / count + epsilon);
      double sum_dy = 0, sum_dy_xhat = 0;
      for (int n = 0; n < t.n; ++n)
        for (size_t i = 0; i < inner; ++i) {
          sum_dy += dys[at(n, c, i)];
          sum_dy_xhat += dys[at(n, c, i)] * (xs[at(n, c, i)] - mean) * inv;
        }
      ds[c] = sum_dy_xhat;
      db[c] = sum_dy;
      for (int n = 0; n < t.n; ++n)
        for (size_t i = 0; i < inner; ++i) {
          const double xhat = (xs[at(n, c, i)] - mean) * inv;
          grad[at(n, c, i)] =
              g[c] * inv / count * (count * dys[at(n, c, i)] - sum_dy - xhat * sum_dy_xhat);
        }
    }
    blend(static_cast<float *>(dx), grad, ad, bd);
    blend(static_cast<float *>(dscale), ds, ap, bp);
    blend(static_cast<float *>(dbias), db, ap, bp);
  });
}

} // extern "C"
