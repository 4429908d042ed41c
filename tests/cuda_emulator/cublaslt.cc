// cuBLASLt's matrix products on the host, for the CUDA emulator (see
// cuda_emulator.h): the descriptors strata sets, one algorithm per query
// (no workspace), the product in double from f32 (TF32-rounded under the fast
// TF32 compute type), bf16 or f16 operands into f32, on the stream's order.
#include <cublasLt.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/cuda_emulator/cuda_emulator.h"
#include "tests/cuda_emulator/state.h"

namespace strata::cuda_emulator {
namespace {

constexpr uint64_t kMagic = 0x5354524154414c54; // an algorithm this emulator chose

struct Desc {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  cublasLtPointerMode_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
};

struct Layout {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch = 1;
  int64_t stride = 0;
  int32_t order = CUBLASLT_ORDER_COL;
};

struct Preference {
  uint64_t workspace = 0;
  uint32_t alignment[4] = {256, 256, 256, 256}; // A, B, C, D
};

template <typename T> T *of(void *handle) { return static_cast<T *>(handle); }

cublasStatus_t refuse(cublasStatus_t status, std::string message) {
  detail::note("cuBLASLt: " + message);
  return status;
}

size_t element_bytes(cudaDataType_t type) { return type == CUDA_R_32F ? 4 : 2; }

bool operand_type(cudaDataType_t type) {
  return type == CUDA_R_32F || type == CUDA_R_16BF || type == CUDA_R_16F;
}

// The shape check of a product; "" when cuBLASLt would take it.
std::string shape_error(const Desc &d, const Layout &a, const Layout &b, const Layout &c,
                        const Layout &dl) {
  if (d.compute != CUBLAS_COMPUTE_32F && d.compute != CUBLAS_COMPUTE_32F_FAST_TF32)
    return "a compute type other than 32F";
  if (d.scale != CUDA_R_32F) return "a scale type other than f32";
  if (d.epilogue != CUBLASLT_EPILOGUE_DEFAULT) return "an epilogue";
  if (!operand_type(a.type) || a.type != b.type) return "operands of other or mixed types";
  if (c.type != CUDA_R_32F || dl.type != CUDA_R_32F) return "C or D not f32";
  if (d.compute == CUBLAS_COMPUTE_32F_FAST_TF32 && a.type != CUDA_R_32F)
    return "TF32 compute with half-precision operands";
  for (const Layout *l : {&a, &b, &c, &dl})
    if (l->order != CUBLASLT_ORDER_COL || l->ld < static_cast<int64_t>(l->rows) || l->batch < 1 ||
        (l->batch > 1 && l->stride < 0))
      return "a layout that is not column-major with ld >= rows";
  const uint64_t m = d.trans_a == CUBLAS_OP_N ? a.rows : a.cols;
  const uint64_t k = d.trans_a == CUBLAS_OP_N ? a.cols : a.rows;
  const uint64_t kb = d.trans_b == CUBLAS_OP_N ? b.rows : b.cols;
  const uint64_t n = d.trans_b == CUBLAS_OP_N ? b.cols : b.rows;
  if (k != kb || dl.rows != m || dl.cols != n || c.rows != m || c.cols != n)
    return "shapes that do not multiply: op(A) " + std::to_string(m) + "x" + std::to_string(k) +
           ", op(B) " + std::to_string(kb) + "x" + std::to_string(n) + ", D " +
           std::to_string(dl.rows) + "x" + std::to_string(dl.cols);
  if (a.batch != dl.batch || b.batch != dl.batch || c.batch != dl.batch)
    return "operands of different batch counts";
  return "";
}

double read(const void *base, cudaDataType_t type, int64_t index, bool tf32) {
  if (type == CUDA_R_32F) {
    float x = static_cast<const float *>(base)[index];
    if (tf32 && std::isfinite(x)) {
      uint32_t bits;
      std::memcpy(&bits, &x, 4);
      bits = (bits + 0xFFFu + ((bits >> 13) & 1u)) & ~0x1FFFu;
      std::memcpy(&x, &bits, 4);
    }
    return x;
  }
  uint16_t bits = static_cast<const uint16_t *>(base)[index];
  if (type == CUDA_R_16BF) {
    const uint32_t wide = static_cast<uint32_t>(bits) << 16;
    float x;
    std::memcpy(&x, &wide, 4);
    return x;
  }
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

bool aligned(const void *pointer, int64_t stride, size_t element, uint32_t alignment) {
  uint64_t bits = reinterpret_cast<uintptr_t>(pointer);
  if (stride != 0) bits |= static_cast<uint64_t>(stride) * element;
  return bits % alignment == 0;
}

// An attribute's value into `field`, which it must fill exactly.
template <typename Field>
cublasStatus_t set_attribute(Field *field, const void *value, size_t bytes) {
  if (bytes != sizeof *field)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "an attribute of the wrong size");
  std::memcpy(field, value, bytes);
  return CUBLAS_STATUS_SUCCESS;
}

} // namespace
} // namespace strata::cuda_emulator

using namespace strata::cuda_emulator;

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle) {
  *handle = reinterpret_cast<cublasLtHandle_t>(new int(0));
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete reinterpret_cast<int *>(handle);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  auto *d = new Desc{compute, scale};
  *desc = reinterpret_cast<cublasLtMatmulDesc_t>(d);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete reinterpret_cast<Desc *>(desc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attribute,
                                              const void *value, size_t bytes) {
  Desc &d = *reinterpret_cast<Desc *>(desc);
  auto take = [&](auto *field) { return set_attribute(field, value, bytes); };
  switch (attribute) {
  case CUBLASLT_MATMUL_DESC_TRANSA: return take(&d.trans_a);
  case CUBLASLT_MATMUL_DESC_TRANSB: return take(&d.trans_b);
  case CUBLASLT_MATMUL_DESC_POINTER_MODE: return take(&d.pointer_mode);
  case CUBLASLT_MATMUL_DESC_EPILOGUE: return take(&d.epilogue);
  default:
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                  "descriptor attribute " + std::to_string(attribute) + " is not emulated");
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  *layout = reinterpret_cast<cublasLtMatrixLayout_t>(new Layout{type, rows, cols, ld});
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete reinterpret_cast<Layout *>(layout);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                cublasLtMatrixLayoutAttribute_t attribute,
                                                const void *value, size_t bytes) {
  Layout &l = *reinterpret_cast<Layout *>(layout);
  auto take = [&](auto *field) { return set_attribute(field, value, bytes); };
  switch (attribute) {
  case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return take(&l.batch);
  case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return take(&l.stride);
  case CUBLASLT_MATRIX_LAYOUT_ORDER: return take(&l.order);
  default:
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                  "layout attribute " + std::to_string(attribute) + " is not emulated");
  }
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *preference) {
  *preference = reinterpret_cast<cublasLtMatmulPreference_t>(new Preference);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t preference) {
  delete reinterpret_cast<Preference *>(preference);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t preference,
                                                    cublasLtMatmulPreferenceAttributes_t attribute,
                                                    const void *value, size_t bytes) {
  Preference &p = *reinterpret_cast<Preference *>(preference);
  auto take = [&](auto *field) { return set_attribute(field, value, bytes); };
  switch (attribute) {
  case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return take(&p.workspace);
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return take(&p.alignment[0]);
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return take(&p.alignment[1]);
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return take(&p.alignment[2]);
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return take(&p.alignment[3]);
  default:
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                  "preference attribute " + std::to_string(attribute) + " is not emulated");
  }
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t preference, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int *returned) {
  *returned = 0;
  if (requested < 1) return refuse(CUBLAS_STATUS_INVALID_VALUE, "no algorithm requested");
  const std::string error =
      shape_error(*reinterpret_cast<Desc *>(desc), *reinterpret_cast<Layout *>(a),
                  *reinterpret_cast<Layout *>(b), *reinterpret_cast<Layout *>(c),
                  *reinterpret_cast<Layout *>(d));
  if (!error.empty()) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, error);
  const Preference &p = *reinterpret_cast<Preference *>(preference);
  for (uint32_t alignment : p.alignment)
    if (alignment == 0 || (alignment & (alignment - 1)) != 0)
      return refuse(CUBLAS_STATUS_INVALID_VALUE, "an alignment that is not a power of two");
  cublasLtMatmulHeuristicResult_t &r = results[0];
  std::memset(&r, 0, sizeof r);
  // The algorithm remembers the alignments it was chosen for.
  std::memcpy(r.algo.data, p.alignment, sizeof p.alignment);
  r.algo.data[7] = kMagic;
  r.workspaceSize = 0;
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void *alpha,
                              const void *a, cublasLtMatrixLayout_t a_layout, const void *b,
                              cublasLtMatrixLayout_t b_layout, const void *beta, const void *c,
                              cublasLtMatrixLayout_t c_layout, void *d,
                              cublasLtMatrixLayout_t d_layout, const cublasLtMatmulAlgo_t *algo,
                              void *, size_t, cudaStream_t stream) {
  const Desc o = *reinterpret_cast<Desc *>(desc);
  const Layout la = *reinterpret_cast<Layout *>(a_layout),
               lb = *reinterpret_cast<Layout *>(b_layout),
               lc = *reinterpret_cast<Layout *>(c_layout),
               ld = *reinterpret_cast<Layout *>(d_layout);
  const std::string error = shape_error(o, la, lb, lc, ld);
  if (!error.empty()) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, error);
  if (algo == nullptr || algo->data[7] != kMagic)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "an algorithm the heuristic did not return");
  uint32_t alignment[4];
  std::memcpy(alignment, algo->data, sizeof alignment);
  const size_t in = element_bytes(la.type);
  if (!aligned(a, la.batch > 1 ? la.stride : 0, in, alignment[0]) ||
      !aligned(b, lb.batch > 1 ? lb.stride : 0, in, alignment[1]) ||
      !aligned(c, lc.batch > 1 ? lc.stride : 0, 4, alignment[2]) ||
      !aligned(d, ld.batch > 1 ? ld.stride : 0, 4, alignment[3]))
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                  "an operand less aligned than the algorithm was chosen for");
  const bool device_scalars = o.pointer_mode == CUBLASLT_POINTER_MODE_DEVICE;
  // Host scalars are read now, as cuBLASLt reads them at the call.
  const float host_alpha = device_scalars ? 0 : *static_cast<const float *>(alpha);
  const float host_beta = device_scalars ? 0 : *static_cast<const float *>(beta);
  const bool tf32 = o.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  const cudaError_t enqueued = enqueue(stream, "cublasLtMatmul", [=] {
    const double s_alpha = device_scalars ? *static_cast<const float *>(alpha) : host_alpha;
    const double s_beta = device_scalars ? *static_cast<const float *>(beta) : host_beta;
    const uint64_t m = ld.rows, n = ld.cols;
    const uint64_t k = o.trans_a == CUBLAS_OP_N ? la.cols : la.rows;
    for (int32_t batch = 0; batch < ld.batch; ++batch) {
      const int64_t oa = batch * la.stride, ob = batch * lb.stride, oc = batch * lc.stride,
                    od = batch * ld.stride;
      std::vector<float> out(m * n);
      for (uint64_t j = 0; j < n; ++j)
        for (uint64_t i = 0; i < m; ++i) {
          double sum = 0;
          for (uint64_t p = 0; p < k; ++p) {
            const int64_t ia = o.trans_a == CUBLAS_OP_N ? static_cast<int64_t>(i + p * la.ld)
                                                        : static_cast<int64_t>(p + i * la.ld);
            const int64_t ib = o.trans_b == CUBLAS_OP_N ? static_cast<int64_t>(p + j * lb.ld)
                                                        : static_cast<int64_t>(j + p * lb.ld);
            sum += read(a, la.type, oa + ia, tf32) * read(b, lb.type, ob + ib, tf32);
          }
          double value = s_alpha * sum;
          // beta 0 given on the host: C is not read (it may hold anything).
          if (device_scalars || s_beta != 0)
            value += s_beta * static_cast<const float *>(c)[oc + i + j * lc.ld];
          out[i + j * m] = static_cast<float>(value);
        }
      for (uint64_t j = 0; j < n; ++j)
        for (uint64_t i = 0; i < m; ++i)
          static_cast<float *>(d)[od + i + j * ld.ld] = out[i + j * m];
    }
  });
  return enqueued == cudaSuccess
             ? CUBLAS_STATUS_SUCCESS
             : refuse(CUBLAS_STATUS_EXECUTION_FAILED, "the stream refused the product");
}

} // extern "C"
