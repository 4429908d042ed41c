// The CUDA emulator's self-test kernels (see self_test_kernels.h), written as
// strata's kernel files are and compiled for the emulator.
#include "tests/cuda_emulator/kernel_language.h"

#include "ops/kernels/cuda/grid.cuh"
#include "tests/cuda_emulator/self_test_kernels.h"

namespace strata::cuda_emulator::self_test {
namespace {

__global__ void block_sums_kernel(const float *x, float *sums) {
  __shared__ float partial[256];
  const unsigned t = threadIdx.x;
  partial[t] = x[blockIdx.x * 256 + t];
  __syncthreads();
  for (unsigned width = 128; width >= 32; width /= 2) {
    if (t < width) partial[t] += partial[t + width];
    __syncthreads();
  }
  if (t >= 32) return;
  float v = partial[t];
  for (int offset = 16; offset > 0; offset /= 2)
    v += __shfl_down_sync(0xffffffffu, v, offset);
  if (t == 0) sums[blockIdx.x] = v;
}

__global__ void coordinates_kernel(int *out) {
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
  out[block * threads + thread] =
      static_cast<int>(threadIdx.x + 1000 * threadIdx.y + 100000 * threadIdx.z +
                       10000000 * (blockIdx.x + 10 * blockIdx.y + 100 * blockIdx.z));
}

__global__ void divergent_barrier_kernel(int *out) {
  if (threadIdx.x >= 100) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void half_warp_shuffle_kernel(float *out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1.0f, 1);
}

__global__ void oversized_block_kernel(int *out) { out[threadIdx.x] = 1; }

__global__ void neighbour_read_kernel(int *out, int base, bool with_barrier) {
  __shared__ int slot[64];
  slot[threadIdx.x] = base + 100 * static_cast<int>(blockIdx.x) + static_cast<int>(threadIdx.x);
  if (with_barrier) __syncthreads();
  out[blockIdx.x * 64 + threadIdx.x] = slot[(threadIdx.x + 1) % 64];
}

// The launch's error, else the device's once the work is done.
cudaError_t finish() {
  const cudaError_t launched = cudaGetLastError();
  if (launched != cudaSuccess) return launched;
  return cudaDeviceSynchronize();
}

} // namespace

cudaError_t block_sums(const float *x, float *sums, unsigned blocks) {
  STRATA_LAUNCH(block_sums_kernel, blocks, 256, 0, nullptr)(x, sums);
  return finish();
}

cudaError_t coordinates(int *out, dim3 grid, dim3 block) {
  STRATA_LAUNCH(coordinates_kernel, grid, block, 0, nullptr)(out);
  return finish();
}

cudaError_t divergent_barrier(int *out) {
  STRATA_LAUNCH(divergent_barrier_kernel, 1, 128, 0, nullptr)(out);
  return finish();
}

cudaError_t half_warp_shuffle(float *out) {
  STRATA_LAUNCH(half_warp_shuffle_kernel, 1, 32, 0, nullptr)(out);
  return finish();
}

cudaError_t oversized_block(int *out) {
  STRATA_LAUNCH(oversized_block_kernel, 1, 2048, 0, nullptr)(out);
  return finish();
}

cudaError_t neighbour_read(int *out, int base, bool with_barrier) {
  STRATA_LAUNCH(neighbour_read_kernel, 2, 64, 0, nullptr)(out, base, with_barrier);
  return finish();
}

} // namespace strata::cuda_emulator::self_test
