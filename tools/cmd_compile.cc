// `strata compile`: a model into a plan (.splan): an inference plan, a
// training step on one device, or a pipeline-, data- and tensor-parallel
// training step, found by --auto if asked.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <iostream>
#include <vector>

#include "ops/registry.h"
#include "partitioner/search/auto_plan.h"
#include "partitioner/compile_pipeline.h"
#include "passes/make_training.h"
#include "passes/plan_memory.h"
#include "runtime/cpu/executor.h"
#include "serialization/file_io.h"
#include "serialization/model_io.h"
#include "serialization/plan_io.h"
#include "serialization/sha256.h"
#include "tools/cli.h"
#include "tools/model_stats.h"
#include "tools/plan_text.h"

namespace strata::tools {
namespace {

using serialization::Plan;

struct CompileArgs {
  std::string model;
  bool train = false;
  std::string loss = "softmax_cross_entropy";
  std::string optimizer = "sgd:lr=0.01";
  std::string output_tensor; // --loss-input: the tensor the loss reads; empty: the first output
  std::string out;           // plan file to write
  // Pipeline parallelism (training only).
  std::string mesh;                          // "DPxTPxPP"; TP must be 1 so far
  int64_t microbatches = 0;                  // 0: not given (1)
  std::string schedule = "1f1b";             // gpipe, 1f1b or interleaved
  int64_t chunks = 0;                        // interleaved: chunks per device; 0: not given (2)
  std::string cluster;                       // cluster spec JSON the costs are predicted for
  std::vector<std::string> stage_boundaries; // last forward node of each stage but the last
  bool profile = false;                      // time every node here instead of using the roofline
  int64_t zero = 0;                          // 1: shard the optimizer state over the replicas
  double bucket_mb = 25;                     // gradient bucket size in MiB; 0: no overlap
  bool recompute = false;                    // recompute activations in backward
  bool split_activations = false;            // TP: reduce-scatter partial sums into split ones
  // --auto: search the mesh, micro-batches and schedule for `devices` devices.
  bool auto_plan = false;
  int64_t devices = 0;  // 0: every device of the cluster
  bool explain = false; // print the candidates and why the winner won
};

struct Mesh {
  int dp = 1, tp = 1, pp = 1;
};

// The most devices a mesh (--mesh) or an --auto search (--devices) spans.
constexpr int kMaxDevices = 4096;

// --mesh DPxTPxPP.
Result<Mesh> parse_mesh(const std::string &mesh) {
  if (mesh.empty()) return Mesh{};
  std::vector<int64_t> dims;
  size_t start = 0;
  while (true) {
    size_t x = mesh.find('x', start);
    std::string part = mesh.substr(start, x == std::string::npos ? std::string::npos : x - start);
    int64_t value = 0;
    auto [end, error] = std::from_chars(part.data(), part.data() + part.size(), value);
    if (part.empty() || error != std::errc() || end != part.data() + part.size() || value < 1)
      return invalid_argument("--mesh '", mesh,
                              "': expected DPxTPxPP with positive integers, e.g. 1x1x4");
    dims.push_back(value);
    if (x == std::string::npos) break;
    start = x + 1;
  }
  if (dims.size() != 3)
    return invalid_argument("--mesh '", mesh, "': expected three sizes DPxTPxPP, e.g. 1x1x4");
  if (dims[0] > kMaxDevices || dims[1] > kMaxDevices || dims[2] > kMaxDevices ||
      dims[0] * dims[1] * dims[2] > kMaxDevices)
    return invalid_argument("--mesh '", mesh, "': at most ", kMaxDevices, " devices");
  return Mesh{static_cast<int>(dims[0]), static_cast<int>(dims[1]), static_cast<int>(dims[2])};
}

Result<partitioner::PipelineCompileOptions> pipeline_options(const CompileArgs &args) {
  partitioner::PipelineCompileOptions options;
  ASSIGN_OR_RETURN(Mesh mesh, parse_mesh(args.mesh));
  options.stages = mesh.pp;
  options.data_parallel = mesh.dp;
  options.tensor_parallel = mesh.tp;
  if (args.microbatches < 0 || args.microbatches > 1 << 20)
    return invalid_argument("--microbatches must be between 1 and 1048576, got ",
                            args.microbatches);
  options.microbatches = args.microbatches > 0 ? static_cast<int>(args.microbatches) : 1;
  auto schedule = partitioner::parse_schedule(args.schedule);
  if (!schedule.is_ok()) return schedule.status().with_context("--schedule");
  options.schedule = *schedule;
  const bool interleaved = *schedule == partitioner::Schedule::kInterleaved;
  if (args.chunks != 0 && !interleaved)
    return invalid_argument("--chunks cuts the model into chunks per device for --schedule "
                            "interleaved, not ",
                            args.schedule,
                            args.schedule == CompileArgs{}.schedule ? " (the default)" : "");

  options.chunks = !interleaved ? 1 : args.chunks > 0 ? static_cast<int>(args.chunks) : 2;
  if (!args.cluster.empty()) {
    auto cluster = partitioner::load_cluster(args.cluster);
    if (!cluster.is_ok()) return cluster.status().with_context("--cluster");
    options.cluster = std::move(cluster).value();
  }
  options.stage_boundaries = args.stage_boundaries;
  options.zero = static_cast<int>(args.zero);
  options.recompute = args.recompute;
  options.split_activations = args.split_activations;
  if (!(args.bucket_mb >= 0 && args.bucket_mb <= 1 << 20))
    return invalid_argument("--bucket-mb must be between 0 and 1048576 MiB, got ", args.bucket_mb);
  options.bucket_bytes = static_cast<int64_t>(args.bucket_mb * (1 << 20));
  if (args.profile) {
    // One GEMM thread, as each pipeline device thread runs with.
    options.profile = runtime::profile_node_times;
  }
  return options;
}

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

// The pipeline's part of the options text the fingerprint covers.
std::string pipeline_options_text(const Plan &plan) {
  const serialization::PlanPipeline &p = *plan.pipeline;
  std::string text =
      str_cat("stages=", p.stages, "\ndata_parallel=", p.data_parallel,
              p.tensor_parallel > 1 ? str_cat("\ntensor_parallel=", p.tensor_parallel) : "",
              "\nzero=", p.zero, "\nmicrobatches=", p.microbatches, "\nschedule=", p.schedule,
              p.chunks > 1 ? str_cat("\nchunks=", p.chunks) : "", "\nboundaries=");
  for (size_t i = 0; i < p.boundaries.size(); ++i)
    text += str_cat(i ? "," : "", p.boundaries[i]);
  if (recomputed_nodes(plan.graph) > 0) text += "\nrecompute=1";
  if (p.bucket_bytes > 0) text += str_cat("\nbucket_bytes=", p.bucket_bytes);
  for (const Node &node : plan.graph.nodes())
    if (ops::collective_of(node.op) == ops::Collective::kReduceScatter) {
      text += "\nsplit_activations=1";
      break;
    }
  return text + "\ncluster=" + serialization::sha256_hex(std::string_view(p.cluster_json)) + "\n";
}

Status compile_command(const CompileArgs &args, std::ostream &out) {
  if (!args.out.empty()) RETURN_IF_ERROR(serialization::check_not_input(args.out, args.model));
  ASSIGN_OR_RETURN(Graph forward, load_model_file(args.model));
  auto model_bytes = serialization::model_to_flatbuffer(forward);
  if (!model_bytes.is_ok()) return model_bytes.status().with_context(args.model);

  Plan plan;
  std::string options_text;
  const bool pipelined = !args.mesh.empty() || args.microbatches > 0 || !args.cluster.empty() ||
                         !args.stage_boundaries.empty() || args.profile || args.auto_plan ||
                         args.zero > 0 || args.recompute || args.chunks > 0 ||
                         args.schedule == "interleaved";
  if (const CompileArgs defaults;
      args.bucket_mb != defaults.bucket_mb && args.bucket_mb != 0 && !args.auto_plan) {
    // Buckets group the replicas' gradient all-reduces; without replicas the
    // option would be ignored (0, no buckets, is what one replica has anyway).
    auto mesh = parse_mesh(args.mesh);
    if (mesh.is_ok() && mesh->dp < 2)
      return invalid_argument("--bucket-mb groups the data-parallel replicas' gradient "
                              "all-reduces; ",
                              args.mesh.empty() ? "without --mesh" : "this mesh has",
                              " one replica (use --mesh DPxTPxPP with DP >= 2)");
  }
  if (pipelined && !args.train)
    return invalid_argument(
        "--mesh, --microbatches, --cluster, --stage-boundaries and --profile make a "
        "pipeline training plan; add --train");
  if (args.train) {
    passes::TrainingOptions options;
    options.loss = args.loss;
    options.output = args.output_tensor;
    auto spec = passes::parse_optimizer(args.optimizer);
    if (!spec.is_ok())
      return spec.status().with_context(str_cat("--optimizer '", args.optimizer, "'"));
    options.optimizer = *spec;
    if (args.auto_plan) {
      if (args.devices < 0 || args.devices > kMaxDevices)
        return invalid_argument("--devices must be between 1 and ", kMaxDevices, ", got ",
                                args.devices);
      ASSIGN_OR_RETURN(partitioner::PipelineCompileOptions pipeline, pipeline_options(args));
      partitioner::AutoOptions search;
      search.cluster = pipeline.cluster
                           ? *pipeline.cluster
                           : partitioner::default_cpu_cluster(
                                 args.devices > 0 ? static_cast<int>(args.devices) : 2);
      search.devices = static_cast<int>(args.devices);
      search.bucket_bytes = pipeline.bucket_bytes;
      search.profile = pipeline.profile;
      auto found = partitioner::auto_plan(forward, options, search);
      if (!found.is_ok()) return found.status().with_context(args.model);
      if (args.explain) print_search(*found, out);
      if (options.output.empty()) options.output = forward.tensor(forward.outputs()[0]).name;
      options_text = "mode=train\n" + options.to_string() + pipeline_options_text(found->plan);
      plan = std::move(found->plan);
    } else if (pipelined) {
      ASSIGN_OR_RETURN(partitioner::PipelineCompileOptions pipeline, pipeline_options(args));
      auto compiled = partitioner::compile_pipeline(forward, options, pipeline);
      if (!compiled.is_ok()) return compiled.status().with_context(args.model);
      if (options.output.empty()) options.output = forward.tensor(forward.outputs()[0]).name;
      options_text = "mode=train\n" + options.to_string() + pipeline_options_text(*compiled);
      plan = std::move(compiled).value();
      if (args.profile)
        out << "profiled     node times measured on this CPU (one GEMM thread) balance the "
               "stages and predict the step\n";
    } else {
      auto training = passes::make_training_graph(forward, options);
      if (!training.is_ok()) return training.status().with_context(args.model);
      if (options.output.empty()) options.output = forward.tensor(forward.outputs()[0]).name;
      options_text = "mode=train\n" + options.to_string();
      plan.mode = Plan::Mode::kTrain;
      plan.graph = std::move(training).value();
      plan.loss = "loss";
      plan.loss_kind = options.loss;
      plan.optimizer = options.optimizer.to_string();
    }
  } else {
    if (!args.output_tensor.empty())
      return invalid_argument("--loss-input selects the tensor a loss reads; it needs --train");
    options_text = "mode=infer\n";
    plan.mode = Plan::Mode::kInfer;
    plan.graph = std::move(forward);
  }
  plan.model_fingerprint = serialization::sha256_hex(*model_bytes);
  plan.fingerprint = serialization::plan_fingerprint(*model_bytes, options_text);

  if (!plan.pipeline) {
    auto order = plan.graph.topological_order();
    if (!order.is_ok()) return order.status().with_context(args.model);
    auto memory = passes::plan_memory(plan.graph, *order);
    if (!memory.is_ok()) return memory.status().with_context(args.model);
    plan.devices.push_back({0, "cpu"});
    serialization::PlanProgram program;
    program.order = std::move(order).value();
    program.arena_bytes = memory->arena_bytes;
    program.offsets = memory->offsets;
    plan.programs.push_back(std::move(program));
  }

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
                  "(PipeDream-Flush: less activation memory, same result) or interleaved "
                  "(1F1B over --chunks model chunks per device, Megatron-LM's: a bubble about "
                  "--chunks times smaller for more transfers; micro-batches a multiple of the "
                  "stages)")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved"}))
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
      "search the mesh (DPxTPxPP), micro-batches, schedule (gpipe, 1f1b, interleaved with 2 "
      "chunks), ZeRO-1 and recomputation for --devices devices; keep the fastest predicted plan "
      "that "
      "fits in memory (above 64 "
      "devices candidates are estimated from the stage search, and only the winner compiled)");
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
                  "reduce-scatter gradients, update a shard, all-gather parameters)")
      ->check(CLI::Range(0, 1))
      ->needs(train);
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
    "takes 1/DP of the batch and gradients are summed over the replicas (ring or\n"
    "tree, whichever the cost model prefers), in buckets that overlap the rest of\n"
    "backward (--bucket-mb). --zero 1 also shards the optimizer state over the\n"
    "replicas (ZeRO-1).\n"
    "  strata compile gpt.strata --train --mesh 2x1x2 --microbatches 4 --zero 1 -o dp.splan\n\n"
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
