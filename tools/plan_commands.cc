// `strata compile` (model -> plan), the plan side of `strata inspect` and
// `strata convert`, and the training mode of `strata run`.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "passes/make_training.h"
#include "passes/plan_memory.h"
#include "runtime/trainer.h"
#include "serialization/model_io.h"
#include "serialization/sha256.h"
#include "tools/commands.h"
#include "tools/model_stats.h"

namespace strata::tools {
namespace {

namespace fs = std::filesystem;
using serialization::Plan;

std::string folder_of(const std::string &path) {
  fs::path folder = fs::path(path).parent_path();
  return folder.empty() ? std::string(".") : folder.string();
}

// What a plan holds, for the summary lines of compile and inspect.
struct PlanNumbers {
  int64_t parameters = 0, parameter_bytes = 0, trainable_tensors = 0;
  int64_t state_tensors = 0, state_bytes = 0;
  double flops = 0;
};

PlanNumbers plan_numbers(const Graph &graph) {
  PlanNumbers n;
  for (const Tensor &t : graph.tensors()) {
    if (t.kind == TensorKind::kParameter) {
      n.parameters += t.type.num_elements();
      n.parameter_bytes += t.type.size_bytes();
      if (is_floating(t.type.dtype)) ++n.trainable_tensors;
    } else if (t.kind == TensorKind::kState) {
      ++n.state_tensors;
      n.state_bytes += t.type.size_bytes();
    }
  }
  auto stats = compute_model_stats(graph);
  if (stats.is_ok()) n.flops = stats->flops;
  return n;
}

std::string tensor_list(const Graph &graph, llvm::ArrayRef<TensorId> ids) {
  std::string text;
  for (TensorId id : ids)
    text += str_cat(text.empty() ? "" : ", ", graph.tensor(id).name, " ",
                    graph.tensor(id).type.to_string());
  return text.empty() ? "(none)" : text;
}

void print_plan_summary(const Plan &plan, std::ostream &out) {
  const Graph &g = plan.graph;
  PlanNumbers n = plan_numbers(g);
  bool train = plan.mode == Plan::Mode::kTrain;
  out << "mode         " << serialization::plan_mode_name(plan.mode) << " ("
      << (g.name().empty() ? "unnamed model" : g.name()) << ")\n";
  out << "fingerprint  " << plan.fingerprint << "\n";
  out << "model        " << plan.model_fingerprint << " (source model's SHA-256)\n";
  if (train) {
    out << "loss         " << plan.loss_kind << " -> '" << plan.loss << "'\n";
    out << "optimizer    " << plan.optimizer << "\n";
  }
  out << "inputs       " << tensor_list(g, g.inputs()) << "\n";
  out << "outputs      " << tensor_list(g, g.outputs()) << "\n";
  out << "parameters   " << grouped(n.parameters) << " ("
      << human_bytes(static_cast<double>(n.parameter_bytes)) << ") in " << n.trainable_tensors
      << " trainable tensor" << (n.trainable_tensors == 1 ? "" : "s") << "\n";
  if (train)
    out << "opt. state   " << human_bytes(static_cast<double>(n.state_bytes)) << " in "
        << n.state_tensors << " state tensor" << (n.state_tensors == 1 ? "" : "s")
        << " (updates: " << g.updates().size() << ")\n";
  out << "graph        " << g.num_nodes() << " nodes, " << g.num_tensors() << " tensors\n";
  out << "FLOPs        " << human_flops(n.flops) << (train ? " per step" : " per run") << "\n";
  for (const serialization::PlanProgram &program : plan.programs) {
    std::string kind = "cpu";
    for (const auto &device : plan.devices)
      if (device.index == program.device) kind = device.kind;
    out << "device " << kind << ":" << program.device << "  " << program.order.size()
        << " nodes, activation arena " << human_bytes(static_cast<double>(program.arena_bytes))
        << ", weights and state "
        << human_bytes(static_cast<double>(n.parameter_bytes + n.state_bytes)) << "\n";
  }
  if (!plan.producer.empty()) out << "producer     " << plan.producer << "\n";
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

} // namespace

Status compile_command(const CompileArgs &args, std::ostream &out) {
  ASSIGN_OR_RETURN(Graph forward, load_model_file(args.model));
  auto model_bytes = serialization::model_to_flatbuffer(forward);
  if (!model_bytes.is_ok()) return model_bytes.status().with_context(args.model);

  Plan plan;
  std::string options_text;
  if (args.train) {
    passes::TrainingOptions options;
    options.loss = args.loss;
    options.output = args.output_tensor;
    auto spec = passes::parse_optimizer(args.optimizer);
    if (!spec.is_ok())
      return spec.status().with_context(str_cat("--optimizer '", args.optimizer, "'"));
    options.optimizer = *spec;
    auto training = passes::make_training_graph(forward, options);
    if (!training.is_ok()) return training.status().with_context(args.model);
    if (options.output.empty()) options.output = forward.tensor(forward.outputs()[0]).name;
    options_text = "mode=train\n" + options.to_string();
    plan.mode = Plan::Mode::kTrain;
    plan.graph = std::move(training).value();
    plan.loss = "loss";
    plan.loss_kind = options.loss;
    plan.optimizer = options.optimizer.to_string();
  } else {
    if (!args.output_tensor.empty())
      return invalid_argument("--output selects the tensor a loss reads; it needs --train");
    options_text = "mode=infer\n";
    plan.mode = Plan::Mode::kInfer;
    plan.graph = std::move(forward);
  }
  plan.model_fingerprint = serialization::sha256_hex(*model_bytes);
  plan.fingerprint = serialization::plan_fingerprint(*model_bytes, options_text);

  auto order = plan.graph.topological_order();
  if (!order.is_ok()) return order.status().with_context(args.model);
  auto memory = passes::plan_memory(plan.graph, *order);
  if (!memory.is_ok()) return memory.status().with_context(args.model);
  plan.devices.push_back({0, "cpu"});
  plan.programs.push_back({0, std::move(order).value(), memory->arena_bytes, memory->offsets});

  RETURN_IF_ERROR(serialization::save_plan(plan, args.out));
  out << "wrote " << args.out << "\n";
  plan.producer.clear();
  print_plan_summary(plan, out);
  return Status::ok();
}

Status inspect_plan(const InspectArgs &args, std::ostream &out) {
  ASSIGN_OR_RETURN(Plan plan, serialization::load_plan(args.path));
  if (args.format == "json") {
    ASSIGN_OR_RETURN(std::string text, serialization::plan_to_json(plan));
    out << text;
    return Status::ok();
  }
  if (args.format != "text")
    return invalid_argument("--format ", args.format,
                            " is for models; a plan prints as text or json");
  out << "plan         " << args.path << "\n";
  print_plan_summary(plan, out);
  return Status::ok();
}

Status convert_plan(const std::string &in, const std::string &out_path, std::ostream &out) {
  ASSIGN_OR_RETURN(Plan plan, serialization::load_plan(in));
  if (!serialization::is_plan_path(out_path) && fs::path(out_path).extension() != ".json")
    return invalid_argument("'", in, "' is a plan; write it as .splan or .splan.json, not '",
                            out_path, "'");
  RETURN_IF_ERROR(serialization::save_plan(plan, out_path));
  out << "wrote " << out_path << " (" << serialization::plan_mode_name(plan.mode) << " plan, "
      << plan.graph.num_nodes() << " nodes)\n";
  return Status::ok();
}

Status train_command(const RunArgs &args, Plan plan, std::ostream &out, bool interactive) {
  if (args.steps < 1) return invalid_argument("--steps must be at least 1");
  if (args.log_every < 1) return invalid_argument("--log-every must be at least 1");
  if (args.checkpoint_every < 0) return invalid_argument("--checkpoint-every must be at least 0");
  if (args.checkpoint_every > 0 && args.checkpoint.empty())
    return invalid_argument("--checkpoint-every needs --checkpoint DIR");

  runtime::Dataset data;
  if (!args.data.empty()) {
    ASSIGN_OR_RETURN(data, runtime::load_dataset(plan.graph, args.data));
  } else {
    data = runtime::synthetic_dataset(plan.graph, args.seed);
  }
  runtime::TrainerOptions options;
  options.model_dir = folder_of(args.model);
  options.fingerprint = plan.fingerprint;
  std::string model_name = plan.graph.name();
  auto created =
      runtime::Trainer::create(std::move(plan.graph), plan.loss, std::move(data), options);
  if (!created.is_ok()) return created.status().with_context(args.model);
  runtime::Trainer &trainer = **created;

  out << "plan       " << args.model << " (train " << (model_name.empty() ? "model" : model_name)
      << ", " << plan.loss_kind << ", " << plan.optimizer << ")\n";
  out << "data       " << trainer.data().description << "\n";
  if (!args.resume.empty()) {
    RETURN_IF_ERROR(trainer.restore_checkpoint(args.resume));
    out << "resumed    " << args.resume << " at step " << trainer.step() << "\n";
  }
  if (trainer.step() >= args.steps) {
    out << "done       already at step " << trainer.step() << " of " << args.steps
        << "; nothing to run\n";
    return Status::ok();
  }

  const int64_t first_step = trainer.step();
  double first_loss = 0, last_loss = 0;
  auto start = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  while (trainer.step() < args.steps) {
    ASSIGN_OR_RETURN(double loss, trainer.train_step());
    const int64_t step = trainer.step();
    if (step == first_step + 1) first_loss = loss;
    last_loss = loss;
    if (!std::isfinite(loss)) {
      if (interactive) out << "\n";
      return failed_precondition("the loss is ", loss, " at step ", step,
                                 "; lower the learning rate or add clip=1 to --optimizer");
    }
    std::string line =
        str_cat("step ", step, "/", args.steps, "  loss ", format_loss(loss), "  (",
                format_rate(static_cast<double>(step - first_step), seconds()), " steps/s)");
    bool logged = step % args.log_every == 0 || step == args.steps;
    if (interactive) {
      out << "\r" << line << "\x1b[K" << (logged ? "\n" : "") << std::flush;
    } else if (logged) {
      out << line << "\n";
    }
    bool save =
        !args.checkpoint.empty() &&
        ((args.checkpoint_every > 0 && step % args.checkpoint_every == 0) || step == args.steps);
    if (save) {
      RETURN_IF_ERROR(trainer.save_checkpoint(args.checkpoint));
      if (!interactive || logged)
        out << "checkpoint " << args.checkpoint << " (step " << step << ")\n";
    }
  }
  double elapsed = seconds();
  int64_t ran = trainer.step() - first_step;
  out << "done       " << ran << " step" << (ran == 1 ? "" : "s") << " in "
      << format_seconds(elapsed) << " s (" << format_rate(static_cast<double>(ran), elapsed)
      << " steps/s); loss " << format_loss(first_loss) << " -> " << format_loss(last_loss) << "\n";
  return Status::ok();
}

} // namespace strata::tools
