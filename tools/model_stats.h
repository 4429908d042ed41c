// Static numbers about a model: parameters, bytes and FLOPs per forward pass,
// per op type and per node, all from the op registry's cost functions. Shared by
// `strata zoo`, `strata inspect`, the tests and the benchmarks.
#pragma once

#include <string>
#include <vector>

#include "graph/graph.h"
#include "graph/units.h"
#include "ops/registry.h"

namespace strata::tools {

struct OpTypeStats {
  std::string op;
  int64_t count = 0;
  double flops = 0;
};

struct NodeStats {
  NodeId node = kNoNode;
  double flops = 0;
  double bytes = 0; // read + written
};

struct ModelStats {
  int64_t parameters = 0;      // elements of all parameter tensors
  int64_t parameter_bytes = 0; // their size in memory
  int64_t constant_bytes = 0;  // size of constant tensors
  double flops = 0;            // one forward pass
  double bytes = 0; // memory traffic of one forward pass (every node reads and writes once)
  std::vector<NodeStats> nodes; // in topological order
  std::vector<OpTypeStats> ops; // by FLOPs, largest first (ties by name)
};

// Fails if the graph has a cycle.
Result<ModelStats> compute_model_stats(const Graph &graph,
                                       const ops::OpRegistry &registry = ops::OpRegistry::global());

// FLOPs of one node by the registry's cost function.
double node_flops(const Graph &graph, NodeId node,
                  const ops::OpRegistry &registry = ops::OpRegistry::global());

// Time per op type from per-node times (by node id, as the executors'
// node_times give them): nodes with a time > 0 counted, sums largest first
// (ties by name).
struct OpTime {
  std::string op;
  int64_t nodes = 0;
  double ms = 0;
};
std::vector<OpTime> op_times(const Graph &graph, const std::vector<double> &node_ms);

// Human units (graph/units.h): "1.23M", "1.23 GFLOP", "1.23 MiB".
using strata::human_bytes;
using strata::human_count;
using strata::human_flops;
// An integer with thousands separators: "1,234,567".
std::string grouped(int64_t value);

} // namespace strata::tools
