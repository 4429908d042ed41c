#include "tools/plan_text.h"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <set>

#include "ops/registry.h"
#include "partitioner/cost/cluster.h"
#include "passes/fuse_elementwise.h"
#include "passes/recompute.h"
#include "plan/instructions.h"
#include "tools/model_stats.h"

namespace strata::tools {
namespace {

using serialization::Plan;

std::string tensor_list(const Graph &graph, llvm::ArrayRef<TensorId> ids) {
  std::string text;
  for (TensorId id : ids)
    text += str_cat(text.empty() ? "" : ", ", graph.tensor(id).name, " ",
                    graph.tensor(id).type.to_string());
  return text.empty() ? "(none)" : text;
}

// How the data-parallel groups reduce: " (ring)" when every group that names
// an algorithm names the same one, else each algorithm with its groups,
// " (recursive-doubling: groups 0, 2; rabenseifner: group 1)"; "" for none.
// Whether a ZeRO-3 plan starts its gathers on the communication stream.
bool prefetches(const Plan &plan) {
  for (const auto &program : plan.programs)
    for (const auto &instr : program.instructions)
      if (instr.kind == serialization::InstrKind::kStartGather) return true;
  return false;
}

std::string algorithms_note(const serialization::PlanPipeline &p) {
  std::vector<std::pair<std::string, std::vector<size_t>>> by_name;
  for (size_t g = 0; g < p.group_algorithms.size(); ++g) {
    const std::string &name = p.group_algorithms[g];
    if (name.empty()) continue;
    auto it = std::find_if(by_name.begin(), by_name.end(),
                           [&](const auto &entry) { return entry.first == name; });
    if (it == by_name.end()) {
      by_name.emplace_back(name, std::vector<size_t>{});
      it = std::prev(by_name.end());
    }
    it->second.push_back(g);
  }
  if (by_name.empty()) return "";
  if (by_name.size() == 1) return str_cat(" (", by_name.front().first, ")");
  std::string text;
  for (const auto &[name, indices] : by_name) {
    text +=
        str_cat(text.empty() ? " (" : "; ", name, indices.size() == 1 ? ": group " : ": groups ");
    for (size_t k = 0; k < indices.size(); ++k)
      text += str_cat(k ? ", " : "", indices[k]);
  }
  return text + ")";
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
        << (p.zero == 3
                ? str_cat("reduce-scattered every micro-batch; parameters, gradients "
                          "and optimizer state sharded (ZeRO-3); each layer's parameters ",
                          prefetches(plan) ? "gathered on the communication stream one batch ahead "
                                             "of use"
                                           : "gathered right before use")
            : p.zero == 2 ? "reduce-scattered every micro-batch and kept as shards (ZeRO-2), "
                            "optimizer state sharded too"
            : p.zero == 1 ? "reduce-scattered, optimizer state sharded (ZeRO-1)"
                          : "all-reduced per stage")
        << algorithms_note(p) << "\n";
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

} // namespace

std::string group_algorithm(const serialization::PlanPipeline &p, int64_t group, bool gather) {
  if (group < 0 || static_cast<size_t>(group) >= p.group_algorithms.size()) return "";
  const std::string &name = p.group_algorithms[static_cast<size_t>(group)];
  return gather && !name.empty() ? "ring" : name;
}

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

std::string counted(int64_t n, std::string_view noun) {
  return str_cat(n, " ", noun, n == 1 ? "" : noun.ends_with("h") ? "es" : "s");
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

size_t recomputed_nodes(const Graph &graph) {
  return static_cast<size_t>(
      std::count_if(graph.nodes().begin(), graph.nodes().end(),
                    [](const Node &n) { return n.name.ends_with(passes::kRecomputeSuffix); }));
}

std::string bubble_formula(const serialization::PlanPipeline &p) {
  if (p.schedule == "zb-h1") {
    // Qi et al. 2024: (p-1)(F+B-W) idle per m(F+B+W) of work, with p-1 or
    // more micro-batches whose W can be put off; with fewer, m of them.
    const double m = p.microbatches, idle = 3.0 * (p.stages - 1) - 2 * std::min(m, p.stages - 1.0);
    return str_cat(m >= p.stages - 1 ? "(p-1)/(3m+p-1) = " : "ideal ",
                   format_percent(idle / (3 * m + idle)), " with F = B = W");
  }
  const double formula =
      (p.stages - 1.0) / (static_cast<double>(p.chunks) * p.microbatches + p.stages - 1.0);
  return str_cat(p.chunks > 1 ? "(p-1)/(vm+p-1) = " : "(p-1)/(m+p-1) = ", format_percent(formula));
}

std::vector<std::vector<plan::TraceSpan>> simulation_spans(const plan::Simulation &sim) {
  std::vector<std::vector<plan::TraceSpan>> spans(sim.devices.size());
  for (size_t d = 0; d < sim.devices.size(); ++d)
    for (size_t i = 0; i < sim.devices[d].size(); ++i)
      spans[d].push_back(
          {static_cast<uint32_t>(i), sim.devices[d][i].start, sim.devices[d][i].end, 1});
  return spans;
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

} // namespace strata::tools
