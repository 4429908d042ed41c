// The pipeline runner's own kernels: gradient accumulation over micro-batches,
// the mean's division, and the sum of a group's buffers on one GPU.
#include "ops/kernels/cuda/grid.cuh"
#include "ops/kernels/cuda/launch.h"

namespace strata::cuda {
namespace {

__global__ void accumulate_kernel(float *acc, const float *src, int64_t n) {
  STRATA_GRID_STRIDE(i, n) { acc[i] += src[i]; }
}

__global__ void divide_kernel(float *acc, float divisor, int64_t n) {
  STRATA_GRID_STRIDE(i, n) { acc[i] /= divisor; }
}

// Every element reads all members' values first, then writes the sum to every
// out, so an out may be an in (in place). Element i is (row, e) of [rows,
// run]; the ins are read at row * pitch + offset + e.
__global__ void sum_members_kernel(Members members, int64_t rows, int64_t run, int64_t pitch,
                                   int64_t offset) {
  STRATA_GRID_STRIDE(i, rows * run) {
    const int64_t at = (i / run) * pitch + offset + i % run;
    float sum = members.in[0][at];
    for (int m = 1; m < members.count; ++m)
      sum += members.in[m][at];
    for (int o = 0; o < members.outs; ++o)
      members.out[o][i] = sum;
  }
}

} // namespace

cudaError_t accumulate(float *acc, const float *src, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  STRATA_LAUNCH(accumulate_kernel, grid_for(n), kThreads, 0, stream)(acc, src, n);
  return cudaGetLastError();
}

cudaError_t divide(float *acc, float divisor, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  STRATA_LAUNCH(divide_kernel, grid_for(n), kThreads, 0, stream)(acc, divisor, n);
  return cudaGetLastError();
}

cudaError_t sum_members_block(const Members &members, int64_t rows, int64_t run, int64_t pitch,
                              int64_t offset, cudaStream_t stream) {
  if (rows <= 0 || run <= 0) return cudaSuccess;
  if (members.count < 1 || members.count > kMaxMembers || members.outs < 0 ||
      members.outs > kMaxMembers)
    return cudaErrorInvalidValue;
  STRATA_LAUNCH(sum_members_kernel, grid_for(rows * run), kThreads, 0, stream)
  (members, rows, run, pitch, offset);
  return cudaGetLastError();
}

cudaError_t sum_members(const Members &members, int64_t n, cudaStream_t stream) {
  return sum_members_block(members, 1, n, n, 0, stream);
}

} // namespace strata::cuda
