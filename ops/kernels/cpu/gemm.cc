#include "ops/kernels/cpu/gemm.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstdlib>
#include <thread>

#include "strata_config.h"

#if STRATA_HAVE_OPENBLAS
#include <cblas.h>
#endif
#if STRATA_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

namespace strata::ops::cpu {
namespace {

constexpr GemmBackend kDefaultBackend =
#if STRATA_HAVE_DNNL
    GemmBackend::kOneDnn;
#else
    GemmBackend::kOpenBlas;
#endif

std::atomic<GemmBackend> &current_backend() {
  static std::atomic<GemmBackend> backend{kDefaultBackend};
  return backend;
}

// C = beta * C, for the degenerate k == 0 product (the libraries differ on it).
void scale_output(const GemmShape &shape, float beta, float *c, int64_t ldc) {
  for (int64_t i = 0; i < shape.m; ++i) {
    float *row = c + i * ldc;
    if (beta == 0.0f)
      std::fill(row, row + shape.n, 0.0f);
    else
      for (int64_t j = 0; j < shape.n; ++j)
        row[j] *= beta;
  }
}

} // namespace

bool gemm_backend_available(GemmBackend backend) {
  switch (backend) {
  case GemmBackend::kOneDnn: return STRATA_HAVE_DNNL != 0;
  case GemmBackend::kOpenBlas: return STRATA_HAVE_OPENBLAS != 0;
  }
  return false;
}

GemmBackend gemm_backend() { return current_backend().load(std::memory_order_relaxed); }

bool set_gemm_backend(GemmBackend backend) {
  if (!gemm_backend_available(backend)) return false;
  current_backend().store(backend, std::memory_order_relaxed);
  return true;
}

std::string_view gemm_backend_name(GemmBackend backend) {
  switch (backend) {
  case GemmBackend::kOneDnn: return "oneDNN dnnl_sgemm";
  case GemmBackend::kOpenBlas: return "OpenBLAS cblas_sgemm";
  }
  return "unknown";
}

void set_gemm_num_threads(int n) {
  if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
#if STRATA_HAVE_OPENBLAS
  openblas_set_num_threads(n);
#endif
  // oneDNN runs on the OpenMP runtime it was built with, which strata does not
  // link itself; look the setter up in the process instead.
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"))) set(n);
}

void sgemm(const GemmShape &shape, float alpha, const float *a, int64_t lda, const float *b,
           int64_t ldb, float beta, float *c, int64_t ldc) {
  if (shape.m <= 0 || shape.n <= 0) return;
  if (shape.k <= 0) {
    scale_output(shape, beta, c, ldc);
    return;
  }
  // Rows of a stored matrix need at least one element even when it has no columns.
  assert(lda >= std::max<int64_t>(1, shape.trans_a ? shape.m : shape.k));
  assert(ldb >= std::max<int64_t>(1, shape.trans_b ? shape.k : shape.n));
  assert(ldc >= std::max<int64_t>(1, shape.n));
  GemmBackend backend = gemm_backend();
#if STRATA_HAVE_DNNL
  if (backend == GemmBackend::kOneDnn) {
    dnnl_status_t status = dnnl_sgemm(shape.trans_a ? 'T' : 'N', shape.trans_b ? 'T' : 'N', shape.m,
                                      shape.n, shape.k, alpha, a, lda, b, ldb, beta, c, ldc);
    // Only invalid arguments fail, and the asserts above rule those out.
    assert(status == dnnl_success);
    (void)status;
    return;
  }
#endif
#if STRATA_HAVE_OPENBLAS
  if (backend == GemmBackend::kOpenBlas) {
    cblas_sgemm(CblasRowMajor, shape.trans_a ? CblasTrans : CblasNoTrans,
                shape.trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(shape.m),
                static_cast<blasint>(shape.n), static_cast<blasint>(shape.k), alpha, a,
                static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
                static_cast<blasint>(ldc));
    return;
  }
#endif
  (void)backend;
  assert(false && "no GEMM backend built in");
}

void sgemm_strided_batched(const GemmShape &shape, int64_t batch, float alpha, const float *a,
                           int64_t lda, int64_t stride_a, const float *b, int64_t ldb,
                           int64_t stride_b, float beta, float *c, int64_t ldc, int64_t stride_c) {
  for (int64_t i = 0; i < batch; ++i)
    sgemm(shape, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta, c + i * stride_c, ldc);
}

} // namespace strata::ops::cpu
