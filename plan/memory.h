// What a plan's devices need in memory, known before anything is allocated.
#pragma once

#include <cstdint>

#include "serialization/plan_io.h"

namespace strata::plan {

// Bytes device `d` of `plan` needs: its arena plus its held tensors (a ZeRO-1
// or ZeRO-2 shard counts its share; ZeRO-2's gradient shards are in the arena).
int64_t device_memory(const serialization::Plan &plan, size_t device);

} // namespace strata::plan
