// Shared by the benchmarks: times CpuExecutor::run of a graph and reports its
// FLOP rate.
#pragma once

#include <chrono>

#include <benchmark/benchmark.h>

#include "runtime/cpu/executor.h"

namespace strata::bench {

// Runs `graph` on seeded random inputs once per benchmark iteration and sets the
// counters "GFLOP" (per run) and "GFLOP/s" (over the time spent in run() only).
inline void time_runs(benchmark::State &state, Graph graph, double flops) {
  std::vector<HostTensor> inputs = runtime::random_inputs(graph, 0);
  auto executor = runtime::CpuExecutor::create(std::move(graph));
  if (!executor.is_ok()) {
    state.SkipWithError(executor.status().to_string().c_str());
    return;
  }
  std::vector<HostTensor> outputs;
  double seconds = 0;
  for (auto _ : state) {
    outputs.clear();
    auto start = std::chrono::steady_clock::now();
    Status status = (*executor)->run(inputs, &outputs);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!status.is_ok()) {
      state.SkipWithError(status.to_string().c_str());
      break;
    }
    benchmark::DoNotOptimize(outputs.data());
  }
  if (seconds > 0)
    state.counters["GFLOP/s"] = flops * static_cast<double>(state.iterations()) / seconds * 1e-9;
  state.counters["GFLOP"] = flops * 1e-9;
}

} // namespace strata::bench
