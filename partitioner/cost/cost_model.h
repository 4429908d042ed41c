// The analytic cost model: how long an op, a transfer or a collective takes on
// the hardware a ClusterSpec describes.
//
// Ops follow the roofline model: an op either waits on arithmetic or on memory,
// whichever is slower, plus a fixed launch cost:
//
//   time = launch_overhead + max(flops / (peak(dtype) * compute_efficiency),
//                                (bytes_read + bytes_written) / (memory_bandwidth *
//                                                                 memory_efficiency))
//
// Transfers follow the alpha-beta (Hockney) model: alpha = link latency,
// beta = 1 / link bandwidth, a message of n bytes takes alpha + n * beta.
//
// Collectives use the per-algorithm costs of Thakur, Rabenseifner and Gropp,
// "Optimization of Collective Communication Operations in MPICH", IJHPCA 19(1),
// 2005, with p ranks, n bytes, alpha and beta of the link the group crosses, and
// gamma = seconds per byte of the local reduction. lg p is rounded up for p not
// a power of two (the extra exchange step such groups need in that paper).
// These are the formulas recorded in the project's reference table.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "graph/graph.h"
#include "ops/registry.h"
#include "partitioner/cost/cluster.h"

namespace strata::partitioner {

// Where an op's roofline time comes from.
struct RooflineTime {
  double launch_s = 0;
  double compute_s = 0; // flops at the effective peak
  double memory_s = 0;  // bytes at the effective bandwidth
  double total_s = 0;   // launch_s + max(compute_s, memory_s)
  bool compute_bound() const { return compute_s >= memory_s; }
};

// Roofline time of work `cost` done in `dtype` on `device`; `tf32` lets f32 use
// the TF32 tensor-core rate. An op with neither FLOPs nor bytes costs its launch.
RooflineTime roofline(const ops::OpCost &cost, DType dtype, const DeviceSpec &device,
                      bool tf32 = false);
double op_time(const ops::OpCost &cost, DType dtype, const DeviceSpec &device, bool tf32 = false);

// The element type a node computes in: its first output's (its first input's for
// a node without outputs; f32 for one with neither).
DType node_compute_dtype(const Graph &graph, NodeId id);
// Roofline time of node `id`, its cost taken from the op registry.
double node_time(const Graph &graph, NodeId id, const DeviceSpec &device, bool tf32 = false);
// Sum of node_time over every node: the graph run serially on one device.
double graph_time(const Graph &graph, const DeviceSpec &device, bool tf32 = false);

// Point-to-point message of `bytes` over `link`: alpha + n * beta. Zero bytes
// (no message) costs nothing.
double transfer_time(double bytes, const LinkSpec &link);

// Bytes per second one device reduces (adds) data of `dtype`: each reduced byte
// reads two operands and writes one, so memory traffic is three times the data;
// capped by the arithmetic rate (one FLOP per element). 1 / gamma of the model.
double reduce_bytes_per_second(const DeviceSpec &device, DType dtype);

enum class CollectiveAlgorithm { kRing, kTree, kRecursiveDoubling, kRabenseifner };
inline constexpr CollectiveAlgorithm kAllCollectiveAlgorithms[] = {
    CollectiveAlgorithm::kRing, CollectiveAlgorithm::kTree, CollectiveAlgorithm::kRecursiveDoubling,
    CollectiveAlgorithm::kRabenseifner};
// "ring", "tree", "recursive-doubling", "rabenseifner".
std::string_view collective_algorithm_name(CollectiveAlgorithm algorithm);
// The algorithm of that name, or none.
std::optional<CollectiveAlgorithm> collective_algorithm_named(std::string_view name);

enum class Collective { kAllReduce, kAllGather, kReduceScatter, kBroadcast };
std::string_view collective_name(Collective collective);

// In every function below `bytes` is the full buffer one rank holds at the end
// (all-reduce, all-gather, broadcast) or at the start (reduce-scatter); each rank
// of an all-gather contributes bytes / p, each ends a reduce-scatter with
// bytes / p. `reduce_Bps` is 1 / gamma; pass infinity to leave reduction out.
// One rank (p <= 1) costs nothing.

// All-reduce:
//   ring               2(p-1) a + 2((p-1)/p) n b + ((p-1)/p) n g
//   recursive doubling lg p a + n lg p b + n lg p g
//   Rabenseifner       2 lg p a + 2((p-1)/p) n b + ((p-1)/p) n g
//                      (recursive-halving reduce-scatter + recursive-doubling all-gather)
//   tree               binomial reduce then binomial broadcast:
//                      2 lg p (a + n b) + n lg p g
double all_reduce_time(double bytes, int p, const LinkSpec &link, CollectiveAlgorithm algorithm,
                       double reduce_Bps);

// All-gather:
//   ring                              (p-1) a + ((p-1)/p) n b
//   recursive doubling / Rabenseifner lg p a + ((p-1)/p) n b
//   tree                              binomial gather then broadcast:
//                                     lg p a + ((p-1)/p) n b + lg p (a + n b)
double all_gather_time(double bytes, int p, const LinkSpec &link, CollectiveAlgorithm algorithm);

// All-to-all (a tensor of n bytes split over p members, resplit along another
// dim): every member sends a 1/p-th of its piece to each other member, one
// message each: (p-1) a + ((p-1)/p^2) n b.
double all_to_all_time(double bytes, int p, const LinkSpec &link);

// Reduce-scatter:
//   ring                              (p-1) a + ((p-1)/p) n (b + g)
//   recursive halving (the recursive-doubling and Rabenseifner entries)
//                                     lg p a + ((p-1)/p) n (b + g)
//   tree                              binomial reduce then scatter:
//                                     lg p (a + n b + n g) + lg p a + ((p-1)/p) n b
double reduce_scatter_time(double bytes, int p, const LinkSpec &link, CollectiveAlgorithm algorithm,
                           double reduce_Bps);

// Broadcast:
//   tree / recursive doubling  binomial tree: lg p (a + n b)
//   ring                       scatter + ring all-gather (van de Geijn):
//                              (lg p + p - 1) a + 2((p-1)/p) n b
//   Rabenseifner               scatter + recursive-doubling all-gather:
//                              2 lg p a + 2((p-1)/p) n b
double broadcast_time(double bytes, int p, const LinkSpec &link, CollectiveAlgorithm algorithm);

// Any of the above by kind; reduce_Bps is ignored where nothing is reduced.
double collective_time(Collective collective, double bytes, int p, const LinkSpec &link,
                       CollectiveAlgorithm algorithm, double reduce_Bps);

struct CollectiveChoice {
  CollectiveAlgorithm algorithm = CollectiveAlgorithm::kRing;
  double time_s = 0;
};
// The cheapest algorithm for the collective (ties go to the earlier entry of
// kAllCollectiveAlgorithms).
CollectiveChoice best_collective(Collective collective, double bytes, int p, const LinkSpec &link,
                                 double reduce_Bps);
CollectiveChoice best_all_reduce(double bytes, int p, const LinkSpec &link, double reduce_Bps);

} // namespace strata::partitioner
