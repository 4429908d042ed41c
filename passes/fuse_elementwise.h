// Elementwise chains a backend may run as one kernel.
//
// A chain is a path of elementwise f32 nodes (unary maps such as Relu, Gelu,
// Exp; binaries such as Add, Mul, ReluGrad) of one output shape, each reading
// the previous one's output, whose every output but the last has no reader
// but the next node (not a graph output, not a state update's value). Every
// other operand of a chain node is broadcast to that shape (a bias, a
// scalar). Run as one kernel, a chain reads its operands once and writes only
// its last output: the intermediates never reach memory. Each element goes
// through the same f32 operations in the same order as node by node, so the
// results are bitwise those of the unfused nodes.
#pragma once

#include <vector>

#include "graph/graph.h"

namespace strata::passes {

// Whether a chain may hold `node`: an op the registry marks
// Elementwise::kFusable, with one f32 output of rank 8 at most and one or two
// f32 inputs that broadcast to it.
bool fusable_elementwise(const Graph &graph, const Node &node);

// The graph's maximal chains of at least two nodes, each in order (first to
// last), chains ordered by their first node in `order` (a topological order).
// Every node is in at most one chain; a chain holds at most `max_nodes` nodes
// and reads at most `max_operands` tensors besides its own intermediates.
std::vector<std::vector<NodeId>> find_elementwise_chains(const Graph &graph,
                                                         const std::vector<NodeId> &order,
                                                         int max_nodes = 16, int max_operands = 16);

} // namespace strata::passes
