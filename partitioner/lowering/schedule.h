// Pipeline schedules: the order in which one device runs its per-micro-batch
// forward and backward blocks.
//
// P stages, M micro-batches; stage s (= device s). With the interleaved
// schedule the device runs v model chunks: virtual stages s, s + P, ...,
// s + (v-1) P.
//  - GPipe: F0 .. F(M-1), then B0 .. B(M-1).
//  - 1F1B (PipeDream-Flush, as in Megatron-LM): w = min(P-1-s, M) warm-up
//    forwards, then alternating F(w+i), B(i), then the remaining backwards.
//  - Interleaved (Megatron-LM's virtual pipeline, Narayanan et al. 2021): the
//    chunks take P micro-batches in turn, forwards in chunk order and
//    backwards in reverse, after min(2(P-1-s) + (v-1)P, vM) warm-up forwards
//    (all of them when M = P). M must be a multiple of P. The ideal bubble
//    shrinks from (P-1)/(M+P-1) to (P-1)/(vM+P-1), for v times the activation
//    transfers. Data-parallel replicas and ZeRO-1 work as with 1F1B; tensor
//    parallelism and recomputation are not built for it yet.
// Every schedule runs each (micro-batch, chunk) forward once and backward
// once, the forward first, and the backward of micro-batch k before that of
// k + 1 in every chunk, so gradients accumulate in the same order whatever
// the schedule.
#pragma once

#include <string_view>
#include <vector>

#include "graph/status.h"

namespace strata::partitioner {

enum class Schedule { kGPipe, k1F1B, kInterleaved };
// "gpipe", "1f1b" or "interleaved"
Result<Schedule> parse_schedule(std::string_view text);
std::string_view schedule_name(Schedule schedule);

// One run of a stage's forward or backward nodes on one micro-batch, for one
// model chunk (always 0 but with the interleaved schedule).
struct Block {
  bool backward = false;
  int microbatch = 0;
  int chunk = 0;

  bool operator==(const Block &) const = default;
};

// Stage `stage`'s blocks in the order it runs them, 2 * microbatches * chunks
// of them. `chunks` counts only with the interleaved schedule (which needs 2
// or more stages, 2 or more chunks and microbatches a multiple of stages);
// the other schedules run one chunk whatever it says.
std::vector<Block> schedule_blocks(Schedule schedule, int stages, int microbatches, int stage,
                                   int chunks);

} // namespace strata::partitioner
