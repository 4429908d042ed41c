// Splitting a CPU kernel's independent work over the threads of the OpenMP
// runtime oneDNN already runs on (its thread count is what
// cpu::set_gemm_num_threads and OMP_NUM_THREADS set).
//
// Every index is handled by exactly one call of `body`, with the same
// arithmetic whatever the thread count, so a kernel that splits only
// independent work (elements, channels, planes) gives the same bits on any
// number of threads.
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace strata::ops::cpu {

// Calls body(begin, end) over consecutive pieces of [0, n), each at least
// `grain` long, in parallel. Inside a parallel region already, or with one
// thread, it is one call body(0, n).
template <typename Body> void parallel_for(int64_t n, int64_t grain, Body body) {
  if (n <= 0) return;
#if defined(_OPENMP)
  const int64_t threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const int64_t pieces = std::min<int64_t>(threads, n / std::max<int64_t>(grain, 1));
  if (pieces > 1) {
    const int team = static_cast<int>(pieces);
#pragma omp parallel for num_threads(team) schedule(static, 1)
    for (int64_t p = 0; p < pieces; ++p)
      body(n * p / pieces, n * (p + 1) / pieces);
    return;
  }
#endif
  body(int64_t{0}, n);
}

// Elements per thread below which splitting work costs more than it saves.
constexpr int64_t kElementsPerThread = int64_t{1} << 15;

// parallel_for over `n` items (elements, channels, planes) of `item_elements`
// elements each, at least kElementsPerThread elements per piece.
template <typename Body> void parallel_for_items(int64_t n, int64_t item_elements, Body body) {
  parallel_for(n, std::max<int64_t>(1, kElementsPerThread / std::max<int64_t>(1, item_elements)),
               body);
}

} // namespace strata::ops::cpu
