#include "runtime/cpu/executor.h"

#include <algorithm>
#include <chrono>
#include <cstring>


#include "graph/units.h"
#include "graph/verifier.h"
#include "ops/kernels/cpu/gemm.h"
#include "ops/registry.h"

namespace strata::runtime {

namespace {

constexpr int64_t kArenaAlignment = 64;

std::string node_context(const Node &node) {
  return str_cat("node '", node.name, "' (", node.op, ")");
}

} // namespace

// Everything run() touches, laid out in create() so a run allocates nothing but
// its output tensors.
struct CpuExecutor::State {
  // One step of the order: the node, its op, and views of its buffers. Views of
  // parameters, constants and intermediates point at fixed addresses; views of
  // graph inputs are pointed at the caller's buffers at the start of each run.
  struct Step {
    const Node *node = nullptr;
    const ops::OpDef *def = nullptr;
    std::vector<ops::ConstTensorView> inputs;
    std::vector<ops::TensorView> outputs;
  };
  // A view slot that reads graph input `input`.
  struct InputSlot {
    uint32_t step;
    uint32_t slot;
    uint32_t input;
  };
  // Where a graph output is read from: graph input `input`, or `data`.
  struct OutputSource {
    const void *data = nullptr;
    int64_t input = -1;
  };

  std::shared_ptr<Blob> arena;
  std::vector<HostTensor> weights; // per tensor; only parameters and constants set
  std::vector<Step> steps;
  std::vector<InputSlot> input_slots;
  std::vector<OutputSource> output_sources;
  // End-of-run assignments: copy `source` into the weight buffer `target`.
  struct Update {
    std::byte *target = nullptr;
    OutputSource source;
    size_t bytes = 0;
  };
  std::vector<Update> updates;
};

CpuExecutor::~CpuExecutor() = default;

Result<std::unique_ptr<CpuExecutor>> CpuExecutor::create(Graph graph,
                                                         const ExecutorOptions &options) {
  const std::string context = str_cat("CPU executor for graph '", graph.name(), "'");
  const ops::OpRegistry &registry = ops::OpRegistry::global();
  RETURN_IF_ERROR(verify_graph(graph, registry).with_context(context));

  std::unique_ptr<CpuExecutor> executor(new CpuExecutor());
  executor->graph_ = std::move(graph);
  const Graph &g = executor->graph_;
  auto state = std::make_unique<State>();

  // Kernels first: a missing one is the cheapest thing to report.
  for (const Node &node : g.nodes()) {
    const ops::OpDef *def = registry.find(node.op);
    if (def == nullptr)
      return not_found("unknown op").with_context(node_context(node)).with_context(context);
    if (def->cpu_kernel == nullptr)
      return unimplemented("op ", node.op, " has no CPU kernel")
          .with_context(node_context(node))
          .with_context(context);
  }

  ASSIGN_OR_RETURN(executor->order_, g.topological_order());
  auto plan = passes::plan_memory(g, executor->order_, kArenaAlignment);
  if (!plan.is_ok()) return plan.status().with_context(context);
  executor->plan_ = std::move(plan).value();
  {
    int64_t weights = 0;
    for (const Tensor &tensor : g.tensors())
      if (tensor.kind == TensorKind::kParameter || tensor.kind == TensorKind::kConstant ||
          tensor.kind == TensorKind::kState)
        weights += tensor.type.size_bytes();
    const int64_t activations = executor->plan_.arena_bytes;
    RETURN_IF_ERROR(check_host_memory(
        activations + weights, str_cat("graph '", g.name(), "' needs"),
        str_cat(human_bytes(static_cast<double>(weights)), " of weights and state, ",
                human_bytes(static_cast<double>(activations)), " of activations")));
  }
  state->arena = Blob::zeroed(static_cast<size_t>(executor->plan_.arena_bytes));

  // Parameters and constants, once.
  state->weights.resize(g.num_tensors());
  for (TensorId id = 0; id < g.num_tensors(); ++id) {
    const Tensor &tensor = g.tensor(id);
    if (tensor.kind != TensorKind::kParameter && tensor.kind != TensorKind::kConstant &&
        tensor.kind != TensorKind::kState)
      continue;
    auto value = materialize(tensor, options.model_dir);
    if (!value.is_ok()) return value.status().with_context(context);
    state->weights[id] = std::move(value).value();
    executor->weight_bytes_ += static_cast<int64_t>(state->weights[id].size_bytes());
  }

  std::vector<int64_t> input_index(g.num_tensors(), -1);
  for (size_t k = 0; k < g.inputs().size(); ++k)
    input_index[g.inputs()[k]] = static_cast<int64_t>(k);
  std::byte *arena = state->arena->mutable_data();
  // The fixed address of a tensor that is not a graph input.
  auto address = [&](TensorId id) -> std::byte * {
    if (executor->plan_.offsets[id] >= 0) return arena + executor->plan_.offsets[id];
    HostTensor &weight = state->weights[id];
    return weight.blob ? weight.data() : nullptr;
  };

  state->steps.resize(executor->order_.size());
  for (size_t s = 0; s < executor->order_.size(); ++s) {
    State::Step &step = state->steps[s];
    const Node &node = g.node(executor->order_[s]);
    step.node = &node;
    step.def = registry.find(node.op);
    step.inputs.reserve(node.inputs.size());
    for (size_t slot = 0; slot < node.inputs.size(); ++slot) {
      const TensorId id = node.inputs[slot];
      const Tensor &tensor = g.tensor(id);
      if (input_index[id] >= 0) {
        state->input_slots.push_back({static_cast<uint32_t>(s), static_cast<uint32_t>(slot),
                                      static_cast<uint32_t>(input_index[id])});
        step.inputs.push_back({nullptr, &tensor.type});
      } else {
        step.inputs.push_back({address(id), &tensor.type});
      }
    }
    step.outputs.reserve(node.outputs.size());
    for (TensorId id : node.outputs)
      step.outputs.push_back({address(id), &g.tensor(id).type});
  }

  for (TensorId id : g.outputs()) {
    State::OutputSource source;
    if (input_index[id] >= 0)
      source.input = input_index[id];
    else
      source.data = address(id);
    state->output_sources.push_back(source);
  }

  for (const StateUpdate &update : g.updates()) {
    State::Update entry;
    entry.target = state->weights[update.target].data();
    if (input_index[update.value] >= 0)
      entry.source.input = input_index[update.value];
    else
      entry.source.data = address(update.value);
    entry.bytes = static_cast<size_t>(g.tensor(update.target).type.size_bytes());
    state->updates.push_back(entry);
  }

  executor->state_ = std::move(state);
  return executor;
}

const HostTensor &CpuExecutor::value(TensorId id) const { return state_->weights[id]; }

Status CpuExecutor::assign(TensorId id, const HostTensor &value) {
  RETURN_IF_ERROR(check_assignable(graph_, id, value));
  if (value.size_bytes() > 0)
    std::memcpy(state_->weights[id].data(), value.data(), value.size_bytes());
  return Status::ok();
}

Status CpuExecutor::run(llvm::ArrayRef<HostTensor> inputs, std::vector<HostTensor> *outputs) {
  const auto graph_inputs = graph_.inputs();
  if (inputs.size() != graph_inputs.size())
    return invalid_argument("graph '", graph_.name(), "' takes ", graph_inputs.size(),
                            " inputs, got ", inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor &expected = graph_.tensor(graph_inputs[k]);
    if (!(inputs[k].type == expected.type))
      return invalid_argument("input '", expected.name, "' is ", expected.type.to_string(),
                              ", got ", inputs[k].type.to_string());
    if (static_cast<int64_t>(inputs[k].size_bytes()) < expected.type.size_bytes())
      return invalid_argument("input '", expected.name, "' holds ", inputs[k].size_bytes(),
                              " bytes, ", expected.type.to_string(), " needs ",
                              expected.type.size_bytes());
  }

  State &state = *state_;
  for (const State::InputSlot &slot : state.input_slots) {
    const HostTensor &input = inputs[slot.input];
    state.steps[slot.step].inputs[slot.slot].data = input.blob ? input.data() : nullptr;
  }

  for (const State::Step &step : state.steps) {
    ops::KernelContext kernel_context{*step.node, *step.def, step.inputs, step.outputs};
    Status status = step.def->cpu_kernel(kernel_context);
    if (!status.is_ok()) return std::move(status).with_context(node_context(*step.node));
  }

  outputs->clear();
  outputs->reserve(state.output_sources.size());
  for (size_t k = 0; k < state.output_sources.size(); ++k) {
    const State::OutputSource &source = state.output_sources[k];
    const TensorType &type = graph_.tensor(graph_.outputs()[k]).type;
    const void *data =
        source.input >= 0
            ? static_cast<const void *>(inputs[static_cast<size_t>(source.input)].blob
                                            ? inputs[static_cast<size_t>(source.input)].data()
                                            : nullptr)
            : source.data;
    HostTensor out = HostTensor::zeros(type);
    const auto size = static_cast<size_t>(type.size_bytes());
    if (size > 0) std::memcpy(out.data(), data, size);
    outputs->push_back(std::move(out));
  }
  // Updates last: outputs read the values this run computed, before any update.
  for (const State::Update &update : state.updates) {
    const void *source =
        update.source.input >= 0
            ? static_cast<const void *>(inputs[static_cast<size_t>(update.source.input)].data())
            : update.source.data;
    if (update.bytes > 0 && source != update.target)
      std::memmove(update.target, source, update.bytes);
  }
  return Status::ok();
}

Result<std::vector<double>> CpuExecutor::profile(llvm::ArrayRef<HostTensor> inputs, int repeats) {
  if (repeats < 1) return invalid_argument("profile: repeats must be at least 1, got ", repeats);
  const auto graph_inputs = graph_.inputs();
  if (inputs.size() != graph_inputs.size())
    return invalid_argument("graph '", graph_.name(), "' takes ", graph_inputs.size(),
                            " inputs, got ", inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k)
    if (!(inputs[k].type == graph_.tensor(graph_inputs[k]).type))
      return invalid_argument("input '", graph_.tensor(graph_inputs[k]).name, "' is ",
                              graph_.tensor(graph_inputs[k]).type.to_string(), ", got ",
                              inputs[k].type.to_string());
  State &state = *state_;
  for (const State::InputSlot &slot : state.input_slots) {
    const HostTensor &input = inputs[slot.input];
    state.steps[slot.step].inputs[slot.slot].data = input.blob ? input.data() : nullptr;
  }
  std::vector<std::vector<double>> samples(state.steps.size());
  for (int r = 0; r < repeats; ++r) {
    for (size_t s = 0; s < state.steps.size(); ++s) {
      const State::Step &step = state.steps[s];
      ops::KernelContext kernel_context{*step.node, *step.def, step.inputs, step.outputs};
      const auto start = std::chrono::steady_clock::now();
      Status status = step.def->cpu_kernel(kernel_context);
      samples[s].push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      if (!status.is_ok()) return std::move(status).with_context(node_context(*step.node));
    }
  }
  std::vector<double> seconds(graph_.num_nodes(), 0.0);
  for (size_t s = 0; s < state.steps.size(); ++s) {
    std::vector<double> &v = samples[s];
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    seconds[order_[s]] = v[v.size() / 2];
  }
  return seconds;
}

Result<std::vector<double>> profile_node_times(const Graph &graph) {
  ops::cpu::set_gemm_num_threads(1);
  auto seconds = [&]() -> Result<std::vector<double>> {
    std::vector<HostTensor> inputs = random_inputs(graph, 0);
    ASSIGN_OR_RETURN(auto executor, CpuExecutor::create(graph));
    RETURN_IF_ERROR(executor->profile(inputs, 1).status());
    return executor->profile(inputs, 5);
  }();
  ops::cpu::set_gemm_num_threads(0);
  return seconds;
}

} // namespace strata::runtime
