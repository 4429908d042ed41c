#include "plan/memory.h"

#include <algorithm>

namespace strata::plan {

int64_t device_memory(const serialization::Plan &plan, size_t device) {
  const auto &program = plan.programs[device];
  int64_t bytes = program.arena_bytes;
  int64_t shards = 1;
  if (plan.pipeline && program.shard_group >= 0 &&
      static_cast<size_t>(program.shard_group) < plan.pipeline->groups.size())
    shards = static_cast<int64_t>(plan.pipeline->groups[program.shard_group].size());
  for (TensorId id : program.holds) {
    const bool sharded =
        std::binary_search(program.sharded_holds.begin(), program.sharded_holds.end(), id);
    bytes += plan.graph.tensor(id).type.size_bytes() / (sharded ? shards : 1);
  }
  return bytes;
}

} // namespace strata::plan
