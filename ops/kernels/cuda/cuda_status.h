// The results of CUDA, cuBLASLt and cuDNN calls as Status: the one place that
// decides what a failure of theirs means (graph/status.h's codes).
//   out of memory (the GPU's, or a library's own) -> resource_exhausted
//   no device, no driver or one too old for this toolkit, a library that
//   cannot load or run on this GPU -> unavailable
//   everything else (a launch strata got wrong, an illegal address, an
//   invalid value) -> internal, a bug in strata
// Messages read "CUDA <what>: <CUDA's reason>" ("cuBLASLt <what>: ...",
// "cuDNN <what>: ..."), with "out of GPU memory (<reason>)" for the first kind.
//
// Every failure also clears CUDA's last error (cudaGetLastError), so that no
// later call reports it again: a kernel launcher returns cudaGetLastError(),
// and an error left behind would be blamed on the next kernel. A fault of the
// device itself (an illegal address, a failed kernel) cannot be cleared: CUDA
// returns it from every later call of the process.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string_view>

#include "graph/status.h"
#include "strata_config.h"

#if STRATA_HAVE_CUDNN
#include <cudnn.h>
#endif

namespace strata::cuda {

// OK for cudaSuccess, else the error for `what` ("allocating 1.0 GiB").
Status cuda_status(cudaError_t error, std::string_view what);

// OK for CUBLAS_STATUS_SUCCESS, else the error for `what`.
Status cublas_status(cublasStatus_t status, std::string_view what);

#if STRATA_HAVE_CUDNN
// OK for CUDNN_STATUS_SUCCESS, else the error for `what`.
Status cudnn_status(cudnnStatus_t status, std::string_view what);
#endif

} // namespace strata::cuda
