// `strata run`: executes a model once or more on the CPU and reports outputs,
// time per run and the memory plan.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "runtime/cuda_executor.h"
#include "runtime/executor.h"
#include "runtime/make_runner.h"
#include "serialization/file_io.h"
#include "serialization/npy.h"
#include "tools/commands.h"
#include "tools/model_stats.h"

namespace strata::tools {
namespace {

namespace fs = std::filesystem;

// Element `i` of a tensor as a double, whatever its dtype.
double element(const HostTensor &t, int64_t i) {
  switch (t.type.dtype) {
  case DType::kF32: return t.as<float>()[i];
  case DType::kF16: return f16_to_float(t.as<uint16_t>()[i]);
  case DType::kBF16: return bf16_to_float(t.as<uint16_t>()[i]);
  case DType::kI32: return t.as<int32_t>()[i];
  case DType::kI64: return static_cast<double>(t.as<int64_t>()[i]);
  case DType::kBool: return t.as<uint8_t>()[i] != 0;
  }
  return 0;
}

// "sum=... mean|x|=... first=[a, b, c, d]": enough to compare two runs by eye.
std::string summarize(const HostTensor &t) {
  int64_t n = t.type.num_elements();
  double sum = 0, abs_sum = 0;
  int64_t non_finite = 0;
  for (int64_t i = 0; i < n; ++i) {
    double v = element(t, i);
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
    std::snprintf(buf, sizeof buf, "%s%.6g", i > 0 ? ", " : "", element(t, i));
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

} // namespace

runtime::RunnerOptions run_runner_options(const RunArgs &args) {
  runtime::RunnerOptions options;
  options.backend = args.backend == "cuda" ? runtime::Backend::kCuda : runtime::Backend::kCpu;
  const fs::path parent = fs::path(args.model).parent_path();
  options.model_dir = parent.empty() ? "." : parent.string();
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

namespace {

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

} // namespace

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
    ASSIGN_OR_RETURN(serialization::Plan plan, serialization::load_plan(args.model));
    if (plan.mode == serialization::Plan::Mode::kTrain) {
      // Options that only a forward run reads would be silently ignored.
      const char *forward_only = first_given_option(args, /*training=*/false);
      if (forward_only != nullptr)
        return invalid_argument(forward_only, " is for running a model; ", args.model,
                                " is a training plan (its batches come from --data, or are "
                                "synthetic)");
      return train_command(args, std::move(plan), out, args.interactive);
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
  std::vector<std::string> output_names;
  for (TensorId id : graph.outputs())
    output_names.push_back(graph.tensor(id).name);

  ASSIGN_OR_RETURN(std::unique_ptr<runtime::StepRunner> runner,
                   runtime::make_runner(std::move(graph), run_runner_options(args)));
  runtime::StepRunner &executor = *runner;

  std::vector<HostTensor> outputs;
  for (int64_t i = 0; i < args.warmup; ++i) {
    outputs.clear();
    RETURN_IF_ERROR(executor.run(inputs, &outputs));
  }
  std::vector<double> times;
  for (int64_t i = 0; i < args.repeat; ++i) {
    outputs.clear();
    auto start = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(executor.run(inputs, &outputs));
    times.push_back(ms(std::chrono::steady_clock::now() - start));
  }
  std::sort(times.begin(), times.end());
  double median = times.size() % 2 == 1
                      ? times[times.size() / 2]
                      : 0.5 * (times[times.size() / 2 - 1] + times[times.size() / 2]);

  char buf[160];
  out << "model      " << args.model << " (" << (model_name.empty() ? "unnamed" : model_name)
      << ", " << human_flops(flops) << " per forward)\n";
  for (const auto &[name, source] : input_lines)
    out << "input      " << name << " " << source << '\n';
  std::snprintf(buf, sizeof buf, "median %.3f ms, min %.3f ms over %lld run%s (%lld warmup)",
                median, times.front(), static_cast<long long>(args.repeat),
                args.repeat == 1 ? "" : "s", static_cast<long long>(args.warmup));
  out << "time       " << buf;
  if (flops > 0 && median > 0) {
    out << ", " << human_flops(flops / (median * 1e-3)) << "/s at the median";
  }
  out << '\n';
  if (const auto *cpu = dynamic_cast<const runtime::CpuExecutor *>(runner.get())) {
    const passes::MemoryPlan &plan = cpu->memory_plan();
    out << "memory     activations " << human_bytes(static_cast<double>(plan.arena_bytes))
        << " arena (" << human_bytes(static_cast<double>(plan.naive_bytes))
        << " without reuse), weights " << human_bytes(static_cast<double>(cpu->weight_bytes()))
        << '\n';
  } else if (const auto *gpu = dynamic_cast<const runtime::CudaExecutor *>(runner.get())) {
    out << "memory     " << gpu->device_name() << ": "
        << human_bytes(static_cast<double>(gpu->device_bytes()))
        << " allocated once (activations, weights, staging, cuBLASLt workspace)"
        << (args.cuda_graph ? "; runs replay one CUDA Graph" : "; eager launches") << '\n';
  }

  if (!args.output_dir.empty()) {
    std::error_code ec;
    fs::create_directories(args.output_dir, ec);
    if (ec)
      return io_error("cannot create output directory '", args.output_dir, "': ", ec.message());
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    std::string name = i < output_names.size() ? output_names[i] : str_cat("output", i);
    std::string path;
    if (!args.output.empty())
      path = args.output;
    else if (!args.output_dir.empty())
      path = (fs::path(args.output_dir) / (sanitize(name) + ".npy")).string();
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
  if (args.op_times) RETURN_IF_ERROR(print_op_times(executor, inputs, out));
  return Status::ok();
}

} // namespace strata::tools
