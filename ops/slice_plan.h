// What a Slice reads, from its attributes (ONNX clamping applied); shared by
// the CPU kernels of Slice and SliceGrad and the CUDA backend.
#pragma once

#include "ops/registry.h"

namespace strata::ops {

// Per dimension of the sliced tensor: first index, step and output length.
struct SlicePlan {
  Shape start;
  Shape step;
  Shape length;
};

// The plan of Slice node `node` over `x`; an error names the attribute at fault.
Result<SlicePlan> plan_slice(const Node &node, const OpDef &def, const TensorType &x);

} // namespace strata::ops
