// A CUDA emulator, for tests on machines without a GPU: strata's kernels, the
// CUDA runtime, cuBLASLt, cuDNN and NCCL on the host. A test program links
// the CUDA backend's own object files against it instead of nvcc's kernels
// and NVIDIA's libraries (tests/runtime/meson.build). It needs the CUDA
// toolkit's headers (it is built where the CUDA backend is), not a GPU.
// Linked so: cuda_emulation_test (every CUDA op against the CPU kernel, and
// the emulator's own checks), cuda_executor_emulated_test* (the GPU tests of
// cuda_executor_test: the executor and the pipeline runner against the CPU)
// and strata_emulated, the CLI, which cli_emulated_test runs for the CLI's
// CUDA cases. The last two run with two emulated GPUs, so runs over several
// GPUs and NCCL are tested too.
//
// Kernels. The kernel files (ops/kernels/cuda/*.cu) compile as C++ with
// kernel_language.h included first (the *_emulated.cc files beside this),
// with 64-thread blocks where a GPU runs 256 (grid.cuh's kThreads: a fiber
// switch per thread per barrier is the emulator's main cost).
// A launch, STRATA_LAUNCH(kernel, grid, block, shared, stream)(arguments...),
// queues the grid on its stream. It runs block after block, each thread of
// a block a fiber that runs until it finishes or reaches __syncthreads() or
// a warp shuffle, where it waits for the others. Shared memory is a static
// variable per kernel, per block because blocks run one after another.
//
// Streams (cuda_runtime.cc). Device memory is host memory. Work queues on its
// stream and runs only when something must wait for it (a query, a
// synchronizing call, a copy to host memory), and then only what that needs:
// the stream's work in order, and other streams' as far as a wait at its
// head demands. Work nothing waits for runs as late as it can, so work that
// should have waited for it and did not reads stale data, and a test fails
// where a GPU would race. Copies from host memory read it at the call, as
// from pageable memory. Captures follow CUDA's rules: work on a capturing
// stream is recorded, another stream joins by waiting on an event recorded in
// the capture (one recorded outside it is refused), the capture must end with
// every joined stream's work joined back, and calls that would synchronize or
// allocate while the calling thread captures fail and spoil it. A replay
// queues the nodes in an order their edges allow, the latest ready first.
//
// Libraries. cuBLASLt (cublaslt.cc) keeps its descriptors, multiplies in
// double (TF32 inputs rounded), reads host scalars at the call and device
// scalars when it runs, and refuses operands less aligned than its algorithm
// was chosen for. cuDNN (cudnn.cc): convolutions (refusing the algorithms its
// query offered as non-deterministic or too greedy), pooling, batch norm.
// NCCL (nccl.cc): a call waits at the head of its stream until every rank's
// part has reached the head of its own, then runs once.
// The number of GPUs is STRATA_CUDA_EMULATOR_GPUS (default 1).
//
// What it catches: indexing and logic errors (against the CPU, in the tests),
// a __syncthreads() some threads of a block never reach, a shuffle with lanes
// of its warp gone, launch shapes CUDA refuses, missing stream and event
// dependencies, captures CUDA would refuse, misaligned GEMM operands, NCCL
// calls the ranks issue differently, and kernels, event records and NCCL
// calls on another GPU's stream than the current one (cudaSetDevice).
//
// What it cannot: most races between threads of a kernel (they interleave
// only at barriers, first to last in even blocks and last to first in odd
// ones, and shared memory keeps the last block's contents), host code reading device memory or one
// GPU's kernels another's (all is host memory), device math that rounds unlike glibc (expf, tanhf,
// erff, ...), the 256-thread blocks themselves, cuBLASLt's and cuDNN's own
// summation orders, algorithms and workspaces, and anything about speed.
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
// __shfl_down_sync's exchange within the warp (lanes by linear thread index):
// publish `bytes` of `value`, wait for every lane of the warp, copy the value
// of the lane `delta` above ours (or keep ours past the warp's end), and wait
// again before anyone publishes anew.
void exchange_in_warp(void *value, size_t bytes, int delta);

// Runs `thread` as every thread of a grid, now (the queued work of a launch). A barrier some thread
// never reaches fails the launch: the error is kept for cudaGetLastError and, as a GPU's fault is,
// for every later call (sticky until reset()). `kernel` names it in errors.
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
// With `on_current_gpu`, the stream must be the current GPU's, as CUDA
// requires of a kernel launch.
cudaError_t enqueue_made(cudaStream_t stream, const char *what, Make make,
                         bool on_current_gpu = false);

// Work on a stream: queued, or recorded while the stream is being captured
// into a CUDA Graph (cudaGraphLaunch queues it again). What CUDA refuses at
// the call (a launch shape, the legacy stream during a capture) is returned.
cudaError_t enqueue(cudaStream_t stream, const char *what, std::function<void()> work);

// The GPU a stream belongs to (the current one for the legacy stream), and
// the calling thread's current GPU (cudaSetDevice).
int stream_device(cudaStream_t stream);
int current_gpu();

// A kernel launch: checks the shape, then enqueues the grid.
cudaError_t launch(const char *kernel, dim3 grid, dim3 block, size_t shared_bytes,
                   cudaStream_t stream, std::function<void()> thread);

// What went wrong last, in words ("" if nothing yet).
std::string last_error_message();
// Clears a sticky fault (tests that fault on purpose).
void reset();

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
