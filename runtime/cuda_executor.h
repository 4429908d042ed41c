// The single-device CUDA executor: a graph's step on one GPU.
//
// create() lays out all of the step's GPU memory as one allocation, sized
// before the first step: the activation arena of the compile-time memory plan
// (256-byte aligned), every parameter, state and constant tensor, staging for
// the graph's inputs and outputs, each node's scratch, cuBLASLt's workspace,
// and one error flag per node. A step then allocates nothing.
//
// run() copies the batch into the input staging and launches the step: the
// nodes' kernels (ops/kernels/cuda/cuda_ops.h), the copies of the outputs into
// their staging, then the state updates (new weights over old), which a step
// whose device checks failed (a label or index out of range) skips, as the CPU
// executor stops before its updates. With CUDA Graphs on (the default), the
// first run launches that sequence eagerly, the second captures it into a
// graph and every later run replays it, after checking that every buffer it
// binds is where and what it was at capture (runtime/gpu_placement.h's
// CaptureRecord). The results are the same either way: every kernel is
// deterministic.
//
// Without a GPU the executor cannot be created (the error says why), but
// check_cuda_ops() tells, without one, which ops of a graph the backend lacks.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "graph/host_tensor.h"
#include "runtime/step_runner.h"

namespace strata::runtime {

struct CudaExecutorOptions {
  std::string model_dir = "."; // external data paths are relative to it
  int gpu = 0;                 // CUDA device ordinal
  bool cuda_graph = true;      // false: launch every node eagerly each step
  bool tf32 = false;           // f32 GEMMs may use TF32 tensor cores
  int64_t workspace_bytes = 32 << 20;
};

// Whether this build has the CUDA backend and this machine a GPU it can use:
// an empty string when it can, else the reason (no CUDA in the build, no
// driver, no device).
std::string cuda_unavailable_reason();

// The ops the CUDA backend runs (none without CUDA in the build), sorted.
std::vector<std::string_view> cuda_backend_ops();

// OK when the CUDA backend has a kernel for every node of `graph`; otherwise
// one error naming every op it lacks with the nodes that use it.
Status check_cuda_ops(const Graph &graph);

class CudaExecutor : public StepRunner {
public:
  static Result<std::unique_ptr<CudaExecutor>> create(Graph graph,
                                                      const CudaExecutorOptions &options = {});
  ~CudaExecutor() override;

  const Graph &graph() const override { return graph_; }
  Status run(llvm::ArrayRef<HostTensor> inputs, std::vector<HostTensor> *outputs) override;
  // Reads the tensor back from the GPU (waits for the step in flight).
  const HostTensor &value(TensorId id) const override;
  Status assign(TensorId id, const HostTensor &value) override;

  // Bytes of the one GPU allocation.
  int64_t device_bytes() const;
  // Steps launched from the captured graph (0 without CUDA Graphs).
  int64_t replays() const;

private:
  CudaExecutor() = default;
  Graph graph_;
  struct State;
  std::unique_ptr<State> state_;
};

} // namespace strata::runtime
