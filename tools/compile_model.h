// Compiling a model into a plan: what `strata compile` does between reading
// the model and writing the plan, shared with the Python module's
// Model.compile so that both give byte-identical plans for the same options.
//
// An inference plan is the model's graph with one node order and memory plan;
// a training plan adds the loss, backward pass and optimizer step
// (passes/make_training.h); any of the parallel options makes a pipeline-,
// data- or tensor-parallel training plan (partitioner/compile_pipeline.h), or
// `auto_plan` searches for one (partitioner/search/auto_plan.h). The plan's
// fingerprint covers the model's canonical bytes and the options' canonical
// text, as `strata run --resume` checks it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "partitioner/search/auto_plan.h"
#include "serialization/plan_io.h"

namespace strata::tools {

// The most devices a mesh (--mesh) or an --auto search (--devices) spans.
inline constexpr int kMaxDevices = 4096;

// What a plan is compiled with. Each field is the `strata compile` option of
// the same name, and errors name those options ("--mesh '2x2': ...").
struct CompileOptions {
  bool train = false;
  std::string loss = "softmax_cross_entropy";
  std::string optimizer = "sgd:lr=0.01";
  std::string output_tensor; // --loss-input: the tensor the loss reads; empty: the first output
  // Pipeline parallelism (training only).
  std::string mesh;                          // "DPxTPxPP"
  int64_t microbatches = 0;                  // 0: not given (1)
  std::string schedule = "1f1b";             // gpipe, 1f1b, interleaved or zb-h1
  int64_t chunks = 0;                        // interleaved: chunks per device; 0: not given (2)
  std::string cluster;                       // cluster spec JSON the costs are predicted for
  std::vector<std::string> stage_boundaries; // last forward node of each stage but the last
  bool profile = false;                      // time every node here instead of using the roofline
  int64_t zero = 0;                          // 1: shard the optimizer state; 2: gradients too
  bool no_prefetch = false;                  // ZeRO-3: gather right before the reader
  double bucket_mb = 25;                     // gradient bucket size in MiB; 0: no overlap
  bool recompute = false;                    // recompute activations in backward
  bool split_activations = false;            // TP: reduce-scatter partial sums into split ones
  // --auto: search the mesh, micro-batches and schedule for `devices` devices.
  bool auto_plan = false;
  int64_t devices = 0; // 0: every device of the cluster
};

struct CompiledModel {
  serialization::Plan plan;
  // With auto_plan: the candidates and why the winner won (its plan is `plan`).
  std::optional<partitioner::AutoResult> search;
};

// Compiles `forward`, read from `source` (named in errors of the model), into
// a plan with its fingerprints and, for one device, its node order and memory
// plan. The plan is not written.
Result<CompiledModel> compile_model(const Graph &forward, const CompileOptions &options,
                                    const std::string &source);

// The parallel options' part of the options text a pipeline plan's
// fingerprint covers (after "mode=train\n" and the training options' text):
// the mesh, micro-batches, schedule, stage boundaries, recomputation,
// buckets and cluster, as read off the plan. `strata verify --model` checks a
// model against a plan's fingerprint with it.
std::string pipeline_options_text(const serialization::Plan &plan);

} // namespace strata::tools
