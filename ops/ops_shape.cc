// Shape ops: ops that move or select elements without arithmetic, plus Constant,
// their gradient rules and the backward ops those need (SliceGrad, GatherGrad).
//
// Every kernel here works on bytes, so it runs on every dtype. Transpose and Slice
// share one strided copy: the output is written contiguously while the input is
// walked with a per-dimension stride, after merging dimensions that form one run.
// When the innermost run is contiguous in the input too, rows move with memcpy.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "ops/registry.h"
#include "ops/slice_plan.h"

namespace strata::ops {
namespace {

using TypeList = llvm::SmallVector<TensorType, 2>;

TypeList one(DType dtype, Shape shape) { return TypeList{TensorType{dtype, std::move(shape)}}; }

std::string ints_to_string(llvm::ArrayRef<int64_t> values) { return shape_to_string(values); }

int64_t product(llvm::ArrayRef<int64_t> dims) {
  int64_t p = 1;
  for (int64_t d : dims)
    p *= d;
  return p;
}

// Normalizes every axis of `axes` against `rank`; an error on an out-of-range or
// repeated axis names the attribute and starts with `context`.
Result<Shape> normalize_axes(llvm::ArrayRef<int64_t> axes, int64_t rank, std::string_view attr_name,
                             const std::string &context) {
  Shape out;
  for (int64_t axis : axes) {
    Result<int64_t> normalized = normalize_axis(axis, rank, attr_name);
    if (!normalized.is_ok()) return std::move(normalized).take_status().with_context(context);
    if (std::find(out.begin(), out.end(), *normalized) != out.end())
      return invalid_argument(context, ": attribute '", attr_name, "' = ", ints_to_string(axes),
                              " repeats axis ", *normalized);
    out.push_back(*normalized);
  }
  return out;
}

// Copies `count` elements of `element_size` bytes from `in` (stepping `stride`
// elements) to contiguous `out`.
void strided_run(const std::byte *in, int64_t stride, std::byte *out, int64_t count,
                 size_t element_size) {
  auto typed = [&](auto tag) {
    using T = decltype(tag);
    const T *src = reinterpret_cast<const T *>(in);
    T *dst = reinterpret_cast<T *>(out);
    for (int64_t i = 0; i < count; ++i)
      dst[i] = src[i * stride];
  };
  switch (element_size) {
  case 1: typed(uint8_t{}); return;
  case 2: typed(uint16_t{}); return;
  case 4: typed(uint32_t{}); return;
  case 8: typed(uint64_t{}); return;
  default:
    for (int64_t i = 0; i < count; ++i)
      std::memcpy(out + i * element_size, in + i * stride * static_cast<int64_t>(element_size),
                  element_size);
  }
}

// Writes out[i][j] = in[i + j * in_col_stride] for i < rows, j < cols (out is
// rows x cols, contiguous), in square tiles so that both the reads and the writes
// of one tile stay in cache.
template <typename T>
void transpose_tiles(const T *in, int64_t in_col_stride, T *out, int64_t rows, int64_t cols) {
  constexpr int64_t kTile = 32;
  for (int64_t i0 = 0; i0 < rows; i0 += kTile) {
    const int64_t i1 = std::min(rows, i0 + kTile);
    for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
      const int64_t j1 = std::min(cols, j0 + kTile);
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t j = j0; j < j1; ++j)
          out[i * cols + j] = in[i + j * in_col_stride];
    }
  }
}

// One rows x cols tile transpose of elements of `element_size` bytes; false when
// the size has no typed path.
bool transpose_block(const std::byte *in, int64_t in_col_stride, std::byte *out, int64_t rows,
                     int64_t cols, size_t element_size) {
  auto typed = [&](auto tag) {
    using T = decltype(tag);
    transpose_tiles(reinterpret_cast<const T *>(in), in_col_stride, reinterpret_cast<T *>(out),
                    rows, cols);
    return true;
  };
  switch (element_size) {
  case 1: return typed(uint8_t{});
  case 2: return typed(uint16_t{});
  case 4: return typed(uint32_t{});
  case 8: return typed(uint64_t{});
  default: return false;
  }
}

// Writes the tensor of shape `out_shape` whose element at index (i0, i1, ...) is
// in[base + sum(i_d * in_strides[d])] (in elements) contiguously to `out`.
void strided_copy(const void *in_data, int64_t base, llvm::ArrayRef<int64_t> out_shape,
                  llvm::ArrayRef<int64_t> in_strides, void *out_data, size_t element_size) {
  const int64_t total = product(out_shape);
  if (total == 0) return;
  const auto *in = static_cast<const std::byte *>(in_data);
  auto *out = static_cast<std::byte *>(out_data);
  const auto esize = static_cast<int64_t>(element_size);
  Shape dims;
  Shape strides;
  for (size_t d = 0; d < out_shape.size(); ++d) {
    if (out_shape[d] == 1) continue;
    if (!dims.empty() && strides.back() == in_strides[d] * out_shape[d]) {
      dims.back() *= out_shape[d];
      strides.back() = in_strides[d];
      continue;
    }
    dims.push_back(out_shape[d]);
    strides.push_back(in_strides[d]);
  }
  if (dims.empty()) {
    dims.push_back(1);
    strides.push_back(1);
  }
  const size_t rank = dims.size();
  const int64_t inner = dims.back();
  const int64_t inner_stride = strides.back();
  Shape index(rank, 0);
  int64_t offset = base;
  // A transpose of the last two dims (the input is contiguous along the
  // second-to-last output dim): move whole 2-D blocks in tiles.
  if (rank >= 2 && inner_stride != 1 && strides[rank - 2] == 1 && inner > 1) {
    const int64_t rows = dims[rank - 2];
    const int64_t block = rows * inner;
    bool tiled = true;
    for (int64_t done = 0; tiled && done < total; done += block) {
      tiled = transpose_block(in + offset * esize, inner_stride, out + done * esize, rows, inner,
                              element_size);
      for (size_t d = rank - 2; d-- > 0;) {
        offset += strides[d];
        if (++index[d] < dims[d]) break;
        offset -= strides[d] * dims[d];
        index[d] = 0;
      }
    }
    if (tiled) return;
    index.assign(rank, 0);
    offset = base;
  }
  for (int64_t done = 0; done < total; done += inner) {
    if (inner_stride == 1)
      std::memcpy(out + done * esize, in + offset * esize, static_cast<size_t>(inner * esize));
    else
      strided_run(in + offset * esize, inner_stride, out + done * esize, inner, element_size);
    for (size_t d = rank - 1; d-- > 0;) {
      offset += strides[d];
      if (++index[d] < dims[d]) break;
      offset -= strides[d] * dims[d];
      index[d] = 0;
    }
  }
}

size_t element_size(const ConstTensorView &view) { return dtype_size(view.dtype()); }

// Output = input bytes, unchanged (Reshape, Flatten, Squeeze, Unsqueeze).
Status copy_kernel(const KernelContext &context) {
  // An empty tensor may have no buffer at all: memcpy takes no null pointer.
  if (const auto bytes = static_cast<size_t>(context.inputs[0].type->size_bytes()); bytes > 0)
    std::memcpy(context.outputs[0].data, context.inputs[0].data, bytes);
  return Status::ok();
}

// Moving bytes costs no FLOPs; bytes are read and written once.
OpCost move_cost(const Node &node, const OpDef &def, llvm::ArrayRef<TensorType> inputs,
                 llvm::ArrayRef<TensorType> outputs) {
  OpCost cost = elementwise_cost(node, def, inputs, outputs);
  cost.flops = 0;
  return cost;
}

// Ops that read only part of their input (Slice, Gather) read what they write,
// plus any index tensors.
OpCost select_cost(const Node &, const OpDef &, llvm::ArrayRef<TensorType> inputs,
                   llvm::ArrayRef<TensorType> outputs) {
  OpCost cost;
  for (size_t i = 1; i < inputs.size(); ++i)
    cost.bytes_read += static_cast<double>(inputs[i].size_bytes());
  for (const TensorType &t : outputs) {
    cost.bytes_read += static_cast<double>(t.size_bytes());
    cost.bytes_written += static_cast<double>(t.size_bytes());
  }
  return cost;
}

// ---------------------------------------------------------------------------
// Reshape

Result<TypeList> infer_reshape(const Node &node, const OpDef &def,
                               llvm::ArrayRef<TensorType> inputs) {
  const TensorType &x = inputs[0];
  std::vector<int64_t> spec = AttrReader(node, def).get_ints("shape");
  Shape shape;
  int inferred = -1;
  for (size_t i = 0; i < spec.size(); ++i) {
    int64_t dim = spec[i];
    if (dim == -1) {
      if (inferred >= 0)
        return invalid_argument(def.name, ": attribute 'shape' = ", ints_to_string(spec),
                                " has more than one -1");
      inferred = static_cast<int>(i);
      shape.push_back(1);
    } else if (dim == 0) {
      if (i >= x.shape.size())
        return invalid_argument(def.name, ": attribute 'shape' = ", ints_to_string(spec),
                                " copies dimension ", i, " (0) but input 0 ", x.to_string(),
                                " has rank ", x.rank());
      shape.push_back(x.shape[i]);
    } else if (dim < 0) {
      return invalid_argument(def.name, ": attribute 'shape' = ", ints_to_string(spec),
                              " has negative dimension ", dim);
    } else {
      shape.push_back(dim);
    }
  }
  const int64_t total = x.num_elements();
  ASSIGN_OR_RETURN(int64_t known, checked_num_elements(shape));
  if (inferred >= 0) {
    if (known == 0 || total % known != 0)
      return invalid_argument(def.name, ": cannot reshape input 0 ", x.to_string(), " to shape ",
                              ints_to_string(spec), ": no size for the -1 gives ", total,
                              " elements");
    shape[inferred] = total / known;
  } else if (known != total) {
    return invalid_argument(def.name, ": cannot reshape input 0 ", x.to_string(), " (", total,
                            " elements) to ", shape_to_string(shape), " (", known, " elements)");
  }
  return one(x.dtype, std::move(shape));
}

// ---------------------------------------------------------------------------
// Flatten

Result<TypeList> infer_flatten(const Node &node, const OpDef &def,
                               llvm::ArrayRef<TensorType> inputs) {
  const TensorType &x = inputs[0];
  int64_t axis = AttrReader(node, def).get_int("axis");
  int64_t rank = x.rank();
  // Unlike other axes, axis == rank is allowed (everything goes to the first dim).
  if (axis < -rank || axis > rank)
    return out_of_range(def.name, ": attribute 'axis' = ", axis, " is out of range for input 0 ",
                        x.to_string(), " (rank ", rank, ")");
  if (axis < 0) axis += rank;
  llvm::ArrayRef<int64_t> dims = x.shape;
  return one(x.dtype, Shape{product(dims.take_front(axis)), product(dims.drop_front(axis))});
}

// ---------------------------------------------------------------------------
// Transpose

Result<Shape> transpose_perm(const Node &node, const OpDef &def, const TensorType &x) {
  std::vector<int64_t> perm = AttrReader(node, def).get_ints("perm");
  const int64_t rank = x.rank();
  if (perm.empty()) { // the default: reverse the dimensions
    Shape reversed;
    for (int64_t d = rank - 1; d >= 0; --d)
      reversed.push_back(d);
    return reversed;
  }
  bool valid = static_cast<int64_t>(perm.size()) == rank;
  std::vector<bool> seen(perm.size(), false);
  for (int64_t p : perm) {
    if (!valid) break;
    if (p < 0 || p >= rank || seen[p])
      valid = false;
    else
      seen[p] = true;
  }
  if (!valid)
    return invalid_argument(def.name, ": attribute 'perm' = ", ints_to_string(perm),
                            " is not a permutation of the ", rank, " dimensions of input 0 ",
                            x.to_string());
  return Shape(perm.begin(), perm.end());
}

Result<TypeList> infer_transpose(const Node &node, const OpDef &def,
                                 llvm::ArrayRef<TensorType> inputs) {
  ASSIGN_OR_RETURN(Shape perm, transpose_perm(node, def, inputs[0]));
  Shape shape;
  for (int64_t p : perm)
    shape.push_back(inputs[0].shape[p]);
  return one(inputs[0].dtype, std::move(shape));
}

Status transpose_kernel(const KernelContext &context) {
  const ConstTensorView &x = context.inputs[0];
  ASSIGN_OR_RETURN(Shape perm, transpose_perm(context.node, context.def, *x.type));
  Shape in_strides = contiguous_strides(x.shape());
  Shape out_strides; // input stride of each output dimension
  for (int64_t p : perm)
    out_strides.push_back(in_strides[p]);
  strided_copy(x.data, 0, context.outputs[0].shape(), out_strides, context.outputs[0].data,
               element_size(x));
  return Status::ok();
}

// ---------------------------------------------------------------------------
// Concat and Split

Result<TypeList> infer_concat(const Node &node, const OpDef &def,
                              llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_same_dtype(def, inputs));
  const TensorType &first = inputs[0];
  Result<int64_t> axis =
      normalize_axis(AttrReader(node, def).get_int("axis"), first.rank(), "axis");
  if (!axis.is_ok())
    return std::move(axis).take_status().with_context(
        str_cat(def.name, " (input 0 is ", first.to_string(), ")"));
  Shape shape = first.shape;
  for (size_t i = 1; i < inputs.size(); ++i) {
    const TensorType &t = inputs[i];
    bool match = t.rank() == first.rank();
    for (int64_t d = 0; match && d < first.rank(); ++d)
      if (d != *axis && t.shape[d] != first.shape[d]) match = false;
    if (!match)
      return invalid_argument(def.name, ": input ", i, " ", t.to_string(),
                              " does not match input 0 ", first.to_string(), " outside axis ",
                              *axis);
    shape[*axis] += t.shape[*axis];
  }
  RETURN_IF_ERROR(checked_num_elements(shape).status());
  return one(first.dtype, std::move(shape));
}

Status concat_kernel(const KernelContext &context) {
  const TensorView &y = context.outputs[0];
  ASSIGN_OR_RETURN(int64_t axis,
                   normalize_axis(context.attrs().get_int("axis"), y.type->rank(), "axis"));
  const int64_t esize = static_cast<int64_t>(dtype_size(y.dtype()));
  llvm::ArrayRef<int64_t> out_shape = y.shape();
  const int64_t outer = product(out_shape.take_front(axis));
  const int64_t inner = product(out_shape.drop_front(axis + 1)) * esize;
  const int64_t out_row = out_shape[axis] * inner;
  auto *out = static_cast<std::byte *>(y.data);
  int64_t column = 0;
  for (const ConstTensorView &x : context.inputs) {
    const int64_t row = x.shape()[axis] * inner;
    const auto *in = static_cast<const std::byte *>(x.data);
    if (row > 0)
      for (int64_t o = 0; o < outer; ++o)
        std::memcpy(out + o * out_row + column, in + o * row, static_cast<size_t>(row));
    column += row;
  }
  return Status::ok();
}

Result<TypeList> infer_split(const Node &node, const OpDef &def,
                             llvm::ArrayRef<TensorType> inputs) {
  const TensorType &x = inputs[0];
  AttrReader attrs(node, def);
  Result<int64_t> axis = normalize_axis(attrs.get_int("axis"), x.rank(), "axis");
  if (!axis.is_ok())
    return std::move(axis).take_status().with_context(
        str_cat(def.name, " (input 0 is ", x.to_string(), ")"));
  std::vector<int64_t> split = attrs.get_ints("split");
  if (split.empty())
    return invalid_argument(def.name, ": attribute 'split' must list at least one size");
  int64_t sum = 0;
  for (int64_t size : split) {
    if (size < 0)
      return invalid_argument(def.name, ": attribute 'split' = ", ints_to_string(split),
                              " has negative size ", size);
    if (size > x.shape[*axis] - sum) // would pass the dimension (and could overflow)
      return invalid_argument(def.name, ": attribute 'split' = ", ints_to_string(split),
                              " sums past dimension ", *axis, " of input 0 ", x.to_string(),
                              ", which is ", x.shape[*axis]);
    sum += size;
  }
  if (sum != x.shape[*axis])
    return invalid_argument(def.name, ": attribute 'split' = ", ints_to_string(split), " sums to ",
                            sum, " but dimension ", *axis, " of input 0 ", x.to_string(), " is ",
                            x.shape[*axis]);
  TypeList outputs;
  for (int64_t size : split) {
    Shape shape = x.shape;
    shape[*axis] = size;
    outputs.push_back(TensorType{x.dtype, std::move(shape)});
  }
  return outputs;
}

Status split_kernel(const KernelContext &context) {
  const ConstTensorView &x = context.inputs[0];
  ASSIGN_OR_RETURN(int64_t axis,
                   normalize_axis(context.attrs().get_int("axis"), x.type->rank(), "axis"));
  const int64_t esize = static_cast<int64_t>(element_size(x));
  llvm::ArrayRef<int64_t> in_shape = x.shape();
  const int64_t outer = product(in_shape.take_front(axis));
  const int64_t inner = product(in_shape.drop_front(axis + 1)) * esize;
  const int64_t in_row = in_shape[axis] * inner;
  const auto *in = static_cast<const std::byte *>(x.data);
  int64_t column = 0;
  for (const TensorView &y : context.outputs) {
    const int64_t row = y.shape()[axis] * inner;
    auto *out = static_cast<std::byte *>(y.data);
    if (row > 0)
      for (int64_t o = 0; o < outer; ++o)
        std::memcpy(out + o * row, in + o * in_row + column, static_cast<size_t>(row));
    column += row;
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------
// Slice

} // namespace

Result<SlicePlan> plan_slice(const Node &node, const OpDef &def, const TensorType &x) {
  AttrReader attrs(node, def);
  std::vector<int64_t> starts = attrs.get_ints("starts");
  std::vector<int64_t> ends = attrs.get_ints("ends");
  std::vector<int64_t> axes = attrs.get_ints("axes");
  std::vector<int64_t> steps = attrs.get_ints("steps");
  const int64_t rank = x.rank();
  if (ends.size() != starts.size())
    return invalid_argument(def.name, ": attributes 'starts' ", ints_to_string(starts),
                            " and 'ends' ", ints_to_string(ends), " differ in length");
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i)
      axes.push_back(static_cast<int64_t>(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (axes.size() != starts.size())
    return invalid_argument(def.name, ": attribute 'axes' ", ints_to_string(axes), " has ",
                            axes.size(), " entries but 'starts' has ", starts.size());
  if (steps.size() != starts.size())
    return invalid_argument(def.name, ": attribute 'steps' ", ints_to_string(steps), " has ",
                            steps.size(), " entries but 'starts' has ", starts.size());
  ASSIGN_OR_RETURN(
      Shape normalized,
      normalize_axes(axes, rank, "axes", str_cat(def.name, " (input 0 is ", x.to_string(), ")")));
  SlicePlan plan;
  plan.start.assign(rank, 0);
  plan.step.assign(rank, 1);
  plan.length = x.shape;
  for (size_t i = 0; i < axes.size(); ++i) {
    const int64_t axis = normalized[i];
    const int64_t dim = x.shape[axis];
    const int64_t step = steps[i];
    if (step == 0) return invalid_argument(def.name, ": attribute 'steps' has a 0 for axis ", axis);
    plan.step[axis] = step;
    if (dim == 0) {
      plan.length[axis] = 0;
      continue;
    }
    // ONNX clamping: negative positions count from the end, then clamp to
    // [0, dim] for positive steps and to [0, dim - 1] (start) and [-1, dim - 1]
    // (end) for negative ones.
    auto clamp_position = [&](int64_t position, bool is_start) {
      if (position < 0) position = position < -dim ? -1 : position + dim;
      if (step > 0) return std::clamp<int64_t>(position, 0, dim);
      return std::clamp<int64_t>(position, is_start ? 0 : -1, dim - 1);
    };
    const int64_t start = clamp_position(starts[i], true);
    const int64_t end = clamp_position(ends[i], false);
    int64_t length = 0;
    if (step > 0 && end > start) length = (end - start - 1) / step + 1;
    if (step < 0 && start > end) {
      const uint64_t magnitude = uint64_t{0} - static_cast<uint64_t>(step);
      length = static_cast<int64_t>(static_cast<uint64_t>(start - end - 1) / magnitude) + 1;
    }
    plan.start[axis] = start;
    plan.length[axis] = length;
  }
  return plan;
}

namespace {

Result<TypeList> infer_slice(const Node &node, const OpDef &def,
                             llvm::ArrayRef<TensorType> inputs) {
  ASSIGN_OR_RETURN(SlicePlan plan, plan_slice(node, def, inputs[0]));
  return one(inputs[0].dtype, std::move(plan.length));
}

Status slice_kernel(const KernelContext &context) {
  const ConstTensorView &x = context.inputs[0];
  ASSIGN_OR_RETURN(SlicePlan plan, plan_slice(context.node, context.def, *x.type));
  Shape in_strides = contiguous_strides(x.shape());
  int64_t base = 0;
  Shape strides;
  for (size_t d = 0; d < in_strides.size(); ++d) {
    base += plan.start[d] * in_strides[d];
    // A dimension of length <= 1 is never stepped (and its step may be huge).
    strides.push_back(plan.length[d] > 1 ? plan.step[d] * in_strides[d] : 0);
  }
  strided_copy(x.data, base, context.outputs[0].shape(), strides, context.outputs[0].data,
               element_size(x));
  return Status::ok();
}

// ---------------------------------------------------------------------------
// Unsqueeze and Squeeze

Result<TypeList> infer_unsqueeze(const Node &node, const OpDef &def,
                                 llvm::ArrayRef<TensorType> inputs) {
  const TensorType &x = inputs[0];
  std::vector<int64_t> axes = AttrReader(node, def).get_ints("axes");
  const int64_t out_rank = x.rank() + static_cast<int64_t>(axes.size());
  ASSIGN_OR_RETURN(Shape normalized,
                   normalize_axes(axes, out_rank, "axes",
                                  str_cat(def.name, " (input 0 is ", x.to_string(),
                                          ", output rank ", out_rank, ")")));
  Shape shape;
  size_t next = 0;
  for (int64_t d = 0; d < out_rank; ++d) {
    if (std::find(normalized.begin(), normalized.end(), d) != normalized.end())
      shape.push_back(1);
    else
      shape.push_back(x.shape[next++]);
  }
  return one(x.dtype, std::move(shape));
}

Result<TypeList> infer_squeeze(const Node &node, const OpDef &def,
                               llvm::ArrayRef<TensorType> inputs) {
  const TensorType &x = inputs[0];
  std::vector<int64_t> axes = AttrReader(node, def).get_ints("axes");
  Shape drop;
  if (axes.empty()) {
    for (int64_t d = 0; d < x.rank(); ++d)
      if (x.shape[d] == 1) drop.push_back(d);
  } else {
    ASSIGN_OR_RETURN(Shape normalized,
                     normalize_axes(axes, x.rank(), "axes",
                                    str_cat(def.name, " (input 0 is ", x.to_string(), ")")));
    for (int64_t d : normalized)
      if (x.shape[d] != 1)
        return invalid_argument(def.name, ": axis ", d, " of input 0 ", x.to_string(), " has size ",
                                x.shape[d], ", not 1");
    drop = std::move(normalized);
  }
  Shape shape;
  for (int64_t d = 0; d < x.rank(); ++d)
    if (std::find(drop.begin(), drop.end(), d) == drop.end()) shape.push_back(x.shape[d]);
  return one(x.dtype, std::move(shape));
}

// ---------------------------------------------------------------------------
// Gather

Result<TypeList> infer_gather(const Node &node, const OpDef &def,
                              llvm::ArrayRef<TensorType> inputs) {
  const TensorType &data = inputs[0];
  const TensorType &indices = inputs[1];
  if (!is_integer(indices.dtype))
    return invalid_argument(def.name, ": input 1 (indices) must be i32 or i64, got ",
                            indices.to_string());
  RETURN_IF_ERROR(read_parts(node, def).status());
  Result<int64_t> axis = normalize_axis(AttrReader(node, def).get_int("axis"), data.rank(), "axis");
  if (!axis.is_ok())
    return std::move(axis).take_status().with_context(
        str_cat(def.name, " (input 0 is ", data.to_string(), ")"));
  Shape shape(data.shape.begin(), data.shape.begin() + *axis);
  shape.append(indices.shape.begin(), indices.shape.end());
  shape.append(data.shape.begin() + *axis + 1, data.shape.end());
  RETURN_IF_ERROR(checked_num_elements(shape).status());
  return one(data.dtype, std::move(shape));
}

// Indices in [-bound, bound) are valid; negative ones count from the end. An
// error names the index, its position in input 1, and the dimension of `tensor`.
template <typename Index>
Status check_indices(const KernelContext &context, const Index *index, int64_t count, int64_t axis,
                     int64_t bound, std::string_view tensor, const TensorType &type) {
  for (int64_t i = 0; i < count; ++i) {
    const int64_t value = index[i];
    if (value < -bound || value >= bound)
      return out_of_range(context.def.name, ": index ", value, " (element ", i,
                          " of input 1) is out of range for dimension ", axis, " of size ", bound,
                          " of ", tensor, " ", type.to_string());
  }
  return Status::ok();
}

// A table split over `parts` members along the gathered axis: this member
// holds rows [first, first + rows) of `bound` (parts * rows). Indices are
// checked against the whole table; rows another member holds are zeros here
// (the members' outputs sum to the whole gather: Megatron-LM's vocabulary-
// parallel embedding).
struct TablePiece {
  int64_t bound = 0, first = 0, rows = 0;
  // The row of this piece that index `value` names, or -1.
  int64_t local(int64_t value) const {
    if (value < 0) value += bound;
    value -= first;
    return value >= 0 && value < rows ? value : -1;
  }
};

Result<TablePiece> table_piece(const KernelContext &context, int64_t rows) {
  const int64_t parts = context.attrs().get_int("parts");
  RETURN_IF_ERROR(expect_group(context, parts));
  // parts 1: the whole table, whichever member reads it.
  return TablePiece{rows * parts, parts == 1 ? 0 : rows * context.member, rows};
}

template <typename Index> Status gather_typed(const KernelContext &context, int64_t axis) {
  const ConstTensorView &data = context.inputs[0];
  const ConstTensorView &indices = context.inputs[1];
  const Index *index = indices.as<Index>();
  const int64_t count = indices.num_elements();
  llvm::ArrayRef<int64_t> shape = data.shape();
  ASSIGN_OR_RETURN(const TablePiece piece, table_piece(context, shape[axis]));
  RETURN_IF_ERROR(check_indices(context, index, count, axis, piece.bound, "input 0", *data.type));
  const int64_t esize = static_cast<int64_t>(element_size(data));
  const int64_t outer = product(shape.take_front(axis));
  const int64_t inner = product(shape.drop_front(axis + 1)) * esize;
  const auto *in = static_cast<const std::byte *>(data.data);
  auto *out = static_cast<std::byte *>(context.outputs[0].data);
  if (inner == 0) return Status::ok();
  for (int64_t o = 0; o < outer; ++o) {
    const std::byte *block = in + o * piece.rows * inner;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t row = piece.local(index[i]);
      if (row >= 0)
        std::memcpy(out, block + row * inner, static_cast<size_t>(inner));
      else
        std::memset(out, 0, static_cast<size_t>(inner));
      out += inner;
    }
  }
  return Status::ok();
}

Status gather_kernel(const KernelContext &context) {
  const ConstTensorView &data = context.inputs[0];
  ASSIGN_OR_RETURN(int64_t axis,
                   normalize_axis(context.attrs().get_int("axis"), data.type->rank(), "axis"));
  switch (context.inputs[1].dtype()) {
  case DType::kI32: return gather_typed<int32_t>(context, axis);
  case DType::kI64: return gather_typed<int64_t>(context, axis);
  default:
    return unimplemented(context.def.name, ": indices of dtype ",
                         dtype_name(context.inputs[1].dtype()));
  }
}

// ---------------------------------------------------------------------------
// Constant

Result<TypeList> infer_constant(const Node &node, const OpDef &def, llvm::ArrayRef<TensorType>) {
  AttrReader attrs(node, def);
  std::string dtype_text = attrs.get_string("dtype");
  std::optional<DType> dtype = parse_dtype(dtype_text);
  if (!dtype)
    return invalid_argument(def.name, ": attribute 'dtype' = \"", dtype_text,
                            "\" is not a dtype (expected f32, f16, bf16, i32, i64 or bool)");
  std::vector<int64_t> dims = attrs.get_ints("shape");
  Shape shape(dims.begin(), dims.end());
  Result<int64_t> count = checked_num_elements(shape);
  if (!count.is_ok())
    return std::move(count).take_status().with_context(str_cat(def.name, ": attribute 'shape'"));
  const std::vector<double> values = attrs.get_floats("value");
  if (values.size() != 1 && static_cast<int64_t>(values.size()) != *count)
    return invalid_argument(def.name, ": attribute 'value' has ", values.size(),
                            " elements; expected 1 (a fill) or ", *count, " for shape ",
                            shape_to_string(shape));
  // An integer is each value truncated toward zero: NaN, infinity and values
  // beyond the dtype have none (the kernel would write 0 or the dtype's limit).
  if (is_integer(*dtype))
    for (size_t i = 0; i < values.size(); ++i) {
      const double v = values[i];
      const bool fits = *dtype == DType::kI32
                            ? v > -2147483649.0 && v < 2147483648.0
                            : v >= -9223372036854775808.0 && v < 9223372036854775808.0;
      if (!fits) // NaN fails every comparison
        return invalid_argument(def.name, ": attribute 'value'[", i, "] = ", v, " has no ",
                                dtype_name(*dtype), " value (",
                                std::isfinite(v) ? "out of range" : "not finite", ")");
    }
  return one(*dtype, std::move(shape));
}

// Truncates toward zero, saturating at I's range; NaN gives 0 (shape
// inference refuses both in a Constant of integers).
template <typename I> I double_to_int(double v) {
  if (std::isnan(v)) return 0;
  constexpr double kLimit = static_cast<double>(uint64_t{1} << (sizeof(I) * 8 - 1));
  if (v >= kLimit) return std::numeric_limits<I>::max();
  if (v <= -kLimit) return std::numeric_limits<I>::min();
  return static_cast<I>(v);
}

template <typename T, typename F>
void fill_values(void *out, int64_t count, const std::vector<double> &values, F convert) {
  T *dst = static_cast<T *>(out);
  if (values.size() == 1) {
    const T value = convert(values[0]);
    std::fill(dst, dst + count, value);
    return;
  }
  for (int64_t i = 0; i < count; ++i)
    dst[i] = convert(values[i]);
}

Status constant_kernel(const KernelContext &context) {
  std::vector<double> values = context.attrs().get_floats("value");
  const TensorView &y = context.outputs[0];
  const int64_t count = y.num_elements();
  switch (y.dtype()) {
  case DType::kF32:
    fill_values<float>(y.data, count, values, [](double v) { return static_cast<float>(v); });
    break;
  case DType::kF16:
    fill_values<uint16_t>(y.data, count, values,
                          [](double v) { return float_to_f16(static_cast<float>(v)); });
    break;
  case DType::kBF16:
    fill_values<uint16_t>(y.data, count, values,
                          [](double v) { return float_to_bf16(static_cast<float>(v)); });
    break;
  case DType::kI32: fill_values<int32_t>(y.data, count, values, double_to_int<int32_t>); break;
  case DType::kI64: fill_values<int64_t>(y.data, count, values, double_to_int<int64_t>); break;
  case DType::kBool:
    fill_values<uint8_t>(y.data, count, values,
                         [](double v) { return static_cast<uint8_t>(v != 0.0); });
    break;
  }
  return Status::ok();
}

OpCost constant_cost(const Node &, const OpDef &, llvm::ArrayRef<TensorType>,
                     llvm::ArrayRef<TensorType> outputs) {
  OpCost cost;
  cost.bytes_written = static_cast<double>(outputs[0].size_bytes());
  return cost;
}

// ---------------------------------------------------------------------------
// Expand

Result<TypeList> infer_expand(const Node &node, const OpDef &def,
                              llvm::ArrayRef<TensorType> inputs) {
  std::vector<int64_t> target = AttrReader(node, def).get_ints("shape");
  for (int64_t d : target)
    if (d < 0)
      return invalid_argument(def.name, ": attribute 'shape' = ", ints_to_string(target),
                              " has negative dimension ", d);
  Result<Shape> shape = broadcast_shapes(inputs[0].shape, target);
  if (!shape.is_ok())
    return std::move(shape).take_status().with_context(
        str_cat(def.name, ": input 0 ", inputs[0].to_string(), " and attribute 'shape' ",
                ints_to_string(target)));
  RETURN_IF_ERROR(checked_num_elements(*shape).status());
  return one(inputs[0].dtype, std::move(*shape));
}

// A strided copy whose input stride is 0 along every broadcast dimension.
Status expand_kernel(const KernelContext &context) {
  const ConstTensorView &x = context.inputs[0];
  const TensorView &y = context.outputs[0];
  const size_t rank = y.shape().size();
  const size_t offset = rank - x.shape().size();
  Shape own = contiguous_strides(x.shape());
  Shape strides(rank, 0);
  for (size_t d = 0; d < x.shape().size(); ++d)
    strides[offset + d] = x.shape()[d] == 1 ? 0 : own[d];
  strided_copy(x.data, 0, y.shape(), strides, y.data, element_size(x));
  return Status::ok();
}

// ---------------------------------------------------------------------------
// SliceGrad: dX = zeros of X's shape with dY written where Slice read it.

Result<Shape> slice_grad_input_shape(const Node &node, const OpDef &def) {
  std::vector<int64_t> dims = AttrReader(node, def).get_ints("shape");
  Shape shape(dims.begin(), dims.end());
  for (int64_t d : shape)
    if (d < 0)
      return invalid_argument(def.name, ": attribute 'shape' = ", ints_to_string(dims),
                              " has negative dimension ", d);
  RETURN_IF_ERROR(checked_num_elements(shape).status());
  return shape;
}

Result<TypeList> infer_slice_grad(const Node &node, const OpDef &def,
                                  llvm::ArrayRef<TensorType> inputs) {
  ASSIGN_OR_RETURN(Shape shape, slice_grad_input_shape(node, def));
  TensorType x{inputs[0].dtype, shape};
  ASSIGN_OR_RETURN(SlicePlan plan, plan_slice(node, def, x));
  if (!(llvm::ArrayRef<int64_t>(plan.length) == llvm::ArrayRef<int64_t>(inputs[0].shape)))
    return invalid_argument(def.name, ": input 0 (dY) ", inputs[0].to_string(),
                            " is not the shape ", shape_to_string(plan.length),
                            " that the slice takes from ", x.to_string());
  return TypeList{std::move(x)};
}

Status slice_grad_kernel(const KernelContext &context) {
  const ConstTensorView &dy = context.inputs[0];
  const TensorView &dx = context.outputs[0];
  ASSIGN_OR_RETURN(SlicePlan plan, plan_slice(context.node, context.def, *dx.type));
  const size_t esize = dtype_size(dx.dtype());
  std::memset(dx.data, 0, static_cast<size_t>(dx.type->size_bytes()));
  const int64_t total = dy.num_elements();
  if (total == 0) return Status::ok();
  Shape out_strides = contiguous_strides(dx.shape());
  const size_t rank = out_strides.size();
  int64_t base = 0;
  Shape strides(rank, 0);
  for (size_t d = 0; d < rank; ++d) {
    base += plan.start[d] * out_strides[d];
    strides[d] = plan.step[d] * out_strides[d];
  }
  const auto *in = static_cast<const std::byte *>(dy.data);
  auto *out = static_cast<std::byte *>(dx.data);
  Shape index(rank, 0);
  int64_t offset = base;
  for (int64_t i = 0; i < total; ++i) {
    std::memcpy(out + offset * static_cast<int64_t>(esize), in + i * static_cast<int64_t>(esize),
                esize);
    for (size_t d = rank; d-- > 0;) {
      offset += strides[d];
      if (++index[d] < plan.length[d]) break;
      offset -= strides[d] * plan.length[d];
      index[d] = 0;
    }
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------
// GatherGrad: dData = zeros of data's shape, then dY's rows added at the indices.

Result<TypeList> infer_gather_grad(const Node &node, const OpDef &def,
                                   llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  AttrReader attrs(node, def);
  std::vector<int64_t> dims = attrs.get_ints("shape");
  TensorType data{inputs[0].dtype, Shape(dims.begin(), dims.end())};
  for (int64_t d : dims)
    if (d < 0)
      return invalid_argument(def.name, ": attribute 'shape' = ", ints_to_string(dims),
                              " has negative dimension ", d);
  // The forward Gather's output type must be dY's.
  std::vector<TensorType> forward{data, inputs[1]};
  ASSIGN_OR_RETURN(TypeList gathered, infer_gather(node, def, forward));
  if (!(gathered[0] == inputs[0]))
    return invalid_argument(def.name, ": input 0 (dY) ", inputs[0].to_string(), " is not ",
                            gathered[0].to_string(), ", what Gather of ", data.to_string(),
                            " by indices ", inputs[1].to_string(), " gives");
  return TypeList{std::move(data)};
}

// Accumulates sequentially in index order (then row order), so the result does
// not depend on anything but the inputs; a repeated index sums its rows.
template <typename Index> Status gather_grad_typed(const KernelContext &context, int64_t axis) {
  const ConstTensorView &dy = context.inputs[0];
  const ConstTensorView &indices = context.inputs[1];
  const TensorView &dx = context.outputs[0];
  const Index *index = indices.as<Index>();
  const int64_t count = indices.num_elements();
  llvm::ArrayRef<int64_t> shape = dx.shape();
  ASSIGN_OR_RETURN(const TablePiece piece, table_piece(context, shape[axis]));
  RETURN_IF_ERROR(
      check_indices(context, index, count, axis, piece.bound, "the gradient", *dx.type));
  const int64_t outer = product(shape.take_front(axis));
  const int64_t inner = product(shape.drop_front(axis + 1));
  float *out = dx.as<float>();
  const float *in = dy.as<float>();
  std::fill(out, out + dx.num_elements(), 0.0f);
  for (int64_t o = 0; o < outer; ++o) {
    float *block = out + o * piece.rows * inner;
    for (int64_t i = 0; i < count; ++i, in += inner) {
      const int64_t local = piece.local(index[i]);
      if (local < 0) continue; // another member's row
      float *row = block + local * inner;
      for (int64_t k = 0; k < inner; ++k)
        row[k] += in[k];
    }
  }
  return Status::ok();
}

Status gather_grad_kernel(const KernelContext &context) {
  const TensorView &dx = context.outputs[0];
  if (dx.dtype() != DType::kF32)
    return unimplemented(context.def.name, ": no CPU kernel for dtype ", dtype_name(dx.dtype()));
  ASSIGN_OR_RETURN(int64_t axis,
                   normalize_axis(context.attrs().get_int("axis"), dx.type->rank(), "axis"));
  switch (context.inputs[1].dtype()) {
  case DType::kI32: return gather_grad_typed<int32_t>(context, axis);
  case DType::kI64: return gather_grad_typed<int64_t>(context, axis);
  default:
    return unimplemented(context.def.name, ": indices of dtype ",
                         dtype_name(context.inputs[1].dtype()));
  }
}

// One FLOP per dY element; dY and the indices are read, dX written once.
OpCost gather_grad_cost(const Node &, const OpDef &, llvm::ArrayRef<TensorType> inputs,
                        llvm::ArrayRef<TensorType> outputs) {
  OpCost cost;
  cost.flops = static_cast<double>(inputs[0].num_elements());
  cost.bytes_read = static_cast<double>(inputs[0].size_bytes() + inputs[1].size_bytes());
  cost.bytes_written = static_cast<double>(outputs[0].size_bytes());
  return cost;
}

// ---------------------------------------------------------------------------
// Gradient rules

std::vector<int64_t> dims_of(GradContext &c, TensorId id) {
  const Shape &shape = c.type(id).shape;
  return std::vector<int64_t>(shape.begin(), shape.end());
}

Status pass_through(GradContext &c) {
  if (c.needs_input_grad[0]) c.input_grads[0] = c.output_grads[0];
  return Status::ok();
}

// Reshape, Flatten, Squeeze, Unsqueeze: dX = dY reshaped back to X's shape.
Status reshape_grad(GradContext &c) {
  if (!c.needs_input_grad[0]) return Status::ok();
  c.input_grads[0] = c.builder.op1("Reshape", {c.output_grads[0]},
                                   {{"shape", dims_of(c, c.input(0))}}, c.grad_name("reshape"));
  return Status::ok();
}

// dX = dY transposed by the inverse permutation.
Status transpose_grad(GradContext &c) {
  if (!c.needs_input_grad[0]) return Status::ok();
  ASSIGN_OR_RETURN(Shape perm, transpose_perm(c.node, c.def, c.type(c.input(0))));
  std::vector<int64_t> inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i)
    inverse[perm[i]] = static_cast<int64_t>(i);
  c.input_grads[0] = c.builder.op1("Transpose", {c.output_grads[0]}, {{"perm", inverse}},
                                   c.grad_name("transpose"));
  return Status::ok();
}

// dY split back into the inputs' extents along the axis.
Status concat_grad(GradContext &c) {
  const int64_t rank = c.type(c.input(0)).rank();
  ASSIGN_OR_RETURN(int64_t axis, normalize_axis(c.attrs().get_int("axis"), rank, "axis"));
  std::vector<int64_t> sizes;
  for (TensorId input : c.node.inputs)
    sizes.push_back(c.type(input).shape[axis]);
  if (sizes.size() == 1) return pass_through(c);
  auto pieces = c.builder.op("Split", {c.output_grads[0]}, {{"axis", axis}, {"split", sizes}},
                             c.grad_name("split"));
  if (pieces.size() != sizes.size()) return c.builder.status();
  for (size_t i = 0; i < sizes.size(); ++i)
    if (c.needs_input_grad[i]) c.input_grads[i] = pieces[i];
  return Status::ok();
}

// The output gradients joined along the axis; an output no gradient reached
// contributes zeros.
Status split_grad(GradContext &c) {
  if (!c.needs_input_grad[0]) return Status::ok();
  const int64_t axis = c.attrs().get_int("axis");
  std::vector<TensorId> pieces;
  for (size_t i = 0; i < c.output_grads.size(); ++i) {
    TensorId grad = c.output_grads[i];
    if (grad == kInvalidTensor) {
      const TensorType type = c.type(c.output(i));
      grad = c.builder.op1("Constant", {},
                           {{"dtype", std::string(dtype_name(type.dtype))},
                            {"shape", std::vector<int64_t>(type.shape.begin(), type.shape.end())},
                            {"value", std::vector<double>{0.0}}},
                           c.grad_name(str_cat("zero", i)));
    }
    pieces.push_back(grad);
  }
  c.input_grads[0] = c.builder.op1("Concat", pieces, {{"axis", axis}}, c.grad_name("concat"));
  return Status::ok();
}

// SliceGrad with the forward slice's attributes and X's shape.
Status slice_grad(GradContext &c) {
  if (!c.needs_input_grad[0]) return Status::ok();
  std::vector<Attribute> attrs = c.node.attrs;
  attrs.push_back({"shape", dims_of(c, c.input(0))});
  c.input_grads[0] =
      c.builder.op1("SliceGrad", {c.output_grads[0]}, std::move(attrs), c.grad_name("slice"));
  return Status::ok();
}

// The data gets a scatter-add; the indices get nothing.
Status gather_grad(GradContext &c) {
  if (!c.needs_input_grad[0]) return Status::ok();
  c.input_grads[0] = c.builder.op1("GatherGrad", {c.output_grads[0], c.input(1)},
                                   {{"axis", c.attrs().get_int("axis")},
                                    {"shape", dims_of(c, c.input(0))},
                                    {"parts", c.attrs().get_int("parts")}},
                                   c.grad_name("gather"));
  return Status::ok();
}

// Expand: the broadcast gradient summed back to X's shape.
Status expand_grad(GradContext &c) {
  if (!c.needs_input_grad[0]) return Status::ok();
  const Shape shape = c.type(c.input(0)).shape;
  c.input_grads[0] = reduce_to_shape(c, c.output_grads[0], shape, "expand");
  return Status::ok();
}

// Constant has no inputs: nothing to do.
Status no_inputs_grad(GradContext &) { return Status::ok(); }

// ---------------------------------------------------------------------------
// The table

AttrValue ints(std::vector<int64_t> values) { return AttrValue{std::move(values)}; }
AttrValue int_value(int64_t value) { return AttrValue{value}; }
AttrSpec parts_attr(std::string_view doc) { return {"parts", AttrType::kInt, int_value(1), doc}; }

// The values Gather's and GatherGrad's indices may take: the size of the
// table's gathered dim, whole (a member's piece of a table split over `parts`
// members is one part of it).
std::optional<int64_t> indexed_dim(llvm::ArrayRef<int64_t> table, const Node &node) {
  const auto rank = static_cast<int64_t>(table.size());
  int64_t axis = node.int_attr("axis").value_or(0);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return std::nullopt;
  return capped_product(table[static_cast<size_t>(axis)],
                        std::max<int64_t>(1, node.int_attr("parts").value_or(1)));
}

std::optional<int64_t> gather_index_range(const Node &node, const OpDef &,
                                          llvm::ArrayRef<TensorType> inputs, size_t) {
  return indexed_dim(inputs[0].shape, node);
}

// GatherGrad's table is its attribute "shape" (its output's).
std::optional<int64_t> gather_grad_index_range(const Node &node, const OpDef &,
                                               llvm::ArrayRef<TensorType>, size_t) {
  const std::optional<std::vector<int64_t>> table = node.ints_attr("shape");
  if (!table) return std::nullopt;
  return indexed_dim(*table, node);
}

std::vector<OpDef> make_table() {
  std::vector<OpDef> table;
  table.push_back(OpDef{"Reshape",
                        "Y = X with a new shape of the same element count",
                        1,
                        1,
                        {{"shape", AttrType::kInts, std::nullopt,
                          "new dims; at most one -1 (inferred), 0 copies the input dim"}},
                        infer_reshape,
                        move_cost,
                        copy_kernel,
                        reshape_grad});
  table.back().traits = {.batch = BatchRule::kReshapeAttr, .shard = ShardRule::kReshape};
  table.push_back(OpDef{"Flatten",
                        "Y = X as 2-D [prod(dims[:axis]), prod(dims[axis:])]",
                        1,
                        1,
                        {{"axis", AttrType::kInt, int_value(1), "first dim of the second group"}},
                        infer_flatten,
                        move_cost,
                        copy_kernel,
                        reshape_grad});
  table.back().traits = {.batch = BatchRule::kReshape, .shard = ShardRule::kReshape};
  table.push_back(OpDef{"Transpose",
                        "Y = X with dims permuted: Y.shape[i] = X.shape[perm[i]]",
                        1,
                        1,
                        {{"perm", AttrType::kInts, ints({}), "permutation; [] reverses the dims"}},
                        infer_transpose,
                        move_cost,
                        transpose_kernel,
                        transpose_grad});
  table.back().traits = {.batch = BatchRule::kFollows, .shard = ShardRule::kTranspose};
  table.push_back(OpDef{"Concat",
                        "Y = inputs joined along axis",
                        1,
                        64,
                        {{"axis", AttrType::kInt, std::nullopt, "axis to join along"}},
                        infer_concat,
                        move_cost,
                        concat_kernel,
                        concat_grad});
  table.back().traits = {.batch = BatchRule::kConcatAxis, .shard = ShardRule::kOtherAxis};
  table.push_back(OpDef{"Split",
                        "Y0..Yn-1 = X cut along axis into pieces of the given sizes",
                        1,
                        1,
                        {{"axis", AttrType::kInt, int_value(0), "axis to cut"},
                         {"split", AttrType::kInts, std::nullopt, "sizes, summing to the dim"}},
                        infer_split,
                        move_cost,
                        split_kernel,
                        split_grad});
  table.back().traits = {.batch = BatchRule::kSplitAxis, .shard = ShardRule::kOtherAxis};
  table.push_back(OpDef{"Slice",
                        "Y = X[starts:ends:steps] along axes, with ONNX clamping",
                        1,
                        1,
                        {{"axes", AttrType::kInts, ints({}), "axes sliced; [] means 0..n-1"},
                         {"ends", AttrType::kInts, std::nullopt, "end positions (exclusive)"},
                         {"starts", AttrType::kInts, std::nullopt, "start positions"},
                         {"steps", AttrType::kInts, ints({}), "steps, nonzero; [] means all 1"}},
                        infer_slice,
                        select_cost,
                        slice_kernel,
                        slice_grad});
  table.back().traits = {.batch = BatchRule::kSlice, .shard = ShardRule::kReplicated};
  table.push_back(OpDef{"Unsqueeze",
                        "Y = X with size-1 dims inserted at axes (positions in Y)",
                        1,
                        1,
                        {{"axes", AttrType::kInts, std::nullopt, "positions of new dims in Y"}},
                        infer_unsqueeze,
                        move_cost,
                        copy_kernel,
                        reshape_grad});
  table.back().traits = {.batch = BatchRule::kReshape, .shard = ShardRule::kReshape};
  table.push_back(OpDef{"Squeeze",
                        "Y = X with size-1 dims removed",
                        1,
                        1,
                        {{"axes", AttrType::kInts, ints({}), "dims to remove; [] = every size-1"}},
                        infer_squeeze,
                        move_cost,
                        copy_kernel,
                        reshape_grad});
  table.back().traits = {.batch = BatchRule::kReshape, .shard = ShardRule::kReshape};
  table.push_back(
      OpDef{"Gather",
            "Y = data indexed by indices along axis",
            2,
            2,
            {{"axis", AttrType::kInt, int_value(0), "axis of data to index"},
             parts_attr("data is this member's piece of a table split along axis over parts "
                        "tensor-parallel members; rows others hold give zeros")},
            infer_gather,
            select_cost,
            gather_kernel,
            gather_grad});
  table.back().traits = {.batch = BatchRule::kGatherAxis,
                         .shard = ShardRule::kGather,
                         .integer_inputs = 1u << 1,
                         .index_range = gather_index_range};
  table.push_back(
      OpDef{"Constant",
            "Y = a tensor given by attributes",
            0,
            0,
            {{"dtype", AttrType::kString, AttrValue{std::string("f32")}, "element type"},
             {"shape", AttrType::kInts, ints({}), "dims; [] is a scalar"},
             {"value", AttrType::kFloats, std::nullopt, "1 element (fill) or exactly prod(shape)"}},
            infer_constant,
            constant_cost,
            constant_kernel,
            no_inputs_grad});
  table.back().traits = {.batch = BatchRule::kFollows, .shard = ShardRule::kReplicated};
  table.push_back(OpDef{"Expand",
                        "Y = X broadcast (NumPy rules) against attribute shape",
                        1,
                        1,
                        {{"shape", AttrType::kInts, std::nullopt, "shape X is broadcast against"}},
                        infer_expand,
                        move_cost,
                        expand_kernel,
                        expand_grad});
  table.back().traits = {.batch = BatchRule::kExpand, .shard = ShardRule::kReplicated};
  table.push_back(OpDef{"SliceGrad",
                        "dX = zeros of attribute shape with dY written where Slice read",
                        1,
                        1,
                        {{"axes", AttrType::kInts, ints({}), "as Slice"},
                         {"ends", AttrType::kInts, std::nullopt, "as Slice"},
                         {"shape", AttrType::kInts, std::nullopt, "shape of the sliced input X"},
                         {"starts", AttrType::kInts, std::nullopt, "as Slice"},
                         {"steps", AttrType::kInts, ints({}), "as Slice"}},
                        infer_slice_grad,
                        move_cost,
                        slice_grad_kernel});
  table.back().traits = {.batch = BatchRule::kNotForward, .shard = ShardRule::kReplicated};
  table.push_back(OpDef{"GatherGrad",
                        "dData = zeros of attribute shape plus dY rows added at indices along axis",
                        2,
                        2,
                        {{"axis", AttrType::kInt, int_value(0), "as Gather"},
                         {"shape", AttrType::kInts, std::nullopt, "shape of Gather's data"},
                         parts_attr("as Gather: dData is this member's piece")},
                        infer_gather_grad,
                        gather_grad_cost,
                        gather_grad_kernel});
  table.back().traits = {.batch = BatchRule::kNotForward,
                         .shard = ShardRule::kReplicated,
                         .integer_inputs = 1u << 1,
                         .index_range = gather_grad_index_range};
  return table;
}

} // namespace

std::span<const OpDef> shape_ops() {
  static const std::vector<OpDef> table = make_table();
  return table;
}

} // namespace strata::ops
