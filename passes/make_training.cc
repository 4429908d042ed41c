#include "passes/make_training.h"

#include "graph/builder.h"
#include "graph/verifier.h"
#include "ops/registry.h"
#include "passes/autodiff.h"

namespace strata::passes {
namespace {

// Switches every BatchNormalization node to the training form and adds, per node,
// new_running = (1 - momentum) * running + momentum * batch_stat for its mean and
// var inputs (batch stats from BatchNormStats: mean and unbiased variance, as
// PyTorch). The running mean/var become kState (persistent, never trained).
// `graph` changes only on success.
Status add_batch_norm_updates(Graph &graph, const std::string &model) {
  std::vector<NodeId> bn_nodes;
  for (NodeId id = 0; id < graph.num_nodes(); ++id)
    if (graph.node(id).op == "BatchNormalization") bn_nodes.push_back(id);
  if (bn_nodes.empty()) return Status::ok();
  Graph edited = graph;
  const auto consumers = edited.consumers();
  std::vector<bool> claimed(graph.num_tensors(), false);
  for (NodeId id : bn_nodes) {
    Node &node = edited.mutable_node(id);
    node.set_attr("training", int64_t{1});
    if (node.inputs.size() != 5)
      return invalid_argument("BatchNormalization node '", node.name, "' of ", model, " has ",
                              node.inputs.size(), " inputs, expected 5");
    for (size_t slot : {3, 4}) {
      const TensorId t = node.inputs[slot];
      Tensor &tensor = edited.mutable_tensor(t);
      const char *what = slot == 3 ? "running mean" : "running var";
      if (tensor.producer != kNoNode || tensor.kind == TensorKind::kInput)
        return invalid_argument("the ", what, " '", tensor.name, "' of BatchNormalization node '",
                                node.name, "' in ", model,
                                " must be a parameter, constant or state tensor to be updated "
                                "in training, but it is ",
                                tensor.producer != kNoNode ? "computed by a node"
                                                           : "a graph input");
      if (claimed[t] || consumers[t].size() != 1)
        return invalid_argument("the ", what, " '", tensor.name, "' of BatchNormalization node '",
                                node.name, "' in ", model,
                                " is read elsewhere too; training needs each BatchNormalization "
                                "node's running mean and var to be its own");
      claimed[t] = true;
      tensor.kind = TensorKind::kState;
    }
  }

  GraphBuilder builder(std::move(edited), ops::OpRegistry::global());
  std::vector<StateUpdate> updates;
  for (NodeId id : bn_nodes) {
    const Node node = builder.graph().node(id);
    const ops::OpDef *def = ops::OpRegistry::global().find(node.op);
    const double momentum = ops::AttrReader(node, *def).get_float("momentum");
    auto stats = builder.op("BatchNormStats", {node.inputs[0]}, {}, node.name + ".batch_stats");
    if (stats.size() != 2) break; // the builder's error is reported by finish()
    for (size_t i = 0; i < 2; ++i) {
      const TensorId running = node.inputs[3 + i];
      const std::string base = builder.name(running);
      const std::string dtype(dtype_name(builder.type(running).dtype));
      auto constant = [&](double value, const char *suffix) {
        return builder.op1("Constant", {},
                           {{"dtype", dtype},
                            {"shape", std::vector<int64_t>{}},
                            {"value", std::vector<double>{value}}},
                           base + suffix);
      };
      const TensorId keep =
          builder.op1("Mul", {running, constant(1.0 - momentum, ".keep")}, {}, base + ".decayed");
      const TensorId take =
          builder.op1("Mul", {stats[i], constant(momentum, ".momentum")}, {}, base + ".batch_part");
      const TensorId next = builder.op1("Add", {keep, take}, {}, base + ".next");
      updates.push_back({running, next});
    }
  }
  auto built = std::move(builder).finish();
  if (!built.is_ok())
    return built.status().with_context(
        str_cat("running statistics of BatchNormalization in ", model));
  graph = std::move(built).value();
  for (const StateUpdate &update : updates)
    graph.add_update(update);
  return Status::ok();
}

} // namespace

std::string TrainingOptions::to_string() const {
  return str_cat("loss=", loss, "\noutput=", output, "\noptimizer=", optimizer.to_string(), "\n");
}

namespace {

// Checks `forward` and `options` for training; the output the loss reads.
Result<TensorId> loss_output(const Graph &forward, const TrainingOptions &options,
                             const std::string &model) {
  if (forward.outputs().empty()) return invalid_argument(model, " has no outputs to train");
  if (!forward.updates().empty())
    return invalid_argument(model, " already has state updates (is it a training graph already?)");
  TensorId output = forward.outputs()[0];
  if (!options.output.empty()) {
    auto found = forward.find_tensor(options.output);
    if (!found)
      return invalid_argument("--loss-input '", options.output, "' is not a tensor of ", model);
    output = *found;
  }
  const TensorType &output_type = forward.tensor(output).type;
  if (!is_floating(output_type.dtype))
    return invalid_argument("--loss-input '", forward.tensor(output).name, "' of ", model, " is ",
                            output_type.to_string(), "; a loss needs a floating-point output");
  for (const char *name : {"labels", "targets", "loss"})
    if (forward.find_tensor(name) || forward.find_node(name))
      return invalid_argument(model, " already has a tensor or node named '", name,
                              "', which training adds");
  return output;
}

std::string model_name(const Graph &graph) {
  return graph.name().empty() ? "the model" : "model '" + graph.name() + "'";
}

// `graph` with the loss of `output` appended; its outputs become [loss].
Result<Graph> append_loss(Graph graph, TensorId output, const TrainingOptions &options,
                          const std::string &model) {
  const std::string output_name = graph.tensor(output).name;
  const TensorType output_type = graph.tensor(output).type;
  GraphBuilder builder(std::move(graph), ops::OpRegistry::global());
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
  Graph out = std::move(built).value();
  out.set_outputs({loss});
  return out;
}

// The backward pass of the loss (the first output) over the trainable
// parameters, and the optimizer step.
Result<Graph> append_backward_and_step(Graph graph, const TrainingOptions &options,
                                       const std::string &model) {
  const ops::OpRegistry &registry = ops::OpRegistry::global();
  const TensorId loss = graph.outputs()[0];
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

} // namespace

Result<Graph> make_training_graph(const Graph &forward, const TrainingOptions &options) {
  const std::string model = model_name(forward);
  ASSIGN_OR_RETURN(const TensorId output, loss_output(forward, options, model));
  // BatchNormalization: training form and running-statistics updates first, so the
  // running mean/var (now state) are not trainable parameters below.
  Graph edited = forward;
  RETURN_IF_ERROR(add_batch_norm_updates(edited, model));
  ASSIGN_OR_RETURN(Graph graph, append_loss(std::move(edited), output, options, model));
  return append_backward_and_step(std::move(graph), options, model);
}

Result<Graph> add_loss(const Graph &forward, const TrainingOptions &options) {
  const std::string model = model_name(forward);
  ASSIGN_OR_RETURN(const TensorId output, loss_output(forward, options, model));
  return append_loss(forward, output, options, model);
}

Result<Graph> make_training_graph_from_loss(const Graph &with_loss,
                                            const TrainingOptions &options) {
  const std::string model = model_name(with_loss);
  if (with_loss.outputs().size() != 1 || with_loss.tensor(with_loss.outputs()[0]).name != "loss")
    return invalid_argument(model, " does not end in the loss add_loss makes");
  if (!with_loss.updates().empty())
    return invalid_argument(model, " already has state updates (is it a training graph already?)");
  Graph edited = with_loss;
  RETURN_IF_ERROR(add_batch_norm_updates(edited, model));
  return append_backward_and_step(std::move(edited), options, model);
}

} // namespace strata::passes
