// The local transport: P ranks as threads of one process.
//
// A LocalWorld is the state the ranks share: one mailbox per (source,
// destination, tag) and one rendezvous slot per collective in flight, guarded by
// one mutex, with one condition variable per rank that wakes it when something
// it waits for arrives. Sends copy the data into the receiver's mailbox and
// return at once; receives and collectives block, each wait bounded by the
// world's timeout. Collectives copy every member's input into the slot; the last
// member to arrive computes the result (sums in increasing rank order) and every
// member copies the same bytes out.
//
// The first failure of any rank (a timeout, mismatched sizes, a bad argument, an
// abort, or an error returned by a rank's body under run_on_threads) is the
// world's failure; it wakes every waiting rank, and every pending and later call
// fails with "device N failed: <reason>".
#pragma once

#include <chrono>
#include <functional>
#include <memory>

#include "runtime/comm/communicator.h"

namespace strata::runtime {

inline constexpr std::chrono::milliseconds kDefaultCommunicatorTimeout{30'000};

class LocalWorldState;

class LocalWorld {
public:
  // `size` >= 1 ranks; every wait is bounded by `timeout` (> 0).
  static Result<std::shared_ptr<LocalWorld>> create(int size, std::chrono::milliseconds timeout);
  ~LocalWorld();

  int size() const;
  std::chrono::milliseconds timeout() const;

  // The communicator of `rank` (0 <= rank < size); one per rank, used by one
  // thread at a time. It and its requests keep the shared state alive.
  std::unique_ptr<Communicator> communicator(int rank);

  // Ends the world with `reason` (as Communicator::abort, from outside any rank).
  void abort(Status reason);
  // Records that `rank` failed with `error` and ends the world; the first
  // failure wins. The message is prefixed with the device's name.
  void fail(int rank, const Status &error);
  // The world's first failure, or ok.
  Status failure() const;

private:
  explicit LocalWorld(std::shared_ptr<LocalWorldState> state);
  std::shared_ptr<LocalWorldState> state_;
};

// Runs `body` for ranks 0..size-1, each on its own thread with a communicator of
// one fresh LocalWorld, and joins them all. Returns the world's first failure
// (which names its rank), or ok when every body returned ok. An error returned by
// a body ends the world, so ranks waiting on that rank fail promptly.
Status run_on_threads(int size, const std::function<Status(int rank, Communicator &)> &body,
                      std::chrono::milliseconds timeout = kDefaultCommunicatorTimeout);

} // namespace strata::runtime
