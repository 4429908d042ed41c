// How a plan cuts tensors: tensor-parallel pieces (a member's part of a
// parameter, PlanShard), the layouts of the tensor-parallel collectives'
// pieces, and ZeRO-1's shards (ComputeShard's view of its operands). Every
// backend reads and writes pieces with these functions, so all of them agree
// on which bytes are whose.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

#include "graph/graph.h"
#include "graph/host_tensor.h"
#include "serialization/plan_io.h"

namespace strata::plan {

// Copies piece `rank` of a full tensor of shape shard.full_shape out of `full`
// into `piece` (to_piece) or back (!to_piece); elements of `element_bytes`.
void copy_piece(const serialization::PlanShard &shard, int parts, int rank, size_t element_bytes,
                std::byte *full, std::byte *piece, bool to_piece);

// The full tensor put together from every member's piece of `tensor` (whose
// type is the piece's), in member order; errors name a wrong count or type.
Result<HostTensor> join_pieces(const Tensor &tensor, const serialization::PlanShard &shard,
                               int parts, const std::vector<HostTensor> &pieces);

// How a tensor-parallel node (TpAllGather, TpReduceScatter, TpSplit) cuts the
// full tensor along its `axis` (viewed as [outer, n / outer]): the full tensor
// is [rows, parts, run] and member r's piece is [rows, run], `run` in bytes.
struct PieceLayout {
  size_t rows = 1, run = 0;
};
PieceLayout piece_layout(const Node &node, const TensorType &piece);

// A TpAllToAll of `parts` members from `in` to `out`: how its input is cut
// along `axis` (block j, for member j, is `cut` within the input) and how its
// output is put together along `from_axis` (piece j, from member j, is
// `place` within the output); every block has the same bytes, and member r's
// output piece j is member j's input block r.
struct AllToAllLayout {
  PieceLayout cut, place;
  size_t block = 0; // bytes
};
Result<AllToAllLayout> all_to_all_layout(const Node &node, const TensorType &in,
                                         const TensorType &out, int parts);

// ZeRO-1's ComputeShard: node `node` run by the device at position `rank` of a
// group of `count` devices computes elements [rank c, (rank + 1) c) of every
// operand the size of its first input (n elements, c = n / count), viewed
// flat; scalars stay whole, and a tensor the device holds as its shard is that
// shard itself.
struct ShardedCompute {
  int64_t n = 0, chunk = 0, rank = 0;
  // How the shard sees a tensor of `type`: whole (`whole`), or `chunk`
  // elements (`type`) at byte `offset` of its buffer (0 when `held_as_shard`).
  struct View {
    bool whole = false;
    int64_t offset = 0;
    TensorType type;
  };
  View view(const TensorType &type, bool held_as_shard) const;
};
// Checks the node and the group: n splits evenly over it, every operand has n
// elements or one, every output n (SumOfSquares's pair is whole: what the
// shard adds), the device is a member. Errors name `context`.
Result<ShardedCompute> sharded_compute(const Graph &graph, const Node &node,
                                       const std::vector<int32_t> &group, int32_t device,
                                       std::string_view context);

} // namespace strata::plan
