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
// member, so the buffers may be the members' own (in place).
__global__ void sum_members_kernel(Members members, int64_t n) {
  STRATA_GRID_STRIDE(i, n) {
    float sum = members.in[0][i];
    for (int m = 1; m < members.count; ++m)
      sum += members.in[m][i];
    for (int m = 0; m < members.count; ++m)
      members.out[m][i] = sum;
  }
}

} // namespace

cudaError_t accumulate(float *acc, const float *src, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  accumulate_kernel<<<grid_for(n), kThreads, 0, stream>>>(acc, src, n);
  return cudaGetLastError();
}

cudaError_t divide(float *acc, float divisor, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  divide_kernel<<<grid_for(n), kThreads, 0, stream>>>(acc, divisor, n);
  return cudaGetLastError();
}

cudaError_t sum_members(const Members &members, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (members.count < 1 || members.count > kMaxMembers) return cudaErrorInvalidValue;
  sum_members_kernel<<<grid_for(n), kThreads, 0, stream>>>(members, n);
  return cudaGetLastError();
}

} // namespace strata::cuda
