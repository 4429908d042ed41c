// `strata compile`: a model into a plan (.splan): an inference plan, a
// training step on one device, or a pipeline-, data- and tensor-parallel
// training step, found by --auto if asked.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <vector>

#include "partitioner/search/auto_plan.h"
#include "serialization/file_io.h"
#include "serialization/plan_io.h"
#include "tools/cli.h"
#include "tools/compile_model.h"
#include "tools/model_stats.h"
#include "tools/plan_text.h"

namespace strata::tools {
namespace {

using serialization::Plan;

// `strata compile`'s options: what the plan is compiled with, the model it
// reads and the plan file it writes.
struct CompileArgs : CompileOptions {
  std::string model;
  std::string out;      // plan file to write
  bool explain = false; // --auto: print the candidates and why the winner won
};

// --explain: the candidates of the search and why the winner won.
void print_search(const partitioner::AutoResult &result, std::ostream &out) {
  const auto fitting = std::count_if(result.candidates.begin(), result.candidates.end(),
                                     [](const auto &c) { return c.error.empty() && c.fits; });
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.2f s", result.search_seconds);
  const bool estimated = !result.candidates.empty() && result.candidates.front().estimated;
  out << "search       " << result.candidates.size()
      << (estimated ? " candidates estimated from the stage search (too many devices to compile "
                      "each) in "
                    : " candidates compiled and simulated in ")
      << seconds << "; " << fitting << " fit in memory\n";
  out << "rank  candidate                       predicted step   bubble   memory/device   "
         "moved/step\n";
  for (size_t i = 0; i < result.candidates.size() && i < 8; ++i) {
    const auto &c = result.candidates[i];
    std::string label = c.label();
    label.resize(std::max<size_t>(label.size(), 30), ' ');
    if (!c.error.empty()) {
      out << pad(std::to_string(i + 1), 4) << "  " << label << "  error: " << c.error << "\n";
      continue;
    }
    out << pad(std::to_string(i + 1), 4) << "  " << label << pad(format_ms(c.step_s), 16)
        << pad(format_percent(c.bubble), 9) << pad(human_bytes(static_cast<double>(c.memory)), 16)
        << pad(human_bytes(c.comm_bytes), 13) << (c.fits ? "" : "  (does not fit)") << "\n";
  }
  if (result.candidates.size() > 8)
    out << "      ... " << result.candidates.size() - 8 << " more\n";
  out << "chosen       " << result.reason << "\n";
}

Status compile_command(const CompileArgs &args, std::ostream &out) {
  if (!args.out.empty()) RETURN_IF_ERROR(serialization::check_not_input(args.out, args.model));
  ASSIGN_OR_RETURN(Graph forward, load_model_file(args.model));
  ASSIGN_OR_RETURN(CompiledModel compiled, compile_model(forward, args, args.model));
  Plan &plan = compiled.plan;
  if (compiled.search && args.explain) print_search(*compiled.search, out);
  if (args.profile && !args.auto_plan)
    out << "profiled     node times measured on this CPU (one GEMM thread) balance the "
           "stages and predict the step\n";

  RETURN_IF_ERROR(serialization::save_plan(plan, args.out));
  out << "wrote " << args.out << "\n";
  plan.producer.clear();
  print_plan_summary(plan, out);
  return Status::ok();
}

// The options of a pipeline-, data- or tensor-parallel training step, and
// --auto's search for one.
void add_parallel_options(CLI::App *sub, CompileArgs &args, CLI::Option *train) {
  sub->add_option("--mesh", args.mesh,
                  "device mesh DPxTPxPP: PP pipeline stages, each replicated DP times (data "
                  "parallelism; gradients all-reduced), each replica split over TP devices "
                  "(tensor parallelism)")
      ->needs(train)
      ->type_name("DPxTPxPP");
  sub->add_option("--microbatches", args.microbatches,
                  "split each batch into M micro-batches (M divides the batch); gradients are "
                  "averaged, one optimizer step per batch (default 1)")
      ->needs(train)
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->type_name("M");
  sub->add_option("--schedule", args.schedule,
                  "pipeline schedule: gpipe (all forwards, then all backwards), 1f1b "
                  "(PipeDream-Flush: less activation memory, same result), interleaved "
                  "(1F1B over --chunks model chunks per device, Megatron-LM's: a bubble about "
                  "--chunks times smaller for more transfers; micro-batches a multiple of the "
                  "stages) or zb-h1 (zero-bubble H1: 1F1B with each backward split into its "
                  "input-gradient and weight-gradient halves, the weight halves put off to fill "
                  "the cool-down's waits; same result, some more activation memory)")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved", "zb-h1"}))
      ->needs(train)
      ->capture_default_str();
  sub->add_option("--chunks", args.chunks,
                  "--schedule interleaved: model chunks per device; the model is cut into "
                  "stages x chunks virtual stages, virtual stage k on device k mod stages "
                  "(default 2)")
      ->check(CLI::Range(2, 1024))
      ->needs(train)
      ->type_name("V");
  sub->add_option("--cluster", args.cluster,
                  "cluster spec (JSON; see examples/clusters/, `strata calibrate`) the stages are "
                  "balanced and the step predicted for (default: a CPU with one device per stage)")
      ->needs(train)
      ->type_name("FILE");
  sub->add_option("--stage-boundaries", args.stage_boundaries,
                  "instead of searching, cut after these forward nodes (P-1 names, comma "
                  "separated, in order; with --schedule interleaved P x --chunks - 1)")
      ->needs(train)
      ->delimiter(',')
      ->type_name("NODE,...");
  CLI::Option *auto_flag = sub->add_flag(
      "--auto", args.auto_plan,
      "search the mesh (DPxTPxPP), micro-batches, schedule (gpipe, 1f1b, zb-h1, interleaved "
      "with 2 chunks), ZeRO-1, 2 and 3 and recomputation for --devices devices; keep the fastest "
      "predicted plan that fits in memory (above 64 devices candidates are estimated from the "
      "stage search, as 1F1B, and only the winner compiled)");
  sub->add_option("--devices", args.devices,
                  "--auto: devices to use, at most 4096 as in a --mesh (default: every device of "
                  "--cluster)")
      ->needs(auto_flag)
      ->check(CLI::Range(1, kMaxDevices));
  sub->add_flag("--explain", args.explain,
                "--auto: print the best candidates and why the winner won")
      ->needs(auto_flag);
  sub->add_option("--zero", args.zero,
                  "1: shard the optimizer state over the data-parallel replicas (ZeRO-1: "
                  "reduce-scatter gradients, update a shard, all-gather parameters); 2: the "
                  "gradients too (ZeRO-2: every micro-batch's gradients reduce-scattered as they "
                  "are computed, each replica keeping only the shard it updates); 3: the "
                  "parameters too (ZeRO-3 / FSDP: each replica holds only its shard of a "
                  "parameter, gathered whole before the forward and again before the backward "
                  "that read it, freed after; each layer's gathers run on the communication "
                  "stream while the layer before it computes)")
      ->check(CLI::Range(0, 3))
      ->needs(train);
  sub->add_flag("--no-prefetch", args.no_prefetch,
                "--zero 3: gather each parameter right before its reader instead of one layer "
                "ahead on the communication stream (less memory, no overlap)");
  sub->add_flag("--split-activations", args.split_activations,
                "tensor parallelism: let partial sums become split activations (reduce-scatter, "
                "all-gather before the next whole use) where the cost model finds it cheaper, "
                "so the work between blocks is split too, as in Megatron-LM's sequence "
                "parallelism; without it every block ends in one all-reduce")
      ->needs(train);
  sub->add_option("--bucket-mb", args.bucket_mb,
                  "data parallelism: sum gradients over the replicas in buckets of about this "
                  "many MiB, each started as soon as its gradients are final so the reduction "
                  "overlaps the rest of backward (PyTorch DDP's default is 25); 0 reduces every "
                  "gradient on its own at the end of backward")
      ->default_val(25)
      ->check(CLI::Range(0.0, 1048576.0))
      ->needs(train);
  sub->add_flag("--recompute", args.recompute,
                "activation recomputation: keep only the activations between layers for the "
                "backward pass and recompute the rest (about one more forward pass, much less "
                "activation memory)")
      ->needs(train);
  sub->add_flag("--profile", args.profile,
                "time every node of the training step on this CPU and balance and predict with "
                "those times instead of the cluster's roofline");
  auto_flag->excludes(sub->get_option("--mesh"))
      ->excludes(sub->get_option("--microbatches"))
      ->excludes(sub->get_option("--schedule"))
      ->excludes(sub->get_option("--stage-boundaries"))
      ->excludes(sub->get_option("--chunks"))
      ->excludes(sub->get_option("--recompute"))
      ->needs(train);
}

constexpr char kCompileFooter[] =
    "A training plan adds an input 'labels' (i64, the output's shape without its last\n"
    "dim; softmax_cross_entropy) or 'targets' (the output's type; mse), the scalar\n"
    "'loss' (mean), the gradients and the optimizer's update; its only output is the\n"
    "loss. Gradient clipping and learning-rate schedules are options of the optimizer\n"
    "string. The same model and options always give a byte-identical plan; its\n"
    "fingerprint (SHA-256 of the model and the options) is checked by --resume.\n\n"
    "Examples:\n"
    "  strata compile mlp.strata --train --loss softmax_cross_entropy \\\n"
    "      --optimizer sgd:lr=0.1,momentum=0.9 -o train.splan\n"
    "  strata compile gpt.strata --train \\\n"
    "      --optimizer adamw:lr=3e-4,wd=0.1,clip=1,schedule=cosine,warmup=100,total=1000 \\\n"
    "      -o train.splan\n"
    "  strata compile mlp.strata --train --loss mse --optimizer adam:lr=1e-3 -o reg.splan\n"
    "  strata compile mlp.strata -o infer.splan     # inference plan\n"
    "  strata run train.splan --steps 100\n\n"
    "Pipeline parallelism: --mesh 1x1xP cuts the forward graph into P stages of about\n"
    "equal predicted time (the backward and optimizer work follows its forward node),\n"
    "inserts the sends and receives between stages, schedules M micro-batches with\n"
    "GPipe, 1F1B or interleaved 1F1B (--chunks model chunks per device), plans each\n"
    "device's memory and checks the programs for deadlocks.\n"
    "The result trains to the same weights as one device (see docs/architecture.md).\n"
    "  strata compile gpt.strata --train --mesh 1x1x4 --microbatches 8 --schedule 1f1b \\\n"
    "      -o pp.splan\n"
    "  strata compile gpt.strata --train --mesh 1x1x2 --microbatches 4 \\\n"
    "      --cluster examples/clusters/cpu-dev.json -o pp2.splan   # this 2-core machine\n"
    "  strata inspect pp.splan                        # stages, memory, predicted bubble\n"
    "  strata run pp.splan --steps 5 --trace t.json   # 4 device threads; Perfetto trace\n\n"
    "Data parallelism: --mesh DPx1xPP replicates each stage DP times; each replica\n"
    "takes 1/DP of the batch and gradients are summed over the replicas (ring, tree,\n"
    "recursive doubling or Rabenseifner, whichever the cost model prefers for each\n"
    "group; `strata inspect --comm` shows it), in buckets that overlap the rest of\n"
    "backward (--bucket-mb). --zero 1 also shards the optimizer state over the\n"
    "replicas (ZeRO-1); --zero 2 the gradients too: each micro-batch's are\n"
    "reduce-scattered as backward computes them and each replica keeps only the\n"
    "shard it updates (ZeRO-2: less memory, a reduce-scatter per micro-batch);\n"
    "--zero 3 the parameters too: each replica holds 1/DP of every parameter and\n"
    "gathers it whole before the forward and the backward of each micro-batch\n"
    "(ZeRO-3 / FSDP: least memory, two all-gathers per parameter and micro-batch,\n"
    "each started one layer ahead on the communication stream, --no-prefetch to\n"
    "wait instead; CPU threads and MPI ranks so far, not CUDA).\n"
    "  strata compile gpt.strata --train --mesh 2x1x2 --microbatches 4 --zero 1 -o dp.splan\n"
    "  strata compile gpt.strata --train --mesh 4x1x1 --microbatches 4 --zero 2 -o z2.splan\n"
    "  strata compile gpt.strata --train --mesh 4x1x1 --microbatches 4 --zero 3 -o z3.splan\n\n"
    "Tensor parallelism: --mesh DPxTPxPP with TP > 1 splits every stage's work over\n"
    "TP devices. Nothing is annotated: the compiler picks each tensor's split by the\n"
    "cost model (on a GPT: Megatron-LM's column/row split, attention by heads, one\n"
    "all-reduce per block each way); `strata inspect --comm` says why each one is there.\n"
    "  strata compile gpt.strata --train --mesh 1x2x2 --microbatches 4 -o tp.splan\n\n"
    "Memory: --recompute keeps only the activations between layers for backward and\n"
    "recomputes the rest (same results, about one more forward pass).\n"
    "  strata compile gpt.strata --train --mesh 1x1x4 --microbatches 16 --recompute -o "
    "r.splan\n\n"
    "--auto searches all of the above for N devices of a cluster and explains its choice.\n"
    "  strata compile gpt.strata --train --auto --devices 8 --explain -o auto.splan";

} // namespace

void add_compile(CLI::App &app, Action &action) {
  static CompileArgs args;
  CLI::App *sub = app.add_subcommand(
      "compile", "Compile a model into a plan (.splan); with --train, a training-step plan");
  sub->add_option("MODEL", args.model, "model file (.strata or .json)")->required();
  CLI::Option *train = sub->add_flag(
      "--train", args.train, "add a loss, the backward pass and the optimizer step to the graph");
  sub->add_option("--loss", args.loss, "softmax_cross_entropy (integer labels) or mse (targets)")
      ->check(CLI::IsMember({"softmax_cross_entropy", "mse"}))
      ->needs(train)
      ->capture_default_str();
  sub->add_option("--optimizer", args.optimizer,
                  "NAME[:key=value,...]: sgd, adam or adamw; keys lr, momentum, nesterov, wd, "
                  "beta1, beta2, eps, schedule (constant|cosine), warmup, total, min_lr, clip. "
                  "Defaults as in torch.optim: wd 0, but 0.01 for adamw; betas 0.9, 0.999; eps "
                  "1e-8")
      ->needs(train)
      ->capture_default_str();
  sub->add_option("--loss-input", args.output_tensor,
                  "the model output the loss reads (default: the model's first output)")
      ->needs(train)
      ->type_name("NAME");
  // Every other command's --output is the file it writes; here that is -o.
  // --output (once the loss input's name) is caught to say so.
  static std::string misplaced_output;
  sub->add_option("--output", misplaced_output)->group("");
  sub->add_option("-o", args.out, "plan file to write: .splan (binary) or .splan.json (text)")
      ->type_name("FILE");
  add_parallel_options(sub, args, train);
  sub->footer(kCompileFooter);
  sub->callback([&action] {
    action = []() -> Status {
      if (!misplaced_output.empty())
        return invalid_argument("compile writes its plan with -o FILE, and --output is not one "
                                "of its options (the tensor the loss reads is --loss-input NAME)");
      if (args.out.empty())
        return invalid_argument("-o FILE is required: the plan file to write (.splan or "
                                ".splan.json)");
      return compile_command(args, std::cout);
    };
  });
}

} // namespace strata::tools
