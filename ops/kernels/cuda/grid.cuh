// Launch shapes shared by strata's CUDA kernels (included by .cu files only).
#pragma once

#include <cstdint>

namespace strata::cuda {

// Threads per block of every kernel; the block reductions need a power of two
// of at least a warp. The CUDA emulator of the tests runs 64: each thread is a
// fiber there, and a block's barriers cost a switch per thread.
#if defined(STRATA_CUDA_EMULATOR)
constexpr int kThreads = 64;
#else
constexpr int kThreads = 256;
#endif

// Blocks for n elements at kThreads per block, capped (grid-stride loops cover
// the rest) and at least 1.
inline unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 * 16 ? (blocks > 0 ? blocks : 1) : 65535 * 16);
}

} // namespace strata::cuda

// kernel<<<grid, block, shared, stream>>>, written STRATA_LAUNCH(kernel, grid,
// block, shared, stream)(arguments...). The CUDA emulator of the tests
// (tests/cuda_emulator) compiles these files as C++ and runs the launch on the
// host, each thread a fiber; nvcc sees the chevrons.
#if defined(STRATA_CUDA_EMULATOR)
#define STRATA_LAUNCH(kernel, grid, block, shared, stream)                                         \
  ::strata::cuda_emulator::Launch {                                                                \
#kernel, (grid), (block), (shared), (stream), [](auto... arguments) { kernel(arguments...); }  \
  }
#else
#define STRATA_LAUNCH(kernel, grid, block, shared, stream)                                         \
  kernel<<<(grid), (block), (shared), (stream)>>>
#endif

// for (i = this thread's first element; i < n; i += every thread of the grid)
#define STRATA_GRID_STRIDE(i, n)                                                                   \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n);           \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)
