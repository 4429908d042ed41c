// The execution core's transport over a Communicator (local threads, MPI
// ranks): one per plan device, used by that device's thread, which blocks in
// each call until its part is done. Collectives run the plan's algorithm for
// the group (runtime/comm/collectives.h, over point-to-point messages) or the
// communicator's own; where the group's members share the address space
// (threads), the shared-memory form of the same sums (no messages, no
// packing). Gradient buckets are packed chunk by chunk into one message and
// reduced on the device's communication stream (CommStream: a second thread
// over a second communicator) while the device computes.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/comm/device_clock.h"
#include "runtime/core/issue.h"

namespace strata::runtime {

// A device's communication stream: one thread that runs the work handed to
// it, in order, on the device's second communicator, while the device
// thread computes. A failure aborts the device's main communicator too, so a
// device waiting anywhere learns of it at once. Its times are seconds since
// `epoch`, or with a `clock` the stream's device time (runtime/comm/device_clock.h),
// which starts at `clock_start`.
class CommStream {
public:
  CommStream(Communicator &side, Communicator &main, size_t tasks,
             std::chrono::steady_clock::time_point epoch, DeviceClock *clock, double clock_start);
  ~CommStream() { stop(Status::ok()); }

  // Runs `work` (task `index`, handed over by instruction `instruction` at
  // device time `ready`) on the second communicator after the tasks before it.
  void start(std::function<Status(Communicator &)> work, uint32_t index, uint32_t instruction,
             double ready);
  // Until task `index` is done; bounded by `timeout` (the work's own waits
  // are bounded by the communicator's, so this is a backstop).
  Status wait(uint32_t index, std::chrono::milliseconds timeout);
  // When task `index` was done (after wait() returned ok for it).
  double done_at(uint32_t index);
  struct Span {
    uint32_t instruction;
    double begin, end;
  };
  // What the stream did (read after stop()).
  const std::vector<Span> &spans() const { return spans_; }
  // Ends the stream; with an error, first aborts the second world so work
  // waiting for other devices returns.
  void stop(const Status &why);

private:
  void loop();
  Communicator &side_;
  Communicator &main_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  std::vector<char> done_;
  std::vector<double> done_at_;
  std::chrono::steady_clock::time_point epoch_;
  DeviceClock *clock_;
  double clock_start_;
  std::vector<Span> spans_;
  Status error_ = Status::ok();
  bool stopping_ = false, aborted_ = false;
  std::thread thread_;
};

class CommTransport : public core::Transport {
public:
  // `stream`: the device's communication stream for buckets, or null (each
  // bucket is then reduced where it is started); `clock`: the device clock,
  // or null; `backstop`: the bound on waiting for a bucket; `staging`: room
  // for the device's largest bucket, packed.
  CommTransport(const core::PipelinePlan &plan, Communicator &comm, CommStream *stream,
                DeviceClock *clock, std::chrono::milliseconds backstop,
                std::vector<float> &staging);

  Status send(const core::Part &part, const core::Op &op) override;
  Status recv(const core::Part &part, const core::Op &op) override;
  Status all_reduce(llvm::ArrayRef<core::Member> members, size_t count,
                    const core::Collective &call) override;
  Status reduce_scatter(llvm::ArrayRef<core::Member> members, size_t count,
                        const core::Collective &call, const plan::PieceLayout *blocks) override;
  Status all_gather(llvm::ArrayRef<core::Member> members, size_t bytes,
                    const core::Collective &call, const plan::PieceLayout *blocks) override;
  Status all_to_all(llvm::ArrayRef<core::Member> members, size_t block,
                    const core::Collective &call) override;
  Status start_bucket(int device, uint32_t index, const core::Bucket &bucket,
                      size_t instruction) override;
  Status wait_bucket(int device, uint32_t index, const core::Bucket &bucket,
                     size_t instruction) override;
  Status start_gathers(llvm::ArrayRef<Gather> gathers, uint32_t index) override;
  Status wait_gather(int device, uint32_t index, size_t instruction) override;

private:
  // Packs the bucket, reduces it over its group with `comm`, unpacks it.
  Status reduce(Communicator &comm, const core::Bucket &bucket);
  // One member's all-gather over `comm`.
  Status gather(Communicator &comm, const core::Member &me, size_t bytes,
                const core::Collective &call);
  // One member's all-gathers of a batch over `comm` (where the group shares
  // memory, with one exchange of addresses).
  Status gather_batch(Communicator &comm, llvm::ArrayRef<Gather> gathers);
  // Waits for the stream's task `index` and joins its time.
  Status wait_stream(uint32_t index);
  const core::PipelinePlan &plan_;
  Communicator &comm_;
  CommStream *stream_;
  DeviceClock *clock_;
  std::chrono::milliseconds backstop_;
  std::vector<float> &staging_;
};

} // namespace strata::runtime
