// Rebuilds a forward graph at a smaller batch, for pipeline micro-batching.
//
// split_batch(forward, M) returns the forward graph at batch B / M, where B is
// dim 0 of every graph input. The compiler builds the training graph
// (make_training_graph) from the result, runs it once per micro-batch and
// averages the gradients: with equal micro-batches that is the full batch's
// gradient, as long as no op combines samples.
//
// What changes: dim 0 of every graph input becomes b = B / M, the output types of
// every node that depends on an input are re-inferred through the op registry in
// topological order, and the ops whose attributes spell out a shape are rewritten
// (Reshape and Expand: their "shape"). Nothing else changes: names, tensor and
// node ids, kinds, parameters, constants, initializers and data, graph inputs,
// outputs and updates are those of `forward`, so per-element initializers and
// checkpoints match the full-batch graph. M = 1 returns an unchanged copy without
// further checks.
//
// The pass tracks the dim of every tensor that carries the batch: dim 0 of the
// inputs, then for each node output the one dim whose size went from n to n / M.
// Within that dim the micro-batches are contiguous equal slices, in order, so
// running the split graph on the M slices of the inputs and concatenating each
// output along its batch dim gives the full-batch result. Tensors that do not
// depend on any input keep their type and carry no batch.
//
// Each op says how the batch goes through it in its registry entry
// (ops::BatchRule); the pass names no op. It refuses, with an error naming the
// node, what would break that:
//  - an op that declares no batch rule: the pass cannot tell whether it keeps
//    samples apart;
//  - BatchNormalization when M > 1: the statistics are over the batch;
//  - ops that combine samples: ReduceSum/ReduceMean/ReduceMax whose axes
//    include the batch dim; Softmax/LogSoftmax along it; LayerNorm over it;
//    Conv2d, pooling, Gather, Slice, Split and Concat across or along it; any
//    node output that no longer carries the batch (a contraction or reduction
//    over it, a loss with reduction "mean" or "sum");
//  - a node output where more than one dim changed, or a dim changed by a
//    factor other than M; a Reshape or Flatten that does not keep the batch the
//    outermost part of a dim;
//  - training-mode Dropout with ratio > 0: its mask is keyed by element index,
//    so every micro-batch would draw the same mask;
//  - graphs with gradient or optimizer ops (split the forward graph, before
//    make_training_graph) or tensor-parallel collectives (before
//    shard_tensor_parallel).
// The result passes verify_graph.
#pragma once

#include <cstdint>

#include "graph/graph.h"
#include "ops/registry.h"

namespace strata::passes {

// What split_batch checks of every node of `graph` before it splits anything:
// an error naming the node where its op (`def`) declares no batch rule, or is
// one that only training or tensor parallelism adds (ops::BatchRule::kNotForward).
Status check_batch_rule(const Node &node, const ops::OpDef &def, const Graph &graph);

// The forward graph rebuilt at batch B / microbatches, where B is dim 0 of every
// graph input. Errors: microbatches < 1; a graph input of rank 0, inputs with
// different dim 0, a batch that microbatches does not divide ("input 'tokens'
// has batch 6, which 4 micro-batches do not divide"); a node through which the
// batch cannot be split ("cannot split the batch through node 'X' (Op): ...").
Result<Graph> split_batch(const Graph &forward, int64_t microbatches);

} // namespace strata::passes
