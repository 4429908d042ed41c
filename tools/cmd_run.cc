// `strata run`: runs a model or an inference plan once or more on the CPU or a
// GPU and reports its outputs, time per run and memory; a training plan
// trains (tools/cmd_run_train.cc).
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <optional>

#include "runtime/cpu/executor.h"
#include "runtime/cuda/cuda_executor.h"
#include "serialization/file_io.h"
#include "serialization/npy.h"
#include "tools/cli.h"
#include "tools/cmd_run.h"
#include "tools/model_stats.h"

namespace strata::tools {

runtime::RunnerOptions run_runner_options(const RunArgs &args) {
  runtime::RunnerOptions options;
  options.backend = args.backend == "cuda" ? runtime::Backend::kCuda : runtime::Backend::kCpu;
  options.model_dir = folder_of(args.model);
  options.source = args.model;
  options.trace = !args.trace.empty();
  if (args.clock == "device") options.clock = runtime::PipelineRunnerOptions::Clock::kDevice;
  options.gpu = args.gpu;
  options.gpus = args.gpus;
  options.cuda_graph = args.cuda_graph;
  options.tf32 = args.tf32;
  options.bf16 = args.precision == "bf16";
  options.f16 = args.precision == "f16";
  options.cudnn_pool_norm = args.pool_norm != "strata";
  options.devices_per_rank = args.devices_per_rank;
  options.node_times = args.op_times;
  return options;
}

Status print_op_times(runtime::StepRunner &runner, llvm::ArrayRef<HostTensor> inputs,
                      std::ostream &out) {
  std::vector<double> times; // by node id, in milliseconds
  if (auto *gpu = dynamic_cast<runtime::CudaExecutor *>(&runner)) {
    ASSIGN_OR_RETURN(times, gpu->node_times(inputs));
    out << "op times   one more run, eager, GPU time per op type (fused chains count on "
           "their last node)\n";
  } else if (auto *cpu = dynamic_cast<runtime::CpuExecutor *>(&runner)) {
    constexpr int kRuns = 5;
    ASSIGN_OR_RETURN(times, cpu->profile(inputs, kRuns));
    for (double &t : times)
      t *= 1e3;
    out << "op times   " << kRuns << " more runs, CPU time per op type (each node's median)\n";
  } else {
    return unimplemented("--op-times times a one-device runner's nodes");
  }
  const Graph &graph = runner.graph();
  const std::vector<OpTime> rows = op_times(graph, times);
  double total = 0;
  for (const OpTime &row : rows)
    total += row.ms;
  char line[128];
  std::snprintf(line, sizeof line, "  %-28s %6s %10s %7s\n", "op", "nodes", "ms", "share");
  out << line;
  for (const OpTime &row : rows) {
    std::snprintf(line, sizeof line, "  %-28s %6lld %10.4f %6.1f%%\n", row.op.c_str(),
                  static_cast<long long>(row.nodes), row.ms,
                  total > 0 ? 100 * row.ms / total : 0.0);
    out << line;
  }
  std::snprintf(line, sizeof line, "  %-28s %6s %10.4f\n", "total", "", total);
  out << line;
  return Status::ok();
}

namespace {

namespace fs = std::filesystem;

// "sum=... mean|x|=... first=[a, b, c, d]": enough to compare two runs by eye.
std::string summarize(const HostTensor &t) {
  int64_t n = t.type.num_elements();
  double sum = 0, abs_sum = 0;
  int64_t non_finite = 0;
  for (int64_t i = 0; i < n; ++i) {
    double v = t.element(i);
    if (!std::isfinite(v)) {
      ++non_finite;
      continue;
    }
    sum += v;
    abs_sum += std::fabs(v);
  }
  char buf[96];
  std::snprintf(buf, sizeof buf, "sum=%.6g mean|x|=%.6g", sum, n > 0 ? abs_sum / n : 0.0);
  std::string text = buf;
  if (non_finite > 0) text += str_cat(" non-finite=", non_finite);
  text += " first=[";
  for (int64_t i = 0; i < std::min<int64_t>(n, 4); ++i) {
    std::snprintf(buf, sizeof buf, "%s%.6g", i > 0 ? ", " : "", t.element(i));
    text += buf;
  }
  return text + (n > 4 ? ", ...]" : "]");
}

// A file name for a tensor name: keeps letters, digits, '.', '-' and '_'.
std::string sanitize(const std::string &name) {
  std::string out;
  for (char c : name) {
    bool keep = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
    out += keep ? c : '_';
  }
  if (out.empty() || out == "." || out == "..") out = "output" + out;
  return out;
}

// Reads the --input arguments into one tensor per graph input, in graph order.
Result<std::vector<HostTensor>> read_inputs(const Graph &graph,
                                            const std::vector<std::string> &specs) {
  const size_t n = graph.inputs().size();
  std::vector<std::optional<std::string>> paths(n);
  std::vector<std::string> positional;
  for (const std::string &spec : specs) {
    size_t eq = spec.find('=');
    if (eq != std::string::npos) {
      std::string name = spec.substr(0, eq);
      auto it = std::find_if(graph.inputs().begin(), graph.inputs().end(),
                             [&](TensorId id) { return graph.tensor(id).name == name; });
      if (it != graph.inputs().end()) {
        size_t index = static_cast<size_t>(it - graph.inputs().begin());
        if (paths[index]) return invalid_argument("input '", name, "' is given twice");
        paths[index] = spec.substr(eq + 1);
        continue;
      }
    }
    positional.push_back(spec);
  }
  size_t next = 0;
  for (const std::string &path : positional) {
    // NAME=FILE whose NAME is no input (a file name may hold '=' too).
    std::error_code error;
    if (const size_t eq = path.find('=');
        eq != std::string::npos && path.find('/') > eq && !fs::exists(path, error)) {
      std::string names;
      for (TensorId id : graph.inputs())
        names += str_cat(names.empty() ? "" : ", ", graph.tensor(id).name);
      return invalid_argument("--input ", path, ": the model has no input '", path.substr(0, eq),
                              "' (its inputs: ", names, ")");
    }
    while (next < n && paths[next])
      ++next;
    if (next == n)
      return invalid_argument("too many --input files: the model has ", n, " input",
                              n == 1 ? "" : "s", " (extra: ", path, ")");
    paths[next++] = path;
  }
  std::vector<HostTensor> inputs;
  for (size_t i = 0; i < n; ++i) {
    const Tensor &input = graph.tensor(graph.inputs()[i]);
    if (!paths[i])
      return invalid_argument("input '", input.name, "' (", input.type.to_string(),
                              ") has no --input file; give every input or none");
    auto tensor = serialization::read_npy(*paths[i]);
    if (!tensor.is_ok()) {
      Status status = tensor.status();
      if (status.message().find(*paths[i]) == std::string::npos)
        status = status.with_context(*paths[i]);
      return status.with_context(str_cat("input '", input.name, "'"));
    }
    if (!(tensor->type == input.type))
      return invalid_argument("input '", input.name, "' expects ", input.type.to_string(), " but ",
                              *paths[i], " holds ", tensor->type.to_string());
    inputs.push_back(std::move(tensor).value());
  }
  return inputs;
}

double ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// --backend, and the options only the CUDA backend reads (before anything loads).
Status check_backend_options(const RunArgs &args) {
  if (args.backend != "cpu" && args.backend != "cuda")
    return invalid_argument("--backend must be cpu or cuda, got '", args.backend, "'");
  if (args.backend == "cuda") return Status::ok();
  if (!args.cuda_graph) return invalid_argument("--no-cuda-graph needs --backend cuda");
  if (args.tf32) return invalid_argument("--tf32 needs --backend cuda");
  if (args.precision != "f32")
    return invalid_argument("--precision ", args.precision,
                            " needs --backend cuda (the CPU backend computes in f32)");
  if (args.gpu != 0) return invalid_argument("--gpu needs --backend cuda");
  if (!args.gpus.empty()) return invalid_argument("--gpus needs --backend cuda");
  if (args.pool_norm != "cudnn") return invalid_argument("--pool-norm needs --backend cuda");
  return Status::ok();
}

// The first option given on the command line (away from its default) that
// only a training plan reads (`training`) or only a forward run reads.
const char *first_given_option(const RunArgs &args, bool training) {
  const RunArgs defaults;
  const struct {
    const char *name;
    bool given, for_training;
  } options[] = {
      {"--input", !args.inputs.empty(), false},
      {"--output", !args.output.empty(), false},
      {"--output-dir", !args.output_dir.empty(), false},
      {"--repeat", args.repeat != defaults.repeat, false},
      {"--warmup", args.warmup != defaults.warmup, false},
      {"--steps", args.steps != defaults.steps, true},
      {"--data", !args.data.empty(), true},
      {"--checkpoint", !args.checkpoint.empty(), true},
      {"--checkpoint-every", args.checkpoint_every != defaults.checkpoint_every, true},
      {"--resume", !args.resume.empty(), true},
      {"--log-every", args.log_every != defaults.log_every, true},
      {"--trace", !args.trace.empty(), true},
      {"--clock device", args.clock != defaults.clock, true},
      {"--timeout", args.timeout_s != defaults.timeout_s, true},
      {"--devices-per-rank", args.devices_per_rank != defaults.devices_per_rank, true},
  };
  for (const auto &option : options)
    if (option.given && option.for_training == training) return option.name;
  return nullptr;
}

// The median and the minimum milliseconds of a run.
struct RunTimes {
  double median = 0, min = 0;
};

// --warmup untimed runs, then --repeat timed ones; `outputs` are the last run's.
Result<RunTimes> time_runs(runtime::StepRunner &runner, llvm::ArrayRef<HostTensor> inputs,
                           const RunArgs &args, std::vector<HostTensor> *outputs) {
  for (int64_t i = 0; i < args.warmup; ++i) {
    outputs->clear();
    RETURN_IF_ERROR(runner.run(inputs, outputs));
  }
  std::vector<double> times;
  for (int64_t i = 0; i < args.repeat; ++i) {
    outputs->clear();
    auto start = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(runner.run(inputs, outputs));
    times.push_back(ms(std::chrono::steady_clock::now() - start));
  }
  std::sort(times.begin(), times.end());
  RunTimes result;
  result.median = times.size() % 2 == 1
                      ? times[times.size() / 2]
                      : 0.5 * (times[times.size() / 2 - 1] + times[times.size() / 2]);
  result.min = times.front();
  return result;
}

// The `memory` line: what the runner allocated.
void print_memory(const runtime::StepRunner &runner, const RunArgs &args, std::ostream &out) {
  if (const auto *cpu = dynamic_cast<const runtime::CpuExecutor *>(&runner)) {
    const passes::MemoryPlan &plan = cpu->memory_plan();
    out << "memory     activations " << human_bytes(static_cast<double>(plan.arena_bytes))
        << " arena (" << human_bytes(static_cast<double>(plan.naive_bytes))
        << " without reuse), weights " << human_bytes(static_cast<double>(cpu->weight_bytes()))
        << '\n';
  } else if (const auto *gpu = dynamic_cast<const runtime::CudaExecutor *>(&runner)) {
    out << "memory     " << gpu->device_name() << ": "
        << human_bytes(static_cast<double>(gpu->device_bytes()))
        << " allocated once (activations, weights, staging, cuBLASLt workspace)"
        << (args.cuda_graph ? "; runs replay one CUDA Graph" : "; eager launches") << '\n';
  }
}

// The file each output is written to ("" where none is): --output, or
// <name>.npy in --output-dir. Refused, before anything runs, where two
// outputs would go to one file (names that differ only where sanitize
// replaces characters, such as 'a/b' and 'a_b').
Result<std::vector<std::string>> output_files(const RunArgs &args,
                                              const std::vector<std::string> &names) {
  std::vector<std::string> files(names.size());
  if (!args.output.empty()) {
    files.assign(names.size(), args.output);
    return files;
  }
  if (args.output_dir.empty()) return files;
  std::map<std::string, std::string> owner; // file name -> output name
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string file = sanitize(names[i]) + ".npy";
    if (auto [it, fresh] = owner.try_emplace(file, names[i]); !fresh && it->second != names[i])
      return invalid_argument("--output-dir ", args.output_dir, ": outputs '", it->second,
                              "' and '", names[i], "' would both be written to ", file,
                              " (a file name keeps a tensor name's letters, digits, '.', '-' "
                              "and '_', and turns any other character into '_')");
    files[i] = (fs::path(args.output_dir) / file).string();
  }
  return files;
}

// An `output` line per output with its checksum, each written to its file
// (output_files).
Status write_outputs(const RunArgs &args, const std::vector<std::string> &names,
                     const std::vector<std::string> &files, const std::vector<HostTensor> &outputs,
                     std::ostream &out) {
  if (!args.output_dir.empty()) {
    std::error_code ec;
    fs::create_directories(args.output_dir, ec);
    if (ec)
      return io_error("cannot create output directory '", args.output_dir, "': ", ec.message());
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    std::string name = i < names.size() ? names[i] : str_cat("output", i);
    const std::string path = i < files.size() ? files[i] : std::string();
    out << "output     " << name << " " << outputs[i].type.to_string() << " "
        << summarize(outputs[i]);
    if (!path.empty()) {
      Status written = serialization::write_npy(path, outputs[i]);
      if (!written.is_ok()) {
        out << '\n';
        if (written.message().find(path) == std::string::npos) written = written.with_context(path);
        return written;
      }
      out << " -> " << path;
    }
    out << '\n';
  }
  return Status::ok();
}

// Runs a model's graph (or an inference plan's) and reports it.
Status run_forward(const RunArgs &args, Graph graph, std::ostream &out) {
  std::vector<std::string> output_names;
  for (TensorId id : graph.outputs())
    output_names.push_back(graph.tensor(id).name);
  ASSIGN_OR_RETURN(const std::vector<std::string> output_paths, output_files(args, output_names));

  auto stats = compute_model_stats(graph);
  double flops = stats.is_ok() ? stats->flops : 0.0;

  std::vector<HostTensor> inputs;
  if (args.inputs.empty()) {
    inputs = runtime::random_inputs(graph, args.seed);
  } else {
    ASSIGN_OR_RETURN(inputs, read_inputs(graph, args.inputs));
  }

  std::string model_name = graph.name();
  std::vector<std::pair<std::string, std::string>> input_lines;
  for (size_t i = 0; i < graph.inputs().size(); ++i) {
    const Tensor &t = graph.tensor(graph.inputs()[i]);
    input_lines.emplace_back(t.name + " " + t.type.to_string(),
                             args.inputs.empty() ? str_cat("random (seed ", args.seed, ")")
                                                 : summarize(inputs[i]));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<runtime::StepRunner> runner,
                   runtime::make_runner(std::move(graph), run_runner_options(args)));
  std::vector<HostTensor> outputs;
  ASSIGN_OR_RETURN(const RunTimes times, time_runs(*runner, inputs, args, &outputs));

  char buf[160];
  out << "model      " << args.model << " (" << (model_name.empty() ? "unnamed" : model_name)
      << ", " << human_flops(flops) << " per forward)\n";
  for (const auto &[name, source] : input_lines)
    out << "input      " << name << " " << source << '\n';
  std::snprintf(buf, sizeof buf, "median %.3f ms, min %.3f ms over %lld run%s (%lld warmup)",
                times.median, times.min, static_cast<long long>(args.repeat),
                args.repeat == 1 ? "" : "s", static_cast<long long>(args.warmup));
  out << "time       " << buf;
  if (flops > 0 && times.median > 0) {
    out << ", " << human_flops(flops / (times.median * 1e-3)) << "/s at the median";
  }
  out << '\n';
  print_memory(*runner, args, out);
  RETURN_IF_ERROR(write_outputs(args, output_names, output_paths, outputs, out));
  if (args.op_times) RETURN_IF_ERROR(print_op_times(*runner, inputs, out));
  return Status::ok();
}

// Runs a model or a plan; a training plan trains (train_command).
Status run_command(const RunArgs &args, std::ostream &out) {
  RETURN_IF_ERROR(check_backend_options(args));
  if (!args.output.empty())
    RETURN_IF_ERROR(serialization::check_not_input(args.output, args.model));
  if (args.repeat < 1) return invalid_argument("--repeat must be at least 1");
  if (args.warmup < 0) return invalid_argument("--warmup must be at least 0");
  if (!args.output.empty() && !args.output_dir.empty())
    return invalid_argument("give --output or --output-dir, not both");

  Graph graph;
  bool inference_plan = false;
  if (serialization::file_is_plan(args.model)) {
    ASSIGN_OR_RETURN(serialization::Plan plan, load_plan_file(args.model));
    if (plan.mode == serialization::Plan::Mode::kTrain) {
      // Options that only a forward run reads would be silently ignored.
      const char *forward_only = first_given_option(args, /*training=*/false);
      if (forward_only != nullptr)
        return invalid_argument(forward_only, " is for running a model; ", args.model,
                                " is a training plan (its batches come from --data, or are "
                                "synthetic)");
      return train_command(args, plan, out);
    }
    graph = std::move(plan.graph);
    inference_plan = true;
  } else {
    ASSIGN_OR_RETURN(graph, load_model_file(args.model));
  }
  // Options that only a training plan reads would be silently ignored.
  const char *training_only = first_given_option(args, /*training=*/true);
  if (training_only != nullptr)
    return invalid_argument(training_only, " is for training plans; ", args.model,
                            inference_plan
                                ? " is an inference plan (compile the model with --train for one)"
                                : str_cat(" is a model (compile it with `strata compile ",
                                          args.model, " --train -o t.splan` and run t.splan)"));
  if (!args.output.empty() && graph.outputs().size() != 1)
    return invalid_argument("the model has ", graph.outputs().size(),
                            " outputs; --output writes one, use --output-dir for several");
  return run_forward(args, std::move(graph), out);
}

// A bound far beyond any real run, inside int64 (as kMaxSteps).
constexpr int64_t kMaxRuns = int64_t{1} << 20;

// What a model run reads: its inputs, outputs, runs and seed.
void add_model_options(CLI::App *sub, RunArgs &args) {
  sub->add_option("-i,--input", args.inputs,
                  "input values as .npy: NAME=FILE, or FILE for the next input in graph order; "
                  "repeat for several inputs (default: random inputs)")
      ->type_name("[NAME=]FILE");
  CLI::Option *output =
      sub->add_option("-o,--output", args.output, "write the model's single output here (.npy)")
          ->check(not_empty_path("a .npy file"))
          ->type_name("FILE");
  sub->add_option("--output-dir", args.output_dir, "write every output here as <name>.npy")
      ->check(not_empty_path("a folder"))
      ->excludes(output)
      ->type_name("DIR");
  // Each timed run keeps its time: a bound on the runs is one on that memory.
  sub->add_option("--repeat", args.repeat, "timed runs")
      ->check(CLI::Range(int64_t{1}, kMaxRuns))
      ->capture_default_str();
  sub->add_option("--warmup", args.warmup, "untimed runs first")
      ->check(CLI::Range(int64_t{0}, kMaxRuns))
      ->capture_default_str();
  sub->add_option("--seed", args.seed, "seed of the random inputs or synthetic training batches")
      ->transform(unsigned_64())
      ->capture_default_str();
}

// What a training plan reads: steps, data and checkpoints.
void add_training_options(CLI::App *sub, RunArgs &args) {
  sub->add_option("--steps", args.steps,
                  "training plan: train until this many steps are done (counting resumed ones)")
      ->check(CLI::Range(int64_t{1}, kMaxSteps))
      ->capture_default_str();
  sub->add_option("--data", args.data,
                  "training plan: folder with <input>.npy for every graph input, batches "
                  "stacked on a new first dim (default: 8 fixed synthetic batches)")
      ->check(not_empty_path("a folder of .npy batches"))
      ->type_name("DIR");
  sub->add_option("--checkpoint", args.checkpoint,
                  "training plan: save the weights + manifest.json here at the end, and when "
                  "Ctrl-C or SIGTERM stops the run (after the step in flight); the previous save "
                  "stays loadable until the new one is complete. A folder that holds a "
                  "checkpoint is refused unless --resume names it, and one that another run "
                  "is saving to (.strata.lock) is refused")
      ->check(not_empty_path("a folder"))
      ->type_name("DIR");
  sub->add_option("--checkpoint-every", args.checkpoint_every,
                  "training plan: also save every K steps (needs --checkpoint)")
      ->check(CLI::Range(int64_t{0}, kMaxSteps))
      ->capture_default_str();
  sub->add_option("--resume", args.resume,
                  "training plan: continue from this checkpoint (same plan fingerprint)")
      ->check(not_empty_path("a checkpoint folder"))
      ->type_name("DIR");
  sub->add_option("--log-every", args.log_every, "training plan: print the loss every K steps")
      ->check(CLI::Range(int64_t{1}, kMaxSteps))
      ->capture_default_str();
}

// Where and how the model or plan runs: the backend, its GPUs, and a
// pipeline plan's trace, clock, timeout and MPI ranks.
void add_device_options(CLI::App *sub, RunArgs &args) {
  sub->add_option("--backend", args.backend,
                  "where the model or plan runs: cpu, or cuda (cuBLASLt, cuDNN and strata's "
                  "kernels, each GPU's whole step as one CUDA Graph; a pipeline, data- or "
                  "tensor-parallel plan's devices become streams of one GPU, or spread over "
                  "several with --gpus)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  sub->add_option("--gpu", args.gpu,
                  "--backend cuda: the GPU to run on (CUDA device ordinal; under mpirun each "
                  "rank takes the GPU of its local rank instead)")
      ->check(CLI::Range(0, std::numeric_limits<int>::max()))
      ->capture_default_str();
  sub->add_option("--gpus", args.gpus,
                  "--backend cuda, pipeline plan: the GPU of each plan device, e.g. 0,0,1,1 for "
                  "4 devices on 2 GPUs. Devices on one GPU are streams of it; GPUs talk over "
                  "NCCL, a host thread each (a group is on one GPU or one member per GPU). "
                  "Default: every device on --gpu")
      ->type_name("LIST");
  sub->add_flag("!--no-cuda-graph", args.cuda_graph,
                "--backend cuda: launch every kernel each step instead of replaying the step "
                "captured as a CUDA Graph (for comparison)");
  sub->add_flag("--op-times", args.op_times,
                "a model or one-device plan: after the runs, time every node and print the "
                "time per op type (Conv2d, Conv2dGradInput, Conv2dGradWeight, ...), largest "
                "first. CPU: each node's median of five more runs; --backend cuda: one more "
                "run, eagerly, with an event after every node");
  sub->add_flag("--tf32", args.tf32,
                "--backend cuda: f32 matrix products on TF32 tensor cores (faster, ~1e-3 "
                "relative error)");
  sub->add_option("--precision", args.precision,
                  "--backend cuda: f32, bf16 or f16 (mixed precision: MatMul and Gemm multiply "
                  "half-precision operands on the tensor cores with f32 accumulation; weights, "
                  "optimizer state and every other op stay f32. f16 scales each operand by a "
                  "power of two that fits it into f16's range, so small gradients survive "
                  "without loss scaling)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  sub->add_option("--pool-norm", args.pool_norm,
                  "--backend cuda: who runs pooling and batch norm: cudnn (where cuDNN computes "
                  "the node as strata defines it: no dilation, even padding, output rounded "
                  "down; strata's kernels elsewhere) or strata (its own kernels, which match the "
                  "CPU element for element; for comparison)")
      ->check(CLI::IsMember({"cudnn", "strata"}))
      ->capture_default_str();
  sub->add_option("--trace", args.trace,
                  "pipeline plan: write what every device did (Chrome / Perfetto trace JSON)")
      ->check(not_empty_path("a trace file"))
      ->type_name("FILE");
  sub->add_option("--clock", args.clock,
                  "pipeline plan on the CPU: how --trace is timed: wall, or device: each device "
                  "thread's own CPU time, joined where it waits for another device; the step as "
                  "a core per device would run it, on a machine with fewer free cores than the "
                  "plan has devices. Adds a `device` line (step time by that clock) after the "
                  "`steady` one (wall time); reading the clocks costs a few percent of wall time")
      ->check(CLI::IsMember({"wall", "device"}))
      ->capture_default_str();
  sub->add_option("--timeout", args.timeout_s,
                  "pipeline plan: seconds any device waits for another before the run fails; "
                  "a device thread still stalled this long after that ends the process "
                  "(--backend cuda: a GPU's whole step, and NCCL's start-up)")
      ->capture_default_str();
  sub->add_option("--devices-per-rank", args.devices_per_rank,
                  "pipeline plan under mpirun: plan devices each rank runs as threads, or "
                  "with --backend cuda as streams of its GPU (ranks x this = the plan's devices)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
}

constexpr char kRunFooter[] =
    "Without --input, floating inputs are drawn from normal(0, 1) and index inputs\n"
    "(e.g. token ids) from the range they index. Prints the median and minimum time\n"
    "per run, the planned activation memory, and a checksum of each output.\n\n"
    "Examples:\n  strata run gpt.strata --repeat 10 --output logits.npy\n"
    "  strata run mlp.strata --input x=batch.npy --output-dir out/\n\n"
    "Training (a plan from `strata compile --train`): step k reads batch k mod the\n"
    "number of batches, so a run resumed from a checkpoint continues exactly where\n"
    "the interrupted one stopped. The run ends with the steady step time (the\n"
    "median from the third step on), then the plan's predictions beside what the\n"
    "run measured: a pipeline plan's `predicted` line (step time and bubble against\n"
    "the steady step, and the device clock's with --clock device) and a row per\n"
    "device: predicted busy time against the device thread's CPU time in its\n"
    "instructions per step (median; waits cost none, so no --clock device is\n"
    "needed; a GPU's devices show -), planned activation arena against the arena\n"
    "allocated, and the weights and state it holds. A one-device plan records no\n"
    "time: its `memory` line sets the planned arena beside the allocated one. Both\n"
    "end with the peak RSS (under mpirun, rank 0 prints every rank's devices).\n"
    "  strata run train.splan --steps 100 --log-every 10 --checkpoint ckpt\n"
    "  strata run train.splan --steps 200 --resume ckpt --checkpoint ckpt\n"
    "  strata run train.splan --steps 50 --data batches/   # x.npy, labels.npy\n"
    "  strata run train.splan --steps 20 --op-times         # time per op type\n\n"
    "A pipeline plan's devices are CPU threads. On a machine with fewer free cores\n"
    "than devices, --clock device times the step as a core per device would run it.\n"
    "  strata run pp.splan --steps 5 --trace t.json     # open in ui.perfetto.dev\n"
    "  strata run pp.splan --steps 5 --clock device --trace t.json\n\n"
    "On a GPU (`strata ops --backend cuda` says which ops have CUDA kernels); a\n"
    "pipeline, data- or tensor-parallel plan runs its devices as streams of one GPU,\n"
    "or over several GPUs (--gpus, NCCL between them) or MPI ranks (a GPU each).\n"
    "The run ends with the host's time per step to issue the work (median after\n"
    "capture): the launch overhead that replaying the captured step removes.\n"
    "  strata run train.splan --steps 100 --backend cuda\n"
    "  strata run train.splan --steps 100 --backend cuda --no-cuda-graph\n"
    "  strata run train.splan --steps 100 --backend cuda --precision bf16\n"
    "  strata run train.splan --steps 20 --backend cuda --op-times\n"
    "  strata run pp.splan --steps 100 --backend cuda --gpu 1\n"
    "  strata run pp4.splan --steps 100 --backend cuda --gpus 0,0,1,1\n"
    "  mpirun -np 8 strata run pp8.splan --steps 100 --backend cuda\n\n"
    "Several processes (Open MPI): the same plan, one device per rank, or\n"
    "--devices-per-rank K threads per rank; rank 0 prints, every rank checks that\n"
    "all run the same plan and strata, and a lost rank ends the whole job.\n"
    "  mpirun -np 4 strata run pp.splan --steps 5\n"
    "  mpirun -np 2 strata run pp.splan --steps 5 --devices-per-rank 2\n"
    "  mpirun -np 8 --hostfile hosts strata run pp.splan --checkpoint /shared/ck";

} // namespace

void add_run(CLI::App &app, Action &action) {
  static RunArgs args;
  CLI::App *sub = app.add_subcommand(
      "run", "Run a model or plan on the CPU or a GPU; a training plan trains for --steps steps");
  sub->add_option("FILE", args.model, "model (.strata, .json) or plan (.splan, .splan.json)")
      ->required();
  add_model_options(sub, args);
  add_training_options(sub, args);
  add_device_options(sub, args);
  sub->footer(kRunFooter);
  sub->callback([&action] {
    action = [] {
      args.interactive = isatty(STDOUT_FILENO) != 0;
      return run_command(args, std::cout);
    };
  });
}

} // namespace strata::tools
