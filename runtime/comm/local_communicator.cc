#include "runtime/comm/local_communicator.h"
#include "runtime/comm/device_world.h"
#include "runtime/comm/host_transport.h"

#include <atomic>
#include <cassert>
#include <compare>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

namespace strata::runtime {

using namespace host_transport; // what the host transports share

namespace {

using Clock = std::chrono::steady_clock;
using Bytes = std::vector<std::byte>;

// A send's copy of the data, in a recycled buffer.
Bytes message_copy(const void *data, std::size_t bytes) {
  Bytes out = BufferPool::global().take(bytes);
  if (bytes > 0) std::memcpy(out.data(), data, bytes);
  return out;
}

Bytes copy_bytes(const void *data, std::size_t bytes) {
  Bytes out(bytes);
  if (bytes > 0) std::memcpy(out.data(), data, bytes);
  return out;
}

// ---------------------------------------------------------------------------
// Point to point: one channel per (source, destination, tag). Sends and posted
// receives are numbered in order; the k-th posted receive takes the k-th message.

struct ChannelKey {
  int source;
  int destination;
  uint64_t tag;
  auto operator<=>(const ChannelKey &) const = default;
};

struct Message {
  Bytes data;
  std::string sender_what;
};

struct Channel {
  uint64_t sent = 0;   // messages sent so far
  uint64_t posted = 0; // receives posted so far
  std::map<uint64_t, Message> arrived;
  std::set<uint64_t> abandoned; // receives dropped before their message arrived
  // An idle channel carries no information: dropping it and starting again from
  // zero on both sides is the same.
  bool idle() const { return sent == posted && arrived.empty() && abandoned.empty(); }
};

// ---------------------------------------------------------------------------
// Collectives: one rendezvous slot per (group, sequence number on that group).

struct Slot {
  CollectiveSignature signature;
  int first_rank = -1;
  std::string first_what;
  std::vector<Bytes> inputs; // by group position; immutable once the member arrived
  std::vector<bool> arrived;
  std::size_t arrived_count = 0;
  bool ready = false;
  Bytes result; // immutable once ready
  std::size_t departed = 0;
};

using SlotKey = std::pair<std::vector<int>, uint64_t>;

// The result of a collective whose members have all arrived. Reductions add the
// inputs one member at a time in group (= increasing rank) order.
Bytes compute_result(Slot &slot, const std::vector<int> &members) {
  const CollectiveSignature &signature = slot.signature;
  switch (signature.kind) {
  case CollectiveKind::kAllReduce:
  case CollectiveKind::kReduceScatter: {
    Bytes sum = slot.inputs[0];
    const std::size_t count = sum.size() / element_size(signature.type);
    for (std::size_t i = 1; i < slot.inputs.size(); ++i) {
      assert(slot.inputs[i].size() == sum.size());
      add_elements(signature.type, sum.data(), slot.inputs[i].data(), count);
    }
    return sum;
  }
  case CollectiveKind::kAllGather: {
    Bytes gathered;
    gathered.reserve(signature.count * slot.inputs.size());
    for (const Bytes &input : slot.inputs)
      gathered.insert(gathered.end(), input.begin(), input.end());
    return gathered;
  }
  case CollectiveKind::kBroadcast:
    for (std::size_t i = 0; i < members.size(); ++i) {
      if (members[i] == signature.root) return std::move(slot.inputs[i]);
    }
    return {};
  case CollectiveKind::kBarrier: return {};
  }
  return {};
}

} // namespace

// ---------------------------------------------------------------------------

class LocalWorldState final : public WorldState {
public:
  LocalWorldState(int size, std::chrono::milliseconds timeout)
      : WorldState(size), size_(size), timeout_(timeout),
        wakeups_(std::make_unique<std::condition_variable[]>(static_cast<std::size_t>(size))),
        signals_(std::make_unique<std::atomic<uint64_t>[]>(static_cast<std::size_t>(size))),
        claimed_(static_cast<std::size_t>(size)) {}

  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  bool claim(int rank) {
    auto lock = lock_spinning(mutex_);
    if (claimed_[rank]) return false;
    claimed_[rank] = true;
    return true;
  }

  void abort(int rank, const Status &reason) {
    auto lock = lock_spinning(mutex_);
    std::string message =
        str_cat(rank < 0 ? "run" : name_locked(rank),
                " aborted: ", reason.is_ok() ? "no reason given" : reason.message());
    StatusCode code = reason.is_ok() ? StatusCode::kInternal : reason.code();
    set_failure_locked(Status(code, message), message);
  }

  // Sends copy the data and never block.
  Status send(int rank, const void *data, std::size_t bytes, int peer, uint64_t tag,
              std::string_view what) {
    RETURN_IF_ERROR(check_peer(rank, "send to", peer, tag, what));
    Message message{message_copy(data, bytes), std::string(what)};
    auto lock = lock_spinning(mutex_);
    if (failed_) return cascaded_locked(rank, p2p_operation("send to", peer, tag, what));
    const ChannelKey key{rank, peer, tag};
    Channel &channel = channels_[key];
    const uint64_t number = channel.sent++;
    if (channel.abandoned.erase(number) == 0) channel.arrived.emplace(number, std::move(message));
    if (channel.idle()) channels_.erase(key);
    wake_locked(peer);
    return Status::ok();
  }

  // Reserves the next message from `peer` on `tag` for a receive of `rank`.
  Result<uint64_t> post_recv(int rank, int peer, uint64_t tag, std::string_view what) {
    RETURN_IF_ERROR(check_peer(rank, "recv from", peer, tag, what));
    auto lock = lock_spinning(mutex_);
    if (failed_) return cascaded_locked(rank, p2p_operation("recv from", peer, tag, what));
    return channels_[ChannelKey{peer, rank, tag}].posted++;
  }

  bool recv_ready(int rank, int peer, uint64_t tag, uint64_t ticket) {
    auto lock = lock_spinning(mutex_);
    if (failed_) return true;
    auto channel = channels_.find(ChannelKey{peer, rank, tag});
    return channel != channels_.end() && channel->second.arrived.contains(ticket);
  }

  // Drops a posted receive that will never be waited on.
  void abandon_recv(int rank, int peer, uint64_t tag, uint64_t ticket) {
    auto lock = lock_spinning(mutex_);
    const ChannelKey key{peer, rank, tag};
    auto channel = channels_.find(key);
    if (channel == channels_.end()) return;
    if (channel->second.arrived.erase(ticket) == 0) channel->second.abandoned.insert(ticket);
    if (channel->second.idle()) channels_.erase(channel);
  }

  Status await_recv(int rank, void *data, std::size_t bytes, int peer, uint64_t tag,
                    uint64_t ticket, std::string_view what) {
    const auto deadline = Clock::now() + timeout_;
    const ChannelKey key{peer, rank, tag};
    Message message;
    {
      auto lock = lock_spinning(mutex_);
      for (;;) {
        if (failed_) return cascaded_locked(rank, p2p_operation("recv from", peer, tag, what));
        auto channel = channels_.find(key);
        assert(channel != channels_.end() && "a posted receive keeps its channel");
        auto arrived = channel->second.arrived.find(ticket);
        if (arrived != channel->second.arrived.end()) {
          message = std::move(arrived->second);
          channel->second.arrived.erase(arrived);
          if (channel->second.idle()) channels_.erase(channel);
          break;
        }
        if (Clock::now() >= deadline) {
          return fail_locked(rank, StatusCode::kDeadlineExceeded,
                             p2p_operation("recv from", peer, tag, what),
                             str_cat("timed out after ", format_duration(timeout_)));
        }
        wait_locked(lock, rank, deadline);
      }
      if (message.data.size() != bytes) {
        return fail_locked(
            rank, StatusCode::kInvalidArgument, p2p_operation("recv from", peer, tag, what),
            str_cat("size mismatch: device ", peer, " sent ", message.data.size(), " bytes",
                    message.sender_what.empty() ? std::string()
                                                : str_cat(" (", message.sender_what, ")"),
                    ", device ", rank, " expects ", bytes, " bytes"));
      }
    }
    if (bytes > 0) std::memcpy(data, message.data.data(), bytes);
    BufferPool::global().give(std::move(message.data));
    return Status::ok();
  }

  // Checks that a failure has not ended the world (single-member collectives).
  Status check_alive(int rank, const std::string &operation) {
    auto lock = lock_spinning(mutex_);
    if (failed_) return cascaded_locked(rank, operation);
    return Status::ok();
  }

  // Deposits `input` for the `sequence`-th collective of `members` and waits
  // until every member has arrived and the result is computed.
  Result<std::shared_ptr<const Slot>> rendezvous(int rank, const std::vector<int> &members,
                                                 std::size_t position, uint64_t sequence,
                                                 const CollectiveSignature &signature, Bytes input,
                                                 std::string_view what) {
    const auto deadline = Clock::now() + timeout_;
    const std::size_t group_size = members.size();
    auto lock = lock_spinning(mutex_);
    if (failed_) return cascaded_locked(rank, collective_operation(signature, members, what));
    SlotKey key{members, sequence};
    std::shared_ptr<Slot> &entry = slots_[key];
    if (!entry) {
      entry = std::make_shared<Slot>();
      entry->signature = signature;
      entry->first_rank = rank;
      entry->first_what = std::string(what);
      entry->inputs.resize(group_size);
      entry->arrived.assign(group_size, false);
    } else if (!(entry->signature == signature)) {
      return fail_locked(
          rank, StatusCode::kInvalidArgument, collective_operation(signature, members, what),
          str_cat("does not match device ", entry->first_rank, "'s ",
                  collective_operation(entry->signature, members, entry->first_what)));
    }
    std::shared_ptr<Slot> slot = entry;
    slot->inputs[position] = std::move(input);
    slot->arrived[position] = true;
    if (++slot->arrived_count == group_size) {
      // The inputs no longer change: reduce without holding the lock.
      lock.unlock();
      Bytes result = compute_result(*slot, members);
      lock.lock();
      slot->result = std::move(result);
      slot->inputs.clear();
      slot->ready = true;
      for (int member : members)
        wake_locked(member);
    }
    for (;;) {
      if (failed_) return cascaded_locked(rank, collective_operation(signature, members, what));
      if (slot->ready) break;
      if (Clock::now() >= deadline) {
        std::vector<int> missing;
        for (std::size_t i = 0; i < group_size; ++i) {
          if (!slot->arrived[i]) missing.push_back(members[i]);
        }
        return fail_locked(rank, StatusCode::kDeadlineExceeded,
                           collective_operation(signature, members, what),
                           str_cat("timed out after ", format_duration(timeout_),
                                   missing.empty() ? std::string(" waiting for the result")
                                                   : " waiting for " + format_devices(missing)));
      }
      wait_locked(lock, rank, deadline);
    }
    if (++slot->departed == group_size) slots_.erase(key);
    return std::shared_ptr<const Slot>(std::move(slot));
  }

private:
  void on_failure_locked(bool) override {
    for (int rank = 0; rank < size_; ++rank)
      wake_locked(rank);
  }

  // Tells `rank` that what it waits for may have changed.
  void wake_locked(int rank) {
    signals_[rank].fetch_add(1, std::memory_order_release);
    wakeups_[rank].notify_all();
  }

  // Waits, with the lock held on entry and on return, until `rank` is woken
  // or the deadline passes. A wake-up from sleep costs tens of microseconds,
  // several times a shared-memory meeting, so the waiter first watches its
  // signal without the lock for a short while (yielding, in case the threads
  // outnumber the cores), then sleeps.
  void wait_locked(std::unique_lock<std::mutex> &lock, int rank, Clock::time_point deadline) {
    constexpr auto kSpin = std::chrono::microseconds(50);
    const uint64_t seen = signals_[rank].load(std::memory_order_acquire);
    lock.unlock();
    const auto until = std::min(deadline, Clock::now() + kSpin);
    for (int round = 0; signals_[rank].load(std::memory_order_acquire) == seen; ++round) {
      if ((round & 63) == 63) {
        if (Clock::now() >= until) break;
        std::this_thread::yield();
      }
    }
    lock = lock_spinning(*lock.release());
    // Signals change under the lock, so none is missed between here and the sleep.
    if (signals_[rank].load(std::memory_order_relaxed) == seen)
      wakeups_[rank].wait_until(lock, deadline);
  }

  const int size_;
  const std::chrono::milliseconds timeout_;
  // Guarded by mutex_:
  std::unique_ptr<std::condition_variable[]> wakeups_; // one per rank: what it waits for changed
  std::unique_ptr<std::atomic<uint64_t>[]> signals_;   // one per rank: wakes so far (read unlocked)
  std::vector<bool> claimed_;
  std::map<ChannelKey, Channel> channels_;
  std::map<SlotKey, std::shared_ptr<Slot>> slots_;
};

namespace {

class LocalRecvRequest final : public Request {
public:
  LocalRecvRequest(std::shared_ptr<LocalWorldState> state, int rank, void *data, std::size_t bytes,
                   int peer, uint64_t tag, uint64_t ticket, std::string_view what)
      : state_(std::move(state)), rank_(rank), data_(data), bytes_(bytes), peer_(peer), tag_(tag),
        ticket_(ticket), what_(what) {}

  ~LocalRecvRequest() override {
    if (!waited_) state_->abandon_recv(rank_, peer_, tag_, ticket_);
  }

  bool ready() override { return waited_ || state_->recv_ready(rank_, peer_, tag_, ticket_); }

  Status wait() override {
    if (!waited_) {
      waited_ = true;
      status_ = state_->await_recv(rank_, data_, bytes_, peer_, tag_, ticket_, what_);
    }
    return status_;
  }

private:
  std::shared_ptr<LocalWorldState> state_;
  int rank_;
  void *data_;
  std::size_t bytes_;
  int peer_;
  uint64_t tag_;
  uint64_t ticket_;
  std::string what_;
  bool waited_ = false;
  Status status_;
};

class LocalCommunicator final : public Communicator {
public:
  LocalCommunicator(std::shared_ptr<LocalWorldState> state, int rank)
      : state_(std::move(state)), rank_(rank), calls_(rank, state_->size()) {}

  int rank() const override { return rank_; }
  int size() const override { return state_->size(); }
  std::chrono::milliseconds timeout() const override { return state_->timeout(); }
  void set_label(std::string label) override { state_->set_label(rank_, std::move(label)); }
  void abort(Status reason) override { state_->abort(rank_, reason); }
  bool shares_memory(const Group &) const override { return true; }

protected:
  Status send_impl(const void *data, std::size_t bytes, int peer, uint64_t tag,
                   std::string_view what) override {
    return state_->send(rank_, data, bytes, peer, tag, what);
  }

  Status recv_impl(void *data, std::size_t bytes, int peer, uint64_t tag,
                   std::string_view what) override {
    Result<uint64_t> ticket = state_->post_recv(rank_, peer, tag, what);
    if (!ticket.is_ok()) return ticket.status();
    return state_->await_recv(rank_, data, bytes, peer, tag, *ticket, what);
  }

  std::unique_ptr<Request> isend_impl(const void *data, std::size_t bytes, int peer, uint64_t tag,
                                      std::string_view what) override {
    return std::make_unique<CompletedRequest>(send_impl(data, bytes, peer, tag, what));
  }

  std::unique_ptr<Request> irecv_impl(void *data, std::size_t bytes, int peer, uint64_t tag,
                                      std::string_view what) override {
    Result<uint64_t> ticket = state_->post_recv(rank_, peer, tag, what);
    if (!ticket.is_ok()) return std::make_unique<CompletedRequest>(ticket.status());
    return std::make_unique<LocalRecvRequest>(state_, rank_, data, bytes, peer, tag, *ticket, what);
  }

  Status all_reduce_impl(void *data, std::size_t count, ReduceType type, const Group &group,
                         std::string_view what) override {
    const CollectiveSignature signature{CollectiveKind::kAllReduce, count, type, -1, 0};
    const std::size_t bytes = count * element_size(type);
    Result<std::shared_ptr<const Slot>> slot =
        run_collective(signature, group, what, [&] { return copy_bytes(data, bytes); });
    if (!slot.is_ok()) return slot.status();
    if (*slot && bytes > 0) std::memcpy(data, (*slot)->result.data(), bytes);
    return Status::ok();
  }

  Status reduce_scatter_impl(const void *input, std::size_t input_count, void *output,
                             std::size_t output_count, ReduceType type, const Group &group,
                             std::string_view what) override {
    const CollectiveSignature signature{CollectiveKind::kReduceScatter, output_count, type, -1,
                                        input_count};
    const std::size_t chunk = output_count * element_size(type);
    Result<std::shared_ptr<const Slot>> slot = run_collective(signature, group, what, [&] {
      return copy_bytes(input, input_count * element_size(type));
    });
    if (!slot.is_ok()) return slot.status();
    const std::byte *source = *slot ? (*slot)->result.data() + calls_.position() * chunk
                                    : static_cast<const std::byte *>(input);
    if (chunk > 0) std::memmove(output, source, chunk);
    return Status::ok();
  }

  Status all_gather_impl(const void *input, std::size_t bytes, void *output, const Group &group,
                         std::string_view what) override {
    const CollectiveSignature signature{CollectiveKind::kAllGather, bytes, ReduceType::kF32, -1, 0};
    Result<std::shared_ptr<const Slot>> slot =
        run_collective(signature, group, what, [&] { return copy_bytes(input, bytes); });
    if (!slot.is_ok()) return slot.status();
    if (!*slot) {
      if (bytes > 0) std::memmove(output, input, bytes);
    } else if (!(*slot)->result.empty()) {
      std::memcpy(output, (*slot)->result.data(), (*slot)->result.size());
    }
    return Status::ok();
  }

  Status broadcast_impl(void *data, std::size_t bytes, int root, const Group &group,
                        std::string_view what) override {
    const CollectiveSignature signature{CollectiveKind::kBroadcast, bytes, ReduceType::kF32, root,
                                        0};
    Result<std::shared_ptr<const Slot>> slot = run_collective(
        signature, group, what, [&] { return rank_ == root ? copy_bytes(data, bytes) : Bytes(); });
    if (!slot.is_ok()) return slot.status();
    if (*slot && rank_ != root && bytes > 0) std::memcpy(data, (*slot)->result.data(), bytes);
    return Status::ok();
  }

  Status barrier_impl(const Group &group, std::string_view what) override {
    const CollectiveSignature signature{CollectiveKind::kBarrier, 0, ReduceType::kF32, -1, 0};
    return run_collective(signature, group, what, [] { return Bytes(); }).status();
  }

private:
  // Runs one collective: checks the group and the call, then meets the other
  // members. Returns a null slot for a group of one (nothing to exchange).
  template <typename MakeInput>
  Result<std::shared_ptr<const Slot>> run_collective(const CollectiveSignature &signature,
                                                     const Group &group, std::string_view what,
                                                     MakeInput make_input) {
    RETURN_IF_ERROR(state_->check_collective(rank_, calls_, signature, group, what));
    const std::vector<int> &members = calls_.members();
    if (members.size() == 1) {
      RETURN_IF_ERROR(state_->check_alive(rank_, collective_operation(signature, members, what)));
      return std::shared_ptr<const Slot>();
    }
    const uint64_t sequence = calls_.next_sequence();
    return state_->rendezvous(rank_, members, calls_.position(), sequence, signature, make_input(),
                              what);
  }

  std::shared_ptr<LocalWorldState> state_;
  int rank_;
  CollectiveCalls calls_;
};

} // namespace

// ---------------------------------------------------------------------------

LocalWorld::LocalWorld(std::shared_ptr<LocalWorldState> state) : state_(std::move(state)) {}
LocalWorld::~LocalWorld() = default;

Result<std::shared_ptr<LocalWorld>> LocalWorld::create(int size,
                                                       std::chrono::milliseconds timeout) {
  if (size < 1) return invalid_argument("a local world needs at least one device, not ", size);
  if (timeout.count() <= 0) {
    return invalid_argument("the communicator timeout must be positive, not ", timeout.count(),
                            " ms");
  }
  return std::shared_ptr<LocalWorld>(
      new LocalWorld(std::make_shared<LocalWorldState>(size, timeout)));
}

int LocalWorld::size() const { return state_->size(); }
std::chrono::milliseconds LocalWorld::timeout() const { return state_->timeout(); }

std::unique_ptr<Communicator> LocalWorld::communicator(int rank) {
  assert(rank >= 0 && rank < state_->size());
  [[maybe_unused]] const bool first = state_->claim(rank);
  assert(first && "one communicator per rank");
  return std::make_unique<LocalCommunicator>(state_, rank);
}

void LocalWorld::abort(Status reason) { state_->abort(-1, reason); }
void LocalWorld::fail(int rank, const Status &error) { state_->fail_device(rank, error); }
Status LocalWorld::failure() const { return state_->failure(); }

Status run_on_threads(int size, const std::function<Status(int rank, Communicator &)> &body,
                      std::chrono::milliseconds timeout) {
  ASSIGN_OR_RETURN(std::shared_ptr<LocalWorld> world, LocalWorld::create(size, timeout));
  std::vector<int> ranks;
  std::vector<std::unique_ptr<Communicator>> communicators;
  for (int rank = 0; rank < size; ++rank) {
    ranks.push_back(rank);
    communicators.push_back(world->communicator(rank));
  }
  run_device_threads(
      ranks, [&](int rank) { return body(rank, *communicators[rank]); },
      [&](int rank, const Status &error) { world->fail(rank, error); });
  return world->failure();
}

Status LocalDeviceWorld::run(const std::function<Status(int device, Communicator &)> &body) {
  return run_on_threads(devices_, body, timeout_);
}

Status LocalDeviceWorld::run_with_side(
    const std::function<Status(int device, Communicator &, Communicator *)> &body) {
  ASSIGN_OR_RETURN(std::shared_ptr<LocalWorld> side, LocalWorld::create(devices_, timeout_));
  std::vector<std::unique_ptr<Communicator>> sides;
  for (int rank = 0; rank < devices_; ++rank)
    sides.push_back(side->communicator(rank));
  return run_on_threads(
      devices_,
      [&](int rank, Communicator &comm) {
        return body(rank, comm, sides[static_cast<size_t>(rank)].get());
      },
      timeout_);
}

} // namespace strata::runtime
