#include "plan/verify.h"

#include <algorithm>
#include <climits>
#include <functional>
#include <iterator>
#include <map>
#include <queue>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "plan/instructions.h"
#include "plan/phases.h"

namespace strata::plan {

using serialization::InstrKind;
using serialization::Plan;
using serialization::PlanBucket;
using serialization::PlanInstruction;
using serialization::PlanPipeline;
using serialization::PlanProgram;
using serialization::PlanSlot;

namespace {

std::string tensor_text(const Graph &graph, TensorId t, int32_t microbatch) {
  return str_cat("'", graph.tensor(t).name, "' ", microbatch_text(microbatch));
}

std::string devices_text(const std::vector<int32_t> &devices) {
  std::string text;
  for (int32_t d : devices)
    text += str_cat(text.empty() ? "" : ", ", d);
  return text;
}

// A training plan's loss is computed from the graph input make_training adds
// for its kind: "labels" for softmax_cross_entropy, "targets" for mse.
Status check_loss_kind(const Plan &plan) {
  const Graph &g = plan.graph;
  const bool mse = plan.loss_kind == "mse";
  if (!mse && plan.loss_kind != "softmax_cross_entropy")
    return invalid_argument("field loss_kind is '", plan.loss_kind,
                            "'; expected softmax_cross_entropy or mse");
  const auto loss = g.find_tensor(plan.loss);
  if (!loss) return invalid_argument("field loss names tensor '", plan.loss, "', not in the model");
  // The graph inputs the loss is computed from.
  std::vector<bool> seen(g.num_tensors(), false);
  std::vector<TensorId> stack = {*loss};
  seen[*loss] = true;
  std::set<std::string> inputs;
  while (!stack.empty()) {
    const Tensor &tensor = g.tensor(stack.back());
    stack.pop_back();
    if (tensor.kind == TensorKind::kInput) inputs.insert(tensor.name);
    if (tensor.producer == kNoNode || tensor.producer >= g.num_nodes()) continue;
    for (TensorId in : g.node(tensor.producer).inputs)
      if (in < g.num_tensors() && !seen[in]) {
        seen[in] = true;
        stack.push_back(in);
      }
  }
  const std::string wanted = mse ? "targets" : "labels", other = mse ? "labels" : "targets";
  if (inputs.contains(wanted)) return Status::ok();
  return invalid_argument(
      "field loss_kind is '", plan.loss_kind, "', but the loss '", plan.loss,
      "' is not computed from a graph input '", wanted, "', which that loss compares with",
      inputs.contains(other)
          ? str_cat("; it reads '", other, "', as ", mse ? "softmax_cross_entropy" : "mse", " does")
          : std::string());
}

// What every device's check shares: the mesh, the step's phases and where
// each node and tensor is computed.
class PipelineCheck {
public:
  PipelineCheck(const Plan &plan, StepPhases phases);

  // The plan's fields against each other, and every index, peer, group,
  // micro-batch and slot in range (a plan built in memory has not been
  // through the loader).
  Status check_fields() const;
  Status check_ranges() const;
  // Every node of each device's stage computed once per micro-batch, or once.
  Status check_coverage() const;
  // Every send received once, every receive sent once.
  Status check_transfers() const;

  const Graph &graph() const { return g_; }
  const PlanPipeline &pipeline() const { return pipe_; }
  const PlanProgram &program(size_t d) const { return plan_.programs[d]; }
  const StepPhases &phases() const { return phases_; }
  size_t num_devices() const { return plan_.programs.size(); }
  bool accumulated(TensorId t) const { return accumulated_[t]; }
  int64_t microbatches() const { return M_; }
  int64_t replicas() const { return DP_; }

  int64_t stage(int64_t device) const { return device / TP_ / DP_; }
  int64_t replica(int64_t device) const { return device / TP_ % DP_; }
  int64_t member(int64_t device) const { return device % TP_; }
  // The device's stage of the pipeline, whatever its model chunk.
  int64_t node_stage(NodeId n) const { return pipe_.node_stage[n] % P_; }
  // The stage that computes `t`, or -1 for tensors no node computes.
  int64_t producer_stage(TensorId t) const {
    const NodeId p = g_.tensor(t).producer;
    return p == kNoNode ? -1 : node_stage(p);
  }
  // The devices of `device`'s stage and member: its data-parallel replicas.
  std::vector<int32_t> replica_devices(int64_t device) const;

  // "device 1 (stage 1)".
  std::string where(size_t d) const {
    return str_cat("device ", d, " (", device_role(pipe_, static_cast<int64_t>(d)), ")");
  }
  // "device 1 (stage 1) instruction 17 (compute 'fc2' (MatMul) mb 3)".
  std::string at(size_t d, size_t i) const {
    return str_cat(where(d), " instruction ", i, " (",
                   describe_instruction(g_, plan_.programs[d].instructions[i]), ")");
  }

private:
  Status check_instruction(size_t d, size_t i) const;
  Status check_program_ranges(size_t d) const;

  const Plan &plan_;
  const Graph &g_;
  const PlanPipeline &pipe_;
  const StepPhases phases_;
  std::vector<bool> accumulated_; // by tensor
  const int64_t P_, DP_, TP_, M_;
};

PipelineCheck::PipelineCheck(const Plan &plan, StepPhases phases)
    : plan_(plan), g_(plan.graph), pipe_(*plan.pipeline), phases_(std::move(phases)),
      accumulated_(plan.graph.num_tensors(), false), P_(plan.pipeline->stages),
      DP_(plan.pipeline->data_parallel), TP_(plan.pipeline->tensor_parallel),
      M_(plan.pipeline->microbatches) {
  for (TensorId t : phases_.accumulated)
    accumulated_[t] = true;
}

std::vector<int32_t> PipelineCheck::replica_devices(int64_t device) const {
  std::vector<int32_t> devices;
  for (int64_t r = 0; r < DP_; ++r)
    devices.push_back(static_cast<int32_t>((stage(device) * DP_ + r) * TP_ + member(device)));
  return devices;
}

Status PipelineCheck::check_fields() const {
  if (plan_.mode != Plan::Mode::kTrain)
    return invalid_argument("field mode is ", serialization::plan_mode_name(plan_.mode),
                            ", but a plan with a pipeline is a training plan");
  const int32_t zero = pipe_.zero;
  if (zero >= 1 && DP_ < 2)
    return invalid_argument("field pipeline.zero = ", zero, " shards optimizer state",
                            zero == 2   ? " and gradients"
                            : zero == 3 ? ", gradients and parameters"
                                        : "",
                            " over the data-parallel replicas, but pipeline.data_parallel = ", DP_);
  bool sharded = false, scattered = false, gathered = false;
  for (const PlanProgram &program : plan_.programs) {
    sharded = sharded || !program.sharded_holds.empty();
    for (const PlanInstruction &instr : program.instructions) {
      scattered = scattered || instr.kind == InstrKind::kReduceScatterAccumulate;
      gathered = gathered || serialization::fills_gathered(instr.kind);
    }
  }
  if (zero == 1 && !sharded)
    return invalid_argument("field pipeline.zero = 1, but no device holds a ZeRO-1 shard "
                            "(every program's sharded_holds is empty)");
  if (zero < 1 && sharded)
    return invalid_argument("a program holds ZeRO-1 shards (sharded_holds), but field "
                            "pipeline.zero = ",
                            zero);
  if (zero == 2 && !scattered)
    return invalid_argument("field pipeline.zero = 2, but no program reduce-scatters a gradient "
                            "into its shard every micro-batch (ReduceScatterAccumulate)");
  if (zero < 2 && scattered)
    return invalid_argument("a program reduce-scatters gradients into shards every micro-batch "
                            "(ReduceScatterAccumulate, ZeRO-2), but field pipeline.zero = ",
                            zero);
  if (zero == 3 && !gathered)
    return invalid_argument("field pipeline.zero = 3, but no program gathers a parameter it "
                            "holds as a shard (GatherParam)");
  if (zero != 3 && gathered)
    return invalid_argument("a program gathers parameters from shards (GatherParam, ZeRO-3), "
                            "but field pipeline.zero = ",
                            zero);
  return Status::ok();
}

Status PipelineCheck::check_instruction(size_t d, size_t i) const {
  const PlanInstruction &instr = plan_.programs[d].instructions[i];
  const auto kind_value = static_cast<uint8_t>(instr.kind);
  if (kind_value > static_cast<uint8_t>(InstrKind::kWaitGather))
    return invalid_argument(where(d), " instruction ", i, ": unknown kind ", int{kind_value});
  const std::string head =
      str_cat(where(d), " instruction ", i, " (", serialization::instr_kind_name(instr.kind), ")");
  const int64_t devices = static_cast<int64_t>(num_devices());
  RETURN_IF_ERROR(serialization::check_instruction_index(
      instr.kind, instr.index, plan_.programs[d].buckets.size(), g_, head));
  if (instr.kind == InstrKind::kSend || instr.kind == InstrKind::kRecv) {
    if (instr.peer < 0 || instr.peer >= devices || instr.peer == static_cast<int64_t>(d))
      return out_of_range(head, ": peer ", instr.peer, " is not another device of the ", devices);
  } else if (is_grouped(instr.kind)) {
    if (instr.peer < 0 || static_cast<size_t>(instr.peer) >= pipe_.groups.size())
      return out_of_range(head, ": group ", instr.peer, ", but the pipeline has ",
                          pipe_.groups.size());
  }
  const bool per_microbatch = instr.kind == InstrKind::kCompute || instr.kind == InstrKind::kSend ||
                              instr.kind == InstrKind::kRecv;
  const bool accumulates =
      instr.kind == InstrKind::kAccumulate || instr.kind == InstrKind::kReduceScatterAccumulate;
  const int64_t lowest = accumulates ? 0 : -1;
  if (per_microbatch || accumulates) {
    if (instr.microbatch < lowest || instr.microbatch >= M_)
      return out_of_range(head, ": micro-batch ", instr.microbatch, " is not in ", lowest, "..",
                          M_ - 1);
  } else if (serialization::fills_gathered(instr.kind) || instr.kind == InstrKind::kWaitGather) {
    if (instr.microbatch < 0 || instr.microbatch >= 2 * M_)
      return out_of_range(head, ": block ", instr.microbatch, " is not in 0..", 2 * M_ - 1,
                          " (a micro-batch's forward, or M + the micro-batch for its backward)");
  } else if (instr.microbatch != -1) {
    return invalid_argument(at(d, i), ": runs once per step, so its micro-batch is -1, not ",
                            instr.microbatch);
  }
  return Status::ok();
}

Status PipelineCheck::check_program_ranges(size_t d) const {
  const PlanProgram &program = plan_.programs[d];
  const size_t num_tensors = g_.num_tensors();
  if (program.device != d)
    return invalid_argument("program ", d, " is for device ", program.device,
                            "; programs come in device order");
  for (size_t i = 0; i < program.instructions.size(); ++i)
    RETURN_IF_ERROR(check_instruction(d, i));
  for (size_t b = 0; b < program.buckets.size(); ++b)
    for (TensorId t : program.buckets[b].tensors)
      if (t >= num_tensors)
        return out_of_range(where(d), ": bucket ", b, " holds tensor ", t, ", but there are ",
                            num_tensors);
  for (const auto *list : {&program.holds, &program.sharded_holds})
    for (TensorId t : *list)
      if (t >= num_tensors)
        return out_of_range(where(d), ": holds tensor ", t, ", but there are ", num_tensors);
  if (!program.sharded_holds.empty() &&
      (program.shard_group < 0 || static_cast<size_t>(program.shard_group) >= pipe_.groups.size()))
    return out_of_range(where(d), ": shard group ", program.shard_group, ", but the pipeline has ",
                        pipe_.groups.size(), " groups");
  const std::vector<bool> shards = serialization::shard_accumulated(program, num_tensors);
  const std::vector<bool> gathered = serialization::gathered_params(program, num_tensors);
  for (size_t k = 0; k < program.slots.size(); ++k) {
    const PlanSlot &slot = program.slots[k];
    if (slot.tensor >= num_tensors)
      return out_of_range(where(d), ": slot ", k, " is for tensor ", slot.tensor,
                          ", but there are ", num_tensors);
    const int64_t bytes = serialization::slot_bytes(g_, slot.tensor, slot.microbatch, shards, DP_);
    // A ZeRO-3 parameter's buffers are per block: 2M of them.
    const int64_t top = gathered[slot.tensor] ? 2 * M_ : M_;
    if (slot.microbatch < -1 || slot.microbatch >= top)
      return out_of_range(where(d), ": slot ", k, " (", tensor_text(g_, slot.tensor, 0),
                          ") is for micro-batch ", slot.microbatch, ", not in -1..", top - 1);
    if (slot.offset < 0 || slot.offset > program.arena_bytes ||
        bytes > program.arena_bytes - slot.offset)
      return out_of_range(where(d), ": slot ", k, " (",
                          tensor_text(g_, slot.tensor, slot.microbatch), ", ", bytes,
                          " bytes) at offset ", slot.offset, " is outside the ",
                          program.arena_bytes, "-byte arena");
  }
  return Status::ok();
}

Status PipelineCheck::check_ranges() const {
  if (P_ < 1 || DP_ < 1 || TP_ < 1 || M_ < 1 || pipe_.chunks < 1)
    return invalid_argument("field pipeline: stages (", P_, "), data_parallel (", DP_,
                            "), tensor_parallel (", TP_, "), microbatches (", M_, ") and chunks (",
                            pipe_.chunks, ") must all be at least 1");
  const int64_t devices = P_ * DP_ * TP_;
  if (static_cast<int64_t>(num_devices()) != devices)
    return invalid_argument("field pipeline: ", P_, " stages x ", DP_, " replicas x ", TP_,
                            " members make ", devices, " devices, but the plan has ", num_devices(),
                            " programs");
  if (pipe_.node_stage.size() != g_.num_nodes())
    return invalid_argument("field pipeline.node_stage has ", pipe_.node_stage.size(),
                            " entries for ", g_.num_nodes(), " nodes");
  const int64_t virtual_stages = P_ * pipe_.chunks;
  for (NodeId n = 0; n < g_.num_nodes(); ++n)
    if (pipe_.node_stage[n] < 0 || pipe_.node_stage[n] >= virtual_stages)
      return out_of_range("field pipeline.node_stage[", n, "] = ", pipe_.node_stage[n],
                          " is not a stage 0..", virtual_stages - 1);
  for (size_t k = 0; k < pipe_.groups.size(); ++k)
    for (int32_t member : pipe_.groups[k])
      if (member < 0 || member >= devices)
        return out_of_range("field pipeline.groups[", k, "] names device ", member,
                            ", but there are ", devices);
  for (size_t d = 0; d < num_devices(); ++d)
    RETURN_IF_ERROR(check_program_ranges(d));
  return Status::ok();
}

Status PipelineCheck::check_coverage() const {
  std::vector<std::vector<NodeId>> stage_nodes(static_cast<size_t>(P_));
  for (NodeId n = 0; n < g_.num_nodes(); ++n)
    stage_nodes[static_cast<size_t>(node_stage(n))].push_back(n);
  // A program that computes nothing at all (an emptied one) first.
  bool per_microbatch_work = false;
  for (Phase phase : phases_.node_phase)
    per_microbatch_work = per_microbatch_work || phase != Phase::kStep;
  int64_t covered = 0; // micro-batches the programs compute: 0..covered-1
  for (size_t d = 0; d < num_devices(); ++d) {
    size_t computes = 0;
    for (const PlanInstruction &instr : plan_.programs[d].instructions) {
      if (instr.kind != InstrKind::kCompute && instr.kind != InstrKind::kComputeShard) continue;
      ++computes;
      covered = std::max(covered, int64_t{instr.microbatch} + 1);
    }
    const auto &nodes = stage_nodes[static_cast<size_t>(stage(static_cast<int64_t>(d)))];
    if (computes == 0 && !nodes.empty())
      return invalid_argument(where(d), ": the program computes none of the ", nodes.size(),
                              " nodes of its stage");
  }
  if (per_microbatch_work && covered != M_)
    return invalid_argument("field pipeline.microbatches = ", M_, ", but the programs compute ",
                            covered == 0 ? std::string("no micro-batch")
                                         : str_cat("micro-batches 0..", covered - 1));
  for (size_t d = 0; d < num_devices(); ++d) {
    const auto &instrs = plan_.programs[d].instructions;
    const int64_t s = stage(static_cast<int64_t>(d));
    // (node, micro-batch, instruction) of every computation, sorted.
    std::vector<std::tuple<NodeId, int32_t, size_t>> runs;
    for (size_t i = 0; i < instrs.size(); ++i) {
      const PlanInstruction &instr = instrs[i];
      if (instr.kind != InstrKind::kCompute && instr.kind != InstrKind::kComputeShard) continue;
      const NodeId n = instr.index;
      if (node_stage(n) != s)
        return invalid_argument(at(d, i), ": node '", g_.node(n).name, "' is in stage ",
                                pipe_.node_stage[n],
                                " (pipeline.node_stage), which this device does not run");
      const bool step = phases_.node_phase[n] == Phase::kStep;
      if (!step && instr.kind == InstrKind::kComputeShard)
        return invalid_argument(at(d, i), ": node '", g_.node(n).name,
                                "' runs per micro-batch; only once-per-step work runs on shards");
      if (step && instr.microbatch >= 0)
        return invalid_argument(at(d, i), ": node '", g_.node(n).name,
                                "' is once-per-step work (the optimizer's), not run per "
                                "micro-batch");
      if (!step && instr.microbatch < 0)
        return invalid_argument(at(d, i), ": node '", g_.node(n).name,
                                "' runs once per micro-batch, not once per step");
      runs.emplace_back(n, instr.microbatch, i);
    }
    std::sort(runs.begin(), runs.end());
    for (size_t k = 1; k < runs.size(); ++k) {
      const auto [n, mb, i] = runs[k];
      if (n == std::get<0>(runs[k - 1]) && mb == std::get<1>(runs[k - 1]))
        return invalid_argument(at(d, i), ": computes node '", g_.node(n).name, "' ",
                                microbatch_text(mb), " a second time (first at instruction ",
                                std::get<2>(runs[k - 1]), ")");
    }
    // Every node of the stage: micro-batches 0..M-1, or once.
    size_t next = 0;
    for (NodeId n : stage_nodes[static_cast<size_t>(s)]) {
      const bool step = phases_.node_phase[n] == Phase::kStep;
      int64_t count = 0;
      while (next < runs.size() && std::get<0>(runs[next]) < n)
        ++next;
      for (; next < runs.size() && std::get<0>(runs[next]) == n; ++next, ++count)
        if (!step && std::get<1>(runs[next]) != count)
          return invalid_argument(where(d), ": never computes node '", g_.node(n).name, "' (",
                                  g_.node(n).op, ") for mb ", count,
                                  "; every node of the stage runs once per micro-batch 0..",
                                  M_ - 1);
      if (step && count == 0)
        return invalid_argument(where(d), ": never computes node '", g_.node(n).name, "' (",
                                g_.node(n).op, "), once-per-step work of its stage");
      if (!step && count != M_)
        return invalid_argument(where(d), ": never computes node '", g_.node(n).name, "' (",
                                g_.node(n).op, ") for mb ", count,
                                "; every node of the stage runs once per micro-batch 0..", M_ - 1);
    }
  }
  return Status::ok();
}

Status PipelineCheck::check_transfers() const {
  // (from, to, tensor, micro-batch) -> the send's and the receive's instruction.
  struct Ends {
    int64_t send = -1, recv = -1;
  };
  std::map<std::tuple<int64_t, int64_t, TensorId, int32_t>, Ends> messages;
  for (size_t d = 0; d < num_devices(); ++d) {
    const auto &instrs = plan_.programs[d].instructions;
    const auto self = static_cast<int64_t>(d);
    std::map<std::pair<TensorId, int32_t>, size_t> received;
    for (size_t i = 0; i < instrs.size(); ++i) {
      const PlanInstruction &instr = instrs[i];
      const bool send = instr.kind == InstrKind::kSend;
      if (!send && instr.kind != InstrKind::kRecv) continue;
      const int64_t peer = instr.peer;
      if (replica(peer) != replica(self) || member(peer) != member(self) ||
          stage(peer) == stage(self))
        return invalid_argument(at(d, i), ": device ", peer, " (", device_role(pipe_, peer),
                                ") is not this device's replica and member on another stage");
      const TensorId t = instr.index;
      const int64_t made = producer_stage(t);
      const std::string maker =
          made < 0 ? std::string("no node computes it") : str_cat("stage ", made, " computes it");
      if (send && made != stage(self))
        return invalid_argument(at(d, i), ": sends '", g_.tensor(t).name, "', but ", maker,
                                ", not this device's stage");
      if (!send && made != stage(peer))
        return invalid_argument(at(d, i), ": receives '", g_.tensor(t).name, "' from stage ",
                                stage(peer), ", but ", maker);
      if (!send) {
        auto [it, fresh] =
            received.try_emplace(std::pair<TensorId, int32_t>{t, instr.microbatch}, i);
        if (!fresh)
          return invalid_argument(at(d, i), ": receives ", tensor_text(g_, t, instr.microbatch),
                                  " a second time (first at instruction ", it->second, ")");
      }
      Ends &ends = messages[send ? std::make_tuple(self, peer, t, instr.microbatch)
                                 : std::make_tuple(peer, self, t, instr.microbatch)];
      int64_t &mine = send ? ends.send : ends.recv;
      if (mine >= 0)
        return invalid_argument(at(d, i), ": sends ", tensor_text(g_, t, instr.microbatch),
                                " to device ", peer, " a second time (first at instruction ", mine,
                                ")");
      mine = static_cast<int64_t>(i);
    }
  }
  for (const auto &[key, ends] : messages) {
    const auto &[from, to, t, mb] = key;
    if (ends.send < 0)
      return invalid_argument(at(static_cast<size_t>(to), static_cast<size_t>(ends.recv)),
                              ": device ", from, " never sends ", tensor_text(g_, t, mb), " to it");
    if (ends.recv < 0)
      return invalid_argument(at(static_cast<size_t>(from), static_cast<size_t>(ends.send)),
                              ": device ", to, " never receives it (no recv of ",
                              tensor_text(g_, t, mb), " from device ", from, ")");
  }
  return Status::ok();
}

// One device's program, instruction by instruction: what each reads was
// written before, the accumulated tensors' sums, collectives and updates;
// then its memory.
class DeviceCheck {
public:
  DeviceCheck(const PipelineCheck &plan, size_t device);
  Status run();

private:
  using Key = std::pair<TensorId, int32_t>;
  // The sum over micro-batches (and replicas) of an accumulated tensor the
  // device computes: instructions that did each part, -1 until then.
  struct Sum {
    int64_t accumulated = 0; // micro-batches added so far
    int64_t reduced = -1;    // the all-reduce, reduce-scatter or bucket start
    bool reduce_done = false;
    bool scattered = false; // the device keeps only its shard
    bool shard_sum = false; // ZeRO-2: reduce-scattered into its shard every micro-batch
    int64_t scaled = -1;
  };

  // With one micro-batch an accumulated tensor's step buffer (t, -1) is its
  // micro-batch buffer (t, 0), as the lowering places them; but not a ZeRO-2
  // shard's, which is a buffer of its own.
  Key key(TensorId t, int32_t mb) const {
    if (check_.microbatches() == 1 && mb < 0 && check_.accumulated(t) && !shard_sum_[t])
      return {t, 0};
    return {t, mb};
  }
  Status read(TensorId t, int32_t mb, size_t i);
  void write(TensorId t, int32_t mb, size_t i);
  // A step buffer read once per step must be final: its mean taken, whole on
  // the device unless read by work on shards.
  Status read_step_value(TensorId t, size_t i, bool on_shards) const;
  Status check_group(size_t i) const;
  Status compute(const PlanInstruction &instr, size_t i);
  Status accumulate(const PlanInstruction &instr, size_t i);
  Status scale(const PlanInstruction &instr, size_t i);
  Status start_sum(TensorId t, size_t i, bool scatter);
  Status reduce(const PlanInstruction &instr, size_t i);
  Status reduce_scatter_accumulate(const PlanInstruction &instr, size_t i);
  Status gather(const PlanInstruction &instr, size_t i);
  Status gather_param(const PlanInstruction &instr, size_t i);
  Status wait_gather(const PlanInstruction &instr, size_t i);
  Status bucket(const PlanInstruction &instr, size_t i);
  Status update(const PlanInstruction &instr, size_t i);
  Status instruction(size_t i);
  // What the whole program must have done by its end.
  Status check_end() const;
  Status check_memory();

  const PipelineCheck &check_;
  const Graph &g_;
  const size_t d_;
  const PlanProgram &program_;
  const bool averaged_; // micro-batches x replicas > 1: sums are scaled to means
  std::map<Key, std::pair<int64_t, int64_t>> life_; // first write, last use
  std::vector<bool> own_sum_;                       // accumulated here, by tensor
  std::vector<bool> shard_sum_;       // ZeRO-2: the step buffer holds only the shard, by tensor
  std::vector<Sum> sums_;             // by tensor
  std::map<Key, size_t> accumulates_; // (tensor, mb) -> instruction
  // ZeRO-2: micro-batch buffers reduce-scattered (then scratch but for the
  // shard that went into the step buffer) -> the instruction.
  std::map<Key, size_t> scattered_;
  std::vector<bool> held_, sharded_;
  std::vector<bool> gathered_;    // ZeRO-3: parameters the device gathers per block, by tensor
  std::vector<bool> partial_;     // computed on shards, not yet gathered or summed
  std::vector<int64_t> replaced_; // by tensor: the update that replaced it
  std::vector<int64_t> applied_;  // by state update
  std::vector<int64_t> started_;  // by bucket
  // ZeRO-3 prefetch: buffers a StartGather fills, not yet waited for -> it.
  std::map<Key, size_t> in_flight_;
};

DeviceCheck::DeviceCheck(const PipelineCheck &check, size_t device)
    : check_(check), g_(check.graph()), d_(device), program_(check.program(device)),
      averaged_(check.microbatches() * check.replicas() > 1), own_sum_(g_.num_tensors(), false),
      shard_sum_(serialization::shard_accumulated(program_, g_.num_tensors())),
      sums_(g_.num_tensors()), held_(g_.num_tensors(), false), sharded_(g_.num_tensors(), false),
      gathered_(serialization::gathered_params(program_, g_.num_tensors())),
      partial_(g_.num_tensors(), false), replaced_(g_.num_tensors(), -1),
      applied_(g_.updates().size(), -1), started_(program_.buckets.size(), -1) {
  const int64_t stage = check.stage(static_cast<int64_t>(device));
  for (TensorId t : check.phases().accumulated)
    own_sum_[t] = check.producer_stage(t) == stage;
  for (TensorId t : program_.holds)
    held_[t] = true;
  for (TensorId t : program_.sharded_holds)
    sharded_[t] = true;
}

Status DeviceCheck::read(TensorId t, int32_t mb, size_t i) {
  if (auto f = in_flight_.find(Key{t, mb}); f != in_flight_.end())
    return invalid_argument(check_.at(d_, i), ": reads ", tensor_text(g_, t, mb),
                            " while the gather instruction ", f->second,
                            " started still fills it (no WaitGather of it comes first)");
  if (auto s = scattered_.find(Key{t, mb}); mb >= 0 && s != scattered_.end())
    return invalid_argument(check_.at(d_, i), ": reads ", tensor_text(g_, t, mb),
                            " after instruction ", s->second,
                            " reduce-scattered it; only the device's shard of the sum, in the "
                            "step buffer, is left of it");
  auto it = life_.find(key(t, mb));
  if (it == life_.end()) {
    const int64_t made = check_.producer_stage(t);
    const NodeId producer = g_.tensor(t).producer;
    std::string why;
    if (made < 0)
      why = "; no node computes it";
    else if (mb < 0 && own_sum_[t] && check_.microbatches() > 1)
      why = "; no accumulate of it comes first";
    else if (made == check_.stage(static_cast<int64_t>(d_)))
      why = str_cat("; its producer '", g_.node(producer).name, "' (", g_.node(producer).op,
                    ") has not run on ", microbatch_text(mb), " before it");
    else
      why = str_cat("; stage ", made, " computes it, and no recv of it comes first");
    return invalid_argument(check_.at(d_, i), ": reads ", tensor_text(g_, t, mb),
                            " before anything on the device writes it", why);
  }
  it->second.second = std::max(it->second.second, static_cast<int64_t>(i));
  return Status::ok();
}

void DeviceCheck::write(TensorId t, int32_t mb, size_t i) {
  const auto n = static_cast<int64_t>(i);
  auto [it, fresh] = life_.try_emplace(key(t, mb), n, n);
  if (!fresh) it->second.second = std::max(it->second.second, n);
}

Status DeviceCheck::read_step_value(TensorId t, size_t i, bool on_shards) const {
  const std::string &name = g_.tensor(t).name;
  if (own_sum_[t]) {
    const Sum &sum = sums_[t];
    if (averaged_ && sum.scaled < 0)
      return invalid_argument(check_.at(d_, i), ": reads '", name,
                              "' (step) before its mean over the micro-batches",
                              check_.replicas() > 1 ? " and replicas" : "", " (scale)");
    if (sum.scattered && !on_shards)
      return invalid_argument(check_.at(d_, i), ": reads '", name,
                              "', of which the device keeps only its reduce-scattered shard");
  }
  if (partial_[t] && !on_shards)
    return invalid_argument(check_.at(d_, i), ": reads '", name,
                            "', computed on shards and not yet gathered or summed over the "
                            "replicas");
  return Status::ok();
}

Status DeviceCheck::check_group(size_t i) const {
  const PlanInstruction &instr = program_.instructions[i];
  if (check_.replicas() < 2)
    return invalid_argument(check_.at(d_, i), ": runs over group ", instr.peer,
                            ", but pipeline.data_parallel = 1: the device has no replicas");
  std::vector<int32_t> group = check_.pipeline().groups[static_cast<size_t>(instr.peer)];
  std::sort(group.begin(), group.end());
  const std::vector<int32_t> replicas = check_.replica_devices(static_cast<int64_t>(d_));
  if (group != replicas)
    return invalid_argument(check_.at(d_, i), ": group ", instr.peer, " is devices ",
                            devices_text(group), ", not this device's replicas (devices ",
                            devices_text(replicas), ")");
  return Status::ok();
}

Status DeviceCheck::compute(const PlanInstruction &instr, size_t i) {
  const bool shard = instr.kind == InstrKind::kComputeShard;
  if (shard) RETURN_IF_ERROR(check_group(i));
  const Node &node = g_.node(instr.index);
  const int32_t mb = shard ? -1 : instr.microbatch;
  for (TensorId in : node.inputs) {
    const Tensor &tensor = g_.tensor(in);
    switch (tensor.kind) {
    case TensorKind::kInput:
      if (mb < 0)
        return invalid_argument(check_.at(d_, i), ": reads graph input '", tensor.name,
                                "' once per step; inputs are read per micro-batch");
      break;
    case TensorKind::kIntermediate:
      RETURN_IF_ERROR(read(in, mb, i));
      if (mb < 0) RETURN_IF_ERROR(read_step_value(in, i, shard));
      break;
    case TensorKind::kParameter:
    case TensorKind::kConstant:
    case TensorKind::kState:
      if (!held_[in])
        return invalid_argument(check_.at(d_, i), ": reads '", tensor.name,
                                "', which the device does not hold (program holds)");
      if (replaced_[in] >= 0)
        return invalid_argument(
            check_.at(d_, i), ": reads '", tensor.name, "' after instruction ", replaced_[in],
            " replaced it (",
            describe_instruction(g_, program_.instructions[static_cast<size_t>(replaced_[in])]),
            ")");
      if (sharded_[in] && !shard && gathered_[in] && mb >= 0) {
        // ZeRO-3: the whole parameter, from its block's gather.
        const int32_t block =
            gather_block(check_.phases().node_phase[instr.index] == Phase::kBackward, mb,
                         static_cast<int32_t>(check_.microbatches()));
        if (!life_.contains(Key{in, block}))
          return invalid_argument(check_.at(d_, i), ": reads '", tensor.name,
                                  "', which the device holds only as its ZeRO-3 shard, before "
                                  "a gather of it for block ",
                                  block, " (GatherParam) comes first");
        RETURN_IF_ERROR(read(in, block, i));
        break;
      }
      if (sharded_[in] && !shard)
        return invalid_argument(check_.at(d_, i), ": reads '", tensor.name,
                                "', which the device holds only as its ZeRO-1 shard "
                                "(sharded_holds); only compute-shard reads it");
      break;
    }
  }
  for (TensorId out : node.outputs) {
    write(out, mb, i);
    partial_[out] = shard;
  }
  return Status::ok();
}

Status DeviceCheck::accumulate(const PlanInstruction &instr, size_t i) {
  const TensorId t = instr.index;
  const std::string &name = g_.tensor(t).name;
  if (!own_sum_[t])
    return invalid_argument(check_.at(d_, i), ": '", name,
                            "' is not summed over micro-batches on this device (a "
                            "per-micro-batch tensor read once per step, computed by its stage)");
  if (shard_sum_[t])
    return invalid_argument(check_.at(d_, i), ": accumulates '", name,
                            "' whole, but the device keeps only its shard of that sum (it "
                            "reduce-scatters '",
                            name, "' into its shard: ReduceScatterAccumulate)");
  if (check_.microbatches() == 1)
    return invalid_argument(check_.at(d_, i),
                            ": with one micro-batch a step buffer is the micro-batch's own; "
                            "nothing is accumulated");
  Sum &sum = sums_[t];
  if (sum.reduced >= 0 || sum.scaled >= 0)
    return invalid_argument(check_.at(d_, i), ": accumulates '", name, "' after instruction ",
                            std::max(sum.reduced, sum.scaled), " already ",
                            sum.reduced >= 0 ? "summed it over the replicas" : "scaled it");
  auto [it, fresh] = accumulates_.try_emplace(Key{t, instr.microbatch}, i);
  if (!fresh)
    return invalid_argument(check_.at(d_, i), ": accumulates ",
                            tensor_text(g_, t, instr.microbatch),
                            " a second time (first at instruction ", it->second, ")");
  if (sum.accumulated == 0 && instr.microbatch != 0)
    return invalid_argument(check_.at(d_, i), ": accumulates ",
                            tensor_text(g_, t, instr.microbatch),
                            " before mb 0, which starts the sum");
  RETURN_IF_ERROR(read(t, instr.microbatch, i));
  write(t, -1, i);
  ++sum.accumulated;
  return Status::ok();
}

Status DeviceCheck::scale(const PlanInstruction &instr, size_t i) {
  const TensorId t = instr.index;
  const std::string &name = g_.tensor(t).name;
  const int64_t M = check_.microbatches();
  if (!own_sum_[t])
    return invalid_argument(check_.at(d_, i), ": '", name,
                            "' is not a sum over micro-batches of this device; scale divides "
                            "such sums into means");
  if (!averaged_)
    return invalid_argument(check_.at(d_, i),
                            ": one micro-batch and one replica: there is no mean to take");
  Sum &sum = sums_[t];
  if (sum.scaled >= 0)
    return invalid_argument(check_.at(d_, i), ": scales '", name,
                            "' a second time (first at instruction ", sum.scaled, ")");
  if (M > 1 && sum.accumulated < M)
    return invalid_argument(check_.at(d_, i), ": scales '", name, "' after ", sum.accumulated,
                            " of its ", M, " micro-batches were accumulated");
  if (check_.replicas() > 1 && !sum.reduce_done)
    return invalid_argument(
        check_.at(d_, i), ": scales '", name, "' before its sum over the replicas is complete (",
        sum.reduced < 0 ? "it is not reduced before this" : "its gradient bucket is not waited for",
        ")");
  RETURN_IF_ERROR(read(t, -1, i));
  sum.scaled = static_cast<int64_t>(i);
  return Status::ok();
}

Status DeviceCheck::start_sum(TensorId t, size_t i, bool scatter) {
  const std::string &name = g_.tensor(t).name;
  const int64_t M = check_.microbatches();
  Sum &sum = sums_[t];
  if (sum.reduced >= 0)
    return invalid_argument(check_.at(d_, i), ": sums '", name,
                            "' over the replicas a second time (first at instruction ", sum.reduced,
                            ")");
  if (sum.scaled >= 0)
    return invalid_argument(check_.at(d_, i), ": sums '", name,
                            "' over the replicas after instruction ", sum.scaled, " scaled it");
  if (M > 1 && sum.accumulated < M)
    return invalid_argument(check_.at(d_, i), ": sums '", name, "' over the replicas after ",
                            sum.accumulated, " of its ", M, " micro-batches were accumulated");
  sum.reduced = static_cast<int64_t>(i);
  sum.scattered = scatter;
  return Status::ok();
}

Status DeviceCheck::reduce(const PlanInstruction &instr, size_t i) {
  RETURN_IF_ERROR(check_group(i));
  const TensorId t = instr.index;
  RETURN_IF_ERROR(read(t, -1, i));
  if (own_sum_[t]) {
    RETURN_IF_ERROR(start_sum(t, i, instr.kind == InstrKind::kReduceScatter));
    sums_[t].reduce_done = true;
    return Status::ok();
  }
  if (instr.kind == InstrKind::kAllReduce && partial_[t]) {
    partial_[t] = false; // the partial sums of the shards, summed
    return Status::ok();
  }
  return invalid_argument(check_.at(d_, i), ": '", g_.tensor(t).name,
                          "' is neither a sum over micro-batches of this device",
                          instr.kind == InstrKind::kAllReduce ? " nor computed on shards" : "",
                          "; there is nothing to sum over the replicas");
}

// ZeRO-2: one micro-batch summed over the replicas, the device's shard of it
// started (mb 0) or added into the step buffer, which holds only that shard;
// the sum is complete with the last micro-batch's.
Status DeviceCheck::reduce_scatter_accumulate(const PlanInstruction &instr, size_t i) {
  RETURN_IF_ERROR(check_group(i));
  const TensorId t = instr.index;
  const int32_t mb = instr.microbatch;
  const std::string &name = g_.tensor(t).name;
  if (!own_sum_[t])
    return invalid_argument(check_.at(d_, i), ": '", name,
                            "' is not summed over micro-batches on this device (a "
                            "per-micro-batch tensor read once per step, computed by its stage)");
  auto [it, fresh] = accumulates_.try_emplace(Key{t, mb}, i);
  if (!fresh)
    return invalid_argument(check_.at(d_, i), ": reduce-scatters ", tensor_text(g_, t, mb),
                            " into its shard a second time (first at instruction ", it->second,
                            ")");
  Sum &sum = sums_[t];
  if ((sum.reduced >= 0 && !sum.shard_sum) || sum.scaled >= 0)
    return invalid_argument(check_.at(d_, i), ": reduce-scatters ", tensor_text(g_, t, mb),
                            " into its shard after instruction ",
                            sum.scaled >= 0 ? sum.scaled : sum.reduced, " already ",
                            sum.scaled >= 0 ? "scaled it" : "summed it over the replicas");
  if (sum.accumulated == 0 && mb != 0)
    return invalid_argument(check_.at(d_, i), ": reduce-scatters ", tensor_text(g_, t, mb),
                            " into its shard before mb 0, which starts the sum");
  RETURN_IF_ERROR(read(t, mb, i));
  scattered_.emplace(Key{t, mb}, i);
  write(t, -1, i);
  if (sum.reduced < 0) sum.reduced = static_cast<int64_t>(i);
  sum.shard_sum = sum.scattered = true;
  ++sum.accumulated;
  sum.reduce_done = sum.accumulated == check_.microbatches();
  return Status::ok();
}

Status DeviceCheck::gather(const PlanInstruction &instr, size_t i) {
  RETURN_IF_ERROR(check_group(i));
  const TensorId t = instr.index;
  RETURN_IF_ERROR(read(t, -1, i));
  if (!partial_[t])
    return invalid_argument(check_.at(d_, i), ": gathers '", g_.tensor(t).name,
                            "', which no compute-shard before it left in shards");
  partial_[t] = false;
  return Status::ok();
}

// ZeRO-3: a parameter the device holds as its shard, gathered whole into its
// block's buffer once.
Status DeviceCheck::gather_param(const PlanInstruction &instr, size_t i) {
  RETURN_IF_ERROR(check_group(i));
  const TensorId t = instr.index;
  const Tensor &tensor = g_.tensor(t);
  if (tensor.kind != TensorKind::kParameter || !held_[t] || !sharded_[t])
    return invalid_argument(check_.at(d_, i), ": gathers '", tensor.name,
                            "', which is not a parameter the device holds as its shard "
                            "(sharded_holds)");
  if (static_cast<int32_t>(instr.peer) != program_.shard_group)
    return invalid_argument(check_.at(d_, i), ": gathers over group ", instr.peer,
                            ", but the device's shards are of group ", program_.shard_group);
  if (replaced_[t] >= 0)
    return invalid_argument(check_.at(d_, i), ": gathers '", tensor.name, "' after instruction ",
                            replaced_[t], " replaced it");
  if (life_.contains(Key{t, instr.microbatch}))
    return invalid_argument(check_.at(d_, i), ": gathers '", tensor.name, "' for block ",
                            instr.microbatch, " a second time");
  write(t, instr.microbatch, i);
  if (instr.kind == InstrKind::kStartGather) in_flight_.emplace(Key{t, instr.microbatch}, i);
  return Status::ok();
}

// ZeRO-3 prefetch: the wait for a gather started before, over its group.
Status DeviceCheck::wait_gather(const PlanInstruction &instr, size_t i) {
  RETURN_IF_ERROR(check_group(i));
  const Key k{instr.index, instr.microbatch};
  auto f = in_flight_.find(k);
  if (f == in_flight_.end())
    return invalid_argument(check_.at(d_, i), ": waits for the gather of ",
                            tensor_text(g_, k.first, k.second),
                            ", which no StartGather before it started (or one waited for it)");
  const PlanInstruction &start = program_.instructions[f->second];
  if (start.peer != instr.peer)
    return invalid_argument(check_.at(d_, i), ": waits over group ", instr.peer,
                            " for the gather instruction ", f->second, " started over group ",
                            start.peer);
  in_flight_.erase(f);
  write(k.first, k.second, i);
  return Status::ok();
}

Status DeviceCheck::bucket(const PlanInstruction &instr, size_t i) {
  RETURN_IF_ERROR(check_group(i));
  const PlanBucket &planned = program_.buckets[instr.index];
  int64_t &started = started_[instr.index];
  const bool start = instr.kind == InstrKind::kStartBucket;
  if (start && started >= 0)
    return invalid_argument(check_.at(d_, i), ": starts bucket ", instr.index,
                            " a second time (first at instruction ", started, ")");
  if (!start && started < 0)
    return invalid_argument(check_.at(d_, i), ": waits for bucket ", instr.index,
                            " before it is started");
  for (TensorId t : planned.tensors) {
    if (!own_sum_[t])
      return invalid_argument(check_.at(d_, i), ": bucket ", instr.index, " holds '",
                              g_.tensor(t).name,
                              "', which is not a sum over micro-batches of this device");
    RETURN_IF_ERROR(read(t, -1, i));
    if (start)
      RETURN_IF_ERROR(start_sum(t, i, planned.reduce_scatter));
    else
      sums_[t].reduce_done = true;
  }
  if (start) started = static_cast<int64_t>(i);
  return Status::ok();
}

Status DeviceCheck::update(const PlanInstruction &instr, size_t i) {
  const StateUpdate &assignment = g_.updates()[instr.index];
  const std::string &target = g_.tensor(assignment.target).name;
  if (!held_[assignment.target])
    return invalid_argument(check_.at(d_, i), ": applies update ", instr.index, " of '", target,
                            "', which the device does not hold");
  if (applied_[instr.index] >= 0)
    return invalid_argument(check_.at(d_, i), ": applies update ", instr.index, " of '", target,
                            "' a second time (first at instruction ", applied_[instr.index], ")");
  RETURN_IF_ERROR(read(assignment.value, -1, i));
  RETURN_IF_ERROR(read_step_value(assignment.value, i, sharded_[assignment.target]));
  applied_[instr.index] = static_cast<int64_t>(i);
  replaced_[assignment.target] = static_cast<int64_t>(i);
  return Status::ok();
}

Status DeviceCheck::instruction(size_t i) {
  const PlanInstruction &instr = program_.instructions[i];
  switch (instr.kind) {
  case InstrKind::kCompute:
  case InstrKind::kComputeShard: return compute(instr, i);
  case InstrKind::kSend:
    RETURN_IF_ERROR(read(instr.index, instr.microbatch, i));
    if (instr.microbatch < 0) return read_step_value(instr.index, i, false);
    return Status::ok();
  case InstrKind::kRecv:
    write(instr.index, instr.microbatch, i);
    partial_[instr.index] = false;
    return Status::ok();
  case InstrKind::kAccumulate: return accumulate(instr, i);
  case InstrKind::kScale: return scale(instr, i);
  case InstrKind::kAllReduce:
  case InstrKind::kReduceScatter: return reduce(instr, i);
  case InstrKind::kAllGather: return gather(instr, i);
  case InstrKind::kReduceScatterAccumulate: return reduce_scatter_accumulate(instr, i);
  case InstrKind::kGatherParam:
  case InstrKind::kStartGather: return gather_param(instr, i);
  case InstrKind::kWaitGather: return wait_gather(instr, i);
  case InstrKind::kStartBucket:
  case InstrKind::kWaitBucket: return bucket(instr, i);
  case InstrKind::kUpdate: return update(instr, i);
  }
  return Status::ok();
}

Status DeviceCheck::check_end() const {
  const int64_t M = check_.microbatches(), DP = check_.replicas();
  const std::string where = check_.where(d_);
  if (!in_flight_.empty()) {
    const auto &[k, start] = *in_flight_.begin();
    return invalid_argument(where, ": never waits for the gather of ",
                            tensor_text(g_, k.first, k.second), " that instruction ", start,
                            " started");
  }
  for (TensorId t : check_.phases().accumulated) {
    if (!own_sum_[t]) continue;
    const Sum &sum = sums_[t];
    const std::string &name = g_.tensor(t).name;
    if (M > 1 && sum.accumulated != M) {
      int32_t missing = 0;
      while (accumulates_.contains(Key{t, missing}))
        ++missing;
      return invalid_argument(where, ": accumulates '", name, "' for ", sum.accumulated, " of its ",
                              M, " micro-batches (never mb ", missing, ")");
    }
    if (DP > 1 && sum.reduced < 0)
      return invalid_argument(where, ": never sums '", name,
                              "' over its replicas (an all-reduce, a reduce-scatter or a "
                              "gradient bucket)");
    if (DP > 1 && !sum.reduce_done)
      return invalid_argument(where, ": never waits for the gradient bucket that sums '", name,
                              "' over its replicas");
    if (averaged_ && sum.scaled < 0)
      return invalid_argument(where, ": never scales '", name, "' to its mean over ", M,
                              " micro-batches", DP > 1 ? str_cat(" x ", DP, " replicas") : "");
  }
  for (size_t u = 0; u < g_.updates().size(); ++u)
    if (held_[g_.updates()[u].target] && applied_[u] < 0)
      return invalid_argument(where, ": never applies update ", u, " of '",
                              g_.tensor(g_.updates()[u].target).name, "', which the device holds");
  return Status::ok();
}

Status DeviceCheck::check_memory() {
  const std::string where = check_.where(d_);
  // Each buffer's slot, as the runtime finds it.
  std::map<Key, int64_t> offset_of;
  for (const PlanSlot &slot : program_.slots)
    if (!offset_of.try_emplace(Key{slot.tensor, slot.microbatch}, slot.offset).second)
      return invalid_argument(where, ": two slots for ",
                              tensor_text(g_, slot.tensor, slot.microbatch));
  if (check_.microbatches() == 1)
    for (const auto &[k, offset] : offset_of) {
      if (k.second >= 0 || !check_.accumulated(k.first) || shard_sum_[k.first]) continue;
      auto own = offset_of.find(Key{k.first, 0});
      if (own != offset_of.end() && own->second != offset)
        return invalid_argument(
            where, ": with one micro-batch the step buffer of '", g_.tensor(k.first).name,
            "' is its mb 0 buffer, but their slots are at offsets ", offset, " and ", own->second);
    }
  // Graph outputs are read after the step.
  const auto end = static_cast<int64_t>(program_.instructions.size());
  for (TensorId out : g_.outputs()) {
    auto it = life_.find(key(out, -1));
    if (it != life_.end()) it->second.second = end;
  }
  // Buffers by first write; a sweep keeps the byte ranges of those live.
  struct Buffer {
    Key key;
    int64_t first = 0, last = 0, begin = 0, end = 0;
  };
  std::vector<Buffer> buffers;
  for (const auto &[k, span] : life_) {
    auto slot = offset_of.find(k);
    const int64_t bytes =
        serialization::slot_bytes(g_, k.first, k.second, shard_sum_, check_.replicas());
    if (slot == offset_of.end() || bytes <= 0) continue; // no slot: resolve_program says so
    buffers.push_back({k, span.first, span.second, slot->second, slot->second + bytes});
  }
  std::stable_sort(buffers.begin(), buffers.end(),
                   [](const Buffer &a, const Buffer &b) { return a.first < b.first; });
  auto describe = [&](const Buffer &b) {
    return str_cat(tensor_text(g_, b.key.first, b.key.second), " (bytes ", b.begin, "..", b.end - 1,
                   ", live over instructions ", b.first, "..", b.last, ")");
  };
  std::map<int64_t, size_t> placed;          // begin -> buffer, disjoint ranges
  using Ending = std::pair<int64_t, size_t>; // last use, buffer
  std::priority_queue<Ending, std::vector<Ending>, std::greater<>> ending;
  for (size_t k = 0; k < buffers.size(); ++k) {
    const Buffer &buffer = buffers[k];
    while (!ending.empty() && ending.top().first < buffer.first) {
      const size_t done = ending.top().second;
      ending.pop();
      auto it = placed.find(buffers[done].begin);
      if (it != placed.end() && it->second == done) placed.erase(it);
    }
    auto next = placed.lower_bound(buffer.begin);
    size_t clash = buffers.size(); // none
    if (next != placed.end() && buffers[next->second].begin < buffer.end) clash = next->second;
    if (clash == buffers.size() && next != placed.begin() &&
        buffers[std::prev(next)->second].end > buffer.begin)
      clash = std::prev(next)->second;
    if (clash < buffers.size())
      return invalid_argument(where, ": buffers ", describe(buffers[clash]), " and ",
                              describe(buffer), " share bytes of the arena while both are live");
    placed[buffer.begin] = k;
    ending.push({buffer.last, k});
  }
  return Status::ok();
}

Status DeviceCheck::run() {
  for (size_t i = 0; i < program_.instructions.size(); ++i)
    RETURN_IF_ERROR(instruction(i));
  RETURN_IF_ERROR(check_end());
  return check_memory();
}

Status verify_pipeline(const Plan &plan) {
  const PlanPipeline &pipe = *plan.pipeline;
  // The phases the lowering split the step into (replicas split the batch
  // like micro-batches do).
  const int64_t slices = int64_t{pipe.microbatches} * pipe.data_parallel;
  auto phases =
      analyze_phases(plan.graph, static_cast<int>(std::clamp<int64_t>(slices, 1, INT_MAX)));
  if (!phases.is_ok()) return phases.status().with_context("the plan's graph");
  const PipelineCheck check(plan, std::move(phases).value());
  RETURN_IF_ERROR(check.check_ranges());
  RETURN_IF_ERROR(check.check_fields());
  RETURN_IF_ERROR(check.check_coverage());
  RETURN_IF_ERROR(check.check_transfers());
  for (size_t d = 0; d < check.num_devices(); ++d) {
    DeviceCheck device(check, d);
    RETURN_IF_ERROR(device.run());
  }
  return Status::ok();
}

} // namespace

Status verify_plan(const Plan &plan) {
  if (plan.mode == Plan::Mode::kTrain) RETURN_IF_ERROR(check_loss_kind(plan));
  if (plan.pipeline) RETURN_IF_ERROR(verify_pipeline(plan));
  return Status::ok();
}

} // namespace strata::plan
