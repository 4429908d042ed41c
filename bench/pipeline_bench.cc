// Pipeline benchmark: measured bubble against (p-1)/(m+p-1), and predicted
// against measured step time, for a GPT on P CPU device threads.
//
// For each P in {2, 4} and M in {4, 8, 16} the GPT is compiled to a 1F1B
// pipeline plan and trained for a few steps with tracing on, timed by the
// device clock (runtime/comm/device_clock.h: each device's own CPU time, joined at
// its messages and collectives), which measures the step as a core per device
// would run it also where the machine has fewer cores than devices. The wall
// time of the same steps is printed beside it: with a core per device the two
// agree. From the trace:
//   step time  a step's first instruction start to its last end
//   busy       per device, the time in its own instructions (not in receives)
//   bubble     1 - sum(busy) / (P * step time)
// The formula (p-1)/(m+p-1) takes the stages to be equally long; the plan's
// own predicted bubble includes the imbalance its stage split leaves.
// Plans are compiled as `strata compile --profile` does: every node of the
// training step is timed once on one device, and those times balance the stages
// and predict the step (the plan's own prediction, "profiled"). The same
// programs are also predicted from the roofline of the cluster spec given
// (--cluster, e.g. from `strata calibrate`), which shows how far the analytic
// per-op model is from these small CPU kernels.
// Prints one markdown table row per configuration.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "ops/kernels/cpu/gemm.h"
#include "partitioner/compile_pipeline.h"
#include "runtime/cpu/pipeline_runner.h"
#include "runtime/trainer.h"
#include "tools/zoo.h"

namespace strata {
namespace {

struct Measured {
  double step = 0;   // median step seconds (device clock)
  double bubble = 0; // median bubble
  double wall = 0;   // median wall seconds of the same steps
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Result<Measured> measure(const serialization::Plan &plan, int warmup, int steps) {
  runtime::PipelineRunnerOptions options;
  options.trace = true;
  options.clock = runtime::PipelineRunnerOptions::Clock::kDevice;
  ASSIGN_OR_RETURN(auto runner, runtime::PipelineRunner::create(plan, options));
  const int M = plan.pipeline->microbatches;
  auto data = runtime::synthetic_dataset(plan.graph, 0, 1, M);
  std::vector<HostTensor> outputs;
  std::vector<double> walls;
  for (int s = 0; s < warmup + steps; ++s) {
    const auto start = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(runner->run(data.batches[0], &outputs));
    if (s >= warmup)
      walls.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  const auto &spans = runner->spans();
  const int P = runner->num_devices();
  Measured m;
  std::vector<double> step_times, bubbles;
  for (int64_t step = warmup + 1; step <= warmup + steps; ++step) {
    double start = 1e300, end = 0, busy = 0;
    for (int d = 0; d < P; ++d)
      for (const auto &span : spans[static_cast<size_t>(d)]) {
        if (span.step != step || span.stream) continue;
        start = std::min(start, span.start_s);
        end = std::max(end, span.end_s);
        const auto &instr = plan.programs[static_cast<size_t>(d)].instructions[span.instruction];
        if (instr.kind != serialization::InstrKind::kRecv) busy += span.end_s - span.start_s;
      }
    step_times.push_back(end - start);
    bubbles.push_back(1.0 - busy / (P * (end - start)));
  }
  m.step = median(step_times);
  m.bubble = median(bubbles);
  m.wall = median(walls);
  return m;
}

int run(int argc, char **argv) {
  std::string cluster_path;
  int layers = 8, hidden = 128, seq = 64, batch = 32, vocab = 512, steps = 5, chunks = 1;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (arg == "--cluster")
      cluster_path = next();
    else if (arg == "--layers")
      layers = std::stoi(next());
    else if (arg == "--hidden")
      hidden = std::stoi(next());
    else if (arg == "--seq")
      seq = std::stoi(next());
    else if (arg == "--batch")
      batch = std::stoi(next());
    else if (arg == "--vocab")
      vocab = std::stoi(next());
    else if (arg == "--chunks")
      chunks = std::stoi(next());
    else if (arg == "--steps")
      steps = std::stoi(next());
    else {
      std::fprintf(stderr, "usage: pipeline_bench [--cluster spec.json] [--layers N] [--hidden H] "
                           "[--seq S] [--batch B] [--vocab V] [--chunks C] [--steps N]\n");
      return 2;
    }
  }
  partitioner::ClusterSpec cluster = partitioner::default_cpu_cluster(4);
  if (!cluster_path.empty()) {
    auto loaded = partitioner::load_cluster(cluster_path);
    if (!loaded.is_ok()) {
      std::fprintf(stderr, "%s\n", loaded.status().message().c_str());
      return 1;
    }
    cluster = *loaded;
  }
  zoo::GptOptions o;
  o.layers = layers;
  o.hidden = hidden;
  o.heads = 4;
  o.seq = seq;
  o.vocab = vocab;
  o.batch = batch;
  const Graph forward = *zoo::make_gpt(o);
  passes::TrainingOptions training;
  training.optimizer = *passes::parse_optimizer("adamw:lr=1e-3");
  ops::cpu::set_gemm_num_threads(1);

  const std::string schedule =
      chunks > 1 ? "1F1B (v = 1) and interleaved 1F1B (v = " + std::to_string(chunks) +
                       " model chunks per device), back to back"
                 : "1F1B";
  std::printf("GPT layers %d hidden %d seq %d vocab %d batch %d, AdamW, %s, one GEMM thread per "
              "device, cluster '%s', %d steps (median) after 2 warm-up, %u cores\n\n",
              layers, hidden, seq, vocab, batch, schedule.c_str(), cluster.name.c_str(), steps,
              std::thread::hardware_concurrency());
  std::printf("| P | M | v | wall ms | step ms | bubble | (p-1)/(vm+p-1) | diff (points) | plan's "
              "bubble | diff (points) | predicted ms (plan, --profile) | error | predicted ms "
              "(roofline) | error |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  // What `strata compile --profile` does: time every node of the training step
  // on one device (one GEMM thread), balance and predict with those times.
  // With --chunks, each configuration runs 1F1B (v = 1) and then the
  // interleaved schedule, back to back.
  const std::vector<int> schedules = chunks > 1 ? std::vector<int>{1, chunks} : std::vector<int>{1};
  for (int M : {4, 8, 16}) {
    for (int P : {2, 4})
      for (int v : schedules) {
        partitioner::PipelineCompileOptions options;
        options.stages = P;
        options.microbatches = M;
        if (v > 1) {
          options.schedule = partitioner::Schedule::kInterleaved;
          options.chunks = v;
        }
        options.cluster = cluster;
        options.profile = runtime::profile_node_times;
        auto plan = partitioner::compile_pipeline(forward, training, options);
        if (!plan.is_ok()) {
          std::fprintf(stderr, "%s\n", plan.status().message().c_str());
          return 1;
        }
        auto measured = measure(*plan, 2, steps);
        if (!measured.is_ok()) {
          std::fprintf(stderr, "%s\n", measured.status().message().c_str());
          return 1;
        }
        // The same programs predicted from the cluster's roofline instead.
        auto roofline = plan::simulate_pipeline(
            plan->graph, plan->programs, partitioner::cluster_costs(plan->graph, cluster));
        const double formula = static_cast<double>(P - 1) / static_cast<double>(v * M + P - 1);
        const double predicted = plan->pipeline->predicted_step_s;
        const double roof = roofline.is_ok() ? roofline->step_time : 0;
        const double planned = plan->pipeline->predicted_bubble;
        std::printf(
            "| %d | %d | %d | %.2f | %.2f | %.1f%% | %.1f%% | %+.1f | %.1f%% | %+.1f | %.2f | "
            "%+.1f%% | %.2f | %+.1f%% |\n",
            P, M, v, measured->wall * 1e3, measured->step * 1e3, measured->bubble * 100,
            formula * 100, (measured->bubble - formula) * 100, planned * 100,
            (measured->bubble - planned) * 100, predicted * 1e3,
            (predicted / measured->step - 1) * 100, roof * 1e3, (roof / measured->step - 1) * 100);
        std::fflush(stdout);
      }
  }
  return 0;
}

} // namespace
} // namespace strata

int main(int argc, char **argv) { return strata::run(argc, argv); }
