// `strata inspect`: what a model is and what it costs, as text, JSON or DOT;
// what a plan holds, its pipeline's stages and transfers, and its predicted
// schedule.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "graph/printer.h"
#include "partitioner/compile_pipeline.h"
#include "partitioner/cost/cluster.h"
#include "passes/plan_memory.h"
#include "plan/instructions.h"
#include "plan/trace.h"
#include "serialization/file_io.h"
#include "serialization/plan_io.h"
#include "tools/cli.h"
#include "tools/inspect_checkpoint.h"
#include "tools/inspect_json.h"
#include "tools/model_stats.h"
#include "tools/plan_text.h"

namespace strata::tools {
namespace {

using serialization::Plan;

struct InspectArgs {
  std::string path;
  std::string format = "text"; // text, json, report or dot; plans also trace
  int64_t max_nodes = 25;      // rows of the per-node table in text form
  bool all_nodes = false;
  bool comm = false; // pipeline plans: list every transfer and why it is there
};

// A plain text table: columns sized to their widest cell, numbers right-aligned.
class Table {
public:
  Table(std::vector<std::string> header, std::vector<bool> right_aligned)
      : right_(std::move(right_aligned)) {
    rows_.push_back(std::move(header));
  }
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }

  void print(std::ostream &out, const std::string &indent = "  ") const {
    std::vector<size_t> width(rows_[0].size(), 0);
    for (const auto &row : rows_)
      for (size_t c = 0; c < row.size(); ++c)
        width[c] = std::max(width[c], row[c].size());
    for (const auto &row : rows_) {
      std::string line = indent;
      for (size_t c = 0; c < row.size(); ++c) {
        size_t pad = width[c] - row[c].size();
        bool last = c + 1 == row.size();
        if (right_[c])
          line += std::string(pad, ' ') + row[c];
        else
          line += row[c] + (last ? "" : std::string(pad, ' '));
        if (!last) line += "  ";
      }
      while (!line.empty() && line.back() == ' ')
        line.pop_back();
      out << line << '\n';
    }
  }

private:
  std::vector<std::vector<std::string>> rows_;
  std::vector<bool> right_;
};

std::string percent(double part, double whole) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", whole > 0 ? 100.0 * part / whole : 0.0);
  return buf;
}

std::string flops_cell(double flops) {
  if (flops == 0) return "0";
  return human_flops(flops);
}

std::string tensor_text(const Graph &graph, TensorId id) {
  const Tensor &t = graph.tensor(id);
  return t.name + ": " + t.type.to_string();
}

std::string node_outputs_text(const Graph &graph, const Node &node) {
  // Several outputs of one type (Split) read best as "3 x f32[...]".
  bool same = !node.outputs.empty();
  for (TensorId id : node.outputs)
    same = same && graph.tensor(id).type == graph.tensor(node.outputs[0]).type;
  if (same && node.outputs.size() > 1)
    return str_cat(node.outputs.size(), " x ", graph.tensor(node.outputs[0]).type.to_string());
  std::string text;
  for (TensorId id : node.outputs) {
    if (!text.empty()) text += ", ";
    text += graph.tensor(id).type.to_string();
  }
  return text;
}

void print_text(const std::string &path, const Graph &graph, const ModelStats &stats,
                const std::optional<passes::MemoryPlan> &plan, const InspectArgs &args,
                std::ostream &out) {
  auto field = [&](const char *label, const std::string &value) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%-12s", label);
    out << buf << value << '\n';
  };
  field("model", graph.name().empty() ? "(unnamed)" : graph.name());
  field("file", path);
  for (TensorId id : graph.inputs())
    field("input", tensor_text(graph, id));
  for (TensorId id : graph.outputs())
    field("output", tensor_text(graph, id));
  size_t num_params = 0, num_consts = 0;
  for (const Tensor &t : graph.tensors()) {
    num_params += t.kind == TensorKind::kParameter;
    num_consts += t.kind == TensorKind::kConstant;
  }
  std::string count = grouped(stats.parameters);
  if (stats.parameters >= 1000)
    count += " (" + human_count(static_cast<double>(stats.parameters)) + ")";
  field("parameters", str_cat(count, " in ", num_params, " tensors, ",
                              human_bytes(static_cast<double>(stats.parameter_bytes))));
  if (num_consts > 0)
    field("constants", str_cat(num_consts, " tensors, ",
                               human_bytes(static_cast<double>(stats.constant_bytes))));
  field("nodes", str_cat(graph.num_nodes(), " (", stats.ops.size(), " op types), ",
                         graph.num_tensors(), " tensors"));
  field("FLOPs", str_cat(grouped(static_cast<int64_t>(stats.flops)), " per forward (",
                         human_flops(stats.flops), ")"));
  field("traffic", str_cat(human_bytes(stats.bytes),
                           " read+written per forward (every node once, no fusion)"));
  if (plan)
    field("activations",
          str_cat(human_bytes(static_cast<double>(plan->arena_bytes)), " planned arena (",
                  human_bytes(static_cast<double>(plan->naive_bytes)), " without reuse)"));

  out << "\nper op type\n";
  Table ops({"op", "count", "FLOPs", "share"}, {false, true, true, true});
  for (const OpTypeStats &op : stats.ops)
    ops.add(
        {op.op, std::to_string(op.count), flops_cell(op.flops), percent(op.flops, stats.flops)});
  ops.print(out);

  size_t shown = stats.nodes.size();
  if (!args.all_nodes && args.max_nodes >= 0)
    shown = std::min(shown, static_cast<size_t>(args.max_nodes));
  out << "\nper node (topological order)\n";
  Table nodes({"node", "op", "output", "FLOPs", "share"}, {false, false, false, true, true});
  for (size_t i = 0; i < shown; ++i) {
    const NodeStats &ns = stats.nodes[i];
    const Node &node = graph.node(ns.node);
    nodes.add({node.name, node.op, node_outputs_text(graph, node), flops_cell(ns.flops),
               percent(ns.flops, stats.flops)});
  }
  nodes.print(out);
  if (shown < stats.nodes.size())
    out << "  ... " << stats.nodes.size() - shown
        << " more nodes (--all lists every node, --nodes N the first N)\n";
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
    text +=
        str_cat("  stage", d, " [label=\"",
                p.chunks > 1 || p.data_parallel > 1 || p.tensor_parallel > 1
                    ? str_cat("device ", d, "\\n", plan::device_role(p, static_cast<int64_t>(d)))
                    : str_cat("stage ", d),
                "\\n", r.nodes, " nodes\\n", grouped(r.parameters), " parameters\\n",
                human_flops(r.flops), " per step\\npeak ",
                human_bytes(static_cast<double>(r.arena)), "\\nbusy ", format_ms(r.busy), "\"];\n");
  }
  for (size_t d = 0; d < rows.size(); ++d)
    for (const auto &[peer, bytes] : rows[d].sent)
      text +=
          str_cat("  stage", d, " -> stage", peer, " [label=\"", human_bytes(bytes), "/step\"];\n");
  return text + "}\n";
}

Status inspect_plan(const InspectArgs &args, std::ostream &out) {
  ASSIGN_OR_RETURN(Plan plan, load_plan_file(args.path));
  if (args.format == "json") {
    ASSIGN_OR_RETURN(std::string text, serialization::plan_to_json(plan));
    out << text;
    return Status::ok();
  }
  if (args.format == "report") {
    ASSIGN_OR_RETURN(nlohmann::ordered_json report, plan_report(plan, args.path));
    out << report.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << '\n';
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
                            " is for models; a plan prints as text, json, report, dot or trace");
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
      const std::string algorithm = group_algorithm(*plan.pipeline, row.group, row.gather);
      out << "  " << pad(route, 10) << "   " << tensor << pad(human_bytes(row.bytes), 10) << " x "
          << row.count << pad(format_ms(row.seconds), 13) << "  " << row.why
          << (algorithm.empty() ? "" : str_cat("; ", algorithm)) << "\n";
    }
  }
  return Status::ok();
}

// A checkpoint folder: text or json (the report); the other forms are a
// model's or a plan's.
Status inspect_checkpoint(const InspectArgs &args, std::ostream &out) {
  if (args.format != "text" && args.format != "json")
    return invalid_argument("--format ", args.format, " is for models and plans; '", args.path,
                            "' is a checkpoint folder (use text or json)");
  if (args.comm)
    return invalid_argument("--comm lists a pipeline plan's transfers; '", args.path,
                            "' is a checkpoint folder");
  ASSIGN_OR_RETURN(nlohmann::ordered_json report, checkpoint_report(args.path));
  if (args.format == "json") {
    out << report.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << '\n';
    return Status::ok();
  }
  print_checkpoint_text(report, args.all_nodes ? -1 : args.max_nodes, out);
  return Status::ok();
}

Status inspect_command(const InspectArgs &args, std::ostream &out) {
  if (args.format != "text" && args.format != "json" && args.format != "report" &&
      args.format != "dot" && args.format != "trace")
    return invalid_argument("unknown --format '", args.format,
                            "' (use text, json, report, dot, or trace for a pipeline plan)");
  if (args.comm && args.format != "text")
    return invalid_argument("--comm adds to the text report; drop --format ", args.format);
  if (std::error_code error; std::filesystem::is_directory(args.path, error))
    return inspect_checkpoint(args, out);
  if (serialization::file_is_plan(args.path)) return inspect_plan(args, out);
  if (args.comm)
    return invalid_argument("--comm lists a pipeline plan's transfers; '", args.path,
                            "' is a model");
  if (args.format == "trace")
    return invalid_argument("--format trace shows a pipeline plan's predicted schedule; '",
                            args.path, "' is a model");
  ASSIGN_OR_RETURN(Graph graph, load_model_file(args.path));
  if (args.format == "dot") {
    out << graph_to_dot(graph);
    return Status::ok();
  }
  auto stats = compute_model_stats(graph);
  if (!stats.is_ok()) return stats.status().with_context(args.path);
  std::optional<passes::MemoryPlan> plan = plan_activations(graph);
  if (args.format == "json" || args.format == "report") {
    // Names are UTF-8 (the loader checks them); the path is whatever the
    // command line held, so bytes that are not UTF-8 print as U+FFFD.
    out << model_json(args.path, graph, *stats, plan)
               .dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace)
        << '\n';
    return Status::ok();
  }
  print_text(args.path, graph, *stats, plan, args, out);
  return Status::ok();
}

} // namespace

void add_inspect(CLI::App &app, Action &action) {
  static InspectArgs args;
  static std::string out_path;
  CLI::App *sub = app.add_subcommand(
      "inspect", "Show a model (inputs, outputs, parameters, FLOPs per forward, per-op and "
                 "per-node costs), a plan, or a checkpoint folder");
  sub->add_option("FILE", args.path,
                  "model (.strata, .json), plan (.splan, .splan.json) or checkpoint folder")
      ->required();
  sub->add_option("--format", args.format,
                  "text (for people), json (for scripts: a model's report, a plan's own JSON "
                  "form), report (the text report's facts as JSON; for a plan its stages, "
                  "memory, predicted times and every transfer, as Python's Plan.inspect() "
                  "gives them) or dot (Graphviz); for a pipeline plan also trace (the "
                  "predicted schedule as a Chrome / Perfetto trace)")
      ->check(CLI::IsMember({"text", "json", "report", "dot", "trace"}))
      ->capture_default_str();
  CLI::Option *all = sub->add_flag("--all", args.all_nodes, "list every node in the text form");
  sub->add_flag("--comm", args.comm,
                "pipeline plan: list every send, receive and all-reduce per step, its size, "
                "predicted time and why it is there");
  sub->add_option("--nodes", args.max_nodes, "rows of the per-node table in the text form")
      ->check(at_least(0))
      ->excludes(all)
      ->capture_default_str();
  sub->add_option("-o,--output", out_path,
                  "write to this file instead of stdout (- or /dev/stdout: stdout)")
      ->check(not_empty_path("a file, or - for stdout"))
      ->type_name("FILE");
  sub->footer(
      "FLOPs come from the op registry's cost model (a multiply-add counts 2).\n\n"
      "Examples:\n  strata inspect gpt.strata\n"
      "  strata inspect gpt.strata --format json | jq .flops\n"
      "  strata inspect gpt.strata --format dot -o gpt.dot && dot -Tsvg gpt.dot > gpt.svg\n"
      "  strata inspect train.splan               # mode, fingerprint, options, memory\n"
      "  strata inspect train.splan --format json # the plan's JSON form\n"
      "  strata inspect pp.splan --format report | jq .transfers  # facts as JSON\n"
      "  strata inspect pp.splan --format trace -o predicted.json  # pipeline schedule\n"
      "  strata inspect ckpt/                     # step, layout, model, optimizer, tensors");
  sub->callback([&action] {
    action = []() -> Status {
      // "-" and /dev/stdout are stdout, where earlier output keeps its place.
      if (out_path.empty() || out_path == "-" || out_path == "/dev/stdout")
        return inspect_command(args, std::cout);
      RETURN_IF_ERROR(serialization::check_not_input(out_path, args.path));
      std::ostringstream text;
      RETURN_IF_ERROR(inspect_command(args, text));
      return serialization::write_file_atomically(out_path, std::move(text).str());
    };
  });
}

} // namespace strata::tools
