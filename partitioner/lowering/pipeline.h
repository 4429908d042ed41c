// Pipeline lowering: from a training graph whose nodes are assigned to stages
// to one instruction stream per device, with its memory plan; and the cluster
// costs under which plan/simulate.h predicts those streams' timing.
//
// The training graph is built at micro-batch size (passes/split_batch.h) and run
// M times per step; nothing is unrolled. An instruction names a node or tensor
// and a micro-batch, and a device's buffers are keyed by (tensor, micro-batch).
// The step's phases (forward and backward per micro-batch, the optimizer once
// per step, accumulated tensors) are plan::analyze_phases's.
//
// Lowering (lower_pipeline), per device s (= stage s; with the interleaved
// schedule's v chunks, stages s, s + P, ..., s + (v-1) P):
//  1. the per-micro-batch blocks in the order schedule_blocks gives them
//     (GPipe, 1F1B or interleaved; schedule.h). Every schedule runs the
//     backward of micro-batch k before that of k + 1 in every stage, so
//     gradients accumulate in the same order: every schedule and every P give
//     bitwise the weights of the one-device plan with the same M. The
//     exception is clipping over several stages: its norm is combined from
//     per-stage partial sums (SumOfSquares pairs of about 48 bits), which can
//     differ from one stage's sum in the last bit of the scale. Inside a
//     block, nodes run in one topological order; a tensor from another stage
//     is received right before its first reader in that micro-batch and sent
//     right after its producer; accumulation follows the producer (with
//     ZeRO-2, a sharded gradient's reduce-scatter over the stage's replicas
//     into the device's shard, ReduceScatterAccumulate);
//  2. the per-step part: scale the accumulated tensors, send those another stage
//     reads, run the step nodes (receiving and sending across stages likewise).
//     With data parallelism the accumulated tensors are first summed over the
//     stage's replicas: in gradient buckets (PipelineOptions::bucket_bytes), each
//     started (StartBucket) right after the last instruction of the micro-batch
//     blocks that touches its tensors, and waited for (WaitBucket) here, so the
//     reduction of late layers' gradients overlaps the backward of early ones
//     (only the last micro-batch's backward overlaps: the earlier ones only
//     accumulate, as in PyTorch DDP with no_sync and in Megatron-LM; ZeRO-1's
//     sharded gradients get reduce-scatter buckets of their own, ZeRO-2's are
//     summed already); or, without buckets, by one blocking collective per
//     tensor here;
//  3. state updates: the stage computing a new value sends it to every other
//     stage holding a copy of the target (a tied embedding, the step counter),
//     and each holder applies it. With ZeRO-2 a sharded update's values that
//     no other stage holds are applied in step 2, right after the update (and
//     the gather of its parameter), so the step keeps one update's full-size
//     new values at a time.
// Sends never block (the communicator copies), so a program pair deadlocks only
// when receives wait on each other in a cycle or on a send that never comes;
// check_deadlock finds both.
//
// Memory (per device): each (tensor, micro-batch) buffer lives from the
// instruction that writes it to the last one that reads it (a ZeRO-2
// gradient's step buffer is its shard, 1/DP of it); buffers are placed
// with passes::place_buffers, so the arena size is the device's peak activation
// memory for that schedule, known at compile time (1F1B's is below GPipe's:
// stage s keeps at most P - s micro-batches in flight).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "graph/graph.h"
#include "partitioner/cost/cluster.h"
#include "partitioner/lowering/schedule.h"
#include "plan/instructions.h"
#include "plan/phases.h"
#include "plan/simulate.h"
#include "serialization/plan_io.h"

namespace strata::partitioner {

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
  // ZeRO-2 (2): the same, but every micro-batch's gradient is reduce-scattered
  // right after its producer and only the device's shard accumulated
  // (ReduceScatterAccumulate: no gradient buckets for those), and the
  // update's new values are applied as soon as they are final.
  int zero = 0;
  // ZeRO-3: each block's parameter gathers are started on the device's
  // communication stream while the nodes before them compute (StartGather,
  // one group of gathers ahead), and waited for just before their reader
  // (WaitGather). Off: each gathers right before its reader (GatherParam).
  bool prefetch = true;
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
  // stages.
  int chunks = 1;
  int64_t alignment = 64;
};

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

// A tensor-parallel collective's communication (its ops::Collective: TpCopy
// and TpSplit communicate in their backward, the others in their forward and
// some in both), ring-priced over its group of `parts` consecutive devices of
// the cluster; zero for other nodes.
struct TensorParallelTime {
  double forward = 0;
  double backward = 0;
};
TensorParallelTime tensor_parallel_time(const Graph &graph, NodeId id, const ClusterSpec &cluster);
// Whether a node is a tensor-parallel collective that communicates in its
// forward (ops::communicates_forward: TpAllReduce, TpAllGather,
// TpReduceScatter, TpAllToAll); TpCopy and TpSplit communicate only in their
// backward.
bool communicates_forward(const Node &node);
// One execution of a node: its collective's forward time for a tensor-parallel
// collective, else the roofline on the cluster's device.
double node_seconds(const Graph &graph, NodeId id, const ClusterSpec &cluster);

// Roofline node times on the cluster's device, alpha-beta transfers over the
// links between plan devices 0..P-1 placed on cluster devices 0..P-1.
plan::SimulationCosts cluster_costs(const Graph &graph, const ClusterSpec &cluster);

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
  double bytes = 0;    // each
  double seconds = 0;  // predicted time of one, from `costs`
  bool gather = false; // a ZeRO-1 all-gather: the ring, whatever the group's algorithm
};
std::vector<TransferReason>
explain_transfers(const Graph &graph, const std::vector<serialization::PlanProgram> &programs,
                  const std::vector<std::vector<int32_t>> &groups,
                  const plan::SimulationCosts &costs);

} // namespace strata::partitioner
