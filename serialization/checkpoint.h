// Training checkpoints: a folder holding
//   model-step<K>.safetensors (one process) or
//   model-step<K>-rank<R>-of<N>.safetensors (one per rank of N)
//                      the parameter and state tensors (optimizer moments,
//                      "optimizer.step"), keyed by tensor name; any safetensors
//                      reader (PyTorch, Hugging Face) can load them. A tensor
//                      that ZeRO-1 keeps in pieces is stored as its flat pieces
//                      "<name>@shard<i>of<n>", one per holder;
//   manifest.json      format version, the plan fingerprint, the step count,
//                      the number of ranks and, per file, its size and SHA-256;
//                      from version 3 also the layout record (CheckpointLayout,
//                      below): the model and optimizer it trains, the layout
//                      it was written in, and every tensor's whole type and how
//                      it was cut, so any plan of the same model and
//                      optimizer can put the pieces back together;
//   .strata.lock       what CheckpointLock (below) locks, where a run took it.
// Every file is written through a temporary file, fsync and rename. The data
// files of a step have names of their own, and the manifest is replaced only
// after all of them are durable (every rank's), so a save interrupted at any
// point leaves the previous manifest and the files it lists intact: the
// previous checkpoint stays loadable. After the commit strata removes only
// its own files: those the replaced manifest listed, and data files under
// its own names (above) that the new one does not list (a save cut short).
// Any other file in the folder is left alone. Version 1 folders (one
// model.safetensors) and version 2 manifests (no layout record) still read.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "graph/host_tensor.h"
#include "serialization/file_io.h"

namespace strata::serialization {

inline constexpr int kCheckpointFormatVersion = 3;
inline constexpr const char *kCheckpointManifestFile = "manifest.json";
inline constexpr const char *kCheckpointLockFile = ".strata.lock";

// How a tensor-parallel plan cut a tensor into the pieces a checkpoint holds
// as "<name>@tp<m>of<parts>": the whole tensor viewed along `dim` as
// [outer, parts, m] (plan::copy_piece; PlanShard's dim and outer).
struct TensorCut {
  int32_t dim = 0;
  int64_t outer = 1;
  int32_t parts = 1;
  friend bool operator==(const TensorCut &, const TensorCut &) = default;
};

// One parameter or state tensor of a checkpoint as the model has it.
struct CheckpointTensor {
  bool parameter = false; // a model parameter (else optimizer or other state)
  TensorType type;        // whole
  std::optional<TensorCut> cut; // stored in tensor-parallel pieces
  friend bool operator==(const CheckpointTensor &, const CheckpointTensor &) = default;
};

// What a checkpoint is of, independent of the layout that wrote it (format
// version 3): resuming on another plan needs the same model and optimizer,
// and reads every tensor's pieces back by this record. Empty (no tensors)
// for checkpoints written before it existed.
struct CheckpointLayout {
  std::string model;       // hex SHA-256 of the source model (Plan::model_fingerprint)
  std::string optimizer;   // canonical optimizer string (Plan::optimizer)
  std::string description; // for people: "mesh 1x1x2, 4 micro-batches (1f1b), 2 ranks"
  std::map<std::string, CheckpointTensor> tensors; // by name
  bool empty() const { return tensors.empty(); }
  friend bool operator==(const CheckpointLayout &, const CheckpointLayout &) = default;
};

struct Checkpoint {
  int64_t step = 0;                           // training steps completed
  std::string fingerprint;                    // of the plan that wrote it
  int ranks = 1;                              // processes that wrote it
  CheckpointLayout layout;                    // empty before format version 3
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

// What a data file's name says about it: the step of the save and the rank
// of how many that wrote it (rank 0 of 1 for "model-step5.safetensors").
struct CheckpointDataName {
  int64_t step = 0;
  int rank = 0;
  int ranks = 1;
};
// The parts of a name checkpoint_file_name gives; nullopt for any other name
// and for numbers too large for their fields.
std::optional<CheckpointDataName> parse_checkpoint_data_name(std::string_view name);

// Writes `tensors` durably into `dir`/`name` (`dir` is created if missing) and
// returns its manifest entry, checksummed from what is on disk.
Result<CheckpointFile> write_checkpoint_file(const std::string &dir, const std::string &name,
                                             const std::map<std::string, HostTensor> &tensors);

// Replaces the manifest (atomically) with one listing `files`, then removes
// the files the replaced manifest listed and unlisted files named as
// checkpoint_file_name names them (saves that never committed); every other
// file in `dir` stays. Before anything changes, refuses `files` that
// read_checkpoint would refuse by name (a path, a file of another step or
// rank count, a rank twice or none) and files that are not in `dir` as they
// were written: missing, of another size or unreadable. With MPI each rank
// writes its own file and rank 0 commits, so ranks that do not share a
// filesystem (or were given different folders) each wrote into a folder of
// their own; the error names each such file and the rank that wrote it.
// `layout` is recorded in the manifest unless it is empty.
Status commit_checkpoint(const std::string &dir, std::string_view fingerprint, int64_t step,
                         int ranks, const std::vector<CheckpointFile> &files,
                         const CheckpointLayout &layout = {});

// One process's checkpoint: one data file, then the commit.
Status write_checkpoint(const std::string &dir, const std::map<std::string, HostTensor> &tensors,
                        std::string_view fingerprint, int64_t step,
                        const CheckpointLayout &layout = {});

// Holds a checkpoint folder for one training run, so that no other run saves
// into it meanwhile: an exclusive flock(2) on `dir`/.strata.lock, released
// when the object goes away or the process ends, however it ends. The file
// records the holder as "<pid> <host>" for the error another run gets. It
// stays in the folder after the run: were it removed, a run that opened it
// just before and one that created it anew would lock different files.
// One process per run takes it (with MPI, rank 0, which commits every
// checkpoint; the other ranks write only inside the saves it leads).
class CheckpointLock {
public:
  // Creates `dir` if needed and takes the lock without waiting, then removes
  // the temporary files of saves killed mid-write (".model-step5.safetensors
  // .tmp.AbC123" and the like, strata's exact patterns only): with the lock
  // held, no save is writing one. Errors name the folder or the lock file and
  // the cause: the operating system's reason (a name too long, no
  // permission, no flock on this file system), or the pid and host of the run
  // that holds the lock.
  static Result<CheckpointLock> acquire(const std::string &dir);

private:
  explicit CheckpointLock(std::unique_ptr<FileDescriptor> fd) : fd_(std::move(fd)) {}
  std::unique_ptr<FileDescriptor> fd_;
};

// Reads and verifies the checkpoint in `dir`: manifest format, fingerprint
// (must equal `expected_fingerprint` unless that is empty), the layout
// record's fields, that the files
// it lists under checkpoint_file_name's names are of its step and rank count
// (every rank once), each file's size and checksum, then the tensors. Errors
// name the file and field or tensor.
Result<Checkpoint> read_checkpoint(const std::string &dir, std::string_view expected_fingerprint);

// The fingerprint of the plan that wrote the checkpoint in `dir`, from its
// manifest alone (no data file is read); the manifest's errors are
// read_checkpoint's.
Result<std::string> read_checkpoint_fingerprint(const std::string &dir);

} // namespace strata::serialization
