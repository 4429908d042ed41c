#include "graph/verifier.h"

#include <cmath>

#include <llvm/ADT/DenseSet.h>
#include <llvm/ADT/StringSet.h>

namespace strata {
namespace {

// An initializer must make values of its tensor's dtype: random ones a
// floating dtype, with a finite mean and a finite, non-negative stddev
// (normal) or finite bounds low <= high (uniform); a constant of an integer
// or bool tensor a finite value in the dtype's range. Otherwise the values
// would be NaN, fall outside the bounds, or fail only when first drawn.
Status verify_initializer(const Tensor &t) {
  const Initializer &init = t.initializer;
  auto bad = [&](auto &&...parts) {
    return invalid_argument("tensor '", t.name, "' (", t.type.to_string(), "): initializer ",
                            initializer_kind_name(init.kind), ": ", parts...);
  };
  const bool floating = is_floating(t.type.dtype);
  switch (init.kind) {
  case Initializer::Kind::kNone:
  case Initializer::Kind::kZeros:
  case Initializer::Kind::kOnes: return Status::ok();
  case Initializer::Kind::kConstant: {
    if (floating) return Status::ok(); // inf and NaN are values of a float tensor
    const double value = init.a;
    if (!std::isfinite(value))
      return bad("value ", value, " is not finite, so it has no ", dtype_name(t.type.dtype),
                 " value");
    // Truncated toward zero, the value must fit the dtype.
    if ((t.type.dtype == DType::kI32 && (value <= -2147483649.0 || value >= 2147483648.0)) ||
        (t.type.dtype == DType::kI64 &&
         (value < -9223372036854775808.0 || value >= 9223372036854775808.0)))
      return bad("value ", value, " does not fit ", dtype_name(t.type.dtype));
    return Status::ok();
  }
  case Initializer::Kind::kNormal:
    if (!floating) return bad("needs a floating dtype");
    if (!std::isfinite(init.a)) return bad("mean ", init.a, " is not finite");
    if (!(init.b >= 0) || !std::isfinite(init.b))
      return bad("stddev ", init.b, " must be finite and at least 0");
    return Status::ok();
  case Initializer::Kind::kUniform:
    if (!floating) return bad("needs a floating dtype");
    if (!std::isfinite(init.a) || !std::isfinite(init.b))
      return bad("bounds [", init.a, ", ", init.b, ") must be finite");
    if (init.a > init.b)
      return bad("bounds [", init.a, ", ", init.b, ") are reversed (low ", init.a, " > high ",
                 init.b, ")");
    return Status::ok();
  }
  return invalid_argument("tensor '", t.name, "': field initializer.kind has unknown value ",
                          static_cast<int>(init.kind));
}

Status verify_tensor(const Graph &graph, TensorId id) {
  const Tensor &t = graph.tensor(id);
  auto where = [&] { return str_cat("tensor '", t.name, "'"); };
  if (!parse_dtype(dtype_name(t.type.dtype)))
    return invalid_argument(where(), ": field dtype has unknown value ",
                            static_cast<int>(t.type.dtype));
  auto count = checked_num_elements(t.type.shape);
  if (!count.is_ok()) return count.status().with_context(str_cat(where(), ": field shape"));
  int64_t bytes = *count * static_cast<int64_t>(dtype_size(t.type.dtype));
  int sources = (t.data != nullptr) + t.external.has_value() +
                (t.initializer.kind != Initializer::Kind::kNone);
  switch (t.kind) {
  case TensorKind::kParameter:
  case TensorKind::kConstant:
  case TensorKind::kState:
    if (sources != 1)
      return invalid_argument(
          where(), " (", tensor_kind_name(t.kind),
          ") needs exactly one of data, external data or an initializer; it has ", sources);
    if (t.data != nullptr && static_cast<int64_t>(t.data->size()) != bytes)
      return invalid_argument(where(), ": field data has ", t.data->size(), " bytes but ",
                              t.type.to_string(), " needs ", bytes);
    if (t.producer != kNoNode)
      return invalid_argument(where(), " is a ", tensor_kind_name(t.kind),
                              " but is produced by node '", graph.node(t.producer).name, "'");
    break;
  case TensorKind::kInput:
    if (sources != 0) return invalid_argument(where(), " is a graph input but carries a value");
    if (t.producer != kNoNode)
      return invalid_argument(where(), " is a graph input but is produced by node '",
                              graph.node(t.producer).name, "'");
    break;
  case TensorKind::kIntermediate:
    if (sources != 0) return invalid_argument(where(), " is an intermediate but carries a value");
    if (t.producer == kNoNode)
      return invalid_argument(where(), " is an intermediate that no node produces");
    break;
  default:
    return invalid_argument(where(), ": field kind has unknown value ", static_cast<int>(t.kind));
  }
  return verify_initializer(t);
}

} // namespace

Status verify_graph(const Graph &graph, const OpResolver &resolver) {
  RETURN_IF_ERROR(check_name("the graph name", graph.name()));
  llvm::StringSet<> tensor_names, node_names;
  for (TensorId id = 0; id < graph.num_tensors(); ++id) {
    const Tensor &t = graph.tensor(id);
    if (t.name.empty()) return invalid_argument("tensor ", id, " has no name");
    RETURN_IF_ERROR(check_name(str_cat("tensor ", id, ": name"), t.name));
    if (!tensor_names.insert(t.name).second)
      return invalid_argument("tensor name '", t.name, "' is used twice");
    RETURN_IF_ERROR(verify_tensor(graph, id));
  }

  // Producers recorded on tensors must agree with node outputs.
  for (NodeId id = 0; id < graph.num_nodes(); ++id) {
    const Node &node = graph.node(id);
    auto where = [&] { return str_cat("node '", node.name, "' (", node.op, ")"); };
    if (node.name.empty()) return invalid_argument("node ", id, " has no name");
    RETURN_IF_ERROR(check_name(str_cat("node ", id, ": name"), node.name));
    RETURN_IF_ERROR(check_name(str_cat("node ", id, ": op"), node.op));
    for (const Attribute &attr : node.attrs)
      RETURN_IF_ERROR(check_name(str_cat(where(), ": attribute name"), attr.name));
    if (!node_names.insert(node.name).second)
      return invalid_argument("node name '", node.name, "' is used twice");
    for (size_t i = 0; i < node.inputs.size(); ++i)
      if (node.inputs[i] >= graph.num_tensors())
        return out_of_range(where(), ": field inputs[", i, "] = ", node.inputs[i],
                            " is not a tensor index (the graph has ", graph.num_tensors(), ")");
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      if (node.outputs[i] >= graph.num_tensors())
        return out_of_range(where(), ": field outputs[", i, "] = ", node.outputs[i],
                            " is not a tensor index (the graph has ", graph.num_tensors(), ")");
      if (graph.tensor(node.outputs[i]).producer != id)
        return invalid_argument(where(), ": output tensor '", graph.tensor(node.outputs[i]).name,
                                "' has another producer");
    }
    for (size_t i = 1; i < node.attrs.size(); ++i)
      if (!(node.attrs[i - 1].name < node.attrs[i].name))
        return invalid_argument(where(), ": attribute '", node.attrs[i].name,
                                "' is repeated or out of order");
  }

  llvm::DenseSet<TensorId> listed_inputs;
  for (TensorId id : graph.inputs()) {
    if (id >= graph.num_tensors())
      return out_of_range("graph input index ", id, " is not a tensor index");
    if (graph.tensor(id).kind != TensorKind::kInput)
      return invalid_argument("graph input '", graph.tensor(id).name, "' is a ",
                              tensor_kind_name(graph.tensor(id).kind), ", not an input");
    if (!listed_inputs.insert(id).second)
      return invalid_argument("graph input '", graph.tensor(id).name, "' is listed twice");
  }
  for (TensorId id = 0; id < graph.num_tensors(); ++id)
    if (graph.tensor(id).kind == TensorKind::kInput && !listed_inputs.count(id))
      return invalid_argument("tensor '", graph.tensor(id).name,
                              "' is an input but not listed among the graph inputs");
  if (graph.outputs().empty()) return invalid_argument("the graph has no outputs");
  for (TensorId id : graph.outputs())
    if (id >= graph.num_tensors())
      return out_of_range("graph output index ", id, " is not a tensor index");

  llvm::DenseSet<TensorId> updated;
  for (size_t i = 0; i < graph.updates().size(); ++i) {
    const StateUpdate &update = graph.updates()[i];
    if (update.target >= graph.num_tensors() || update.value >= graph.num_tensors())
      return out_of_range("update ", i, " refers to a tensor index past the graph's ",
                          graph.num_tensors(), " tensors");
    const Tensor &target = graph.tensor(update.target);
    const Tensor &value = graph.tensor(update.value);
    if (target.kind != TensorKind::kParameter && target.kind != TensorKind::kState)
      return invalid_argument("update ", i, " assigns to '", target.name, "', a ",
                              tensor_kind_name(target.kind), " (only parameters and state change)");
    if (!(target.type == value.type))
      return invalid_argument("update ", i, " assigns '", value.name, "' (", value.type.to_string(),
                              ") to '", target.name, "' (", target.type.to_string(), ")");
    if (!updated.insert(update.target).second)
      return invalid_argument("'", target.name, "' is updated twice");
  }

  ASSIGN_OR_RETURN(auto order, graph.topological_order());
  for (NodeId id : order) {
    const Node &node = graph.node(id);
    llvm::SmallVector<TensorType, 4> input_types;
    for (TensorId input : node.inputs)
      input_types.push_back(graph.tensor(input).type);
    auto inferred = resolver.infer_types(node, input_types);
    if (!inferred.is_ok()) return with_node_context(inferred.status(), node);
    if (inferred->size() != node.outputs.size())
      return invalid_argument("node '", node.name, "' (", node.op, ") has ", node.outputs.size(),
                              " outputs but the op produces ", inferred->size());
    for (size_t i = 0; i < inferred->size(); ++i) {
      const TensorType &declared = graph.tensor(node.outputs[i]).type;
      if (!(declared == (*inferred)[i]))
        return invalid_argument("node '", node.name, "' (", node.op, "): output tensor '",
                                graph.tensor(node.outputs[i]).name, "' is declared ",
                                declared.to_string(), " but the op produces ",
                                (*inferred)[i].to_string());
    }
  }
  return Status::ok();
}

} // namespace strata
