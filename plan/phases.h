// The phases of a training step, read off the graph: what runs per
// micro-batch (forward, backward) and what once per step (the optimizer).
//
// A tensor computed per micro-batch and read once per step (a gradient, the
// loss) is accumulated: buffer (t, -1) holds the sum over micro-batches, then
// is divided by M, the mean the full batch would have given (every
// micro-batch has the same size and the loss is a mean).
#pragma once

#include <functional>
#include <vector>

#include "graph/graph.h"

namespace strata::plan {

enum class Phase : uint8_t { kForward, kBackward, kStep };

struct StepPhases {
  std::vector<Phase> node_phase; // by NodeId
  // Tensors computed per micro-batch that are read once per step, are graph
  // outputs or are the values of state updates, by id.
  std::vector<TensorId> accumulated;
};

// Splits a training graph's nodes into:
//  - per micro-batch, forward: the loss and everything it depends on;
//  - per micro-batch, backward: everything else that depends on the data and
//    is not optimizer work;
//  - once per step: the optimizer (ops whose registry entry is once_per_step,
//    and everything computed from them) and the nodes that depend on no data
//    at all (the step counter).
// Errors: a per-micro-batch node reading a per-step value, a state update
// whose value is computed per micro-batch when microbatches > 1 (batch
// statistics), an accumulated tensor that is not floating point.
Result<StepPhases> analyze_phases(const Graph &graph, int microbatches);

// The halves of one stage's backward for the zero-bubble schedules: B, kept
// in `backward` (the stage's backward nodes, in order), is the nodes that
// produce what leaves the stage each micro-batch (`sent`: the input
// gradient the stage before waits for) and the block's nodes those read; W,
// returned, is the rest (the weight gradients and what only they read), in
// order. A block that sends nothing stays whole: its W would only wait.
std::vector<NodeId> split_weight_half(const Graph &graph, std::vector<NodeId> &backward,
                                      const std::function<bool(TensorId)> &sent);

} // namespace strata::plan
