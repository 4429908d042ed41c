// Reverse-mode automatic differentiation of a graph.
//
// Given a scalar loss tensor and the tensors to differentiate with respect to
// (usually the trainable parameters), append_backward appends the backward graph:
// it visits the forward nodes that lie on a path from a differentiated tensor to
// the loss in reverse topological order and asks each op's gradient rule (in the
// op registry) for the gradients of its inputs. A tensor read by several nodes gets
// the sum of their contributions, added in a fixed order, so the backward graph is
// the same every time. A target the loss does not depend on gets a zero gradient.
// The forward part of the graph is left untouched.
#pragma once

#include <vector>

#include "graph/graph.h"

namespace strata::passes {

struct Gradient {
  TensorId target;   // the tensor differentiated with respect to
  TensorId gradient; // dLoss/dTarget, the same type as target
};

// Appends the backward graph for d`loss`/d`targets` to `graph`. The loss must be a
// floating-point scalar (rank 0, or every dimension 1). Errors name the node
// whose op has no gradient rule, or the rule that failed.
Result<std::vector<Gradient>> append_backward(Graph &graph, TensorId loss,
                                              llvm::ArrayRef<TensorId> targets);

// The float parameters of `graph` in tensor order: the default set of targets.
std::vector<TensorId> trainable_parameters(const Graph &graph);

} // namespace strata::passes
