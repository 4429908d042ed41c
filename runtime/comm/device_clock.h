// Device time: how long a pipeline's step would take with a core per device,
// measured on a machine with fewer.
//
// When P device threads share fewer than P cores, wall-clock time measures the
// operating system's time slicing, not the schedule: every device runs at a
// fraction of its speed and waits look like work. Device time instead advances
// each device's clock by the CPU time its own thread spends (the kernel's
// per-thread accounting, CLOCK_THREAD_CPUTIME_ID), and joins the clocks where
// the devices depend on each other:
//   - a message is ready at the sender's clock when it sent it; a receive ends
//     at max(receiver's clock, ready) plus the receiver's own CPU time in it;
//   - a collective ends on every member at the latest member's clock when it
//     entered plus the most CPU time any member spent in it (a transport may
//     do a whole reduction on one member); a broadcast member waits for its
//     root only, then adds its own time.
// A device's communication stream (data-parallel gradient buckets) keeps a
// clock of its own: it counts as an engine beside the device's core, as a
// GPU's communication kernels run beside its compute. A message is ready when
// its send began (in-process sends copy the data in microseconds).
// Blocked waits cost no CPU time, so they never advance a clock. The result is
// the time of the same instructions on dedicated cores, minus what sharing a
// core does to caches and memory bandwidth; it needs every thread doing a
// device's work to be counted (one GEMM thread per device: a GEMM's worker
// threads would not be).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "runtime/comm/communicator.h"

namespace strata::runtime {

// Seconds of CPU time the calling thread has used.
double thread_cpu_seconds();

// One thread's clock. start() on the thread that does the work; after that,
// every call must come from that thread.
class DeviceClock {
public:
  // Begins at device time `at` (seconds), counting this thread's CPU time from now.
  void start(double at);
  // Adds the CPU time used since the last call and returns the device time.
  double now();
  // Something this thread waited for was ready at `ready`: the clock goes to
  // max(clock as of the last call, ready) plus the CPU time used since that
  // call (call now() just before waiting, so that is the wait's own). Returns
  // the new time.
  double join(double ready);
  // The time as of the last call (any thread, once this one is done).
  double last() const { return time_; }

private:
  double time_ = 0;
  double mark_ = 0; // thread CPU seconds already counted
};

// What the device threads of one world tell each other about time: when each
// message was sent and when each member entered each collective. Shared by the
// world's clocked communicators; thread-safe.
class ClockExchange {
public:
  // Sender side, before the message goes: the n-th message on (source,
  // destination, tag) was sent at `time`.
  void sent(int source, int destination, uint64_t tag, double time);
  // Receiver side, when the receive is posted: its sequence number on the
  // channel (receives are matched in the order they are posted).
  uint64_t posted(int source, int destination, uint64_t tag);
  // Once the message arrived: when it was sent (then forgotten). A message
  // that arrived was always announced first.
  double ready(int source, int destination, uint64_t tag, uint64_t sequence);
  // Forgets an announcement no one will read (a receive dropped unwaited).
  void drop(int source, int destination, uint64_t tag, uint64_t sequence);

  // Collective number `sequence` on `group` (the full member list): `rank`
  // entered it at `time`.
  void entered(const Group &group, uint64_t sequence, int rank, double time);
  // Once the collective completed on `rank`, which spent `work` seconds of
  // CPU time in it: the time it is done there. Without a root, the latest
  // entry plus the most work of any member, which waits (at most `timeout`,
  // then with the members heard from) for every member's work; for a
  // broadcast (root >= 0), the later of its own and the root's entry plus its
  // own work. Forgotten once every member has left.
  double left(const Group &group, uint64_t sequence, int rank, int root, double work,
              std::chrono::milliseconds timeout);

private:
  using Channel = std::tuple<int, int, uint64_t, uint64_t>; // source, destination, tag, n
  struct Entries {
    std::map<int, double> by_rank, work;
    size_t left = 0;
  };
  std::mutex mutex_;
  std::condition_variable work_posted_;
  std::map<std::tuple<int, int, uint64_t>, uint64_t> sends_, receives_;
  std::map<Channel, double> messages_;
  std::map<std::pair<Group, uint64_t>, Entries> collectives_;
};

// A communicator that does what `inner` does and keeps `clock` (the calling
// device's, or its communication stream's) in device time through `exchange`.
// Every rank of the world must be wrapped alike, over one exchange.
std::unique_ptr<Communicator> clocked_communicator(Communicator &inner, DeviceClock &clock,
                                                   ClockExchange &exchange);

} // namespace strata::runtime
