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
};

} // namespace

Result<MemoryPlan> plan_memory(const Graph &graph, llvm::ArrayRef<NodeId> order, int64_t alignment,
                               llvm::ArrayRef<int64_t> runs_at) {
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

  if (!runs_at.empty() && runs_at.size() != num_nodes)
    return invalid_argument("runs_at has ", runs_at.size(), " steps for ", num_nodes, " nodes");
  auto runs = [&](size_t step) {
    return runs_at.empty() ? static_cast<int64_t>(step) : runs_at[order[step]];
  };
  // Lifetimes of the intermediates; `written` checks the order itself.
  const size_t num_tensors = graph.num_tensors();
  std::vector<int64_t> first(num_tensors, -1), last(num_tensors, -1), written(num_tensors, -1);
  for (size_t step = 0; step < order.size(); ++step) {
    const Node &node = graph.node(order[step]);
    for (TensorId output : node.outputs) {
      if (output >= num_tensors)
        return invalid_argument("node '", node.name, "' writes tensor ", output,
                                ", past the graph's ", num_tensors, " tensors");
      first[output] = last[output] = runs(step);
      written[output] = static_cast<int64_t>(step);
    }
  }
  for (size_t step = 0; step < order.size(); ++step) {
    const Node &node = graph.node(order[step]);
    for (TensorId input : node.inputs) {
      if (input >= num_tensors)
        return invalid_argument("node '", node.name, "' reads tensor ", input,
                                ", past the graph's ", num_tensors, " tensors");
      if (graph.tensor(input).kind != TensorKind::kIntermediate) continue;
      if (written[input] < 0)
        return invalid_argument("node '", node.name, "' reads tensor '", graph.tensor(input).name,
                                "', which no node writes");
      if (written[input] >= static_cast<int64_t>(step))
        return invalid_argument("execution order runs node '", node.name,
                                "' before the producer of its input '", graph.tensor(input).name,
                                "'");
      if (first[input] > runs(step))
        return invalid_argument("runs_at runs node '", node.name,
                                "' before the producer of its input '", graph.tensor(input).name,
                                "'");
      last[input] = std::max(last[input], runs(step));
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

  std::vector<BufferLifetime> buffers;
  buffers.reserve(intervals.size());
  for (const Interval &interval : intervals)
    buffers.push_back({interval.size, interval.first, interval.last});
  plan.arena_bytes = place_buffers(buffers, alignment);
  for (size_t i = 0; i < intervals.size(); ++i)
    plan.offsets[intervals[i].tensor] = buffers[i].offset;
  return plan;
}

int64_t place_buffers(std::vector<BufferLifetime> &buffers, int64_t alignment) {
  // Greedy by size: the largest buffers are placed first, since they are the
  // hardest to fit into gaps; each goes to the lowest aligned offset where it
  // clashes with no already placed buffer whose lifetime meets its own. Ties go
  // to the earlier buffer, so the plan depends only on the list.
  std::vector<size_t> by_size(buffers.size());
  std::iota(by_size.begin(), by_size.end(), size_t{0});
  std::stable_sort(by_size.begin(), by_size.end(),
                   [&](size_t a, size_t b) { return buffers[a].size > buffers[b].size; });
  // Placed buffers, kept sorted by offset so the gap search is one sweep.
  std::vector<const BufferLifetime *> placed;
  placed.reserve(buffers.size());
  int64_t peak = 0;
  for (size_t index : by_size) {
    BufferLifetime &candidate = buffers[index];
    if (candidate.size <= 0) {
      candidate.offset = 0;
      continue;
    }
    int64_t offset = 0;
    for (const BufferLifetime *other : placed) {
      if (!(candidate.first <= other->last && other->first <= candidate.last)) continue;
      if (other->offset >= offset + candidate.size) break; // the gap before `other` fits
      offset = std::max(offset, align_up(other->offset + other->size, alignment));
    }
    candidate.offset = offset;
    peak = std::max(peak, offset + candidate.size);
    auto position = std::upper_bound(
        placed.begin(), placed.end(), &candidate,
        [](const BufferLifetime *a, const BufferLifetime *b) { return a->offset < b->offset; });
    placed.insert(position, &candidate);
  }
  return align_up(peak, alignment);
}

} // namespace strata::passes
