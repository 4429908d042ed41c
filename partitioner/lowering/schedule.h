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
//  - ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): 1F1B
//    with each backward split in two, B (the input gradient, which the stage
//    before waits for) and W (the weight gradients, which nobody waits for).
//    B keeps 1F1B's place; stage s puts W off by up to s micro-batches, so
//    the later stages, whose Bs every earlier stage's cool-down waits for,
//    run them back to back with their forwards, and run the Ws they put off
//    where they would idle at the end; after each cool-down B the oldest W,
//    the rest at the end. Ideally the bubble falls from 1F1B's
//    (P-1)(F+B+W) to (P-1)(F+B-W). A stage holds at most P micro-batches
//    between F and W (warm-up P-1-s, plus s put off, plus one), 1F1B's
//    most on stage 0, though a W keeps only what it reads.
// Every schedule runs each (micro-batch, chunk) forward once and backward
// once (ZB-H1: B, then W), the forward first, and the backward of micro-batch
// k before that of k + 1 in every chunk (ZB-H1: the Bs in order, and the Ws),
// so gradients accumulate in the same order whatever the schedule.
#pragma once

#include <string_view>
#include <vector>

#include "graph/status.h"

namespace strata::partitioner {

enum class Schedule { kGPipe, k1F1B, kInterleaved, kZeroBubbleH1 };
// "gpipe", "1f1b", "interleaved" or "zb-h1"
Result<Schedule> parse_schedule(std::string_view text);
std::string_view schedule_name(Schedule schedule);

// One run of a stage's forward or backward nodes on one micro-batch, for one
// model chunk (always 0 but with the interleaved schedule). With ZB-H1 a
// backward block is its B half, and `weight` marks a W half.
struct Block {
  bool backward = false;
  int microbatch = 0;
  int chunk = 0;
  bool weight = false; // the weight-gradient half of the backward (ZB-H1)

  bool operator==(const Block &) const = default;
};

// Whether `schedule` splits each backward into B and W blocks.
bool splits_backward(Schedule schedule);

// Stage `stage`'s blocks in the order it runs them, 2 * microbatches * chunks
// of them (3 * microbatches with a split backward). `chunks` counts only with
// the interleaved schedule (which needs 2 or more stages, 2 or more chunks
// and microbatches a multiple of stages); the other schedules run one chunk
// whatever it says.
std::vector<Block> schedule_blocks(Schedule schedule, int stages, int microbatches, int stage,
                                   int chunks);

} // namespace strata::partitioner
