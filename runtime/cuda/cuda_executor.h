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
// binds is where and what it was at capture (runtime/cuda/gpu_placement.h's
// CaptureRecord). The results are the same either way: every kernel is
// deterministic. How each op runs, and why its bits repeat:
// ops/kernels/cuda/cuda_ops.h and launch.h.
//
// Without a GPU the executor cannot be created (the error says why), but
// check_cuda_ops() tells, without one, which ops of a graph the backend lacks.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "graph/host_tensor.h"
#include "passes/plan_memory.h"

#include "runtime/step_runner.h"

namespace strata::runtime {

struct CudaExecutorOptions {
  std::string model_dir = "."; // external data paths are relative to it
  int gpu = 0;                 // CUDA device ordinal
  bool cuda_graph = true;      // false: launch every node eagerly each step
  bool tf32 = false;           // f32 GEMMs may use TF32 tensor cores
  // Mixed precision (--precision bf16): MatMul and Gemm multiply their operands
  // rounded to bf16 on the tensor cores, accumulating in f32; weights, optimizer
  // state, activations and every other op stay f32 (the master copy).
  bool bf16 = false;
  // --precision f16: the same with f16 operands, each scaled on the device by
  // a power of two that fits its largest magnitude into f16's range (no loss
  // scaling needed; cuda::to_f16_scaled). Not together with bf16.
  bool f16 = false;
  // Run chains of elementwise nodes as one kernel each (passes/
  // fuse_elementwise.h): the same bits, fewer launches and no intermediates
  // written. false: every node on its own (for comparison).
  bool fuse = true;
  // Pooling and batch norm through cuDNN where it computes the node as strata
  // defines it (ops::cudnn_pool_mismatch: no dilation, even padding, output
  // rounded down); elsewhere, or false, strata's kernels, which match the CPU
  // element for element. cuDNN's results agree within rounding.
  bool cudnn_pool_norm = true;
  int64_t workspace_bytes = 32 << 20;
  // For tests: every buffer (intermediates too, outside the shared arena) gets
  // at least this many guard bytes after it, filled with kGuardByte at load;
  // check_guards() says whether a kernel wrote into one.
  int64_t guard_bytes = 0;
};
constexpr uint8_t kGuardByte = 0xA5;

// Whether this build has the CUDA backend and this machine a GPU it can use:
// an empty string when it can, else the reason (no CUDA in the build, no
// driver, no device).
std::string cuda_unavailable_reason();
// How many GPUs this process can use (0 without CUDA, driver or device).
int cuda_device_count();

// The ops the CUDA backend runs (none without CUDA in the build), sorted.
std::vector<std::string_view> cuda_backend_ops();

// OK when the CUDA backend has a kernel for every node of `graph`; otherwise
// one error naming every op it lacks with the nodes that use it. A runner
// that runs some nodes itself (the pipeline runner's tensor-parallel
// collectives) names them with `runs_elsewhere`; ops on a piece of a tensor
// split over `parts` members (vocabulary-parallel tables and losses) run only
// where the devices are in tensor-parallel groups of that size.
Status check_cuda_ops(const Graph &graph,
                      const std::function<bool(const Node &)> &runs_elsewhere = {},
                      int tensor_parallel = 1);

// The one GPU allocation of a CudaExecutor, laid out before anything is
// allocated (so it is tested without a GPU). Byte offsets from its start; every
// region starts at a multiple of kCudaAlignment and the regions do not overlap:
// the activation arena of the memory plan at 0, then each parameter, state and
// constant tensor, each value computed at load (Constant nodes), each node's
// scratch, input staging, output staging, the cuBLASLt/cuDNN workspace, and
// one error flag per node plus the step's "any failed" flag.
constexpr int64_t kCudaAlignment = 256;
struct CudaLayout {
  std::vector<NodeId> order;          // the nodes, in the order a step runs them
  passes::MemoryPlan plan;            // the activation arena (offsets per tensor)
  std::vector<int64_t> tensor;        // per tensor: its region, or -1
  std::vector<int64_t> constant;      // per step: the value computed at load, or -1
  std::vector<int64_t> scratch;       // per step: the node's scratch, or -1
  std::vector<int64_t> scratch_bytes; // per step
  std::vector<int64_t> input, output; // per graph input / output: staging
  int64_t workspace = 0, workspace_bytes = 0;
  int64_t bf16 = -1, bf16_bytes = 0;       // with bf16 or f16: the GEMM operands' staging
  std::vector<std::vector<NodeId>> chains; // with fuse: passes/fuse_elementwise.h
  int64_t flags = 0;                       // (steps + 1) ints
  int64_t total = 0;
  // With guard bytes: the bytes after each region, and what the region holds.
  struct Guard {
    int64_t offset = 0, bytes = 0;
    std::string after;
  };
  std::vector<Guard> guards;
};
// Errors: what check_cuda_ops says, a graph that is not a DAG. With
// guard_bytes > 0 every intermediate gets its own region (no arena) and every
// region at least that many guard bytes after it.
// With bf16 (true for --precision bf16 or f16), a region for the largest
// GEMM's operands in half precision and their scales (one stream runs
// the nodes one after another, so they share it). With fuse, the elementwise
// chains the executor runs as one kernel each, and a memory plan in which
// each chain reads and writes at its last node's step.
Result<CudaLayout> cuda_layout(const Graph &graph, int64_t workspace_bytes, int64_t guard_bytes = 0,
                               bool bf16 = false, bool fuse = false);

class CudaExecutor : public StepRunner {
public:
  static Result<std::unique_ptr<CudaExecutor>> create(Graph graph,
                                                      const CudaExecutorOptions &options = {});
  ~CudaExecutor() override;

  const Graph &graph() const override { return graph_; }
  Status run(llvm::ArrayRef<HostTensor> inputs, std::vector<HostTensor> *outputs) override;
  // Reads the tensor back from the GPU (waits for the step in flight).
  const HostTensor &value(TensorId id) const override;
  Status read_status() const override;
  double issue_seconds() const override { return issue_seconds_; }
  Status assign(TensorId id, const HostTensor &value) override;

  // Bytes of the one GPU allocation.
  int64_t device_bytes() const;
  // Steps launched from the captured graph (0 without CUDA Graphs).
  int64_t replays() const;
  // Elementwise chains run as one kernel each (CudaExecutorOptions::fuse).
  int64_t fused_chains() const;
  // "GPU 0 (NVIDIA H100 80GB HBM3)".
  std::string device_name() const;
  // One step run eagerly with an event after every node: each node's GPU
  // milliseconds, by node id (a fused chain's on its last node, 0 on the
  // others). A real step: a training graph's weights update.
  Result<std::vector<double>> node_times(llvm::ArrayRef<HostTensor> inputs);
  // With CudaExecutorOptions::guard_bytes: an error naming the first buffer
  // whose guard bytes changed (waits for the step in flight).
  Status check_guards() const;

private:
  CudaExecutor() = default;
  Status run_step(llvm::ArrayRef<HostTensor> inputs, std::vector<HostTensor> *outputs,
                  std::vector<double> *times);
  Graph graph_;
  struct State;
  std::unique_ptr<State> state_;
  double issue_seconds_ = -1;
};

} // namespace strata::runtime
