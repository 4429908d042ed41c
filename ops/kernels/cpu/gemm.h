// Single-precision GEMM for the CPU kernels: the one entry every op that
// multiplies matrices goes through (MatMul, Gemm, convolution without oneDNN, and
// later the gradients).
//
// Matrices are row-major. C = alpha * op(A) * op(B) + beta * C, where op(A) is
// m x k and op(B) is k x n; a leading dimension is the distance in elements
// between two rows of the matrix as stored (before the transpose). beta == 0
// overwrites C without reading it, so C may hold garbage or NaN.
//
// Backend: oneDNN's dnnl_sgemm when oneDNN is found (about twice OpenBLAS 0.3.21
// on the AVX-512 machine strata is developed on, one thread and two alike), else
// OpenBLAS's cblas_sgemm. Both split the output, never the sum over k, across a
// fixed number of threads, so a result is bitwise the same on every run with the
// same thread count.
#pragma once

#include <cstdint>
#include <string_view>

namespace strata::ops::cpu {

enum class GemmBackend : uint8_t { kOneDnn, kOpenBlas };

struct GemmShape {
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
};

// C = alpha * op(A) * op(B) + beta * C for one matrix.
void sgemm(const GemmShape &shape, float alpha, const float *a, int64_t lda, const float *b,
           int64_t ldb, float beta, float *c, int64_t ldc);

// The same for `batch` matrices at a fixed distance (in elements) from each other;
// a stride of 0 reuses one matrix for the whole batch (broadcasting). C's stride
// must leave the outputs disjoint.
void sgemm_strided_batched(const GemmShape &shape, int64_t batch, float alpha, const float *a,
                           int64_t lda, int64_t stride_a, const float *b, int64_t ldb,
                           int64_t stride_b, float beta, float *c, int64_t ldc, int64_t stride_c);

// The backend sgemm uses: the fastest one built in, unless overridden. Overriding
// with a backend that is not built in is ignored (returns false). Meant for tests
// and benchmarks; not synchronized with concurrent sgemm calls.
GemmBackend gemm_backend();
bool set_gemm_backend(GemmBackend backend);
bool gemm_backend_available(GemmBackend backend);
std::string_view gemm_backend_name(GemmBackend backend);

// Threads the GEMM libraries use from now on (OpenBLAS's own pool through
// openblas_set_num_threads, and the calling thread's OpenMP team size, which
// oneDNN follows, through omp_set_num_threads). n <= 0 restores the number of
// cores. Results are reproducible for a fixed thread count.
void set_gemm_num_threads(int n);

} // namespace strata::ops::cpu
