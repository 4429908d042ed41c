// What `strata inspect` reports about a model, and the facts it prints about a
// plan, as JSON: for `strata inspect --format json` and for the Python
// module's Model.inspect() and Plan.inspect().
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "graph/graph.h"
#include "partitioner/search/auto_plan.h"
#include "passes/plan_memory.h"
#include "serialization/plan_io.h"
#include "tools/model_stats.h"

namespace strata::tools {

// The activation memory plan of a model's graph in one topological order;
// nullopt where the graph cannot be ordered or planned.
std::optional<passes::MemoryPlan> plan_activations(const Graph &graph);

// A model's report: file, name, inputs, outputs, parameters, FLOPs and bytes
// per forward, the activation arena, per op type and per node. `path` is
// reported as given.
nlohmann::ordered_json model_json(const std::string &path, const Graph &graph,
                                  const ModelStats &stats,
                                  const std::optional<passes::MemoryPlan> &activations);

// A plan's facts, as the text of `strata inspect PLAN --comm` gives them:
// mode, fingerprints, loss and optimizer, inputs and outputs (and the batch a
// whole step takes), parameters and optimizer state, FLOPs, each device's
// nodes and activation memory; for a pipeline plan its layout (stages,
// micro-batches, schedule, replicas, tensor-parallel groups, buckets,
// recomputation), the predicted step and bubble, each device's share
// (nodes, parameters, FLOPs, peak activations, predicted busy time, what it
// sends) and every transfer of a step with its size, count, predicted time
// and why it is there. Errors name `source` (a cluster spec in the plan that
// does not parse).
Result<nlohmann::ordered_json> plan_report(const serialization::Plan &plan,
                                           std::string_view source);

// --auto's search: every candidate with its predicted numbers or its error,
// the winner and why it won.
nlohmann::ordered_json search_json(const partitioner::AutoResult &search);

} // namespace strata::tools
