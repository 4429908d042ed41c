// GpuRank: one GPU of a CUDA pipeline run (runtime/cuda/cuda_pipeline.h), the
// CUDA backend and transport of the execution core (runtime/core/issue.h).
//
// Every plan device on the GPU is a pair of streams: compute, and a second
// one for its gradient buckets. The rank's memory is one allocation laid out
// by cuda_pipeline_layout. One host thread enqueues the step: it walks the
// launch order (gpu_launch_order), in which nothing waits on an event not yet
// recorded, and issues each launch through the core, so each instruction
// does what it does on every backend. What is CUDA's own is here:
//  - as a DeviceBackend, each device runs its nodes with the CUDA op table
//    on its stream (elementwise chains as one fused kernel, Constants copied
//    from where they were computed at load), and applies its state updates
//    as guarded copies that read the step's verdict (every device check of
//    the step, combined once at the first update), so a bad label keeps the
//    weights;
//  - as a Transport, the rank moves data between its devices with copies on
//    their streams ordered by events (a send stages the message and records
//    an event; a collective's first member sums or copies every member's
//    buffers in group order once all have arrived, and the others wait for
//    it; a bucket is summed on the first member's second stream), and over
//    NCCL where a group or link crosses GPUs (every rank walks the same
//    order, so all make their NCCL calls in the same order; each call is
//    chained after the rank's previous one).
#pragma once

#include "strata_config.h"

#if STRATA_HAVE_CUDA

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "ops/kernels/cuda/cuda_ops.h"
#include "runtime/core/issue.h"
#include "runtime/cuda/cuda_pipeline.h"
#include "runtime/cuda/cuda_step.h"
#include "runtime/cuda/gpu_placement.h"
#include "runtime/cuda/nccl_bootstrap.h"

namespace strata::runtime {

class GpuRank : public core::Transport {
public:
  GpuRank(const core::PipelinePlan &plan, const CudaPipelineOptions &options)
      : plan(plan), options(options) {}
  ~GpuRank() override;

  // Host values the rank uploads: each held part by its key
  // (PipelinePlan::Held::key), each Constant node's value.
  using Parts = std::map<std::tuple<TensorId, int, int>, HostTensor>;
  // Allocates and uploads, makes the streams and events, resolves every
  // local device's program through the core. `chains`: the graph's
  // elementwise chains (run as one kernel where a program has one whole).
  Status build(const Parts &parts, const std::map<NodeId, HostTensor> &constants,
               const std::vector<std::vector<NodeId>> &chains);
  // The step's work on the GPU: fork every stream from the origin, the
  // launches, join them back (also after a failed launch).
  Status enqueue();
  // Waits for the origin stream (which every step joins), bounded.
  Status wait(std::string_view what) const;
  // The buffers a captured step binds, checked before a replay.
  CaptureRecord record() const;
  // Ends the communicators at once, so no GPU waits for a peer that will not
  // come (a failed or stalled rank).
  void abort_comms();
  bool is_local(size_t d) const { return local.empty() || local[d]; }
  // Where device `d` keeps its part of `id`, or null.
  std::byte *held_at(size_t d, TensorId id) const;

  // Transport.
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
  bool strided(int group) const override { return !group_comms.contains(group); }
  Status start_bucket(int device, uint32_t index, const core::Bucket &bucket,
                      size_t instruction) override;
  Status reduce_bucket(llvm::ArrayRef<core::Part> members) override;
  Status wait_bucket(int device, uint32_t index, const core::Bucket &bucket,
                     size_t instruction) override;

  const core::PipelinePlan &plan;
  CudaPipelineOptions options;
  std::string device_name;
  // A run over several GPUs has one rank per GPU: the plan devices on it
  // (`local`, one flag per plan device), what it does at each launch of the
  // shared order (`steps`), the rank running each plan device, and its NCCL
  // communicators: `world` over every rank for the point-to-point messages
  // and the shared check flags, and one per plan group spread over GPUs,
  // holding its member here. On one GPU `local` and `steps` are empty and
  // there are no communicators.
  int gpu = 0, rank = 0;
  std::vector<bool> local;
  std::vector<GpuRankStep> steps;
  std::vector<int> rank_of_device;
  std::unique_ptr<NcclComm> world;
  std::map<int, std::unique_ptr<NcclComm>> group_comms;
  const std::atomic<bool> *stop = nullptr; // another rank failed: stop waiting
  CudaPipelineLayout layout;
  std::vector<GpuLaunch> order;
  int64_t fused_chains = 0; // instances over this GPU's devices and micro-batches
  CapturedStep step;
  bool failed = false;
  mutable bool stuck = false; // a wait ran out of time (see ~GpuRank)
  struct Output {
    int device = -1;
    const std::byte *data = nullptr;
  };
  std::vector<Output> outputs; // per graph output: where this GPU keeps it
  std::vector<std::byte *> input_staging;
  std::vector<size_t> input_bytes;
  cudaStream_t origin = nullptr;
  mutable std::map<TensorId, HostTensor> host; // value()'s copies, until the next step
  mutable Status read_error; // rank 0's: the first value() since the step that failed
  double issue_seconds = 0;  // the last step's, on its host thread

  // The error flags the device checks of one instruction raise, and what a
  // raised one means; ok where none is raised.
  Status check_flags() const;

private:
  class Device;
  struct Extra;
  Device &device(int d) const { return *devices_[static_cast<size_t>(d)]; }
  Extra &extra(int d, size_t instruction) const;
  Result<cudaEvent_t> make_event();
  Status copy(void *to, const void *from, size_t bytes, cudaStream_t stream);
  Status copy_block(void *to, size_t to_pitch, const void *from, size_t from_pitch, size_t width,
                    size_t rows, cudaStream_t stream);
  Status build_device(size_t d, const Parts &parts);
  Status resolve(size_t d, const std::vector<std::vector<NodeId>> &chains);
  Status wire_launches();
  Status launch(size_t k);
  Status rank_step(size_t k);
  // A collective whose members are all here: each member arrives (an event
  // on its stream), the first member's stream waits for them all; after the
  // work it records the launch's event, which the others wait for.
  Status arrive(llvm::ArrayRef<core::Member> members);
  Status release(llvm::ArrayRef<core::Member> members);
  cudaStream_t stream_of(const core::Member &member) const;
  Status combine_local_flags();
  Status share_flags();
  size_t first_local() const;
  // The group's NCCL communicator when the group crosses GPUs, else null.
  NcclComm *group_comm(int group) const;
  Status watch() const;
  enum class NcclOp { kAllReduce, kReduceScatter, kAllGather };
  Status nccl_collective(NcclComm &comm, const core::Member &me, NcclOp op, size_t n,
                         std::string_view what);
  Status nccl_all_to_all(NcclComm &comm, const core::Member &me, size_t block, int group);
  Status aborted_by_peer() const;
#if STRATA_HAVE_NCCL
  Status nccl(NcclComm &comm, int result, std::string_view what);
  Status nccl_after_last(cudaStream_t stream);
  Status nccl_mark(cudaStream_t stream);
  Status send_out(const GpuRankStep &step);
#endif

  cublasLtHandle_t lt_ = nullptr;
  std::byte *base_ = nullptr;
  std::vector<cudaEvent_t> events_;              // every event, destroyed with the rank
  std::vector<std::unique_ptr<Device>> devices_; // by plan device; null elsewhere
  std::unique_ptr<core::Issuer> issuer_;
  std::deque<cudaEvent_t> reduced_; // one per collective launch (stable addresses)
  cudaEvent_t fork_ = nullptr;
  int *flags_ = nullptr;               // every device's, then the verdict
  int *rank_any_ = nullptr;            // this GPU's checks and (after sharing) every GPU's
  cudaEvent_t flags_shared_ = nullptr; // rank_any_ is final
  bool flags_combined_ = false;        // this step's checks are in rank_any_ (while enqueueing)
  std::vector<cudaEvent_t> marks_;     // per device: its stream reached the sharing
  std::vector<cudaEvent_t> joins_;     // two per device (compute, side)
  // The last NCCL call enqueued this step: its stream and an event after it.
  cudaStream_t nccl_stream_ = nullptr;
  cudaEvent_t nccl_done_ = nullptr;
};

// What one instruction keeps beside its core op on the GPU.
struct GpuRank::Extra {
  const cuda::CudaOp *op = nullptr;       // compute: null for a Constant computed at load
  const std::byte *constant = nullptr;    // its value there
  std::shared_ptr<void> *cache = nullptr; // the kernel's plan, per node and micro-batch
  // An elementwise chain run as one kernel: its last node runs `fused`, the
  // others are skipped.
  bool skip = false;
  std::shared_ptr<cuda::Fused> fused;
  std::byte *staging = nullptr;    // send: where the message waits
  cudaEvent_t sent = nullptr;      // send: recorded after the staging copy
  const Extra *matching = nullptr; // recv: its send, where that is on this GPU
  cudaEvent_t arrived = nullptr;   // collectives and StartBucket: this member is there
  cudaEvent_t *reduced = nullptr;  // a collective launch's (or bucket's) work is done
};

// One plan device on this GPU: the core's DeviceBackend on its stream.
class GpuRank::Device : public core::DeviceBackend {
public:
  Device(GpuRank &rank, int index) : rank_(rank), index(index) {}
  ~Device() override {
    cuda::destroy_cudnn(cudnn);
    if (stream) cudaStreamDestroy(stream);
    if (side) cudaStreamDestroy(side);
  }

  Status run_node(size_t instruction) override;
  Status copy(void *to, const void *from, size_t bytes) override {
    return rank_.copy(to, from, bytes, stream);
  }
  Status copy_rows(void *to, size_t to_pitch, const void *from, size_t from_pitch, size_t width,
                   size_t rows) override {
    return rank_.copy_block(to, to_pitch, from, from_pitch, width, rows, stream);
  }
  Status accumulate(float *sum, const float *add, size_t count) override {
    return cuda_check(cuda::accumulate(sum, add, static_cast<int64_t>(count), stream), "launch");
  }
  Status divide(float *data, float divisor, size_t count) override {
    return cuda_check(cuda::divide(data, divisor, static_cast<int64_t>(count), stream), "launch");
  }
  Status update(size_t instruction) override;

  GpuRank &rank_;
  int index;
  cudaStream_t stream = nullptr, side = nullptr;
  void *cudnn = nullptr;
  void *scratch = nullptr, *workspace = nullptr, *bf16 = nullptr;
  int64_t scratch_bytes = 0;
  std::byte *tp_staging = nullptr;
  int *flags = nullptr; // its instructions' flags
  bool checked = false; // waited for the step's verdict (before its first update)
  std::map<TensorId, std::byte *> held;
  core::DeviceProgram program;
  std::vector<Extra> extras; // per instruction
  std::map<std::pair<NodeId, int32_t>, std::shared_ptr<void>> caches;
  std::map<uint32_t, cudaEvent_t> bucket_done; // per bucket
};

} // namespace strata::runtime

#endif
