// Training checkpoints: a folder holding
//   model.safetensors  every parameter and state tensor (optimizer moments,
//                      "optimizer.step"), keyed by tensor name; any safetensors
//                      reader (PyTorch, Hugging Face) can load it;
//   manifest.json      format version, the plan fingerprint, the step count and,
//                      per file, its size and SHA-256.
// Both are written through a temporary file, fsync and rename, the manifest
// last, so a folder whose manifest verifies is a complete checkpoint; a save
// interrupted after the weights but before the manifest leaves a manifest whose
// checksum no longer matches, which reading refuses.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "graph/host_tensor.h"

namespace strata::serialization {

inline constexpr int kCheckpointFormatVersion = 1;
inline constexpr const char *kCheckpointWeightsFile = "model.safetensors";
inline constexpr const char *kCheckpointManifestFile = "manifest.json";

struct Checkpoint {
  int64_t step = 0;        // training steps completed
  std::string fingerprint; // of the plan that wrote it
  std::map<std::string, HostTensor> tensors;
};

// Writes `tensors` and the manifest into folder `dir` (created if missing).
Status write_checkpoint(const std::string &dir, const std::map<std::string, HostTensor> &tensors,
                        std::string_view fingerprint, int64_t step);

// Reads and verifies the checkpoint in `dir`: manifest format, fingerprint
// (must equal `expected_fingerprint` unless that is empty), each file's size and
// checksum, then the tensors. Errors name the file and field or tensor.
Result<Checkpoint> read_checkpoint(const std::string &dir, std::string_view expected_fingerprint);

} // namespace strata::serialization
