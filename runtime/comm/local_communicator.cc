#include "runtime/comm/local_communicator.h"
#include "runtime/comm/device_world.h"

#include <algorithm>
#include <cassert>
#include <compare>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <thread>
#include <utility>

namespace strata::runtime {
namespace {

using Clock = std::chrono::steady_clock;
using Bytes = std::vector<std::byte>;

// Message copies recycled by size across worlds (a pipeline makes a fresh
// world per step and sends the same sizes every step); fresh memory would cost
// a page fault per page. At most 8 buffers per size and 1 GiB in all.
class BufferPool {
public:
  static BufferPool &global() {
    static BufferPool pool;
    return pool;
  }
  Bytes take(std::size_t bytes) {
    {
      std::lock_guard lock(mutex_);
      auto it = free_.find(bytes);
      if (it != free_.end()) {
        Bytes buffer = std::move(it->second);
        free_.erase(it);
        held_ -= bytes;
        return buffer;
      }
    }
    return Bytes(bytes);
  }
  void give(Bytes buffer) {
    constexpr std::size_t kSmall = 4096, kMaxHeld = std::size_t{1} << 30;
    if (buffer.size() < kSmall) return;
    std::lock_guard lock(mutex_);
    if (held_ + buffer.size() > kMaxHeld || free_.count(buffer.size()) >= 8) return;
    held_ += buffer.size();
    free_.emplace(buffer.size(), std::move(buffer));
  }

private:
  std::mutex mutex_;
  std::multimap<std::size_t, Bytes> free_;
  std::size_t held_ = 0;
};

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

std::string format_duration(std::chrono::milliseconds duration) {
  if (duration.count() % 1000 == 0) return str_cat(duration.count() / 1000, " s");
  return str_cat(duration.count(), " ms");
}

// "device 2" or "devices {0, 2}".
std::string format_devices(const std::vector<int> &ranks) {
  if (ranks.size() == 1) return str_cat("device ", ranks[0]);
  std::string out = "devices {";
  for (std::size_t i = 0; i < ranks.size(); ++i)
    out += str_cat(i == 0 ? "" : ", ", ranks[i]);
  return out + "}";
}

std::string with_what(std::string operation, std::string_view what) {
  if (what.empty()) return operation;
  return str_cat(operation, " (", what, ")");
}

std::string p2p_operation(const char *verb, int peer, uint64_t tag, std::string_view what) {
  return with_what(str_cat(verb, " device ", peer, ", tag ", tag), what);
}

std::size_t element_size(ReduceType type) { return type == ReduceType::kF32 ? 4 : 8; }
const char *element_name(ReduceType type) { return type == ReduceType::kF32 ? "f32" : "f64"; }

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

enum class CollectiveKind { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kBarrier };

struct CollectiveSignature {
  CollectiveKind kind;
  std::size_t count = 0; // elements (reductions) or bytes (gather, broadcast) per member
  ReduceType type = ReduceType::kF32;
  int root = -1;
  bool operator==(const CollectiveSignature &) const = default;
};

std::string collective_operation(const CollectiveSignature &signature,
                                 const std::vector<int> &members, std::string_view what) {
  std::string operation;
  switch (signature.kind) {
  case CollectiveKind::kAllReduce:
    operation = str_cat("all_reduce of ", signature.count, " ", element_name(signature.type));
    break;
  case CollectiveKind::kReduceScatter:
    operation = str_cat("reduce_scatter of ", signature.count, " ", element_name(signature.type),
                        " per device");
    break;
  case CollectiveKind::kAllGather:
    operation = str_cat("all_gather of ", signature.count, " bytes per device");
    break;
  case CollectiveKind::kBroadcast:
    operation = str_cat("broadcast of ", signature.count, " bytes from device ", signature.root);
    break;
  case CollectiveKind::kBarrier: operation = "barrier"; break;
  }
  return with_what(str_cat(operation, " over ", format_devices(members)), what);
}

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

template <typename T> void accumulate(Bytes &sum, const Bytes &addend) {
  assert(sum.size() == addend.size());
  T *out = reinterpret_cast<T *>(sum.data());
  const T *in = reinterpret_cast<const T *>(addend.data());
  const std::size_t count = sum.size() / sizeof(T);
  for (std::size_t i = 0; i < count; ++i)
    out[i] += in[i];
}

// The result of a collective whose members have all arrived. Reductions add the
// inputs one member at a time in group (= increasing rank) order.
Bytes compute_result(Slot &slot, const std::vector<int> &members) {
  const CollectiveSignature &signature = slot.signature;
  switch (signature.kind) {
  case CollectiveKind::kAllReduce:
  case CollectiveKind::kReduceScatter: {
    Bytes sum = slot.inputs[0];
    for (std::size_t i = 1; i < slot.inputs.size(); ++i) {
      if (signature.type == ReduceType::kF32) {
        accumulate<float>(sum, slot.inputs[i]);
      } else {
        accumulate<double>(sum, slot.inputs[i]);
      }
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

class LocalWorldState {
public:
  LocalWorldState(int size, std::chrono::milliseconds timeout)
      : size_(size), timeout_(timeout),
        wakeups_(std::make_unique<std::condition_variable[]>(static_cast<std::size_t>(size))),
        labels_(static_cast<std::size_t>(size)), claimed_(static_cast<std::size_t>(size)) {}

  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  bool claim(int rank) {
    std::lock_guard lock(mutex_);
    if (claimed_[rank]) return false;
    claimed_[rank] = true;
    return true;
  }

  void set_label(int rank, std::string label) {
    std::lock_guard lock(mutex_);
    labels_[rank] = std::move(label);
  }

  Status failure() const {
    std::lock_guard lock(mutex_);
    return failure_;
  }

  void abort(int rank, const Status &reason) {
    std::lock_guard lock(mutex_);
    std::string message =
        str_cat(rank < 0 ? "run" : device_name_locked(rank),
                " aborted: ", reason.is_ok() ? "no reason given" : reason.message());
    StatusCode code = reason.is_ok() ? StatusCode::kInternal : reason.code();
    set_failure_locked(Status(code, message), message);
  }

  void fail(int rank, const Status &error) {
    std::lock_guard lock(mutex_);
    std::string device = device_name_locked(rank);
    set_failure_locked(Status(error.code(), str_cat(device, ": ", error.message())),
                       str_cat(device, " failed: ", error.message()));
  }

  bool valid_peer(int peer) const { return peer >= 0 && peer < size_; }

  // Fails the world from `rank` with an invalid argument in `operation`.
  Status reject(int rank, const std::string &operation, const std::string &problem) {
    std::lock_guard lock(mutex_);
    return fail_locked(rank, StatusCode::kInvalidArgument, operation, problem);
  }

  // Sends copy the data and never block.
  Status send(int rank, const void *data, std::size_t bytes, int peer, uint64_t tag,
              std::string_view what) {
    if (!valid_peer(peer)) {
      return reject(rank, p2p_operation("send to", peer, tag, what), no_such_device(peer));
    }
    Message message{message_copy(data, bytes), std::string(what)};
    std::lock_guard lock(mutex_);
    if (failed_) return cascaded_locked(rank, p2p_operation("send to", peer, tag, what));
    const ChannelKey key{rank, peer, tag};
    Channel &channel = channels_[key];
    const uint64_t number = channel.sent++;
    if (channel.abandoned.erase(number) == 0) channel.arrived.emplace(number, std::move(message));
    if (channel.idle()) channels_.erase(key);
    wakeups_[peer].notify_all();
    return Status::ok();
  }

  // Reserves the next message from `peer` on `tag` for a receive of `rank`.
  Result<uint64_t> post_recv(int rank, int peer, uint64_t tag, std::string_view what) {
    if (!valid_peer(peer)) {
      return reject(rank, p2p_operation("recv from", peer, tag, what), no_such_device(peer));
    }
    std::lock_guard lock(mutex_);
    if (failed_) return cascaded_locked(rank, p2p_operation("recv from", peer, tag, what));
    return channels_[ChannelKey{peer, rank, tag}].posted++;
  }

  bool recv_ready(int rank, int peer, uint64_t tag, uint64_t ticket) {
    std::lock_guard lock(mutex_);
    if (failed_) return true;
    auto channel = channels_.find(ChannelKey{peer, rank, tag});
    return channel != channels_.end() && channel->second.arrived.contains(ticket);
  }

  // Drops a posted receive that will never be waited on.
  void abandon_recv(int rank, int peer, uint64_t tag, uint64_t ticket) {
    std::lock_guard lock(mutex_);
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
      std::unique_lock lock(mutex_);
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
        wakeups_[rank].wait_until(lock, deadline);
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
    std::lock_guard lock(mutex_);
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
    std::unique_lock lock(mutex_);
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
        wakeups_[member].notify_all();
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
      wakeups_[rank].wait_until(lock, deadline);
    }
    if (++slot->departed == group_size) slots_.erase(key);
    return std::shared_ptr<const Slot>(std::move(slot));
  }

private:
  static std::string no_such_device(int peer) { return str_cat("there is no device ", peer); }

  std::string device_name_locked(int rank) const {
    if (labels_[rank].empty()) return str_cat("device ", rank);
    return str_cat("device ", rank, " (", labels_[rank], ")");
  }

  // Records the world's first failure and wakes every rank.
  void set_failure_locked(Status root, const std::string &cascade_message) {
    if (failed_) return;
    failed_ = true;
    cascade_ = Status(root.code(), cascade_message);
    failure_ = std::move(root);
    for (int rank = 0; rank < size_; ++rank)
      wakeups_[rank].notify_all();
  }

  // `rank` failed in `operation`: ends the world and returns the rank's error.
  Status fail_locked(int rank, StatusCode code, const std::string &operation,
                     const std::string &problem) {
    const std::string device = device_name_locked(rank);
    Status error(code, str_cat(device, ": ", operation, ": ", problem));
    set_failure_locked(error, str_cat(device, " failed: ", operation, ": ", problem));
    return error;
  }

  // The error of a call of `rank` that the world's failure ended.
  Status cascaded_locked(int rank, const std::string &operation) const {
    return Status(cascade_.code(),
                  str_cat(device_name_locked(rank), ": ", operation, ": ", cascade_.message()));
  }

  const int size_;
  const std::chrono::milliseconds timeout_;

  mutable std::mutex mutex_;
  // Guarded by mutex_:
  std::unique_ptr<std::condition_variable[]> wakeups_; // one per rank: what it waits for changed
  std::vector<std::string> labels_;
  std::vector<bool> claimed_;
  std::map<ChannelKey, Channel> channels_;
  std::map<SlotKey, std::shared_ptr<Slot>> slots_;
  bool failed_ = false;
  Status failure_; // the first failure, as its rank reported it
  Status cascade_; // what the first failure means to every other call
};

namespace {

class CompletedRequest final : public Request {
public:
  explicit CompletedRequest(Status status) : status_(std::move(status)) {}
  bool ready() override { return true; }
  Status wait() override { return status_; }

private:
  Status status_;
};

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
      : state_(std::move(state)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return state_->size(); }
  std::chrono::milliseconds timeout() const override { return state_->timeout(); }
  void set_label(std::string label) override { state_->set_label(rank_, std::move(label)); }
  void abort(Status reason) override { state_->abort(rank_, reason); }

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
    const CollectiveSignature signature{CollectiveKind::kAllReduce, count, type, -1};
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
    const CollectiveSignature signature{CollectiveKind::kReduceScatter, output_count, type, -1};
    const std::size_t chunk = output_count * element_size(type);
    std::size_t position = 0;
    Result<std::shared_ptr<const Slot>> slot = run_collective(
        signature, group, what, [&] { return copy_bytes(input, input_count * element_size(type)); },
        &position,
        [&](std::size_t group_size) -> std::string {
          if (input_count == output_count * group_size) return {};
          return str_cat("the input has ", input_count, " elements, not ", group_size, " x ",
                         output_count);
        });
    if (!slot.is_ok()) return slot.status();
    const std::byte *source =
        *slot ? (*slot)->result.data() + position * chunk : static_cast<const std::byte *>(input);
    if (chunk > 0) std::memmove(output, source, chunk);
    return Status::ok();
  }

  Status all_gather_impl(const void *input, std::size_t bytes, void *output, const Group &group,
                         std::string_view what) override {
    const CollectiveSignature signature{CollectiveKind::kAllGather, bytes, ReduceType::kF32, -1};
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
    const CollectiveSignature signature{CollectiveKind::kBroadcast, bytes, ReduceType::kF32, root};
    Result<std::shared_ptr<const Slot>> slot = run_collective(
        signature, group, what, [&] { return rank_ == root ? copy_bytes(data, bytes) : Bytes(); },
        nullptr,
        [&](std::size_t) -> std::string {
          if (std::binary_search(members_.begin(), members_.end(), root)) return {};
          return str_cat("the root, device ", root, ", is not in the group");
        });
    if (!slot.is_ok()) return slot.status();
    if (*slot && rank_ != root && bytes > 0) std::memcpy(data, (*slot)->result.data(), bytes);
    return Status::ok();
  }

  Status barrier_impl(const Group &group, std::string_view what) override {
    const CollectiveSignature signature{CollectiveKind::kBarrier, 0, ReduceType::kF32, -1};
    return run_collective(signature, group, what, [] { return Bytes(); }).status();
  }

private:
  // Resolves `group` into members_ and this rank's position in it, or explains
  // what is wrong with it.
  std::string resolve_group(const Group &group, std::size_t *position) {
    members_.clear();
    if (group.empty()) {
      for (int rank = 0; rank < state_->size(); ++rank)
        members_.push_back(rank);
    } else {
      members_ = group;
    }
    bool has_self = false;
    for (std::size_t i = 0; i < members_.size(); ++i) {
      const bool in_range = state_->valid_peer(members_[i]);
      const bool increasing = i == 0 || members_[i - 1] < members_[i];
      if (!in_range || !increasing) {
        return str_cat("a group lists distinct devices in increasing order, each in [0, ",
                       state_->size(), ")");
      }
      if (members_[i] == rank_) {
        has_self = true;
        *position = i;
      }
    }
    if (!has_self) return str_cat("the group does not include device ", rank_);
    return {};
  }

  // Runs one collective: checks the group and the call, then meets the other
  // members. Returns a null slot for a group of one (nothing to exchange).
  template <typename MakeInput, typename CheckCall = std::string (*)(std::size_t)>
  Result<std::shared_ptr<const Slot>> run_collective(
      const CollectiveSignature &signature, const Group &group, std::string_view what,
      MakeInput make_input, std::size_t *position_out = nullptr,
      CheckCall check_call = [](std::size_t) { return std::string(); }) {
    std::size_t position = 0;
    std::string problem = resolve_group(group, &position);
    if (problem.empty()) problem = check_call(members_.size());
    if (!problem.empty()) {
      return state_->reject(rank_, collective_operation(signature, members_, what), problem);
    }
    if (position_out != nullptr) *position_out = position;
    if (members_.size() == 1) {
      RETURN_IF_ERROR(state_->check_alive(rank_, collective_operation(signature, members_, what)));
      return std::shared_ptr<const Slot>();
    }
    const uint64_t sequence = sequences_[members_]++;
    return state_->rendezvous(rank_, members_, position, sequence, signature, make_input(), what);
  }

  std::shared_ptr<LocalWorldState> state_;
  int rank_;
  std::vector<int> members_;                       // the current collective's group
  std::map<std::vector<int>, uint64_t> sequences_; // collectives issued per group
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
void LocalWorld::fail(int rank, const Status &error) { state_->fail(rank, error); }
Status LocalWorld::failure() const { return state_->failure(); }

Status run_on_threads(int size, const std::function<Status(int rank, Communicator &)> &body,
                      std::chrono::milliseconds timeout) {
  ASSIGN_OR_RETURN(std::shared_ptr<LocalWorld> world, LocalWorld::create(size, timeout));
  std::vector<std::unique_ptr<Communicator>> communicators;
  for (int rank = 0; rank < size; ++rank)
    communicators.push_back(world->communicator(rank));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(size));
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      Status status;
      try {
        status = body(rank, *communicators[rank]);
      } catch (const std::bad_alloc &error) {
        // A buffer beyond what the host can give is a condition of the run,
        // not a bug in strata.
        status = resource_exhausted(
            "out of memory: this host cannot allocate what the device needs (", error.what(), ")");
      } catch (const std::exception &error) {
        status = internal_error("threw an exception: ", error.what());
      } catch (...) {
        status = internal_error("threw an exception");
      }
      // A communicator error has already ended the world; this records errors of
      // the body itself and wakes the ranks that wait on this one.
      if (!status.is_ok()) world->fail(rank, status);
    });
  }
  for (std::thread &thread : threads)
    thread.join();
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
