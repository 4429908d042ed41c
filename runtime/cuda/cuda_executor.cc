#include "runtime/cuda/cuda_executor.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include "graph/units.h"
#include "graph/verifier.h"
#include "ops/registry.h"
#include "passes/fuse_elementwise.h"
#include "passes/plan_memory.h"
#include "runtime/materialize.h"
#include "runtime/cuda/gpu_placement.h"
#include "strata_config.h"

#if STRATA_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "ops/kernels/cuda/cuda_ops.h"
#include "ops/kernels/cuda/cuda_status.h"
#include "ops/kernels/cuda/launch.h"
#include "runtime/cuda/cuda_step.h"
#endif

namespace strata::runtime {

#if STRATA_HAVE_CUDA
namespace {

std::string node_context(const Node &node) {
  return str_cat("node '", node.name, "' (", node.op, ")");
}

// Nodes without inputs (Constant) are computed once on the CPU at load and
// copied into place each step.
bool computed_at_load(const Node &node, const ops::OpDef &def) {
  return node.inputs.empty() && def.cpu_kernel != nullptr;
}

} // namespace

#endif

#if !STRATA_HAVE_CUDA

std::string cuda_unavailable_reason() {
  return "this strata was built without the CUDA toolkit (meson setup -Dcuda=enabled needs it)";
}
int cuda_device_count() { return 0; }
Status check_cuda_ops(const Graph &, const std::function<bool(const Node &)> &, int) {
  return unimplemented(cuda_unavailable_reason());
}
std::vector<std::string_view> cuda_backend_ops() { return {}; }
Result<CudaLayout> cuda_layout(const Graph &, int64_t, int64_t, bool, bool) {
  return unimplemented(cuda_unavailable_reason());
}

struct CudaExecutor::State {};
CudaExecutor::~CudaExecutor() = default;
Result<std::unique_ptr<CudaExecutor>> CudaExecutor::create(Graph, const CudaExecutorOptions &) {
  return unimplemented(cuda_unavailable_reason());
}
Status CudaExecutor::run(llvm::ArrayRef<HostTensor>, std::vector<HostTensor> *) {
  return unimplemented(cuda_unavailable_reason());
}
const HostTensor &CudaExecutor::value(TensorId) const {
  static const HostTensor empty;
  return empty;
}
Status CudaExecutor::read_status() const { return unimplemented(cuda_unavailable_reason()); }
Status CudaExecutor::assign(TensorId, const HostTensor &) {
  return unimplemented(cuda_unavailable_reason());
}
int64_t CudaExecutor::device_bytes() const { return 0; }
int64_t CudaExecutor::replays() const { return 0; }
int64_t CudaExecutor::fused_chains() const { return 0; }
std::string CudaExecutor::device_name() const { return ""; }
Status CudaExecutor::check_guards() const { return unimplemented(cuda_unavailable_reason()); }
Result<std::vector<double>> CudaExecutor::node_times(llvm::ArrayRef<HostTensor>) {
  return unimplemented(cuda_unavailable_reason());
}
Status CudaExecutor::run_step(llvm::ArrayRef<HostTensor>, std::vector<HostTensor> *,
                              std::vector<double> *) {
  return unimplemented(cuda_unavailable_reason());
}

#else

std::string cuda_unavailable_reason() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();
    // Without a driver at all the runtime says the driver is too old; say
    // what is missing instead.
    if (error == cudaErrorInsufficientDriver || error == cudaErrorNoDevice) {
      void *driver = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
      if (driver == nullptr)
        return "no usable GPU: no NVIDIA driver on this machine (libcuda.so.1 not found)";
      ::dlclose(driver);
    }
    return str_cat("no usable GPU: ", cudaGetErrorString(error));
  }
  if (count == 0) return "no usable GPU: the CUDA driver sees no device";
  return "";
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

std::vector<std::string_view> cuda_backend_ops() { return cuda::cuda_op_names(); }

namespace {

// Whether the CUDA kernel of `node` (op `def`) takes input `i` in `dtype`:
// f32, except where an op reads integers (its integer inputs: indices, labels,
// step counters; integer sums).
bool runs_dtype(const Graph &graph, const Node &node, const ops::OpDef &def, size_t i,
                DType dtype) {
  const std::string_view op = node.op;
  const bool integer = dtype == DType::kI32 || dtype == DType::kI64;
  if (op == "Cast") return dtype != DType::kF16 && dtype != DType::kBF16;
  if (op == "Add" || op == "Sub" || op == "Mul") {
    if (!integer) return dtype == DType::kF32;
    return graph.tensor(node.inputs[0]).type.dtype == graph.tensor(node.inputs[1]).type.dtype;
  }
  const bool integer_input = i < 32 && ((def.traits.integer_inputs >> i) & 1u) != 0;
  return integer_input ? integer : dtype == DType::kF32;
}

} // namespace

Status check_cuda_ops(const Graph &graph, const std::function<bool(const Node &)> &runs_elsewhere,
                      int tensor_parallel) {
  const ops::OpRegistry &registry = ops::OpRegistry::global();
  std::map<std::string, std::vector<std::string>> missing;
  // Ops that only move bytes run on any dtype; the others compute in f32 (and
  // integers where indices, labels and step counters are).
  auto moves_bytes = [](std::string_view op) {
    return op == "Reshape" || op == "Squeeze" || op == "Unsqueeze" || op == "Flatten" ||
           op == "Identity" || op == "Transpose" || op == "Concat" || op == "Split" ||
           op == "Slice" || op == "SliceGrad" || op == "Where";
  };
  for (const Node &node : graph.nodes()) {
    const ops::OpDef *def = registry.find(node.op);
    if (def != nullptr && computed_at_load(node, *def)) continue;
    if (runs_elsewhere && runs_elsewhere(node)) continue;
    // A piece of a table or of logits split over `parts` members runs where
    // the device is one of a tensor-parallel group of that many.
    if (const int64_t parts = node.int_attr("parts").value_or(1);
        parts > 1 && parts != tensor_parallel &&
        (def == nullptr || def->traits.collective == ops::Collective::kNone)) {
      missing[str_cat(node.op, " of a tensor split over ", parts,
                      " members outside a tensor-parallel group of ", parts)]
          .push_back(node.name);
      continue;
    }
    if (cuda::find_cuda_op(node.op) == nullptr) {
      missing[node.op].push_back(node.name);
      continue;
    }
    if (moves_bytes(node.op)) continue;
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const DType dtype = graph.tensor(node.inputs[i]).type.dtype;
      if (!runs_dtype(graph, node, *def, i, dtype)) {
        missing[str_cat(node.op, " on ", dtype_name(dtype))].push_back(node.name);
        break;
      }
    }
    if (node.op.starts_with("Conv2d")) {
      const std::vector<int64_t> pads = ops::AttrReader(node, *def).get_ints("pads");
      if (pads.size() == 4 && (pads[0] != pads[2] || pads[1] != pads[3]))
        missing[str_cat(node.op, " with asymmetric pads")].push_back(node.name);
    }
  }
  if (missing.empty()) return Status::ok();
  std::string text;
  for (const auto &[op, nodes] : missing) {
    std::string names;
    for (size_t i = 0; i < nodes.size() && i < 3; ++i)
      names += str_cat(i == 0 ? "" : ", ", "'", nodes[i], "'");
    if (nodes.size() > 3) names += str_cat(" and ", nodes.size() - 3, " more");
    text += str_cat(text.empty() ? "" : "; ", op, " (", names, ")");
  }
  return unimplemented("the CUDA backend has no kernel for ", missing.size(), " op",
                       missing.size() == 1 ? "" : "s", " of graph '", graph.name(), "': ", text,
                       " (run it with --backend cpu)");
}

namespace {

int64_t align_up(int64_t n) { return (n + kCudaAlignment - 1) / kCudaAlignment * kCudaAlignment; }

// What create() checks before it touches a GPU: the options, the graph, and
// that the backend has a kernel for every node.
Status check_request(const Graph &graph, const CudaExecutorOptions &options,
                     const std::string &context) {
  if (options.workspace_bytes < 0 || options.guard_bytes < 0)
    return invalid_argument("workspace and guard bytes must be at least 0, got ",
                            options.workspace_bytes, " and ", options.guard_bytes);
  RETURN_IF_ERROR(verify_graph(graph, ops::OpRegistry::global()).with_context(context));
  return check_cuda_ops(graph);
}

// Makes `gpu` the calling thread's device, once this machine is known to have
// a usable GPU of that number.
Status use_gpu(int gpu, const std::string &context) {
  if (std::string reason = cuda_unavailable_reason(); !reason.empty())
    return unavailable(reason).with_context(context);
  int gpus = 0;
  RETURN_IF_ERROR(cuda_check(cudaGetDeviceCount(&gpus), "device count"));
  if (gpu < 0 || gpu >= gpus)
    return invalid_argument("GPU ", gpu, " does not exist: this machine has ", gpus)
        .with_context(context);
  return cuda_check(cudaSetDevice(gpu), "set device").with_context(context);
}

// The host copies create() uploads: by tensor id, each parameter, state and
// constant tensor the layout places; by step, each value computed at load.
struct HostValues {
  std::vector<HostTensor> weights;
  std::vector<HostTensor> constants;
};

// Reads or initializes the weights (external data relative to `model_dir`)
// and runs the nodes computed at load on the CPU.
Result<HostValues> host_values(const Graph &g, const CudaLayout &l, const std::string &model_dir,
                               const std::string &context) {
  const ops::OpRegistry &registry = ops::OpRegistry::global();
  HostValues values;
  values.weights.resize(g.num_tensors());
  for (TensorId id = 0; id < g.num_tensors(); ++id) {
    if (l.tensor[id] < 0 || g.tensor(id).kind == TensorKind::kIntermediate) continue;
    auto value = materialize(g.tensor(id), model_dir);
    if (!value.is_ok()) return value.status().with_context(context);
    values.weights[id] = std::move(value).value();
  }
  values.constants.resize(l.order.size());
  for (size_t s = 0; s < l.order.size(); ++s) {
    if (l.constant[s] < 0) continue;
    const Node &node = g.node(l.order[s]);
    const ops::OpDef *def = registry.find(node.op);
    HostTensor value = HostTensor::zeros(g.tensor(node.outputs[0]).type);
    ops::TensorView view{value.size_bytes() > 0 ? value.data() : nullptr, &value.type};
    ops::KernelContext kernel_context{node, *def, {}, llvm::ArrayRef<ops::TensorView>(view)};
    RETURN_IF_ERROR(def->cpu_kernel(kernel_context).with_context(node_context(node)));
    values.constants[s] = std::move(value);
  }
  return values;
}

} // namespace

struct CudaExecutor::State {
  CudaExecutorOptions options;
  std::string device_name;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void *cudnn = nullptr; // cudnnHandle_t, when cuDNN is in the build
  std::byte *base = nullptr;
  int64_t bytes = 0;
  std::vector<NodeId> order;
  passes::MemoryPlan plan;

  struct Step {
    const Node *node = nullptr;
    const ops::OpDef *def = nullptr;
    const cuda::CudaOp *op = nullptr; // nullptr: a copy of `constant`
    std::vector<ops::ConstTensorView> inputs;
    std::vector<ops::TensorView> outputs;
    void *scratch = nullptr;
    int64_t scratch_bytes = 0;
    int *flag = nullptr;
    std::shared_ptr<void> cache; // the op's plan (ops/kernels/cuda/cuda_ops.h)
    const std::byte *constant = nullptr;
    // Elementwise chains: every node but the last is skipped, and the last
    // runs the whole chain into its output.
    bool skip = false;
    std::unique_ptr<cuda::Fused> fused;
  };
  std::vector<Step> steps;
  int64_t fused_chains = 0;
  std::vector<std::byte *> address; // per tensor; nullptr when it has none
  std::vector<std::byte *> input_staging, output_staging;
  struct Copy {
    std::byte *target = nullptr;
    const std::byte *source = nullptr;
    size_t bytes = 0;
  };
  std::vector<Copy> output_copies, updates;
  int *flags = nullptr;
  void *workspace = nullptr;
  void *bf16 = nullptr; // --precision bf16 or f16: the GEMM operands' staging
  CapturedStep step;
  std::vector<CudaLayout::Guard> guards;
  mutable std::vector<HostTensor> host; // value()'s copies
  mutable std::vector<bool> host_fresh;
  mutable Status read_error; // the first value() since the last step that failed
  // A wait ran out of time: the GPU may still be working (or hung), so the
  // destructor waits a little more, bounded, and if it is still busy leaves
  // its memory and handles alone rather than wait unbounded in cudaFree or
  // cudnnDestroy.
  mutable bool stuck = false;

  ~State() {
    // Teardown has nowhere to report to; the error is cleared, not left for
    // a later call to report.
    cuda_check(cudaSetDevice(options.gpu), "set device").ignore();
    if (stuck && !wait_for_stream(stream, "teardown", std::chrono::seconds(2)).is_ok()) return;
    step.reset(); // the graph goes before the streams and memory it uses
    if (lt) cublasLtDestroy(lt);
    cuda::destroy_cudnn(cudnn);
    if (stream) cudaStreamDestroy(stream);
    if (base) cudaFree(base);
  }

  // Waits for the stream, bounded: a GPU that never finishes is an error, not
  // a hang.
  Status wait(std::string_view what) const {
    Status status = wait_for_stream(stream, what);
    if (status.code() == StatusCode::kDeadlineExceeded) stuck = true;
    return status;
  }

  // Everything one step does on the GPU, in order.
  // One node's work on the stream (nothing for a node a fused chain runs).
  Status launch_step(Step &step) {
    if (step.skip) return Status::ok();
    if (step.fused) {
      const ops::TensorView &out = step.outputs[0];
      return cuda_check(cuda::fused_elementwise(*step.fused, static_cast<float *>(out.data),
                                                out.type->num_elements(), stream),
                        "launch");
    }
    if (step.op == nullptr) {
      const size_t size = static_cast<size_t>(step.outputs[0].type->size_bytes());
      if (size == 0) return Status::ok();
      return cuda_check(cudaMemcpyAsync(step.outputs[0].data, step.constant, size,
                                        cudaMemcpyDeviceToDevice, stream),
                        "copy");
    }
    cuda::CudaKernelContext context{
        *step.node,   *step.def, step.inputs,  step.outputs,
        stream,       lt,        workspace,    static_cast<size_t>(options.workspace_bytes),
        step.scratch, step.flag, options.tf32, cudnn,
        &step.cache,  bf16,      options.f16};
    context.cudnn_pool_norm = options.cudnn_pool_norm;
    context.scratch_bytes = step.scratch_bytes;
    return step.op->kernel(context);
  }

  // With `timing` (steps + 1 timing events, eager runs only): an event before
  // the first node and after each.
  Status enqueue(const std::vector<cudaEvent_t> *timing = nullptr) {
    RETURN_IF_ERROR(
        cuda_check(cudaMemsetAsync(flags, 0, steps.size() * sizeof(int), stream), "memset"));
    if (timing) RETURN_IF_ERROR(cuda_check(cudaEventRecord((*timing)[0], stream), "event record"));
    for (size_t s = 0; s < steps.size(); ++s) {
      Status status = launch_step(steps[s]);
      if (!status.is_ok()) return std::move(status).with_context(node_context(*steps[s].node));
      if (timing)
        RETURN_IF_ERROR(cuda_check(cudaEventRecord((*timing)[s + 1], stream), "event record"));
    }
    for (const Copy &copy : output_copies)
      if (copy.bytes > 0 && copy.source != copy.target)
        RETURN_IF_ERROR(cuda_check(
            cudaMemcpyAsync(copy.target, copy.source, copy.bytes, cudaMemcpyDeviceToDevice, stream),
            "copy"));
    // The state updates only when no device check failed (the flag after the
    // nodes' says whether any did).
    int *any = flags + steps.size();
    RETURN_IF_ERROR(cuda_check(
        cuda::any_flag(flags, static_cast<int64_t>(steps.size()), any, stream), "launch"));
    for (const Copy &copy : updates)
      if (copy.bytes > 0 && copy.source != copy.target)
        RETURN_IF_ERROR(
            cuda_check(cuda::guarded_copy(copy.target, copy.source,
                                          static_cast<int64_t>(copy.bytes), any, stream),
                       "launch"));
    return Status::ok();
  }

  // The buffers a captured step binds.
  CaptureRecord record(const Graph &g) const {
    CaptureRecord r;
    for (size_t k = 0; k < g.inputs().size(); ++k)
      r.add(g.tensor(g.inputs()[k]).name, input_staging[k], g.tensor(g.inputs()[k]).type);
    for (size_t k = 0; k < g.outputs().size(); ++k)
      r.add(g.tensor(g.outputs()[k]).name, output_staging[k], g.tensor(g.outputs()[k]).type);
    for (TensorId id = 0; id < g.num_tensors(); ++id)
      if (g.tensor(id).kind != TensorKind::kIntermediate &&
          g.tensor(id).kind != TensorKind::kInput && address[id] != nullptr)
        r.add(g.tensor(id).name, address[id], g.tensor(id).type);
    return r;
  }

  // ---- create(), in order ------------------------------------------------

  // The step's one allocation, zeroed on the step's stream, and the libraries'
  // handles: cuBLASLt, and cuDNN (required only where a node has no other
  // kernel).
  Status allocate_and_start(const Graph &g, const CudaLayout &l, const std::string &context) {
    void *memory = nullptr;
    RETURN_IF_ERROR(cuda_check(cudaMalloc(&memory, static_cast<size_t>(bytes)),
                               str_cat("allocating ", human_bytes(static_cast<double>(bytes)), " (",
                                       bytes, " bytes) on GPU ", options.gpu))
                        .with_context(context));
    base = static_cast<std::byte *>(memory);
    RETURN_IF_ERROR(
        cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream"));
    // Every upload goes on the step's stream (a non-blocking stream is not
    // ordered after the legacy default stream), then create() waits for it.
    RETURN_IF_ERROR(
        cuda_check(cudaMemsetAsync(base, 0, static_cast<size_t>(bytes), stream), "memset"));
    RETURN_IF_ERROR(
        cuda::cublas_status(cublasLtCreate(&lt), "could not start").with_context(context));
    Result<void *> handle = cuda::start_cudnn(stream);
    if (handle.is_ok()) {
      cudnn = *handle;
    } else {
      for (const cuda::CudaOp &op : cuda::cudnn_ops())
        if (std::any_of(g.nodes().begin(), g.nodes().end(),
                        [&](const Node &n) { return n.op == op.name; }))
          return handle.status().with_context(context);
    }
    workspace = base + l.workspace;
    if (l.bf16 >= 0) bf16 = base + l.bf16;
    flags = reinterpret_cast<int *>(base + l.flags);
    return Status::ok();
  }

  // Copies the weights and the values computed at load into place and fills
  // the guards, all on the stream, and waits: `values` must outlive the copies.
  Status upload(const Graph &g, const CudaLayout &l, const HostValues &values,
                const std::string &context) {
    for (TensorId id = 0; id < g.num_tensors(); ++id)
      if (l.tensor[id] >= 0 && values.weights[id].size_bytes() > 0)
        RETURN_IF_ERROR(cuda_check(cudaMemcpyAsync(base + l.tensor[id], values.weights[id].data(),
                                                   values.weights[id].size_bytes(),
                                                   cudaMemcpyHostToDevice, stream),
                                   str_cat("uploading '", g.tensor(id).name, "'")));
    for (size_t s = 0; s < values.constants.size(); ++s)
      if (l.constant[s] >= 0 && values.constants[s].size_bytes() > 0)
        RETURN_IF_ERROR(cuda_check(cudaMemcpyAsync(base + l.constant[s], values.constants[s].data(),
                                                   values.constants[s].size_bytes(),
                                                   cudaMemcpyHostToDevice, stream),
                                   "uploading a constant"));
    guards = l.guards;
    for (const CudaLayout::Guard &guard : guards)
      RETURN_IF_ERROR(cuda_check(cudaMemsetAsync(base + guard.offset, kGuardByte,
                                                 static_cast<size_t>(guard.bytes), stream),
                                 "guards"));
    return wait("the uploads").with_context(context);
  }

  // Every tensor's address (the arena's plan, else its own region; graph
  // inputs live in their staging), and the copies that end a step: each
  // output into its staging, then each state update.
  void bind_buffers(const Graph &g, const CudaLayout &l) {
    address.assign(g.num_tensors(), nullptr);
    for (TensorId id = 0; id < g.num_tensors(); ++id) {
      if (plan.offsets[id] >= 0)
        address[id] = base + plan.offsets[id];
      else if (l.tensor[id] >= 0)
        address[id] = base + l.tensor[id];
    }
    for (size_t k = 0; k < g.inputs().size(); ++k) {
      input_staging.push_back(base + l.input[k]);
      address[g.inputs()[k]] = base + l.input[k];
    }
    for (size_t k = 0; k < g.outputs().size(); ++k) {
      output_staging.push_back(base + l.output[k]);
      output_copies.push_back({base + l.output[k], address[g.outputs()[k]],
                               static_cast<size_t>(g.tensor(g.outputs()[k]).type.size_bytes())});
    }
    for (const StateUpdate &update : g.updates())
      updates.push_back({address[update.target], address[update.value],
                         static_cast<size_t>(g.tensor(update.target).type.size_bytes())});
  }

  // One step per node, in order, with its buffers, scratch and flag; each
  // elementwise chain then runs as one kernel at its last node's step.
  Status build_steps(const Graph &g, const CudaLayout &l) {
    const ops::OpRegistry &registry = ops::OpRegistry::global();
    steps.resize(order.size());
    for (size_t s = 0; s < order.size(); ++s) {
      Step &node_step = steps[s];
      const Node &node = g.node(order[s]);
      node_step.node = &node;
      node_step.def = registry.find(node.op);
      node_step.op = cuda::find_cuda_op(node.op);
      for (TensorId id : node.inputs)
        node_step.inputs.push_back({address[id], &g.tensor(id).type});
      for (TensorId id : node.outputs)
        node_step.outputs.push_back({address[id], &g.tensor(id).type});
      if (l.scratch[s] >= 0) {
        node_step.scratch = base + l.scratch[s];
        node_step.scratch_bytes = l.scratch_bytes[s];
      }
      if (l.constant[s] >= 0) node_step.constant = base + l.constant[s];
      node_step.flag = flags + s;
    }
    std::vector<size_t> position(g.num_nodes(), 0);
    for (size_t s = 0; s < order.size(); ++s)
      position[order[s]] = s;
    for (const std::vector<NodeId> &chain : l.chains) {
      ASSIGN_OR_RETURN(
          std::unique_ptr<cuda::Fused> program,
          fused_chain_program(g, chain, [&](TensorId id) -> const void * { return address[id]; }));
      for (NodeId id : chain)
        steps[position[id]].skip = true;
      Step &last = steps[position[chain.back()]];
      last.skip = false;
      last.fused = std::move(program);
      ++fused_chains;
    }
    return Status::ok();
  }
};

Result<CudaLayout> cuda_layout(const Graph &g, int64_t workspace_bytes, int64_t guard_bytes,
                               bool bf16, bool fuse) {
  RETURN_IF_ERROR(check_cuda_ops(g));
  const ops::OpRegistry &registry = ops::OpRegistry::global();
  CudaLayout l;
  ASSIGN_OR_RETURN(l.order, g.topological_order());
  std::vector<int64_t> runs_at;
  if (fuse && guard_bytes == 0) {
    // A chain runs, reading and writing, at its last node's step.
    l.chains = passes::find_elementwise_chains(g, l.order, cuda::kMaxFused, cuda::kMaxFused);
    std::vector<int64_t> step_of(g.num_nodes(), 0);
    for (size_t s = 0; s < l.order.size(); ++s)
      step_of[l.order[s]] = static_cast<int64_t>(s);
    runs_at = step_of;
    for (const std::vector<NodeId> &chain : l.chains)
      for (NodeId id : chain)
        runs_at[id] = step_of[chain.back()];
  }
  ASSIGN_OR_RETURN(l.plan, passes::plan_memory(g, l.order, kCudaAlignment, runs_at));
  if (guard_bytes > 0) {
    // Every intermediate in its own guarded region instead of the arena.
    l.plan.offsets.assign(g.num_tensors(), -1);
    l.plan.arena_bytes = 0;
  }
  int64_t offset = align_up(l.plan.arena_bytes);
  auto place = [&](int64_t bytes, auto &&name) {
    const int64_t at = offset;
    offset += align_up(bytes + guard_bytes);
    if (guard_bytes > 0) l.guards.push_back({at + bytes, offset - at - bytes, name()});
    return at;
  };
  l.tensor.assign(g.num_tensors(), -1);
  for (TensorId id = 0; id < g.num_tensors(); ++id) {
    const TensorKind kind = g.tensor(id).kind;
    if (kind == TensorKind::kParameter || kind == TensorKind::kConstant ||
        kind == TensorKind::kState || (guard_bytes > 0 && kind == TensorKind::kIntermediate))
      l.tensor[id] = place(g.tensor(id).type.size_bytes(),
                           [&] { return str_cat("tensor '", g.tensor(id).name, "'"); });
  }
  const size_t steps = l.order.size();
  l.constant.assign(steps, -1);
  l.scratch.assign(steps, -1);
  l.scratch_bytes.assign(steps, 0);
  for (size_t s = 0; s < steps; ++s) {
    const Node &node = g.node(l.order[s]);
    const cuda::CudaOp *op = cuda::find_cuda_op(node.op);
    if (op == nullptr) { // computed at load (check_cuda_ops let nothing else through)
      l.constant[s] = place(g.tensor(node.outputs[0]).type.size_bytes(),
                            [&] { return str_cat("the value of node '", node.name, "'"); });
      continue;
    }
    if (op->scratch == nullptr) continue;
    std::vector<TensorType> types;
    for (TensorId id : node.inputs)
      types.push_back(g.tensor(id).type);
    l.scratch_bytes[s] = op->scratch(node, *registry.find(node.op), types);
    l.scratch[s] =
        place(l.scratch_bytes[s], [&] { return str_cat("the scratch of node '", node.name, "'"); });
  }
  for (TensorId id : g.inputs())
    l.input.push_back(place(g.tensor(id).type.size_bytes(), [&] {
      return str_cat("the staging of input '", g.tensor(id).name, "'");
    }));
  for (TensorId id : g.outputs())
    l.output.push_back(place(g.tensor(id).type.size_bytes(), [&] {
      return str_cat("the staging of output '", g.tensor(id).name, "'");
    }));
  l.workspace_bytes = workspace_bytes;
  l.workspace = place(workspace_bytes, [] { return std::string("the workspace"); });
  if (bf16) {
    for (NodeId id : l.order) {
      std::vector<TensorType> types;
      for (TensorId t : g.node(id).inputs)
        types.push_back(g.tensor(t).type);
      l.bf16_bytes = std::max(l.bf16_bytes, cuda::half_staging_bytes(g.node(id), types));
    }
    l.bf16 = place(l.bf16_bytes, [] { return std::string("the half-precision staging"); });
  }
  l.flags = place(static_cast<int64_t>((steps + 1) * sizeof(int)),
                  [] { return std::string("the error flags"); });
  l.total = offset;
  return l;
}

CudaExecutor::~CudaExecutor() = default;

Result<std::unique_ptr<CudaExecutor>> CudaExecutor::create(Graph graph,
                                                           const CudaExecutorOptions &options) {
  const std::string context = str_cat("CUDA executor for graph '", graph.name(), "'");
  RETURN_IF_ERROR(check_request(graph, options, context));
  RETURN_IF_ERROR(use_gpu(options.gpu, context));

  std::unique_ptr<CudaExecutor> executor(new CudaExecutor());
  executor->graph_ = std::move(graph);
  const Graph &g = executor->graph_;
  auto state = std::make_unique<State>();
  state->options = options;
  state->device_name = gpu_name(options.gpu);
  if (options.bf16 && options.f16)
    return invalid_argument("bf16 or f16 GEMM operands, not both").with_context(context);
  auto layout = cuda_layout(g, options.workspace_bytes, options.guard_bytes,
                            options.bf16 || options.f16, options.fuse);
  if (!layout.is_ok()) return layout.status().with_context(context);
  const CudaLayout &l = *layout;
  state->order = l.order;
  state->plan = l.plan;
  state->bytes = l.total;
  ASSIGN_OR_RETURN(const HostValues values, host_values(g, l, options.model_dir, context));
  RETURN_IF_ERROR(state->allocate_and_start(g, l, context));
  RETURN_IF_ERROR(state->upload(g, l, values, context));
  state->bind_buffers(g, l);
  RETURN_IF_ERROR(state->build_steps(g, l));
  state->host.resize(g.num_tensors());
  state->host_fresh.assign(g.num_tensors(), false);
  executor->state_ = std::move(state);
  return executor;
}

Status CudaExecutor::run(llvm::ArrayRef<HostTensor> inputs, std::vector<HostTensor> *outputs) {
  return run_step(inputs, outputs, nullptr);
}

Result<std::vector<double>> CudaExecutor::node_times(llvm::ArrayRef<HostTensor> inputs) {
  std::vector<double> times;
  std::vector<HostTensor> outputs;
  RETURN_IF_ERROR(run_step(inputs, &outputs, &times));
  return times;
}

Status CudaExecutor::run_step(llvm::ArrayRef<HostTensor> inputs, std::vector<HostTensor> *outputs,
                              std::vector<double> *times) {
  issue_seconds_ = -1;
  const auto graph_inputs = graph_.inputs();
  if (inputs.size() != graph_inputs.size())
    return invalid_argument("graph '", graph_.name(), "' takes ", graph_inputs.size(),
                            " inputs, got ", inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor &expected = graph_.tensor(graph_inputs[k]);
    if (!(inputs[k].type == expected.type) ||
        static_cast<int64_t>(inputs[k].size_bytes()) < expected.type.size_bytes())
      return invalid_argument("input '", expected.name, "' is ", expected.type.to_string(),
                              ", got ", inputs[k].type.to_string());
  }
  State &state = *state_;
  const auto issue_start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(cuda_check(cudaSetDevice(state.options.gpu), "set device"));
  // Whatever value() read before is stale from here on, even if this step
  // fails part-way.
  std::fill(state.host_fresh.begin(), state.host_fresh.end(), false);
  state.read_error = Status::ok();
  for (size_t k = 0; k < inputs.size(); ++k)
    if (graph_.tensor(graph_inputs[k]).type.size_bytes() > 0)
      RETURN_IF_ERROR(cuda_check(
          cudaMemcpyAsync(state.input_staging[k], inputs[k].data(),
                          static_cast<size_t>(graph_.tensor(graph_inputs[k]).type.size_bytes()),
                          cudaMemcpyHostToDevice, state.stream),
          str_cat("copying input '", graph_.tensor(graph_inputs[k]).name, "'")));

  // Timed: eagerly, an event after every node (events that time cannot be
  // captured into a graph).
  std::vector<cudaEvent_t> timing;
  struct Events {
    std::vector<cudaEvent_t> *events;
    ~Events() {
      for (cudaEvent_t event : *events)
        cudaEventDestroy(event);
    }
  } destroy{&timing};
  if (times != nullptr) {
    for (size_t s = 0; s <= state.steps.size(); ++s) {
      cudaEvent_t event = nullptr;
      RETURN_IF_ERROR(cuda_check(cudaEventCreate(&event), "event"));
      timing.push_back(event);
    }
    RETURN_IF_ERROR(state.enqueue(&timing));
  } else {
    // The first step runs eagerly (kernels load, cuBLASLt and cuDNN settle on
    // their algorithms), the second is captured, and every later one replays it.
    RETURN_IF_ERROR(state.step.launch(
        state.stream, state.options.cuda_graph, [&] { return state.enqueue(); },
        [&] { return state.record(graph_); }));
  }

  issue_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - issue_start).count();
  // Wait (bounded) before reading back: a copy into pageable memory would
  // block until the step is done, past any bound.
  RETURN_IF_ERROR(state.wait("the step"));
  if (times != nullptr) {
    times->assign(graph_.num_nodes(), 0.0);
    for (size_t s = 0; s < state.steps.size(); ++s) {
      float ms = 0;
      RETURN_IF_ERROR(
          cuda_check(cudaEventElapsedTime(&ms, timing[s], timing[s + 1]), "event elapsed time"));
      (*times)[state.order[s]] = ms;
    }
  }
  outputs->clear();
  for (size_t k = 0; k < graph_.outputs().size(); ++k) {
    HostTensor out = HostTensor::zeros(graph_.tensor(graph_.outputs()[k]).type);
    if (out.size_bytes() > 0)
      RETURN_IF_ERROR(cuda_check(
          cudaMemcpy(out.data(), state.output_staging[k], out.size_bytes(), cudaMemcpyDeviceToHost),
          "copying an output"));
    outputs->push_back(std::move(out));
  }
  std::vector<int> flags(state.steps.size());
  RETURN_IF_ERROR(cuda_check(
      cudaMemcpy(flags.data(), state.flags, flags.size() * sizeof(int), cudaMemcpyDeviceToHost),
      "reading the error flags"));
  for (size_t s = 0; s < flags.size(); ++s)
    if (flags[s] != 0)
      return out_of_range(state.steps[s].op->flag_meaning.empty()
                              ? std::string_view("device check failed")
                              : state.steps[s].op->flag_meaning)
          .with_context(node_context(*state.steps[s].node));
  return Status::ok();
}

const HostTensor &CudaExecutor::value(TensorId id) const {
  State &state = *state_;
  if (!state.host_fresh[id]) {
    const Tensor &tensor = graph_.tensor(id);
    HostTensor copy = HostTensor::zeros(tensor.type);
    Status read = Status::ok();
    if (state.address[id] != nullptr && copy.size_bytes() > 0) {
      read = cuda_check(cudaSetDevice(state.options.gpu), "set device");
      if (read.is_ok()) read = state.wait("a read");
      if (read.is_ok())
        read = cuda_check(
            cudaMemcpy(copy.data(), state.address[id], copy.size_bytes(), cudaMemcpyDeviceToHost),
            "copying to the host");
    }
    state.host[id] = std::move(copy);
    // A failed read stays unread (zero, not cached) and is reported by
    // read_status().
    state.host_fresh[id] = read.is_ok();
    if (!read.is_ok() && state.read_error.is_ok())
      state.read_error = std::move(read).with_context(str_cat("reading '", tensor.name, "'"));
  }
  return state.host[id];
}

Status CudaExecutor::read_status() const { return state_->read_error; }

Status CudaExecutor::assign(TensorId id, const HostTensor &value) {
  RETURN_IF_ERROR(check_assignable(graph_, id, value));
  State &state = *state_;
  RETURN_IF_ERROR(cuda_check(cudaSetDevice(state.options.gpu), "set device"));
  RETURN_IF_ERROR(state.wait("the step before an assignment"));
  if (value.size_bytes() > 0) {
    RETURN_IF_ERROR(cuda_check(cudaMemcpyAsync(state.address[id], value.data(), value.size_bytes(),
                                               cudaMemcpyHostToDevice, state.stream),
                               str_cat("assigning '", graph_.tensor(id).name, "'")));
    RETURN_IF_ERROR(state.wait("an assignment"));
  }
  state.host_fresh[id] = false;
  return Status::ok();
}

int64_t CudaExecutor::device_bytes() const { return state_->bytes; }
int64_t CudaExecutor::replays() const { return state_->step.replays(); }
int64_t CudaExecutor::fused_chains() const { return state_->fused_chains; }
std::string CudaExecutor::device_name() const { return state_->device_name; }

Status CudaExecutor::check_guards() const {
  const State &state = *state_;
  RETURN_IF_ERROR(cuda_check(cudaSetDevice(state.options.gpu), "set device"));
  RETURN_IF_ERROR(state.wait("a guard check"));
  // The guards alone (the arena holds the 32 MiB workspace besides).
  std::vector<uint8_t> bytes;
  for (const CudaLayout::Guard &guard : state.guards) {
    bytes.resize(static_cast<size_t>(guard.bytes));
    RETURN_IF_ERROR(cuda_check(
        cudaMemcpy(bytes.data(), state.base + guard.offset, bytes.size(), cudaMemcpyDeviceToHost),
        "reading the guards"));
    for (int64_t i = 0; i < guard.bytes; ++i)
      if (bytes[static_cast<size_t>(i)] != kGuardByte)
        return data_loss("the guard after ", guard.after, " was overwritten at its byte ", i,
                         " (a kernel wrote past its buffer)");
  }
  return Status::ok();
}

#endif

} // namespace strata::runtime
