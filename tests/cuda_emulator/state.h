// The CUDA emulator's error state, shared by its files (not for tests).
#pragma once

#include <cuda_runtime.h>

#include <string>

namespace strata::cuda_emulator::detail {

// The calling thread's last error becomes `code` (with `message`, kept for
// last_error_message()); returns `code`.
cudaError_t set_error(cudaError_t code, std::string message);
// A fault of the device, as a failed kernel is: every later call returns it
// until reset(). Returns `code`.
cudaError_t fault(cudaError_t code, std::string message);
// The sticky fault, or cudaSuccess.
cudaError_t sticky();
// cudaGetLastError: the last error (or the sticky fault), then cleared.
cudaError_t take_error();
cudaError_t peek_error();
// A message for last_error_message() alone (a library's failure, which has
// no CUDA error code).
void note(std::string message);

} // namespace strata::cuda_emulator::detail
