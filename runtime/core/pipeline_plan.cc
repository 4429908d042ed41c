#include "runtime/core/pipeline_plan.h"

#include <algorithm>
#include <cstring>

#include "graph/verifier.h"
#include "ops/registry.h"
#include "plan/instructions.h"
#include "plan/phases.h"
#include "plan/pieces.h"
#include "plan/simulate.h"
#include "plan/verify.h"
#include "runtime/materialize.h"
#include "runtime/step_runner.h"

namespace strata::runtime::core {

Result<std::unique_ptr<const PipelinePlan>> PipelinePlan::create(const serialization::Plan &plan,
                                                                 std::string_view context) {
  if (!plan.pipeline)
    return invalid_argument("the plan has no pipeline (compile it with --mesh or --microbatches)");
  std::unique_ptr<PipelinePlan> p(new PipelinePlan());
  p->graph_ = plan.graph;
  p->pipeline_ = *plan.pipeline;
  p->programs_ = plan.programs;
  RETURN_IF_ERROR(p->index().with_context(context));
  // What the programs mean: every node computed once per micro-batch, every
  // read after its write, every sum scaled and every update applied once.
  RETURN_IF_ERROR(plan::verify_plan(plan).with_context(context));
  return std::unique_ptr<const PipelinePlan>(std::move(p));
}

Status PipelinePlan::index() {
  const Graph &g = graph_;
  RETURN_IF_ERROR(verify_graph(g, ops::OpRegistry::global()));
  RETURN_IF_ERROR(check_pipeline_inputs(g, slices()));
  if (pipeline_.data_parallel < 1 || pipeline_.tensor_parallel < 1 || pipeline_.microbatches < 1)
    return invalid_argument("micro-batches (", pipeline_.microbatches, "), replicas (",
                            pipeline_.data_parallel, ") and tensor-parallel members (",
                            pipeline_.tensor_parallel, ") must all be at least 1");
  for (size_t d = 0; d < programs_.size(); ++d)
    if (programs_[d].device != d)
      return invalid_argument("program ", d, " is for device ", programs_[d].device,
                              "; programs must be in device order");
  for (size_t k = 0; k < pipeline_.groups.size(); ++k)
    for (int32_t member : pipeline_.groups[k])
      if (member < 0 || member >= num_devices())
        return invalid_argument("group ", k, " names device ", member, "; the plan has ",
                                num_devices());
  // A plan from a file is checked again: every receive must be matched, in an
  // order that completes, before any device waits on one.
  RETURN_IF_ERROR(plan::check_deadlock(g, programs_, pipeline_.groups));

  input_index_.assign(g.num_tensors(), -1);
  for (size_t k = 0; k < g.inputs().size(); ++k)
    input_index_[g.inputs()[k]] = static_cast<int64_t>(k);
  output_device_.assign(g.outputs().size(), -1);
  for (size_t k = 0; k < g.outputs().size(); ++k) {
    for (size_t d = 0; d < programs_.size() && output_device_[k] < 0; ++d)
      for (const serialization::PlanSlot &slot : programs_[d].slots)
        if (slot.tensor == g.outputs()[k] && slot.microbatch == -1)
          output_device_[k] = static_cast<int>(d);
    if (output_device_[k] < 0)
      return invalid_argument("no device of the plan keeps graph output '",
                              g.tensor(g.outputs()[k]).name, "'");
  }
  for (const serialization::PlanShard &shard : pipeline_.shards) {
    auto id = g.find_tensor(shard.tensor);
    if (!id) return invalid_argument("shard of unknown tensor '", shard.tensor, "'");
    if (!tp_shards_.emplace(*id, shard).second)
      return invalid_argument("two shards of tensor '", shard.tensor, "'");
  }
  shards_.resize(programs_.size());
  held_.assign(programs_.size(), std::vector<bool>(g.num_tensors(), false));
  shard_sums_.clear();
  gathered_.clear();
  backward_.clear();
  bool gathers = false;
  for (size_t d = 0; d < programs_.size(); ++d) {
    const serialization::PlanProgram &program = programs_[d];
    shard_sums_.push_back(serialization::shard_accumulated(program, g.num_tensors()));
    gathered_.push_back(serialization::gathered_params(program, g.num_tensors()));
    for (bool b : gathered_.back())
      gathers = gathers || b;
    for (TensorId id : program.holds) {
      if (id >= g.num_tensors())
        return invalid_argument("device ", d, " holds tensor ", id, "; the graph has ",
                                g.num_tensors());
      held_[d][id] = true;
    }
    if (program.shard_group < 0) continue;
    if (program.shard_group >= num_groups())
      return invalid_argument("device ", d, ": no shard group ", program.shard_group);
    Shards &shards = shards_[d];
    shards.group = program.shard_group;
    const auto &members = group(program.shard_group);
    shards.count = static_cast<int>(members.size());
    shards.rank = static_cast<int>(position(program.shard_group, static_cast<int>(d)));
    if (shards.rank == shards.count)
      return invalid_argument("device ", d, " is not in its shard group ", program.shard_group);
    shards.tensors.insert(program.sharded_holds.begin(), program.sharded_holds.end());
  }
  if (gathers) {
    // ZeRO-3: which block's gathered buffer each node reads.
    ASSIGN_OR_RETURN(const plan::StepPhases phases,
                     plan::analyze_phases(g, static_cast<int>(slices())));
    backward_.assign(g.num_nodes(), false);
    for (NodeId n = 0; n < g.num_nodes(); ++n)
      backward_[n] = phases.node_phase[n] == plan::Phase::kBackward;
  }
  return Status::ok();
}

size_t PipelinePlan::position(int index, int device) const {
  const auto &members = group(index);
  return static_cast<size_t>(std::find(members.begin(), members.end(), device) - members.begin());
}

std::optional<CollectiveAlgo> PipelinePlan::algorithm(int index) const {
  const auto &algorithms = pipeline_.group_algorithms;
  if (index < 0 || static_cast<size_t>(index) >= algorithms.size()) return std::nullopt;
  return collective_algo_named(algorithms[static_cast<size_t>(index)]);
}

std::vector<TensorType> PipelinePlan::batch_types() const {
  return pipeline_batch_types(graph_, slices());
}

Status PipelinePlan::check_batch(llvm::ArrayRef<HostTensor> inputs) const {
  const std::vector<TensorType> types = batch_types();
  if (inputs.size() != types.size())
    return invalid_argument("the pipeline takes ", types.size(), " inputs, got ", inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k)
    if (!(inputs[k].type == types[k]) ||
        static_cast<int64_t>(inputs[k].size_bytes()) < types[k].size_bytes())
      return invalid_argument("input '", graph_.tensor(graph_.inputs()[k]).name, "' is ",
                              inputs[k].type.to_string(), ", the pipeline needs ",
                              types[k].to_string(), " (", slices(), " micro-batches of ",
                              graph_.tensor(graph_.inputs()[k]).type.to_string(), ")");
  return Status::ok();
}

std::string PipelinePlan::context(int device, size_t instruction) const {
  return str_cat("device ", device, " instruction ", instruction, " (",
                 plan::describe_instruction(graph_, program(device).instructions.at(instruction)),
                 ")");
}

const serialization::PlanShard *PipelinePlan::tp_shard(TensorId id) const {
  auto it = tp_shards_.find(id);
  return it == tp_shards_.end() ? nullptr : &it->second;
}

TensorType PipelinePlan::value_type(TensorId id) const {
  TensorType type = graph_.tensor(id).type;
  if (const serialization::PlanShard *shard = tp_shard(id))
    type.shape.assign(shard->full_shape.begin(), shard->full_shape.end());
  return type;
}

bool PipelinePlan::holds(int device, TensorId id) const {
  return held_[static_cast<size_t>(device)][id];
}

PipelinePlan::Held PipelinePlan::held(int device, TensorId id) const {
  Held held;
  held.id = id;
  held.type = graph_.tensor(id).type;
  if (tp_shard(id) != nullptr) held.member = member(device);
  const Shards &s = shards(device);
  if (s.tensors.contains(id)) {
    held.shard = s.rank;
    held.type = TensorType{held.type.dtype, {held.type.num_elements() / s.count}};
  }
  return held;
}

Result<HostTensor> PipelinePlan::materialize(const Held &held, const std::string &model_dir) const {
  Tensor whole = graph_.tensor(held.id);
  const serialization::PlanShard *shard = tp_shard(held.id);
  if (shard != nullptr) whole.type = value_type(held.id);
  ASSIGN_OR_RETURN(HostTensor value, runtime::materialize(whole, model_dir));
  if (shard != nullptr) {
    // This member's piece of the full tensor.
    HostTensor piece = HostTensor::zeros(graph_.tensor(held.id).type);
    plan::copy_piece(*shard, tensor_parallel(), held.member, dtype_size(whole.type.dtype),
                     value.data(), piece.data(), true);
    value = std::move(piece);
  }
  if (held.shard >= 0) {
    // The ZeRO-1 shard of it: elements [r n / D, (r + 1) n / D).
    HostTensor part = HostTensor::zeros(held.type);
    if (part.size_bytes() > 0)
      std::memcpy(part.data(), value.data() + part.size_bytes() * static_cast<size_t>(held.shard),
                  part.size_bytes());
    value = std::move(part);
  }
  return value;
}

int PipelinePlan::first_holder(TensorId id) const {
  for (int d = 0; d < num_devices(); ++d)
    if (holds(d, id)) return d;
  return -1;
}

std::optional<HostTensor> PipelinePlan::device_whole(int device, TensorId id, const Local &local,
                                                     const ReadPart &read) const {
  if (!local(device)) return std::nullopt;
  const Shards &s = shards(device);
  if (!s.tensors.contains(id)) return read(device, id);
  // ZeRO-1: the shards of the device's group, each at its position (a shard
  // another process holds stays zero).
  HostTensor whole = HostTensor::zeros(graph_.tensor(id).type);
  const size_t chunk = whole.size_bytes() / static_cast<size_t>(s.count);
  for (int e = 0; e < num_devices() && chunk > 0; ++e) {
    const Shards &other = shards(e);
    if (other.group != s.group || !other.tensors.contains(id) || !local(e)) continue;
    if (std::optional<HostTensor> part = read(e, id))
      std::memcpy(whole.data() + chunk * static_cast<size_t>(other.rank), part->data(), chunk);
  }
  return whole;
}

std::optional<HostTensor> PipelinePlan::whole_value(TensorId id, const Local &local,
                                                    const ReadPart &read) const {
  // The first device of this process holding it.
  int first = -1;
  for (int d = 0; d < num_devices() && first < 0; ++d)
    if (holds(d, id) && local(d)) first = d;
  if (first < 0) return std::nullopt;
  const serialization::PlanShard *shard = tp_shard(id);
  if (shard == nullptr) return device_whole(first, id, local, read);
  // Tensor parallelism: the pieces of the first holder's group, joined (only
  // where this process runs every member; checkpoints over several
  // processes go through checkpoint_pieces()).
  const int base = first - first % tensor_parallel();
  HostTensor full = HostTensor::zeros(value_type(id));
  for (int m = 0; m < tensor_parallel(); ++m) {
    std::optional<HostTensor> piece = device_whole(base + m, id, local, read);
    if (!piece) return std::nullopt;
    plan::copy_piece(*shard, tensor_parallel(), m, dtype_size(full.type.dtype), full.data(),
                     piece->data(), false);
  }
  return full;
}

Status PipelinePlan::split_value(TensorId id, const HostTensor &value,
                                 const WritePart &write) const {
  const serialization::PlanShard *shard = tp_shard(id);
  // Each member's piece (the whole value outside tensor parallelism).
  std::vector<HostTensor> pieces;
  for (int m = 0; m < (shard == nullptr ? 0 : tensor_parallel()); ++m) {
    HostTensor piece = HostTensor::zeros(graph_.tensor(id).type);
    plan::copy_piece(*shard, tensor_parallel(), m, dtype_size(value.type.dtype),
                     const_cast<std::byte *>(value.data()), piece.data(), true);
    pieces.push_back(std::move(piece));
  }
  for (int d = 0; d < num_devices(); ++d) {
    if (!holds(d, id)) continue;
    const HostTensor &whole = shard == nullptr ? value : pieces[static_cast<size_t>(member(d))];
    const std::byte *from = whole.size_bytes() > 0 ? whole.data() : nullptr;
    size_t bytes = whole.size_bytes();
    const Shards &s = shards(d);
    if (s.tensors.contains(id)) { // ZeRO-1: the device's shard of it
      bytes /= static_cast<size_t>(s.count);
      if (from != nullptr) from += bytes * static_cast<size_t>(s.rank);
    }
    RETURN_IF_ERROR(write(d, from, bytes));
  }
  return Status::ok();
}

std::map<std::string, HostTensor> PipelinePlan::checkpoint_pieces(const Local &local,
                                                                  const ReadPart &read) const {
  std::map<std::string, HostTensor> pieces;
  for (TensorId id = 0; id < graph_.num_tensors(); ++id) {
    const Tensor &tensor = graph_.tensor(id);
    if (tensor.kind != TensorKind::kParameter && tensor.kind != TensorKind::kState) continue;
    // The first device holding it decides: whole, or sharded over its group.
    const int first = first_holder(id);
    if (first < 0) continue;
    // Tensor parallelism: every member of the first holder's group writes its
    // piece, "<name>@tp<m>of<T>" (plan::join_checkpoint puts them together).
    const bool in_pieces = tp_shard(id) != nullptr;
    const int base = in_pieces ? first - first % tensor_parallel() : first;
    for (int m = 0; m < (in_pieces ? tensor_parallel() : 1); ++m) {
      const int holder = base + m;
      const std::string name =
          in_pieces ? str_cat(tensor.name, "@tp", m, "of", tensor_parallel()) : tensor.name;
      const Shards &s = shards(holder);
      if (!s.tensors.contains(id)) {
        if (!local(holder)) continue;
        if (std::optional<HostTensor> value = read(holder, id))
          pieces.emplace(name, std::move(*value));
        continue;
      }
      for (int e = 0; e < num_devices(); ++e) {
        const Shards &other = shards(e);
        if (other.group != s.group || !other.tensors.contains(id) || !local(e)) continue;
        if (std::optional<HostTensor> value = read(e, id))
          pieces.emplace(str_cat(name, "@shard", other.rank, "of", other.count), std::move(*value));
      }
    }
  }
  return pieces;
}

} // namespace strata::runtime::core
