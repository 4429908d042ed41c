#include "runtime/comm/local_communicator.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace strata::runtime {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

// Passing tests never reach this; failing ones end by their own timeout.
constexpr milliseconds kGenerousTimeout{5000};
// Tests that expect a timeout.
constexpr milliseconds kShortTimeout{200};

// Each rank's own status, next to what run_on_threads reports.
struct Outcome {
  Status overall;
  std::vector<Status> ranks;
};

Outcome run_ranks(int size, const std::function<Status(int, Communicator &)> &body,
                  milliseconds timeout = kGenerousTimeout) {
  Outcome outcome;
  outcome.ranks.resize(static_cast<std::size_t>(size));
  outcome.overall = run_on_threads(
      size,
      [&](int rank, Communicator &comm) {
        Status status = body(rank, comm);
        outcome.ranks[rank] = status;
        return status;
      },
      timeout);
  return outcome;
}

// Values of widely different magnitudes and both signs, so that the order of a
// sum changes its rounding.
template <typename T> T input_value(int rank, std::size_t i) {
  const T mantissa = T(1) + T(0.1) * static_cast<T>((i * 7 + rank * 13) % 10);
  const int exponent = static_cast<int>((i * 3 + rank * 5) % 40) - 20;
  const T sign = (i + rank) % 3 == 0 ? T(-1) : T(1);
  return sign * std::ldexp(mantissa, exponent);
}

template <typename T>
std::vector<T> inputs_of(int rank, std::size_t count, std::size_t offset = 0) {
  std::vector<T> values(count);
  for (std::size_t i = 0; i < count; ++i)
    values[i] = input_value<T>(rank, offset + i);
  return values;
}

// The single-device sum: element by element, in increasing rank order.
template <typename T>
std::vector<T> sum_in_rank_order(const std::vector<int> &ranks, std::size_t count,
                                 std::size_t offset = 0) {
  std::vector<T> sum = inputs_of<T>(ranks[0], count, offset);
  for (std::size_t r = 1; r < ranks.size(); ++r) {
    const std::vector<T> addend = inputs_of<T>(ranks[r], count, offset);
    for (std::size_t i = 0; i < count; ++i)
      sum[i] += addend[i];
  }
  return sum;
}

template <typename T> bool bitwise_equal(const std::vector<T> &a, const std::vector<T> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

std::vector<int> all_ranks(int size) {
  std::vector<int> ranks;
  for (int rank = 0; rank < size; ++rank)
    ranks.push_back(rank);
  return ranks;
}

// --- point to point --------------------------------------------------------

TEST(LocalCommunicator, SendRecvKeepsOrderPerPeerAndTag) {
  constexpr int kSize = 3, kTags = 4, kMessages = 20;
  std::vector<int> out_of_order(kSize, 0);
  Outcome outcome = run_ranks(kSize, [&](int rank, Communicator &comm) {
    // Interleave tags and destinations on the way out ...
    for (int k = 0; k < kMessages; ++k) {
      for (int tag = 0; tag < kTags; ++tag) {
        for (int peer = 0; peer < kSize; ++peer) {
          if (peer == rank) continue;
          const int64_t value = rank * 10000 + tag * 100 + k;
          RETURN_IF_ERROR(comm.send(&value, sizeof(value), peer, tag));
        }
      }
    }
    // ... and receive them tag by tag, in reverse tag order.
    for (int peer = 0; peer < kSize; ++peer) {
      if (peer == rank) continue;
      for (int tag = kTags - 1; tag >= 0; --tag) {
        for (int k = 0; k < kMessages; ++k) {
          int64_t value = -1;
          RETURN_IF_ERROR(comm.recv(&value, sizeof(value), peer, tag));
          if (value != peer * 10000 + tag * 100 + k) ++out_of_order[rank];
        }
      }
    }
    return Status::ok();
  });
  ASSERT_TRUE(outcome.overall.is_ok()) << outcome.overall.to_string();
  EXPECT_EQ(out_of_order, std::vector<int>(kSize, 0));
}

TEST(LocalCommunicator, ReceivesMatchInPostOrderNotWaitOrder) {
  int a = 0, b = 0, c = 0;
  bool ready_before_send = true, ready_after_later_wait = false;
  Outcome outcome = run_ranks(2, [&](int rank, Communicator &comm) {
    if (rank == 0) {
      RETURN_IF_ERROR(comm.barrier());
      const int x = 1, y = 2, z = 3;
      auto send_z = comm.isend(&z, sizeof(z), 1, 9);
      auto send_x = comm.isend(&x, sizeof(x), 1, 5);
      auto send_y = comm.isend(&y, sizeof(y), 1, 5);
      RETURN_IF_ERROR(send_z->wait());
      RETURN_IF_ERROR(send_x->wait());
      return send_y->wait();
    }
    auto recv_a = comm.irecv(&a, sizeof(a), 0, 5);
    auto recv_b = comm.irecv(&b, sizeof(b), 0, 5);
    auto recv_c = comm.irecv(&c, sizeof(c), 0, 9);
    ready_before_send = recv_a->ready() || recv_b->ready() || recv_c->ready();
    RETURN_IF_ERROR(comm.barrier());
    RETURN_IF_ERROR(recv_c->wait());
    RETURN_IF_ERROR(recv_b->wait());
    ready_after_later_wait = recv_a->ready(); // x was sent before y
    return recv_a->wait();
  });
  ASSERT_TRUE(outcome.overall.is_ok()) << outcome.overall.to_string();
  EXPECT_FALSE(ready_before_send);
  EXPECT_TRUE(ready_after_later_wait);
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, 2);
  EXPECT_EQ(c, 3);
}

TEST(LocalCommunicator, NonBlockingRingExchange) {
  for (int size = 1; size <= 4; ++size) {
    std::vector<int> received(size, -1);
    Outcome outcome = run_ranks(size, [&](int rank, Communicator &comm) {
      const int right = (rank + 1) % size, left = (rank + size - 1) % size;
      const int mine = 100 + rank;
      auto receive = comm.irecv(&received[rank], sizeof(int), left, 0, "ring");
      auto send = comm.isend(&mine, sizeof(mine), right, 0, "ring");
      RETURN_IF_ERROR(send->wait());
      return receive->wait();
    });
    ASSERT_TRUE(outcome.overall.is_ok()) << outcome.overall.to_string();
    for (int rank = 0; rank < size; ++rank) {
      EXPECT_EQ(received[rank], 100 + (rank + size - 1) % size) << "size " << size;
    }
  }
}

TEST(LocalCommunicator, DroppedReceiveDiscardsItsMessage) {
  int first = 0, second = 0;
  Outcome outcome = run_ranks(2, [&](int rank, Communicator &comm) {
    if (rank == 0) {
      RETURN_IF_ERROR(comm.barrier()); // the first receive is dropped before it arrives
      for (int value : {1, 2, 3, 4})
        RETURN_IF_ERROR(comm.send(&value, sizeof(value), 1, 1));
      return comm.barrier();
    }
    int unused = 0;
    comm.irecv(&unused, sizeof(unused), 0, 1).reset();
    RETURN_IF_ERROR(comm.barrier());
    RETURN_IF_ERROR(comm.recv(&first, sizeof(first), 0, 1));
    RETURN_IF_ERROR(comm.barrier());
    comm.irecv(&unused, sizeof(unused), 0, 1).reset(); // message 3 has arrived
    return comm.recv(&second, sizeof(second), 0, 1);
  });
  ASSERT_TRUE(outcome.overall.is_ok()) << outcome.overall.to_string();
  EXPECT_EQ(first, 2);
  EXPECT_EQ(second, 4);
}

// --- collectives -----------------------------------------------------------

class CollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(CollectivesTest, MatchReferences) {
  const int size = GetParam();
  const std::vector<int> ranks = all_ranks(size);
  constexpr std::size_t kCount = 37, kChunk = 5;
  struct Results {
    std::vector<float> reduced_f32;
    std::vector<double> reduced_f64;
    std::vector<float> scattered_f32;
    std::vector<double> scattered_f64;
    std::vector<int32_t> gathered;
    std::vector<std::vector<int64_t>> broadcasts; // one per root
  };
  std::vector<Results> results(size);
  Outcome outcome = run_ranks(size, [&](int rank, Communicator &comm) {
    Results &mine = results[rank];
    mine.reduced_f32 = inputs_of<float>(rank, kCount);
    RETURN_IF_ERROR(comm.all_reduce(mine.reduced_f32, {}, "f32"));
    mine.reduced_f64 = inputs_of<double>(rank, kCount);
    RETURN_IF_ERROR(comm.all_reduce(mine.reduced_f64, {}, "f64"));

    const std::vector<float> scatter_f32 = inputs_of<float>(rank, kChunk * size);
    mine.scattered_f32.resize(kChunk);
    RETURN_IF_ERROR(comm.reduce_scatter(scatter_f32, mine.scattered_f32));
    const std::vector<double> scatter_f64 = inputs_of<double>(rank, kChunk * size);
    mine.scattered_f64.resize(kChunk);
    RETURN_IF_ERROR(comm.reduce_scatter(scatter_f64, mine.scattered_f64));

    const int32_t piece[3] = {rank, rank * 10, rank * 100};
    mine.gathered.assign(3 * size, -1);
    RETURN_IF_ERROR(comm.all_gather(piece, sizeof(piece), mine.gathered.data()));

    for (int root = 0; root < size; ++root) {
      std::vector<int64_t> data(4, rank == root ? int64_t{1000} * root + 7 : -1);
      RETURN_IF_ERROR(comm.broadcast(data.data(), data.size() * sizeof(int64_t), root));
      mine.broadcasts.push_back(data);
    }
    return comm.barrier({}, "end");
  });
  ASSERT_TRUE(outcome.overall.is_ok()) << outcome.overall.to_string();

  const std::vector<float> sum_f32 = sum_in_rank_order<float>(ranks, kCount);
  const std::vector<double> sum_f64 = sum_in_rank_order<double>(ranks, kCount);
  for (int rank = 0; rank < size; ++rank) {
    const Results &mine = results[rank];
    EXPECT_TRUE(bitwise_equal(mine.reduced_f32, sum_f32)) << "rank " << rank;
    EXPECT_TRUE(bitwise_equal(mine.reduced_f64, sum_f64)) << "rank " << rank;
    EXPECT_TRUE(
        bitwise_equal(mine.scattered_f32, sum_in_rank_order<float>(ranks, kChunk, kChunk * rank)))
        << "rank " << rank;
    EXPECT_TRUE(
        bitwise_equal(mine.scattered_f64, sum_in_rank_order<double>(ranks, kChunk, kChunk * rank)))
        << "rank " << rank;
    std::vector<int32_t> gathered;
    for (int peer = 0; peer < size; ++peer)
      gathered.insert(gathered.end(), {peer, peer * 10, peer * 100});
    EXPECT_EQ(mine.gathered, gathered) << "rank " << rank;
    ASSERT_EQ(mine.broadcasts.size(), static_cast<std::size_t>(size));
    for (int root = 0; root < size; ++root) {
      EXPECT_EQ(mine.broadcasts[root], std::vector<int64_t>(4, int64_t{1000} * root + 7))
          << "rank " << rank << ", root " << root;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, CollectivesTest, ::testing::Values(1, 2, 3, 4));

TEST(LocalCommunicator, DisjointGroupsRunConcurrently) {
  constexpr std::size_t kCount = 16;
  constexpr int kRounds = 5;
  std::vector<std::vector<float>> group_sums(4), world_sums(4);
  std::vector<std::vector<int>> gathered(4);
  std::vector<int> broadcast(4, -1);
  Outcome outcome = run_ranks(4, [&](int rank, Communicator &comm) {
    const Group group = rank % 2 == 0 ? Group{0, 2} : Group{1, 3};
    for (int round = 0; round < kRounds; ++round) {
      group_sums[rank] = inputs_of<float>(rank, kCount, round);
      RETURN_IF_ERROR(comm.all_reduce(group_sums[rank], group, "pair"));
      if (round == 2) {
        world_sums[rank] = inputs_of<float>(rank, kCount);
        RETURN_IF_ERROR(comm.all_reduce(world_sums[rank], {}, "world"));
      }
    }
    gathered[rank].assign(2, -1);
    RETURN_IF_ERROR(comm.all_gather(&rank, sizeof(int), gathered[rank].data(), group));
    broadcast[rank] = rank;
    return comm.broadcast(&broadcast[rank], sizeof(int), group[1], group);
  });
  ASSERT_TRUE(outcome.overall.is_ok()) << outcome.overall.to_string();
  for (int rank = 0; rank < 4; ++rank) {
    const std::vector<int> group = rank % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
    EXPECT_TRUE(
        bitwise_equal(group_sums[rank], sum_in_rank_order<float>(group, kCount, kRounds - 1)))
        << "rank " << rank;
    EXPECT_TRUE(bitwise_equal(world_sums[rank], sum_in_rank_order<float>(all_ranks(4), kCount)))
        << "rank " << rank;
    EXPECT_EQ(gathered[rank], group) << "rank " << rank;
    EXPECT_EQ(broadcast[rank], group[1]) << "rank " << rank;
  }
}

TEST(LocalCommunicator, AllReduceIsBitwiseDeterministic) {
  constexpr int kSize = 4;
  constexpr std::size_t kCount = 1000;
  const std::vector<float> expected = sum_in_rank_order<float>(all_ranks(kSize), kCount);
  // The inputs are chosen so that another order would round differently.
  const std::vector<float> reversed = sum_in_rank_order<float>({3, 2, 1, 0}, kCount);
  ASSERT_FALSE(bitwise_equal(expected, reversed));

  for (int run = 0; run < 3; ++run) {
    std::vector<std::vector<float>> results(kSize);
    Outcome outcome = run_ranks(kSize, [&](int rank, Communicator &comm) {
      results[rank] = inputs_of<float>(rank, kCount);
      if (rank == run) std::this_thread::sleep_for(milliseconds(5)); // vary who arrives last
      return comm.all_reduce(results[rank], {}, "gradients");
    });
    ASSERT_TRUE(outcome.overall.is_ok()) << outcome.overall.to_string();
    for (int rank = 0; rank < kSize; ++rank) {
      EXPECT_TRUE(bitwise_equal(results[rank], expected)) << "run " << run << ", rank " << rank;
    }
  }
}

// --- failures ----------------------------------------------------------------

TEST(LocalCommunicator, SilentPeerTimesOutAndEndsEveryRank) {
  Outcome outcome = run_ranks(
      3,
      [&](int rank, Communicator &comm) {
        comm.set_label(str_cat("stage ", rank));
        if (rank == 1) return Status::ok(); // never sends
        if (rank == 0) {
          float activation[8];
          return comm.recv(activation, sizeof(activation), 1, 7,
                           "activation 'layer3.out', micro-batch 5");
        }
        // Starts waiting later than device 0, so device 0's timeout comes first.
        std::this_thread::sleep_for(milliseconds(100));
        return comm.barrier({0, 2}, "step end");
      },
      kShortTimeout);
  EXPECT_EQ(outcome.overall.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(outcome.overall.message(),
            "device 0 (stage 0): recv from device 1, tag 7 (activation 'layer3.out', "
            "micro-batch 5): timed out after 200 ms");
  EXPECT_EQ(outcome.ranks[0].message(), outcome.overall.message());
  EXPECT_TRUE(outcome.ranks[1].is_ok());
  EXPECT_EQ(outcome.ranks[2].message(),
            "device 2 (stage 2): barrier over devices {0, 2} (step end): device 0 (stage 0) "
            "failed: recv from device 1, tag 7 (activation 'layer3.out', micro-batch 5): timed out "
            "after 200 ms");
}

TEST(LocalCommunicator, CollectiveTimeoutNamesTheMissingDevices) {
  Outcome outcome = run_ranks(
      4,
      [&](int rank, Communicator &comm) {
        if (rank == 1 || rank == 3) return Status::ok();
        float data[2] = {1, 2};
        return comm.all_reduce(data, {}, "gradients");
      },
      kShortTimeout);
  EXPECT_EQ(outcome.overall.code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(outcome.overall.message(),
              HasSubstr(": all_reduce of 2 f32 over devices {0, 1, 2, 3} (gradients): timed out "
                        "after 200 ms waiting for devices {1, 3}"));
}

TEST(LocalCommunicator, ErrorReturnedByOneRankEndsTheOthers) {
  Outcome outcome = run_ranks(3, [&](int rank, Communicator &comm) {
    if (rank == 1) return internal_error("loss is NaN");
    float data[4] = {1, 2, 3, 4};
    return comm.all_reduce(data, {}, "gradients");
  });
  EXPECT_EQ(outcome.overall.code(), StatusCode::kInternal);
  EXPECT_EQ(outcome.overall.message(), "device 1: loss is NaN");
  for (int rank : {0, 2}) {
    EXPECT_EQ(outcome.ranks[rank].message(),
              str_cat("device ", rank,
                      ": all_reduce of 4 f32 over devices {0, 1, 2} (gradients): device 1 failed: "
                      "loss is NaN"));
  }
}

// A device thread the host cannot give memory to fails the run as out of
// memory (a condition of the run), not as a bug in strata; the others end too.
TEST(LocalCommunicator, OutOfMemoryInADeviceThreadIsResourceExhausted) {
  Status survivor;
  const Status overall = run_on_threads(
      2,
      [&](int rank, Communicator &comm) -> Status {
        if (rank == 1) throw std::bad_alloc();
        float data[4] = {1, 2, 3, 4};
        survivor = comm.all_reduce(data, {}, "gradients");
        return survivor;
      },
      kGenerousTimeout);
  EXPECT_EQ(overall.code(), StatusCode::kResourceExhausted) << overall.to_string();
  EXPECT_THAT(overall.message(), HasSubstr("device 1: out of memory"));
  EXPECT_EQ(survivor.code(), StatusCode::kResourceExhausted) << survivor.to_string();
}

TEST(LocalCommunicator, AbortEndsPendingAndLaterCalls) {
  Status later_on_aborter, later_on_waiter;
  Outcome outcome = run_ranks(3, [&](int rank, Communicator &comm) {
    if (rank == 1) {
      std::this_thread::sleep_for(milliseconds(20)); // let the others start waiting
      comm.abort(failed_precondition("checkpoint disk full"));
      const int value = 0;
      later_on_aborter = comm.send(&value, sizeof(value), 0, 3);
      return Status::ok();
    }
    Status status;
    if (rank == 0) {
      int value = 0;
      status = comm.recv(&value, sizeof(value), 1, 3, "weights");
    } else {
      status = comm.barrier();
    }
    if (rank == 0) later_on_waiter = comm.barrier({0, 2});
    return status;
  });
  EXPECT_EQ(outcome.overall.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(outcome.overall.message(), "device 1 aborted: checkpoint disk full");
  EXPECT_EQ(
      outcome.ranks[0].message(),
      "device 0: recv from device 1, tag 3 (weights): device 1 aborted: checkpoint disk full");
  EXPECT_EQ(outcome.ranks[2].message(),
            "device 2: barrier over devices {0, 1, 2}: device 1 aborted: checkpoint disk full");
  EXPECT_THAT(later_on_aborter.message(), HasSubstr("device 1 aborted: checkpoint disk full"));
  EXPECT_THAT(later_on_waiter.message(), HasSubstr("device 1 aborted: checkpoint disk full"));
}

TEST(LocalCommunicator, MessageSizeMismatchNamesBothSides) {
  Outcome outcome = run_ranks(2, [&](int rank, Communicator &comm) {
    if (rank == 0) {
      const char data[16] = {};
      RETURN_IF_ERROR(comm.send(data, sizeof(data), 1, 2, "weights of 'fc1'"));
      return comm.barrier();
    }
    char data[12];
    return comm.recv(data, sizeof(data), 0, 2, "gradients of 'fc1'");
  });
  EXPECT_EQ(outcome.overall.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(outcome.overall.message(),
            "device 1: recv from device 0, tag 2 (gradients of 'fc1'): size mismatch: device 0 "
            "sent 16 bytes (weights of 'fc1'), device 1 expects 12 bytes");
  EXPECT_THAT(outcome.ranks[0].message(), HasSubstr("device 1 failed: recv from device 0"));
}

TEST(LocalCommunicator, MismatchedCollectivesNameBothSides) {
  Outcome outcome = run_ranks(2, [&](int rank, Communicator &comm) {
    std::vector<float> data(rank == 0 ? 4 : 5, 1.0f);
    return comm.all_reduce(data, {}, str_cat("bucket ", rank));
  });
  EXPECT_EQ(outcome.overall.code(), StatusCode::kInvalidArgument);
  // Either rank may arrive first; the other reports the mismatch.
  EXPECT_THAT(outcome.overall.message(), HasSubstr("does not match device"));
  EXPECT_THAT(outcome.overall.message(),
              HasSubstr("all_reduce of 4 f32 over devices {0, 1} (bucket 0)"));
  EXPECT_THAT(outcome.overall.message(),
              HasSubstr("all_reduce of 5 f32 over devices {0, 1} (bucket 1)"));
}

TEST(LocalCommunicator, BadGroupsAndPeersAreErrors) {
  Outcome outcome = run_ranks(2, [&](int rank, Communicator &comm) {
    if (rank == 0) return comm.barrier({1}, "sync");
    return comm.barrier();
  });
  EXPECT_EQ(outcome.overall.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(outcome.overall.message(),
            "device 0: barrier over device 1 (sync): the group does not include device 0");
  EXPECT_THAT(outcome.ranks[1].message(), HasSubstr("device 0 failed: barrier over device 1"));

  outcome = run_ranks(2, [&](int, Communicator &comm) { return comm.barrier({1, 0}); });
  EXPECT_THAT(outcome.overall.message(), HasSubstr("distinct devices in increasing order"));

  outcome = run_ranks(2, [&](int rank, Communicator &comm) {
    const int value = 0;
    if (rank == 1) return comm.send(&value, sizeof(value), 5, 0);
    return Status::ok();
  });
  EXPECT_EQ(outcome.overall.message(), "device 1: send to device 5, tag 0: there is no device 5");

  // A bad peer ends the world: the device waiting on the caller fails too.
  outcome = run_ranks(2, [&](int rank, Communicator &comm) {
    int value = 0;
    if (rank == 0) return comm.irecv(&value, sizeof(value), -1, 4, "weights")->wait();
    return comm.recv(&value, sizeof(value), 0, 4);
  });
  EXPECT_EQ(outcome.overall.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(outcome.overall.message(),
            "device 0: recv from device -1, tag 4 (weights): there is no device -1");
  EXPECT_THAT(outcome.ranks[1].message(), HasSubstr("device 0 failed: recv from device -1"));

  outcome = run_ranks(2, [&](int rank, Communicator &comm) {
    std::vector<float> input(3), output(2);
    return comm.reduce_scatter(input, output, {}, str_cat("rank ", rank));
  });
  EXPECT_THAT(outcome.overall.message(), HasSubstr("the input has 3 elements, not 2 x 2"));

  outcome = run_ranks(2, [&](int rank, Communicator &comm) {
    int value = 0;
    if (rank == 0) return comm.broadcast(&value, sizeof(value), 1, {0});
    return Status::ok();
  });
  EXPECT_EQ(outcome.overall.message(), "device 0: broadcast of 4 bytes from device 1 over device "
                                       "0: the root, device 1, is not in the group");
}

TEST(LocalWorld, CreateRejectsBadArguments) {
  EXPECT_EQ(LocalWorld::create(0, kShortTimeout).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LocalWorld::create(2, milliseconds(0)).status().code(), StatusCode::kInvalidArgument);
  Result<std::shared_ptr<LocalWorld>> world = LocalWorld::create(2, kShortTimeout);
  ASSERT_TRUE(world.is_ok());
  EXPECT_EQ((*world)->size(), 2);
  std::unique_ptr<Communicator> comm = (*world)->communicator(1);
  EXPECT_EQ(comm->rank(), 1);
  EXPECT_EQ(comm->size(), 2);
  EXPECT_EQ(comm->timeout(), kShortTimeout);
  // A world ended from outside any rank.
  (*world)->abort(io_error("lost the node"));
  EXPECT_EQ(comm->barrier().message(),
            "device 1: barrier over devices {0, 1}: run aborted: lost the node");
  EXPECT_EQ((*world)->failure().message(), "run aborted: lost the node");
}

} // namespace
} // namespace strata::runtime
