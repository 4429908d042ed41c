// Device time (runtime/comm/device_clock.h): clocks that count each thread's own CPU
// time and meet at messages and collectives, whatever the machine's load.
#include "runtime/comm/device_clock.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/comm/local_communicator.h"

namespace strata::runtime {
namespace {

// Uses `seconds` of this thread's CPU time.
void spin(double seconds) {
  const double start = thread_cpu_seconds();
  volatile double sink = 0;
  while (thread_cpu_seconds() - start < seconds)
    sink = sink + 1;
}

// What a thread does besides spinning (clock reads, system calls, a copy)
// costs far less than this; a sanitizer build included.
constexpr double kSlack = 0.01;

TEST(DeviceClockTest, CountsCpuTimeNotSleep) {
  DeviceClock clock;
  clock.start(1.0);
  spin(0.02);
  const double spun = clock.now();
  EXPECT_GE(spun, 1.02);
  EXPECT_LT(spun, 1.02 + kSlack);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_LT(clock.now() - spun, kSlack) << "a sleeping thread's clock moved";
  // Waiting for something ready later moves the clock to it; for something
  // ready earlier, not at all.
  EXPECT_GE(clock.join(5.0), 5.0);
  EXPECT_LT(clock.last(), 5.0 + kSlack);
  EXPECT_LT(clock.join(2.0), 5.0 + kSlack);
}

TEST(DeviceClockTest, ExchangeMatchesMessagesInOrderAndCollectivesByGroup) {
  ClockExchange exchange;
  exchange.sent(0, 1, 7, 1.5);
  exchange.sent(0, 1, 7, 2.5);
  exchange.sent(2, 1, 7, 9.0); // another channel
  const uint64_t first = exchange.posted(0, 1, 7), second = exchange.posted(0, 1, 7);
  EXPECT_EQ(exchange.ready(0, 1, 7, second), 2.5); // waited in the other order
  EXPECT_EQ(exchange.ready(0, 1, 7, first), 1.5);
  EXPECT_EQ(exchange.ready(2, 1, 7, exchange.posted(2, 1, 7)), 9.0);

  const Group all{0, 1, 2}, pair{0, 2};
  exchange.entered(all, 0, 0, 1.0);
  exchange.entered(pair, 0, 0, 7.0); // the same sequence number, another group
  exchange.entered(all, 0, 1, 3.0);
  exchange.entered(all, 0, 2, 2.0);
  // Every member is done at the latest entry plus the most work any member
  // did in it, once all have said how much.
  std::vector<double> done(3);
  {
    std::vector<std::thread> members;
    for (int rank = 0; rank < 3; ++rank)
      members.emplace_back([&, rank] {
        done[static_cast<size_t>(rank)] =
            exchange.left(all, 0, rank, -1, rank == 1 ? 0.5 : 0.125, std::chrono::seconds(10));
      });
    for (std::thread &member : members)
      member.join();
  }
  EXPECT_EQ(done, std::vector<double>(3, 3.5));
  EXPECT_EQ(exchange.left(pair, 0, 0, -1, 0.25, std::chrono::milliseconds(0)), 7.25)
      << "a member that hears from nobody else (a failed call) does not wait";
  // A broadcast waits for its root only, then adds its own work.
  exchange.entered(all, 1, 0, 4.0);
  exchange.entered(all, 1, 1, 6.0);
  exchange.entered(all, 1, 2, 1.0);
  const auto none = std::chrono::milliseconds(0);
  EXPECT_EQ(exchange.left(all, 1, 0, 0, 0.25, none), 4.25);
  EXPECT_EQ(exchange.left(all, 1, 1, 0, 0.5, none), 6.5);
  EXPECT_EQ(exchange.left(all, 1, 2, 0, 0.0, none), 4.0);
}

// A chain 0 -> 1 -> 2: each device's time is its own CPU time plus what it
// waited for, the same however the three threads shared the cores.
TEST(DeviceClockTest, MessagesCarryTheSendersTime) {
  ClockExchange exchange;
  std::vector<double> ends(3, -1);
  const Status status = run_on_threads(
      3,
      [&](int rank, Communicator &inner) -> Status {
        DeviceClock clock;
        clock.start(0);
        auto comm = clocked_communicator(inner, clock, exchange);
        float value = 1;
        if (rank == 0) {
          spin(0.04);
          RETURN_IF_ERROR(comm->send(&value, sizeof value, 1, 5));
        } else if (rank == 1) {
          spin(0.01);
          RETURN_IF_ERROR(comm->recv(&value, sizeof value, 0, 5)); // ready at 0.04
          spin(0.04);
          RETURN_IF_ERROR(comm->isend(&value, sizeof value, 2, 5)->wait());
        } else {
          auto request = comm->irecv(&value, sizeof value, 1, 5); // posted at once
          spin(0.005);
          RETURN_IF_ERROR(request->wait()); // ready at 0.08
          spin(0.01);
        }
        ends[static_cast<size_t>(rank)] = clock.now();
        return Status::ok();
      },
      std::chrono::milliseconds(10'000));
  ASSERT_TRUE(status.is_ok()) << status.message();
  const std::vector<double> expected{0.04, 0.08, 0.09};
  for (size_t rank = 0; rank < 3; ++rank) {
    EXPECT_GE(ends[rank], expected[rank]) << "device " << rank;
    EXPECT_LT(ends[rank], expected[rank] + kSlack) << "device " << rank;
  }
}

TEST(DeviceClockTest, CollectivesWaitForTheirLastMemberOrTheirRoot) {
  ClockExchange exchange;
  std::vector<double> reduced(3), broadcast(3), large(3);
  std::vector<float> sums(3);
  const Status status = run_on_threads(
      3,
      [&](int rank, Communicator &inner) -> Status {
        DeviceClock clock;
        clock.start(0);
        auto comm = clocked_communicator(inner, clock, exchange);
        spin(0.01 * (rank + 1));
        float value = static_cast<float>(rank);
        RETURN_IF_ERROR(comm->all_reduce(std::span(&value, 1)));
        sums[static_cast<size_t>(rank)] = value;
        reduced[static_cast<size_t>(rank)] = clock.now();
        if (rank == 2) spin(0.03);
        RETURN_IF_ERROR(comm->broadcast(&value, sizeof value, 0));
        broadcast[static_cast<size_t>(rank)] = clock.now();
        // The local transport sums on the member that arrives last (by the
        // wall clock): every member is done when that work is.
        std::vector<float> values(size_t{1} << 22, 1.0f);
        RETURN_IF_ERROR(comm->all_reduce(std::span(values)));
        large[static_cast<size_t>(rank)] = clock.now();
        return Status::ok();
      },
      std::chrono::milliseconds(10'000));
  ASSERT_TRUE(status.is_ok()) << status.message();
  for (size_t rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(sums[rank], 3.0f); // the communicator underneath still sums
    EXPECT_GE(reduced[rank], 0.03) << "device " << rank;
    EXPECT_LT(reduced[rank], 0.03 + kSlack) << "device " << rank;
  }
  // The root and device 1 do not wait for device 2's extra work.
  EXPECT_LT(broadcast[0], 0.03 + 2 * kSlack);
  EXPECT_LT(broadcast[1], 0.03 + 2 * kSlack);
  EXPECT_GE(broadcast[2], 0.06);
  const auto [first, last] = std::minmax_element(large.begin(), large.end());
  EXPECT_LT(*last - *first, 0.002) << "the members of one all-reduce end apart";
  EXPECT_GT(*first, broadcast[2]);
}

} // namespace
} // namespace strata::runtime
