// Compile-time benchmark: a GPT-3-175B-shaped model (96 layers, hidden 12288,
// 96 heads, sequence 2048, vocabulary 50257; Brown et al. 2020, table 2.1) into
// a 96-stage 1F1B pipeline plan, timed end to end and per phase.
//
// The device memory limit is lifted (see below). Weights are initializers, so nothing of the 175B
// parameters is materialized: this measures the compiler (shape inference, autodiff, the stage
// search, lowering, memory planning, the deadlock check and the simulation) and the plan's
// serialization.
//
//   compile_bench [--layers 96] [--stages 96] [--microbatches 8]
//                 [--cluster examples/clusters/h100-128-nodes.json]
#include <chrono>
#include <cstdio>
#include <string>

#include "partitioner/compile_pipeline.h"
#include "serialization/plan_io.h"
#include "tools/zoo.h"

namespace strata {
namespace {

double since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int run(int argc, char **argv) {
  int layers = 96, stages = 96, microbatches = 8;
  std::string cluster_path;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (arg == "--layers")
      layers = std::stoi(next());
    else if (arg == "--stages")
      stages = std::stoi(next());
    else if (arg == "--microbatches")
      microbatches = std::stoi(next());
    else if (arg == "--cluster")
      cluster_path = next();
    else {
      std::fprintf(stderr, "usage: compile_bench [--layers N] [--stages P] [--microbatches M] "
                           "[--cluster spec.json]\n");
      return 2;
    }
  }
  partitioner::PipelineCompileOptions options;
  options.stages = stages;
  options.microbatches = microbatches;
  if (!cluster_path.empty()) {
    auto cluster = partitioner::load_cluster(cluster_path);
    if (!cluster.is_ok()) {
      std::fprintf(stderr, "%s\n", cluster.status().message().c_str());
      return 1;
    }
    options.cluster = *cluster;
  }
  // In f32 without tensor parallelism or recomputation a 175B layer's weights,
  // optimizer state and in-flight activations exceed an 80 GB device; the
  // capacity check is left out here, the search and lowering are what is timed.
  options.check_memory = false;

  auto start = std::chrono::steady_clock::now();
  zoo::GptOptions o;
  o.layers = layers;
  o.hidden = 12288;
  o.heads = 96;
  o.seq = 2048;
  o.vocab = 50257;
  o.batch = microbatches; // micro-batch 1
  auto forward = zoo::make_gpt(o);
  if (!forward.is_ok()) {
    std::fprintf(stderr, "%s\n", forward.status().message().c_str());
    return 1;
  }
  const double build_s = since(start);

  passes::TrainingOptions training;
  training.optimizer = *passes::parse_optimizer("adamw:lr=6e-5,wd=0.1,clip=1");
  start = std::chrono::steady_clock::now();
  auto plan = partitioner::compile_pipeline(*forward, training, options);
  const double compile_s = since(start);
  if (!plan.is_ok()) {
    std::fprintf(stderr, "%s\n", plan.status().message().c_str());
    return 1;
  }
  start = std::chrono::steady_clock::now();
  auto bytes = serialization::plan_to_flatbuffer(*plan);
  const double write_s = since(start);
  if (!bytes.is_ok()) {
    std::fprintf(stderr, "%s\n", bytes.status().message().c_str());
    return 1;
  }
  size_t instructions = 0;
  for (const auto &program : plan->programs)
    instructions += program.instructions.size();
  std::printf("| layers | stages | micro-batches | training-graph nodes | instructions | build "
              "model s | compile s | serialize s | total s | plan MiB | predicted step s | "
              "predicted bubble |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::printf("| %d | %d | %d | %zu | %zu | %.2f | %.2f | %.2f | %.2f | %.1f | %.3f | %.1f%% |\n",
              layers, stages, microbatches, plan->graph.num_nodes(), instructions, build_s,
              compile_s, write_s, build_s + compile_s + write_s,
              static_cast<double>(bytes->size()) / (1024.0 * 1024.0),
              plan->pipeline->predicted_step_s, plan->pipeline->predicted_bubble * 100);
  return 0;
}

} // namespace
} // namespace strata

int main(int argc, char **argv) { return strata::run(argc, argv); }
