#include "runtime/core/device_program.h"

#include <algorithm>
#include <map>

#include "plan/instructions.h"

namespace strata::runtime::core {

using serialization::InstrKind;
using serialization::PlanInstruction;

namespace {

// The tag of a tensor-parallel all-to-all's messages: its node, apart from
// the transfer tags (bit 63 clear) and the collective tags (bit 63 set).
uint64_t all_to_all_tag(NodeId node) { return (uint64_t{1} << 62) | node; }

// Resolves one device's instructions; holds what they all look up.
class Resolver {
public:
  Resolver(const PipelinePlan &plan, int device, const DeviceMemory &memory, DeviceProgram &program)
      : plan_(plan), g_(plan.graph()), device_(device), memory_(memory), out_(program) {
    for (const serialization::PlanSlot &slot : plan.program(device).slots)
      slots_[{slot.tensor, slot.microbatch}] = memory.arena + slot.offset;
  }

  Status buckets();
  Status instruction(size_t i);
  Status outputs();

private:
  Status compute(const PlanInstruction &instr, Op &op);
  Status tensor_parallel(const PlanInstruction &instr, Op &op);
  Status transfer(const PlanInstruction &instr, Op &op);
  Status update(const PlanInstruction &instr, Op &op);
  Status gather_param(const PlanInstruction &instr, Op &op);
  Result<int> group(const PlanInstruction &instr) const;
  Result<std::byte *> slot(TensorId t, int32_t microbatch) const;
  Result<std::byte *> weight(TensorId t) const;
  Status f32(TensorId t, std::string_view doing = "", std::string_view what = "") const;
  template <typename... Args> Status invalid(Args &&...args) const {
    return invalid_argument(context_, ": ", std::forward<Args>(args)...);
  }

  const PipelinePlan &plan_;
  const Graph &g_;
  int device_;
  const DeviceMemory &memory_;
  DeviceProgram &out_;
  std::map<std::pair<TensorId, int32_t>, std::byte *> slots_;
  // ZeRO-3 prefetch: (parameter, block) started, not yet waited for -> task.
  std::map<std::pair<TensorId, int32_t>, uint32_t> gathers_;
  size_t batch_leader_ = 0; // the StartGather that issues the current batch
  std::string context_;     // the instruction being resolved
};

Result<std::byte *> Resolver::slot(TensorId t, int32_t microbatch) const {
  auto it = slots_.find({t, microbatch});
  if (it == slots_.end())
    return invalid("'", g_.tensor(t).name, "' ",
                   microbatch < 0 ? std::string("(step)") : str_cat("micro-batch ", microbatch),
                   " has no buffer in the plan");
  return it->second;
}

Result<std::byte *> Resolver::weight(TensorId t) const {
  if (!plan_.holds(device_, t))
    return invalid("reads '", g_.tensor(t).name, "', which the plan does not place on this device");
  return memory_.held(t); // null for an empty tensor
}

Result<int> Resolver::group(const PlanInstruction &instr) const {
  if (instr.peer < 0 || instr.peer >= plan_.num_groups()) return invalid("no group ", instr.peer);
  if (plan_.position(instr.peer, device_) == plan_.group(instr.peer).size())
    return invalid("the device is not in group ", instr.peer);
  return instr.peer;
}

// Sums and averages run in f32 only so far.
Status Resolver::f32(TensorId t, std::string_view doing, std::string_view what) const {
  const TensorType &type = g_.tensor(t).type;
  if (type.dtype == DType::kF32) return Status::ok();
  return unimplemented(context_, ": ", doing, type.to_string(), what, " (f32 only so far)");
}

Status Resolver::buckets() {
  const serialization::PlanProgram &program = plan_.program(device_);
  out_.buckets.resize(program.buckets.size());
  // The group comes from the instruction that starts each bucket.
  for (size_t i = 0; i < program.instructions.size(); ++i) {
    const PlanInstruction &instr = program.instructions[i];
    if (instr.kind != InstrKind::kStartBucket) continue;
    context_ = plan_.context(device_, i);
    if (instr.index >= program.buckets.size())
      return invalid("the program has ", program.buckets.size(), " buckets");
    ASSIGN_OR_RETURN(const int index, group(instr));
    const serialization::PlanBucket &planned = program.buckets[instr.index];
    Bucket &bucket = out_.buckets[instr.index];
    bucket.group = index;
    bucket.position = plan_.position(index, device_);
    bucket.reduce_scatter = planned.reduce_scatter;
    bucket.tag = plan::collective_tag(instr);
    const size_t p = plan_.group(index).size();
    std::string names;
    for (TensorId t : planned.tensors) {
      if (t >= g_.num_tensors()) return invalid("no tensor ", t);
      const Tensor &tensor = g_.tensor(t);
      if (tensor.type.dtype != DType::kF32)
        return unimplemented(context_, ": '", tensor.name, "' is ", tensor.type.to_string(),
                             " (f32 only so far)");
      ASSIGN_OR_RETURN(std::byte * data, slot(t, -1));
      const auto count = static_cast<size_t>(tensor.type.num_elements());
      if (bucket.reduce_scatter && count % p != 0)
        return invalid("'", tensor.name, "' has ", count, " elements, which ", p,
                       " devices do not divide");
      bucket.parts.emplace_back(reinterpret_cast<float *>(data), count);
      names += str_cat(names.empty() ? "'" : ", '", tensor.name, "'");
    }
    bucket.what = str_cat("gradient bucket ", instr.index, ": ", names);
    bucket.chunks.assign(p + 1, 0);
    for (size_t c = 0; c < p; ++c) {
      bucket.chunks[c + 1] = bucket.chunks[c];
      for (const auto &part : bucket.parts)
        bucket.chunks[c + 1] += chunk_begin(part.size(), p, c + 1) - chunk_begin(part.size(), p, c);
    }
  }
  return Status::ok();
}

Status Resolver::instruction(size_t i) {
  const PlanInstruction &instr = plan_.program(device_).instructions[i];
  context_ = plan_.context(device_, i);
  Op &op = out_.ops[i];
  op.kind = instr.kind;
  op.what = plan::describe_instruction(g_, instr);
  op.microbatch = instr.microbatch;
  switch (instr.kind) {
  case InstrKind::kCompute:
  case InstrKind::kComputeShard: return compute(instr, op);
  case InstrKind::kSend:
  case InstrKind::kRecv:
  case InstrKind::kAccumulate:
  case InstrKind::kScale:
  case InstrKind::kAllReduce:
  case InstrKind::kReduceScatter:
  case InstrKind::kAllGather:
  case InstrKind::kReduceScatterAccumulate: return transfer(instr, op);
  case InstrKind::kUpdate: return update(instr, op);
  case InstrKind::kGatherParam: return gather_param(instr, op);
  case InstrKind::kStartGather: {
    RETURN_IF_ERROR(gather_param(instr, op));
    const auto &instrs = plan_.program(device_).instructions;
    const bool follows =
        i > 0 && instrs[i - 1].kind == InstrKind::kStartGather && instrs[i - 1].peer == instr.peer;
    if (follows) {
      op.bucket = out_.stream_tasks - 1;
      ++out_.ops[batch_leader_].batch;
    } else {
      op.bucket = out_.stream_tasks++;
      op.batch = 1;
      batch_leader_ = i;
    }
    gathers_[{instr.index, instr.microbatch}] = op.bucket;
    return Status::ok();
  }
  case InstrKind::kWaitGather: {
    auto it = gathers_.find({instr.index, instr.microbatch});
    if (it == gathers_.end()) return invalid("waits for a gather no StartGather started");
    op.bucket = it->second;
    gathers_.erase(it);
    ASSIGN_OR_RETURN(op.group, group(instr));
    return Status::ok();
  }
  case InstrKind::kStartBucket:
  case InstrKind::kWaitBucket:
    if (instr.index >= out_.buckets.size() || out_.buckets[instr.index].chunks.empty())
      return invalid("bucket ", instr.index, " is never started");
    op.bucket = instr.index;
    op.group = out_.buckets[instr.index].group;
    op.position = out_.buckets[instr.index].position;
    return Status::ok();
  }
  return invalid("unknown instruction");
}

Status Resolver::compute(const PlanInstruction &instr, Op &op) {
  if (instr.index >= g_.num_nodes()) return invalid("no node ", instr.index);
  const Node &node = g_.node(instr.index);
  op.node = &node;
  op.def = ops::OpRegistry::global().find(node.op);
  if (op.def == nullptr) return invalid("unknown op ", node.op);
  op.member = plan_.member(device_);
  op.parts = plan_.tensor_parallel();
  // A shard computes its part of the node's operands (plan::ShardedCompute:
  // chunk r of each, scalars whole): the whole of what the device keeps as
  // its shard (ZeRO-1's held state, ZeRO-2's gradient sums).
  const bool shard = instr.kind == InstrKind::kComputeShard;
  plan::ShardedCompute sharding;
  if (shard) {
    ASSIGN_OR_RETURN(const int index, group(instr));
    ASSIGN_OR_RETURN(sharding, plan::sharded_compute(g_, node, plan_.group(index),
                                                     static_cast<int32_t>(device_), context_));
  }
  const PipelinePlan::Shards &held_shards = plan_.shards(device_);
  auto view = [&](TensorId t, std::byte *base) -> std::pair<std::byte *, const TensorType *> {
    const TensorType &type = g_.tensor(t).type;
    if (!shard) return {base, &type};
    auto seen =
        sharding.view(type, held_shards.tensors.contains(t) || plan_.shard_accumulated(device_, t));
    if (seen.whole) return {base, &type};
    out_.views.push_back(std::move(seen.type));
    return {base == nullptr ? nullptr : base + seen.offset, &out_.views.back()};
  };
  for (size_t s = 0; s < node.inputs.size(); ++s) {
    const TensorId t = node.inputs[s];
    const Tensor &tensor = g_.tensor(t);
    if (plan_.input_index(t) >= 0) {
      if (instr.microbatch < 0)
        return invalid("reads graph input '", tensor.name, "' once per step");
      out_.batch_reads.push_back(
          {static_cast<size_t>(&op - out_.ops.data()), static_cast<uint32_t>(s),
           static_cast<uint32_t>(plan_.input_index(t)), plan_.slice(device_, instr.microbatch)});
      op.inputs.push_back({nullptr, &tensor.type});
      continue;
    }
    std::byte *data = nullptr;
    if (tensor.kind == TensorKind::kIntermediate) {
      ASSIGN_OR_RETURN(data, slot(t, instr.microbatch));
    } else if (!shard && instr.microbatch >= 0 && plan_.gathers(device_, t)) {
      // ZeRO-3: the whole parameter its block gathered.
      ASSIGN_OR_RETURN(data, slot(t, plan::gather_block(plan_.backward(instr.index),
                                                        instr.microbatch, plan_.microbatches())));
    } else {
      ASSIGN_OR_RETURN(data, weight(t));
    }
    auto [at, type] = view(t, data);
    op.inputs.push_back({at, type});
  }
  for (TensorId t : node.outputs) {
    ASSIGN_OR_RETURN(std::byte * data, slot(t, instr.microbatch));
    auto [at, type] = view(t, data);
    if (node.op == "SumOfSquares") at = data, type = &g_.tensor(t).type; // the whole pair
    op.outputs.push_back({at, type});
  }
  op.collective = op.def->traits.collective;
  if (op.collective == ops::Collective::kNone) return Status::ok();
  if (shard) return invalid("a tensor-parallel node cannot run on a ZeRO-1 shard");
  return tensor_parallel(instr, op);
}

Status Resolver::tensor_parallel(const PlanInstruction &instr, Op &op) {
  const Node &node = *op.node;
  const int64_t parts = node.int_attr("parts").value_or(1);
  if (parts != plan_.tensor_parallel() || plan_.pipeline().tp_groups_begin < 0 ||
      plan_.tp_group(device_) >= plan_.num_groups())
    return invalid("a tensor-parallel node of ", parts,
                   " parts in a plan of tensor_parallel = ", plan_.tensor_parallel());
  if (ops::sums(op.collective)) RETURN_IF_ERROR(f32(node.inputs[0]));
  op.group = plan_.tp_group(device_);
  op.position = plan_.position(op.group, device_);
  if (op.position == plan_.group(op.group).size())
    return invalid("the device is not in its tensor-parallel group ", op.group);
  switch (op.collective) {
  case ops::Collective::kAllGather: // the piece: the input of an all-gather
    op.piece = plan::piece_layout(node, *op.inputs[0].type);
    break;
  case ops::Collective::kReduceScatter:
  case ops::Collective::kSplit: // the output of the others
    op.piece = plan::piece_layout(node, *op.outputs[0].type);
    break;
  case ops::Collective::kAllToAll: {
    auto layout = plan::all_to_all_layout(node, *op.inputs[0].type, *op.outputs[0].type,
                                          plan_.tensor_parallel());
    if (!layout.is_ok()) return layout.status().with_context(context_);
    op.all_to_all = *layout;
    op.tag = all_to_all_tag(instr.index);
    break;
  }
  default: break;
  }
  return Status::ok();
}

Status Resolver::transfer(const PlanInstruction &instr, Op &op) {
  if (instr.index >= g_.num_tensors()) return invalid("no tensor ", instr.index);
  const TensorType &type = g_.tensor(instr.index).type;
  op.bytes = static_cast<size_t>(type.size_bytes());
  if (instr.kind == InstrKind::kSend || instr.kind == InstrKind::kRecv) {
    ASSIGN_OR_RETURN(op.data, slot(instr.index, instr.microbatch));
    op.peer = instr.peer;
    op.tag = plan::transfer_tag(instr.index, instr.microbatch);
    return Status::ok();
  }
  const bool scatter_sum = instr.kind == InstrKind::kReduceScatterAccumulate;
  if (instr.kind == InstrKind::kAccumulate || instr.kind == InstrKind::kScale ||
      instr.kind == InstrKind::kAllReduce || scatter_sum)
    RETURN_IF_ERROR(f32(instr.index, "accumulating ", " over micro-batches"));
  else
    RETURN_IF_ERROR(f32(instr.index));
  if (scatter_sum) {
    // ZeRO-2: the micro-batch's buffer, reduced in place; the device's shard
    // of it goes into the step buffer, which holds only that shard.
    ASSIGN_OR_RETURN(op.data, slot(instr.index, instr.microbatch));
    ASSIGN_OR_RETURN(op.sum, slot(instr.index, -1));
    op.first = instr.microbatch == 0;
  } else {
    ASSIGN_OR_RETURN(op.data, slot(instr.index, -1));
  }
  if (instr.kind == InstrKind::kAccumulate) {
    ASSIGN_OR_RETURN(std::byte * source, slot(instr.index, instr.microbatch));
    op.source = source;
    op.first = instr.microbatch == 0;
    return Status::ok();
  }
  if (instr.kind == InstrKind::kScale) {
    // A ZeRO-2 step buffer is the device's shard: 1/D of the tensor.
    if (plan_.shard_accumulated(device_, instr.index))
      op.bytes /= static_cast<size_t>(plan_.data_parallel());
    return Status::ok();
  }
  ASSIGN_OR_RETURN(op.group, group(instr));
  op.position = plan_.position(op.group, device_);
  op.tag = plan::collective_tag(instr);
  const auto members = static_cast<int64_t>(plan_.group(op.group).size());
  if (instr.kind != InstrKind::kAllReduce && type.num_elements() % members != 0)
    return invalid(type.to_string(), " does not split over ", members, " devices");
  return Status::ok();
}

Status Resolver::update(const PlanInstruction &instr, Op &op) {
  if (instr.index >= g_.updates().size())
    return invalid("the graph has ", g_.updates().size(), " updates");
  const StateUpdate &update = g_.updates()[instr.index];
  ASSIGN_OR_RETURN(op.data, weight(update.target));
  ASSIGN_OR_RETURN(std::byte * source, slot(update.value, -1));
  op.source = source;
  op.bytes = static_cast<size_t>(g_.tensor(update.target).type.size_bytes());
  const PipelinePlan::Shards &shards = plan_.shards(device_);
  if (shards.tensors.contains(update.target)) {
    // Only this device's shard of the new value is meaningful.
    op.bytes /= static_cast<size_t>(shards.count);
    op.source = source + op.bytes * static_cast<size_t>(shards.rank);
  }
  return Status::ok();
}

// ZeRO-3: the block's buffer of the parameter, filled from the device's held
// shard (at its position's chunk) and the group's all-gather.
Status Resolver::gather_param(const PlanInstruction &instr, Op &op) {
  if (instr.index >= g_.num_tensors()) return invalid("no tensor ", instr.index);
  const TensorId t = instr.index;
  const PipelinePlan::Shards &shards = plan_.shards(device_);
  if (!shards.tensors.contains(t))
    return invalid("gathers '", g_.tensor(t).name,
                   "', which the device does not hold as its shard (sharded_holds)");
  ASSIGN_OR_RETURN(op.group, group(instr));
  if (op.group != shards.group)
    return invalid("gathers over group ", op.group, ", but the device's shards are of group ",
                   shards.group);
  op.position = plan_.position(op.group, device_);
  op.bytes = static_cast<size_t>(g_.tensor(t).type.size_bytes());
  const auto members = plan_.group(op.group).size();
  if (op.bytes % members != 0)
    return invalid(g_.tensor(t).type.to_string(), " does not split over ", members, " devices");
  ASSIGN_OR_RETURN(op.data, slot(t, instr.microbatch));
  op.source = memory_.held(t);
  op.tag = plan::collective_tag(instr);
  return Status::ok();
}

Status Resolver::outputs() {
  const Graph &g = g_;
  out_.outputs.assign(g.outputs().size(), nullptr);
  for (size_t k = 0; k < g.outputs().size(); ++k) {
    auto it = slots_.find({g.outputs()[k], -1});
    if (it != slots_.end()) out_.outputs[k] = it->second;
  }
  return Status::ok();
}

} // namespace

int64_t collective_staging_bytes(const Graph &g, const serialization::PlanProgram &program,
                                 bool strided) {
  int64_t need = 0;
  for (const PlanInstruction &instr : program.instructions) {
    if (instr.kind != InstrKind::kCompute || instr.index >= g.num_nodes()) continue;
    const Node &node = g.node(instr.index);
    const ops::OpDef *def = ops::OpRegistry::global().find(node.op);
    if (def == nullptr) continue;
    auto bytes = [&](TensorId t) { return g.tensor(t).type.size_bytes(); };
    switch (def->traits.collective) {
    case ops::Collective::kAllGather:
      if (!strided && plan::piece_layout(node, g.tensor(node.inputs[0]).type).rows > 1)
        need = std::max(need, bytes(node.outputs[0]));
      break;
    case ops::Collective::kReduceScatter:
      if (!strided && plan::piece_layout(node, g.tensor(node.outputs[0]).type).rows > 1)
        need = std::max(need, bytes(node.inputs[0]));
      break;
    case ops::Collective::kAllToAll: need = std::max(need, 2 * bytes(node.inputs[0])); break;
    default: break;
    }
  }
  return need;
}

Result<DeviceProgram> resolve_program(const PipelinePlan &plan, int device,
                                      const DeviceMemory &memory) {
  DeviceProgram program;
  program.device = device;
  program.staging = memory.staging;
  program.ops.resize(plan.program(device).instructions.size());
  Resolver resolver(plan, device, memory, program);
  RETURN_IF_ERROR(resolver.buckets());
  program.stream_tasks = static_cast<uint32_t>(program.buckets.size());
  for (size_t i = 0; i < program.ops.size(); ++i)
    RETURN_IF_ERROR(resolver.instruction(i));
  RETURN_IF_ERROR(resolver.outputs());
  return program;
}

void bind_batch(DeviceProgram &program, const PipelinePlan &plan,
                llvm::ArrayRef<const std::byte *> bases) {
  const Graph &g = plan.graph();
  for (const DeviceProgram::BatchRead &read : program.batch_reads) {
    const std::byte *base = bases[read.input];
    const auto slice = static_cast<size_t>(g.tensor(g.inputs()[read.input]).type.size_bytes());
    program.ops[read.op].inputs[read.slot].data =
        base == nullptr ? nullptr : base + slice * static_cast<size_t>(read.slice);
  }
}

} // namespace strata::runtime::core
