// The graph verifier: checks that a Graph means something.
//
// A graph is valid when
//  - every tensor and node name is non-empty and unique, and every name (the
//    graph's and its tensors', nodes', ops' and attributes') is UTF-8 without
//    NUL bytes;
//  - every node index refers to an existing tensor;
//  - every intermediate tensor has exactly one producer, and no other tensor has one;
//  - graph inputs are exactly the tensors of kind input, each listed once;
//  - parameters and constants have data, external data or an initializer, and
//    inline data is exactly shape x dtype bytes;
//  - an initializer makes values of its tensor's dtype: normal and uniform
//    only for floating dtypes, with a finite mean and a finite, non-negative
//    stddev, or finite bounds low <= high; a constant of an integer or bool
//    tensor is finite and fits the dtype;
//  - every shape is non-negative and its element count does not overflow;
//  - the nodes form no cycle;
//  - every op is known and the declared output types equal the inferred ones;
//  - there is at least one graph output, each an existing tensor.
// Errors name the node, tensor and field at fault.
#pragma once

#include "graph/graph.h"

namespace strata {

Status verify_graph(const Graph &graph, const OpResolver &resolver);

} // namespace strata
