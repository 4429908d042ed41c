// make_runner: the one place that turns a plan (or a one-device graph) and the
// backend's options into the StepRunner that runs it.
//
// The choice: a pipeline plan (data-, tensor-parallel or pipelined) runs on a
// PipelineRunner (CPU, a thread per device) or a CudaPipelineRunner (its
// devices as streams of one GPU, or over several GPUs or MPI ranks); a plan of
// one device, a model or an inference plan on a CpuExecutor or a
// CudaExecutor. A caller that needs what only one kind of runner knows (a CPU
// pipeline's trace, a GPU's name) asks for it with dynamic_cast.
//
// Errors about the options name the setting at fault as the caller's user
// gave it (`strata run`'s flag, or a Python keyword; see RunnerOptionNames);
// errors of making the runner itself (a plan a GPU cannot run, a file the
// weights are not in) are prefixed with RunnerOptions::source, the file the
// plan came from.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "graph/graph.h"
#include "runtime/comm/local_communicator.h"
#include "runtime/comm/mpi_world.h"
#include "runtime/cpu/pipeline_runner.h"
#include "runtime/step_runner.h"
#include "serialization/plan_io.h"

namespace strata::runtime {

enum class Backend { kCpu, kCuda };

struct RunnerOptions {
  Backend backend = Backend::kCpu;
  std::string model_dir = "."; // external data paths are relative to it
  std::string source;          // the plan's or model's file, named in errors of making it
  // Pipeline plans: the bound on every wait between devices (on a GPU: its
  // whole step, and NCCL's start-up). A one-device runner keeps its own.
  std::chrono::milliseconds timeout = kDefaultCommunicatorTimeout;

  // A pipeline plan on the CPU (PipelineRunnerOptions).
  bool trace = false; // record what each device did (PipelineRunner::trace_json)
  PipelineRunnerOptions::Clock clock = PipelineRunnerOptions::Clock::kWall;
  int gemm_threads = 1; // GEMM threads per device thread
  std::optional<PipelineRunnerOptions::Fault> fault;

  // Backend::kCuda only (CudaExecutorOptions, CudaPipelineOptions).
  int gpu = 0; // the CUDA device ordinal
  // A pipeline plan's GPU per plan device as --gpus gives it ("0,0,1,1"),
  // parsed by parse_gpu_list when the runner is made. Empty: all on `gpu`.
  std::string gpus;
  bool cuda_graph = true; // false: launch every kernel each step
  bool tf32 = false;
  bool bf16 = false; // GEMM operands in bf16
  bool f16 = false;  // or in scaled f16
  bool fuse = true;  // elementwise chains as one kernel each
  bool cudnn_pool_norm = true;
  int64_t workspace_bytes = 32 << 20;

  // Several processes: the MPI job this process has joined, which runs
  // `devices_per_rank` plan devices here (on a GPU: the GPU of its local
  // rank). Null: this process runs every device.
  std::shared_ptr<MpiWorld> world;
  int devices_per_rank = 1;

  // The caller will time the runner's nodes (CpuExecutor::profile,
  // CudaExecutor::node_times), which only a one-device runner does.
  bool node_times = false;
};

// How errors about the GPU options name them: `strata run`'s flags ("--gpu",
// "--gpus", "--backend cuda") or Python's keywords ("gpu=", "gpus=",
// "backend='cuda'"). The trace, clock and node-time options only the command
// line sets, so errors about them name its flags.
struct RunnerOptionNames {
  std::string_view gpu;
  std::string_view gpus;
  std::string_view cuda; // the CUDA backend
};

// Whether `options` suit `plan`, before anything is made: a GPU pinned under
// an MPI launcher, gpus on a one-device plan or with gpu, a trace or the
// device clock where they cannot be had, node times of a pipeline. The first
// misfit, in that order; the message names the options by `names`.
Status check_runner_options(const serialization::Plan &plan, const RunnerOptions &options,
                            const RunnerOptionNames &names);

// A timeout in seconds as the milliseconds RunnerOptions::timeout and
// MpiWorldOptions::timeout take (rounded up). More than 0 and at most a day;
// errors name it as `what` ("--timeout", "timeout=").
Result<std::chrono::milliseconds> timeout_from_seconds(double seconds, std::string_view what);

// The runner of a training or inference plan: check_runner_options first,
// then the pipeline runners for a pipeline plan, else make_runner(graph).
Result<std::unique_ptr<StepRunner>> make_runner(const serialization::Plan &plan,
                                                const RunnerOptions &options,
                                                const RunnerOptionNames &names);
// A one-device runner of `graph` (a model, or a one-device plan's graph):
// a CudaExecutor or a CpuExecutor. The pipeline fields are not read.
Result<std::unique_ptr<StepRunner>> make_runner(Graph graph, const RunnerOptions &options);

} // namespace strata::runtime
