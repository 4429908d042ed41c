#include "partitioner/search/auto_plan.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "ops/registry.h"
#include "partitioner/cost/cost_model.h"
#include "partitioner/search/stage_partition.h"
#include "partitioner/search/tensor_parallel.h"
#include "passes/recompute.h"
#include "passes/split_batch.h"
#include "plan/memory.h"
#include "plan/phases.h"

namespace strata::partitioner {

using plan::reduced_tensors;

namespace {

std::string bytes_text(double bytes) {
  char text[48];
  if (bytes >= 1024.0 * 1024.0 * 1024.0)
    std::snprintf(text, sizeof text, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  else if (bytes >= 1024.0 * 1024.0)
    std::snprintf(text, sizeof text, "%.2f MiB", bytes / (1024.0 * 1024.0));
  else
    std::snprintf(text, sizeof text, "%.1f KiB", bytes / 1024.0);
  return text;
}

std::string ms_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f ms", seconds * 1e3);
  return text;
}

std::string percent_text(double fraction) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f%%", fraction * 100);
  return text;
}

// Bytes moved per step: sends and collectives of every device (tensor-parallel
// ones are nodes of the graph).
double comm_bytes(const serialization::Plan &plan) {
  double bytes = 0;
  for (const auto &program : plan.programs)
    for (const auto &instr : program.instructions)
      if (instr.kind == serialization::InstrKind::kCompute) {
        const Node &node = plan.graph.node(instr.index);
        const ops::Collective collective = ops::collective_of(node.op);
        if (ops::communicates_forward(collective)) {
          // The whole tensor: a reduce-scatter's input, the others' output.
          const TensorId whole = ops::whole_is_input(collective) ? node.inputs[0] : node.outputs[0];
          bytes += static_cast<double>(plan.graph.tensor(whole).type.size_bytes());
        }
      } else if (instr.kind == serialization::InstrKind::kSend ||
                 instr.kind == serialization::InstrKind::kAllGather) {
        bytes += static_cast<double>(plan.graph.tensor(instr.index).type.size_bytes());
      } else {
        for (TensorId t : reduced_tensors(program, instr))
          bytes += static_cast<double>(plan.graph.tensor(t).type.size_bytes());
      }
  return bytes;
}

// The estimate of a candidate (see auto_plan.h), for every ZeRO setting at once.
struct Estimate {
  double step_s = 0, bubble = 0, comm_bytes = 0;
  // What ZB-H1 saves of step_s: the pipeline's fill and drain shrink from
  // (P-1)(F+B+W) to (P-1)(F+B-W) (Qi et al. 2024).
  double zero_bubble_saving_s = 0;
  // What ZeRO-1 changes in the step: the parameters' all-gathers (one per
  // parameter, after the update) less the updates' (DP - 1) / DP it saves;
  // ZeRO-2 that and M blocking reduce-scatters of a stage's gradients;
  // ZeRO-3 that and two gathers of the parameters per micro-batch (forward
  // and backward) in place of the one after the update, less what the
  // stage's compute hides of them (they are prefetched).
  double zero_delta_s[4] = {0, 0, 0, 0};
  int64_t memory[4] = {0, 0, 0, 0}; // ZeRO 0, 1, 2, 3
  // The same under ZB-H1, which keeps what a W half reads for up to P
  // micro-batches on every stage (counted as whole activations).
  int64_t zero_bubble_memory[4] = {0, 0, 0, 0};
};

// What the estimates take from one training graph per tensor-parallel degree
// (its structure, not its sizes, matters): the forward tensors the backward
// pass reads (what a stage keeps per micro-batch in flight), and how much
// longer backward takes than forward.
struct Structure {
  std::set<std::string> saved;
  std::set<std::string> forward; // every forward tensor of that graph
  double backward_factor = 2.0;
  // The share of a micro-batch's forward and backward time that ZB-H1's W
  // halves take: the backward nodes only the optimizer step reads (the
  // weight-gradient products).
  double weight_share = 0;
};

Result<Structure> training_structure(const Graph &local, const passes::TrainingOptions &training,
                                     const std::function<double(const Graph &, NodeId)> &time,
                                     bool recompute) {
  ASSIGN_OR_RETURN(Graph graph, passes::make_training_graph_from_loss(local, training));
  if (recompute) {
    ASSIGN_OR_RETURN(graph, passes::recompute_activations(graph));
  }
  Structure s;
  double forward = 0, backward = 0, weight = 0;
  ASSIGN_OR_RETURN(plan::StepPhases phases, plan::analyze_phases(graph, 1));
  const auto consumers = graph.consumers();
  // A node whose every output only the step reads (a weight gradient's
  // producer), or only such nodes read (what feeds it alone: the bias's sum,
  // a reshape of the output gradient). One level only: below, the input
  // gradients of the whole graph lead only to weight gradients too, but a
  // stage's are what the stage before waits for.
  auto reads_only = [&](NodeId id, auto &&reader_ok) {
    for (TensorId out : graph.node(id).outputs)
      for (NodeId c : consumers[out])
        if (!reader_ok(c)) return false;
    return true;
  };
  auto step = [&](NodeId c) { return phases.node_phase[c] == plan::Phase::kStep; };
  auto weight_half = [&](NodeId id) {
    return reads_only(id, step) || reads_only(id, [&](NodeId c) {
             return phases.node_phase[c] == plan::Phase::kBackward && reads_only(c, step);
           });
  };
  for (NodeId id = 0; id < graph.num_nodes(); ++id) {
    const Node &node = graph.node(id);
    if (local.find_node(node.name)) {
      forward += time(graph, id);
      for (TensorId out : node.outputs)
        s.forward.insert(graph.tensor(out).name);
      continue;
    }
    // Backward: everything but the loss and the optimizer.
    const ops::OpDef *def = ops::OpRegistry::global().find(node.op);
    if ((node.name.find(".grad") != std::string::npos ||
         node.name.ends_with(passes::kRecomputeSuffix)) &&
        def && !def->once_per_step) {
      const double t = time(graph, id);
      backward += t;
      if (phases.node_phase[id] == plan::Phase::kBackward && weight_half(id)) weight += t;
    }
    for (TensorId in : node.inputs) {
      const Tensor &t = graph.tensor(in);
      if (t.kind == TensorKind::kIntermediate && local.find_tensor(t.name)) s.saved.insert(t.name);
    }
  }
  if (forward > 0 && backward > 0) s.backward_factor = backward / forward;
  if (forward + backward > 0) s.weight_share = weight / (forward + backward);
  return s;
}

// What the estimates reuse: the local forward graph per (micro-batches x
// replicas, TP) and the training structure per TP.
struct EstimateCache {
  std::map<std::pair<int64_t, int>, Graph> local;
  std::map<std::pair<int, bool>, Structure> structure; // per (TP, recompute)
};

Result<Estimate> estimate(const Graph &forward, const passes::TrainingOptions &training,
                          const ClusterSpec &cluster, int dp, int tp, int pp, int M,
                          bool mixed_precision, bool recompute, int64_t bucket_bytes,
                          EstimateCache &cache) {
  DeviceSpec device = cluster.device;
  if (mixed_precision) device.peak_flops.f32 = device.peak_flops.bf16;
  const double activation_scale = mixed_precision ? 0.5 : 1.0;
  auto members = [](int count, int stride) {
    std::vector<int> m;
    for (int k = 0; k < count; ++k)
      m.push_back(k * stride);
    return m;
  };
  const LinkSpec tp_link = link_for_group(cluster, members(tp, 1));
  const double gamma = reduce_bytes_per_second(device, DType::kF32);
  const auto key = std::make_pair(int64_t{M} * dp, tp);
  if (!cache.local.contains(key)) {
    ASSIGN_OR_RETURN(Graph split, passes::split_batch(forward, int64_t{M} * dp));
    // With its loss: tensor parallelism may split it (vocabulary-parallel).
    ASSIGN_OR_RETURN(Graph micro, passes::add_loss(split, training));
    if (tp > 1) {
      TensorParallelOptions options;
      options.parts = tp;
      options.device = device;
      options.link = tp_link;
      ASSIGN_OR_RETURN(TensorParallelResult sharded, shard_tensor_parallel(micro, options));
      micro = std::move(sharded.local);
    }
    cache.local.emplace(key, std::move(micro));
  }
  const Graph &micro = cache.local.at(key);
  std::function<double(const Graph &, NodeId)> time = [&](const Graph &g, NodeId id) {
    // A collective, forward or backward: the stage search multiplies item
    // times by 3 (forward, and twice that backward).
    const TensorParallelTime comm = tensor_parallel_time(g, id, cluster);
    if (comm.forward + comm.backward > 0) return (comm.forward + comm.backward) / 3;
    return node_time(g, id, device);
  };
  const auto structure_key = std::make_pair(tp, recompute);
  if (!cache.structure.contains(structure_key)) {
    ASSIGN_OR_RETURN(cache.structure[structure_key],
                     training_structure(micro, training, time, recompute));
  }
  const Structure &structure = cache.structure.at(structure_key);
  const std::set<std::string> &kept = structure.saved;
  StagePartitionOptions partition;
  partition.node_time = time;
  partition.backward_factor = structure.backward_factor;
  const LinkSpec &link = link_between(cluster, 0, pp > 1 ? dp * tp : 0);
  partition.link_bandwidth = link.bandwidth_Bps > 0 ? link.bandwidth_Bps : 1e12;
  partition.link_latency = link.latency_s;
  partition.training = true;
  partition.parameter_state_factor = parameter_state_factor(training.optimizer, 0, dp);
  partition.microbatches = M;
  partition.narrowest_only = true;
  // Another micro-batch size may choose other splits (other Tp* nodes): what
  // the structure does not know counts as kept.
  partition.kept = [&kept, &structure](const Graph &g, TensorId id) {
    const std::string &name = g.tensor(id).name;
    return kept.contains(name) || !structure.forward.contains(name);
  };
  ASSIGN_OR_RETURN(StageAssignment stages, partition_stages(micro, pp, partition));
  Estimate e;
  double sum = 0, slowest = 0, reduce = 0, update = 0, busy = 0;
  const LinkSpec dp_link = link_for_group(cluster, members(dp, tp));
  const double bandwidth = device.memory_bandwidth * device.memory_efficiency;
  const double touched =
      parameter_state_factor(training.optimizer, 0, 1) * 2 - 1; // read all, write but g
  // Per stage: the gradients' collectives and the optimizer updates (memory
  // bound, one launch each). Without buckets the runtime reduces one parameter
  // at a time after backward; with them, in buckets of about bucket_bytes
  // started during the last micro-batch's backward, so only what outlasts that
  // backward shows, and at least the last bucket (the first layers').
  const size_t num_stages = stages.stages.size();
  std::vector<double> stage_reduce(num_stages, 0), stage_update(num_stages, 0),
      stage_grad_bytes(num_stages, 0);
  for (TensorId id = 0; id < micro.num_tensors(); ++id) {
    const int s = stages.tensor_stage[id];
    if (s < 0 || micro.tensor(id).kind != TensorKind::kParameter) continue;
    const auto bytes = static_cast<double>(micro.tensor(id).type.size_bytes());
    stage_grad_bytes[static_cast<size_t>(s)] += bytes;
    if (dp > 1 && bucket_bytes <= 0)
      stage_reduce[static_cast<size_t>(s)] +=
          all_reduce_time(bytes, dp, dp_link, CollectiveAlgorithm::kRing, gamma);
    stage_update[static_cast<size_t>(s)] +=
        device.launch_overhead_s + (bandwidth > 0 ? bytes * touched / bandwidth : 0.0);
  }
  if (dp > 1 && bucket_bytes > 0)
    for (size_t k = 0; k < num_stages; ++k) {
      const double bytes = stage_grad_bytes[k];
      if (bytes <= 0) continue;
      const double buckets = std::ceil(bytes / static_cast<double>(bucket_bytes));
      const double one =
          all_reduce_time(bytes / buckets, dp, dp_link, CollectiveAlgorithm::kRing, gamma);
      const double backward = stages.stages[k].compute_time * structure.backward_factor /
                              (1 + structure.backward_factor);
      stage_reduce[k] = std::max(one, buckets * one - backward);
    }
  for (size_t k = 0; k < num_stages; ++k) {
    const StageInfo &stage = stages.stages[k];
    sum += stage.time;
    slowest = std::max(slowest, stage.time);
    busy += M * stage.compute_time;
    reduce = std::max(reduce, stage_reduce[k]);
    update = std::max(update, stage_update[k]);
    e.comm_bytes += 2.0 * stage.activation_bytes * M * dp * tp; // rough: activations both ways
    e.comm_bytes += dp > 1 ? stage.parameter_bytes * dp * tp : 0;
    for (int zero : {0, 1, 2, 3}) {
      const double state =
          stage.parameter_bytes * parameter_state_factor(training.optimizer, zero, dp);
      const double activations = stage.activation_bytes * activation_scale;
      e.memory[zero] =
          std::max(e.memory[zero], static_cast<int64_t>(state + stage.in_flight * activations));
      e.zero_bubble_memory[zero] = std::max(
          e.zero_bubble_memory[zero],
          static_cast<int64_t>(state + std::max(stage.in_flight, std::min(pp, M)) * activations));
    }
  }
  if (dp > 1) {
    std::vector<double> gather(num_stages, 0), scatter(num_stages, 0);
    for (TensorId id = 0; id < micro.num_tensors(); ++id) {
      const int s = stages.tensor_stage[id];
      if (s < 0 || micro.tensor(id).kind != TensorKind::kParameter) continue;
      const auto bytes = static_cast<double>(micro.tensor(id).type.size_bytes());
      gather[static_cast<size_t>(s)] +=
          all_gather_time(bytes, dp, dp_link, CollectiveAlgorithm::kRing);
      scatter[static_cast<size_t>(s)] +=
          reduce_scatter_time(bytes, dp, dp_link, CollectiveAlgorithm::kRing, gamma);
    }
    e.zero_delta_s[1] = *std::max_element(gather.begin(), gather.end()) - update * (dp - 1) / dp;
    e.zero_delta_s[2] = e.zero_delta_s[1] + M * *std::max_element(scatter.begin(), scatter.end());
    // The gathers run on the communication stream one layer ahead of their
    // readers (prefetch): what the stage's compute does not cover is exposed.
    double exposed = 0;
    for (size_t k = 0; k < num_stages; ++k)
      exposed = std::max(exposed, (2 * M - 1) * gather[k] - M * stages.stages[k].compute_time);
    e.zero_delta_s[3] = e.zero_delta_s[2] + std::max(0.0, exposed);
  }
  const double pipe = sum + (M - 1) * slowest;
  e.step_s = pipe + reduce + update;
  // ZB-H1's saving, (P-1) 2W with P-1 or more micro-batches to put off (only
  // M with fewer), and never more than the idle time.
  if (pp > 1 && M > 1)
    e.zero_bubble_saving_s =
        std::min((sum - slowest) * 2 * structure.weight_share * std::min(1.0, M / (pp - 1.0)),
                 std::max(0.0, pipe - busy / pp));
  e.bubble = e.step_s > 0 ? std::max(0.0, 1 - busy / (pp * e.step_s)) : 0;
  return e;
}

// How compile_pipeline builds candidate `c`.
PipelineCompileOptions compile_options(const AutoCandidate &c, const AutoOptions &options) {
  PipelineCompileOptions compile;
  compile.zero = c.zero;
  compile.recompute = c.recompute;
  compile.stages = c.stages;
  compile.data_parallel = c.data_parallel;
  compile.tensor_parallel = c.tensor_parallel;
  compile.microbatches = c.microbatches;
  compile.schedule = c.schedule;
  compile.chunks = c.chunks;
  compile.cluster = options.cluster;
  compile.check_memory = false; // the search checks memory over the whole device
  compile.profile = options.profile;
  compile.bucket_bytes = options.bucket_bytes;
  return compile;
}

// The micro-batch counts tried for a replica's batch of `local`: the powers of
// two that divide it, up to `max`, and `local` itself when it is at most `max`.
std::vector<int> microbatch_counts(int64_t local, int max) {
  std::vector<int> microbatches;
  for (int64_t m = 1; m <= std::min<int64_t>(local, max); m *= 2)
    if (local % m == 0) microbatches.push_back(static_cast<int>(m));
  if (local <= max &&
      std::find(microbatches.begin(), microbatches.end(), local) == microbatches.end())
    microbatches.push_back(static_cast<int>(local));
  return microbatches;
}

// The candidates of one --auto search, in the order they are tried, and each
// compiled one's plan at the same index (an empty plan for the others).
class CandidateSearch {
public:
  CandidateSearch(const Graph &forward, const passes::TrainingOptions &training,
                  const AutoOptions &options)
      : forward_(forward), training_(training), options_(options),
        capacity_(options.cluster.device.memory_bytes) {}

  // Every mesh of N devices (tensor parallelism within a node, data
  // parallelism dividing the batch), with every micro-batch count, ZeRO,
  // schedule and recomputation worth trying; above exact_devices estimated,
  // else compiled.
  void run(int N, int64_t batch);
  // Fitting candidates by step, memory, micro-batches; then the rest by
  // memory. Their plans move with them.
  void sort();
  std::vector<AutoCandidate> take_candidates() { return std::move(candidates_); }
  serialization::Plan take_plan(size_t i) { return std::move(plans_[i]); }
  bool empty() const { return candidates_.empty(); }

private:
  void add_estimated(int dp, int tp, int pp, int M, std::vector<int> zeros);
  void add_compiled(int dp, int tp, int pp, int M, const std::vector<int> &zeros);

  const Graph &forward_;
  const passes::TrainingOptions &training_;
  const AutoOptions &options_;
  const int64_t capacity_;
  EstimateCache cache_;
  std::vector<AutoCandidate> candidates_;
  std::vector<serialization::Plan> plans_;
};

void CandidateSearch::run(int N, int64_t batch) {
  const bool estimating = N > options_.exact_devices;
  const int per_node = std::max(1, options_.cluster.devices_per_node);
  for (int tp = 1; tp <= std::min(N, per_node); tp *= 2)
    for (int dp = 1; dp <= N / tp; ++dp) {
      if (N % (dp * tp) != 0 || batch % dp != 0) continue;
      const int pp = N / (dp * tp);
      for (int M : microbatch_counts(batch / dp, options_.max_microbatches)) {
        std::vector<int> zeros = {0};
        if (dp > 1) zeros.insert(zeros.end(), {1, 2, 3});
        if (estimating)
          add_estimated(dp, tp, pp, M, std::move(zeros));
        else
          add_compiled(dp, tp, pp, M, zeros);
      }
    }
}

void CandidateSearch::add_estimated(int dp, int tp, int pp, int M, std::vector<int> zeros) {
  // With tensor parallelism ZeRO does not shard updates that read clipped
  // gradients.
  if (training_.optimizer.clip_norm > 0 && tp > 1) zeros = {0};
  // Recomputation only ever costs time: tried when a plan without it
  // does not fit.
  // ZB-H1 where there is a pipeline to fill: a shorter fill and drain, up to
  // P micro-batches of activations on every stage.
  std::vector<Schedule> schedules = {Schedule::k1F1B};
  if (pp > 1 && M > 1) schedules.push_back(Schedule::kZeroBubbleH1);
  for (bool recompute : {false, true}) {
    auto e = estimate(forward_, training_, options_.cluster, dp, tp, pp, M,
                      options_.mixed_precision, recompute, options_.bucket_bytes, cache_);
    bool all_fit = true;
    for (int zero : zeros)
      for (Schedule schedule : schedules) {
        AutoCandidate c{dp, tp, pp, M, schedule, zero, recompute};
        c.estimated = true;
        if (!e.is_ok()) {
          c.error = e.status().message();
        } else {
          const double saving = schedule == Schedule::kZeroBubbleH1 ? e->zero_bubble_saving_s : 0;
          c.step_s = e->step_s + e->zero_delta_s[zero] - saving;
          c.bubble = std::max(0.0, 1 - (1 - e->bubble) * e->step_s / (e->step_s - saving));
          c.memory =
              schedule == Schedule::kZeroBubbleH1 ? e->zero_bubble_memory[zero] : e->memory[zero];
          c.comm_bytes = e->comm_bytes;
          c.fits = capacity_ <= 0 || c.memory <= capacity_;
        }
        all_fit = all_fit && (c.fits || !c.error.empty());
        candidates_.push_back(std::move(c));
        plans_.emplace_back();
      }
    if (all_fit) break;
  }
}

void CandidateSearch::add_compiled(int dp, int tp, int pp, int M, const std::vector<int> &zeros) {
  // With one stage or one micro-batch GPipe and ZB-H1 are 1F1B's program.
  // Interleaved (two chunks per device) with micro-batches a multiple of the
  // stages, with tensor parallelism and recomputation too.
  std::vector<Schedule> schedules = {Schedule::k1F1B};
  if (pp > 1 && M > 1)
    schedules.insert(schedules.end(), {Schedule::kGPipe, Schedule::kZeroBubbleH1});
  if (pp > 1 && M % pp == 0) schedules.push_back(Schedule::kInterleaved);
  for (int zero : zeros)
    for (Schedule schedule : schedules)
      for (bool recompute : {false, true}) {
        AutoCandidate c{dp, tp, pp, M, schedule, zero, recompute};
        if (schedule == Schedule::kInterleaved) c.chunks = 2;
        auto plan = compile_pipeline(forward_, training_, compile_options(c, options_));
        if (!plan.is_ok()) {
          c.error = plan.status().message();
          candidates_.push_back(std::move(c));
          plans_.emplace_back();
          break;
        }
        c.step_s = plan->pipeline->predicted_step_s;
        c.bubble = plan->pipeline->predicted_bubble;
        for (size_t d = 0; d < plan->programs.size(); ++d)
          c.memory = std::max(c.memory, plan::device_memory(*plan, d));
        c.comm_bytes = comm_bytes(*plan);
        c.fits = capacity_ <= 0 || c.memory <= capacity_;
        const bool fits = c.fits;
        candidates_.push_back(std::move(c));
        plans_.push_back(std::move(plan).value());
        // Recomputation only ever costs time: tried when this does not fit.
        if (fits) break;
      }
}

void CandidateSearch::sort() {
  std::vector<size_t> order(candidates_.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  auto rank = [&](size_t i) {
    const AutoCandidate &c = candidates_[i];
    const int group = c.error.empty() ? (c.fits ? 0 : 1) : 2;
    return std::make_tuple(group, group == 0 ? c.step_s : static_cast<double>(c.memory), c.memory,
                           c.microbatches, i);
  };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return rank(a) < rank(b); });
  std::vector<AutoCandidate> sorted;
  std::vector<serialization::Plan> sorted_plans;
  for (size_t i : order) {
    sorted.push_back(candidates_[i]);
    sorted_plans.push_back(std::move(plans_[i]));
  }
  candidates_ = std::move(sorted);
  plans_ = std::move(sorted_plans);
}

// The estimate's winner, or the next fitting candidate that compiles, into
// result.plan; the candidates that do not compile get their error.
Status compile_estimated_winner(const Graph &forward, const passes::TrainingOptions &training,
                                const AutoOptions &options, AutoResult &result) {
  Status first_error = Status::ok();
  for (size_t i = 0; i < result.candidates.size() && !result.planned; ++i) {
    const AutoCandidate &c = result.candidates[i];
    if (!c.error.empty() || !c.fits) break;
    auto plan = compile_pipeline(forward, training, compile_options(c, options));
    if (!plan.is_ok()) {
      if (first_error.is_ok()) first_error = plan.status().with_context(c.label());
      result.candidates[i].error = plan.status().message();
      continue;
    }
    result.plan = std::move(plan).value();
    result.planned = true;
    result.winner = i;
  }
  if (!result.planned) return first_error.with_context("--auto: no fitting candidate compiles");
  return Status::ok();
}

// Why the winner won: against the runner-up that fits, else the best that
// does not.
std::string explain_choice(const AutoResult &result, int64_t capacity) {
  const AutoCandidate &chosen = result.candidates[result.winner];
  const AutoCandidate *other = nullptr;
  for (size_t i = 0; i < result.candidates.size() && other == nullptr; ++i)
    if (i != result.winner && result.candidates[i].error.empty()) other = &result.candidates[i];
  if (other == nullptr) return str_cat(chosen.label(), " is the only plan that compiles.");
  if (!other->fits)
    return str_cat(chosen.label(), " is the fastest plan that fits; ", other->label(), " needs ",
                   bytes_text(static_cast<double>(other->memory)), " per device, over the ",
                   bytes_text(static_cast<double>(capacity)), " there are.");
  return str_cat(chosen.label(), " wins: predicted step ", ms_text(chosen.step_s), " against ",
                 ms_text(other->step_s), " for the runner-up, ", other->label(), " (",
                 percent_text(other->step_s > 0 ? 1 - chosen.step_s / other->step_s : 0),
                 " faster); bubble ", percent_text(chosen.bubble), " against ",
                 percent_text(other->bubble), ", ", bytes_text(chosen.comm_bytes), " against ",
                 bytes_text(other->comm_bytes), " moved per step, ",
                 bytes_text(static_cast<double>(chosen.memory)), " against ",
                 bytes_text(static_cast<double>(other->memory)), " on the fullest device.");
}

} // namespace

std::string AutoCandidate::label() const {
  return str_cat("dp=", data_parallel, " tp=", tensor_parallel, " pp=", stages, " M=", microbatches,
                 " ", schedule_name(schedule), chunks > 1 ? str_cat(" x", chunks) : "",
                 zero ? str_cat(" zero", zero) : "", recompute ? " recompute" : "");
}

Result<AutoResult> auto_plan(const Graph &forward, const passes::TrainingOptions &training,
                             const AutoOptions &options) {
  const auto start = std::chrono::steady_clock::now();
  const int N = options.devices > 0 ? options.devices : options.cluster.num_devices();
  if (N < 1) return invalid_argument("--auto needs at least one device");
  if (N > options.cluster.num_devices())
    return invalid_argument("--devices ", N, ": cluster '", options.cluster.name, "' has only ",
                            options.cluster.num_devices());
  if (forward.inputs().empty() || forward.tensor(forward.inputs()[0]).type.rank() < 1)
    return invalid_argument("--auto splits the batch (dim 0 of the inputs); the model has none");
  const int64_t batch = forward.tensor(forward.inputs()[0]).type.shape[0];
  const auto capacity = options.cluster.device.memory_bytes;

  CandidateSearch search(forward, training, options);
  search.run(N, batch);
  if (search.empty())
    return invalid_argument("--auto: no way to split a batch of ", batch, " over ", N,
                            " devices (data parallelism needs the batch to divide)");
  search.sort();
  AutoResult result;
  result.candidates = search.take_candidates();
  result.search_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const AutoCandidate &best = result.candidates.front();
  if (!best.error.empty())
    return invalid_argument("--auto: no candidate plan compiles; ", best.label(), ": ", best.error);
  if (!best.fits)
    return failed_precondition(
        "--auto: no plan for ", N, " devices fits in ", bytes_text(static_cast<double>(capacity)),
        " per device; the smallest needs ", bytes_text(static_cast<double>(best.memory)), " (",
        best.label(), "). Use more devices, a smaller batch, or a device with more memory");
  result.winner = 0;
  if (!best.estimated) {
    result.plan = search.take_plan(0);
    result.planned = true;
  } else if (options.compile_winner) {
    RETURN_IF_ERROR(compile_estimated_winner(forward, training, options, result));
  }
  result.reason = explain_choice(result, capacity);
  return result;
}

} // namespace strata::partitioner
