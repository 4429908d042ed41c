// Tensor parallelism: the forward graph split over the `parts` devices of a
// tensor-parallel group.
//
// Every tensor gets a sharding spec over the group: replicated (R: every member
// holds all of it), split (S: member r holds piece r along one dim) or partial
// (P: every member holds a summand; the value is their sum). Each op declares
// its sharding rule in the registry (ops::ShardRule; ops::Linearity for partial
// sums), which gives the specs of inputs it accepts and the spec of the outputs
// it then produces (MatMul: column split R x S(1) -> S(-1), row split S(-1) x S(0) ->
// P, heads as batch dims; elementwise ops follow their inputs; LayerNorm and
// Softmax along non-normalized dims; Conv2d by output channels; reshapes map a
// split through their flattening; Gather from a table split by rows -> P and
// SoftmaxCrossEntropy of logits split by class -> R, Megatron-LM's vocabulary-
// parallel embedding and loss; ...). Any op accepts all-R. The forward graph
// may end in its loss (passes::add_loss), so that the loss runs split too.
//
// Nothing is annotated by hand. The pass picks a spec for every tensor by
// dynamic programming over the graph in topological order: for each tensor and
// each spec, the cheapest way to have it in that spec, charging every rule its
// compute time (divided by `parts` when the work is split) and every change of
// spec its collective on the group's link, forward and backward (an all-reduce
// for P -> R and for the gradient of a replicated tensor read by split work,
// an all-gather for S -> R). Parameters may be stored in any spec for free; an
// activation never goes from R to S by itself (the group splits the model; the
// data-parallel axis splits the batch), so splits start at the parameters. The
// choices are then read back from the graph outputs, which must be R. Costs
// are kept relative to each tensor's cheapest spec, so a residual stream's
// shared upstream cost cancels instead of doubling per layer. A parameter
// read by several nodes (a tied embedding) is stored once: choosing a node's
// rule charges what its wanting the parameter in some spec adds to the
// cheapest storage for the readers already decided. One split becomes
// another (S(a) -> S(b)) by an all-to-all, each member sending (p-1)/p^2 of
// the tensor where an all-gather and a slice would receive (p-1)/p of it.
//
// On a GPT this finds Megatron-LM's pattern (tests/partitioner/
// tensor_parallel_test.cc checks it at GPT-2-medium width on the H100 spec):
// the QKV and first MLP projections split by columns (QKV by heads: a split
// of the fused [Q | K | V] axis with outer 3), the attention by heads, the
// output and second MLP projections by rows, and one all-reduce after each
// block. Where the vocabulary is large it also finds the vocabulary-parallel
// embedding and loss: the tied table split by rows, the lookup a Gather of
// each member's rows (partial sums, one all-reduce), the logits left split by
// class into VocabParallelStats, a TpAllGather of three numbers per row, and
// VocabParallelCrossEntropy (ops/ops_nn.cc), whose gradient reaches the piece
// with nothing to communicate. On tiny models or slow links it may choose
// otherwise (an all-gather instead of an all-reduce, or replication), because
// that is cheaper there.
//
// The result is one local graph that every member runs: parameters at their
// piece's shape, activations at their local shape, and the communication as
// graph ops (ops/ops_parallel.cc) whose gradients are each other, so autodiff
// and the optimizer apply to the local graph unchanged: TpCopy (identity;
// gradient all-reduced), TpAllReduce (gradient passes through), TpAllGather
// and TpSplit (each other's gradient), TpReduceScatter (gradient
// all-gathered), TpAllToAll (gradient the reverse all-to-all). Each records
// why it is there (`why`, which `strata inspect --comm` prints). Pieces are
// cut from initializers only: weights that come as data (imported ONNX
// initializers) stay replicated.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "partitioner/cost/cluster.h"
#include "serialization/plan_io.h"

namespace strata::partitioner {

struct ShardSpec {
  enum class Kind : uint8_t { kReplicated, kSplit, kPartial };
  Kind kind = Kind::kReplicated;
  int dim = 0;       // split: the dim
  int64_t outer = 1; // split: the dim viewed as [outer, n / outer]; the second factor is cut
  static ShardSpec replicated() { return {}; }
  static ShardSpec partial() { return {Kind::kPartial, 0, 1}; }
  static ShardSpec split(int dim, int64_t outer = 1) { return {Kind::kSplit, dim, outer}; }
  bool is_split() const { return kind == Kind::kSplit; }
  std::string to_string() const; // "R", "P", "S(2)", "S(2/3)" (outer 3)
  friend bool operator==(const ShardSpec &, const ShardSpec &) = default;
  friend auto operator<=>(const ShardSpec &, const ShardSpec &) = default;
};

// A parameter held in pieces: member r of the group holds piece r of the full
// tensor along `dim` (with `outer`, as ShardSpec).
using TensorShard = serialization::PlanShard;

struct TensorParallelOptions {
  int parts = 2;
  DeviceSpec device; // compute is priced on it
  LinkSpec link;     // the group's link
  // Whether partial sums may become split activations by a reduce-scatter
  // (TpReduceScatter; its backward an all-gather), so that the elementwise work
  // between blocks runs split too, as in Megatron-LM's sequence parallelism.
  // Off, the search keeps Megatron-LM's plain pattern (an all-reduce after each
  // block); a partial tensor that must be split is still reduce-scattered.
  bool split_activations = false;
};

struct TensorParallelResult {
  Graph local; // what every member runs
  std::vector<TensorShard> shards;
  // The chosen spec of every forward tensor, by name (for inspection and tests).
  std::map<std::string, ShardSpec> specs;
  // The chosen rule of every forward node, by name ("column split", ...).
  std::map<std::string, std::string> rules;
};

// Errors: parts < 1, a forward graph with state updates.
Result<TensorParallelResult> shard_tensor_parallel(const Graph &forward,
                                                   const TensorParallelOptions &options);

// The optimizer state of a sharded parameter is sharded like it: adds the
// shards of "<param>.momentum", ".adam_m" and ".adam_v" when `training` has them.
std::vector<TensorShard> with_optimizer_state(const Graph &training,
                                              std::vector<TensorShard> shards);

} // namespace strata::partitioner
