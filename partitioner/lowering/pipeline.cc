#include "partitioner/lowering/pipeline.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "ops/registry.h"
#include "partitioner/cost/cost_model.h"
#include "passes/optimizer.h"
#include "passes/plan_memory.h"
#include "passes/recompute.h"

namespace strata::partitioner {

using plan::analyze_phases;
using plan::describe_instruction;
using plan::is_collective;
using plan::microbatch_text;
using plan::Phase;
using plan::SimulationCosts;
using plan::StepPhases;
using plan::transfer_tag;
using serialization::InstrKind;
using serialization::PlanInstruction;
using serialization::PlanProgram;
using serialization::PlanSlot;

namespace {

bool is_intermediate(const Graph &graph, TensorId id) {
  return graph.tensor(id).kind == TensorKind::kIntermediate;
}

} // namespace

namespace {

// Emits one device's instruction stream.
class ProgramBuilder {
public:
  ProgramBuilder(const Graph &graph, const std::vector<int> &node_stage,
                 const std::vector<NodeId> &producer, int stage)
      : graph_(graph), node_stage_(node_stage), producer_(producer), stage_(stage) {}

  // Receives what `node` reads from other stages, then runs it.
  void compute(NodeId node, int32_t mb) {
    for (TensorId in : graph_.node(node).inputs) {
      if (!is_intermediate(graph_, in)) continue;
      const int from = node_stage_[producer_[in]];
      if (from == stage_ || !have_.insert({in, mb}).second) continue;
      program_.instructions.push_back({InstrKind::kRecv, mb, in, from});
    }
    program_.instructions.push_back({InstrKind::kCompute, mb, node, -1});
  }
  // The same on the device's shard over group `group` (ZeRO-1).
  void compute_shard(NodeId node, int group) {
    compute(node, -1);
    program_.instructions.back() = {InstrKind::kComputeShard, -1, node, group};
  }
  void send(TensorId tensor, int32_t mb, int peer) {
    if (sent_.insert({tensor, mb, peer}).second)
      program_.instructions.push_back({InstrKind::kSend, mb, tensor, peer});
  }
  void recv(TensorId tensor, int32_t mb, int peer) {
    if (have_.insert({tensor, mb}).second)
      program_.instructions.push_back({InstrKind::kRecv, mb, tensor, peer});
  }
  void add(InstrKind kind, uint32_t index, int32_t mb = -1, int peer = -1) {
    program_.instructions.push_back({kind, mb, index, peer});
  }
  // ZeRO-3: gathers parameter `tensor` into its block's buffer over group
  // `group`, unless the block has it already.
  void gather(TensorId tensor, int32_t block, int group) {
    if (gathered_.insert({tensor, block}).second)
      program_.instructions.push_back({InstrKind::kGatherParam, block, tensor, group});
  }
  PlanProgram &program() { return program_; }

private:
  const Graph &graph_;
  const std::vector<int> &node_stage_;
  const std::vector<NodeId> &producer_;
  const int stage_;
  std::set<std::pair<TensorId, int32_t>> have_;       // buffers received so far
  std::set<std::tuple<TensorId, int32_t, int>> sent_; // (buffer, peer) sent so far
  std::set<std::pair<TensorId, int32_t>> gathered_;   // ZeRO-3: (parameter, block)
  PlanProgram program_;
};

// ZeRO-3 prefetch. The GatherParams in front of one compute are a run;
// consecutive runs make a batch of at least an eighth of the parameters the
// program gathers, up to kPrefetchBytes (the last may be smaller). Each batch is started
// (StartGather) where the batch before it begins to be read, and each run waited for (WaitGather)
// where it stands: the stream gathers one batch ahead while the device computes. The first batch is
// started where it stands. (Batches, not single parameters, so the stream moves few, large
// transfers: a layer's weights, not each bias.)
constexpr int64_t kPrefetchBytes = int64_t{1} << 20;

void prefetch_gathers(const Graph &graph, PlanProgram &program) {
  const std::vector<PlanInstruction> &old = program.instructions;
  // Runs by position, and the batch each run belongs to.
  std::vector<std::pair<size_t, size_t>> runs; // first instruction, count
  for (size_t i = 0; i < old.size(); ++i) {
    if (old[i].kind != InstrKind::kGatherParam) continue;
    if (i == 0 || old[i - 1].kind != InstrKind::kGatherParam) runs.emplace_back(i, 0);
    ++runs.back().second;
  }
  std::set<TensorId> gathered;
  int64_t total = 0;
  for (const auto &[first, count] : runs)
    for (size_t k = 0; k < count; ++k)
      if (gathered.insert(old[first + k].index).second)
        total += graph.tensor(old[first + k].index).type.size_bytes();
  const int64_t enough = std::min(kPrefetchBytes, total / 8);
  std::vector<size_t> batch_of(runs.size());
  std::vector<std::vector<PlanInstruction>> batches;
  int64_t bytes = enough;
  for (size_t r = 0; r < runs.size(); ++r) {
    if (bytes >= enough) {
      batches.emplace_back();
      bytes = 0;
    }
    batch_of[r] = batches.size() - 1;
    for (size_t k = 0; k < runs[r].second; ++k) {
      PlanInstruction instr = old[runs[r].first + k];
      bytes += graph.tensor(instr.index).type.size_bytes();
      instr.kind = InstrKind::kStartGather;
      batches.back().push_back(instr);
    }
  }
  std::vector<PlanInstruction> out;
  size_t next_run = 0;
  for (size_t i = 0; i < old.size(); ++i) {
    if (old[i].kind != InstrKind::kGatherParam) {
      out.push_back(old[i]);
      continue;
    }
    if (next_run >= runs.size() || runs[next_run].first != i) continue; // emitted with its run
    const size_t r = next_run++, b = batch_of[r];
    // The batch's first run starts the next batch (and the first batch
    // itself, waited for before the next starts: consecutive StartGathers
    // are one task of the stream).
    const bool first = r == 0 || batch_of[r - 1] != b;
    if (first && b == 0) out.insert(out.end(), batches[0].begin(), batches[0].end());
    if (first && b > 0 && b + 1 < batches.size())
      out.insert(out.end(), batches[b + 1].begin(), batches[b + 1].end());
    for (size_t k = 0; k < runs[r].second; ++k) {
      PlanInstruction instr = old[runs[r].first + k];
      instr.kind = InstrKind::kWaitGather;
      out.push_back(instr);
    }
    if (first && b == 0 && batches.size() > 1)
      out.insert(out.end(), batches[1].begin(), batches[1].end());
  }
  program.instructions = std::move(out);
}

// Buffer lifetimes of one program and their placement. A ZeRO-2 gradient's
// step buffer holds only the device's shard: 1/replicas of its bytes. A
// ZeRO-3 parameter's block buffer lives from its gather to the block's last
// reader (`node_phase` says which block a node reads).
Status plan_program_memory(const Graph &graph, const std::vector<bool> &accumulated,
                           const std::vector<Phase> &node_phase, int microbatches, int replicas,
                           int64_t alignment, PlanProgram &program) {
  using Key = std::pair<TensorId, int32_t>;
  const std::vector<bool> shards = serialization::shard_accumulated(program, graph.num_tensors());
  const std::vector<bool> gathered = serialization::gathered_params(program, graph.num_tensors());
  // With one micro-batch the accumulated buffer (t, -1) is (t, 0) itself (but
  // for a ZeRO-2 shard, a buffer of its own).
  auto key = [&](TensorId t, int32_t mb) -> Key {
    if (microbatches == 1 && mb < 0 && accumulated[t] && !shards[t]) return {t, 0};
    return {t, mb};
  };
  std::map<Key, std::pair<int64_t, int64_t>> life; // first, last
  const std::string device = str_cat("device ", program.device);
  auto define = [&](Key k, int64_t i) {
    auto [it, fresh] = life.try_emplace(k, i, i);
    if (!fresh) it->second.second = std::max(it->second.second, i);
  };
  auto touch = [&](Key k, int64_t i, const PlanInstruction &instr) -> Status {
    auto it = life.find(k);
    if (it == life.end())
      return internal_error(device, " instruction ", i, " (", describe_instruction(graph, instr),
                            ") reads '", graph.tensor(k.first).name, "' ",
                            microbatch_text(k.second), " before anything writes it");
    it->second.second = std::max(it->second.second, i);
    return Status::ok();
  };
  const auto &instrs = program.instructions;
  for (size_t n = 0; n < instrs.size(); ++n) {
    const PlanInstruction &instr = instrs[n];
    const auto i = static_cast<int64_t>(n);
    switch (instr.kind) {
    case InstrKind::kCompute: {
      const Node &node = graph.node(instr.index);
      for (TensorId in : node.inputs) {
        if (is_intermediate(graph, in)) RETURN_IF_ERROR(touch(key(in, instr.microbatch), i, instr));
        if (gathered[in] && instr.microbatch >= 0) {
          const bool backward = node_phase[instr.index] == Phase::kBackward;
          const int32_t block = plan::gather_block(backward, instr.microbatch, microbatches);
          RETURN_IF_ERROR(touch(key(in, block), i, instr));
        }
      }
      for (TensorId out : node.outputs)
        define(key(out, instr.microbatch), i);
      break;
    }
    case InstrKind::kGatherParam:
    case InstrKind::kStartGather: define(key(instr.index, instr.microbatch), i); break;
    case InstrKind::kWaitGather:
      RETURN_IF_ERROR(touch(key(instr.index, instr.microbatch), i, instr));
      break;
    case InstrKind::kSend:
      RETURN_IF_ERROR(touch(key(instr.index, instr.microbatch), i, instr));
      break;
    case InstrKind::kRecv: define(key(instr.index, instr.microbatch), i); break;
    case InstrKind::kAccumulate:
    case InstrKind::kReduceScatterAccumulate:
      RETURN_IF_ERROR(touch(key(instr.index, instr.microbatch), i, instr));
      define(key(instr.index, -1), i);
      break;
    case InstrKind::kScale:
    case InstrKind::kAllReduce:
    case InstrKind::kReduceScatter:
    case InstrKind::kAllGather: RETURN_IF_ERROR(touch(key(instr.index, -1), i, instr)); break;
    case InstrKind::kComputeShard: {
      const Node &node = graph.node(instr.index);
      for (TensorId in : node.inputs)
        if (is_intermediate(graph, in)) RETURN_IF_ERROR(touch(key(in, -1), i, instr));
      for (TensorId out : node.outputs)
        define(key(out, -1), i);
      break;
    }
    case InstrKind::kUpdate:
      RETURN_IF_ERROR(touch(key(graph.updates()[instr.index].value, -1), i, instr));
      break;
    case InstrKind::kStartBucket:
    case InstrKind::kWaitBucket:
      // The communication stream reads and writes the buffers in between.
      for (TensorId t : program.buckets.at(instr.index).tensors)
        RETURN_IF_ERROR(touch(key(t, -1), i, instr));
      break;
    }
  }
  // Graph outputs are read after the step.
  const auto end = static_cast<int64_t>(instrs.size());
  for (TensorId out : graph.outputs()) {
    auto it = life.find(key(out, -1));
    if (it != life.end()) it->second.second = end;
  }

  std::vector<Key> keys;
  std::vector<passes::BufferLifetime> buffers;
  for (const auto &[k, span] : life) {
    keys.push_back(k);
    buffers.push_back({serialization::slot_bytes(graph, k.first, k.second, shards, replicas),
                       span.first, span.second});
  }
  program.arena_bytes = passes::place_buffers(buffers, alignment);
  program.slots.clear();
  for (size_t b = 0; b < keys.size(); ++b) {
    program.slots.push_back({keys[b].first, keys[b].second, buffers[b].offset});
    if (microbatches == 1 && keys[b].second == 0 && accumulated[keys[b].first] &&
        !shards[keys[b].first])
      program.slots.push_back({keys[b].first, -1, buffers[b].offset});
  }
  std::sort(program.slots.begin(), program.slots.end(), [](const PlanSlot &a, const PlanSlot &b) {
    return std::tie(a.tensor, a.microbatch) < std::tie(b.tensor, b.microbatch);
  });
  return Status::ok();
}

} // namespace

namespace {

// Recomputing clones (passes/recompute.h) run just before their first reader in
// the stage's backward block, so recomputed activations live briefly. A clone
// that another stage reads keeps its topological place.
std::vector<NodeId> just_in_time(const Graph &graph, const std::vector<NodeId> &bwd,
                                 const std::vector<NodeId> &producer,
                                 const std::vector<int> &node_stage, int stage) {
  std::vector<char> in_block(graph.num_nodes(), 0), clone(graph.num_nodes(), 0),
      done(graph.num_nodes(), 0);
  bool any = false;
  for (NodeId id : bwd) {
    in_block[id] = 1;
    clone[id] = graph.node(id).name.ends_with(passes::kRecomputeSuffix);
    any = any || clone[id];
  }
  if (!any) return bwd;
  const auto consumers = graph.consumers();
  auto read_elsewhere = [&](NodeId id) {
    for (TensorId out : graph.node(id).outputs)
      for (NodeId c : consumers[out])
        if (node_stage[c] != stage) return true;
    return false;
  };
  std::vector<NodeId> out;
  std::function<void(NodeId)> emit = [&](NodeId id) {
    if (done[id]) return;
    done[id] = 1;
    for (TensorId in : graph.node(id).inputs) {
      const NodeId p = producer[in];
      if (p != kNoNode && in_block[p] && clone[p]) emit(p);
    }
    out.push_back(id);
  };
  for (NodeId id : bwd)
    if (!clone[id] || read_elsewhere(id)) emit(id);
  for (NodeId id : bwd)
    emit(id); // clones nothing reads
  return out;
}

// Groups the accumulated tensors stage `stage` computes into buckets of about
// `bucket_bytes` (one tensor may exceed it), in the order they become final,
// and starts each bucket right after the last instruction of the micro-batch
// blocks that touches its tensors (the last micro-batch's producer or its
// accumulation): the reduction then runs while the device computes the rest
// of that micro-batch's backward. ZeRO-1's sharded gradients get buckets of
// their own (reduce-scatter); ZeRO-2's (`shard_summed`), reduce-scattered
// every micro-batch, none. Group `stage` is the stage's replicas.
void add_buckets(const Graph &graph, const StepPhases &phases, const std::vector<NodeId> &producer,
                 const std::vector<int> &node_stage, int stage, int microbatches,
                 int64_t bucket_bytes, const std::vector<bool> &sharded_grad,
                 const std::vector<bool> &shard_summed, PlanProgram &program) {
  std::vector<bool> reduced(graph.num_tensors(), false);
  for (TensorId t : phases.accumulated)
    reduced[t] = node_stage[producer[t]] == stage && !shard_summed[t];
  // The last instruction touching each reduced tensor's final buffers.
  std::map<TensorId, size_t> last;
  auto &instrs = program.instructions;
  for (size_t i = 0; i < instrs.size(); ++i) {
    const PlanInstruction &instr = instrs[i];
    auto mark = [&](TensorId t) {
      if (reduced[t]) last[t] = i;
    };
    if (instr.kind == InstrKind::kAccumulate) {
      mark(instr.index);
    } else if (instr.microbatch == microbatches - 1) {
      if (instr.kind == InstrKind::kCompute) {
        for (TensorId t : graph.node(instr.index).inputs)
          mark(t);
        for (TensorId t : graph.node(instr.index).outputs)
          mark(t);
      } else if (instr.kind == InstrKind::kSend || instr.kind == InstrKind::kRecv) {
        mark(instr.index);
      }
    }
  }
  std::vector<std::pair<size_t, TensorId>> ready;
  for (const auto &[t, i] : last)
    ready.emplace_back(i, t);
  std::sort(ready.begin(), ready.end());
  // Buckets in ready order; each starts after the instruction of its last tensor.
  std::vector<size_t> start_after;
  int64_t bytes = 0;
  for (const auto &[i, t] : ready) {
    const int64_t size = graph.tensor(t).type.size_bytes();
    const bool scatter = sharded_grad[t];
    if (program.buckets.empty() || program.buckets.back().reduce_scatter != scatter ||
        bytes + size > bucket_bytes) {
      program.buckets.push_back({{}, scatter});
      start_after.push_back(i);
      bytes = 0;
    }
    program.buckets.back().tensors.push_back(t);
    start_after.back() = i;
    bytes += size;
  }
  for (size_t k = program.buckets.size(); k-- > 0;)
    instrs.insert(instrs.begin() + static_cast<std::ptrdiff_t>(start_after[k] + 1),
                  PlanInstruction{InstrKind::kStartBucket, -1, static_cast<uint32_t>(k), stage});
}

} // namespace

namespace {

// The options' and the stage assignment's errors, found before any lowering.
Status check_lowering(const Graph &graph, const std::vector<int> &virtual_stage,
                      const PipelineOptions &options) {
  const int P = options.stages, M = options.microbatches;
  if (P < 1) return invalid_argument("a pipeline needs at least 1 stage, got ", P);
  if (M < 1) return invalid_argument("a pipeline needs at least 1 micro-batch, got ", M);
  const int DP = options.data_parallel;
  if (DP < 1) return invalid_argument("data parallelism needs at least 1 replica, got ", DP);
  const bool interleaved = options.schedule == Schedule::kInterleaved;
  const int chunks = interleaved ? options.chunks : 1;
  if (interleaved) {
    if (chunks < 2)
      return invalid_argument("the interleaved schedule needs 2 or more model chunks per device, "
                              "not ",
                              chunks);
    if (P < 2) return invalid_argument("the interleaved schedule needs 2 or more stages, not ", P);
    if (M % P != 0)
      return invalid_argument("the interleaved schedule runs micro-batches in groups of the ", P,
                              " stages; ", M, " micro-batches are not a multiple of ", P);
  }
  const int V = P * chunks; // (virtual) stages
  if (virtual_stage.size() != graph.num_nodes())
    return invalid_argument("stage assignment has ", virtual_stage.size(), " entries for ",
                            graph.num_nodes(), " nodes");
  for (NodeId id = 0; id < graph.num_nodes(); ++id)
    if (virtual_stage[id] < 0 || virtual_stage[id] >= V)
      return invalid_argument("node '", graph.node(id).name, "' is assigned to stage ",
                              virtual_stage[id], ", outside 0..", V - 1);
  return Status::ok();
}

// ZeRO-1 (and ZeRO-2): the optimizer updates that can run on shards, their
// gradients and the optimizer state they alone read. With clipping an update reads
// Mul(gradient, scale), which runs on the shard too, and the gradient's
// own SumOfSquares (split_clip_norm_over_shards) sums the shard's squares,
// then the pairs are summed over the replicas. Each runs as ComputeShard;
// what follows it depends on its role.
enum class Shard : uint8_t {
  kNone,
  kUpdate,  // then every replica's new parameter in full (AllGather)
  kClip,    // the clipped shard, read by the update
  kSquares, // the shard's squares, summed over the replicas (AllReduce)
};

// What sharding one optimizer update takes: the accumulated gradient it
// reduce-scatters, the clipping nodes between that gradient and the update
// (kNoNode without clipping), and the optimizer state held as shards.
struct ShardedUpdate {
  TensorId grad = kInvalidTensor;
  NodeId clip = kNoNode, squares = kNoNode;
  std::vector<TensorId> states;
};

// One stage's nodes in topological order, by phase; the per-micro-batch ones
// per model chunk (one without the interleaved schedule).
// With ZB-H1, `backward` holds each block's B half and `weight` its W half.
struct StageNodes {
  std::vector<std::vector<NodeId>> forward, backward, weight;
  std::vector<NodeId> step;
};

// What every device's program is lowered from: the device of every node,
// which other stages read each intermediate, what each stage holds, and
// ZeRO-1's shards. Built once; each stage's program is then independent.
class PipelineLowering {
public:
  PipelineLowering(const Graph &graph, const std::vector<int> &virtual_stage,
                   const PipelineOptions &options, StepPhases phases, std::vector<NodeId> order);

  // Every state update's new value needs a producer, whose stage sends it to
  // the target's holders.
  Status check_updates() const;
  // Gives every parameter or state tensor nothing reads to a stage.
  void hold_unread_state();
  // Finds the updates that run on shards (ZeRO-1 and 2 with data
  // parallelism), with ZeRO-2 the gradients reduce-scattered every
  // micro-batch and the updates applied as soon as their values are final.
  void plan_shards();
  // Stage s's program, with its memory plan.
  Result<PlanProgram> lower_stage(int s) const;

private:
  void find_readers();
  std::optional<ShardedUpdate>
  sharded_update(NodeId id, const std::vector<llvm::SmallVector<NodeId, 2>> &consumers) const;
  StageNodes stage_nodes(int s) const;
  void plan_early_updates(NodeId id, const std::vector<llvm::SmallVector<NodeId, 2>> &consumers);
  void run_block(ProgramBuilder &b, const std::vector<NodeId> &nodes, int32_t mb) const;
  void run_step(ProgramBuilder &b, int s, const std::vector<NodeId> &step,
                std::vector<bool> &applied) const;
  void apply_updates(ProgramBuilder &b, int s, const std::vector<bool> &applied) const;

  const Graph &graph_;
  const std::vector<int> &virtual_stage_;
  const PipelineOptions &options_;
  const int chunks_; // model chunks per device
  const StepPhases phases_;
  const std::vector<NodeId> order_; // topological
  // The device of every node: its stage, or with chunks its virtual stage mod P.
  std::vector<int> node_stage_;
  std::vector<NodeId> producer_;  // by tensor
  std::vector<bool> accumulated_; // by tensor
  // Which other stages read each intermediate, per micro-batch and per step.
  std::vector<std::set<int>> mb_readers_, step_readers_;
  std::vector<std::set<TensorId>> holds_;          // per stage: parameters, state, constants
  std::vector<Shard> shard_role_;                  // by node
  std::vector<bool> sharded_grad_, sharded_state_; // by tensor
  // ZeRO-2: the sharded gradients reduce-scattered into the device's shard
  // every micro-batch (by tensor), and per sharded update node the state
  // updates applied right after it (its new values final).
  std::vector<bool> shard_summed_;
  std::vector<std::vector<uint32_t>> early_updates_;
  // ZeRO-3: the parameters held as shards and gathered per block (by tensor).
  std::vector<bool> sharded_param_;
};

PipelineLowering::PipelineLowering(const Graph &graph, const std::vector<int> &virtual_stage,
                                   const PipelineOptions &options, StepPhases phases,
                                   std::vector<NodeId> order)
    : graph_(graph), virtual_stage_(virtual_stage), options_(options),
      chunks_(options.schedule == Schedule::kInterleaved ? options.chunks : 1),
      phases_(std::move(phases)), order_(std::move(order)), node_stage_(graph.num_nodes()),
      producer_(graph.num_tensors(), kNoNode), accumulated_(graph.num_tensors(), false),
      mb_readers_(graph.num_tensors()), step_readers_(graph.num_tensors()),
      holds_(static_cast<size_t>(options.stages)), shard_role_(graph.num_nodes(), Shard::kNone),
      sharded_grad_(graph.num_tensors(), false), sharded_state_(graph.num_tensors(), false),
      shard_summed_(graph.num_tensors(), false), early_updates_(graph.num_nodes()),
      sharded_param_(graph.num_tensors(), false) {
  for (NodeId id = 0; id < graph.num_nodes(); ++id)
    node_stage_[id] = virtual_stage[id] % options.stages;
  for (NodeId id = 0; id < graph.num_nodes(); ++id)
    for (TensorId out : graph.node(id).outputs)
      producer_[out] = id;
  for (TensorId id : phases_.accumulated)
    accumulated_[id] = true;
  find_readers();
}

void PipelineLowering::find_readers() {
  for (NodeId id = 0; id < graph_.num_nodes(); ++id) {
    const int s = node_stage_[id];
    const bool step = phases_.node_phase[id] == Phase::kStep;
    for (TensorId in : graph_.node(id).inputs) {
      const TensorKind kind = graph_.tensor(in).kind;
      if (kind == TensorKind::kParameter || kind == TensorKind::kState ||
          kind == TensorKind::kConstant) {
        holds_[static_cast<size_t>(s)].insert(in);
        continue;
      }
      if (kind != TensorKind::kIntermediate || node_stage_[producer_[in]] == s) continue;
      (step ? step_readers_ : mb_readers_)[in].insert(s);
    }
  }
}

Status PipelineLowering::check_updates() const {
  for (const StateUpdate &update : graph_.updates())
    if (producer_[update.value] == kNoNode)
      return invalid_argument("the state update of '", graph_.tensor(update.target).name,
                              "' assigns '", graph_.tensor(update.value).name,
                              "', which no node computes; pipeline plans need a node to "
                              "produce every new value");
  return Status::ok();
}

// A parameter or state tensor nothing reads is still part of the model (and of
// its checkpoints): the stage that computes its new value keeps it, else stage 0.
void PipelineLowering::hold_unread_state() {
  for (TensorId id = 0; id < graph_.num_tensors(); ++id) {
    const TensorKind kind = graph_.tensor(id).kind;
    if (kind != TensorKind::kParameter && kind != TensorKind::kState) continue;
    bool held = false;
    for (const auto &h : holds_)
      held = held || h.contains(id);
    if (held) continue;
    int owner = 0;
    for (const StateUpdate &update : graph_.updates())
      if (update.target == id) owner = node_stage_[producer_[update.value]];
    holds_[static_cast<size_t>(owner)].insert(id);
  }
}

void PipelineLowering::plan_shards() {
  if (options_.zero < 1 || options_.data_parallel <= 1) return;
  const auto consumers = graph_.consumers();
  std::vector<bool> output(graph_.num_tensors(), false);
  for (TensorId t : graph_.outputs())
    output[t] = true;
  for (NodeId id = 0; id < graph_.num_nodes(); ++id) {
    const std::optional<ShardedUpdate> update = sharded_update(id, consumers);
    if (!update) continue;
    shard_role_[id] = Shard::kUpdate;
    sharded_grad_[update->grad] = true;
    for (TensorId t : update->states)
      sharded_state_[t] = true;
    if (update->clip != kNoNode) {
      shard_role_[update->clip] = Shard::kClip;
      shard_role_[update->squares] = Shard::kSquares;
    }
    if (options_.zero < 2) continue;
    // A graph output is read whole after the step: it stays ZeRO-1's.
    shard_summed_[update->grad] = !output[update->grad];
    plan_early_updates(id, consumers);
    if (options_.zero < 3) continue;
    // ZeRO-3: the parameter too, where only its stage holds it and nothing
    // but per-micro-batch work and this update reads it (the update reads
    // its shard; no all-gather of the new value follows).
    const TensorId param = graph_.node(id).inputs[0];
    const int s = node_stage_[id];
    bool whole = graph_.tensor(param).kind != TensorKind::kParameter || output[param];
    for (int h = 0; h < options_.stages; ++h)
      whole = whole || (h != s && holds_[static_cast<size_t>(h)].contains(param));
    for (NodeId reader : consumers[param])
      whole = whole || (reader != id && phases_.node_phase[reader] == Phase::kStep);
    if (whole) continue;
    sharded_param_[param] = true;
    sharded_state_[param] = true;
  }
}

// ZeRO-2: the state updates of sharded update `id` applied right after it
// (after its new parameter is gathered), so that its full-size new values
// do not stay in the arena until the step ends: those whose target only
// this stage holds (no copy elsewhere waits for the value) and nothing but
// `id` reads once per step (earlier micro-batch work has read it already).
void PipelineLowering::plan_early_updates(
    NodeId id, const std::vector<llvm::SmallVector<NodeId, 2>> &consumers) {
  const int s = node_stage_[id];
  const auto &outputs = graph_.node(id).outputs;
  const auto &updates = graph_.updates();
  for (uint32_t u = 0; u < updates.size(); ++u) {
    if (std::find(outputs.begin(), outputs.end(), updates[u].value) == outputs.end()) continue;
    const TensorId target = updates[u].target;
    bool early = holds_[static_cast<size_t>(s)].contains(target);
    for (int h = 0; h < options_.stages; ++h)
      early = early && (h == s || !holds_[static_cast<size_t>(h)].contains(target));
    for (NodeId reader : consumers[target])
      early = early && (reader == id || phases_.node_phase[reader] != Phase::kStep);
    if (early) early_updates_[id].push_back(u);
  }
}

// Node `id` as a ZeRO-1 update, or nothing when it is not an optimizer update
// or cannot run on shards: the parameter's size must be a multiple of the
// replicas, and the gradient, the clipping and the update all on one stage.
std::optional<ShardedUpdate>
PipelineLowering::sharded_update(NodeId id,
                                 const std::vector<llvm::SmallVector<NodeId, 2>> &consumers) const {
  const int DP = options_.data_parallel;
  const Node &node = graph_.node(id);
  if ((node.op != "AdamUpdate" && node.op != "SgdUpdate") || node.inputs.size() < 2)
    return std::nullopt;
  const int64_t n = graph_.tensor(node.inputs[0]).type.num_elements();
  if (n % DP != 0 || n < DP) return std::nullopt;
  ShardedUpdate update;
  update.grad = node.inputs[1];
  // Clipped: grad = Mul(gradient, scalar scale), read only here; the
  // gradient read by it and by a SumOfSquares of it alone.
  const NodeId mul_id = producer_[update.grad];
  if (!accumulated_[update.grad] && mul_id != kNoNode && graph_.node(mul_id).op == "Mul" &&
      consumers[update.grad].size() == 1) {
    const Node &mul = graph_.node(mul_id);
    const TensorId scale = mul.inputs.size() == 2 ? mul.inputs[1] : kInvalidTensor;
    const TensorId raw = mul.inputs[0];
    if (scale == kInvalidTensor || graph_.tensor(scale).type.num_elements() != 1 ||
        !accumulated_[raw] || consumers[raw].size() != 2)
      return std::nullopt;
    for (NodeId reader : consumers[raw])
      if (reader != mul_id && graph_.node(reader).op == "SumOfSquares" &&
          graph_.node(reader).inputs.size() == 1 && node_stage_[reader] == node_stage_[id])
        update.squares = reader;
    if (update.squares == kNoNode || node_stage_[mul_id] != node_stage_[id]) return std::nullopt;
    update.clip = mul_id;
    update.grad = raw;
  }
  if (!accumulated_[update.grad] ||
      consumers[update.grad].size() != (update.clip == kNoNode ? 1u : 2u) ||
      node_stage_[producer_[update.grad]] != node_stage_[id])
    return std::nullopt;
  bool ok = true;
  for (TensorId in : node.inputs) {
    const Tensor &t = graph_.tensor(in);
    if (t.type.num_elements() == 1 && n > 1) continue; // lr, step: scalars
    if (t.type.num_elements() != n) ok = false;
    if (t.kind == TensorKind::kState) {
      if (consumers[in].size() != 1) ok = false;
      update.states.push_back(in);
    }
  }
  for (TensorId out : node.outputs)
    if (graph_.tensor(out).type.num_elements() != n) ok = false;
  if (!ok) return std::nullopt;
  return update;
}

StageNodes PipelineLowering::stage_nodes(int s) const {
  StageNodes nodes;
  nodes.forward.resize(static_cast<size_t>(chunks_));
  nodes.backward.resize(static_cast<size_t>(chunks_));
  for (NodeId id : order_) {
    if (node_stage_[id] != s) continue;
    const auto chunk = static_cast<size_t>(virtual_stage_[id] / options_.stages);
    switch (phases_.node_phase[id]) {
    case Phase::kForward: nodes.forward[chunk].push_back(id); break;
    case Phase::kBackward: nodes.backward[chunk].push_back(id); break;
    case Phase::kStep: nodes.step.push_back(id); break;
    }
  }
  for (auto &block : nodes.backward)
    block = just_in_time(graph_, block, producer_, node_stage_, s);
  nodes.weight.resize(nodes.backward.size());
  if (splits_backward(options_.schedule))
    for (size_t c = 0; c < nodes.backward.size(); ++c)
      nodes.weight[c] = plan::split_weight_half(
          graph_, nodes.backward[c], [&](TensorId t) { return !mb_readers_[t].empty(); });
  return nodes;
}

// One micro-batch of a block's nodes: each sends what other stages read and
// accumulates what the step reads.
void PipelineLowering::run_block(ProgramBuilder &b, const std::vector<NodeId> &nodes,
                                 int32_t mb) const {
  for (NodeId id : nodes) {
    // ZeRO-3: the block's first reader of a sharded parameter gathers it
    // first (no prefetch: the gather runs right before that node).
    const bool backward = phases_.node_phase[id] == Phase::kBackward;
    for (TensorId in : graph_.node(id).inputs)
      if (sharded_param_[in])
        b.gather(in, plan::gather_block(backward, mb, options_.microbatches), node_stage_[id]);
    b.compute(id, mb);
    for (TensorId out : graph_.node(id).outputs) {
      for (int peer : mb_readers_[out])
        b.send(out, mb, peer);
      // ZeRO-2: summed over the stage's replicas (group = stage) at once,
      // the device's shard of it added into its step buffer.
      if (shard_summed_[out])
        b.add(InstrKind::kReduceScatterAccumulate, out, mb, node_stage_[id]);
      else if (accumulated_[out] && options_.microbatches > 1)
        b.add(InstrKind::kAccumulate, out, mb);
    }
  }
}

// Once per step: the sums over the replicas, the means, what other stages
// read of them, the step nodes (with ZeRO-2 the updates that can go at once:
// marked in `applied`, by update).
void PipelineLowering::run_step(ProgramBuilder &b, int s, const std::vector<NodeId> &step,
                                std::vector<bool> &applied) const {
  const int DP = options_.data_parallel;
  auto finish = [&](TensorId t) {
    if (options_.microbatches * DP > 1) b.add(InstrKind::kScale, t);
    for (int peer : step_readers_[t])
      b.send(t, -1, peer);
  };
  std::vector<bool> bucketed(graph_.num_tensors(), false);
  for (uint32_t k = 0; k < b.program().buckets.size(); ++k) {
    b.add(InstrKind::kWaitBucket, k, -1, s);
    for (TensorId t : b.program().buckets[k].tensors) {
      bucketed[t] = true;
      finish(t);
    }
  }
  for (TensorId t : phases_.accumulated) {
    if (node_stage_[producer_[t]] != s || bucketed[t]) continue;
    // A ZeRO-2 gradient is summed already, every micro-batch.
    if (DP > 1 && !shard_summed_[t])
      b.add(sharded_grad_[t] ? InstrKind::kReduceScatter : InstrKind::kAllReduce, t, -1, s);
    finish(t);
  }
  for (NodeId id : step) {
    if (shard_role_[id] == Shard::kNone) {
      b.compute(id, -1);
    } else {
      b.compute_shard(id, s);
      if (shard_role_[id] == Shard::kSquares)
        b.add(InstrKind::kAllReduce, graph_.node(id).outputs[0], -1, s);
      // ZeRO-3: the shard is the parameter; nothing gathers the new value.
      if (shard_role_[id] == Shard::kUpdate && !sharded_param_[graph_.node(id).inputs[0]])
        b.add(InstrKind::kAllGather, graph_.node(id).outputs[0], -1, s);
    }
    for (TensorId out : graph_.node(id).outputs)
      for (int peer : step_readers_[out])
        b.send(out, -1, peer);
    for (uint32_t u : early_updates_[id]) {
      b.add(InstrKind::kUpdate, u);
      applied[u] = true;
    }
  }
}

// State updates: new values to every other holder, then apply (but those
// run_step `applied` already).
void PipelineLowering::apply_updates(ProgramBuilder &b, int s,
                                     const std::vector<bool> &applied) const {
  const auto &updates = graph_.updates();
  for (uint32_t u = 0; u < updates.size(); ++u) {
    if (node_stage_[producer_[updates[u].value]] != s) continue;
    for (int h = 0; h < options_.stages; ++h)
      if (h != s && holds_[static_cast<size_t>(h)].contains(updates[u].target))
        b.send(updates[u].value, -1, h);
  }
  for (uint32_t u = 0; u < updates.size(); ++u) {
    if (!holds_[static_cast<size_t>(s)].contains(updates[u].target) || applied[u]) continue;
    const int from = node_stage_[producer_[updates[u].value]];
    if (from != s) b.recv(updates[u].value, -1, from);
    b.add(InstrKind::kUpdate, u);
  }
}

Result<PlanProgram> PipelineLowering::lower_stage(int s) const {
  const int M = options_.microbatches;
  ProgramBuilder b(graph_, node_stage_, producer_, s);
  const StageNodes nodes = stage_nodes(s);
  // 1. Micro-batches in schedule order.
  for (const Block &block : schedule_blocks(options_.schedule, options_.stages, M, s, chunks_)) {
    const auto &per_chunk = block.weight     ? nodes.weight
                            : block.backward ? nodes.backward
                                             : nodes.forward;
    run_block(b, per_chunk[static_cast<size_t>(block.chunk)], block.microbatch);
  }
  // Gradient buckets, started as soon as their tensors are final.
  if (options_.data_parallel > 1 && options_.bucket_bytes > 0)
    add_buckets(graph_, phases_, producer_, node_stage_, s, M, options_.bucket_bytes, sharded_grad_,
                shard_summed_, b.program());
  // 2. Once per step.
  std::vector<bool> applied(graph_.updates().size(), false);
  run_step(b, s, nodes.step, applied);
  // 3. State updates.
  apply_updates(b, s, applied);

  PlanProgram program = std::move(b.program());
  if (options_.zero == 3 && options_.prefetch) prefetch_gathers(graph_, program);
  const auto &held = holds_[static_cast<size_t>(s)];
  program.device = static_cast<uint32_t>(s);
  program.holds.assign(held.begin(), held.end());
  for (TensorId t : program.holds)
    if (sharded_state_[t]) program.sharded_holds.push_back(t);
  if (!program.sharded_holds.empty()) program.shard_group = s;
  RETURN_IF_ERROR(plan_program_memory(graph_, accumulated_, phases_.node_phase, M,
                                      options_.data_parallel, options_.alignment, program));
  return program;
}

// The same programs on every replica of a stage, with peers in its own replica.
std::vector<PlanProgram> replicate(const std::vector<PlanProgram> &programs, int DP) {
  std::vector<PlanProgram> replicated;
  for (size_t s = 0; s < programs.size(); ++s)
    for (int r = 0; r < DP; ++r) {
      PlanProgram program = programs[s];
      program.device = static_cast<uint32_t>(static_cast<int>(s) * DP + r);
      for (PlanInstruction &instr : program.instructions)
        if (instr.kind == InstrKind::kSend || instr.kind == InstrKind::kRecv)
          instr.peer = instr.peer * DP + r;
      replicated.push_back(std::move(program));
    }
  return replicated;
}

} // namespace

Result<std::vector<PlanProgram>> lower_pipeline(const Graph &graph,
                                                const std::vector<int> &virtual_stage,
                                                const PipelineOptions &options) {
  RETURN_IF_ERROR(check_lowering(graph, virtual_stage, options));
  // Replicas split the batch like micro-batches do.
  ASSIGN_OR_RETURN(StepPhases phases,
                   analyze_phases(graph, options.microbatches * options.data_parallel));
  ASSIGN_OR_RETURN(std::vector<NodeId> order, graph.topological_order());
  PipelineLowering lowering(graph, virtual_stage, options, std::move(phases), std::move(order));
  RETURN_IF_ERROR(lowering.check_updates());
  lowering.hold_unread_state();
  lowering.plan_shards();

  std::vector<PlanProgram> programs;
  for (int s = 0; s < options.stages; ++s) {
    ASSIGN_OR_RETURN(PlanProgram program, lowering.lower_stage(s));
    programs.push_back(std::move(program));
  }
  if (options.data_parallel == 1) return programs;
  return replicate(programs, options.data_parallel);
}

std::vector<std::vector<int32_t>> pipeline_groups(const PipelineOptions &options) {
  std::vector<std::vector<int32_t>> groups;
  if (options.data_parallel <= 1) return groups;
  for (int s = 0; s < options.stages; ++s) {
    std::vector<int32_t> group;
    for (int r = 0; r < options.data_parallel; ++r)
      group.push_back(s * options.data_parallel + r);
    groups.push_back(std::move(group));
  }
  return groups;
}

bool communicates_forward(const Node &node) {
  return ops::communicates_forward(ops::collective_of(node.op));
}

TensorParallelTime tensor_parallel_time(const Graph &graph, NodeId id, const ClusterSpec &cluster) {
  const Node &node = graph.node(id);
  const ops::Collective collective = ops::collective_of(node.op);
  if (collective == ops::Collective::kNone) return {};
  // The group: `parts` consecutive devices (tp is innermost in the mesh).
  const int parts = static_cast<int>(node.int_attr("parts").value_or(1));
  std::vector<int> members;
  for (int m = 0; m < parts; ++m)
    members.push_back(m);
  const LinkSpec &link = link_for_group(cluster, members);
  // The whole tensor's bytes: a split's or reduce-scatter's input, the others' output.
  const TensorId whole = ops::whole_is_input(collective) ? node.inputs[0] : node.outputs[0];
  const auto bytes = static_cast<double>(graph.tensor(whole).type.size_bytes());
  const double reduce_speed = reduce_bytes_per_second(cluster.device, DType::kF32);
  switch (collective) {
  case ops::Collective::kNone: return {};
  case ops::Collective::kAllToAll: { // backward: the reverse all-to-all
    const double seconds = all_to_all_time(bytes * parts, parts, link);
    return {seconds, seconds};
  }
  case ops::Collective::kReduceScatter: // backward: the gradient's all-gather
    return {reduce_scatter_time(bytes, parts, link, CollectiveAlgorithm::kRing, reduce_speed),
            all_gather_time(bytes, parts, link, CollectiveAlgorithm::kRing)};
  case ops::Collective::kAllReduce:
    return {all_reduce_time(bytes, parts, link, CollectiveAlgorithm::kRing, reduce_speed), 0};
  case ops::Collective::kAllGather:
    return {all_gather_time(bytes, parts, link, CollectiveAlgorithm::kRing), 0};
  // TpCopy and TpSplit communicate only in their backward (their gradients).
  case ops::Collective::kCopy:
    return {0, all_reduce_time(bytes, parts, link, CollectiveAlgorithm::kRing, reduce_speed)};
  case ops::Collective::kSplit:
    return {0, all_gather_time(bytes, parts, link, CollectiveAlgorithm::kRing)};
  }
  return {};
}

double node_seconds(const Graph &graph, NodeId id, const ClusterSpec &cluster) {
  const double collective = tensor_parallel_time(graph, id, cluster).forward;
  return collective > 0 ? collective : node_time(graph, id, cluster.device);
}

SimulationCosts cluster_costs(const Graph &graph, const ClusterSpec &cluster) {
  SimulationCosts costs;
  std::vector<double> times(graph.num_nodes());
  for (NodeId id = 0; id < graph.num_nodes(); ++id)
    times[id] = node_seconds(graph, id, cluster);
  costs.compute = [times = std::move(times)](NodeId id) { return times[id]; };
  costs.transfer = [cluster](int src, int dst, double bytes) {
    return transfer_time(bytes, link_between(cluster, src, dst));
  };
  const double bandwidth = cluster.device.memory_bandwidth * cluster.device.memory_efficiency;
  costs.local_copy = [bandwidth](double bytes) { return bandwidth > 0 ? bytes / bandwidth : 0.0; };
  auto collective = [cluster](Collective kind) {
    return [cluster, kind](const std::vector<int32_t> &devices, double bytes) {
      std::vector<int> members(devices.begin(), devices.end());
      const LinkSpec &link = link_for_group(cluster, members);
      return best_collective(kind, bytes, static_cast<int>(members.size()), link,
                             reduce_bytes_per_second(cluster.device, DType::kF32))
          .time_s;
    };
  };
  costs.all_reduce = collective(Collective::kAllReduce);
  costs.reduce_scatter = collective(Collective::kReduceScatter);
  costs.all_gather = collective(Collective::kAllGather);
  return costs;
}

std::vector<TransferReason> explain_transfers(const Graph &graph,
                                              const std::vector<PlanProgram> &programs,
                                              const std::vector<std::vector<int32_t>> &groups,
                                              const SimulationCosts &costs) {
  auto phases = analyze_phases(graph, 1);
  std::vector<TensorId> update_target(graph.num_tensors(), kInvalidTensor);
  for (const StateUpdate &update : graph.updates())
    update_target[update.value] = update.target;
  auto node_text = [&](NodeId id) {
    return str_cat("'", graph.node(id).name, "' (", graph.node(id).op, ")");
  };
  // The first node of `device`'s program that reads `tensor` on `microbatch`.
  auto first_reader = [&](size_t device, TensorId tensor, int32_t microbatch) -> NodeId {
    if (device >= programs.size()) return kNoNode;
    for (const PlanInstruction &instr : programs[device].instructions) {
      if (instr.kind != InstrKind::kCompute || instr.microbatch != microbatch) continue;
      for (TensorId in : graph.node(instr.index).inputs)
        if (in == tensor) return instr.index;
    }
    return kNoNode;
  };
  std::map<std::tuple<int, int, int32_t, TensorId>, size_t> rows;
  std::vector<TransferReason> out;
  // A new row for (from, to, group, tensor), or null when it exists (counted again).
  auto new_row = [&](int from, int to, int32_t group, TensorId tensor) -> TransferReason * {
    auto [it, fresh] = rows.try_emplace(std::make_tuple(from, to, group, tensor), out.size());
    if (!fresh) {
      ++out[it->second].count;
      return nullptr;
    }
    TransferReason &row = out.emplace_back();
    row.from = from;
    row.to = to;
    row.group = group;
    row.tensor = tensor;
    row.count = 1;
    row.bytes = static_cast<double>(graph.tensor(tensor).type.size_bytes());
    return &row;
  };
  for (size_t d = 0; d < programs.size(); ++d)
    for (const PlanInstruction &instr : programs[d].instructions) {
      if (instr.kind == InstrKind::kCompute) {
        // Tensor-parallel collectives are nodes of the graph, run over the
        // device's group of `parts` consecutive devices; one row per group.
        const Node &node = graph.node(instr.index);
        if (!communicates_forward(node)) continue;
        const auto parts = static_cast<int32_t>(node.int_attr("parts").value_or(1));
        const auto base = static_cast<int32_t>(d) - static_cast<int32_t>(d) % parts;
        if (base != static_cast<int32_t>(d)) continue;
        int32_t group = -1;
        for (size_t g = 0; g < groups.size() && group < 0; ++g)
          if (groups[g].size() == static_cast<size_t>(parts) && groups[g].front() == base &&
              groups[g].back() == base + parts - 1)
            group = static_cast<int32_t>(g);
        TransferReason *row = new_row(static_cast<int>(d), -1, group, node.outputs[0]);
        if (row == nullptr) continue;
        const AttrValue *why = node.find_attr("why");
        const std::string reason =
            why && std::holds_alternative<std::string>(*why) ? std::get<std::string>(*why) : "";
        row->why = str_cat(node.op, ": ", reason.empty() ? node_text(instr.index) : reason);
        if (costs.compute) row->seconds = costs.compute(instr.index);
        continue;
      }
      if (instr.kind == InstrKind::kStartBucket) {
        // One row per bucket and group, from its first member.
        const auto &group = groups.at(static_cast<size_t>(instr.peer));
        const auto &bucket = programs[d].buckets.at(instr.index);
        if (group.front() != static_cast<int32_t>(d)) continue;
        TransferReason *row = new_row(static_cast<int>(d), -1, instr.peer, bucket.tensors[0]);
        if (row == nullptr) continue;
        row->bytes = 0;
        std::string names;
        for (size_t k = 0; k < bucket.tensors.size(); ++k) {
          row->bytes += static_cast<double>(graph.tensor(bucket.tensors[k]).type.size_bytes());
          if (k < 3)
            names += str_cat(k ? ", " : "", "'", graph.tensor(bucket.tensors[k]).name, "'");
        }
        if (bucket.tensors.size() > 3)
          names += str_cat(" and ", bucket.tensors.size() - 3, " more");
        std::string members;
        for (int32_t m : group)
          members += str_cat(members.empty() ? "" : ", ", m);
        row->why =
            str_cat("gradient bucket ", instr.index, " (", bucket.tensors.size(),
                    bucket.tensors.size() == 1 ? " tensor: " : " tensors: ", names,
                    "), summed over the replicas (devices ", members, ")",
                    bucket.reduce_scatter ? ", each keeping the shards it updates (ZeRO-1)" : "",
                    "; started when its last tensor is final, overlapping the rest of "
                    "backward");
        const auto &cost = bucket.reduce_scatter ? costs.reduce_scatter : costs.all_reduce;
        if (cost) row->seconds = cost(group, row->bytes);
        continue;
      }
      const bool reduce = is_collective(instr.kind) || instr.kind == InstrKind::kStartGather;
      if (instr.kind != InstrKind::kSend && !reduce) continue;
      if (reduce && static_cast<size_t>(instr.peer) < groups.size() &&
          groups[static_cast<size_t>(instr.peer)].front() != static_cast<int32_t>(d))
        continue; // one row per group, from its first member
      TransferReason *added = new_row(static_cast<int>(d), reduce ? -1 : instr.peer,
                                      reduce ? instr.peer : -1, instr.index);
      if (added == nullptr) continue;
      TransferReason &row = *added;
      const NodeId producer = graph.tensor(instr.index).producer;
      const std::string made = producer == kNoNode ? std::string("an input") : node_text(producer);
      if (reduce) {
        std::string members;
        if (static_cast<size_t>(instr.peer) < groups.size())
          for (int32_t m : groups[static_cast<size_t>(instr.peer)])
            members += str_cat(members.empty() ? "" : ", ", m);
        const bool scatters = instr.kind == InstrKind::kReduceScatter ||
                              instr.kind == InstrKind::kReduceScatterAccumulate;
        const auto &cost = instr.kind == InstrKind::kAllReduce ? costs.all_reduce
                           : scatters                          ? costs.reduce_scatter
                                                               : costs.all_gather;
        if (instr.kind == InstrKind::kAllReduce) {
          row.why = str_cat("from ", made, ", summed over the replicas (devices ", members,
                            ") before the mean");
        } else if (instr.kind == InstrKind::kReduceScatter) {
          row.why = str_cat("from ", made, ", summed over the replicas (devices ", members,
                            "), each keeping the shard it updates (ZeRO-1)");
        } else if (instr.kind == InstrKind::kReduceScatterAccumulate) {
          row.why = str_cat("from ", made, ", summed over the replicas (devices ", members,
                            ") every micro-batch, each adding the shard it updates into a "
                            "shard-sized sum (ZeRO-2)");
        } else if (instr.kind == InstrKind::kGatherParam) {
          row.why = str_cat("parameter held in shards, gathered whole on every replica (devices ",
                            members, ") before the nodes of a block that read it (ZeRO-3)");
        } else if (instr.kind == InstrKind::kStartGather) {
          row.why = str_cat("parameter held in shards, gathered whole on every replica (devices ",
                            members,
                            ") for the nodes of a block that read it, on the "
                            "communication stream while the nodes before them compute "
                            "(ZeRO-3 prefetch)");
        } else {
          row.why = str_cat("new shards from ", made, " gathered on every replica (devices ",
                            members, ") (ZeRO-1)");
          row.gather = true;
        }
        if (cost && static_cast<size_t>(instr.peer) < groups.size())
          row.seconds = cost(groups[static_cast<size_t>(instr.peer)], row.bytes);
      } else {
        const NodeId reader =
            first_reader(static_cast<size_t>(instr.peer), instr.index, instr.microbatch);
        const std::string read =
            reader == kNoNode ? std::string("") : str_cat(" read by ", node_text(reader));
        if (instr.microbatch < 0 && update_target[instr.index] != kInvalidTensor) {
          row.why = str_cat("new value of '", graph.tensor(update_target[instr.index]).name,
                            "' from ", made, " for the copy on device ", instr.peer);
        } else if (instr.microbatch < 0) {
          row.why = str_cat("once per step: ", made, read, " on device ", instr.peer);
        } else {
          const bool backward = producer != kNoNode && phases.is_ok() &&
                                phases->node_phase[producer] == Phase::kBackward;
          row.why = str_cat(backward ? "gradient" : "activation", " from ", made, read,
                            " on device ", instr.peer, ", every micro-batch");
        }
        if (costs.transfer) row.seconds = costs.transfer(row.from, row.to, row.bytes);
      }
    }
  return out;
}

} // namespace strata::partitioner
