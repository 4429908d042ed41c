// The op registry: one entry per op, holding everything strata knows about it.
//
// An OpDef is the single place that describes an op: its inputs, outputs and
// attributes (with defaults), how output types follow from input types, what it
// costs (FLOPs and bytes, for the cost model), its CPU kernel, its gradient rule
// and its traits: the facts other layers act on (whether fused chains may hold
// it, how micro-batching and tensor parallelism carry it, which collective it
// is, which inputs are integers). Those layers read the traits rather than
// keep lists of op names, so adding an op touches its entry;
// tests/ops/registry_test.cc checks that every op declares them. The op tables
// are plain data, one per family of ops (ops_*.cc), concatenated by OpRegistry.
#pragma once

#include <cstdint>
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

// Whether an op is an elementwise map, for passes that chain maps.
enum class Elementwise : uint8_t {
  kNone,
  // An f32 map of one or two operands broadcast to its one output (NumPy
  // rules): passes::fusable_elementwise chains it, and the CUDA op table has
  // its fused step (cuda::fused_step).
  kFusable,
  // Elementwise with broadcasting, but never chained: Identity, Cast (changes
  // the dtype), Where (three operands, a bool condition), Dropout (its mask is
  // keyed by the element's index).
  kUnfused,
};

// How the output follows partial sums: under tensor parallelism each member may
// hold one term of a sum, and a linear op can run on the terms.
enum class Linearity : uint8_t {
  kNone,
  kJoint,      // f(sum of terms) = sum of f(terms), every input a partial sum (Add, Neg)
  kEachInput,  // linear in any one input while the others are whole (Mul)
  kFirstInput, // linear in input 0 while the others are whole (Div)
};

// How micro-batching (passes::split_batch) carries the batch dim through the op.
// The pass refuses, naming the node, an op that declares none: it cannot tell
// whether an unknown op keeps the samples apart.
enum class BatchRule : uint8_t {
  kUndeclared,  // refused
  kElementwise, // broadcasting map: each batched input's batch dim lines up with the output's
  kExpand,      // as kElementwise, and attribute "shape" is rewritten at the batch dim
  kDropout,     // as kElementwise; refused in training with ratio > 0 (the mask is keyed by index)
  kReshape,     // moves elements: the batch stays the outermost part of its dim
  kReshapeAttr, // as kReshape, and attribute "shape" is rewritten (Reshape)
  // Keeps samples apart wherever the batch is: the re-inferred output types
  // show where it went (MatMul, Transpose, Constant; the losses whose shape
  // inference rules out the bad cases).
  kFollows,
  kReduceAxes,    // "axes" ([] = all) of input 0 must not include its batch dim
  kNormalizeAxis, // "axis" of input 0, which it normalizes along, is not its batch dim
  kGatherAxis,    // "axis" of input 0, which it selects along, is not its batch dim
  kSplitAxis,     // "axis" of input 0, which it cuts along, is not its batch dim
  kConcatAxis,    // "axis", which it joins along, is not the batch dim of any input
  kTrailingAxes,  // dims ["axis", rank) of input 0 must not include its batch dim (LayerNorm)
  kConv,          // only input 0 carries the batch, in dim 0 (N)
  kPool,          // the batch in dim 0 or 1 (N or C), never a pooled dim
  kSlice,         // the batch dim is not sliced (step 1, the whole extent)
  kClasses,       // the last (classes) dim of input 0 must not carry the batch
  kCombines,      // statistics over the batch (BatchNormalization): always refused
  // Added only after micro-batching, by gradient rules, the optimizer,
  // make_training or tensor parallelism: refused in the graph split_batch gets.
  kNotForward,
};

// Tensor parallelism's strategies for the op (partitioner/search/tensor_parallel.cc).
// Every op may run whole on every member; the rule adds the split and
// partial-sum strategies.
enum class ShardRule : uint8_t {
  kUndeclared,        // the registry test forbids it; the partitioner treats it as kReplicated
  kReplicated,        // no other strategy
  kElementwise,       // split like its broadcast inputs; partial sums per its Linearity
  kReshape,           // the split follows the flattening; a partial sum stays partial
  kTranspose,         // the split follows its dim through "perm"; a partial sum stays partial
  kOtherAxis,         // every operand split alike along a dim other than "axis" (Split, Concat)
  kNormalizeAxis,     // input 0 split along a dim other than "axis" (Softmax)
  kNormalizeTrailing, // input 0 split along a dim before "axis" (LayerNorm)
  kPool,              // split along N or C
  kMatMul,            // B by columns, A by rows, the contracted dim (partial sums), batch dims
  kConv,              // output channels, input channels (partial sums), the batch
  kGather,            // the table along another dim, the indices, the table by rows
  kCrossEntropy,      // logits split by class (vocabulary-parallel cross entropy)
};

// The tensor-parallel collective an op is (ops_parallel.cc); kNone for the rest.
enum class Collective : uint8_t {
  kNone,
  kCopy,          // TpCopy: the identity; its gradient is all-reduced
  kAllReduce,     // TpAllReduce
  kAllGather,     // TpAllGather
  kReduceScatter, // TpReduceScatter
  kAllToAll,      // TpAllToAll
  kSplit,         // TpSplit: this member's piece; its gradient is all-gathered
};

// Whether the collective communicates when it runs; TpCopy and TpSplit
// communicate only in their gradients.
constexpr bool communicates_forward(Collective c) {
  return c == Collective::kAllReduce || c == Collective::kAllGather ||
         c == Collective::kReduceScatter || c == Collective::kAllToAll;
}
// Whether the collective sums values over the group.
constexpr bool sums(Collective c) {
  return c == Collective::kAllReduce || c == Collective::kReduceScatter;
}
// Whether the whole tensor (what its cost and staging are sized by) is the
// collective's input rather than its output.
constexpr bool whole_is_input(Collective c) {
  return c == Collective::kSplit || c == Collective::kReduceScatter;
}

// For integer input `input` of a node (bit `input` of OpTraits::integer_inputs
// is set): how many values it may take ([0, n)), from the node and its input
// types; a tensor-parallel member's piece of what it indexes counts `parts`
// times. nullopt where the node leaves the range open.
using IndexRangeFn = std::optional<int64_t> (*)(const Node &node, const OpDef &def,
                                                llvm::ArrayRef<TensorType> inputs, size_t input);

// What other layers need to know about an op, as data. Batch and shard rules
// must be declared (the registry test checks every op); the rest default to
// "not so".
struct OpTraits {
  Elementwise elementwise = Elementwise::kNone;
  Linearity linearity = Linearity::kNone;
  BatchRule batch = BatchRule::kUndeclared;
  ShardRule shard = ShardRule::kUndeclared;
  Collective collective = Collective::kNone;
  // Inputs read as integers, not values (bit k: input k): indices and labels,
  // which select along a dim of another operand, and step counters. Backends
  // keep them integer; the CUDA backend takes the other inputs in f32.
  uint32_t integer_inputs = 0;
  IndexRangeFn index_range = nullptr; // set iff an integer input is an index or a label
};

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
  OpTraits traits = {};

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

// The collective `op` is, for code that holds only a node's op name; kNone for
// every other op and for unknown ones.
Collective collective_of(std::string_view op);

// Helpers for infer functions and kernels.

// Sums `grad` (the gradient of a broadcast result) down to `target`'s shape:
// over leading axes the target lacks and over axes where the target has size 1.
// Returns `grad` itself when the shapes already match.
TensorId reduce_to_shape(GradContext &context, TensorId grad, llvm::ArrayRef<int64_t> target,
                         std::string_view what);

// Normalizes a possibly negative axis against `rank`; an error names the attribute.
Result<int64_t> normalize_axis(int64_t axis, int64_t rank, std::string_view attr_name);
// The most members a tensor is split over (the largest tensor-parallel group).
inline constexpr int64_t kMaxParts = 4096;
// The `parts` attribute of a node: 1 to kMaxParts; an error names the op.
Result<int64_t> read_parts(const Node &node, const OpDef &def);
// a * b for sizes known non-negative, or kMaxTensorElements + 1 where the
// product passes kMaxTensorElements (no overflow either way).
inline int64_t capped_product(int64_t a, int64_t b) {
  int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product) || product > kMaxTensorElements)
    return kMaxTensorElements + 1;
  return product;
}
// An error unless every input has the same dtype as input 0.
Status expect_same_dtype(const OpDef &def, llvm::ArrayRef<TensorType> inputs);
// An error unless input `index` is floating point.
Status expect_floating(const OpDef &def, llvm::ArrayRef<TensorType> inputs, size_t index);

} // namespace strata::ops
