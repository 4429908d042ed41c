#include "ops/kernels/cuda/cuda_status.h"

namespace strata::cuda {
namespace {

// Errors that say this machine cannot run CUDA work now, whatever strata asks:
// no device, no driver or one that does not match the toolkit, a GPU the
// build has no code for.
bool device_unavailable(cudaError_t error) {
  switch (error) {
  case cudaErrorNoDevice:
  case cudaErrorInvalidDevice:
  case cudaErrorDevicesUnavailable:
  case cudaErrorInsufficientDriver:
  case cudaErrorStubLibrary:
  case cudaErrorInitializationError:
  case cudaErrorStartupFailure:
  case cudaErrorSystemNotReady:
  case cudaErrorSystemDriverMismatch:
  case cudaErrorCompatNotSupportedOnDevice:
  case cudaErrorNoKernelImageForDevice:
  case cudaErrorUnsupportedPtxVersion: return true;
  default: return false;
  }
}

// cuBLAS has cublasGetStatusString, but not every cuBLAS strata links against
// (the CUDA emulator's) does; the names are stable.
const char *cublas_status_name(cublasStatus_t status) {
  switch (status) {
  case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
  case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
  case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
  case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
  case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
  case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
  case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
  case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  default: return "an unknown cuBLAS status";
  }
}

#if STRATA_HAVE_CUDNN
// cuDNN 9 splits each category of error by cause; these two are allocations.
bool cudnn_out_of_memory(cudnnStatus_t status) {
  return status == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
         status == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED;
}

// cuDNN cannot start or run here: its sub-libraries missing or mismatched, a
// driver or CUDA runtime it does not support, a GPU it has no code for.
bool cudnn_unavailable(cudnnStatus_t status) {
#if CUDNN_VERSION >= 90200
  if (status == CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED) return true;
#endif
  return status == CUDNN_STATUS_NOT_INITIALIZED ||
         status == CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH ||
         status == CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER ||
         status == CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART ||
         status == CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH ||
         status == CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING ||
         status == CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE;
}
#endif

} // namespace

Status cuda_status(cudaError_t error, std::string_view what) {
  if (error == cudaSuccess) return Status::ok();
  cudaGetLastError(); // reported here, so by no later call
  const char *reason = cudaGetErrorString(error);
  if (error == cudaErrorMemoryAllocation)
    return resource_exhausted("CUDA ", what, ": out of GPU memory (", reason, ")");
  if (device_unavailable(error)) return unavailable("CUDA ", what, ": ", reason);
  return internal_error("CUDA ", what, ": ", reason);
}

Status cublas_status(cublasStatus_t status, std::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return Status::ok();
  // A failure inside the library may leave CUDA's error behind.
  cudaGetLastError();
  const char *reason = cublas_status_name(status);
  if (status == CUBLAS_STATUS_ALLOC_FAILED)
    return resource_exhausted("cuBLASLt ", what, ": out of memory (", reason, ")");
  if (status == CUBLAS_STATUS_NOT_INITIALIZED || status == CUBLAS_STATUS_ARCH_MISMATCH)
    return unavailable("cuBLASLt ", what, ": ", reason);
  return internal_error("cuBLASLt ", what, ": ", reason);
}

#if STRATA_HAVE_CUDNN
Status cudnn_status(cudnnStatus_t status, std::string_view what) {
  if (status == CUDNN_STATUS_SUCCESS) return Status::ok();
  // A failure inside the library may leave CUDA's error behind.
  cudaGetLastError();
  const char *reason = cudnnGetErrorString(status);
  if (cudnn_out_of_memory(status))
    return resource_exhausted("cuDNN ", what, ": out of memory (", reason, ")");
  if (cudnn_unavailable(status)) return unavailable("cuDNN ", what, ": ", reason);
  return internal_error("cuDNN ", what, ": ", reason);
}
#endif

} // namespace strata::cuda
