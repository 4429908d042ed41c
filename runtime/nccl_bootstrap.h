// NCCL bootstrap over the processes of a run: rank 0 makes the unique id (an
// opaque 128-byte token naming the communicator), every rank receives it
// through the ProcessGroup (MPI across processes), and each then creates its
// NCCL communicator from it. The sharing is transport-independent and tested
// without a GPU; making the id and the communicator needs NCCL (and a GPU for
// the communicator).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
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

// An NCCL communicator (ncclComm_t); destroying it destroys the communicator.
class NcclComm {
public:
  virtual ~NcclComm() = default;
  virtual void *handle() const = 0; // the ncclComm_t
};

// ncclCommInitRank for rank `rank` of `ranks` on the current CUDA device, from
// the shared id, without blocking: NCCL's non-blocking init is polled until it
// completes, fails (an error naming NCCL's reason: no GPU, a network error) or
// runs past `timeout` (then aborted, so no rank hangs on another that never
// joins).
Result<std::unique_ptr<NcclComm>> nccl_init_rank(const std::string &id, int ranks, int rank,
                                                 std::chrono::milliseconds timeout);

} // namespace strata::runtime
