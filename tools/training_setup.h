// What a training run needs before its first step, for `strata run` and the
// Python module's Plan.trainer: the batches it cycles through and the
// checkpoint folder it saves into, held for the run.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/trainer.h"
#include "serialization/checkpoint.h"
#include "serialization/plan_io.h"

namespace strata::tools {

// The batches of a training run: `data_dir`'s (<input>.npy for every graph
// input, batches stacked on a new first dim), or without one 8 fixed
// synthetic batches drawn from `seed`. A pipeline plan's batches are whole
// steps: every replica's micro-batches.
Result<runtime::Dataset> training_data(const serialization::Plan &plan, const std::string &data_dir,
                                       uint64_t seed);

// Whether the folder `dir` holds a checkpoint (a manifest: its first save
// finished), which a save into it would replace.
bool holds_checkpoint(const std::string &dir);

// Claims the folder `checkpoint` (unless empty) for one training run: a
// folder this process may write into, holding no checkpoint of another run
// (one that `resume` names is this run's own), locked against other runs by
// rank 0 (or the only process), which commits every checkpoint. The lock is
// held until the returned value goes. Errors name the two settings as the
// caller's user gave them: `checkpoint_option` and `resume_option` are
// "--checkpoint" and "--resume" for `strata run`, "checkpoint=" and
// "resume=" for Python.
Result<std::optional<serialization::CheckpointLock>>
claim_checkpoint_folder(const std::string &checkpoint, const std::string &resume, int rank,
                        std::string_view checkpoint_option, std::string_view resume_option);

} // namespace strata::tools
