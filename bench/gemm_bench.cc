// Single-precision GEMM throughput: strata's sgemm entry (on each backend built
// in) and the MatMul op's CPU kernel through the registry, on square sizes and a
// GPT-2-like MLP shape. The "FLOPS" counter is 2·M·N·K per iteration over wall
// time. Thread counts go through cpu::set_gemm_num_threads, which calls
// openblas_set_num_threads and the OpenMP runtime's omp_set_num_threads (what
// oneDNN follows); "threads:0" means one thread per core.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "ops/kernels/cpu/gemm.h"
#include "ops/registry.h"

namespace {

using strata::ops::cpu::GemmBackend;

struct Problem {
  int64_t m, n, k;
};

std::vector<float> random_matrix(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> out(static_cast<size_t>(count));
  for (float &v : out)
    v = dist(rng);
  return out;
}

void set_flops(benchmark::State &state, const Problem &p) {
  state.counters["FLOPS"] = benchmark::Counter(
      2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) * static_cast<double>(p.k),
      benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::OneK::kIs1000);
}

// Args: m, n, k, threads (0 = one per core).
void run_sgemm(benchmark::State &state, GemmBackend backend) {
  const Problem p{state.range(0), state.range(1), state.range(2)};
  if (!strata::ops::cpu::set_gemm_backend(backend)) {
    state.SkipWithError("backend not built in");
    return;
  }
  strata::ops::cpu::set_gemm_num_threads(static_cast<int>(state.range(3)));
  std::vector<float> a = random_matrix(p.m * p.k, 1), b = random_matrix(p.k * p.n, 2);
  std::vector<float> c(static_cast<size_t>(p.m * p.n));
  const strata::ops::cpu::GemmShape shape{false, false, p.m, p.n, p.k};
  strata::ops::cpu::sgemm(shape, 1.0f, a.data(), p.k, b.data(), p.n, 0.0f, c.data(), p.n); // warm
  for (auto _ : state) {
    strata::ops::cpu::sgemm(shape, 1.0f, a.data(), p.k, b.data(), p.n, 0.0f, c.data(), p.n);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, p);
}

void BM_Sgemm_OneDnn(benchmark::State &state) { run_sgemm(state, GemmBackend::kOneDnn); }
void BM_Sgemm_OpenBlas(benchmark::State &state) { run_sgemm(state, GemmBackend::kOpenBlas); }

// The MatMul op's kernel, called as the runtime calls it (default backend).
void BM_MatMulOp(benchmark::State &state) {
  using namespace strata;
  const Problem p{state.range(0), state.range(1), state.range(2)};
  strata::ops::cpu::set_gemm_backend(strata::ops::cpu::gemm_backend_available(GemmBackend::kOneDnn)
                                         ? GemmBackend::kOneDnn
                                         : GemmBackend::kOpenBlas);
  strata::ops::cpu::set_gemm_num_threads(static_cast<int>(state.range(3)));
  const ops::OpDef *def = ops::OpRegistry::global().find("MatMul");
  if (def == nullptr || def->cpu_kernel == nullptr) {
    state.SkipWithError("MatMul has no CPU kernel");
    return;
  }
  Node node;
  node.name = "matmul";
  node.op = "MatMul";
  std::vector<TensorType> in_types = {TensorType{DType::kF32, Shape{p.m, p.k}},
                                      TensorType{DType::kF32, Shape{p.k, p.n}}};
  auto out_types = ops::OpRegistry::global().infer_types(node, in_types);
  if (!out_types) {
    state.SkipWithError(out_types.status().to_string().c_str());
    return;
  }
  std::vector<float> a = random_matrix(p.m * p.k, 1), b = random_matrix(p.k * p.n, 2);
  std::vector<float> c(static_cast<size_t>(p.m * p.n));
  ops::ConstTensorView inputs[] = {{a.data(), &in_types[0]}, {b.data(), &in_types[1]}};
  ops::TensorView outputs[] = {{c.data(), &(*out_types)[0]}};
  ops::KernelContext context{node, *def, inputs, outputs};
  if (Status status = def->cpu_kernel(context); !status.is_ok()) {
    state.SkipWithError(status.to_string().c_str());
    return;
  }
  for (auto _ : state) {
    Status status = def->cpu_kernel(context);
    benchmark::DoNotOptimize(status);
    benchmark::ClobberMemory();
  }
  set_flops(state, p);
}

// Square 512, 1024, 2048 and a GPT-2-small MLP up-projection: 2048 tokens (batch
// 4 x sequence 512) x 768 -> 3072; each at one thread and one thread per core.
void shapes(benchmark::internal::Benchmark *b) {
  b->ArgNames({"m", "n", "k", "threads"});
  for (int64_t threads : {1, 0}) {
    for (int64_t size : {512, 1024, 2048})
      b->Args({size, size, size, threads});
    b->Args({2048, 3072, 768, threads});
  }
  b->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);
}

BENCHMARK(BM_Sgemm_OneDnn)->Apply(shapes);
BENCHMARK(BM_Sgemm_OpenBlas)->Apply(shapes);
BENCHMARK(BM_MatMulOp)->Apply(shapes);

} // namespace

BENCHMARK_MAIN();
