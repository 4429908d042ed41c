// Placeholder table: filled in by the elementwise family.
#include "ops/registry.h"

namespace strata::ops {

std::span<const OpDef> elementwise_ops() { return {}; }

} // namespace strata::ops
