#include "runtime/cpu/pipeline_runner.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include <signal.h>

#include "graph/units.h"
#include "ops/kernels/cpu/gemm.h"
#include "plan/instructions.h"
#include "plan/memory.h"
#include "runtime/cpu/comm_transport.h"
#include "runtime/cpu/cpu_device.h"
#include "runtime/cpu/executor.h"

namespace strata::runtime {

// One device of this process: its arena, its parts of the tensors it holds,
// the staging of its collectives, and its resolved program.
struct PipelineRunner::Device {
  int index = 0;
  std::shared_ptr<Blob> arena;
  std::map<TensorId, HostTensor> weights; // each held tensor's part
  std::shared_ptr<Blob> staging;          // tensor-parallel collectives
  std::vector<float> bucket_staging;      // the largest gradient bucket, packed
  core::DeviceProgram program;
  std::unique_ptr<CpuDevice> backend;
};

PipelineRunner::~PipelineRunner() = default;

namespace {

double seconds_since(std::chrono::steady_clock::time_point epoch) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch).count();
}

// What this process's devices need, before any of it is allocated.
Status check_memory(const serialization::Plan &plan, const DeviceWorld &world) {
  int64_t total = 0, largest = 0;
  int local = 0;
  size_t largest_device = 0;
  for (size_t d = 0; d < plan.programs.size(); ++d) {
    if (!world.is_local(static_cast<int>(d))) continue;
    const int64_t bytes = plan::device_memory(plan, d);
    total += bytes;
    ++local;
    if (bytes > largest) largest = bytes, largest_device = d;
  }
  return check_host_memory(total,
                           str_cat("the pipeline's ", local, local == 1 ? " device" : " devices",
                                   " in this process need"),
                           str_cat("activations, weights and optimizer state; the largest, device ",
                                   largest_device, ", ",
                                   human_bytes(static_cast<double>(largest))));
}

// Hands out a device's memory (DeviceWorld::shared_memory) in 64-byte
// aligned blocks; with none, each block is a fresh allocation.
class Placer {
public:
  Placer(std::span<std::byte> memory, std::shared_ptr<const void> owner, int device)
      : memory_(memory), owner_(std::move(owner)), device_(device) {}
  // `bytes` zeroed bytes for `what`.
  Result<std::shared_ptr<Blob>> zeroed(size_t bytes, std::string_view what) {
    if (memory_.empty()) return Blob::zeroed(bytes);
    ASSIGN_OR_RETURN(std::shared_ptr<Blob> blob, carve(bytes, what));
    std::memset(blob->mutable_data(), 0, bytes);
    return blob;
  }
  // `value` itself, or moved into the memory.
  Result<HostTensor> place(HostTensor value, std::string_view what) {
    if (memory_.empty() || !value.blob) return value;
    ASSIGN_OR_RETURN(std::shared_ptr<Blob> blob, carve(value.size_bytes(), what));
    if (value.size_bytes() > 0) std::memcpy(blob->mutable_data(), value.data(), value.size_bytes());
    value.blob = std::move(blob);
    return value;
  }

private:
  // The next `bytes` of the memory, as they are.
  Result<std::shared_ptr<Blob>> carve(size_t bytes, std::string_view what) {
    const size_t at = (used_ + 63) / 64 * 64;
    if (at > memory_.size() || memory_.size() - at < bytes)
      return internal_error("device ", device_, "'s shared memory (",
                            human_bytes(static_cast<double>(memory_.size())), ") has no room for ",
                            what, " (", human_bytes(static_cast<double>(bytes)), ")");
    used_ = at + bytes;
    return Blob::borrowed(memory_.data() + at, bytes, owner_);
  }

  std::span<std::byte> memory_;
  std::shared_ptr<const void> owner_;
  int device_;
  size_t used_ = 0;
};

} // namespace

std::vector<size_t> shared_memory_bytes(const serialization::Plan &plan) {
  // Only a plan with collectives gains from it.
  if (!plan.pipeline || plan.pipeline->groups.empty()) return {};
  std::vector<size_t> bytes;
  auto block = [](int64_t n) {
    return (static_cast<size_t>(std::max<int64_t>(n, 0)) + 63) / 64 * 64;
  };
  for (size_t d = 0; d < plan.programs.size(); ++d) {
    const serialization::PlanProgram &program = plan.programs[d];
    size_t total = block(program.arena_bytes) +
                   block(core::collective_staging_bytes(plan.graph, program, false));
    int64_t shards = 1;
    if (program.shard_group >= 0 &&
        static_cast<size_t>(program.shard_group) < plan.pipeline->groups.size())
      shards = std::max<int64_t>(
          1, static_cast<int64_t>(plan.pipeline->groups[program.shard_group].size()));
    for (TensorId id : program.holds) {
      if (id >= plan.graph.num_tensors()) continue; // refused when the plan is read
      const TensorType &type = plan.graph.tensor(id).type;
      const bool sharded =
          std::binary_search(program.sharded_holds.begin(), program.sharded_holds.end(), id);
      // A part is at most the tensor; a shard at most its rounded-up share.
      const int64_t elements = type.num_elements();
      const int64_t share = sharded ? (elements + shards - 1) / shards : elements;
      total += block(share * static_cast<int64_t>(dtype_size(type.dtype)));
    }
    bytes.push_back(total);
  }
  return bytes;
}

size_t shared_segment_bytes(const serialization::Plan &plan) {
  for (const serialization::PlanProgram &program : plan.programs) {
    if (!program.buckets.empty()) return kSegmentBytes;
    for (const serialization::PlanInstruction &instr : program.instructions)
      if (instr.kind == serialization::InstrKind::kStartGather) return kSegmentBytes;
  }
  return 0;
}

Result<std::unique_ptr<PipelineRunner>>
PipelineRunner::create(const serialization::Plan &plan, const PipelineRunnerOptions &options) {
  std::unique_ptr<PipelineRunner> runner(new PipelineRunner());
  ASSIGN_OR_RETURN(runner->plan_, core::PipelinePlan::create(plan, "pipeline plan"));
  const core::PipelinePlan &p = *runner->plan_;
  runner->options_ = options;
  if (options.timeout.count() <= 0) return invalid_argument("the timeout must be positive");
  const int num_devices = p.num_devices();
  runner->world_ = options.world ? options.world
                                 : std::make_shared<LocalDeviceWorld>(num_devices, options.timeout);
  DeviceWorld &world = *runner->world_;
  if (world.num_devices() != num_devices)
    return invalid_argument("the plan has ", num_devices, " devices but the run has ",
                            world.num_devices());
  for (int d = 0; d < num_devices; ++d)
    runner->all_local_ = runner->all_local_ && world.is_local(d);
  if (options.clock == PipelineRunnerOptions::Clock::kDevice) {
    // The devices' clocks meet in this process, and a GEMM's worker threads'
    // CPU time would not be counted.
    if (!runner->all_local_ || world.processes() != nullptr)
      return invalid_argument("the device clock needs every device a thread of this process, "
                              "not a rank of an MPI job (whose waits busy-poll)");
    if (options.gemm_threads != 1)
      return invalid_argument("the device clock counts each device thread's own CPU time, so it "
                              "needs one GEMM thread per device, not ",
                              options.gemm_threads);
  }
  {
    // Failure reports of other processes name instructions of any device.
    auto names = std::make_shared<std::vector<std::vector<std::string>>>();
    for (const auto &program : p.programs()) {
      names->emplace_back();
      for (const serialization::PlanInstruction &instr : program.instructions)
        names->back().push_back(plan::describe_instruction(p.graph(), instr));
    }
    world.set_describer([names](int device, int64_t instruction) -> std::string {
      if (device < 0 || static_cast<size_t>(device) >= names->size() || instruction < 0 ||
          static_cast<size_t>(instruction) >= (*names)[static_cast<size_t>(device)].size())
        return "?";
      return (*names)[static_cast<size_t>(device)][static_cast<size_t>(instruction)];
    });
  }
  RETURN_IF_ERROR(check_memory(plan, world));
  runner->devices_.resize(static_cast<size_t>(num_devices));
  for (int d = 0; d < num_devices; ++d) {
    if (!world.is_local(d)) continue;
    auto device = std::make_unique<Device>();
    device->index = d;
    // Where the other ranks on this host can read it, if the world shares
    // memory: every buffer a collective touches.
    Placer placer(world.shared_memory(d), runner->world_, d);
    ASSIGN_OR_RETURN(device->arena,
                     placer.zeroed(static_cast<size_t>(p.program(d).arena_bytes), "its arena"));
    for (TensorId id : p.program(d).holds) {
      auto value = p.materialize(p.held(d, id), options.model_dir);
      if (!value.is_ok()) return value.status().with_context(str_cat("device ", d));
      ASSIGN_OR_RETURN(HostTensor placed,
                       placer.place(std::move(value).value(),
                                    str_cat("tensor '", p.graph().tensor(id).name, "'")));
      device->weights.emplace(id, std::move(placed));
    }
    ASSIGN_OR_RETURN(device->staging,
                     placer.zeroed(static_cast<size_t>(core::collective_staging_bytes(
                                       p.graph(), p.program(d), false)),
                                   "its collectives' staging"));
    core::DeviceMemory memory;
    memory.arena = device->arena->mutable_data();
    memory.held = [&weights = device->weights](TensorId id) -> std::byte * {
      auto it = weights.find(id);
      return it == weights.end() || !it->second.blob ? nullptr : it->second.data();
    };
    memory.staging = device->staging->mutable_data();
    ASSIGN_OR_RETURN(device->program, core::resolve_program(p, d, memory));
    RETURN_IF_ERROR(CpuDevice::check_kernels(p, device->program));
    size_t largest = 0;
    for (const core::Bucket &bucket : device->program.buckets)
      if (!bucket.chunks.empty()) largest = std::max(largest, bucket.packed());
    device->bucket_staging.assign(largest, 0.0f);
    device->backend = std::make_unique<CpuDevice>(device->program);
    runner->devices_[static_cast<size_t>(d)] = std::move(device);
  }
  runner->spans_.resize(static_cast<size_t>(num_devices));
  runner->device_ends_.assign(static_cast<size_t>(num_devices), 0.0);
  runner->busy_.assign(static_cast<size_t>(num_devices), -1.0);
  if (!runner->all_local_) {
    runner->output_copies_.resize(static_cast<size_t>(num_devices));
    for (int d = 0; d < num_devices; ++d) {
      if (!world.is_local(d)) continue;
      for (TensorId id : p.graph().outputs())
        runner->output_copies_[static_cast<size_t>(d)].push_back(
            HostTensor::zeros(p.graph().tensor(id).type));
    }
  }
  return runner;
}

std::vector<TensorType> PipelineRunner::batch_types() const { return plan_->batch_types(); }

std::vector<int64_t> PipelineRunner::arena_bytes() const {
  std::vector<int64_t> bytes;
  for (const auto &program : plan_->programs())
    bytes.push_back(program.arena_bytes);
  return bytes;
}

std::vector<PipelineRunner::Allocation> PipelineRunner::allocations() const {
  std::vector<Allocation> result(devices_.size());
  for (size_t d = 0; d < devices_.size(); ++d) {
    const Device *device = devices_[d].get();
    if (device == nullptr) continue;
    result[d].arena = device->arena ? static_cast<int64_t>(device->arena->size()) : 0;
    result[d].held = 0;
    for (const auto &held : device->weights)
      result[d].held += static_cast<int64_t>(held.second.size_bytes());
  }
  return result;
}

// The device's instructions in order, each issued through the core, with the
// test faults, failure reports and trace spans around them.
Status PipelineRunner::run_program(Device &device, core::Transport &transport, DeviceClock *clock,
                                   int64_t step) {
  const int rank = device.index;
  std::vector<core::DeviceProgram *> programs(devices_.size(), nullptr);
  std::vector<core::DeviceBackend *> backends(devices_.size(), nullptr);
  programs[static_cast<size_t>(rank)] = &device.program;
  backends[static_cast<size_t>(rank)] = device.backend.get();
  core::Issuer issuer(*plan_, std::move(programs), std::move(backends), transport);
  auto &spans = spans_[static_cast<size_t>(rank)];
  const auto &fault = options_.fault;
  for (size_t i = 0; i < device.program.ops.size(); ++i) {
    const core::Op &op = device.program.ops[i];
    world_->report(rank, step, static_cast<int64_t>(i));
    if (fault && fault->device == rank && fault->instruction == i && fault->step == step) {
      using Kind = PipelineRunnerOptions::Fault::Kind;
      switch (fault->kind) {
      case Kind::kError:
        return internal_error("step ", step, ", instruction ", i, " (", op.what,
                              "): injected fault");
      case Kind::kStall: std::this_thread::sleep_for(fault->stall); break;
      case Kind::kKill: raise(SIGKILL); break;
      case Kind::kExit: std::_Exit(0);
      case Kind::kStop: raise(SIGSTOP); break;
      }
    }
    const double start = clock ? clock->now() : options_.trace ? seconds_since(epoch_) : 0;
    Status status = issuer.issue({{rank, i}});
    if (!status.is_ok())
      return std::move(status).with_context(
          str_cat("step ", step, ", instruction ", i, " (", op.what, ")"));
    if (options_.trace)
      spans.push_back(
          {static_cast<uint32_t>(i), start, clock ? clock->now() : seconds_since(epoch_), step});
  }
  world_->report(rank, step, -1);
  return Status::ok();
}

Status PipelineRunner::run_device(int rank, Communicator &comm, Communicator *side, int64_t step,
                                  llvm::ArrayRef<HostTensor> inputs) {
  Device &device = *devices_[static_cast<size_t>(rank)];
  comm.set_label(plan::device_role(plan_->pipeline(), rank));
  ops::cpu::set_gemm_num_threads(options_.gemm_threads);
  std::vector<const std::byte *> bases;
  for (const HostTensor &input : inputs)
    bases.push_back(input.blob ? input.data() : nullptr);
  core::bind_batch(device.program, *plan_, bases);
  // The device clock: the device (and its stream) starts the step where the
  // last one ended, exchanging times over clocked communicators.
  std::optional<DeviceClock> clock, stream_clock;
  std::unique_ptr<Communicator> clocked, side_clocked;
  if (exchange_) {
    clock.emplace();
    clock->start(device_time_);
    clocked = clocked_communicator(comm, *clock, *exchange_);
    if (side != nullptr) {
      stream_clock.emplace();
      side_clocked = clocked_communicator(*side, *stream_clock, *side_exchange_);
      side = side_clocked.get();
    }
  }
  Communicator &main = clocked ? *clocked : comm;
  // Buckets and ZeRO-3 prefetches run on the communication stream where the
  // world gives a second communicator (threads, MPI); else each is done when
  // it is started.
  std::optional<CommStream> stream;
  if (side != nullptr && device.program.stream_tasks > 0)
    stream.emplace(*side, comm, device.program.stream_tasks, epoch_,
                   stream_clock ? &*stream_clock : nullptr, device_time_);
  // The reduction's own waits are bounded by the timeout; twice it is a
  // backstop for waiting on the stream.
  CommTransport transport(*plan_, main, stream ? &*stream : nullptr, clock ? &*clock : nullptr,
                          2 * world_->timeout(), device.bucket_staging);
  const double cpu_start = thread_cpu_seconds();
  Status result = run_program(device, transport, clock ? &*clock : nullptr, step);
  busy_[static_cast<size_t>(rank)] = thread_cpu_seconds() - cpu_start;
  if (result.is_ok() && !all_local_) {
    // The outputs (the loss) reach every process.
    auto &copies = output_copies_[static_cast<size_t>(rank)];
    const Graph &g = plan_->graph();
    for (size_t k = 0; k < copies.size() && result.is_ok(); ++k) {
      HostTensor &copy = copies[k];
      const int keeper = plan_->output_device(k);
      if (keeper == rank && copy.size_bytes())
        std::memcpy(copy.data(), device.program.outputs[k], copy.size_bytes());
      result = main.broadcast(copy.size_bytes() ? copy.data() : nullptr, copy.size_bytes(), keeper,
                              {}, str_cat("graph output '", g.tensor(g.outputs()[k]).name, "'"));
    }
  }
  if (stream) {
    stream->stop(result);
    if (options_.trace)
      for (const CommStream::Span &span : stream->spans())
        spans_[static_cast<size_t>(rank)].push_back(
            {span.instruction, span.begin, span.end, step, true});
  }
  if (clock)
    device_ends_[static_cast<size_t>(rank)] =
        std::max(clock->now(), stream ? stream_clock->last() : 0.0);
  return result;
}

Status PipelineRunner::run(llvm::ArrayRef<HostTensor> inputs, std::vector<HostTensor> *outputs) {
  if (failed_)
    return failed_precondition("an earlier step of this pipeline failed; its state is lost");
  RETURN_IF_ERROR(plan_->check_batch(inputs));
  if (steps_run_ == 0) epoch_ = std::chrono::steady_clock::now();
  const int64_t step = steps_run_ + 1;
  const bool device_clock = options_.clock == PipelineRunnerOptions::Clock::kDevice;
  if (device_clock) {
    exchange_ = std::make_unique<ClockExchange>();
    side_exchange_ = std::make_unique<ClockExchange>();
  }
  std::fill(device_ends_.begin(), device_ends_.end(), device_time_);
  Status status = world_->run_with_side([&](int rank, Communicator &comm, Communicator *side) {
    return run_device(rank, comm, side, step, inputs);
  });
  if (!status.is_ok()) {
    failed_ = true;
    device_step_ = 0;
    std::fill(busy_.begin(), busy_.end(), -1.0);
    return status.with_context(str_cat("pipeline step ", step));
  }
  ++steps_run_;
  if (device_clock) {
    const double end = *std::max_element(device_ends_.begin(), device_ends_.end());
    device_step_ = end - device_time_;
    device_time_ = end;
  }
  outputs->clear();
  const Graph &g = plan_->graph();
  const std::vector<HostTensor> *copies = nullptr;
  for (const auto &device_copies : output_copies_)
    if (!device_copies.empty() && copies == nullptr) copies = &device_copies;
  for (size_t k = 0; k < g.outputs().size(); ++k) {
    const TensorType &type = g.tensor(g.outputs()[k]).type;
    HostTensor out = HostTensor::zeros(type);
    const std::byte *from =
        copies ? (*copies)[k].data()
               : devices_[static_cast<size_t>(plan_->output_device(k))]->program.outputs[k];
    if (type.size_bytes() > 0)
      std::memcpy(out.data(), from, static_cast<size_t>(type.size_bytes()));
    outputs->push_back(std::move(out));
  }
  return Status::ok();
}

std::optional<HostTensor> PipelineRunner::read(int device, TensorId id) const {
  const auto &holder = devices_[static_cast<size_t>(device)];
  if (!holder) return std::nullopt;
  auto it = holder->weights.find(id);
  if (it == holder->weights.end()) return std::nullopt;
  HostTensor copy = HostTensor::zeros(it->second.type);
  if (copy.size_bytes()) std::memcpy(copy.data(), it->second.data(), copy.size_bytes());
  return copy;
}

TensorType PipelineRunner::value_type(TensorId id) const { return plan_->value_type(id); }

const HostTensor &PipelineRunner::value(TensorId id) const {
  static const HostTensor kNone;
  std::optional<HostTensor> whole = plan_->whole_value(
      id, [this](int d) { return world_->is_local(d); },
      [this](int d, TensorId t) { return read(d, t); });
  if (!whole) return kNone;
  return assembled_[id] = std::move(*whole);
}

Status PipelineRunner::assign(TensorId id, const HostTensor &value) {
  const TensorType type = value_type(id);
  RETURN_IF_ERROR(check_assignable(graph(), id, value, &type));
  bool written = false;
  RETURN_IF_ERROR(
      plan_->split_value(id, value, [&](int d, const std::byte *from, size_t bytes) -> Status {
        const auto &device = devices_[static_cast<size_t>(d)];
        if (!device) return Status::ok(); // another process's
        written = true;
        if (bytes > 0) std::memcpy(device->weights.at(id).data(), from, bytes);
        return Status::ok();
      }));
  // Over several processes, a tensor only other processes hold is theirs to set.
  if (!written && all_local_)
    return not_found("no device of the pipeline holds '", graph().tensor(id).name, "'");
  return Status::ok();
}

Result<std::map<std::string, HostTensor>> PipelineRunner::checkpoint_pieces() const {
  return plan_->checkpoint_pieces([this](int d) { return world_->is_local(d); },
                                  [this](int d, TensorId t) { return read(d, t); });
}

std::string PipelineRunner::trace_json() const {
  return plan::chrome_trace(plan_->graph(), plan_->programs(), spans_, plan_->microbatches(),
                            &plan_->pipeline());
}

} // namespace strata::runtime
