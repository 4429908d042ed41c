#include "passes/plan_memory.h"

#include <algorithm>
#include <numeric>

namespace strata::passes {

namespace {

int64_t align_up(int64_t value, int64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// One tensor to place: its size and the steps [first, last] during which its
// bytes must not be touched by anything else. Both ends are inclusive, so a
// node's inputs (live through the step that reads them) and its outputs (live
// from the step that writes them) always overlap and never share bytes.
struct Interval {
  TensorId tensor;
  int64_t size;
  int64_t first;
  int64_t last;
  int64_t offset = -1;
};

bool lifetimes_overlap(const Interval &a, const Interval &b) {
  return a.first <= b.last && b.first <= a.last;
}

} // namespace

Result<MemoryPlan> plan_memory(const Graph &graph, llvm::ArrayRef<NodeId> order,
                               int64_t alignment) {
  if (alignment <= 0 || (alignment & (alignment - 1)) != 0)
    return invalid_argument("memory plan alignment ", alignment, " is not a power of two");

  // Step of each node in the order; the order must hold every node exactly once.
  const size_t num_nodes = graph.num_nodes();
  if (order.size() != num_nodes)
    return invalid_argument("execution order has ", order.size(), " nodes, the graph has ",
                            num_nodes);
  std::vector<int64_t> step_of(num_nodes, -1);
  for (size_t step = 0; step < order.size(); ++step) {
    NodeId id = order[step];
    if (id >= num_nodes)
      return invalid_argument("execution order step ", step, " names node ", id,
                              ", past the graph's ", num_nodes, " nodes");
    if (step_of[id] != -1)
      return invalid_argument("execution order lists node '", graph.node(id).name,
                              "' twice (steps ", step_of[id], " and ", step, ")");
    step_of[id] = static_cast<int64_t>(step);
  }

  // Lifetimes of the intermediates.
  const size_t num_tensors = graph.num_tensors();
  std::vector<int64_t> first(num_tensors, -1), last(num_tensors, -1);
  for (size_t step = 0; step < order.size(); ++step) {
    const Node &node = graph.node(order[step]);
    for (TensorId output : node.outputs) {
      if (output >= num_tensors)
        return invalid_argument("node '", node.name, "' writes tensor ", output,
                                ", past the graph's ", num_tensors, " tensors");
      first[output] = last[output] = static_cast<int64_t>(step);
    }
  }
  for (size_t step = 0; step < order.size(); ++step) {
    const Node &node = graph.node(order[step]);
    for (TensorId input : node.inputs) {
      if (input >= num_tensors)
        return invalid_argument("node '", node.name, "' reads tensor ", input,
                                ", past the graph's ", num_tensors, " tensors");
      if (graph.tensor(input).kind != TensorKind::kIntermediate) continue;
      if (first[input] < 0)
        return invalid_argument("node '", node.name, "' reads tensor '", graph.tensor(input).name,
                                "', which no node writes");
      if (first[input] >= static_cast<int64_t>(step))
        return invalid_argument("execution order runs node '", node.name,
                                "' before the producer of its input '", graph.tensor(input).name,
                                "'");
      last[input] = std::max(last[input], static_cast<int64_t>(step));
    }
  }
  // Graph outputs and the values of state updates are read after the last step.
  const auto end_step = static_cast<int64_t>(order.size());
  for (TensorId output : graph.outputs())
    if (output < num_tensors) last[output] = end_step;
  for (const StateUpdate &update : graph.updates())
    if (update.value < num_tensors) last[update.value] = end_step;

  MemoryPlan plan;
  plan.offsets.assign(num_tensors, -1);
  std::vector<Interval> intervals;
  for (TensorId id = 0; id < num_tensors; ++id) {
    const Tensor &tensor = graph.tensor(id);
    if (tensor.kind != TensorKind::kIntermediate) continue;
    if (first[id] < 0)
      return invalid_argument("intermediate tensor '", tensor.name,
                              "' is not written by any node of the order");
    auto elements = checked_num_elements(tensor.type.shape);
    if (!elements.is_ok())
      return elements.status().with_context(str_cat("tensor '", tensor.name, "'"));
    const int64_t size = tensor.type.size_bytes();
    plan.naive_bytes += align_up(size, alignment);
    if (size == 0) {
      // Nothing to protect: any aligned address will do.
      plan.offsets[id] = 0;
      continue;
    }
    intervals.push_back({id, size, first[id], last[id]});
  }

  // Greedy by size: the largest tensors are placed first, since they are the
  // hardest to fit into gaps; each goes to the lowest aligned offset where it
  // clashes with no already placed tensor whose lifetime meets its own. Ties go
  // to the lower tensor id, so the plan depends only on the graph and the order.
  std::sort(intervals.begin(), intervals.end(), [](const Interval &a, const Interval &b) {
    return a.size != b.size ? a.size > b.size : a.tensor < b.tensor;
  });
  // Placed tensors, kept sorted by offset so the gap search is one sweep.
  std::vector<const Interval *> placed;
  placed.reserve(intervals.size());
  int64_t peak = 0;
  for (Interval &candidate : intervals) {
    int64_t offset = 0;
    for (const Interval *other : placed) {
      if (!lifetimes_overlap(candidate, *other)) continue;
      if (other->offset >= offset + candidate.size) break; // the gap before `other` fits
      offset = std::max(offset, align_up(other->offset + other->size, alignment));
    }
    candidate.offset = offset;
    plan.offsets[candidate.tensor] = offset;
    peak = std::max(peak, offset + candidate.size);
    auto position = std::upper_bound(
        placed.begin(), placed.end(), &candidate,
        [](const Interval *a, const Interval *b) { return a->offset < b->offset; });
    placed.insert(position, &candidate);
  }
  plan.arena_bytes = align_up(peak, alignment);
  return plan;
}

} // namespace strata::passes
