// The CUDA pipeline runner: a pipeline (and data-parallel) plan's devices on
// one GPU or spread over several, each plan device a pair of CUDA streams of
// its GPU, each GPU's whole step captured into one CUDA Graph.
//
// create() lays out all of the step's GPU memory as one allocation
// (cuda_pipeline_layout): per plan device its activation arena (the plan's
// memory plan, unchanged), its copies of the parameters, state and constants
// it holds, its kernels' scratch and cuBLASLt/cuDNN workspace, a staging
// buffer per send and one error flag per instruction; then the batch's
// staging and the values computed at load. A step allocates nothing. The
// batch is staged once; each compute instruction reads its micro-batch's rows
// of it in place.
//
// On one GPU, one host thread enqueues every device's instructions, in an
// order in which nothing waits for work not yet enqueued (gpu_launch_order):
//  - compute: the node's CUDA kernel (ops/kernels/cuda/cuda_ops.h) on the
//    device's compute stream;
//  - send: a copy into the send's staging on the sender's stream, then an
//    event; the sender may reuse its buffer at once, as the CPU
//    communicator's sends copy;
//  - receive: the receiver's stream waits for that event and copies out;
//  - accumulate, scale, update: kernels and copies on the device's stream;
//  - all-reduce: every member records an event, the first member's stream
//    waits for them all and sums the members' buffers in group order (as the
//    CPU communicator does; where the plan names a ring or tree algorithm,
//    the CPU adds in its order, the same sum to rounding with three or more
//    members) into every member's, and the members wait for it;
//  - gradient buckets: a member's StartBucket records its arrival and its
//    stream goes on; once every member has arrived, the same sum runs on the
//    first member's second stream, which the members wait for at their
//    WaitBucket, so the reduction overlaps their backward.
// With CUDA Graphs on (the default) the first step runs eagerly, the second is
// captured (every stream forked from and joined back to one origin stream) and
// later steps replay it, after checking that every buffer is where it was.
//
// Tensor-parallel groups run on the same GPU: a member holds its piece of each
// split parameter, TpCopy and TpSplit run on its stream, and TpAllReduce,
// TpAllGather and TpReduceScatter are collectives of its group (the first
// member's stream sums or moves every member's pieces while the others wait).
// ZeRO-1 runs too: a replica holds its shard of the sharded state, its
// ComputeShard updates run on views of its chunk, and the gradients'
// reduce-scatters (blocking, or as buckets) and the parameters' all-gathers
// are group collectives like the all-reduce. Megatron's vocabulary-parallel
// embedding and cross entropy run on each member's piece (the kernels take
// the member's place in its group), and TpAllToAll moves blocks through a
// staging buffer per member (plan::all_to_all_layout). ZeRO-1 shards
// tensor-parallel pieces too: a replica holds its shard of its member's piece.
//
// Over several GPUs (CudaPipelineOptions::gpus) each GPU is a rank with its
// own State and CUDA Graph (and its own host thread for the eager and
// captured steps, whose NCCL calls may wait on the other ranks' while being
// enqueued; replays are launched by the calling thread, one graph per GPU),
// and the ranks talk over NCCL: a world communicator (from one unique id
// shared in-process, started with NCCL's non-blocking init, bounded by
// `timeout`) for messages and one split off it per plan group spread over
// GPUs (one member per GPU; a group on one GPU keeps the copies above; a
// group partly sharing a GPU is refused). Every rank walks the same launch
// order and makes its NCCL calls where gpu_rank_steps says, so all ranks
// reach each call in the same order and none waits on one not yet issued: a
// message is staged at its send and goes out (ncclSend on the sender's
// second stream, ncclRecv on the receiver's) at its receive's launch;
// collectives, buckets and tensor-parallel nodes are NCCL's all-reduce,
// reduce-scatter and all-gather (in place; column-block pieces through a
// staging buffer). NCCL sums in its own order, so results equal the CPU's to
// rounding, not bitwise. Before the step's first update the ranks combine
// their check flags (an NCCL max), so a check that fails on one GPU keeps
// every GPU's weights. Every wait is bounded by `timeout` and watches the
// communicators' errors and the other ranks: a failure aborts every
// communicator and ends the step with the failing GPU's own error, not the
// "another GPU failed" of the rest. A rank whose step timed out leaves its
// memory and handles unfreed at teardown (its comms aborted, then 2 s more)
// rather than block in cudaFree. So far this path has run on the CUDA
// emulator's two GPUs (tests/cuda_emulator), not on a machine with several.
//
// Across the processes of an MPI job (CudaPipelineOptions::processes) each
// process is one such rank on the GPU of its local rank, running its
// devices; rank 0 shares the NCCL unique id through the process group, all
// agree that every rank started, and after each step the processes share
// the outputs (from the process keeping each) and the step's verdict, so
// every process sees the same losses and the same first failure. value()
// reads only this process's tensors; checkpoints go through
// checkpoint_pieces(), as with the CPU runner over MPI.
//
// A device check that fails (a label out of range) ends the step with an
// error naming the device and instruction, and, as with the CPU pipeline
// runner, leaves the runner unusable. A device's state updates are skipped
// when any flag set before them (of any device) is raised, so a bad label
// leaves the weights as they were.
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
  Result<HostTensor> join_pieces(TensorId id,
                                 const std::vector<HostTensor> &pieces) const override {
    return plan_->join_pieces(id, pieces);
  }
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
