// Plan files: what `strata compile` writes and `strata run` executes.
//
// A plan is stored as a FlatBuffers binary (`.splan`, schema
// serialization/schemas/plan.fbs, identifier "STRP") or as its JSON text form
// (`.splan.json`; any JSON file whose first key is "plan_version" is read as a
// plan too). It embeds the graph to run as a Model table (model.fbs) and, per
// device, the program: node order and activation arena. Loading is two stages
// like models: the FlatBuffers Verifier checks structure, then the meaning of
// every field is checked (the embedded model with the model loader's own
// checks, then mode, loss, fingerprints, devices, programs). Errors name the
// file and the field. Saving is canonical: the same Plan gives the same bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace strata::serialization {

struct PlanDevice {
  uint32_t index = 0;
  std::string kind = "cpu";
  friend bool operator==(const PlanDevice &, const PlanDevice &) = default;
};

struct PlanProgram {
  uint32_t device = 0;
  std::vector<NodeId> order;    // a topological order of the plan's graph
  int64_t arena_bytes = 0;      // activation arena size
  std::vector<int64_t> offsets; // per tensor: arena offset, or -1
  friend bool operator==(const PlanProgram &, const PlanProgram &) = default;
};

struct Plan {
  enum class Mode { kInfer = 0, kTrain = 1 };
  Mode mode = Mode::kInfer;
  Graph graph;                   // the graph to run
  std::string loss;              // training: the loss tensor's name
  std::string loss_kind;         // training: "softmax_cross_entropy" or "mse"
  std::string optimizer;         // training: canonical optimizer string
  std::string model_fingerprint; // hex SHA-256 of the source model's canonical bytes
  std::string fingerprint;       // hex SHA-256 of those bytes and the options text
  std::vector<PlanDevice> devices;
  std::vector<PlanProgram> programs;
  std::string producer; // as read from a file; the writer always writes its own
};

std::string_view plan_mode_name(Plan::Mode mode);

// The plan fingerprint: hex SHA-256 of `model_bytes` (the source model's
// canonical binary form), a NUL byte, then `options_text` (the canonical options,
// e.g. "mode=train\nloss=mse\noptimizer=sgd:lr=0.1\noutput=logits\n").
std::string plan_fingerprint(llvm::ArrayRef<uint8_t> model_bytes, std::string_view options_text);

// Whether `path` names a plan by its extension: ".splan" or ".splan.json".
bool is_plan_path(std::string_view path);
// Whether the file at `path` is a plan: by extension, else by content (binary
// identifier "STRP", or JSON whose first key is "plan_version"). False when it
// cannot be read (the caller's load then reports why).
bool file_is_plan(const std::string &path);

Result<Plan> load_plan(const std::string &path);
Result<Plan> load_plan_from_buffer(llvm::ArrayRef<uint8_t> bytes, std::string_view display_name,
                                   std::string_view model_dir);
Result<Plan> load_plan_from_json(std::string_view json, std::string_view display_name,
                                 std::string_view model_dir);

Result<std::vector<uint8_t>> plan_to_flatbuffer(const Plan &plan);
Result<std::string> plan_to_json(const Plan &plan);

// Writes the plan (JSON if the path ends in ".json", else binary) atomically.
Status save_plan(const Plan &plan, const std::string &path);

} // namespace strata::serialization
