// The CUDA pipeline runner: a pipeline plan's devices (pipeline stages,
// data-parallel replicas, tensor-parallel members, ZeRO-1 shards, any
// schedule) on one GPU, spread over the GPUs of this process (--gpus), or
// over MPI processes a GPU each. Each GPU is a GpuRank (runtime/cuda/
// gpu_rank.h): the execution core's CUDA backend and transport, its devices
// as streams, its whole step captured into one CUDA Graph from the second
// step on. What each instruction does is the core's (runtime/core/issue.h),
// as on the CPU.
//
// create() reads the plan (core::PipelinePlan), places its devices on GPUs
// (place_on_gpus: a group whose members share a GPU meets through copies
// between streams, one spread over GPUs through NCCL; a group partly sharing
// a GPU is refused), orders the launches (gpu_launch_order, and for each GPU
// of several its gpu_rank_steps), lays out each GPU's memory as one
// allocation (cuda_pipeline_layout; a step allocates nothing) and starts the
// NCCL communicators: one world (a unique id shared in-process, or by MPI
// rank 0 across processes; NCCL's non-blocking init bounded by `timeout`)
// and one split off it per group spread over GPUs.
//
// A step stages the batch once (each compute reads its micro-batch's rows in
// place). On one GPU one host thread enqueues it; over several each GPU's
// host thread enqueues its own (an NCCL call may wait for the other ranks
// while being enqueued), and replays are launched from the calling thread.
// NCCL sums in its own order, so results over several GPUs equal the CPU's
// to rounding; on one GPU sums follow group order, as on the CPU. Every wait
// is bounded by `timeout` and watches the communicators' errors and the other
// ranks: a failure aborts every communicator and ends the step with the
// failing GPU's own error, not the "another GPU failed" of the rest; a rank
// whose step timed out leaves its memory and handles unfreed at teardown
// rather than block in cudaFree. Across MPI processes, rank 0 shares the NCCL
// id through the process group, all agree that every rank started, and after
// each step the processes share the outputs and the step's verdict, so all
// print the same losses and stop on the same first failure; checkpoints are
// written per process (checkpoint_pieces), as with the CPU runner over MPI.
//
// A device check that fails (a label out of range) ends the step with an
// error naming the device and instruction and leaves the runner unusable;
// the step's state updates are skipped on every device and GPU, so the
// weights stay as they were. Several GPUs have so far run only on the CUDA
// emulator's two (tests/cuda_emulator).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "graph/host_tensor.h"
#include "runtime/core/pipeline_plan.h"
#include "runtime/cuda/gpu_placement.h"
#include "runtime/step_runner.h"
#include "serialization/plan_io.h"

namespace strata::runtime {

struct CudaPipelineOptions {
  std::string model_dir = "."; // external data paths are relative to it
  int gpu = 0;                 // the CUDA device every plan device runs on (without `gpus`)
  // Per plan device its GPU (--gpus 0,0,1,1): several GPUs run as one rank
  // each, a host thread per GPU, over NCCL. Empty: every device on `gpu`.
  std::vector<int> gpus;
  // How long a GPU may take for a step, and NCCL for its start-up, before the
  // run ends with an error naming what did not finish (communicators aborted).
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  // Across the processes of an MPI job: process r runs plan devices
  // [r k, (r + 1) k) (k = devices_per_process) on its GPU `gpu`, a rank of
  // the NCCL world, whose unique id rank 0 shares through `processes`.
  // `watch` is asked during every wait: an error (another process failed)
  // ends it. Null: this process runs every device.
  ProcessGroup *processes = nullptr;
  int devices_per_process = 1;
  std::function<Status()> watch;
  // Told at once of this process's failure (MpiWorld::fail), so the others
  // stop waiting for it instead of running into their timeouts.
  std::function<void(const Status &)> fail;
  bool cuda_graph = true; // false: launch every instruction eagerly each step
  bool tf32 = false;      // f32 GEMMs and convolutions may use TF32 tensor cores
  bool bf16 = false;      // GEMM operands in bf16 (CudaExecutorOptions::bf16)
  bool f16 = false;       // or in scaled f16 (CudaExecutorOptions::f16)
  // Elementwise chains a device runs back to back (program_chains) as one
  // kernel each: the same bits, fewer launches. false: node by node.
  bool fuse = true;
  // Pooling and batch norm through cuDNN where it computes the node as strata
  // defines it (CudaExecutorOptions::cudnn_pool_norm). false: strata's kernels.
  bool cudnn_pool_norm = true;
  int64_t workspace_bytes = 32 << 20; // cuBLASLt/cuDNN workspace per plan device
};

// The one GPU allocation of a CudaPipelineRunner, laid out before anything is
// allocated (tested without a GPU). Byte offsets from its start; every region
// starts at a multiple of kGpuAlignment and none overlap.
struct CudaPipelineLayout {
  struct Device {
    int64_t arena = 0, arena_bytes = 0;             // the plan's activation arena
    std::vector<std::pair<TensorId, int64_t>> held; // in the program's holds order
    int64_t scratch = 0, scratch_bytes = 0;         // the largest of its nodes' (one stream)
    int64_t workspace = 0;
    int64_t bf16 = -1, bf16_bytes = 0; // with bf16: its GEMM operands' staging
    // Its tensor-parallel collectives' staging (core::collective_staging_bytes):
    // an all-to-all's blocks, and over NCCL where an all-gather lands or a
    // reduce-scatter packs pieces that are column blocks.
    int64_t tp_staging = -1, tp_staging_bytes = 0;
    std::vector<int64_t> send; // per instruction: a send's staging, or -1
    int64_t first_flag = 0;    // its instructions' flags: first_flag + i in `flags`
  };
  std::vector<Device> devices;
  std::vector<int64_t> constant; // per node: its value computed at load, or -1
  std::vector<int64_t> input;    // per graph input: the staging of the whole batch
  // Every device's instructions' error flags (ints, device by device), then
  // the step's verdict, read by every guarded state update: every local check
  // and (over NCCL) every other GPU's, combined at the step's first update.
  int64_t flags = 0, flag_count = 0, instruction_flags = 0;
  int64_t workspace_bytes = 0;
  int64_t total = 0;
};
// `local` (one flag per plan device; empty: all) limits it to the devices of
// one GPU of a run over several: the others get no regions, and the local
// ones' tensor-parallel staging for NCCL. Errors: what check_cuda_ops says,
// and a program that names a node, tensor or bucket the plan lacks, each
// naming the device and instruction.
Result<CudaPipelineLayout> cuda_pipeline_layout(const serialization::Plan &plan,
                                                int64_t workspace_bytes, bool bf16 = false,
                                                const std::vector<bool> &local = {});

class GpuRank;

class CudaPipelineRunner : public StepRunner {
public:
  static Result<std::unique_ptr<CudaPipelineRunner>>
  create(const serialization::Plan &plan, const CudaPipelineOptions &options = {});
  ~CudaPipelineRunner() override;

  const Graph &graph() const override { return plan_->graph(); }
  std::vector<TensorType> batch_types() const override { return plan_->batch_types(); }
  Status run(llvm::ArrayRef<HostTensor> inputs, std::vector<HostTensor> *outputs) override;
  // From the first plan device holding the tensor (waits for the step in
  // flight); a tensor-parallel one put together from its group's pieces.
  const HostTensor &value(TensorId id) const override;
  Status read_status() const override;
  // Over several GPUs: the longest any one GPU's host thread spent, or with
  // every step replayed from one thread, that thread's time for all of them.
  double issue_seconds() const override { return issue_seconds_; }
  // Tensor-parallel pieces are whole here: the full tensor's type.
  TensorType value_type(TensorId id) const override { return plan_->value_type(id); }
  // To every plan device holding the tensor (each member its piece).
  Status assign(TensorId id, const HostTensor &value) override;
  // Across processes: the process group, and what this process's devices
  // write to a checkpoint (StepRunner::checkpoint_pieces).
  ProcessGroup *processes() const override { return processes_; }
  Result<std::map<std::string, HostTensor>> checkpoint_pieces() const override;

  int num_devices() const { return plan_->num_devices(); } // plan devices
  int num_gpus() const;         // GPUs they run on (a host thread and NCCL rank each)
  int64_t device_bytes() const; // over every GPU
  int64_t replays() const;      // steps launched from the captured graph
  // Elementwise chains run as one kernel, counted per device and micro-batch.
  int64_t fused_chains() const;
  std::string device_name() const;

private:
  CudaPipelineRunner() = default;
  // Rank r's step: the batch in, the first step eagerly, the second
  // captured, later ones replayed (not waited for).
  Status launch_rank(GpuRank &rank, llvm::ArrayRef<HostTensor> inputs);
  // Every rank's step, on a thread per GPU where NCCL calls may wait.
  Status run_ranks(llvm::ArrayRef<HostTensor> inputs);
  // The rank running plan device `d` in this process (made current), or null.
  GpuRank *rank_of(size_t d) const;
  // What device `d` of this process keeps of `id`; a copy that fails leaves
  // it zero and `error` set.
  std::optional<HostTensor> read(int d, TensorId id, Status &error) const;

  std::unique_ptr<const core::PipelinePlan> plan_;
  // One per GPU the plan runs on in this process (across processes, this
  // process's one).
  std::vector<std::unique_ptr<GpuRank>> ranks_;
  ProcessGroup *processes_ = nullptr;
  double issue_seconds_ = -1;
};

} // namespace strata::runtime
