#include "partitioner/search/tensor_parallel.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <set>

#include "graph/verifier.h"
#include "ops/registry.h"
#include "partitioner/cost/cost_model.h"

namespace strata::partitioner {

std::string ShardSpec::to_string() const {
  switch (kind) {
  case Kind::kReplicated: return "R";
  case Kind::kPartial: return "P";
  case Kind::kSplit: break;
  }
  return outer == 1 ? str_cat("S(", dim, ")") : str_cat("S(", dim, "/", outer, ")");
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
using Kind = ShardSpec::Kind;

int64_t product(llvm::ArrayRef<int64_t> dims, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i)
    p *= dims[i];
  return p;
}

// A rule's choice for one node: the spec each input must arrive in and the spec
// of each output.
struct Strategy {
  std::vector<ShardSpec> in;
  std::vector<ShardSpec> out;
  std::string rule;
  // The local node's attributes that differ from the global one's (the group
  // size of ops that read a member's piece), and the rule's own communication.
  std::vector<Attribute> attrs = {};
  double communication = 0;
  // SoftmaxCrossEntropy of vocabulary-split logits: three local nodes
  // (ops/ops_nn.cc, VocabParallelCrossEntropy).
  bool vocab_parallel_loss = false;
  // Whether the work is split over the group (its time divided).
  bool splits() const {
    auto split = [](const ShardSpec &s) { return s.kind != Kind::kReplicated; };
    return std::any_of(out.begin(), out.end(), split) || std::any_of(in.begin(), in.end(), split);
  }
};

// A possibly negative axis made non-negative, or `fallback` when out of range.
int axis_or(int64_t axis, int64_t rank, int fallback) {
  auto normalized = ops::normalize_axis(axis, rank, "axis");
  return normalized.is_ok() ? static_cast<int>(*normalized) : fallback;
}

// The dims of `in` and `out` (same element count) grouped where their prefix
// products meet: pairs of [begin, end) ranges.
std::vector<std::pair<std::pair<size_t, size_t>, std::pair<size_t, size_t>>>
reshape_groups(llvm::ArrayRef<int64_t> in, llvm::ArrayRef<int64_t> out) {
  std::vector<std::pair<std::pair<size_t, size_t>, std::pair<size_t, size_t>>> groups;
  size_t i = 0, j = 0;
  while (i < in.size() && j < out.size()) {
    size_t i0 = i, j0 = j;
    int64_t a = in[i++], b = out[j++];
    while (a != b && i <= in.size() && j <= out.size()) {
      if (a < b && i < in.size())
        a *= in[i++];
      else if (b < a && j < out.size())
        b *= out[j++];
      else
        break;
    }
    if (a != b) break;
    groups.push_back({{i0, i}, {j0, j}});
  }
  return groups;
}

class Sharder {
public:
  Sharder(const Graph &graph, const TensorParallelOptions &options)
      : g_(graph), t_(options.parts), options_(options), registry_(ops::OpRegistry::global()),
        gamma_(reduce_bytes_per_second(options.device, DType::kF32)), local_(graph.name()) {}

  Result<TensorParallelResult> run();

private:
  const TensorType &type(TensorId id) const { return g_.tensor(id).type; }
  // Reshape, Flatten, Squeeze, Unsqueeze: views of the same elements in order.
  bool is_reshape(const Node &node) const {
    const ops::OpDef *def = registry_.find(node.op);
    return def != nullptr && def->traits.shard == ops::ShardRule::kReshape;
  }
  bool valid_split(const TensorType &ty, int d, int64_t o) const {
    if (d < 0 || d >= static_cast<int>(ty.rank()) || o < 1) return false;
    const int64_t n = ty.shape[static_cast<size_t>(d)];
    return n % o == 0 && (n / o) % t_ == 0 && n / o >= t_;
  }
  std::vector<ShardSpec> split_specs(const TensorType &ty) const {
    std::vector<ShardSpec> specs;
    for (int d = 0; d < static_cast<int>(ty.rank()); ++d)
      for (int64_t o : outers_)
        if (valid_split(ty, d, o)) specs.push_back(ShardSpec::split(d, o));
    return specs;
  }
  double bytes(TensorId id) const { return static_cast<double>(type(id).size_bytes()); }
  double all_reduce(TensorId id) const {
    return all_reduce_time(bytes(id), t_, options_.link, CollectiveAlgorithm::kRing, gamma_);
  }
  double all_gather(TensorId id) const {
    return all_gather_time(bytes(id), t_, options_.link, CollectiveAlgorithm::kRing);
  }
  double all_to_all(TensorId id) const { return all_to_all_time(bytes(id), t_, options_.link); }
  double reduce_scatter(TensorId id) const {
    return reduce_scatter_time(bytes(id), t_, options_.link, CollectiveAlgorithm::kRing, gamma_);
  }
  bool is_parameter(TensorId id) const {
    const Tensor &t = g_.tensor(id);
    // Pieces are cut from initializers; imported weights (data) stay whole.
    return t.kind == TensorKind::kParameter && t.data == nullptr && !t.external &&
           t.initializer.kind != Initializer::Kind::kNone;
  }
  // The cost of turning `id` from `from` into `to`, forward and backward;
  // infinity where the pass does not do it. `fallback` allows R -> S for
  // activations (a slice), which the search itself never starts.
  double arrive(TensorId id, const ShardSpec &from, const ShardSpec &to, bool fallback) const;
  std::optional<ShardSpec> map_reshape(const TensorType &in, const ShardSpec &spec,
                                       const TensorType &out) const;
  // The rules of the op's ops::ShardRule, "replicated" first; ties go to the
  // first.
  std::vector<Strategy> strategies(NodeId id) const;
  void elementwise_strategies(const Node &node, ops::Linearity linearity,
                              std::vector<Strategy> &out) const;
  void matmul_strategies(const Node &node, const ops::AttrReader &attrs,
                         std::vector<Strategy> &out) const;
  void conv_strategies(const Node &node, const ops::AttrReader &attrs,
                       std::vector<Strategy> &out) const;
  void gather_strategies(const Node &node, const ops::AttrReader &attrs,
                         std::vector<Strategy> &out) const;
  void cross_entropy_strategies(const Node &node, std::vector<Strategy> &out) const;
  void collect_outers();
  // Cheapest arrival of `input` in `want`, with the spec it comes from.
  std::pair<double, ShardSpec> best_arrival(TensorId input, const ShardSpec &want) const;
  double strategy_cost(NodeId id, const Strategy &s) const;

  // The search. Forward: every tensor's cost table from its producer's
  // strategies (an error when no strategy fits). Backward: every node's
  // strategy from what its outputs' readers want, then the sources' specs.
  void find_gradients(const std::vector<NodeId> &order);
  Status fill_cost_tables(const std::vector<NodeId> &order);
  void choose_strategies(const std::vector<NodeId> &order);
  void choose_source_specs();
  // What serving every reader of `id` decided so far from `spec` costs.
  double serve(TensorId id, const ShardSpec &spec) const;
  // A parameter is stored once for all its readers (a tied embedding: the
  // lookup and the output projection). The cheapest storage serving the
  // readers decided so far and `extra` (when not null).
  double storage(TensorId id, const ShardSpec *extra) const;
  // What a node's strategy `s` adds to the storage of the parameters it reads.
  double storage_cost(NodeId id, const Strategy &s) const;
  const Strategy &chosen_strategy(NodeId id) const {
    return node_strategies_[id][static_cast<size_t>(strategy_of_[id])];
  }

  // The local graph. A failure to add a node is left in status_, which the
  // callers check before using what it returned.
  TensorType local_type(TensorId id) const;
  std::vector<TensorId> add_node(std::string op, std::vector<TensorId> inputs,
                                 std::vector<Attribute> attrs, std::string name,
                                 std::vector<std::string> output_names);
  // "'name' (op, rule)" of a global node, for the collectives' "why".
  std::string describe(NodeId id) const;
  // One collective node "<name>.tp_<suffix>": `op` over `input`, with the
  // group's size, the split attributes `split` (the spec the op makes or
  // reads) and `why`.
  TensorId add_collective(const char *op, const char *suffix, TensorId input,
                          const std::vector<Attribute> &split, const std::string &name,
                          const std::string &why);
  // Tensor `id` (global) in spec `want` for `reader`, converting from its
  // chosen spec; each conversion is made once.
  TensorId convert(TensorId id, const ShardSpec &want, NodeId reader);
  // The sources (inputs, parameters, constants) at their local shape.
  Status add_sources(TensorParallelResult &result);
  // Input i of node `id` as its strategy reads it: split work reading a
  // replicated tensor that carries a gradient reads it through a TpCopy.
  TensorId local_input(NodeId id, size_t i);
  // The local node's op and attributes.
  struct LocalOp {
    std::string op;
    std::vector<Attribute> attrs;
  };
  LocalOp local_op(const Node &node, const Strategy &s) const;
  // The vocabulary-parallel loss's statistics, gathered, as one more input.
  Status add_vocab_stats(const Node &node, const Strategy &s, const std::vector<Attribute> &attrs,
                         std::vector<TensorId> &inputs);
  Status add_local_node(NodeId id, TensorParallelResult &result);

  const Graph &g_;
  const int t_;
  const TensorParallelOptions &options_;
  const ops::OpRegistry &registry_;
  const double gamma_;
  std::vector<int64_t> outers_{1};
  std::vector<bool> needs_grad_;
  // Per tensor: the specs it can be had in and the excess cost over its
  // cheapest (the common upstream cost cancels out between the choices).
  std::vector<std::map<ShardSpec, double>> table_;
  std::vector<std::vector<Strategy>> node_strategies_;
  std::vector<double> node_time_;
  // Per tensor: the specs its readers want, and the spec it is made in.
  std::vector<std::vector<ShardSpec>> demands_;
  std::vector<ShardSpec> chosen_;
  std::vector<int> strategy_of_; // per node: its pick in node_strategies_

  Graph local_;
  std::vector<TensorId> base_; // per global tensor: the local one in its chosen spec
  std::map<std::pair<TensorId, ShardSpec>, TensorId> converted_;
  std::map<TensorId, TensorId> copied_; // a local tensor's TpCopy
  Status status_ = Status::ok();
};

double Sharder::arrive(TensorId id, const ShardSpec &from, const ShardSpec &to,
                       bool fallback) const {
  if (from == to) return 0;
  const bool grad = needs_grad_[id];
  if (to.kind == Kind::kReplicated) {
    if (from.kind == Kind::kPartial) return all_reduce(id);
    if (from.kind == Kind::kSplit) return all_gather(id); // backward: a slice
  }
  if (to.is_split() && from.is_split() && to.dim != from.dim)
    return all_to_all(id) + (grad ? all_to_all(id) : 0.0); // backward: the reverse
  if (to.kind == Kind::kSplit && from.kind == Kind::kPartial && options_.split_activations)
    return reduce_scatter(id) + (grad ? all_gather(id) : 0.0); // backward: gather the gradient
  if (to.kind == Kind::kSplit && from.kind == Kind::kReplicated &&
      (fallback || g_.tensor(id).kind == TensorKind::kParameter ||
       g_.tensor(id).kind == TensorKind::kConstant))
    return grad ? all_gather(id) : 0.0; // a slice; backward: gather the gradient
  if (fallback && to.kind == Kind::kSplit)
    return arrive(id, from, ShardSpec::replicated(), true) +
           arrive(id, ShardSpec::replicated(), to, true);
  return kInf;
}

std::optional<ShardSpec> Sharder::map_reshape(const TensorType &in, const ShardSpec &spec,
                                              const TensorType &out) const {
  if (spec.kind != Kind::kSplit) return spec;
  const auto d = static_cast<size_t>(spec.dim);
  // Member r holds the flat elements i with (i mod L) in [r L / t, (r + 1) L / t)
  // in every one of A blocks: a reshape keeps flat positions, so the same (A, L)
  // must be a split of some output dim.
  const int64_t A = product(in.shape, 0, d) * spec.outer;
  const int64_t L =
      in.shape[d] / spec.outer * product(in.shape, d + 1, static_cast<size_t>(in.rank()));
  for (size_t e = 0; e < static_cast<size_t>(out.rank()); ++e) {
    const int64_t before = product(out.shape, 0, e);
    if (A % before != 0) continue;
    const int64_t o = A / before;
    if (out.shape[e] % o != 0) continue;
    const int64_t m = out.shape[e] / o;
    if (m % t_ != 0 || m < t_ ||
        m * product(out.shape, e + 1, static_cast<size_t>(out.rank())) != L)
      continue;
    return ShardSpec::split(static_cast<int>(e), o);
  }
  return std::nullopt;
}

void Sharder::collect_outers() {
  std::set<int64_t> outers = {1};
  for (const Node &node : g_.nodes()) {
    if (!is_reshape(node)) continue;
    const auto &in = type(node.inputs[0]).shape;
    const auto &out = type(node.outputs[0]).shape;
    for (const auto &[a, b] : reshape_groups(in, out)) {
      // One dim on one side, several on the other: the prefix products of the
      // several are the ways that dim is viewed.
      auto add = [&](llvm::ArrayRef<int64_t> dims, std::pair<size_t, size_t> range) {
        int64_t p = 1;
        for (size_t k = range.first; k + 1 < range.second; ++k)
          outers.insert(p *= dims[k]);
      };
      if (a.second - a.first == 1) add(out, b);
      if (b.second - b.first == 1) add(in, a);
    }
  }
  outers_.assign(outers.begin(), outers.end());
}

// Every input and output in `kind` (replicated or partial sums).
Strategy all_in(const Node &node, Kind kind) {
  const ShardSpec spec = kind == Kind::kPartial ? ShardSpec::partial() : ShardSpec{};
  Strategy s;
  s.in.assign(node.inputs.size(), spec);
  s.out.assign(node.outputs.size(), spec);
  return s;
}

std::vector<Strategy> Sharder::strategies(NodeId id) const {
  const Node &node = g_.node(id);
  const ops::OpDef *def = registry_.find(node.op);
  std::vector<Strategy> out;
  Strategy replicated = all_in(node, Kind::kReplicated);
  replicated.rule = "replicated";
  out.push_back(replicated);
  if (def == nullptr || node.outputs.empty()) return out;
  const ops::AttrReader attrs(node, *def);
  const TensorType &y = type(node.outputs[0]);
  const int r = static_cast<int>(y.rank());

  switch (def->traits.shard) {
  case ops::ShardRule::kUndeclared:
  case ops::ShardRule::kReplicated: return out;
  case ops::ShardRule::kElementwise:
    if (node.outputs.size() == 1) elementwise_strategies(node, def->traits.linearity, out);
    return out;
  case ops::ShardRule::kReshape: {
    const TensorType &x = type(node.inputs[0]);
    for (const ShardSpec &spec : split_specs(x)) {
      auto mapped = map_reshape(x, spec, y);
      if (!mapped) continue;
      out.push_back({{spec}, {*mapped}, "reshape, the split follows the flattening"});
    }
    out.push_back({{ShardSpec::partial()}, {ShardSpec::partial()}, "reshape of a partial sum"});
    return out;
  }
  case ops::ShardRule::kTranspose: {
    std::vector<int64_t> perm = attrs.get_ints("perm");
    if (perm.empty())
      for (int k = r - 1; k >= 0; --k)
        perm.push_back(k);
    for (const ShardSpec &spec : split_specs(type(node.inputs[0]))) {
      const auto at = std::find(perm.begin(), perm.end(), spec.dim) - perm.begin();
      if (at >= r) continue;
      out.push_back({{spec},
                     {ShardSpec::split(static_cast<int>(at), spec.outer)},
                     "transpose, the split follows its dim"});
    }
    out.push_back({{ShardSpec::partial()}, {ShardSpec::partial()}, "transpose of a partial sum"});
    return out;
  }
  case ops::ShardRule::kOtherAxis: {
    const int axis = axis_or(attrs.get_int("axis"), r, -1);
    // Every operand (the same rank) split along another dim: split alike.
    for (const ShardSpec &spec : split_specs(type(node.inputs[0]))) {
      if (spec.dim == axis) continue;
      bool ok = true;
      for (TensorId t : node.inputs)
        ok = ok && valid_split(type(t), spec.dim, spec.outer);
      for (TensorId t : node.outputs)
        ok = ok && valid_split(type(t), spec.dim, spec.outer);
      if (!ok) continue;
      Strategy s;
      s.in.assign(node.inputs.size(), spec);
      s.out.assign(node.outputs.size(), spec);
      s.rule = str_cat(node.op, " along another dim");
      out.push_back(std::move(s));
    }
    return out;
  }
  case ops::ShardRule::kNormalizeAxis:
  case ops::ShardRule::kNormalizeTrailing: {
    const int axis = axis_or(attrs.get_int("axis"), r, 0);
    // Softmax normalizes one dim; LayerNorm every dim from `axis` on.
    const bool trailing = def->traits.shard == ops::ShardRule::kNormalizeTrailing;
    for (const ShardSpec &spec : split_specs(y)) {
      if (trailing ? spec.dim >= axis : spec.dim == axis) continue;
      Strategy s;
      s.in.assign(node.inputs.size(), ShardSpec::replicated());
      s.in[0] = spec;
      s.out = {spec};
      s.rule = "normalization along an unsplit dim";
      out.push_back(std::move(s));
    }
    return out;
  }
  case ops::ShardRule::kPool:
    for (const ShardSpec &spec : split_specs(y))
      if (spec.dim <= 1) out.push_back({{spec}, {spec}, "pooling per channel"});
    return out;
  case ops::ShardRule::kMatMul: matmul_strategies(node, attrs, out); return out;
  case ops::ShardRule::kConv: conv_strategies(node, attrs, out); return out;
  case ops::ShardRule::kGather: gather_strategies(node, attrs, out); return out;
  case ops::ShardRule::kCrossEntropy: cross_entropy_strategies(node, out); return out;
  }
  return out;
}

void Sharder::elementwise_strategies(const Node &node, ops::Linearity linearity,
                                     std::vector<Strategy> &out) const {
  const TensorType &y = type(node.outputs[0]);
  const int r = static_cast<int>(y.rank());
  for (const ShardSpec &spec : split_specs(y)) {
    Strategy s;
    s.rule = "elementwise, split like its inputs";
    for (TensorId in : node.inputs) {
      const TensorType &x = type(in);
      const int di = spec.dim - (r - static_cast<int>(x.rank()));
      if (di >= 0 && x.shape[static_cast<size_t>(di)] == y.shape[static_cast<size_t>(spec.dim)])
        s.in.push_back(ShardSpec::split(di, spec.outer));
      else
        s.in.push_back(ShardSpec::replicated());
    }
    s.out = {spec};
    out.push_back(std::move(s));
  }
  auto same_shape = [&](TensorId in) { return type(in).shape == y.shape; };
  switch (linearity) {
  case ops::Linearity::kNone: return;
  case ops::Linearity::kJoint:
    if (std::all_of(node.inputs.begin(), node.inputs.end(), same_shape)) {
      Strategy s = all_in(node, Kind::kPartial);
      s.rule = node.inputs.size() > 1 ? "sum of partial sums" : "linear in a partial sum";
      out.push_back(std::move(s));
    }
    return;
  case ops::Linearity::kEachInput:
  case ops::Linearity::kFirstInput: {
    const size_t linear_in = linearity == ops::Linearity::kFirstInput ? 1 : node.inputs.size();
    for (size_t k = 0; k < linear_in; ++k) {
      if (!same_shape(node.inputs[k])) continue;
      Strategy s = all_in(node, Kind::kReplicated);
      s.in[k] = ShardSpec::partial();
      s.out = {ShardSpec::partial()};
      s.rule = "linear in a partial sum";
      out.push_back(std::move(s));
    }
    return;
  }
  }
}

void Sharder::matmul_strategies(const Node &node, const ops::AttrReader &attrs,
                                std::vector<Strategy> &out) const {
  const TensorType &y = type(node.outputs[0]);
  const int r = static_cast<int>(y.rank());
  const TensorType &a = type(node.inputs[0]);
  const TensorType &b = type(node.inputs[1]);
  if (a.rank() < 2 || b.rank() < 2) return;
  const bool ta = attrs.get_int("trans_a") != 0, tb = attrs.get_int("trans_b") != 0;
  const int ra = static_cast<int>(a.rank()), rb = static_cast<int>(b.rank());
  const int a_m = ta ? ra - 1 : ra - 2, a_k = ta ? ra - 2 : ra - 1;
  const int b_k = tb ? rb - 1 : rb - 2, b_n = tb ? rb - 2 : rb - 1;
  const bool has_c = node.inputs.size() > 2;
  const TensorType *c = has_c ? &type(node.inputs[2]) : nullptr;
  // C (Gemm) broadcast to the output: split along `dim` of Y where it has it.
  auto c_spec = [&](const ShardSpec &ys) {
    const int dc = ys.dim - (r - static_cast<int>(c->rank()));
    if (dc >= 0 && c->shape[static_cast<size_t>(dc)] == y.shape[static_cast<size_t>(ys.dim)])
      return ShardSpec::split(dc, ys.outer);
    return ShardSpec::replicated();
  };
  auto push = [&](ShardSpec sa, ShardSpec sb, ShardSpec sy, std::string rule) {
    Strategy s{{sa, sb}, {sy}, std::move(rule)};
    if (has_c) s.in.push_back(sy.is_split() ? c_spec(sy) : ShardSpec::replicated());
    out.push_back(std::move(s));
  };
  for (int64_t o : outers_) {
    if (valid_split(b, b_n, o))
      push(ShardSpec::replicated(), ShardSpec::split(b_n, o), ShardSpec::split(r - 1, o),
           "column split (B by columns)");
    if (valid_split(a, a_m, o))
      push(ShardSpec::split(a_m, o), ShardSpec::replicated(), ShardSpec::split(r - 2, o),
           "row split of A");
    if (!has_c && valid_split(a, a_k, o) && valid_split(b, b_k, o))
      push(ShardSpec::split(a_k, o), ShardSpec::split(b_k, o), ShardSpec::partial(),
           "row split (the contracted dim; partial sums)");
  }
  // Batch dims (attention heads): both operands split alike where they have the dim.
  for (int d = 0; d + 2 < r; ++d)
    for (int64_t o : outers_) {
      if (!valid_split(y, d, o)) continue;
      auto operand = [&](const TensorType &x) {
        const int dx = d - (r - static_cast<int>(x.rank()));
        if (dx >= 0 && dx + 2 < static_cast<int>(x.rank()) &&
            x.shape[static_cast<size_t>(dx)] == y.shape[static_cast<size_t>(d)])
          return ShardSpec::split(dx, o);
        return ShardSpec::replicated();
      };
      push(operand(a), operand(b), ShardSpec::split(d, o), "batch dims (heads) split");
    }
}

void Sharder::conv_strategies(const Node &node, const ops::AttrReader &attrs,
                              std::vector<Strategy> &out) const {
  const TensorType &y = type(node.outputs[0]);
  const int64_t group = attrs.get_int("group");
  const TensorType &w = type(node.inputs[1]);
  const bool has_bias = node.inputs.size() > 2;
  for (int64_t o : outers_) {
    if (group == 1 && valid_split(w, 0, o)) {
      Strategy s{{ShardSpec::replicated(), ShardSpec::split(0, o)},
                 {ShardSpec::split(1, o)},
                 "output channels split"};
      if (has_bias) s.in.push_back(ShardSpec::split(0, o));
      out.push_back(std::move(s));
    }
    if (group == 1 && !has_bias && valid_split(w, 1, o))
      out.push_back({{ShardSpec::split(1, o), ShardSpec::split(1, o)},
                     {ShardSpec::partial()},
                     "input channels split (partial sums)"});
    if (valid_split(y, 0, o)) {
      Strategy s{{ShardSpec::split(0, o), ShardSpec::replicated()},
                 {ShardSpec::split(0, o)},
                 "batch split"};
      if (has_bias) s.in.push_back(ShardSpec::replicated());
      out.push_back(std::move(s));
    }
  }
}

void Sharder::gather_strategies(const Node &node, const ops::AttrReader &attrs,
                                std::vector<Strategy> &out) const {
  const TensorType &data = type(node.inputs[0]);
  const TensorType &indices = type(node.inputs[1]);
  const int axis = axis_or(attrs.get_int("axis"), static_cast<int64_t>(data.rank()), 0);
  const int ri = static_cast<int>(indices.rank());
  for (const ShardSpec &spec : split_specs(data)) {
    if (spec.dim == axis) continue;
    const int e = spec.dim < axis ? spec.dim : spec.dim - 1 + ri;
    out.push_back({{spec, ShardSpec::replicated()},
                   {ShardSpec::split(e, spec.outer)},
                   "gather from a table split along another dim"});
  }
  for (const ShardSpec &spec : split_specs(indices))
    out.push_back({{ShardSpec::replicated(), spec},
                   {ShardSpec::split(axis + spec.dim, spec.outer)},
                   "gather with split indices"});
  // Megatron-LM's vocabulary-parallel embedding: each member looks up the
  // rows it holds, zeros for the others'.
  if (valid_split(data, axis, 1)) {
    Strategy s{{ShardSpec::split(axis), ShardSpec::replicated()},
               {ShardSpec::partial()},
               "gather from a table split by rows (each member's rows; partial sums)"};
    s.attrs = {{"parts", int64_t{t_}}};
    out.push_back(std::move(s));
  }
}

void Sharder::cross_entropy_strategies(const Node &node, std::vector<Strategy> &out) const {
  // Megatron-LM's vocabulary-parallel cross entropy: the logits stay split
  // by class; the members exchange three numbers per row.
  const TensorType &logits = type(node.inputs[0]);
  if (valid_split(logits, static_cast<int>(logits.rank()) - 1, 1)) {
    Strategy s{{ShardSpec::split(static_cast<int>(logits.rank()) - 1), ShardSpec::replicated()},
               {ShardSpec::replicated()},
               "cross entropy over logits split by class (per row: max, sum of "
               "exponentials and label logit gathered)"};
    const double stats = static_cast<double>(type(node.inputs[1]).num_elements()) * 3 * t_ *
                         static_cast<double>(dtype_size(logits.dtype));
    s.communication = all_gather_time(stats, t_, options_.link, CollectiveAlgorithm::kRing);
    s.attrs = {{"parts", int64_t{t_}}};
    s.vocab_parallel_loss = true;
    out.push_back(std::move(s));
  }
}

std::pair<double, ShardSpec> Sharder::best_arrival(TensorId input, const ShardSpec &want) const {
  double best = kInf;
  ShardSpec from;
  for (const auto &[spec, excess] : table_[input]) {
    const double c = excess + arrive(input, spec, want, false);
    if (c < best) best = c, from = spec;
  }
  return {best, from};
}

double Sharder::strategy_cost(NodeId id, const Strategy &s) const {
  const Node &node = g_.node(id);
  double cost = (s.splits() ? node_time_[id] / t_ : node_time_[id]) + s.communication;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    const TensorId in = node.inputs[i];
    cost += best_arrival(in, s.in[i]).first;
    // A replicated operand of split work gets partial gradients: TpCopy sums them.
    if (s.splits() && s.in[i].kind == Kind::kReplicated && needs_grad_[in]) cost += all_reduce(in);
    if (cost == kInf) return kInf;
  }
  return cost;
}

// Which tensors carry a gradient (depend on a trainable parameter).
void Sharder::find_gradients(const std::vector<NodeId> &order) {
  needs_grad_.assign(g_.num_tensors(), false);
  for (TensorId id = 0; id < g_.num_tensors(); ++id)
    needs_grad_[id] =
        g_.tensor(id).kind == TensorKind::kParameter && is_floating(g_.tensor(id).type.dtype);
  for (NodeId id : order) {
    bool any = false;
    for (TensorId in : g_.node(id).inputs)
      any = any || needs_grad_[in];
    for (TensorId out : g_.node(id).outputs)
      needs_grad_[out] = any && is_floating(type(out).dtype);
  }
}

Status Sharder::fill_cost_tables(const std::vector<NodeId> &order) {
  table_.assign(g_.num_tensors(), {});
  for (TensorId id = 0; id < g_.num_tensors(); ++id) {
    if (g_.tensor(id).producer != kNoNode) continue;
    table_[id][ShardSpec::replicated()] = 0;
    if (is_parameter(id))
      for (const ShardSpec &spec : split_specs(type(id)))
        table_[id][spec] = 0;
  }
  node_strategies_.assign(g_.num_nodes(), {});
  node_time_.assign(g_.num_nodes(), 0);
  for (NodeId id : order) {
    node_time_[id] = partitioner::node_time(g_, id, options_.device);
    node_strategies_[id] = strategies(id);
    const Node &node = g_.node(id);
    for (const Strategy &s : node_strategies_[id]) {
      const double c = strategy_cost(id, s);
      if (c == kInf) continue;
      for (size_t k = 0; k < node.outputs.size(); ++k) {
        auto [it, fresh] = table_[node.outputs[k]].emplace(s.out[k], c);
        if (!fresh) it->second = std::min(it->second, c);
      }
    }
    for (TensorId out : node.outputs) {
      auto &entries = table_[out];
      if (entries.empty())
        return internal_error("tensor parallelism: no rule fits '", node.name, "'");
      double least = kInf;
      for (const auto &[spec, c] : entries)
        least = std::min(least, c);
      for (auto &[spec, c] : entries)
        c -= least;
    }
  }
  return Status::ok();
}

double Sharder::serve(TensorId id, const ShardSpec &spec) const {
  double c = 0;
  for (const ShardSpec &want : demands_[id])
    c += arrive(id, spec, want, true);
  return c;
}

double Sharder::storage(TensorId id, const ShardSpec *extra) const {
  std::vector<ShardSpec> wants = demands_[id];
  if (extra != nullptr) wants.push_back(*extra);
  double best = kInf;
  for (const ShardSpec &stored : wants) {
    double c = 0;
    for (const ShardSpec &want : wants)
      c += arrive(id, stored, want, true);
    best = std::min(best, c);
  }
  return wants.empty() ? 0.0 : best;
}

double Sharder::storage_cost(NodeId id, const Strategy &s) const {
  double c = 0;
  const Node &node = g_.node(id);
  for (size_t i = 0; i < node.inputs.size(); ++i)
    if (is_parameter(node.inputs[i]) && !demands_[node.inputs[i]].empty())
      c += storage(node.inputs[i], &s.in[i]) - storage(node.inputs[i], nullptr);
  return c;
}

void Sharder::choose_strategies(const std::vector<NodeId> &order) {
  demands_.assign(g_.num_tensors(), {});
  for (TensorId out : g_.outputs())
    demands_[out].push_back(ShardSpec::replicated());
  chosen_.assign(g_.num_tensors(), ShardSpec{});
  strategy_of_.assign(g_.num_nodes(), 0);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const NodeId id = *it;
    const Node &node = g_.node(id);
    double best = kInf;
    int pick = 0;
    const auto &candidates = node_strategies_[id];
    for (size_t k = 0; k < candidates.size(); ++k) {
      double c = strategy_cost(id, candidates[k]) + storage_cost(id, candidates[k]);
      for (size_t o = 0; o < node.outputs.size() && c < kInf; ++o)
        c += serve(node.outputs[o], candidates[k].out[o]);
      if (c < best) best = c, pick = static_cast<int>(k);
    }
    strategy_of_[id] = pick;
    const Strategy &s = candidates[static_cast<size_t>(pick)];
    for (size_t o = 0; o < node.outputs.size(); ++o)
      chosen_[node.outputs[o]] = s.out[o];
    for (size_t i = 0; i < node.inputs.size(); ++i)
      demands_[node.inputs[i]].push_back(s.in[i]);
  }
}

// Sources: parameters are stored in the spec that serves their readers best.
void Sharder::choose_source_specs() {
  for (TensorId id = 0; id < g_.num_tensors(); ++id) {
    if (g_.tensor(id).producer != kNoNode) continue;
    chosen_[id] = ShardSpec::replicated();
    if (!is_parameter(id)) continue;
    double best = serve(id, ShardSpec::replicated());
    for (const ShardSpec &want : demands_[id]) {
      const double c = serve(id, want);
      if (c < best) best = c, chosen_[id] = want;
    }
  }
}

TensorType Sharder::local_type(TensorId id) const {
  TensorType ty = type(id);
  if (chosen_[id].is_split()) ty.shape[static_cast<size_t>(chosen_[id].dim)] /= t_;
  return ty;
}

std::vector<TensorId> Sharder::add_node(std::string op, std::vector<TensorId> inputs,
                                        std::vector<Attribute> attrs, std::string name,
                                        std::vector<std::string> output_names) {
  Node node;
  node.name = local_.unique_name(name);
  node.op = std::move(op);
  for (Attribute &a : attrs)
    node.set_attr(std::move(a.name), std::move(a.value));
  llvm::SmallVector<TensorType, 4> in_types;
  for (TensorId in : inputs) {
    node.inputs.push_back(in);
    in_types.push_back(local_.tensor(in).type);
  }
  auto types = registry_.infer_types(node, in_types);
  if (!types.is_ok()) {
    status_ = types.status().with_context(str_cat("tensor parallelism: node '", node.name, "'"));
    return std::vector<TensorId>{};
  }
  std::vector<TensorId> outs;
  for (size_t k = 0; k < types->size(); ++k) {
    Tensor t;
    t.name =
        k < output_names.size() ? output_names[k] : local_.unique_name(str_cat(node.name, ":", k));
    t.type = (*types)[k];
    auto added = local_.add_tensor(std::move(t));
    if (!added.is_ok()) {
      status_ = added.status();
      return std::vector<TensorId>{};
    }
    outs.push_back(*added);
    node.outputs.push_back(*added);
  }
  if (auto added = local_.add_node(std::move(node)); !added.is_ok()) status_ = added.status();
  return outs;
}

std::string Sharder::describe(NodeId id) const {
  if (id == kNoNode) return std::string("the graph output");
  const Node &node = g_.node(id);
  return str_cat("'", node.name, "' (", node.op, ", ", chosen_strategy(id).rule, ")");
}

// The split attributes of a collective: `spec`'s dim and outer under the
// names `dim` and `outer`.
std::vector<Attribute> split_attrs(const ShardSpec &spec, const char *dim = "axis",
                                   const char *outer = "outer") {
  return std::vector<Attribute>{{dim, int64_t{spec.dim}}, {outer, spec.outer}};
}

TensorId Sharder::add_collective(const char *op, const char *suffix, TensorId input,
                                 const std::vector<Attribute> &split, const std::string &name,
                                 const std::string &why) {
  std::vector<Attribute> attrs = {{"parts", int64_t{t_}}};
  attrs.insert(attrs.end(), split.begin(), split.end());
  attrs.push_back({"why", why});
  const std::string node = str_cat(name, ".tp_", suffix);
  auto outs = add_node(op, {input}, std::move(attrs), node, {local_.unique_name(node)});
  return outs.empty() ? kInvalidTensor : outs[0];
}

TensorId Sharder::convert(TensorId id, const ShardSpec &want, NodeId reader) {
  const ShardSpec &have = chosen_[id];
  if (have == want || !status_.is_ok()) return base_[id];
  auto key = std::make_pair(id, want);
  if (auto found = converted_.find(key); found != converted_.end()) return found->second;
  const std::string &name = g_.tensor(id).name;
  const NodeId producer = g_.tensor(id).producer;
  const std::string why =
      str_cat("'", name, "' is ",
              have.kind == Kind::kPartial ? std::string("partial sums")
              : have.is_split()           ? "split " + have.to_string()
                                          : std::string("whole (R)"),
              " from ", producer == kNoNode ? std::string("its source") : describe(producer), "; ",
              describe(reader), " reads it ", want.to_string());
  TensorId made = kInvalidTensor;
  if (want.kind == Kind::kReplicated && have.kind == Kind::kPartial) {
    made = add_collective("TpAllReduce", "all_reduce", base_[id], {}, name, why);
  } else if (want.kind == Kind::kReplicated && have.is_split()) {
    made = add_collective("TpAllGather", "all_gather", base_[id], split_attrs(have), name, why);
  } else if (want.is_split() && have.is_split() && want.dim != have.dim) {
    std::vector<Attribute> attrs = split_attrs(want);
    for (Attribute &from : split_attrs(have, "from_axis", "from_outer"))
      attrs.push_back(std::move(from));
    made = add_collective("TpAllToAll", "all_to_all", base_[id], attrs, name, why);
  } else if (want.is_split() && have.kind == Kind::kPartial) {
    made = add_collective("TpReduceScatter", "reduce_scatter", base_[id], split_attrs(want), name,
                          why);
  } else if (want.is_split()) {
    const TensorId whole = convert(id, ShardSpec::replicated(), reader);
    if (!status_.is_ok()) return kInvalidTensor;
    made = add_collective("TpSplit", "split", whole, split_attrs(want), name, why);
  } else {
    status_ = internal_error("tensor parallelism: cannot turn '", name, "' from ", have.to_string(),
                             " into ", want.to_string());
  }
  converted_[key] = made;
  return made;
}

Status Sharder::add_sources(TensorParallelResult &result) {
  for (TensorId id = 0; id < g_.num_tensors(); ++id) {
    const Tensor &t = g_.tensor(id);
    if (t.producer != kNoNode) continue;
    Tensor copy = t;
    copy.type = local_type(id);
    copy.producer = kNoNode;
    ASSIGN_OR_RETURN(base_[id], local_.add_tensor(std::move(copy)));
    if (chosen_[id].is_split())
      result.shards.push_back(
          {t.name, {t.type.shape.begin(), t.type.shape.end()}, chosen_[id].dim, chosen_[id].outer});
  }
  for (TensorId in : g_.inputs())
    local_.add_input(base_[in]);
  return Status::ok();
}

TensorId Sharder::local_input(NodeId id, size_t i) {
  const Node &node = g_.node(id);
  const Strategy &s = chosen_strategy(id);
  const TensorId in = node.inputs[i];
  const TensorId local_in = convert(in, s.in[i], id);
  if (!s.splits() || s.in[i].kind != Kind::kReplicated || !needs_grad_[in]) return local_in;
  // Split work reading a replicated tensor: its gradient is summed over the group.
  auto found = copied_.find(local_in);
  if (found == copied_.end()) {
    const std::string name = local_.tensor(local_in).name + ".tp_copy";
    const std::string why = str_cat("'", g_.tensor(in).name, "' is read whole by ", describe(id),
                                    ", whose gradients for it are partial");
    auto outs = add_node("TpCopy", {local_in}, {{"parts", int64_t{t_}}, {"why", why}}, name,
                         {local_.unique_name(name)});
    found = copied_.emplace(local_in, outs.empty() ? kInvalidTensor : outs[0]).first;
  }
  return found->second;
}

Sharder::LocalOp Sharder::local_op(const Node &node, const Strategy &s) const {
  LocalOp local{node.op, node.attrs};
  for (const Attribute &a : s.attrs) {
    auto at = std::find_if(local.attrs.begin(), local.attrs.end(),
                           [&](const Attribute &b) { return b.name == a.name; });
    if (at == local.attrs.end())
      local.attrs.push_back(a);
    else
      *at = a;
  }
  if (node.op == "Reshape")
    for (Attribute &a : local.attrs)
      if (a.name == "shape") {
        const TensorType ty = local_type(node.outputs[0]);
        a.value = std::vector<int64_t>(ty.shape.begin(), ty.shape.end());
      }
  if (is_reshape(node) && local.op != "Reshape" && s.in[0].is_split()) {
    // Squeeze's "every size-1 dim" or Flatten's axis would read the piece's
    // shape; a Reshape to the local shape says exactly what is meant.
    local.op = "Reshape";
    const TensorType ty = local_type(node.outputs[0]);
    local.attrs = {{"shape", std::vector<int64_t>(ty.shape.begin(), ty.shape.end())}};
  }
  return local;
}

Status Sharder::add_vocab_stats(const Node &node, const Strategy &s,
                                const std::vector<Attribute> &attrs,
                                std::vector<TensorId> &inputs) {
  // The members' per-row statistics, gathered; then the loss from them.
  std::vector<Attribute> stats_attrs;
  for (const Attribute &a : attrs)
    if (a.name == "parts" || a.name == "ignore_index") stats_attrs.push_back(a);
  auto stats =
      add_node("VocabParallelStats", inputs, std::move(stats_attrs), node.name + ".vocab_stats",
               {local_.unique_name(node.name + ".vocab_stats")});
  RETURN_IF_ERROR(status_);
  const auto rank = static_cast<int64_t>(local_.tensor(stats[0]).type.rank());
  const std::string why = str_cat("'", node.name, "' (", node.op, ", ", s.rule, ") reads '",
                                  g_.tensor(node.inputs[0]).name,
                                  "' split by class: every member's three numbers per row");
  const std::string gathered_name = node.name + ".vocab_stats.tp_all_gather";
  auto gathered =
      add_node("TpAllGather", stats,
               {{"parts", int64_t{t_}}, {"axis", rank - 1}, {"outer", int64_t{1}}, {"why", why}},
               gathered_name, {local_.unique_name(gathered_name)});
  RETURN_IF_ERROR(status_);
  inputs.push_back(gathered[0]);
  return Status::ok();
}

Status Sharder::add_local_node(NodeId id, TensorParallelResult &result) {
  const Node &node = g_.node(id);
  const Strategy &s = chosen_strategy(id);
  result.rules[node.name] = s.rule;
  std::vector<TensorId> inputs;
  for (size_t i = 0; i < node.inputs.size(); ++i)
    inputs.push_back(local_input(id, i));
  RETURN_IF_ERROR(status_);
  LocalOp local = local_op(node, s);
  std::vector<std::string> names;
  for (TensorId out : node.outputs)
    names.push_back(g_.tensor(out).name);
  if (s.vocab_parallel_loss) {
    RETURN_IF_ERROR(add_vocab_stats(node, s, local.attrs, inputs));
    local.op = "VocabParallelCrossEntropy";
  }
  auto outs = add_node(local.op, inputs, std::move(local.attrs), node.name, names);
  RETURN_IF_ERROR(status_);
  for (size_t k = 0; k < node.outputs.size(); ++k) {
    const TensorId out = node.outputs[k];
    base_[out] = outs[k];
    if (!(local_.tensor(outs[k]).type == local_type(out)))
      return internal_error("tensor parallelism: node '", node.name, "' (", node.op, ", ", s.rule,
                            ") gives ", local_.tensor(outs[k]).type.to_string(), " for '",
                            g_.tensor(out).name, "' (", chosen_[out].to_string(), " of ",
                            type(out).to_string(), ")");
  }
  return Status::ok();
}

Result<TensorParallelResult> Sharder::run() {
  if (!g_.updates().empty())
    return unimplemented("tensor parallelism: the forward graph has state updates");
  ASSIGN_OR_RETURN(std::vector<NodeId> order, g_.topological_order());
  collect_outers();
  find_gradients(order);
  // Forward: the cost table of every tensor.
  RETURN_IF_ERROR(fill_cost_tables(order));
  // Backward: the spec of every tensor, from what its readers want.
  choose_strategies(order);
  choose_source_specs();

  // The local graph.
  TensorParallelResult result;
  base_.assign(g_.num_tensors(), kInvalidTensor);
  RETURN_IF_ERROR(add_sources(result));
  for (NodeId id : order)
    RETURN_IF_ERROR(add_local_node(id, result));
  for (TensorId out : g_.outputs()) {
    const TensorId whole = convert(out, ShardSpec::replicated(), kNoNode);
    RETURN_IF_ERROR(status_);
    local_.add_output(whole);
  }
  for (TensorId id = 0; id < g_.num_tensors(); ++id)
    result.specs[g_.tensor(id).name] = chosen_[id];
  RETURN_IF_ERROR(verify_graph(local_, registry_).with_context("tensor-parallel local graph"));
  result.local = std::move(local_);
  return result;
}

} // namespace

Result<TensorParallelResult> shard_tensor_parallel(const Graph &forward,
                                                   const TensorParallelOptions &options) {
  if (options.parts < 1)
    return invalid_argument("tensor parallelism needs at least 1 device, got ", options.parts);
  if (options.parts == 1) {
    // One member holds everything.
    TensorParallelResult whole;
    whole.local = forward;
    for (const Tensor &t : forward.tensors())
      whole.specs[t.name] = ShardSpec::replicated();
    return whole;
  }
  Sharder sharder(forward, options);
  return sharder.run();
}

std::vector<TensorShard> with_optimizer_state(const Graph &training,
                                              std::vector<TensorShard> shards) {
  const size_t n = shards.size();
  for (size_t i = 0; i < n; ++i)
    for (const char *suffix : {".momentum", ".adam_m", ".adam_v"}) {
      TensorShard state = shards[i];
      state.tensor += suffix;
      if (training.find_tensor(state.tensor)) shards.push_back(std::move(state));
    }
  return shards;
}

} // namespace strata::partitioner
