#include "passes/recompute.h"

#include <algorithm>
#include <functional>

#include "graph/builder.h"
#include "graph/verifier.h"
#include "ops/registry.h"

namespace strata::passes {

std::vector<bool> forward_part(const Graph &training) {
  std::vector<bool> forward(training.num_nodes(), false);
  std::vector<TensorId> stack(training.outputs().begin(), training.outputs().end());
  std::vector<bool> seen(training.num_tensors(), false);
  while (!stack.empty()) {
    const TensorId t = stack.back();
    stack.pop_back();
    if (seen[t]) continue;
    seen[t] = true;
    const NodeId p = training.tensor(t).producer;
    if (p == kNoNode || forward[p]) continue;
    forward[p] = true;
    for (TensorId in : training.node(p).inputs)
      stack.push_back(in);
  }
  return forward;
}

Result<Graph> recompute_activations(const Graph &training, RecomputeStats *stats,
                                    const std::vector<bool> *also_keep) {
  if (training.outputs().empty())
    return invalid_argument("recomputation: the training graph '", training.name(),
                            "' has no loss output");
  const ops::OpRegistry &registry = ops::OpRegistry::global();
  ASSIGN_OR_RETURN(std::vector<NodeId> order, training.topological_order());

  const std::vector<bool> forward = forward_part(training);
  std::vector<NodeId> fwd;
  std::vector<size_t> position(training.num_nodes(), SIZE_MAX);
  for (NodeId id : order)
    if (forward[id]) {
      position[id] = fwd.size();
      fwd.push_back(id);
    }
  const size_t n = fwd.size();
  if (n < 2) return training;

  // Activations crossing each cut position (after forward node i), by
  // difference counts; the narrowest positions are the segment boundaries.
  const auto consumers = training.consumers();
  std::vector<long> delta(n + 1, 0);
  struct Span {
    TensorId tensor;
    size_t first, last;
  };
  std::vector<Span> spans;
  for (TensorId t = 0; t < training.num_tensors(); ++t) {
    const Tensor &tensor = training.tensor(t);
    if (tensor.kind != TensorKind::kIntermediate || tensor.producer == kNoNode ||
        !forward[tensor.producer])
      continue;
    size_t last = 0;
    for (NodeId c : consumers[t])
      if (forward[c]) last = std::max(last, position[c]);
    const size_t first = position[tensor.producer];
    if (last <= first) continue;
    spans.push_back({t, first, last});
    delta[first] += 1;
    delta[last] -= 1;
  }
  std::vector<long> crossing(n, 0);
  long count = 0;
  for (size_t i = 0; i < n; ++i)
    crossing[i] = count += delta[i];
  const long narrowest = *std::min_element(crossing.begin(), crossing.end() - 1);
  std::vector<size_t> cuts;
  for (size_t i = 0; i + 1 < n; ++i)
    if (crossing[i] == narrowest) cuts.push_back(i);
  if (cuts.empty()) return training;
  const size_t last_cut = cuts.back();
  std::vector<bool> keep(training.num_tensors(), false);
  for (const Span &s : spans)
    for (size_t c : cuts)
      if (s.first <= c && c < s.last) keep[s.tensor] = true;
  // The last segment's activations are read by backward right away: kept.
  for (TensorId t = 0; t < training.num_tensors(); ++t) {
    const NodeId p = training.tensor(t).producer;
    if (p != kNoNode && forward[p] && position[p] > last_cut) keep[t] = true;
    if (also_keep != nullptr && t < also_keep->size() && (*also_keep)[t]) keep[t] = true;
  }

  // Clone what backward reads of the rest.
  Graph graph = training;
  std::vector<TensorId> clone_of(training.num_tensors(), kInvalidTensor);
  RecomputeStats counted;
  Status status = Status::ok();
  std::function<TensorId(TensorId)> clone = [&](TensorId t) -> TensorId {
    const Tensor &tensor = training.tensor(t);
    if (tensor.kind != TensorKind::kIntermediate || keep[t] || tensor.producer == kNoNode ||
        !forward[tensor.producer])
      return t;
    if (clone_of[t] != kInvalidTensor) return clone_of[t];
    const Node original = training.node(tensor.producer);
    Node copy;
    copy.name = graph.unique_name(str_cat(original.name, kRecomputeSuffix));
    copy.op = original.op;
    copy.attrs = original.attrs;
    for (TensorId in : original.inputs) {
      const TensorId input = clone(in);
      if (!status.is_ok()) return t;
      copy.inputs.push_back(input);
    }
    for (size_t k = 0; k < original.outputs.size(); ++k) {
      Tensor out;
      out.name = graph.unique_name(k == 0 ? copy.name : str_cat(copy.name, ":", k));
      out.type = training.tensor(original.outputs[k]).type;
      auto added = graph.add_tensor(std::move(out));
      if (!added.is_ok()) {
        status = added.status();
        return t;
      }
      copy.outputs.push_back(*added);
      clone_of[original.outputs[k]] = *added;
    }
    if (auto added = graph.add_node(std::move(copy)); !added.is_ok()) status = added.status();
    ++counted.cloned;
    return clone_of[t];
  };
  for (NodeId id : order) {
    if (forward[id]) continue;
    // Backward readers only: optimizer work reads accumulated gradients, never
    // forward activations, and a step-phase reader keeps what it reads.
    const ops::OpDef *def = registry.find(training.node(id).op);
    if (def != nullptr && def->once_per_step) continue;
    for (size_t i = 0; i < training.node(id).inputs.size(); ++i) {
      const TensorId in = training.node(id).inputs[i];
      const TensorId replacement = clone(in);
      RETURN_IF_ERROR(status);
      graph.mutable_node(id).inputs[i] = replacement;
    }
  }
  for (TensorId t = 0; t < training.num_tensors(); ++t)
    counted.checkpoints +=
        keep[t] && training.tensor(t).producer != kNoNode && forward[training.tensor(t).producer];
  if (stats) *stats = counted;
  RETURN_IF_ERROR(verify_graph(graph, registry).with_context("recomputation"));
  return graph;
}

} // namespace strata::passes
