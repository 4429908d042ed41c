#include "runtime/cuda/cuda_pipeline.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include "ops/registry.h"
#include "passes/fuse_elementwise.h"
#include "plan/instructions.h"
#include "runtime/cuda/cuda_executor.h"
#include "runtime/cuda/gpu_rank.h"
#include "runtime/cuda/nccl_bootstrap.h"
#include "strata_config.h"

namespace strata::runtime {

using serialization::InstrKind;
using serialization::PlanInstruction;

#if !STRATA_HAVE_CUDA

class GpuRank {};
Result<CudaPipelineLayout> cuda_pipeline_layout(const serialization::Plan &, int64_t, bool,
                                                const std::vector<bool> &) {
  return unimplemented(cuda_unavailable_reason());
}
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
int64_t CudaPipelineRunner::device_bytes() const { return 0; }
int64_t CudaPipelineRunner::replays() const { return 0; }
int64_t CudaPipelineRunner::fused_chains() const { return 0; }
int CudaPipelineRunner::num_gpus() const { return 0; }
std::string CudaPipelineRunner::device_name() const { return ""; }

#else

namespace {

int64_t align_up(int64_t n) {
  constexpr int64_t a = kGpuAlignment;
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
  return str_cat("device ", device, " instruction ", i, " (", plan::describe_instruction(g, instr),
                 ")");
}

// What one device's instructions need beside the core's buffers: its
// kernels' scratch and bf16 staging (the largest: one stream), a staging
// buffer per send.
Status size_instructions(const serialization::Plan &plan, size_t d, bool bf16,
                         CudaPipelineLayout::Device &device) {
  const Graph &g = plan.graph;
  const serialization::PlanProgram &program = plan.programs[d];
  const ops::OpRegistry &registry = ops::OpRegistry::global();
  device.send.assign(program.instructions.size(), -1);
  for (size_t i = 0; i < program.instructions.size(); ++i) {
    const PlanInstruction &instr = program.instructions[i];
    switch (instr.kind) {
    case InstrKind::kCompute:
    case InstrKind::kComputeShard: {
      if (instr.index >= g.num_nodes())
        return invalid_argument(instruction_context(g, d, i, instr), ": no node ", instr.index);
      const Node &node = g.node(instr.index);
      const cuda::CudaOp *op = cuda::find_cuda_op(node.op);
      if (op == nullptr) {
        if (instr.kind == InstrKind::kComputeShard)
          return unimplemented(instruction_context(g, d, i, instr), ": op ", node.op,
                               " has no CUDA kernel");
        break;
      }
      // The whole operands: at least what a shard of them needs.
      std::vector<TensorType> types;
      for (TensorId t : node.inputs)
        types.push_back(g.tensor(t).type);
      if (bf16 && instr.kind == InstrKind::kCompute)
        device.bf16_bytes = std::max(device.bf16_bytes, cuda::half_staging_bytes(node, types));
      if (op->scratch != nullptr)
        device.scratch_bytes =
            std::max(device.scratch_bytes, op->scratch(node, *registry.find(node.op), types));
      break;
    }
    case InstrKind::kSend:
      if (instr.index >= g.num_tensors())
        return invalid_argument(instruction_context(g, d, i, instr), ": no tensor ", instr.index);
      device.send[i] = -2; // placed after the fixed regions
      break;
    case InstrKind::kGatherParam:
    case InstrKind::kStartGather:
    case InstrKind::kWaitGather:
      return unimplemented(instruction_context(g, d, i, instr),
                           ": ZeRO-3 (--zero 3) does not run on CUDA yet; run the plan on CPU "
                           "threads or MPI ranks, or compile it with --zero 2");
    case InstrKind::kStartBucket:
    case InstrKind::kWaitBucket:
      if (instr.index >= program.buckets.size())
        return invalid_argument(instruction_context(g, d, i, instr), ": the program has ",
                                program.buckets.size(), " buckets");
      break;
    default: break;
    }
  }
  return Status::ok();
}

} // namespace

Result<CudaPipelineLayout> cuda_pipeline_layout(const serialization::Plan &plan,
                                                int64_t workspace_bytes, bool bf16,
                                                const std::vector<bool> &local) {
  if (!plan.pipeline) return invalid_argument("the plan has no pipeline (one device)");
  const Graph &g = plan.graph;
  const serialization::PlanPipeline &pipeline = *plan.pipeline;
  // The tensor-parallel collectives the execution core runs.
  const bool tp = pipeline.tensor_parallel > 1;
  RETURN_IF_ERROR(check_cuda_ops(
      g,
      [tp](const Node &node) {
        return tp && ops::collective_of(node.op) != ops::Collective::kNone;
      },
      pipeline.tensor_parallel));
  if (workspace_bytes < 0) return invalid_argument("the workspace cannot be negative");
  if (!local.empty() && local.size() != plan.programs.size())
    return invalid_argument("the local set names ", local.size(), " devices; the plan has ",
                            plan.programs.size());
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
    RETURN_IF_ERROR(size_instructions(plan, d, bf16, device));
    // One GPU moves column blocks in place; over NCCL they are staged.
    device.tp_staging_bytes = core::collective_staging_bytes(g, program, local.empty());
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

CudaPipelineRunner::~CudaPipelineRunner() = default;

namespace {

// Where the plan's devices run: the GPUs of this process (each a rank), or
// across the processes of an MPI job one GPU each (ranks placed as if each
// process were a GPU of its own).
struct Placed {
  GpuPlacement placement;
  GpuRanks ranks;
  std::vector<int> mine; // the ranks this process runs
  ProcessGroup *processes = nullptr;
};

Result<Placed> place(const core::PipelinePlan &plan, const CudaPipelineOptions &options) {
  const auto num_devices = static_cast<size_t>(plan.num_devices());
  int gpus = 0;
  RETURN_IF_ERROR(cuda_check(cudaGetDeviceCount(&gpus), "device count"));
  Placed placed;
  ProcessGroup *processes =
      options.processes != nullptr && options.processes->size() > 1 ? options.processes : nullptr;
  placed.processes = processes;
  std::vector<int> gpu_list = options.gpus;
  if (processes != nullptr) {
    const int k = options.devices_per_process;
    if (!gpu_list.empty())
      return invalid_argument("--gpus places the devices of one process; across MPI processes "
                              "each takes the GPU of its local rank");
    if (k < 1 || static_cast<int64_t>(num_devices) != int64_t{k} * processes->size())
      return invalid_argument("the plan has ", num_devices, " devices; ", processes->size(),
                              " processes of ", k, " device(s) each run ",
                              int64_t{k} * processes->size());
    for (size_t d = 0; d < num_devices; ++d)
      gpu_list.push_back(static_cast<int>(d) / k);
  }
  if (gpu_list.empty() || processes != nullptr) {
    if (options.gpu < 0 || options.gpu >= gpus)
      return invalid_argument(
          "GPU ", options.gpu, " does not exist: this machine has ", gpus,
          processes != nullptr ? " (start at most one process per GPU on each node)" : "");
    if (gpu_list.empty()) gpu_list.assign(num_devices, options.gpu);
  }
  const auto &groups = plan.pipeline().groups;
  ASSIGN_OR_RETURN(placed.placement,
                   place_on_gpus(static_cast<int>(num_devices), groups,
                                 processes != nullptr ? processes->size() : gpus, gpu_list));
  placed.ranks = gpu_ranks(placed.placement);
  const size_t num_ranks = placed.ranks.gpu.size();
  if (num_ranks > 1 && !nccl_built())
    return unimplemented("the plan's devices are on ", num_ranks,
                         " GPUs, which talk over NCCL; this strata was built without NCCL");
  for (size_t r = 0; r < num_ranks; ++r)
    if (processes == nullptr || static_cast<int>(r) == processes->rank())
      placed.mine.push_back(static_cast<int>(r));
  for (size_t k = 0; k < groups.size(); ++k)
    if (placed.placement.group_transport[k] == GpuTransport::kDeviceCopy &&
        groups[k].size() > static_cast<size_t>(cuda::kMaxMembers))
      return unimplemented("group ", k, " has ", groups[k].size(),
                           " devices on one GPU; the CUDA backend sums at most ", cuda::kMaxMembers,
                           " there (spread them over GPUs with --gpus)");
  return placed;
}

// The host values the ranks upload: each part a device of this process
// holds (materialized once per part), and the Constant nodes.
Result<GpuRank::Parts> held_parts(const core::PipelinePlan &plan,
                                  const std::vector<std::unique_ptr<GpuRank>> &ranks,
                                  const std::string &model_dir) {
  GpuRank::Parts parts;
  for (int d = 0; d < plan.num_devices(); ++d) {
    bool here = false;
    for (const auto &rank : ranks)
      here = here || rank->is_local(static_cast<size_t>(d));
    if (!here) continue;
    for (TensorId id : plan.program(d).holds) {
      const core::PipelinePlan::Held held = plan.held(d, id);
      if (parts.contains(held.key())) continue;
      auto value = plan.materialize(held, model_dir);
      if (!value.is_ok()) return value.status().with_context(str_cat("device ", d));
      parts.emplace(held.key(), std::move(value).value());
    }
  }
  return parts;
}

Result<std::map<NodeId, HostTensor>> load_constants(const Graph &g,
                                                    const CudaPipelineLayout &layout) {
  std::map<NodeId, HostTensor> constants;
  for (NodeId n = 0; n < g.num_nodes(); ++n) {
    if (layout.constant[n] < 0) continue; // the same on every GPU
    const Node &node = g.node(n);
    const ops::OpDef *def = ops::OpRegistry::global().find(node.op);
    HostTensor value = HostTensor::zeros(g.tensor(node.outputs[0]).type);
    ops::TensorView view{value.size_bytes() > 0 ? value.data() : nullptr, &value.type};
    ops::KernelContext kernel_context{node, *def, {}, llvm::ArrayRef<ops::TensorView>(view)};
    RETURN_IF_ERROR(def->cpu_kernel(kernel_context)
                        .with_context(str_cat("node '", node.name, "' (", node.op, ")")));
    constants.emplace(n, std::move(value));
  }
  return constants;
}

// The first failure that is not a rank stopping for another's.
Status first_failure(const std::vector<Status> &statuses) {
  Status first = Status::ok();
  for (const Status &status : statuses)
    if (!status.is_ok() &&
        (first.is_ok() ||
         first.message().find("another GPU of the run failed") != std::string::npos))
      first = status;
  return first;
}

// A rank over NCCL: it joins the world and the communicators of its groups
// (every rank must, before any can fail on its own).
Status start_nccl(GpuRank &s, const GpuPlacement &placement, size_t num_ranks,
                  const std::string &id, const NcclCheck &check) {
  RETURN_IF_ERROR(cuda_check(cudaSetDevice(s.gpu), "set device"));
  ASSIGN_OR_RETURN(
      s.world, nccl_init_rank(id, static_cast<int>(num_ranks), s.rank, s.options.timeout, check));
  // A communicator per group spread over GPUs, in group order on every rank
  // (a split is collective over all ranks).
  const auto &groups = s.plan.pipeline().groups;
  for (size_t k = 0; k < groups.size(); ++k) {
    if (placement.group_transport[k] != GpuTransport::kNccl || groups[k].size() < 2) continue;
    int color = -1, key = 0;
    for (size_t m = 0; m < groups[k].size(); ++m)
      if (s.is_local(static_cast<size_t>(groups[k][m])))
        color = static_cast<int>(k), key = static_cast<int>(m);
    ASSIGN_OR_RETURN(auto comm, nccl_split(*s.world, color, key, s.options.timeout, check));
    if (comm) s.group_comms.emplace(static_cast<int>(k), std::move(comm));
  }
  return Status::ok();
}

} // namespace

Result<std::unique_ptr<CudaPipelineRunner>>
CudaPipelineRunner::create(const serialization::Plan &plan, const CudaPipelineOptions &options) {
  const std::string context = str_cat("CUDA pipeline of graph '", plan.graph.name(), "'");
  std::unique_ptr<CudaPipelineRunner> runner(new CudaPipelineRunner());
  ASSIGN_OR_RETURN(runner->plan_, core::PipelinePlan::create(plan, context));
  const core::PipelinePlan &p = *runner->plan_;
  if (options.bf16 && options.f16)
    return invalid_argument("bf16 or f16 GEMM operands, not both").with_context(context);
  const auto &groups = p.pipeline().groups;
  auto order = gpu_launch_order(p.graph(), p.programs(), groups, p.tensor_parallel(),
                                p.pipeline().tp_groups_begin);
  if (!order.is_ok()) return order.status().with_context(context);
  if (std::string reason = cuda_unavailable_reason(); !reason.empty())
    return unavailable(reason).with_context(context);
  auto placed = place(p, options);
  if (!placed.is_ok()) return placed.status().with_context(context);
  runner->processes_ = placed->processes;
  const size_t num_ranks = placed->ranks.gpu.size();
  // Per rank: its devices, its step per launch, its memory.
  for (int r : placed->mine) {
    auto rank = std::make_unique<GpuRank>(p, options);
    rank->gpu =
        placed->processes != nullptr ? options.gpu : placed->ranks.gpu[static_cast<size_t>(r)];
    rank->rank = r;
    rank->rank_of_device = placed->ranks.rank_of_device;
    rank->order = *order;
    if (num_ranks > 1) {
      for (size_t d = 0; d < static_cast<size_t>(p.num_devices()); ++d)
        rank->local.push_back(placed->ranks.rank_of_device[d] == r);
      auto steps = gpu_rank_steps(p.graph(), p.programs(), groups, p.tensor_parallel(),
                                  p.pipeline().tp_groups_begin, *order, placed->placement, r);
      if (!steps.is_ok()) return steps.status().with_context(context);
      rank->steps = std::move(steps).value();
    }
    auto layout = cuda_pipeline_layout(plan, options.workspace_bytes, options.bf16 || options.f16,
                                       rank->local);
    if (!layout.is_ok()) return layout.status().with_context(context);
    rank->layout = std::move(layout).value();
    runner->ranks_.push_back(std::move(rank));
  }
  auto parts = held_parts(p, runner->ranks_, options.model_dir);
  if (!parts.is_ok()) return parts.status().with_context(context);
  ASSIGN_OR_RETURN(const auto constants, load_constants(p.graph(), runner->ranks_[0]->layout));
  // The graph's elementwise chains (each device runs those it has back to
  // back as one kernel; program_chains).
  std::vector<std::vector<NodeId>> chains;
  if (options.fuse) {
    auto topological = p.graph().topological_order();
    if (!topological.is_ok()) return topological.status().with_context(context);
    chains =
        passes::find_elementwise_chains(p.graph(), *topological, cuda::kMaxFused, cuda::kMaxFused);
  }
  auto fail_all = [&](const Status &status) {
    for (auto &rank : runner->ranks_)
      rank->failed = true; // their communicators are aborted, not waited for
    return status.with_context(context);
  };
  auto build = [&](GpuRank &s) { return s.build(*parts, constants, chains); };
  if (num_ranks == 1) {
    RETURN_IF_ERROR(build(*runner->ranks_[0]).with_context(context));
  } else if (runner->processes_ != nullptr) {
    // Rank 0 makes the id and shares it; every process starts its rank, then
    // all learn whether every one did (so none trains beside a dead peer).
    ProcessGroup &processes = *runner->processes_;
    GpuRank &s = *runner->ranks_[0];
    auto id = share_unique_id(processes, [] { return nccl_unique_id(); });
    if (!id.is_ok()) return fail_all(id.status());
    Status started = start_nccl(s, placed->placement, num_ranks, *id, options.watch);
    if (started.is_ok()) started = build(s);
    started = started.with_context(str_cat("process ", processes.rank(), " (GPU ", s.gpu, ")"));
    // A process that failed tells the others at once (they may be waiting
    // in NCCL's start-up for it), then all agree.
    if (!started.is_ok() && options.fail) options.fail(started);
    Status agreed = agree_across(processes, started, "CUDA start-up");
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
        GpuRank &s = *runner->ranks_[r];
        Status status = start_nccl(s, placed->placement, num_ranks, *id, check);
        if (status.is_ok()) status = build(s);
        built[r] = status.with_context(str_cat("GPU ", s.gpu, " (rank ", r, ")"));
        if (!built[r].is_ok()) build_failed = true;
      });
    for (std::thread &thread : threads)
      thread.join();
    if (Status first = first_failure(built); !first.is_ok()) return fail_all(first);
  }
  return runner;
}

Status CudaPipelineRunner::launch_rank(GpuRank &s, llvm::ArrayRef<HostTensor> inputs) {
  const auto start = std::chrono::steady_clock::now();
  s.issue_seconds = 0;
  RETURN_IF_ERROR(cuda_check(cudaSetDevice(s.gpu), "set device"));
  s.host.clear();
  s.read_error = Status::ok();
  const Graph &g = plan_->graph();
  for (size_t k = 0; k < inputs.size(); ++k)
    if (s.input_bytes[k] > 0)
      RETURN_IF_ERROR(
          cuda_check(cudaMemcpyAsync(s.input_staging[k], inputs[k].data(), s.input_bytes[k],
                                     cudaMemcpyHostToDevice, s.origin),
                     str_cat("copying input '", g.tensor(g.inputs()[k]).name, "'")));
  RETURN_IF_ERROR(s.step.launch(
      s.origin, s.options.cuda_graph, [&] { return s.enqueue(); }, [&] { return s.record(); }));
  s.issue_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return Status::ok();
}

Status CudaPipelineRunner::run_ranks(llvm::ArrayRef<HostTensor> inputs) {
  auto run_rank = [&](GpuRank &s) -> Status {
    RETURN_IF_ERROR(launch_rank(s, inputs));
    return s.wait("the step");
  };
  auto where = [&](size_t r) { return str_cat("GPU ", ranks_[r]->gpu, " (rank ", r, ")"); };
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
      status = launch_rank(*ranks_[r], inputs).with_context(where(r));
    for (size_t r = 0; r < ranks_.size() && status.is_ok(); ++r)
      status = ranks_[r]->wait("the step").with_context(where(r));
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
        statuses[r] = run_rank(*ranks_[r]).with_context(where(r));
        if (!statuses[r].is_ok()) stop = true;
      });
    }
    for (std::thread &thread : threads)
      thread.join();
    for (const auto &rank : ranks_)
      rank->stop = nullptr;
    status = first_failure(statuses);
  }
  if (status.is_ok()) {
    // One thread launched every replay in turn; else each GPU's thread its own.
    issue_seconds_ = 0;
    for (const auto &rank : ranks_)
      issue_seconds_ = replays && ranks_.size() > 1 ? issue_seconds_ + rank->issue_seconds
                                                    : std::max(issue_seconds_, rank->issue_seconds);
  }
  return status;
}

Status CudaPipelineRunner::run(llvm::ArrayRef<HostTensor> inputs,
                               std::vector<HostTensor> *outputs) {
  issue_seconds_ = -1;
  for (const auto &rank : ranks_)
    if (rank->failed)
      return failed_precondition("an earlier step of this pipeline failed; its state is lost");
  RETURN_IF_ERROR(plan_->check_batch(inputs));
  const Graph &g = plan_->graph();
  Status status = run_ranks(inputs);
  // This process's outputs and device checks.
  std::vector<std::optional<HostTensor>> kept(g.outputs().size());
  for (size_t k = 0; k < kept.size() && status.is_ok(); ++k)
    for (const auto &rank : ranks_) {
      if (rank->outputs[k].device < 0) continue;
      HostTensor out = HostTensor::zeros(g.tensor(g.outputs()[k]).type);
      if (out.size_bytes() > 0)
        status = cuda_check(
            cudaMemcpy(out.data(), rank->outputs[k].data, out.size_bytes(), cudaMemcpyDefault),
            "copying an output");
      kept[k] = std::move(out);
      break;
    }
  for (const auto &rank : ranks_)
    if (status.is_ok()) status = rank->check_flags();
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
    for (TensorId id : g.outputs())
      types.push_back(g.tensor(id).type);
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

GpuRank *CudaPipelineRunner::rank_of(size_t d) const {
  for (const auto &rank : ranks_)
    if (rank->is_local(d)) {
      cuda_check(cudaSetDevice(rank->gpu), "set device").ignore();
      return rank.get();
    }
  return nullptr;
}

std::optional<HostTensor> CudaPipelineRunner::read(int d, TensorId id, Status &error) const {
  GpuRank *rank = rank_of(static_cast<size_t>(d));
  const std::byte *address = rank ? rank->held_at(static_cast<size_t>(d), id) : nullptr;
  if (address == nullptr && (rank == nullptr || !plan_->holds(d, id))) return std::nullopt;
  HostTensor value = HostTensor::zeros(plan_->held(d, id).type);
  if (value.size_bytes() > 0 && error.is_ok())
    error = cuda_check(cudaMemcpy(value.data(), address, value.size_bytes(), cudaMemcpyDefault),
                       str_cat("reading '", graph().tensor(id).name, "'"));
  return value;
}

const HostTensor &CudaPipelineRunner::value(TensorId id) const {
  GpuRank &cache = *ranks_[0];
  auto cached = cache.host.find(id);
  if (cached != cache.host.end()) return cached->second;
  // A read that fails leaves the value zero and is reported by read_status().
  Status read_error = Status::ok();
  for (const auto &rank : ranks_)
    if (read_error.is_ok()) read_error = rank->wait("a read");
  std::optional<HostTensor> whole;
  if (read_error.is_ok())
    whole = plan_->whole_value(
        id, [this](int d) { return rank_of(static_cast<size_t>(d)) != nullptr; },
        [&](int d, TensorId t) { return read(d, t, read_error); });
  if (!read_error.is_ok()) {
    if (cache.read_error.is_ok())
      cache.read_error =
          std::move(read_error).with_context(str_cat("reading '", graph().tensor(id).name, "'"));
    whole.reset();
  }
  if (!whole) whole = HostTensor::zeros(value_type(id));
  return cache.host.emplace(id, std::move(*whole)).first->second;
}

Status CudaPipelineRunner::read_status() const { return ranks_[0]->read_error; }

Status CudaPipelineRunner::assign(TensorId id, const HostTensor &value) {
  const TensorType type = value_type(id);
  RETURN_IF_ERROR(check_assignable(graph(), id, value, &type));
  for (const auto &rank : ranks_)
    RETURN_IF_ERROR(rank->wait("the step before an assignment"));
  bool written = false;
  // The parts are copied from host memory that lives until the copies are
  // waited for below.
  RETURN_IF_ERROR(
      plan_->split_value(id, value, [&](int d, const std::byte *from, size_t bytes) -> Status {
        GpuRank *rank = rank_of(static_cast<size_t>(d));
        if (rank == nullptr) return Status::ok(); // another process's
        written = true;
        if (bytes == 0) return Status::ok();
        return cuda_check(
            cudaMemcpy(rank->held_at(static_cast<size_t>(d), id), from, bytes, cudaMemcpyDefault),
            str_cat("assigning '", graph().tensor(id).name, "'"));
      }));
  // Across processes, a tensor only other processes hold is theirs to set.
  if (!written && processes_ == nullptr)
    return invalid_argument("no device of the plan holds '", graph().tensor(id).name, "'");
  ranks_[0]->host.erase(id);
  return Status::ok();
}

Result<std::map<std::string, HostTensor>> CudaPipelineRunner::checkpoint_pieces() const {
  for (const auto &rank : ranks_)
    RETURN_IF_ERROR(rank->wait("the step before a checkpoint"));
  Status copied = Status::ok();
  auto pieces =
      plan_->checkpoint_pieces([this](int d) { return rank_of(static_cast<size_t>(d)) != nullptr; },
                               [&](int d, TensorId t) { return read(d, t, copied); });
  RETURN_IF_ERROR(copied);
  return pieces;
}

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
