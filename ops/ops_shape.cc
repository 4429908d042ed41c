// Placeholder table: filled in by the shape family.
#include "ops/registry.h"

namespace strata::ops {

std::span<const OpDef> shape_ops() { return {}; }

} // namespace strata::ops
