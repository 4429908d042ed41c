// The automatic plan search (strata compile --auto): given a model, a training
// setup and N devices of a cluster, try every way to spend the devices that
// strata can run today and keep the fastest plan that fits in memory.
//
// Search space:
//   DP x TP x PP = N                every factorization of the device count with
//                                   TP a power of two within one node (tensor
//                                   parallelism talks every layer: it stays on
//                                   the fastest links)
//   M                               micro-batches per replica: every power of two
//                                   (and the whole local batch) dividing the
//                                   replica's batch, up to 64
//   schedule                        1F1B; GPipe and ZB-H1 when PP > 1 and
//                                   M > 1; interleaved with two chunks per
//                                   device when PP > 1 and PP divides M
//                                   (estimated candidates: 1F1B and ZB-H1)
//   ZeRO                            off, ZeRO-1, 2 and 3 when DP > 1
//   recomputation                   when the candidate without it does not fit
//                                   (passes/recompute.h: it only costs time)
// Each candidate is compiled for real (compile_pipeline: stage search, lowering,
// memory plans, deadlock check) and scored by the simulator's predicted step
// time. Its memory per device is what the plan says: the activation arena plus
// the weights, optimizer state and constants the device holds. A candidate fits
// when every device's memory is within the cluster device's capacity.
//
// Above `exact_devices` devices (64 by default) compiling every candidate for
// every device would take minutes, so candidates are estimated instead, from
// the stage search alone: the forward graph at the candidate's micro-batch size
// (tensor-parallel rewrite included) split into stages by partition_stages,
// then
//   step   = sum of stage times + (M - 1) x the slowest stage      (1F1B's
//            critical path: fill, steady state, drain)
//          + the slowest stage's data-parallel gradient all-reduce (ring, over
//            the replicas' link; ZeRO-1's reduce-scatter + all-gather moves the
//            same bytes)
//          + the slowest stage's optimizer update (memory bound)
//          + under ZeRO-2, M blocking reduce-scatters of the slowest stage's
//            gradients (one per micro-batch, each right after backward makes
//            it; the estimate keeps the step's reduction too, an upper bound:
//            ZeRO-1's buckets overlap backward where these block it)
//   memory = parameters x (weights, gradients, optimizer state; the state / DP
//            under ZeRO-1, the gradients / DP too under ZeRO-2) + the
//            activations of min(P - s, M) micro-batches.
// Only 1F1B candidates are estimated there (GPipe would take the same time
// with more memory). Only the winner is then compiled for real (unless
// compile_winner is off).
// tests/partitioner/auto_plan_test.cc checks the estimates against the exact
// search: the same winner, every estimate within 1.5x of the simulated step.
//
// The winner is the fitting candidate with the smallest predicted step (ties:
// less memory, then fewer micro-batches). The explanation compares it with the
// runner-up: step time, bubble, bytes moved per step, memory.
#pragma once

#include <string>
#include <vector>

#include "partitioner/compile_pipeline.h"

namespace strata::partitioner {

struct AutoOptions {
  int devices = 0;     // N; 0: every device of the cluster
  ClusterSpec cluster; // costs and memory capacity
  // As PipelineCompileOptions::profile: measured node times for every candidate.
  std::function<Result<std::vector<double>>(const Graph &training)> profile;
  int max_microbatches = 64;
  // Devices above which candidates are estimated rather than compiled.
  int exact_devices = 64;
  // Whether to compile the winner into AutoResult::plan.
  bool compile_winner = true;
  // Estimates only, a what-if for mixed precision (bf16 arithmetic at the
  // device's bf16 peak, activations kept in bf16; weights, gradients and
  // optimizer state stay f32). The compiler itself builds f32 plans.
  bool mixed_precision = false;
  // As PipelineCompileOptions::bucket_bytes, for the compiled candidates.
  int64_t bucket_bytes = kDefaultBucketBytes;
};

struct AutoCandidate {
  int data_parallel = 1;
  int tensor_parallel = 1;
  int stages = 1;
  int microbatches = 1;
  Schedule schedule = Schedule::k1F1B;
  int zero = 0;           // 1: ZeRO-1 optimizer-state sharding; 2: ZeRO-2 (gradients too)
  bool recompute = false; // activation recomputation (tried when the plan without does not fit)
  int chunks = 1;         // the interleaved schedule's model chunks per device
  double step_s = 0;      // predicted
  double bubble = 0;      // predicted
  int64_t memory = 0;     // the largest device's bytes: arena + held tensors
  double comm_bytes = 0;  // sent and all-reduced per step, all devices
  bool fits = false;
  bool estimated = false;    // scored by the estimate, not compiled
  std::string error{};       // why it could not be compiled (then the numbers are 0)
  std::string label() const; // "dp=2 tp=2 pp=4 M=8 1f1b", "... interleaved x2"
};

struct AutoResult {
  // Every candidate tried: fitting ones by predicted step, then the rest.
  std::vector<AutoCandidate> candidates;
  size_t winner = 0;        // index into candidates
  serialization::Plan plan; // the winner's plan (when compiled)
  bool planned = false;
  std::string reason; // why the winner won, one or two sentences
  double search_seconds = 0;
};

// Errors: no candidate compiles (the first error), or none fits: "no plan for N
// devices fits in C per device; the smallest needs M (dp=.. pp=.. M=..)".
Result<AutoResult> auto_plan(const Graph &forward, const passes::TrainingOptions &training,
                             const AutoOptions &options);

} // namespace strata::partitioner
