// Activation recomputation (activation checkpointing; Chen et al. 2016,
// arXiv 1604.06174): the backward pass recomputes forward activations from a
// few kept ones instead of keeping all of them for every micro-batch in flight.
//
// recompute_activations(training) keeps the "checkpoints": the activations that
// cross the narrowest cuts of the forward order (between the layers of a
// model built from repeated blocks: the residual stream), and everything the
// last segment (after the last such cut) computes. Every other forward
// activation a backward node reads is recomputed: its producer and, recursively,
// the producers of its inputs back to checkpoints, parameters, constants and
// graph inputs are cloned as nodes named "<forward node>.recompute", and the
// backward nodes read the clones. The forward activations then die with their
// last forward reader, so a device keeps one checkpoint per segment per
// micro-batch in flight, at the price of about one more forward pass.
//
// The clones run the same kernels on the same inputs, so a step gives bitwise
// the same result with and without recomputation. Stochastic ops recompute the
// same values (Dropout's mask is a function of its seed, the step and the
// element index). The lowering runs each clone just before its first backward
// reader (partitioner/lowering/pipeline.h).
#pragma once

#include "graph/graph.h"

namespace strata::passes {

struct RecomputeStats {
  size_t checkpoints = 0; // activations kept for backward
  size_t cloned = 0;      // forward nodes recomputed
};

// `training` is a make_training_graph result whose first output is the loss.
// `also_keep` (by TensorId of `training`), when given, names more checkpoints:
// activations that must not be recomputed (the interleaved schedule keeps
// every activation that crosses a virtual stage, whose backward runs before
// the stage that produced it). Errors: no loss. A graph with nothing to
// recompute is returned unchanged.
Result<Graph> recompute_activations(const Graph &training, RecomputeStats *stats = nullptr,
                                    const std::vector<bool> *also_keep = nullptr);

// The forward part of a training graph: the nodes its outputs (the loss)
// depend on, by NodeId.
std::vector<bool> forward_part(const Graph &training);

// The suffix of recomputing clones' names.
inline constexpr std::string_view kRecomputeSuffix = ".recompute";

} // namespace strata::passes
