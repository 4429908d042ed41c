#include "runtime/cuda/nccl_bootstrap.h"

#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "strata_config.h"

#if STRATA_HAVE_NCCL
#include <nccl.h>
#endif

namespace strata::runtime {

bool nccl_built() { return STRATA_HAVE_NCCL != 0; }

Result<std::string> share_unique_id(ProcessGroup &processes,
                                    const std::function<Result<std::string>()> &make_id) {
  // The first byte says whether rank 0 made an id ('1') or failed ('0').
  std::string message;
  if (processes.rank() == 0) {
    auto id = make_id();
    message = id.is_ok() ? "1" + *id : "0" + id.status().message();
  }
  RETURN_IF_ERROR(processes.broadcast(&message, "NCCL unique id"));
  if (message.empty() || message[0] != '1')
    return failed_precondition("rank 0 could not make the NCCL unique id: ",
                               message.empty() ? "no reason given" : message.substr(1));
  return message.substr(1);
}

Result<std::string> nccl_unique_id() {
#if STRATA_HAVE_NCCL
  ncclUniqueId id;
  ncclResult_t result = ncclGetUniqueId(&id);
  if (result != ncclSuccess)
    return failed_precondition("ncclGetUniqueId failed: ", ncclGetErrorString(result));
  return std::string(id.internal, sizeof id.internal);
#else
  return unimplemented("this strata was built without NCCL");
#endif
}

#if STRATA_HAVE_NCCL
namespace {

// An NCCL call's failure on a communicator that is up: a peer, the network or
// the operating system refusing (ncclRemoteError, ncclSystemError) is
// unavailable, a condition of the run; anything else is a bug in strata.
Status nccl_failure(ncclResult_t result, std::string_view what, const std::string &detail) {
  std::string text =
      str_cat("NCCL ", what, ": ", ncclGetErrorString(result), detail.empty() ? "" : ": ", detail);
  if (result == ncclRemoteError || result == ncclSystemError) return unavailable(std::move(text));
  return internal_error(std::move(text));
}

class Comm : public NcclComm {
public:
  explicit Comm(ncclComm_t comm) : comm_(comm) {}
  ~Comm() override {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
  }
  void *handle() const override { return comm_; }
  void abort() override {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

private:
  ncclComm_t comm_;
};

// Polls `comm` while NCCL reports a call in progress (spinning for a
// millisecond, then napping), until `deadline` (`late`) or until `check`
// fails (`stopped`); the last result.
ncclResult_t poll(ncclComm_t comm, ncclResult_t result,
                  std::chrono::steady_clock::time_point deadline, const NcclCheck &check,
                  bool *late, Status *stopped) {
  *late = false;
  const auto spin_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1);
  while (result == ncclInProgress && comm != nullptr) {
    const auto now = std::chrono::steady_clock::now();
    if (now > deadline) {
      *late = true;
      return result;
    }
    if (check) {
      Status status = check();
      if (!status.is_ok()) {
        *stopped = std::move(status);
        return result;
      }
    }
    if (now < spin_until) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    ncclCommGetAsyncError(comm, &result);
  }
  return result;
}

} // namespace
#endif

Result<std::unique_ptr<NcclComm>> nccl_init_rank(const std::string &id, int ranks, int rank,
                                                 std::chrono::milliseconds timeout,
                                                 const NcclCheck &check) {
#if STRATA_HAVE_NCCL
  ncclUniqueId unique;
  if (id.size() != sizeof unique.internal)
    return invalid_argument("an NCCL unique id has ", sizeof unique.internal, " bytes, got ",
                            id.size());
  std::memcpy(unique.internal, id.data(), id.size());
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t result = ncclCommInitRankConfig(&comm, ranks, unique, rank, &config);
  bool late = false;
  Status stopped = Status::ok();
  result = poll(comm, result, std::chrono::steady_clock::now() + timeout, check, &late, &stopped);
  if (late || !stopped.is_ok()) {
    ncclCommAbort(comm);
    if (!stopped.is_ok()) return stopped;
    return deadline_exceeded("NCCL communicator init (rank ", rank, " of ", ranks,
                             ") did not finish within ", timeout.count(), " ms");
  }
  if (result != ncclSuccess) {
    std::string detail = ncclGetLastError(comm);
    if (comm != nullptr) ncclCommAbort(comm);
    return failed_precondition("NCCL communicator init (rank ", rank, " of ", ranks,
                               ") failed: ", ncclGetErrorString(result), detail.empty() ? "" : ": ",
                               detail);
  }
  return std::unique_ptr<NcclComm>(new Comm(comm));
#else
  (void)id, (void)ranks, (void)rank, (void)timeout, (void)check;
  return unimplemented("this strata was built without NCCL");
#endif
}

Result<std::unique_ptr<NcclComm>> nccl_split(NcclComm &parent, int color, int key,
                                             std::chrono::milliseconds timeout,
                                             const NcclCheck &check) {
#if STRATA_HAVE_NCCL
  auto *from = static_cast<ncclComm_t>(parent.handle());
  if (from == nullptr) return failed_precondition("NCCL split of a communicator already ended");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  // NCCL writes the new communicator when the split completes, which may be
  // after a wait given up on: the slot must outlive this call then (leaked).
  auto slot = std::make_unique<ncclComm_t>(nullptr);
  ncclResult_t result =
      ncclCommSplit(from, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, slot.get(), &config);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool late = false;
  Status stopped = Status::ok();
  result = poll(from, result, deadline, check, &late, &stopped);
  if (result == ncclSuccess && *slot != nullptr) {
    ncclCommGetAsyncError(*slot, &result);
    result = poll(*slot, result, deadline, check, &late, &stopped);
  }
  if (late || !stopped.is_ok()) {
    parent.abort(); // ends the split too
    (void)slot.release();
    if (!stopped.is_ok()) return stopped;
    return deadline_exceeded("NCCL communicator split (color ", color, ") did not finish within ",
                             timeout.count(), " ms");
  }
  ncclComm_t comm = *slot;
  if (result != ncclSuccess) {
    std::string detail = ncclGetLastError(comm != nullptr ? comm : from);
    if (comm != nullptr) ncclCommAbort(comm);
    return failed_precondition("NCCL communicator split (color ", color,
                               ") failed: ", ncclGetErrorString(result), detail.empty() ? "" : ": ",
                               detail);
  }
  if (comm == nullptr) return std::unique_ptr<NcclComm>();
  return std::unique_ptr<NcclComm>(new Comm(comm));
#else
  (void)parent, (void)color, (void)key, (void)timeout, (void)check;
  return unimplemented("this strata was built without NCCL");
#endif
}

Status nccl_settle(NcclComm &comm, int result, std::string_view what,
                   std::chrono::milliseconds timeout, const NcclCheck &check) {
#if STRATA_HAVE_NCCL
  auto *handle = static_cast<ncclComm_t>(comm.handle());
  bool late = false;
  Status stopped = Status::ok();
  const auto status = poll(handle, static_cast<ncclResult_t>(result),
                           std::chrono::steady_clock::now() + timeout, check, &late, &stopped);
  if (!stopped.is_ok()) return stopped;
  if (late)
    return deadline_exceeded("NCCL ", what, " was not enqueued within ", timeout.count(), " ms");
  if (status != ncclSuccess)
    return nccl_failure(status, what, handle != nullptr ? ncclGetLastError(handle) : "");
  return Status::ok();
#else
  (void)comm, (void)result, (void)what, (void)timeout, (void)check;
  return unimplemented("this strata was built without NCCL");
#endif
}

Status nccl_async_error(const NcclComm &comm, std::string_view what) {
#if STRATA_HAVE_NCCL
  auto *handle = static_cast<ncclComm_t>(comm.handle());
  if (handle == nullptr)
    return failed_precondition("NCCL ", what, ": the communicator was aborted");
  ncclResult_t result = ncclSuccess;
  ncclCommGetAsyncError(handle, &result);
  if (result == ncclSuccess || result == ncclInProgress) return Status::ok();
  return nccl_failure(result, what, ncclGetLastError(handle));
#else
  (void)comm, (void)what;
  return unimplemented("this strata was built without NCCL");
#endif
}

} // namespace strata::runtime
