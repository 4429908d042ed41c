// NCCL bootstrap over the processes of a run: rank 0 makes the unique id (an
// opaque 128-byte token naming the communicator), every rank receives it
// through the ProcessGroup (MPI across processes), and each then creates its
// NCCL communicator from it. The sharing is transport-independent and tested
// without a GPU; making the id and the communicator needs NCCL (and a GPU for
// the communicator).
#pragma once

#include <functional>
#include <string>

#include "runtime/device_world.h"

namespace strata::runtime {

// Whether this build has NCCL.
bool nccl_built();

// Rank 0 calls `make_id` and every rank returns its bytes; a failure on rank 0
// reaches every rank as an error naming it.
Result<std::string> share_unique_id(ProcessGroup &processes,
                                    const std::function<Result<std::string>()> &make_id);

// ncclGetUniqueId, as bytes (an error naming NCCL's reason where it fails, or
// saying the build has no NCCL).
Result<std::string> nccl_unique_id();

} // namespace strata::runtime
