// One training step of zoo models on the CPU executor.
//
// Each benchmark builds the model, turns it into a training-step graph
// (passes/make_training.h: softmax cross-entropy loss, backward, optimizer update),
// creates the executor once (weights drawn, memory planned) and times `run` alone:
// one run is forward + backward + the optimizer's parameter update. The GFLOP/s
// counter divides the registry's FLOP count of every node of the training graph by
// the time per step.
//
//   build/bench/train_bench --benchmark_min_time=0.2
#include "bench/bench_util.h"
#include "passes/make_training.h"
#include "tools/model_stats.h"
#include "tools/zoo.h"

namespace strata {
namespace {

void run_training_step(benchmark::State &state, Result<Graph> built, const char *optimizer) {
  if (!built.is_ok()) {
    state.SkipWithError(built.status().to_string().c_str());
    return;
  }
  auto spec = passes::parse_optimizer(optimizer);
  if (!spec.is_ok()) {
    state.SkipWithError(spec.status().to_string().c_str());
    return;
  }
  passes::TrainingOptions options;
  options.optimizer = *spec;
  auto training = passes::make_training_graph(*built, options);
  if (!training.is_ok()) {
    state.SkipWithError(training.status().to_string().c_str());
    return;
  }
  auto stats = tools::compute_model_stats(*training);
  if (!stats.is_ok()) {
    state.SkipWithError(stats.status().to_string().c_str());
    return;
  }
  bench::time_runs(state, std::move(training).value(), stats->flops);
}

// GPT: 2 layers, 4 heads, vocab 512, batch 4; args are {hidden, seq}. AdamW.
void BM_GptTrainStep(benchmark::State &state) {
  zoo::GptOptions o;
  o.layers = 2;
  o.hidden = state.range(0);
  o.heads = 4;
  o.seq = state.range(1);
  o.vocab = 512;
  o.batch = 4;
  run_training_step(state, zoo::make_gpt(o), "adamw:lr=1e-3,wd=0");
}
BENCHMARK(BM_GptTrainStep)
    ->Args({128, 64})
    ->Args({256, 64})
    ->ArgNames({"hidden", "seq"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The zoo CNN (3x32x32 images, conv stages of 16 and 32 channels, fc 128, 10 classes);
// the arg is the batch (8 is the zoo default).
void BM_ConvnetTrainStepAdamW(benchmark::State &state) {
  zoo::ConvnetOptions o;
  o.batch = state.range(0);
  run_training_step(state, zoo::make_convnet(o), "adamw:lr=1e-3,wd=0");
}
BENCHMARK(BM_ConvnetTrainStepAdamW)
    ->Arg(8)
    ->Arg(32)
    ->ArgName("batch")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_ConvnetTrainStepSgd(benchmark::State &state) {
  zoo::ConvnetOptions o;
  o.batch = state.range(0);
  run_training_step(state, zoo::make_convnet(o), "sgd:lr=1e-2");
}
BENCHMARK(BM_ConvnetTrainStepSgd)
    ->Arg(8)
    ->Arg(32)
    ->ArgName("batch")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

} // namespace
} // namespace strata

BENCHMARK_MAIN();
