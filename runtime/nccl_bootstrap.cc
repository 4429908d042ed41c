#include "runtime/nccl_bootstrap.h"

#include <cstring>
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

Result<std::unique_ptr<NcclComm>> nccl_init_rank(const std::string &id, int ranks, int rank,
                                                 std::chrono::milliseconds timeout) {
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
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (result == ncclInProgress && comm != nullptr) {
    if (std::chrono::steady_clock::now() > deadline) {
      ncclCommAbort(comm);
      return deadline_exceeded("NCCL communicator init (rank ", rank, " of ", ranks,
                               ") did not finish within ", timeout.count(), " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ncclCommGetAsyncError(comm, &result);
  }
  if (result != ncclSuccess) {
    std::string detail = ncclGetLastError(comm);
    if (comm != nullptr) ncclCommAbort(comm);
    return failed_precondition("NCCL communicator init (rank ", rank, " of ", ranks,
                               ") failed: ", ncclGetErrorString(result), detail.empty() ? "" : ": ",
                               detail);
  }
  class Comm : public NcclComm {
  public:
    explicit Comm(ncclComm_t comm) : comm_(comm) {}
    ~Comm() override { ncclCommDestroy(comm_); }
    void *handle() const override { return comm_; }

  private:
    ncclComm_t comm_;
  };
  return std::unique_ptr<NcclComm>(new Comm(comm));
#else
  (void)id, (void)ranks, (void)rank, (void)timeout;
  return unimplemented("this strata was built without NCCL");
#endif
}

} // namespace strata::runtime
