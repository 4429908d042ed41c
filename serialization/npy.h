// NumPy .npy files (format versions 1.0 to 3.0), for graph inputs and outputs.
//
// Reading accepts little-endian f32, f16, i32, i64 and bool arrays in C order;
// bf16 has no NumPy dtype and is refused. Writing produces version 1.0 files that
// numpy.load reads.
#pragma once

#include <string>

#include "graph/host_tensor.h"

namespace strata::serialization {

Result<HostTensor> read_npy(const std::string &path);
Result<HostTensor> parse_npy(llvm::ArrayRef<uint8_t> bytes, std::string_view display_name);
Status write_npy(const std::string &path, const HostTensor &tensor);
std::vector<uint8_t> npy_bytes(const HostTensor &tensor);

} // namespace strata::serialization
