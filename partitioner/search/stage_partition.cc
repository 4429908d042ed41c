#include "partitioner/search/stage_partition.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>

#include <llvm/ADT/StringMap.h>

#include "ops/registry.h"

namespace strata::partitioner {
namespace {

std::string format_bytes(double bytes) {
  char text[96];
  if (bytes >= 1024.0 * 1024.0 * 1024.0) {
    std::snprintf(text, sizeof(text), "%.0f bytes (%.2f GiB)", bytes,
                  bytes / (1024.0 * 1024.0 * 1024.0));
  } else if (bytes >= 1024.0 * 1024.0) {
    std::snprintf(text, sizeof(text), "%.0f bytes (%.2f MiB)", bytes, bytes / (1024.0 * 1024.0));
  } else {
    std::snprintf(text, sizeof(text), "%.0f bytes", bytes);
  }
  return text;
}

std::string item_label(const PartitionProblem &problem, size_t index) {
  const std::string &name = problem.items[index].name;
  return name.empty() ? str_cat("item ", index) : str_cat("'", name, "'");
}

// Prefix sums and the stage predicates, shared by the search and the evaluation so
// both compute every stage time and memory with the same expressions.
class Sequence {
public:
  explicit Sequence(const PartitionProblem &problem)
      : n_(problem.items.size()), stages_(problem.stages), capacity_(problem.memory_capacity),
        time_(n_ + 1, 0.0), static_(n_ + 1, 0.0), act_(n_ + 1, 0.0), cut_(n_ + 1, 0.0) {
    for (size_t i = 0; i < n_; ++i) {
      const PartitionItem &item = problem.items[i];
      time_[i + 1] = time_[i] + item.time;
      static_[i + 1] = static_[i] + item.static_bytes;
      act_[i + 1] = act_[i] + item.activation_bytes;
      cut_[i + 1] = i + 1 < n_ ? item.cut_cost : 0.0;
    }
    in_flight_.resize(static_cast<size_t>(stages_), 1);
    for (size_t s = 0; s < problem.in_flight.size() && s < in_flight_.size(); ++s) {
      in_flight_[s] = problem.in_flight[s];
    }
  }

  size_t size() const { return n_; }
  int stages() const { return stages_; }
  int in_flight(int stage) const { return in_flight_[static_cast<size_t>(stage)]; }
  // Whether a stage may end at exclusive end `e` (the cut after item e - 1 is allowed).
  bool end_allowed(size_t e) const { return e == n_ || std::isfinite(cut_[e]); }
  double cut(size_t e) const { return cut_[e]; }

  // Items [b, e) as one stage.
  double compute(size_t b, size_t e) const { return time_[e] - time_[b]; }
  double time(size_t b, size_t e) const { return compute(b, e) + cut_[e]; }
  double memory(size_t b, size_t e, int stage) const {
    return (static_[e] - static_[b]) + static_cast<double>(in_flight(stage)) * (act_[e] - act_[b]);
  }
  bool fits(size_t b, size_t e, int stage) const { return memory(b, e, stage) <= capacity_; }

  // For each end e in [1, n], the smallest start b < e with time(b, e) <= bound, or e
  // when there is none. time(b, e) only falls as b grows, so a binary search finds it.
  void time_starts(double bound, std::vector<size_t> &starts) const {
    starts.assign(n_ + 1, 0);
    for (size_t e = 1; e <= n_; ++e) {
      if (!end_allowed(e)) {
        starts[e] = e;
        continue;
      }
      size_t lo = 0, hi = e; // answer in [lo, hi]; hi = e means none
      while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (time(mid, e) <= bound) {
          hi = mid;
        } else {
          lo = mid + 1;
        }
      }
      starts[e] = lo;
    }
  }

  // Ends that stage s (0-based) may have while every stage stays non-empty.
  size_t first_end(int s) const { return static_cast<size_t>(s) + 1; }
  size_t last_end(int s) const { return n_ - static_cast<size_t>(stages_ - 1 - s); }

  // Calls visit(e, lower) for each end of stage s, with `lower` the smallest start
  // allowed by both the time bound (time_starts) and memory. The memory bound grows
  // with e, so one pointer sweeps it.
  template <typename Visit>
  void for_each_end(int s, const std::vector<size_t> &time_start, Visit &&visit) const {
    size_t memory_start = 0;
    for (size_t e = first_end(s); e <= last_end(s); ++e) {
      if (memory_start < static_cast<size_t>(s)) memory_start = static_cast<size_t>(s);
      while (memory_start < e && !fits(memory_start, e, s))
        ++memory_start;
      visit(e, std::max(time_start[e], memory_start));
    }
  }

  // Whether some partition has every stage time <= bound and fits in memory.
  bool feasible(double bound) const {
    std::vector<size_t> time_start;
    time_starts(bound, time_start);
    std::vector<uint32_t> reach_count(n_ + 2, 0); // prefix counts of reachable starts
    std::vector<char> reach(n_ + 1, 0), next(n_ + 1, 0);
    reach[0] = 1;
    for (int s = 0; s < stages_; ++s) {
      for (size_t i = 0; i <= n_; ++i)
        reach_count[i + 1] = reach_count[i] + (reach[i] ? 1 : 0);
      std::fill(next.begin(), next.end(), 0);
      bool any = false;
      for_each_end(s, time_start, [&](size_t e, size_t lower) {
        if (lower < e && reach_count[e] - reach_count[lower] > 0) {
          next[e] = 1;
          any = true;
        }
      });
      if (!any) return false;
      reach.swap(next);
    }
    return reach[n_] != 0;
  }

private:
  size_t n_;
  int stages_;
  double capacity_;
  std::vector<double> time_, static_, act_, cut_;
  std::vector<int> in_flight_;
};

Status check_problem(const PartitionProblem &problem) {
  const size_t n = problem.items.size();
  if (n == 0) return invalid_argument("cannot partition an empty sequence");
  if (problem.stages < 1)
    return invalid_argument("stages must be at least 1, got ", problem.stages);
  if (static_cast<size_t>(problem.stages) > n) {
    return invalid_argument("cannot split ", n, " items into ", problem.stages,
                            " non-empty stages");
  }
  if (!problem.in_flight.empty() &&
      problem.in_flight.size() != static_cast<size_t>(problem.stages)) {
    return invalid_argument("in_flight has ", problem.in_flight.size(), " entries for ",
                            problem.stages, " stages");
  }
  for (size_t s = 0; s < problem.in_flight.size(); ++s) {
    if (problem.in_flight[s] < 0) {
      return invalid_argument("stage ", s, " keeps ", problem.in_flight[s],
                              " micro-batches in flight");
    }
  }
  if (std::isnan(problem.memory_capacity) || problem.memory_capacity < 0) {
    return invalid_argument("memory capacity must be a non-negative number");
  }
  for (size_t i = 0; i < n; ++i) {
    const PartitionItem &item = problem.items[i];
    auto bad = [](double v) { return !std::isfinite(v) || v < 0; };
    if (bad(item.time) || bad(item.static_bytes) || bad(item.activation_bytes) ||
        std::isnan(item.cut_cost) || item.cut_cost < 0) {
      return invalid_argument(item_label(problem, i),
                              ": time, bytes and cut cost must be finite and non-negative");
    }
  }
  return Status::ok();
}

// The error for a problem that no split fits in memory, naming the item that needs
// the most memory on its own (with the fewest micro-batches any stage keeps).
Status memory_error(const PartitionProblem &problem) {
  int fewest = 1;
  if (!problem.in_flight.empty()) {
    fewest = *std::min_element(problem.in_flight.begin(), problem.in_flight.end());
  }
  size_t largest = 0;
  double largest_need = -1;
  for (size_t i = 0; i < problem.items.size(); ++i) {
    const PartitionItem &item = problem.items[i];
    double need = item.static_bytes + fewest * item.activation_bytes;
    if (need > largest_need) {
      largest_need = need;
      largest = i;
    }
  }
  return failed_precondition("no partition into ", problem.stages, " stages fits in ",
                             format_bytes(problem.memory_capacity),
                             " per device; the largest item, ", item_label(problem, largest),
                             ", needs ", format_bytes(largest_need), " (with ", fewest,
                             " micro-batch(es) in flight)");
}

PartitionSolution describe(const Sequence &seq, std::vector<size_t> boundaries) {
  PartitionSolution solution;
  size_t begin = 0;
  for (int s = 0; s < seq.stages(); ++s) {
    size_t end = s + 1 < seq.stages() ? boundaries[static_cast<size_t>(s)] + 1 : seq.size();
    double time = seq.time(begin, end);
    solution.stage_time.push_back(time);
    solution.stage_memory.push_back(seq.memory(begin, end, s));
    solution.bottleneck = std::max(solution.bottleneck, time);
    if (end < seq.size()) solution.total_cut_cost += seq.cut(end);
    begin = end;
  }
  solution.boundaries = std::move(boundaries);
  return solution;
}

// Range minimum (value, then smallest index) over a fixed array.
class RangeMin {
public:
  explicit RangeMin(const std::vector<double> &values) : values_(values) {
    const size_t n = values.size();
    table_.emplace_back(n);
    for (size_t i = 0; i < n; ++i)
      table_[0][i] = static_cast<uint32_t>(i);
    for (size_t width = 1; 2 * width <= n; width *= 2) {
      const std::vector<uint32_t> &prev = table_.back();
      std::vector<uint32_t> level(n - 2 * width + 1);
      for (size_t i = 0; i < level.size(); ++i)
        level[i] = better(prev[i], prev[i + width]);
      table_.push_back(std::move(level));
    }
  }
  // Index of the minimum over [lo, hi], lo <= hi.
  uint32_t query(size_t lo, size_t hi) const {
    size_t level = static_cast<size_t>(std::bit_width(hi - lo + 1) - 1);
    return better(table_[level][lo], table_[level][hi + 1 - (size_t{1} << level)]);
  }

private:
  uint32_t better(uint32_t a, uint32_t b) const {
    if (values_[b] < values_[a]) return b;
    if (values_[a] < values_[b]) return a;
    return std::min(a, b);
  }
  const std::vector<double> &values_;
  std::vector<std::vector<uint32_t>> table_;
};

double from_bits(uint64_t bits) { return std::bit_cast<double>(bits); }

} // namespace

Result<PartitionSolution> solve_partition(const PartitionProblem &problem) {
  RETURN_IF_ERROR(check_problem(problem));
  const Sequence seq(problem);
  const size_t n = seq.size();
  const int p = problem.stages;

  size_t allowed_cuts = 0;
  double largest_cut = 0;
  for (size_t e = 1; e < n; ++e) {
    if (seq.end_allowed(e)) {
      ++allowed_cuts;
      largest_cut = std::max(largest_cut, seq.cut(e));
    }
  }
  if (allowed_cuts + 1 < static_cast<size_t>(p)) {
    return failed_precondition("cannot split into ", p, " stages: only ", allowed_cuts,
                               " cut position(s) are allowed");
  }
  if (!seq.feasible(kUnlimited)) {
    // Either memory, or the allowed cuts cannot make every stage non-empty.
    PartitionProblem unlimited = problem;
    unlimited.memory_capacity = kUnlimited;
    if (Sequence(unlimited).feasible(kUnlimited)) return memory_error(problem);
    return failed_precondition("cannot split into ", p,
                               " non-empty stages at the allowed cut positions");
  }

  // Smallest feasible bottleneck: bisection over the bit patterns of non-negative
  // doubles, which order like the values. Every stage time is at most `upper`.
  const double upper = seq.compute(0, n) + largest_cut;
  uint64_t lo = 0, hi = std::bit_cast<uint64_t>(upper);
  if (!seq.feasible(upper)) return internal_error("stage partition: upper bound not feasible");
  while (lo < hi) {
    uint64_t mid = lo + (hi - lo) / 2;
    if (seq.feasible(from_bits(mid))) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  const double bound = from_bits(lo);

  // Among the partitions within the bound, the least total cut cost. cost[b] is the
  // cheapest cover of items [0, b) by the stages so far (infinite: unreachable).
  std::vector<size_t> time_start;
  seq.time_starts(bound, time_start);
  std::vector<double> cost(n + 1, kUnlimited), next(n + 1, kUnlimited);
  cost[0] = 0;
  std::vector<uint32_t> parent(static_cast<size_t>(p) * (n + 1), UINT32_MAX);
  for (int s = 0; s < p; ++s) {
    RangeMin range(cost);
    std::fill(next.begin(), next.end(), kUnlimited);
    seq.for_each_end(s, time_start, [&](size_t e, size_t lower) {
      if (lower >= e) return;
      uint32_t best = range.query(lower, e - 1);
      if (!std::isfinite(cost[best])) return;
      next[e] = cost[best] + (e < n ? seq.cut(e) : 0.0);
      parent[static_cast<size_t>(s) * (n + 1) + e] = best;
    });
    cost.swap(next);
  }
  if (!std::isfinite(cost[n])) return internal_error("stage partition: no path at the optimum");

  std::vector<size_t> boundaries(static_cast<size_t>(p - 1));
  size_t end = n;
  for (int s = p - 1; s > 0; --s) {
    size_t start = parent[static_cast<size_t>(s) * (n + 1) + end];
    boundaries[static_cast<size_t>(s - 1)] = start - 1;
    end = start;
  }
  return describe(seq, std::move(boundaries));
}

Result<PartitionSolution> evaluate_partition(const PartitionProblem &problem,
                                             const std::vector<size_t> &boundaries) {
  RETURN_IF_ERROR(check_problem(problem));
  const Sequence seq(problem);
  const size_t n = seq.size();
  if (boundaries.size() + 1 != static_cast<size_t>(problem.stages)) {
    return invalid_argument(problem.stages, " stages need ", problem.stages - 1,
                            " boundaries, got ", boundaries.size());
  }
  size_t begin = 0;
  for (size_t s = 0; s < boundaries.size(); ++s) {
    size_t last = boundaries[s];
    if (last + 1 >= n) {
      return out_of_range("boundary ", s, " is at position ", last, " of ", n,
                          " items; the last stage would be empty");
    }
    if (last < begin) {
      return invalid_argument("boundary ", s, " (after ", item_label(problem, last),
                              ") does not come after the previous one");
    }
    if (!seq.end_allowed(last + 1)) {
      return invalid_argument("cutting after ", item_label(problem, last), " is not allowed");
    }
    begin = last + 1;
  }
  PartitionSolution solution = describe(seq, boundaries);
  for (int s = 0; s < problem.stages; ++s) {
    double need = solution.stage_memory[static_cast<size_t>(s)];
    if (need > problem.memory_capacity) {
      return failed_precondition("stage ", s, " needs ", format_bytes(need), ", more than the ",
                                 format_bytes(problem.memory_capacity), " of a device");
    }
  }
  return solution;
}

// ---------------------------------------------------------------------------------
// Graph adapter.

namespace {

bool is_activation(const Tensor &tensor) { return tensor.kind == TensorKind::kIntermediate; }

double tensor_bytes(const Tensor &tensor) { return static_cast<double>(tensor.type.size_bytes()); }

// The forward part of `graph`: everything, or for a training graph (one with state
// updates) the nodes its outputs depend on.
std::vector<char> forward_nodes(const Graph &graph) {
  std::vector<char> forward(graph.num_nodes(), graph.updates().empty() ? 1 : 0);
  if (graph.updates().empty()) return forward;
  std::vector<TensorId> work(graph.outputs().begin(), graph.outputs().end());
  std::vector<char> seen(graph.num_tensors(), 0);
  while (!work.empty()) {
    TensorId t = work.back();
    work.pop_back();
    if (seen[t]) continue;
    seen[t] = 1;
    NodeId producer = graph.tensor(t).producer;
    if (producer == kNoNode || forward[producer]) continue;
    forward[producer] = 1;
    for (TensorId in : graph.node(producer).inputs)
      work.push_back(in);
  }
  return forward;
}

// One run of partition_stages: the forward nodes as a sequence of items (time,
// owned parameters, kept activations, the cost of cutting after each), the
// search over them, and the assignment read back from its solution.
class StagePartitioner {
public:
  StagePartitioner(const Graph &graph, int stages, const StagePartitionOptions &options)
      : graph_(graph), stages_(stages), options_(options),
        where_(str_cat("stage partition of '", graph.name(), "'")),
        registry_(ops::OpRegistry::global()), is_forward_(forward_nodes(graph)),
        // Whole-step times need the step's other nodes: a forward graph has none.
        whole_step_(options.training && options.whole_step_times &&
                    std::find(is_forward_.begin(), is_forward_.end(), 0) != is_forward_.end()) {}

  Result<StageAssignment> run();

private:
  // An activation produced at position `first` and last read (forward) at
  // `last`: it crosses the cuts after first..last-1.
  struct Span {
    TensorId tensor;
    size_t first, last;
  };

  Status check_options() const;
  // The forward nodes in topological order, and each one's position in it.
  Status order_forward_nodes();
  double node_time(NodeId id) const {
    return options_.node_time ? options_.node_time(graph_, id)
                              : registry_.node_cost(graph_, id).flops / 1e11;
  }
  // Each forward node's item: its time and the activations it keeps.
  Status time_items();
  // With whole-step times: every other node of the step adds its time to the
  // item of the forward node it will run with.
  Status add_step_times();
  // Who owns each parameter and constant, and the activations crossing each
  // cut: the items' static bytes and cut costs.
  void find_crossings();
  void set_in_flight();
  // The partition --stage-boundaries names, or the search's.
  Result<PartitionSolution> manual_solution();
  Result<PartitionSolution> searched_solution();
  // Stages of nodes and parameters, per-stage statistics.
  void read_stages(const PartitionSolution &solution);
  void read_parameters_and_crossings(const PartitionSolution &solution);

  const Graph &graph_;
  const int stages_;
  const StagePartitionOptions &options_;
  const std::string where_;
  const ops::OpRegistry &registry_;
  const std::vector<char> is_forward_;
  const bool whole_step_;
  StageAssignment out_;
  size_t n_ = 0;                 // forward nodes
  std::vector<size_t> position_; // by NodeId; SIZE_MAX for other nodes
  PartitionProblem problem_;
  std::vector<llvm::SmallVector<NodeId, 2>> consumers_;
  std::vector<size_t> owner_; // by TensorId: position of the owner
  std::vector<Span> spans_;
  std::vector<long> count_at_; // activations crossing the cut after each position
  std::vector<int> stage_at_;  // by position
};

Result<StageAssignment> StagePartitioner::run() {
  RETURN_IF_ERROR(check_options());
  RETURN_IF_ERROR(order_forward_nodes());
  RETURN_IF_ERROR(time_items());
  if (whole_step_) RETURN_IF_ERROR(add_step_times());
  find_crossings();
  set_in_flight();
  PartitionSolution solution;
  if (!options_.manual_boundaries.empty()) {
    ASSIGN_OR_RETURN(solution, manual_solution());
    out_.manual = true;
  } else {
    ASSIGN_OR_RETURN(solution, searched_solution());
  }
  read_stages(solution);
  read_parameters_and_crossings(solution);
  return std::move(out_);
}

Status StagePartitioner::check_options() const {
  if (stages_ < 1) return invalid_argument(where_, ": stages must be at least 1, got ", stages_);
  if (!(options_.link_bandwidth > 0) || !(options_.link_latency >= 0) ||
      !(options_.backward_factor >= 0) || !(options_.parameter_state_factor >= 0)) {
    return invalid_argument(where_, ": link bandwidth must be positive, latency, backward "
                                    "factor and parameter state factor non-negative");
  }
  if (!options_.in_flight.empty() && options_.in_flight.size() != static_cast<size_t>(stages_)) {
    return invalid_argument(where_, ": in_flight has ", options_.in_flight.size(), " entries for ",
                            stages_, " stages");
  }
  return Status::ok();
}

Status StagePartitioner::order_forward_nodes() {
  ASSIGN_OR_RETURN(std::vector<NodeId> topo, graph_.topological_order());
  out_.num_stages = stages_;
  for (NodeId id : topo) {
    if (is_forward_[id]) out_.order.push_back(id);
  }
  n_ = out_.order.size();
  if (n_ < static_cast<size_t>(stages_)) {
    return invalid_argument(where_, ": cannot split ", n_, " forward nodes into ", stages_,
                            " stages");
  }
  position_.assign(graph_.num_nodes(), SIZE_MAX);
  for (size_t i = 0; i < n_; ++i) {
    position_[out_.order[i]] = i;
    out_.order_names.push_back(graph_.node(out_.order[i]).name);
  }
  return Status::ok();
}

Status StagePartitioner::time_items() {
  problem_.stages = stages_;
  problem_.memory_capacity = options_.memory_capacity;
  problem_.items.resize(n_);
  const double time_scale = 1.0 + (options_.training ? options_.backward_factor : 0.0);
  for (size_t i = 0; i < n_; ++i) {
    const NodeId id = out_.order[i];
    PartitionItem &item = problem_.items[i];
    item.name = graph_.node(id).name;
    double t = node_time(id);
    if (!std::isfinite(t) || t < 0) {
      return invalid_argument(where_, ": node '", item.name, "' has time ", t);
    }
    item.time = whole_step_ ? t : t * time_scale;
    if (options_.training) {
      for (TensorId o : graph_.node(id).outputs)
        if (!options_.kept || options_.kept(graph_, o))
          item.activation_bytes += tensor_bytes(graph_.tensor(o));
    }
  }
  return Status::ok();
}

Status StagePartitioner::add_step_times() {
  // Where each node of the step runs, as if every forward node were a stage
  // of its own: the item it adds its time to.
  StageAssignment each;
  each.num_stages = static_cast<int>(n_);
  each.order = out_.order;
  each.order_names = out_.order_names;
  each.node_stage.assign(graph_.num_nodes(), -1);
  for (size_t i = 0; i < n_; ++i)
    each.node_stage[out_.order[i]] = static_cast<int>(i);
  auto placed = assign_training_nodes(graph_, each);
  if (!placed.is_ok()) return placed.status().with_context(where_);
  const double micro = options_.microbatches > 0 ? options_.microbatches : stages_;
  for (NodeId id = 0; id < graph_.num_nodes(); ++id) {
    if (position_[id] != SIZE_MAX) continue; // a forward node: counted above
    double t = node_time(id);
    if (!std::isfinite(t) || t < 0)
      return invalid_argument(where_, ": node '", graph_.node(id).name, "' has time ", t);
    if (options_.once_per_step && options_.once_per_step(id)) t /= micro;
    problem_.items[static_cast<size_t>(placed->node_stage[id])].time += t;
  }
  return Status::ok();
}

void StagePartitioner::find_crossings() {
  consumers_ = graph_.consumers();
  out_.tensor_stage.assign(graph_.num_tensors(), -1);
  owner_.assign(graph_.num_tensors(), SIZE_MAX);
  // Crossing counts and bytes per cut position, by difference arrays: an activation
  // produced at position a and last read (forward) at c crosses the cuts after a..c-1.
  std::vector<double> cross_count(n_ + 1, 0), cross_bytes(n_ + 1, 0);
  for (TensorId t = 0; t < graph_.num_tensors(); ++t) {
    const Tensor &tensor = graph_.tensor(t);
    size_t first_use = SIZE_MAX, last_use = 0;
    for (NodeId c : consumers_[t]) {
      if (position_[c] == SIZE_MAX) continue;
      first_use = std::min(first_use, position_[c]);
      last_use = std::max(last_use, position_[c]);
    }
    if (first_use == SIZE_MAX) continue;
    if (tensor.kind == TensorKind::kParameter || tensor.kind == TensorKind::kConstant) {
      owner_[t] = first_use;
      double factor = tensor.kind == TensorKind::kParameter ? options_.parameter_state_factor : 1.0;
      problem_.items[first_use].static_bytes += tensor_bytes(tensor) * factor;
    } else if (is_activation(tensor) && tensor.producer != kNoNode &&
               position_[tensor.producer] != SIZE_MAX && last_use > position_[tensor.producer]) {
      size_t a = position_[tensor.producer];
      spans_.push_back({t, a, last_use});
      cross_count[a] += 1;
      cross_count[last_use] -= 1;
      cross_bytes[a] += tensor_bytes(tensor);
      cross_bytes[last_use] -= tensor_bytes(tensor);
    }
  }
  const double directions = options_.training ? 2.0 : 1.0;
  count_at_.assign(n_, 0);
  double count = 0, bytes = 0;
  for (size_t i = 0; i < n_; ++i) {
    count += cross_count[i];
    bytes += cross_bytes[i];
    count_at_[i] = std::lround(count);
    problem_.items[i].cut_cost = directions * (count * options_.link_latency +
                                               std::max(bytes, 0.0) / options_.link_bandwidth);
  }
}

void StagePartitioner::set_in_flight() {
  if (!options_.in_flight.empty()) {
    problem_.in_flight = options_.in_flight;
  } else {
    const int micro = options_.microbatches > 0 ? options_.microbatches : stages_;
    for (int s = 0; s < stages_; ++s)
      problem_.in_flight.push_back(std::min(stages_ - s, micro));
  }
}

Result<PartitionSolution> StagePartitioner::manual_solution() {
  const std::vector<std::string> &names = options_.manual_boundaries;
  if (names.size() + 1 != static_cast<size_t>(stages_)) {
    return invalid_argument(where_, ": --stage-boundaries names ", names.size(), " node(s); ",
                            stages_,
                            stages_ == 1 ? " stage needs none (the pipeline depth is --mesh's "
                                           "last number, e.g. --mesh 1x1x2)"
                                         : str_cat(" stages need ", stages_ - 1));
  }
  std::vector<size_t> cuts;
  for (size_t k = 0; k < names.size(); ++k) {
    const std::string &name = names[k];
    std::optional<NodeId> id = graph_.find_node(name);
    if (!id || position_[*id] == SIZE_MAX) {
      return not_found(where_, ": --stage-boundaries: no forward node named '", name, "'");
    }
    size_t pos = position_[*id];
    if (!cuts.empty() && pos <= cuts.back()) {
      return invalid_argument(where_, ": --stage-boundaries: '", name, "' does not come after '",
                              names[k - 1], "' in the topological order");
    }
    if (pos + 1 >= n_) {
      return invalid_argument(where_, ": --stage-boundaries: '", name,
                              "' is the last forward node; the last stage would be empty");
    }
    cuts.push_back(pos);
  }
  auto evaluated = evaluate_partition(problem_, cuts);
  if (!evaluated) return evaluated.status().with_context(where_);
  return evaluated;
}

Result<PartitionSolution> StagePartitioner::searched_solution() {
  if (options_.cut_points == CutPoints::kNarrowest && stages_ > 1) {
    // The smallest crossing count with enough positions at or below it.
    std::vector<long> counts(count_at_.begin(), count_at_.end() - 1);
    std::sort(counts.begin(), counts.end());
    const long threshold = counts[static_cast<size_t>(stages_ - 2)];
    if (options_.narrowest_only && threshold > counts.front())
      return invalid_argument(
          where_, ": ", std::count(counts.begin(), counts.end(), counts.front()),
          " cut positions where the fewest activations cross (layer boundaries); ", stages_,
          " stages need ", stages_ - 1);
    for (size_t i = 0; i + 1 < n_; ++i) {
      if (count_at_[i] > threshold) problem_.items[i].cut_cost = kUnlimited;
    }
  }
  auto solved = solve_partition(problem_);
  if (!solved) return solved.status().with_context(where_);
  return solved;
}

void StagePartitioner::read_stages(const PartitionSolution &solution) {
  out_.node_stage.assign(graph_.num_nodes(), -1);
  out_.stages.resize(static_cast<size_t>(stages_));
  stage_at_.assign(n_, 0);
  int s = 0;
  for (size_t i = 0; i < n_; ++i) {
    stage_at_[i] = s;
    if (static_cast<size_t>(s) < solution.boundaries.size() && solution.boundaries[s] == i) ++s;
  }
  for (size_t i = 0; i < n_; ++i) {
    StageInfo &info = out_.stages[static_cast<size_t>(stage_at_[i])];
    const PartitionItem &item = problem_.items[i];
    out_.node_stage[out_.order[i]] = stage_at_[i];
    info.num_nodes += 1;
    info.compute_time += item.time;
    info.static_bytes += item.static_bytes;
    info.activation_bytes += item.activation_bytes;
  }
  for (int k = 0; k < stages_; ++k) {
    StageInfo &info = out_.stages[static_cast<size_t>(k)];
    info.time = solution.stage_time[static_cast<size_t>(k)];
    info.cut_time = k + 1 < stages_ ? problem_.items[solution.boundaries[k]].cut_cost : 0.0;
    info.in_flight = problem_.in_flight[static_cast<size_t>(k)];
    info.memory_bytes = solution.stage_memory[static_cast<size_t>(k)];
  }
  out_.bottleneck = solution.bottleneck;
  for (size_t cut : solution.boundaries)
    out_.boundaries.push_back(problem_.items[cut].name);
}

void StagePartitioner::read_parameters_and_crossings(const PartitionSolution &solution) {
  for (TensorId t = 0; t < graph_.num_tensors(); ++t) {
    if (owner_[t] == SIZE_MAX) continue;
    const Tensor &tensor = graph_.tensor(t);
    const int s = stage_at_[owner_[t]];
    out_.tensor_stage[t] = s;
    if (tensor.kind != TensorKind::kParameter) continue;
    out_.stages[static_cast<size_t>(s)].parameter_bytes += tensor_bytes(tensor);
    std::vector<int> used;
    for (NodeId c : consumers_[t]) {
      if (position_[c] != SIZE_MAX) used.push_back(stage_at_[position_[c]]);
    }
    std::sort(used.begin(), used.end());
    used.erase(std::unique(used.begin(), used.end()), used.end());
    if (used.size() > 1) out_.shared_parameters.push_back({t, std::move(used)});
  }
  for (const Span &span : spans_) {
    auto it = std::lower_bound(solution.boundaries.begin(), solution.boundaries.end(), span.first);
    for (; it != solution.boundaries.end() && *it < span.last; ++it) {
      out_.stages[static_cast<size_t>(it - solution.boundaries.begin())].outgoing.push_back(
          span.tensor);
    }
  }
}

} // namespace

Result<StageAssignment> partition_stages(const Graph &graph, int stages,
                                         const StagePartitionOptions &options) {
  StagePartitioner partitioner(graph, stages, options);
  return partitioner.run();
}

// ---------------------------------------------------------------------------------
// Training graphs.

Result<TrainingStages> assign_training_nodes(const Graph &training,
                                             const StageAssignment &forward_stages) {
  const std::string where = str_cat("stage assignment of '", training.name(), "'");
  llvm::StringMap<int> forward_stage;
  for (size_t i = 0; i < forward_stages.order.size() && i < forward_stages.order_names.size();
       ++i) {
    forward_stage[forward_stages.order_names[i]] =
        forward_stages.node_stage[forward_stages.order[i]];
  }
  for (const auto &entry : forward_stage) {
    if (!training.find_node(entry.getKey())) {
      return not_found(where, ": forward node '", entry.getKey().str(),
                       "' is not in the training graph");
    }
  }
  ASSIGN_OR_RETURN(std::vector<NodeId> topo, training.topological_order());
  const auto consumers = training.consumers();

  TrainingStages out;
  out.node_stage.assign(training.num_nodes(), -1);
  out.tensor_stage.assign(training.num_tensors(), -1);

  // Parameters: the earliest stage among their forward consumers.
  for (TensorId t = 0; t < training.num_tensors(); ++t) {
    const Tensor &tensor = training.tensor(t);
    if (tensor.kind != TensorKind::kParameter && tensor.kind != TensorKind::kConstant) continue;
    int stage = -1;
    for (NodeId c : consumers[t]) {
      auto it = forward_stage.find(training.node(c).name);
      if (it != forward_stage.end() && (stage < 0 || it->second < stage)) stage = it->second;
    }
    out.tensor_stage[t] = stage;
  }
  // The longest prefix of `name`, ending before a '.', that names a parameter or
  // state tensor with a stage.
  auto owner_prefix = [&](std::string_view name) -> int {
    for (size_t dot = name.rfind('.'); dot != std::string_view::npos && dot > 0;
         dot = name.rfind('.', dot - 1)) {
      std::optional<TensorId> t = training.find_tensor(name.substr(0, dot));
      if (t && out.tensor_stage[*t] >= 0 &&
          (training.tensor(*t).kind == TensorKind::kParameter ||
           training.tensor(*t).kind == TensorKind::kState)) {
        return out.tensor_stage[*t];
      }
    }
    return -1;
  };
  // State tensors "<P>.<state>" follow P (parameters are set above).
  for (TensorId t = 0; t < training.num_tensors(); ++t) {
    if (training.tensor(t).kind == TensorKind::kState) {
      out.tensor_stage[t] = owner_prefix(training.tensor(t).name);
    }
  }

  std::vector<char> state(training.num_nodes(), 0); // 0 new, 1 in progress, 2 done
  // Resolves one node; a node named by a ".grad." rule may be resolved ahead of the
  // topological order, in which case inputs not yet staged are skipped.
  std::function<int(NodeId)> resolve = [&](NodeId id) -> int {
    if (state[id] == 2) return out.node_stage[id];
    if (state[id] == 1) return -1;
    state[id] = 1;
    const Node &node = training.node(id);
    int stage = -1;
    if (auto it = forward_stage.find(node.name); it != forward_stage.end()) stage = it->second;
    if (stage < 0 && node.name.ends_with(".recompute")) {
      // A recomputing clone (passes/recompute.h) runs where its original does.
      const std::string_view original =
          std::string_view(node.name).substr(0, node.name.size() - std::strlen(".recompute"));
      if (std::optional<NodeId> x = training.find_node(original); x && *x != id)
        stage = resolve(*x);
    }
    if (stage < 0 && node.name.ends_with(".grad.accumulate")) {
      // The sum of a tensor's gradient contributions runs where they are all
      // computed when that is one stage: at a stage boundary only the sum then
      // crosses, not every contribution. Mixed stages keep the rule below.
      int only = -1;
      bool one_stage = true;
      for (TensorId in : node.inputs) {
        const NodeId producer = training.tensor(in).producer;
        const int s = producer != kNoNode ? resolve(producer) : -1;
        if (s < 0 || (only >= 0 && s != only)) one_stage = false;
        only = s;
      }
      if (one_stage) stage = only;
    }
    if (stage < 0) {
      size_t grad = node.name.find(".grad.");
      if (grad != std::string::npos && grad > 0) {
        std::string_view target = std::string_view(node.name).substr(0, grad);
        if (std::optional<NodeId> x = training.find_node(target); x && *x != id) {
          stage = resolve(*x);
        }
        if (stage < 0) {
          if (std::optional<TensorId> t = training.find_tensor(target)) {
            stage = out.tensor_stage[*t];
          }
        }
      }
    }
    if (stage < 0) stage = owner_prefix(node.name);
    if (stage < 0) {
      for (TensorId in : node.inputs)
        stage = std::max(stage, out.tensor_stage[in]);
    }
    if (stage < 0) stage = 0;
    out.node_stage[id] = stage;
    for (TensorId o : node.outputs)
      out.tensor_stage[o] = stage;
    state[id] = 2;
    return stage;
  };
  for (NodeId id : topo)
    resolve(id);

  out.nodes_per_stage.assign(static_cast<size_t>(std::max(forward_stages.num_stages, 1)), 0);
  for (int s : out.node_stage) {
    if (static_cast<size_t>(s) >= out.nodes_per_stage.size()) {
      return internal_error(where, ": node stage ", s, " out of range");
    }
    out.nodes_per_stage[static_cast<size_t>(s)] += 1;
  }
  return out;
}

} // namespace strata::partitioner
