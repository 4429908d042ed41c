// A CUDA emulator for strata's kernels, for tests on machines without a GPU.
//
// The kernel files (ops/kernels/cuda/*.cu) compile as C++ with
// kernel_language.h included first (see the *_emulated.cc files beside it). A launch,
// STRATA_LAUNCH(kernel, grid, block, shared, stream)(arguments...), then runs
// on the calling host thread before it returns: block after block, each
// thread of a block a fiber (ucontext) that runs until it finishes or reaches
// __syncthreads() or a warp shuffle, where it waits for the others. Shared
// memory is a static variable per kernel, which is per block because blocks
// run one after another.
//
// What it catches: indexing and logic errors (against the CPU kernels, in the
// tests), a __syncthreads() that some threads of a block never reach, a
// shuffle with lanes of its warp gone, launch shapes CUDA refuses. What it
// cannot: races between threads (they interleave only at barriers), device
// math that rounds unlike glibc (expf, tanhf, erff, ...), and the timing of
// streams (every call completes before it returns). cuBLASLt, cuDNN, CUDA
// Graphs and NCCL are not emulated.
//
// The host side of the CUDA runtime the kernels' callers use (cudaMemsetAsync,
// cudaMemcpyAsync, cudaGetLastError, ...) is defined in cuda_emulator.cc over
// host memory, so a test binary links that instead of libcudart.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

namespace strata::cuda_emulator {

// The running thread's coordinates (valid inside a launch only).
uint3 thread_index();
uint3 block_index();
dim3 block_dim();
dim3 grid_dim();

// __syncthreads(): wait until every thread of the block is here.
void sync_threads();
// A shuffle's exchange within the warp: publish `bytes` of `value`, wait
// for every lane of the warp, copy lane `source`'s value (or keep ours when
// there is no such lane) into `value`, and wait again before anyone publishes
// anew.
void exchange_in_warp(void *value, size_t bytes, int source);

// Runs `thread` as every thread of a grid; a launch error (the shape CUDA
// refuses, a barrier some thread never reaches) is kept for cudaGetLastError.
// `kernel` names it in errors.
void run_grid(const char *kernel, dim3 grid, dim3 block, size_t shared_bytes,
              const std::function<void()> &thread);

// What went wrong in the last failed launch, in words ("" if none since the
// last call); cudaGetLastError returns its code.
std::string last_error_message();

// Launches so far (tests check a path launched what they expect).
int64_t launches();

template <typename Kernel> struct Launch {
  const char *name;
  dim3 grid, block;
  size_t shared_bytes;
  cudaStream_t stream;
  Kernel kernel;
  template <typename... Arguments> void operator()(Arguments... arguments) const {
    run_grid(name, grid, block, shared_bytes, [&] { kernel(arguments...); });
  }
};
template <typename Kernel>
Launch(const char *, dim3, dim3, size_t, cudaStream_t, Kernel) -> Launch<Kernel>;

} // namespace strata::cuda_emulator
