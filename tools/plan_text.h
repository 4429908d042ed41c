// How the commands that read plans (compile, inspect, simulate, run) write
// about them: the summary of a plan, its pipeline devices' shares of a step,
// and the small formats their lines share.
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "plan/simulate.h"
#include "plan/trace.h"
#include "serialization/plan_io.h"

namespace strata::tools {

// "1 stage", "4 stages", "1 micro-batch", "8 micro-batches".
std::string counted(int64_t n, std::string_view noun);
// "1.234 ms" from seconds.
std::string format_ms(double seconds);
// "27.3%" from a fraction.
std::string format_percent(double fraction);
// `text` right-aligned in `width` columns.
std::string pad(std::string text, size_t width);

// What a plan's graph holds, for the summary lines of compile and inspect.
struct PlanNumbers {
  int64_t parameters = 0, parameter_bytes = 0, trainable_tensors = 0;
  int64_t state_tensors = 0, state_bytes = 0;
  double flops = 0; // one run of the graph (FLOPs of a pipeline step: stage_rows)
};
PlanNumbers plan_numbers(const Graph &graph);

// One pipeline device's share of the step.
struct StageRow {
  size_t nodes = 0;           // distinct nodes it computes
  int64_t parameters = 0;     // elements of the trainable parameters it holds
  double flops = 0;           // per step, all micro-batches
  int64_t arena = 0;          // peak activation bytes
  double busy = 0;            // predicted seconds of work per step
  std::map<int, double> sent; // bytes per step to each peer
  double reduced = 0;         // bytes per step all-reduced with the other replicas
};
// One row per device of a pipeline plan.
std::vector<StageRow> stage_rows(const serialization::Plan &plan);

// Forward nodes a plan recomputes in backward (--recompute).
size_t recomputed_nodes(const Graph &graph);

// The schedule's ideal bubble with equal stages: (p-1)/(m+p-1), or with v
// chunks per device (interleaved) (p-1)/(vm+p-1).
std::string bubble_formula(const serialization::PlanPipeline &p);

// The predicted timeline as trace spans (one step).
std::vector<std::vector<plan::TraceSpan>> simulation_spans(const plan::Simulation &sim);

// The algorithm a transfer row of group `group` runs with
// (partitioner::explain_transfers; runtime/comm/collectives.h): the group's
// recorded one, the ring for a ZeRO-1 all-gather (`gather`) of a group that
// records one, "" for the communicator's own.
std::string group_algorithm(const serialization::PlanPipeline &p, int64_t group, bool gather);

// The summary lines of `strata compile` and `strata inspect`: mode,
// fingerprints, inputs, parameters, FLOPs, and a pipeline's stages or a
// one-device plan's memory.
void print_plan_summary(const serialization::Plan &plan, std::ostream &out);

} // namespace strata::tools
