#include "tools/model_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

namespace strata::tools {

double node_flops(const Graph &graph, NodeId id, const ops::OpRegistry &registry) {
  return registry.node_cost(graph, id).flops;
}

Result<ModelStats> compute_model_stats(const Graph &graph, const ops::OpRegistry &registry) {
  ModelStats stats;
  for (const Tensor &t : graph.tensors()) {
    if (t.kind == TensorKind::kParameter) {
      stats.parameters += t.type.num_elements();
      stats.parameter_bytes += t.type.size_bytes();
    } else if (t.kind == TensorKind::kConstant) {
      stats.constant_bytes += t.type.size_bytes();
    }
  }
  ASSIGN_OR_RETURN(std::vector<NodeId> order, graph.topological_order());
  std::map<std::string, OpTypeStats> by_op;
  for (NodeId id : order) {
    const Node &node = graph.node(id);
    ops::OpCost cost = registry.node_cost(graph, id);
    NodeStats ns{id, cost.flops, cost.bytes_read + cost.bytes_written};
    stats.nodes.push_back(ns);
    stats.flops += ns.flops;
    stats.bytes += ns.bytes;
    OpTypeStats &op = by_op[node.op];
    op.op = node.op;
    op.count += 1;
    op.flops += ns.flops;
  }
  for (auto &[name, op] : by_op)
    stats.ops.push_back(op);
  std::stable_sort(stats.ops.begin(), stats.ops.end(),
                   [](const OpTypeStats &a, const OpTypeStats &b) { return a.flops > b.flops; });
  return stats;
}

std::vector<OpTime> op_times(const Graph &graph, const std::vector<double> &node_ms) {
  std::map<std::string, OpTime> by_op;
  for (NodeId n = 0; n < graph.num_nodes() && n < node_ms.size(); ++n) {
    if (!(node_ms[n] > 0)) continue;
    OpTime &row = by_op[graph.node(n).op];
    row.op = graph.node(n).op;
    ++row.nodes;
    row.ms += node_ms[n];
  }
  std::vector<OpTime> rows;
  for (auto &[op, row] : by_op)
    rows.push_back(std::move(row));
  std::stable_sort(rows.begin(), rows.end(),
                   [](const OpTime &a, const OpTime &b) { return a.ms > b.ms; });
  return rows;
}

std::string grouped(int64_t value) {
  std::string digits = std::to_string(value < 0 ? -value : value);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return value < 0 ? "-" + out : out;
}

} // namespace strata::tools
