// Tests of the pipeline schedules: each schedule's block order on small
// pipelines written out in full, and the rules every schedule keeps on every
// stage of many pipelines (each block once, forward before backward, backwards
// in micro-batch order, the warm-up counts).
#include "partitioner/lowering/schedule.h"

#include <algorithm>
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace strata::partitioner {

// How gtest shows a Block in a failed expectation.
void PrintTo(const Block &block, std::ostream *out) {
  *out << (block.weight     ? "W"
           : block.backward ? "B"
                            : "F")
       << block.microbatch << ":" << block.chunk;
}

namespace {

// "F0 F1 B0 ...": F or B, then the micro-batch, then ":chunk" when
// `with_chunks`.
std::string text(const std::vector<Block> &blocks, bool with_chunks = false) {
  std::string out;
  for (const Block &block : blocks) {
    if (!out.empty()) out += ' ';
    out += block.weight ? 'W' : block.backward ? 'B' : 'F';
    out += std::to_string(block.microbatch);
    if (with_chunks) out += ":" + std::to_string(block.chunk);
  }
  return out;
}

// The forwards before the first backward.
int leading_forwards(const std::vector<Block> &blocks) {
  int count = 0;
  while (count < static_cast<int>(blocks.size()) && !blocks[static_cast<size_t>(count)].backward)
    ++count;
  return count;
}

// The rules of every schedule: each (micro-batch, chunk) runs forward once
// and backward once, the forward first; in each chunk the backward of
// micro-batch k runs before that of k + 1.
void expect_valid(const std::vector<Block> &blocks, int microbatches, int chunks) {
  ASSERT_EQ(blocks.size(), static_cast<size_t>(2 * microbatches * chunks)) << text(blocks, true);
  std::map<std::pair<int, int>, size_t> forward_at, backward_at;
  std::vector<int> last_backward(static_cast<size_t>(chunks), -1);
  for (size_t i = 0; i < blocks.size(); ++i) {
    const Block &block = blocks[i];
    ASSERT_GE(block.microbatch, 0);
    ASSERT_LT(block.microbatch, microbatches);
    ASSERT_GE(block.chunk, 0);
    ASSERT_LT(block.chunk, chunks);
    const std::pair<int, int> key{block.microbatch, block.chunk};
    auto &seen = block.backward ? backward_at : forward_at;
    EXPECT_TRUE(seen.emplace(key, i).second)
        << (block.backward ? "backward" : "forward") << " of micro-batch " << block.microbatch
        << " chunk " << block.chunk << " runs twice: " << text(blocks, true);
    if (!block.backward) continue;
    EXPECT_TRUE(forward_at.contains(key))
        << "backward of micro-batch " << block.microbatch << " chunk " << block.chunk
        << " runs before its forward: " << text(blocks, true);
    int &last = last_backward[static_cast<size_t>(block.chunk)];
    EXPECT_EQ(block.microbatch, last + 1)
        << "chunk " << block.chunk << "'s backwards out of order: " << text(blocks, true);
    last = block.microbatch;
  }
}

TEST(ParseSchedule, NamesRoundTrip) {
  for (Schedule schedule :
       {Schedule::kGPipe, Schedule::k1F1B, Schedule::kInterleaved, Schedule::kZeroBubbleH1}) {
    Result<Schedule> parsed = parse_schedule(schedule_name(schedule));
    ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
    EXPECT_EQ(*parsed, schedule);
  }
  Result<Schedule> bad = parse_schedule("zigzag");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("unknown schedule 'zigzag'"), std::string::npos);
}

TEST(ScheduleBlocks, GPipeRunsAllForwardsThenAllBackwards) {
  for (int s = 0; s < 4; ++s)
    EXPECT_EQ(text(schedule_blocks(Schedule::kGPipe, 4, 3, s, 1)), "F0 F1 F2 B0 B1 B2");
  // GPipe has one chunk whatever `chunks` says.
  EXPECT_EQ(text(schedule_blocks(Schedule::kGPipe, 2, 2, 0, 3), true), "F0:0 F1:0 B0:0 B1:0");
}

TEST(ScheduleBlocks, OneFOneBWarmsUpThenAlternates) {
  // P = 4, M = 6: stage s warms up with min(3 - s, 6) forwards.
  EXPECT_EQ(text(schedule_blocks(Schedule::k1F1B, 4, 6, 0, 1)),
            "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(text(schedule_blocks(Schedule::k1F1B, 4, 6, 1, 1)),
            "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
  EXPECT_EQ(text(schedule_blocks(Schedule::k1F1B, 4, 6, 3, 1)),
            "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  // Fewer micro-batches than the warm-up: all forwards, then all backwards.
  EXPECT_EQ(text(schedule_blocks(Schedule::k1F1B, 4, 2, 0, 1)), "F0 F1 B0 B1");
}

TEST(ScheduleBlocks, OneFOneBStructureOnEveryStage) {
  for (int P = 1; P <= 6; ++P)
    for (int M = 1; M <= 9; ++M)
      for (int s = 0; s < P; ++s) {
        SCOPED_TRACE(::testing::Message() << "P=" << P << " M=" << M << " s=" << s);
        const std::vector<Block> blocks = schedule_blocks(Schedule::k1F1B, P, M, s, 1);
        expect_valid(blocks, M, 1);
        // min(P-1-s, M) warm-up forwards F0 .. F(w-1) ...
        const int w = std::min(P - 1 - s, M);
        for (int k = 0; k < w; ++k)
          EXPECT_EQ(blocks[static_cast<size_t>(k)], (Block{false, k, 0}));
        // ... then F(w+i), B(i) alternating ...
        for (int i = 0; i + w < M; ++i) {
          EXPECT_EQ(blocks[static_cast<size_t>(w + 2 * i)], (Block{false, w + i, 0}));
          EXPECT_EQ(blocks[static_cast<size_t>(w + 2 * i + 1)], (Block{true, i, 0}));
        }
        // ... then the last w backwards.
        for (int k = M - w; k < M; ++k)
          EXPECT_EQ(blocks[static_cast<size_t>(M + k)], (Block{true, k, 0}));
        // So no more than P - s micro-batches are ever in flight.
        int in_flight = 0, most = 0;
        for (const Block &block : blocks) {
          in_flight += block.backward ? -1 : 1;
          most = std::max(most, in_flight);
        }
        EXPECT_EQ(most, std::min(P - s, M));
      }
}

TEST(ScheduleBlocks, InterleavedTakesMicroBatchesInGroupsOfP) {
  // P = 2, M = 4, 2 chunks: the chunks take 2 micro-batches in turn, forwards
  // in chunk order (0 then 1) and backwards in reverse. Stage 0 warms up with
  // 2 (P-1-s) + (v-1) P = 4 forwards, stage 1 with 2.
  EXPECT_EQ(text(schedule_blocks(Schedule::kInterleaved, 2, 4, 0, 2), true),
            "F0:0 F1:0 F0:1 F1:1 "
            "F2:0 B0:1 F3:0 B1:1 F2:1 B0:0 F3:1 B1:0 "
            "B2:1 B3:1 B2:0 B3:0");
  EXPECT_EQ(text(schedule_blocks(Schedule::kInterleaved, 2, 4, 1, 2), true),
            "F0:0 F1:0 "
            "F0:1 B0:1 F1:1 B1:1 F2:0 B0:0 F3:0 B1:0 F2:1 B2:1 F3:1 B3:1 "
            "B2:0 B3:0");
  // With M = P every forward goes first.
  EXPECT_EQ(text(schedule_blocks(Schedule::kInterleaved, 2, 2, 1, 2), true),
            "F0:0 F1:0 F0:1 F1:1 B0:1 B1:1 B0:0 B1:0");
}

TEST(ScheduleBlocks, InterleavedStructureOnEveryStage) {
  for (int P = 2; P <= 5; ++P)
    for (int V = 2; V <= 4; ++V)
      for (int groups = 1; groups <= 4; ++groups)
        for (int s = 0; s < P; ++s) {
          const int M = groups * P, N = V * M;
          SCOPED_TRACE(::testing::Message() << "P=" << P << " V=" << V << " M=" << M << " s=" << s);
          const std::vector<Block> blocks = schedule_blocks(Schedule::kInterleaved, P, M, s, V);
          expect_valid(blocks, M, V);
          // Warm-up: 2 (P-1-s) + (V-1) P forwards (at most all of them), or
          // all of them when M = P; the steady state then opens with a forward.
          const int warmup = M == P ? N : std::min(N, 2 * (P - 1 - s) + (V - 1) * P);
          EXPECT_EQ(leading_forwards(blocks), std::min(warmup + 1, N));
          for (int i = 0; i + warmup < N; ++i) {
            EXPECT_FALSE(blocks[static_cast<size_t>(warmup + 2 * i)].backward);
            EXPECT_TRUE(blocks[static_cast<size_t>(warmup + 2 * i + 1)].backward);
          }
          // Forward i is micro-batch (i / PV) P + i mod P of chunk (i mod PV) / P;
          // backward i the same micro-batch of chunk V-1 - (i mod PV) / P.
          int forwards = 0, backwards = 0;
          for (const Block &block : blocks) {
            int &i = block.backward ? backwards : forwards;
            const int chunk = (i % (P * V)) / P;
            EXPECT_EQ(block.microbatch, (i / (P * V)) * P + i % P) << text(blocks, true);
            EXPECT_EQ(block.chunk, block.backward ? V - 1 - chunk : chunk) << text(blocks, true);
            ++i;
          }
        }
}

TEST(ScheduleBlocks, GPipeStructureOnEveryStage) {
  for (int P = 1; P <= 4; ++P)
    for (int M = 1; M <= 6; ++M)
      for (int s = 0; s < P; ++s) {
        SCOPED_TRACE(::testing::Message() << "P=" << P << " M=" << M << " s=" << s);
        const std::vector<Block> blocks = schedule_blocks(Schedule::kGPipe, P, M, s, 1);
        expect_valid(blocks, M, 1);
        EXPECT_EQ(leading_forwards(blocks), M);
      }
}

} // namespace
} // namespace strata::partitioner

namespace strata::partitioner {
namespace {

TEST(ScheduleBlocks, ZeroBubbleH1PutsOffTheWeightHalves) {
  EXPECT_TRUE(splits_backward(Schedule::kZeroBubbleH1));
  EXPECT_FALSE(splits_backward(Schedule::k1F1B));
  // P = 4, M = 6. Stage 0 runs each W right after its B; stage s puts Ws
  // off by up to s micro-batches, runs one after each cool-down B and the
  // rest at the end.
  EXPECT_EQ(text(schedule_blocks(Schedule::kZeroBubbleH1, 4, 6, 0, 1)),
            "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 B3 W3 B4 W4 B5 W5");
  EXPECT_EQ(text(schedule_blocks(Schedule::kZeroBubbleH1, 4, 6, 2, 1)),
            "F0 F1 B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 B5 W3 W4 W5");
  EXPECT_EQ(text(schedule_blocks(Schedule::kZeroBubbleH1, 4, 6, 3, 1)),
            "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 W3 W4 W5");
}

TEST(ScheduleBlocks, ZeroBubbleH1StructureOnEveryStage) {
  for (int P = 1; P <= 6; ++P)
    for (int M = 1; M <= 9; ++M)
      for (int s = 0; s < P; ++s) {
        SCOPED_TRACE(::testing::Message() << "P=" << P << " M=" << M << " s=" << s);
        const std::vector<Block> blocks = schedule_blocks(Schedule::kZeroBubbleH1, P, M, s, 1);
        ASSERT_EQ(blocks.size(), static_cast<size_t>(3 * M)) << text(blocks);
        // Without the Ws it is 1F1B, B for backward.
        std::vector<Block> without;
        for (const Block &block : blocks)
          if (!block.weight) without.push_back(block);
        EXPECT_EQ(without, schedule_blocks(Schedule::k1F1B, P, M, s, 1)) << text(blocks);
        // Each W once, in micro-batch order, after its B; no more than P
        // micro-batches between their F and their W, 1F1B's most.
        int next = 0, backwards = 0, forwards = 0, most = 0;
        for (const Block &block : blocks) {
          if (!block.backward) ++forwards;
          if (block.backward && !block.weight) ++backwards;
          most = std::max(most, forwards - next);
          if (!block.weight) continue;
          EXPECT_EQ(block.microbatch, next++) << text(blocks);
          EXPECT_LT(block.microbatch, backwards) << "W before its B: " << text(blocks);
          EXPECT_TRUE(block.backward);
        }
        EXPECT_EQ(next, M);
        EXPECT_LE(most, std::min(P, M)) << text(blocks);
      }
}

} // namespace
} // namespace strata::partitioner
