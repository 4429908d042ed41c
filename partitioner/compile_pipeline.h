// The pipeline compiler: a forward model to a pipeline training plan
// (strata compile --mesh DPxTPxPP, --microbatches M).
//
//   split_batch        the forward graph at batch / (M x DP) (passes/split_batch.h)
//   shard_tensor_parallel  TP > 1: the loss added first (passes::add_loss), then
//                      the local graph one member of a group runs
//                      (search/tensor_parallel.h)
//   make_training      loss, backward, optimizer (passes/make_training.h);
//                      --recompute then adds recomputation (passes/recompute.h)
//   partition_stages   the forward nodes into P stages (P x chunks virtual
//                      stages when interleaved), balanced by the cost model
//                      on the cluster's device (or profiled node times) over the
//                      whole step: each forward node counts with the backward and
//                      optimizer nodes that will run where it runs; under the
//                      device's memory (or the manual --stage-boundaries);
//                      backward and optimizer nodes follow
//   lower_pipeline     per-device programs for the schedule, with memory plans
//                      (lowering/pipeline.h)
//   expand_tensor_parallel  TP > 1: each program copied per member
//   check_deadlock     every receive matched, in an order that completes
//   simulate_pipeline  predicted step time, per-device busy time and bubble
//   verify_plan        what the programs mean (plan/verify.h), as every runner
//                      checks it on load
//
// Devices are numbered (stage x DP + replica) x TP + member: tensor
// parallelism innermost, on the fastest links. Each data-parallel group
// reduces with the algorithm (runtime/comm/collectives.h) the cost model
// prices lowest for its size and the bytes it reduces in a step, among the
// algorithms that add in the same order as the rest of the plan's groups:
// the ring, the binomial tree, or recursive doubling and Rabenseifner (which
// add along the same tree, so one group may take recursive doubling for its
// small tensors and another Rabenseifner for its large ones). That order is
// chosen once for the plan, pricing everything reduced in a step as
// all-reduces, so every pipeline depth, and ZeRO-1 or not, is bitwise equal.
// Gradient clipping is split where a stage, a tensor-parallel group or
// a ZeRO-1 replica holds only part of the gradients: each part's SumOfSquares
// runs where its gradient is (on a replica's shard: ComputeShard) and the
// partial sums meet before NormScale. ZeRO-1 with clipping under tensor
// parallelism is refused; ZeRO-1 shards the optimizer state a device holds,
// while the new state a step computes still gets full-size arena buffers
// until the update. ZeRO-2 (--zero 2) also keeps each sharded gradient as a
// shard: every micro-batch's is reduce-scattered right after its producer
// and only the device's shard is summed over the micro-batches (a buffer
// 1/DP of its size), and each update's new values are applied as soon as
// they are final (lowering/pipeline.h). Its sums over the replicas then come
// before those over micro-batches: weights equal ZeRO-1's to rounding (with
// one micro-batch ZeRO-1's very sums, bitwise where the plans reduce with one
// algorithm, as two replicas always do).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "partitioner/cost/cluster.h"
#include "partitioner/lowering/pipeline.h"
#include "passes/make_training.h"
#include "serialization/plan_io.h"

namespace strata::partitioner {

struct PipelineCompileOptions {
  int stages = 1;
  int microbatches = 1;
  // Replicas of every stage (--mesh DPx1xPP): the batch is split over
  // data_parallel x microbatches, gradients are all-reduced per stage.
  int data_parallel = 1;
  // --zero 1: shard the optimizer state over each stage's replicas (ZeRO-1);
  // --zero 2: the gradients too (ZeRO-2); --zero 3: the parameters too,
  // gathered before each forward and backward block that reads them (ZeRO-3).
  int zero = 0;
  // ZeRO-3: gathers started on the communication stream ahead of their
  // readers (PipelineOptions::prefetch).
  bool prefetch = true;
  // --bucket-mb: with data parallelism, gradients are summed over the replicas
  // in buckets of about this many bytes, overlapping backward; 0: one blocking
  // collective per gradient at the step (PipelineOptions::bucket_bytes).
  int64_t bucket_bytes = kDefaultBucketBytes;
  // Members of every tensor-parallel group (--mesh DPxTPxPP): the forward graph
  // is split over them (partitioner/search/tensor_parallel.h); tp is innermost in the
  // device numbering.
  int tensor_parallel = 1;
  // --split-activations: TensorParallelOptions::split_activations.
  bool split_activations = false;
  // --recompute: keep only the activations between layers for backward and
  // recompute the rest (passes/recompute.h).
  bool recompute = false;
  Schedule schedule = Schedule::k1F1B;
  // --chunks: with the interleaved schedule, model chunks per device (the
  // model is cut into stages x chunks virtual stages); 1 otherwise.
  int chunks = 1;
  // The cluster the costs are predicted for; absent: default_cpu_cluster(stages).
  std::optional<ClusterSpec> cluster;
  // Whether the stage search refuses stages over the device's memory capacity
  // (the --auto search and the compile benchmark check memory themselves).
  bool check_memory = true;
  // --stage-boundaries: the last forward node of each stage but the last.
  std::vector<std::string> stage_boundaries;
  // --profile: measured seconds of every node of the (micro-batch) training graph
  // it is given, by NodeId; used instead of the cost model's roofline to balance
  // the stages and predict the step. Supplied by a layer that can run graphs.
  std::function<Result<std::vector<double>>(const Graph &training)> profile;
};

// Bytes a device holds per parameter byte: the weights, their gradients and
// the optimizer's per-parameter state (that state / dp when ZeRO-1 shards it
// over dp replicas; the gradients / dp too with ZeRO-2).
double parameter_state_factor(const passes::OptimizerSpec &spec, int zero = 0, int dp = 1);

// A training plan (mode, graph, loss, optimizer, devices, programs, pipeline).
// The caller fills in the fingerprints. Errors name the option or the node.
Result<serialization::Plan> compile_pipeline(const Graph &forward,
                                             const passes::TrainingOptions &training,
                                             const PipelineCompileOptions &options);

// Tensor parallelism: every program of a (stage, replica) becomes `members`
// copies (device d -> d * members + m) with their sends, receives and groups
// moved to member m's; one tensor-parallel group per (stage, replica) is
// appended to `groups`. Returns the index of the first of those.
int32_t expand_tensor_parallel(int members, std::vector<serialization::PlanProgram> &programs,
                               std::vector<std::vector<int32_t>> &groups);

// Prices the collectives of `groups` with the algorithm the plan recorded for
// each ("ring", "tree", "recursive-doubling" or "rabenseifner", as the runtime
// runs it: all-gathers are the ring, a tree reduce-scatter a whole all-reduce);
// a group with none is priced as the ring, and a plan with none anywhere keeps
// the cost model's best.
void price_with_algorithms(plan::SimulationCosts &costs, const ClusterSpec &cluster,
                           const std::vector<std::vector<int32_t>> &groups,
                           const std::vector<std::string> &algorithms);
// cluster_costs with the plan's collective algorithms.
plan::SimulationCosts plan_costs(const serialization::Plan &plan, const ClusterSpec &cluster);

// Re-predicts a pipeline plan's step for `cluster` (strata simulate), pricing
// collectives with the plan's algorithms.
Result<plan::Simulation> simulate_plan(const serialization::Plan &plan, const ClusterSpec &cluster);

} // namespace strata::partitioner
