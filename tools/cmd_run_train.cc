// The training mode of `strata run`: a training plan trained for --steps
// steps on one device, a pipeline of CPU threads, one GPU or several, or
// across the processes of an MPI job, with checkpoints, a stop on Ctrl-C, a
// trace of a CPU pipeline's devices, and at the end the steady step time and
// the plan's predictions beside what the run measured.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "plan/checkpoint_layout.h"
#include "runtime/comm/host_transport.h"
#include "runtime/comm/mpi_world.h"
#include "runtime/cpu/executor.h"
#include "runtime/cpu/pipeline_runner.h"
#include "runtime/cuda/cuda_executor.h"
#include "runtime/cuda/cuda_pipeline.h"
#include "runtime/trainer.h"
#include "serialization/checkpoint.h"
#include "serialization/file_io.h"
#include "serialization/sha256.h"
#include "tools/cli.h"
#include "tools/cmd_run.h"
#include "tools/model_stats.h"
#include "tools/plan_text.h"
#include "tools/training_setup.h"

namespace strata::tools {
namespace {

namespace fs = std::filesystem;
using serialization::Plan;

// STRATA_FAULT, for the failure tests: "<kind>:<device>:<step>:<instruction>"
// with kind error|stall|kill|exit|stop (the device does it on reaching that
// instruction of that step; "stall:...:<ms>" sleeps that long, not an hour: a
// slow device when it is under --timeout), "nostart:<rank>" (that rank never
// joins), "ckptkill:<rank>:<step>" (SIGKILL once that rank's checkpoint file
// of that step is written, before the commit) or "ckptlose:<rank>:<step>"
// (that file is removed once written, as if the rank had saved it on a
// filesystem of its own).
struct EnvFault {
  std::optional<runtime::PipelineRunnerOptions::Fault> fault;
  int nostart_rank = -1;
  int ckpt_kill_rank = -1;
  int64_t ckpt_kill_step = -1;
  int ckpt_lose_rank = -1;
  int64_t ckpt_lose_step = -1;
};

Result<EnvFault> fault_from_env() {
  EnvFault result;
  const char *text = std::getenv("STRATA_FAULT");
  if (text == nullptr || *text == '\0') return result;
  std::vector<std::string> parts;
  std::string part;
  for (const char *c = text;; ++c) {
    if (*c == ':' || *c == '\0') {
      parts.push_back(part);
      part.clear();
      if (*c == '\0') break;
    } else {
      part += *c;
    }
  }
  auto number = [&](size_t i) -> int64_t {
    int64_t value = -1;
    const std::string &p = parts[i];
    auto [end, error] = std::from_chars(p.data(), p.data() + p.size(), value);
    return error == std::errc() && end == p.data() + p.size() ? value : -1;
  };
  const std::string usage =
      str_cat("STRATA_FAULT='", text,
              "': expected <error|stall|kill|exit|stop>:<device>:<step>:<instruction>, "
              "stall:<device>:<step>:<instruction>:<ms>, nostart:<rank>, ckptkill:<rank>:<step> or "
              "ckptlose:<rank>:<step>");
  if (parts.size() == 2 && parts[0] == "nostart" && number(1) >= 0) {
    result.nostart_rank = static_cast<int>(number(1));
    return result;
  }
  if (parts.size() == 3 && parts[0] == "ckptkill" && number(1) >= 0 && number(2) >= 1) {
    result.ckpt_kill_rank = static_cast<int>(number(1));
    result.ckpt_kill_step = number(2);
    return result;
  }
  if (parts.size() == 3 && parts[0] == "ckptlose" && number(1) >= 0 && number(2) >= 1) {
    result.ckpt_lose_rank = static_cast<int>(number(1));
    result.ckpt_lose_step = number(2);
    return result;
  }
  using Kind = runtime::PipelineRunnerOptions::Fault::Kind;
  const std::map<std::string, Kind> kinds = {{"error", Kind::kError},
                                             {"stall", Kind::kStall},
                                             {"kill", Kind::kKill},
                                             {"exit", Kind::kExit},
                                             {"stop", Kind::kStop}};
  const bool timed_stall = parts.size() == 5 && parts[0] == "stall" && number(4) >= 0;
  if ((parts.size() != 4 && !timed_stall) || !kinds.contains(parts[0]) || number(1) < 0 ||
      number(2) < 1 || number(3) < 0)
    return invalid_argument(usage);
  runtime::PipelineRunnerOptions::Fault fault;
  fault.kind = kinds.at(parts[0]);
  fault.device = static_cast<int>(number(1));
  fault.step = number(2);
  fault.instruction = static_cast<size_t>(number(3));
  fault.stall = timed_stall ? std::chrono::milliseconds(number(4)) : std::chrono::hours(1);
  result.fault = fault;
  return result;
}

// Ctrl-C (SIGINT) or SIGTERM during training: the step in flight finishes,
// the checkpoint is saved (with --checkpoint), and the process ends by the
// signal. A second signal ends it at once. From the first, SIGPIPE is
// ignored: a pipe reader such as tee gets the Ctrl-C too, and writing to it
// must not end the process before the checkpoint is saved.
std::atomic<int> stop_requested{0}; // the signal, from the handler
static_assert(std::atomic<int>::is_always_lock_free);
int stopped_by = 0; // the signal that ended the run early, for main

extern "C" void request_stop(int signal_number) {
  struct sigaction action = {};
  sigemptyset(&action.sa_mask);
  if (stop_requested.exchange(signal_number) != 0) {
    action.sa_handler = SIG_DFL;
    ::sigaction(signal_number, &action, nullptr);
    ::raise(signal_number); // delivered when this handler returns
    return;
  }
  action.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &action, nullptr);
  static const char kMessage[] =
      "\nstrata: stopping after this step (send the signal again to stop at once)\n";
  [[maybe_unused]] ssize_t written = ::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
}

// Installs request_stop for SIGINT and SIGTERM while in scope, except for a
// signal the process was started ignoring (a background job's SIGINT).
class StopOnSignal {
public:
  StopOnSignal() {
    struct sigaction action = {};
    action.sa_handler = request_stop;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    ::sigaction(SIGPIPE, nullptr, &previous_[0]);
    for (int k = 1; k < 3; ++k) {
      ::sigaction(kSignals[k], nullptr, &previous_[k]);
      if (previous_[k].sa_handler != SIG_IGN) ::sigaction(kSignals[k], &action, nullptr);
    }
  }
  ~StopOnSignal() {
    // After a stop SIGPIPE stays ignored: the error is still to be printed,
    // perhaps to a pipe whose reader the signal ended too.
    for (int k = 1; k < 3; ++k)
      ::sigaction(kSignals[k], &previous_[k], nullptr);
    if (stop_requested.load() == 0) ::sigaction(SIGPIPE, &previous_[0], nullptr);
  }
  StopOnSignal(const StopOnSignal &) = delete;
  StopOnSignal &operator=(const StopOnSignal &) = delete;

private:
  static constexpr int kSignals[3] = {SIGPIPE, SIGINT, SIGTERM};
  struct sigaction previous_[3] = {};
};

// "t.json" for rank 0, "t.rank2.json" for rank 2.
std::string per_rank_path(const std::string &path, int rank) {
  if (rank == 0) return path;
  fs::path p(path);
  return (p.parent_path() / str_cat(p.stem().string(), ".rank", rank, p.extension().string()))
      .string();
}

std::string format_loss(double loss) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", loss);
  return buf;
}

std::string format_rate(double steps, double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", seconds > 0 ? steps / seconds : 0.0);
  return buf;
}

std::string format_seconds(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", seconds);
  return buf;
}

std::string format_micros(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", seconds * 1e6);
  return buf;
}

// How a GPU runs each step, for the `gpu` line: replayed or eager, the GEMMs'
// precision, the fused chains.
std::string gpu_step_line(const RunArgs &args, int64_t fused_chains) {
  return str_cat(args.cuda_graph ? "steps replayed as one CUDA Graph" : "eager launches",
                 args.precision != "f32"
                     ? str_cat(", ", args.precision, " GEMMs (f32 weights and optimizer state)")
                     : std::string(),
                 fused_chains > 0 ? str_cat(", ", fused_chains, " elementwise chains fused")
                                  : std::string(),
                 args.pool_norm == "strata" ? ", pooling and batch norm by strata's kernels" : "");
}

// The `gpu` line: which GPU, how the plan's devices share it or spread over
// GPUs or processes, the memory allocated and how it runs each step. Empty
// on the CPU.
std::string gpu_summary(const RunArgs &args, const runtime::StepRunner &runner,
                        const runtime::MpiWorld *world) {
  if (const auto *gpu = dynamic_cast<const runtime::CudaPipelineRunner *>(&runner))
    return str_cat(
        gpu->device_name(),
        world ? str_cat(" (rank 0 of ", world->size(), " processes, NCCL between their GPUs) runs ",
                        args.devices_per_rank, " of the ", gpu->num_devices())
        : gpu->num_gpus() > 1 ? str_cat(" (NCCL, a host thread each) run ", gpu->num_devices())
                              : str_cat(" runs all ", gpu->num_devices()),
        " plan devices (two streams each), ", human_bytes(static_cast<double>(gpu->device_bytes())),
        " allocated once, ", gpu_step_line(args, gpu->fused_chains()));
  if (const auto *gpu = dynamic_cast<const runtime::CudaExecutor *>(&runner))
    return str_cat(gpu->device_name(), ", ", human_bytes(static_cast<double>(gpu->device_bytes())),
                   " allocated once, ", gpu_step_line(args, gpu->fused_chains()));
  return "";
}

// FLOPs of one training step by the op registry's costs, as the plan summary
// counts them (recomputed nodes count again): every compute instruction of
// every device, all micro-batches and replicas, or every node of a
// single-device plan.
double step_flops(const Plan &plan) {
  double flops = 0;
  if (plan.pipeline) {
    for (const StageRow &row : stage_rows(plan))
      flops += row.flops;
  } else if (auto stats = compute_model_stats(plan.graph); stats.is_ok()) {
    flops = stats->flops;
  }
  return flops;
}

// --steps, --log-every and --checkpoint-every.
Status check_loop_options(const RunArgs &args) {
  if (args.steps < 1) return invalid_argument("--steps must be at least 1");
  if (args.log_every < 1) return invalid_argument("--log-every must be at least 1");
  if (args.checkpoint_every < 0) return invalid_argument("--checkpoint-every must be at least 0");
  if (args.checkpoint_every > 0 && args.checkpoint.empty())
    return invalid_argument("--checkpoint-every needs --checkpoint DIR");
  return Status::ok();
}

// Where the run will write, checked before it trains: the checkpoint folder,
// which must hold no other run's checkpoint, and this rank's trace file.
// Rank 0 (or the only process) also creates the folder and locks it for the
// run, which it returns: it commits every checkpoint and removes the files
// a commit replaces, while the other ranks write only their own data files
// inside the saves it leads, so its lock keeps every other run out without
// making the ranks of this one refuse each other.
Result<std::optional<serialization::CheckpointLock>> check_writable(const RunArgs &args, int rank) {
  ASSIGN_OR_RETURN(
      std::optional<serialization::CheckpointLock> lock,
      claim_checkpoint_folder(args.checkpoint, args.resume, rank, "--checkpoint", "--resume"));
  if (!args.trace.empty())
    RETURN_IF_ERROR(serialization::check_file_writable(per_rank_path(args.trace, rank), "--trace"));
  return lock;
}

// The plan's fingerprint and layout record, which checkpoints carry, and
// STRATA_FAULT's ckptkill or ckptlose where it names this rank (of `ranks`).
runtime::TrainerOptions trainer_options(const RunArgs &args, const Plan &plan,
                                        const EnvFault &fault, int rank, int ranks) {
  runtime::TrainerOptions options;
  options.fingerprint = plan.fingerprint;
  options.layout = plan::checkpoint_layout(plan, plan::layout_description(plan, ranks));
  if (fault.ckpt_kill_rank == rank) {
    const int64_t at = fault.ckpt_kill_step;
    options.checkpoint_file_written = [at](int64_t step) {
      if (step == at) raise(SIGKILL);
    };
  } else if (fault.ckpt_lose_rank == rank) {
    const int64_t at = fault.ckpt_lose_step;
    const std::string file =
        (fs::path(args.checkpoint) / serialization::checkpoint_file_name(at, rank, ranks)).string();
    options.checkpoint_file_written = [at, file](int64_t step) {
      std::error_code error;
      if (step == at) fs::remove(file, error);
    };
  }
  return options;
}

// Where a pipeline plan's devices run, for the `pipeline` line: threads of
// this process, streams of one GPU or of several, or a share of them in each
// of the MPI job's processes.
std::string placement(const RunArgs &args, const runtime::StepRunner &runner,
                      const runtime::MpiWorld *world) {
  const int per_rank = args.devices_per_rank;
  if (world && args.backend == "cuda")
    return str_cat(world->size(), " MPI ranks x ", per_rank, " device", per_rank == 1 ? "" : "s",
                   " (streams of each rank's GPU)");
  if (world) {
    // Rank 0 speaks: whether its devices' memory is in the host's window.
    const bool shared = !world->shared_memory(0).empty();
    return str_cat(world->size(), " MPI ranks x ", per_rank, " CPU thread",
                   per_rank == 1 ? "" : "s", " (devices)",
                   shared ? ", memory shared by the ranks on a host" : "");
  }
  if (const auto *gpu = dynamic_cast<const runtime::CudaPipelineRunner *>(&runner);
      gpu != nullptr && gpu->num_gpus() > 1)
    return str_cat("on ", gpu->num_gpus(), " GPUs");
  if (args.backend == "cuda") return "on one GPU";
  return "one CPU thread per device";
}

// The `plan` line, a pipeline plan's `pipeline` line, and on a GPU the `gpu`
// line.
void print_header(const RunArgs &args, const Plan &plan, const runtime::StepRunner &runner,
                  const runtime::MpiWorld *world, std::ostream &out) {
  const std::string &model_name = plan.graph.name();
  out << "plan       " << args.model << " (train " << (model_name.empty() ? "model" : model_name)
      << ", " << plan.loss_kind << ", " << plan.optimizer << ")\n";
  if (plan.pipeline)
    out << "pipeline   " << counted(plan.pipeline->stages, "stage") << " x "
        << counted(plan.pipeline->microbatches, "micro-batch") << " (" << plan.pipeline->schedule
        << (plan.pipeline->chunks > 1 ? str_cat(", ", plan.pipeline->chunks, " chunks per device")
                                      : std::string())
        << ")"
        << (plan.pipeline->data_parallel > 1
                ? str_cat(" x ", plan.pipeline->data_parallel, " replicas")
                : std::string())
        << (plan.pipeline->tensor_parallel > 1
                ? str_cat(" x ", plan.pipeline->tensor_parallel, "-device tensor-parallel groups")
                : std::string())
        << ", " << placement(args, runner, world) << "\n";
  if (const std::string gpu = gpu_summary(args, runner, world); !gpu.empty())
    out << "gpu        " << gpu << "\n";
}

// What a CPU pipeline runner records: its devices' trace (--trace) and the
// device clock (--clock device). Other runners record neither.
struct PipelineRecords {
  const runtime::PipelineRunner *pipeline = nullptr; // null: another runner
  std::string trace_path;                            // this rank's --trace file; empty: none

  bool tracing() const { return pipeline != nullptr && !trace_path.empty(); }
  Status write_trace() const {
    if (!tracing()) return Status::ok();
    return serialization::write_file_atomically(trace_path, pipeline->trace_json());
  }
};

// What the step loop saw, for the closing lines.
struct LoopStats {
  int64_t first_step = 0;
  double first_loss = 0, last_loss = 0;
  std::chrono::steady_clock::time_point start;
  // Each step's time, and on a GPU the host's time issuing it, from the
  // third step on (the first loads the kernels, on a GPU the second is
  // captured): the steady state.
  std::vector<double> step_seconds, issue_seconds, device_seconds;
  // A CPU pipeline's: per plan device, its thread's CPU time in each steady
  // step (PipelineRunner::busy_seconds); empty for another process's device.
  std::vector<std::vector<float>> busy_seconds;

  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

// Adds a step's busy time of this process's devices to `stats`.
void record_busy(const std::vector<double> &busy, LoopStats &stats) {
  stats.busy_seconds.resize(busy.size());
  for (size_t d = 0; d < busy.size(); ++d)
    if (busy[d] >= 0) stats.busy_seconds[d].push_back(static_cast<float>(busy[d]));
}

// The median of `values` (not empty).
double median(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

// Steps until --steps are done or a signal asks to stop: the loss every
// --log-every steps (rewritten in place on a terminal), and checkpoints.
Status run_steps(const RunArgs &args, runtime::Trainer &trainer, const PipelineRecords &records,
                 bool interactive, LoopStats &stats, std::ostream &out) {
  stats.first_step = trainer.step();
  stats.start = std::chrono::steady_clock::now();
  while (trainer.step() < args.steps) {
    const auto step_start = std::chrono::steady_clock::now();
    auto stepped = trainer.train_step();
    if (stepped.is_ok() && trainer.step() > stats.first_step + 2) {
      stats.step_seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count());
      if (trainer.runner().issue_seconds() >= 0)
        stats.issue_seconds.push_back(trainer.runner().issue_seconds());
      if (records.pipeline != nullptr && args.clock == "device")
        stats.device_seconds.push_back(records.pipeline->device_step_seconds());
      if (records.pipeline != nullptr) record_busy(records.pipeline->busy_seconds(), stats);
    }
    if (!stepped.is_ok()) {
      // The trace of a failed run is the most useful one: write what was recorded.
      if (records.write_trace().is_ok() && records.tracing())
        return stepped.status().with_context(str_cat("trace of the failed run: ", args.trace));
      return stepped.status();
    }
    const double loss = *stepped;
    const int64_t step = trainer.step();
    if (step == stats.first_step + 1) stats.first_loss = loss;
    stats.last_loss = loss;
    if (!std::isfinite(loss)) {
      if (interactive) out << "\n";
      return failed_precondition("the loss is ", loss, " at step ", step,
                                 "; lower the learning rate or add clip=1 to --optimizer");
    }
    std::string line = str_cat(
        "step ", step, "/", args.steps, "  loss ", format_loss(loss), "  (",
        format_rate(static_cast<double>(step - stats.first_step), stats.seconds()), " steps/s)");
    bool logged = step % args.log_every == 0 || step == args.steps;
    if (interactive) {
      out << "\r" << line << "\x1b[K" << (logged ? "\n" : "") << std::flush;
    } else if (logged) {
      out << line << "\n" << std::flush; // a pipe or file sees each line as it happens
    }
    bool save =
        !args.checkpoint.empty() &&
        ((args.checkpoint_every > 0 && step % args.checkpoint_every == 0) || step == args.steps);
    if (save) {
      RETURN_IF_ERROR(trainer.save_checkpoint(args.checkpoint));
      if (!interactive || logged)
        out << "checkpoint " << args.checkpoint << " (step " << step << ")\n" << std::flush;
    }
    if (stop_requested.load() != 0) {
      stopped_by = stop_requested.load(); // whatever fails below, the process ends by it
      if (interactive && !logged) out << "\n";
      if (!args.checkpoint.empty() && !save) {
        RETURN_IF_ERROR(trainer.save_checkpoint(args.checkpoint));
        out << "checkpoint " << args.checkpoint << " (step " << step << ")\n" << std::flush;
      }
      break;
    }
  }
  return Status::ok();
}

// A run a signal stopped after `step`: the trace up to there, and the error
// that ends the process (by the signal: main).
Status stopped_run(const RunArgs &args, int64_t step, const PipelineRecords &records,
                   int signal_number, std::ostream &out) {
  stopped_by = signal_number;
  if (records.tracing()) {
    RETURN_IF_ERROR(records.write_trace());
    out << "trace      " << args.trace << " (up to the stop)\n" << std::flush;
  }
  return failed_precondition("stopped by ", signal_number == SIGINT ? "SIGINT" : "SIGTERM",
                             " after step ", step, " of ", args.steps, "; ",
                             step == args.steps ? std::string("the run is complete")
                             : args.checkpoint.empty()
                                 ? std::string("nothing was saved (--checkpoint DIR saves the "
                                               "state when stopped)")
                                 : str_cat("continue with --resume ", args.checkpoint));
}

// The closing lines: the trace, the steps and the loss, the FLOP rate, and
// the steady step time by the wall clock, the device clock and the host's
// time issuing it.
Status print_summary(const RunArgs &args, int64_t last_step, const LoopStats &stats,
                     const PipelineRecords &records, double flops, std::ostream &out) {
  double elapsed = stats.seconds();
  int64_t ran = last_step - stats.first_step;
  if (records.tracing()) {
    RETURN_IF_ERROR(records.write_trace());
    out << "trace      " << args.trace << " (" << ran << " step" << (ran == 1 ? "" : "s")
        << "; open in ui.perfetto.dev or chrome://tracing)\n";
  }
  out << "done       " << ran << " step" << (ran == 1 ? "" : "s") << " in "
      << format_seconds(elapsed) << " s (" << format_rate(static_cast<double>(ran), elapsed)
      << " steps/s); loss " << format_loss(stats.first_loss) << " -> "
      << format_loss(stats.last_loss) << "\n";
  if (ran > 0 && elapsed > 0)
    out << "compute    " << human_flops(flops) << " per step, "
        << human_flops(flops * static_cast<double>(ran) / elapsed) << "/s\n";
  const size_t n = stats.step_seconds.size();
  const std::string last_steps = str_cat("median of the last ", n, " step", n == 1 ? "" : "s");
  if (n > 0)
    out << "steady     " << format_ms(median(stats.step_seconds)) << " per step (" << last_steps
        << ")\n";
  if (stats.device_seconds.empty() && args.clock == "device" && records.pipeline != nullptr)
    out << "device     no step time: the device clock's is the median from the third step on "
           "(run 3 or more steps)\n";
  if (!stats.device_seconds.empty())
    out << "device     " << format_ms(median(stats.device_seconds))
        << " per step on a core per device (the device clock"
        << (args.trace.empty() ? "" : ", which the trace uses too") << "; " << last_steps << ")\n";
  if (!stats.issue_seconds.empty())
    out << "host       " << format_micros(median(stats.issue_seconds))
        << " us per step to issue it (" << last_steps << ": the batch copied in, "
        << (args.cuda_graph ? "the captured step replayed" : "every kernel launched") << ")\n";
  return Status::ok();
}

// What the run measured of one plan device, set beside the plan's
// predictions for it; -1 where it was not measured (a GPU's device; a CPU
// device's busy time before its third step).
struct DeviceMeasure {
  double busy = -1;   // median CPU seconds of its thread per steady step
  int64_t arena = -1; // the activation arena allocated for it
  int64_t held = -1;  // the parameters, state and constants it holds
};

// What the run measured: per plan device, and the peak resident set of this
// process or, on rank 0 of an MPI job with CPU devices, of every rank.
struct RunMeasures {
  std::vector<DeviceMeasure> devices; // by plan device
  std::vector<int64_t> rss;           // bytes, by rank; -1 where unknown
};

// This process's peak resident set size in bytes, or -1.
int64_t peak_rss_bytes() {
  struct rusage usage = {};
  if (::getrusage(RUSAGE_SELF, &usage) != 0) return -1;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024; // Linux counts KiB
}

// What this process measured: a CPU pipeline's arenas and held bytes (as
// allocated) and busy times (the median over the steady steps) of its
// devices, or a one-device CPU run's arena and weights. A GPU's runners tell
// only their whole allocation (the `gpu` line).
RunMeasures local_measures(const Plan &plan, const runtime::StepRunner &runner,
                           const LoopStats &stats) {
  RunMeasures measures;
  measures.devices.resize(plan.programs.size());
  measures.rss.push_back(peak_rss_bytes());
  if (const auto *pipeline = dynamic_cast<const runtime::PipelineRunner *>(&runner)) {
    const std::vector<runtime::PipelineRunner::Allocation> allocations = pipeline->allocations();
    for (size_t d = 0; d < measures.devices.size() && d < allocations.size(); ++d) {
      DeviceMeasure &device = measures.devices[d];
      device.arena = allocations[d].arena;
      device.held = allocations[d].held;
      if (d >= stats.busy_seconds.size() || stats.busy_seconds[d].empty()) continue;
      const std::vector<float> &busy = stats.busy_seconds[d];
      device.busy = median(std::vector<double>(busy.begin(), busy.end()));
    }
  } else if (const auto *cpu = dynamic_cast<const runtime::CpuExecutor *>(&runner);
             cpu != nullptr && !measures.devices.empty()) {
    measures.devices[0].arena = cpu->memory_plan().arena_bytes;
    measures.devices[0].held = cpu->weight_bytes();
  }
  return measures;
}

// Under MPI: every rank's measures of its devices and its peak RSS, put
// together on rank 0 (the others keep their own). A collective: every rank
// of a CPU pipeline calls it once, after its last step.
Status gather_measures(runtime::ProcessGroup &processes, RunMeasures &measures) {
  using Json = nlohmann::json;
  Json devices = Json::array();
  for (size_t d = 0; d < measures.devices.size(); ++d) {
    const DeviceMeasure &device = measures.devices[d];
    if (device.arena >= 0)
      devices.push_back(
          {{"device", d}, {"busy", device.busy}, {"arena", device.arena}, {"held", device.held}});
  }
  const Json mine = {{"rss", measures.rss.front()}, {"devices", devices}};
  std::vector<std::string> all;
  RETURN_IF_ERROR(processes.gather(mine.dump(), &all, "the measures of the devices"));
  if (processes.rank() != 0) return Status::ok();
  auto integer = [](const Json &object, const char *key) {
    return object.is_object() && object.contains(key) && object.at(key).is_number_integer();
  };
  measures.rss.assign(all.size(), -1);
  for (size_t r = 0; r < all.size(); ++r) {
    const Json entry = Json::parse(all[r], nullptr, false);
    const std::string malformed = str_cat("rank ", r, " sent malformed measures of its devices");
    if (!integer(entry, "rss") || !entry.contains("devices") || !entry.at("devices").is_array())
      return internal_error(malformed);
    measures.rss[r] = entry.at("rss").get<int64_t>();
    for (const Json &row : entry.at("devices")) {
      if (!integer(row, "device") || !integer(row, "arena") || !integer(row, "held") ||
          !row.contains("busy") || !row.at("busy").is_number())
        return internal_error(malformed);
      const int64_t d = row.at("device").get<int64_t>();
      if (d < 0 || static_cast<size_t>(d) >= measures.devices.size())
        return internal_error(malformed);
      measures.devices[static_cast<size_t>(d)] = {row.at("busy").get<double>(),
                                                  row.at("arena").get<int64_t>(),
                                                  row.at("held").get<int64_t>()};
    }
  }
  return Status::ok();
}

// Everything the closing comparison sets beside the plan, this process's
// and under MPI (a CPU pipeline's), on rank 0, every rank's.
Result<RunMeasures> measure_run(const Plan &plan, const runtime::StepRunner &runner,
                                const LoopStats &stats, runtime::MpiWorld *world) {
  RunMeasures measures = local_measures(plan, runner, stats);
  if (world != nullptr && dynamic_cast<const runtime::PipelineRunner *>(&runner) != nullptr)
    RETURN_IF_ERROR(gather_measures(*world, measures));
  return measures;
}

// "x1.15": how many times the prediction the measure is.
std::string format_ratio(double measured, double predicted) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "x%.2f", measured / predicted);
  return buf;
}

std::string bytes_or_dash(int64_t bytes) {
  return bytes < 0 ? std::string("-") : human_bytes(static_cast<double>(bytes));
}

// "peak RSS 45.2 MiB (this process)", or per rank under MPI.
std::string rss_text(const std::vector<int64_t> &rss) {
  if (rss.size() == 1) return str_cat("peak RSS ", bytes_or_dash(rss[0]), " (this process)");
  if (rss.size() <= 8) {
    std::string text = "peak RSS";
    for (size_t r = 0; r < rss.size(); ++r)
      text += str_cat(r == 0 ? " " : ", ", bytes_or_dash(rss[r]), " (rank ", r, ")");
    return text;
  }
  const size_t largest =
      static_cast<size_t>(std::max_element(rss.begin(), rss.end()) - rss.begin());
  return str_cat("peak RSS up to ", bytes_or_dash(rss[largest]), " (rank ", largest, " of ",
                 rss.size(), ")");
}

// A pipeline plan's `predicted` line: its step time and bubble against the
// steady step by the wall clock, and by the device clock where it was kept.
void print_predicted_step(const serialization::PlanPipeline &p, const LoopStats &stats,
                          std::ostream &out) {
  if (p.predicted_step_s <= 0)
    out << "predicted  no step time: the plan records none";
  else
    out << "predicted  step " << format_ms(p.predicted_step_s) << " (bubble "
        << format_percent(p.predicted_bubble) << ")";
  if (stats.step_seconds.empty()) {
    out << "; nothing measured to set beside it (the steady step is the median from the third "
           "step on: run 3 or more steps)\n";
    return;
  }
  auto against = [&](double measured) {
    return p.predicted_step_s <= 0 ? format_ms(measured)
                                   : str_cat(format_ms(measured), " (",
                                             format_ratio(measured, p.predicted_step_s), ")");
  };
  out << (p.predicted_step_s <= 0 ? "; measured " : " against measured ")
      << against(median(stats.step_seconds));
  if (!stats.device_seconds.empty())
    out << " by the wall clock, " << against(median(stats.device_seconds))
        << " by the device clock";
  out << "\n";
}

// The plan's predictions beside what the run measured. A pipeline plan: the
// `predicted` line, then per device its predicted busy time and planned
// arena beside the measured ones and what it holds ("-": not measured).
// Then the `memory` line: a one-device plan's planned arena beside the
// allocated one, and the peak RSS.
void print_predictions(const Plan &plan, const LoopStats &stats, const RunMeasures &measures,
                       std::ostream &out) {
  bool measured = false; // any device's memory
  for (const DeviceMeasure &device : measures.devices)
    measured = measured || device.arena >= 0;
  if (plan.pipeline) {
    print_predicted_step(*plan.pipeline, stats, out);
    out << "device  predicted busy  measured busy  planned arena  allocated arena  weights+state\n";
    for (size_t d = 0; d < plan.programs.size(); ++d) {
      const DeviceMeasure device =
          d < measures.devices.size() ? measures.devices[d] : DeviceMeasure{};
      out << pad(std::to_string(d), 6) << pad(format_ms(plan.programs[d].predicted_busy_s), 16)
          << pad(device.busy < 0 ? std::string("-") : format_ms(device.busy), 15)
          << pad(bytes_or_dash(plan.programs[d].arena_bytes), 15)
          << pad(bytes_or_dash(device.arena), 17) << pad(bytes_or_dash(device.held), 15) << "\n";
    }
    out << "memory     " << rss_text(measures.rss)
        << (measured ? "" : "; a GPU's devices are measured as one allocation (the `gpu` line)")
        << "\n";
    return;
  }
  const DeviceMeasure device = measures.devices.empty() ? DeviceMeasure{} : measures.devices[0];
  out << "memory     activation arena "
      << bytes_or_dash(plan.programs.empty() ? -1 : plan.programs[0].arena_bytes) << " planned";
  if (measured)
    out << ", " << bytes_or_dash(device.arena) << " allocated; weights and state "
        << bytes_or_dash(device.held);
  else
    out << " (the GPU's allocation: the `gpu` line)";
  out << "; " << rss_text(measures.rss) << "\n";
}

// Trains `plan` in this process: every device, or under an MPI launcher
// (`world`) this rank's.
Status train_on(const RunArgs &args, const Plan &plan, std::ostream &out, bool interactive,
                const std::shared_ptr<runtime::MpiWorld> &world, const EnvFault &fault) {
  RETURN_IF_ERROR(check_loop_options(args));
  runtime::RunnerOptions runner_options = run_runner_options(args);
  runner_options.world = world;
  runner_options.fault = fault.fault;
  RETURN_IF_ERROR(runtime::check_runner_options(plan, runner_options, kRunnerFlags));
  ASSIGN_OR_RETURN(runner_options.timeout,
                   runtime::timeout_from_seconds(args.timeout_s, "--timeout"));
  const int rank = world ? world->rank() : 0;
  // The data and the runner first: a run refused for them leaves no
  // checkpoint folder behind. The lock is held until the run ends.
  ASSIGN_OR_RETURN(runtime::Dataset data, training_data(plan, args.data, args.seed));
  ASSIGN_OR_RETURN(std::unique_ptr<runtime::StepRunner> runner,
                   runtime::make_runner(plan, runner_options, kRunnerFlags));
  ASSIGN_OR_RETURN(std::optional<serialization::CheckpointLock> checkpoint_lock,
                   check_writable(args, rank));
  runtime::StepRunner *timed = runner.get(); // --op-times, once the trainer owns it
  auto created =
      runtime::Trainer::create(std::move(runner), plan.loss, std::move(data),
                               trainer_options(args, plan, fault, rank, world ? world->size() : 1));
  if (!created.is_ok()) return created.status().with_context(args.model);
  runtime::Trainer &trainer = **created;

  print_header(args, plan, trainer.runner(), world.get(), out);
  out << "data       " << trainer.data().description << "\n";
  if (!args.resume.empty()) {
    RETURN_IF_ERROR(trainer.restore_checkpoint(args.resume));
    out << "resumed    " << args.resume << " at step " << trainer.step();
    if (!trainer.resharded_from().empty())
      out << " (resharded from " << trainer.resharded_from() << ")";
    out << "\n";
  }
  if (trainer.step() >= args.steps) {
    out << "done       already at step " << trainer.step() << " of " << args.steps
        << "; nothing to run\n";
    return Status::ok();
  }

  PipelineRecords records;
  records.pipeline = dynamic_cast<const runtime::PipelineRunner *>(&trainer.runner());
  if (!args.trace.empty()) records.trace_path = per_rank_path(args.trace, rank);
  LoopStats stats;
  {
    // Under an MPI launcher every rank would have to stop at the same step;
    // there the MPI world's own handlers (runtime/comm/mpi_world.cc) end the job.
    std::optional<StopOnSignal> stop_on_signal;
    if (!world) stop_on_signal.emplace();
    out << std::flush; // the header, before a first step that may take long
    RETURN_IF_ERROR(run_steps(args, trainer, records, interactive, stats, out));
  }
  // A signal from here on has its default action again. One that came after
  // the last step's check still ends the process by it.
  if (const int signal_number = stop_requested.load(); signal_number != 0)
    return stopped_run(args, trainer.step(), records, signal_number, out);
  // Under MPI a collective: before anything that one rank alone may fail.
  ASSIGN_OR_RETURN(const RunMeasures measures,
                   measure_run(plan, trainer.runner(), stats, world.get()));
  RETURN_IF_ERROR(print_summary(args, trainer.step(), stats, records, step_flops(plan), out));
  print_predictions(plan, stats, measures, out);
  if (args.op_times)
    RETURN_IF_ERROR(print_op_times(*timed, runtime::random_inputs(timed->graph(), args.seed), out));
  return Status::ok();
}

// What identifies a data folder to the start-up agreement: each file's name,
// size and a digest of its first and last MiB. Ranks given different data
// (another folder, another copy, another seed's synthetic batches) then refuse
// to start, without every rank reading all of a large dataset at start-up.
Result<std::string> data_identity(const std::string &dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto &entry : fs::directory_iterator(dir, ec))
    if (entry.is_regular_file()) files.push_back(entry.path());
  if (ec) return not_found("--data ", dir, ": ", ec.message());
  std::sort(files.begin(), files.end());
  serialization::Sha256 digest;
  std::vector<char> buffer(size_t{1} << 20);
  for (const fs::path &file : files) {
    const uintmax_t size = fs::file_size(file, ec);
    if (ec) return not_found("--data ", file.string(), ": ", ec.message());
    digest.update(str_cat(file.filename().string(), " ", size, "\n"));
    std::ifstream in(file, std::ios::binary);
    for (const uintmax_t at : {uintmax_t{0}, size > buffer.size() ? size - buffer.size() : 0}) {
      in.seekg(static_cast<std::streamoff>(at));
      in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
      digest.update(buffer.data(), static_cast<size_t>(in.gcount()));
      in.clear();
    }
    if (!in) return io_error("--data ", file.string(), ": cannot read");
  }
  return str_cat(files.size(), " files, ", digest.hex_digest().substr(0, 16));
}

// The settings every rank of a job must share besides the plan: ranks that
// differ in them would train on mixed data or save at different steps. A data
// folder a rank cannot read is its value too, so that rank is named rather
// than left out of the agreement the others wait in.
std::vector<std::pair<std::string, std::string>> shared_settings(const RunArgs &args) {
  auto folder = [](const std::string &path) {
    if (path.empty()) return std::string("(none)");
    std::error_code ec;
    const fs::path full = fs::weakly_canonical(fs::absolute(path), ec);
    return ec ? path : full.string();
  };
  std::string data = "(synthetic)";
  if (!args.data.empty()) {
    Result<std::string> identity = data_identity(args.data);
    data = identity.is_ok() ? *identity : identity.status().message();
  }
  return {
      {"--seed", str_cat(args.seed)},
      {"--steps", str_cat(args.steps)},
      {"--data", data},
      {"--checkpoint folder", folder(args.checkpoint)},
      {"--checkpoint-every", str_cat(args.checkpoint_every)},
      {"--resume folder", folder(args.resume)},
  };
}

} // namespace

int training_stop_signal() { return stopped_by; }

Status train_command(const RunArgs &args, const Plan &plan, std::ostream &out) {
  ASSIGN_OR_RETURN(EnvFault env_fault, fault_from_env());
  const auto launch = runtime::detect_mpi_launch();
  if (!launch || launch->size == 1) {
    if (args.devices_per_rank != 1)
      return invalid_argument("--devices-per-rank splits a plan over MPI ranks; start strata with "
                              "an MPI launcher (mpirun -np N strata run ...)");
    // A device thread stalled past the timeout cannot be stopped: report the
    // failure and end the process, as a failed MPI rank does, rather than
    // wait for it past --timeout and the user's SIGTERM.
    ASSIGN_OR_RETURN(const std::chrono::milliseconds grace,
                     runtime::timeout_from_seconds(args.timeout_s, "--timeout"));
    runtime::host_transport::set_stuck_device_policy(
        {grace, [](const Status &failure) {
           std::cout.flush();
           std::cerr << str_cat("strata: error: ", one_line(failure.message()), "\n");
           std::cerr.flush();
           std::_Exit(1);
         }});
    return train_on(args, plan, out, args.interactive, nullptr, env_fault);
  }
  if (!plan.pipeline)
    return failed_precondition("the launcher started ", launch->size, " ranks but ", args.model,
                               " is a one-device plan; compile it for several devices (--mesh "
                               "DPx1xPP) or run it without mpirun");
  ASSIGN_OR_RETURN(const std::chrono::milliseconds timeout,
                   runtime::timeout_from_seconds(args.timeout_s, "--timeout"));
  if (env_fault.nostart_rank == launch->rank) std::this_thread::sleep_for(std::chrono::hours(1));
  runtime::MpiWorldOptions options;
  options.devices_per_rank = args.devices_per_rank;
  options.timeout = timeout;
  options.shared_bytes = runtime::shared_segment_bytes(plan);
  if (args.backend == "cpu") options.memory_bytes = runtime::shared_memory_bytes(plan);
  ASSIGN_OR_RETURN(std::shared_ptr<runtime::MpiWorld> world,
                   runtime::MpiWorld::create(static_cast<int>(plan.programs.size()), options));
  Status status = world->agree(plan.fingerprint, fs::path(args.model).filename().string(),
                               shared_settings(args));
  if (status.is_ok()) {
    // Rank 0 speaks for the job.
    std::ostream silent(nullptr);
    status = train_on(args, plan, world->rank() == 0 ? out : silent,
                      /*interactive=*/false, world, env_fault);
  }
  if (status.is_ok()) {
    world->finish(false);
    return status;
  }
  // Tell the other ranks (unless the failure came from them), report, and let
  // the launcher end the job.
  world->fail(status);
  out.flush();
  if (runtime::claim_failure_report())
    std::cerr << str_cat("strata: error: rank ", world->rank(), " of ", world->size(), ": ",
                         status.message(), "\n");
  std::cerr.flush();
  world->finish(true);
  return status;
}

} // namespace strata::tools
