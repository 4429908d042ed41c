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
#include <string_view>

#include "runtime/comm/device_world.h"

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

// Asked while an NCCL call is polled: an error (another rank failed) stops
// the wait early with that error.
using NcclCheck = std::function<Status()>;

// An NCCL communicator (ncclComm_t); destroying it destroys the communicator.
class NcclComm {
public:
  virtual ~NcclComm() = default;
  virtual void *handle() const = 0; // the ncclComm_t
  // Ends the communicator at once (ncclCommAbort): kernels waiting on a peer
  // return and later calls fail. For a run that failed; idempotent.
  virtual void abort() = 0;
};

// ncclCommInitRank for rank `rank` of `ranks` on the current CUDA device, from
// the shared id, without blocking: NCCL's non-blocking init is polled until it
// completes, fails (an error naming NCCL's reason: no GPU, a network error) or
// runs past `timeout` (then aborted, so no rank hangs on another that never
// joins).
Result<std::unique_ptr<NcclComm>> nccl_init_rank(const std::string &id, int ranks, int rank,
                                                 std::chrono::milliseconds timeout,
                                                 const NcclCheck &check = {});

// ncclCommSplit over `parent` (collective: every rank of it calls it, in the
// same order): the ranks passing one color >= 0 get a communicator of their
// own, ranked by `key`; a rank passing -1 takes part and gets null. Polled
// like nccl_init_rank and bounded by `timeout`; a split that does not finish
// aborts `parent` (NCCL would otherwise finish it later, unwaited for).
Result<std::unique_ptr<NcclComm>> nccl_split(NcclComm &parent, int color, int key,
                                             std::chrono::milliseconds timeout,
                                             const NcclCheck &check = {});

// After an NCCL call on a non-blocking communicator returned `result` (an
// ncclResult_t): OK once NCCL has enqueued it (polling while it is in
// progress, at most `timeout`), else an error naming `what` and NCCL's reason.
Status nccl_settle(NcclComm &comm, int result, std::string_view what,
                   std::chrono::milliseconds timeout, const NcclCheck &check = {});

// The communicator's asynchronous error (a peer gone, a network failure)
// as an error naming `what`; OK while there is none.
Status nccl_async_error(const NcclComm &comm, std::string_view what);

} // namespace strata::runtime
