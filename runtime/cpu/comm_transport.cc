#include "runtime/cpu/comm_transport.h"

#include <algorithm>
#include <cstring>

#include "runtime/comm/collectives.h"

namespace strata::runtime {

namespace {

// Every member's shared segment in group order, or none unless each member
// has one of `need` bytes or more (MPI ranks on one host).
std::vector<std::byte *> member_segments(const Communicator &comm, const Group &group,
                                         size_t need) {
  std::vector<std::byte *> segments;
  if (comm.shared_segment_bytes() < need) return segments;
  for (int member : group) {
    std::byte *segment = comm.shared_segment(member);
    if (segment == nullptr) return {};
    segments.push_back(segment);
  }
  return segments;
}

double seconds_since(std::chrono::steady_clock::time_point epoch) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch).count();
}

} // namespace

CommStream::CommStream(Communicator &side, Communicator &main, size_t tasks,
                       std::chrono::steady_clock::time_point epoch, DeviceClock *clock,
                       double clock_start)
    : side_(side), main_(main), done_(tasks, 0), done_at_(tasks, 0.0), epoch_(epoch), clock_(clock),
      clock_start_(clock_start), thread_([this] { loop(); }) {}

void CommStream::start(std::function<Status(Communicator &)> work, uint32_t index,
                       uint32_t instruction, double ready) {
  std::lock_guard lock(mutex_);
  queue_.push_back([work = std::move(work), this, index, instruction, ready] {
    const double begin = clock_ ? clock_->join(ready) : seconds_since(epoch_);
    Status status = work(side_);
    const double end = clock_ ? clock_->now() : seconds_since(epoch_);
    std::lock_guard done_lock(mutex_);
    if (!status.is_ok() && error_.is_ok()) error_ = status;
    done_[index] = 1;
    done_at_[index] = end;
    spans_.push_back({instruction, begin, end});
  });
  wake_.notify_all();
}

double CommStream::done_at(uint32_t index) {
  std::lock_guard lock(mutex_);
  return done_at_[index];
}

Status CommStream::wait(uint32_t index, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!wake_.wait_for(lock, timeout, [&] { return done_[index] != 0 || !error_.is_ok(); }))
    return deadline_exceeded("the communication stream's task ", index,
                             " (a gradient bucket or a parameter gather) was not done within ",
                             timeout.count(), " ms");
  return error_;
}

void CommStream::stop(const Status &why) {
  if (!thread_.joinable()) return;
  if (!why.is_ok()) side_.abort(why);
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    wake_.notify_all();
  }
  thread_.join();
}

void CommStream::loop() {
  if (clock_) clock_->start(clock_start_);
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;
    auto task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    task();
    lock.lock();
    if (!error_.is_ok() && !aborted_) {
      aborted_ = true;
      const Status error = error_;
      lock.unlock();
      main_.abort(error);
      lock.lock();
    }
    wake_.notify_all();
  }
}

CommTransport::CommTransport(const core::PipelinePlan &plan, Communicator &comm, CommStream *stream,
                             DeviceClock *clock, std::chrono::milliseconds backstop,
                             std::vector<float> &staging)
    : plan_(plan), comm_(comm), stream_(stream), clock_(clock), backstop_(backstop),
      staging_(staging) {}

Status CommTransport::send(const core::Part &, const core::Op &op) {
  return comm_.send(op.data, op.bytes, op.peer, op.tag, op.what);
}

Status CommTransport::recv(const core::Part &, const core::Op &op) {
  return comm_.recv(op.data, op.bytes, op.peer, op.tag, op.what);
}

Status CommTransport::all_reduce(llvm::ArrayRef<core::Member> members, size_t count,
                                 const core::Collective &call) {
  const core::Member &me = members[0];
  auto *out = static_cast<float *>(me.out);
  if (count > 0 && me.in != me.out) std::memcpy(out, me.in, count * sizeof(float));
  const std::span<float> data(out, count);
  const Group &group = plan_.group(call.group);
  if (comm_.shares_memory(group))
    return shared_all_reduce(comm_, std::span(&data, 1), group, call.algo, call.what);
  return call.algo ? algo_all_reduce(comm_, data, group, *call.algo, call.tag, call.what)
                   : comm_.all_reduce(data, group, call.what);
}

Status CommTransport::reduce_scatter(llvm::ArrayRef<core::Member> members, size_t count,
                                     const core::Collective &call, const plan::PieceLayout *) {
  const core::Member &me = members[0];
  const Group &group = plan_.group(call.group);
  if (comm_.shares_memory(group)) { // read in place, `out` written
    const std::span<float> whole(const_cast<float *>(static_cast<const float *>(me.in)), count);
    float *const out = static_cast<float *>(me.out);
    return shared_reduce_scatter(comm_, std::span(&whole, 1), std::span(&out, 1), group, call.algo,
                                 call.what);
  }
  // The algorithms work in place: `in` is the whole tensor and `out` this
  // member's chunk of it (the rest is scratch).
  if (call.algo)
    return algo_reduce_scatter(
        comm_, std::span<float>(const_cast<float *>(static_cast<const float *>(me.in)), count),
        group, *call.algo, call.tag, call.what);
  return comm_.reduce_scatter(std::span<const float>(static_cast<const float *>(me.in), count),
                              std::span<float>(static_cast<float *>(me.out), count / group.size()),
                              group, call.what);
}

Status CommTransport::all_gather(llvm::ArrayRef<core::Member> members, size_t bytes,
                                 const core::Collective &call, const plan::PieceLayout *) {
  return gather(comm_, members[0], bytes, call);
}

Status CommTransport::gather(Communicator &comm, const core::Member &me, size_t bytes,
                             const core::Collective &call) {
  const Group &group = plan_.group(call.group);
  if (comm.shares_memory(group))
    return shared_all_gather(comm, me.in, bytes, me.out, group, call.what);
  if (call.algo) // in place: the whole tensor with this member's shard filled in
    return algo_all_gather(
        comm, std::span<float>(static_cast<float *>(me.out), bytes * group.size() / sizeof(float)),
        group, call.tag, call.what);
  return comm.all_gather(me.in, bytes, me.out, group, call.what);
}

Status CommTransport::gather_batch(Communicator &comm, llvm::ArrayRef<Gather> gathers) {
  if (gathers.empty()) return Status::ok();
  const core::Collective &call = gathers.front().call;
  const Group &group = plan_.group(call.group);
  std::vector<GatherPiece> pieces;
  for (const Gather &g : gathers)
    pieces.push_back({g.member.in, g.bytes, g.member.out});
  if (comm.shares_memory(group)) return shared_all_gather(comm, pieces, group, call.what);
  // MPI ranks on one host: through the shared segments (the stream's, as
  // its buckets: one task at a time).
  if (auto segments = member_segments(comm, group, 1); !segments.empty())
    return segment_all_gather(comm, segments, pieces, group, call.what);
  for (const Gather &g : gathers)
    RETURN_IF_ERROR(gather(comm, g.member, g.bytes, g.call));
  return Status::ok();
}

Status CommTransport::start_gathers(llvm::ArrayRef<Gather> gathers, uint32_t index) {
  if (stream_ == nullptr) return gather_batch(comm_, gathers);
  stream_->start([this, batch = std::vector<Gather>(gathers.begin(), gathers.end())](
                     Communicator &side) { return gather_batch(side, batch); },
                 index, static_cast<uint32_t>(gathers.front().member.instruction),
                 clock_ ? clock_->now() : 0);
  return Status::ok();
}

Status CommTransport::wait_gather(int, uint32_t index, size_t) { return wait_stream(index); }

Status CommTransport::all_to_all(llvm::ArrayRef<core::Member> members, size_t block,
                                 const core::Collective &call) {
  const core::Member &me = members[0];
  const Group &group = plan_.group(call.group);
  const size_t r = plan_.position(call.group, me.device);
  const auto *outgoing = static_cast<const std::byte *>(me.in);
  auto *incoming = static_cast<std::byte *>(me.out);
  // Sends copy, so every send goes before the receives.
  for (size_t j = 0; j < group.size(); ++j)
    if (j != r)
      RETURN_IF_ERROR(comm_.send(outgoing + j * block, block, group[j], call.tag, call.what));
  if (block > 0) std::memcpy(incoming + r * block, outgoing + r * block, block);
  for (size_t j = 0; j < group.size(); ++j)
    if (j != r)
      RETURN_IF_ERROR(comm_.recv(incoming + j * block, block, group[j], call.tag, call.what));
  return Status::ok();
}

namespace {

// Calls fn(part, n, at) for each piece of `bucket`'s parts that falls in
// elements [begin, end) of the bucket as packed (chunk c of every part, then
// chunk c + 1; the range lies in one chunk): `part` is where the piece's
// first element in the range is, `at` its offset from `begin`.
template <typename Fn>
void each_packed(const core::Bucket &bucket, size_t p, size_t begin, size_t end, Fn &&fn) {
  const size_t c =
      static_cast<size_t>(std::upper_bound(bucket.chunks.begin(), bucket.chunks.end(), begin) -
                          bucket.chunks.begin() - 1);
  size_t at = bucket.chunks[c];
  for (const std::span<float> &part : bucket.parts) {
    const size_t first = chunk_begin(part.size(), p, c),
                 n = chunk_begin(part.size(), p, c + 1) - first;
    const size_t lo = std::max(at, begin), hi = std::min(at + n, end);
    if (lo < hi) fn(part.data() + first + (lo - at), hi - lo, lo - begin);
    at += n;
    if (at >= end) return;
  }
}

} // namespace

Status CommTransport::reduce(Communicator &comm, const core::Bucket &bucket) {
  const Group &group = plan_.group(bucket.group);
  const size_t p = group.size();
  const std::optional<CollectiveAlgo> algo = plan_.algorithm(bucket.group);
  // Threads: no packing, the members read each other's gradients.
  if (comm.shares_memory(group)) {
    if (!bucket.reduce_scatter)
      return shared_all_reduce(comm, bucket.parts, group, algo, bucket.what);
    std::vector<float *> out;
    for (const std::span<float> &part : bucket.parts)
      out.push_back(part.data() + chunk_begin(part.size(), p, bucket.position));
    return shared_reduce_scatter(comm, bucket.parts, out, group, algo, bucket.what);
  }
  // MPI ranks on one host: the bucket is summed in rounds staged in the
  // members' shared segments.
  std::vector<float *> segments;
  for (std::byte *segment : member_segments(comm, group, kSegmentBytes))
    segments.push_back(reinterpret_cast<float *>(segment));
  if (!segments.empty()) {
    auto pack = [&](size_t begin, size_t end, float *to) {
      each_packed(bucket, p, begin, end,
                  [&](float *part, size_t n, size_t at) { std::copy(part, part + n, to + at); });
    };
    auto take = [&](size_t begin, size_t end, const float *sum) {
      each_packed(bucket, p, begin, end, [&](float *part, size_t n, size_t at) {
        std::copy(sum + at, sum + at + n, part);
      });
    };
    return segment_reduce(comm, segments, group, algo, bucket.chunks, !bucket.reduce_scatter, pack,
                          take, bucket.what);
  }
  float *packed = staging_.data();
  // Chunk c of every part and where it sits in the packed bucket.
  auto each_piece = [&](size_t c, auto &&fn) {
    size_t at = bucket.chunks[c];
    for (const std::span<float> &part : bucket.parts) {
      const size_t begin = chunk_begin(part.size(), p, c), end = chunk_begin(part.size(), p, c + 1);
      fn(part.data() + begin, end - begin, packed + at);
      at += end - begin;
    }
  };
  for (size_t c = 0; c < p; ++c)
    each_piece(c, [](const float *from, size_t n, float *to) { std::copy(from, from + n, to); });
  const std::span<float> all(packed, bucket.packed());
  const size_t mine = bucket.position;
  Status status = Status::ok();
  if (!bucket.reduce_scatter)
    status = algo ? algo_all_reduce(comm, all, group, *algo, bucket.tag, bucket.what, bucket.chunks)
                  : comm.all_reduce(all, group, bucket.what);
  else if (algo)
    status = algo_reduce_scatter(comm, all, group, *algo, bucket.tag, bucket.what, bucket.chunks);
  else
    status = comm.reduce_scatter(all,
                                 std::span<float>(packed + bucket.chunks[mine],
                                                  bucket.chunks[mine + 1] - bucket.chunks[mine]),
                                 group, bucket.what);
  RETURN_IF_ERROR(status);
  // An all-reduce's every chunk, a reduce-scatter's own (its shard of each tensor).
  for (size_t c = 0; c < p; ++c)
    if (!bucket.reduce_scatter || c == mine)
      each_piece(c, [](float *to, size_t n, const float *from) { std::copy(from, from + n, to); });
  return Status::ok();
}

Status CommTransport::start_bucket(int, uint32_t index, const core::Bucket &bucket,
                                   size_t instruction) {
  if (stream_ == nullptr) return reduce(comm_, bucket);
  stream_->start([this, &bucket](Communicator &side) { return reduce(side, bucket); }, index,
                 static_cast<uint32_t>(instruction), clock_ ? clock_->now() : 0);
  return Status::ok();
}

Status CommTransport::wait_bucket(int, uint32_t index, const core::Bucket &, size_t) {
  return wait_stream(index);
}

Status CommTransport::wait_stream(uint32_t index) {
  if (clock_ != nullptr) clock_->now(); // the work before the wait
  if (stream_ == nullptr) return Status::ok();
  RETURN_IF_ERROR(stream_->wait(index, backstop_));
  if (clock_ != nullptr) clock_->join(stream_->done_at(index));
  return Status::ok();
}

} // namespace strata::runtime
