// Placeholder table: filled in by the nn family.
#include "ops/registry.h"

namespace strata::ops {

std::span<const OpDef> nn_ops() { return {}; }

} // namespace strata::ops
