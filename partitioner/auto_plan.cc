#include "partitioner/auto_plan.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace strata::partitioner {

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
        if (node.op == "TpAllReduce" || node.op == "TpAllGather")
          bytes += static_cast<double>(plan.graph.tensor(node.outputs[0]).type.size_bytes());
      } else if (instr.kind == serialization::InstrKind::kSend ||
                 instr.kind == serialization::InstrKind::kAllReduce ||
                 instr.kind == serialization::InstrKind::kReduceScatter ||
                 instr.kind == serialization::InstrKind::kAllGather)
        bytes += static_cast<double>(plan.graph.tensor(instr.index).type.size_bytes());
  return bytes;
}

} // namespace

std::string AutoCandidate::label() const {
  return str_cat("dp=", data_parallel, " tp=", tensor_parallel, " pp=", stages, " M=", microbatches,
                 " ", schedule_name(schedule), zero ? " zero1" : "");
}

int64_t device_memory(const serialization::Plan &plan, size_t device) {
  const auto &program = plan.programs[device];
  int64_t bytes = program.arena_bytes;
  int64_t shards = 1;
  if (plan.pipeline && program.shard_group >= 0 &&
      static_cast<size_t>(program.shard_group) < plan.pipeline->groups.size())
    shards = static_cast<int64_t>(plan.pipeline->groups[program.shard_group].size());
  for (TensorId id : program.holds) {
    const bool sharded =
        std::binary_search(program.sharded_holds.begin(), program.sharded_holds.end(), id);
    bytes += plan.graph.tensor(id).type.size_bytes() / (sharded ? shards : 1);
  }
  return bytes;
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

  AutoResult result;
  std::vector<serialization::Plan> plans;
  const int per_node = std::max(1, options.cluster.devices_per_node);
  for (int tp = 1; tp <= std::min(N, per_node); tp *= 2)
    for (int dp = 1; dp <= N / tp; ++dp) {
      if (N % (dp * tp) != 0 || batch % dp != 0) continue;
      const int pp = N / (dp * tp);
      const int64_t local = batch / dp;
      std::vector<int> microbatches;
      for (int64_t m = 1; m <= std::min<int64_t>(local, options.max_microbatches); m *= 2)
        if (local % m == 0) microbatches.push_back(static_cast<int>(m));
      if (local <= options.max_microbatches &&
          std::find(microbatches.begin(), microbatches.end(), local) == microbatches.end())
        microbatches.push_back(static_cast<int>(local));
      for (int M : microbatches) {
        // With one stage or one micro-batch both schedules are the same program.
        std::vector<Schedule> schedules = {Schedule::k1F1B};
        if (pp > 1 && M > 1) schedules.push_back(Schedule::kGPipe);
        std::vector<int> zeros = {0};
        if (dp > 1) zeros.push_back(1);
        for (int zero : zeros)
          for (Schedule schedule : schedules) {
            AutoCandidate c;
            c.data_parallel = dp;
            c.tensor_parallel = tp;
            c.stages = pp;
            c.microbatches = M;
            c.schedule = schedule;
            c.zero = zero;
            PipelineCompileOptions compile;
            compile.zero = zero;
            compile.stages = pp;
            compile.data_parallel = dp;
            compile.tensor_parallel = tp;
            compile.microbatches = M;
            compile.schedule = schedule;
            compile.cluster = options.cluster;
            compile.check_memory = false; // checked below, over the whole device
            compile.profile = options.profile;
            auto plan = compile_pipeline(forward, training, compile);
            if (!plan.is_ok()) {
              c.error = plan.status().message();
              result.candidates.push_back(std::move(c));
              plans.emplace_back();
              continue;
            }
            c.step_s = plan->pipeline->predicted_step_s;
            c.bubble = plan->pipeline->predicted_bubble;
            for (size_t d = 0; d < plan->programs.size(); ++d)
              c.memory = std::max(c.memory, device_memory(*plan, d));
            c.comm_bytes = comm_bytes(*plan);
            c.fits = capacity <= 0 || c.memory <= capacity;
            result.candidates.push_back(std::move(c));
            plans.push_back(std::move(plan).value());
          }
      }
    }
  if (result.candidates.empty())
    return invalid_argument("--auto: no way to split a batch of ", batch, " over ", N,
                            " devices (data parallelism needs the batch to divide)");

  // Order: fitting by step, memory, micro-batches; then the rest by memory.
  std::vector<size_t> order(result.candidates.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  auto rank = [&](size_t i) {
    const AutoCandidate &c = result.candidates[i];
    const int group = c.error.empty() ? (c.fits ? 0 : 1) : 2;
    return std::make_tuple(group, group == 0 ? c.step_s : static_cast<double>(c.memory), c.memory,
                           c.microbatches, i);
  };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return rank(a) < rank(b); });
  std::vector<AutoCandidate> sorted;
  std::vector<serialization::Plan> sorted_plans;
  for (size_t i : order) {
    sorted.push_back(result.candidates[i]);
    sorted_plans.push_back(std::move(plans[i]));
  }
  result.candidates = std::move(sorted);
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
  result.plan = std::move(sorted_plans.front());

  // Why: against the runner-up that fits, else the best that does not.
  const AutoCandidate *other = nullptr;
  for (size_t i = 1; i < result.candidates.size() && other == nullptr; ++i)
    if (result.candidates[i].error.empty()) other = &result.candidates[i];
  if (other == nullptr) {
    result.reason = str_cat(best.label(), " is the only plan that compiles.");
  } else if (!other->fits) {
    result.reason =
        str_cat(best.label(), " is the fastest plan that fits; ", other->label(), " needs ",
                bytes_text(static_cast<double>(other->memory)), " per device, over the ",
                bytes_text(static_cast<double>(capacity)), " there are.");
  } else {
    result.reason = str_cat(
        best.label(), " wins: predicted step ", ms_text(best.step_s), " against ",
        ms_text(other->step_s), " for the runner-up, ", other->label(), " (",
        percent_text(other->step_s > 0 ? 1 - best.step_s / other->step_s : 0), " faster); bubble ",
        percent_text(best.bubble), " against ", percent_text(other->bubble), ", ",
        bytes_text(best.comm_bytes), " against ", bytes_text(other->comm_bytes),
        " moved per step, ", bytes_text(static_cast<double>(best.memory)), " against ",
        bytes_text(static_cast<double>(other->memory)), " on the fullest device.");
  }
  return result;
}

} // namespace strata::partitioner
