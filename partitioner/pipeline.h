// Pipeline lowering: from a training graph whose nodes are assigned to stages
// to one instruction stream per device, with its memory plan, and the simulator
// that checks those streams for deadlocks and predicts their timing.
//
// The training graph is built at micro-batch size (passes/split_batch.h) and run
// M times per step; nothing is unrolled. An instruction names a node or tensor
// and a micro-batch, and a device's buffers are keyed by (tensor, micro-batch).
//
// The step has three phases (analyze_phases):
//  - per micro-batch, forward: the loss and everything it depends on;
//  - per micro-batch, backward: everything else that depends on the data and is
//    not optimizer work;
//  - once per step: the optimizer (passes::is_step_op and everything computed
//    from it) and the nodes that depend on no data at all (the step counter).
// A tensor computed per micro-batch and read once per step (a gradient, the loss)
// is accumulated: buffer (t, -1) holds the sum over micro-batches, then is divided
// by M, the mean the full batch would have given (every micro-batch has the
// same size and the loss is a mean).
//
// Lowering (lower_pipeline), per device s (= stage s; with the interleaved
// schedule's v chunks, stages s, s + P, ..., s + (v-1) P):
//  1. the per-micro-batch blocks in schedule order. GPipe: F0 .. F(M-1), then
//     B0 .. B(M-1). 1F1B (PipeDream-Flush, as in Megatron-LM): w = min(P-1-s, M)
//     warm-up forwards, then alternating F(w+i), B(i), then the remaining
//     backwards. Interleaved (Megatron-LM's virtual pipeline): the chunks take
//     P micro-batches in turn, forwards in chunk order and backwards in
//     reverse, after 2(P-1-s) + (v-1)P warm-up forwards (all of them when
//     M = P). Every schedule runs the backward of micro-batch k before that of
//     k + 1 in every stage, so gradients accumulate in the same order and all
//     give bitwise the same result (but with clipping, whose norm sums
//     per-stage partials, so v chunks sum in another order). Inside a block, nodes run in one
//     topological order; a tensor from another stage is received right before its first reader in
//     that micro-batch and sent right after its producer; accumulation follows the producer;
//  2. the per-step part: scale the accumulated tensors, send those another stage
//     reads, run the step nodes (receiving and sending across stages likewise).
//     With data parallelism the accumulated tensors are first summed over the
//     stage's replicas: in gradient buckets (PipelineOptions::bucket_bytes), each
//     started (StartBucket) right after the last instruction of the micro-batch
//     blocks that touches its tensors, and waited for (WaitBucket) here, so the
//     reduction of late layers' gradients overlaps the backward of early ones;
//     or, without buckets, by one blocking collective per tensor here;
//  3. state updates: the stage computing a new value sends it to every other
//     stage holding a copy of the target (a tied embedding, the step counter),
//     and each holder applies it.
// Sends never block (the communicator copies), so a program pair deadlocks only
// when receives wait on each other in a cycle or on a send that never comes;
// check_deadlock finds both.
//
// Memory (per device): each (tensor, micro-batch) buffer lives from the
// instruction that writes it to the last one that reads it; buffers are placed
// with passes::place_buffers, so the arena size is the device's peak activation
// memory for that schedule, known at compile time.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "graph/graph.h"
#include "partitioner/cluster.h"
#include "serialization/plan_io.h"

namespace strata::partitioner {

enum class Schedule { kGPipe, k1F1B, kInterleaved };
// "gpipe", "1f1b" or "interleaved"
Result<Schedule> parse_schedule(std::string_view text);
std::string_view schedule_name(Schedule schedule);

enum class Phase : uint8_t { kForward, kBackward, kStep };

struct StepPhases {
  std::vector<Phase> node_phase; // by NodeId
  // Tensors computed per micro-batch that are read once per step, are graph
  // outputs or are the values of state updates, by id.
  std::vector<TensorId> accumulated;
};

// Splits a training graph's nodes into the phases above. Errors: a per-micro-batch
// node reading a per-step value, a state update whose value is computed per
// micro-batch when microbatches > 1 (batch statistics), an accumulated tensor that
// is not floating point.
Result<StepPhases> analyze_phases(const Graph &graph, int microbatches);

// PyTorch DDP's default bucket size (bucket_cap_mb = 25).
inline constexpr int64_t kDefaultBucketBytes = int64_t{25} << 20;

struct PipelineOptions {
  int stages = 1;
  int microbatches = 1;
  // Replicas of every stage (--mesh DPx1xPP). Device s * data_parallel + r runs
  // replica r of stage s; sends and receives stay within a replica, and every
  // accumulated tensor is summed over the stage's replicas (pipeline group s)
  // before the division by microbatches * data_parallel.
  int data_parallel = 1;
  // ZeRO-1 (with data_parallel > 1): each optimizer update whose gradient only
  // it reads runs on the device's 1/DP shard (ComputeShard) of the parameter,
  // gradient and optimizer state; the gradient is reduce-scattered instead of
  // all-reduced, the new parameter all-gathered, and the state is held as
  // shards. Tensors whose size DP does not divide stay replicated.
  int zero = 0;
  // With data_parallel > 1: the gradients (and other accumulated tensors) are
  // reduced in buckets of about this many bytes, each started on the device's
  // communication stream as soon as its last tensor is final (in the last
  // micro-batch's backward, so later layers' buckets go first) and waited for
  // before the step. 0: one blocking collective per tensor at the step.
  int64_t bucket_bytes = kDefaultBucketBytes;
  Schedule schedule = Schedule::k1F1B;
  // kInterleaved: model chunks per device (2 or more). node_stage then runs
  // over stages * chunks virtual stages; virtual stage k runs on device
  // k mod stages (chunk k / stages of it). Needs microbatches a multiple of
  // stages and no recomputation.
  int chunks = 1;
  int64_t alignment = 64;
};

// The send/recv tag of buffer (tensor, micro-batch): unique within a step.
uint64_t transfer_tag(TensorId tensor, int32_t microbatch);

// One program per device (stages * data_parallel of them, in device order).
// `node_stage` gives every node's stage in [0, stages), or with the
// interleaved schedule its virtual stage in [0, stages * chunks). With
// data_parallel > 1, the all-reduce groups (one per stage) are
// pipeline_groups(options).
Result<std::vector<serialization::PlanProgram>> lower_pipeline(const Graph &graph,
                                                               const std::vector<int> &node_stage,
                                                               const PipelineOptions &options);

// The data-parallel groups: group s holds the replicas of stage s (none when
// data_parallel is 1).
std::vector<std::vector<int32_t>> pipeline_groups(const PipelineOptions &options);

// "compute 'layer0.fc1' mb 3", "send 'h' mb 2 to device 1", ... for messages.
std::string describe_instruction(const Graph &graph, const serialization::PlanInstruction &instr);

// ZeRO-1's ComputeShard: node `node` run by the device at position `rank` of a
// group of `count` devices computes elements [rank c, (rank + 1) c) of every
// operand the size of its first input (n elements, c = n / count), viewed
// flat; scalars stay whole, and a tensor the device holds as its shard is that
// shard itself. Both runners (CPU and CUDA) view the operands this way.
struct ShardedCompute {
  int64_t n = 0, chunk = 0, rank = 0;
  // How the shard sees a tensor of `type`: whole (`whole`), or `chunk`
  // elements (`type`) at byte `offset` of its buffer (0 when `held_as_shard`).
  struct View {
    bool whole = false;
    int64_t offset = 0;
    TensorType type;
  };
  View view(const TensorType &type, bool held_as_shard) const;
};
// Checks the node and the group: n splits evenly over it, every operand has n
// elements or one, every output n (SumOfSquares's pair is whole: what the
// shard adds), the device is a member. Errors name `context`.
Result<ShardedCompute> sharded_compute(const Graph &graph, const Node &node,
                                       const std::vector<int32_t> &group, int32_t device,
                                       std::string_view context);

// The predicted timeline of one step.
struct SimulatedInstruction {
  double start = 0;
  double end = 0;
};
struct Simulation {
  std::vector<std::vector<SimulatedInstruction>> devices; // per device, per instruction
  std::vector<double> busy; // per device: seconds spent on its own instructions
  std::vector<double> end;  // per device: when its last instruction ends
  double step_time = 0;     // the largest end
  double bubble = 0;        // 1 - sum(busy) / (devices * step_time)
};

// Costs the simulator charges. Transfers take `transfer(src, dst, bytes)` from
// the send to the arrival; the receiver waits for the arrival.
struct SimulationCosts {
  std::function<double(NodeId node)> compute;                     // one node, one micro-batch
  std::function<double(int src, int dst, double bytes)> transfer; // in flight
  std::function<double(double bytes)> local_copy;                 // accumulate, scale, update
  // An all-reduce of `bytes` over `devices`; empty: free. Reduce-scatter and
  // all-gather of a `bytes` buffer likewise.
  std::function<double(const std::vector<int32_t> &devices, double bytes)> all_reduce;
  std::function<double(const std::vector<int32_t> &devices, double bytes)> reduce_scatter;
  std::function<double(const std::vector<int32_t> &devices, double bytes)> all_gather;
};

// A tensor-parallel node's communication (TpAllReduce, TpAllGather; TpCopy and
// TpSplit communicate in their backward), ring-priced over its group of
// `parts` consecutive devices of the cluster; zero for other nodes.
struct TensorParallelTime {
  double forward = 0;
  double backward = 0;
};
TensorParallelTime tensor_parallel_time(const Graph &graph, NodeId id, const ClusterSpec &cluster);
// Whether a node is a tensor-parallel collective that communicates in its
// forward (TpAllReduce, TpAllGather, TpReduceScatter, TpAllToAll); TpCopy and
// TpSplit communicate only in their backward, as the other four.
bool communicates_forward(const Node &node);
// One execution of a node: its collective's forward time for a tensor-parallel
// collective, else the roofline on the cluster's device.
double node_seconds(const Graph &graph, NodeId id, const ClusterSpec &cluster);

// The accumulated tensors an instruction sums over its group: the tensor of an
// AllReduce or ReduceScatter, a StartBucket's bucket; none for others.
std::vector<TensorId> reduced_tensors(const serialization::PlanProgram &program,
                                      const serialization::PlanInstruction &instr);

// Zero costs: what check_deadlock uses.
SimulationCosts zero_costs();
// Roofline node times on the cluster's device, alpha-beta transfers over the
// links between plan devices 0..P-1 placed on cluster devices 0..P-1.
SimulationCosts cluster_costs(const Graph &graph, const ClusterSpec &cluster);

// Runs every device's program against the others: a receive waits for its send.
// programs[i] must be device i's.
// Errors (also what check_deadlock reports): a receive that can never be matched
// ("device 1 instruction 12 (recv 'h' mb 3 from device 0) waits forever: device 0
// ..."), naming both sides and where the other side is stuck or that it never
// sends it, and a send nobody receives.
// `groups` are the devices of the all-reduce instructions (peer = group index).
Result<Simulation> simulate_pipeline(const Graph &graph,
                                     const std::vector<serialization::PlanProgram> &programs,
                                     const SimulationCosts &costs,
                                     const std::vector<std::vector<int32_t>> &groups = {});

// check-deadlock: simulate_pipeline with zero costs, keeping only the verdict.
Status check_deadlock(const Graph &graph, const std::vector<serialization::PlanProgram> &programs,
                      const std::vector<std::vector<int32_t>> &groups = {});

// Why a plan moves data: one row per (sender, receiver or group, tensor), with
// the producer and the first reader it connects, derived from the programs.
struct TransferReason {
  int from = 0;       // device that sends (or a member of the group)
  int to = -1;        // receiving device; -1 for an all-reduce
  int32_t group = -1; // all-reduce group
  TensorId tensor = 0;
  std::string
      why;       // "activation of 'layer1.out' (Add) read by 'layer2.ln1' (LayerNorm) on device 1"
  int count = 0; // messages per step (one per micro-batch, or one)
  double bytes = 0;   // each
  double seconds = 0; // predicted time of one, from `costs`
};
std::vector<TransferReason>
explain_transfers(const Graph &graph, const std::vector<serialization::PlanProgram> &programs,
                  const std::vector<std::vector<int32_t>> &groups, const SimulationCosts &costs);

// One executed (or predicted) instruction, for traces.
struct TraceSpan {
  uint32_t instruction = 0;
  double start_s = 0;
  double end_s = 0;
  int64_t step = 0;
  // Work of the device's communication stream (a StartBucket's reduction),
  // shown on a track of its own.
  bool stream = false;
};

// A Chrome / Perfetto trace (JSON, "traceEvents") of what each device did: one
// track per device; consecutive computation of one micro-batch's forward
// ("F3"), backward ("B3") or the step ("optimizer") becomes one event, with the
// node count in its args; every send and receive is its own event, so waiting
// shows as a receive's length. Load it in ui.perfetto.dev or chrome://tracing.
// With the plan's `pipeline` its devices are named by device_role, and with
// model chunks (the interleaved schedule) blocks are named "F3 c1"
// (micro-batch 3 of chunk 1).
std::string chrome_trace(const Graph &graph,
                         const std::vector<serialization::PlanProgram> &programs,
                         const std::vector<std::vector<TraceSpan>> &spans, int microbatches,
                         const serialization::PlanPipeline *pipeline = nullptr);

// Each node's model chunk (its virtual stage / stages) for an interleaved
// plan; empty for the other schedules.
std::vector<int32_t> node_chunks(const serialization::PlanPipeline &pipeline);

// What device `device` of a pipeline plan runs, for messages and traces:
// "stage 2", "stage 1 replica 0", "stages 1, 5" (interleaved), with
// " member 1" in a tensor-parallel group.
std::string device_role(const serialization::PlanPipeline &pipeline, int64_t device);

} // namespace strata::partitioner
