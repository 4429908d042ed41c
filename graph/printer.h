// Human-readable forms of a graph: an indented text listing and Graphviz DOT.
#pragma once

#include <string>

#include "graph/graph.h"

namespace strata {

// One line per input, parameter and node, in topological order:
//   %h = MatMul(%x: f32[2, 8], %w: f32[8, 4]) {transpose_b = 0} -> f32[2, 4]
std::string print_graph(const Graph &graph);

// A DOT digraph: nodes are ops (boxes) and value tensors (ellipses); edges are
// labelled with tensor types.
std::string graph_to_dot(const Graph &graph);

} // namespace strata
