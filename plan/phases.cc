#include "plan/phases.h"

#include "ops/registry.h"

namespace strata::plan {

Result<StepPhases> analyze_phases(const Graph &graph, int microbatches) {
  ASSIGN_OR_RETURN(std::vector<NodeId> order, graph.topological_order());
  const size_t num_nodes = graph.num_nodes();
  std::vector<NodeId> producer(graph.num_tensors(), kNoNode);
  for (NodeId id = 0; id < num_nodes; ++id)
    for (TensorId out : graph.node(id).outputs)
      producer[out] = id;
  std::vector<bool> is_input(graph.num_tensors(), false);
  for (TensorId id : graph.inputs())
    is_input[id] = true;

  // Data dependence and step work, forwards.
  std::vector<bool> data(num_nodes, false), step(num_nodes, false);
  for (NodeId id : order) {
    const Node &node = graph.node(id);
    const ops::OpDef *def = ops::OpRegistry::global().find(node.op);
    step[id] = def != nullptr && def->once_per_step;
    for (TensorId in : node.inputs) {
      if (is_input[in]) data[id] = true;
      if (producer[in] == kNoNode) continue;
      if (data[producer[in]]) data[id] = true;
      if (step[producer[in]]) step[id] = true;
    }
  }
  // Per micro-batch: data-dependent work that is not step work, and whatever
  // data-free work it reads (constants), decided backwards.
  std::vector<bool> per_mb(num_nodes, false);
  const auto consumers = graph.consumers();
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const NodeId id = *it;
    if (step[id]) continue;
    if (data[id]) {
      per_mb[id] = true;
      continue;
    }
    for (TensorId out : graph.node(id).outputs)
      for (NodeId user : consumers[out])
        if (per_mb[user]) per_mb[id] = true;
  }
  // Forward: per-micro-batch ancestors of the graph outputs (the loss).
  std::vector<bool> forward(num_nodes, false);
  for (TensorId out : graph.outputs())
    if (producer[out] != kNoNode) forward[producer[out]] = true;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    if (!forward[*it] || !per_mb[*it]) continue;
    for (TensorId in : graph.node(*it).inputs)
      if (producer[in] != kNoNode) forward[producer[in]] = true;
  }

  StepPhases phases;
  phases.node_phase.assign(num_nodes, Phase::kStep);
  for (NodeId id = 0; id < num_nodes; ++id)
    if (per_mb[id]) phases.node_phase[id] = forward[id] ? Phase::kForward : Phase::kBackward;

  std::vector<bool> accumulated(graph.num_tensors(), false);
  for (NodeId id = 0; id < num_nodes; ++id) {
    const Node &node = graph.node(id);
    for (TensorId in : node.inputs) {
      if (producer[in] == kNoNode) continue;
      const bool source_mb = per_mb[producer[in]];
      if (per_mb[id] && !source_mb)
        return invalid_argument("node '", node.name, "' (", node.op,
                                ") runs per micro-batch but reads '", graph.tensor(in).name,
                                "', which is computed once per step");
      if (!per_mb[id] && source_mb) accumulated[in] = true;
    }
  }
  for (TensorId out : graph.outputs())
    if (producer[out] != kNoNode && per_mb[producer[out]]) accumulated[out] = true;
  for (const StateUpdate &update : graph.updates()) {
    if (producer[update.value] == kNoNode || !per_mb[producer[update.value]]) continue;
    if (microbatches > 1)
      return invalid_argument(
          "the new value of '", graph.tensor(update.target).name, "' ('",
          graph.tensor(update.value).name,
          "') is computed from each micro-batch (batch statistics); with ", microbatches,
          " micro-batches it would not be the full batch's. Use --microbatches 1");
    accumulated[update.value] = true;
  }
  for (TensorId id = 0; id < graph.num_tensors(); ++id) {
    if (!accumulated[id]) continue;
    if (microbatches > 1 && graph.tensor(id).type.dtype != DType::kF32)
      return invalid_argument("'", graph.tensor(id).name, "' (", graph.tensor(id).type.to_string(),
                              ") is computed per micro-batch and read once per step, but only "
                              "f32 tensors are averaged over micro-batches so far");
    phases.accumulated.push_back(id);
  }
  return phases;
}

std::vector<NodeId> split_weight_half(const Graph &graph, std::vector<NodeId> &backward,
                                      const std::function<bool(TensorId)> &sent) {
  std::vector<char> in_block(graph.num_nodes(), 0), needed(graph.num_nodes(), 0);
  for (NodeId id : backward)
    in_block[id] = 1;
  // In reverse order: a node is needed if it sends, or a needed node reads it.
  for (auto it = backward.rbegin(); it != backward.rend(); ++it) {
    const Node &node = graph.node(*it);
    for (TensorId out : node.outputs)
      if (sent(out)) needed[*it] = 1;
    if (!needed[*it]) continue;
    for (TensorId in : node.inputs) {
      const NodeId producer = graph.tensor(in).producer;
      if (producer != kNoNode && in_block[producer]) needed[producer] = 1;
    }
  }
  std::vector<NodeId> input_half, weight_half;
  for (NodeId id : backward)
    (needed[id] ? input_half : weight_half).push_back(id);
  if (input_half.empty()) return {};
  backward = std::move(input_half);
  return weight_half;
}

} // namespace strata::plan
