// The CUDA backend's CPU-side bookkeeping, which needs no GPU and is tested
// without one:
//  - placing a plan's devices on this machine's GPUs (several plan devices may
//    share one GPU, so pipeline and tensor-parallel plans run on a single GPU),
//    and choosing how each of the plan's groups and each point-to-point link
//    meets there: NCCL where the members are on distinct GPUs, device-to-device
//    copies on streams where they share one (NCCL refuses a communicator with
//    two ranks on the same GPU);
//  - the record a CUDA Graph is captured with (every buffer the step touches:
//    name, address, type), against which a replay is checked, so a replay with
//    moved buffers or other shapes is an error naming the buffer instead of
//    reading stale memory.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "graph/graph.h"
#include "graph/host_tensor.h"
#include "runtime/comm/device_world.h"
#include "serialization/plan_io.h"

namespace strata::runtime {

enum class GpuTransport : uint8_t {
  kNccl,       // members on distinct GPUs: an NCCL communicator
  kDeviceCopy, // members sharing a GPU: device-to-device copies and local sums on streams
};
const char *gpu_transport_name(GpuTransport transport);

struct GpuPlacement {
  std::vector<int> gpu_of_device; // per plan device: the GPU it runs on
  // Per plan group (Pipeline.groups): how its members meet, and why.
  std::vector<GpuTransport> group_transport;
  std::vector<std::string> group_why;
  // How plan devices `a` and `b` exchange point-to-point messages.
  GpuTransport link(int a, int b) const;
};

// Places `devices` plan devices on `gpus` visible GPUs: by `gpu_list` (one
// GPU index per plan device, as --gpus 0,0,1,1 gives), or round robin (plan
// device d on GPU d mod gpus) when it is empty. Errors: no GPU, a list of the
// wrong length or naming a GPU that is not there, a group naming a device
// that is not in the plan.
Result<GpuPlacement> place_on_gpus(int devices, const std::vector<std::vector<int32_t>> &groups,
                                   int gpus, const std::vector<int> &gpu_list = {});

// "0,0,1,1" -> {0, 0, 1, 1}; an error naming the bad entry otherwise.
Result<std::vector<int>> parse_gpu_list(std::string_view text);

// Where every region of a GPU allocation starts: a multiple of this many
// bytes (what cuBLASLt and cuDNN want of their operands and workspaces).
constexpr int64_t kGpuAlignment = 256;

// One launch of the single host thread that enqueues a step of several plan
// devices sharing a GPU, each device on its own stream: one instruction of one
// device, or a collective's instruction on every member of its group, in group
// order (AllReduce, ReduceScatter, AllGather), or a bucket's reduction (`reduce`:
// every member's StartBucket, each of which also came alone, where its device
// reached it, to mark its arrival).
struct GpuLaunch {
  struct Part {
    int device = 0;
    uint32_t instruction = 0;
    friend bool operator==(const Part &, const Part &) = default;
  };
  std::vector<Part> parts;
  bool reduce = false;
};
// An order in which one thread can enqueue every instruction of every device
// so that nothing waits on work not yet enqueued (an event not yet recorded):
// each device's instructions keep their order, every receive comes after the
// send it matches (same peers, tensor and micro-batch, matched in order, as
// the communicator matches them), a collective comes once every member of
// its group has reached it, and a WaitBucket after its bucket's reduction. A
// StartBucket does not stop its device (the reduction runs beside it, as on
// the CPU's communication stream). Errors: a receive never sent, a collective some
// member never reaches or reaches out of order (each stuck device is named
// with its instruction), a collective on a device outside its group. In a
// tensor-parallel plan (`tensor_parallel` > 1) the nodes that communicate
// (TpAllReduce, TpAllGather, TpReduceScatter, TpAllToAll) are collectives of
// the device's group, groups[tp_groups_begin + device / tensor_parallel],
// matched per node and micro-batch.
Result<std::vector<GpuLaunch>>
gpu_launch_order(const Graph &graph, const std::vector<serialization::PlanProgram> &programs,
                 const std::vector<std::vector<int32_t>> &groups, int tensor_parallel = 1,
                 int tp_groups_begin = -1);

// A run over several GPUs has one rank per GPU (in increasing GPU order, or
// one per process across MPI processes), each enqueueing the launches of the
// same global order (gpu_launch_order) that touch its GPU, so every rank
// issues its NCCL calls in the same order and none can wait on a call
// another has not reached.
struct GpuRanks {
  std::vector<int> gpu;            // per rank: its GPU
  std::vector<int> rank_of_device; // per plan device: the rank running it
};
GpuRanks gpu_ranks(const GpuPlacement &placement);

// What one rank does at one launch of the global order.
enum class GpuRankAction : uint8_t {
  kSkip,           // nothing of the launch is on this GPU
  kLocal,          // all of it is: streams and device copies, as on one GPU
  kNcclSend,       // a receive on another GPU of a message staged here: ncclSend
  kNcclRecv,       // a receive here of a message staged on another GPU: ncclRecv
  kNcclCollective, // a collective of a group spread over GPUs: this GPU's member calls NCCL
};

struct GpuRankStep {
  GpuRankAction action = GpuRankAction::kSkip;
  // The part on this rank: of kLocal the launch's own parts; of kNcclSend the
  // send the receive matches; of kNcclRecv the receive; of kNcclCollective
  // this GPU's member.
  GpuLaunch::Part part;
  int peer = -1;  // kNcclSend / kNcclRecv: the other rank
  int group = -1; // kNcclCollective: the plan group whose communicator it uses
  // Set on the launch of the step's first state update: before it every rank
  // combines its devices' check flags with the others' (an all-reduce over
  // all ranks), so a failed check on any GPU keeps every GPU's weights.
  bool share_flags = false;
};

// The plan group a collective launch runs over: AllReduce, ReduceScatter,
// AllGather and bucket reductions name it, a tensor-parallel node's is its
// device's (groups[tp_groups_begin + device / tensor_parallel]); -1 for a
// launch that is not a collective.
int gpu_launch_group(const Graph &graph, const std::vector<serialization::PlanProgram> &programs,
                     const GpuLaunch &launch, int tensor_parallel, int tp_groups_begin);

// Per launch of `order`: for a receive, the send it matches (same peers,
// tensor and micro-batch, in order, as communicators match them); for any
// other launch, device -1. Error: a receive whose send is not before it.
Result<std::vector<GpuLaunch::Part>>
gpu_matching_sends(const std::vector<serialization::PlanProgram> &programs,
                   const std::vector<GpuLaunch> &order);

// Rank `rank`'s step for every launch of `order` (one per launch, in order).
// Errors: a group spread over GPUs with two members sharing one (NCCL takes
// one rank per GPU, and a mix of copies and NCCL is not built), a receive
// whose send is not in the order, a rank that is not there.
Result<std::vector<GpuRankStep>>
gpu_rank_steps(const Graph &graph, const std::vector<serialization::PlanProgram> &programs,
               const std::vector<std::vector<int32_t>> &groups, int tensor_parallel,
               int tp_groups_begin, const std::vector<GpuLaunch> &order,
               const GpuPlacement &placement, int rank);

// Across the processes of a run, every process's status to all: OK where
// every process's is, else the same error on every process, the first
// failure by rank (one that only says another process failed counts last).
// `what` names the exchange in the group's errors.
Status agree_across(ProcessGroup &processes, const Status &mine, std::string_view what);

// After a step across processes: each process's outputs (those it keeps, of
// `types`; `outputs[k]` empty where it keeps none) and status go to every
// process, which gets every output from the first process keeping it and
// the step's status as agree_across decides it. An output no process keeps
// is an error.
Status share_step_results(ProcessGroup &processes, const Status &mine,
                          const std::vector<TensorType> &types,
                          std::vector<std::optional<HostTensor>> *outputs);

// Where a device's program may run an elementwise chain (passes/
// fuse_elementwise.h) as one kernel: the chain's nodes are consecutive
// compute instructions on one micro-batch, and the slot of its output does
// not overlap the slot of any tensor the chain reads (the compile-time memory
// plan did not foresee the chain reading its operands at its last node's
// place). The runs in program order.
struct ProgramChain {
  size_t first = 0, last = 0; // instruction indices
  size_t chain = 0;           // index into `chains`
};
std::vector<ProgramChain> program_chains(const Graph &graph,
                                         const serialization::PlanProgram &program,
                                         const std::vector<std::vector<NodeId>> &chains);

// The buffers a captured step reads and writes.
class CaptureRecord {
public:
  void add(std::string name, const void *address, TensorType type);
  size_t size() const { return buffers_.size(); }
  // OK when `replay` binds the same buffers at the same addresses with the
  // same types, in the same order; otherwise an error naming the first that
  // differs (and what it was at capture), or the count that differs.
  Status check_replay(const CaptureRecord &replay) const;

private:
  struct Buffer {
    std::string name;
    const void *address;
    TensorType type;
  };
  std::vector<Buffer> buffers_;
};

} // namespace strata::runtime
