// CUDA C++'s device-side language for the host compiler: what strata's
// kernel files use, mapped onto the CUDA emulator (cuda_emulator.h). Include
// it before a kernel file, and nowhere else: it redefines CUDA's keywords.
#pragma once

// grid.cuh's STRATA_LAUNCH launches through the emulator.
#define STRATA_CUDA_EMULATOR 1

#include "tests/cuda_emulator/cuda_emulator.h"

#include <cmath>
#include <cstring>

// The CUDA C++ the kernels use, for the host compiler.
#undef __global__
#undef __device__
#undef __shared__
#undef __host__
#undef __forceinline__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define threadIdx (::strata::cuda_emulator::thread_index())
#define blockIdx (::strata::cuda_emulator::block_index())
#define blockDim (::strata::cuda_emulator::block_dim())
#define gridDim (::strata::cuda_emulator::grid_dim())

inline void __syncthreads() { ::strata::cuda_emulator::sync_threads(); }

template <typename T> T __shfl_down_sync(unsigned mask, T value, unsigned delta) {
  (void)mask; // every kernel of strata shuffles with the full warp
  ::strata::cuda_emulator::exchange_in_warp(&value, sizeof value, static_cast<int>(delta));
  return value;
}

inline unsigned __float_as_uint(float x) {
  unsigned u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
// Fibers of one host thread never run at once: a plain read-modify-write.
inline unsigned atomicMax(unsigned *address, unsigned value) {
  const unsigned old = *address;
  if (value > old) *address = value;
  return old;
}
// CUDA's overloads in the global namespace.
using std::isfinite;
using std::max;
using std::min;
