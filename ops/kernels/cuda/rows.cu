// Row-wise CUDA kernels: reductions, softmax, layer norm, cross entropy and
// gather. Every sum is taken in a fixed order (a block reduces its threads'
// partial sums in a fixed tree), so a kernel gives bitwise the same result on
// every run: a captured CUDA Graph replays exactly what eager execution does.
#include "ops/kernels/cuda/grid.cuh"
#include "ops/kernels/cuda/launch.h"

#include <cub/device/device_radix_sort.cuh>

#include <cfloat>
#include <cmath>

namespace strata::cuda {
namespace {

// Reduces one value per thread of the block with `combine`; every thread gets
// the result. `shared` holds kThreads values.
template <typename T, typename Combine>
__device__ T block_reduce(T value, T *shared, Combine combine) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int width = blockDim.x / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width)
      shared[threadIdx.x] = combine(shared[threadIdx.x], shared[threadIdx.x + width]);
    __syncthreads();
  }
  const T result = shared[0];
  __syncthreads();
  return result;
}

struct Add {
  template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};
// The larger, with NaN winning (as the CPU kernels' nan_max).
struct Max {
  __device__ float operator()(float a, float b) const {
    return (a != a || a > b) ? a : (b != b ? b : (a > b ? a : b));
  }
};

// ---- reduce -----------------------------------------------------------------

struct ReduceShape {
  Dims kept;         // output dims, in order
  Dims kept_strides; // input strides of the kept dims
  Dims folded;       // reduced dims, in order
  Dims folded_strides;
};

__global__ void reduce_kernel(Reduce op, const float *x, ReduceShape s, int64_t outputs,
                              int64_t folded_count, double divisor, float *y) {
  for (int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; o < outputs;
       o += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    int64_t base = 0, rest = o;
    for (int d = s.kept.rank - 1; d >= 0; --d) {
      base += (rest % s.kept.d[d]) * s.kept_strides.d[d];
      rest /= s.kept.d[d];
    }
    double sum = 0;
    float max = -INFINITY;
    for (int64_t k = 0; k < folded_count; ++k) {
      int64_t offset = base, r = k;
      for (int d = s.folded.rank - 1; d >= 0; --d) {
        offset += (r % s.folded.d[d]) * s.folded_strides.d[d];
        r /= s.folded.d[d];
      }
      if (op == Reduce::kSum)
        sum += x[offset];
      else
        max = Max()(max, x[offset]);
    }
    y[o] = op == Reduce::kSum ? static_cast<float>(sum / divisor) : max;
  }
}

// Few outputs over many folded elements: one block per output, its threads
// striding over the folded elements and combining in a fixed tree.
__global__ void reduce_block_kernel(Reduce op, const float *x, ReduceShape s, int64_t folded_count,
                                    double divisor, float *y) {
  __shared__ double shared_sum[kThreads];
  __shared__ float shared_max[kThreads];
  const int64_t o = blockIdx.x;
  int64_t base = 0, rest = o;
  for (int d = s.kept.rank - 1; d >= 0; --d) {
    base += (rest % s.kept.d[d]) * s.kept_strides.d[d];
    rest /= s.kept.d[d];
  }
  double sum = 0;
  float max = -INFINITY;
  for (int64_t k = threadIdx.x; k < folded_count; k += blockDim.x) {
    int64_t offset = base, r = k;
    for (int d = s.folded.rank - 1; d >= 0; --d) {
      offset += (r % s.folded.d[d]) * s.folded_strides.d[d];
      r /= s.folded.d[d];
    }
    if (op == Reduce::kSum)
      sum += x[offset];
    else
      max = Max()(max, x[offset]);
  }
  if (op == Reduce::kSum) {
    sum = block_reduce(sum, shared_sum, Add());
    if (threadIdx.x == 0) y[o] = static_cast<float>(sum / divisor);
  } else {
    max = block_reduce(max, shared_max, Max());
    if (threadIdx.x == 0) y[o] = max;
  }
}

__global__ void reduce_max_grad_kernel(const float *dy, const float *x, ReduceShape s,
                                       int64_t groups, int64_t folded_count, float *dx) {
  STRATA_GRID_STRIDE(o, groups) {
    int64_t base = 0, rest = o;
    for (int d = s.kept.rank - 1; d >= 0; --d) {
      base += (rest % s.kept.d[d]) * s.kept_strides.d[d];
      rest /= s.kept.d[d];
    }
    int64_t best = -1;
    for (int64_t k = 0; k < folded_count; ++k) {
      int64_t offset = base, r = k;
      for (int d = s.folded.rank - 1; d >= 0; --d) {
        offset += (r % s.folded.d[d]) * s.folded_strides.d[d];
        r /= s.folded.d[d];
      }
      const float v = x[offset];
      if (best < 0 || v > x[best] || (v != v && x[best] == x[best])) best = offset;
    }
    if (best >= 0) dx[best] = dy[o];
  }
}

__global__ void mse_partials_kernel(const float *p, const float *t, int64_t n, double *partials) {
  __shared__ double shared[kThreads];
  double sum = 0;
  STRATA_GRID_STRIDE(i, n) {
    const float d = p[i] - t[i];
    sum += static_cast<double>(d) * d;
  }
  sum = block_reduce(sum, shared, Add());
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

__global__ void mse_finish_kernel(const double *partials, int64_t n, int reduction, float *loss) {
  double total = 0;
  for (int b = 0; b < kNormBlocks; ++b)
    total += partials[b];
  *loss = reduction == 1 ? static_cast<float>(total)
                         : (n == 0 ? 0.0f : static_cast<float>(total / static_cast<double>(n)));
}

__global__ void mse_none_kernel(const float *p, const float *t, int64_t n, float *loss) {
  STRATA_GRID_STRIDE(i, n) {
    const float d = p[i] - t[i];
    loss[i] = d * d;
  }
}

__global__ void mse_grad_kernel(const float *dloss, const float *p, const float *t, int64_t n,
                                int reduction, float *dp, float *dt) {
  double shared = 0;
  if (reduction == 1) shared = dloss[0];
  if (reduction == 0 && n > 0) shared = static_cast<double>(dloss[0]) / static_cast<double>(n);
  STRATA_GRID_STRIDE(i, n) {
    const double weight = reduction == 2 ? static_cast<double>(dloss[i]) : shared;
    const float g = static_cast<float>(2.0 * weight * (static_cast<double>(p[i]) - t[i]));
    dp[i] = g;
    dt[i] = -g;
  }
}

// ---- softmax ------------------------------------------------------------------

// One block per row; a row is `axis` elements `inner` apart.
__global__ void softmax_kernel(const float *x, float *y, int64_t axis, int64_t inner, bool log) {
  __shared__ float shared_max[kThreads];
  __shared__ double shared_sum[kThreads];
  const int64_t row = blockIdx.x;
  const int64_t base = (row / inner) * axis * inner + row % inner;
  float max = -INFINITY;
  for (int64_t j = threadIdx.x; j < axis; j += blockDim.x)
    max = Max()(max, x[base + j * inner]);
  max = block_reduce(max, shared_max, Max());
  double sum = 0;
  for (int64_t j = threadIdx.x; j < axis; j += blockDim.x)
    sum += expf(x[base + j * inner] - max);
  sum = block_reduce(sum, shared_sum, Add());
  const float shift = log ? static_cast<float>(::log(sum)) : static_cast<float>(1.0 / sum);
  for (int64_t j = threadIdx.x; j < axis; j += blockDim.x) {
    const float v = x[base + j * inner] - max;
    y[base + j * inner] = log ? v - shift : expf(v) * shift;
  }
}

__global__ void softmax_grad_kernel(const float *dy, const float *y, float *dx, int64_t axis,
                                    int64_t inner, bool log) {
  __shared__ double shared_sum[kThreads];
  const int64_t row = blockIdx.x;
  const int64_t base = (row / inner) * axis * inner + row % inner;
  double sum = 0;
  for (int64_t j = threadIdx.x; j < axis; j += blockDim.x) {
    const int64_t i = base + j * inner;
    sum += log ? static_cast<double>(dy[i]) : static_cast<double>(dy[i]) * y[i];
  }
  sum = block_reduce(sum, shared_sum, Add());
  const float s = static_cast<float>(sum);
  for (int64_t j = threadIdx.x; j < axis; j += blockDim.x) {
    const int64_t i = base + j * inner;
    dx[i] = log ? dy[i] - expf(y[i]) * s : y[i] * (dy[i] - s);
  }
}

// ---- layer norm -----------------------------------------------------------------

// The row's mean and 1 / sqrt(var + eps), two passes in double as on the CPU.
__device__ void row_stats(const float *row, int64_t cols, double epsilon, double *shared,
                          double *mean, double *rstd) {
  double sum = 0;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
    sum += row[i];
  *mean = block_reduce(sum, shared, Add()) / static_cast<double>(cols);
  double squares = 0;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const double d = row[i] - *mean;
    squares += d * d;
  }
  squares = block_reduce(squares, shared, Add());
  *rstd = 1.0 / sqrt(squares / static_cast<double>(cols) + epsilon);
}

__global__ void layer_norm_kernel(const float *x, const float *scale, const float *bias, float *y,
                                  int64_t cols, double epsilon) {
  __shared__ double shared[kThreads];
  const float *row = x + blockIdx.x * cols;
  float *out = y + blockIdx.x * cols;
  double mean, rstd;
  row_stats(row, cols, epsilon, shared, &mean, &rstd);
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
    out[i] = static_cast<float>((row[i] - mean) * rstd * scale[i] + bias[i]);
}

__global__ void layer_norm_dx_kernel(const float *dy, const float *x, const float *scale, float *dx,
                                     int64_t cols, double epsilon) {
  __shared__ double shared[kThreads];
  const float *row = x + blockIdx.x * cols;
  const float *g = dy + blockIdx.x * cols;
  double mean, rstd;
  row_stats(row, cols, epsilon, shared, &mean, &rstd);
  double sum_g = 0, sum_gx = 0;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const double gi = static_cast<double>(g[i]) * scale[i];
    sum_g += gi;
    sum_gx += gi * ((row[i] - mean) * rstd);
  }
  const double mean_g = block_reduce(sum_g, shared, Add()) / static_cast<double>(cols);
  const double mean_gx = block_reduce(sum_gx, shared, Add()) / static_cast<double>(cols);
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const double gi = static_cast<double>(g[i]) * scale[i];
    const double xhat = (row[i] - mean) * rstd;
    dx[blockIdx.x * cols + i] = static_cast<float>(rstd * (gi - mean_g - xhat * mean_gx));
  }
}

// Each row's mean and rstd again (one block per row), kept for the column pass.
__global__ void layer_norm_stats_kernel(const float *x, int64_t cols, double epsilon,
                                        double *stats) {
  __shared__ double shared[kThreads];
  double mean, rstd;
  row_stats(x + blockIdx.x * cols, cols, epsilon, shared, &mean, &rstd);
  if (threadIdx.x == 0) {
    stats[2 * blockIdx.x] = mean;
    stats[2 * blockIdx.x + 1] = rstd;
  }
}

// One thread per column, rows in order.
__global__ void layer_norm_params_kernel(const float *dy, const float *x, const double *stats,
                                         float *dscale, float *dbias, int64_t rows, int64_t cols) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < cols;
       c += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    double ds = 0, db = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const double g = dy[r * cols + c];
      ds += g * ((x[r * cols + c] - stats[2 * r]) * stats[2 * r + 1]);
      db += g;
    }
    dscale[c] = static_cast<float>(ds);
    dbias[c] = static_cast<float>(db);
  }
}

// ---- batch norm ------------------------------------------------------------------

// Element j of channel c (j over batch x inner).
__device__ int64_t channel_at(int64_t j, int64_t c, int64_t channels, int64_t inner) {
  return ((j / inner) * channels + c) * inner + j % inner;
}

struct ChannelStats {
  double mean, squares; // squares: sum of (x - mean)^2
};

__device__ ChannelStats channel_stats(const float *x, int64_t c, int64_t count, int64_t channels,
                                      int64_t inner, double *shared) {
  double sum = 0;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x)
    sum += x[channel_at(j, c, channels, inner)];
  const double mean = count == 0 ? 0.0 : block_reduce(sum, shared, Add()) / count;
  const float m = static_cast<float>(mean);
  double squares = 0;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const float d = x[channel_at(j, c, channels, inner)] - m;
    squares += d * d;
  }
  squares = block_reduce(squares, shared, Add());
  const double offset = mean - static_cast<double>(m);
  squares = squares - static_cast<double>(count) * offset * offset;
  return {mean, squares > 0.0 ? squares : 0.0};
}

__global__ void batch_norm_kernel(const float *x, const float *scale, const float *bias,
                                  const float *mean_in, const float *var_in, float *y,
                                  int64_t batch, int64_t channels, int64_t inner, double epsilon,
                                  bool training) {
  __shared__ double shared[kThreads];
  const int64_t c = blockIdx.x, count = batch * inner;
  double mean = mean_in[c];
  double rstd = 1.0 / sqrt(static_cast<double>(var_in[c]) + epsilon);
  if (training) {
    const ChannelStats s = channel_stats(x, c, count, channels, inner, shared);
    mean = s.mean;
    rstd = 1.0 / sqrt((count == 0 ? 0.0 : s.squares / count) + epsilon);
  }
  const double factor = scale[c] * rstd;
  const float m = static_cast<float>(mean);
  const float mul = static_cast<float>(factor);
  const float add = static_cast<float>(bias[c] - (mean - static_cast<double>(m)) * factor);
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const int64_t at = channel_at(j, c, channels, inner);
    y[at] = (x[at] - m) * mul + add;
  }
}

__global__ void batch_norm_stats_kernel(const float *x, float *mean, float *var, int64_t batch,
                                        int64_t channels, int64_t inner) {
  __shared__ double shared[kThreads];
  const int64_t c = blockIdx.x, count = batch * inner;
  const ChannelStats s = channel_stats(x, c, count, channels, inner, shared);
  if (threadIdx.x != 0) return;
  mean[c] = static_cast<float>(s.mean);
  var[c] = static_cast<float>(s.squares / (static_cast<double>(count) - 1.0));
}

__global__ void batch_norm_grad_kernel(const float *dy, const float *x, const float *scale,
                                       float *dx, float *dscale, float *dbias, int64_t batch,
                                       int64_t channels, int64_t inner, double epsilon) {
  __shared__ double shared[kThreads];
  const int64_t c = blockIdx.x, count = batch * inner;
  const ChannelStats s = channel_stats(x, c, count, channels, inner, shared);
  const double mean = s.mean;
  const double rstd = 1.0 / sqrt((count == 0 ? 0.0 : s.squares / count) + epsilon);
  const float m = static_cast<float>(mean);
  double sum_g = 0, sum_gd = 0;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const int64_t at = channel_at(j, c, channels, inner);
    sum_g += dy[at];
    sum_gd += dy[at] * (x[at] - m);
  }
  sum_g = block_reduce(sum_g, shared, Add());
  sum_gd = block_reduce(sum_gd, shared, Add());
  sum_gd -= sum_g * (mean - static_cast<double>(m));
  const double sum_gx = sum_gd * rstd;
  if (threadIdx.x == 0) {
    dscale[c] = static_cast<float>(sum_gx);
    dbias[c] = static_cast<float>(sum_g);
  }
  if (count == 0) return;
  const double mean_g = sum_g / count, mean_gx = sum_gx / count;
  const double factor = static_cast<double>(scale[c]) * rstd;
  const double xcoef = -factor * rstd * mean_gx;
  const float a = static_cast<float>(factor), b = static_cast<float>(xcoef);
  const float d = static_cast<float>(factor * (-mean_g) - xcoef * (mean - m));
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const int64_t at = channel_at(j, c, channels, inner);
    dx[at] = a * dy[at] + b * (x[at] - m) + d;
  }
}

// ---- cross entropy -----------------------------------------------------------------

// A row's max and its sum of e^(x - max) in double, over the block.
struct ExpStats {
  float max;
  double sum;
};
__device__ ExpStats exp_stats(const float *row, int64_t n, float *shared_max, double *shared_sum) {
  float max = -INFINITY;
  for (int64_t c = threadIdx.x; c < n; c += blockDim.x)
    max = Max()(max, row[c]);
  max = block_reduce(max, shared_max, Max());
  double sum = 0;
  for (int64_t c = threadIdx.x; c < n; c += blockDim.x)
    sum += exp(static_cast<double>(row[c]) - max);
  return {max, block_reduce(sum, shared_sum, Add())};
}

__device__ int64_t label_at(const void *labels, int bytes, int64_t r) {
  return bytes == 4 ? static_cast<const int32_t *>(labels)[r]
                    : static_cast<const int64_t *>(labels)[r];
}

// One block per row: max + log(sum exp(x - max)) - x[label], in double.
__global__ void cross_entropy_rows_kernel(const float *logits, const void *labels, int label_bytes,
                                          int64_t classes, int64_t ignore_index, int reduction,
                                          double *row_loss, float *loss, int *bad_label) {
  __shared__ float shared_max[kThreads];
  __shared__ double shared_sum[kThreads];
  const int64_t r = blockIdx.x;
  const float *row = logits + r * classes;
  const int64_t label = label_at(labels, label_bytes, r);
  const bool ignored = label == ignore_index;
  const bool bad = !ignored && (label < 0 || label >= classes);
  const ExpStats stats = exp_stats(row, classes, shared_max, shared_sum);
  const float max = stats.max;
  const double sum = stats.sum;
  if (threadIdx.x != 0) return;
  if (bad) *bad_label = 1;
  const double value = ignored || bad ? 0.0 : max + ::log(sum) - row[label];
  row_loss[r] = value;
  if (reduction == 2) loss[r] = static_cast<float>(value);
}

// The rows' losses (double) reduced in row order by one thread, as on the CPU.
__global__ void cross_entropy_reduce_kernel(const double *row_loss, const void *labels,
                                            int label_bytes, int64_t rows, int64_t ignore_index,
                                            int reduction, float *loss) {
  double total = 0;
  int64_t counted = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (label_at(labels, label_bytes, r) == ignore_index) continue;
    total += row_loss[r];
    ++counted;
  }
  if (reduction == 1) *loss = static_cast<float>(total);
  if (reduction == 0) *loss = counted == 0 ? 0.0f : static_cast<float>(total / counted);
}

// The weight every counted row's gradient shares: dLoss ("sum") or dLoss over
// the counted rows ("mean"); unused for "none". One thread, rows in order.
__global__ void cross_entropy_weight_kernel(const float *dloss, const void *labels, int label_bytes,
                                            int64_t rows, int64_t ignore_index, int reduction,
                                            double *weight) {
  int64_t counted = 0;
  for (int64_t k = 0; k < rows; ++k)
    counted += label_at(labels, label_bytes, k) != ignore_index;
  *weight = reduction == 0 ? (counted == 0 ? 0.0 : static_cast<double>(dloss[0]) / counted)
                           : static_cast<double>(dloss[0]);
}

__global__ void cross_entropy_grad_kernel(const float *dloss, const float *logits,
                                          const void *labels, int label_bytes, int64_t classes,
                                          int64_t ignore_index, int reduction, const double *shared,
                                          float *dlogits, int *bad_label) {
  __shared__ float shared_max[kThreads];
  __shared__ double shared_sum[kThreads];
  const int64_t r = blockIdx.x;
  const float *row = logits + r * classes;
  float *out = dlogits + r * classes;
  const int64_t label = label_at(labels, label_bytes, r);
  if (label == ignore_index || label < 0 || label >= classes) {
    if (label != ignore_index && threadIdx.x == 0) *bad_label = 1;
    for (int64_t c = threadIdx.x; c < classes; c += blockDim.x)
      out[c] = 0.0f;
    return;
  }

  const ExpStats stats = exp_stats(row, classes, shared_max, shared_sum);
  const float max = stats.max;
  const double sum = stats.sum;
  const double weight = reduction == 2 ? static_cast<double>(dloss[r]) : *shared;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
    const double p = exp(static_cast<double>(row[c]) - max) / sum;
    out[c] = static_cast<float>(weight * (p - (c == label ? 1.0 : 0.0)));
  }
}

// ---- vocabulary-parallel cross entropy ------------------------------------------------

// One block per row of the piece: max, sum of e^(x - max), the label's logit.
__global__ void vocab_stats_kernel(const float *piece, const void *labels, int label_bytes,
                                   int64_t classes, int64_t first, int64_t total,
                                   int64_t ignore_index, float *stats, int *bad_label) {
  __shared__ float shared_max[kThreads];
  __shared__ double shared_sum[kThreads];
  const int64_t r = blockIdx.x;
  const float *row = piece + r * classes;
  const ExpStats s = exp_stats(row, classes, shared_max, shared_sum);
  if (threadIdx.x != 0) return;
  const int64_t label = label_at(labels, label_bytes, r);
  const bool ignored = label == ignore_index;
  if (!ignored && (label < 0 || label >= total)) *bad_label = 1;
  const int64_t local = ignored ? -1 : label - first;
  float *out = stats + 3 * r;
  out[0] = s.max;
  out[1] = static_cast<float>(s.sum);
  out[2] = local >= 0 && local < classes ? row[local] : 0.0f;
}

// Row r's max over every class, log of its sum of exponentials and label
// logit, from every member's three (in member order, as the CPU adds them).
struct RowSoftmax {
  double max, log_sum, target;
};
__device__ RowSoftmax combine_stats(const float *stats, int64_t parts) {
  float max = stats[0];
  for (int64_t p = 1; p < parts; ++p)
    max = fmaxf(max, stats[3 * p]);
  double sum = 0, target = 0;
  for (int64_t p = 0; p < parts; ++p) {
    sum += static_cast<double>(stats[3 * p + 1]) *
           exp(static_cast<double>(stats[3 * p]) - static_cast<double>(max));
    target += stats[3 * p + 2];
  }
  return {max, ::log(sum), target};
}

// One thread per row: its loss (0 for an ignored or bad row).
__global__ void vocab_loss_rows_kernel(const void *labels, int label_bytes, const float *stats,
                                       int64_t rows, int64_t parts, int64_t total,
                                       int64_t ignore_index, int reduction, double *row_loss,
                                       float *loss, int *bad_label) {
  STRATA_GRID_STRIDE(r, rows) {
    const int64_t label = label_at(labels, label_bytes, r);
    const bool ignored = label == ignore_index;
    const bool bad = !ignored && (label < 0 || label >= total);
    if (bad) *bad_label = 1;
    double value = 0;
    if (!ignored && !bad) {
      const RowSoftmax row = combine_stats(stats + 3 * parts * r, parts);
      value = row.max + row.log_sum - row.target;
    }
    row_loss[r] = value;
    if (reduction == 2) loss[r] = static_cast<float>(value);
  }
}

__global__ void vocab_grad_kernel(const float *dloss, const float *piece, const void *labels,
                                  int label_bytes, const float *stats, int64_t classes,
                                  int64_t parts, int64_t first, int64_t ignore_index, int reduction,
                                  const double *shared, float *dpiece, int *bad_label) {
  const int64_t r = blockIdx.x;
  const float *row = piece + r * classes;
  float *out = dpiece + r * classes;
  const int64_t label = label_at(labels, label_bytes, r);
  if (label == ignore_index || label < 0 || label >= classes * parts) {
    if (label != ignore_index && threadIdx.x == 0) *bad_label = 1;
    for (int64_t c = threadIdx.x; c < classes; c += blockDim.x)
      out[c] = 0.0f;
    return;
  }
  const RowSoftmax softmax = combine_stats(stats + 3 * parts * r, parts);
  const double weight = reduction == 2 ? static_cast<double>(dloss[r]) : *shared;
  const int64_t local = label - first;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
    const double p = exp(static_cast<double>(row[c]) - softmax.max - softmax.log_sum);
    out[c] = static_cast<float>(weight * (p - (c == local ? 1.0 : 0.0)));
  }
}

// ---- gather --------------------------------------------------------------------------

// The row of this piece (rows [first, first + axis_size) of `bound`) that
// index j names: its local row, -1 for another member's row, -2 for an index
// out of range.
__device__ int64_t piece_row(const void *indices, int index_bytes, int64_t j, int64_t first,
                             int64_t axis_size, int64_t bound) {
  int64_t index = label_at(indices, index_bytes, j);
  if (index < 0) index += bound;
  if (index < 0 || index >= bound) return -2;
  index -= first;
  return index >= 0 && index < axis_size ? index : -1;
}

__global__ void gather_kernel(const float *data, int64_t outer, int64_t axis_size, int64_t inner,
                              const void *indices, int index_bytes, int64_t n, float *out,
                              int *bad_index, int64_t first, int64_t bound) {
  const int64_t total = outer * n * inner;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t k = i % inner, j = (i / inner) % n, o = i / (inner * n);
    const int64_t index = piece_row(indices, index_bytes, j, first, axis_size, bound);
    if (index < 0) {
      if (index == -2) *bad_index = 1;
      out[i] = 0.0f;
      continue;
    }
    out[i] = data[(o * axis_size + index) * inner + k];
  }
}

// One thread per element of dData: scans the indices in order and adds the dY
// rows that land on it. Work n per element: fine for the embedding tables of
// the zoo models; a sort-based pass is the way for large vocabularies.
__global__ void gather_grad_kernel(const float *dy, int64_t outer, int64_t axis_size, int64_t inner,
                                   const void *indices, int index_bytes, int64_t n, float *ddata,
                                   int *bad_index, int64_t first, int64_t bound) {
  const int64_t total = outer * axis_size * inner;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t k = i % inner, row = (i / inner) % axis_size, o = i / (inner * axis_size);
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t index = piece_row(indices, index_bytes, j, first, axis_size, bound);
      if (index == -2) *bad_index = 1;
      if (index == row) sum += dy[(o * n + j) * inner + k];
    }
    ddata[i] = sum;
  }
}

// ---- sorted embedding gradient ---------------------------------------------------------

// Row of every position (out-of-range ones get axis_size: sorted last, unused).
__global__ void index_keys_kernel(const void *indices, int index_bytes, int64_t n,
                                  int64_t axis_size, uint32_t *keys, uint32_t *positions,
                                  int *bad_index, int64_t first, int64_t bound) {
  STRATA_GRID_STRIDE(j, n) {
    int64_t index = piece_row(indices, index_bytes, j, first, axis_size, bound);
    if (index == -2) *bad_index = 1;
    if (index < 0) index = axis_size; // another member's row, or out of range
    keys[j] = static_cast<uint32_t>(index);
    positions[j] = static_cast<uint32_t>(j);
  }
}

// First p in sorted `keys` [0, n) with keys[p] >= key.
__device__ int64_t lower_bound(const uint32_t *keys, int64_t n, uint32_t key) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (keys[mid] < key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// dData[row, k] = sum of dY[position, k] over the row's positions, in
// increasing position (the sort is stable), as the CPU adds them.
__global__ void sorted_gather_grad_kernel(const float *dy, int64_t axis_size, int64_t inner,
                                          const uint32_t *keys, const uint32_t *positions,
                                          int64_t n, float *ddata) {
  STRATA_GRID_STRIDE(i, axis_size * inner) {
    const int64_t row = i / inner, k = i % inner;
    float sum = 0.0f;
    for (int64_t p = lower_bound(keys, n, static_cast<uint32_t>(row));
         p < n && keys[p] == static_cast<uint32_t>(row); ++p)
      sum += dy[static_cast<int64_t>(positions[p]) * inner + k];
    ddata[i] = sum;
  }
}

struct SortScratch {
  uint32_t *keys_in, *keys_out, *positions_in, *positions_out;
  void *temp;
  size_t temp_bytes;
};

size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Bits that hold every key in [0, axis_size].
int key_bits(int64_t axis_size) {
  int bits = 1;
  while (bits < 32 && (int64_t{1} << bits) <= axis_size)
    ++bits;
  return bits;
}

// CUB's temporary storage for sorting n keys (0: CUB could not say).
size_t sort_temp_bytes(int64_t n, int64_t axis_size) {
  size_t temp = 0;
  const cudaError_t error = cub::DeviceRadixSort::SortPairs(
      nullptr, temp, static_cast<const uint32_t *>(nullptr), static_cast<uint32_t *>(nullptr),
      static_cast<const uint32_t *>(nullptr), static_cast<uint32_t *>(nullptr), n, 0,
      key_bits(axis_size));
  return error == cudaSuccess ? temp : 0;
}

// The four key and position arrays, then CUB's storage: the rest of the
// scratch (CUB checks it is enough).
SortScratch carve(void *scratch, size_t scratch_bytes, int64_t n) {
  auto *base = static_cast<char *>(scratch);
  const size_t array = align256(static_cast<size_t>(n) * sizeof(uint32_t));
  SortScratch s;
  s.keys_in = reinterpret_cast<uint32_t *>(base);
  s.keys_out = reinterpret_cast<uint32_t *>(base + array);
  s.positions_in = reinterpret_cast<uint32_t *>(base + 2 * array);
  s.positions_out = reinterpret_cast<uint32_t *>(base + 3 * array);
  s.temp = base + 4 * array;
  s.temp_bytes = scratch_bytes - 4 * array;
  return s;
}

// ---- gradient norms ------------------------------------------------------------------

__global__ void sum_squares_kernel(const float *x, int64_t n, double *partials) {
  __shared__ double shared[kThreads];
  double sum = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)
    sum += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  sum = block_reduce(sum, shared, Add());
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

__device__ float clip_scale(double sum, double max_norm) {
  const double scale = max_norm / (sqrt(sum) + 1e-6);
  return static_cast<float>(1.0 < scale ? 1.0 : scale); // NaN stays NaN, as std::min
}

__global__ void finish_norm_kernel(const double *partials, int64_t inputs, bool pair,
                                   double max_norm, float *out) {
  double total = 0;
  for (int64_t k = 0; k < inputs; ++k) {
    double part = 0;
    for (int b = 0; b < kNormBlocks; ++b)
      part += partials[k * kNormBlocks + b];
    total += part;
  }
  if (pair) {
    out[0] = static_cast<float>(total);
    out[1] = static_cast<float>(total - static_cast<double>(out[0]));
  } else {
    out[0] = clip_scale(total, max_norm);
  }
}

__global__ void add_pair_kernel(const float *pair, bool first, double *acc) {
  const double value = static_cast<double>(pair[0]) + static_cast<double>(pair[1]);
  *acc = first ? value : *acc + value;
}

__global__ void finish_pairs_kernel(const double *acc, double max_norm, float *scale) {
  *scale = clip_scale(*acc, max_norm);
}

} // namespace

static void split_reduce(const Dims &shape, const bool *reduced, ReduceShape *s, int64_t *outputs,
                         int64_t *folded) {
  int64_t stride = 1;
  Dims strides;
  for (int d = shape.rank - 1; d >= 0; --d) {
    strides.d[d] = stride;
    stride *= shape.d[d];
  }
  *outputs = *folded = 1;
  for (int d = 0; d < shape.rank; ++d) {
    if (reduced[d]) {
      s->folded.d[s->folded.rank] = shape.d[d];
      s->folded_strides.d[s->folded.rank++] = strides.d[d];
      *folded *= shape.d[d];
    } else {
      s->kept.d[s->kept.rank] = shape.d[d];
      s->kept_strides.d[s->kept.rank++] = strides.d[d];
      *outputs *= shape.d[d];
    }
  }
}

cudaError_t reduce(Reduce op, const float *x, const Dims &shape, const bool *reduced,
                   double divisor, float *y, cudaStream_t stream) {
  ReduceShape s;
  int64_t outputs = 0, folded = 0;
  split_reduce(shape, reduced, &s, &outputs, &folded);
  if (outputs == 0) return cudaSuccess;
  // A thread per output keeps the GPU busy when there are many; a block per
  // output when a few outputs each fold many elements (a full reduction).
  if (folded >= 8 * kThreads && outputs < 4096)
    STRATA_LAUNCH(reduce_block_kernel, static_cast<unsigned>(outputs), kThreads, 0, stream)
    (op, x, s, folded, divisor, y);
  else
    STRATA_LAUNCH(reduce_kernel, grid_for(outputs), kThreads, 0, stream)
    (op, x, s, outputs, folded, divisor, y);
  return cudaGetLastError();
}

cudaError_t softmax(const float *x, float *y, int64_t outer, int64_t axis, int64_t inner, bool log,
                    cudaStream_t stream) {
  const int64_t rows = outer * inner;
  if (rows == 0 || axis == 0) return cudaSuccess;
  STRATA_LAUNCH(softmax_kernel, static_cast<unsigned>(rows), kThreads, 0, stream)
  (x, y, axis, inner, log);
  return cudaGetLastError();
}

cudaError_t softmax_grad(const float *dy, const float *y, float *dx, int64_t outer, int64_t axis,
                         int64_t inner, bool log, cudaStream_t stream) {
  const int64_t rows = outer * inner;
  if (rows == 0 || axis == 0) return cudaSuccess;
  STRATA_LAUNCH(softmax_grad_kernel, static_cast<unsigned>(rows), kThreads, 0, stream)
  (dy, y, dx, axis, inner, log);
  return cudaGetLastError();
}

cudaError_t layer_norm(const float *x, const float *scale, const float *bias, float *y,
                       int64_t rows, int64_t cols, double epsilon, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  STRATA_LAUNCH(layer_norm_kernel, static_cast<unsigned>(rows), kThreads, 0, stream)
  (x, scale, bias, y, cols, epsilon);
  return cudaGetLastError();
}

cudaError_t layer_norm_grad(const float *dy, const float *x, const float *scale, float *dx,
                            float *dscale, float *dbias, int64_t rows, int64_t cols, double epsilon,
                            double *stats, cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  // With no rows dScale and dBias are zeros, as on the CPU.
  if (rows > 0)
    STRATA_LAUNCH(layer_norm_dx_kernel, static_cast<unsigned>(rows), kThreads, 0, stream)
    (dy, x, scale, dx, cols, epsilon);
  if (rows > 0)
    STRATA_LAUNCH(layer_norm_stats_kernel, static_cast<unsigned>(rows), kThreads, 0, stream)
    (x, cols, epsilon, stats);
  STRATA_LAUNCH(layer_norm_params_kernel, grid_for(cols), kThreads, 0, stream)
  (dy, x, stats, dscale, dbias, rows, cols);
  return cudaGetLastError();
}

cudaError_t batch_norm(const float *x, const float *scale, const float *bias, const float *mean,
                       const float *var, float *y, int64_t batch, int64_t channels, int64_t inner,
                       double epsilon, bool training, cudaStream_t stream) {
  if (channels == 0) return cudaSuccess;
  STRATA_LAUNCH(batch_norm_kernel, static_cast<unsigned>(channels), kThreads, 0, stream)
  (x, scale, bias, mean, var, y, batch, channels, inner, epsilon, training);
  return cudaGetLastError();
}

cudaError_t batch_norm_stats(const float *x, float *mean, float *var, int64_t batch,
                             int64_t channels, int64_t inner, cudaStream_t stream) {
  if (channels == 0) return cudaSuccess;
  STRATA_LAUNCH(batch_norm_stats_kernel, static_cast<unsigned>(channels), kThreads, 0, stream)
  (x, mean, var, batch, channels, inner);
  return cudaGetLastError();
}

cudaError_t batch_norm_grad(const float *dy, const float *x, const float *scale, float *dx,
                            float *dscale, float *dbias, int64_t batch, int64_t channels,
                            int64_t inner, double epsilon, cudaStream_t stream) {
  if (channels == 0) return cudaSuccess;
  STRATA_LAUNCH(batch_norm_grad_kernel, static_cast<unsigned>(channels), kThreads, 0, stream)
  (dy, x, scale, dx, dscale, dbias, batch, channels, inner, epsilon);
  return cudaGetLastError();
}

cudaError_t cross_entropy(const float *logits, const void *labels, int label_bytes, int64_t rows,
                          int64_t classes, int64_t ignore_index, int reduction, double *row_loss,
                          float *loss, int *bad_label, cudaStream_t stream) {
  if (rows == 0) {
    if (reduction != 2) return cudaMemsetAsync(loss, 0, sizeof(float), stream);
    return cudaSuccess;
  }
  STRATA_LAUNCH(cross_entropy_rows_kernel, static_cast<unsigned>(rows), kThreads, 0, stream)
  (logits, labels, label_bytes, classes, ignore_index, reduction, row_loss, loss, bad_label);
  if (reduction != 2)
    STRATA_LAUNCH(cross_entropy_reduce_kernel, 1, 1, 0, stream)
    (row_loss, labels, label_bytes, rows, ignore_index, reduction, loss);
  return cudaGetLastError();
}

cudaError_t cross_entropy_grad(const float *dloss, const float *logits, const void *labels,
                               int label_bytes, int64_t rows, int64_t classes, int64_t ignore_index,
                               int reduction, float *dlogits, int *bad_label, double *weight,
                               cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (reduction != 2)
    STRATA_LAUNCH(cross_entropy_weight_kernel, 1, 1, 0, stream)
    (dloss, labels, label_bytes, rows, ignore_index, reduction, weight);
  STRATA_LAUNCH(cross_entropy_grad_kernel, static_cast<unsigned>(rows), kThreads, 0, stream)
  (dloss, logits, labels, label_bytes, classes, ignore_index, reduction, weight, dlogits,
   bad_label);
  return cudaGetLastError();
}

cudaError_t vocab_parallel_stats(const float *piece, const void *labels, int label_bytes,
                                 int64_t rows, int64_t classes, int64_t first, int64_t total,
                                 int64_t ignore_index, float *stats, int *bad_label,
                                 cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  STRATA_LAUNCH(vocab_stats_kernel, static_cast<unsigned>(rows), kThreads, 0, stream)
  (piece, labels, label_bytes, classes, first, total, ignore_index, stats, bad_label);
  return cudaGetLastError();
}

cudaError_t vocab_parallel_cross_entropy(const void *labels, int label_bytes, const float *stats,
                                         int64_t rows, int64_t parts, int64_t total,
                                         int64_t ignore_index, int reduction, double *row_loss,
                                         float *loss, int *bad_label, cudaStream_t stream) {
  if (rows == 0) {
    if (reduction != 2) return cudaMemsetAsync(loss, 0, sizeof(float), stream);
    return cudaSuccess;
  }
  STRATA_LAUNCH(vocab_loss_rows_kernel, grid_for(rows), kThreads, 0, stream)
  (labels, label_bytes, stats, rows, parts, total, ignore_index, reduction, row_loss, loss,
   bad_label);
  if (reduction != 2)
    STRATA_LAUNCH(cross_entropy_reduce_kernel, 1, 1, 0, stream)
    (row_loss, labels, label_bytes, rows, ignore_index, reduction, loss);
  return cudaGetLastError();
}

cudaError_t vocab_parallel_cross_entropy_grad(const float *dloss, const float *piece,
                                              const void *labels, int label_bytes,
                                              const float *stats, int64_t rows, int64_t classes,
                                              int64_t parts, int64_t first, int64_t ignore_index,
                                              int reduction, float *dpiece, int *bad_label,
                                              double *weight, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (reduction != 2)
    STRATA_LAUNCH(cross_entropy_weight_kernel, 1, 1, 0, stream)
    (dloss, labels, label_bytes, rows, ignore_index, reduction, weight);
  STRATA_LAUNCH(vocab_grad_kernel, static_cast<unsigned>(rows), kThreads, 0, stream)
  (dloss, piece, labels, label_bytes, stats, classes, parts, first, ignore_index, reduction, weight,
   dpiece, bad_label);
  return cudaGetLastError();
}

cudaError_t gather(const float *data, int64_t outer, int64_t axis_size, int64_t inner,
                   const void *indices, int index_bytes, int64_t n, float *out, int *bad_index,
                   cudaStream_t stream, int64_t first, int64_t bound) {
  const int64_t total = outer * n * inner;
  if (total == 0) return cudaSuccess;
  STRATA_LAUNCH(gather_kernel, grid_for(total), kThreads, 0, stream)
  (data, outer, axis_size, inner, indices, index_bytes, n, out, bad_index, first,
   bound > 0 ? bound : axis_size);
  return cudaGetLastError();
}

size_t gather_grad_scratch(int64_t n, int64_t axis_size) {
  if (n <= 0 || n >= (int64_t{1} << 32) || axis_size >= (int64_t{1} << 32) - 1) return 0;
  const size_t temp = sort_temp_bytes(n, axis_size);
  if (temp == 0) return 0;
  return 4 * align256(static_cast<size_t>(n) * sizeof(uint32_t)) + temp;
}

cudaError_t gather_grad(const float *dy, int64_t outer, int64_t axis_size, int64_t inner,
                        const void *indices, int index_bytes, int64_t n, float *ddata,
                        int *bad_index, void *scratch, size_t scratch_bytes, cudaStream_t stream,
                        int64_t first, int64_t bound) {
  const int64_t total = outer * axis_size * inner;
  if (total == 0) return cudaSuccess;
  if (bound <= 0) bound = axis_size;
  const size_t needed = outer == 1 ? gather_grad_scratch(n, axis_size) : 0;
  if (needed == 0 || scratch == nullptr || scratch_bytes < needed) {
    STRATA_LAUNCH(gather_grad_kernel, grid_for(total), kThreads, 0, stream)
    (dy, outer, axis_size, inner, indices, index_bytes, n, ddata, bad_index, first, bound);
    return cudaGetLastError();
  }
  SortScratch s = carve(scratch, scratch_bytes, n);
  STRATA_LAUNCH(index_keys_kernel, grid_for(n), kThreads, 0, stream)
  (indices, index_bytes, n, axis_size, s.keys_in, s.positions_in, bad_index, first, bound);
  const cudaError_t sorted =
      cub::DeviceRadixSort::SortPairs(s.temp, s.temp_bytes, s.keys_in, s.keys_out, s.positions_in,
                                      s.positions_out, n, 0, key_bits(axis_size), stream);
  if (sorted != cudaSuccess) return sorted;
  STRATA_LAUNCH(sorted_gather_grad_kernel, grid_for(total), kThreads, 0, stream)
  (dy, axis_size, inner, s.keys_out, s.positions_out, n, ddata);
  return cudaGetLastError();
}

cudaError_t sum_squares_partials(const float *x, int64_t n, double *partials, cudaStream_t stream) {
  cudaError_t error = cudaMemsetAsync(partials, 0, kNormBlocks * sizeof(double), stream);
  if (error != cudaSuccess || n == 0) return error;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  STRATA_LAUNCH(sum_squares_kernel,
                static_cast<unsigned>(blocks < kNormBlocks ? blocks : kNormBlocks), kThreads, 0,
                stream)
  (x, n, partials);
  return cudaGetLastError();
}

cudaError_t finish_norm(const double *partials, int64_t inputs, bool pair, double max_norm,
                        float *out, cudaStream_t stream) {
  STRATA_LAUNCH(finish_norm_kernel, 1, 1, 0, stream)(partials, inputs, pair, max_norm, out);
  return cudaGetLastError();
}

cudaError_t add_pair(const float *pair, bool first, double *acc, cudaStream_t stream) {
  STRATA_LAUNCH(add_pair_kernel, 1, 1, 0, stream)(pair, first, acc);
  return cudaGetLastError();
}

cudaError_t finish_pairs(const double *acc, double max_norm, float *scale, cudaStream_t stream) {
  STRATA_LAUNCH(finish_pairs_kernel, 1, 1, 0, stream)(acc, max_norm, scale);
  return cudaGetLastError();
}

cudaError_t reduce_max_grad(const float *dy, const float *x, const Dims &shape, const bool *reduced,
                            float *dx, cudaStream_t stream) {
  int64_t total = 1;
  for (int d = 0; d < shape.rank; ++d)
    total *= shape.d[d];
  cudaError_t error = cudaMemsetAsync(dx, 0, static_cast<size_t>(total) * sizeof(float), stream);
  if (error != cudaSuccess || total == 0) return error;
  ReduceShape s;
  int64_t groups = 0, folded = 0;
  split_reduce(shape, reduced, &s, &groups, &folded);
  STRATA_LAUNCH(reduce_max_grad_kernel, grid_for(groups), kThreads, 0, stream)
  (dy, x, s, groups, folded, dx);
  return cudaGetLastError();
}

cudaError_t mse_loss(const float *p, const float *t, int64_t n, int reduction, double *partials,
                     float *loss, cudaStream_t stream) {
  if (reduction == 2) {
    if (n == 0) return cudaSuccess;
    STRATA_LAUNCH(mse_none_kernel, grid_for(n), kThreads, 0, stream)(p, t, n, loss);
    return cudaGetLastError();
  }
  cudaError_t error = cudaMemsetAsync(partials, 0, kNormBlocks * sizeof(double), stream);
  if (error != cudaSuccess) return error;
  if (n > 0) {
    const int64_t blocks = (n + kThreads - 1) / kThreads;
    STRATA_LAUNCH(mse_partials_kernel,
                  static_cast<unsigned>(blocks < kNormBlocks ? blocks : kNormBlocks), kThreads, 0,
                  stream)
    (p, t, n, partials);
  }
  STRATA_LAUNCH(mse_finish_kernel, 1, 1, 0, stream)(partials, n, reduction, loss);
  return cudaGetLastError();
}

cudaError_t mse_loss_grad(const float *dloss, const float *p, const float *t, int64_t n,
                          int reduction, float *dp, float *dt, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  STRATA_LAUNCH(mse_grad_kernel, grid_for(n), kThreads, 0, stream)
  (dloss, p, t, n, reduction, dp, dt);
  return cudaGetLastError();
}

} // namespace strata::cuda
