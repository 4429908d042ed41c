// `strata inspect CKPT`: what a checkpoint folder holds, for people and for
// scripts. Reading it verifies every file's size and SHA-256, as a resume
// does, so a report is also a check that the checkpoint is whole.
#pragma once

#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "graph/status.h"

namespace strata::tools {

// The report of the checkpoint in `dir`: path, step, fingerprint, ranks,
// files, and from its layout record (manifest format 3) model, optimizer,
// layout and per tensor its role, dtype, whole shape and how it is stored
// ("whole", tensor-parallel pieces, ZeRO shards); totals per role. Without a
// record, the stored tensors as they are. Errors are read_checkpoint's.
Result<nlohmann::ordered_json> checkpoint_report(const std::string &dir);

// The report for people: a header, then a row per tensor (all of them, or
// the first `max_rows`).
void print_checkpoint_text(const nlohmann::ordered_json &report, int64_t max_rows,
                           std::ostream &out);

} // namespace strata::tools
