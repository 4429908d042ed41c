// A CUDA emulator, for tests on machines without a GPU: strata's kernels, the
// CUDA runtime and cuBLASLt on the host.
//
// Kernels. The kernel files (ops/kernels/cuda/*.cu) compile as C++ with
// kernel_language.h included first (the *_emulated.cc files beside this).
// A launch, STRATA_LAUNCH(kernel, grid, block, shared, stream)(arguments...),
// runs on the calling host thread before it returns (on a stream being
// captured: when the CUDA Graph is launched), block after block, each thread
// of a block a fiber (ucontext) that runs until it finishes or reaches
// __syncthreads() or a warp shuffle, where it waits for the others. Shared
// memory is a static variable per kernel, per block because blocks run one
// after another.
//
// Runtime (cuda_runtime.cc) and cuBLASLt (cublaslt.cc). Device memory is host
// memory. Work on a stream is done when it is enqueued; streams are ordered,
// and so trivially joined. Captures follow CUDA's rules: work on a capturing
// stream is recorded, another stream joins the capture by waiting on an event
// recorded in it, the capture ends unjoined streams refused, and calls that
// would synchronize or allocate while the calling thread captures fail and
// invalidate it. cuBLASLt keeps its descriptors, runs the product in double,
// rounds TF32 inputs, and refuses operands less aligned than the algorithm
// was chosen for. The number of GPUs is STRATA_CUDA_EMULATOR_GPUS (default 1).
//
// What it catches: indexing and logic errors (against the CPU, in the tests),
// a __syncthreads() some threads of a block never reach, a shuffle with lanes
// of its warp gone, launch shapes CUDA refuses, captures that CUDA would
// refuse, misaligned GEMM operands. What it cannot: races between threads
// (they interleave only at barriers) or between streams (work never overlaps),
// device math that rounds unlike glibc (expf, tanhf, erff, ...), cuDNN and
// NCCL, which are not emulated, and anything about speed.
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

// Runs `thread` as every thread of a grid, now. A barrier some thread never
// reaches fails the launch: the error is kept for cudaGetLastError and, as a
// GPU's fault is, for every later call (sticky until reset()). `kernel` names
// it in errors.
cudaError_t run_grid(const char *kernel, dim3 grid, dim3 block, size_t shared_bytes,
                     const std::function<void()> &thread);

// What a piece of work does when it runs and, for work that meets other
// GPUs' (NCCL calls), whether it can run yet (asked only when the work is
// next on its stream; null: always).
struct Work {
  std::function<void()> run;
  std::function<bool()> ready;
};
// Makes the work anew each time it is queued: a captured NCCL call meets its
// peers afresh at every replay of the graph.
using Make = std::function<Work()>;

// Work made by `make`, on a stream (see enqueue).
cudaError_t enqueue_made(cudaStream_t stream, const char *what, Make make);

// Work on a stream: done now, or recorded while the stream is being captured
// into a CUDA Graph (cudaGraphLaunch replays it). What CUDA refuses at the
// call (a launch shape, a stream of another capture) is returned.
cudaError_t enqueue(cudaStream_t stream, const char *what, std::function<void()> work);

// A kernel launch: checks the shape, then enqueues the grid.
cudaError_t launch(const char *kernel, dim3 grid, dim3 block, size_t shared_bytes,
                   cudaStream_t stream, std::function<void()> thread);

// What went wrong last, in words ("" if nothing yet).
std::string last_error_message();
// Clears a sticky fault (tests that fault on purpose).
void reset();

// Kernel launches run so far.
int64_t launches();

template <typename Kernel> struct Launch {
  const char *name;
  dim3 grid, block;
  size_t shared_bytes;
  cudaStream_t stream;
  Kernel kernel;
  // The arguments are copied, as CUDA copies them at the launch.
  template <typename... Arguments> void operator()(Arguments... arguments) const {
    launch(name, grid, block, shared_bytes, stream,
           [kernel = kernel, arguments...] { kernel(arguments...); });
  }
};
template <typename Kernel>
Launch(const char *, dim3, dim3, size_t, cudaStream_t, Kernel) -> Launch<Kernel>;

} // namespace strata::cuda_emulator
