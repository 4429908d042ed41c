#include "passes/split_batch.h"

#include <string>
#include <string_view>
#include <vector>

#include "graph/verifier.h"

namespace strata::passes {
namespace {

// The batch dim of a tensor that carries none (it does not depend on any input).
constexpr int64_t kNoBatch = -1;

int64_t product(llvm::ArrayRef<int64_t> dims) {
  int64_t p = 1;
  for (int64_t d : dims)
    p *= d;
  return p;
}

std::string describe(const Tensor &t) { return str_cat("'", t.name, "' ", t.type.to_string()); }

class Splitter {
public:
  Splitter(const Graph &forward, int64_t microbatches)
      : old_(forward), graph_(forward), m_(microbatches), batch_(forward.num_tensors(), kNoBatch),
        registry_(ops::OpRegistry::global()) {}

  Result<Graph> run() {
    RETURN_IF_ERROR(verify_graph(old_, registry_)
                        .with_context(str_cat("split_batch of graph '", old_.name(), "'")));
    for (const Node &node : old_.nodes()) // verify_graph found every op in the registry
      RETURN_IF_ERROR(check_batch_rule(node, *registry_.find(node.op), old_));
    RETURN_IF_ERROR(split_inputs());
    ASSIGN_OR_RETURN(std::vector<NodeId> order, old_.topological_order());
    for (NodeId id : order)
      RETURN_IF_ERROR(split_node(id));
    Status status = verify_graph(graph_, registry_);
    if (!status.is_ok())
      return failed_precondition("graph '", old_.name(), "' split into ", m_,
                                 " micro-batches does not verify: ", status.message());
    return std::move(graph_);
  }

private:
  template <typename... Args> Status refuse(const Node &node, Args &&...args) const {
    return failed_precondition("cannot split the batch through node '", node.name, "' (", node.op,
                               "): ", std::forward<Args>(args)...);
  }

  Status split_inputs() {
    if (old_.inputs().empty())
      return failed_precondition("graph '", old_.name(),
                                 "' has no inputs, so no batch to split into ", m_,
                                 " micro-batches");
    const Tensor *first = nullptr;
    int64_t batch = 0;
    for (TensorId id : old_.inputs()) {
      const Tensor &t = old_.tensor(id);
      if (t.type.rank() == 0)
        return failed_precondition("input '", t.name, "' is a scalar (", t.type.to_string(),
                                   "); micro-batching splits dim 0 of every input, the batch");
      if (first == nullptr) {
        first = &t;
        batch = t.type.shape[0];
      } else if (t.type.shape[0] != batch) {
        return failed_precondition("input '", t.name, "' has batch ", t.type.shape[0],
                                   " but input '", first->name, "' has batch ", batch,
                                   "; dim 0 of every input must be the batch");
      }
    }
    if (batch == 0)
      return failed_precondition("input '", first->name,
                                 "' has batch 0: there is nothing to split");
    if (batch % m_ != 0)
      return failed_precondition("input '", first->name, "' has batch ", batch, ", which ", m_,
                                 " micro-batches do not divide");
    for (TensorId id : old_.inputs()) {
      graph_.mutable_tensor(id).type.shape[0] = batch / m_;
      batch_[id] = 0;
    }
    return Status::ok();
  }

  Status split_node(NodeId id) {
    Node &node = graph_.mutable_node(id);
    const ops::OpDef *def = registry_.find(node.op);
    if (def == nullptr) return internal_error("op '", node.op, "' vanished from the registry");
    if (def->traits.batch == ops::BatchRule::kCombines)
      return failed_precondition("node '", node.name, "' (", node.op,
                                 ") normalizes over the batch; micro-batches would change its "
                                 "statistics");

    std::vector<int64_t> in_batch;
    bool batched = false;
    for (TensorId t : node.inputs) {
      in_batch.push_back(batch_[t]);
      batched |= batch_[t] != kNoBatch;
    }
    if (!batched) return Status::ok(); // its inputs, hence its outputs, keep their types

    RETURN_IF_ERROR(check_samples_stay_apart(node, *def, in_batch));
    RETURN_IF_ERROR(rewrite_shape_attrs(node, *def, in_batch));

    llvm::SmallVector<TensorType, 4> types;
    for (TensorId t : node.inputs)
      types.push_back(graph_.tensor(t).type);
    auto inferred = registry_.infer_types(node, types);
    if (!inferred.is_ok()) return refuse(node, inferred.status().message());
    if (inferred->size() != node.outputs.size())
      return internal_error("node '", node.name, "' (", node.op, ") has ", node.outputs.size(),
                            " outputs but the op now produces ", inferred->size());
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      const TensorId out = node.outputs[i];
      graph_.mutable_tensor(out).type = (*inferred)[i];
      RETURN_IF_ERROR(track_output(node, out));
    }
    return check_batch_placement(node, *def, in_batch);
  }

  // The dim of `out` that carries the batch: the one whose size went from n to n / M.
  Status track_output(const Node &node, TensorId out) {
    const TensorType &before = old_.tensor(out).type;
    const TensorType &after = graph_.tensor(out).type;
    const std::string &name = old_.tensor(out).name;
    if (before.rank() != after.rank() || before.dtype != after.dtype)
      return refuse(node, "output '", name, "' would change from ", before.to_string(), " to ",
                    after.to_string());
    std::vector<int64_t> changed;
    for (int64_t d = 0; d < before.rank(); ++d)
      if (before.shape[d] != after.shape[d]) changed.push_back(d);
    if (changed.empty())
      return refuse(node, "output ", describe(old_.tensor(out)),
                    " does not carry the batch of its inputs: the op combines samples (a "
                    "reduction or contraction over the batch dim), so the micro-batches' results "
                    "would not make up the full batch's");
    if (changed.size() > 1)
      return refuse(node, "output '", name, "' would change in more than one dim, from ",
                    before.to_string(), " to ", after.to_string(),
                    "; the batch can be carried by one dim only");
    const int64_t d = changed[0];
    if (before.shape[d] % m_ != 0 || after.shape[d] * m_ != before.shape[d])
      return refuse(node, "dim ", d, " of output '", name, "' would go from ", before.shape[d],
                    " to ", after.shape[d], " (", before.to_string(), " to ", after.to_string(),
                    "), not divided by the ", m_, " micro-batches");
    batch_[out] = d;
    return Status::ok();
  }

  // Refuses ops that would combine samples while keeping a dim that looks like
  // the batch: normalizing, reducing, convolving, selecting or joining along it.
  Status check_samples_stay_apart(const Node &node, const ops::OpDef &def,
                                  llvm::ArrayRef<int64_t> in_batch) const {
    ops::AttrReader attrs(node, def);
    const int64_t bx = in_batch[0];
    const Tensor &x = old_.tensor(node.inputs[0]);
    const int64_t rank = x.type.rank();
    auto axis_attr = [&](std::string_view attr) -> int64_t {
      int64_t axis = attrs.get_int(attr);
      return axis < 0 ? axis + rank : axis;
    };

    switch (def.traits.batch) {
    case ops::BatchRule::kReduceAxes: {
      if (bx == kNoBatch) return Status::ok();
      std::vector<int64_t> axes = attrs.get_ints("axes");
      if (axes.empty())
        return refuse(node, "reduces over every dim of input ", describe(x), ", the batch dim ", bx,
                      " included; the micro-batches' results would not "
                      "make up the full batch's");
      for (int64_t axis : axes)
        if ((axis < 0 ? axis + rank : axis) == bx)
          return refuse(node, "reduces over axis ", axis, " of input ", describe(x),
                        ", which carries the batch; the micro-batches' results would not make up "
                        "the full batch's");
      return Status::ok();
    }
    case ops::BatchRule::kNormalizeAxis:
      if (bx != kNoBatch && axis_attr("axis") == bx)
        return refuse(node, "normalizes along axis ", attrs.get_int("axis"), " of input ",
                      describe(x), ", which carries the batch");
      return Status::ok();
    case ops::BatchRule::kTrailingAxes:
      if (bx != kNoBatch && axis_attr("axis") <= bx)
        return refuse(node, "normalizes over dims [", axis_attr("axis"), ", ", rank, ") of input ",
                      describe(x), ", which include the batch dim ", bx);
      return Status::ok();
    case ops::BatchRule::kConv:
      if (bx != kNoBatch && bx != 0)
        return refuse(node, "input ", describe(x), " carries the batch in dim ", bx,
                      ", not in N (dim 0); the convolution would mix samples");
      for (size_t i = 1; i < in_batch.size(); ++i)
        if (in_batch[i] != kNoBatch)
          return refuse(node, "its ", i == 1 ? "weight " : "bias ",
                        describe(old_.tensor(node.inputs[i])),
                        " depends on the batch; only X may carry it");
      return Status::ok();
    case ops::BatchRule::kPool:
      if (bx >= 2)
        return refuse(node, "pools over dim ", bx, " of input ", describe(x),
                      ", which carries the batch");
      return Status::ok();
    case ops::BatchRule::kGatherAxis:
      if (bx != kNoBatch && axis_attr("axis") == bx)
        return refuse(node, "gathers along axis ", attrs.get_int("axis"), " of data ", describe(x),
                      ", which carries the batch: it selects samples");
      return Status::ok();
    case ops::BatchRule::kSplitAxis:
      if (bx != kNoBatch && axis_attr("axis") == bx)
        return refuse(node, "cuts input ", describe(x), " along axis ", attrs.get_int("axis"),
                      ", which carries the batch");
      return Status::ok();
    case ops::BatchRule::kConcatAxis:
      for (size_t i = 0; i < in_batch.size(); ++i)
        if (in_batch[i] != kNoBatch && axis_attr("axis") == in_batch[i])
          return refuse(node, "joins along axis ", attrs.get_int("axis"),
                        ", which carries the "
                        "batch of input ",
                        describe(old_.tensor(node.inputs[i])));
      return Status::ok();
    case ops::BatchRule::kSlice: return check_slice(node, attrs, bx);
    case ops::BatchRule::kDropout:
      if (attrs.get_int("training") == 1 && attrs.get_float("ratio") > 0)
        return refuse(node, "training-mode Dropout keys its mask by element index, so every "
                            "micro-batch would draw the same mask");
      return Status::ok();
    case ops::BatchRule::kClasses:
      if (bx != kNoBatch && bx == rank - 1)
        return refuse(node, "the classes dim of logits ", describe(x), " carries the batch");
      return Status::ok();
    // Where the batch goes is all there is to check (track_output, check_batch_placement).
    case ops::BatchRule::kElementwise:
    case ops::BatchRule::kExpand:
    case ops::BatchRule::kReshape:
    case ops::BatchRule::kReshapeAttr:
    case ops::BatchRule::kFollows:
    // Refused before the split starts (run, split_node).
    case ops::BatchRule::kUndeclared:
    case ops::BatchRule::kCombines:
    case ops::BatchRule::kNotForward: return Status::ok();
    }
    return Status::ok();
  }

  // A Slice must take the whole batch dim, in order.
  Status check_slice(const Node &node, const ops::AttrReader &attrs, int64_t bx) const {
    if (bx == kNoBatch) return Status::ok();
    const Tensor &x = old_.tensor(node.inputs[0]);
    const int64_t rank = x.type.rank();
    std::vector<int64_t> axes = attrs.get_ints("axes");
    std::vector<int64_t> steps = attrs.get_ints("steps");
    const size_t count = attrs.get_ints("starts").size();
    const TensorType &y = old_.tensor(node.outputs[0]).type;
    for (size_t i = 0; i < count; ++i) {
      int64_t axis = axes.empty() ? static_cast<int64_t>(i) : axes[i];
      if (axis < 0) axis += rank;
      if (axis != bx) continue;
      const int64_t step = steps.empty() ? 1 : steps[i];
      if (step != 1 || y.shape[bx] != x.type.shape[bx])
        return refuse(node, "slices axis ", bx, " of input ", describe(x),
                      ", which carries the batch: it selects samples");
    }
    return Status::ok();
  }

  // Rewrites the attributes that spell out a shape containing the batch.
  Status rewrite_shape_attrs(Node &node, const ops::OpDef &def, llvm::ArrayRef<int64_t> in_batch) {
    const ops::BatchRule rule = def.traits.batch;
    if (rule != ops::BatchRule::kReshapeAttr && rule != ops::BatchRule::kExpand)
      return Status::ok();
    const int64_t bx = in_batch[0];
    const Tensor &x = old_.tensor(node.inputs[0]);
    const TensorType &y = old_.tensor(node.outputs[0]).type;
    std::vector<int64_t> shape = ops::AttrReader(node, def).get_ints("shape");

    if (rule == ops::BatchRule::kReshapeAttr) {
      // The output dim that starts where the batch dim does (the same number of
      // elements before it) and that M divides; it shrinks by M.
      const int64_t before = product(llvm::ArrayRef<int64_t>(x.type.shape).take_front(bx));
      int64_t prefix = 1;
      int64_t j = -1;
      for (int64_t d = 0; d < y.rank(); ++d) {
        if (prefix == before && y.shape[d] > 0 && y.shape[d] % m_ == 0) {
          j = d;
          break;
        }
        prefix *= y.shape[d];
      }
      if (j < 0)
        return refuse(node, "no dim of its output ", y.to_string(), " starts at the batch dim ", bx,
                      " of input ", describe(x), " (after ", before, " elements) with a size that ",
                      m_, " micro-batches divide");
      if (shape.size() != static_cast<size_t>(y.rank()))
        return internal_error("node '", node.name, "' (", node.op, "): attribute 'shape' has ",
                              shape.size(), " dims but its output ", y.to_string(), " has ",
                              y.rank());
      // -1 is inferred and 0 copies an input dim: either follows the input.
      if (shape[j] > 0) shape[j] = y.shape[j] / m_;
    } else {
      // Expand: the target dim that lines up with the batch dim of X.
      const int64_t k = bx + static_cast<int64_t>(shape.size()) - x.type.rank();
      if (k < 0 || shape[k] == 1) return Status::ok();
      if (shape[k] != x.type.shape[bx])
        return refuse(node, "attribute 'shape' ", shape_to_string(shape),
                      " does not line up with the batch dim ", bx, " of input ", describe(x));
      shape[k] /= m_;
    }
    node.set_attr("shape", std::move(shape));
    return Status::ok();
  }

  // Where the batch ends up must match where it came from: in reshape-like ops
  // the batch stays the outermost part of its dim (so micro-batches stay
  // contiguous slices); in broadcasting ops every batched input lines up with it.
  Status check_batch_placement(const Node &node, const ops::OpDef &def,
                               llvm::ArrayRef<int64_t> in_batch) const {
    const ops::BatchRule rule = def.traits.batch;
    if (rule == ops::BatchRule::kReshape || rule == ops::BatchRule::kReshapeAttr) {
      const Tensor &x = old_.tensor(node.inputs[0]);
      const Tensor &y = old_.tensor(node.outputs[0]);
      const int64_t dy = batch_[node.outputs[0]];
      const int64_t before_x =
          product(llvm::ArrayRef<int64_t>(x.type.shape).take_front(in_batch[0]));
      const int64_t before_y = product(llvm::ArrayRef<int64_t>(y.type.shape).take_front(dy));
      if (before_x != before_y)
        return refuse(node, "the batch dim ", in_batch[0], " of input ", describe(x),
                      " is not the outermost part of dim ", dy, " of output ", describe(y),
                      "; the micro-batches would not be contiguous slices of it");
      return Status::ok();
    }
    if (rule == ops::BatchRule::kElementwise || rule == ops::BatchRule::kExpand ||
        rule == ops::BatchRule::kDropout) {
      const Tensor &y = old_.tensor(node.outputs[0]);
      const int64_t dy = batch_[node.outputs[0]];
      for (size_t i = 0; i < in_batch.size(); ++i) {
        if (in_batch[i] == kNoBatch) continue;
        const Tensor &x = old_.tensor(node.inputs[i]);
        if (in_batch[i] + y.type.rank() - x.type.rank() != dy)
          return refuse(node, "the batch dim ", in_batch[i], " of input ", describe(x),
                        " does not line up with dim ", dy, " of output ", describe(y),
                        ", which carries the batch");
      }
    }
    return Status::ok();
  }

  const Graph &old_;
  Graph graph_;
  const int64_t m_;
  std::vector<int64_t> batch_; // per tensor: the dim carrying the batch, or kNoBatch
  const ops::OpRegistry &registry_;
};

} // namespace

Status check_batch_rule(const Node &node, const ops::OpDef &def, const Graph &graph) {
  if (def.traits.batch == ops::BatchRule::kUndeclared)
    return failed_precondition("node '", node.name, "' (", node.op, ") of graph '", graph.name(),
                               "' declares no batch rule: micro-batching cannot tell whether it "
                               "keeps samples apart");
  if (def.traits.batch != ops::BatchRule::kNotForward) return Status::ok();
  if (def.traits.collective != ops::Collective::kNone)
    return failed_precondition("node '", node.name, "' (", node.op, ") of graph '", graph.name(),
                               "' is a tensor-parallel collective: split_batch rebuilds forward "
                               "graphs; split the forward graph before shard_tensor_parallel");
  return failed_precondition(
      "node '", node.name, "' (", node.op, ") of graph '", graph.name(),
      "' is a gradient or optimizer op: split_batch rebuilds forward graphs; split the "
      "forward graph before make_training_graph");
}

Result<Graph> split_batch(const Graph &forward, int64_t microbatches) {
  if (microbatches < 1)
    return invalid_argument("the number of micro-batches must be at least 1, got ", microbatches);
  if (microbatches == 1) return Graph(forward);
  return Splitter(forward, microbatches).run();
}

} // namespace strata::passes
