#include "plan/pieces.h"

#include <algorithm>
#include <cstring>

namespace strata::plan {

namespace {

int64_t product(llvm::ArrayRef<int64_t> dims, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i)
    p *= dims[i];
  return p;
}

} // namespace

void copy_piece(const serialization::PlanShard &shard, int parts, int rank, size_t element_bytes,
                std::byte *full, std::byte *piece, bool to_piece) {
  const auto d = static_cast<size_t>(shard.dim);
  const auto &shape = shard.full_shape;
  // The full tensor as [before * outer, parts, m, after]; the piece as
  // [before * outer, m, after].
  const int64_t rows = product(shape, 0, d) * shard.outer;
  const int64_t m = shape[d] / shard.outer / parts;
  const size_t run = static_cast<size_t>(m * product(shape, d + 1, shape.size())) * element_bytes;
  for (int64_t row = 0; row < rows; ++row) {
    std::byte *f = full + (static_cast<size_t>(row * parts + rank)) * run;
    std::byte *p = piece + static_cast<size_t>(row) * run;
    if (run == 0) continue;
    if (to_piece)
      std::memcpy(p, f, run);
    else
      std::memcpy(f, p, run);
  }
}

PieceLayout piece_layout(const Node &node, const TensorType &piece) {
  const int64_t axis = node.int_attr("axis").value_or(0);
  const int64_t outer = node.int_attr("outer").value_or(1);
  const auto a = static_cast<size_t>(axis < 0 ? axis + piece.rank() : axis);
  PieceLayout layout;
  size_t after = 1;
  for (size_t d = 0; d < static_cast<size_t>(piece.rank()); ++d) {
    const auto n = static_cast<size_t>(piece.shape[d]);
    if (d < a) layout.rows *= n;
    if (d > a) after *= n;
  }
  layout.rows *= static_cast<size_t>(outer);
  layout.run = static_cast<size_t>(piece.shape[a]) / static_cast<size_t>(outer) * after *
               dtype_size(piece.dtype);
  return layout;
}

Result<AllToAllLayout> all_to_all_layout(const Node &node, const TensorType &in,
                                         const TensorType &out, int parts) {
  // One piece of `whole` cut along the attribute `axis_name`, as
  // piece_layout sees a node of that axis and outer.
  auto piece_of = [&](const TensorType &whole, const char *axis_name,
                      const char *outer_name) -> Result<PieceLayout> {
    int64_t axis = node.int_attr(axis_name).value_or(0);
    if (axis < 0) axis += whole.rank();
    if (axis < 0 || axis >= whole.rank() || whole.shape[static_cast<size_t>(axis)] % parts != 0)
      return invalid_argument("node '", node.name, "': ", whole.to_string(),
                              " does not split into ", parts, " along ", axis_name);
    Node view = node;
    view.attrs = {{"axis", axis}, {"outer", node.int_attr(outer_name).value_or(1)}};
    TensorType piece = whole;
    piece.shape[static_cast<size_t>(axis)] /= parts;
    return piece_layout(view, piece);
  };
  AllToAllLayout layout;
  ASSIGN_OR_RETURN(layout.cut, piece_of(in, "axis", "outer"));
  ASSIGN_OR_RETURN(layout.place, piece_of(out, "from_axis", "from_outer"));
  layout.block = static_cast<size_t>(in.size_bytes()) / static_cast<size_t>(parts);
  if (layout.cut.rows * layout.cut.run != layout.block ||
      layout.place.rows * layout.place.run != layout.block)
    return invalid_argument("node '", node.name, "': ", in.to_string(), " -> ", out.to_string(),
                            " does not cut into ", parts, " equal blocks");
  return layout;
}

Result<HostTensor> join_pieces(const Tensor &tensor, const serialization::PlanShard &shard,
                               int parts, const std::vector<HostTensor> &pieces) {
  if (pieces.size() != static_cast<size_t>(parts))
    return invalid_argument("'", tensor.name, "' has ", pieces.size(),
                            " tensor-parallel pieces; the plan cuts it in ", parts);
  TensorType type = tensor.type;
  type.shape.assign(shard.full_shape.begin(), shard.full_shape.end());
  HostTensor full = HostTensor::zeros(type);
  for (size_t m = 0; m < pieces.size(); ++m) {
    if (!(pieces[m].type == tensor.type))
      return invalid_argument("piece ", m, " of '", tensor.name, "' is ",
                              pieces[m].type.to_string(), "; the plan's pieces are ",
                              tensor.type.to_string());
    copy_piece(shard, parts, static_cast<int>(m), dtype_size(type.dtype), full.data(),
               const_cast<std::byte *>(pieces[m].data()), false);
  }
  return full;
}

ShardedCompute::View ShardedCompute::view(const TensorType &type, bool held_as_shard) const {
  if (type.num_elements() == 1 && n > 1) return {true, 0, type};
  return {false, held_as_shard ? 0 : chunk * rank * static_cast<int64_t>(dtype_size(type.dtype)),
          TensorType{type.dtype, {chunk}}};
}

Result<ShardedCompute> sharded_compute(const Graph &graph, const Node &node,
                                       const std::vector<int32_t> &group, int32_t device,
                                       std::string_view context) {
  ShardedCompute shard;
  const auto count = static_cast<int64_t>(group.size());
  const auto member = std::find(group.begin(), group.end(), device);
  if (member == group.end())
    return invalid_argument(context, ": device ", device, " is not in the shard's group");
  shard.rank = member - group.begin();
  shard.n = graph.tensor(node.inputs[0]).type.num_elements();
  // A shard is a slice of operands of n elements; n must split evenly.
  if (shard.n % count != 0)
    return invalid_argument(context, ": ", shard.n, " elements do not split over ", count,
                            " devices");
  shard.chunk = shard.n / count;
  for (TensorId t : node.inputs) {
    const int64_t e = graph.tensor(t).type.num_elements();
    if (e != shard.n && e != 1)
      return invalid_argument(context, ": operand '", graph.tensor(t).name, "' has ", e,
                              " elements; a shard needs ", shard.n, " or a scalar");
  }
  for (TensorId t : node.outputs)
    if (graph.tensor(t).type.num_elements() != shard.n && node.op != "SumOfSquares")
      return invalid_argument(context, ": output '", graph.tensor(t).name,
                              "' is not the size of the shard's operands");
  return shard;
}

} // namespace strata::plan
