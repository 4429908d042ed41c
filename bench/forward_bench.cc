// One forward pass of zoo models on the CPU executor.
//
// Each benchmark builds the model, creates the executor once (weights drawn,
// memory planned) and times `run` alone. The GFLOP/s counter divides the
// registry's FLOP count of one forward pass by the time per pass.
//
//   build/bench/forward_bench --benchmark_min_time=0.2
#include "bench/bench_util.h"
#include "tools/model_stats.h"
#include "tools/zoo.h"

namespace strata {
namespace {

void run_forward(benchmark::State &state, Result<Graph> built) {
  if (!built.is_ok()) {
    state.SkipWithError(built.status().to_string().c_str());
    return;
  }
  Graph graph = std::move(built).value();
  auto stats = tools::compute_model_stats(graph);
  if (!stats.is_ok()) {
    state.SkipWithError(stats.status().to_string().c_str());
    return;
  }
  bench::time_runs(state, std::move(graph), stats->flops);
  state.counters["params"] = static_cast<double>(stats->parameters);
}

// GPT: 2 layers, batch x seq tokens; args are {hidden, seq}.
void BM_GptForward(benchmark::State &state) {
  zoo::GptOptions o;
  o.layers = 2;
  o.hidden = state.range(0);
  o.heads = 4;
  o.seq = state.range(1);
  o.vocab = 512;
  o.batch = 4;
  run_forward(state, zoo::make_gpt(o));
}
BENCHMARK(BM_GptForward)
    ->Args({128, 64})
    ->Args({256, 64})
    ->Args({512, 128})
    ->ArgNames({"hidden", "seq"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// MLP 784 -> 256 -> 256 -> 10; the arg is the batch.
void BM_MlpForward(benchmark::State &state) {
  zoo::MlpOptions o;
  o.batch = state.range(0);
  run_forward(state, zoo::make_mlp(o));
}
BENCHMARK(BM_MlpForward)
    ->Arg(32)
    ->Arg(256)
    ->ArgName("batch")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The small CNN on 8 images of 3x32x32.
void BM_ConvnetForward(benchmark::State &state) { run_forward(state, zoo::make_convnet({})); }
BENCHMARK(BM_ConvnetForward)->Unit(benchmark::kMillisecond)->UseRealTime();

} // namespace
} // namespace strata

BENCHMARK_MAIN();
