// Placeholder table: filled in by the reduction family.
#include "ops/registry.h"

namespace strata::ops {

std::span<const OpDef> reduction_ops() { return {}; }

} // namespace strata::ops
