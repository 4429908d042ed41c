#include "passes/make_training.h"

#include "graph/builder.h"
#include "graph/verifier.h"
#include "ops/registry.h"
#include "passes/autodiff.h"

namespace strata::passes {

std::string TrainingOptions::to_string() const {
  return str_cat("loss=", loss, "\noutput=", output, "\noptimizer=", optimizer.to_string(), "\n");
}

Result<Graph> make_training_graph(const Graph &forward, const TrainingOptions &options) {
  const std::string model = forward.name().empty() ? "the model" : "model '" + forward.name() + "'";
  if (forward.outputs().empty()) return invalid_argument(model, " has no outputs to train");
  if (!forward.updates().empty())
    return invalid_argument(model, " already has state updates (is it a training graph already?)");

  TensorId output = forward.outputs()[0];
  if (!options.output.empty()) {
    auto found = forward.find_tensor(options.output);
    if (!found)
      return invalid_argument("--output '", options.output, "' is not a tensor of ", model);
    output = *found;
  }
  const std::string &output_name = forward.tensor(output).name;
  const TensorType output_type = forward.tensor(output).type;
  if (!is_floating(output_type.dtype))
    return invalid_argument("--output '", output_name, "' of ", model, " is ",
                            output_type.to_string(), "; a loss needs a floating-point output");
  for (const char *name : {"labels", "targets", "loss"})
    if (forward.find_tensor(name) || forward.find_node(name))
      return invalid_argument(model, " already has a tensor or node named '", name,
                              "', which training adds");

  const ops::OpRegistry &registry = ops::OpRegistry::global();
  GraphBuilder builder(forward, registry);
  TensorId loss = kInvalidTensor;
  if (options.loss == "softmax_cross_entropy") {
    if (output_type.rank() < 1)
      return invalid_argument("--loss softmax_cross_entropy needs an output of rank >= 1 "
                              "(..., classes), but '",
                              output_name, "' of ", model, " is ", output_type.to_string());
    Shape label_shape(output_type.shape.begin(), output_type.shape.end() - 1);
    TensorId labels = builder.input("labels", DType::kI64, label_shape);
    loss = builder.op1("SoftmaxCrossEntropy", {output, labels},
                       {{"reduction", std::string("mean")}}, "loss");
  } else if (options.loss == "mse") {
    TensorId targets = builder.input("targets", output_type.dtype, output_type.shape);
    loss = builder.op1("MseLoss", {output, targets}, {{"reduction", std::string("mean")}}, "loss");
  } else {
    return invalid_argument("--loss '", options.loss, "' for ", model,
                            " is not a known loss (softmax_cross_entropy or mse)");
  }
  auto built = std::move(builder).finish();
  if (!built.is_ok())
    return built.status().with_context(str_cat("--loss ", options.loss, " on ", model));
  Graph graph = std::move(built).value();
  graph.set_outputs({loss});

  std::vector<TensorId> targets = trainable_parameters(graph);
  if (targets.empty()) return invalid_argument(model, " has no trainable (float) parameters");
  auto gradients = append_backward(graph, loss, targets);
  if (!gradients.is_ok())
    return gradients.status().with_context(str_cat("backward pass of ", model));
  Status optimized = append_optimizer(graph, *gradients, options.optimizer);
  if (!optimized.is_ok())
    return optimized.with_context(
        str_cat("--optimizer ", options.optimizer.to_string(), " on ", model));
  Status verified = verify_graph(graph, registry);
  if (!verified.is_ok()) return verified.with_context(str_cat("training graph of ", model));
  return graph;
}

} // namespace strata::passes
