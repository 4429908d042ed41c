#include "graph/builder.h"

#include <cmath>

namespace strata {

TensorId GraphBuilder::add_value_tensor(Tensor tensor) {
  if (!status_.is_ok()) return kInvalidTensor;
  if (auto count = checked_num_elements(tensor.type.shape); !count.is_ok()) {
    status_ = count.status().with_context(str_cat("tensor '", tensor.name, "'"));
    return kInvalidTensor;
  }
  auto id = graph_.add_tensor(std::move(tensor));
  if (!id.is_ok()) {
    status_ = id.status();
    return kInvalidTensor;
  }
  return *id;
}

TensorId GraphBuilder::input(std::string name, DType dtype, Shape shape) {
  Tensor t;
  t.name = std::move(name);
  t.type = {dtype, std::move(shape)};
  t.kind = TensorKind::kInput;
  TensorId id = add_value_tensor(std::move(t));
  if (id != kInvalidTensor) graph_.add_input(id);
  return id;
}

TensorId GraphBuilder::parameter(std::string name, DType dtype, Shape shape,
                                 Initializer initializer) {
  Tensor t;
  t.name = std::move(name);
  t.type = {dtype, std::move(shape)};
  t.kind = TensorKind::kParameter;
  t.initializer = initializer;
  return add_value_tensor(std::move(t));
}

TensorId GraphBuilder::parameter(std::string name, DType dtype, Shape shape,
                                 std::shared_ptr<const Blob> data) {
  Tensor t;
  t.name = std::move(name);
  t.type = {dtype, std::move(shape)};
  t.kind = TensorKind::kParameter;
  t.data = std::move(data);
  return add_value_tensor(std::move(t));
}

TensorId GraphBuilder::constant(std::string name, DType dtype, Shape shape,
                                std::shared_ptr<const Blob> data) {
  Tensor t;
  t.name = std::move(name);
  t.type = {dtype, std::move(shape)};
  t.kind = TensorKind::kConstant;
  t.data = std::move(data);
  return add_value_tensor(std::move(t));
}

TensorId GraphBuilder::scalar(float value, std::string name) {
  if (name.empty()) name = graph_.unique_name(str_cat("const_", value));
  return constant(std::move(name), DType::kF32, {}, Blob::copy_of(&value, sizeof value));
}

llvm::SmallVector<TensorId, 2> GraphBuilder::op(std::string_view op,
                                                llvm::ArrayRef<TensorId> inputs,
                                                std::vector<Attribute> attrs,
                                                std::string_view name) {
  if (!status_.is_ok()) return {};
  Node node;
  node.name = graph_.unique_name(name.empty() ? op : name);
  node.op = std::string(op);
  for (Attribute &attr : attrs)
    node.set_attr(std::move(attr.name), std::move(attr.value));
  llvm::SmallVector<TensorType, 4> input_types;
  for (TensorId input : inputs) {
    if (input >= graph_.num_tensors()) {
      status_ = invalid_argument("node '", node.name, "' (", op, "): input is not a valid tensor");
      return {};
    }
    node.inputs.push_back(input);
    input_types.push_back(graph_.tensor(input).type);
  }
  auto output_types = resolver_.infer_types(node, input_types);
  if (!output_types.is_ok()) {
    status_ = with_node_context(output_types.status(), node);
    return {};
  }
  llvm::SmallVector<TensorId, 2> outputs;
  for (size_t i = 0; i < output_types->size(); ++i) {
    Tensor t;
    t.name = i == 0 ? node.name : graph_.unique_name(str_cat(node.name, ":", i));
    t.type = (*output_types)[i];
    t.kind = TensorKind::kIntermediate;
    TensorId id = add_value_tensor(std::move(t));
    if (id == kInvalidTensor) return {};
    outputs.push_back(id);
    node.outputs.push_back(id);
  }
  if (auto added = graph_.add_node(std::move(node)); !added.is_ok()) {
    status_ = added.status();
    return {};
  }
  return outputs;
}

TensorId GraphBuilder::op1(std::string_view op_name, llvm::ArrayRef<TensorId> inputs,
                           std::vector<Attribute> attrs, std::string_view name) {
  auto outputs = op(op_name, inputs, std::move(attrs), name);
  if (!status_.is_ok()) return kInvalidTensor;
  if (outputs.size() != 1) {
    status_ = internal_error("op ", op_name, " has ", outputs.size(), " outputs, expected one");
    return kInvalidTensor;
  }
  return outputs[0];
}

void GraphBuilder::output(TensorId id) {
  if (!status_.is_ok()) return;
  if (id >= graph_.num_tensors()) {
    status_ = invalid_argument("graph output is not a valid tensor");
    return;
  }
  graph_.add_output(id);
}

Result<Graph> GraphBuilder::finish() && {
  if (!status_.is_ok()) return status_;
  return std::move(graph_);
}

} // namespace strata
