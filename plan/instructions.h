// What a pipeline plan's instructions mean, for everyone who reads a plan:
// the compiler that writes it, the runtime that executes it, and the tools
// that show it. Nothing here compiles or runs anything.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "serialization/plan_io.h"

namespace strata::plan {

// The send/recv tag of buffer (tensor, micro-batch): unique within a step.
uint64_t transfer_tag(TensorId tensor, int32_t microbatch);
// The tag of the point-to-point messages a collective instruction runs over
// (an algorithm of runtime/comm/collectives.h uses this tag and the next; four
// are free below the next kind's): the top bit set, so it never meets a
// transfer tag (and bit 62 clear: MPI's own collectives use both); each
// tensor is reduced or gathered at most once per step per group and kind, or
// once per micro-batch (ZeRO-2's ReduceScatterAccumulate: the micro-batch is
// in the tag), or once per block (ZeRO-3's GatherParam: its block, forward
// or backward, is in the tag, so the two gathers of one micro-batch differ).
uint64_t collective_tag(const serialization::PlanInstruction &instr);

// Instructions that run over a group of devices (peer = the group's index).
bool is_grouped(serialization::InstrKind kind);
// StartBucket and WaitBucket.
bool is_bucket(serialization::InstrKind kind);
// The work of the device's communication stream and the waits for it:
// StartBucket, WaitBucket, StartGather and WaitGather.
bool on_stream(serialization::InstrKind kind);
// The grouped instructions every member must reach together (AllReduce,
// ReduceScatter, AllGather, ReduceScatterAccumulate, GatherParam).
bool is_collective(serialization::InstrKind kind);

// ZeRO-3: the block whose buffer (parameter, block) a per-micro-batch node
// reads a gathered parameter from: the micro-batch for a forward node, M +
// the micro-batch for a backward one (GatherParam's micro-batch field).
inline int32_t gather_block(bool backward, int32_t microbatch, int32_t microbatches) {
  return backward ? microbatches + microbatch : microbatch;
}

// "mb 3", or "step" for -1.
std::string microbatch_text(int32_t microbatch);
// "compute 'layer0.fc1' mb 3", "send 'h' mb 2 to device 1", ... for messages.
std::string describe_instruction(const Graph &graph, const serialization::PlanInstruction &instr);

// The accumulated tensors an instruction sums over its group: the tensor of an
// AllReduce, ReduceScatter or ReduceScatterAccumulate (one micro-batch's), a
// StartBucket's bucket; none for others.
std::vector<TensorId> reduced_tensors(const serialization::PlanProgram &program,
                                      const serialization::PlanInstruction &instr);

// Each node's model chunk (its virtual stage / stages) for an interleaved
// plan; empty for the other schedules.
std::vector<int32_t> node_chunks(const serialization::PlanPipeline &pipeline);

// What device `device` of a pipeline plan runs, for messages and traces:
// "stage 2", "stage 1 replica 0", "stages 1, 5" (interleaved), with
// " member 1" in a tensor-parallel group.
std::string device_role(const serialization::PlanPipeline &pipeline, int64_t device);

} // namespace strata::plan
