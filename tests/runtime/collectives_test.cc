// Ring, tree, recursive-doubling and Rabenseifner collectives over
// point-to-point messages: every member gets the same bits, the sum is right,
// shards land where ZeRO-1 expects them (with a bucket's chunk offsets too),
// and a member that never joins ends the collective with a timeout, not a hang.
// Group sizes that are powers of two and ones that are not (the fold). The
// shared-memory collectives give the same bits as the messages.
#include "runtime/comm/collectives.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/comm/local_communicator.h"

namespace strata::runtime {
namespace {

constexpr int kGroupSizes[] = {2, 3, 4, 5, 8};

// Member r's input: a fixed pseudo-random pattern, different per member.
std::vector<float> input(int rank, size_t n) {
  std::vector<float> v(n);
  for (size_t e = 0; e < n; ++e)
    v[e] = std::sin(static_cast<float>(rank * 1000 + e) * 0.37f) * 10.0f;
  return v;
}

// Small integers as floats: every sum is exact, whatever the order.
std::vector<float> integers(int rank, size_t n) {
  std::vector<float> v(n);
  for (size_t e = 0; e < n; ++e)
    v[e] = static_cast<float>((static_cast<size_t>(rank) * 7 + e * 13) % 19) - 9.0f;
  return v;
}

// Random floats of mixed magnitudes: sums in another order round differently.
std::vector<float> random_floats(int rank, size_t n) {
  std::mt19937 generator(static_cast<uint32_t>(rank * 1000003 + static_cast<int>(n)));
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-8, 8);
  std::vector<float> v(n);
  for (float &x : v)
    x = std::ldexp(mantissa(generator), exponent(generator));
  return v;
}

Group whole_group(int p) {
  Group group;
  for (int r = 0; r < p; ++r)
    group.push_back(r);
  return group;
}

// One all-reduce (or, with `scatter`, reduce-scatter) of `algo` over p
// threads, member r starting from inputs[r]; what each member's data holds
// afterwards.
std::vector<std::vector<float>> reduce_on_threads(int p, CollectiveAlgo algo, bool scatter,
                                                  const std::vector<std::vector<float>> &inputs,
                                                  const std::vector<size_t> &chunks,
                                                  const std::string &what) {
  std::vector<std::vector<float>> out(static_cast<size_t>(p));
  Status status = run_on_threads(p, [&](int rank, Communicator &comm) {
    std::vector<float> data = inputs[static_cast<size_t>(rank)];
    const Group group = whole_group(p);
    RETURN_IF_ERROR(scatter ? algo_reduce_scatter(comm, data, group, algo, 40, what, chunks)
                            : algo_all_reduce(comm, data, group, algo, 40, what, chunks));
    out[static_cast<size_t>(rank)] = std::move(data);
    return Status::ok();
  });
  EXPECT_TRUE(status.is_ok()) << what << ": " << status.message();
  return status.is_ok() ? out : inputs; // the callers' checks then fail, not crash
}

std::vector<std::vector<float>> inputs_of(int p, size_t n,
                                          std::vector<float> (*make)(int rank, size_t n)) {
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < p; ++r)
    inputs.push_back(make(r, n));
  return inputs;
}

// The exact sum over the members of element e (integer inputs).
float exact_sum(const std::vector<std::vector<float>> &inputs, size_t e) {
  double sum = 0;
  for (const auto &v : inputs)
    sum += v[e];
  return static_cast<float>(sum);
}

bool same_bits(const float *a, const float *b, size_t n) {
  return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0;
}

std::string label(CollectiveAlgo algo, int p, size_t n) {
  return str_cat(collective_algo_name(algo), " p=", p, " n=", n);
}

TEST(CollectivesTest, NamesRoundTrip) {
  for (CollectiveAlgo algo : kAllCollectiveAlgos)
    EXPECT_TRUE(collective_algo_named(collective_algo_name(algo)) == algo)
        << collective_algo_name(algo);
  EXPECT_EQ(collective_algo_name(CollectiveAlgo::kRecursiveDoubling), "recursive-doubling");
  EXPECT_EQ(collective_algo_name(CollectiveAlgo::kRabenseifner), "rabenseifner");
  EXPECT_FALSE(collective_algo_named("butterfly").has_value());
  EXPECT_FALSE(collective_algo_named("").has_value());
}

TEST(CollectivesTest, AllReduceGivesEveryMemberTheSameSum) {
  for (CollectiveAlgo algo : kAllCollectiveAlgos)
    for (int p : kGroupSizes)
      for (size_t n : {size_t{1}, size_t{3}, size_t{64}, size_t{1001}}) {
        const std::string what = label(algo, p, n);
        const auto inputs = inputs_of(p, n, input);
        const auto out = reduce_on_threads(p, algo, false, inputs, {}, what);
        for (int r = 1; r < p; ++r)
          ASSERT_TRUE(same_bits(out[static_cast<size_t>(r)].data(), out[0].data(), n))
              << what << ": member " << r << " differs from member 0";
        for (size_t e = 0; e < n; ++e) {
          double want = 0;
          for (int r = 0; r < p; ++r)
            want += inputs[static_cast<size_t>(r)][e];
          EXPECT_NEAR(out[0][e], want, 1e-4 * (1 + std::abs(want))) << what << " element " << e;
        }
      }
}

// Integers in floats: the sum is exact, so every algorithm and every member
// must give exactly it, also with fewer elements than members and sizes the
// group does not divide.
TEST(CollectivesTest, AllReduceIsTheExactSum) {
  for (CollectiveAlgo algo : kAllCollectiveAlgos)
    for (int p : kGroupSizes)
      for (size_t n : {size_t{1}, size_t{3}, size_t{7}, size_t{64}, size_t{1001}}) {
        const std::string what = label(algo, p, n);
        const auto inputs = inputs_of(p, n, integers);
        const auto out = reduce_on_threads(p, algo, false, inputs, {}, what);
        for (int r = 0; r < p; ++r) {
          ASSERT_EQ(out[static_cast<size_t>(r)].size(), n) << what;
          ASSERT_TRUE(same_bits(out[static_cast<size_t>(r)].data(), out[0].data(), n))
              << what << ": member " << r << " differs from member 0";
        }
        for (size_t e = 0; e < n; ++e) {
          EXPECT_EQ(out[0][e], exact_sum(inputs, e)) << what << " element " << e;
        }
      }
}

// Member i of p ends a reduce-scatter with its chunk [i n/p, (i+1) n/p)
// summed (the ZeRO-1 convention), whatever the algorithm and the group size.
TEST(CollectivesTest, ReduceScatterLeavesEachMemberItsChunkSummed) {
  for (CollectiveAlgo algo : kAllCollectiveAlgos)
    for (int p : kGroupSizes) {
      const size_t up = static_cast<size_t>(p);
      for (size_t n : {size_t{1}, size_t{3}, size_t{7}, 12 * up, 12 * up + 5, size_t{1001}}) {
        const std::string what = label(algo, p, n);
        const auto inputs = inputs_of(p, n, integers);
        const auto out = reduce_on_threads(p, algo, true, inputs, {}, what);
        for (size_t r = 0; r < up; ++r)
          for (size_t e = chunk_begin(n, up, r); e < chunk_begin(n, up, r + 1); ++e) {
            EXPECT_EQ(out[r][e], exact_sum(inputs, e))
                << what << ": member " << r << " element " << e;
          }
      }
    }
}

// Chunk offsets other than the even split (some chunks empty): the
// reduce-scatter leaves member i chunk i summed, the all-reduce everything.
TEST(CollectivesTest, ChunkOffsetsPlaceTheShards) {
  for (CollectiveAlgo algo : kAllCollectiveAlgos)
    for (int p : kGroupSizes) {
      const size_t up = static_cast<size_t>(p);
      std::vector<size_t> chunks = {0};
      for (size_t c = 0; c < up; ++c)
        chunks.push_back(chunks.back() + (c * 5 + 3) % 4); // 3, 0, 1, 2, 3, ...
      const size_t n = chunks.back();
      const std::string what = label(algo, p, n) + " with chunk offsets";
      const auto inputs = inputs_of(p, n, integers);
      const auto scattered = reduce_on_threads(p, algo, true, inputs, chunks, what);
      for (size_t r = 0; r < up; ++r)
        for (size_t e = chunks[r]; e < chunks[r + 1]; ++e) {
          EXPECT_EQ(scattered[r][e], exact_sum(inputs, e))
              << what << ": member " << r << " element " << e;
        }
      const auto reduced = reduce_on_threads(p, algo, false, inputs, chunks, what);
      for (size_t r = 0; r < up; ++r)
        for (size_t e = 0; e < n; ++e) {
          EXPECT_EQ(reduced[r][e], exact_sum(inputs, e))
              << what << ": member " << r << " element " << e;
        }
    }
}

// A gradient bucket packs its tensors chunk by chunk and passes the chunk
// offsets: every element then gets the bits it gets when its tensor is
// reduced alone, for every algorithm (random floats, so the order shows).
TEST(CollectivesTest, BucketsKeepTheBitsOfEachTensorReducedAlone) {
  const std::vector<std::pair<size_t, size_t>> sizes = {{7, 13}, {1, 2}, {100, 37}};
  for (CollectiveAlgo algo : kAllCollectiveAlgos)
    for (int p : kGroupSizes)
      for (const auto &[na, nb] : sizes)
        for (bool scatter : {false, true}) {
          const size_t up = static_cast<size_t>(p);
          const std::string what = str_cat(label(algo, p, na), "+", nb, scatter ? " scatter" : "");
          const auto a = inputs_of(p, na, random_floats);
          std::vector<std::vector<float>> b;
          for (int r = 0; r < p; ++r)
            b.push_back(random_floats(r + 100, nb));
          // Chunk c of a, then chunk c of b, for c = 0, 1, ...
          std::vector<size_t> chunks = {0};
          std::vector<std::vector<float>> packed(up);
          for (size_t c = 0; c < up; ++c) {
            for (size_t r = 0; r < up; ++r) {
              packed[r].insert(packed[r].end(), a[r].begin() + chunk_begin(na, up, c),
                               a[r].begin() + chunk_begin(na, up, c + 1));
              packed[r].insert(packed[r].end(), b[r].begin() + chunk_begin(nb, up, c),
                               b[r].begin() + chunk_begin(nb, up, c + 1));
            }
            chunks.push_back(packed[0].size());
          }
          const auto alone_a = reduce_on_threads(p, algo, scatter, a, {}, what + " a");
          const auto alone_b = reduce_on_threads(p, algo, scatter, b, {}, what + " b");
          const auto bucket = reduce_on_threads(p, algo, scatter, packed, chunks, what);
          for (size_t r = 0; r < up; ++r)
            for (size_t c = 0; c < up; ++c) {
              if (scatter && c != r) continue; // a reduce-scatter's other chunks are scratch
              const size_t a_begin = chunk_begin(na, up, c);
              const size_t a_n = chunk_begin(na, up, c + 1) - a_begin;
              const size_t b_begin = chunk_begin(nb, up, c);
              const size_t b_n = chunk_begin(nb, up, c + 1) - b_begin;
              EXPECT_TRUE(same_bits(bucket[r].data() + chunks[c], alone_a[r].data() + a_begin, a_n))
                  << what << ": member " << r << " chunk " << c << " of a";
              EXPECT_TRUE(
                  same_bits(bucket[r].data() + chunks[c] + a_n, alone_b[r].data() + b_begin, b_n))
                  << what << ": member " << r << " chunk " << c << " of b";
            }
        }
}

// Recursive doubling gives every member the same bits, and the same bits as
// Rabenseifner and as the recursive-halving reduce-scatter: all three add
// every element along the same tree (the plan may mix them in one group
// class, runtime/comm/collectives.h).
TEST(CollectivesTest, RecursiveDoublingGivesEveryMemberTheSameBitsAsRabenseifner) {
  for (int p = 2; p <= 8; ++p)
    for (size_t n : {size_t{1}, size_t{17}, size_t{1000}}) {
      const size_t up = static_cast<size_t>(p);
      const std::string what = str_cat("p=", p, " n=", n);
      const auto inputs = inputs_of(p, n, random_floats);
      const auto doubling =
          reduce_on_threads(p, CollectiveAlgo::kRecursiveDoubling, false, inputs, {}, what);
      const auto rabenseifner =
          reduce_on_threads(p, CollectiveAlgo::kRabenseifner, false, inputs, {}, what);
      const auto halving =
          reduce_on_threads(p, CollectiveAlgo::kRecursiveDoubling, true, inputs, {}, what);
      for (size_t r = 0; r < up; ++r) {
        ASSERT_EQ(doubling[r].size(), n) << what;
        EXPECT_TRUE(same_bits(doubling[r].data(), doubling[0].data(), n))
            << what << ": recursive doubling, member " << r << " differs from member 0";
        EXPECT_TRUE(same_bits(rabenseifner[r].data(), doubling[0].data(), n))
            << what << ": Rabenseifner, member " << r << " differs from recursive doubling";
        const size_t begin = chunk_begin(n, up, r), end = chunk_begin(n, up, r + 1);
        EXPECT_TRUE(same_bits(halving[r].data() + begin, doubling[0].data() + begin, end - begin))
            << what << ": recursive halving, member " << r << " differs from recursive doubling";
      }
    }
}

TEST(CollectivesTest, ReduceScatterAndAllGatherUseTheZeroShards) {
  for (int p : kGroupSizes)
    for (CollectiveAlgo algo : kAllCollectiveAlgos) {
      const size_t n = 12 * static_cast<size_t>(p);
      std::vector<std::vector<float>> reduced(static_cast<size_t>(p)),
          gathered(static_cast<size_t>(p)), all_reduced(static_cast<size_t>(p));
      Status status = run_on_threads(p, [&](int rank, Communicator &comm) {
        const Group group = whole_group(p);
        std::vector<float> data = input(rank, n);
        RETURN_IF_ERROR(algo_reduce_scatter(comm, data, group, algo, 10, "rs"));
        reduced[static_cast<size_t>(rank)] = data;
        RETURN_IF_ERROR(algo_all_gather(comm, data, group, 20, "ag"));
        gathered[static_cast<size_t>(rank)] = data;
        std::vector<float> whole = input(rank, n);
        RETURN_IF_ERROR(algo_all_reduce(comm, whole, group, algo, 30, "ar"));
        all_reduced[static_cast<size_t>(rank)] = whole;
        return Status::ok();
      });
      ASSERT_TRUE(status.is_ok()) << status.message();
      const size_t chunk = n / static_cast<size_t>(p);
      for (int r = 0; r < p; ++r) {
        // Member r's shard [r n/p, (r+1) n/p) holds the sum: the same bits as the
        // all-reduce (so a ZeRO-1 step equals a plain data-parallel one).
        const size_t begin = chunk * static_cast<size_t>(r);
        EXPECT_EQ(std::memcmp(reduced[static_cast<size_t>(r)].data() + begin,
                              all_reduced[0].data() + begin, chunk * sizeof(float)),
                  0)
            << collective_algo_name(algo) << " p=" << p << " member " << r;
        // The all-gather puts every member's shard together.
        EXPECT_EQ(std::memcmp(gathered[static_cast<size_t>(r)].data(), all_reduced[0].data(),
                              n * sizeof(float)),
                  0)
            << collective_algo_name(algo) << " p=" << p << " member " << r;
      }
    }
}

TEST(CollectivesTest, AMemberThatNeverJoinsTimesOut) {
  for (CollectiveAlgo algo : kAllCollectiveAlgos) {
    const auto start = std::chrono::steady_clock::now();
    Status status = run_on_threads(
        3,
        [&](int rank, Communicator &comm) -> Status {
          if (rank == 2) {
            std::this_thread::sleep_for(std::chrono::milliseconds(500));
            return Status::ok();
          }
          std::vector<float> data = input(rank, 30);
          return algo_all_reduce(comm, data, {0, 1, 2}, algo, 5, "grad 'w'");
        },
        std::chrono::milliseconds(200));
    ASSERT_FALSE(status.is_ok()) << collective_algo_name(algo);
    EXPECT_NE(status.message().find("timed out"), std::string::npos) << status.message();
    EXPECT_NE(status.message().find("grad 'w'"), std::string::npos) << status.message();
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3))
        << collective_algo_name(algo);
  }
}

// ---------------------------------------------------------------------------
// Shared memory: the same bits as the messages, read from the members' memory.

// Part sizes of a bucket: fewer elements than members, sizes the group does
// not divide, and a few blocks' worth.
const std::vector<size_t> kPartSizes = {1, 3, 64, 1001, 5000};

// Member r's parts (random floats: another order would round differently).
std::vector<std::vector<float>> parts_of(int rank) {
  std::vector<std::vector<float>> parts;
  for (size_t k = 0; k < kPartSizes.size(); ++k)
    parts.push_back(random_floats(rank * 16 + static_cast<int>(k), kPartSizes[k]));
  return parts;
}

std::vector<std::span<float>> spans(std::vector<std::vector<float>> &parts) {
  std::vector<std::span<float>> out;
  for (auto &part : parts)
    out.emplace_back(part);
  return out;
}

// Each part of each member all-reduced (or, with `scatter`, reduce-scattered)
// alone, with `algo`'s messages or, for none, the communicator's own.
std::vector<std::vector<std::vector<float>>>
reduced_alone(int p, std::optional<CollectiveAlgo> algo, bool scatter) {
  std::vector<std::vector<std::vector<float>>> out(static_cast<size_t>(p));
  Status status = run_on_threads(p, [&](int rank, Communicator &comm) {
    auto parts = parts_of(rank);
    const Group group = whole_group(p);
    for (auto &part : parts) {
      if (algo) {
        RETURN_IF_ERROR(scatter ? algo_reduce_scatter(comm, part, group, *algo, 40, "alone")
                                : algo_all_reduce(comm, part, group, *algo, 40, "alone"));
      } else {
        RETURN_IF_ERROR(comm.all_reduce(std::span<float>(part), group, "alone"));
      }
    }
    out[static_cast<size_t>(rank)] = std::move(parts);
    return Status::ok();
  });
  EXPECT_TRUE(status.is_ok()) << status.message();
  return out;
}

std::string algo_label(std::optional<CollectiveAlgo> algo, int p) {
  return str_cat(algo ? collective_algo_name(*algo) : "the communicator's own", " p=", p);
}

std::vector<std::optional<CollectiveAlgo>> every_order() {
  std::vector<std::optional<CollectiveAlgo>> orders = {std::nullopt};
  for (CollectiveAlgo algo : kAllCollectiveAlgos)
    orders.push_back(algo);
  return orders;
}

TEST(SharedCollectivesTest, AllReduceHasTheBitsOfTheMessages) {
  for (std::optional<CollectiveAlgo> algo : every_order())
    for (int p : kGroupSizes) {
      const std::string what = algo_label(algo, p);
      const auto want = reduced_alone(p, algo, false);
      std::vector<std::vector<std::vector<float>>> got(static_cast<size_t>(p));
      Status status = run_on_threads(p, [&](int rank, Communicator &comm) {
        EXPECT_TRUE(comm.shares_memory(whole_group(p)));
        auto parts = parts_of(rank);
        const auto views = spans(parts);
        RETURN_IF_ERROR(shared_all_reduce(comm, views, whole_group(p), algo, what));
        got[static_cast<size_t>(rank)] = std::move(parts);
        return Status::ok();
      });
      ASSERT_TRUE(status.is_ok()) << what << ": " << status.message();
      for (int r = 0; r < p; ++r)
        for (size_t k = 0; k < kPartSizes.size(); ++k) {
          const auto &g = got[static_cast<size_t>(r)][k], &w = want[static_cast<size_t>(r)][k];
          ASSERT_TRUE(same_bits(g.data(), w.data(), g.size()))
              << what << ": member " << r << ", part of " << g.size();
        }
    }
}

TEST(SharedCollectivesTest, ReduceScatterHasTheBitsOfTheMessagesAndKeepsTheRest) {
  for (std::optional<CollectiveAlgo> algo : every_order())
    for (int p : kGroupSizes) {
      const std::string what = algo_label(algo, p);
      // The messages' shards (the communicator's own all-reduce for none: its
      // reduce-scatter sums in the same order).
      const auto want = reduced_alone(p, algo, algo.has_value());
      Status status = run_on_threads(p, [&](int rank, Communicator &comm) {
        auto parts = parts_of(rank);
        const auto before = parts;
        const auto views = spans(parts);
        // Half the parts in place, half into buffers of their own.
        std::vector<std::vector<float>> separate(parts.size());
        std::vector<float *> out;
        for (size_t k = 0; k < parts.size(); ++k) {
          const size_t begin =
              chunk_begin(parts[k].size(), static_cast<size_t>(p), static_cast<size_t>(rank));
          const size_t end =
              chunk_begin(parts[k].size(), static_cast<size_t>(p), static_cast<size_t>(rank) + 1);
          separate[k].assign(end - begin, -1.0f);
          out.push_back(k % 2 ? separate[k].data() : parts[k].data() + begin);
        }
        RETURN_IF_ERROR(shared_reduce_scatter(comm, views, out, whole_group(p), algo, what));
        for (size_t k = 0; k < parts.size(); ++k) {
          const size_t n = parts[k].size();
          const size_t begin = chunk_begin(n, static_cast<size_t>(p), static_cast<size_t>(rank));
          const size_t end = chunk_begin(n, static_cast<size_t>(p), static_cast<size_t>(rank) + 1);
          const float *mine = want[static_cast<size_t>(rank)][k].data() + begin;
          EXPECT_TRUE(same_bits(out[k], mine, end - begin))
              << what << ": member " << rank << "'s shard of part " << k;
          for (size_t e = 0; e < n; ++e) { // the rest of the part is unchanged
            if (k % 2 || e < begin || e >= end) {
              EXPECT_TRUE(same_bits(&parts[k][e], &before[k][e], 1))
                  << what << ": member " << rank << " part " << k << " element " << e;
            }
          }
        }
        return Status::ok();
      });
      ASSERT_TRUE(status.is_ok()) << what << ": " << status.message();
    }
}

TEST(SharedCollectivesTest, AllGatherPutsEveryMemberInPlace) {
  for (int p : kGroupSizes) {
    const size_t bytes = 12;
    Status status = run_on_threads(p, [&](int rank, Communicator &comm) {
      std::vector<std::byte> out(bytes * static_cast<size_t>(p), std::byte{0});
      std::vector<std::byte> mine(bytes);
      for (size_t b = 0; b < bytes; ++b)
        mine[b] = static_cast<std::byte>(rank * 31 + static_cast<int>(b));
      // In place: this member's input is its slot of the output.
      std::byte *slot = out.data() + static_cast<size_t>(rank) * bytes;
      std::copy(mine.begin(), mine.end(), slot);
      RETURN_IF_ERROR(shared_all_gather(comm, slot, bytes, out.data(), whole_group(p), "w"));
      for (int m = 0; m < p; ++m)
        for (size_t b = 0; b < bytes; ++b)
          EXPECT_EQ(out[static_cast<size_t>(m) * bytes + b],
                    static_cast<std::byte>(m * 31 + static_cast<int>(b)))
              << "p=" << p << " member " << rank << " slot " << m;
      return Status::ok();
    });
    ASSERT_TRUE(status.is_ok()) << status.message();
  }
}

TEST(SharedCollectivesTest, AllGatherPiecesOfDifferentSizesAreAnError) {
  Status status = run_on_threads(2, [&](int rank, Communicator &comm) {
    std::vector<std::byte> in(rank == 0 ? 8 : 12), out(2 * in.size());
    const GatherPiece pieces[] = {{in.data(), 4, out.data()}, {in.data(), in.size(), out.data()}};
    return shared_all_gather(comm, pieces, {0, 1}, "parameter batch 2");
  });
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("parameter batch 2: piece 1 of an all-gather is"),
            std::string::npos)
      << status.message();
}

TEST(SharedCollectivesTest, PartsOfDifferentSizesAreAnError) {
  Status status = run_on_threads(2, [&](int rank, Communicator &comm) {
    std::vector<float> part(rank == 0 ? 10 : 12, 1.0f);
    const std::span<float> view(part);
    return shared_all_reduce(comm, std::span(&view, 1), {0, 1}, std::nullopt, "bucket 3");
  });
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("different sizes"), std::string::npos) << status.message();
}

// A local communicator that claims segments of `segment_bytes` (the test
// hands segment_reduce the buffers itself): the rounds of the segment path,
// with threads standing in for the ranks of one host.
class SegmentComm final : public Communicator {
public:
  SegmentComm(Communicator &inner, size_t segment_bytes)
      : inner_(inner), segment_bytes_(segment_bytes) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::chrono::milliseconds timeout() const override { return inner_.timeout(); }
  void set_label(std::string label) override { inner_.set_label(std::move(label)); }
  void abort(Status reason) override { inner_.abort(std::move(reason)); }
  size_t shared_segment_bytes() const override { return segment_bytes_; }

protected:
  Status send_impl(const void *data, std::size_t bytes, int peer, uint64_t tag,
                   std::string_view what) override {
    return inner_.send(data, bytes, peer, tag, what);
  }
  Status recv_impl(void *data, std::size_t bytes, int peer, uint64_t tag,
                   std::string_view what) override {
    return inner_.recv(data, bytes, peer, tag, what);
  }
  std::unique_ptr<Request> isend_impl(const void *data, std::size_t bytes, int peer, uint64_t tag,
                                      std::string_view what) override {
    return inner_.isend(data, bytes, peer, tag, what);
  }
  std::unique_ptr<Request> irecv_impl(void *data, std::size_t bytes, int peer, uint64_t tag,
                                      std::string_view what) override {
    return inner_.irecv(data, bytes, peer, tag, what);
  }
  Status all_reduce_impl(void *data, std::size_t count, ReduceType type, const Group &group,
                         std::string_view what) override {
    if (type == ReduceType::kF64)
      return inner_.all_reduce(std::span(static_cast<double *>(data), count), group, what);
    return inner_.all_reduce(std::span(static_cast<float *>(data), count), group, what);
  }
  Status reduce_scatter_impl(const void *, std::size_t, void *, std::size_t, ReduceType,
                             const Group &, std::string_view) override {
    return unimplemented("not used by segment_reduce");
  }
  Status all_gather_impl(const void *input, std::size_t bytes, void *output, const Group &group,
                         std::string_view what) override {
    return inner_.all_gather(input, bytes, output, group, what);
  }
  Status broadcast_impl(void *data, std::size_t bytes, int root, const Group &group,
                        std::string_view what) override {
    return inner_.broadcast(data, bytes, root, group, what);
  }
  Status barrier_impl(const Group &group, std::string_view what) override {
    return inner_.barrier(group, what);
  }

private:
  Communicator &inner_;
  size_t segment_bytes_;
};

// Rounds of 2p - 1 and of 64p elements (many rounds, chunk sizes the round
// does not divide), every order, all-reduce and reduce-scatter: each tensor of
// the bucket ends with the bits of its own messages' reduction.
TEST(SegmentCollectivesTest, RoundsHaveTheBitsOfTheMessages) {
  for (bool scatter : {false, true})
    for (std::optional<CollectiveAlgo> algo : every_order())
      for (int p : {2, 3, 4, 5})
        for (size_t per_member : {size_t{2}, size_t{64}}) {
          const size_t block = per_member * static_cast<size_t>(p) - (per_member == 2 ? 1 : 0);
          const std::string what =
              str_cat(algo_label(algo, p), scatter ? " reduce-scatter" : " all-reduce",
                      ", rounds of ", block);
          const auto want = reduced_alone(p, algo, scatter && algo.has_value());
          const size_t P = static_cast<size_t>(p);
          std::vector<std::vector<float>> segments(
              P, std::vector<float>(kSegmentRounds * block, -7.0f));
          std::vector<float *> views;
          for (auto &segment : segments)
            views.push_back(segment.data());
          Status status = run_on_threads(p, [&](int rank, Communicator &local) {
            SegmentComm comm(local, kSegmentRounds * block * sizeof(float));
            const size_t me = static_cast<size_t>(rank);
            auto parts = parts_of(rank);
            // Packed chunk by chunk, as a gradient bucket.
            std::vector<float> packed;
            std::vector<size_t> chunks = {0};
            for (size_t c = 0; c < P; ++c) {
              for (const auto &part : parts)
                packed.insert(packed.end(), part.begin() + chunk_begin(part.size(), P, c),
                              part.begin() + chunk_begin(part.size(), P, c + 1));
              chunks.push_back(packed.size());
            }
            std::vector<float> result(packed.size(), -1.0f);
            auto pack = [&](size_t begin, size_t end, float *to) {
              std::copy(packed.begin() + begin, packed.begin() + end, to);
            };
            auto take = [&](size_t begin, size_t end, const float *sum) {
              std::copy(sum, sum + (end - begin), result.begin() + begin);
            };
            RETURN_IF_ERROR(segment_reduce(comm, views, whole_group(p), algo, chunks, !scatter,
                                           pack, take, what, block));
            for (size_t c = 0; c < P; ++c) {
              if (scatter && c != me) { // untouched
                for (size_t e = chunks[c]; e < chunks[c + 1]; ++e)
                  EXPECT_EQ(result[e], -1.0f) << what << ": member " << rank << " element " << e;
                continue;
              }
              size_t at = chunks[c];
              for (size_t k = 0; k < parts.size(); ++k) {
                const size_t n = parts[k].size(), begin = chunk_begin(n, P, c);
                const size_t len = chunk_begin(n, P, c + 1) - begin;
                EXPECT_TRUE(same_bits(&result[at], want[me][k].data() + begin, len))
                    << what << ": member " << rank << ", chunk " << c << " of part " << k;
                at += len;
              }
            }
            return Status::ok();
          });
          ASSERT_TRUE(status.is_ok()) << what << ": " << status.message();
        }
}

// Pieces of odd sizes through segments smaller than all of them (rounds cut
// pieces in two), in place and into buffers of their own: every member ends
// with every member's pieces in group order.
TEST(SegmentCollectivesTest, AllGatherMovesEveryPieceInRounds) {
  const std::vector<size_t> sizes = {3, 40, 1, 17, 64};
  for (int p : {2, 3, 4})
    for (size_t room : {size_t{7}, size_t{50}, size_t{1000}}) {
      const std::string what = str_cat("p=", p, " segments of ", room, " bytes");
      const size_t P = static_cast<size_t>(p);
      std::vector<std::vector<std::byte>> segments(P, std::vector<std::byte>(room));
      std::vector<std::byte *> views;
      for (auto &segment : segments)
        views.push_back(segment.data());
      auto byte_of = [](size_t member, size_t piece, size_t k) {
        return static_cast<std::byte>((member * 31 + piece * 7 + k) & 0xff);
      };
      Status status = run_on_threads(p, [&](int rank, Communicator &local) {
        SegmentComm comm(local, room);
        const size_t me = static_cast<size_t>(rank);
        std::vector<std::vector<std::byte>> whole(sizes.size()), own(sizes.size());
        std::vector<GatherPiece> pieces;
        for (size_t j = 0; j < sizes.size(); ++j) {
          // Even pieces in place, odd ones from a buffer of their own.
          whole[j].assign(sizes[j] * P, std::byte{0});
          own[j].resize(sizes[j]);
          for (size_t k = 0; k < sizes[j]; ++k)
            (j % 2 ? own[j][k] : whole[j][me * sizes[j] + k]) = byte_of(me, j, k);
          const void *input = j % 2 ? own[j].data() : whole[j].data() + me * sizes[j];
          pieces.push_back({input, sizes[j], whole[j].data()});
        }
        RETURN_IF_ERROR(segment_all_gather(comm, views, pieces, whole_group(p), what));
        for (size_t j = 0; j < sizes.size(); ++j)
          for (size_t m = 0; m < P; ++m)
            for (size_t k = 0; k < sizes[j]; ++k)
              EXPECT_EQ(whole[j][m * sizes[j] + k], byte_of(m, j, k))
                  << what << ": member " << rank << " piece " << j << " from " << m;
        return Status::ok();
      });
      ASSERT_TRUE(status.is_ok()) << what << ": " << status.message();
    }
}

TEST(SegmentCollectivesTest, ASegmentTooSmallForThreeRoundsIsAnError) {
  Status status = run_on_threads(2, [&](int, Communicator &local) {
    SegmentComm comm(local, 100);
    std::vector<float> a(64), b(64);
    std::vector<float *> views = {a.data(), b.data()};
    const std::vector<size_t> chunks = {0, 5, 10};
    return segment_reduce(
        comm, views, {0, 1}, std::nullopt, chunks, true, [](size_t, size_t, float *) {},
        [](size_t, size_t, const float *) {}, "bucket 2", 32);
  });
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("needs 384 bytes of segment, not 100"), std::string::npos)
      << status.message();
}

} // namespace
} // namespace strata::runtime
