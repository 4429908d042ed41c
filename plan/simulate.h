// The program simulator: runs every device's instruction stream against the
// others under a cost model, and so both predicts a step's timeline and
// proves that the programs cannot deadlock (check_deadlock). The compiler
// prices it with a cluster (partitioner::cluster_costs); the runtime checks
// a plan read from a file with zero costs before any thread waits.
//
// Collectives match too: every member's k-th collective on a group must
// reduce the same tensor. Gradient buckets run on a second resource per
// device (its communication stream), beside its instructions; a stuck
// WaitBucket is traced to the member that never started the bucket.
#pragma once

#include <functional>
#include <vector>

#include "graph/graph.h"
#include "serialization/plan_io.h"

namespace strata::plan {

// The predicted timeline of one step.
struct SimulatedInstruction {
  double start = 0;
  double end = 0;
};
struct Simulation {
  std::vector<std::vector<SimulatedInstruction>> devices; // per device, per instruction
  std::vector<double> busy; // per device: seconds spent on its own instructions
  std::vector<double> end;  // per device: when its last instruction ends
  double step_time = 0;     // the largest end
  double bubble = 0;        // 1 - sum(busy) / (devices * step_time)
};

// Costs the simulator charges. Transfers take `transfer(src, dst, bytes)` from
// the send to the arrival; the receiver waits for the arrival.
struct SimulationCosts {
  std::function<double(NodeId node)> compute;                     // one node, one micro-batch
  std::function<double(int src, int dst, double bytes)> transfer; // in flight
  std::function<double(double bytes)> local_copy;                 // accumulate, scale, update
  // An all-reduce of `bytes` over `devices`; empty: free. Reduce-scatter and
  // all-gather of a `bytes` buffer likewise.
  std::function<double(const std::vector<int32_t> &devices, double bytes)> all_reduce;
  std::function<double(const std::vector<int32_t> &devices, double bytes)> reduce_scatter;
  std::function<double(const std::vector<int32_t> &devices, double bytes)> all_gather;
};

// Zero costs: what check_deadlock uses.
SimulationCosts zero_costs();

// Runs every device's program against the others: a receive waits for its send.
// programs[i] must be device i's.
// Errors (also what check_deadlock reports): a receive that can never be matched
// ("device 1 instruction 12 (recv 'h' mb 3 from device 0) waits forever: device 0
// ..."), naming both sides and where the other side is stuck or that it never
// sends it, and a send nobody receives.
// `groups` are the devices of the all-reduce instructions (peer = group index).
Result<Simulation> simulate_pipeline(const Graph &graph,
                                     const std::vector<serialization::PlanProgram> &programs,
                                     const SimulationCosts &costs,
                                     const std::vector<std::vector<int32_t>> &groups = {});

// check-deadlock: simulate_pipeline with zero costs, keeping only the verdict.
Status check_deadlock(const Graph &graph, const std::vector<serialization::PlanProgram> &programs,
                      const std::vector<std::vector<int32_t>> &groups = {});

} // namespace strata::plan
