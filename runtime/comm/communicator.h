// Communicator: how the devices of one run exchange tensors.
//
// The host transports (local threads, MPI processes) implement this one
// narrow interface; the execution core reaches them through CommTransport
// (runtime/cpu/comm_transport.h), as it reaches NCCL and copies between GPU
// streams through GpuRank: both are core::Transport (runtime/core/issue.h). A
// communicator belongs to one rank ("device") of a world of size() ranks and
// is used by one thread at a time.
//
// Terms and guarantees:
// - Point-to-point messages are matched by (source, destination, tag). Messages on
//   one (source, destination, tag) are received in the order they were sent; a
//   receive is matched in the order it was posted, not the order it is waited on.
//   The receiver names the exact byte count; a message of another size is an error
//   that names both sides.
// - A group is a strictly increasing list of global ranks that contains the
//   calling rank; the empty group means the whole world. Every member of a group
//   must issue the same collectives on that group in the same order, with the same
//   sizes. Disjoint groups run their collectives independently.
// - Reductions sum, and they are deterministic: each element is accumulated in
//   increasing rank order, ((x[g0] + x[g1]) + x[g2]) + ..., where g0 < g1 < ... are
//   the group's ranks, and every member receives bitwise the same result, run to
//   run. This is the order a single device summing the same values would use.
// - Every wait is bounded by timeout(). A call that times out, or fails in any
//   other way, ends the whole world: every pending and later call on every rank
//   fails promptly with "device N failed: <reason>". abort() does the same on
//   request. There is no recovery: a failed world is discarded.
// - A peer that is no rank of the world, a group that breaks the rules above,
//   or a collective that does not fit its group (a broadcast root outside it, a
//   reduce_scatter input other than group size x output) is the caller's bug:
//   the call fails with invalid_argument and ends the world like any failure.
// - Errors name the device (its rank and label, "device 2 (stage 2)"), the
//   operation and its peer or group, and the caller's `what` text describing the
//   instruction, e.g. "device 2 (stage 2): recv from device 1, tag 7 (activation
//   'layer3.out', micro-batch 5): timed out after 30 s".
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "graph/status.h"

namespace strata::runtime {

// Strictly increasing global ranks that include the caller; empty = every rank.
using Group = std::vector<int>;

// Element types that reductions support.
enum class ReduceType : uint8_t { kF32, kF64 };

// A non-blocking transfer in flight. wait() must be called once before the
// buffer is reused; destroying an unwaited receive discards its message.
class Request {
public:
  virtual ~Request() = default;
  // True when wait() would return without blocking.
  virtual bool ready() = 0;
  // Blocks until the transfer completes, at most the communicator's timeout.
  virtual Status wait() = 0;
};

class Communicator {
public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The bound on every wait.
  virtual std::chrono::milliseconds timeout() const = 0;
  // Names this device in errors: "device 2 (<label>)", e.g. "stage 2".
  virtual void set_label(std::string label) = 0;

  // Point to point. `what` describes the instruction for error messages. A send
  // may return before the receiver has posted its receive (the data is copied).
  Status send(const void *data, std::size_t bytes, int peer, uint64_t tag,
              std::string_view what = {}) {
    return send_impl(data, bytes, peer, tag, what);
  }
  Status recv(void *data, std::size_t bytes, int peer, uint64_t tag, std::string_view what = {}) {
    return recv_impl(data, bytes, peer, tag, what);
  }
  // Non-blocking forms; `data` must stay valid until wait() returns.
  std::unique_ptr<Request> isend(const void *data, std::size_t bytes, int peer, uint64_t tag,
                                 std::string_view what = {}) {
    return isend_impl(data, bytes, peer, tag, what);
  }
  std::unique_ptr<Request> irecv(void *data, std::size_t bytes, int peer, uint64_t tag,
                                 std::string_view what = {}) {
    return irecv_impl(data, bytes, peer, tag, what);
  }

  // In-place sum over the group.
  Status all_reduce(std::span<float> data, const Group &group = {}, std::string_view what = {}) {
    return all_reduce_impl(data.data(), data.size(), ReduceType::kF32, group, what);
  }
  Status all_reduce(std::span<double> data, const Group &group = {}, std::string_view what = {}) {
    return all_reduce_impl(data.data(), data.size(), ReduceType::kF64, group, what);
  }
  // Sums `input` (group size x output.size() elements) over the group; the member
  // at position i of the group receives elements [i * n, (i + 1) * n) of the sum.
  Status reduce_scatter(std::span<const float> input, std::span<float> output,
                        const Group &group = {}, std::string_view what = {}) {
    return reduce_scatter_impl(input.data(), input.size(), output.data(), output.size(),
                               ReduceType::kF32, group, what);
  }
  Status reduce_scatter(std::span<const double> input, std::span<double> output,
                        const Group &group = {}, std::string_view what = {}) {
    return reduce_scatter_impl(input.data(), input.size(), output.data(), output.size(),
                               ReduceType::kF64, group, what);
  }
  // `output` (group size x bytes) receives every member's `input` in group order.
  Status all_gather(const void *input, std::size_t bytes, void *output, const Group &group = {},
                    std::string_view what = {}) {
    return all_gather_impl(input, bytes, output, group, what);
  }
  // Copies `root`'s (a global rank in the group) buffer to every member's.
  Status broadcast(void *data, std::size_t bytes, int root, const Group &group = {},
                   std::string_view what = {}) {
    return broadcast_impl(data, bytes, root, group, what);
  }
  Status barrier(const Group &group = {}, std::string_view what = {}) {
    return barrier_impl(group, what);
  }

  // True when inside one of `group`'s collectives (empty: every rank) each
  // member may read and write the others' memory: the shared-memory
  // collectives of runtime/comm/collectives.h then move no message. Devices
  // as threads of one process do; MPI ranks on one host do when their
  // devices' memory is in a shared window (DeviceWorld::shared_memory).
  virtual bool shares_memory(const Group &group) const {
    (void)group;
    return false;
  }
  // How the other members of a shared-memory collective find `data`, a
  // buffer of this device: a token they turn into their own address of it
  // with shared_address(this rank, token), which is null where they cannot
  // reach it. Threads pass the address; MPI ranks its offset in the
  // device's shared memory (DeviceWorld::shared_memory), or for a buffer
  // outside it, an address only the devices of its process can use.
  virtual uint64_t share_address(const void *data) const {
    return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(data));
  }
  virtual const void *shared_address(int member, uint64_t token) const {
    (void)member;
    return reinterpret_cast<const void *>(static_cast<uintptr_t>(token));
  }

  // Where device `device`'s shared segment (shared_segment_bytes() bytes) is
  // mapped in this process, or null: MPI ranks on one host share one per
  // device (MpiWorldOptions::shared_bytes), for the gradient buckets. Between
  // two of a group's collectives a member may read the others' segments.
  virtual std::byte *shared_segment(int device) const {
    (void)device;
    return nullptr;
  }
  virtual size_t shared_segment_bytes() const { return 0; }
  // A barrier of `group` for the segment collectives: where every member's
  // segment is mapped here, the members meet through the segments (a few
  // atomic counters, no message); elsewhere it is barrier(). What a member
  // wrote to its segment before, the others see after.
  virtual Status segment_barrier(const Group &group, std::string_view what) {
    return barrier(group, what);
  }

  // all_gather of a few bytes, for the shared-memory collectives to swap
  // where their buffers are: where every member's segment is mapped here,
  // through mailboxes beside the segments and one meeting (segment_barrier),
  // no message; elsewhere all_gather.
  virtual Status exchange(const void *mine, size_t bytes, void *all, const Group &group,
                          std::string_view what) {
    return all_gather(mine, bytes, all, group, what);
  }

  // Ends the world: every pending and later call on every rank fails promptly
  // with "device N aborted: <reason>". Callable from any thread.
  virtual void abort(Status reason) = 0;

protected:
  virtual Status send_impl(const void *data, std::size_t bytes, int peer, uint64_t tag,
                           std::string_view what) = 0;
  virtual Status recv_impl(void *data, std::size_t bytes, int peer, uint64_t tag,
                           std::string_view what) = 0;
  virtual std::unique_ptr<Request> isend_impl(const void *data, std::size_t bytes, int peer,
                                              uint64_t tag, std::string_view what) = 0;
  virtual std::unique_ptr<Request> irecv_impl(void *data, std::size_t bytes, int peer, uint64_t tag,
                                              std::string_view what) = 0;
  virtual Status all_reduce_impl(void *data, std::size_t count, ReduceType type, const Group &group,
                                 std::string_view what) = 0;
  virtual Status reduce_scatter_impl(const void *input, std::size_t input_count, void *output,
                                     std::size_t output_count, ReduceType type, const Group &group,
                                     std::string_view what) = 0;
  virtual Status all_gather_impl(const void *input, std::size_t bytes, void *output,
                                 const Group &group, std::string_view what) = 0;
  virtual Status broadcast_impl(void *data, std::size_t bytes, int root, const Group &group,
                                std::string_view what) = 0;
  virtual Status barrier_impl(const Group &group, std::string_view what) = 0;
};

} // namespace strata::runtime
