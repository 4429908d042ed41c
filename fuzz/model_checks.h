// What every graph a loader accepts (a model file, an imported ONNX model, a
// plan's graph) must satisfy:
//  - it passes verify_graph;
//  - its canonical bytes (unless more than one FlatBuffer holds) load back,
//    and save to the same bytes;
//  - its JSON text loads back, and saves to the same text and, unless a float
//    attribute or initializer figure is a NaN (the text keeps no NaN sign or
//    payload), to the same bytes: binary -> JSON -> binary is byte-identical;
//  - what `strata inspect` computes from it (statistics, a memory plan) works.
#pragma once

#include <cmath>
#include <string>
#include <variant>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "graph/graph.h"
#include "graph/verifier.h"
#include "ops/registry.h"
#include "passes/plan_memory.h"
#include "serialization/model_io.h"
#include "tools/model_stats.h"

namespace strata::fuzz {

// Whether a float the JSON text cannot carry bit for bit is in the graph.
inline bool has_nan(const Graph &graph) {
  for (const Tensor &t : graph.tensors())
    if (std::isnan(t.initializer.a) || std::isnan(t.initializer.b)) return true;
  for (const Node &node : graph.nodes())
    for (const Attribute &attr : node.attrs) {
      if (const auto *value = std::get_if<double>(&attr.value); value && std::isnan(*value))
        return true;
      if (const auto *values = std::get_if<std::vector<double>>(&attr.value))
        for (double value : *values)
          if (std::isnan(value)) return true;
    }
  return false;
}

// `bytes` (model_to_flatbuffer of `graph`) and the graph's JSON text load back
// to themselves.
inline void check_round_trips(const Graph &graph, const Result<std::vector<uint8_t>> &bytes,
                              const std::string &model_dir) {
  check(bytes.is_ok(), "an accepted model cannot be saved", bytes.status().to_string());
  auto reloaded = serialization::load_model_from_buffer(*bytes, "canonical.strata", model_dir);
  check(reloaded.is_ok(), "a model's canonical bytes do not load", reloaded.status().to_string());
  auto bytes_again = serialization::model_to_flatbuffer(*reloaded);
  check(bytes_again.is_ok() && *bytes_again == *bytes,
        "a model's canonical bytes change over load and save");

  auto text = serialization::model_to_json(graph);
  check(text.is_ok(), "an accepted model has no JSON text", text.status().to_string());
  auto from_text = serialization::load_model_from_json(*text, "canonical.json", model_dir);
  check(from_text.is_ok(), "a model's JSON text does not load", from_text.status().to_string());
  auto text_again = serialization::model_to_json(*from_text);
  check(text_again.is_ok() && *text_again == *text,
        "a model's JSON text changes over load and save", *text);
  if (!has_nan(graph)) {
    auto bytes_from_text = serialization::model_to_flatbuffer(*from_text);
    check(bytes_from_text.is_ok() && *bytes_from_text == *bytes,
          "binary -> JSON -> binary changes a model's bytes", *text);
  }
}

// `model_dir` is the folder external data paths are checked against.
inline void check_model(const Graph &graph, const std::string &model_dir) {
  const ops::OpRegistry &registry = ops::OpRegistry::global();
  Status verified = verify_graph(graph, registry);
  check(verified.is_ok(), "an accepted model fails verify_graph", verified.to_string());

  auto bytes = serialization::model_to_flatbuffer(graph);
  // More inline data than one FlatBuffer holds (an ONNX import's folded
  // constants can be that large) is saved only with its weights outside.
  const bool too_large = !bytes.is_ok() && bytes.status().code() == StatusCode::kOutOfRange;
  if (!too_large) check_round_trips(graph, bytes, model_dir);

  // What `strata inspect` prints for a model.
  auto stats = tools::compute_model_stats(graph, registry);
  check(stats.is_ok(), "compute_model_stats fails on a verified model", stats.status().to_string());
  auto order = graph.topological_order();
  check(order.is_ok(), "a verified model has no topological order", order.status().to_string());
  auto memory = passes::plan_memory(graph, *order);
  if (memory.is_ok())
    check(memory->offsets.size() == graph.num_tensors(),
          "plan_memory gives an offset list of the wrong length");
  else
    check_refusal(memory.status());
}

} // namespace strata::fuzz
