// The op registry: one entry per op, holding everything strata knows about it.
//
// An OpDef is the single place that describes an op: its inputs, outputs and
// attributes (with defaults), how output types follow from input types, what it
// costs (FLOPs and bytes, for the cost model), and its CPU kernel. Later layers add
// gradient and sharding rules to the same entry. The op tables are plain data,
// one per family of ops (ops_*.cc), concatenated by OpRegistry.
#pragma once

#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "graph/builder.h"
#include "graph/graph.h"

namespace strata::ops {

struct OpDef;

// An attribute an op accepts. Without a default the attribute is required.
struct AttrSpec {
  std::string_view name;
  AttrType type;
  std::optional<AttrValue> default_value;
  std::string_view doc;
};

// Reads a node's attributes, falling back to the op's defaults. Only valid on a
// node the registry has checked (attribute names and types match the op's specs),
// so a missing required attribute cannot happen here.
class AttrReader {
public:
  AttrReader(const Node &node, const OpDef &def) : node_(node), def_(def) {}
  int64_t get_int(std::string_view name) const;
  double get_float(std::string_view name) const;
  std::string get_string(std::string_view name) const;
  std::vector<int64_t> get_ints(std::string_view name) const;
  std::vector<double> get_floats(std::string_view name) const;
  bool has(std::string_view name) const { return node_.find_attr(name) != nullptr; }

private:
  const AttrValue &lookup(std::string_view name) const;
  const Node &node_;
  const OpDef &def_;
};

// Work and traffic of one execution of a node, for the roofline cost model.
struct OpCost {
  double flops = 0;      // floating-point operations (a multiply-add counts 2)
  double bytes_read = 0; // bytes read from memory, inputs at least once
  double bytes_written = 0;
};

// A kernel's view of one tensor: a pointer and the tensor's type.
template <typename Pointer> struct BasicTensorView {
  Pointer data;
  const TensorType *type;
  template <typename T> auto as() const {
    using Out = std::conditional_t<std::is_const_v<std::remove_pointer_t<Pointer>>, const T *, T *>;
    return static_cast<Out>(data);
  }
  int64_t num_elements() const { return type->num_elements(); }
  llvm::ArrayRef<int64_t> shape() const { return type->shape; }
  DType dtype() const { return type->dtype; }
};
using ConstTensorView = BasicTensorView<const void *>;
using TensorView = BasicTensorView<void *>;

// What a kernel gets: the node (for attributes), its inputs and its outputs.
// Output buffers never alias input buffers.
struct KernelContext {
  const Node &node;
  const OpDef &def;
  llvm::ArrayRef<ConstTensorView> inputs;
  llvm::ArrayRef<TensorView> outputs;
  // The device's tensor-parallel group: its size and this device's position in
  // it. Ops whose inputs are this member's piece of a split tensor (Gather with
  // parts > 1, VocabParallelStats, ...) read them; outside a tensor-parallel
  // plan the group is this device alone.
  int group = 1;
  int member = 0;
  AttrReader attrs() const { return AttrReader(node, def); }
};

// For ops that take this member's piece of a tensor split over `parts`
// members: an error unless the kernel runs in such a group (parts 1 runs
// anywhere, as member 0 of 1).
Status expect_group(const KernelContext &context, int64_t parts);

using InferFn = Result<llvm::SmallVector<TensorType, 2>> (*)(const Node &node, const OpDef &def,
                                                             llvm::ArrayRef<TensorType> inputs);
using CostFn = OpCost (*)(const Node &node, const OpDef &def, llvm::ArrayRef<TensorType> inputs,
                          llvm::ArrayRef<TensorType> outputs);
using CpuKernelFn = Status (*)(const KernelContext &context);

// What a gradient rule gets: the forward node (a copy: the graph grows while the
// rule runs), the gradient of the loss with respect to each forward output, and a
// builder that appends backward nodes to the training graph. The rule sets
// input_grads[i] to dLoss/dInput[i] for every i with needs_input_grad[i]; leaving
// one at kInvalidTensor says no gradient flows there (the autodiff pass then
// treats it as zero). Gradients must have exactly their input's type.
struct GradContext {
  GraphBuilder &builder;
  const Node node;
  const OpDef &def;
  llvm::SmallVector<TensorId, 2> output_grads; // kInvalidTensor: no gradient reaches it
  llvm::SmallVector<bool, 4> needs_input_grad;
  llvm::SmallVector<TensorId, 4> input_grads;

  TensorId input(size_t i) const { return node.inputs[i]; }
  TensorId output(size_t i) const { return node.outputs[i]; }
  const TensorType &type(TensorId id) const { return builder.type(id); }
  AttrReader attrs() const { return AttrReader(node, def); }
  // A name for a backward node: "<forward node>.grad.<what>".
  std::string grad_name(std::string_view what) const { return str_cat(node.name, ".grad.", what); }
};
using GradFn = Status (*)(GradContext &context);

struct OpDef {
  std::string_view name;
  std::string_view summary;
  int min_inputs = 1;
  int max_inputs = 1; // trailing inputs past min_inputs are optional
  std::vector<AttrSpec> attrs;
  InferFn infer = nullptr;
  CostFn cost = nullptr; // nullptr: one FLOP per output element, every byte once
  CpuKernelFn cpu_kernel = nullptr;
  // The gradient rule; nullptr for ops that are not differentiable (gradients
  // reaching such an op are an autodiff error naming the node).
  GradFn grad = nullptr;
  // Optimizer work: runs once per training step on the accumulated gradients,
  // never per micro-batch (passes::is_step_op).
  bool once_per_step = false;

  const AttrSpec *find_attr(std::string_view attr_name) const;
};

// Default cost: one FLOP per output element, reading every input and writing
// every output once.
OpCost elementwise_cost(const Node &node, const OpDef &def, llvm::ArrayRef<TensorType> inputs,
                        llvm::ArrayRef<TensorType> outputs);

class OpRegistry final : public OpResolver {
public:
  // The registry of every built-in op.
  static const OpRegistry &global();

  const OpDef *find(std::string_view op) const;
  // All ops, sorted by name.
  std::span<const OpDef *const> all() const { return sorted_; }

  // Checks the node against the op's schema (known op, input count, attribute
  // names and types), then infers output types.
  Result<llvm::SmallVector<TensorType, 2>>
  infer_types(const Node &node, llvm::ArrayRef<TensorType> input_types) const override;

  // Cost of a node whose input and output types are known.
  OpCost cost(const Node &node, llvm::ArrayRef<TensorType> inputs,
              llvm::ArrayRef<TensorType> outputs) const;
  // Cost of node `id` of `graph`, with the types the graph declares.
  OpCost node_cost(const Graph &graph, NodeId id) const;

  // Checks a node's op, input count and attributes against its schema.
  Status check_schema(const Node &node, size_t num_inputs) const;

private:
  OpRegistry();
  std::vector<const OpDef *> sorted_;
};

// The op tables, one per family; each returns entries that live forever.
std::span<const OpDef> elementwise_ops();
std::span<const OpDef> shape_ops();
std::span<const OpDef> reduction_ops();
std::span<const OpDef> nn_ops();
std::span<const OpDef> optimizer_ops();
std::span<const OpDef> parallel_ops(); // ops_parallel.cc: tensor-parallel communication

// Helpers for infer functions and kernels.

// Sums `grad` (the gradient of a broadcast result) down to `target`'s shape:
// over leading axes the target lacks and over axes where the target has size 1.
// Returns `grad` itself when the shapes already match.
TensorId reduce_to_shape(GradContext &context, TensorId grad, llvm::ArrayRef<int64_t> target,
                         std::string_view what);

// Normalizes a possibly negative axis against `rank`; an error names the attribute.
Result<int64_t> normalize_axis(int64_t axis, int64_t rank, std::string_view attr_name);
// An error unless every input has the same dtype as input 0.
Status expect_same_dtype(const OpDef &def, llvm::ArrayRef<TensorType> inputs);
// An error unless input `index` is floating point.
Status expect_floating(const OpDef &def, llvm::ArrayRef<TensorType> inputs, size_t index);

} // namespace strata::ops
