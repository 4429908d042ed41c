#include "runtime/cuda/gpu_rank.h"

#if STRATA_HAVE_CUDA

#include <algorithm>
#include <chrono>

#include "graph/units.h"
#include "ops/kernels/cuda/cuda_status.h"
#include "ops/kernels/cuda/launch.h"
#include "plan/instructions.h"
#include "runtime/comm/collectives.h"
#if STRATA_HAVE_NCCL
#include <nccl.h>
#endif

namespace strata::runtime {

using serialization::InstrKind;

Status GpuRank::Device::run_node(size_t instruction) {
  const core::Op &op = program.ops[instruction];
  Extra &x = extras[instruction];
  if (x.skip) return Status::ok();
  if (x.fused)
    return cuda_check(cuda::fused_elementwise(*x.fused, static_cast<float *>(op.outputs[0].data),
                                              op.outputs[0].type->num_elements(), stream),
                      "launch");
  if (x.op == nullptr)
    return copy(op.outputs[0].data, x.constant,
                static_cast<size_t>(op.outputs[0].type->size_bytes()));
  const CudaPipelineOptions &o = rank_.options;
  cuda::CudaKernelContext context{*op.node,     *op.def,
                                  op.inputs,    op.outputs,
                                  stream,       rank_.lt_,
                                  workspace,    static_cast<size_t>(o.workspace_bytes),
                                  scratch,      flags + instruction,
                                  o.tf32,       cudnn,
                                  x.cache,      bf16,
                                  o.f16,        op.member,
                                  op.parts,     o.cudnn_pool_norm,
                                  scratch_bytes};
  return x.op->kernel(context);
}

// The checks were combined once, at the step's first update (on one GPU
// here, over several by share_flags): every device's updates read that one
// verdict, so all of them are skipped or none.
Status GpuRank::Device::update(size_t instruction) {
  if (!checked) {
    if (rank_.steps.empty() && !rank_.flags_combined_) {
      RETURN_IF_ERROR(rank_.combine_local_flags());
      RETURN_IF_ERROR(
          cuda_check(cudaEventRecord(rank_.flags_shared_,
                                     rank_.device(static_cast<int>(rank_.first_local())).stream),
                     "event record"));
    }
    RETURN_IF_ERROR(cuda_check(cudaStreamWaitEvent(stream, rank_.flags_shared_, 0), "event wait"));
    checked = true;
  }
  const core::Op &op = program.ops[instruction];
  return cuda_check(cuda::guarded_copy(op.data, op.source, static_cast<int64_t>(op.bytes),
                                       rank_.rank_any_, stream),
                    "launch");
}

GpuRank::~GpuRank() {
  cuda_check(cudaSetDevice(gpu), "set device").ignore();
  if (failed || stuck) abort_comms();
  // A step that ran out of time may still be running (or hung): after the
  // comms are aborted it gets a short, bounded wait; if it still has not
  // finished, memory and handles are left alone rather than freed, since
  // cudaFree and cudnnDestroy would wait for it unbounded.
  if (stuck && !wait_for_stream(origin, "teardown", std::chrono::seconds(2)).is_ok()) {
    for (auto &device : devices_)
      (void)device.release(); // its streams and cuDNN handle stay, on purpose
    return;
  }
  step.reset(); // the graph goes before the streams and memory it uses
  group_comms.clear();
  world.reset();
  for (cudaEvent_t event : events_)
    cudaEventDestroy(event);
  devices_.clear();
  if (lt_) cublasLtDestroy(lt_);
  if (origin) cudaStreamDestroy(origin);
  if (base_) cudaFree(base_);
}

GpuRank::Extra &GpuRank::extra(int d, size_t instruction) const {
  return device(d).extras[instruction];
}

Result<cudaEvent_t> GpuRank::make_event() {
  cudaEvent_t event = nullptr;
  RETURN_IF_ERROR(cuda_check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "event"));
  events_.push_back(event);
  return event;
}

Status GpuRank::copy(void *to, const void *from, size_t bytes, cudaStream_t stream) {
  if (bytes == 0 || to == from) return Status::ok();
  return cuda_check(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stream), "copy");
}

// `rows` rows of `width` bytes, `from_pitch` apart, to `to_pitch` apart.
Status GpuRank::copy_block(void *to, size_t to_pitch, const void *from, size_t from_pitch,
                           size_t width, size_t rows, cudaStream_t stream) {
  if (width == 0 || rows == 0) return Status::ok();
  if (rows == 1) return copy(to, from, width, stream); // no pitch limit
  return cuda_check(cudaMemcpy2DAsync(to, to_pitch, from, from_pitch, width, rows,
                                      cudaMemcpyDeviceToDevice, stream),
                    "copy");
}

void GpuRank::abort_comms() {
  for (auto &[group, comm] : group_comms)
    if (comm) comm->abort();
  if (world) world->abort();
}

// What a bounded wait also watches over NCCL: the communicators' errors and
// the other ranks' failures.
Status GpuRank::watch() const {
  if (stop != nullptr && stop->load()) return aborted_by_peer();
  if (options.watch) RETURN_IF_ERROR(options.watch());
  if (world) RETURN_IF_ERROR(nccl_async_error(*world, str_cat("on GPU ", gpu)));
  for (const auto &[group, comm] : group_comms)
    if (comm) RETURN_IF_ERROR(nccl_async_error(*comm, str_cat("group ", group, " on GPU ", gpu)));
  return Status::ok();
}

Status GpuRank::aborted_by_peer() const {
  return failed_precondition("GPU ", gpu, " stopped: another GPU of the run failed");
}

Status GpuRank::wait(std::string_view what) const {
  Status status = steps.empty()
                      ? wait_for_stream(origin, what, options.timeout)
                      : wait_for_stream(origin, what, options.timeout, [this] { return watch(); });
  if (status.code() != StatusCode::kDeadlineExceeded) return status;
  stuck = true;
  // Launched eagerly (not replayed), each device's join events say which
  // devices have not finished their part of the step.
  if (step.replays_next() || joins_.empty()) return status;
  std::string unfinished;
  for (size_t d = 0; d < devices_.size(); ++d)
    if (is_local(d) && (cudaEventQuery(joins_[2 * d]) == cudaErrorNotReady ||
                        cudaEventQuery(joins_[2 * d + 1]) == cudaErrorNotReady))
      unfinished += str_cat(unfinished.empty() ? "" : ", ", d);
  if (unfinished.empty()) return status;
  return std::move(status).with_context(str_cat("devices not finished: ", unfinished));
}

std::byte *GpuRank::held_at(size_t d, TensorId id) const {
  if (!is_local(d)) return nullptr;
  auto it = devices_[d]->held.find(id);
  return it == devices_[d]->held.end() ? nullptr : it->second;
}

size_t GpuRank::first_local() const {
  for (size_t d = 0; d < devices_.size(); ++d)
    if (is_local(d)) return d;
  return devices_.size();
}

NcclComm *GpuRank::group_comm(int group) const {
  auto it = group_comms.find(group);
  return it == group_comms.end() ? nullptr : it->second.get();
}

CaptureRecord GpuRank::record() const {
  const Graph &g = plan.graph();
  CaptureRecord r;
  for (size_t k = 0; k < input_staging.size(); ++k)
    r.add(str_cat("the batch of '", g.tensor(g.inputs()[k]).name, "'"), input_staging[k],
          g.tensor(g.inputs()[k]).type);
  for (size_t d = 0; d < devices_.size(); ++d) {
    if (!is_local(d)) continue;
    for (const auto &[id, address] : devices_[d]->held)
      r.add(str_cat("device ", d, ": '", g.tensor(id).name, "'"), address, g.tensor(id).type);
  }
  return r;
}

namespace {

// Whether the graph needs cuDNN (convolutions), or would take it where it
// starts (pooling and batch norm; strata's kernels otherwise).
bool uses(const Graph &g, llvm::ArrayRef<std::string_view> ops) {
  return std::any_of(g.nodes().begin(), g.nodes().end(), [&](const Node &n) {
    return std::find(ops.begin(), ops.end(), n.op) != ops.end();
  });
}

} // namespace

Status GpuRank::build(const Parts &parts, const std::map<NodeId, HostTensor> &constants,
                      const std::vector<std::vector<NodeId>> &chains) {
  const CudaPipelineLayout &l = layout;
  const Graph &g = plan.graph();
  RETURN_IF_ERROR(cuda_check(cudaSetDevice(gpu), "set device"));
  device_name = gpu_name(gpu);
  void *base = nullptr;
  RETURN_IF_ERROR(cuda_check(cudaMalloc(&base, static_cast<size_t>(std::max<int64_t>(l.total, 1))),
                             str_cat("allocating ", human_bytes(static_cast<double>(l.total)), " (",
                                     l.total, " bytes) on GPU ", gpu)));
  base_ = static_cast<std::byte *>(base);
  RETURN_IF_ERROR(cuda_check(cudaStreamCreateWithFlags(&origin, cudaStreamNonBlocking), "stream"));
  RETURN_IF_ERROR(
      cuda_check(cudaMemsetAsync(base, 0, static_cast<size_t>(l.total), origin), "memset"));
  RETURN_IF_ERROR(cuda::cublas_status(cublasLtCreate(&lt_), "could not start"));
  ASSIGN_OR_RETURN(fork_, make_event());
  flags_ = reinterpret_cast<int *>(base_ + l.flags);
  rank_any_ = flags_ + l.instruction_flags;
  ASSIGN_OR_RETURN(flags_shared_, make_event());
  if (!steps.empty()) {
    ASSIGN_OR_RETURN(nccl_done_, make_event());
  }
  const size_t num_devices = plan.programs().size();
  devices_.resize(num_devices);
  marks_.assign(num_devices, nullptr);
  joins_.assign(2 * num_devices, nullptr);
  for (size_t d = 0; d < num_devices; ++d)
    if (is_local(d)) RETURN_IF_ERROR(build_device(d, parts));
  for (const auto &[n, value] : constants)
    if (value.size_bytes() > 0)
      RETURN_IF_ERROR(
          cuda_check(cudaMemcpyAsync(base_ + l.constant[n], value.data(), value.size_bytes(),
                                     cudaMemcpyHostToDevice, origin),
                     "uploading a constant"));
  // The host buffers above must outlive their copies.
  RETURN_IF_ERROR(wait("the uploads"));
  const std::vector<TensorType> batch = plan.batch_types();
  for (size_t k = 0; k < g.inputs().size(); ++k) {
    input_staging.push_back(base_ + l.input[k]);
    input_bytes.push_back(static_cast<size_t>(batch[k].size_bytes()));
  }
  outputs.assign(g.outputs().size(), {});
  for (size_t d = 0; d < num_devices; ++d)
    if (is_local(d)) RETURN_IF_ERROR(resolve(d, chains));
  RETURN_IF_ERROR(wire_launches());
  std::vector<core::DeviceProgram *> programs(num_devices, nullptr);
  std::vector<core::DeviceBackend *> backends(num_devices, nullptr);
  for (size_t d = 0; d < num_devices; ++d)
    if (is_local(d)) programs[d] = &devices_[d]->program, backends[d] = devices_[d].get();
  issuer_ = std::make_unique<core::Issuer>(plan, std::move(programs), std::move(backends), *this);
  return Status::ok();
}

// A device's streams, regions and held tensors (uploaded on the origin stream).
Status GpuRank::build_device(size_t d, const Parts &parts) {
  const Graph &g = plan.graph();
  const CudaPipelineLayout::Device &region = layout.devices[d];
  devices_[d] = std::make_unique<Device>(*this, static_cast<int>(d));
  Device &device = *devices_[d];
  RETURN_IF_ERROR(
      cuda_check(cudaStreamCreateWithFlags(&device.stream, cudaStreamNonBlocking), "stream"));
  RETURN_IF_ERROR(
      cuda_check(cudaStreamCreateWithFlags(&device.side, cudaStreamNonBlocking), "stream"));
  std::vector<std::string_view> cudnn_ops;
  for (const cuda::CudaOp &op : cuda::cudnn_ops())
    cudnn_ops.push_back(op.name);
  const bool needs_cudnn = uses(g, cudnn_ops);
  if (needs_cudnn || (options.cudnn_pool_norm && uses(g, cuda::cudnn_preferred_ops()))) {
    Result<void *> handle = cuda::start_cudnn(device.stream);
    if (handle.is_ok())
      device.cudnn = *handle;
    else if (needs_cudnn)
      return handle.status();
  }
  device.scratch = base_ + region.scratch;
  device.scratch_bytes = region.scratch_bytes;
  device.workspace = base_ + region.workspace;
  if (region.bf16 >= 0) device.bf16 = base_ + region.bf16;
  if (region.tp_staging >= 0) device.tp_staging = base_ + region.tp_staging;
  device.flags = flags_ + region.first_flag;
  for (const auto &[id, offset] : region.held) {
    device.held[id] = base_ + offset;
    const HostTensor &value = parts.at(plan.held(static_cast<int>(d), id).key());
    if (value.size_bytes() > 0)
      RETURN_IF_ERROR(cuda_check(cudaMemcpyAsync(base_ + offset, value.data(), value.size_bytes(),
                                                 cudaMemcpyHostToDevice, origin),
                                 str_cat("uploading '", g.tensor(id).name, "'")));
  }
  for (size_t k = 0; k < 2; ++k) {
    ASSIGN_OR_RETURN(joins_[2 * d + k], make_event());
  }
  ASSIGN_OR_RETURN(marks_[d], make_event());
  return Status::ok();
}

// The device's program through the core, and what the GPU keeps beside each
// instruction: its kernel and plan cache, a Constant's value, its events and
// a send's staging; then its elementwise chains fused.
Status GpuRank::resolve(size_t d, const std::vector<std::vector<NodeId>> &chains) {
  const Graph &g = plan.graph();
  Device &device = *devices_[d];
  core::DeviceMemory memory;
  memory.arena = base_ + layout.devices[d].arena;
  memory.held = [&device](TensorId id) -> std::byte * {
    auto it = device.held.find(id);
    return it == device.held.end() ? nullptr : it->second;
  };
  memory.staging = device.tp_staging;
  ASSIGN_OR_RETURN(device.program, core::resolve_program(plan, static_cast<int>(d), memory));
  std::vector<const std::byte *> bases(input_staging.begin(), input_staging.end());
  core::bind_batch(device.program, plan, bases);
  const auto &instructions = plan.program(static_cast<int>(d)).instructions;
  device.extras.resize(instructions.size());
  for (size_t i = 0; i < instructions.size(); ++i) {
    const core::Op &op = device.program.ops[i];
    Extra &x = device.extras[i];
    switch (op.kind) {
    case InstrKind::kCompute:
    case InstrKind::kComputeShard: {
      x.op = cuda::find_cuda_op(op.node->op);
      x.cache = &device.caches[{instructions[i].index, op.microbatch}];
      if (x.op == nullptr && layout.constant[instructions[i].index] >= 0)
        x.constant = base_ + layout.constant[instructions[i].index];
      if (ops::communicates_forward(op.collective)) {
        ASSIGN_OR_RETURN(x.arrived, make_event());
      }
      break;
    }
    case InstrKind::kSend: {
      x.staging = base_ + layout.devices[d].send[i];
      ASSIGN_OR_RETURN(x.sent, make_event());
      break;
    }
    case InstrKind::kAllReduce:
    case InstrKind::kReduceScatter:
    case InstrKind::kAllGather:
    case InstrKind::kReduceScatterAccumulate:
    case InstrKind::kStartBucket: {
      ASSIGN_OR_RETURN(x.arrived, make_event());
      break;
    }
    default: break;
    }
  }
  // Elementwise chains whose nodes run back to back: one kernel at the last
  // node's place, the others skipped.
  for (const ProgramChain &run : program_chains(g, plan.program(static_cast<int>(d)), chains)) {
    ASSIGN_OR_RETURN(std::unique_ptr<cuda::Fused> fused,
                     fused_chain_program(g, chains[run.chain], [&](TensorId t) -> const void * {
                       for (size_t i = run.first; i <= run.last; ++i) {
                         const core::Op &op = device.program.ops[i];
                         for (size_t j = 0; j < op.node->inputs.size(); ++j)
                           if (op.node->inputs[j] == t) return op.inputs[j].data;
                       }
                       return nullptr;
                     }));
    for (size_t i = run.first; i < run.last; ++i)
      device.extras[i].skip = true;
    device.extras[run.last].fused = std::move(fused);
    ++fused_chains;
  }
  for (size_t k = 0; k < g.outputs().size(); ++k)
    if (device.program.outputs[k] != nullptr && outputs[k].device < 0)
      outputs[k] = {static_cast<int>(d), device.program.outputs[k]};
  return Status::ok();
}

// Wires the launches: each receive to its send where both are here, each
// collective to the event its members wait for, each WaitBucket to its
// bucket's. Over several GPUs only this GPU's parts: a receive whose send is
// elsewhere is NCCL's.
Status GpuRank::wire_launches() {
  ASSIGN_OR_RETURN(const std::vector<GpuLaunch::Part> sends,
                   gpu_matching_sends(plan.programs(), order));
  for (size_t k = 0; k < order.size(); ++k) {
    const GpuLaunch &launch = order[k];
    const GpuLaunch::Part &lead = launch.parts[0];
    const auto &instr = plan.program(lead.device).instructions[lead.instruction];
    if (!launch.reduce && instr.kind == InstrKind::kRecv) {
      const GpuLaunch::Part send = sends[k];
      if (is_local(static_cast<size_t>(lead.device)) && is_local(static_cast<size_t>(send.device)))
        extra(lead.device, lead.instruction).matching = &extra(send.device, send.instruction);
      continue;
    }
    if (!launch.reduce && launch.parts.size() == 1 && !plan::is_collective(instr.kind)) continue;
    ASSIGN_OR_RETURN(cudaEvent_t done, make_event());
    reduced_.push_back(done);
    for (const GpuLaunch::Part &part : launch.parts) {
      if (!is_local(static_cast<size_t>(part.device))) continue;
      extra(part.device, part.instruction).reduced = &reduced_.back();
      if (launch.reduce)
        device(part.device)
            .bucket_done[plan.program(part.device).instructions[part.instruction].index] = done;
    }
  }
  for (size_t d = 0; d < devices_.size(); ++d) {
    if (!is_local(d)) continue;
    const core::DeviceProgram &program = devices_[d]->program;
    for (size_t i = 0; i < program.ops.size(); ++i)
      if (program.ops[i].kind == InstrKind::kWaitBucket &&
          !devices_[d]->bucket_done.contains(program.ops[i].bucket))
        return invalid_argument(plan.context(static_cast<int>(d), i),
                                ": the bucket is never started");
  }
  return Status::ok();
}

Status GpuRank::enqueue() {
  RETURN_IF_ERROR(cuda_check(
      cudaMemsetAsync(flags_, 0, static_cast<size_t>(layout.flag_count) * sizeof(int), origin),
      "memset"));
  RETURN_IF_ERROR(cuda_check(cudaEventRecord(fork_, origin), "event record"));
  nccl_stream_ = nullptr;
  flags_combined_ = false;
  Status status = Status::ok();
  for (size_t d = 0; d < devices_.size(); ++d) {
    if (!is_local(d)) continue;
    Device &device = *devices_[d];
    device.checked = false;
    if (status.is_ok())
      status = cuda_check(cudaStreamWaitEvent(device.stream, fork_, 0), "event wait");
    if (status.is_ok())
      status = cuda_check(cudaStreamWaitEvent(device.side, fork_, 0), "event wait");
  }
  for (size_t k = 0; k < order.size() && status.is_ok(); ++k) {
    status = steps.empty() ? launch(k) : rank_step(k);
    if (!status.is_ok()) {
      // Name an instruction of this GPU's where the launch has one.
      const GpuLaunch::Part part = steps.empty() ? order[k].parts[0] : steps[k].part;
      status = std::move(status).with_context(is_local(static_cast<size_t>(part.device))
                                                  ? plan.context(part.device, part.instruction)
                                                  : str_cat("launch ", k));
    }
  }
  for (size_t d = 0; d < devices_.size(); ++d) {
    if (!is_local(d)) continue;
    Status joined = cuda_check(cudaEventRecord(joins_[2 * d], devices_[d]->stream), "event record");
    if (joined.is_ok())
      joined = cuda_check(cudaEventRecord(joins_[2 * d + 1], devices_[d]->side), "event record");
    if (joined.is_ok())
      joined = cuda_check(cudaStreamWaitEvent(origin, joins_[2 * d], 0), "event wait");
    if (joined.is_ok())
      joined = cuda_check(cudaStreamWaitEvent(origin, joins_[2 * d + 1], 0), "event wait");
    if (status.is_ok()) status = joined;
  }
  return status;
}

// Launch k of the order, all of it on this GPU.
Status GpuRank::launch(size_t k) {
  const GpuLaunch &launch = order[k];
  std::vector<core::Part> parts;
  for (const GpuLaunch::Part &part : launch.parts)
    parts.push_back({part.device, part.instruction});
  return issuer_->issue(parts, launch.reduce);
}

// Launch k on this GPU of a run over several: as on one GPU where every part
// is here, NCCL where the launch crosses GPUs (gpu_rank_steps).
Status GpuRank::rank_step(size_t k) {
#if STRATA_HAVE_NCCL
  const GpuRankStep &step = steps[k];
  if (step.share_flags) RETURN_IF_ERROR(share_flags());
  switch (step.action) {
  case GpuRankAction::kSkip: return Status::ok();
  case GpuRankAction::kLocal: return launch(k);
  case GpuRankAction::kNcclSend: return send_out(step);
  case GpuRankAction::kNcclRecv:
  case GpuRankAction::kNcclCollective:
    return issuer_->issue({{step.part.device, step.part.instruction}}, order[k].reduce);
  }
  return internal_error("unknown rank step");
#else
  (void)k;
  return unimplemented("this strata was built without NCCL");
#endif
}

// The checks of every local device so far, into rank_any_ (on the first
// local device's stream, after every other local device's work so far).
// At the step's first update: every forward check precedes every update
// through the transfers; a backward check of another stage may come later
// (today those repeat forward checks: an index the forward Gather already
// flagged), and is then missed by every device alike.
Status GpuRank::combine_local_flags() {
  const size_t first = first_local();
  cudaStream_t stream = devices_.at(first)->stream;
  for (size_t d = first + 1; d < devices_.size(); ++d) {
    if (!is_local(d)) continue;
    RETURN_IF_ERROR(cuda_check(cudaEventRecord(marks_[d], devices_[d]->stream), "event record"));
    RETURN_IF_ERROR(cuda_check(cudaStreamWaitEvent(stream, marks_[d], 0), "event wait"));
  }
  flags_combined_ = true;
  return cuda_check(cuda::any_flag(flags_, layout.instruction_flags, rank_any_, stream), "launch");
}

Status GpuRank::check_flags() const {
  Status status = Status::ok();
  for (size_t d = 0; d < devices_.size() && status.is_ok(); ++d) {
    if (!is_local(d) || devices_[d]->extras.empty()) continue;
    const Device &device = *devices_[d];
    std::vector<int> flags(device.extras.size());
    status = cuda_check(
        cudaMemcpy(flags.data(), device.flags, flags.size() * sizeof(int), cudaMemcpyDefault),
        "reading the error flags");
    for (size_t i = 0; i < flags.size() && status.is_ok(); ++i)
      if (flags[i] != 0) {
        const cuda::CudaOp *op = device.extras[i].op;
        status = out_of_range(op == nullptr || op->flag_meaning.empty()
                                  ? std::string_view("device check failed")
                                  : op->flag_meaning)
                     .with_context(plan.context(static_cast<int>(d), i));
      }
  }
  return status;
}

} // namespace strata::runtime

#endif
