// PipelineRunner: a pipeline plan on CPU device threads, in this process
// (LocalDeviceWorld) or spread over the ranks of an MPI job (MpiWorld).
//
// Each local device owns one activation arena (the size its program's memory
// plan says; nothing is allocated during a step), its parts of the tensors it
// holds, and its resolved program (runtime/core/device_program.h), which its
// thread issues through the execution core: CpuDevice runs the registry's
// CPU kernels, CommTransport moves data over the device's communicator and
// reduces gradient buckets on a communication thread beside it. Around the
// core this runner adds what only threads have: traces, the device clock,
// injected faults for tests, and, over MPI, each step's outputs broadcast to
// every process.
//
// Failure: every wait is bounded by the timeout. A kernel error, a timeout or an
// abort on one device ends the step on every device with one error naming the
// device, its instruction and the cause; a failed step leaves the runner
// unusable (its state may be half updated).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "plan/trace.h"
#include "runtime/comm/device_clock.h"
#include "runtime/comm/device_world.h"
#include "runtime/comm/local_communicator.h"
#include "runtime/core/issue.h"
#include "runtime/step_runner.h"
#include "serialization/plan_io.h"

namespace strata::runtime {

struct PipelineRunnerOptions {
  std::string model_dir = "."; // folder external data paths are relative to
  std::chrono::milliseconds timeout = kDefaultCommunicatorTimeout;
  // Where the devices run: null for every device a thread of this process;
  // an MpiWorld to run only this rank's devices (runtime/comm/mpi_world.h).
  std::shared_ptr<DeviceWorld> world;
  int gemm_threads = 1; // GEMM threads per device thread
  bool trace = false;   // record what each device did (trace_json())
  // How the trace and device_step_seconds() tell time: wall-clock time, or
  // device time (runtime/comm/device_clock.h: each device's own CPU time, joined at
  // its messages and collectives: the step as it would run with a core per
  // device). Device time needs every device in this process and one GEMM
  // thread per device.
  enum class Clock { kWall, kDevice };
  Clock clock = Clock::kWall;
  // Testing: make `device` fail (kError), sleep for `stall` (kStall), or end
  // its process (kKill: SIGKILL; kExit: exit status 0 mid-step; kStop:
  // SIGSTOP) when it reaches instruction `instruction` of step `step`
  // (1-based).
  struct Fault {
    enum class Kind { kError, kStall, kKill, kExit, kStop } kind = Kind::kError;
    int device = 0;
    size_t instruction = 0;
    int64_t step = 1;
    std::chrono::milliseconds stall{0};
  };
  std::optional<Fault> fault;
};

class PipelineRunner : public StepRunner {
public:
  // The plan must be a pipeline plan (plan.pipeline set). Errors name the device
  // and instruction whose buffers cannot be resolved.
  static Result<std::unique_ptr<PipelineRunner>> create(const serialization::Plan &plan,
                                                        const PipelineRunnerOptions &options = {});
  ~PipelineRunner() override;

  const Graph &graph() const override { return plan_->graph(); }
  std::vector<TensorType> batch_types() const override;
  Status run(llvm::ArrayRef<HostTensor> inputs, std::vector<HostTensor> *outputs) override;
  // From the first device holding the tensor.
  const HostTensor &value(TensorId id) const override;
  // Tensor-parallel pieces are whole here: the full tensor's type.
  TensorType value_type(TensorId id) const override;
  // To every device holding the tensor.
  Status assign(TensorId id, const HostTensor &value) override;
  // Over several processes: what this one writes (whole tensors it is the
  // first holder of; its shards of ZeRO-sharded ones).
  Result<std::map<std::string, HostTensor>> checkpoint_pieces() const override;
  ProcessGroup *processes() const override { return world_->processes(); }

  int num_devices() const { return plan_->num_devices(); }
  int microbatches() const { return plan_->microbatches(); }
  int data_parallel() const { return plan_->data_parallel(); }
  int tensor_parallel() const { return plan_->tensor_parallel(); }
  // Whether `device` runs in this process.
  bool is_local(int device) const { return world_->is_local(device); }
  // Peak activation bytes of each device (its arena).
  std::vector<int64_t> arena_bytes() const;
  // What each device of this process allocated: its activation arena and its
  // parts of the parameters, state and constants it holds (collective staging
  // not counted). -1 for a device another process runs.
  struct Allocation {
    int64_t arena = -1, held = -1;
  };
  std::vector<Allocation> allocations() const;
  // The CPU time each device thread of this process spent in its program in
  // the last step (two reads of its thread's CPU clock a step): the kernels,
  // copies and reductions it ran itself. Blocked waits cost none; its
  // communication stream's reductions and a GEMM's worker threads (more than
  // one GEMM thread per device) are not counted. -1 for a device another
  // process runs, and after a failed step.
  const std::vector<double> &busy_seconds() const { return busy_; }
  // What the devices did in every step run so far (with options.trace), as a
  // Chrome / Perfetto trace.
  std::string trace_json() const;
  // The recorded spans, per device (seconds since the first step began, by
  // options.clock).
  const std::vector<std::vector<plan::TraceSpan>> &spans() const { return spans_; }
  // With the device clock, the device time of the last step run (its last
  // device's end); else 0.
  double device_step_seconds() const { return device_step_; }

private:
  PipelineRunner() = default;
  struct Device;
  // One step on device `rank`'s thread.
  Status run_device(int rank, Communicator &comm, Communicator *side, int64_t step,
                    llvm::ArrayRef<HostTensor> inputs);
  Status run_program(Device &device, core::Transport &transport, DeviceClock *clock, int64_t step);
  std::optional<HostTensor> read(int device, TensorId id) const;

  std::unique_ptr<const core::PipelinePlan> plan_;
  std::vector<std::unique_ptr<Device>> devices_; // by plan device; null where run elsewhere
  PipelineRunnerOptions options_;
  std::shared_ptr<DeviceWorld> world_;
  bool all_local_ = true;
  int64_t steps_run_ = 0;
  bool failed_ = false;
  std::chrono::steady_clock::time_point epoch_;
  // The device clock: where the last step ended, its length, and the
  // exchanges the devices' (and their streams') clocked communicators share.
  double device_time_ = 0;
  double device_step_ = 0;
  std::vector<double> busy_; // busy_seconds(), by plan device
  std::unique_ptr<ClockExchange> exchange_, side_exchange_;
  std::vector<double> device_ends_;
  std::vector<std::vector<plan::TraceSpan>> spans_;
  // ZeRO-1 shards and tensor-parallel pieces put together by value().
  mutable std::map<TensorId, HostTensor> assembled_;
  // Over several processes, each local device's copy of the outputs after a
  // step (broadcast from the devices that hold them).
  std::vector<std::vector<HostTensor>> output_copies_;
};

// What MPI ranks on one host share per device to sum gradient buckets and
// gather prefetched parameters in their segments
// (MpiWorldOptions::shared_bytes): kSegmentBytes where `plan` has buckets or
// StartGathers, else 0.
size_t shared_segment_bytes(const serialization::Plan &plan);
// Per device of `plan`, at least the bytes of its memory the runner places
// in DeviceWorld::shared_memory (MpiWorldOptions::memory_bytes): its arena,
// held tensors and staging. Empty for a plan without collectives.
std::vector<size_t> shared_memory_bytes(const serialization::Plan &plan);

} // namespace strata::runtime
