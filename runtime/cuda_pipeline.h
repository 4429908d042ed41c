// The CUDA pipeline runner: a pipeline (and data-parallel) plan's devices on
// one GPU, each plan device a pair of CUDA streams, the whole step captured
// into one CUDA Graph.
//
// create() lays out all of the step's GPU memory as one allocation
// (cuda_pipeline_layout): per plan device its activation arena (the plan's
// memory plan, unchanged), its copies of the parameters, state and constants
// it holds, its kernels' scratch and cuBLASLt/cuDNN workspace, a staging
// buffer per send and one error flag per instruction; then the batch's
// staging and the values computed at load. A step allocates nothing.
//
// One host thread enqueues every device's instructions, in an order in which
// nothing waits for work not yet enqueued (gpu_launch_order):
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
// are group collectives like the all-reduce. Plans over several GPUs (NCCL),
// ZeRO-1 of tensor-parallel pieces, TpAllToAll (some --split-activations
// plans) and vocabulary-parallel embeddings and losses are refused with the
// reason. A device check that fails (a label out
// of range) ends the step with an error naming the device and instruction,
// and, as with the CPU pipeline runner, leaves the runner unusable. A
// device's state updates are skipped when any flag set before them (of any
// device) is raised, so a bad label leaves the weights as they were.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "graph/host_tensor.h"
#include "runtime/gpu_placement.h"
#include "runtime/step_runner.h"
#include "serialization/plan_io.h"

namespace strata::runtime {

struct CudaPipelineOptions {
  std::string model_dir = ".";        // external data paths are relative to it
  int gpu = 0;                        // the CUDA device every plan device runs on
  bool cuda_graph = true;             // false: launch every instruction eagerly each step
  bool tf32 = false;                  // f32 GEMMs and convolutions may use TF32 tensor cores
  bool bf16 = false;                  // GEMM operands in bf16 (CudaExecutorOptions::bf16)
  int64_t workspace_bytes = 32 << 20; // cuBLASLt/cuDNN workspace per plan device
};

// The one GPU allocation of a CudaPipelineRunner, laid out before anything is
// allocated (tested without a GPU). Byte offsets from its start; every region
// starts at a multiple of GpuArenaLayout::kGpuAlignment and none overlap.
struct CudaPipelineLayout {
  struct Device {
    int64_t arena = 0, arena_bytes = 0;             // the plan's activation arena
    std::vector<std::pair<TensorId, int64_t>> held; // in the program's holds order
    int64_t scratch = 0, scratch_bytes = 0;         // the largest of its nodes' (one stream)
    int64_t workspace = 0;
    int64_t bf16 = -1, bf16_bytes = 0; // with bf16: its GEMM operands' staging
    std::vector<int64_t> send;         // per instruction: a send's staging, or -1
    int64_t first_flag = 0;            // its instructions' flags: first_flag + i in `flags`
  };
  std::vector<Device> devices;
  std::vector<int64_t> constant; // per node: its value computed at load, or -1
  std::vector<int64_t> input;    // per graph input: the staging of the whole batch
  // Every device's instructions' error flags (ints, device by device), then one
  // "any flag set" int per device, read by its guarded state updates.
  int64_t flags = 0, flag_count = 0;
  int64_t workspace_bytes = 0;
  int64_t total = 0;
};
// Errors: what check_cuda_ops says, and what this runner does not run yet
// (ZeRO-1 of tensor-parallel pieces, non-f32 accumulation), each naming the
// device and instruction.
Result<CudaPipelineLayout> cuda_pipeline_layout(const serialization::Plan &plan,
                                                int64_t workspace_bytes, bool bf16 = false);

class CudaPipelineRunner : public StepRunner {
public:
  static Result<std::unique_ptr<CudaPipelineRunner>>
  create(const serialization::Plan &plan, const CudaPipelineOptions &options = {});
  ~CudaPipelineRunner() override;

  const Graph &graph() const override { return graph_; }
  std::vector<TensorType> batch_types() const override;
  Status run(llvm::ArrayRef<HostTensor> inputs, std::vector<HostTensor> *outputs) override;
  // From the first plan device holding the tensor (waits for the step in
  // flight); a tensor-parallel one put together from its group's pieces.
  const HostTensor &value(TensorId id) const override;
  // Tensor-parallel pieces are whole here: the full tensor's type.
  TensorType value_type(TensorId id) const override;
  // To every plan device holding the tensor (each member its piece).
  Status assign(TensorId id, const HostTensor &value) override;
  Result<HostTensor> join_pieces(TensorId id, const std::vector<HostTensor> &pieces) const override;

  int num_devices() const;
  int64_t device_bytes() const;
  int64_t replays() const; // steps launched from the captured graph
  std::string device_name() const;

private:
  CudaPipelineRunner() = default;
  Graph graph_;
  int microbatches_ = 1, data_parallel_ = 1, tensor_parallel_ = 1;
  // Tensor parallelism: tensors every member holds a piece of, by id.
  std::map<TensorId, serialization::PlanShard> tp_shards_;
  struct State;
  std::unique_ptr<State> state_;
};

} // namespace strata::runtime
