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

// A batched product as `outer` blocks of `inner` consecutive batch entries,
// each block one strided product: entry j * inner + i reads A at
// a_offsets[j * inner] + i * stride_a and B likewise. The largest such inner
// over the trailing batch dims (1 when nothing else fits: a product each).
// E.g. [B, H, M, K] x [H, K, N]: B blocks of H; [2, 1, M, K] x [1, 3, K, N]:
// 2 blocks of 3 (A's stride 0).
struct BatchBlocks {
  int64_t outer = 1, inner = 1;
  int64_t stride_a = 0, stride_b = 0;
};
BatchBlocks strided_batch_blocks(llvm::ArrayRef<int64_t> batch, llvm::ArrayRef<int64_t> a_offsets,
                                 llvm::ArrayRef<int64_t> b_offsets);

} // namespace strata::ops
