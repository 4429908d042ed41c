#include "runtime/pipeline_runner.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <signal.h>

#include "graph/units.h"
#include "graph/verifier.h"
#include "ops/kernels/cpu/gemm.h"
#include "ops/registry.h"
#include "plan/instructions.h"
#include "plan/memory.h"
#include "plan/pieces.h"
#include "plan/simulate.h"
#include "runtime/collectives.h"
#include "runtime/device_clock.h"
#include "runtime/executor.h"

namespace strata::runtime {

using serialization::InstrKind;
using serialization::PlanInstruction;

// One device: its arena, its copies of weights, and its program with every
// buffer resolved to an address.
struct PipelineRunner::Device {
  struct Op {
    InstrKind kind = InstrKind::kCompute;
    std::string what; // describe_instruction, for errors
    // Compute.
    const Node *node = nullptr;
    const ops::OpDef *def = nullptr;
    std::vector<ops::ConstTensorView> inputs;
    std::vector<ops::TensorView> outputs;
    struct InputPatch {
      uint32_t slot;
      uint32_t input;
      int32_t microbatch;
    };
    std::vector<InputPatch> patches; // graph inputs, pointed at each step's batch
    // Transfers, accumulate, scale, update: `data` is written (or sent from).
    std::byte *data = nullptr;
    const std::byte *source = nullptr;
    size_t bytes = 0;
    int peer = -1;
    uint64_t tag = 0;
    bool first = false; // accumulate: micro-batch 0 copies
    Group group;        // all-reduce: the devices
    // Collectives: the plan's algorithm for the group (ring or tree, over
    // point-to-point messages with tag `tag`), or none: the communicator's own.
    std::optional<CollectiveAlgo> algo;
    // A tensor-parallel node (TpCopy ...) run over `group`; `peer` is this
    // device's position in it. All-gathers land in `gathered` first.
    enum class Tp : uint8_t {
      kNone,
      kCopy,
      kAllReduce,
      kAllGather,
      kSplit,
      kReduceScatter,
      kAllToAll
    } tp = Tp::kNone;
    std::vector<std::byte> gathered;
    Status run_tensor_parallel(Communicator &comm);
    uint32_t bucket = 0; // StartBucket, WaitBucket
  };
  // A gradient bucket: its tensors' accumulated buffers, packed chunk by chunk
  // (chunk c of every tensor, then chunk c + 1; runtime/collectives.h) into
  // `staging`, reduced over `group` and unpacked.
  struct Bucket {
    struct Part {
      float *data;
      size_t count;
    };
    std::vector<Part> parts;
    bool reduce_scatter = false;
    Group group;
    size_t position = 0;        // this device's in the group
    std::vector<size_t> chunks; // group.size() + 1 offsets into the packed bucket
    std::optional<CollectiveAlgo> algo;
    uint64_t tag = 0;
    std::string what;
    Status reduce(Communicator &comm, std::vector<float> &staging) const;
  };
  std::vector<Bucket> buckets;
  std::vector<float> staging; // the largest bucket, packed
  int index = 0;
  std::shared_ptr<Blob> arena;
  std::map<TensorId, HostTensor> weights; // sharded ones hold only this device's shard
  std::vector<Op> ops;
  // ZeRO-1: tensors held as shards, this device's position in its shard group
  // and the group's size; the flat shard types views point at.
  std::set<TensorId> sharded;
  int shard_rank = 0, shard_count = 1;
  std::deque<TensorType> shard_types;
};

PipelineRunner::~PipelineRunner() = default;

Status PipelineRunner::Device::Bucket::reduce(Communicator &comm,
                                              std::vector<float> &staging) const {
  const size_t p = group.size();
  float *packed = staging.data();
  // Chunk c of every part and where it sits in the packed bucket.
  auto each_piece = [&](size_t c, auto &&fn) {
    size_t at = chunks[c];
    for (const Part &part : parts) {
      const size_t begin = chunk_begin(part.count, p, c), end = chunk_begin(part.count, p, c + 1);
      fn(part.data + begin, end - begin, packed + at);
      at += end - begin;
    }
  };
  for (size_t c = 0; c < p; ++c)
    each_piece(c, [](const float *from, size_t n, float *to) { std::copy(from, from + n, to); });
  const size_t n = chunks[p];
  const std::span<float> all(packed, n);
  Status status = Status::ok();
  if (!reduce_scatter)
    status = algo ? algo_all_reduce(comm, all, group, *algo, tag, what, chunks)
                  : comm.all_reduce(all, group, what);
  else if (algo)
    status = algo_reduce_scatter(comm, all, group, *algo, tag, what, chunks);
  else
    status = comm.reduce_scatter(
        all, std::span<float>(packed + chunks[position], chunks[position + 1] - chunks[position]),
        group, what);
  RETURN_IF_ERROR(status);
  // An all-reduce's every chunk, a reduce-scatter's own (its shard of each tensor).
  for (size_t c = 0; c < p; ++c)
    if (!reduce_scatter || c == position)
      each_piece(c, [](float *to, size_t n, const float *from) { std::copy(from, from + n, to); });
  return Status::ok();
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point epoch) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch).count();
}

// A device's communication stream: one thread that reduces the buckets handed
// to it, in order, on the device's second communicator, while the device
// thread computes. A failure aborts the device's main communicator too, so a
// device waiting anywhere learns of it at once. Its times are seconds since
// `epoch`, or with a `clock` the stream's device time (runtime/device_clock.h),
// which starts at `clock_start`.
class CommStream {
public:
  CommStream(Communicator &side, Communicator &main, size_t buckets,
             std::chrono::steady_clock::time_point epoch, DeviceClock *clock, double clock_start)
      : side_(side), main_(main), done_(buckets, 0), done_at_(buckets, 0.0), epoch_(epoch),
        clock_(clock), clock_start_(clock_start), thread_([this] { loop(); }) {}
  ~CommStream() { stop(Status::ok()); }

  // Runs `reduce` (bucket `index`, started by instruction `instruction` at
  // device time `ready`) on the second communicator after the buckets before it.
  void start(std::function<Status(Communicator &)> reduce, uint32_t index, uint32_t instruction,
             double ready) {
    std::lock_guard lock(mutex_);
    queue_.push_back([reduce = std::move(reduce), this, index, instruction, ready] {
      const double begin = clock_ ? clock_->join(ready) : seconds_since(epoch_);
      Status status = reduce(side_);
      const double end = clock_ ? clock_->now() : seconds_since(epoch_);
      std::lock_guard done_lock(mutex_);
      if (!status.is_ok() && error_.is_ok()) error_ = status;
      done_[index] = 1;
      done_at_[index] = end;
      spans_.push_back({instruction, begin, end});
    });
    wake_.notify_all();
  }
  struct Span {
    uint32_t instruction;
    double begin, end;
  };
  // When bucket `index` was reduced (after wait() returned ok for it).
  double done_at(uint32_t index) {
    std::lock_guard lock(mutex_);
    return done_at_[index];
  }
  // What the stream did (read after stop()).
  const std::vector<Span> &spans() const { return spans_; }
  // Until bucket `index` is reduced; bounded by `timeout` (the reduction's own
  // waits are bounded by the communicator's, so this is a backstop).
  Status wait(uint32_t index, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    if (!wake_.wait_for(lock, timeout, [&] { return done_[index] != 0 || !error_.is_ok(); }))
      return deadline_exceeded("the gradient bucket was not reduced within ", timeout.count(),
                               " ms");
    return error_;
  }
  // Ends the stream; with an error, first aborts the second world so a
  // reduction waiting for other devices returns.
  void stop(const Status &why) {
    if (!thread_.joinable()) return;
    if (!why.is_ok()) side_.abort(why);
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      wake_.notify_all();
    }
    thread_.join();
  }

private:
  void loop() {
    if (clock_) clock_->start(clock_start_);
    std::unique_lock lock(mutex_);
    while (true) {
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      auto task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      task();
      lock.lock();
      if (!error_.is_ok() && !aborted_) {
        aborted_ = true;
        const Status error = error_;
        lock.unlock();
        main_.abort(error);
        lock.lock();
      }
      wake_.notify_all();
    }
  }
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

} // namespace

using plan::piece_layout;
using plan::PieceLayout;

Status PipelineRunner::Device::Op::run_tensor_parallel(Communicator &comm) {
  const ops::ConstTensorView &in = inputs[0];
  const ops::TensorView &out = outputs[0];
  const auto in_bytes = static_cast<size_t>(in.type->size_bytes());
  const auto *src = static_cast<const std::byte *>(in.data);
  auto *dst = static_cast<std::byte *>(out.data);
  const size_t parts = group.size();
  switch (tp) {
  case Tp::kNone: break;
  case Tp::kCopy:
    if (in_bytes) std::memcpy(dst, src, in_bytes);
    return Status::ok();
  case Tp::kAllReduce:
    if (in_bytes) std::memcpy(dst, src, in_bytes);
    return comm.all_reduce(
        std::span<float>(reinterpret_cast<float *>(dst), in_bytes / sizeof(float)), group, what);
  case Tp::kAllGather: {
    // The members' pieces arrive one after another; each row interleaves them.
    RETURN_IF_ERROR(comm.all_gather(src, in_bytes, gathered.data(), group, what));
    const PieceLayout layout = piece_layout(*node, *in.type);
    for (size_t r = 0; r < parts; ++r)
      for (size_t row = 0; row < layout.rows && layout.run; ++row)
        std::memcpy(dst + (row * parts + r) * layout.run,
                    gathered.data() + (r * layout.rows + row) * layout.run, layout.run);
    return Status::ok();
  }
  case Tp::kReduceScatter: {
    // Every member's piece of the input, one after another, in `gathered`;
    // the reduce-scatter leaves this member the sum of its own.
    const PieceLayout layout = piece_layout(*node, *out.type);
    for (size_t r = 0; r < parts; ++r)
      for (size_t row = 0; row < layout.rows && layout.run; ++row)
        std::memcpy(gathered.data() + (r * layout.rows + row) * layout.run,
                    src + (row * parts + r) * layout.run, layout.run);
    const size_t count = in_bytes / sizeof(float);
    return comm.reduce_scatter(
        std::span<const float>(reinterpret_cast<const float *>(gathered.data()), count),
        std::span<float>(reinterpret_cast<float *>(dst), count / parts), group, what);
  }
  case Tp::kAllToAll: {
    // Block j, for member j: this member's piece of the input cut along
    // `axis`. Member j's block for this one is piece j of the output along
    // `from_axis`. Sends copy, so every send goes before the receives.
    const auto r = static_cast<size_t>(peer);
    const size_t block = in_bytes / parts, element = dtype_size(in.type->dtype);
    std::byte *outgoing = gathered.data(), *incoming = gathered.data() + in_bytes;
    auto dim = [&](const char *name) {
      const auto axis = static_cast<int32_t>(node->int_attr(name).value_or(0));
      return axis < 0 ? axis + static_cast<int32_t>(in.type->rank()) : axis;
    };
    const serialization::PlanShard cut{"",
                                       {in.type->shape.begin(), in.type->shape.end()},
                                       dim("axis"),
                                       node->int_attr("outer").value_or(1)};
    const serialization::PlanShard place{"",
                                         {out.type->shape.begin(), out.type->shape.end()},
                                         dim("from_axis"),
                                         node->int_attr("from_outer").value_or(1)};
    for (size_t j = 0; j < parts; ++j)
      plan::copy_piece(cut, static_cast<int>(parts), static_cast<int>(j), element,
                              const_cast<std::byte *>(src), outgoing + j * block, true);
    for (size_t j = 0; j < parts; ++j)
      if (j != r) RETURN_IF_ERROR(comm.send(outgoing + j * block, block, group[j], tag, what));
    for (size_t j = 0; j < parts; ++j) {
      std::byte *from_j = outgoing + r * block;
      if (j != r) {
        from_j = incoming + j * block;
        RETURN_IF_ERROR(comm.recv(from_j, block, group[j], tag, what));
      }
      plan::copy_piece(place, static_cast<int>(parts), static_cast<int>(j), element, dst,
                              from_j, false);
    }
    return Status::ok();
  }
  case Tp::kSplit: {
    const PieceLayout layout = piece_layout(*node, *out.type);
    const auto r = static_cast<size_t>(peer);
    for (size_t row = 0; row < layout.rows && layout.run; ++row)
      std::memcpy(dst + row * layout.run, src + (row * parts + r) * layout.run, layout.run);
    return Status::ok();
  }
  }
  return internal_error("not a tensor-parallel node");
}

Result<std::unique_ptr<PipelineRunner>>
PipelineRunner::create(const serialization::Plan &plan, const PipelineRunnerOptions &options) {
  if (!plan.pipeline)
    return invalid_argument("the plan has no pipeline (compile it with --mesh or --microbatches)");
  const ops::OpRegistry &registry = ops::OpRegistry::global();
  RETURN_IF_ERROR(verify_graph(plan.graph, registry).with_context("pipeline plan"));
  RETURN_IF_ERROR(check_pipeline_inputs(plan.graph, int64_t{plan.pipeline->microbatches} *
                                                        plan.pipeline->data_parallel)
                      .with_context("pipeline plan"));
  std::unique_ptr<PipelineRunner> runner(new PipelineRunner());
  runner->graph_ = plan.graph;
  runner->microbatches_ = plan.pipeline->microbatches;
  runner->data_parallel_ = plan.pipeline->data_parallel;
  runner->tensor_parallel_ = plan.pipeline->tensor_parallel;
  runner->tp_groups_begin_ = plan.pipeline->tp_groups_begin;
  for (const serialization::PlanShard &shard : plan.pipeline->shards) {
    auto id = plan.graph.find_tensor(shard.tensor);
    if (!id) return invalid_argument("pipeline plan: shard of unknown tensor '", shard.tensor, "'");
    if (!runner->tp_shards_.emplace(*id, shard).second)
      return invalid_argument("pipeline plan: two shards of tensor '", shard.tensor, "'");
  }
  runner->programs_ = plan.programs;
  runner->pipeline_ = *plan.pipeline;
  runner->groups_ = plan.pipeline->groups;
  const auto &algorithms = plan.pipeline->group_algorithms;
  auto algorithm_of = [&](int32_t group) -> std::optional<CollectiveAlgo> {
    if (group < 0 || static_cast<size_t>(group) >= algorithms.size()) return std::nullopt;
    const std::string &name = algorithms[static_cast<size_t>(group)];
    if (name == "ring") return CollectiveAlgo::kRing;
    if (name == "tree") return CollectiveAlgo::kTree;
    return std::nullopt;
  };

  runner->options_ = options;
  const Graph &g = runner->graph_;
  if (options.timeout.count() <= 0) return invalid_argument("the timeout must be positive");
  const int num_devices = static_cast<int>(runner->programs_.size());
  runner->world_ = options.world ? options.world
                                 : std::make_shared<LocalDeviceWorld>(num_devices, options.timeout);
  if (runner->world_->num_devices() != num_devices)
    return invalid_argument("the plan has ", num_devices, " devices but the run has ",
                            runner->world_->num_devices());
  for (int d = 0; d < num_devices; ++d)
    runner->all_local_ = runner->all_local_ && runner->world_->is_local(d);
  if (options.clock == PipelineRunnerOptions::Clock::kDevice) {
    // The devices' clocks meet in this process, and a GEMM's worker threads'
    // CPU time would not be counted.
    if (!runner->all_local_ || runner->world_->processes() != nullptr)
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
    for (const auto &program : runner->programs_) {
      names->emplace_back();
      for (const PlanInstruction &instr : program.instructions)
        names->back().push_back(plan::describe_instruction(g, instr));
    }
    runner->world_->set_describer([names](int device, int64_t instruction) -> std::string {
      if (device < 0 || static_cast<size_t>(device) >= names->size() || instruction < 0 ||
          static_cast<size_t>(instruction) >= (*names)[static_cast<size_t>(device)].size())
        return "?";
      return (*names)[static_cast<size_t>(device)][static_cast<size_t>(instruction)];
    });
  }
  // A plan from a file is checked again: every receive must be matched, in an
  // order that completes, before any thread waits on one.
  for (size_t d = 0; d < runner->programs_.size(); ++d)
    if (runner->programs_[d].device != d)
      return invalid_argument("pipeline plan: program ", d, " is for device ",
                              runner->programs_[d].device, "; programs must be in device order");
  RETURN_IF_ERROR(plan::check_deadlock(g, runner->programs_, runner->groups_)
                      .with_context("pipeline plan"));

  std::vector<int64_t> input_index(g.num_tensors(), -1);
  for (size_t k = 0; k < g.inputs().size(); ++k)
    input_index[g.inputs()[k]] = static_cast<int64_t>(k);
  runner->outputs_.assign(g.outputs().size(), {});
  std::vector<bool> output_found(g.outputs().size(), false);

  {
    // What this process's devices need, before any of it is allocated.
    int64_t total = 0, largest = 0;
    int local = 0;
    size_t largest_device = 0;
    for (size_t d = 0; d < plan.programs.size(); ++d) {
      if (!runner->world_->is_local(static_cast<int>(plan.programs[d].device))) continue;
      const int64_t bytes = plan::device_memory(plan, d);
      total += bytes;
      ++local;
      if (bytes > largest) largest = bytes, largest_device = plan.programs[d].device;
    }
    RETURN_IF_ERROR(check_host_memory(
        total,
        str_cat("the pipeline's ", local, local == 1 ? " device" : " devices",
                " in this process need"),
        str_cat("activations, weights and optimizer state; the largest, device ", largest_device,
                ", ", human_bytes(static_cast<double>(largest)))));
  }
  for (const serialization::PlanProgram &program : runner->programs_) {
    auto device = std::make_unique<Device>();
    device->index = static_cast<int>(program.device);
    const std::string where = str_cat("device ", program.device);
    if (!runner->world_->is_local(device->index)) {
      // Another process runs it; only where its outputs are matters here.
      for (size_t k = 0; k < g.outputs().size(); ++k)
        for (const serialization::PlanSlot &slot : program.slots)
          if (slot.tensor == g.outputs()[k] && slot.microbatch == -1 && !output_found[k]) {
            output_found[k] = true;
            runner->outputs_[k] = {device->index, nullptr};
          }
      runner->devices_.push_back(std::move(device));
      continue;
    }
    device->arena = Blob::zeroed(static_cast<size_t>(program.arena_bytes));
    std::byte *arena = device->arena->mutable_data();
    if (program.shard_group >= 0) {
      const auto &group = runner->groups_.at(static_cast<size_t>(program.shard_group));
      device->shard_count = static_cast<int>(group.size());
      device->shard_rank = static_cast<int>(
          std::find(group.begin(), group.end(), static_cast<int32_t>(program.device)) -
          group.begin());
      device->sharded.insert(program.sharded_holds.begin(), program.sharded_holds.end());
    }
    const int tp_rank = device->index % runner->tensor_parallel_;
    for (TensorId id : program.holds) {
      Result<HostTensor> value = HostTensor{};
      if (auto shard = runner->tp_shards_.find(id); shard != runner->tp_shards_.end()) {
        // This member's piece of the full tensor.
        Tensor full = g.tensor(id);
        full.type.shape.assign(shard->second.full_shape.begin(), shard->second.full_shape.end());
        auto whole = materialize(full, options.model_dir);
        if (!whole.is_ok()) return whole.status().with_context(where);
        HostTensor piece = HostTensor::zeros(g.tensor(id).type);
        plan::copy_piece(shard->second, runner->tensor_parallel_, tp_rank,
                                dtype_size(full.type.dtype), whole->data(), piece.data(), true);
        value = std::move(piece);
      } else {
        value = materialize(g.tensor(id), options.model_dir);
      }
      if (!value.is_ok()) return value.status().with_context(where);
      if (device->sharded.contains(id)) {
        // Keep this device's shard only.
        const HostTensor &full = *value;
        const int64_t chunk = full.type.num_elements() / device->shard_count;
        HostTensor shard = HostTensor::zeros({full.type.dtype, {chunk}});
        const size_t bytes = shard.size_bytes();
        if (bytes) std::memcpy(shard.data(), full.data() + bytes * device->shard_rank, bytes);
        device->weights.emplace(id, std::move(shard));
        continue;
      }
      device->weights.emplace(id, std::move(value).value());
    }
    std::map<std::pair<TensorId, int32_t>, std::byte *> slots;
    for (const serialization::PlanSlot &slot : program.slots)
      slots[{slot.tensor, slot.microbatch}] = arena + slot.offset;
    // Gradient buckets: the group comes from the instruction that starts each.
    device->buckets.resize(program.buckets.size());
    size_t largest = 0;
    for (size_t i = 0; i < program.instructions.size(); ++i) {
      const PlanInstruction &instr = program.instructions[i];
      if (instr.kind != InstrKind::kStartBucket) continue;
      const std::string context = str_cat(where, " instruction ", i, " (",
                                          plan::describe_instruction(g, instr), ")");
      if (instr.index >= program.buckets.size())
        return invalid_argument(context, ": the program has ", program.buckets.size(), " buckets");
      if (instr.peer < 0 || static_cast<size_t>(instr.peer) >= runner->groups_.size())
        return invalid_argument(context, ": no group ", instr.peer);
      const serialization::PlanBucket &plan_bucket = program.buckets[instr.index];
      Device::Bucket &bucket = device->buckets[instr.index];
      const auto &group = runner->groups_[static_cast<size_t>(instr.peer)];
      bucket.group.assign(group.begin(), group.end());
      bucket.position = static_cast<size_t>(
          std::find(group.begin(), group.end(), static_cast<int32_t>(program.device)) -
          group.begin());
      bucket.reduce_scatter = plan_bucket.reduce_scatter;
      bucket.algo = algorithm_of(instr.peer);
      bucket.tag = plan::collective_tag(instr);
      const size_t p = group.size();
      std::string names;
      for (TensorId t : plan_bucket.tensors) {
        const TensorType &type = g.tensor(t).type;
        if (type.dtype != DType::kF32)
          return unimplemented(context, ": '", g.tensor(t).name, "' is ", type.to_string(),
                               " (f32 only so far)");
        auto it = slots.find({t, -1});
        if (it == slots.end())
          return invalid_argument(context, ": '", g.tensor(t).name,
                                  "' (step) has no buffer in the plan");
        const auto count = static_cast<size_t>(type.num_elements());
        if (bucket.reduce_scatter && count % p != 0)
          return invalid_argument(context, ": '", g.tensor(t).name, "' has ", count,
                                  " elements, which ", p, " devices do not divide");
        bucket.parts.push_back({reinterpret_cast<float *>(it->second), count});
        names += str_cat(names.empty() ? "'" : ", '", g.tensor(t).name, "'");
      }
      bucket.what = str_cat("gradient bucket ", instr.index, ": ", names);
      bucket.chunks.assign(p + 1, 0);
      for (size_t c = 0; c < p; ++c) {
        bucket.chunks[c + 1] = bucket.chunks[c];
        for (const auto &part : bucket.parts)
          bucket.chunks[c + 1] += chunk_begin(part.count, p, c + 1) - chunk_begin(part.count, p, c);
      }
      largest = std::max(largest, bucket.chunks[p]);
    }
    device->staging.assign(largest, 0.0f);

    for (size_t i = 0; i < program.instructions.size(); ++i) {
      const PlanInstruction &instr = program.instructions[i];
      Device::Op op;
      op.kind = instr.kind;
      op.what = plan::describe_instruction(g, instr);
      const std::string context = str_cat(where, " instruction ", i, " (", op.what, ")");
      auto slot = [&](TensorId t, int32_t mb) -> Result<std::byte *> {
        auto it = slots.find({t, mb});
        if (it == slots.end())
          return invalid_argument(context, ": '", g.tensor(t).name, "' ",
                                  mb < 0 ? std::string("(step)") : str_cat("micro-batch ", mb),
                                  " has no buffer in the plan");
        return it->second;
      };
      auto weight = [&](TensorId t) -> Result<std::byte *> {
        auto it = device->weights.find(t);
        if (it == device->weights.end())
          return invalid_argument(context, ": reads '", g.tensor(t).name,
                                  "', which the plan does not place on this device");
        return it->second.blob ? it->second.data() : nullptr;
      };
      switch (instr.kind) {
      case InstrKind::kCompute:
      case InstrKind::kComputeShard: {
        // A shard computes its part of the node's operands
        // (plan::ShardedCompute: chunk r of each, scalars whole).
        const bool shard = instr.kind == InstrKind::kComputeShard;
        plan::ShardedCompute sharding;
        if (shard) {
          if (instr.peer < 0 || static_cast<size_t>(instr.peer) >= runner->groups_.size())
            return invalid_argument(context, ": no group ", instr.peer);
          ASSIGN_OR_RETURN(sharding, plan::sharded_compute(
                                         g, g.node(instr.index),
                                         runner->groups_[static_cast<size_t>(instr.peer)],
                                         static_cast<int32_t>(program.device), context));
        }
        auto view = [&](TensorId t, std::byte *base) -> std::pair<std::byte *, const TensorType *> {
          const TensorType &type = g.tensor(t).type;
          if (!shard) return {base, &type};
          auto seen = sharding.view(type, device->sharded.contains(t));
          if (seen.whole) return {base, &type};
          device->shard_types.push_back(std::move(seen.type));
          return {base + seen.offset, &device->shard_types.back()};
        };
        op.node = &g.node(instr.index);
        op.def = registry.find(op.node->op);
        if (op.def == nullptr || op.def->cpu_kernel == nullptr)
          return unimplemented(context, ": op ", op.node->op, " has no CPU kernel");
        for (size_t s = 0; s < op.node->inputs.size(); ++s) {
          const TensorId t = op.node->inputs[s];
          const Tensor &tensor = g.tensor(t);
          if (input_index[t] >= 0) {
            if (instr.microbatch < 0)
              return invalid_argument(context, ": reads graph input '", tensor.name,
                                      "' once per step");
            // The global micro-batch: replica r of a stage runs r * M .. r * M + M - 1.
            const auto replica = static_cast<int32_t>(program.device) / runner->tensor_parallel_ %
                                 runner->data_parallel_;
            op.patches.push_back({static_cast<uint32_t>(s), static_cast<uint32_t>(input_index[t]),
                                  replica * runner->microbatches_ + instr.microbatch});
            op.inputs.push_back({nullptr, &tensor.type});
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
        for (TensorId t : op.node->outputs) {
          ASSIGN_OR_RETURN(std::byte * data, slot(t, instr.microbatch));
          auto [at, type] = view(t, data);
          if (op.node->op == "SumOfSquares") at = data, type = &g.tensor(t).type; // whole pair
          op.outputs.push_back({at, type});
        }
        using Tp = Device::Op::Tp;
        const std::string &name = op.node->op;
        op.tp = name == "TpCopy"            ? Tp::kCopy
                : name == "TpAllReduce"     ? Tp::kAllReduce
                : name == "TpAllGather"     ? Tp::kAllGather
                : name == "TpSplit"         ? Tp::kSplit
                : name == "TpReduceScatter" ? Tp::kReduceScatter
                : name == "TpAllToAll"      ? Tp::kAllToAll
                                            : Tp::kNone;
        if (op.tp != Tp::kNone) {
          const int64_t parts = op.node->int_attr("parts").value_or(1);
          if (shard || parts != runner->tensor_parallel_ || runner->tp_groups_begin_ < 0)
            return invalid_argument(
                context, ": a tensor-parallel node of ", parts,
                " parts in a plan of tensor_parallel = ", runner->tensor_parallel_);
          if ((op.tp == Tp::kAllReduce || op.tp == Tp::kReduceScatter) &&
              op.inputs[0].type->dtype != DType::kF32)
            return unimplemented(context, ": ", op.inputs[0].type->to_string(),
                                 " (f32 only so far)");
          const auto &group = runner->groups_.at(
              static_cast<size_t>(runner->tp_groups_begin_ +
                                  static_cast<int>(program.device) / runner->tensor_parallel_));
          op.group.assign(group.begin(), group.end());
          op.peer = static_cast<int>(program.device) % runner->tensor_parallel_;
          if (op.tp == Tp::kAllGather)
            op.gathered.resize(static_cast<size_t>(op.outputs[0].type->size_bytes()));
          if (op.tp == Tp::kReduceScatter)
            op.gathered.resize(static_cast<size_t>(op.inputs[0].type->size_bytes()));
          if (op.tp == Tp::kAllToAll) {
            // Outgoing blocks, then incoming ones; messages on the group's
            // point-to-point channels, tagged by the node.
            op.gathered.resize(2 * static_cast<size_t>(op.inputs[0].type->size_bytes()));
            op.tag = (uint64_t{1} << 62) | instr.index;
          }
        }
        break;
      }
      case InstrKind::kReduceScatter:
      case InstrKind::kAllGather: {
        const TensorType &type = g.tensor(instr.index).type;
        if (type.dtype != DType::kF32)
          return unimplemented(context, ": ", type.to_string(), " (f32 only so far)");
        if (instr.peer < 0 || static_cast<size_t>(instr.peer) >= runner->groups_.size())
          return invalid_argument(context, ": no group ", instr.peer);
        const auto &group = runner->groups_[static_cast<size_t>(instr.peer)];
        if (type.num_elements() % static_cast<int64_t>(group.size()) != 0)
          return invalid_argument(context, ": ", type.to_string(), " does not split over ",
                                  group.size(), " devices");
        op.group.assign(group.begin(), group.end());
        ASSIGN_OR_RETURN(op.data, slot(instr.index, -1));
        op.bytes = static_cast<size_t>(type.size_bytes());
        // This device's shard: its position in the group, kept in `peer`.
        op.peer = static_cast<int>(
            std::find(group.begin(), group.end(), static_cast<int32_t>(program.device)) -
            group.begin());
        op.algo = algorithm_of(instr.peer);
        op.tag = plan::collective_tag(instr);
        break;
      }
      case InstrKind::kSend:
      case InstrKind::kRecv: {
        ASSIGN_OR_RETURN(op.data, slot(instr.index, instr.microbatch));
        op.bytes = static_cast<size_t>(g.tensor(instr.index).type.size_bytes());
        op.peer = instr.peer;
        op.tag = plan::transfer_tag(instr.index, instr.microbatch);
        break;
      }
      case InstrKind::kAccumulate:
      case InstrKind::kScale:
      case InstrKind::kAllReduce: {
        const TensorType &type = g.tensor(instr.index).type;
        if (type.dtype != DType::kF32)
          return unimplemented(context, ": accumulating ", type.to_string(),
                               " over micro-batches (f32 only so far)");
        ASSIGN_OR_RETURN(op.data, slot(instr.index, -1));
        if (instr.kind == InstrKind::kAllReduce) {
          if (instr.peer < 0 || static_cast<size_t>(instr.peer) >= runner->groups_.size())
            return invalid_argument(context, ": no group ", instr.peer);
          const auto &group = runner->groups_[static_cast<size_t>(instr.peer)];
          op.group.assign(group.begin(), group.end());
          op.algo = algorithm_of(instr.peer);
          op.tag = plan::collective_tag(instr);
        }
        if (instr.kind == InstrKind::kAccumulate) {
          ASSIGN_OR_RETURN(std::byte * source, slot(instr.index, instr.microbatch));
          op.source = source;
          op.first = instr.microbatch == 0;
        }
        op.bytes = static_cast<size_t>(type.size_bytes());
        break;
      }
      case InstrKind::kStartBucket:
      case InstrKind::kWaitBucket:
        if (instr.index >= device->buckets.size() || device->buckets[instr.index].chunks.empty())
          return invalid_argument(context, ": bucket ", instr.index, " is never started");
        op.bucket = instr.index;
        break;
      case InstrKind::kUpdate: {
        const StateUpdate &update = g.updates()[instr.index];
        ASSIGN_OR_RETURN(op.data, weight(update.target));
        ASSIGN_OR_RETURN(std::byte * source, slot(update.value, -1));
        op.source = source;
        op.bytes = static_cast<size_t>(g.tensor(update.target).type.size_bytes());
        if (device->sharded.contains(update.target)) {
          // Only this device's shard of the new value is meaningful.
          op.bytes /= static_cast<size_t>(device->shard_count);
          op.source = source + op.bytes * static_cast<size_t>(device->shard_rank);
        }
        break;
      }
      }
      device->ops.push_back(std::move(op));
    }
    for (size_t k = 0; k < g.outputs().size(); ++k) {
      auto it = slots.find({g.outputs()[k], -1});
      if (it == slots.end() || output_found[k]) continue;
      output_found[k] = true;
      runner->outputs_[k] = {device->index, it->second};
    }
    runner->devices_.push_back(std::move(device));
  }
  for (size_t k = 0; k < g.outputs().size(); ++k)
    if (!output_found[k])
      return invalid_argument("no device of the plan keeps graph output '",
                              g.tensor(g.outputs()[k]).name, "'");
  runner->spans_.resize(runner->devices_.size());
  if (!runner->all_local_) {
    runner->output_copies_.resize(runner->devices_.size());
    for (int d = 0; d < num_devices; ++d) {
      if (!runner->world_->is_local(d)) continue;
      for (TensorId id : g.outputs())
        runner->output_copies_[static_cast<size_t>(d)].push_back(
            HostTensor::zeros(g.tensor(id).type));
    }
  }
  return runner;
}

std::vector<TensorType> PipelineRunner::batch_types() const {
  return pipeline_batch_types(graph_, int64_t{microbatches_} * data_parallel_);
}

std::vector<int64_t> PipelineRunner::arena_bytes() const {
  std::vector<int64_t> bytes;
  for (const auto &program : programs_)
    bytes.push_back(program.arena_bytes);
  return bytes;
}

Status PipelineRunner::run(llvm::ArrayRef<HostTensor> inputs, std::vector<HostTensor> *outputs) {
  if (failed_)
    return failed_precondition("an earlier step of this pipeline failed; its state is lost");
  const std::vector<TensorType> types = batch_types();
  if (inputs.size() != types.size())
    return invalid_argument("the pipeline takes ", types.size(), " inputs, got ", inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k)
    if (!(inputs[k].type == types[k]) ||
        static_cast<int64_t>(inputs[k].size_bytes()) < types[k].size_bytes())
      return invalid_argument(
          "input '", graph_.tensor(graph_.inputs()[k]).name, "' is ", inputs[k].type.to_string(),
          ", the pipeline needs ", types[k].to_string(), " (", microbatches_ * data_parallel_,
          " micro-batches of ", graph_.tensor(graph_.inputs()[k]).type.to_string(), ")");
  if (steps_run_ == 0) epoch_ = std::chrono::steady_clock::now();
  const int64_t step = steps_run_ + 1;
  // The device clock: each device (and its stream) starts the step where the
  // last one ended, exchanging times over clocked communicators.
  const bool device_clock = options_.clock == PipelineRunnerOptions::Clock::kDevice;
  std::optional<ClockExchange> exchange, side_exchange;
  if (device_clock) {
    exchange.emplace();
    side_exchange.emplace();
  }
  std::vector<double> device_ends(devices_.size(), device_time_);

  auto run_device = [&](int rank, Communicator &comm, CommStream *stream,
                        DeviceClock *clock) -> Status {
    Device &device = *devices_[static_cast<size_t>(rank)];
    // The device's position in its tensor-parallel group, for the kernels of
    // ops that read a member's piece (ops::KernelContext).
    const int member = rank % tensor_parallel_;
    ops::cpu::set_gemm_num_threads(options_.gemm_threads);
    for (Device::Op &op : device.ops)
      for (const Device::Op::InputPatch &patch : op.patches) {
        const HostTensor &input = inputs[patch.input];
        const auto slice = static_cast<size_t>(input.size_bytes()) /
                           static_cast<size_t>(microbatches_ * data_parallel_);
        op.inputs[patch.slot].data =
            input.blob ? input.data() + slice * static_cast<size_t>(patch.microbatch) : nullptr;
      }
    auto &spans = spans_[static_cast<size_t>(rank)];
    const auto &fault = options_.fault;
    for (size_t i = 0; i < device.ops.size(); ++i) {
      Device::Op &op = device.ops[i];
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
      Status status = Status::ok();
      switch (op.kind) {
      case InstrKind::kCompute: {
        if (op.tp != Device::Op::Tp::kNone) {
          status = op.run_tensor_parallel(comm);
          break;
        }
        ops::KernelContext context{*op.node,   *op.def,          op.inputs,
                                   op.outputs, tensor_parallel_, member};
        status = op.def->cpu_kernel(context);
        break;
      }
      case InstrKind::kSend: status = comm.send(op.data, op.bytes, op.peer, op.tag, op.what); break;
      case InstrKind::kRecv: status = comm.recv(op.data, op.bytes, op.peer, op.tag, op.what); break;
      case InstrKind::kAccumulate: {
        auto *acc = reinterpret_cast<float *>(op.data);
        const auto *src = reinterpret_cast<const float *>(op.source);
        const size_t n = op.bytes / sizeof(float);
        if (op.first) {
          if (op.bytes) std::memcpy(acc, src, op.bytes);
        } else {
          for (size_t e = 0; e < n; ++e)
            acc[e] += src[e];
        }
        break;
      }
      case InstrKind::kScale: {
        auto *acc = reinterpret_cast<float *>(op.data);
        const auto m = static_cast<float>(microbatches_ * data_parallel_);
        for (size_t e = 0; e < op.bytes / sizeof(float); ++e)
          acc[e] /= m;
        break;
      }
      case InstrKind::kUpdate:
        if (op.bytes && op.data != op.source) std::memmove(op.data, op.source, op.bytes);
        break;
      case InstrKind::kAllReduce: {
        std::span<float> data(reinterpret_cast<float *>(op.data), op.bytes / sizeof(float));
        status = op.algo ? algo_all_reduce(comm, data, op.group, *op.algo, op.tag, op.what)
                         : comm.all_reduce(data, op.group, op.what);
        break;
      }
      case InstrKind::kComputeShard: {
        ops::KernelContext context{*op.node,   *op.def,          op.inputs,
                                   op.outputs, tensor_parallel_, member};
        status = op.def->cpu_kernel(context);
        break;
      }
      case InstrKind::kStartBucket:
        if (stream != nullptr)
          stream->start(
              [&device, &op](Communicator &side) {
                return device.buckets[op.bucket].reduce(side, device.staging);
              },
              op.bucket, static_cast<uint32_t>(i), clock ? clock->now() : 0);
        else
          status = device.buckets[op.bucket].reduce(comm, device.staging);
        break;
      case InstrKind::kWaitBucket:
        // The reduction's own waits are bounded by the timeout; twice it is
        // a backstop.
        if (clock != nullptr) clock->now(); // the work before the wait
        if (stream != nullptr) status = stream->wait(op.bucket, 2 * world_->timeout());
        if (status.is_ok() && stream != nullptr && clock != nullptr)
          clock->join(stream->done_at(op.bucket));
        break;
      case InstrKind::kReduceScatter:
      case InstrKind::kAllGather: {
        // In place: the shard of device `peer` (its rank) is its part of the buffer.
        auto *full = reinterpret_cast<float *>(op.data);
        const size_t count = op.bytes / sizeof(float), chunk = count / op.group.size();
        float *mine = full + chunk * static_cast<size_t>(op.peer);
        if (op.algo && op.kind == InstrKind::kReduceScatter)
          status = algo_reduce_scatter(comm, std::span<float>(full, count), op.group, *op.algo,
                                       op.tag, op.what);
        else if (op.algo)
          status = algo_all_gather(comm, std::span<float>(full, count), op.group, op.tag, op.what);
        else if (op.kind == InstrKind::kReduceScatter)
          status = comm.reduce_scatter(std::span<const float>(full, count),
                                       std::span<float>(mine, chunk), op.group, op.what);
        else
          status = comm.all_gather(mine, chunk * sizeof(float), full, op.group, op.what);
        break;
      }
      }
      if (!status.is_ok())
        return std::move(status).with_context(
            str_cat("step ", step, ", instruction ", i, " (", op.what, ")"));
      if (options_.trace)
        spans.push_back(
            {static_cast<uint32_t>(i), start, clock ? clock->now() : seconds_since(epoch_), step});
    }
    world_->report(rank, step, -1);
    if (!all_local_) {
      // The outputs (the loss) reach every process.
      auto &copies = output_copies_[static_cast<size_t>(rank)];
      for (size_t k = 0; k < outputs_.size(); ++k) {
        HostTensor &copy = copies[k];
        if (outputs_[k].device == rank && copy.size_bytes())
          std::memcpy(copy.data(), outputs_[k].data, copy.size_bytes());
        RETURN_IF_ERROR(comm.broadcast(
            copy.size_bytes() ? copy.data() : nullptr, copy.size_bytes(), outputs_[k].device, {},
            str_cat("graph output '", graph_.tensor(graph_.outputs()[k]).name, "'")));
      }
    }
    return Status::ok();
  };
  auto body = [&](int rank, Communicator &comm, Communicator *side) -> Status {
    Device &device = *devices_[static_cast<size_t>(rank)];
    comm.set_label(plan::device_role(pipeline_, rank));
    std::optional<DeviceClock> clock, stream_clock;
    std::unique_ptr<Communicator> clocked, side_clocked;
    if (device_clock) {
      clock.emplace();
      clock->start(device_time_);
      clocked = clocked_communicator(comm, *clock, *exchange);
      if (side != nullptr) {
        stream_clock.emplace();
        side_clocked = clocked_communicator(*side, *stream_clock, *side_exchange);
        side = side_clocked.get();
      }
    }
    // Buckets run on the communication stream where the world gives a second
    // communicator (threads, MPI); else each is reduced when it is started.
    std::optional<CommStream> stream;
    if (side != nullptr && !device.buckets.empty())
      stream.emplace(*side, comm, device.buckets.size(), epoch_,
                     stream_clock ? &*stream_clock : nullptr, device_time_);
    Status result = run_device(rank, clocked ? *clocked : comm, stream ? &*stream : nullptr,
                               clock ? &*clock : nullptr);
    if (stream) {
      stream->stop(result);
      if (options_.trace)
        for (const CommStream::Span &span : stream->spans())
          spans_[static_cast<size_t>(rank)].push_back(
              {span.instruction, span.begin, span.end, step, true});
    }
    if (clock)
      device_ends[static_cast<size_t>(rank)] =
          std::max(clock->now(), stream ? stream_clock->last() : 0.0);
    return result;
  };
  Status status = world_->run_with_side(body);
  if (!status.is_ok()) {
    failed_ = true;
    device_step_ = 0;
    return status.with_context(str_cat("pipeline step ", step));
  }
  ++steps_run_;
  if (device_clock) {
    const double end = *std::max_element(device_ends.begin(), device_ends.end());
    device_step_ = end - device_time_;
    device_time_ = end;
  }
  outputs->clear();
  const std::vector<HostTensor> *copies = nullptr;
  for (const auto &device_copies : output_copies_)
    if (!device_copies.empty() && copies == nullptr) copies = &device_copies;
  for (size_t k = 0; k < outputs_.size(); ++k) {
    const TensorType &type = graph_.tensor(graph_.outputs()[k]).type;
    HostTensor out = HostTensor::zeros(type);
    const std::byte *from = copies ? (*copies)[k].data() : outputs_[k].data;
    if (type.size_bytes() > 0)
      std::memcpy(out.data(), from, static_cast<size_t>(type.size_bytes()));
    outputs->push_back(std::move(out));
  }
  return Status::ok();
}

int PipelineRunner::first_holder(TensorId id) const {
  for (const auto &device : devices_)
    if (device->weights.contains(id)) return device->index;
  return -1;
}

HostTensor PipelineRunner::local_whole(const Device &device, TensorId id) const {
  const HostTensor &mine = device.weights.at(id);
  const TensorType &type = graph_.tensor(id).type;
  HostTensor whole = HostTensor::zeros(type);
  if (!device.sharded.contains(id)) {
    if (mine.size_bytes()) std::memcpy(whole.data(), mine.data(), mine.size_bytes());
    return whole;
  }
  // ZeRO-1: put it together from the shards of the device's group.
  const int32_t group = programs_[static_cast<size_t>(device.index)].shard_group;
  const size_t chunk =
      static_cast<size_t>(type.size_bytes()) / static_cast<size_t>(device.shard_count);
  for (const auto &other : devices_) {
    auto it = other->weights.find(id);
    if (!other->sharded.contains(id) || it == other->weights.end() ||
        programs_[static_cast<size_t>(other->index)].shard_group != group)
      continue;
    if (chunk)
      std::memcpy(whole.data() + chunk * static_cast<size_t>(other->shard_rank), it->second.data(),
                  chunk);
  }
  return whole;
}

TensorType PipelineRunner::value_type(TensorId id) const {
  TensorType type = graph_.tensor(id).type;
  if (auto shard = tp_shards_.find(id); shard != tp_shards_.end())
    type.shape.assign(shard->second.full_shape.begin(), shard->second.full_shape.end());
  return type;
}

const HostTensor &PipelineRunner::value(TensorId id) const {
  const int first = first_holder(id);
  static const HostTensor kNone;
  if (first < 0) return kNone;
  const Device &device = *devices_[static_cast<size_t>(first)];
  auto shard = tp_shards_.find(id);
  if (shard == tp_shards_.end()) {
    if (!device.sharded.contains(id)) return device.weights.at(id);
    return assembled_[id] = local_whole(device, id);
  }
  // Tensor parallelism: the pieces of the first holder's group, joined (only
  // where this process runs every member; checkpoints over several processes
  // go through checkpoint_pieces()).
  const int base = first - first % tensor_parallel_;
  for (int m = 0; m < tensor_parallel_; ++m)
    if (!world_->is_local(base + m)) return kNone;
  HostTensor full = HostTensor::zeros(value_type(id));
  for (int m = 0; m < tensor_parallel_; ++m) {
    HostTensor piece = local_whole(*devices_[static_cast<size_t>(base + m)], id);
    plan::copy_piece(shard->second, tensor_parallel_, m, dtype_size(full.type.dtype),
                            full.data(), piece.data(), false);
  }
  return assembled_[id] = std::move(full);
}

Status PipelineRunner::assign(TensorId id, const HostTensor &value) {
  const TensorType type = value_type(id);
  RETURN_IF_ERROR(check_assignable(graph_, id, value, &type));
  const Tensor &tensor = graph_.tensor(id);
  auto shard = tp_shards_.find(id);
  bool held = false;
  for (auto &device : devices_) {
    auto it = device->weights.find(id);
    if (it == device->weights.end()) continue;
    held = true;
    // This device's whole copy: its tensor-parallel piece, or all of it.
    HostTensor piece;
    const HostTensor *whole = &value;
    if (shard != tp_shards_.end()) {
      piece = HostTensor::zeros(tensor.type);
      plan::copy_piece(shard->second, tensor_parallel_, device->index % tensor_parallel_,
                              dtype_size(type.dtype), const_cast<std::byte *>(value.data()),
                              piece.data(), true);
      whole = &piece;
    }
    if (device->sharded.contains(id)) {
      const size_t chunk = it->second.size_bytes();
      if (chunk)
        std::memcpy(it->second.data(),
                    whole->data() + chunk * static_cast<size_t>(device->shard_rank), chunk);
      continue;
    }
    if (whole->size_bytes() > 0) std::memcpy(it->second.data(), whole->data(), whole->size_bytes());
  }
  // Over several processes, a tensor only other processes hold is theirs to set.
  if (!held && all_local_) return not_found("no device of the pipeline holds '", tensor.name, "'");
  return Status::ok();
}

Result<HostTensor> PipelineRunner::join_pieces(TensorId id,
                                               const std::vector<HostTensor> &pieces) const {
  auto shard = tp_shards_.find(id);
  if (shard == tp_shards_.end())
    return invalid_argument("'", graph_.tensor(id).name,
                            "' is not held in tensor-parallel pieces by this plan");
  return plan::join_pieces(graph_.tensor(id), shard->second, tensor_parallel_, pieces);
}

Result<std::map<std::string, HostTensor>> PipelineRunner::checkpoint_pieces() const {
  std::map<std::string, HostTensor> pieces;
  auto copy_of = [](const HostTensor &value) {
    HostTensor copy = HostTensor::zeros(value.type);
    if (value.size_bytes()) std::memcpy(copy.data(), value.data(), value.size_bytes());
    return copy;
  };
  for (TensorId id = 0; id < graph_.num_tensors(); ++id) {
    const Tensor &tensor = graph_.tensor(id);
    if (tensor.kind != TensorKind::kParameter && tensor.kind != TensorKind::kState) continue;
    // The first device holding it decides: whole, or sharded over its group.
    int first = -1;
    for (size_t d = 0; d < programs_.size() && first < 0; ++d)
      if (std::find(programs_[d].holds.begin(), programs_[d].holds.end(), id) !=
          programs_[d].holds.end())
        first = static_cast<int>(d);
    if (first < 0) continue;
    // Tensor parallelism: every member of the first holder's group writes its
    // piece, "<name>@tp<m>of<T>" (join_pieces puts them together).
    const bool in_pieces = tp_shards_.contains(id);
    const int base = in_pieces ? first - first % tensor_parallel_ : first;
    for (int m = 0; m < (in_pieces ? tensor_parallel_ : 1); ++m) {
      const int holder = base + m;
      const std::string name =
          in_pieces ? str_cat(tensor.name, "@tp", m, "of", tensor_parallel_) : tensor.name;
      const auto &program = programs_[static_cast<size_t>(holder)];
      const bool sharded = std::find(program.sharded_holds.begin(), program.sharded_holds.end(),
                                     id) != program.sharded_holds.end();
      if (!sharded) {
        if (!world_->is_local(holder)) continue;
        pieces.emplace(name, copy_of(devices_[static_cast<size_t>(holder)]->weights.at(id)));
        continue;
      }
      for (const auto &device : devices_) {
        if (!world_->is_local(device->index) ||
            programs_[static_cast<size_t>(device->index)].shard_group != program.shard_group ||
            !device->sharded.contains(id))
          continue;
        pieces.emplace(str_cat(name, "@shard", device->shard_rank, "of", device->shard_count),
                       copy_of(device->weights.at(id)));
      }
    }
  }
  return pieces;
}

std::string PipelineRunner::trace_json() const {
  return plan::chrome_trace(graph_, programs_, spans_, microbatches_, &pipeline_);
}

} // namespace strata::runtime
