#include "tools/compile_model.h"

#include <charconv>

#include "ops/registry.h"
#include "partitioner/compile_pipeline.h"
#include "passes/make_training.h"
#include "passes/plan_memory.h"
#include "runtime/cpu/executor.h"
#include "serialization/model_io.h"
#include "serialization/sha256.h"
#include "tools/plan_text.h"

namespace strata::tools {
namespace {

using serialization::Plan;

struct Mesh {
  int dp = 1, tp = 1, pp = 1;
};

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

Result<partitioner::PipelineCompileOptions> pipeline_options(const CompileOptions &args) {
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
                            args.schedule == CompileOptions{}.schedule ? " (the default)" : "");

  options.chunks = !interleaved ? 1 : args.chunks > 0 ? static_cast<int>(args.chunks) : 2;
  if (!args.cluster.empty()) {
    auto cluster = partitioner::load_cluster(args.cluster);
    if (!cluster.is_ok()) return cluster.status().with_context("--cluster");
    options.cluster = std::move(cluster).value();
  }
  options.stage_boundaries = args.stage_boundaries;
  options.zero = static_cast<int>(args.zero);
  if (args.no_prefetch && args.zero != 3)
    return invalid_argument("--no-prefetch is for --zero 3 (its parameter gathers), not --zero ",
                            args.zero);
  options.prefetch = !args.no_prefetch;
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

// The options that only a parallel training plan reads, and the bucket size
// where there are no replicas to sum over: refused rather than ignored.
Status check_parallel_options(const CompileOptions &args, bool pipelined) {
  if (const CompileOptions defaults;
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
  // A schedule orders a pipeline's micro-batches: alone it would be ignored.
  if (!pipelined && args.schedule != CompileOptions{}.schedule)
    return invalid_argument("--schedule ", args.schedule,
                            " orders the micro-batches of a pipeline; add --mesh DPxTPxPP with "
                            "PP >= 2 and --microbatches M");
  return Status::ok();
}

// --auto: the search, its winner as the plan, and the options text.
Status compile_auto(const Graph &forward, passes::TrainingOptions &training,
                    const CompileOptions &args, const std::string &source, CompiledModel &compiled,
                    std::string &options_text) {
  if (args.devices < 0 || args.devices > kMaxDevices)
    return invalid_argument("--devices must be between 1 and ", kMaxDevices, ", got ",
                            args.devices);
  ASSIGN_OR_RETURN(partitioner::PipelineCompileOptions pipeline, pipeline_options(args));
  partitioner::AutoOptions search;
  search.cluster =
      pipeline.cluster
          ? *pipeline.cluster
          : partitioner::default_cpu_cluster(args.devices > 0 ? static_cast<int>(args.devices) : 2);
  search.devices = static_cast<int>(args.devices);
  search.bucket_bytes = pipeline.bucket_bytes;
  search.profile = pipeline.profile;
  auto found = partitioner::auto_plan(forward, training, search);
  if (!found.is_ok()) return found.status().with_context(source);
  if (training.output.empty()) training.output = forward.tensor(forward.outputs()[0]).name;
  options_text = "mode=train\n" + training.to_string() + pipeline_options_text(found->plan);
  compiled.plan = std::move(found->plan);
  compiled.search = std::move(found).value();
  return Status::ok();
}

// A training plan: --auto's, a parallel one, or the training step on one device.
Status compile_training(const Graph &forward, const CompileOptions &args, bool pipelined,
                        const std::string &source, CompiledModel &compiled,
                        std::string &options_text) {
  Plan &plan = compiled.plan;
  passes::TrainingOptions options;
  options.loss = args.loss;
  options.output = args.output_tensor;
  auto spec = passes::parse_optimizer(args.optimizer);
  if (!spec.is_ok())
    return spec.status().with_context(str_cat("--optimizer '", args.optimizer, "'"));
  options.optimizer = *spec;
  if (args.auto_plan) return compile_auto(forward, options, args, source, compiled, options_text);
  if (pipelined) {
    ASSIGN_OR_RETURN(partitioner::PipelineCompileOptions pipeline, pipeline_options(args));
    auto built = partitioner::compile_pipeline(forward, options, pipeline);
    if (!built.is_ok()) return built.status().with_context(source);
    if (options.output.empty()) options.output = forward.tensor(forward.outputs()[0]).name;
    options_text = "mode=train\n" + options.to_string() + pipeline_options_text(*built);
    plan = std::move(built).value();
    return Status::ok();
  }
  auto training = passes::make_training_graph(forward, options);
  if (!training.is_ok()) return training.status().with_context(source);
  if (options.output.empty()) options.output = forward.tensor(forward.outputs()[0]).name;
  options_text = "mode=train\n" + options.to_string();
  plan.mode = Plan::Mode::kTrain;
  plan.graph = std::move(training).value();
  plan.loss = "loss";
  plan.loss_kind = options.loss;
  plan.optimizer = options.optimizer.to_string();
  return Status::ok();
}

// A plan of one device: its node order and activation memory plan.
Status plan_one_device(Plan &plan, const std::string &source) {
  auto order = plan.graph.topological_order();
  if (!order.is_ok()) return order.status().with_context(source);
  auto memory = passes::plan_memory(plan.graph, *order);
  if (!memory.is_ok()) return memory.status().with_context(source);
  plan.devices.push_back({0, "cpu"});
  serialization::PlanProgram program;
  program.order = std::move(order).value();
  program.arena_bytes = memory->arena_bytes;
  program.offsets = memory->offsets;
  plan.programs.push_back(std::move(program));
  return Status::ok();
}

} // namespace

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

Result<CompiledModel> compile_model(const Graph &forward, const CompileOptions &args,
                                    const std::string &source) {
  auto model_bytes = serialization::model_to_flatbuffer(forward);
  if (!model_bytes.is_ok()) return model_bytes.status().with_context(source);

  CompiledModel compiled;
  Plan &plan = compiled.plan;
  std::string options_text;
  const bool pipelined = !args.mesh.empty() || args.microbatches > 0 || !args.cluster.empty() ||
                         !args.stage_boundaries.empty() || args.profile || args.auto_plan ||
                         args.zero > 0 || args.recompute || args.chunks > 0 ||
                         args.schedule == "interleaved";
  RETURN_IF_ERROR(check_parallel_options(args, pipelined));
  if (args.train) {
    RETURN_IF_ERROR(compile_training(forward, args, pipelined, source, compiled, options_text));
  } else {
    if (!args.output_tensor.empty())
      return invalid_argument("--loss-input selects the tensor a loss reads; it needs --train");
    options_text = "mode=infer\n";
    plan.mode = Plan::Mode::kInfer;
    plan.graph = forward;
  }
  plan.model_fingerprint = serialization::sha256_hex(*model_bytes);
  plan.fingerprint = serialization::plan_fingerprint(*model_bytes, options_text);
  if (!plan.pipeline) RETURN_IF_ERROR(plan_one_device(plan, source));
  return compiled;
}

} // namespace strata::tools
