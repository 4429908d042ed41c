#include "ops/kernels/cuda/probe.h"

#include <cuda_runtime.h>

namespace strata::cuda {
namespace {

__global__ void fill_kernel(float *out, int n, float value) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value;
}

void fill_impl(cudaStream_t stream, float *out, int n, float value) {
  int threads = 256;
  fill_kernel<<<(n + threads - 1) / threads, threads, 0, stream>>>(out, n, value);
}

} // namespace

int device_count(std::string *reason) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError(); // clear the sticky error
    if (reason) *reason = cudaGetErrorString(err);
    return 0;
  }
  if (count == 0 && reason) *reason = "no CUDA device found";
  return count;
}

bool fill_roundtrip(float *host, int n, float value, std::string *reason) {
  float *device = nullptr;
  cudaError_t err = cudaMalloc(&device, sizeof(float) * n);
  if (err == cudaSuccess) {
    fill_impl(nullptr, device, n, value);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) err = cudaMemcpy(host, device, sizeof(float) * n, cudaMemcpyDeviceToHost);
  if (device) cudaFree(device);
  if (err != cudaSuccess) {
    if (reason) *reason = cudaGetErrorString(err);
    return false;
  }
  return true;
}

} // namespace strata::cuda
