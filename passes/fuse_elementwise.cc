#include "passes/fuse_elementwise.h"

#include <set>

#include "ops/registry.h"

namespace strata::passes {

bool fusable_elementwise(const Graph &graph, const Node &node) {
  const ops::OpDef *def = ops::OpRegistry::global().find(node.op);
  if (def == nullptr || def->traits.elementwise != ops::Elementwise::kFusable) return false;
  if (node.outputs.size() != 1 || node.inputs.empty() || node.inputs.size() > 2) return false;
  const TensorType &out = graph.tensor(node.outputs[0]).type;
  if (out.dtype != DType::kF32) return false;
  if (out.rank() > 8) return false; // the kernels' kMaxDims
  for (TensorId id : node.inputs) {
    const TensorType &in = graph.tensor(id).type;
    if (in.dtype != DType::kF32 || in.rank() > out.rank()) return false;
    // Broadcast to the output (NumPy rules, aligned right).
    for (int64_t d = 1; d <= in.rank(); ++d) {
      const int64_t have = in.shape[static_cast<size_t>(in.rank() - d)];
      if (have != 1 && have != out.shape[static_cast<size_t>(out.rank() - d)]) return false;
    }
  }
  return true;
}

std::vector<std::vector<NodeId>> find_elementwise_chains(const Graph &graph,
                                                         const std::vector<NodeId> &order,
                                                         int max_nodes, int max_operands) {
  // Readers of every tensor (a node reading one tensor twice counts once),
  // and the tensors something outside the nodes reads.
  std::vector<std::vector<NodeId>> readers(graph.num_tensors());
  for (NodeId n = 0; n < graph.num_nodes(); ++n)
    for (TensorId id : graph.node(n).inputs)
      if (readers[id].empty() || readers[id].back() != n) readers[id].push_back(n);
  std::vector<bool> kept(graph.num_tensors(), false);
  for (TensorId id : graph.outputs())
    kept[id] = true;
  for (const StateUpdate &update : graph.updates())
    kept[update.value] = true;

  // The node a fusable node hands its output to, if it may: its only reader,
  // fusable, of the same shape.
  auto next_of = [&](const Node &node) -> NodeId {
    const TensorId out = node.outputs[0];
    if (kept[out] || readers[out].size() != 1) return kNoNode;
    const NodeId next = readers[out][0];
    if (!fusable_elementwise(graph, graph.node(next))) return kNoNode;
    if (!(graph.tensor(graph.node(next).outputs[0]).type.shape == graph.tensor(out).type.shape))
      return kNoNode;
    return next;
  };
  std::vector<bool> used(graph.num_nodes(), false);
  std::vector<std::vector<NodeId>> chains;
  for (NodeId start : order) {
    const Node &first = graph.node(start);
    if (used[start] || !fusable_elementwise(graph, first)) continue;
    std::vector<NodeId> chain = {start};
    std::set<TensorId> operands(first.inputs.begin(), first.inputs.end());
    for (NodeId next = next_of(first); next != kNoNode && !used[next];
         next = next_of(graph.node(next))) {
      if (static_cast<int>(chain.size()) >= max_nodes) break;
      std::set<TensorId> with = operands;
      for (TensorId id : graph.node(next).inputs)
        if (id != graph.node(chain.back()).outputs[0]) with.insert(id);
      if (static_cast<int>(with.size()) > max_operands) break;
      operands = std::move(with);
      chain.push_back(next);
    }
    if (chain.size() < 2) continue;
    for (NodeId id : chain)
      used[id] = true;
    chains.push_back(std::move(chain));
  }
  return chains;
}

} // namespace strata::passes
