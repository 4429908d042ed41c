// Ring and tree collectives over point-to-point messages: every member gets the
// same bits, the sum is right, shards land where ZeRO-1 expects them, and a
// member that never joins ends the collective with a timeout, not a hang.
#include "runtime/comm/collectives.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/comm/local_communicator.h"

namespace strata::runtime {
namespace {

// Member r's input: a fixed pseudo-random pattern, different per member.
std::vector<float> input(int rank, size_t n) {
  std::vector<float> v(n);
  for (size_t e = 0; e < n; ++e)
    v[e] = std::sin(static_cast<float>(rank * 1000 + e) * 0.37f) * 10.0f;
  return v;
}

TEST(CollectivesTest, AllReduceGivesEveryMemberTheSameSum) {
  for (CollectiveAlgo algo : {CollectiveAlgo::kRing, CollectiveAlgo::kTree})
    for (int p : {2, 3, 4, 5})
      for (size_t n : {size_t{1}, size_t{3}, size_t{64}, size_t{1001}}) {
        std::vector<std::vector<float>> out(static_cast<size_t>(p));
        Status status = run_on_threads(p, [&](int rank, Communicator &comm) {
          std::vector<float> data = input(rank, n);
          Group group;
          for (int r = 0; r < p; ++r)
            group.push_back(r);
          RETURN_IF_ERROR(algo_all_reduce(comm, data, group, algo, 100, "test"));
          out[static_cast<size_t>(rank)] = data;
          return Status::ok();
        });
        const std::string what = str_cat(collective_algo_name(algo), " p=", p, " n=", n);
        ASSERT_TRUE(status.is_ok()) << what << ": " << status.message();
        for (int r = 1; r < p; ++r)
          ASSERT_EQ(
              std::memcmp(out[static_cast<size_t>(r)].data(), out[0].data(), n * sizeof(float)), 0)
              << what << ": member " << r << " differs from member 0";
        for (size_t e = 0; e < n; ++e) {
          double want = 0;
          for (int r = 0; r < p; ++r)
            want += input(r, n)[e];
          EXPECT_NEAR(out[0][e], want, 1e-4 * (1 + std::abs(want))) << what << " element " << e;
        }
      }
}

TEST(CollectivesTest, RingReduceScatterAndAllGatherUseTheZeroShards) {
  for (int p : {2, 3, 4})
    for (CollectiveAlgo algo : {CollectiveAlgo::kRing, CollectiveAlgo::kTree}) {
      const size_t n = 12 * static_cast<size_t>(p);
      std::vector<std::vector<float>> reduced(static_cast<size_t>(p)),
          gathered(static_cast<size_t>(p)), all_reduced(static_cast<size_t>(p));
      Status status = run_on_threads(p, [&](int rank, Communicator &comm) {
        Group group;
        for (int r = 0; r < p; ++r)
          group.push_back(r);
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
  const auto start = std::chrono::steady_clock::now();
  Status status = run_on_threads(
      3,
      [&](int rank, Communicator &comm) -> Status {
        if (rank == 2) {
          std::this_thread::sleep_for(std::chrono::milliseconds(500));
          return Status::ok();
        }
        std::vector<float> data = input(rank, 30);
        return algo_all_reduce(comm, data, {0, 1, 2}, CollectiveAlgo::kRing, 5, "grad 'w'");
      },
      std::chrono::milliseconds(200));
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("timed out"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("grad 'w'"), std::string::npos) << status.message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

} // namespace
} // namespace strata::runtime
