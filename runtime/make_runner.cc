#include "runtime/make_runner.h"

#include <cmath>
#include <utility>

#include "runtime/cpu/executor.h"
#include "runtime/cuda/cuda_executor.h"
#include "runtime/cuda/cuda_pipeline.h"
#include "runtime/cuda/gpu_placement.h"

namespace strata::runtime {
namespace {

using serialization::Plan;

// What the two CUDA runners' options share, from `options`.
template <typename CudaOptions> CudaOptions cuda_options(const RunnerOptions &options) {
  CudaOptions cuda;
  cuda.model_dir = options.model_dir;
  cuda.gpu = options.gpu;
  cuda.cuda_graph = options.cuda_graph;
  cuda.tf32 = options.tf32;
  cuda.bf16 = options.bf16;
  cuda.f16 = options.f16;
  cuda.fuse = options.fuse;
  cuda.cudnn_pool_norm = options.cudnn_pool_norm;
  cuda.workspace_bytes = options.workspace_bytes;
  return cuda;
}

// A made runner as a StepRunner, or its error prefixed with the file it came from.
template <typename Runner>
Result<std::unique_ptr<StepRunner>> named(Result<std::unique_ptr<Runner>> created,
                                          const std::string &source) {
  if (!created.is_ok())
    return source.empty() ? created.status() : created.status().with_context(source);
  return std::unique_ptr<StepRunner>(std::move(created).value());
}

Result<std::unique_ptr<StepRunner>> make_cuda_pipeline(const Plan &plan,
                                                       const RunnerOptions &options) {
  auto cuda = cuda_options<CudaPipelineOptions>(options);
  cuda.timeout = options.timeout;
  if (!options.gpus.empty()) {
    ASSIGN_OR_RETURN(cuda.gpus, parse_gpu_list(options.gpus));
  }
  if (const std::shared_ptr<MpiWorld> &world = options.world) {
    // One GPU per process: the launcher's local rank picks it; NCCL joins
    // the processes, whose failures end every wait.
    // A launcher that shows each process its own GPU only (Slurm's
    // --gpus-per-task, CUDA_VISIBLE_DEVICES per rank) leaves one: GPU 0.
    const auto launch = detect_mpi_launch();
    cuda.gpu = launch && cuda_device_count() > 1 ? launch->local_rank : 0;
    cuda.processes = world.get();
    cuda.devices_per_process = options.devices_per_rank;
    cuda.watch = [world]() -> Status {
      Status failure = world->failure();
      if (failure.is_ok()) return failure;
      return failed_precondition("another process of the run failed: ", failure.message());
    };
    cuda.fail = [world](const Status &status) { world->fail(status); };
  }
  return named(CudaPipelineRunner::create(plan, cuda), options.source);
}

Result<std::unique_ptr<StepRunner>> make_cpu_pipeline(const Plan &plan,
                                                      const RunnerOptions &options) {
  PipelineRunnerOptions cpu;
  cpu.model_dir = options.model_dir;
  cpu.timeout = options.timeout;
  cpu.world = options.world;
  cpu.gemm_threads = options.gemm_threads;
  cpu.trace = options.trace;
  cpu.clock = options.clock;
  cpu.fault = options.fault;
  return named(PipelineRunner::create(plan, cpu), options.source);
}

} // namespace

Status check_runner_options(const Plan &plan, const RunnerOptions &options,
                            const RunnerOptionNames &names) {
  const bool cuda = options.backend == Backend::kCuda;
  if (cuda && options.world && (!options.gpus.empty() || options.gpu != 0))
    return invalid_argument("under an MPI launcher each process runs its devices on the GPU of "
                            "its local rank on its node; drop ",
                            names.gpu, "/", names.gpus);
  // On the CPU the GPU fields are not read (`strata run` refuses them first).
  if (cuda && !options.gpus.empty() && !plan.pipeline)
    return invalid_argument(names.gpus, " places a pipeline plan's devices on GPUs (", names.cuda,
                            "); this plan has one device (use ", names.gpu, " for one GPU)");
  if (cuda && !options.gpus.empty() && options.gpu != 0)
    return invalid_argument("give ", names.gpus, " or ", names.gpu, ", not both");
  if (cuda && options.trace)
    return invalid_argument("--trace records the CPU devices' instructions; with --backend cuda "
                            "profile the GPU with Nsight Systems (nsys profile strata run ...)");
  if (options.node_times && plan.pipeline)
    return invalid_argument(
        "--op-times times the nodes of a plan compiled without --mesh; this plan is a pipeline "
        "plan of ",
        plan.programs.size(), plan.programs.size() == 1 ? " device" : " devices",
        " (compile it without --mesh to profile its ops)");
  if (options.trace && !plan.pipeline)
    return invalid_argument("--trace records a pipeline plan's devices; this plan has one device "
                            "(compile with --mesh 1x1xP)");
  if (options.clock == PipelineRunnerOptions::Clock::kDevice) {
    if (cuda)
      return invalid_argument("--clock device times the CPU device threads; a GPU's steps are "
                              "timed by the GPU");
    if (!plan.pipeline)
      return invalid_argument("--clock device times a pipeline plan's devices; this plan has one "
                              "device (compile with --mesh 1x1xP)");
    if (options.world)
      return invalid_argument("--clock device needs every device in one process; this run has ",
                              options.world->size(), " MPI ranks");
  }
  return Status::ok();
}

Result<std::chrono::milliseconds> timeout_from_seconds(double seconds, std::string_view what) {
  if (!(seconds > 0) || seconds > 86400)
    return invalid_argument(what, " must be more than 0 and at most 86400 seconds, got ", seconds);
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000)));
}

Result<std::unique_ptr<StepRunner>> make_runner(const Plan &plan, const RunnerOptions &options,
                                                const RunnerOptionNames &names) {
  RETURN_IF_ERROR(check_runner_options(plan, options, names));
  // A copy of the graph is cheap: it shares the weights' bytes.
  if (!plan.pipeline) return make_runner(plan.graph, options);
  if (options.backend == Backend::kCuda) return make_cuda_pipeline(plan, options);
  return make_cpu_pipeline(plan, options);
}

Result<std::unique_ptr<StepRunner>> make_runner(Graph graph, const RunnerOptions &options) {
  if (options.backend == Backend::kCuda) {
    return named(CudaExecutor::create(std::move(graph), cuda_options<CudaExecutorOptions>(options)),
                 options.source);
  }
  ExecutorOptions cpu;
  cpu.model_dir = options.model_dir;
  return named(CpuExecutor::create(std::move(graph), cpu), options.source);
}

} // namespace strata::runtime
