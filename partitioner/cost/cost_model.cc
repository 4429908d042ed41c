#include "partitioner/cost/cost_model.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <limits>

namespace strata::partitioner {
namespace {

// ceil(log2 p) for p >= 1.
double lg(int p) {
  assert(p >= 1);
  return static_cast<double>(std::bit_width(static_cast<unsigned>(p - 1)));
}

// Seconds per byte of reduction; zero when reduction is to be left out.
double gamma_of(double reduce_Bps) {
  assert(reduce_Bps > 0);
  return std::isinf(reduce_Bps) ? 0.0 : 1.0 / reduce_Bps;
}

} // namespace

RooflineTime roofline(const ops::OpCost &cost, DType dtype, const DeviceSpec &device, bool tf32) {
  RooflineTime time;
  time.launch_s = device.launch_overhead_s;
  if (cost.flops > 0) {
    time.compute_s = cost.flops / (device.peak_flops_for(dtype, tf32) * device.compute_efficiency);
  }
  double bytes = cost.bytes_read + cost.bytes_written;
  if (bytes > 0) {
    time.memory_s = bytes / (device.memory_bandwidth * device.memory_efficiency);
  }
  time.total_s = time.launch_s + std::max(time.compute_s, time.memory_s);
  return time;
}

double op_time(const ops::OpCost &cost, DType dtype, const DeviceSpec &device, bool tf32) {
  return roofline(cost, dtype, device, tf32).total_s;
}

DType node_compute_dtype(const Graph &graph, NodeId id) {
  const Node &node = graph.node(id);
  if (!node.outputs.empty()) return graph.tensor(node.outputs.front()).type.dtype;
  if (!node.inputs.empty()) return graph.tensor(node.inputs.front()).type.dtype;
  return DType::kF32;
}

double node_time(const Graph &graph, NodeId id, const DeviceSpec &device, bool tf32) {
  ops::OpCost cost = ops::OpRegistry::global().node_cost(graph, id);
  return op_time(cost, node_compute_dtype(graph, id), device, tf32);
}

double graph_time(const Graph &graph, const DeviceSpec &device, bool tf32) {
  double total = 0;
  for (NodeId id = 0; id < graph.num_nodes(); ++id)
    total += node_time(graph, id, device, tf32);
  return total;
}

double transfer_time(double bytes, const LinkSpec &link) {
  if (bytes <= 0) return 0;
  return link.latency_s + bytes / link.bandwidth_Bps;
}

double reduce_bytes_per_second(const DeviceSpec &device, DType dtype) {
  double memory = device.memory_bandwidth * device.memory_efficiency / 3.0;
  double arithmetic = device.peak_flops_for(dtype) * device.compute_efficiency *
                      static_cast<double>(dtype_size(dtype));
  return std::min(memory, arithmetic);
}

std::string_view collective_algorithm_name(CollectiveAlgorithm algorithm) {
  switch (algorithm) {
  case CollectiveAlgorithm::kRing: return "ring";
  case CollectiveAlgorithm::kTree: return "tree";
  case CollectiveAlgorithm::kRecursiveDoubling: return "recursive-doubling";
  case CollectiveAlgorithm::kRabenseifner: return "rabenseifner";
  }
  return "?";
}

std::optional<CollectiveAlgorithm> collective_algorithm_named(std::string_view name) {
  for (CollectiveAlgorithm algorithm : kAllCollectiveAlgorithms)
    if (collective_algorithm_name(algorithm) == name) return algorithm;
  return std::nullopt;
}

std::string_view collective_name(Collective collective) {
  switch (collective) {
  case Collective::kAllReduce: return "all-reduce";
  case Collective::kAllGather: return "all-gather";
  case Collective::kReduceScatter: return "reduce-scatter";
  case Collective::kBroadcast: return "broadcast";
  }
  return "?";
}

double all_reduce_time(double bytes, int p, const LinkSpec &link, CollectiveAlgorithm algorithm,
                       double reduce_Bps) {
  if (p <= 1 || bytes <= 0) return 0;
  const double a = link.latency_s, b = 1.0 / link.bandwidth_Bps, g = gamma_of(reduce_Bps);
  const double n = bytes, frac = static_cast<double>(p - 1) / p, l = lg(p);
  switch (algorithm) {
  case CollectiveAlgorithm::kRing: return 2 * (p - 1) * a + 2 * frac * n * b + frac * n * g;
  case CollectiveAlgorithm::kRecursiveDoubling: return l * a + n * l * b + n * l * g;
  case CollectiveAlgorithm::kRabenseifner: return 2 * l * a + 2 * frac * n * b + frac * n * g;
  case CollectiveAlgorithm::kTree: return 2 * l * (a + n * b) + n * l * g;
  }
  return 0;
}

double all_gather_time(double bytes, int p, const LinkSpec &link, CollectiveAlgorithm algorithm) {
  if (p <= 1 || bytes <= 0) return 0;
  const double a = link.latency_s, b = 1.0 / link.bandwidth_Bps;
  const double n = bytes, frac = static_cast<double>(p - 1) / p, l = lg(p);
  switch (algorithm) {
  case CollectiveAlgorithm::kRing: return (p - 1) * a + frac * n * b;
  case CollectiveAlgorithm::kRecursiveDoubling:
  case CollectiveAlgorithm::kRabenseifner: return l * a + frac * n * b;
  case CollectiveAlgorithm::kTree: return l * a + frac * n * b + l * (a + n * b);
  }
  return 0;
}

double all_to_all_time(double bytes, int p, const LinkSpec &link) {
  if (p <= 1 || bytes <= 0) return 0;
  const double frac = static_cast<double>(p - 1) / (static_cast<double>(p) * p);
  return (p - 1) * link.latency_s + frac * bytes / link.bandwidth_Bps;
}

double reduce_scatter_time(double bytes, int p, const LinkSpec &link, CollectiveAlgorithm algorithm,
                           double reduce_Bps) {
  if (p <= 1 || bytes <= 0) return 0;
  const double a = link.latency_s, b = 1.0 / link.bandwidth_Bps, g = gamma_of(reduce_Bps);
  const double n = bytes, frac = static_cast<double>(p - 1) / p, l = lg(p);
  switch (algorithm) {
  case CollectiveAlgorithm::kRing: return (p - 1) * a + frac * n * (b + g);
  case CollectiveAlgorithm::kRecursiveDoubling:
  case CollectiveAlgorithm::kRabenseifner: return l * a + frac * n * (b + g);
  case CollectiveAlgorithm::kTree: return l * (a + n * b + n * g) + l * a + frac * n * b;
  }
  return 0;
}

double broadcast_time(double bytes, int p, const LinkSpec &link, CollectiveAlgorithm algorithm) {
  if (p <= 1 || bytes <= 0) return 0;
  const double a = link.latency_s, b = 1.0 / link.bandwidth_Bps;
  const double n = bytes, frac = static_cast<double>(p - 1) / p, l = lg(p);
  switch (algorithm) {
  case CollectiveAlgorithm::kTree:
  case CollectiveAlgorithm::kRecursiveDoubling: return l * (a + n * b);
  case CollectiveAlgorithm::kRing: return (l + p - 1) * a + 2 * frac * n * b;
  case CollectiveAlgorithm::kRabenseifner: return 2 * l * a + 2 * frac * n * b;
  }
  return 0;
}

double collective_time(Collective collective, double bytes, int p, const LinkSpec &link,
                       CollectiveAlgorithm algorithm, double reduce_Bps) {
  switch (collective) {
  case Collective::kAllReduce: return all_reduce_time(bytes, p, link, algorithm, reduce_Bps);
  case Collective::kAllGather: return all_gather_time(bytes, p, link, algorithm);
  case Collective::kReduceScatter:
    return reduce_scatter_time(bytes, p, link, algorithm, reduce_Bps);
  case Collective::kBroadcast: return broadcast_time(bytes, p, link, algorithm);
  }
  return 0;
}

CollectiveChoice best_collective(Collective collective, double bytes, int p, const LinkSpec &link,
                                 double reduce_Bps) {
  CollectiveChoice best{CollectiveAlgorithm::kRing, std::numeric_limits<double>::infinity()};
  for (CollectiveAlgorithm algorithm : kAllCollectiveAlgorithms) {
    double time = collective_time(collective, bytes, p, link, algorithm, reduce_Bps);
    if (time < best.time_s) best = {algorithm, time};
  }
  return best;
}

CollectiveChoice best_all_reduce(double bytes, int p, const LinkSpec &link, double reduce_Bps) {
  return best_collective(Collective::kAllReduce, bytes, p, link, reduce_Bps);
}

} // namespace strata::partitioner
