// Tensor-parallel communication ops (partitioner/search/tensor_parallel.h inserts them).
//
// A tensor-parallel plan gives every device of a tensor-parallel group the same
// local graph; these six ops are where the devices of the group meet. Their
// meaning is defined over the group of `parts` devices, and their gradients are
// each other (Megatron-LM's f and g operators, plus gather and scatter):
//
//   TpCopy(x)       y = x (x replicated);          dx = TpAllReduce(dy)
//   TpAllReduce(x)  y = sum over the group of x;   dx = dy
//   TpAllGather(x)  y = the members' x joined along `axis`;   dx = TpSplit(dy)
//   TpSplit(x)      y = this member's part of x along `axis`; dx = TpAllGather(dy)
//   TpReduceScatter(x)  y = this member's part of the sum over the group of x
//                   along `axis` (partial sums become split); dx = TpAllGather(dy)
//   TpAllToAll(x)   x is this member's piece along `from_axis`, y its piece of
//                   the same tensor along `axis`; dx = TpAllToAll(dy) back
//
// A split along `axis` with `outer` = o views the axis (size n) as [o, n / o] and
// cuts the second factor into `parts` equal pieces: member r holds, for every
// one of the o outer rows, elements [r n / (o parts), (r + 1) n / (o parts)).
// o = 1 is the plain contiguous split; o = 3 splits a fused [Q | K | V] axis by
// heads.
//
// The execution core runs them over their group on every backend
// (runtime/core/issue.cc); the CPU kernel here is the one-member group
// (parts = 1), a copy.
#include <cstring>

#include "ops/registry.h"

namespace strata::ops {
namespace {

using TypeList = llvm::SmallVector<TensorType, 2>;

Result<TypeList> infer_reduce(const Node &node, const OpDef &def,
                              llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(read_parts(node, def).status());
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  return TypeList{inputs[0]};
}

// Resizes `axis` of the input: times parts (gather) or divided by parts (split).
Result<TypeList> infer_resize(const Node &node, const OpDef &def, llvm::ArrayRef<TensorType> inputs,
                              bool gather) {
  ASSIGN_OR_RETURN(const int64_t parts, read_parts(node, def));
  const AttrReader attrs(node, def);
  TensorType out = inputs[0];
  ASSIGN_OR_RETURN(const int64_t axis, normalize_axis(attrs.get_int("axis"), out.rank(), "axis"));
  const int64_t outer = attrs.get_int("outer");
  int64_t &dim = out.shape[static_cast<size_t>(axis)];
  if (outer < 1 || dim % outer != 0)
    return invalid_argument(def.name, ": outer ", outer, " does not divide dim ", axis, " (", dim,
                            ") of ", inputs[0].to_string());
  if (gather) {
    if (capped_product(dim, parts) > kMaxTensorElements)
      return invalid_argument(def.name, ": dim ", axis, " of ", inputs[0].to_string(),
                              " gathered from ", parts, " parts is more than ", kMaxTensorElements,
                              " elements");
    dim *= parts;
  } else {
    if ((dim / outer) % parts != 0)
      return invalid_argument(def.name, ": dim ", axis, " of ", inputs[0].to_string(),
                              " does not split into ", parts, " parts (outer ", outer, ")");
    dim /= parts;
  }
  return TypeList{out};
}

Result<TypeList> infer_gather(const Node &node, const OpDef &def,
                              llvm::ArrayRef<TensorType> inputs) {
  return infer_resize(node, def, inputs, true);
}
Result<TypeList> infer_split(const Node &node, const OpDef &def,
                             llvm::ArrayRef<TensorType> inputs) {
  return infer_resize(node, def, inputs, false);
}

// Moves bytes only; the cost model prices the communication itself.
OpCost move_only(const Node &, const OpDef &, llvm::ArrayRef<TensorType> inputs,
                 llvm::ArrayRef<TensorType> outputs) {
  OpCost cost;
  for (const TensorType &t : inputs)
    cost.bytes_read += static_cast<double>(t.size_bytes());
  for (const TensorType &t : outputs)
    cost.bytes_written += static_cast<double>(t.size_bytes());
  return cost;
}

Status single_member_kernel(const KernelContext &context) {
  if (context.attrs().get_int("parts") != 1)
    return failed_precondition(context.def.name, " '", context.node.name,
                               "' needs its tensor-parallel group (only a pipeline plan's devices "
                               "run it)");
  // An empty tensor may have no buffer at all: memcpy takes no null pointer.
  if (const auto bytes = static_cast<size_t>(context.inputs[0].type->size_bytes()); bytes > 0)
    std::memcpy(context.outputs[0].data, context.inputs[0].data, bytes);
  return Status::ok();
}

std::vector<Attribute> same_attrs(const GradContext &c, bool with_axis) {
  const AttrReader attrs = c.attrs();
  std::vector<Attribute> out = {{"parts", attrs.get_int("parts")}};
  const std::string why = attrs.get_string("why");
  out.push_back({"why", why.empty() ? std::string() : str_cat("backward of: ", why)});
  if (with_axis) {
    out.push_back({"axis", attrs.get_int("axis")});
    out.push_back({"outer", attrs.get_int("outer")});
  }
  return out;
}

Status copy_grad(GradContext &c) {
  if (c.needs_input_grad[0])
    c.input_grads[0] = c.builder.op1("TpAllReduce", {c.output_grads[0]}, same_attrs(c, false),
                                     c.grad_name("all_reduce"));
  return Status::ok();
}

Status all_reduce_grad(GradContext &c) {
  if (c.needs_input_grad[0]) c.input_grads[0] = c.output_grads[0];
  return Status::ok();
}

Status all_gather_grad(GradContext &c) {
  if (c.needs_input_grad[0])
    c.input_grads[0] =
        c.builder.op1("TpSplit", {c.output_grads[0]}, same_attrs(c, true), c.grad_name("split"));
  return Status::ok();
}

Result<TypeList> infer_reduce_scatter(const Node &node, const OpDef &def,
                                      llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  return infer_resize(node, def, inputs, false);
}

// A piece along `from_axis` (from_outer) becomes one along `axis` (outer):
// `from_axis` grows by parts, `axis` shrinks by parts.
Result<TypeList> infer_all_to_all(const Node &node, const OpDef &def,
                                  llvm::ArrayRef<TensorType> inputs) {
  ASSIGN_OR_RETURN(const int64_t parts, read_parts(node, def));
  const AttrReader attrs(node, def);
  TensorType out = inputs[0];
  ASSIGN_OR_RETURN(const int64_t from,
                   normalize_axis(attrs.get_int("from_axis"), out.rank(), "from_axis"));
  ASSIGN_OR_RETURN(const int64_t to, normalize_axis(attrs.get_int("axis"), out.rank(), "axis"));
  if (from == to)
    return invalid_argument(def.name, ": from_axis and axis are both ", to,
                            "; an all-to-all moves the split to another dim");
  const int64_t from_outer = attrs.get_int("from_outer"), outer = attrs.get_int("outer");
  int64_t &grow = out.shape[static_cast<size_t>(from)];
  int64_t &shrink = out.shape[static_cast<size_t>(to)];
  if (from_outer < 1 || grow % from_outer != 0 || outer < 1 || shrink % outer != 0 ||
      (shrink / outer) % parts != 0)
    return invalid_argument(def.name, ": dim ", to, " of ", inputs[0].to_string(),
                            " does not split into ", parts, " parts (outer ", outer,
                            "), or from_outer ", from_outer, " does not divide dim ", from);
  if (capped_product(grow, parts) > kMaxTensorElements)
    return invalid_argument(def.name, ": dim ", from, " of ", inputs[0].to_string(), " times ",
                            parts, " parts is more than ", kMaxTensorElements, " elements");
  grow *= parts;
  shrink /= parts;
  return TypeList{out};
}

Status all_to_all_grad(GradContext &c) {
  if (!c.needs_input_grad[0]) return Status::ok();
  const AttrReader attrs = c.attrs();
  std::vector<Attribute> back = same_attrs(c, false);
  back.push_back({"axis", attrs.get_int("from_axis")});
  back.push_back({"outer", attrs.get_int("from_outer")});
  back.push_back({"from_axis", attrs.get_int("axis")});
  back.push_back({"from_outer", attrs.get_int("outer")});
  c.input_grads[0] =
      c.builder.op1("TpAllToAll", {c.output_grads[0]}, std::move(back), c.grad_name("all_to_all"));
  return Status::ok();
}

Status split_grad(GradContext &c) {
  if (c.needs_input_grad[0])
    c.input_grads[0] = c.builder.op1("TpAllGather", {c.output_grads[0]}, same_attrs(c, true),
                                     c.grad_name("all_gather"));
  return Status::ok();
}

AttrSpec parts_attr() {
  return {"parts", AttrType::kInt, std::nullopt, "devices of the tensor-parallel group"};
}
AttrSpec why_attr() {
  return {"why", AttrType::kString, AttrValue(std::string()),
          "why the compiler put it there (strata inspect --comm shows it)"};
}
AttrSpec axis_attr() { return {"axis", AttrType::kInt, AttrValue(int64_t{0}), "the split dim"}; }
AttrSpec outer_attr() {
  return {"outer", AttrType::kInt, AttrValue(int64_t{1}),
          "the dim is viewed as [outer, n / outer]; the second factor is split"};
}

std::vector<OpDef> make_table() {
  std::vector<OpDef> table;
  table.push_back(OpDef{"TpCopy",
                        "Y = X, a replicated tensor entering a tensor-parallel region; the "
                        "gradient is summed over the group",
                        1,
                        1,
                        {parts_attr(), why_attr()},
                        infer_reduce,
                        move_only,
                        single_member_kernel,
                        copy_grad});
  table.back().traits.collective = Collective::kCopy;
  table.push_back(OpDef{"TpAllReduce",
                        "Y = the sum of X over the tensor-parallel group (partial sums become "
                        "whole); the gradient passes through",
                        1,
                        1,
                        {parts_attr(), why_attr()},
                        infer_reduce,
                        move_only,
                        single_member_kernel,
                        all_reduce_grad});
  table.back().traits.collective = Collective::kAllReduce;
  table.push_back(OpDef{"TpAllGather",
                        "Y = the members' X joined along axis (split pieces become whole)",
                        1,
                        1,
                        {parts_attr(), axis_attr(), outer_attr(), why_attr()},
                        infer_gather,
                        move_only,
                        single_member_kernel,
                        all_gather_grad});
  table.back().traits.collective = Collective::kAllGather;
  table.push_back(OpDef{"TpReduceScatter",
                        "Y = this member's piece along axis of the sum of X over the group "
                        "(partial sums become split)",
                        1,
                        1,
                        {parts_attr(), axis_attr(), outer_attr(), why_attr()},
                        infer_reduce_scatter,
                        move_only,
                        single_member_kernel,
                        split_grad});
  table.back().traits.collective = Collective::kReduceScatter;
  table.push_back(OpDef{
      "TpAllToAll",
      "X is this member's piece along from_axis; Y is its piece of the same "
      "tensor along axis (one split becomes another)",
      1,
      1,
      {parts_attr(),
       axis_attr(),
       outer_attr(),
       {"from_axis", AttrType::kInt, AttrValue(int64_t{0}), "the split dim of X"},
       {"from_outer", AttrType::kInt, AttrValue(int64_t{1}), "outer of X's split (see outer)"},
       why_attr()},
      infer_all_to_all,
      move_only,
      single_member_kernel,
      all_to_all_grad});
  table.back().traits.collective = Collective::kAllToAll;
  table.push_back(OpDef{"TpSplit",
                        "Y = this member's piece of X along axis",
                        1,
                        1,
                        {parts_attr(), axis_attr(), outer_attr(), why_attr()},
                        infer_split,
                        move_only,
                        single_member_kernel,
                        split_grad});
  table.back().traits.collective = Collective::kSplit;
  // Tensor parallelism adds them to its local graph, after micro-batching, and
  // shards nothing further.
  for (OpDef &def : table) {
    def.traits.batch = BatchRule::kNotForward;
    def.traits.shard = ShardRule::kReplicated;
  }
  return table;
}

} // namespace

std::span<const OpDef> parallel_ops() {
  static const std::vector<OpDef> table = make_table();
  return table;
}

} // namespace strata::ops
