// The smallest use of the CUDA toolkit: counts visible GPUs and runs a kernel.
#pragma once

#include <string>

namespace strata::cuda {

// Number of usable GPUs; 0 with `reason` set when there are none (no driver,
// no device), which is not an error for the caller.
int device_count(std::string *reason);

// Fills `n` floats on the GPU with `value` and copies them back to `host`;
// returns false with `reason` set on any CUDA error.
bool fill_roundtrip(float *host, int n, float value, std::string *reason);

} // namespace strata::cuda
