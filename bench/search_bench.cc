// Plan-search benchmark: `--auto` for a GPT-3-175B-shaped model (hidden 12288,
// 96 heads, sequence 2048, vocabulary 50257, global batch 1536; Brown et al.
// 2020, table 2.1) onto every device of a cluster spec (by default the 128-node
// x 8 H100 spec: 1024 devices), for several layer counts. Prints a markdown row
// per layer count: the search time, the candidates, the chosen mesh, its
// predicted step and memory, and the predicted model FLOPs utilization
// (3 x forward FLOPs per step / (step x devices x peak)).
//
// --bf16 estimates the f32 graph as a mixed-precision run (AutoOptions::
// mixed_precision: bf16 arithmetic at the bf16 peak, activations in bf16,
// weights and optimizer state in f32); MFU is then against the bf16 peak, the
// figure Megatron-Core reports.
//
//   search_bench [--layers 12,24,48,96] [--cluster spec.json] [--batch 1536] [--bf16]
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "ops/registry.h"
#include "partitioner/search/auto_plan.h"
#include "tools/zoo.h"

namespace strata {
namespace {

int run(int argc, char **argv) {
  std::vector<int> layer_counts = {12, 24, 48, 96};
  std::string cluster_path = "examples/clusters/h100-128-nodes.json";
  int64_t batch = 1536;
  bool bf16 = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (arg == "--layers") {
      layer_counts.clear();
      std::stringstream list(next());
      std::string item;
      while (std::getline(list, item, ','))
        layer_counts.push_back(std::stoi(item));
    } else if (arg == "--cluster") {
      cluster_path = next();
    } else if (arg == "--batch") {
      batch = std::stoll(next());
    } else if (arg == "--bf16") {
      bf16 = true;
    } else {
      std::fprintf(stderr, "usage: search_bench [--layers 12,24,48,96] [--cluster spec.json] "
                           "[--batch 1536] [--bf16]\n");
      return 2;
    }
  }
  auto cluster = partitioner::load_cluster(cluster_path);
  if (!cluster.is_ok()) {
    std::fprintf(stderr, "%s\n", cluster.status().message().c_str());
    return 1;
  }
  const double peak = bf16 ? cluster->device.peak_flops.bf16 : cluster->device.peak_flops.f32;
  passes::TrainingOptions training;
  training.optimizer = *passes::parse_optimizer("adamw:lr=6e-5,wd=0.1");

  std::printf("| layers | parameters | devices | candidates | estimated | fit | search s | ms per "
              "estimate | chosen | predicted step s | memory/device GB | predicted MFU |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int layers : layer_counts) {
    zoo::GptOptions o;
    o.layers = layers;
    o.hidden = 12288;
    o.heads = 96;
    o.seq = 2048;
    o.vocab = 50257;
    o.batch = batch;
    auto forward = zoo::make_gpt(o);
    if (!forward.is_ok()) {
      std::fprintf(stderr, "%s\n", forward.status().message().c_str());
      return 1;
    }
    double flops = 0;
    for (NodeId id = 0; id < forward->num_nodes(); ++id)
      flops += ops::OpRegistry::global().node_cost(*forward, id).flops;
    partitioner::AutoOptions options;
    options.cluster = *cluster;
    options.compile_winner = false;
    options.mixed_precision = bf16;
    options.max_microbatches = static_cast<int>(batch); // down to micro-batches of one
    const auto start = std::chrono::steady_clock::now();
    auto result = partitioner::auto_plan(*forward, training, options);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!result.is_ok()) {
      std::fprintf(stderr, "%d layers: %s\n", layers, result.status().message().c_str());
      return 1;
    }
    size_t fit = 0, estimated = 0;
    for (const auto &c : result->candidates) {
      fit += c.fits;
      estimated += c.error.empty();
    }
    const auto &best = result->candidates[result->winner];
    const double devices = cluster->num_devices();
    std::printf(
        "| %d | %.1fB | %.0f | %zu | %zu | %zu | %.2f | %.1f | %s | %.2f | %.1f | %.1f%% |\n",
        layers, static_cast<double>(forward->num_parameters()) / 1e9, devices,
        result->candidates.size(), estimated, fit, seconds,
        estimated ? 1e3 * seconds / static_cast<double>(estimated) : 0.0, best.label().c_str(),
        best.step_s, static_cast<double>(best.memory) / 1e9,
        100 * 3 * flops / (best.step_s * devices * peak));
    std::fflush(stdout);
  }
  return 0;
}

} // namespace
} // namespace strata

int main(int argc, char **argv) { return strata::run(argc, argv); }
