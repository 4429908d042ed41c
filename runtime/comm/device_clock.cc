#include "runtime/comm/device_clock.h"

#include <algorithm>
#include <ctime>
#include <numeric>

namespace strata::runtime {

double thread_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

void DeviceClock::start(double at) {
  time_ = at;
  mark_ = thread_cpu_seconds();
}

double DeviceClock::now() {
  const double cpu = thread_cpu_seconds();
  time_ += cpu - mark_;
  mark_ = cpu;
  return time_;
}

double DeviceClock::join(double ready) {
  const double cpu = thread_cpu_seconds();
  time_ = std::max(time_, ready) + (cpu - mark_);
  mark_ = cpu;
  return time_;
}

void ClockExchange::sent(int source, int destination, uint64_t tag, double time) {
  std::lock_guard lock(mutex_);
  const uint64_t n = sends_[{source, destination, tag}]++;
  messages_[{source, destination, tag, n}] = time;
}

uint64_t ClockExchange::posted(int source, int destination, uint64_t tag) {
  std::lock_guard lock(mutex_);
  return receives_[{source, destination, tag}]++;
}

double ClockExchange::ready(int source, int destination, uint64_t tag, uint64_t sequence) {
  std::lock_guard lock(mutex_);
  auto it = messages_.find({source, destination, tag, sequence});
  if (it == messages_.end()) return 0; // not announced: no constraint
  const double time = it->second;
  messages_.erase(it);
  return time;
}

void ClockExchange::drop(int source, int destination, uint64_t tag, uint64_t sequence) {
  std::lock_guard lock(mutex_);
  messages_.erase({source, destination, tag, sequence});
}

void ClockExchange::entered(const Group &group, uint64_t sequence, int rank, double time) {
  std::lock_guard lock(mutex_);
  collectives_[{group, sequence}].by_rank[rank] = time;
}

double ClockExchange::left(const Group &group, uint64_t sequence, int rank, int root, double work,
                           std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  auto it = collectives_.find({group, sequence});
  if (it == collectives_.end()) return 0;
  Entries &entries = it->second;
  entries.work[rank] = work;
  work_posted_.notify_all();
  double ready = 0, most = work;
  if (root >= 0) {
    for (const auto &[member, time] : entries.by_rank)
      if (member == root || member == rank) ready = std::max(ready, time);
  } else {
    work_posted_.wait_for(lock, timeout, [&] { return entries.work.size() == group.size(); });
    for (const auto &[member, time] : entries.by_rank)
      ready = std::max(ready, time);
    for (const auto &[member, spent] : entries.work)
      most = std::max(most, spent);
  }
  if (++entries.left == group.size()) collectives_.erase(it);
  return ready + most;
}

namespace {

class ClockedRequest final : public Request {
public:
  ClockedRequest(std::unique_ptr<Request> inner, DeviceClock &clock, ClockExchange &exchange,
                 int source, int destination, uint64_t tag, uint64_t sequence)
      : inner_(std::move(inner)), clock_(clock), exchange_(exchange), source_(source),
        destination_(destination), tag_(tag), sequence_(sequence) {}
  ~ClockedRequest() override {
    if (!waited_) exchange_.drop(source_, destination_, tag_, sequence_);
  }
  bool ready() override { return inner_->ready(); }
  Status wait() override {
    clock_.now(); // the work before the wait
    Status status = inner_->wait();
    waited_ = true;
    const double sent = exchange_.ready(source_, destination_, tag_, sequence_);
    if (status.is_ok()) clock_.join(sent);
    return status;
  }

private:
  std::unique_ptr<Request> inner_;
  DeviceClock &clock_;
  ClockExchange &exchange_;
  int source_, destination_;
  uint64_t tag_, sequence_;
  bool waited_ = false;
};

class ClockedCommunicator final : public Communicator {
public:
  ClockedCommunicator(Communicator &inner, DeviceClock &clock, ClockExchange &exchange)
      : inner_(inner), clock_(clock), exchange_(exchange) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::chrono::milliseconds timeout() const override { return inner_.timeout(); }
  void set_label(std::string label) override { inner_.set_label(std::move(label)); }
  void abort(Status reason) override { inner_.abort(std::move(reason)); }
  bool shares_memory(const Group &group) const override { return inner_.shares_memory(group); }
  std::byte *shared_segment(int device) const override { return inner_.shared_segment(device); }
  size_t shared_segment_bytes() const override { return inner_.shared_segment_bytes(); }
  uint64_t share_address(const void *data) const override { return inner_.share_address(data); }
  const void *shared_address(int member, uint64_t token) const override {
    return inner_.shared_address(member, token);
  }

protected:
  Status send_impl(const void *data, std::size_t bytes, int peer, uint64_t tag,
                   std::string_view what) override {
    exchange_.sent(rank(), peer, tag, clock_.now());
    return inner_.send(data, bytes, peer, tag, what);
  }
  Status recv_impl(void *data, std::size_t bytes, int peer, uint64_t tag,
                   std::string_view what) override {
    const uint64_t sequence = exchange_.posted(peer, rank(), tag);
    clock_.now(); // the work before the wait
    Status status = inner_.recv(data, bytes, peer, tag, what);
    const double sent = exchange_.ready(peer, rank(), tag, sequence);
    if (status.is_ok()) clock_.join(sent);
    return status;
  }
  std::unique_ptr<Request> isend_impl(const void *data, std::size_t bytes, int peer, uint64_t tag,
                                      std::string_view what) override {
    exchange_.sent(rank(), peer, tag, clock_.now());
    return inner_.isend(data, bytes, peer, tag, what);
  }
  std::unique_ptr<Request> irecv_impl(void *data, std::size_t bytes, int peer, uint64_t tag,
                                      std::string_view what) override {
    const uint64_t sequence = exchange_.posted(peer, rank(), tag);
    return std::make_unique<ClockedRequest>(inner_.irecv(data, bytes, peer, tag, what), clock_,
                                            exchange_, peer, rank(), tag, sequence);
  }
  Status all_reduce_impl(void *data, std::size_t count, ReduceType type, const Group &group,
                         std::string_view what) override {
    return collective(group, -1, [&] {
      return type == ReduceType::kF32
                 ? inner_.all_reduce(std::span(static_cast<float *>(data), count), group, what)
                 : inner_.all_reduce(std::span(static_cast<double *>(data), count), group, what);
    });
  }
  Status reduce_scatter_impl(const void *input, std::size_t input_count, void *output,
                             std::size_t output_count, ReduceType type, const Group &group,
                             std::string_view what) override {
    return collective(group, -1, [&] {
      return type == ReduceType::kF32
                 ? inner_.reduce_scatter(std::span(static_cast<const float *>(input), input_count),
                                         std::span(static_cast<float *>(output), output_count),
                                         group, what)
                 : inner_.reduce_scatter(std::span(static_cast<const double *>(input), input_count),
                                         std::span(static_cast<double *>(output), output_count),
                                         group, what);
    });
  }
  Status all_gather_impl(const void *input, std::size_t bytes, void *output, const Group &group,
                         std::string_view what) override {
    return collective(group, -1,
                      [&] { return inner_.all_gather(input, bytes, output, group, what); });
  }
  Status broadcast_impl(void *data, std::size_t bytes, int root, const Group &group,
                        std::string_view what) override {
    return collective(group, root,
                      [&] { return inner_.broadcast(data, bytes, root, group, what); });
  }
  Status barrier_impl(const Group &group, std::string_view what) override {
    return collective(group, -1, [&] { return inner_.barrier(group, what); });
  }

public:
  Status segment_barrier(const Group &group, std::string_view what) override {
    return collective(group, -1, [&] { return inner_.segment_barrier(group, what); });
  }
  Status exchange(const void *mine, size_t bytes, void *all, const Group &group,
                  std::string_view what) override {
    return collective(group, -1, [&] { return inner_.exchange(mine, bytes, all, group, what); });
  }

private:
  template <typename Call> Status collective(const Group &group, int root, Call call) {
    Group members = group;
    if (members.empty()) {
      members.resize(static_cast<size_t>(size()));
      std::iota(members.begin(), members.end(), 0);
    }
    const uint64_t sequence = sequences_[members]++;
    const double entered = clock_.now();
    exchange_.entered(members, sequence, rank(), entered);
    Status status = call();
    // A failed member's peers fail too: nobody waits for its work then.
    const double done = exchange_.left(members, sequence, rank(), root, clock_.now() - entered,
                                       status.is_ok() ? timeout() : std::chrono::milliseconds(0));
    if (status.is_ok()) clock_.join(done);
    return status;
  }

  Communicator &inner_;
  DeviceClock &clock_;
  ClockExchange &exchange_;
  std::map<Group, uint64_t> sequences_;
};

} // namespace

std::unique_ptr<Communicator> clocked_communicator(Communicator &inner, DeviceClock &clock,
                                                   ClockExchange &exchange) {
  return std::make_unique<ClockedCommunicator>(inner, clock, exchange);
}

} // namespace strata::runtime
