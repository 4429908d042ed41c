// Turns a forward (inference) graph into a training-step graph.
//
// make_training_graph adds to a copy of `forward`:
//  - a labels input: "labels" (i64, the output's shape without its last dim)
//    for softmax_cross_entropy, or "targets" (the output's type) for mse;
//  - the loss node "loss" (SoftmaxCrossEntropy or MseLoss, reduction mean);
//  - the backward graph of the loss over the trainable parameters;
//  - the optimizer step (passes/optimizer.h), with its state tensors and
//    state updates.
// The graph outputs become [loss]. Running the result once is one training step.
#pragma once

#include <string>

#include "graph/graph.h"
#include "passes/optimizer.h"

namespace strata::passes {

struct TrainingOptions {
  std::string loss = "softmax_cross_entropy"; // or "mse"
  std::string output;                         // empty: the graph's first output
  OptimizerSpec optimizer;

  // The canonical text of the options, part of a plan's fingerprint:
  // "loss=...\noutput=...\noptimizer=...\n" (output resolved by the caller).
  std::string to_string() const;
};

// Errors name the option at fault and the model.
Result<Graph> make_training_graph(const Graph &forward, const TrainingOptions &options);

} // namespace strata::passes
