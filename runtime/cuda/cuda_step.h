// What the CUDA executors share (CUDA builds only): error checks, a bounded
// wait for a stream, and the launch of a step as a CUDA Graph.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "graph/graph.h"
#include "graph/status.h"
#include "ops/kernels/cuda/launch.h"
#include "runtime/cuda/gpu_placement.h"

namespace strata::runtime {

// cuda::cuda_status (ops/kernels/cuda/cuda_status.h): OK, or "CUDA <what>:
// <CUDA's reason>" as resource_exhausted (out of GPU memory), unavailable (no
// usable device or driver) or internal, with CUDA's last error cleared so
// later calls do not report it again.
Status cuda_check(cudaError_t error, std::string_view what);

// "GPU 0 (NVIDIA H100 80GB HBM3)", or "GPU 0" where CUDA cannot say: the name
// is for messages, so CUDA's error is cleared, not reported.
std::string gpu_name(int gpu);

// Waits until `stream` has finished its work: spins for 2 ms (a short step
// should not pay a sleep's latency), then naps up to 1 ms at a time; a GPU
// that does not finish within `timeout` is an error naming `what`. Once it
// naps, `check` (where given) is asked between naps; an error from it (a
// communicator's asynchronous error, another GPU's failure) ends the wait.
Status wait_for_stream(cudaStream_t stream, std::string_view what,
                       std::chrono::milliseconds timeout = std::chrono::minutes(10),
                       const std::function<Status()> &check = {});

// The one-kernel program of an elementwise chain (passes/fuse_elementwise.h,
// in order): each node a step on the running value, its other operands read
// from `address(tensor)`: densely, as a scalar, or through broadcast strides.
Result<std::unique_ptr<cuda::Fused>>
fused_chain_program(const Graph &graph, const std::vector<NodeId> &chain,
                    const std::function<const void *(TensorId)> &address);

// A step launched as a CUDA Graph: the first launch runs `enqueue` eagerly
// (kernels load, cuBLASLt and cuDNN settle on their algorithms), the second
// captures it into a graph and every later launch replays that graph, after
// checking that `record()` binds the buffers the capture did. Without graphs
// every launch runs `enqueue` eagerly.
class CapturedStep {
public:
  CapturedStep() = default;
  CapturedStep(const CapturedStep &) = delete;
  CapturedStep &operator=(const CapturedStep &) = delete;
  ~CapturedStep();

  Status launch(cudaStream_t stream, bool use_graph, const std::function<Status()> &enqueue,
                const std::function<CaptureRecord()> &record);
  int64_t replays() const { return replays_; }
  // Whether the next launch (with graphs on) replays the captured graph: it
  // enqueues nothing itself, so it never waits on another GPU's host thread.
  bool replays_next() const { return exec_ != nullptr; }
  // Destroys the graph (before the streams and memory it uses go); the next
  // launch captures again.
  void reset();

private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  CaptureRecord capture_;
  int64_t launches_ = 0, replays_ = 0;
};

} // namespace strata::runtime
