#include "runtime/cuda_pipeline.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include "graph/verifier.h"
#include "ops/registry.h"
#include "plan/instructions.h"
#include "plan/pieces.h"
#include "plan/simulate.h"
#include "passes/fuse_elementwise.h"
#include "runtime/collectives.h"
#include "runtime/cuda_executor.h"
#include "runtime/executor.h"
#include "runtime/nccl_bootstrap.h"
#include "strata_config.h"

#if STRATA_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "ops/kernels/cuda/cuda_ops.h"
#include "ops/kernels/cuda/launch.h"
#include "runtime/cuda_step.h"
#if STRATA_HAVE_NCCL
#include <nccl.h>
#endif
#endif

namespace strata::runtime {

using serialization::InstrKind;
using serialization::PlanInstruction;

Result<HostTensor> CudaPipelineRunner::join_pieces(TensorId id,
                                                   const std::vector<HostTensor> &pieces) const {
  auto shard = tp_shards_.find(id);
  if (shard == tp_shards_.end())
    return invalid_argument("'", graph_.tensor(id).name,
                            "' is not held in tensor-parallel pieces by this plan");
  return plan::join_pieces(graph_.tensor(id), shard->second, tensor_parallel_, pieces);
}

std::vector<TensorType> CudaPipelineRunner::batch_types() const {
  return pipeline_batch_types(graph_, int64_t{microbatches_} * data_parallel_);
}

TensorType CudaPipelineRunner::value_type(TensorId id) const {
  TensorType type = graph_.tensor(id).type;
  if (auto shard = tp_shards_.find(id); shard != tp_shards_.end())
    type.shape.assign(shard->second.full_shape.begin(), shard->second.full_shape.end());
  return type;
}

#if !STRATA_HAVE_CUDA

Result<CudaPipelineLayout> cuda_pipeline_layout(const serialization::Plan &, int64_t, bool,
                                                const std::vector<bool> &) {
  return unimplemented(cuda_unavailable_reason());
}
struct CudaPipelineRunner::State {};
CudaPipelineRunner::~CudaPipelineRunner() = default;
Result<std::unique_ptr<CudaPipelineRunner>>
CudaPipelineRunner::create(const serialization::Plan &, const CudaPipelineOptions &) {
  return unimplemented(cuda_unavailable_reason());
}
Status CudaPipelineRunner::run(llvm::ArrayRef<HostTensor>, std::vector<HostTensor> *) {
  return unimplemented(cuda_unavailable_reason());
}
const HostTensor &CudaPipelineRunner::value(TensorId) const {
  static const HostTensor empty;
  return empty;
}
Status CudaPipelineRunner::read_status() const { return unimplemented(cuda_unavailable_reason()); }
Status CudaPipelineRunner::assign(TensorId, const HostTensor &) {
  return unimplemented(cuda_unavailable_reason());
}

Result<std::map<std::string, HostTensor>> CudaPipelineRunner::checkpoint_pieces() const {
  return unimplemented(cuda_unavailable_reason());
}
int CudaPipelineRunner::num_devices() const { return 0; }
int64_t CudaPipelineRunner::device_bytes() const { return 0; }
int64_t CudaPipelineRunner::replays() const { return 0; }
int64_t CudaPipelineRunner::fused_chains() const { return 0; }
int CudaPipelineRunner::num_gpus() const { return 0; }
std::string CudaPipelineRunner::device_name() const { return ""; }

#else

namespace {

int64_t align_up(int64_t n) {
  constexpr int64_t a = GpuArenaLayout::kGpuAlignment;
  return (n + a - 1) / a * a;
}

// Nodes without inputs (Constant) are computed once on the CPU at load.
bool computed_at_load(const Node &node) {
  const ops::OpDef *def = ops::OpRegistry::global().find(node.op);
  return node.inputs.empty() && def != nullptr && def->cpu_kernel != nullptr &&
         cuda::find_cuda_op(node.op) == nullptr;
}

std::string instruction_context(const Graph &g, size_t device, size_t i,
                                const PlanInstruction &instr) {
  return str_cat("device ", device, " instruction ", i, " (",
                 plan::describe_instruction(g, instr), ")");
}

} // namespace

Result<CudaPipelineLayout> cuda_pipeline_layout(const serialization::Plan &plan,
                                                int64_t workspace_bytes, bool bf16,
                                                const std::vector<bool> &local) {
  if (!plan.pipeline) return invalid_argument("the plan has no pipeline (one device)");
  const Graph &g = plan.graph;
  const serialization::PlanPipeline &pipeline = *plan.pipeline;
  // The tensor-parallel nodes the runner itself runs.
  const bool tp = pipeline.tensor_parallel > 1;
  RETURN_IF_ERROR(check_cuda_ops(
      g,
      [tp](const Node &node) {
        return tp && (node.op == "TpCopy" || node.op == "TpSplit" || node.op == "TpAllReduce" ||
                      node.op == "TpAllGather" || node.op == "TpReduceScatter" ||
                      node.op == "TpAllToAll");
      },
      pipeline.tensor_parallel));
  if (workspace_bytes < 0) return invalid_argument("the workspace cannot be negative");
  if (!local.empty() && local.size() != plan.programs.size())
    return invalid_argument("the local set names ", local.size(), " devices; the plan has ",
                            plan.programs.size());
  const ops::OpRegistry &registry = ops::OpRegistry::global();
  CudaPipelineLayout l;
  l.workspace_bytes = workspace_bytes;
  int64_t at = 0;
  bool here = true; // the device being laid out is on this GPU
  auto place = [&](int64_t bytes) -> int64_t {
    if (!here) return -1;
    const int64_t offset = at;
    at += align_up(bytes);
    return offset;
  };
  for (size_t d = 0; d < plan.programs.size(); ++d) {
    const serialization::PlanProgram &program = plan.programs[d];
    if (program.device != d)
      return invalid_argument("pipeline plan: program ", d, " is for device ", program.device,
                              "; programs must be in device order");
    // ZeRO-1: tensors held as this device's shard of its shard group.
    int64_t shard_count = 1;
    if (!program.sharded_holds.empty()) {
      if (program.shard_group < 0 ||
          static_cast<size_t>(program.shard_group) >= pipeline.groups.size())
        return invalid_argument("device ", d, ": no shard group ", program.shard_group);
      shard_count =
          static_cast<int64_t>(pipeline.groups[static_cast<size_t>(program.shard_group)].size());
    }
    const std::set<TensorId> sharded(program.sharded_holds.begin(), program.sharded_holds.end());
    here = local.empty() || local[d];
    CudaPipelineLayout::Device device;
    device.arena_bytes = here ? program.arena_bytes : 0;
    device.arena = place(program.arena_bytes);
    for (TensorId id : program.holds) {
      if (id >= g.num_tensors())
        return invalid_argument("device ", d, " holds tensor ", id, "; the graph has ",
                                g.num_tensors());
      const int64_t bytes = g.tensor(id).type.size_bytes();
      if (here)
        device.held.push_back({id, place(sharded.contains(id) ? bytes / shard_count : bytes)});
    }
    device.send.assign(program.instructions.size(), -1);
    for (size_t i = 0; i < program.instructions.size(); ++i) {
      const PlanInstruction &instr = program.instructions[i];
      auto refuse = [&](auto &&...why) {
        return unimplemented(instruction_context(g, d, i, instr), ": ", why...);
      };
      switch (instr.kind) {
      case InstrKind::kCompute: {
        if (instr.index >= g.num_nodes())
          return invalid_argument(instruction_context(g, d, i, instr), ": no node ", instr.index);
        const Node &node = g.node(instr.index);
        if ((node.op == "TpAllReduce" || node.op == "TpReduceScatter") &&
            g.tensor(node.inputs[0]).type.dtype != DType::kF32)
          return refuse(g.tensor(node.inputs[0]).type.to_string(), " (f32 only so far)");
        if (!local.empty() && (node.op == "TpAllGather" || node.op == "TpReduceScatter"))
          device.tp_staging_bytes =
              std::max(device.tp_staging_bytes,
                       g.tensor(node.op == "TpAllGather" ? node.outputs[0] : node.inputs[0])
                           .type.size_bytes());
        // An all-to-all cuts its input into blocks there, and over NCCL
        // receives the others' blocks beside them.
        if (node.op == "TpAllToAll")
          device.tp_staging_bytes =
              std::max(device.tp_staging_bytes,
                       (local.empty() ? 1 : 2) * g.tensor(node.inputs[0]).type.size_bytes());
        const cuda::CudaOp *op = cuda::find_cuda_op(node.op);
        if (op == nullptr) break;
        std::vector<TensorType> types;
        for (TensorId t : node.inputs)
          types.push_back(g.tensor(t).type);
        if (bf16)
          device.bf16_bytes = std::max(device.bf16_bytes, cuda::half_staging_bytes(node, types));
        if (op->scratch != nullptr)
          device.scratch_bytes =
              std::max(device.scratch_bytes, op->scratch(node, *registry.find(node.op), types));
        break;
      }
      case InstrKind::kSend:
        if (instr.index >= g.num_tensors())
          return invalid_argument(instruction_context(g, d, i, instr), ": no tensor ", instr.index);
        device.send[i] = -2; // placed below, after the fixed regions
        break;
      case InstrKind::kRecv: break;
      case InstrKind::kAccumulate:
      case InstrKind::kScale:
      case InstrKind::kAllReduce:
      case InstrKind::kReduceScatter:
      case InstrKind::kAllGather:
        if (instr.index >= g.num_tensors())
          return invalid_argument(instruction_context(g, d, i, instr), ": no tensor ", instr.index);
        if (g.tensor(instr.index).type.dtype != DType::kF32)
          return refuse(g.tensor(instr.index).type.to_string(), " (f32 only so far)");
        break;
      case InstrKind::kUpdate: break;
      case InstrKind::kStartBucket:
      case InstrKind::kWaitBucket:
        if (instr.index >= program.buckets.size())
          return invalid_argument(instruction_context(g, d, i, instr), ": the program has ",
                                  program.buckets.size(), " buckets");

        for (TensorId t : program.buckets[instr.index].tensors)
          if (g.tensor(t).type.dtype != DType::kF32)
            return refuse("'", g.tensor(t).name, "' is ", g.tensor(t).type.to_string(),
                          " (f32 only so far)");
        break;
      case InstrKind::kComputeShard: {
        if (instr.index >= g.num_nodes())
          return invalid_argument(instruction_context(g, d, i, instr), ": no node ", instr.index);
        const Node &node = g.node(instr.index);
        const cuda::CudaOp *op = cuda::find_cuda_op(node.op);
        if (op == nullptr) return refuse("op ", node.op, " has no CUDA kernel");
        if (op->scratch != nullptr) {
          std::vector<TensorType> types;
          for (TensorId t : node.inputs)
            types.push_back(g.tensor(t).type); // the whole operands: at least the shard's need
          device.scratch_bytes =
              std::max(device.scratch_bytes, op->scratch(node, *registry.find(node.op), types));
        }
        break;
      }
      }
    }
    device.scratch = place(device.scratch_bytes);
    device.workspace = place(workspace_bytes);
    if (bf16) device.bf16 = place(device.bf16_bytes);
    if (device.tp_staging_bytes > 0) device.tp_staging = place(device.tp_staging_bytes);
    for (size_t i = 0; i < program.instructions.size(); ++i)
      if (device.send[i] == -2)
        device.send[i] = place(g.tensor(program.instructions[i].index).type.size_bytes());
    device.first_flag = l.flag_count;
    l.flag_count += static_cast<int64_t>(program.instructions.size());
    l.devices.push_back(std::move(device));
  }
  here = true;
  l.instruction_flags = l.flag_count;
  l.flag_count += 1; // the step's verdict: did any check fail?
  l.flags = place(l.flag_count * static_cast<int64_t>(sizeof(int)));
  l.constant.assign(g.num_nodes(), -1);
  for (NodeId n = 0; n < g.num_nodes(); ++n)
    if (computed_at_load(g.node(n)))
      l.constant[n] = place(g.tensor(g.node(n).outputs[0]).type.size_bytes());
  const int64_t batch = int64_t{pipeline.microbatches} * pipeline.data_parallel;
  for (TensorId id : g.inputs()) {
    const TensorType &type = g.tensor(id).type;
    l.input.push_back(place(type.rank() > 0 ? type.size_bytes() * batch : type.size_bytes()));
  }
  l.total = at;
  return l;
}

struct CudaPipelineRunner::State {
  CudaPipelineOptions options;
  std::string device_name;
  // A run over several GPUs has one State per GPU (its rank): the plan
  // devices on it (`local`, one flag per plan device), what it does at each
  // launch of the shared order (`steps`), and its NCCL communicators: `world`
  // over every rank for the point-to-point messages and the shared check
  // flags, and one per plan group spread over GPUs, holding its member here.
  // On one GPU `local` and `steps` are empty and there are no communicators.
  int gpu = 0, rank = 0;
  std::vector<bool> local;
  std::vector<GpuRankStep> steps;
  std::unique_ptr<NcclComm> world;
  std::map<int, std::unique_ptr<NcclComm>> group_comms;
  int *rank_any = nullptr;            // this GPU's checks and (after sharing) every GPU's
  cudaEvent_t flags_shared = nullptr; // rank_any is final
  bool flags_combined = false;        // this step's checks are in rank_any (while enqueueing)
  std::vector<cudaEvent_t> marks;     // per local device: its stream reached the sharing
  // The last NCCL call enqueued this step: its stream and an event after it.
  cudaStream_t nccl_stream = nullptr;
  cudaEvent_t nccl_done = nullptr;
  const std::atomic<bool> *stop = nullptr; // another rank failed: stop waiting
  CudaPipelineLayout layout;
  std::vector<serialization::PlanProgram> programs;
  std::vector<std::vector<int32_t>> groups; // the plan's
  std::vector<GpuLaunch> order;
  int64_t fused_chains = 0; // instances over this GPU's devices and micro-batches
  cudaStream_t origin = nullptr;
  cublasLtHandle_t lt = nullptr;
  std::byte *base = nullptr;
  std::vector<cudaEvent_t> events; // every event, destroyed with the state

  struct Op {
    InstrKind kind = InstrKind::kCompute;
    std::string what; // "device d instruction i (...)"
    // Compute.
    const Node *node = nullptr;
    const ops::OpDef *def = nullptr;
    const cuda::CudaOp *op = nullptr; // null: a copy of `source` (computed at load)
    std::vector<ops::ConstTensorView> inputs;
    std::vector<ops::TensorView> outputs;
    std::shared_ptr<void> *cache = nullptr;
    int *flag = nullptr;
    // An elementwise chain run as one kernel: its last node runs `fused`, the
    // others are skipped.
    bool skip = false;
    std::shared_ptr<cuda::Fused> fused;
    // Transfers, accumulate, scale, update: `data` is written (or sent from).
    std::byte *data = nullptr;
    const std::byte *source = nullptr;
    std::byte *staging = nullptr; // send: where the message waits
    size_t bytes = 0;
    bool first = false;
    cudaEvent_t sent = nullptr;    // send: recorded after the staging copy
    const Op *matching = nullptr;  // recv: its send
    std::vector<float *> bucket;   // StartBucket: the bucket's buffers
    std::vector<size_t> counts;    // StartBucket: their element counts
    bool reduce_scatter = false;   // StartBucket: ZeRO-1's bucket (each member its chunks)
    cudaEvent_t arrived = nullptr; // collectives: this member is there
    // A tensor-parallel node: what it does, this device's position in its
    // group, and the pieces' layout (plan::piece_layout).
    enum class Tp : uint8_t {
      kNone,
      kCopy,
      kSplit,
      kAllReduce,
      kAllGather,
      kReduceScatter,
      kAllToAll
    };
    Tp tp = Tp::kNone;
    int member = 0, parts = 1;
    size_t rows = 1, run = 0;
    // An all-to-all: its input cut along `axis` (rows x run) and its output
    // placed along `from_axis` (place_rows x place_run), `block` bytes each.
    size_t place_rows = 1, place_run = 0, block = 0;
    cudaEvent_t *reduced = nullptr; // AllReduce, Start/WaitBucket: the sum is done
  };
  struct Device {
    cudaStream_t stream = nullptr, side = nullptr;
    void *cudnn = nullptr;
    void *scratch = nullptr, *workspace = nullptr, *bf16 = nullptr;
    int64_t scratch_bytes = 0;
    void *tp_staging = nullptr; // over NCCL: column-block pieces laid out for it
    int *flags = nullptr;       // its instructions' flags
    bool checked = false;       // waits for the step's verdict before its first update
    std::vector<Op> ops;
    std::map<TensorId, std::byte *> held;
    // Per node and micro-batch: its kernel plan (a plan is valid for the
    // buffers it was made for, and each micro-batch has its own).
    std::map<std::pair<NodeId, int32_t>, std::shared_ptr<void>> caches;
    std::map<uint32_t, cudaEvent_t> bucket_done; // per bucket
    // ZeRO-1: the tensors it holds as its shard, its position in its shard
    // group and the group's size; the flat shard types of ComputeShard's views.
    std::set<TensorId> sharded;
    int shard_rank = 0, shard_count = 1;
    std::deque<TensorType> shard_types;
  };
  std::vector<Device> devices;
  std::deque<cudaEvent_t> reduced; // one per collective launch (stable addresses)
  cudaEvent_t fork = nullptr;
  int *flags = nullptr; // every device's, then the "any" ints
  int64_t flag_count = 0;
  std::vector<cudaEvent_t> joins; // two per device (compute, side)
  std::vector<std::byte *> input_staging;
  std::vector<size_t> input_bytes;
  struct Output {
    int device = 0;
    const std::byte *data = nullptr;
  };
  std::vector<Output> outputs;
  CapturedStep step;
  bool failed = false;
  mutable std::map<TensorId, HostTensor> host; // value()'s copies, until the next step
  mutable Status read_error; // rank 0's: the first value() since the step that failed
  double issue_seconds = 0;  // the last run()'s launch_rank, on its host thread

  bool is_local(size_t d) const { return local.empty() || local[d]; }

  // Ends the communicators at once, so that no GPU waits for a peer that
  // will not come (a failed or stalled rank).
  void abort_comms() {
    for (auto &[group, comm] : group_comms)
      if (comm) comm->abort();
    if (world) world->abort();
  }

  // What a bounded wait also watches over NCCL: the communicators' errors and
  // the other ranks' failures.
  Status watch() const {
    if (stop != nullptr && stop->load()) return aborted_by_peer();
    if (options.watch) RETURN_IF_ERROR(options.watch());
    if (world) RETURN_IF_ERROR(nccl_async_error(*world, str_cat("on GPU ", gpu)));
    for (const auto &[group, comm] : group_comms)
      if (comm) RETURN_IF_ERROR(nccl_async_error(*comm, str_cat("group ", group, " on GPU ", gpu)));
    return Status::ok();
  }
  Status aborted_by_peer() const {
    return failed_precondition("GPU ", gpu, " stopped: another GPU of the run failed");
  }

  ~State() {
    cudaSetDevice(gpu);
    if (failed || stuck) abort_comms();
    // A step that ran out of time may still be running (or hung): after the
    // comms are aborted it gets a short, bounded wait; if it still has not
    // finished, memory and handles are left alone rather than freed, since
    // cudaFree and cudnnDestroy would wait for it unbounded.
    if (stuck && !wait_for_stream(origin, "teardown", std::chrono::seconds(2)).is_ok()) return;
    step.reset(); // the graph goes before the streams and memory it uses
    group_comms.clear();
    world.reset();
    for (cudaEvent_t event : events)
      cudaEventDestroy(event);
    for (Device &device : devices) {
      cuda::destroy_cudnn(device.cudnn);
      if (device.stream) cudaStreamDestroy(device.stream);
      if (device.side) cudaStreamDestroy(device.side);
    }
    if (lt) cublasLtDestroy(lt);
    if (origin) cudaStreamDestroy(origin);
    if (base) cudaFree(base);
  }

  Result<cudaEvent_t> make_event() {
    cudaEvent_t event = nullptr;
    RETURN_IF_ERROR(cuda_check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "event"));
    events.push_back(event);
    return event;
  }

  // Waits for the origin stream (which every step joins back into), bounded.
  Status wait(std::string_view what) const {
    Status status =
        steps.empty() ? wait_for_stream(origin, what, options.timeout)
                      : wait_for_stream(origin, what, options.timeout, [this] { return watch(); });
    if (status.code() != StatusCode::kDeadlineExceeded) return status;
    stuck = true;
    // Launched eagerly (not replayed), each device's join events say which
    // devices have not finished their part of the step.
    if (step.replays_next() || joins.empty()) return status;
    std::string unfinished;
    for (size_t d = 0; d < devices.size(); ++d)
      if (is_local(d) && (cudaEventQuery(joins[2 * d]) == cudaErrorNotReady ||
                          cudaEventQuery(joins[2 * d + 1]) == cudaErrorNotReady))
        unfinished += str_cat(unfinished.empty() ? "" : ", ", d);
    if (unfinished.empty()) return status;
    return std::move(status).with_context(str_cat("devices not finished: ", unfinished));
  }
  mutable bool stuck = false; // a wait ran out of time (see ~State)

  Status copy(void *to, const void *from, size_t bytes, cudaStream_t stream) {
    if (bytes == 0 || to == from) return Status::ok();
    return cuda_check(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stream), "copy");
  }

  // `rows` rows of `width` bytes, `from_pitch` apart, to `to_pitch` apart.
  Status copy_block(void *to, size_t to_pitch, const void *from, size_t from_pitch, size_t width,
                    size_t rows, cudaStream_t stream) {
    if (width == 0 || rows == 0) return Status::ok();
    if (rows == 1) return copy(to, from, width, stream); // no pitch limit
    return cuda_check(cudaMemcpy2DAsync(to, to_pitch, from, from_pitch, width, rows,
                                        cudaMemcpyDeviceToDevice, stream),
                      "copy");
  }

  // A tensor-parallel node that communicates, on every member of its group at
  // once: each member's input is ready (its `arrived`), the first member's
  // stream moves or sums the pieces, and every member waits for it.
  Status run_tensor_parallel(const GpuLaunch &launch) {
    const GpuLaunch::Part &lead = launch.parts[0];
    Device &first_device = devices[static_cast<size_t>(lead.device)];
    Op &first = first_device.ops[lead.instruction];
    cudaStream_t stream = first_device.stream;
    std::vector<Op *> members;
    for (const GpuLaunch::Part &part : launch.parts) {
      Device &member = devices[static_cast<size_t>(part.device)];
      members.push_back(&member.ops[part.instruction]);
      RETURN_IF_ERROR(
          cuda_check(cudaEventRecord(members.back()->arrived, member.stream), "event record"));
      RETURN_IF_ERROR(
          cuda_check(cudaStreamWaitEvent(stream, members.back()->arrived, 0), "event wait"));
    }
    const size_t parts = members.size();
    auto in = [&](size_t m) { return static_cast<const std::byte *>(members[m]->inputs[0].data); };
    auto out = [&](size_t m) { return static_cast<std::byte *>(members[m]->outputs[0].data); };
    switch (first.tp) {
    case Op::Tp::kAllReduce: {
      cuda::Members sum;
      sum.count = sum.outs = static_cast<int>(parts);
      for (size_t m = 0; m < parts; ++m) {
        sum.in[m] = reinterpret_cast<const float *>(in(m));
        sum.out[m] = reinterpret_cast<float *>(out(m));
      }
      RETURN_IF_ERROR(cuda_check(
          cuda::sum_members(sum, members[0]->inputs[0].type->num_elements(), stream), "launch"));
      break;
    }
    case Op::Tp::kAllGather: // member r's piece is column block r of every member's output
      for (size_t m = 0; m < parts; ++m)
        for (size_t r = 0; r < parts; ++r)
          RETURN_IF_ERROR(copy_block(out(m) + r * first.run, parts * first.run, in(r), first.run,
                                     first.run, first.rows, stream));
      break;
    case Op::Tp::kReduceScatter: { // member m gets the sum of column block m
      const auto run = static_cast<int64_t>(first.run / sizeof(float));
      for (size_t m = 0; m < parts; ++m) {
        cuda::Members sum;
        sum.count = static_cast<int>(parts);
        sum.outs = 1;
        for (size_t r = 0; r < parts; ++r)
          sum.in[r] = reinterpret_cast<const float *>(in(r));
        sum.out[0] = reinterpret_cast<float *>(out(m));
        RETURN_IF_ERROR(cuda_check(cuda::sum_members_block(sum, static_cast<int64_t>(first.rows),
                                                           run, static_cast<int64_t>(parts) * run,
                                                           static_cast<int64_t>(m) * run, stream),
                                   "launch"));
      }
      break;
    }
    case Op::Tp::kAllToAll: {
      // Each member's input cut into contiguous blocks (block j for member
      // j) in its staging; then member r's output piece j is member j's
      // block r.
      auto staging = [&](size_t m) {
        return static_cast<std::byte *>(
            devices[static_cast<size_t>(launch.parts[m].device)].tp_staging);
      };
      for (size_t m = 0; m < parts; ++m)
        for (size_t j = 0; j < parts; ++j)
          RETURN_IF_ERROR(copy_block(staging(m) + j * first.block, first.run, in(m) + j * first.run,
                                     parts * first.run, first.run, first.rows, stream));
      for (size_t r = 0; r < parts; ++r)
        for (size_t j = 0; j < parts; ++j)
          RETURN_IF_ERROR(copy_block(out(r) + j * first.place_run, parts * first.place_run,
                                     staging(j) + r * first.block, first.place_run, first.place_run,
                                     first.place_rows, stream));
      break;
    }
    default: return internal_error(first.what, ": not a tensor-parallel collective");
    }
    RETURN_IF_ERROR(cuda_check(cudaEventRecord(*first.reduced, stream), "event record"));
    for (const GpuLaunch::Part &part : launch.parts)
      if (part.device != lead.device)
        RETURN_IF_ERROR(
            cuda_check(cudaStreamWaitEvent(devices[static_cast<size_t>(part.device)].stream,
                                           *first.reduced, 0),
                       "event wait"));
    return Status::ok();
  }

  // One instruction of one device (not a collective) on its stream.
  Status run_one(Device &device, Op &op, float divisor) {
    cudaStream_t stream = device.stream;
    switch (op.kind) {
    case InstrKind::kCompute:
    case InstrKind::kComputeShard: {
      if (op.tp == Op::Tp::kCopy)
        return copy(op.outputs[0].data, op.inputs[0].data,
                    static_cast<size_t>(op.inputs[0].type->size_bytes()), stream);
      if (op.tp == Op::Tp::kSplit) // this member's column block of every row
        return copy_block(op.outputs[0].data, op.run,
                          static_cast<const std::byte *>(op.inputs[0].data) + op.member * op.run,
                          op.parts * op.run, op.run, op.rows, stream);
      if (op.skip) return Status::ok();
      if (op.fused)
        return cuda_check(cuda::fused_elementwise(*op.fused,
                                                  static_cast<float *>(op.outputs[0].data),
                                                  op.outputs[0].type->num_elements(), stream),
                          "launch");
      if (op.op == nullptr)
        return copy(op.outputs[0].data, op.source,
                    static_cast<size_t>(op.outputs[0].type->size_bytes()), stream);
      cuda::CudaKernelContext context{*op.node,
                                      *op.def,
                                      op.inputs,
                                      op.outputs,
                                      stream,
                                      lt,
                                      device.workspace,
                                      static_cast<size_t>(options.workspace_bytes),
                                      device.scratch,
                                      op.flag,
                                      options.tf32,
                                      device.cudnn,
                                      op.cache,
                                      device.bf16,
                                      options.f16,
                                      op.member,
                                      op.parts,
                                      options.cudnn_pool_norm,
                                      device.scratch_bytes};
      return op.op->kernel(context);
    }
    case InstrKind::kSend:
      RETURN_IF_ERROR(copy(op.staging, op.data, op.bytes, stream));
      return cuda_check(cudaEventRecord(op.sent, stream), "event record");
    case InstrKind::kRecv:
      RETURN_IF_ERROR(cuda_check(cudaStreamWaitEvent(stream, op.matching->sent, 0), "event wait"));
      return copy(op.data, op.matching->staging, op.bytes, stream);
    case InstrKind::kAccumulate:
      if (op.first) return copy(op.data, op.source, op.bytes, stream);
      return cuda_check(cuda::accumulate(reinterpret_cast<float *>(op.data),
                                         reinterpret_cast<const float *>(op.source),
                                         static_cast<int64_t>(op.bytes / sizeof(float)), stream),
                        "launch");
    case InstrKind::kScale:
      return cuda_check(cuda::divide(reinterpret_cast<float *>(op.data), divisor,
                                     static_cast<int64_t>(op.bytes / sizeof(float)), stream),
                        "launch");

    case InstrKind::kWaitBucket:
      return cuda_check(cudaStreamWaitEvent(stream, *op.reduced, 0), "event wait");
    default: return internal_error("instruction enqueued out of its launch");
    }
  }

  // A group's sum, on `stream` after every member's `arrived` event, then
  // `reduced`: the members' buffers added in group order into each of them
  // (all-reduce), or into member m's chunk m only (reduce-scatter, ZeRO-1:
  // chunk m of n elements is [m n / p, (m + 1) n / p)).
  Status sum_group(const GpuLaunch &launch, cudaStream_t stream, bool scatter) {
    const GpuLaunch::Part &lead = launch.parts[0];
    Op &first = devices[static_cast<size_t>(lead.device)].ops[lead.instruction];
    const size_t p = launch.parts.size();
    for (const GpuLaunch::Part &part : launch.parts)
      RETURN_IF_ERROR(cuda_check(
          cudaStreamWaitEvent(
              stream, devices[static_cast<size_t>(part.device)].ops[part.instruction].arrived, 0),
          "event wait"));
    auto member = [&](size_t m) -> Op & {
      return devices[static_cast<size_t>(launch.parts[m].device)].ops[launch.parts[m].instruction];
    };
    const size_t tensors = launch.reduce ? first.bucket.size() : 1;
    for (size_t t = 0; t < tensors; ++t) {
      auto data = [&](size_t m) {
        return launch.reduce ? member(m).bucket[t] : reinterpret_cast<float *>(member(m).data);
      };
      const size_t n = launch.reduce ? first.counts[t] : first.bytes / sizeof(float);
      for (size_t c = 0; c < (scatter ? p : 1); ++c) {
        const size_t begin = scatter ? chunk_begin(n, p, c) : 0;
        const size_t end = scatter ? chunk_begin(n, p, c + 1) : n;
        cuda::Members members;
        members.count = static_cast<int>(p);
        for (size_t m = 0; m < p; ++m) {
          members.in[m] = data(m) + begin;
          if (!scatter) members.out[members.outs++] = data(m);
        }
        if (scatter) members.out[members.outs++] = data(c) + begin;
        RETURN_IF_ERROR(cuda_check(
            cuda::sum_members(members, static_cast<int64_t>(end - begin), stream), "launch"));
      }
    }
    return cuda_check(cudaEventRecord(*first.reduced, stream), "event record");
  }

  // ZeRO-1's all-gather: member m's chunk m of the tensor copied into every
  // other member's buffer, on `stream` after every member's `arrived`.
  Status gather_group(const GpuLaunch &launch, cudaStream_t stream) {
    const GpuLaunch::Part &lead = launch.parts[0];
    Op &first = devices[static_cast<size_t>(lead.device)].ops[lead.instruction];
    const size_t p = launch.parts.size(), n = first.bytes / sizeof(float);
    std::vector<std::byte *> data;
    for (const GpuLaunch::Part &part : launch.parts) {
      Op &op = devices[static_cast<size_t>(part.device)].ops[part.instruction];
      RETURN_IF_ERROR(cuda_check(cudaStreamWaitEvent(stream, op.arrived, 0), "event wait"));
      data.push_back(op.data);
    }
    for (size_t m = 0; m < p; ++m) {
      const size_t begin = chunk_begin(n, p, m) * sizeof(float);
      const size_t bytes = chunk_begin(n, p, m + 1) * sizeof(float) - begin;
      for (size_t r = 0; r < p; ++r)
        if (r != m) RETURN_IF_ERROR(copy(data[r] + begin, data[m] + begin, bytes, stream));
    }
    return cuda_check(cudaEventRecord(*first.reduced, stream), "event record");
  }

  // One launch of the order (gpu_placement.h's GpuLaunch).
  Status run_launch(const GpuLaunch &launch, float divisor) {
    const GpuLaunch::Part &lead = launch.parts[0];
    Device &device = devices[static_cast<size_t>(lead.device)];
    Op &op = device.ops[lead.instruction];
    if (launch.reduce) // a bucket, on its first member's second stream
      return sum_group(launch, device.side, op.reduce_scatter);
    if (op.kind == InstrKind::kCompute && launch.parts.size() > 1)
      return run_tensor_parallel(launch);
    switch (op.kind) {
    case InstrKind::kStartBucket: // this member is there; its stream goes on
      return cuda_check(cudaEventRecord(op.arrived, device.stream), "event record");
    case InstrKind::kAllReduce:
    case InstrKind::kReduceScatter:
    case InstrKind::kAllGather: {
      // Every member stops until the collective, which its first member's
      // stream runs.
      for (const GpuLaunch::Part &part : launch.parts) {
        Device &member = devices[static_cast<size_t>(part.device)];
        RETURN_IF_ERROR(cuda_check(
            cudaEventRecord(member.ops[part.instruction].arrived, member.stream), "event record"));
      }
      RETURN_IF_ERROR(op.kind == InstrKind::kAllGather
                          ? gather_group(launch, device.stream)
                          : sum_group(launch, device.stream, op.kind == InstrKind::kReduceScatter));
      for (const GpuLaunch::Part &part : launch.parts)
        if (part.device != lead.device)
          RETURN_IF_ERROR(cuda_check(
              cudaStreamWaitEvent(devices[static_cast<size_t>(part.device)].stream, *op.reduced, 0),
              "event wait"));
      return Status::ok();
    }
    case InstrKind::kUpdate:
      if (!device.checked) {
        // The checks were combined once, at the step's first update (on one
        // GPU here, over several by share_flags): every device's updates read
        // that one verdict, so all of them are skipped or none.
        if (steps.empty() && !flags_combined) {
          RETURN_IF_ERROR(combine_local_flags());
          RETURN_IF_ERROR(cuda_check(
              cudaEventRecord(flags_shared, devices.at(first_local()).stream), "event record"));
        }
        RETURN_IF_ERROR(
            cuda_check(cudaStreamWaitEvent(device.stream, flags_shared, 0), "event wait"));
        device.checked = true;
      }
      return cuda_check(cuda::guarded_copy(op.data, op.source, static_cast<int64_t>(op.bytes),
                                           rank_any, device.stream),
                        "launch");
    default: return run_one(device, op, divisor);
    }
  }

  // A group's position of `device`.
  size_t position(int group, int device) const {
    const auto &members = groups.at(static_cast<size_t>(group));
    return static_cast<size_t>(std::find(members.begin(), members.end(), device) - members.begin());
  }

#if STRATA_HAVE_NCCL
  // An NCCL call's result, settled (non-blocking communicators may still be
  // enqueueing it), bounded by the run's timeout.
  Status nccl(NcclComm &comm, ncclResult_t result, std::string_view what) {
    return nccl_settle(comm, result, what, options.timeout, [this]() -> Status {
      if (stop != nullptr && stop->load()) return aborted_by_peer();
      return options.watch ? options.watch() : Status::ok();
    });
  }

  // Every NCCL call of this GPU starts after the one enqueued before it,
  // whatever its stream: the calls are already in the same global order on
  // every rank, and chained they never need two communicators' kernels
  // resident at once (which NCCL warns can deadlock when they do not fit).
  Status nccl_after_last(cudaStream_t stream) {
    if (nccl_stream == nullptr || nccl_stream == stream) return Status::ok();
    return cuda_check(cudaStreamWaitEvent(stream, nccl_done, 0), "event wait");
  }
  Status nccl_mark(cudaStream_t stream) {
    nccl_stream = stream;
    return cuda_check(cudaEventRecord(nccl_done, stream), "event record");
  }
  static ncclComm_t handle(const NcclComm &comm) { return static_cast<ncclComm_t>(comm.handle()); }

  // The first device this GPU runs.
  size_t first_local() const {
    for (size_t d = 0; d < devices.size(); ++d)
      if (is_local(d)) return d;
    return devices.size();
  }

  // The checks of every local device so far, into rank_any (on the first
  // local device's stream, after every other local device's work so far).
  // At the step's first update: every forward check precedes every update
  // through the transfers; a backward check of another stage may come later
  // (today those repeat forward checks: an index the forward Gather already
  // flagged), and is then missed by every device alike.
  Status combine_local_flags() {
    const size_t first = first_local();
    cudaStream_t stream = devices.at(first).stream;
    for (size_t d = first + 1; d < devices.size(); ++d) {
      if (!is_local(d)) continue;
      RETURN_IF_ERROR(cuda_check(cudaEventRecord(marks[d], devices[d].stream), "event record"));
      RETURN_IF_ERROR(cuda_check(cudaStreamWaitEvent(stream, marks[d], 0), "event wait"));
    }
    flags_combined = true;
    return cuda_check(cuda::any_flag(flags, layout.instruction_flags, rank_any, stream), "launch");
  }

  // The step's first update, over several GPUs: every local device's checks
  // so far (combine_local_flags), then every GPU's (the maximum over
  // `world`), into rank_any, which every local update then reads
  // (run_launch's kUpdate).
  Status share_flags() {
    RETURN_IF_ERROR(combine_local_flags());
    cudaStream_t stream = devices.at(first_local()).stream;
    RETURN_IF_ERROR(nccl_after_last(stream));
    RETURN_IF_ERROR(nccl(
        *world, ncclAllReduce(rank_any, rank_any, 1, ncclInt32, ncclMax, handle(*world), stream),
        "all-reduce of the check flags"));
    RETURN_IF_ERROR(nccl_mark(stream));
    return cuda_check(cudaEventRecord(flags_shared, stream), "event record");
  }

  // This GPU's member of a collective whose group is spread over GPUs: the
  // NCCL call on the group's communicator. Sums are NCCL's (its order, not
  // the CPU communicator's: equal to rounding).
  Status run_nccl_collective(const GpuLaunch &launch, const GpuRankStep &step) {
    auto found = group_comms.find(step.group);
    if (found == group_comms.end() || !found->second)
      return internal_error("no NCCL communicator for group ", step.group);
    NcclComm &comm = *found->second;
    const ncclComm_t c = handle(comm);
    Device &device = devices[static_cast<size_t>(step.part.device)];
    Op &op = device.ops[step.part.instruction];
    const size_t p = groups.at(static_cast<size_t>(step.group)).size();
    const size_t m = position(step.group, step.part.device);
    if (launch.reduce) { // a bucket, beside the backward on the second stream
      RETURN_IF_ERROR(cuda_check(cudaStreamWaitEvent(device.side, op.arrived, 0), "event wait"));
      RETURN_IF_ERROR(nccl(comm, ncclGroupStart(), "group start"));
      Status status = Status::ok();
      for (size_t t = 0; t < op.bucket.size() && status.is_ok(); ++t) {
        float *data = op.bucket[t];
        const size_t n = op.counts[t], chunk = n / p;
        status = nccl(comm,
                      op.reduce_scatter
                          ? ncclReduceScatter(data, data + m * chunk, chunk, ncclFloat32, ncclSum,
                                              c, device.side)
                          : ncclAllReduce(data, data, n, ncclFloat32, ncclSum, c, device.side),
                      "bucket reduction");
      }
      Status ended = nccl(comm, ncclGroupEnd(), "bucket reduction");
      RETURN_IF_ERROR(status);
      RETURN_IF_ERROR(ended);
      return cuda_check(cudaEventRecord(*op.reduced, device.side), "event record");
    }
    cudaStream_t stream = device.stream;
    const size_t n = op.bytes / sizeof(float), chunk = n / p;
    auto *data = reinterpret_cast<float *>(op.data);
    switch (op.kind) {
    case InstrKind::kAllReduce:
      return nccl(comm, ncclAllReduce(data, data, n, ncclFloat32, ncclSum, c, stream),
                  "all-reduce");
    case InstrKind::kReduceScatter: // in place: member m keeps chunk m's sum
      return nccl(comm,
                  ncclReduceScatter(data, data + m * chunk, chunk, ncclFloat32, ncclSum, c, stream),
                  "reduce-scatter");
    case InstrKind::kAllGather: // in place: member m's chunk m to everyone
      return nccl(comm, ncclAllGather(data + m * chunk, data, chunk, ncclFloat32, c, stream),
                  "all-gather");
    default: break;
    }
    // A tensor-parallel node. Pieces that are column blocks (rows > 1) go
    // through the staging, where NCCL's contiguous blocks are laid out.
    const void *in = op.inputs.at(0).data;
    void *out = op.outputs.at(0).data;
    auto *staging = static_cast<std::byte *>(device.tp_staging);
    const size_t piece = op.rows * op.run;
    switch (op.tp) {
    case Op::Tp::kAllReduce:
      return nccl(comm,
                  ncclAllReduce(in, out, static_cast<size_t>(op.inputs[0].type->num_elements()),
                                ncclFloat32, ncclSum, c, stream),
                  "tensor-parallel all-reduce");
    case Op::Tp::kAllGather:
      if (op.rows == 1)
        return nccl(comm, ncclAllGather(in, out, op.run, ncclUint8, c, stream),
                    "tensor-parallel all-gather");
      RETURN_IF_ERROR(nccl(comm, ncclAllGather(in, staging, piece, ncclUint8, c, stream),
                           "tensor-parallel all-gather"));
      for (size_t r = 0; r < p; ++r)
        RETURN_IF_ERROR(copy_block(static_cast<std::byte *>(out) + r * op.run, p * op.run,
                                   staging + r * piece, op.run, op.run, op.rows, stream));
      return Status::ok();
    case Op::Tp::kReduceScatter:
      if (op.rows == 1)
        return nccl(
            comm,
            ncclReduceScatter(in, out, op.run / sizeof(float), ncclFloat32, ncclSum, c, stream),
            "tensor-parallel reduce-scatter");
      for (size_t r = 0; r < p; ++r)
        RETURN_IF_ERROR(copy_block(staging + r * piece, op.run,
                                   static_cast<const std::byte *>(in) + r * op.run, p * op.run,
                                   op.run, op.rows, stream));
      return nccl(
          comm,
          ncclReduceScatter(staging, out, piece / sizeof(float), ncclFloat32, ncclSum, c, stream),
          "tensor-parallel reduce-scatter");
    case Op::Tp::kAllToAll: {
      // This member's input cut into blocks (block j for member j), the
      // others' blocks for it received beside them, then placed.
      std::byte *outgoing = staging, *incoming = staging + p * op.block;
      for (size_t j = 0; j < p; ++j)
        RETURN_IF_ERROR(copy_block(outgoing + j * op.block, op.run,
                                   static_cast<const std::byte *>(in) + j * op.run, p * op.run,
                                   op.run, op.rows, stream));
      RETURN_IF_ERROR(nccl(comm, ncclGroupStart(), "group start"));
      Status status = Status::ok();
      for (size_t j = 0; j < p && status.is_ok(); ++j) {
        if (j == m) continue;
        const int peer = static_cast<int>(j);
        status = nccl(comm, ncclSend(outgoing + j * op.block, op.block, ncclUint8, peer, c, stream),
                      "tensor-parallel all-to-all");
        if (status.is_ok())
          status =
              nccl(comm, ncclRecv(incoming + j * op.block, op.block, ncclUint8, peer, c, stream),
                   "tensor-parallel all-to-all");
      }
      Status ended = nccl(comm, ncclGroupEnd(), "tensor-parallel all-to-all");
      RETURN_IF_ERROR(status);
      RETURN_IF_ERROR(ended);
      for (size_t j = 0; j < p; ++j)
        RETURN_IF_ERROR(copy_block(static_cast<std::byte *>(out) + j * op.place_run,
                                   p * op.place_run, (j == m ? outgoing : incoming) + j * op.block,
                                   op.place_run, op.place_run, op.place_rows, stream));
      return Status::ok();
    }
    default: return internal_error(op.what, ": not a collective NCCL runs");
    }
  }
#endif

  // One launch on this GPU of a run over several: as on one GPU where every
  // part is here, NCCL where the launch crosses GPUs (gpu_rank_steps).
  Status run_rank_step(const GpuLaunch &launch, const GpuRankStep &step, float divisor) {
#if STRATA_HAVE_NCCL
    if (step.share_flags) RETURN_IF_ERROR(share_flags());
    switch (step.action) {
    case GpuRankAction::kSkip: return Status::ok();
    case GpuRankAction::kLocal: return run_launch(launch, divisor);
    case GpuRankAction::kNcclSend: {
      // The message staged at its send (on the sender's stream); the second
      // stream sends it, so the sender's compute goes on.
      Device &from = devices[static_cast<size_t>(step.part.device)];
      Op &send = from.ops[step.part.instruction];
      RETURN_IF_ERROR(cuda_check(cudaStreamWaitEvent(from.side, send.sent, 0), "event wait"));
      RETURN_IF_ERROR(nccl_after_last(from.side));
      RETURN_IF_ERROR(
          nccl(*world,
               ncclSend(send.staging, send.bytes, ncclUint8, step.peer, handle(*world), from.side),
               str_cat("send to GPU rank ", step.peer)));
      return nccl_mark(from.side);
    }
    case GpuRankAction::kNcclRecv: {
      Device &to = devices[static_cast<size_t>(step.part.device)];
      Op &recv = to.ops[step.part.instruction];
      RETURN_IF_ERROR(nccl_after_last(to.stream));
      RETURN_IF_ERROR(nccl(
          *world, ncclRecv(recv.data, recv.bytes, ncclUint8, step.peer, handle(*world), to.stream),
          str_cat("receive from GPU rank ", step.peer)));
      return nccl_mark(to.stream);
    }
    case GpuRankAction::kNcclCollective: {
      // A bucket on the member's second stream, the rest on its compute one.
      Device &member = devices[static_cast<size_t>(step.part.device)];
      cudaStream_t stream = launch.reduce ? member.side : member.stream;
      RETURN_IF_ERROR(nccl_after_last(stream));
      RETURN_IF_ERROR(run_nccl_collective(launch, step));
      return nccl_mark(stream);
    }
    }
    return internal_error("unknown rank step");
#else
    (void)launch, (void)step, (void)divisor;
    return unimplemented("this strata was built without NCCL");
#endif
  }

  // Everything one step does on the GPU: fork every stream from the origin,
  // the launches, join them back (also after a failed launch, so no stream is
  // left running past the origin).
  Status enqueue(float divisor) {
    RETURN_IF_ERROR(
        cuda_check(cudaMemsetAsync(flags, 0, static_cast<size_t>(flag_count) * sizeof(int), origin),
                   "memset"));
    RETURN_IF_ERROR(cuda_check(cudaEventRecord(fork, origin), "event record"));
    nccl_stream = nullptr;
    flags_combined = false;
    Status status = Status::ok();
    for (size_t d = 0; d < devices.size(); ++d) {
      if (!is_local(d)) continue;
      Device &device = devices[d];
      device.checked = false;
      if (status.is_ok())
        status = cuda_check(cudaStreamWaitEvent(device.stream, fork, 0), "event wait");
      if (status.is_ok())
        status = cuda_check(cudaStreamWaitEvent(device.side, fork, 0), "event wait");
    }
    for (size_t k = 0; k < order.size() && status.is_ok(); ++k) {
      const GpuLaunch &launch = order[k];
      status =
          steps.empty() ? run_launch(launch, divisor) : run_rank_step(launch, steps[k], divisor);
      if (!status.is_ok()) {
        // Name an instruction of this GPU's where the launch has one.
        const GpuLaunch::Part part = steps.empty() ? launch.parts[0] : steps[k].part;
        const Device &device = devices[static_cast<size_t>(part.device)];
        status = std::move(status).with_context(part.instruction < device.ops.size()
                                                    ? device.ops[part.instruction].what
                                                    : str_cat("launch ", k));
      }
    }
    for (size_t d = 0; d < devices.size(); ++d) {
      if (!is_local(d)) continue;
      Status joined = cuda_check(cudaEventRecord(joins[2 * d], devices[d].stream), "event record");
      if (joined.is_ok())
        joined = cuda_check(cudaEventRecord(joins[2 * d + 1], devices[d].side), "event record");
      if (joined.is_ok())
        joined = cuda_check(cudaStreamWaitEvent(origin, joins[2 * d], 0), "event wait");
      if (joined.is_ok())
        joined = cuda_check(cudaStreamWaitEvent(origin, joins[2 * d + 1], 0), "event wait");
      if (status.is_ok()) status = joined;
    }
    return status;
  }

  CaptureRecord record(const Graph &g) const {
    CaptureRecord r;
    for (size_t k = 0; k < input_staging.size(); ++k)
      r.add(str_cat("the batch of '", g.tensor(g.inputs()[k]).name, "'"), input_staging[k],
            g.tensor(g.inputs()[k]).type);
    for (size_t d = 0; d < devices.size(); ++d)
      for (const auto &[id, address] : devices[d].held)
        r.add(str_cat("device ", d, ": '", g.tensor(id).name, "'"), address, g.tensor(id).type);
    return r;
  }
};

CudaPipelineRunner::~CudaPipelineRunner() = default;

Result<std::unique_ptr<CudaPipelineRunner>>
CudaPipelineRunner::create(const serialization::Plan &plan, const CudaPipelineOptions &options) {
  if (!plan.pipeline)
    return invalid_argument("the plan has no pipeline (compile it with --mesh or --microbatches)");
  const std::string context = str_cat("CUDA pipeline of graph '", plan.graph.name(), "'");
  const ops::OpRegistry &registry = ops::OpRegistry::global();
  RETURN_IF_ERROR(verify_graph(plan.graph, registry).with_context(context));
  RETURN_IF_ERROR(check_pipeline_inputs(plan.graph, int64_t{plan.pipeline->microbatches} *
                                                        plan.pipeline->data_parallel)
                      .with_context(context));
  RETURN_IF_ERROR(plan::check_deadlock(plan.graph, plan.programs, plan.pipeline->groups)
                      .with_context(context));
  if (options.bf16 && options.f16)
    return invalid_argument("bf16 or f16 GEMM operands, not both").with_context(context);
  const size_t num_devices = plan.programs.size();
  const auto &groups = plan.pipeline->groups;
  const int tensor_parallel = plan.pipeline->tensor_parallel;
  auto order = gpu_launch_order(plan.graph, plan.programs, groups, tensor_parallel,
                                plan.pipeline->tp_groups_begin);
  if (!order.is_ok()) return order.status().with_context(context);
  if (std::string reason = cuda_unavailable_reason(); !reason.empty())
    return failed_precondition(reason).with_context(context);
  int gpus = 0;
  RETURN_IF_ERROR(cuda_check(cudaGetDeviceCount(&gpus), "device count"));
  // Across processes every process is one rank on one GPU: ranks are placed
  // as if each process were a GPU of its own.
  ProcessGroup *processes =
      options.processes != nullptr && options.processes->size() > 1 ? options.processes : nullptr;
  std::vector<int> gpu_list = options.gpus;
  if (processes != nullptr) {
    const int k = options.devices_per_process;
    if (!gpu_list.empty())
      return invalid_argument("--gpus places the devices of one process; across MPI processes "
                              "each takes the GPU of its local rank")
          .with_context(context);
    if (k < 1 || static_cast<int64_t>(num_devices) != int64_t{k} * processes->size())
      return invalid_argument("the plan has ", num_devices, " devices; ", processes->size(),
                              " processes of ", k, " device(s) each run ",
                              int64_t{k} * processes->size())
          .with_context(context);
    for (size_t d = 0; d < num_devices; ++d)
      gpu_list.push_back(static_cast<int>(d) / k);
  }
  if (gpu_list.empty() || processes != nullptr) {
    if (options.gpu < 0 || options.gpu >= gpus)
      return invalid_argument(
                 "GPU ", options.gpu, " does not exist: this machine has ", gpus,
                 processes != nullptr ? " (start at most one process per GPU on each node)" : "")
          .with_context(context);
    if (gpu_list.empty()) gpu_list.assign(num_devices, options.gpu);
  }
  auto placed = place_on_gpus(static_cast<int>(num_devices), groups,
                              processes != nullptr ? processes->size() : gpus, gpu_list);
  if (!placed.is_ok()) return placed.status().with_context(context);
  const GpuPlacement placement = std::move(placed).value();
  const GpuRanks ranks = gpu_ranks(placement);
  const size_t num_ranks = ranks.gpu.size();
  if (num_ranks > 1 && !nccl_built())
    return unimplemented("the plan's devices are on ", num_ranks,
                         " GPUs, which talk over NCCL; this strata was built without NCCL")
        .with_context(context);
  // The ranks this process runs: all of them, or across processes its own.
  std::vector<int> mine;
  for (size_t r = 0; r < num_ranks; ++r)
    if (processes == nullptr || static_cast<int>(r) == processes->rank())
      mine.push_back(static_cast<int>(r));
  for (size_t k = 0; k < groups.size(); ++k)
    if (placement.group_transport[k] == GpuTransport::kDeviceCopy &&
        groups[k].size() > static_cast<size_t>(cuda::kMaxMembers))
      return unimplemented("group ", k, " has ", groups[k].size(),
                           " devices on one GPU; the CUDA backend sums at most ", cuda::kMaxMembers,
                           " there (spread them over GPUs with --gpus)")
          .with_context(context);
  // Per rank: its devices, its step per launch, its memory.
  std::vector<std::vector<bool>> local(num_ranks);
  std::vector<std::vector<GpuRankStep>> steps(num_ranks);
  std::vector<CudaPipelineLayout> layouts(num_ranks);
  for (int rank : mine) {
    const auto r = static_cast<size_t>(rank);
    if (num_ranks > 1) {
      for (size_t d = 0; d < num_devices; ++d)
        local[r].push_back(ranks.rank_of_device[d] == static_cast<int>(r));
      auto planned =
          gpu_rank_steps(plan.graph, plan.programs, groups, tensor_parallel,
                         plan.pipeline->tp_groups_begin, *order, placement, static_cast<int>(r));
      if (!planned.is_ok()) return planned.status().with_context(context);
      steps[r] = std::move(planned).value();
    }
    auto layout =
        cuda_pipeline_layout(plan, options.workspace_bytes, options.bf16 || options.f16, local[r]);
    if (!layout.is_ok()) return layout.status().with_context(context);
    layouts[r] = std::move(layout).value();
  }

  std::unique_ptr<CudaPipelineRunner> runner(new CudaPipelineRunner());
  runner->graph_ = plan.graph;
  runner->microbatches_ = plan.pipeline->microbatches;
  runner->data_parallel_ = plan.pipeline->data_parallel;
  runner->tensor_parallel_ = tensor_parallel;
  runner->processes_ = processes;
  for (const serialization::PlanShard &shard : plan.pipeline->shards) {
    auto id = plan.graph.find_tensor(shard.tensor);
    if (!id) return invalid_argument("pipeline plan: shard of unknown tensor '", shard.tensor, "'");
    runner->tp_shards_.emplace(*id, shard);
  }
  const Graph &g = runner->graph_;

  // Host values: what each device holds (the same tensor materializes to the
  // same bytes on every holder; a tensor-parallel member holds its piece of
  // it), and the nodes computed at load.
  // By tensor and which part: the tensor-parallel member for a piece (else
  // 0) and the shard's position for a ZeRO-1 shard (of the piece, or of the
  // whole tensor; else -1).
  std::map<std::tuple<TensorId, int, int>, HostTensor> values;
  // Every device's ZeRO-1 shard (each rank's devices start as copies).
  std::vector<State::Device> shard_info(num_devices);
  for (size_t d = 0; d < num_devices; ++d) {
    const serialization::PlanProgram &program = plan.programs[d];
    State::Device &device = shard_info[d];
    if (program.shard_group >= 0) {
      const auto &group = plan.pipeline->groups.at(static_cast<size_t>(program.shard_group));
      device.shard_count = static_cast<int>(group.size());
      device.shard_rank = static_cast<int>(
          std::find(group.begin(), group.end(), static_cast<int32_t>(d)) - group.begin());
      device.sharded.insert(program.sharded_holds.begin(), program.sharded_holds.end());
    }
  }
  // Which part of a tensor device d holds: its tensor-parallel piece (the
  // member) and, with ZeRO-1, its shard of that (or of the whole tensor).
  auto part_of = [&](size_t d, TensorId id) {
    const int member = runner->tp_shards_.contains(id) ? static_cast<int>(d) % tensor_parallel : 0;
    const int shard = shard_info[d].sharded.contains(id) ? shard_info[d].shard_rank : -1;
    return std::tuple<TensorId, int, int>{id, member, shard};
  };
  // Only what this process's devices hold (across processes, not the rest).
  std::vector<bool> needed(num_devices, false);
  for (int r : mine)
    for (size_t d = 0; d < num_devices; ++d)
      needed[d] =
          needed[d] || local[static_cast<size_t>(r)].empty() || local[static_cast<size_t>(r)][d];
  for (const auto &program : plan.programs) {
    if (!needed[program.device]) continue;
    const int member = static_cast<int>(program.device) % tensor_parallel;
    for (TensorId id : program.holds) {
      auto shard = runner->tp_shards_.find(id);
      const auto piece = part_of(program.device, id);
      if (values.contains(piece)) continue;
      Tensor whole = g.tensor(id);
      if (shard != runner->tp_shards_.end())
        whole.type.shape.assign(shard->second.full_shape.begin(), shard->second.full_shape.end());
      auto value = materialize(whole, options.model_dir);
      if (!value.is_ok()) return value.status().with_context(str_cat("device ", program.device));
      if (shard != runner->tp_shards_.end()) {
        HostTensor part = HostTensor::zeros(g.tensor(id).type);
        plan::copy_piece(shard->second, tensor_parallel, member,
                                dtype_size(whole.type.dtype), value->data(), part.data(), true);
        value = std::move(part);
      }
      if (shard_info[program.device].sharded.contains(id)) {
        // This device's ZeRO-1 shard of its piece (or of the whole tensor):
        // elements [r n / D, (r + 1) n / D).
        const int64_t count = shard_info[program.device].shard_count;
        const auto rank = static_cast<size_t>(shard_info[program.device].shard_rank);
        HostTensor part =
            HostTensor::zeros({value->type.dtype, {value->type.num_elements() / count}});
        if (part.size_bytes() > 0)
          std::memcpy(part.data(), value->data() + part.size_bytes() * rank, part.size_bytes());
        value = std::move(part);
      }
      values.emplace(piece, std::move(value).value());
    }
  }
  std::map<NodeId, HostTensor> constants;
  for (NodeId n = 0; n < g.num_nodes(); ++n) {
    if (layouts[static_cast<size_t>(mine[0])].constant[n] < 0) continue; // the same on every GPU
    const Node &node = g.node(n);
    const ops::OpDef *def = registry.find(node.op);
    HostTensor value = HostTensor::zeros(g.tensor(node.outputs[0]).type);
    ops::TensorView view{value.size_bytes() > 0 ? value.data() : nullptr, &value.type};
    ops::KernelContext kernel_context{node, *def, {}, llvm::ArrayRef<ops::TensorView>(view)};
    RETURN_IF_ERROR(def->cpu_kernel(kernel_context)
                        .with_context(str_cat("node '", node.name, "' (", node.op, ")")));
    constants.emplace(n, std::move(value));
  }

  // The graph's elementwise chains (each device runs those it has back to
  // back as one kernel; program_chains).
  std::vector<std::vector<NodeId>> chains;
  if (options.fuse) {
    auto topological = g.topological_order();
    if (!topological.is_ok()) return topological.status().with_context(context);
    chains = passes::find_elementwise_chains(g, *topological, cuda::kMaxFused, cuda::kMaxFused);
  }

  // One GPU's State: its memory, streams, held tensors and resolved
  // instructions (for a rank of a run over several, on its own thread, after
  // its communicators are up).
  auto build = [&](State &s) -> Status {
    const CudaPipelineLayout &l = s.layout;
    RETURN_IF_ERROR(cuda_check(cudaSetDevice(s.gpu), "set device"));
    cudaDeviceProp properties = {};
    s.device_name = cudaGetDeviceProperties(&properties, s.gpu) == cudaSuccess
                        ? str_cat("GPU ", s.gpu, " (", properties.name, ")")
                        : str_cat("GPU ", s.gpu);
    void *base = nullptr;
    RETURN_IF_ERROR(
        cuda_check(cudaMalloc(&base, static_cast<size_t>(std::max<int64_t>(l.total, 1))),
                   str_cat("allocating ", l.total, " bytes on GPU ", s.gpu)));
    s.base = static_cast<std::byte *>(base);
    RETURN_IF_ERROR(
        cuda_check(cudaStreamCreateWithFlags(&s.origin, cudaStreamNonBlocking), "stream"));
    RETURN_IF_ERROR(
        cuda_check(cudaMemsetAsync(base, 0, static_cast<size_t>(l.total), s.origin), "memset"));
    if (cublasLtCreate(&s.lt) != CUBLAS_STATUS_SUCCESS)
      return internal_error("cuBLASLt could not start");
    const bool needs_cudnn = std::any_of(g.nodes().begin(), g.nodes().end(), [](const Node &n) {
      for (const cuda::CudaOp &op : cuda::cudnn_ops())
        if (n.op == op.name) return true;
      return false;
    });
    // Pooling and batch norm take cuDNN when it starts, else strata's kernels.
    const std::vector<std::string_view> preferred = cuda::cudnn_preferred_ops();
    const bool wants_cudnn =
        options.cudnn_pool_norm &&
        std::any_of(g.nodes().begin(), g.nodes().end(), [&](const Node &n) {
          return std::find(preferred.begin(), preferred.end(), n.op) != preferred.end();
        });
    ASSIGN_OR_RETURN(s.fork, s.make_event());
    s.flags = reinterpret_cast<int *>(s.base + l.flags);
    s.flag_count = l.flag_count;
    s.rank_any = s.flags + l.instruction_flags;
    ASSIGN_OR_RETURN(s.flags_shared, s.make_event());
    if (!s.steps.empty()) {
      ASSIGN_OR_RETURN(s.nccl_done, s.make_event());
    }
    s.marks.assign(num_devices, nullptr);
    s.joins.assign(2 * num_devices, nullptr);

    // Per device: streams, regions, held tensors.
    for (size_t d = 0; d < num_devices; ++d) {
      if (!s.is_local(d)) continue;
      State::Device &device = s.devices[d];
      const CudaPipelineLayout::Device &region = l.devices[d];
      RETURN_IF_ERROR(
          cuda_check(cudaStreamCreateWithFlags(&device.stream, cudaStreamNonBlocking), "stream"));
      RETURN_IF_ERROR(
          cuda_check(cudaStreamCreateWithFlags(&device.side, cudaStreamNonBlocking), "stream"));
      if (needs_cudnn || wants_cudnn) {
        std::string why;
        device.cudnn = cuda::create_cudnn(device.stream, &why);
        if (device.cudnn == nullptr && needs_cudnn) return failed_precondition(why);
      }
      device.scratch = s.base + region.scratch;
      device.scratch_bytes = region.scratch_bytes;
      device.workspace = s.base + region.workspace;
      if (region.bf16 >= 0) device.bf16 = s.base + region.bf16;
      if (region.tp_staging >= 0) device.tp_staging = s.base + region.tp_staging;
      device.flags = s.flags + region.first_flag;

      for (const auto &[id, offset] : region.held) {
        device.held[id] = s.base + offset;
        const HostTensor &value = values.at(part_of(d, id));
        if (value.size_bytes() > 0)
          RETURN_IF_ERROR(
              cuda_check(cudaMemcpyAsync(s.base + offset, value.data(), value.size_bytes(),
                                         cudaMemcpyHostToDevice, s.origin),
                         str_cat("uploading '", g.tensor(id).name, "'")));
      }
      for (size_t k = 0; k < 2; ++k) {
        ASSIGN_OR_RETURN(s.joins[2 * d + k], s.make_event());
      }
      ASSIGN_OR_RETURN(s.marks[d], s.make_event());
    }
    for (const auto &[n, value] : constants)
      if (value.size_bytes() > 0)
        RETURN_IF_ERROR(
            cuda_check(cudaMemcpyAsync(s.base + l.constant[n], value.data(), value.size_bytes(),
                                       cudaMemcpyHostToDevice, s.origin),
                       "uploading a constant"));
    // The host buffers above must outlive their copies.
    RETURN_IF_ERROR(s.wait("the uploads"));
    for (size_t k = 0; k < g.inputs().size(); ++k) {
      s.input_staging.push_back(s.base + l.input[k]);
      s.input_bytes.push_back(static_cast<size_t>(runner->batch_types()[k].size_bytes()));
    }

    // Every instruction with its buffers resolved.
    std::vector<int64_t> input_index(g.num_tensors(), -1);
    for (size_t k = 0; k < g.inputs().size(); ++k)
      input_index[g.inputs()[k]] = static_cast<int64_t>(k);
    const int micro = runner->microbatches_, replicas = runner->data_parallel_;
    for (size_t d = 0; d < num_devices; ++d) {
      if (!s.is_local(d)) continue;
      const serialization::PlanProgram &program = s.programs[d];
      State::Device &device = s.devices[d];
      std::byte *arena = s.base + l.devices[d].arena;
      std::map<std::pair<TensorId, int32_t>, std::byte *> slots;
      for (const serialization::PlanSlot &slot : program.slots)
        slots[{slot.tensor, slot.microbatch}] = arena + slot.offset;
      device.ops.resize(program.instructions.size());
      for (size_t i = 0; i < program.instructions.size(); ++i) {
        const PlanInstruction &instr = program.instructions[i];
        State::Op &op = device.ops[i];
        op.kind = instr.kind;
        op.what = instruction_context(g, d, i, instr);
        op.flag = device.flags + i;
        auto slot = [&](TensorId t, int32_t mb) -> Result<std::byte *> {
          auto it = slots.find({t, mb});
          if (it == slots.end())
            return invalid_argument(op.what, ": '", g.tensor(t).name, "' ",
                                    mb < 0 ? std::string("(step)") : str_cat("micro-batch ", mb),
                                    " has no buffer in the plan");
          return it->second;
        };
        auto weight = [&](TensorId t) -> Result<std::byte *> {
          auto it = device.held.find(t);
          if (it == device.held.end())
            return invalid_argument(op.what, ": reads '", g.tensor(t).name,
                                    "', which the plan does not place on this device");
          return it->second;
        };
        switch (instr.kind) {
        case InstrKind::kCompute:
        case InstrKind::kComputeShard: {
          const Node &node = g.node(instr.index);
          // ZeRO-1 (ComputeShard): the node runs on the device's shard of its
          // operands, viewed as the CPU runner views them (plan::ShardedCompute).
          const bool shard = instr.kind == InstrKind::kComputeShard;
          plan::ShardedCompute sharding;
          if (shard) {
            if (instr.peer < 0 || static_cast<size_t>(instr.peer) >= plan.pipeline->groups.size())
              return invalid_argument(op.what, ": no group ", instr.peer);
            ASSIGN_OR_RETURN(sharding,
                             plan::sharded_compute(
                                 g, node, plan.pipeline->groups[static_cast<size_t>(instr.peer)],
                                 static_cast<int32_t>(d), op.what));
          }
          auto view = [&](TensorId t,
                          std::byte *base) -> std::pair<std::byte *, const TensorType *> {
            const TensorType &type = g.tensor(t).type;
            if (!shard) return {base, &type};
            auto seen = sharding.view(type, device.sharded.contains(t));
            if (seen.whole) return {base, &type};
            device.shard_types.push_back(std::move(seen.type));
            return {base + seen.offset, &device.shard_types.back()};
          };
          op.node = &node;
          op.def = registry.find(node.op);
          op.op = cuda::find_cuda_op(node.op);
          op.cache = &device.caches[{instr.index, instr.microbatch}];
          if (op.op == nullptr && l.constant[instr.index] >= 0)
            op.source = s.base + l.constant[instr.index];
          for (TensorId t : node.inputs) {
            const Tensor &tensor = g.tensor(t);
            if (input_index[t] >= 0) {
              if (instr.microbatch < 0)
                return invalid_argument(op.what, ": reads graph input '", tensor.name,
                                        "' once per step");
              // Micro-batch k of replica r is rows (r M + k) b .. of the batch.
              const auto replica = static_cast<int>(d) / tensor_parallel % replicas;
              const auto slice = static_cast<size_t>(tensor.type.size_bytes());
              op.inputs.push_back(
                  {s.input_staging[static_cast<size_t>(input_index[t])] +
                       slice * static_cast<size_t>(replica * micro + instr.microbatch),
                   &tensor.type});
            } else if (tensor.kind == TensorKind::kIntermediate) {
              ASSIGN_OR_RETURN(std::byte * data, slot(t, instr.microbatch));
              auto [at, type] = view(t, data);
              op.inputs.push_back({at, type});
            } else {
              ASSIGN_OR_RETURN(std::byte * data, weight(t));
              auto [at, type] = view(t, data);
              op.inputs.push_back({at, type});
            }
          }
          for (TensorId t : node.outputs) {
            ASSIGN_OR_RETURN(std::byte * data, slot(t, instr.microbatch));
            auto [at, type] = view(t, data);
            if (node.op == "SumOfSquares") at = data, type = &g.tensor(t).type; // the whole pair
            op.outputs.push_back({at, type});
          }
          // Its place in its tensor-parallel group (ops on a piece of a
          // split table or of split logits read it; 0 of 1 without).
          op.member = static_cast<int>(d) % tensor_parallel;
          op.parts = tensor_parallel;
          using Tp = State::Op::Tp;
          op.tp = shard                          ? Tp::kNone
                  : node.op == "TpCopy"          ? Tp::kCopy
                  : node.op == "TpSplit"         ? Tp::kSplit
                  : node.op == "TpAllReduce"     ? Tp::kAllReduce
                  : node.op == "TpAllGather"     ? Tp::kAllGather
                  : node.op == "TpReduceScatter" ? Tp::kReduceScatter
                  : node.op == "TpAllToAll"      ? Tp::kAllToAll
                                                 : Tp::kNone;
          if (op.tp != Tp::kNone) {
            if (node.int_attr("parts").value_or(1) != tensor_parallel)
              return invalid_argument(op.what, ": a tensor-parallel node of ",
                                      node.int_attr("parts").value_or(1),
                                      " parts in a plan of tensor_parallel = ", tensor_parallel);
            op.member = static_cast<int>(d) % tensor_parallel;
            op.parts = tensor_parallel;
            if (op.tp == Tp::kAllToAll) {
              auto layout = plan::all_to_all_layout(node, *op.inputs[0].type,
                                                           *op.outputs[0].type, tensor_parallel);
              if (!layout.is_ok()) return layout.status().with_context(op.what);
              op.rows = layout->cut.rows;
              op.run = layout->cut.run;
              op.place_rows = layout->place.rows;
              op.place_run = layout->place.run;
              op.block = layout->block;
            }
            if (op.tp == Tp::kAllGather || op.tp == Tp::kReduceScatter || op.tp == Tp::kSplit) {
              // The piece: the input of an all-gather, the output of the others.
              const plan::PieceLayout piece = plan::piece_layout(
                  node, op.tp == Tp::kAllGather ? *op.inputs[0].type : *op.outputs[0].type);
              op.rows = piece.rows;
              op.run = piece.run;
            }
            if (op.tp != Tp::kCopy && op.tp != Tp::kSplit) {
              ASSIGN_OR_RETURN(op.arrived, s.make_event());
            }
          }
          break;
        }
        case InstrKind::kSend:
        case InstrKind::kRecv: {
          ASSIGN_OR_RETURN(op.data, slot(instr.index, instr.microbatch));
          op.bytes = static_cast<size_t>(g.tensor(instr.index).type.size_bytes());
          if (instr.kind == InstrKind::kSend) {
            op.staging = s.base + l.devices[d].send[i];
            ASSIGN_OR_RETURN(op.sent, s.make_event());
          }
          break;
        }
        case InstrKind::kAccumulate:
        case InstrKind::kScale:
        case InstrKind::kAllReduce:
        case InstrKind::kReduceScatter:
        case InstrKind::kAllGather: {
          ASSIGN_OR_RETURN(op.data, slot(instr.index, -1));
          op.bytes = static_cast<size_t>(g.tensor(instr.index).type.size_bytes());
          if (instr.kind == InstrKind::kAccumulate) {
            ASSIGN_OR_RETURN(std::byte * source, slot(instr.index, instr.microbatch));
            op.source = source;
            op.first = instr.microbatch == 0;
          }
          if (instr.kind == InstrKind::kReduceScatter || instr.kind == InstrKind::kAllGather) {
            const auto &group = plan.pipeline->groups.at(static_cast<size_t>(instr.peer));
            if (g.tensor(instr.index).type.num_elements() % static_cast<int64_t>(group.size()) != 0)
              return invalid_argument(op.what, ": ", g.tensor(instr.index).type.to_string(),
                                      " does not split over ", group.size(), " devices");
          }
          if (instr.kind != InstrKind::kAccumulate && instr.kind != InstrKind::kScale) {
            ASSIGN_OR_RETURN(op.arrived, s.make_event());
          }
          break;
        }
        case InstrKind::kUpdate: {
          if (instr.index >= g.updates().size())
            return invalid_argument(op.what, ": the graph has ", g.updates().size(), " updates");
          const StateUpdate &update = g.updates()[instr.index];
          ASSIGN_OR_RETURN(op.data, weight(update.target));
          ASSIGN_OR_RETURN(std::byte * source, slot(update.value, -1));
          op.source = source;
          op.bytes = static_cast<size_t>(g.tensor(update.target).type.size_bytes());
          if (device.sharded.contains(update.target)) {
            // Only this device's shard of the new value is meaningful.
            op.bytes /= static_cast<size_t>(device.shard_count);
            op.source = source + op.bytes * static_cast<size_t>(device.shard_rank);
          }
          break;
        }
        case InstrKind::kStartBucket: {
          op.reduce_scatter = program.buckets[instr.index].reduce_scatter;
          const size_t members = plan.pipeline->groups.at(static_cast<size_t>(instr.peer)).size();
          for (TensorId t : program.buckets[instr.index].tensors) {
            if (op.reduce_scatter &&
                g.tensor(t).type.num_elements() % static_cast<int64_t>(members) != 0)
              return invalid_argument(op.what, ": '", g.tensor(t).name, "' has ",
                                      g.tensor(t).type.num_elements(), " elements, which ", members,
                                      " devices do not divide");
            ASSIGN_OR_RETURN(std::byte * data, slot(t, -1));
            op.bucket.push_back(reinterpret_cast<float *>(data));
            op.counts.push_back(static_cast<size_t>(g.tensor(t).type.num_elements()));
          }
          ASSIGN_OR_RETURN(op.arrived, s.make_event());
          break;
        }
        case InstrKind::kWaitBucket: break;
        default: return unimplemented(op.what, ": not run on the CUDA backend yet");
        }
      }
      // Elementwise chains whose nodes run back to back: one kernel at the
      // last node's place, the others skipped.
      for (const ProgramChain &run : program_chains(g, program, chains)) {
        ASSIGN_OR_RETURN(std::unique_ptr<cuda::Fused> fused,
                         fused_chain_program(g, chains[run.chain], [&](TensorId t) -> const void * {
                           for (size_t i = run.first; i <= run.last; ++i) {
                             const Node &node = *device.ops[i].node;
                             for (size_t j = 0; j < node.inputs.size(); ++j)
                               if (node.inputs[j] == t) return device.ops[i].inputs[j].data;
                           }
                           return nullptr;
                         }));
        for (size_t i = run.first; i < run.last; ++i)
          device.ops[i].skip = true;
        device.ops[run.last].fused = std::move(fused);
        ++s.fused_chains;
      }
      for (size_t k = 0; k < g.outputs().size(); ++k) {
        auto it = slots.find({g.outputs()[k], -1});
        if (it != slots.end() && s.outputs[k].device < 0)
          s.outputs[k] = {static_cast<int>(d), it->second};
      }
    }
    // Wire the launches: each receive to its send (in order, per peers and
    // tag), each collective to the event its members wait for, each WaitBucket
    // to its bucket's. Over several GPUs only this GPU's parts: a receive
    // whose send is elsewhere is NCCL's (run_rank_step).
    ASSIGN_OR_RETURN(const std::vector<GpuLaunch::Part> sends,
                     gpu_matching_sends(s.programs, s.order));
    for (size_t k = 0; k < s.order.size(); ++k) {
      const GpuLaunch &launch = s.order[k];
      const GpuLaunch::Part &lead = launch.parts[0];
      const PlanInstruction &instr =
          s.programs[static_cast<size_t>(lead.device)].instructions[lead.instruction];
      if (!launch.reduce && instr.kind == InstrKind::kRecv) {
        const GpuLaunch::Part send = sends[k];
        if (s.is_local(static_cast<size_t>(lead.device)) &&
            s.is_local(static_cast<size_t>(send.device)))
          s.devices[static_cast<size_t>(lead.device)].ops[lead.instruction].matching =
              &s.devices[static_cast<size_t>(send.device)].ops[send.instruction];
      } else if (instr.kind == InstrKind::kAllReduce || instr.kind == InstrKind::kReduceScatter ||
                 instr.kind == InstrKind::kAllGather || launch.reduce ||
                 (instr.kind == InstrKind::kCompute && launch.parts.size() > 1)) {
        ASSIGN_OR_RETURN(cudaEvent_t done, s.make_event());
        s.reduced.push_back(done);
        for (const GpuLaunch::Part &part : launch.parts) {
          if (!s.is_local(static_cast<size_t>(part.device))) continue;
          State::Device &member = s.devices[static_cast<size_t>(part.device)];
          member.ops[part.instruction].reduced = &s.reduced.back();
          if (launch.reduce)
            member.bucket_done[s.programs[static_cast<size_t>(part.device)]
                                   .instructions[part.instruction]
                                   .index] = done;
        }
      }
    }
    for (size_t d = 0; d < num_devices; ++d)
      for (size_t i = 0; i < s.devices[d].ops.size(); ++i) {
        State::Op &op = s.devices[d].ops[i];
        if (op.kind != InstrKind::kWaitBucket) continue;
        auto it = s.devices[d].bucket_done.find(s.programs[d].instructions[i].index);
        if (it == s.devices[d].bucket_done.end())
          return invalid_argument(op.what, ": the bucket is never started");
        op.reduced = &it->second;
      }
    return Status::ok();
  };

  // The ranks: one on one GPU; over several, each GPU's on its own thread,
  // which first joins the NCCL communicators (every rank must, before any
  // can fail on its own), then builds.
  for (int r : mine) {
    auto state = std::make_unique<State>();
    state->options = options;
    state->gpu = processes != nullptr ? options.gpu : ranks.gpu[static_cast<size_t>(r)];
    state->rank = r;
    state->local = local[static_cast<size_t>(r)];
    state->steps = std::move(steps[static_cast<size_t>(r)]);
    state->layout = std::move(layouts[static_cast<size_t>(r)]);
    state->programs = plan.programs;
    state->groups = groups;
    state->order = *order;
    state->devices = shard_info;
    state->outputs.assign(g.outputs().size(), {-1, nullptr});
    runner->ranks_.push_back(std::move(state));
  }
  // A rank over NCCL: it joins the world and the communicators of its groups
  // (every rank must, before any can fail on its own), then builds.
  auto start = [&](State &s, const std::string &id, const NcclCheck &check) -> Status {
    RETURN_IF_ERROR(cuda_check(cudaSetDevice(s.gpu), "set device"));
    ASSIGN_OR_RETURN(
        s.world, nccl_init_rank(id, static_cast<int>(num_ranks), s.rank, options.timeout, check));
    // A communicator per group spread over GPUs, in group order on every
    // rank (a split is collective over all ranks).
    for (size_t k = 0; k < groups.size(); ++k) {
      if (placement.group_transport[k] != GpuTransport::kNccl || groups[k].size() < 2) continue;
      int color = -1, key = 0;
      for (size_t m = 0; m < groups[k].size(); ++m)
        if (s.is_local(static_cast<size_t>(groups[k][m])))
          color = static_cast<int>(k), key = static_cast<int>(m);
      ASSIGN_OR_RETURN(auto comm, nccl_split(*s.world, color, key, options.timeout, check));
      if (comm) s.group_comms.emplace(static_cast<int>(k), std::move(comm));
    }
    return build(s);
  };
  auto fail_all = [&](const Status &status) {
    for (auto &state : runner->ranks_)
      state->failed = true; // their communicators are aborted, not waited for
    return status.with_context(context);
  };
  if (num_ranks == 1) {
    RETURN_IF_ERROR(build(*runner->ranks_[0]).with_context(context));
  } else if (processes != nullptr) {
    // Rank 0 makes the id and shares it; every process starts its rank, then
    // all learn whether every one did (so none trains beside a dead peer).
    State &s = *runner->ranks_[0];
    auto id = share_unique_id(*processes, [] { return nccl_unique_id(); });
    if (!id.is_ok()) return fail_all(id.status());
    Status started =
        start(s, *id, options.watch)
            .with_context(str_cat("process ", processes->rank(), " (GPU ", s.gpu, ")"));
    // A process that failed tells the others at once (they may be waiting
    // in NCCL's start-up for it), then all agree.
    if (!started.is_ok() && options.fail) options.fail(started);
    Status agreed = agree_across(*processes, started, "CUDA start-up");
    if (!agreed.is_ok()) return fail_all(agreed);
  } else {
    auto id = nccl_unique_id();
    if (!id.is_ok()) return id.status().with_context(context);
    std::vector<Status> built(num_ranks, Status::ok());
    // A rank that fails stops the others' waits for it.
    std::atomic<bool> build_failed{false};
    const NcclCheck check = [&build_failed]() -> Status {
      return build_failed.load() ? failed_precondition("another GPU of the run failed")
                                 : Status::ok();
    };
    std::vector<std::thread> threads;
    for (size_t r = 0; r < num_ranks; ++r)
      threads.emplace_back([&, r] {
        State &s = *runner->ranks_[r];
        built[r] = start(s, *id, check).with_context(str_cat("GPU ", s.gpu, " (rank ", r, ")"));
        if (!built[r].is_ok()) build_failed = true;
      });
    for (std::thread &thread : threads)
      thread.join();
    // The first failure that is not a rank stopping for another's.
    Status first = Status::ok();
    for (size_t r = 0; r < num_ranks; ++r)
      if (!built[r].is_ok() &&
          (first.is_ok() ||
           first.message().find("another GPU of the run failed") != std::string::npos))
        first = built[r];
    if (!first.is_ok()) return fail_all(first);
  }
  // Each output from the first rank that keeps it (across processes, one
  // process keeps it and shares it after every step).
  for (size_t k = 0; k < g.outputs().size() && processes == nullptr; ++k) {
    bool kept = false;
    for (const auto &rank : runner->ranks_)
      kept = kept || rank->outputs[k].device >= 0;
    if (!kept)
      return invalid_argument("no device of the plan keeps graph output '",
                              g.tensor(g.outputs()[k]).name, "'")
          .with_context(context);
  }
  return runner;
}

Status CudaPipelineRunner::run(llvm::ArrayRef<HostTensor> inputs,
                               std::vector<HostTensor> *outputs) {
  issue_seconds_ = -1;
  for (const auto &rank : ranks_)
    if (rank->failed)
      return failed_precondition("an earlier step of this pipeline failed; its state is lost");
  const std::vector<TensorType> types = batch_types();
  if (inputs.size() != types.size())
    return invalid_argument("the pipeline takes ", types.size(), " inputs, got ", inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k)
    if (!(inputs[k].type == types[k]) ||
        static_cast<int64_t>(inputs[k].size_bytes()) < types[k].size_bytes())
      return invalid_argument("input '", graph_.tensor(graph_.inputs()[k]).name, "' is ",
                              inputs[k].type.to_string(), ", the pipeline needs ",
                              types[k].to_string());
  const auto divisor = static_cast<float>(int64_t{microbatches_} * data_parallel_);
  // One GPU's step: the batch in, the first step eagerly, the second
  // captured, later ones replayed, then a bounded wait (a copy into pageable
  // memory would block until the step is done, past any bound).
  auto launch_rank = [&](State &s) -> Status {
    const auto start = std::chrono::steady_clock::now();
    s.issue_seconds = 0;
    RETURN_IF_ERROR(cuda_check(cudaSetDevice(s.gpu), "set device"));
    s.host.clear();
    s.read_error = Status::ok();
    for (size_t k = 0; k < inputs.size(); ++k)
      if (s.input_bytes[k] > 0)
        RETURN_IF_ERROR(
            cuda_check(cudaMemcpyAsync(s.input_staging[k], inputs[k].data(), s.input_bytes[k],
                                       cudaMemcpyHostToDevice, s.origin),
                       str_cat("copying input '", graph_.tensor(graph_.inputs()[k]).name, "'")));
    RETURN_IF_ERROR(s.step.launch(
        s.origin, s.options.cuda_graph, [&] { return s.enqueue(divisor); },
        [&] { return s.record(graph_); }));
    s.issue_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return Status::ok();
  };
  auto run_rank = [&](State &s) -> Status {
    RETURN_IF_ERROR(launch_rank(s));
    return s.wait("the step");
  };
  // Replays enqueue nothing that waits on another GPU: one host thread
  // launches every GPU's graph, then waits for each (no thread per step).
  bool replays = true;
  for (const auto &rank : ranks_)
    replays = replays && rank->options.cuda_graph && rank->step.replays_next();
  Status status = Status::ok();
  if (ranks_.size() == 1) {
    status = run_rank(*ranks_[0]);
  } else if (replays) {
    for (size_t r = 0; r < ranks_.size() && status.is_ok(); ++r)
      status =
          launch_rank(*ranks_[r]).with_context(str_cat("GPU ", ranks_[r]->gpu, " (rank ", r, ")"));
    for (size_t r = 0; r < ranks_.size() && status.is_ok(); ++r)
      status = ranks_[r]
                   ->wait("the step")
                   .with_context(str_cat("GPU ", ranks_[r]->gpu, " (rank ", r, ")"));
  } else {
    // A thread per GPU: NCCL calls of one rank may wait, while being
    // enqueued, for the other ranks to reach theirs. A rank that fails stops
    // the others' waits; their communicators are then aborted.
    std::atomic<bool> stop{false};
    std::vector<Status> statuses(ranks_.size(), Status::ok());
    std::vector<std::thread> threads;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      ranks_[r]->stop = &stop;
      threads.emplace_back([&, r] {
        statuses[r] =
            run_rank(*ranks_[r]).with_context(str_cat("GPU ", ranks_[r]->gpu, " (rank ", r, ")"));
        if (!statuses[r].is_ok()) stop = true;
      });
    }
    for (std::thread &thread : threads)
      thread.join();
    for (size_t r = 0; r < ranks_.size(); ++r) {
      ranks_[r]->stop = nullptr;
      // The first failure that is not a rank stopping for another's.
      if (!statuses[r].is_ok() &&
          (status.is_ok() ||
           status.message().find("another GPU of the run failed") != std::string::npos))
        status = statuses[r];
    }
  }
  if (status.is_ok()) {
    // One thread launched every replay in turn; else each GPU's thread its own.
    issue_seconds_ = 0;
    for (const auto &rank : ranks_)
      issue_seconds_ = replays && ranks_.size() > 1 ? issue_seconds_ + rank->issue_seconds
                                                    : std::max(issue_seconds_, rank->issue_seconds);
  }
  // This process's outputs and device checks.
  std::vector<std::optional<HostTensor>> kept(graph_.outputs().size());
  for (size_t k = 0; k < kept.size() && status.is_ok(); ++k)
    for (const auto &rank : ranks_) {
      if (rank->outputs[k].device < 0) continue;
      HostTensor out = HostTensor::zeros(graph_.tensor(graph_.outputs()[k]).type);
      if (out.size_bytes() > 0)
        status = cuda_check(
            cudaMemcpy(out.data(), rank->outputs[k].data, out.size_bytes(), cudaMemcpyDefault),
            "copying an output");
      kept[k] = std::move(out);
      break;
    }
  for (const auto &rank : ranks_) {
    State &s = *rank;
    for (size_t d = 0; d < s.devices.size() && status.is_ok(); ++d) {
      if (!s.is_local(d) || s.devices[d].ops.empty()) continue;
      std::vector<int> flags(s.devices[d].ops.size());
      status = cuda_check(cudaMemcpy(flags.data(), s.devices[d].flags, flags.size() * sizeof(int),
                                     cudaMemcpyDefault),
                          "reading the error flags");
      for (size_t i = 0; i < flags.size() && status.is_ok(); ++i)
        if (flags[i] != 0) {
          const State::Op &op = s.devices[d].ops[i];
          status = out_of_range(op.op == nullptr || op.op->flag_meaning.empty()
                                    ? std::string_view("device check failed")
                                    : op.op->flag_meaning)
                       .with_context(op.what);
        }
    }
  }
  // Across processes every process learns every output and whether any
  // process failed (a failed one first ends its communicators, so that the
  // others' NCCL calls fail instead of waiting for it).
  if (processes_ != nullptr) {
    if (!status.is_ok()) {
      for (const auto &rank : ranks_)
        rank->abort_comms();
      // The others may be waiting in NCCL for this process: tell them now.
      if (ranks_[0]->options.fail) ranks_[0]->options.fail(status);
    }
    std::vector<TensorType> types;
    for (TensorId id : graph_.outputs())
      types.push_back(graph_.tensor(id).type);
    status = share_step_results(*processes_, status, types, &kept);
  }
  if (!status.is_ok()) {
    for (const auto &rank : ranks_) {
      rank->failed = true;
      rank->abort_comms();
    }
    return status;
  }
  outputs->clear();
  for (auto &output : kept)
    outputs->push_back(std::move(output).value());
  return Status::ok();
}

namespace {

// Where plan device `d` keeps `id`: the State of its GPU (made current) and
// the address; {null, null} where it keeps none.
template <typename Ranks>
std::pair<CudaPipelineRunner::State *, std::byte *> held_at(const Ranks &ranks, size_t d,
                                                            TensorId id) {
  for (const auto &rank : ranks) {
    if (!rank->is_local(d)) continue;
    auto it = rank->devices[d].held.find(id);
    if (it == rank->devices[d].held.end()) return {nullptr, nullptr};
    cudaSetDevice(rank->gpu);
    return {rank.get(), it->second};
  }
  return {nullptr, nullptr};
}

} // namespace

const HostTensor &CudaPipelineRunner::value(TensorId id) const {
  State &cache = *ranks_[0];
  auto cached = cache.host.find(id);
  if (cached != cache.host.end()) return cached->second;
  HostTensor whole = HostTensor::zeros(value_type(id));
  const auto shard = tp_shards_.find(id);
  const size_t devices = cache.programs.size();
  // A read that fails leaves the value zero and is reported by read_status().
  Status read = Status::ok();
  auto failed = [&]() -> const HostTensor & {
    if (cache.read_error.is_ok())
      cache.read_error =
          std::move(read).with_context(str_cat("reading '", graph_.tensor(id).name, "'"));
    return cache.host.emplace(id, HostTensor::zeros(value_type(id))).first->second;
  };
  for (const auto &rank : ranks_) {
    read = rank->wait("a read");
    if (!read.is_ok()) return failed();
  }
  // What device `d` holds of the tensor, whole (its piece under tensor
  // parallelism): read directly, or with ZeRO-1 put together from the
  // shards of d's shard group, each at its position.
  // False where d is not in this process.
  auto held_whole = [&](size_t d, HostTensor *out) {
    auto [state, address] = held_at(ranks_, d, id);
    if (state == nullptr) return false;
    if (out->size_bytes() == 0) return true;
    const State::Device &device = state->devices[d];
    if (!device.sharded.contains(id)) {
      if (read.is_ok())
        read = cuda_check(cudaMemcpy(out->data(), address, out->size_bytes(), cudaMemcpyDefault),
                          "copying to the host");
      return true;
    }
    const size_t chunk = out->size_bytes() / static_cast<size_t>(device.shard_count);
    for (size_t e = 0; e < devices && chunk > 0; ++e) {
      auto [other_state, other] = held_at(ranks_, e, id);
      if (other_state == nullptr || !other_state->devices[e].sharded.contains(id) ||
          cache.programs[e].shard_group != cache.programs[d].shard_group)
        continue;
      if (read.is_ok())
        read = cuda_check(cudaMemcpy(out->data() + chunk * static_cast<size_t>(
                                                               other_state->devices[e].shard_rank),
                                     other, chunk, cudaMemcpyDefault),
                          "copying a shard to the host");
    }
    return true;
  };
  for (size_t d = 0; d < devices; ++d) {
    auto [state, address] = held_at(ranks_, d, id);
    if (state == nullptr) continue;
    if (shard == tp_shards_.end()) {
      held_whole(d, &whole);
      break;
    }
    // The first holder is member 0 of its group; the group's members follow.
    for (int m = 0; m < tensor_parallel_ && d + static_cast<size_t>(m) < devices; ++m) {
      HostTensor piece = HostTensor::zeros(graph_.tensor(id).type);
      if (!held_whole(d + static_cast<size_t>(m), &piece)) continue;
      plan::copy_piece(shard->second, tensor_parallel_, m, dtype_size(whole.type.dtype),
                              whole.data(), piece.data(), false);
    }
    break;
  }
  if (!read.is_ok()) return failed();
  return cache.host.emplace(id, std::move(whole)).first->second;
}

Status CudaPipelineRunner::read_status() const { return ranks_[0]->read_error; }

Status CudaPipelineRunner::assign(TensorId id, const HostTensor &value) {
  const TensorType type = value_type(id);
  RETURN_IF_ERROR(check_assignable(graph_, id, value, &type));
  for (const auto &rank : ranks_)
    RETURN_IF_ERROR(rank->wait("the step before an assignment"));
  const auto shard = tp_shards_.find(id);
  // Each member's piece (the whole value outside tensor parallelism), kept
  // until the copies are done.
  std::vector<HostTensor> pieces;
  for (int m = 0; m < (shard == tp_shards_.end() ? 1 : tensor_parallel_); ++m) {
    if (shard == tp_shards_.end()) {
      pieces.push_back(value);
      break;
    }
    HostTensor piece = HostTensor::zeros(graph_.tensor(id).type);
    plan::copy_piece(shard->second, tensor_parallel_, m, dtype_size(type.dtype),
                            const_cast<std::byte *>(value.data()), piece.data(), true);
    pieces.push_back(std::move(piece));
  }
  bool held = false;
  for (size_t d = 0; d < ranks_[0]->programs.size(); ++d) {
    auto [state, address] = held_at(ranks_, d, id);
    if (state == nullptr) continue;
    held = true;
    const HostTensor &piece =
        pieces[shard == tp_shards_.end() ? 0 : d % static_cast<size_t>(tensor_parallel_)];
    const std::byte *from = piece.size_bytes() > 0 ? piece.data() : nullptr;
    size_t bytes = piece.size_bytes();
    const State::Device &device = state->devices[d];
    if (device.sharded.contains(id)) { // ZeRO-1: the device's shard of it
      bytes /= static_cast<size_t>(device.shard_count);
      from += bytes * static_cast<size_t>(device.shard_rank);
    }
    if (bytes > 0)
      RETURN_IF_ERROR(
          cuda_check(cudaMemcpyAsync(address, from, bytes, cudaMemcpyHostToDevice, state->origin),
                     str_cat("assigning '", graph_.tensor(id).name, "'")));
  }
  // Across processes, a tensor only other processes hold is theirs to set.
  if (!held && processes_ == nullptr)
    return invalid_argument("no device of the plan holds '", graph_.tensor(id).name, "'");
  for (const auto &rank : ranks_)
    RETURN_IF_ERROR(rank->wait("an assignment"));
  ranks_[0]->host.erase(id);
  return Status::ok();
}

Result<std::map<std::string, HostTensor>> CudaPipelineRunner::checkpoint_pieces() const {
  std::map<std::string, HostTensor> pieces;
  for (const auto &rank : ranks_)
    RETURN_IF_ERROR(rank->wait("the step before a checkpoint"));
  Status copied = Status::ok();
  const std::vector<serialization::PlanProgram> &programs = ranks_[0]->programs;
  // What device `d` of this process keeps of `id`: its piece, or its ZeRO-1
  // shard (flat), as the CPU pipeline runner writes them.
  auto read = [&](size_t d, TensorId id) -> std::optional<HostTensor> {
    auto [state, address] = held_at(ranks_, d, id);
    if (state == nullptr) return std::nullopt;
    const State::Device &device = state->devices[d];
    TensorType type = graph_.tensor(id).type;
    if (device.sharded.contains(id))
      type = TensorType{type.dtype, {type.num_elements() / device.shard_count}};
    HostTensor value = HostTensor::zeros(type);
    if (value.size_bytes() > 0 && copied.is_ok())
      copied = cuda_check(cudaMemcpy(value.data(), address, value.size_bytes(), cudaMemcpyDefault),
                          str_cat("reading '", graph_.tensor(id).name, "' for a checkpoint"));
    return value;
  };
  auto holds = [&](size_t d, TensorId id, bool sharded) {
    const auto &list = sharded ? programs[d].sharded_holds : programs[d].holds;
    return std::find(list.begin(), list.end(), id) != list.end();
  };
  for (TensorId id = 0; id < graph_.num_tensors(); ++id) {
    const Tensor &tensor = graph_.tensor(id);
    if (tensor.kind != TensorKind::kParameter && tensor.kind != TensorKind::kState) continue;
    size_t first = programs.size();
    for (size_t d = 0; d < programs.size() && first == programs.size(); ++d)
      if (holds(d, id, false)) first = d;
    if (first == programs.size()) continue;
    // Tensor parallelism: every member of the first holder's group writes
    // its piece, "<name>@tp<m>of<T>".
    const bool in_pieces = tp_shards_.contains(id);
    const size_t base = in_pieces ? first - first % static_cast<size_t>(tensor_parallel_) : first;
    for (int m = 0; m < (in_pieces ? tensor_parallel_ : 1); ++m) {
      const size_t holder = base + static_cast<size_t>(m);
      const std::string name =
          in_pieces ? str_cat(tensor.name, "@tp", m, "of", tensor_parallel_) : tensor.name;
      if (!holds(holder, id, true)) {
        if (auto value = read(holder, id)) pieces.emplace(name, std::move(*value));
        continue;
      }
      for (size_t e = 0; e < programs.size(); ++e) {
        if (programs[e].shard_group != programs[holder].shard_group || !holds(e, id, true))
          continue;
        auto [state, address] = held_at(ranks_, e, id);
        if (state == nullptr) continue;
        const State::Device &device = state->devices[e];
        if (auto value = read(e, id))
          pieces.emplace(str_cat(name, "@shard", device.shard_rank, "of", device.shard_count),
                         std::move(*value));
      }
    }
  }
  RETURN_IF_ERROR(copied);
  return pieces;
}

int CudaPipelineRunner::num_devices() const { return static_cast<int>(ranks_[0]->programs.size()); }
int64_t CudaPipelineRunner::device_bytes() const {
  int64_t bytes = 0;
  for (const auto &rank : ranks_)
    bytes += rank->layout.total;
  return bytes;
}
int64_t CudaPipelineRunner::replays() const { return ranks_[0]->step.replays(); }
int64_t CudaPipelineRunner::fused_chains() const {
  int64_t chains = 0;
  for (const auto &rank : ranks_)
    chains += rank->fused_chains;
  return chains;
}
int CudaPipelineRunner::num_gpus() const { return static_cast<int>(ranks_.size()); }
std::string CudaPipelineRunner::device_name() const {
  std::string name;
  for (const auto &rank : ranks_)
    name += str_cat(name.empty() ? "" : ", ", rank->device_name);
  return name;
}

#endif

} // namespace strata::runtime
