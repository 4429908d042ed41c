// .safetensors files: an 8-byte little-endian header length, a JSON header
// mapping tensor names to {dtype, shape, data_offsets}, then the raw data. The
// format Hugging Face and PyTorch loaders read; strata uses it for external
// weights and (later) checkpoints.
#pragma once

#include <map>
#include <string>

#include "graph/host_tensor.h"

namespace strata::serialization {

// Reads one tensor by name, checking its dtype and shape against `expected` and
// its offsets against the file size. Only that tensor's bytes are read.
Result<HostTensor> read_safetensors_tensor(const std::string &path, std::string_view key,
                                           const TensorType &expected);
// Reads every tensor of the file.
Result<std::map<std::string, HostTensor>> read_safetensors(const std::string &path);
// Writes tensors sorted by name (temporary file, fsync, rename).
Status write_safetensors(const std::string &path, const std::map<std::string, HostTensor> &tensors);

} // namespace strata::serialization
