#include "strata_config.h"

#if STRATA_HAVE_CUDA

#include "runtime/cuda/cuda_step.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include "ops/kernels/cuda/cuda_ops.h"
#include "ops/kernels/cuda/cuda_status.h"
#include "ops/registry.h"

namespace strata::runtime {

Status cuda_check(cudaError_t error, std::string_view what) {
  return cuda::cuda_status(error, what);
}

std::string gpu_name(int gpu) {
  cudaDeviceProp properties = {};
  if (!cuda_check(cudaGetDeviceProperties(&properties, gpu), "device properties").is_ok())
    return str_cat("GPU ", gpu);
  return str_cat("GPU ", gpu, " (", properties.name, ")");
}

Status wait_for_stream(cudaStream_t stream, std::string_view what,
                       std::chrono::milliseconds timeout, const std::function<Status()> &check) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto spin_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
  auto nap = std::chrono::microseconds(20);
  while (true) {
    const cudaError_t status = cudaStreamQuery(stream);
    if (status == cudaSuccess) return Status::ok();
    if (status != cudaErrorNotReady) return cuda_check(status, what);
    const auto now = std::chrono::steady_clock::now();
    if (now > deadline)
      return deadline_exceeded("the GPU did not finish ", what, " within ", timeout.count(), " ms");
    if (now < spin_until) {
      std::this_thread::yield();
      continue;
    }
    // Past the spin (a short step never gets here): between naps only.
    if (check) RETURN_IF_ERROR(check());
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(1000));
  }
}

Result<std::unique_ptr<cuda::Fused>>
fused_chain_program(const Graph &graph, const std::vector<NodeId> &chain,
                    const std::function<const void *(TensorId)> &address) {
  if (chain.empty()) return invalid_argument("an empty chain");
  const ops::OpRegistry &registry = ops::OpRegistry::global();
  auto program = std::make_unique<cuda::Fused>();
  const auto &shape = graph.tensor(graph.node(chain.back()).outputs[0]).type.shape;
  ASSIGN_OR_RETURN(program->shape, cuda::shape_dims(shape));
  std::map<TensorId, int> operand;
  TensorId running = kInvalidTensor;
  auto index_of = [&](TensorId id) -> Result<int> {
    if (id == running) return -1;
    auto [it, added] = operand.emplace(id, program->inputs);
    if (added) {
      if (program->inputs >= cuda::kMaxFused)
        return invalid_argument("a chain reading more than ", cuda::kMaxFused, " tensors");
      const TensorType &type = graph.tensor(id).type;
      program->input[program->inputs] = static_cast<const float *>(address(id));
      program->mode[program->inputs] = type.num_elements() == 1 ? 1 : type.shape == shape ? 0 : 2;
      program->strides[program->inputs] = cuda::operand_strides(type.shape, program->shape);
      ++program->inputs;
    }
    return it->second;
  };
  for (NodeId id : chain) {
    const Node &node = graph.node(id);
    if (program->steps >= cuda::kMaxFused)
      return invalid_argument("a chain of more than ", cuda::kMaxFused, " nodes");
    ASSIGN_OR_RETURN(cuda::FusedStep step, cuda::fused_step(node, *registry.find(node.op)));
    ASSIGN_OR_RETURN(step.lhs, index_of(node.inputs[0]));
    if (node.inputs.size() > 1) {
      ASSIGN_OR_RETURN(step.rhs, index_of(node.inputs[1]));
      // A one-element exponent of 2 or 1 is an exact product (binary_op's rule).
      if (node.op == "Pow" && graph.tensor(node.inputs[1]).type.num_elements() == 1)
        step.op = static_cast<int>(cuda::Binary::kPowScalar);
    }
    program->step[program->steps++] = step;
    running = node.outputs[0];
  }
  return program;
}

CapturedStep::~CapturedStep() { reset(); }

void CapturedStep::reset() {
  if (exec_) cudaGraphExecDestroy(exec_);
  if (graph_) cudaGraphDestroy(graph_);
  exec_ = nullptr;
  graph_ = nullptr;
  launches_ = std::min<int64_t>(launches_, 1);
}

Status CapturedStep::launch(cudaStream_t stream, bool use_graph,
                            const std::function<Status()> &enqueue,
                            const std::function<CaptureRecord()> &record) {
  if (!use_graph || launches_++ == 0) return enqueue();
  if (exec_ == nullptr) {
    // What failed while capturing, and what a user can do about it.
    auto capturing = [](Status status) {
      return std::move(status).with_context(
          "capturing the step as a CUDA Graph (--no-cuda-graph launches it eagerly instead)");
    };
    RETURN_IF_ERROR(capturing(
        cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture")));
    Status enqueued = enqueue();
    cudaGraph_t captured = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &captured);
    if (!enqueued.is_ok()) {
      // The stream is out of capture again; its error must not be reported
      // later by an unrelated launch.
      cudaGetLastError();
      if (captured) cudaGraphDestroy(captured);
      return capturing(std::move(enqueued));
    }
    RETURN_IF_ERROR(capturing(cuda_check(ended, "end capture")));
    const cudaError_t instantiated = cudaGraphInstantiate(&exec_, captured, 0);
    if (instantiated != cudaSuccess) {
      cudaGraphDestroy(captured);
      exec_ = nullptr;
      return capturing(cuda_check(instantiated, "instantiating the captured step"));
    }
    graph_ = captured;
    capture_ = record();
  } else {
    RETURN_IF_ERROR(
        capture_.check_replay(record()).with_context("replaying the captured CUDA Graph"));
    ++replays_;
  }
  return cuda_check(cudaGraphLaunch(exec_, stream), "graph launch");
}

} // namespace strata::runtime

#endif
