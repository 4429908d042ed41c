// What the host transports share. The local world (devices as threads of this
// process) and the MPI world (devices spread over MPI ranks) differ in how
// bytes travel and agree on everything above that, written here once: how
// errors name devices and operations, the world's first failure, the checks of
// a peer or a collective call (a bad one is a bug in the plan and ends the
// world), how collectives are numbered and summed, recycled message buffers,
// and the device threads that run a world's bodies.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/comm/communicator.h"

namespace strata::runtime::host_transport {

// "30 s" for whole seconds, else "200 ms".
inline std::string format_duration(std::chrono::milliseconds duration) {
  if (duration.count() % 1000 == 0) return str_cat(duration.count() / 1000, " s");
  return str_cat(duration.count(), " ms");
}
// "operation (what)", or the operation alone.
inline std::string with_what(std::string operation, std::string_view what) {
  if (what.empty()) return operation;
  return str_cat(operation, " (", what, ")");
}
// "device 2" or "devices {0, 2}".
std::string format_devices(const std::vector<int> &devices);
// "send to device 3, tag 7 (what)", which also names a peer that does not exist.
inline std::string p2p_operation(std::string_view verb, int peer, uint64_t tag,
                                 std::string_view what) {
  return with_what(str_cat(verb, " device ", peer, ", tag ", tag), what);
}

enum class CollectiveKind { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kBarrier };

// What one member asks of a collective; every member must ask the same.
struct CollectiveSignature {
  CollectiveKind kind = CollectiveKind::kBarrier;
  std::size_t count = 0; // elements (reductions) or bytes (gather, broadcast) per member
  ReduceType type = ReduceType::kF32;
  int root = -1;               // broadcast
  std::size_t input_count = 0; // reduce_scatter: group size x count
  bool operator==(const CollectiveSignature &) const = default;
};

// "all_reduce of 4 f32 over devices {0, 1} (what)".
std::string collective_operation(const CollectiveSignature &signature,
                                 const std::vector<int> &members, std::string_view what);

// One device's collective calls, checked and numbered before anything moves.
class CollectiveCalls {
public:
  CollectiveCalls(int device, int devices) : device_(device), devices_(devices) {}
  // Resolves `group` (empty: every device) into members() and position() and
  // checks the call: distinct devices in increasing order, this one among
  // them, a broadcast's root too, a reduce_scatter's input group size x its
  // output. Returns what is wrong, or empty.
  std::string check(const CollectiveSignature &signature, const Group &group);
  const std::vector<int> &members() const { return members_; }
  std::size_t position() const { return position_; }
  // Numbers the checked group's collectives 0, 1, ...: every member issues
  // them in the same order, so the members agree on the numbers.
  uint64_t next_sequence() { return sequences_[members_]++; }

private:
  int device_, devices_;
  std::vector<int> members_;
  std::size_t position_ = 0;
  std::map<std::vector<int>, uint64_t> sequences_;
};

// Locks `mutex`, trying for a few microseconds before sleeping on it. The
// worlds' critical sections are short, and a thread put to sleep on a
// contended mutex takes tens of microseconds to wake (more in a virtual
// machine): longer than the wait, and enough to make the next meeting's
// partner sleep in turn.
inline std::unique_lock<std::mutex> lock_spinning(std::mutex &mutex) {
  std::unique_lock lock(mutex, std::try_to_lock);
  for (int round = 0; !lock.owns_lock() && round < 2000; ++round) {
    if ((round & 63) == 63) std::this_thread::yield();
    lock.try_lock();
  }
  if (!lock.owns_lock()) lock.lock();
  return lock;
}

// What every host world keeps under its one mutex: the labels that name its
// devices in errors, and its first failure. The first failure wins: the call
// that failed returns "<name>: <operation>: <problem>", every other call
// "<its name>: <its operation>: <name> failed: <operation>: <problem>".
class WorldState {
public:
  explicit WorldState(int devices) : labels_(static_cast<std::size_t>(devices)) {}
  virtual ~WorldState() = default;

  void set_label(int device, std::string label) {
    std::lock_guard lock(mutex_);
    labels_[static_cast<std::size_t>(device)] = std::move(label);
  }
  Status failure() const {
    std::lock_guard lock(mutex_);
    return failure_;
  }
  // `endpoint` failed outside any call: its body returned `error`.
  void fail_device(int endpoint, const Status &error) {
    std::lock_guard lock(mutex_);
    const std::string name = name_locked(endpoint);
    set_failure_locked(Status(error.code(), str_cat(name, ": ", error.message())),
                       str_cat(name, " failed: ", error.message()));
  }
  // A bad peer or collective call is a bug in the plan: it ends the world like
  // any other failure, and the error names the device and its call.
  Status check_peer(int endpoint, std::string_view verb, int peer, uint64_t tag,
                    std::string_view what) {
    if (peer >= 0 && static_cast<std::size_t>(peer) < labels_.size()) return Status::ok();
    return reject(endpoint, p2p_operation(verb, peer, tag, what),
                  str_cat("there is no device ", peer));
  }
  Status check_collective(int endpoint, CollectiveCalls &calls,
                          const CollectiveSignature &signature, const Group &group,
                          std::string_view what) {
    const std::string problem = calls.check(signature, group);
    if (problem.empty()) return Status::ok();
    return reject(endpoint, collective_operation(signature, calls.members(), what), problem);
  }

  // Guards this state and the deriving world's.
  mutable std::mutex mutex_;

protected:
  // "device 2 (stage 2)"
  virtual std::string name_locked(int endpoint) const {
    const std::string &label = labels_[static_cast<std::size_t>(endpoint)];
    if (label.empty()) return str_cat("device ", endpoint);
    return str_cat("device ", endpoint, " (", label, ")");
  }
  // Wakes every wait of the world, which has just failed. `spread`: the
  // world's other processes must hear of it (false when one of them told us).
  virtual void on_failure_locked(bool spread) = 0;

  // Records the world's first failure: `root` is what the failing call
  // returns, `cascade` the text every other call reports.
  void set_failure_locked(Status root, const std::string &cascade, bool spread = true) {
    if (failed_) return;
    failed_ = true;
    cascade_ = Status(root.code(), cascade);
    failure_ = std::move(root);
    on_failure_locked(spread);
  }
  // `endpoint` failed in `operation`: ends the world, returns the call's error.
  Status fail_locked(int endpoint, StatusCode code, const std::string &operation,
                     const std::string &problem) {
    const std::string name = name_locked(endpoint);
    Status error(code, str_cat(name, ": ", operation, ": ", problem));
    set_failure_locked(error, str_cat(name, " failed: ", operation, ": ", problem));
    return error;
  }
  // The error of a call of `endpoint` that the world's failure ended.
  Status cascaded_locked(int endpoint, const std::string &operation) const {
    return Status(cascade_.code(),
                  str_cat(name_locked(endpoint), ": ", operation, ": ", cascade_.message()));
  }

  std::vector<std::string> labels_; // by device
  bool failed_ = false;
  Status failure_; // the first failure, as its caller reported it
  Status cascade_; // what the first failure means to every other call

private:
  Status reject(int endpoint, const std::string &operation, const std::string &problem) {
    std::lock_guard lock(mutex_);
    return fail_locked(endpoint, StatusCode::kInvalidArgument, operation, problem);
  }
};

inline std::size_t element_size(ReduceType type) { return type == ReduceType::kF32 ? 4 : 8; }
// Adds `addend` into `sum`: the one step of every reduction. A group's sum is
// its first member's values with each later member's added in turn, in
// increasing rank order: the same bits on every member and in both worlds.
void add_elements(ReduceType type, void *sum, const void *addend, std::size_t count);

// Message copies recycled by size: a step sends the same sizes as the last
// one, and fresh memory costs a page fault per page. It keeps copies of 4 KiB
// or more (smaller ones are cheap to make), at most 8 per size and 1 GiB in
// all. Thread-safe.
class BufferPool {
public:
  // Shared by the local worlds of this process (a pipeline makes one per step).
  static BufferPool &global() {
    static BufferPool pool;
    return pool;
  }
  std::vector<std::byte> take(std::size_t bytes);
  void give(std::vector<std::byte> buffer);

private:
  std::mutex mutex_;
  std::multimap<std::size_t, std::vector<std::byte>> free_;
  std::size_t held_ = 0;
};

// A request that was over when it was made: a send (it copies the data), or a
// call that failed at once.
class CompletedRequest final : public Request {
public:
  explicit CompletedRequest(Status status) : status_(std::move(status)) {}
  bool ready() override { return true; }
  Status wait() override { return status_; }

private:
  Status status_;
};

// What happens to device threads still running `grace` after their world
// failed. A device stalled in a kernel or a sleep cannot be stopped, and it
// uses memory its caller owns, so by default the caller waits for it, as a
// library must. A command-line run instead sets `end`, which reports the
// failure (naming the stalled devices) and ends the process, as a failed MPI
// rank does: nothing outlives the run's timeout.
struct StuckDevicePolicy {
  std::chrono::milliseconds grace{0};
  std::function<void(const Status &failure)> end; // must not return
};
void set_stuck_device_policy(StuckDevicePolicy policy);

// Runs `body` for each of `devices` on its own thread and joins them. A thrown
// exception becomes the body's error rather than end the process without a
// word: std::bad_alloc is out of memory (a condition of the run), anything else
// internal. Errors go to `fail`, which ends the world and so wakes the devices
// waiting on this one.
void run_device_threads(const std::vector<int> &devices,
                        const std::function<Status(int device)> &body,
                        const std::function<void(int device, const Status &error)> &fail);

} // namespace strata::runtime::host_transport
