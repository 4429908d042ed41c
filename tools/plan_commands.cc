// `strata compile` (model -> plan), the plan side of `strata inspect` and
// `strata convert`, and the training mode of `strata run`.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "ops/registry.h"
#include "partitioner/auto_plan.h"
#include "partitioner/compile_pipeline.h"
#include "passes/fuse_elementwise.h"
#include "passes/make_training.h"
#include "passes/plan_memory.h"
#include "passes/recompute.h"
#include "plan/instructions.h"
#include "plan/memory.h"
#include "plan/trace.h"
#include "runtime/cuda_executor.h"
#include "runtime/cuda_pipeline.h"
#include "runtime/make_runner.h"
#include "runtime/mpi_world.h"
#include "runtime/pipeline_runner.h"
#include "runtime/trainer.h"
#include "serialization/checkpoint.h"
#include "serialization/file_io.h"
#include "serialization/model_io.h"
#include "serialization/sha256.h"
#include "tools/commands.h"
#include "tools/model_stats.h"

namespace strata::tools {
namespace {

namespace fs = std::filesystem;
using serialization::Plan;

// "1 stage", "4 stages", "1 micro-batch", "8 micro-batches".
std::string counted(int64_t n, std::string_view noun) {
  return str_cat(n, " ", noun, n == 1 ? "" : noun.ends_with("h") ? "es" : "s");
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

// One pipeline device's share of the step.
struct StageRow {
  size_t nodes = 0;           // distinct nodes it computes
  int64_t parameters = 0;     // elements of the trainable parameters it holds
  double flops = 0;           // per step, all micro-batches
  int64_t arena = 0;          // peak activation bytes
  double busy = 0;            // predicted seconds of work per step
  std::map<int, double> sent; // bytes per step to each peer
  double reduced = 0;         // bytes per step all-reduced with the other replicas
};

std::vector<StageRow> stage_rows(const Plan &plan) {
  const Graph &g = plan.graph;
  const ops::OpRegistry &registry = ops::OpRegistry::global();
  std::vector<StageRow> rows;
  for (const serialization::PlanProgram &program : plan.programs) {
    StageRow row;
    std::set<NodeId> nodes;
    for (const serialization::PlanInstruction &instr : program.instructions) {
      if (instr.kind == serialization::InstrKind::kCompute) {
        nodes.insert(instr.index);
        row.flops += registry.node_cost(g, instr.index).flops;
      } else if (instr.kind == serialization::InstrKind::kSend) {
        row.sent[instr.peer] += static_cast<double>(g.tensor(instr.index).type.size_bytes());
      } else {
        for (TensorId t : plan::reduced_tensors(program, instr))
          row.reduced += static_cast<double>(g.tensor(t).type.size_bytes());
      }
    }
    row.nodes = nodes.size();
    for (TensorId id : program.holds)
      if (g.tensor(id).kind == TensorKind::kParameter && is_floating(g.tensor(id).type.dtype))
        row.parameters += g.tensor(id).type.num_elements();
    row.arena = program.arena_bytes;
    row.busy = program.predicted_busy_s;
    rows.push_back(std::move(row));
  }
  return rows;
}

std::string format_ms(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f ms", seconds * 1e3);
  return buf;
}

std::string format_percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", fraction * 100);
  return buf;
}

std::string pad(std::string text, size_t width) {
  if (text.size() < width) text.insert(0, width - text.size(), ' ');
  return text;
}

// Forward nodes a plan recomputes in backward (--recompute).
size_t recomputed_nodes(const Graph &graph) {
  return static_cast<size_t>(
      std::count_if(graph.nodes().begin(), graph.nodes().end(),
                    [](const Node &n) { return n.name.ends_with(passes::kRecomputeSuffix); }));
}

// The schedule's ideal bubble with equal stages: (p-1)/(m+p-1), or with v
// chunks per device (interleaved) (p-1)/(vm+p-1).
std::string bubble_formula(const serialization::PlanPipeline &p) {
  const double formula =
      (p.stages - 1.0) / (static_cast<double>(p.chunks) * p.microbatches + p.stages - 1.0);
  return str_cat(p.chunks > 1 ? "(p-1)/(vm+p-1) = " : "(p-1)/(m+p-1) = ", format_percent(formula));
}

void print_pipeline_summary(const Plan &plan, std::ostream &out) {
  const serialization::PlanPipeline &p = *plan.pipeline;
  std::string cluster_name = "?";
  if (auto cluster = partitioner::parse_cluster(p.cluster_json, "plan cluster"); cluster.is_ok())
    cluster_name = cluster->name;
  out << "pipeline     " << counted(p.stages, "stage") << " x "
      << counted(p.microbatches, "micro-batch") << ", schedule " << p.schedule
      << (p.chunks > 1 ? str_cat(" (", p.chunks, " model chunks per device)") : "")
      << ", costs for cluster '" << cluster_name << "'\n";
  if (p.data_parallel > 1)
    out << "data par.    " << p.data_parallel << " replicas of every stage (device = "
        << (p.tensor_parallel > 1 ? "(stage x " : "stage x ") << p.data_parallel << " + replica"
        << (p.tensor_parallel > 1 ? str_cat(") x ", p.tensor_parallel, " + member") : "")
        << "); gradients "
        << (p.zero == 1 ? "reduce-scattered, optimizer state sharded (ZeRO-1)"
                        : "all-reduced per stage")
        << (p.group_algorithms.empty() ? std::string()
                                       : str_cat(" (", p.group_algorithms.front(), ")"))
        << "\n";
  if (p.bucket_bytes > 0) {
    size_t buckets = 0, tensors = 0;
    for (const auto &program : plan.programs) {
      buckets = std::max(buckets, program.buckets.size());
      for (const auto &bucket : program.buckets)
        tensors += bucket.tensors.size();
    }
    out << "buckets      gradients summed in buckets of up to "
        << human_bytes(static_cast<double>(p.bucket_bytes)) << " (at most " << buckets
        << " per device, " << tensors
        << " tensors in all), each started as soon as its last gradient is final, on a "
           "communication stream overlapping the rest of backward\n";
  }
  if (const size_t recomputed = recomputed_nodes(plan.graph); recomputed > 0)
    out << "recompute    " << recomputed
        << " forward nodes recomputed in backward; activations kept between layers only\n";
  if (p.tensor_parallel > 1) {
    std::map<std::string, int> collectives;
    for (const Node &node : plan.graph.nodes())
      if (ops::collective_of(node.op) != ops::Collective::kNone) ++collectives[node.op];
    out << "tensor par.  " << p.tensor_parallel << " devices per group (device = (stage x "
        << p.data_parallel << " + replica) x " << p.tensor_parallel << " + member); "
        << p.shards.size() << " tensors held in pieces; per micro-batch:";
    for (const auto &[op, count] : collectives)
      out << " " << count << " " << op;
    out << "\n";
  }
  out << "predicted    step " << format_ms(p.predicted_step_s) << ", bubble "
      << format_percent(p.predicted_bubble) << " (" << bubble_formula(p) << ")\n";
  if (!p.boundaries.empty()) {
    out << "boundaries   ";
    for (size_t i = 0; i < p.boundaries.size(); ++i)
      out << (i ? ", " : "") << p.boundaries[i];
    out << "\n";
  }
  if (p.chunks > 1)
    out << "chunks       the devices at pipeline position s run stages s, s+" << p.stages
        << ", ... (of " << p.stages * p.chunks << ")\n";
  std::vector<StageRow> rows = stage_rows(plan);
  out << (p.data_parallel > 1 || p.tensor_parallel > 1 || p.chunks > 1 ? "device" : "stage ")
      << " nodes    parameters   FLOPs/step   peak act.  predicted busy  sends/step\n";
  for (size_t d = 0; d < rows.size(); ++d) {
    const StageRow &r = rows[d];
    std::string sends;
    for (const auto &[peer, bytes] : r.sent)
      sends += str_cat(sends.empty() ? "" : ", ", "->", peer, " ", human_bytes(bytes));
    if (r.reduced > 0)
      sends += str_cat(sends.empty() ? "" : ", ", "all-reduce ", human_bytes(r.reduced));
    out << pad(std::to_string(d), 5) << pad(std::to_string(r.nodes), 7)
        << pad(grouped(r.parameters), 14) << pad(human_flops(r.flops), 13)
        << pad(human_bytes(static_cast<double>(r.arena)), 12) << pad(format_ms(r.busy), 16) << "  "
        << (sends.empty() ? "-" : sends) << "\n";
  }
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
  if (plan.pipeline) {
    // Per step: every micro-batch, on every stage.
    double flops = 0;
    for (const StageRow &row : stage_rows(plan))
      flops += row.flops;
    n.flops = flops;
    out << "batch        inputs above are one micro-batch; a step takes "
        << plan.pipeline->microbatches * plan.pipeline->data_parallel << " of them\n";
    if (plan.pipeline->tensor_parallel > 1)
      out << "pieces       parameters and FLOPs above are one member's of each "
          << plan.pipeline->tensor_parallel << "-device tensor-parallel group\n";
  }
  out << "FLOPs        " << human_flops(n.flops) << (train ? " per step" : " per run") << "\n";
  if (plan.pipeline) {
    print_pipeline_summary(plan, out);
    if (!plan.producer.empty()) out << "producer     " << plan.producer << "\n";
    return;
  }
  // What the CUDA backend runs as one kernel per chain (the CPU runs every
  // node on its own).
  if (auto order = plan.graph.topological_order(); order.is_ok()) {
    const auto chains = passes::find_elementwise_chains(plan.graph, *order);
    if (!chains.empty()) {
      size_t nodes = 0, longest = 0;
      for (const auto &chain : chains) {
        nodes += chain.size();
        longest = std::max(longest, chain.size());
      }
      out << "fusion       " << chains.size() << " elementwise chain"
          << (chains.size() == 1 ? "" : "s") << " (" << nodes << " nodes, the longest " << longest
          << ") run as one kernel each with --backend cuda\n";
    }
  }
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

std::string format_micros(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", seconds * 1e6);
  return buf;
}

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
  if (dims[0] > 4096 || dims[1] > 4096 || dims[2] > 4096 || dims[0] * dims[1] * dims[2] > 4096)
    return invalid_argument("--mesh '", mesh, "': at most 4096 devices");
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

// The predicted timeline as trace spans (one step).
std::vector<std::vector<plan::TraceSpan>>
simulation_spans(const plan::Simulation &sim) {
  std::vector<std::vector<plan::TraceSpan>> spans(sim.devices.size());
  for (size_t d = 0; d < sim.devices.size(); ++d)
    for (size_t i = 0; i < sim.devices[d].size(); ++i)
      spans[d].push_back(
          {static_cast<uint32_t>(i), sim.devices[d][i].start, sim.devices[d][i].end, 1});
  return spans;
}

// Graphviz: one box per stage (its numbers), one edge per link with the bytes
// it carries per step.
std::string stage_dot(const Plan &plan) {
  std::vector<StageRow> rows = stage_rows(plan);
  std::string text =
      "digraph pipeline {\n  rankdir=LR;\n  node [shape=box, fontname=\"monospace\"];\n";
  for (size_t d = 0; d < rows.size(); ++d) {
    const StageRow &r = rows[d];
    const serialization::PlanPipeline &p = *plan.pipeline;
    text += str_cat(
        "  stage", d, " [label=\"",
        p.chunks > 1 || p.data_parallel > 1 || p.tensor_parallel > 1
            ? str_cat("device ", d, "\\n", plan::device_role(p, static_cast<int64_t>(d)))
            : str_cat("stage ", d),
        "\\n", r.nodes, " nodes\\n", grouped(r.parameters), " parameters\\n", human_flops(r.flops),
        " per step\\npeak ", human_bytes(static_cast<double>(r.arena)), "\\nbusy ",
        format_ms(r.busy), "\"];\n");
  }
  for (size_t d = 0; d < rows.size(); ++d)
    for (const auto &[peer, bytes] : rows[d].sent)
      text +=
          str_cat("  stage", d, " -> stage", peer, " [label=\"", human_bytes(bytes), "/step\"];\n");
  return text + "}\n";
}

} // namespace

Status simulate_command(const SimulateArgs &args, std::ostream &out) {
  ASSIGN_OR_RETURN(Plan plan, serialization::load_plan(args.plan));
  if (!plan.pipeline)
    return invalid_argument(args.plan, ": not a pipeline plan (compile it with --mesh 1x1xP)");
  partitioner::ClusterSpec cluster;
  if (args.cluster.empty()) {
    ASSIGN_OR_RETURN(cluster, partitioner::parse_cluster(plan.pipeline->cluster_json, args.plan));
  } else {
    ASSIGN_OR_RETURN(cluster, partitioner::load_cluster(args.cluster));
  }
  auto sim = partitioner::simulate_plan(plan, cluster);
  if (!sim.is_ok()) return sim.status().with_context(args.plan);
  const serialization::PlanPipeline &p = *plan.pipeline;
  out << "plan       " << args.plan << " (" << counted(p.stages, "stage") << " x "
      << counted(p.microbatches, "micro-batch") << ", " << p.schedule
      << (p.chunks > 1 ? str_cat(", ", p.chunks, " chunks per device") : "") << ")\n";
  out << "cluster    " << cluster.name << (args.cluster.empty() ? " (the plan's own)" : "") << "\n";
  out << "step       " << format_ms(sim->step_time) << " predicted (the plan says "
      << format_ms(p.predicted_step_s) << ")\n";
  out << "bubble     " << format_percent(sim->bubble) << " (" << bubble_formula(p) << ")\n";
  out << "device         busy          idle\n";
  for (size_t d = 0; d < sim->busy.size(); ++d)
    out << pad(std::to_string(d), 6) << pad(format_ms(sim->busy[d]), 14)
        << pad(format_ms(sim->step_time - sim->busy[d]), 14) << "\n";
  if (!args.trace.empty()) {
    RETURN_IF_ERROR(serialization::write_file_atomically(
        args.trace, plan::chrome_trace(plan.graph, plan.programs, simulation_spans(*sim),
                                              p.microbatches, &p)));
    out << "trace      " << args.trace << " (predicted; open in ui.perfetto.dev)\n";
  }
  return Status::ok();
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

Status inspect_plan(const InspectArgs &args, std::ostream &out) {
  ASSIGN_OR_RETURN(Plan plan, serialization::load_plan(args.path));
  if (args.format == "json") {
    ASSIGN_OR_RETURN(std::string text, serialization::plan_to_json(plan));
    out << text;
    return Status::ok();
  }
  if (args.format == "trace" || args.format == "dot") {
    if (!plan.pipeline)
      return invalid_argument("--format ", args.format,
                              " shows a pipeline plan's stages; this plan has one device (compile "
                              "with --mesh 1x1xP)");
    ASSIGN_OR_RETURN(partitioner::ClusterSpec cluster,
                     partitioner::parse_cluster(plan.pipeline->cluster_json, args.path));
    if (args.format == "dot") {
      out << stage_dot(plan);
      return Status::ok();
    }
    ASSIGN_OR_RETURN(plan::Simulation sim, partitioner::simulate_plan(plan, cluster));
    out << plan::chrome_trace(plan.graph, plan.programs, simulation_spans(sim),
                                     plan.pipeline->microbatches, &*plan.pipeline);
    return Status::ok();
  }
  if (args.format != "text")
    return invalid_argument("--format ", args.format,
                            " is for models; a plan prints as text, json, dot or trace");
  if (args.comm && !plan.pipeline)
    return invalid_argument("--comm lists a pipeline plan's transfers; this plan has one device");
  out << "plan         " << args.path << "\n";
  print_plan_summary(plan, out);
  if (args.comm) {
    ASSIGN_OR_RETURN(partitioner::ClusterSpec cluster,
                     partitioner::parse_cluster(plan.pipeline->cluster_json, args.path));
    const auto rows = partitioner::explain_transfers(
        plan.graph, plan.programs, plan.pipeline->groups, partitioner::plan_costs(plan, cluster));
    out << "transfers    " << rows.size() << " (per step; predicted time of one on '"
        << cluster.name << "')\n";
    out << "  from -> to   tensor                          size x count     time each  why\n";
    for (const auto &row : rows) {
      std::string route =
          row.to >= 0 ? str_cat(row.from, " -> ", row.to) : str_cat("group ", row.group);
      std::string tensor = plan.graph.tensor(row.tensor).name;
      if (tensor.size() > 30) tensor = tensor.substr(0, 27) + "...";
      tensor.resize(30, ' ');
      out << "  " << pad(route, 10) << "   " << tensor << pad(human_bytes(row.bytes), 10) << " x "
          << row.count << pad(format_ms(row.seconds), 13) << "  " << row.why << "\n";
    }
  }
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

namespace {

// STRATA_FAULT, for the failure tests: "<kind>:<device>:<step>:<instruction>"
// with kind error|stall|kill|exit|stop (the device does it on reaching that
// instruction of that step), "nostart:<rank>" (that rank never joins) or
// "ckptkill:<rank>:<step>" (SIGKILL once that rank's checkpoint file of that
// step is written, before the commit).
struct EnvFault {
  std::optional<runtime::PipelineRunnerOptions::Fault> fault;
  int nostart_rank = -1;
  int ckpt_kill_rank = -1;
  int64_t ckpt_kill_step = -1;
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
  const std::string usage = str_cat(
      "STRATA_FAULT='", text,
      "': expected <error|stall|kill|exit|stop>:<device>:<step>:<instruction>, nostart:<rank> or "
      "ckptkill:<rank>:<step>");
  if (parts.size() == 2 && parts[0] == "nostart" && number(1) >= 0) {
    result.nostart_rank = static_cast<int>(number(1));
    return result;
  }
  if (parts.size() == 3 && parts[0] == "ckptkill" && number(1) >= 0 && number(2) >= 1) {
    result.ckpt_kill_rank = static_cast<int>(number(1));
    result.ckpt_kill_step = number(2);
    return result;
  }
  using Kind = runtime::PipelineRunnerOptions::Fault::Kind;
  const std::map<std::string, Kind> kinds = {{"error", Kind::kError},
                                             {"stall", Kind::kStall},
                                             {"kill", Kind::kKill},
                                             {"exit", Kind::kExit},
                                             {"stop", Kind::kStop}};
  if (parts.size() != 4 || !kinds.contains(parts[0]) || number(1) < 0 || number(2) < 1 ||
      number(3) < 0)
    return invalid_argument(usage);
  runtime::PipelineRunnerOptions::Fault fault;
  fault.kind = kinds.at(parts[0]);
  fault.device = static_cast<int>(number(1));
  fault.step = number(2);
  fault.instruction = static_cast<size_t>(number(3));
  fault.stall = std::chrono::hours(1);
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

Status train_on(const RunArgs &args, Plan plan, std::ostream &out, bool interactive,
                const std::shared_ptr<runtime::MpiWorld> &world, const EnvFault &fault);

} // namespace

int training_stop_signal() { return stopped_by; }

Status train_command(const RunArgs &args, Plan plan, std::ostream &out, bool interactive) {
  ASSIGN_OR_RETURN(EnvFault env_fault, fault_from_env());
  const auto launch = runtime::detect_mpi_launch();
  if (!launch || launch->size == 1) {
    if (args.devices_per_rank != 1)
      return invalid_argument("--devices-per-rank splits a plan over MPI ranks; start strata with "
                              "an MPI launcher (mpirun -np N strata run ...)");
    return train_on(args, std::move(plan), out, interactive, nullptr, env_fault);
  }
  if (!plan.pipeline)
    return failed_precondition("the launcher started ", launch->size, " ranks but ", args.model,
                               " is a one-device plan; compile it for several devices (--mesh "
                               "DPx1xPP) or run it without mpirun");
  ASSIGN_OR_RETURN(const std::chrono::milliseconds timeout,
                   runtime::timeout_from_seconds(args.timeout_s));
  if (env_fault.nostart_rank == launch->rank) std::this_thread::sleep_for(std::chrono::hours(1));
  runtime::MpiWorldOptions options;
  options.devices_per_rank = args.devices_per_rank;
  options.timeout = timeout;
  ASSIGN_OR_RETURN(std::shared_ptr<runtime::MpiWorld> world,
                   runtime::MpiWorld::create(static_cast<int>(plan.programs.size()), options));
  Status status = world->agree(plan.fingerprint, fs::path(args.model).filename().string());
  if (status.is_ok()) {
    // Rank 0 speaks for the job.
    std::ostream silent(nullptr);
    status = train_on(args, std::move(plan), world->rank() == 0 ? out : silent,
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

namespace {

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
    return str_cat(gpu->device_name(),
                   world ? str_cat(" (rank 0 of ", world->size(),
                                   " processes, NCCL between their GPUs) runs ",
                                   args.devices_per_rank, " of the ", gpu->num_devices())
                   : gpu->num_gpus() > 1
                       ? str_cat(" (NCCL, a host thread each) run ", gpu->num_devices())
                       : str_cat(" runs all ", gpu->num_devices()),
                   " plan devices (two streams each), ",
                   human_bytes(static_cast<double>(gpu->device_bytes())), " allocated once, ",
                   gpu_step_line(args, gpu->fused_chains()));
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

Status train_on(const RunArgs &args, Plan plan, std::ostream &out, bool interactive,
                const std::shared_ptr<runtime::MpiWorld> &world, const EnvFault &fault) {
  if (args.steps < 1) return invalid_argument("--steps must be at least 1");
  const double flops = step_flops(plan);
  if (args.log_every < 1) return invalid_argument("--log-every must be at least 1");
  if (args.checkpoint_every < 0) return invalid_argument("--checkpoint-every must be at least 0");
  if (args.checkpoint_every > 0 && args.checkpoint.empty())
    return invalid_argument("--checkpoint-every needs --checkpoint DIR");

  runtime::RunnerOptions runner_options = run_runner_options(args);
  runner_options.world = world;
  runner_options.fault = fault.fault;
  RETURN_IF_ERROR(runtime::check_runner_options(plan, runner_options));
  ASSIGN_OR_RETURN(runner_options.timeout, runtime::timeout_from_seconds(args.timeout_s));
  // Where the run will write, checked before it trains.
  if (!args.checkpoint.empty()) {
    RETURN_IF_ERROR(serialization::check_folder_writable(args.checkpoint, "--checkpoint"));
    std::error_code error;
    const bool resumes_it =
        !args.resume.empty() && fs::equivalent(args.resume, args.checkpoint, error);
    if (!resumes_it &&
        fs::exists(fs::path(args.checkpoint) / serialization::kCheckpointManifestFile, error))
      return failed_precondition("--checkpoint ", args.checkpoint,
                                 " already holds a checkpoint, which this run would "
                                 "replace; continue it with --resume ",
                                 args.checkpoint, ", or save to another folder");
  }
  if (!args.trace.empty())
    RETURN_IF_ERROR(serialization::check_file_writable(
        per_rank_path(args.trace, world ? world->rank() : 0), "--trace"));
  // A pipeline step takes microbatches x replicas micro-batches of the graph's batch.
  const int64_t microbatches =
      plan.pipeline ? int64_t{plan.pipeline->microbatches} * plan.pipeline->data_parallel : 1;
  runtime::Dataset data;
  if (!args.data.empty()) {
    ASSIGN_OR_RETURN(data, runtime::load_dataset(plan.graph, args.data, microbatches));
  } else {
    data = runtime::synthetic_dataset(plan.graph, args.seed, 8, microbatches);
  }
  runtime::TrainerOptions options;
  options.fingerprint = plan.fingerprint;
  if (fault.ckpt_kill_rank == (world ? world->rank() : 0)) {
    const int64_t at = fault.ckpt_kill_step;
    options.checkpoint_file_written = [at](int64_t step) {
      if (step == at) raise(SIGKILL);
    };
  }
  std::string model_name = plan.graph.name();
  ASSIGN_OR_RETURN(std::unique_ptr<runtime::StepRunner> runner,
                   runtime::make_runner(plan, runner_options));
  // What only one kind of runner knows: a CPU pipeline's trace and device
  // clock, a GPU's name and memory.
  auto *pipeline = dynamic_cast<runtime::PipelineRunner *>(runner.get());
  runtime::StepRunner *timed = runner.get(); // --op-times, once the trainer owns it
  const std::string gpu_line = gpu_summary(args, *runner, world.get());
  auto created = runtime::Trainer::create(std::move(runner), plan.loss, std::move(data), options);
  if (!created.is_ok()) return created.status().with_context(args.model);
  runtime::Trainer &trainer = **created;

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
        << ", "
        << (world ? str_cat(world->size(), " MPI ranks x ", args.devices_per_rank, " CPU thread",
                            args.devices_per_rank == 1 ? "" : "s", " (devices)")
            : args.backend == "cuda" ? std::string("on one GPU")
                                     : std::string("one CPU thread per device"))
        << "\n";
  if (!gpu_line.empty()) out << "gpu        " << gpu_line << "\n";
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
  // The trace of a failed run is the most useful one: write what was recorded.
  auto write_trace = [&]() -> Status {
    if (pipeline == nullptr || args.trace.empty()) return Status::ok();
    return serialization::write_file_atomically(
        per_rank_path(args.trace, world ? world->rank() : 0), pipeline->trace_json());
  };
  // Each step's time, and on a GPU the host's time issuing it, from the
  // third step on (the first loads the kernels, on a GPU the second is
  // captured): the steady state.
  std::vector<double> step_seconds, issue_seconds, device_seconds;
  // Under an MPI launcher every rank would have to stop at the same step;
  // there the MPI world's own handlers (runtime/mpi_world.cc) end the job.
  std::optional<StopOnSignal> stop_on_signal;
  if (!world) stop_on_signal.emplace();
  out << std::flush; // the header, before a first step that may take long
  while (trainer.step() < args.steps) {
    const auto step_start = std::chrono::steady_clock::now();
    auto stepped = trainer.train_step();
    if (stepped.is_ok() && trainer.step() > first_step + 2) {
      step_seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count());
      if (trainer.runner().issue_seconds() >= 0)
        issue_seconds.push_back(trainer.runner().issue_seconds());
      if (pipeline != nullptr && args.clock == "device")
        device_seconds.push_back(pipeline->device_step_seconds());
    }
    if (!stepped.is_ok()) {
      if (write_trace().is_ok() && pipeline != nullptr && !args.trace.empty())
        return stepped.status().with_context(str_cat("trace of the failed run: ", args.trace));
      return stepped.status();
    }
    const double loss = *stepped;
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
  // A signal from here on has its default action again. One that came after
  // the last step's check still ends the process by it.
  stop_on_signal.reset();
  if (const int signal_number = stop_requested.load(); signal_number != 0) {
    stopped_by = signal_number;
    if (pipeline != nullptr && !args.trace.empty()) {
      RETURN_IF_ERROR(write_trace());
      out << "trace      " << args.trace << " (up to the stop)\n" << std::flush;
    }
    const int64_t step = trainer.step();
    return failed_precondition("stopped by ", signal_number == SIGINT ? "SIGINT" : "SIGTERM",
                               " after step ", step, " of ", args.steps, "; ",
                               step == args.steps ? std::string("the run is complete")
                               : args.checkpoint.empty()
                                   ? std::string("nothing was saved (--checkpoint DIR saves the "
                                                 "state when stopped)")
                                   : str_cat("continue with --resume ", args.checkpoint));
  }
  double elapsed = seconds();
  int64_t ran = trainer.step() - first_step;
  if (pipeline != nullptr && !args.trace.empty()) {
    RETURN_IF_ERROR(write_trace());
    out << "trace      " << args.trace << " (" << ran << " step" << (ran == 1 ? "" : "s")
        << "; open in ui.perfetto.dev or chrome://tracing)\n";
  }
  out << "done       " << ran << " step" << (ran == 1 ? "" : "s") << " in "
      << format_seconds(elapsed) << " s (" << format_rate(static_cast<double>(ran), elapsed)
      << " steps/s); loss " << format_loss(first_loss) << " -> " << format_loss(last_loss) << "\n";
  if (ran > 0 && elapsed > 0)
    out << "compute    " << human_flops(flops) << " per step, "
        << human_flops(flops * static_cast<double>(ran) / elapsed) << "/s\n";
  auto median = [](std::vector<double> values) {
    std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
    return values[values.size() / 2];
  };
  const size_t n = step_seconds.size();
  const std::string last_steps = str_cat("median of the last ", n, " step", n == 1 ? "" : "s");
  if (n > 0)
    out << "steady     " << format_ms(median(step_seconds)) << " per step (" << last_steps << ")\n";
  if (device_seconds.empty() && args.clock == "device" && pipeline != nullptr)
    out << "device     no step time: the device clock's is the median from the third step on "
           "(run 3 or more steps)\n";
  if (!device_seconds.empty())
    out << "device     " << format_ms(median(device_seconds))
        << " per step on a core per device (the device clock"
        << (args.trace.empty() ? "" : ", which the trace uses too") << "; " << last_steps << ")\n";
  if (!issue_seconds.empty())
    out << "host       " << format_micros(median(issue_seconds)) << " us per step to issue it ("
        << last_steps << ": the batch copied in, "
        << (args.cuda_graph ? "the captured step replayed" : "every kernel launched") << ")\n";
  if (args.op_times)
    RETURN_IF_ERROR(
        print_op_times(*timed, runtime::random_inputs(timed->graph(), args.seed), out));
  return Status::ok();
}

} // namespace

} // namespace strata::tools
