#include "ops/registry.h"

#include <algorithm>

namespace strata::ops {

const AttrValue &AttrReader::lookup(std::string_view name) const {
  if (const AttrValue *value = node_.find_attr(name)) return *value;
  const AttrSpec *spec = def_.find_attr(name);
  assert(spec != nullptr && spec->default_value.has_value() &&
         "attribute read without a default on an unchecked node");
  return *spec->default_value;
}

int64_t AttrReader::get_int(std::string_view name) const {
  const AttrValue &value = lookup(name);
  if (const auto *d = std::get_if<double>(&value)) return static_cast<int64_t>(*d);
  return std::get<int64_t>(value);
}

double AttrReader::get_float(std::string_view name) const {
  const AttrValue &value = lookup(name);
  if (const auto *i = std::get_if<int64_t>(&value)) return static_cast<double>(*i);
  return std::get<double>(value);
}

std::string AttrReader::get_string(std::string_view name) const {
  return std::get<std::string>(lookup(name));
}

std::vector<int64_t> AttrReader::get_ints(std::string_view name) const {
  return std::get<std::vector<int64_t>>(lookup(name));
}

std::vector<double> AttrReader::get_floats(std::string_view name) const {
  const AttrValue &value = lookup(name);
  if (const auto *ints = std::get_if<std::vector<int64_t>>(&value))
    return std::vector<double>(ints->begin(), ints->end());
  return std::get<std::vector<double>>(value);
}

const AttrSpec *OpDef::find_attr(std::string_view attr_name) const {
  for (const AttrSpec &spec : attrs)
    if (spec.name == attr_name) return &spec;
  return nullptr;
}

OpCost elementwise_cost(const Node &, const OpDef &, llvm::ArrayRef<TensorType> inputs,
                        llvm::ArrayRef<TensorType> outputs) {
  OpCost cost;
  for (const TensorType &t : inputs)
    cost.bytes_read += static_cast<double>(t.size_bytes());
  for (const TensorType &t : outputs) {
    cost.bytes_written += static_cast<double>(t.size_bytes());
    cost.flops += static_cast<double>(t.num_elements());
  }
  return cost;
}

OpRegistry::OpRegistry() {
  for (auto table :
       {elementwise_ops(), shape_ops(), reduction_ops(), nn_ops(), optimizer_ops(), parallel_ops()})
    for (const OpDef &def : table)
      sorted_.push_back(&def);
  std::sort(sorted_.begin(), sorted_.end(),
            [](const OpDef *a, const OpDef *b) { return a->name < b->name; });
  for (size_t i = 1; i < sorted_.size(); ++i)
    assert(sorted_[i - 1]->name != sorted_[i]->name && "op registered twice");
}

const OpRegistry &OpRegistry::global() {
  static const OpRegistry registry;
  return registry;
}

const OpDef *OpRegistry::find(std::string_view op) const {
  auto it = std::lower_bound(sorted_.begin(), sorted_.end(), op,
                             [](const OpDef *def, std::string_view n) { return def->name < n; });
  if (it == sorted_.end() || (*it)->name != op) return nullptr;
  return *it;
}

Collective collective_of(std::string_view op) {
  const OpDef *def = OpRegistry::global().find(op);
  return def != nullptr ? def->traits.collective : Collective::kNone;
}

namespace {
bool attr_type_matches(AttrType expected, const AttrValue &value) {
  AttrType actual = attr_type(value);
  if (actual == expected) return true;
  // Integers are accepted where floats are expected (JSON writes 1.0 as 1).
  return (expected == AttrType::kFloat && actual == AttrType::kInt) ||
         (expected == AttrType::kFloats && actual == AttrType::kInts);
}
} // namespace

Status OpRegistry::check_schema(const Node &node, size_t num_inputs) const {
  const OpDef *def = find(node.op);
  if (def == nullptr) return not_found("unknown op '", node.op, "'");
  int count = static_cast<int>(num_inputs);
  if (count < def->min_inputs || count > def->max_inputs) {
    if (def->min_inputs == def->max_inputs)
      return invalid_argument(node.op, " takes ", def->min_inputs, " inputs, got ", count);
    return invalid_argument(node.op, " takes ", def->min_inputs, " to ", def->max_inputs,
                            " inputs, got ", count);
  }
  for (const Attribute &attr : node.attrs) {
    const AttrSpec *spec = def->find_attr(attr.name);
    if (spec == nullptr) return invalid_argument(node.op, " has no attribute '", attr.name, "'");
    if (!attr_type_matches(spec->type, attr.value))
      return invalid_argument("attribute '", attr.name, "' of ", node.op, " must be ",
                              attr_type_name(spec->type), ", got ",
                              attr_type_name(attr_type(attr.value)));
  }
  for (const AttrSpec &spec : def->attrs)
    if (!spec.default_value && node.find_attr(spec.name) == nullptr)
      return invalid_argument(node.op, " needs attribute '", spec.name, "' (", spec.doc, ")");
  return Status::ok();
}

Result<llvm::SmallVector<TensorType, 2>>
OpRegistry::infer_types(const Node &node, llvm::ArrayRef<TensorType> input_types) const {
  RETURN_IF_ERROR(check_schema(node, input_types.size()));
  const OpDef &def = *find(node.op);
  return def.infer(node, def, input_types);
}

OpCost OpRegistry::cost(const Node &node, llvm::ArrayRef<TensorType> inputs,
                        llvm::ArrayRef<TensorType> outputs) const {
  const OpDef *def = find(node.op);
  if (def == nullptr) return {};
  if (def->cost == nullptr) return elementwise_cost(node, *def, inputs, outputs);
  return def->cost(node, *def, inputs, outputs);
}

OpCost OpRegistry::node_cost(const Graph &graph, NodeId id) const {
  const Node &node = graph.node(id);
  llvm::SmallVector<TensorType, 4> inputs, outputs;
  for (TensorId t : node.inputs)
    inputs.push_back(graph.tensor(t).type);
  for (TensorId t : node.outputs)
    outputs.push_back(graph.tensor(t).type);
  return cost(node, inputs, outputs);
}

TensorId reduce_to_shape(GradContext &context, TensorId grad, llvm::ArrayRef<int64_t> target,
                         std::string_view what) {
  GraphBuilder &b = context.builder;
  if (grad == kInvalidTensor) return grad;
  Shape shape = b.type(grad).shape;
  if (llvm::ArrayRef<int64_t>(shape) == target) return grad;
  std::vector<int64_t> axes;
  size_t lead = shape.size() - target.size();
  for (size_t i = 0; i < shape.size(); ++i)
    if (i < lead || (target[i - lead] == 1 && shape[i] != 1))
      axes.push_back(static_cast<int64_t>(i));
  TensorId summed = grad;
  if (!axes.empty())
    summed = b.op1("ReduceSum", {grad}, {{"axes", axes}, {"keepdims", int64_t{1}}},
                   context.grad_name(str_cat(what, ".sum")));
  return b.op1("Reshape", {summed}, {{"shape", std::vector<int64_t>(target.begin(), target.end())}},
               context.grad_name(str_cat(what, ".reshape")));
}

Result<int64_t> normalize_axis(int64_t axis, int64_t rank, std::string_view attr_name) {
  if (axis < -rank || axis >= rank)
    return out_of_range("attribute '", attr_name, "' = ", axis, " is out of range for rank ", rank);
  return axis < 0 ? axis + rank : axis;
}

Result<int64_t> read_parts(const Node &node, const OpDef &def) {
  const int64_t parts = AttrReader(node, def).get_int("parts");
  if (parts < 1 || parts > kMaxParts)
    return invalid_argument(def.name, ": parts must be 1 to ", kMaxParts, ", got ", parts);
  return parts;
}

Status expect_group(const KernelContext &context, int64_t parts) {
  if (parts < 1)
    return invalid_argument(context.def.name, " '", context.node.name,
                            "': parts must be at least 1, got ", parts);
  if (parts != 1 && parts != context.group)
    return failed_precondition(context.def.name, " '", context.node.name,
                               "' reads this member's piece of a tensor split over ", parts,
                               " tensor-parallel members, but runs in a group of ", context.group,
                               " (only a pipeline plan's devices run it)");
  return Status::ok();
}

Status expect_same_dtype(const OpDef &def, llvm::ArrayRef<TensorType> inputs) {
  for (size_t i = 1; i < inputs.size(); ++i)
    if (inputs[i].dtype != inputs[0].dtype)
      return invalid_argument(def.name, ": input ", i, " is ", dtype_name(inputs[i].dtype),
                              " but input 0 is ", dtype_name(inputs[0].dtype));
  return Status::ok();
}

Status expect_floating(const OpDef &def, llvm::ArrayRef<TensorType> inputs, size_t index) {
  if (!is_floating(inputs[index].dtype))
    return invalid_argument(def.name, ": input ", index, " must be floating point, got ",
                            dtype_name(inputs[index].dtype));
  return Status::ok();
}

} // namespace strata::ops
