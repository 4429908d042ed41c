// Plan files: what `strata compile` writes and `strata run` executes.
//
// A plan is stored as a FlatBuffers binary (`.splan`, schema
// serialization/schemas/plan.fbs, identifier "STRP") or as its JSON text form
// (`.splan.json`; any JSON file whose first key is "plan_version" is read as a
// plan too). It embeds the graph to run as a Model table (model.fbs) and, per
// device, the program: node order and activation arena. Loading is two stages
// like models: the FlatBuffers Verifier checks structure, then the meaning of
// every field is checked (the embedded model with the model loader's own
// checks, then mode, loss, fingerprints, devices, programs). Errors name the
// file and the field. Saving is canonical: the same Plan gives the same bytes.
// Pipeline plans (revision 2 and later, `Plan::pipeline`) give every device a
// program of instructions instead; plans without a pipeline are written as
// revision 1. Each file is written at the lowest revision that holds what it
// uses (gradient buckets: 3; interleaved chunks: 4); schemas/plan.fbs keeps
// the history.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace strata::serialization {

struct PlanDevice {
  uint32_t index = 0;
  std::string kind = "cpu";
  friend bool operator==(const PlanDevice &, const PlanDevice &) = default;
};

// One step of a pipeline device's program (plan revision 2). A micro-batch of
// -1 means "once per training step" (the optimizer phase); 0..M-1 name a
// micro-batch. Buffers are keyed by (tensor, micro-batch); see PlanSlot.
enum class InstrKind : uint8_t {
  kCompute = 0,    // run node `index` on micro-batch `microbatch`
  kSend = 1,       // send buffer (tensor `index`, microbatch) to device `peer`
  kRecv = 2,       // receive buffer (tensor `index`, microbatch) from device `peer`
  kAccumulate = 3, // buffer (index, -1) = (index, microbatch) if microbatch == 0, else +=
  kScale = 4,      // buffer (index, -1) *= 1 / microbatches (the mean over micro-batches)
  kUpdate = 5,     // apply the graph's state update number `index` on this device
  kAllReduce = 6,  // sum buffer (index, -1) over the devices of pipeline group `peer`
  // ZeRO-1: the shard of a tensor of n elements held by the device at position r
  // of a group of D devices is elements [r n/D, (r+1) n/D).
  kReduceScatter = 7, // sum (index, -1) over group `peer`; the device keeps its shard
  kAllGather = 8,     // fill (index, -1) with every member's shard of it
  kComputeShard = 9,  // run node `index` on this device's shard of its operands
  // Gradient buckets (plan revision 3), reduced on the device's communication
  // stream while its computation goes on.
  kStartBucket = 10, // start reducing program bucket `index` over group `peer`
  kWaitBucket = 11,  // wait until bucket `index` (over group `peer`) is reduced
  // ZeRO-2 (pipeline zero 2): sum buffer (index, microbatch) over group `peer`;
  // the device's shard of the sum is copied (microbatch 0) or added (later
  // micro-batches) into buffer (index, -1), which holds only that shard (n/D
  // elements: see slot_bytes). The rest of (index, microbatch) is scratch.
  kReduceScatterAccumulate = 12,
  // ZeRO-3 (pipeline zero 3): fill buffer (index, microbatch) with the whole
  // parameter `index`, which the device holds only as its shard over group
  // `peer` (sharded_holds): the shard is copied in at elements [r n/D,
  // (r+1) n/D) and the rest all-gathered over the group. `microbatch` is the
  // block b: b < M the forward of micro-batch b, M <= b < 2M the backward of
  // micro-batch b - M (plan::gather_block); nodes of that phase and
  // micro-batch read the parameter from buffer (index, b), which the memory
  // plan frees after their last read.
  kGatherParam = 13,
  // ZeRO-3 with prefetch: the same gather, handed to the device's
  // communication stream (kStartGather) while computing goes on, and waited
  // for (kWaitGather, the same index, microbatch and peer) before the
  // buffer's first reader. The buffer lives from the start.
  kStartGather = 14,
  kWaitGather = 15,
};
// GatherParam and StartGather: the instructions that fill a ZeRO-3 block's
// buffer of a parameter.
inline bool fills_gathered(InstrKind kind) {
  return kind == InstrKind::kGatherParam || kind == InstrKind::kStartGather;
}
std::string_view instr_kind_name(InstrKind kind);
// What instruction `kind` names by `index` must exist: a node, a tensor or a
// state update of `g`, or one of the program's `num_buckets` buckets. The
// loader and plan::verify_plan share it; `at` begins the error.
Status check_instruction_index(InstrKind kind, uint32_t index, size_t num_buckets, const Graph &g,
                               const std::string &at);

struct PlanInstruction {
  InstrKind kind = InstrKind::kCompute;
  int32_t microbatch = -1;
  uint32_t index = 0; // node (compute), tensor (send, recv, accumulate, scale), update (update)
  int32_t peer = -1;  // send, recv: the other device; all-reduce: the group; -1 otherwise
  friend bool operator==(const PlanInstruction &, const PlanInstruction &) = default;
};

// Where the buffer of (tensor, micro-batch) lives in a device's arena. Two slots
// may share an offset (aliases: with one micro-batch the accumulated buffer
// (t, -1) is (t, 0) itself).
struct PlanSlot {
  uint32_t tensor = 0;
  int32_t microbatch = -1;
  int64_t offset = 0;
  friend bool operator==(const PlanSlot &, const PlanSlot &) = default;
};

// Accumulated buffers (tensor, -1) reduced over a data-parallel group as one
// message: summed (all-reduce) or, with reduce_scatter (ZeRO-1), summed with
// each device keeping its shard of every tensor.
struct PlanBucket {
  std::vector<TensorId> tensors;
  bool reduce_scatter = false;
  friend bool operator==(const PlanBucket &, const PlanBucket &) = default;
};

struct PlanProgram {
  uint32_t device = 0;
  std::vector<NodeId> order;    // a topological order of the plan's graph
  int64_t arena_bytes = 0;      // activation arena size
  std::vector<int64_t> offsets; // per tensor: arena offset, or -1
  // Pipeline plans (revision 2); `order` and `offsets` are then empty. The `{}`
  // initializers let older code write `{device, order, arena_bytes, offsets}`
  // without -Wmissing-field-initializers.
  std::vector<PlanInstruction> instructions{};
  std::vector<PlanSlot> slots{};
  // Parameters, state and constants this device materializes and keeps, by id
  // (strictly increasing).
  std::vector<TensorId> holds{};
  double predicted_busy_s = 0; // compute and transfer time of one step
  // ZeRO-1 and ZeRO-2: held tensors (a subset of holds) kept only as this
  // device's shard over pipeline group `shard_group`.
  std::vector<TensorId> sharded_holds{};
  int32_t shard_group = -1;
  // Gradient buckets of the StartBucket / WaitBucket instructions (revision 3).
  std::vector<PlanBucket> buckets{};
  friend bool operator==(const PlanProgram &, const PlanProgram &) = default;
};

// ZeRO-2: by tensor (num_tensors of them), whether `program` keeps only its
// shard of the tensor's step buffer (t, -1): the tensors its
// ReduceScatterAccumulate instructions name (indices out of range are left
// out).
std::vector<bool> shard_accumulated(const PlanProgram &program, size_t num_tensors);
// The bytes of buffer (tensor, microbatch) in a program's arena: the tensor's,
// but 1/`shards` of them for the step buffer of a tensor `sharded` (the
// program's shard_accumulated) names; `shards`: pipeline.data_parallel.
// ZeRO-3: by tensor, whether `program` gathers the parameter (its
// GatherParam instructions name it); its buffers are then per block
// (micro-batch 0..2M-1).
std::vector<bool> gathered_params(const PlanProgram &program, size_t num_tensors);
int64_t slot_bytes(const Graph &graph, TensorId tensor, int32_t microbatch,
                   const std::vector<bool> &sharded, int64_t shards);

// Tensor parallelism: a parameter (or its optimizer state) that every member
// of a tensor-parallel group holds one piece of. The plan's graph declares the
// piece's shape; member r holds piece r of the full tensor (`full_shape`) along
// `dim`, viewed as [outer, n / outer] with the second factor cut in
// tensor_parallel pieces (partitioner/search/tensor_parallel.h).
struct PlanShard {
  std::string tensor;
  std::vector<int64_t> full_shape;
  int32_t dim = 0;
  int64_t outer = 1;
  friend bool operator==(const PlanShard &, const PlanShard &) = default;
};

// How a pipeline plan splits the step (plan revision 2).
struct PlanPipeline {
  int32_t stages = 1;       // devices (per replica and member)
  int32_t microbatches = 1; // the graph is built at batch / microbatches
  std::string schedule;     // "gpipe", "1f1b", "interleaved" or "zb-h1"
  // Interleaved (plan revision 4): model chunks per device. The graph is cut
  // into stages * chunks virtual stages; virtual stage k runs on device
  // k mod stages. 1 for the other schedules.
  int32_t chunks = 1;
  std::vector<int32_t> node_stage;     // per node of the graph: its (virtual) stage
  std::vector<std::string> boundaries; // last forward node of (virtual) stages but the last
  std::string cluster_json;            // the cluster spec the costs were predicted for
  double predicted_step_s = 0;
  double predicted_bubble = 0; // idle fraction of the devices' step time
  // Data parallelism: device stage * data_parallel + replica runs that replica
  // of the stage on micro-batches replica * M .. replica * M + M - 1 of the batch.
  int32_t data_parallel = 1;
  std::vector<std::vector<int32_t>> groups; // device sets of the all-reduces
  // Per group: "ring", "tree", "recursive-doubling", "rabenseifner" (the
  // algorithms of runtime/comm/collectives.h) or "" (the communicator's own);
  // empty vector: all "".
  std::vector<std::string> group_algorithms;
  // 1: optimizer state sharded over each stage's replicas (ZeRO-1); 2: the
  // gradients too, reduce-scattered every micro-batch (ZeRO-2); 3: the
  // parameters too, gathered before each block that reads them (ZeRO-3)
  int32_t zero = 0;
  // Tensor parallelism (--mesh DPxTPxPP): device (stage * data_parallel + replica)
  // * tensor_parallel + member. The members of a (stage, replica) run the same
  // program on their pieces; the graph's Tp* nodes run over their group
  // (`groups[tp_groups_begin + stage * data_parallel + replica]`).
  int32_t tensor_parallel = 1;
  int32_t tp_groups_begin = -1;
  std::vector<PlanShard> shards;
  // The gradient bucket size the programs' buckets were formed with (revision
  // 3); 0: no buckets.
  int64_t bucket_bytes = 0;
  friend bool operator==(const PlanPipeline &, const PlanPipeline &) = default;
};

struct Plan {
  enum class Mode { kInfer = 0, kTrain = 1 };
  Mode mode = Mode::kInfer;
  Graph graph;                   // the graph to run
  std::string loss;              // training: the loss tensor's name
  std::string loss_kind;         // training: "softmax_cross_entropy" or "mse"
  std::string optimizer;         // training: canonical optimizer string
  std::string model_fingerprint; // hex SHA-256 of the source model's canonical bytes
  std::string fingerprint;       // hex SHA-256 of those bytes and the options text
  std::vector<PlanDevice> devices;
  std::vector<PlanProgram> programs;
  // Present for pipeline plans (strata compile --mesh / --microbatches): every
  // program then has instructions instead of an order.
  std::optional<PlanPipeline> pipeline;
  std::string producer; // as read from a file; the writer always writes its own
};

std::string_view plan_mode_name(Plan::Mode mode);

// The plan fingerprint: hex SHA-256 of `model_bytes` (the source model's
// canonical binary form), a NUL byte, then `options_text` (the canonical options,
// e.g. "mode=train\nloss=mse\noptimizer=sgd:lr=0.1\noutput=logits\n").
std::string plan_fingerprint(llvm::ArrayRef<uint8_t> model_bytes, std::string_view options_text);

// Hex SHA-256 of a graph's canonical binary model bytes: the graph_digest a
// plan records of its embedded model, checked when the plan loads.
Result<std::string> graph_digest(const Graph &graph);

// Whether `path` names a plan by its extension: ".splan" or ".splan.json".
bool is_plan_path(std::string_view path);
// Whether the file at `path` is a plan: by extension, else by content (binary
// identifier "STRP", or JSON whose first key is "plan_version"). False when it
// cannot be read (the caller's load then reports why).
bool file_is_plan(const std::string &path);

Result<Plan> load_plan(const std::string &path);
Result<Plan> load_plan_from_buffer(llvm::ArrayRef<uint8_t> bytes, std::string_view display_name,
                                   std::string_view model_dir);
Result<Plan> load_plan_from_json(std::string_view json, std::string_view display_name,
                                 std::string_view model_dir);

Result<std::vector<uint8_t>> plan_to_flatbuffer(const Plan &plan);
Result<std::string> plan_to_json(const Plan &plan);

// Writes the plan (JSON if the path ends in ".json", else binary) atomically.
Status save_plan(const Plan &plan, const std::string &path);

} // namespace strata::serialization
