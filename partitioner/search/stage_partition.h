// Vertical partitioning: splitting a model into pipeline stages.
//
// Two layers, so the search can be used with any cost model:
//
//  1. A graph-free solver, solve_partition: a sequence of n items (the forward
//     nodes in a topological order), each with a time, memory it owns and a cost for
//     cutting after it, is split into p contiguous non-empty stages. The objective is
//     the pipeline's bottleneck: the largest stage time, where a stage's time is the
//     sum of its items' times plus the cost of its outgoing cut. Every stage must fit
//     in the per-device memory capacity: its static bytes (parameters, gradients,
//     optimizer state) plus its activation bytes times the micro-batches that stage
//     keeps in flight (under 1F1B stage s of p keeps p - s of them).
//
//  2. A graph adapter, partition_stages: turns a forward graph (or the forward part
//     of a training graph, each forward node then timed with the backward and
//     optimizer nodes that follow it) into such a sequence with a per-node time
//     function and a link model, solves it (or applies manual boundaries, the --stage-boundaries
//     override), and reports a StageAssignment: the stage of every forward node and
//     parameter, per-stage statistics and the tensors that cross each cut.
//     assign_training_nodes then maps every node of the training graph built from
//     that forward graph onto a stage.
//
// Algorithm of solve_partition (exact for contiguous partitions):
//  - Feasibility of a bottleneck bound T is a reachability sweep over stages: with
//    prefix sums, the starts b allowed for a stage ending at e form a suffix range
//    [L(e), e - 1] (time and memory only grow as b moves left), so "some start in
//    that range is reachable with s - 1 stages" is one prefix-count lookup. L is
//    found by binary search for the time bound (once per T, it does not depend on the
//    stage) and by a two-pointer sweep for the memory bound (which does depend on the
//    stage, through its micro-batches in flight). One check costs O(n log n + p n).
//  - Feasibility is monotone in T, and the optimum is one of the finitely many
//    computed stage times, so bisecting over the ordered bit patterns of
//    non-negative doubles finds the smallest feasible T exactly, as computed with
//    the same floating-point expressions, in at most 64 checks.
//  - Among the partitions that reach that bottleneck, a second sweep picks the one
//    with the least total cut cost (range minimum over the allowed starts with a
//    sparse table, O(p n log n)); ties go to the smallest cut position, fixed from
//    the last stage backwards, so the result is deterministic.
//  In all O(64 (n log n + p n) + p n log n) time and O(p n) memory (the choices of
//  the second sweep).
//  A greedy "fill each stage up to T" check is not used: cut costs are not
//  monotone along the order (cutting inside an attention block crosses more tensors
//  than cutting between blocks), and with non-empty stages the furthest feasible cut
//  can leave a later stage with only an item whose own cut is too expensive.
#pragma once

#include <cstddef>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace strata::partitioner {

inline constexpr double kUnlimited = std::numeric_limits<double>::infinity();

// One unit of the sequence to split.
struct PartitionItem {
  std::string name;            // for error messages; empty: "item <index>"
  double time = 0;             // seconds, forward and backward together; >= 0
  double static_bytes = 0;     // bytes held once: parameters, gradients, optimizer state
  double activation_bytes = 0; // bytes kept per micro-batch in flight
  double cut_cost = 0;         // seconds to cut after this item; kUnlimited forbids the
                               // cut; ignored for the last item
};

struct PartitionProblem {
  std::vector<PartitionItem> items;
  int stages = 1;
  double memory_capacity = kUnlimited; // bytes per device
  // Micro-batches whose activations stage s keeps, one per stage; empty: one each.
  std::vector<int> in_flight;
};

struct PartitionSolution {
  // boundaries[s] is the index of the last item of stage s, for s < stages - 1.
  std::vector<size_t> boundaries;
  std::vector<double> stage_time;   // compute plus outgoing cut cost
  std::vector<double> stage_memory; // static + in_flight * activation bytes
  double bottleneck = 0;            // the largest stage_time
  double total_cut_cost = 0;
};

// Finds the partition of `problem` that minimizes the bottleneck (see the file
// comment). Errors: no items, stages < 1 or more stages than items, a negative or
// non-finite value, fewer allowed cuts than stages - 1, and no split that fits in
// memory ("no partition into P stages fits in X bytes per device; the largest item,
// 'NAME', needs Y bytes").
Result<PartitionSolution> solve_partition(const PartitionProblem &problem);

// The statistics of a given partition (boundaries as in PartitionSolution). Errors:
// the wrong number of boundaries, positions out of range or not increasing, a cut
// that is forbidden, and a stage over the memory capacity.
Result<PartitionSolution> evaluate_partition(const PartitionProblem &problem,
                                             const std::vector<size_t> &boundaries);

// Where the graph adapter may cut between forward nodes.
enum class CutPoints {
  // Only where the fewest activation tensors cross (one for a chain of layers with
  // residual streams: between blocks), widening to the next smallest count until
  // there are at least stages - 1 such positions. Keeps cuts at layer boundaries.
  kNarrowest,
  // After any forward node.
  kAny,
};

struct StagePartitionOptions {
  // Seconds one forward execution of a node takes; empty: its FLOPs / 1e11.
  std::function<double(const Graph &, NodeId)> node_time;
  // A forward node's item time is node_time * (1 + backward_factor): the backward
  // pass of a node costs about twice its forward pass.
  double backward_factor = 2.0;
  // With a training graph, instead: a forward node's item time is the time of
  // every node of the step that runs where it runs (itself, its backward, its
  // parameters' optimizer updates: as assign_training_nodes places them), each
  // by node_time, per micro-batch: the nodes once_per_step names (run once per
  // step, on the accumulated gradients) count 1 / microbatches of their time.
  bool whole_step_times = false;
  std::function<bool(NodeId)> once_per_step;
  // Link between neighbouring stages. A cut costs, per crossing activation tensor,
  // latency + bytes / bandwidth, twice when training (the activation forward, its
  // gradient backward).
  double link_bandwidth = 25e9; // bytes per second
  double link_latency = 1e-5;   // seconds per tensor
  bool training = true;
  // Bytes a stage holds per parameter byte: weights, gradients and two Adam moments.
  // 1 for inference.
  double parameter_state_factor = 4.0;
  double memory_capacity = kUnlimited; // bytes per device
  // Whether a forward node's output is kept for the backward pass (and so counts
  // as activation memory); empty: every output is.
  std::function<bool(const Graph &, TensorId)> kept;
  // Micro-batches per step; stage s keeps min(stages - s, microbatches) of them in
  // flight (1F1B). 0: as many as stages. Activation bytes are those of the graph's
  // tensors, i.e. the graph is taken to be built at micro-batch size.
  int microbatches = 0;
  // Overrides the above: micro-batches in flight per stage (one entry per stage).
  std::vector<int> in_flight;
  CutPoints cut_points = CutPoints::kNarrowest;
  // With kNarrowest: never widen; fewer narrowest positions than stages - 1 is
  // an error (the plan search skips such stage counts: they cut inside layers).
  bool narrowest_only = false;
  // --stage-boundaries: names of forward nodes after which to cut (stages - 1 of
  // them, in topological order). Empty: search.
  std::vector<std::string> manual_boundaries;
};

struct StageInfo {
  size_t num_nodes = 0;           // forward nodes
  double compute_time = 0;        // seconds per micro-batch: forward, backward (and
                                  // the optimizer / M with whole_step_times)
  double cut_time = 0;            // outgoing cut
  double time = 0;                // compute_time + cut_time
  double parameter_bytes = 0;     // parameters the stage owns (first consumer here)
  double static_bytes = 0;        // parameter_bytes * parameter_state_factor
  double activation_bytes = 0;    // outputs of its forward nodes, per micro-batch
  int in_flight = 1;              // micro-batches kept
  double memory_bytes = 0;        // static_bytes + in_flight * activation_bytes
  std::vector<TensorId> outgoing; // activation tensors crossing its outgoing cut, by id
};

// A parameter read by forward nodes of more than one stage (a tied embedding).
// It belongs to the first of them; the others hold a copy, and its gradient is the
// sum of the stages' contributions.
struct SharedParameter {
  TensorId tensor;
  std::vector<int> stages; // increasing
};

struct StageAssignment {
  int num_stages = 0;
  bool manual = false;                  // boundaries came from manual_boundaries
  std::vector<NodeId> order;            // the forward nodes in the order that was split
  std::vector<std::string> order_names; // their names, same order
  std::vector<int> node_stage;          // by NodeId; -1 for nodes outside the forward part
  std::vector<int> tensor_stage;        // by TensorId: parameters -> owning stage, -1 others
  std::vector<std::string> boundaries;  // name of the last forward node of stages 0..p-2
  std::vector<StageInfo> stages;
  std::vector<SharedParameter> shared_parameters;
  double bottleneck = 0; // the largest StageInfo::time
};

// Splits the forward part of `graph` into `stages` pipeline stages. A graph without
// state updates is all forward; in a training graph (make_training_graph) the
// forward part is the nodes its outputs (the loss) depend on. Errors name unknown or
// out-of-order manual boundaries, nodes whose time is negative, and memory misfits.
Result<StageAssignment> partition_stages(const Graph &graph, int stages,
                                         const StagePartitionOptions &options = {});

// Every node of a training graph mapped onto a stage, given the stages of its forward
// nodes, matched by name (`forward_stages` may come from the forward graph the
// training graph was built from, or from the training graph itself).
struct TrainingStages {
  std::vector<int> node_stage;   // by NodeId of the training graph, each in [0, p)
  std::vector<int> tensor_stage; // by TensorId: producer's stage; parameters and
                                 // their optimizer state: owner's stage; -1 inputs
  std::vector<size_t> nodes_per_stage;
};

// Rules, applied in a topological order of `training`:
//  1. a forward node (named in forward_stages.order_names) takes its stage;
//  2. a node named "<X>.grad.accumulate" (the sum of X's gradient contributions)
//     whose inputs are all produced on one stage runs there, so only the sum
//     crosses a stage boundary; any other "<X>.grad.<...>" follows X: the node
//     named X, or the tensor named X (its producer's stage; a parameter's owning
//     stage);
//  3. a node named "<P>.<...>" for a parameter or state tensor P (optimizer
//     update, clipped gradient) takes P's stage;
//  4. any other node takes the latest stage among its inputs' stages, or 0 when
//     none has one (for example the learning-rate schedule reading the step).
// Parameters belong to the stage of their first forward consumer; a state tensor
// "<P>.<state>" to P's stage. Errors: a forward node missing from `training`, or a
// cycle.
Result<TrainingStages> assign_training_nodes(const Graph &training,
                                             const StageAssignment &forward_stages);

} // namespace strata::partitioner
