// `strata verify`: trains a training plan and its one-device reference side
// by side on the same batches, and after every step compares their losses and
// every parameter and optimizer state tensor the runs keep (tensor-parallel
// pieces and ZeRO-1 shards joined into whole tensors by the runner). It
// passes when all stay within the tolerance: bitwise by default where strata
// promises one device's bits, else a relative bound. What the reference is,
// how it is built (from the plan's own training graph, or with --model from
// the model it was compiled from) and which plans promise the bits:
// tools/verify_reference.h.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "graph/dtype.h"
#include "ops/kernels/cpu/gemm.h"
#include "runtime/comm/host_transport.h"
#include "runtime/comm/mpi_world.h"
#include "runtime/make_runner.h"
#include "runtime/trainer.h"
#include "tools/cli.h"
#include "tools/cmd_run.h"
#include "tools/plan_text.h"
#include "tools/training_setup.h"
#include "tools/verify_reference.h"

namespace strata::tools {
namespace {

using serialization::Plan;

// --tolerance's value when it is not given (the option refuses negatives).
constexpr double kToleranceNotGiven = -1;
// The smallest reference magnitude a difference is divided by.
constexpr double kTiny = 1e-30;

struct VerifyArgs {
  std::string plan;
  std::string model; // --model: the reference compiled from it; empty: from the plan's graph
  int64_t steps = 5;
  std::string data; // folder of <input>.npy batch stacks; empty: synthetic
  uint64_t seed = 0;
  double tolerance = kToleranceNotGiven;
};

// How far a value of the plan's run is from the reference's: the relative
// difference (largest |plan - reference| over largest |reference|; infinite
// where a difference is not finite), and whether the bits are the same.
struct Difference {
  double relative = 0;
  bool identical = true;
};

bool within(const Difference &d, double tolerance) {
  return tolerance == 0 ? d.identical : d.relative <= tolerance;
}

// Two tensors of one type.
Difference tensor_difference(const HostTensor &got, const HostTensor &want) {
  if (got.size_bytes() == want.size_bytes() &&
      (want.size_bytes() == 0 || std::memcmp(got.data(), want.data(), want.size_bytes()) == 0))
    return {};
  double largest = 0, scale = 0;
  for (int64_t i = 0; i < want.type.num_elements(); ++i) {
    const double a = got.element(i), b = want.element(i);
    if (std::isfinite(b)) scale = std::max(scale, std::fabs(b));
    if (a == b) continue;
    const double d = std::fabs(a - b);
    if (!std::isfinite(d)) return {std::numeric_limits<double>::infinity(), false};
    largest = std::max(largest, d);
  }
  return {largest / std::max(scale, kTiny), false};
}

Difference compare_losses(double got, double want) {
  if (std::memcmp(&got, &want, sizeof got) == 0) return {};
  const double d = std::fabs(got - want);
  if (!std::isfinite(d)) return {std::numeric_limits<double>::infinity(), false};
  return {d / std::max(std::fabs(want), kTiny), false};
}

// The plan's state against the reference's after a step: the tensor farthest
// off. Where none differs in value but some in bits, one of those; it differs
// in bits exactly when some tensor does.
struct StateDifference {
  std::string tensor;
  Difference farthest;
  size_t tensors = 0;
};

Result<StateDifference> compare_states(const runtime::Trainer &plan,
                                       const runtime::Trainer &reference, const std::string &path) {
  const std::map<std::string, HostTensor> got = plan.state();
  RETURN_IF_ERROR(plan.runner().read_status().with_context(path));
  const std::map<std::string, HostTensor> want = reference.state();
  RETURN_IF_ERROR(
      reference.runner().read_status().with_context(str_cat(path, ": the one-device reference")));
  for (const auto &entry : got)
    if (!want.contains(entry.first))
      return failed_precondition(path, ": the plan's run keeps tensor '", entry.first,
                                 "', which its one-device reference does not");
  StateDifference result;
  result.tensors = want.size();
  for (const auto &[name, value] : want) {
    const auto it = got.find(name);
    if (it == got.end())
      return failed_precondition(path, ": the one-device reference keeps tensor '", name,
                                 "', which the plan's run does not");
    if (!(it->second.type == value.type))
      return failed_precondition(path, ": tensor '", name, "' is ", it->second.type.to_string(),
                                 " in the plan's run but ", value.type.to_string(),
                                 " in its one-device reference");
    const Difference d = tensor_difference(it->second, value);
    const bool farther =
        d.relative > result.farthest.relative ||
        (d.relative == result.farthest.relative && !d.identical && result.farthest.identical);
    if (result.tensor.empty() || farther) {
      result.tensor = name;
      result.farthest = d;
    }
  }
  return result;
}

// A trainer of `plan` on the batches of --data or --seed; `source` names it
// in errors, `model_dir` is where its graph's external data lie.
Result<std::unique_ptr<runtime::Trainer>> make_trainer(const Plan &plan, const std::string &source,
                                                       const std::string &model_dir,
                                                       const VerifyArgs &args) {
  ASSIGN_OR_RETURN(runtime::Dataset data, training_data(plan, args.data, args.seed));
  runtime::RunnerOptions options;
  options.model_dir = model_dir;
  options.source = source;
  ASSIGN_OR_RETURN(std::unique_ptr<runtime::StepRunner> runner,
                   runtime::make_runner(plan, options, kRunnerFlags));
  auto trainer = runtime::Trainer::create(std::move(runner), plan.loss, std::move(data));
  if (!trainer.is_ok()) return trainer.status().with_context(source);
  return std::move(trainer).value();
}

// The reference plan, where its graph's external data lie, and what it is
// for the `reference` line.
struct Reference {
  Plan plan;
  std::string model_dir;
  std::string description;
};

Result<Reference> make_reference(const VerifyArgs &args, const Plan &plan) {
  Reference reference;
  std::string source;
  if (args.model.empty()) {
    ASSIGN_OR_RETURN(reference.plan, reference_from_plan(plan, args.plan));
    reference.model_dir = folder_of(args.plan);
    source = "lowered from the plan's own training graph";
  } else {
    if (serialization::file_is_plan(args.model))
      return invalid_argument("--model ", args.model,
                              " is a plan; give the model file the plan was compiled from "
                              "(.strata, .json)");
    ASSIGN_OR_RETURN(Graph forward, load_model_file(args.model));
    ASSIGN_OR_RETURN(reference.plan, reference_from_model(plan, args.plan, forward, args.model));
    reference.model_dir = folder_of(args.model);
    source = str_cat("compiled from ", args.model);
  }
  const int64_t microbatches = reference.plan.pipeline ? reference.plan.pipeline->microbatches : 1;
  reference.description =
      str_cat("one device, ", counted(microbatches, "micro-batch"), " per step, ", source);
  return reference;
}

// How the plan splits the step, for the `plan` line.
std::string layout(const Plan &plan) {
  if (!plan.pipeline) return "one device";
  const serialization::PlanPipeline &p = *plan.pipeline;
  std::string text =
      str_cat(counted(p.stages, "stage"), " x ", counted(p.microbatches, "micro-batch"), " (",
              p.schedule, p.chunks > 1 ? str_cat(", ", p.chunks, " chunks per device") : "", ")");
  if (p.data_parallel > 1) text += str_cat(" x ", p.data_parallel, " replicas");
  if (p.tensor_parallel > 1)
    text += str_cat(" x ", p.tensor_parallel, "-device tensor-parallel groups");
  if (p.zero > 0) text += str_cat(", ZeRO-", p.zero);
  if (p.bucket_bytes > 0) text += ", gradient buckets";
  return text;
}

std::string format_loss_exact(double loss) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.8g", loss);
  return buf;
}

std::string format_difference(const Difference &d) {
  if (d.identical) return "0";
  if (d.relative == 0) return "0 (in value, not in bits)";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", d.relative);
  return buf;
}

std::string format_tolerance(double tolerance) {
  if (tolerance == 0) return "0 (bitwise)";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g (relative)", tolerance);
  return buf;
}

// One step of both runs, compared.
struct StepResult {
  int64_t step = 0;
  double loss = 0, reference_loss = 0;
  Difference loss_difference;
  StateDifference state;

  bool passed(double tolerance) const {
    return within(loss_difference, tolerance) && within(state.farthest, tolerance);
  }
};

std::string step_line(int64_t steps, const StepResult &r) {
  std::string line =
      str_cat("step ", r.step, "/", steps, "  loss ", format_loss_exact(r.loss), "  reference ",
              format_loss_exact(r.reference_loss), "  difference ", format_difference(r.loss_difference),
              "  weights ", format_difference(r.state.farthest));
  if (!r.state.farthest.identical) line += str_cat(" in '", r.state.tensor, "'");
  return line;
}

// The error of a failed comparison: the first step over the tolerance, the
// tensor farthest off there (and the loss, where it is over too), and the
// farthest tensor after the last step.
std::string failure_message(const std::string &path, const StepResult &first,
                            const StepResult &last, double tolerance) {
  const bool tensors_within = within(first.state.farthest, tolerance);
  std::string what;
  if (!tensors_within)
    what = str_cat("tensor '", first.state.tensor, "' differs from the one-device reference's by ",
                   format_difference(first.state.farthest));
  if (!within(first.loss_difference, tolerance))
    what += str_cat(what.empty() ? "" : " and ", "the loss ", format_loss_exact(first.loss),
                    " differs from the reference's ", format_loss_exact(first.reference_loss), " by ",
                    format_difference(first.loss_difference));
  std::string text = str_cat(path, ": step ", first.step, ": ", what, ", over the tolerance ",
                             format_tolerance(tolerance));
  if (tensors_within)
    text += str_cat(" (every tensor is within it; the farthest is '", first.state.tensor, "', by ",
                    format_difference(first.state.farthest), ")");
  if (last.step != first.step)
    text += str_cat("; after step ", last.step, " the farthest tensor is '", last.state.tensor,
                    "', by ", format_difference(last.state.farthest));
  return text;
}

// --steps steps of both runs, a line each, then the farthest tensor and the
// verdict: an error naming the first step over the tolerance.
Status compare_steps(const VerifyArgs &args, runtime::Trainer &plan, runtime::Trainer &reference,
                     double tolerance, std::ostream &out) {
  std::optional<StepResult> first_failure;
  StepResult last;
  for (int64_t step = 1; step <= args.steps; ++step) {
    StepResult result;
    result.step = step;
    auto loss = plan.train_step();
    if (!loss.is_ok()) return loss.status().with_context(str_cat(args.plan, ": step ", step));
    auto reference_loss = reference.train_step();
    if (!reference_loss.is_ok())
      return reference_loss.status().with_context(
          str_cat(args.plan, ": step ", step, " of the one-device reference"));
    result.loss = *loss;
    result.reference_loss = *reference_loss;
    result.loss_difference = compare_losses(result.loss, result.reference_loss);
    ASSIGN_OR_RETURN(result.state, compare_states(plan, reference, args.plan));
    const bool passed = result.passed(tolerance);
    out << step_line(args.steps, result) << (passed ? "" : "  <- over the tolerance") << "\n"
        << std::flush;
    if (!passed && !first_failure) first_failure = result;
    last = std::move(result);
  }
  out << "weights    after step " << last.step << " the farthest of the " << last.state.tensors
      << " tensors (weights and optimizer state) is '" << last.state.tensor << "', by "
      << format_difference(last.state.farthest) << "\n";
  if (first_failure)
    return failed_precondition(failure_message(args.plan, *first_failure, last, tolerance));
  out << "pass       " << counted(args.steps, "step") << ", every loss and tensor "
      << (tolerance == 0 ? std::string("bitwise equal")
                         : str_cat("within ", format_tolerance(tolerance)))
      << "\n";
  return Status::ok();
}

Status check_options(const VerifyArgs &args) {
  if (args.steps < 1 || args.steps > kMaxSteps)
    return invalid_argument("--steps must be between 1 and ", kMaxSteps, ", got ", args.steps);
  if (args.tolerance != kToleranceNotGiven && !(args.tolerance >= 0 && args.tolerance <= 1))
    return invalid_argument("--tolerance must be between 0 and 1, got ", args.tolerance);
  if (const auto launch = runtime::detect_mpi_launch(); launch && launch->size > 1)
    return failed_precondition("strata verify runs every device of the plan in this process; "
                               "start it without mpirun");
  return Status::ok();
}

Status verify_command(const VerifyArgs &args, std::ostream &out) {
  RETURN_IF_ERROR(check_options(args));
  ASSIGN_OR_RETURN(Plan plan, load_plan_file(args.plan));
  ASSIGN_OR_RETURN(Reference reference, make_reference(args, plan));
  const Tolerance tolerance = args.tolerance == kToleranceNotGiven
                                  ? default_tolerance(plan)
                                  : Tolerance{args.tolerance, "given by --tolerance"};
  // One GEMM thread here too, as on every pipeline device thread: a
  // one-device plan's executor, which runs on this thread, then splits its
  // products as the reference's device does, and the two agree to the bit.
  ops::cpu::set_gemm_num_threads(1);
  // A device thread stalled past the timeout cannot be stopped: report it and
  // end the process, as `strata run` does.
  runtime::host_transport::set_stuck_device_policy(
      {runtime::kDefaultCommunicatorTimeout, [](const Status &failure) {
         std::cout.flush();
         std::cerr << str_cat("strata: error: ", one_line(failure.message()), "\n");
         std::cerr.flush();
         std::_Exit(1);
       }});
  ASSIGN_OR_RETURN(std::unique_ptr<runtime::Trainer> tested,
                   make_trainer(plan, args.plan, folder_of(args.plan), args));
  ASSIGN_OR_RETURN(std::unique_ptr<runtime::Trainer> one_device,
                   make_trainer(reference.plan, str_cat(args.plan, " (one-device reference)"),
                                reference.model_dir, args));
  const std::string &model_name = plan.graph.name();
  out << "plan       " << args.plan << " (train " << (model_name.empty() ? "model" : model_name)
      << ", " << plan.loss_kind << ", " << plan.optimizer << "; " << layout(plan) << ")\n";
  out << "reference  " << reference.description << "\n";
  out << "data       " << tested->data().description << "\n";
  out << "tolerance  " << format_tolerance(tolerance.value) << ": " << tolerance.why << "\n"
      << std::flush;
  return compare_steps(args, *tested, *one_device, tolerance.value, out);
}

constexpr char kVerifyFooter[] =
    "Trains PLAN and its one-device reference side by side on the same batches\n"
    "(--data, or the same synthetic batches from --seed), compares the losses and\n"
    "every weight and optimizer state tensor after each step, and exits 0 when all\n"
    "stay within the tolerance, 1 naming the first step and tensor that do not.\n"
    "A tensor's difference is max|plan - reference| / max|reference|.\n\n"
    "The reference is one device running the same step with the same micro-batches:\n"
    "the plan's micro-batches of every replica one after another, gradients added\n"
    "in that order. Its bits are promised for one device and for a pipeline of any\n"
    "depth and schedule (interleaved and recomputed too), so these are compared\n"
    "bitwise (but for clip= over several stages, whose norm may differ in its last\n"
    "bit: 1e-5). Replicas (data parallelism, ZeRO-1, gradient buckets) and tensor-\n"
    "parallel groups add in another order: 1e-5, or 2e-3 under Adam and AdamW,\n"
    "which turn the rounding noise of gradients that are exactly zero into steps\n"
    "of about the learning rate.\n\n"
    "Without --model the reference is the plan's own training graph lowered for one\n"
    "device: this checks how the plan splits the step and how the runtime runs it,\n"
    "but an edit to the graph itself is in both runs. With --model, the model the\n"
    "plan was compiled from (checked against the plan's fingerprints) is compiled\n"
    "again for one device: this checks the graph too, and a tensor-parallel plan,\n"
    "whose graph is one member's share of the model, needs it. Both run on the CPU,\n"
    "one GEMM thread per device.\n\n"
    "Examples:\n"
    "  strata verify pp.splan                      # a pipeline: bitwise, 5 steps\n"
    "  strata verify dp.splan --steps 20           # replicas: within 1e-5\n"
    "  strata verify tp.splan --model m.strata     # tensor parallel: needs the model\n"
    "  strata verify z.splan --data batches/ --tolerance 1e-4";

} // namespace

void add_verify(CLI::App &app, Action &action) {
  static VerifyArgs args;
  CLI::App *sub = app.add_subcommand(
      "verify", "Train a plan beside its one-device reference; compare losses and weights");
  sub->add_option("PLAN", args.plan, "training plan (.splan, .splan.json)")->required();
  sub->add_option("--model", args.model,
                  "the model the plan was compiled from: build the reference from it (checks "
                  "the plan's graph too; a tensor-parallel plan needs it)")
      ->check(not_empty_path("a model file"))
      ->type_name("FILE");
  sub->add_option("--steps", args.steps, "training steps to compare")
      ->check(CLI::Range(int64_t{1}, kMaxSteps))
      ->capture_default_str();
  sub->add_option("--data", args.data,
                  "folder with <input>.npy for every graph input, batches stacked on a new "
                  "first dim (default: 8 fixed synthetic batches)")
      ->check(not_empty_path("a folder of .npy batches"))
      ->type_name("DIR");
  sub->add_option("--seed", args.seed, "seed of the synthetic batches")
      ->transform(unsigned_64())
      ->capture_default_str();
  sub->add_option("--tolerance", args.tolerance,
                  "largest relative difference allowed, 0 for bitwise (default: 0 where the "
                  "plan promises one device's bits, else 1e-5, or 2e-3 under Adam and AdamW)")
      ->check(CLI::Range(0.0, 1.0))
      ->type_name("T");
  sub->footer(kVerifyFooter);
  sub->callback([&action] { action = [] { return verify_command(args, std::cout); }; });
}

} // namespace strata::tools
