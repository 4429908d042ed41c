// Checkpoints free of layout: what a plan's checkpoints record about the
// layout they are written in (serialization::CheckpointLayout), and how any
// reader puts a checkpoint's pieces back together from that record alone.
//
// A run of several processes saves a tensor that ZeRO-1 keeps in shards as
// "<name>@shard<i>of<n>" (flat runs of its bytes, in order) and one that
// tensor parallelism cuts as "<name>@tp<m>of<T>" (cut as plan::copy_piece
// cuts it; such a piece may itself be in shards). Joined, every tensor is
// whole and the checkpoint is what one device would have saved, so a plan
// of any mesh, schedule, ZeRO stage or rank count can resume it, and
// `strata reshard` and `strata export` can rewrite it.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "graph/graph.h"
#include "graph/host_tensor.h"
#include "serialization/checkpoint.h"
#include "serialization/plan_io.h"

namespace strata::plan {

// The record for a run of `graph` on one device: every parameter and state
// tensor whole, nothing cut.
serialization::CheckpointLayout checkpoint_layout(const Graph &graph, std::string model,
                                                  std::string optimizer, std::string description);
// The record for a run of a training `plan`: its graph's parameter and state
// tensors at their whole types, with the cut of each that a tensor-parallel
// plan holds in pieces (a run of one process saves them whole: see
// without_cuts).
serialization::CheckpointLayout checkpoint_layout(const serialization::Plan &plan,
                                                  std::string description);
// `layout` with every tensor whole: what a process that saves every tensor
// whole records.
serialization::CheckpointLayout without_cuts(serialization::CheckpointLayout layout);

// For people: "one device", "mesh 2x1x2 (DPxTPxPP), 4 micro-batches, 1f1b,
// ZeRO-1, 2 ranks".
std::string layout_description(const serialization::Plan &plan, int ranks);

// Whether `checkpoint` can resume a run whose plan has `fingerprint` and
// whose layout record is `mine`: the plan that wrote it, or any plan of the
// same model and optimizer once the checkpoint records its layout. Otherwise
// an error naming `manifest` that says what differs: the model, the
// optimizer, or (format 2) that the checkpoint predates layout records.
Status check_resumable(const serialization::Checkpoint &checkpoint, std::string_view fingerprint,
                       const serialization::CheckpointLayout &mine, const std::string &manifest);

// Makes every tensor of `checkpoint` (read from `dir`) whole, in place:
// pieces joined as `layout` says (its own record, or for a checkpoint
// without one, the record of the plan that wrote it); a joined tensor's
// file_of is its first piece's. Errors name the file and the tensor: a piece
// of a tensor the record lacks or does not cut, a piece missing (a rank's
// file?), pieces of another dtype, or that do not fill their tensor.
Status join_checkpoint(serialization::Checkpoint &checkpoint,
                       const serialization::CheckpointLayout &layout, const std::string &dir);

// Whether the whole tensors of `checkpoint` (after join_checkpoint) are
// exactly the tensors of `want` at its types. Errors name the file in `dir`
// and the tensor, its role and both types.
Status check_checkpoint_tensors(const serialization::Checkpoint &checkpoint,
                                const serialization::CheckpointLayout &want,
                                const std::string &dir);

} // namespace strata::plan
