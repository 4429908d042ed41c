// Model files: load, verify and save strata models.
//
// A model is stored as a FlatBuffers binary (`.strata`, schema
// serialization/schemas/model.fbs) or as its JSON text form (`.json`, the same
// schema through FlatBuffers' own parser and generator). Loading is two stages:
// the FlatBuffers Verifier checks structure, then semantic checks check meaning
// (schema version, index ranges, producers before consumers, no cycles, shapes
// without overflow, data sizes, external paths inside the model's folder, and the
// op registry's type inference). Every error names the file and the node, tensor
// or field at fault.
//
// Saving is canonical: the same Graph always gives the same bytes, so a binary
// converted to JSON and back is byte-identical.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace strata::serialization {

enum class ModelFormat { kBinary, kJson };

// The format implied by a path's extension: ".json" is JSON, anything else binary.
ModelFormat model_format_for_path(std::string_view path);

struct SaveOptions {
  // Parameters and constants with inline data larger than this many bytes are
  // written to `<model stem>.safetensors` beside the model instead (FlatBuffers
  // cannot exceed 2 GiB). Negative: never.
  int64_t external_threshold_bytes = -1;
};

// Reads, verifies and returns the model at `path` (binary or JSON by extension).
// External data paths stay relative; the runtime resolves them against the
// model's folder.
Result<Graph> load_model(const std::string &path);

// The same from bytes already in memory. `display_name` prefixes every error;
// `model_dir` is the folder external paths must stay inside.
Result<Graph> load_model_from_buffer(llvm::ArrayRef<uint8_t> bytes, std::string_view display_name,
                                     std::string_view model_dir);
Result<Graph> load_model_from_json(std::string_view json, std::string_view display_name,
                                   std::string_view model_dir);

// Canonical FlatBuffers bytes and JSON text of a graph.
Result<std::vector<uint8_t>> model_to_flatbuffer(const Graph &graph);
Result<std::string> model_to_json(const Graph &graph);

// Writes the model to `path` (format by extension) through a temporary file that
// is fsynced and renamed, so a failure never leaves a half-written model.
Status save_model(const Graph &graph, const std::string &path, const SaveOptions &options = {});

} // namespace strata::serialization
