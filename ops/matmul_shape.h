// The shape arithmetic of MatMul, shared by its CPU kernel and the CUDA
// backend's cuBLASLt call.
#pragma once

#include <vector>

#include "ops/registry.h"

namespace strata::ops {

// The sizes of one MatMul after 1-D promotion and transposes: the output is
// batch + [M] (unless A was 1-D) + [N] (unless B was 1-D).
struct MatMulDims {
  Shape a_batch, b_batch, batch;
  int64_t m = 0, n = 0, k = 0;
  bool a_vector = false, b_vector = false;
  bool trans_a = false, trans_b = false; // as applied (ignored on a 1-D operand)
};

// Checks and sizes a MatMul of `a` and `b` under the node's trans_a/trans_b.
Result<MatMulDims> matmul_dims(const OpDef &def, const AttrReader &attrs, const TensorType &a,
                               const TensorType &b);

// Element offsets of every output batch entry into a batch shape broadcast to
// `batch` (matrices of `matrix_size` elements).
std::vector<int64_t> batch_offsets(llvm::ArrayRef<int64_t> operand_batch,
                                   llvm::ArrayRef<int64_t> batch, int64_t matrix_size);

} // namespace strata::ops
