// DeviceProgram: one device's instructions with every buffer resolved to an
// address, the same for every backend.
//
// The backend says where the device's memory is (DeviceMemory: its
// activation arena, where it keeps each tensor it holds, the staging of its
// tensor-parallel collectives); resolve_program then turns each plan
// instruction into an Op: the node and its operand views (a ZeRO shard's
// view of its chunk; a graph input read from its micro-batch's rows of the
// step's batch), the buffer a transfer or update moves, the group and
// position of a collective, the tag of a message, a gradient bucket's
// tensors. What an Op does is issue.h's; a backend only adds what is its
// own (a CUDA kernel's plan, an error flag) beside it.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "ops/registry.h"
#include "plan/pieces.h"
#include "runtime/core/pipeline_plan.h"

namespace strata::runtime::core {

// One instruction of a device, resolved.
struct Op {
  serialization::InstrKind kind = serialization::InstrKind::kCompute;
  std::string what; // plan::describe_instruction, for errors
  // Compute and ComputeShard: the node and its operands. A graph input's view
  // points at the step's batch (bind_batch).
  const Node *node = nullptr;
  const ops::OpDef *def = nullptr;
  std::vector<ops::ConstTensorView> inputs;
  std::vector<ops::TensorView> outputs;
  int32_t microbatch = -1;
  // A tensor-parallel node (ops::Collective): what it moves over its group
  // and how its pieces are laid out (the piece of an all-gather's input, of
  // the others' output; an all-to-all's cut and placement).
  ops::Collective collective = ops::Collective::kNone;
  plan::PieceLayout piece;
  plan::AllToAllLayout all_to_all;
  // The device's place in its tensor-parallel group (kernels of ops on a
  // member's piece read it): member of parts.
  int member = 0, parts = 1;
  // Transfers, accumulate, scale, update, collectives: `data` is written (or
  // sent from), `source` read; `bytes` of them. ReduceScatterAccumulate:
  // `data` is the micro-batch's whole buffer (`bytes`), reduce-scattered in
  // place, and `sum` the step buffer its shard goes into (bytes / group size).
  // GatherParam: `data` is the block's whole buffer (`bytes`), `source` the
  // device's held shard (bytes / group size).
  std::byte *data = nullptr;
  const std::byte *source = nullptr;
  std::byte *sum = nullptr;
  size_t bytes = 0;
  int peer = -1;       // send, recv: the other device
  uint64_t tag = 0;    // send, recv: plan::transfer_tag; collectives: their messages' tag
  bool first = false;  // accumulate (and ZeRO-2's): micro-batch 0 copies instead of adding
  int group = -1;      // collectives, buckets, tensor-parallel nodes: the plan group
  size_t position = 0; // this device's position in `group`
  uint32_t bucket = 0; // StartBucket, WaitBucket; StartGather, WaitGather: the stream task
  // StartGather: consecutive ones are one stream task, issued by the first
  // (`batch` = how many; 0 for the others).
  uint32_t batch = 0;
};

// A gradient bucket: the accumulated tensors it reduces over its group,
// summed (all-reduce) or each member keeping its chunk of every tensor
// (reduce-scatter, ZeRO-1). Packed chunk by chunk (chunk c of every tensor,
// then chunk c + 1), chunk c of the packed bucket is [chunks[c], chunks[c + 1]).
struct Bucket {
  std::vector<std::span<float>> parts;
  bool reduce_scatter = false;
  int group = -1;
  size_t position = 0;
  std::vector<size_t> chunks; // group size + 1 offsets
  uint64_t tag = 0;
  std::string what; // "gradient bucket 3: 'w1.grad', 'b1.grad'"
  size_t packed() const { return chunks.back(); }
};

struct DeviceProgram {
  int device = 0;
  std::vector<Op> ops; // one per plan instruction
  std::vector<Bucket> buckets;
  // The communication stream's tasks a step: the buckets (tasks 0..), then
  // the ZeRO-3 gathers StartGather hands it, in program order.
  uint32_t stream_tasks = 0;
  // Operands that are graph inputs: op `op`'s input `slot` reads graph input
  // `input`'s slice `slice` of the step's batch.
  struct BatchRead {
    size_t op = 0;
    uint32_t slot = 0;
    uint32_t input = 0;
    int64_t slice = 0;
  };
  std::vector<BatchRead> batch_reads;
  // Per graph output: its step buffer on this device, or null.
  std::vector<std::byte *> outputs;
  // Where its tensor-parallel collectives stage pieces (DeviceMemory::staging).
  std::byte *staging = nullptr;
  // The flat types ZeRO shard views point at (stable addresses).
  std::deque<TensorType> views;
};

// Where a device's buffers are in the backend's memory.
struct DeviceMemory {
  std::byte *arena = nullptr;                // the plan's activation arena
  std::function<std::byte *(TensorId)> held; // each held tensor's part; null: not held
  std::byte *staging = nullptr;              // collective_staging_bytes of it
};

// The staging a device's tensor-parallel collectives need: an all-to-all's
// outgoing and incoming blocks, and unless its transport moves column
// blocks in place (`strided`), where an all-gather lands and a
// reduce-scatter packs pieces laid out in column blocks.
int64_t collective_staging_bytes(const Graph &graph, const serialization::PlanProgram &program,
                                 bool strided);

// Errors name the device and instruction: a buffer the plan does not place,
// a group or bucket that does not exist, what is not built yet (non-f32
// accumulation and reductions).
Result<DeviceProgram> resolve_program(const PipelinePlan &plan, int device,
                                      const DeviceMemory &memory);

// Points every graph-input operand at the step's batch: graph input k's
// slice s is at bases[k] + s * (its micro-batch bytes); a null base (an
// empty input) leaves it null.
void bind_batch(DeviceProgram &program, const PipelinePlan &plan,
                llvm::ArrayRef<const std::byte *> bases);

} // namespace strata::runtime::core
