// What every plan a loader accepts must satisfy:
//  - its graph satisfies check_model (fuzz/model_checks.h);
//  - its canonical bytes load back to a plan of the same meaning (mode, loss,
//    optimizer, fingerprints, devices, programs, pipeline), which saves to the
//    same bytes;
//  - its JSON text loads back and saves to the same text and, unless its graph
//    holds a NaN, to the same bytes;
//  - a pipeline plan's cluster spec, where `strata inspect` and `strata
//    simulate` parse it, is refused cleanly or satisfies check_cluster, and
//    what `strata run` checks before any device starts
//    (runtime::core::PipelinePlan::create) accepts it or refuses it cleanly.
#pragma once

#include <string>
#include <string_view>

#include "fuzz/cluster_checks.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/model_checks.h"
#include "partitioner/cost/cluster.h"
#include "runtime/core/pipeline_plan.h"
#include "serialization/plan_io.h"

namespace strata::fuzz {

// Everything a plan means; `producer` is left out, as every writer writes its own.
inline bool same_meaning(const serialization::Plan &a, const serialization::Plan &b) {
  return a.mode == b.mode && a.loss == b.loss && a.loss_kind == b.loss_kind &&
         a.optimizer == b.optimizer && a.model_fingerprint == b.model_fingerprint &&
         a.fingerprint == b.fingerprint && a.devices == b.devices && a.programs == b.programs &&
         a.pipeline == b.pipeline;
}

// `display_name` is the name the plan was loaded under (errors must name it);
// `model_dir` the folder its external data paths are checked against.
inline void check_plan(const serialization::Plan &plan, std::string_view display_name,
                       const std::string &model_dir) {
  check_model(plan.graph, model_dir);

  auto bytes = serialization::plan_to_flatbuffer(plan);
  check(bytes.is_ok(), "an accepted plan cannot be saved", bytes.status().to_string());
  auto reloaded = serialization::load_plan_from_buffer(*bytes, "canonical.splan", model_dir);
  check(reloaded.is_ok(), "a plan's canonical bytes do not load", reloaded.status().to_string());
  check(same_meaning(plan, *reloaded), "a plan changes meaning over save and load");
  auto bytes_again = serialization::plan_to_flatbuffer(*reloaded);
  check(bytes_again.is_ok() && *bytes_again == *bytes,
        "a plan's canonical bytes change over load and save");

  auto text = serialization::plan_to_json(plan);
  check(text.is_ok(), "an accepted plan has no JSON text", text.status().to_string());
  auto from_text = serialization::load_plan_from_json(*text, "canonical.splan.json", model_dir);
  check(from_text.is_ok(), "a plan's JSON text does not load", from_text.status().to_string());
  auto text_again = serialization::plan_to_json(*from_text);
  check(text_again.is_ok() && *text_again == *text, "a plan's JSON text changes over load and save",
        *text);
  if (!has_nan(plan.graph)) {
    auto bytes_from_text = serialization::plan_to_flatbuffer(*from_text);
    check(bytes_from_text.is_ok() && *bytes_from_text == *bytes,
          "binary -> JSON -> binary changes a plan's bytes", *text);
  }

  if (!plan.pipeline) return;
  auto cluster = partitioner::parse_cluster(plan.pipeline->cluster_json, display_name);
  if (cluster.is_ok())
    check_cluster(*cluster);
  else
    check_refusal(cluster.status(), display_name);
  auto pipeline = runtime::core::PipelinePlan::create(plan, display_name);
  if (!pipeline.is_ok()) check_refusal(pipeline.status(), display_name);
}

} // namespace strata::fuzz
