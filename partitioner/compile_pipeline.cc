#include "partitioner/compile_pipeline.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <map>
#include <set>

#include "graph/builder.h"
#include "graph/units.h"
#include "graph/verifier.h"
#include "ops/registry.h"
#include "partitioner/cost/cost_model.h"
#include "partitioner/search/auto_plan.h"
#include "partitioner/search/stage_partition.h"
#include "partitioner/search/tensor_parallel.h"
#include "passes/recompute.h"
#include "passes/split_batch.h"
#include "plan/memory.h"
#include "plan/verify.h"

namespace strata::partitioner {

using plan::analyze_phases;
using plan::check_deadlock;
using plan::Phase;
using plan::reduced_tensors;
using plan::simulate_pipeline;
using plan::Simulation;
using plan::SimulationCosts;
using plan::StepPhases;

namespace {

// Gradient clipping across stages: a GlobalNormScale reading gradients of
// several stages would pull every gradient to its stage once per step. Each
// stage instead sums its own gradients' squares (SumOfSquares) and the clip
// node becomes NormScale of those pairs: eight bytes per stage cross.
// With `always` (tensor parallelism) a one-stage clip is rewritten too, so
// split_clip_norm_over_pieces finds every norm as per-stage SumOfSquares.
Status split_clip_norm(Graph &graph, std::vector<int> &node_stage, bool always) {
  const ops::OpRegistry &registry = ops::OpRegistry::global();
  for (NodeId id = 0; id < graph.num_nodes(); ++id) {
    if (graph.node(id).op != "GlobalNormScale") continue;
    std::map<int, std::vector<TensorId>> by_stage;
    for (TensorId in : graph.node(id).inputs) {
      const NodeId producer = graph.tensor(in).producer;
      by_stage[producer == kNoNode ? node_stage[id] : node_stage[producer]].push_back(in);
    }
    if (by_stage.size() < 2 && !always) continue;
    const std::string name = graph.node(id).name;
    GraphBuilder builder(std::move(graph), registry);
    std::vector<TensorId> partials;
    std::vector<int> partial_stage;
    for (const auto &[stage, grads] : by_stage) {
      partials.push_back(builder.op1("SumOfSquares", grads, {}, str_cat(name, ".stage", stage)));
      partial_stage.push_back(stage);
    }
    ASSIGN_OR_RETURN(graph, std::move(builder).finish());
    for (int stage : partial_stage)
      node_stage.push_back(stage);
    Node &clip = graph.mutable_node(id);
    clip.op = "NormScale";
    clip.inputs.assign(partials.begin(), partials.end());
    RETURN_IF_ERROR(verify_graph(graph, registry).with_context("splitting " + name));
  }
  return Status::ok();
}

// Gradient clipping under tensor parallelism: a member's gradients of
// parameters held in pieces are pieces too, so their squares are summed over
// the group (TpAllReduce of the SumOfSquares pair); replicated parameters'
// gradients are whole on every member and count once. Runs after
// split_clip_norm(always), which left NormScale of per-stage SumOfSquares:
// each is split into its pieces' part and its whole part.
Status split_clip_norm_over_pieces(Graph &graph, std::vector<int> &node_stage, int members,
                                   const std::vector<serialization::PlanShard> &shards) {
  const ops::OpRegistry &registry = ops::OpRegistry::global();
  std::set<std::string> in_pieces;
  for (const auto &shard : shards)
    in_pieces.insert(shard.tensor);
  // The gradient each "<param>.clipped_grad" multiplies belongs to <param>.
  std::map<TensorId, bool> piece_gradient;
  static constexpr std::string_view kSuffix = ".clipped_grad";
  for (const Node &node : graph.nodes())
    if (node.op == "Mul" && node.name.ends_with(kSuffix))
      piece_gradient[node.inputs[0]] =
          in_pieces.contains(node.name.substr(0, node.name.size() - kSuffix.size()));
  const auto consumers = graph.consumers();
  const NodeId original_nodes = static_cast<NodeId>(graph.num_nodes());
  for (NodeId id = 0; id < original_nodes; ++id) {
    if (graph.node(id).op != "SumOfSquares") continue;
    std::vector<TensorId> pieces, whole;
    for (TensorId g : graph.node(id).inputs) {
      auto it = piece_gradient.find(g);
      if (it == piece_gradient.end())
        return internal_error("clipping: '", graph.tensor(g).name, "' is not a clipped gradient");
      (it->second ? pieces : whole).push_back(g);
    }
    if (pieces.empty()) continue;
    const TensorId partial = graph.node(id).outputs[0];
    const auto &readers = consumers[partial];
    if (readers.size() != 1 || graph.node(readers[0]).op != "NormScale")
      return internal_error("clipping: '", graph.tensor(partial).name,
                            "' is not read by NormScale");
    const NodeId norm = readers[0];
    const std::string name = graph.node(id).name;
    GraphBuilder builder(std::move(graph), registry);
    const TensorId summed = builder.op1(
        "TpAllReduce", {partial},
        {{"parts", int64_t{members}},
         {"why", str_cat("the squares of gradient pieces of this stage, summed over the group "
                         "for the clipping norm")}},
        name + ".tp_all_reduce");
    node_stage.push_back(node_stage[id]);
    TensorId rest = kInvalidTensor;
    if (!whole.empty()) {
      rest = builder.op1("SumOfSquares", whole, {}, name + ".whole");
      node_stage.push_back(node_stage[id]);
    }
    ASSIGN_OR_RETURN(graph, std::move(builder).finish());
    graph.mutable_node(id).inputs.assign(pieces.begin(), pieces.end());
    Node &norm_node = graph.mutable_node(norm);
    std::replace(norm_node.inputs.begin(), norm_node.inputs.end(), partial, summed);
    if (rest != kInvalidTensor) norm_node.inputs.push_back(rest);
  }
  return verify_graph(graph, registry).with_context("clipping over tensor-parallel pieces");
}

// Gradient clipping under ZeRO-1: a replica holds only its shard of a sharded
// gradient, so the stage's SumOfSquares is split into one per gradient the
// replicas divide (lower_pipeline runs each on the shard and sums the pairs
// over the replicas) and one for the rest; NormScale reads them all. Runs
// after split_clip_norm(always).
Status split_clip_norm_over_shards(Graph &graph, std::vector<int> &node_stage, int replicas) {
  const ops::OpRegistry &registry = ops::OpRegistry::global();
  const auto consumers = graph.consumers();
  const NodeId original_nodes = static_cast<NodeId>(graph.num_nodes());
  for (NodeId id = 0; id < original_nodes; ++id) {
    if (graph.node(id).op != "SumOfSquares" || graph.node(id).inputs.size() < 2) continue;
    const TensorId partial = graph.node(id).outputs[0];
    const auto &readers = consumers[partial];
    if (readers.size() != 1 || graph.node(readers[0]).op != "NormScale") continue;
    std::vector<TensorId> divisible, rest;
    for (TensorId g : graph.node(id).inputs) {
      const int64_t n = graph.tensor(g).type.num_elements();
      (n % replicas == 0 && n >= replicas ? divisible : rest).push_back(g);
    }
    if (divisible.empty()) continue;
    const NodeId norm = readers[0];
    const std::string name = graph.node(id).name;
    // The stage's node keeps the rest, or else the first divisible gradient.
    if (rest.empty()) rest.push_back(divisible.front()), divisible.erase(divisible.begin());
    GraphBuilder builder(std::move(graph), registry);
    std::vector<TensorId> pairs;
    for (TensorId g : divisible) {
      pairs.push_back(builder.op1("SumOfSquares", {g}, {}, str_cat(name, ".", builder.name(g))));
      node_stage.push_back(node_stage[id]);
    }
    ASSIGN_OR_RETURN(graph, std::move(builder).finish());
    graph.mutable_node(id).inputs.assign(rest.begin(), rest.end());
    Node &norm_node = graph.mutable_node(norm);
    auto at = std::find(norm_node.inputs.begin(), norm_node.inputs.end(), partial);
    norm_node.inputs.insert(at + 1, pairs.begin(), pairs.end());
  }
  return verify_graph(graph, registry).with_context("clipping over ZeRO-1 shards");
}

} // namespace

double parameter_state_factor(const passes::OptimizerSpec &spec, int zero, int dp) {
  using Kind = passes::OptimizerSpec::Kind;
  const double state =
      spec.kind == Kind::kAdam || spec.kind == Kind::kAdamW ? 2.0 : (spec.momentum > 0 ? 1.0 : 0.0);
  const double shards = zero >= 1 && dp > 1 ? dp : 1;
  // The weights (ZeRO-3: a shard), then the gradients (ZeRO-2 and 3: a
  // shard) and the state (ZeRO-1, 2 and 3: a shard).
  return (zero == 3 ? 1.0 / shards : 1.0) + (zero >= 2 ? 1.0 / shards : 1.0) + state / shards;
}

int32_t expand_tensor_parallel(int members, std::vector<serialization::PlanProgram> &programs,
                               std::vector<std::vector<int32_t>> &groups) {
  using serialization::InstrKind;
  std::vector<serialization::PlanProgram> expanded;
  const auto group_count = static_cast<int32_t>(groups.size());
  for (const auto &program : programs)
    for (int m = 0; m < members; ++m) {
      serialization::PlanProgram copy = program;
      copy.device = program.device * static_cast<uint32_t>(members) + static_cast<uint32_t>(m);
      for (auto &instr : copy.instructions) {
        if (instr.kind == InstrKind::kSend || instr.kind == InstrKind::kRecv)
          instr.peer = instr.peer * members + m;
        else if (instr.peer >= 0)
          instr.peer = instr.peer * members + m; // a data-parallel group
      }
      if (copy.shard_group >= 0) copy.shard_group = copy.shard_group * members + m;
      expanded.push_back(std::move(copy));
    }
  std::vector<std::vector<int32_t>> regrouped;
  for (int32_t g = 0; g < group_count; ++g)
    for (int m = 0; m < members; ++m) {
      std::vector<int32_t> group;
      for (int32_t d : groups[static_cast<size_t>(g)])
        group.push_back(d * members + m);
      regrouped.push_back(std::move(group));
    }
  const auto begin = static_cast<int32_t>(regrouped.size());
  for (const auto &program : programs) {
    std::vector<int32_t> group;
    for (int m = 0; m < members; ++m)
      group.push_back(static_cast<int32_t>(program.device) * members + m);
    regrouped.push_back(std::move(group));
  }
  programs = std::move(expanded);
  groups = std::move(regrouped);
  return begin;
}

namespace {

// What a group's collective costs with the group's algorithm as the runtime
// runs it (runtime/comm/collectives.h): the all-gather is the ring whatever
// the algorithm, a tree reduce-scatter is a whole tree all-reduce, and
// recursive doubling and halving in a group whose size p is not a power of two
// fold it onto q = 2^floor(lg p) members: the whole vector in (sent and
// added), the algorithm over q, then the whole result out (all-reduce) or
// each member's chunk (reduce-scatter). (The cost model's formulas round lg p
// up instead, which underprices the fold's bandwidth.)
double group_collective_time(Collective kind, double bytes, int p, const LinkSpec &link,
                             CollectiveAlgorithm algorithm, double reduce_Bps) {
  if (kind == Collective::kAllGather) algorithm = CollectiveAlgorithm::kRing;
  if (kind == Collective::kReduceScatter && algorithm == CollectiveAlgorithm::kTree)
    kind = Collective::kAllReduce;
  const bool halves = algorithm == CollectiveAlgorithm::kRecursiveDoubling ||
                      algorithm == CollectiveAlgorithm::kRabenseifner;
  if (!halves || p <= 1 || bytes <= 0 || std::has_single_bit(static_cast<unsigned>(p)))
    return collective_time(kind, bytes, p, link, algorithm, reduce_Bps);
  const int q = static_cast<int>(std::bit_floor(static_cast<unsigned>(p)));
  const double in = transfer_time(bytes, link) + bytes / reduce_Bps;
  const double out =
      kind == Collective::kAllReduce ? transfer_time(bytes, link) : transfer_time(bytes / p, link);
  return in + collective_time(kind, bytes, q, link, algorithm, reduce_Bps) + out;
}

} // namespace

void price_with_algorithms(SimulationCosts &costs, const ClusterSpec &cluster,
                           const std::vector<std::vector<int32_t>> &groups,
                           const std::vector<std::string> &algorithms) {
  std::map<std::vector<int32_t>, CollectiveAlgorithm> algorithm_of;
  for (size_t g = 0; g < groups.size() && g < algorithms.size(); ++g)
    if (auto algorithm = collective_algorithm_named(algorithms[g]))
      algorithm_of[groups[g]] = *algorithm;
  if (algorithm_of.empty()) return; // the communicator's own: priced at its best
  auto priced = [cluster, algorithm_of](Collective kind) {
    return [cluster, algorithm_of, kind](const std::vector<int32_t> &devices, double bytes) {
      std::vector<int> members(devices.begin(), devices.end());
      auto it = algorithm_of.find(devices);
      const CollectiveAlgorithm algorithm =
          it == algorithm_of.end() ? CollectiveAlgorithm::kRing : it->second;
      return group_collective_time(kind, bytes, static_cast<int>(members.size()),
                                   link_for_group(cluster, members), algorithm,
                                   reduce_bytes_per_second(cluster.device, DType::kF32));
    };
  };
  costs.all_reduce = priced(Collective::kAllReduce);
  costs.reduce_scatter = priced(Collective::kReduceScatter);
  costs.all_gather = priced(Collective::kAllGather);
}

SimulationCosts plan_costs(const serialization::Plan &plan, const ClusterSpec &cluster) {
  SimulationCosts costs = cluster_costs(plan.graph, cluster);
  if (plan.pipeline)
    price_with_algorithms(costs, cluster, plan.pipeline->groups, plan.pipeline->group_algorithms);
  return costs;
}

Result<Simulation> simulate_plan(const serialization::Plan &plan, const ClusterSpec &cluster) {
  if (!plan.pipeline) return invalid_argument("the plan is not a pipeline plan");
  if (cluster.num_devices() < static_cast<int>(plan.programs.size()))
    return invalid_argument("cluster '", cluster.name, "' has ", cluster.num_devices(),
                            " devices; the plan needs ", plan.programs.size());
  return simulate_pipeline(plan.graph, plan.programs, plan_costs(plan, cluster),
                           plan.pipeline->groups);
}

namespace {

// The options' errors that need no graph, each naming its flag.
Status check_compile_options(const PipelineCompileOptions &options) {
  const int P = options.stages, M = options.microbatches, DP = options.data_parallel,
            TP = options.tensor_parallel;
  if (P < 1) return invalid_argument("--mesh: the pipeline needs at least 1 stage, got ", P);
  if (M < 1) return invalid_argument("--microbatches must be at least 1, got ", M);
  if (DP < 1)
    return invalid_argument("--mesh: data parallelism needs at least 1 replica, got ", DP);
  if (options.zero < 0 || options.zero > 3)
    return invalid_argument("--zero ", options.zero,
                            ": only ZeRO stages 1, 2 and 3 (or 0) are built");
  if (options.zero >= 1 && DP < 2)
    return invalid_argument("--zero ", options.zero, " shards the ",
                            options.zero == 3   ? "parameters, gradients and "
                            : options.zero == 2 ? "gradients and "
                                                : "",
                            "optimizer state over data-parallel replicas; the mesh has one (use "
                            "--mesh DPxTPxPP with DP >= 2)");
  if (TP < 1)
    return invalid_argument("--mesh: tensor parallelism needs at least 1 device, got ", TP);
  const bool interleaved = options.schedule == Schedule::kInterleaved;
  const int chunks = interleaved ? options.chunks : 1;
  if (!interleaved && options.chunks != 1)
    return invalid_argument("--chunks ", options.chunks,
                            " cuts the model into chunks per device for --schedule interleaved");
  if (interleaved) {
    if (chunks < 2 || chunks > 1024)
      return invalid_argument("--schedule interleaved needs --chunks 2 to 1024, not ", chunks);
    if (P < 2)
      return invalid_argument("--schedule interleaved needs a pipeline of 2 or more stages "
                              "(--mesh 1x1xP)");
    if (M % P != 0)
      return invalid_argument("--schedule interleaved runs micro-batches in groups of the ", P,
                              " stages: --microbatches ", M, " is not a multiple of ", P);
  }
  return Status::ok();
}

// The micro-batch training graph, and with tensor parallelism the parameters
// (and their optimizer state) held in pieces.
struct TrainingGraph {
  Graph graph;
  std::vector<serialization::PlanShard> shards;
  Graph before_recompute; // with --recompute under the interleaved schedule
};

// split_batch, then (with tensor parallelism) the loss and the sharding, then
// make_training and, with --recompute, recomputation.
Result<TrainingGraph> build_training_graph(const Graph &forward,
                                           const passes::TrainingOptions &training,
                                           const PipelineCompileOptions &options,
                                           const ClusterSpec &cluster) {
  const int M = options.microbatches, DP = options.data_parallel, TP = options.tensor_parallel;
  auto split = passes::split_batch(forward, int64_t{M} * DP);
  if (!split.is_ok()) {
    // What the user can change: a node that normalizes over the batch runs
    // only on the whole batch, which replicas cut too.
    const bool whole_batch =
        split.status().message().find("normalizes over the batch") != std::string::npos;
    Status status = split.status();
    if (whole_batch)
      status = Status(status.code(),
                      str_cat(status.message(),
                              DP > 1 ? "; data-parallel replicas each take part of the batch: "
                                       "train it on one replica (--mesh 1xTPxPP) with "
                                       "--microbatches 1, or without batch normalization"
                                     : "; use --microbatches 1"));
    // The count the pass saw is not one the user typed: say where it comes from.
    if (DP > 1)
      return status.with_context(str_cat("the batch is cut into ", M, " micro-batch",
                                         M == 1 ? "" : "es", " for each of ", DP, " replicas (",
                                         int64_t{M} * DP, " slices)"));
    return status;
  }
  ASSIGN_OR_RETURN(Graph micro, std::move(split));
  std::vector<serialization::PlanShard> shards;
  if (TP > 1) {
    // The loss goes in first: over logits split by class it runs split too
    // (Megatron-LM's vocabulary-parallel cross entropy).
    ASSIGN_OR_RETURN(micro, passes::add_loss(micro, training));
    TensorParallelOptions tp;
    tp.parts = TP;
    tp.device = cluster.device;
    std::vector<int> members;
    for (int m = 0; m < TP; ++m)
      members.push_back(m);
    tp.link = link_for_group(cluster, members);
    tp.split_activations = options.split_activations;
    auto sharded = shard_tensor_parallel(micro, tp);
    if (!sharded.is_ok()) return sharded.status().with_context("tensor parallelism");
    micro = std::move(sharded->local);
    shards = std::move(sharded->shards);
  }
  ASSIGN_OR_RETURN(Graph graph, TP > 1 ? passes::make_training_graph_from_loss(micro, training)
                                       : passes::make_training_graph(micro, training));
  if (TP > 1) shards = with_optimizer_state(graph, std::move(shards));
  Graph before_recompute;
  if (options.recompute) {
    if (options.schedule == Schedule::kInterleaved) before_recompute = graph;
    auto recomputed = passes::recompute_activations(graph);
    if (!recomputed.is_ok()) return recomputed.status().with_context("--recompute");
    graph = std::move(recomputed).value();
  }
  return TrainingGraph{std::move(graph), std::move(shards), std::move(before_recompute)};
}

// --profile: every node's measured seconds, by NodeId; empty without it.
Result<std::vector<double>> profile_nodes(const PipelineCompileOptions &options,
                                          const Graph &graph) {
  std::vector<double> measured;
  if (options.profile) {
    auto profiled = options.profile(graph);
    if (!profiled.is_ok()) return profiled.status().with_context("--profile");
    measured = std::move(profiled).value();
    if (measured.size() != graph.num_nodes())
      return internal_error("--profile measured ", measured.size(), " nodes of ",
                            graph.num_nodes());
  }
  return measured;
}

// The stage search over stages x chunks (virtual) stages: virtual stage k
// runs on device k mod stages.
Result<StageAssignment> find_stages(const Graph &graph, const passes::TrainingOptions &training,
                                    const PipelineCompileOptions &options,
                                    const ClusterSpec &cluster, const std::vector<double> &measured,
                                    int chunks) {
  const int P = options.stages, M = options.microbatches, DP = options.data_parallel,
            TP = options.tensor_parallel;
  StagePartitionOptions partition;
  partition.node_time = [&measured, &cluster](const Graph &g, NodeId id) {
    return measured.empty() ? node_seconds(g, id, cluster) : measured[id];
  };
  const LinkSpec &link = link_between(cluster, 0, P > 1 ? DP * TP : 0); // stage 0 to stage 1
  partition.link_bandwidth = link.bandwidth_Bps > 0 ? link.bandwidth_Bps : 1e12;
  partition.link_latency = link.latency_s;
  partition.training = true;
  partition.parameter_state_factor = parameter_state_factor(training.optimizer, options.zero, DP);
  partition.memory_capacity = options.check_memory && cluster.device.memory_bytes > 0
                                  ? static_cast<double>(cluster.device.memory_bytes)
                                  : kUnlimited;
  partition.microbatches = M;
  // A stage keeps per micro-batch in flight the forward activations backward
  // reads (with --recompute: the checkpoints between layers).
  std::vector<bool> kept(graph.num_tensors(), false);
  {
    const std::vector<bool> forward = passes::forward_part(graph);
    for (NodeId id = 0; id < graph.num_nodes(); ++id)
      if (!forward[id])
        for (TensorId in : graph.node(id).inputs)
          kept[in] = true;
  }
  partition.kept = [&kept](const Graph &, TensorId id) { return kept[id]; };
  // Stages are balanced on every node of the step, where it will run, not on
  // forward times scaled by a guess at the backward's.
  ASSIGN_OR_RETURN(const StepPhases phases, analyze_phases(graph, M));
  partition.whole_step_times = true;
  partition.once_per_step = [&phases](NodeId id) { return phases.node_phase[id] == Phase::kStep; };
  if (options.schedule == Schedule::kGPipe) partition.in_flight.assign(static_cast<size_t>(P), M);
  // ZB-H1 keeps what a W half reads up to P micro-batches on every stage.
  if (options.schedule == Schedule::kZeroBubbleH1)
    partition.in_flight.assign(static_cast<size_t>(P), std::min(P, M));
  partition.manual_boundaries = options.stage_boundaries;
  return partition_stages(graph, P * chunks, partition);
}

PipelineOptions lowering_options(const PipelineCompileOptions &options, int chunks) {
  PipelineOptions lowering;
  lowering.stages = options.stages;
  lowering.microbatches = options.microbatches;
  lowering.data_parallel = options.data_parallel;
  lowering.zero = options.zero;
  lowering.prefetch = options.prefetch;
  lowering.bucket_bytes = options.bucket_bytes;
  lowering.schedule = options.schedule;
  lowering.chunks = chunks;
  return lowering;
}

// One collective a data-parallel group runs in a step: its kind and bytes.
struct GroupCollective {
  Collective kind = Collective::kAllReduce;
  double bytes = 0;
};

// What group `g` reduces in a step, as its first member's `program` says:
// all-reduces and reduce-scatters, one tensor or one bucket each. (Its
// all-gathers are the ring whatever the algorithm.)
std::vector<GroupCollective>
group_collectives(const Graph &graph, const serialization::PlanProgram &program, size_t g) {
  std::vector<GroupCollective> out;
  for (const auto &instr : program.instructions) {
    const std::vector<TensorId> reduced = reduced_tensors(program, instr);
    if (reduced.empty() || instr.peer != static_cast<int32_t>(g)) continue;
    double bytes = 0;
    for (TensorId t : reduced)
      bytes += static_cast<double>(graph.tensor(t).type.size_bytes());
    const bool scatter = instr.kind == serialization::InstrKind::kReduceScatter ||
                         (instr.kind == serialization::InstrKind::kStartBucket &&
                          program.buckets[instr.index].reduce_scatter);
    out.push_back({scatter ? Collective::kReduceScatter : Collective::kAllReduce, bytes});
  }
  return out;
}

// Algorithms that add every element in the same order give the same bits:
// recursive doubling and Rabenseifner (and their recursive-halving
// reduce-scatter) add along the same tree; the ring and the tree each have
// their own order (runtime/comm/collectives.h).
int same_bits_class(CollectiveAlgorithm algorithm) {
  switch (algorithm) {
  case CollectiveAlgorithm::kRing: return 0;
  case CollectiveAlgorithm::kTree: return 1;
  case CollectiveAlgorithm::kRecursiveDoubling:
  case CollectiveAlgorithm::kRabenseifner: return 2;
  }
  return 0;
}
constexpr int kSameBitsClasses = 3;

// The class every data-parallel group of the plan draws from: the one whose
// cheapest member prices lowest, summed over every collective of every group
// (ties go to the ring, then the tree). Each collective is priced as an
// all-reduce of its bytes, so a ZeRO-1 plan (reduce-scatters) and the plain
// one pick the same class, and as a sum over collectives, so every pipeline
// depth (the same collectives over other groups) picks the same class: the
// sums then associate the same way in all of them, and give the same bits.
int choose_same_bits_class(const std::vector<std::vector<GroupCollective>> &reduced,
                           const std::vector<std::vector<int32_t>> &groups,
                           const ClusterSpec &cluster, double gamma) {
  int chosen = 0;
  double best = std::numeric_limits<double>::infinity();
  for (int c = 0; c < kSameBitsClasses; ++c) {
    double total = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      const std::vector<int> members(groups[g].begin(), groups[g].end());
      const LinkSpec &link = link_for_group(cluster, members);
      const int p = static_cast<int>(members.size());
      for (const GroupCollective &collective : reduced[g]) {
        double cheapest = std::numeric_limits<double>::infinity();
        for (CollectiveAlgorithm algorithm : kAllCollectiveAlgorithms)
          if (same_bits_class(algorithm) == c)
            cheapest =
                std::min(cheapest, group_collective_time(Collective::kAllReduce, collective.bytes,
                                                         p, link, algorithm, gamma));
        total += cheapest;
      }
    }
    if (total < best) {
      best = total;
      chosen = c;
    }
  }
  return chosen;
}

// Each data-parallel group reduces with the algorithm the cost model prices
// lowest for what it runs in a step (its group size, its link, the bytes of
// each of its all-reduces and reduce-scatters), among the algorithms of the
// plan's same-bits class (choose_same_bits_class): recursive doubling for a
// group of small tensors, Rabenseifner for one of large ones. "" for the
// tensor-parallel groups from `tp_groups_begin` on (the communicator's own),
// and no list at all when every entry would be "".
std::vector<std::string> choose_algorithms(const Graph &graph,
                                           const std::vector<serialization::PlanProgram> &programs,
                                           const std::vector<std::vector<int32_t>> &groups,
                                           const ClusterSpec &cluster, int32_t tp_groups_begin) {
  const double gamma = reduce_bytes_per_second(cluster.device, DType::kF32);
  // Tensor-parallel groups use the communicator's own collectives.
  const size_t data_parallel_groups =
      tp_groups_begin >= 0 ? std::min(groups.size(), static_cast<size_t>(tp_groups_begin))
                           : groups.size();
  const std::vector<std::vector<int32_t>> dp_groups(groups.begin(),
                                                    groups.begin() + data_parallel_groups);
  std::vector<std::vector<GroupCollective>> reduced(dp_groups.size());
  for (size_t g = 0; g < dp_groups.size(); ++g)
    reduced[g] = group_collectives(graph, programs[static_cast<size_t>(dp_groups[g].front())], g);
  const int same_bits = choose_same_bits_class(reduced, dp_groups, cluster, gamma);
  std::vector<std::string> algorithms;
  for (size_t g = 0; g < dp_groups.size(); ++g) {
    const std::vector<int> members(dp_groups[g].begin(), dp_groups[g].end());
    const LinkSpec &link = link_for_group(cluster, members);
    const int p = static_cast<int>(members.size());
    CollectiveAlgorithm chosen = CollectiveAlgorithm::kRing;
    double best = std::numeric_limits<double>::infinity();
    for (CollectiveAlgorithm algorithm : kAllCollectiveAlgorithms) {
      if (same_bits_class(algorithm) != same_bits) continue;
      double time = 0;
      for (const GroupCollective &collective : reduced[g])
        time += group_collective_time(collective.kind, collective.bytes, p, link, algorithm, gamma);
      if (time < best) {
        best = time;
        chosen = algorithm;
      }
    }
    algorithms.emplace_back(collective_algorithm_name(chosen));
  }
  if (algorithms.empty()) return algorithms;
  algorithms.resize(groups.size()); // "" for the tensor-parallel groups
  return algorithms;
}

// ZeRO that shards nothing is a plain data-parallel plan; say why. ZeRO-1
// shards optimizer state; ZeRO-2 gradients too (with plain SGD, only those).
Status check_zero_shards(const PipelineCompileOptions &options,
                         const std::vector<serialization::PlanProgram> &programs) {
  if (options.zero < 1) return Status::ok();
  bool sharded = false, gathered = false;
  for (const auto &program : programs) {
    sharded = sharded || !program.sharded_holds.empty();
    for (const auto &instr : program.instructions) {
      sharded = sharded || instr.kind == serialization::InstrKind::kReduceScatterAccumulate;
      gathered = gathered || serialization::fills_gathered(instr.kind);
    }
  }
  if (sharded && options.zero == 3 && !gathered)
    return invalid_argument("--zero 3: no parameter can be held as shards (each needs a sharded "
                            "update, one stage holding it, and no once-per-step reader but "
                            "that update); --zero 2 shards the rest alike");
  if (!sharded)
    return invalid_argument(
        "--zero ", options.zero,
        ": no optimizer update can run on shards (each needs a gradient only it "
        "reads, and a size the ",
        options.data_parallel, " replicas divide",
        options.tensor_parallel > 1 ? str_cat("; with clip=... and tensor parallelism ZeRO-",
                                              options.zero, " does not shard yet")
                                    : "",
        ")");
  return Status::ok();
}

// The stage search weighed each stage alone; a device of the interleaved
// schedule holds several. Its lowered program is exact: its arena and
// everything it holds.
Status check_device_memory(const serialization::Plan &plan, const ClusterSpec &cluster,
                           int chunks) {
  for (size_t d = 0; d < plan.programs.size(); ++d)
    if (const int64_t bytes = plan::device_memory(plan, d); bytes > cluster.device.memory_bytes)
      return invalid_argument(
          "device ", d, chunks > 1 ? str_cat(" (", chunks, " chunks)") : std::string(), " needs ",
          human_bytes(static_cast<double>(bytes)),
          " (activations, weights and optimizer state); cluster '", cluster.name,
          "' gives each device ", human_bytes(static_cast<double>(cluster.device.memory_bytes)),
          chunks > 2 ? " (fewer --chunks or more stages)" : " (more stages, or --schedule 1f1b)");
  return Status::ok();
}

// The interleaved schedule runs a device's chunks' backwards in reverse
// order, so an activation that crosses a virtual stage must not be
// recomputed: its clone would flow from the earlier chunk's backward, which
// runs after the later one's. Recomputes `plain` again with every such
// activation kept (the stage's input, as Megatron-LM keeps it), and places
// the result on the same stages. Node ids change: --profile's times follow
// the nodes by name.
Status keep_stage_inputs(const Graph &plain, const StageAssignment &stages,
                         const ClusterSpec &cluster, Graph &graph, TrainingStages &placed,
                         std::vector<double> &measured) {
  ASSIGN_OR_RETURN(const TrainingStages plain_placed, assign_training_nodes(plain, stages));
  const std::vector<bool> forward = passes::forward_part(plain);
  std::vector<bool> keep(plain.num_tensors(), false);
  for (NodeId id = 0; id < plain.num_nodes(); ++id)
    for (TensorId in : plain.node(id).inputs) {
      const NodeId producer = plain.tensor(in).producer;
      if (producer != kNoNode && forward[producer] &&
          plain_placed.node_stage[producer] != plain_placed.node_stage[id])
        keep[in] = true;
    }
  auto recomputed = passes::recompute_activations(plain, nullptr, &keep);
  if (!recomputed.is_ok()) return recomputed.status().with_context("--recompute");
  std::map<std::string, double> seconds;
  for (NodeId id = 0; id < measured.size(); ++id)
    seconds[graph.node(id).name] = measured[id];
  graph = std::move(recomputed).value();
  ASSIGN_OR_RETURN(placed, assign_training_nodes(graph, stages));
  if (measured.empty()) return Status::ok();
  measured.clear();
  for (NodeId id = 0; id < graph.num_nodes(); ++id) {
    auto it = seconds.find(graph.node(id).name);
    measured.push_back(it != seconds.end() ? it->second : node_seconds(graph, id, cluster));
  }
  return Status::ok();
}

} // namespace

Result<serialization::Plan> compile_pipeline(const Graph &forward,
                                             const passes::TrainingOptions &training,
                                             const PipelineCompileOptions &options) {
  RETURN_IF_ERROR(check_compile_options(options));
  const int P = options.stages, M = options.microbatches, DP = options.data_parallel,
            TP = options.tensor_parallel;
  const bool interleaved = options.schedule == Schedule::kInterleaved;
  const int chunks = interleaved ? options.chunks : 1;
  const int devices = P * DP * TP;
  const ClusterSpec cluster = options.cluster ? *options.cluster : default_cpu_cluster(devices);
  if (cluster.num_devices() < devices)
    return invalid_argument("cluster '", cluster.name, "' has ", cluster.num_devices(),
                            " devices; ", DP, " replica(s) of a ", P, "-stage pipeline",
                            TP > 1 ? str_cat(" over ", TP, "-device tensor-parallel groups") : "",
                            " need ", devices);

  if (options.profile && TP > 1)
    return unimplemented("--profile times each node on this machine as one device; a ", TP,
                         "-device tensor-parallel plan's nodes meet their group (Tp* collectives, "
                         "pieces), which one device cannot run: leave --profile out and the cost "
                         "model prices them");
  ASSIGN_OR_RETURN(TrainingGraph built, build_training_graph(forward, training, options, cluster));
  Graph &graph = built.graph;
  std::vector<serialization::PlanShard> &shards = built.shards;

  ASSIGN_OR_RETURN(std::vector<double> measured, profile_nodes(options, graph));
  ASSIGN_OR_RETURN(StageAssignment stages,
                   find_stages(graph, training, options, cluster, measured, chunks));
  ASSIGN_OR_RETURN(TrainingStages placed, assign_training_nodes(graph, stages));
  if (interleaved && options.recompute)
    RETURN_IF_ERROR(
        keep_stage_inputs(built.before_recompute, stages, cluster, graph, placed, measured));
  // ZeRO with clipping under tensor parallelism is refused below (nothing
  // shards): the pieces' squares are summed over the group first.
  const bool zero_clip = options.zero >= 1 && DP > 1 && TP == 1;
  RETURN_IF_ERROR(split_clip_norm(graph, placed.node_stage, TP > 1 || zero_clip));
  if (TP > 1) RETURN_IF_ERROR(split_clip_norm_over_pieces(graph, placed.node_stage, TP, shards));
  if (zero_clip) RETURN_IF_ERROR(split_clip_norm_over_shards(graph, placed.node_stage, DP));
  // Costs of the graph as it now is (the split added nodes, which the profile
  // did not time: they get their roofline time).
  SimulationCosts costs = cluster_costs(graph, cluster);
  if (!measured.empty()) {
    for (NodeId id = static_cast<NodeId>(measured.size()); id < graph.num_nodes(); ++id)
      measured.push_back(node_seconds(graph, id, cluster));
    costs.compute = [&measured](NodeId id) { return measured[id]; };
  }

  const PipelineOptions lowering = lowering_options(options, chunks);
  auto groups = pipeline_groups(lowering);
  ASSIGN_OR_RETURN(std::vector<serialization::PlanProgram> programs,
                   lower_pipeline(graph, placed.node_stage, lowering));
  const int32_t tp_groups_begin = TP > 1 ? expand_tensor_parallel(TP, programs, groups) : -1;
  const std::vector<std::string> algorithms =
      choose_algorithms(graph, programs, groups, cluster, tp_groups_begin);
  RETURN_IF_ERROR(check_zero_shards(options, programs));
  price_with_algorithms(costs, cluster, groups, algorithms);

  RETURN_IF_ERROR(check_deadlock(graph, programs, groups).with_context("check-deadlock"));
  ASSIGN_OR_RETURN(Simulation sim, simulate_pipeline(graph, programs, costs, groups));

  serialization::Plan plan;
  plan.mode = serialization::Plan::Mode::kTrain;
  plan.loss = "loss";
  plan.loss_kind = training.loss;
  plan.optimizer = training.optimizer.to_string();
  for (int d = 0; d < devices; ++d)
    plan.devices.push_back({static_cast<uint32_t>(d), "cpu"});
  for (size_t d = 0; d < programs.size(); ++d)
    programs[d].predicted_busy_s = sim.busy[d];
  serialization::PlanPipeline pipeline;
  pipeline.stages = P;
  pipeline.microbatches = M;
  pipeline.data_parallel = DP;
  pipeline.zero = options.zero;
  for (const auto &program : programs)
    if (!program.buckets.empty()) pipeline.bucket_bytes = options.bucket_bytes;
  pipeline.tensor_parallel = TP;
  pipeline.tp_groups_begin = tp_groups_begin;
  pipeline.shards = std::move(shards);
  pipeline.groups = groups;
  pipeline.group_algorithms = algorithms;
  pipeline.schedule = std::string(schedule_name(options.schedule));
  pipeline.chunks = chunks;
  pipeline.node_stage.assign(placed.node_stage.begin(), placed.node_stage.end());
  pipeline.boundaries = stages.boundaries;
  pipeline.cluster_json = cluster_to_json(cluster);
  pipeline.predicted_step_s = sim.step_time;
  pipeline.predicted_bubble = sim.bubble;
  plan.programs = std::move(programs);
  plan.pipeline = std::move(pipeline);
  plan.graph = std::move(graph);
  // The schedules whose memory the stage search only approximates.
  if ((interleaved || options.schedule == Schedule::kZeroBubbleH1) && options.check_memory &&
      cluster.device.memory_bytes > 0)
    RETURN_IF_ERROR(check_device_memory(plan, cluster, chunks));
  // What every runner checks on load: a plan the compiler writes passes.
  RETURN_IF_ERROR(plan::verify_plan(plan).with_context("verify-plan"));
  return plan;
}

} // namespace strata::partitioner
