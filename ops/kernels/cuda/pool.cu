// Pooling kernels: max and average windows and their gradients, following the
// CPU kernels of ops_nn.cc element for element (same window clipping, same
// divisor, same order of accumulation).
#include "ops/kernels/cuda/grid.cuh"
#include "ops/kernels/cuda/launch.h"

#include <cmath>

namespace strata::cuda {
namespace {

// The first maximum of window (oy, ox) of `src` (one plane): its index in the
// plane, or -1 when no tap is inside the input.
__device__ int64_t window_argmax(const Window &w, const float *src, int64_t oy, int64_t ox) {
  const int64_t y0 = oy * w.stride_h - w.pad_top, x0 = ox * w.stride_w - w.pad_left;
  int64_t best_index = -1;
  float best = -INFINITY;
  for (int64_t ky = 0; ky < w.kernel_h; ++ky) {
    const int64_t iy = y0 + ky * w.dilation_h;
    if (iy < 0 || iy >= w.h) continue;
    for (int64_t kx = 0; kx < w.kernel_w; ++kx) {
      const int64_t ix = x0 + kx * w.dilation_w;
      if (ix < 0 || ix >= w.w) continue;
      const float v = src[iy * w.w + ix];
      if (best_index < 0 || v > best || v != v) {
        best = v;
        best_index = iy * w.w + ix;
      }
    }
  }
  return best_index;
}

// Average window (oy, ox): the clipped bounds and the divisor.
struct AverageWindow {
  int64_t ys, ye, xs, xe, count;
};
__device__ AverageWindow average_window(const Window &w, int64_t oy, int64_t ox) {
  const int64_t y0 = oy * w.stride_h - w.pad_top, x0 = ox * w.stride_w - w.pad_left;
  const int64_t y1 = min(y0 + w.kernel_h, w.h + w.pad_bottom);
  const int64_t x1 = min(x0 + w.kernel_w, w.w + w.pad_right);
  AverageWindow a;
  a.ys = max(y0, int64_t{0});
  a.ye = min(y1, w.h);
  a.xs = max(x0, int64_t{0});
  a.xe = min(x1, w.w);
  a.count = w.include_pad ? (y1 - y0) * (x1 - x0) : (a.ye - a.ys) * (a.xe - a.xs);
  return a;
}

__global__ void pool_kernel(bool is_max, Window w, const float *x, float *y) {
  const int64_t n = w.planes * w.out_h * w.out_w;
  STRATA_GRID_STRIDE(i, n) {
    const int64_t ox = i % w.out_w, oy = (i / w.out_w) % w.out_h, plane = i / (w.out_w * w.out_h);
    const float *src = x + plane * w.h * w.w;
    if (is_max) {
      const int64_t at = window_argmax(w, src, oy, ox);
      y[i] = at < 0 ? -INFINITY : src[at];
      continue;
    }
    const AverageWindow a = average_window(w, oy, ox);
    double sum = 0;
    for (int64_t iy = a.ys; iy < a.ye; ++iy)
      for (int64_t ix = a.xs; ix < a.xe; ++ix)
        sum += src[iy * w.w + ix];
    y[i] = static_cast<float>(sum / static_cast<double>(a.count));
  }
}

// The output windows whose span (extent taps from its start) may reach input
// position `i` along one dim.
__device__ void reaching(int64_t i, int64_t pad, int64_t stride, int64_t extent, int64_t out,
                         int64_t *first, int64_t *last) {
  // Window o starts at o * stride - pad and spans `extent` positions.
  const int64_t lo = i + pad - extent + 1;
  *first = lo <= 0 ? 0 : (lo + stride - 1) / stride;
  *last = min((i + pad) / stride, out - 1);
}

__global__ void pool_grad_kernel(bool is_max, Window w, const float *dy, const float *x,
                                 float *dx) {
  const int64_t n = w.planes * w.h * w.w;
  const int64_t extent_h = (w.kernel_h - 1) * w.dilation_h + 1;
  const int64_t extent_w = (w.kernel_w - 1) * w.dilation_w + 1;
  STRATA_GRID_STRIDE(i, n) {
    const int64_t ix = i % w.w, iy = (i / w.w) % w.h, plane = i / (w.w * w.h);
    const int64_t here = iy * w.w + ix;
    const float *g = dy + plane * w.out_h * w.out_w;
    const float *src = x == nullptr ? nullptr : x + plane * w.h * w.w;
    int64_t oy0, oy1, ox0, ox1;
    reaching(iy, w.pad_top, w.stride_h, extent_h, w.out_h, &oy0, &oy1);
    reaching(ix, w.pad_left, w.stride_w, extent_w, w.out_w, &ox0, &ox1);
    float sum = 0.0f;
    for (int64_t oy = oy0; oy <= oy1; ++oy)
      for (int64_t ox = ox0; ox <= ox1; ++ox) {
        if (is_max) {
          if (window_argmax(w, src, oy, ox) == here) sum += g[oy * w.out_w + ox];
          continue;
        }
        const AverageWindow a = average_window(w, oy, ox);
        if (a.count <= 0 || iy < a.ys || iy >= a.ye || ix < a.xs || ix >= a.xe) continue;
        sum += static_cast<float>(static_cast<double>(g[oy * w.out_w + ox]) /
                                  static_cast<double>(a.count));
      }
    dx[i] = sum;
  }
}

__global__ void spread_mean_kernel(const float *dy, float *dx, int64_t planes, int64_t size) {
  STRATA_GRID_STRIDE(i, planes * size) {
    dx[i] = static_cast<float>(static_cast<double>(dy[i / size]) / static_cast<double>(size));
  }
}

} // namespace

cudaError_t pool(bool max, const Window &window, const float *x, float *y, cudaStream_t stream) {
  const int64_t n = window.planes * window.out_h * window.out_w;
  if (n == 0) return cudaSuccess;
  STRATA_LAUNCH(pool_kernel, grid_for(n), kThreads, 0, stream)(max, window, x, y);
  return cudaGetLastError();
}

cudaError_t pool_grad(bool max, const Window &window, const float *dy, const float *x, float *dx,
                      cudaStream_t stream) {
  const int64_t n = window.planes * window.h * window.w;
  if (n == 0) return cudaSuccess;
  STRATA_LAUNCH(pool_grad_kernel, grid_for(n), kThreads, 0, stream)
  (max, window, dy, max ? x : nullptr, dx);
  return cudaGetLastError();
}

cudaError_t spread_mean(const float *dy, float *dx, int64_t planes, int64_t size,
                        cudaStream_t stream) {
  if (planes * size == 0) return cudaSuccess;
  STRATA_LAUNCH(spread_mean_kernel, grid_for(planes * size), kThreads, 0, stream)
  (dy, dx, planes, size);
  return cudaGetLastError();
}

} // namespace strata::cuda
