#include "plan/instructions.h"

#include <algorithm>

namespace strata::plan {

using serialization::InstrKind;
using serialization::PlanInstruction;
using serialization::PlanProgram;

uint64_t transfer_tag(TensorId tensor, int32_t microbatch) {
  return (static_cast<uint64_t>(tensor) << 32) | static_cast<uint32_t>(microbatch + 1);
}

uint64_t collective_tag(const PlanInstruction &instr) {
  // Bits 0-1: the algorithm's own (tag, tag + 1); 2-7: the kind; 8-39: the
  // index; 40-61: the micro-batch + 1 (0 for once-per-step collectives).
  const uint64_t microbatch =
      static_cast<uint32_t>(instr.microbatch + 1) & ((uint64_t{1} << 22) - 1);
  return (uint64_t{1} << 63) | (microbatch << 40) | (static_cast<uint64_t>(instr.index) << 8) |
         (static_cast<uint64_t>(instr.kind) << 2);
}

// Instructions that run over a group of devices (peer = group index).
bool is_grouped(InstrKind kind) {
  return kind == InstrKind::kAllReduce || kind == InstrKind::kReduceScatter ||
         kind == InstrKind::kAllGather || kind == InstrKind::kComputeShard ||
         kind == InstrKind::kStartBucket || kind == InstrKind::kWaitBucket ||
         kind == InstrKind::kReduceScatterAccumulate || kind == InstrKind::kGatherParam ||
         kind == InstrKind::kStartGather || kind == InstrKind::kWaitGather;
}
bool is_bucket(InstrKind kind) {
  return kind == InstrKind::kStartBucket || kind == InstrKind::kWaitBucket;
}
bool on_stream(InstrKind kind) {
  return is_bucket(kind) || kind == InstrKind::kStartGather || kind == InstrKind::kWaitGather;
}
// The grouped instructions every member must reach together.
bool is_collective(InstrKind kind) {
  return is_grouped(kind) && kind != InstrKind::kComputeShard && !on_stream(kind);
}

std::string microbatch_text(int32_t microbatch) {
  return microbatch < 0 ? std::string("step") : str_cat("mb ", microbatch);
}

std::string describe_instruction(const Graph &graph, const PlanInstruction &instr) {
  auto tensor_name = [&](uint32_t id) {
    return id < graph.num_tensors() ? str_cat("'", graph.tensor(id).name, "'")
                                    : str_cat("tensor ", id);
  };
  switch (instr.kind) {
  case InstrKind::kCompute:
    if (instr.index >= graph.num_nodes()) return str_cat("compute node ", instr.index);
    return str_cat("compute '", graph.node(instr.index).name, "' (", graph.node(instr.index).op,
                   ") ", microbatch_text(instr.microbatch));
  case InstrKind::kSend:
    return str_cat("send ", tensor_name(instr.index), " ", microbatch_text(instr.microbatch),
                   " to device ", instr.peer);
  case InstrKind::kRecv:
    return str_cat("recv ", tensor_name(instr.index), " ", microbatch_text(instr.microbatch),
                   " from device ", instr.peer);
  case InstrKind::kAccumulate:
    return str_cat("accumulate ", tensor_name(instr.index), " ", microbatch_text(instr.microbatch));
  case InstrKind::kScale: return str_cat("scale ", tensor_name(instr.index));
  case InstrKind::kAllReduce:
    return str_cat("all-reduce ", tensor_name(instr.index), " over group ", instr.peer);
  case InstrKind::kReduceScatter:
    return str_cat("reduce-scatter ", tensor_name(instr.index), " over group ", instr.peer);
  case InstrKind::kAllGather:
    return str_cat("all-gather ", tensor_name(instr.index), " over group ", instr.peer);
  case InstrKind::kComputeShard:
    if (instr.index >= graph.num_nodes()) return str_cat("compute-shard node ", instr.index);
    return str_cat("compute '", graph.node(instr.index).name, "' (", graph.node(instr.index).op,
                   ") on its shard of group ", instr.peer);
  case InstrKind::kUpdate:
    if (instr.index < graph.updates().size())
      return str_cat("update ", tensor_name(graph.updates()[instr.index].target));
    return str_cat("update ", instr.index);
  case InstrKind::kStartBucket:
    return str_cat("start gradient bucket ", instr.index, " over group ", instr.peer);
  case InstrKind::kWaitBucket:
    return str_cat("wait for gradient bucket ", instr.index, " over group ", instr.peer);
  case InstrKind::kReduceScatterAccumulate:
    return str_cat("reduce-scatter ", tensor_name(instr.index), " ",
                   microbatch_text(instr.microbatch), " over group ", instr.peer,
                   " into its shard");
  case InstrKind::kGatherParam:
    return str_cat("gather parameter ", tensor_name(instr.index), " for block ", instr.microbatch,
                   " over group ", instr.peer);
  case InstrKind::kStartGather:
    return str_cat("start gathering parameter ", tensor_name(instr.index), " for block ",
                   instr.microbatch, " over group ", instr.peer);
  case InstrKind::kWaitGather:
    return str_cat("wait for parameter ", tensor_name(instr.index), " of block ", instr.microbatch,
                   " over group ", instr.peer);
  }
  return "unknown instruction";
}

std::vector<TensorId> reduced_tensors(const PlanProgram &program, const PlanInstruction &instr) {
  if (instr.kind == InstrKind::kAllReduce || instr.kind == InstrKind::kReduceScatter ||
      instr.kind == InstrKind::kReduceScatterAccumulate)
    return {instr.index};
  if (instr.kind == InstrKind::kStartBucket && instr.index < program.buckets.size())
    return program.buckets[instr.index].tensors;
  return {};
}

std::vector<int32_t> node_chunks(const serialization::PlanPipeline &pipeline) {
  std::vector<int32_t> chunks;
  if (pipeline.chunks <= 1 || pipeline.stages < 1) return chunks;
  for (int32_t stage : pipeline.node_stage)
    chunks.push_back(stage / pipeline.stages);
  return chunks;
}

std::string device_role(const serialization::PlanPipeline &pipeline, int64_t device) {
  const int64_t tp = std::max(pipeline.tensor_parallel, 1),
                dp = std::max(pipeline.data_parallel, 1);
  const int64_t member = device % tp, replica = device / tp % dp, stage = device / tp / dp;
  std::string text = pipeline.chunks > 1 ? "stages " : str_cat("stage ", stage);
  for (int64_t c = 0; pipeline.chunks > 1 && c < pipeline.chunks; ++c)
    text += str_cat(c ? ", " : "", stage + c * pipeline.stages);
  if (dp > 1) text += str_cat(" replica ", replica);
  if (tp > 1) text += str_cat(" member ", member);
  return text;
}

} // namespace strata::plan
