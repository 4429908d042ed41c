// Training checkpoints: a folder holding
//   model-step<K>.safetensors (one process) or
//   model-step<K>-rank<R>-of<N>.safetensors (one per rank of N)
//                      the parameter and state tensors (optimizer moments,
//                      "optimizer.step"), keyed by tensor name; any safetensors
//                      reader (PyTorch, Hugging Face) can load them. A tensor
//                      that ZeRO-1 keeps in pieces is stored as its flat pieces
//                      "<name>@shard<i>of<n>", one per holder;
//   manifest.json      format version, the plan fingerprint, the step count,
//                      the number of ranks and, per file, its size and SHA-256.
// Every file is written through a temporary file, fsync and rename. The data
// files of a step have names of their own, and the manifest is replaced only
// after all of them are durable (every rank's), so a save interrupted at any
// point leaves the previous manifest and the files it lists intact: the
// previous checkpoint stays loadable. After the commit strata removes only
// its own files: those the replaced manifest listed, and data files under
// its own names (above) that the new one does not list (a save cut short).
// Any other file in the folder is left alone. Version 1 folders (one
// model.safetensors) still read.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "graph/host_tensor.h"

namespace strata::serialization {

inline constexpr int kCheckpointFormatVersion = 2;
inline constexpr const char *kCheckpointManifestFile = "manifest.json";

struct Checkpoint {
  int64_t step = 0;                           // training steps completed
  std::string fingerprint;                    // of the plan that wrote it
  int ranks = 1;                              // processes that wrote it
  std::map<std::string, HostTensor> tensors;  // from every file, pieces as stored
  std::map<std::string, std::string> file_of; // tensor name -> the file it came from
};

// One data file of a checkpoint, as the manifest lists it.
struct CheckpointFile {
  std::string name;
  uint64_t size = 0;
  std::string sha256;
};

// "model-step5.safetensors", "model-step5-rank1-of4.safetensors".
std::string checkpoint_file_name(int64_t step, int rank, int ranks);
// True for exactly the names checkpoint_file_name gives.
bool is_checkpoint_data_name(std::string_view name);

// Writes `tensors` durably into `dir`/`name` (`dir` is created if missing) and
// returns its manifest entry, checksummed from what is on disk.
Result<CheckpointFile> write_checkpoint_file(const std::string &dir, const std::string &name,
                                             const std::map<std::string, HostTensor> &tensors);

// Replaces the manifest (atomically) with one listing `files`, then removes
// the files the replaced manifest listed and unlisted files named as
// checkpoint_file_name names them (saves that never committed); every other
// file in `dir` stays.
Status commit_checkpoint(const std::string &dir, std::string_view fingerprint, int64_t step,
                         int ranks, const std::vector<CheckpointFile> &files);

// One process's checkpoint: one data file, then the commit.
Status write_checkpoint(const std::string &dir, const std::map<std::string, HostTensor> &tensors,
                        std::string_view fingerprint, int64_t step);

// Reads and verifies the checkpoint in `dir`: manifest format, fingerprint
// (must equal `expected_fingerprint` unless that is empty), each file's size and
// checksum, then the tensors. Errors name the file and field or tensor.
Result<Checkpoint> read_checkpoint(const std::string &dir, std::string_view expected_fingerprint);

} // namespace strata::serialization
