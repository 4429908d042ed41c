// GraphBuilder: adds inputs, parameters and ops to a Graph, inferring each op's
// output types through the op registry.
//
// Errors are sticky: after the first failure every call returns kInvalidTensor
// and does nothing, and `finish()` returns that first error. Model-building code
// can then read straight through without checking every line.
#pragma once

#include <initializer_list>

#include "graph/graph.h"

namespace strata {

inline constexpr TensorId kInvalidTensor = UINT32_MAX;

class GraphBuilder {
public:
  GraphBuilder(std::string graph_name, const OpResolver &resolver)
      : graph_(std::move(graph_name)), resolver_(resolver) {}
  // Continues building an existing graph (passes append nodes this way).
  GraphBuilder(Graph graph, const OpResolver &resolver)
      : graph_(std::move(graph)), resolver_(resolver) {}

  TensorId input(std::string name, DType dtype, Shape shape);
  TensorId parameter(std::string name, DType dtype, Shape shape, Initializer initializer);
  TensorId parameter(std::string name, DType dtype, Shape shape, std::shared_ptr<const Blob> data);
  TensorId constant(std::string name, DType dtype, Shape shape, std::shared_ptr<const Blob> data);
  // A scalar f32 constant, named after its value when no name is given.
  TensorId scalar(float value, std::string name = "");

  // Adds node `op` reading `inputs`; returns its outputs. The node is called `name`
  // (made unique) or after the op; outputs are named after the node ("node",
  // then "node:1", "node:2" ...).
  llvm::SmallVector<TensorId, 2> op(std::string_view op, llvm::ArrayRef<TensorId> inputs,
                                    std::vector<Attribute> attrs = {}, std::string_view name = "");
  // The same for an op with exactly one output.
  TensorId op1(std::string_view op, llvm::ArrayRef<TensorId> inputs,
               std::vector<Attribute> attrs = {}, std::string_view name = "");

  void output(TensorId id);

  const TensorType &type(TensorId id) const { return graph_.tensor(id).type; }
  const std::string &name(TensorId id) const { return graph_.tensor(id).name; }
  const Graph &graph() const { return graph_; }
  const Status &status() const { return status_; }

  // The built graph, or the first error.
  Result<Graph> finish() &&;

private:
  TensorId add_value_tensor(Tensor tensor);

  Graph graph_;
  const OpResolver &resolver_;
  Status status_;
};

} // namespace strata
