// Turns a forward (inference) graph into a training-step graph.
//
// make_training_graph adds to a copy of `forward`:
//  - for every BatchNormalization node: training = 1 (batch statistics), and the
//    running-statistics updates of PyTorch's BatchNorm in train mode,
//      running_mean <- (1 - momentum) * running_mean + momentum * batch_mean
//      running_var  <- (1 - momentum) * running_var  + momentum * unbiased_batch_var
//    (momentum: the node's attribute, default 0.1; batch statistics from a
//    BatchNormStats node on the same X). The running mean and var inputs become
//    state tensors (kState, keeping their values): persistent, checkpointed,
//    never trained nor given optimizer state. Each must be a parameter, constant
//    or state tensor read by that node alone. The forward graph itself is not
//    changed, so an inference plan built from it keeps training = 0 semantics
//    with the running statistics;
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

// The same in two halves, for passes that work on the forward graph with its
// loss (tensor parallelism splits the loss over vocabulary-split logits):
// add_loss appends the labels or targets input and the loss node, and makes
// the outputs [loss]; make_training_graph_from_loss adds the rest (batch-norm
// training form, backward, optimizer) to such a graph, possibly transformed
// since.
Result<Graph> add_loss(const Graph &forward, const TrainingOptions &options);
Result<Graph> make_training_graph_from_loss(const Graph &with_loss, const TrainingOptions &options);

} // namespace strata::passes
