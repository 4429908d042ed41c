// Traces of what a plan's devices did (or are predicted to do), in the
// Chrome / Perfetto JSON format.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "serialization/plan_io.h"

namespace strata::plan {

// One executed (or predicted) instruction, for traces.
struct TraceSpan {
  uint32_t instruction = 0;
  double start_s = 0;
  double end_s = 0;
  int64_t step = 0;
  // Work of the device's communication stream (a StartBucket's reduction),
  // shown on a track of its own.
  bool stream = false;
};

// A Chrome / Perfetto trace (JSON, "traceEvents") of what each device did: one
// track per device; consecutive computation of one micro-batch's forward
// ("F3"), backward ("B3") or the step ("optimizer") becomes one event, with the
// node count in its args; every send and receive is its own event, so waiting
// shows as a receive's length. Load it in ui.perfetto.dev or chrome://tracing.
// With the plan's `pipeline` its devices are named by device_role, and with
// model chunks (the interleaved schedule) blocks are named "F3 c1"
// (micro-batch 3 of chunk 1).
std::string chrome_trace(const Graph &graph,
                         const std::vector<serialization::PlanProgram> &programs,
                         const std::vector<std::vector<TraceSpan>> &spans, int microbatches,
                         const serialization::PlanPipeline *pipeline = nullptr);

} // namespace strata::plan
