#include "passes/autodiff.h"

#include <llvm/ADT/BitVector.h>

#include "graph/builder.h"
#include "ops/registry.h"

namespace strata::passes {
namespace {

// Adds `contribution` into the running gradient of a tensor.
TensorId accumulate(GraphBuilder &builder, TensorId sum, TensorId contribution,
                    const std::string &tensor_name) {
  if (sum == kInvalidTensor) return contribution;
  return builder.op1("Add", {sum, contribution}, {}, str_cat(tensor_name, ".grad.accumulate"));
}

} // namespace

std::vector<TensorId> trainable_parameters(const Graph &graph) {
  std::vector<TensorId> params;
  for (TensorId id = 0; id < graph.num_tensors(); ++id) {
    const Tensor &t = graph.tensor(id);
    if (t.kind == TensorKind::kParameter && is_floating(t.type.dtype)) params.push_back(id);
  }
  return params;
}

Result<std::vector<Gradient>> append_backward(Graph &graph, TensorId loss,
                                              llvm::ArrayRef<TensorId> targets) {
  const ops::OpRegistry &registry = ops::OpRegistry::global();
  if (loss >= graph.num_tensors()) return invalid_argument("the loss is not a tensor of the graph");
  const TensorType loss_type = graph.tensor(loss).type;
  if (!is_floating(loss_type.dtype) || loss_type.num_elements() != 1)
    return invalid_argument("the loss '", graph.tensor(loss).name,
                            "' must be a floating-point scalar, got ", loss_type.to_string());
  for (TensorId target : targets) {
    if (target >= graph.num_tensors())
      return invalid_argument("a differentiation target is not a tensor of the graph");
    if (!is_floating(graph.tensor(target).type.dtype))
      return invalid_argument("cannot differentiate with respect to '", graph.tensor(target).name,
                              "': it is ", dtype_name(graph.tensor(target).type.dtype));
  }
  ASSIGN_OR_RETURN(std::vector<NodeId> order, graph.topological_order());

  // Tensors that depend on a target (forward reach) ...
  llvm::BitVector depends_on_target(graph.num_tensors());
  for (TensorId target : targets)
    depends_on_target.set(target);
  for (NodeId id : order) {
    const Node &node = graph.node(id);
    bool any = false;
    for (TensorId input : node.inputs)
      any |= depends_on_target.test(input);
    if (any)
      for (TensorId output : node.outputs)
        depends_on_target.set(output);
  }
  // ... and that the loss depends on (backward reach). A node is differentiated
  // when one of its outputs is on both.
  llvm::BitVector reaches_loss(graph.num_tensors());
  reaches_loss.set(loss);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const Node &node = graph.node(*it);
    bool any = false;
    for (TensorId output : node.outputs)
      any |= reaches_loss.test(output);
    if (any)
      for (TensorId input : node.inputs)
        reaches_loss.set(input);
  }

  const size_t forward_tensors = graph.num_tensors();
  // Work on a copy (weights are shared, not copied) so a failure leaves `graph` as it was.
  GraphBuilder builder(graph, registry);
  std::vector<TensorId> grads(forward_tensors, kInvalidTensor);
  // The seed: dLoss/dLoss = 1, in the loss's dtype and shape.
  {
    TensorId one = builder.op1(
        "Constant", {},
        {{"dtype", std::string(dtype_name(loss_type.dtype))},
         {"shape", std::vector<int64_t>(loss_type.shape.begin(), loss_type.shape.end())},
         {"value", std::vector<double>{1.0}}},
        str_cat(builder.name(loss), ".grad.seed"));
    grads[loss] = one;
  }

  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const Node node = builder.graph().node(*it);
    bool on_path = false;
    for (TensorId output : node.outputs)
      on_path |= depends_on_target.test(output) && reaches_loss.test(output) &&
                 grads[output] != kInvalidTensor;
    if (!on_path) continue;

    const ops::OpDef *def = registry.find(node.op);
    if (def == nullptr) return not_found("node '", node.name, "': unknown op '", node.op, "'");
    if (def->grad == nullptr)
      return unimplemented("node '", node.name, "' (", node.op,
                           ") lies between a parameter and the loss but ", node.op,
                           " has no gradient rule");
    ops::GradContext context{builder, node, *def, {}, {}, {}};
    for (TensorId output : node.outputs)
      context.output_grads.push_back(grads[output]);
    for (TensorId input : node.inputs) {
      context.needs_input_grad.push_back(depends_on_target.test(input) &&
                                         is_floating(builder.type(input).dtype));
      context.input_grads.push_back(kInvalidTensor);
    }
    Status status = def->grad(context);
    if (!status.is_ok())
      return std::move(status).with_context(
          str_cat("gradient of node '", node.name, "' (", node.op, ")"));
    RETURN_IF_ERROR(builder.status());
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      TensorId grad = context.input_grads[i];
      if (grad == kInvalidTensor || !context.needs_input_grad[i]) continue;
      TensorId input = node.inputs[i];
      if (!(builder.type(grad) == builder.type(input)))
        return internal_error("gradient rule of ", node.op, " (node '", node.name, "') gave input ",
                              i, " a gradient of type ", builder.type(grad).to_string(),
                              " but the input is ", builder.type(input).to_string());
      grads[input] = accumulate(builder, grads[input], grad, builder.name(input));
    }
  }
  RETURN_IF_ERROR(builder.status());

  std::vector<Gradient> result;
  for (TensorId target : targets) {
    TensorId grad = grads[target];
    if (grad == kInvalidTensor) {
      // The loss does not depend on this target: its gradient is zero.
      const TensorType &type = builder.type(target);
      grad = builder.op1("Constant", {},
                         {{"dtype", std::string(dtype_name(type.dtype))},
                          {"shape", std::vector<int64_t>(type.shape.begin(), type.shape.end())},
                          {"value", std::vector<double>{0.0}}},
                         str_cat(builder.name(target), ".grad.zero"));
    }
    result.push_back({target, grad});
  }
  RETURN_IF_ERROR(builder.status());
  ASSIGN_OR_RETURN(graph, std::move(builder).finish());
  return result;
}

} // namespace strata::passes
