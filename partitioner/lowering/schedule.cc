#include "partitioner/lowering/schedule.h"

#include <algorithm>
#include <cassert>

namespace strata::partitioner {

Result<Schedule> parse_schedule(std::string_view text) {
  if (text == "gpipe") return Schedule::kGPipe;
  if (text == "1f1b") return Schedule::k1F1B;
  if (text == "interleaved") return Schedule::kInterleaved;
  if (text == "zb-h1") return Schedule::kZeroBubbleH1;
  return invalid_argument("unknown schedule '", text,
                          "' (expected gpipe, 1f1b, interleaved or zb-h1)");
}

bool splits_backward(Schedule schedule) { return schedule == Schedule::kZeroBubbleH1; }

std::string_view schedule_name(Schedule schedule) {
  switch (schedule) {
  case Schedule::kGPipe: return "gpipe";
  case Schedule::k1F1B: return "1f1b";
  case Schedule::kInterleaved: return "interleaved";
  case Schedule::kZeroBubbleH1: return "zb-h1";
  }
  return "1f1b";
}

namespace {

Block forward_block(int microbatch, int chunk = 0) { return {false, microbatch, chunk}; }
Block backward_block(int microbatch, int chunk = 0) { return {true, microbatch, chunk}; }

std::vector<Block> gpipe_blocks(int M) {
  std::vector<Block> blocks;
  for (int k = 0; k < M; ++k)
    blocks.push_back(forward_block(k));
  for (int k = 0; k < M; ++k)
    blocks.push_back(backward_block(k));
  return blocks;
}

std::vector<Block> one_f_one_b_blocks(int P, int M, int s) {
  std::vector<Block> blocks;
  const int warmup = std::min(P - 1 - s, M);
  for (int k = 0; k < warmup; ++k)
    blocks.push_back(forward_block(k));
  for (int k = 0; k + warmup < M; ++k) {
    blocks.push_back(forward_block(k + warmup));
    blocks.push_back(backward_block(k));
  }
  for (int k = M - warmup; k < M; ++k)
    blocks.push_back(backward_block(k));
  return blocks;
}

// ZB-H1: 1F1B's forwards and B halves, each W put off while no more than s
// are pending, then one after each cool-down B, the rest at the end.
std::vector<Block> zero_bubble_h1_blocks(int P, int M, int s) {
  std::vector<Block> blocks;
  const int delay = s, warmup = std::min(P - 1 - s, M);
  int next_weight = 0; // the oldest W not run yet
  auto weight = [&] { blocks.push_back({true, next_weight++, 0, true}); };
  for (int k = 0; k < warmup; ++k)
    blocks.push_back(forward_block(k));
  for (int k = 0; k + warmup < M; ++k) {
    blocks.push_back(forward_block(k + warmup));
    blocks.push_back(backward_block(k));
    while (k + 1 - next_weight > delay)
      weight();
  }
  for (int k = M - warmup; k < M; ++k) {
    blocks.push_back(backward_block(k));
    weight();
  }
  while (next_weight < M)
    weight();
  return blocks;
}

// Interleaved 1F1B (Narayanan et al. 2021, as Megatron-LM runs it): the
// device's chunks take P micro-batches in turn, forwards in chunk order and
// backwards in reverse; block k of N = chunks x M is micro-batch
// (k / (P chunks)) P + k mod P of chunk (k mod (P chunks)) / P. Warm-up
// forwards fill the deeper pipeline; with M = P all forwards go first.
std::vector<Block> interleaved_blocks(int P, int M, int s, int chunks) {
  assert(P >= 2 && chunks >= 2 && M % P == 0);
  const int N = chunks * M, round = P * chunks;
  auto chunk_at = [&](int k, bool is_forward) {
    const int c = (k % round) / P;
    return is_forward ? c : chunks - 1 - c;
  };
  auto mb_at = [&](int k) { return (k / round) * P + k % P; };
  std::vector<Block> blocks;
  const int warmup = M == P ? N : std::min(N, (P - 1 - s) * 2 + (chunks - 1) * P);
  for (int k = 0; k < warmup; ++k)
    blocks.push_back(forward_block(mb_at(k), chunk_at(k, true)));
  for (int k = 0; k + warmup < N; ++k) {
    blocks.push_back(forward_block(mb_at(k + warmup), chunk_at(k + warmup, true)));
    blocks.push_back(backward_block(mb_at(k), chunk_at(k, false)));
  }
  for (int k = std::max(N - warmup, 0); k < N; ++k)
    blocks.push_back(backward_block(mb_at(k), chunk_at(k, false)));
  return blocks;
}

} // namespace

std::vector<Block> schedule_blocks(Schedule schedule, int stages, int microbatches, int stage,
                                   int chunks) {
  switch (schedule) {
  case Schedule::kGPipe: return gpipe_blocks(microbatches);
  case Schedule::k1F1B: return one_f_one_b_blocks(stages, microbatches, stage);
  case Schedule::kInterleaved: return interleaved_blocks(stages, microbatches, stage, chunks);
  case Schedule::kZeroBubbleH1: return zero_bubble_h1_blocks(stages, microbatches, stage);
  }
  return one_f_one_b_blocks(stages, microbatches, stage);
}

} // namespace strata::partitioner
