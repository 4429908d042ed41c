#include "runtime/nccl_bootstrap.h"

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

} // namespace strata::runtime
