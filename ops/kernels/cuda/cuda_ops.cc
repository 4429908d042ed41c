#include "ops/kernels/cuda/cuda_ops.h"

#include <algorithm>
#include <map>
#include <memory>
#include <tuple>

#include "ops/kernels/cuda/cuda_status.h"
#include "ops/kernels/cuda/launch.h"
#include "ops/matmul_shape.h"
#include "ops/slice_plan.h"

#include "ops/window.h"
#include "strata_config.h"

namespace strata::cuda {
namespace {

using ops::ConstTensorView;
using ops::TensorView;

Result<Dims> dims_of(llvm::ArrayRef<int64_t> shape) {
  if (shape.size() > static_cast<size_t>(kMaxDims))
    return unimplemented("the CUDA kernels take at most ", kMaxDims, " dims, got ",
                         shape_to_string(shape));
  Dims dims;
  dims.rank = static_cast<int>(shape.size());
  for (size_t d = 0; d < shape.size(); ++d)
    dims.d[d] = shape[d];
  return dims;
}

// Strides to read `operand` as if broadcast to `shape` (NumPy rules, aligned
// right; 0 along dims the operand lacks or has as 1).
Dims broadcast_strides(llvm::ArrayRef<int64_t> operand, const Dims &shape) {
  Dims strides;
  strides.rank = shape.rank;
  int64_t stride = 1;
  for (int i = 0; i < static_cast<int>(operand.size()); ++i) {
    const int od = static_cast<int>(operand.size()) - 1 - i;
    const int sd = shape.rank - 1 - i;
    strides.d[sd] = operand[static_cast<size_t>(od)] == 1 ? 0 : stride;
    stride *= operand[static_cast<size_t>(od)];
  }
  return strides;
}

const float *in_f32(const CudaKernelContext &c, size_t i) { return c.inputs[i].as<float>(); }
float *out_f32(const CudaKernelContext &c, size_t i) { return c.outputs[i].as<float>(); }

// ---- elementwise ------------------------------------------------------------

template <Unary kOp> Status unary_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0}));
  float a = 0, b = 0;
  Unary op = kOp;
  if constexpr (kOp == Unary::kClip) {
    a = static_cast<float>(c.attrs().get_float("min"));
    b = static_cast<float>(c.attrs().get_float("max"));
  }
  if constexpr (kOp == Unary::kGeluErf)
    if (c.attrs().get_string("approximate") == "tanh") op = Unary::kGeluTanh;
  return cuda_status(
      unary(op, in_f32(c, 0), out_f32(c, 0), c.inputs[0].num_elements(), a, b, c.stream), "launch");
}

template <Binary kOp> Status binary_op(const CudaKernelContext &c) {
  const DType dtype = c.inputs[0].dtype();
  if constexpr (kOp == Binary::kAdd || kOp == Binary::kSub || kOp == Binary::kMul) {
    // Integers too: the optimizer's step counter is an i64 Add.
    if ((dtype == DType::kI32 || dtype == DType::kI64) && c.inputs[1].dtype() == dtype) {
      ASSIGN_OR_RETURN(Dims shape, dims_of(c.outputs[0].shape()));
      return cuda_status(
          binary_int(kOp, c.inputs[0].data, broadcast_strides(c.inputs[0].shape(), shape),
                     c.inputs[1].data, broadcast_strides(c.inputs[1].shape(), shape),
                     c.outputs[0].data, shape, static_cast<int>(dtype_size(dtype)), c.stream),
          "launch");
    }
  }
  RETURN_IF_ERROR(expect_f32(c, {0, 1}));
  ASSIGN_OR_RETURN(Dims shape, dims_of(c.outputs[0].shape()));
  float a = 0, b = 0;
  Binary op = kOp;
  if constexpr (kOp == Binary::kClipGrad) {
    a = static_cast<float>(c.attrs().get_float("min"));
    b = static_cast<float>(c.attrs().get_float("max"));
  }
  if constexpr (kOp == Binary::kGeluErfGrad)
    if (c.attrs().get_string("approximate") == "tanh") op = Binary::kGeluTanhGrad;
  if constexpr (kOp == Binary::kPow)
    if (c.inputs[1].num_elements() == 1) op = Binary::kPowScalar;
  return cuda_status(binary(op, in_f32(c, 0), broadcast_strides(c.inputs[0].shape(), shape),
                            in_f32(c, 1), broadcast_strides(c.inputs[1].shape(), shape),
                            out_f32(c, 0), shape, a, b, c.stream),
                     "launch");
}

// Reshape, Squeeze, Unsqueeze, Flatten, Identity: the bytes as they are.
Status copy_op(const CudaKernelContext &c) {
  const size_t bytes = static_cast<size_t>(c.outputs[0].type->size_bytes());
  if (bytes == 0 || c.outputs[0].data == c.inputs[0].data) return Status::ok();
  return cuda_status(cudaMemcpyAsync(c.outputs[0].data, c.inputs[0].data, bytes,
                                     cudaMemcpyDeviceToDevice, c.stream),
                     "copy");
}

Status expand_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0}));
  ASSIGN_OR_RETURN(Dims shape, dims_of(c.outputs[0].shape()));
  return cuda_status(broadcast_copy(in_f32(c, 0), broadcast_strides(c.inputs[0].shape(), shape),
                                    out_f32(c, 0), shape, c.stream),
                     "launch");
}

Status transpose_op(const CudaKernelContext &c) {
  const int rank = static_cast<int>(c.inputs[0].type->rank());
  std::vector<int64_t> perm = c.attrs().get_ints("perm");
  if (perm.empty())
    for (int d = rank - 1; d >= 0; --d)
      perm.push_back(d);
  ASSIGN_OR_RETURN(Dims shape, dims_of(c.inputs[0].shape()));
  int p[kMaxDims] = {};
  for (int d = 0; d < rank; ++d)
    p[d] = static_cast<int>(perm[static_cast<size_t>(d)]);
  return cuda_status(transpose(c.inputs[0].data, shape, p, c.outputs[0].data,
                               static_cast<int>(dtype_size(c.inputs[0].dtype())), c.stream),
                     "launch");
}

// Slice(X) -> Y and SliceGrad(dY) -> dX (zeros with dY where Slice read).
Result<std::pair<int64_t, Dims>> slice_walk(const CudaKernelContext &c, const TensorType &x) {
  ASSIGN_OR_RETURN(ops::SlicePlan plan, ops::plan_slice(c.node, c.def, x));
  ASSIGN_OR_RETURN(Dims strides, dims_of(x.shape));
  int64_t stride = 1, base = 0;
  for (int d = strides.rank - 1; d >= 0; --d) {
    base += plan.start[static_cast<size_t>(d)] * stride;
    // A dimension of length <= 1 is never stepped (its step may be huge).
    strides.d[d] =
        plan.length[static_cast<size_t>(d)] > 1 ? plan.step[static_cast<size_t>(d)] * stride : 0;
    stride *= x.shape[static_cast<size_t>(d)];
  }
  return std::pair<int64_t, Dims>{base, strides};
}

Status slice_op(const CudaKernelContext &c) {
  ASSIGN_OR_RETURN(auto walk, slice_walk(c, *c.inputs[0].type));
  ASSIGN_OR_RETURN(Dims shape, dims_of(c.outputs[0].shape()));
  return cuda_status(strided_copy(c.inputs[0].data, walk.first, walk.second, c.outputs[0].data,
                                  shape, static_cast<int>(dtype_size(c.inputs[0].dtype())),
                                  c.stream),
                     "launch");
}

Status slice_grad_op(const CudaKernelContext &c) {
  ASSIGN_OR_RETURN(auto walk, slice_walk(c, *c.outputs[0].type));
  ASSIGN_OR_RETURN(Dims shape, dims_of(c.inputs[0].shape()));
  RETURN_IF_ERROR(
      cuda_status(cudaMemsetAsync(c.outputs[0].data, 0,
                                  static_cast<size_t>(c.outputs[0].type->size_bytes()), c.stream),
                  "memset"));
  return cuda_status(strided_scatter(c.inputs[0].data, shape, c.outputs[0].data, walk.first,
                                     walk.second, static_cast<int>(dtype_size(c.inputs[0].dtype())),
                                     c.stream),
                     "launch");
}

// Where(cond, X, Z): any element type for X and Z.
Status where_op(const CudaKernelContext &c) {
  ASSIGN_OR_RETURN(Dims shape, dims_of(c.outputs[0].shape()));
  return cuda_status(where(static_cast<const uint8_t *>(c.inputs[0].data),
                           broadcast_strides(c.inputs[0].shape(), shape), c.inputs[1].data,
                           broadcast_strides(c.inputs[1].shape(), shape), c.inputs[2].data,
                           broadcast_strides(c.inputs[2].shape(), shape), c.outputs[0].data, shape,
                           static_cast<int>(dtype_size(c.outputs[0].dtype())), c.stream),
                     "launch");
}

Result<Elem> elem_of(const CudaKernelContext &c, DType dtype) {
  switch (dtype) {
  case DType::kF32: return Elem::kF32;
  case DType::kI32: return Elem::kI32;
  case DType::kI64: return Elem::kI64;
  case DType::kBool: return Elem::kBool;
  default: break;
  }
  return unimplemented(c.def.name, ": the CUDA backend casts between f32, i32, i64 and bool, not ",
                       dtype_name(dtype));
}

Status cast_op(const CudaKernelContext &c) {
  ASSIGN_OR_RETURN(Elem from, elem_of(c, c.inputs[0].dtype()));
  ASSIGN_OR_RETURN(Elem to, elem_of(c, c.outputs[0].dtype()));
  return cuda_status(
      cast(c.inputs[0].data, from, c.outputs[0].data, to, c.inputs[0].num_elements(), c.stream),
      "launch");
}

// Concat and Split as 2-D copies: `outer` rows of `width` bytes each.
struct Along {
  int64_t outer = 1, inner_bytes = 0;
};
Result<Along> along_axis(const CudaKernelContext &c, const TensorType &type) {
  ASSIGN_OR_RETURN(int64_t axis,
                   ops::normalize_axis(c.attrs().get_int("axis"), type.rank(), "axis"));
  Along a;
  for (int64_t d = 0; d < axis; ++d)
    a.outer *= type.shape[static_cast<size_t>(d)];
  a.inner_bytes = static_cast<int64_t>(dtype_size(type.dtype));
  for (size_t d = static_cast<size_t>(axis) + 1; d < type.shape.size(); ++d)
    a.inner_bytes *= type.shape[d];
  return a;
}
Result<int64_t> axis_of(const CudaKernelContext &c, const TensorType &type) {
  return ops::normalize_axis(c.attrs().get_int("axis"), type.rank(), "axis");
}

// `rows` rows of `width` bytes from `src` (rows `spitch` apart) to `dst`
// (`dpitch` apart). cudaMemcpy2DAsync refuses pitches beyond the device's
// limit (about 2 GiB), as a concat along axis 0 of a large tensor has: copies
// with a pitch of 1 GiB or more, and single rows, go row by row.
Status copy_rows(void *dst, int64_t dpitch, const void *src, int64_t spitch, int64_t width,
                 int64_t rows, cudaStream_t stream) {
  constexpr int64_t kMaxPitch = int64_t{1} << 30;
  if (rows > 1 && dpitch < kMaxPitch && spitch < kMaxPitch)
    return cuda_status(cudaMemcpy2DAsync(dst, static_cast<size_t>(dpitch), src,
                                         static_cast<size_t>(spitch), static_cast<size_t>(width),
                                         static_cast<size_t>(rows), cudaMemcpyDeviceToDevice,
                                         stream),
                       "copy");
  for (int64_t r = 0; r < rows; ++r)
    RETURN_IF_ERROR(
        cuda_status(cudaMemcpyAsync(static_cast<std::byte *>(dst) + r * dpitch,
                                    static_cast<const std::byte *>(src) + r * spitch,
                                    static_cast<size_t>(width), cudaMemcpyDeviceToDevice, stream),
                    "copy"));
  return Status::ok();
}

Status concat_op(const CudaKernelContext &c) {
  const TensorType &out = *c.outputs[0].type;
  ASSIGN_OR_RETURN(Along a, along_axis(c, out));
  ASSIGN_OR_RETURN(int64_t axis, axis_of(c, out));
  const int64_t dpitch = out.shape[static_cast<size_t>(axis)] * a.inner_bytes;
  int64_t offset = 0;
  for (const ConstTensorView &in : c.inputs) {
    const int64_t width = in.shape()[static_cast<size_t>(axis)] * a.inner_bytes;
    if (width > 0 && a.outer > 0)
      RETURN_IF_ERROR(copy_rows(static_cast<std::byte *>(c.outputs[0].data) + offset, dpitch,
                                in.data, width, width, a.outer, c.stream));
    offset += width;
  }
  return Status::ok();
}

Status split_op(const CudaKernelContext &c) {
  const TensorType &in = *c.inputs[0].type;
  ASSIGN_OR_RETURN(Along a, along_axis(c, in));
  ASSIGN_OR_RETURN(int64_t axis, axis_of(c, in));
  const int64_t spitch = in.shape[static_cast<size_t>(axis)] * a.inner_bytes;
  int64_t offset = 0;
  for (const TensorView &out : c.outputs) {
    const int64_t width = out.shape()[static_cast<size_t>(axis)] * a.inner_bytes;
    if (width > 0 && a.outer > 0)
      RETURN_IF_ERROR(copy_rows(out.data, width,
                                static_cast<const std::byte *>(c.inputs[0].data) + offset, spitch,
                                width, a.outer, c.stream));
    offset += width;
  }
  return Status::ok();
}

// ---- reductions and rows --------------------------------------------------------

template <Reduce kOp, bool kMean> Status reduce_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0}));
  const TensorType &x = *c.inputs[0].type;
  const std::vector<int64_t> axes = c.attrs().get_ints("axes");
  bool reduced[kMaxDims] = {};
  ASSIGN_OR_RETURN(Dims shape, dims_of(x.shape));
  int64_t folded = 1;
  for (int d = 0; d < shape.rank; ++d)
    reduced[d] = axes.empty();
  for (int64_t axis : axes) {
    ASSIGN_OR_RETURN(int64_t d, ops::normalize_axis(axis, x.rank(), "axes"));
    reduced[d] = true;
  }
  for (int d = 0; d < shape.rank; ++d)
    if (reduced[d]) folded *= shape.d[d];
  const double divisor = kMean ? static_cast<double>(folded) : 1.0;
  return cuda_status(reduce(kOp, in_f32(c, 0), shape, reduced, divisor, out_f32(c, 0), c.stream),
                     "launch");
}

struct Rows {
  int64_t outer = 1, axis = 1, inner = 1;
};
Result<Rows> rows_at_axis(const CudaKernelContext &c, const TensorType &x) {
  ASSIGN_OR_RETURN(int64_t axis, ops::normalize_axis(c.attrs().get_int("axis"), x.rank(), "axis"));
  Rows r;
  for (int64_t d = 0; d < axis; ++d)
    r.outer *= x.shape[static_cast<size_t>(d)];
  r.axis = x.shape[static_cast<size_t>(axis)];
  for (size_t d = static_cast<size_t>(axis) + 1; d < x.shape.size(); ++d)
    r.inner *= x.shape[d];
  return r;
}

template <bool kLog> Status softmax_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0}));
  ASSIGN_OR_RETURN(Rows r, rows_at_axis(c, *c.inputs[0].type));
  return cuda_status(softmax(in_f32(c, 0), out_f32(c, 0), r.outer, r.axis, r.inner, kLog, c.stream),
                     "launch");
}

template <bool kLog> Status softmax_grad_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0, 1}));
  ASSIGN_OR_RETURN(Rows r, rows_at_axis(c, *c.inputs[0].type));
  return cuda_status(softmax_grad(in_f32(c, 0), in_f32(c, 1), out_f32(c, 0), r.outer, r.axis,
                                  r.inner, kLog, c.stream),
                     "launch");
}

// LayerNorm's rows and columns: dims [axis, rank) are one row.
Result<std::pair<int64_t, int64_t>> norm_rows(const Node &node, const ops::OpDef &def,
                                              const TensorType &x) {
  ASSIGN_OR_RETURN(int64_t axis, ops::normalize_axis(ops::AttrReader(node, def).get_int("axis"),
                                                     x.rank(), "axis"));
  const int64_t cols = num_elements(llvm::ArrayRef<int64_t>(x.shape).drop_front(axis));
  return std::pair<int64_t, int64_t>{cols == 0 ? 0 : x.num_elements() / cols, cols};
}

Status layer_norm_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0, 1, 2}));
  ASSIGN_OR_RETURN(auto rc, norm_rows(c.node, c.def, *c.inputs[0].type));
  return cuda_status(layer_norm(in_f32(c, 0), in_f32(c, 1), in_f32(c, 2), out_f32(c, 0), rc.first,
                                rc.second, c.attrs().get_float("epsilon"), c.stream),
                     "launch");
}

int64_t layer_norm_grad_scratch(const Node &node, const ops::OpDef &def,
                                llvm::ArrayRef<TensorType> inputs) {
  auto rc = norm_rows(node, def, inputs[1]);
  return rc.is_ok() ? 2 * rc->first * static_cast<int64_t>(sizeof(double)) : 0;
}

Status layer_norm_grad_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0, 1, 2}));
  ASSIGN_OR_RETURN(auto rc, norm_rows(c.node, c.def, *c.inputs[1].type));
  return cuda_status(layer_norm_grad(in_f32(c, 0), in_f32(c, 1), in_f32(c, 2), out_f32(c, 0),
                                     out_f32(c, 1), out_f32(c, 2), rc.first, rc.second,
                                     c.attrs().get_float("epsilon"),
                                     static_cast<double *>(c.scratch), c.stream),
                     "launch");
}

Result<int> reduction_code(const CudaKernelContext &c) {
  const std::string reduction = c.attrs().get_string("reduction");
  if (reduction == "mean") return 0;
  if (reduction == "sum") return 1;
  if (reduction == "none") return 2;
  return invalid_argument(c.def.name, ": attribute 'reduction' = \"", reduction,
                          "\" is not \"mean\", \"sum\" or \"none\"");
}

Result<int> index_bytes(const CudaKernelContext &c, size_t input) {
  const DType dtype = c.inputs[input].dtype();
  if (dtype == DType::kI32) return 4;
  if (dtype == DType::kI64) return 8;
  return invalid_argument(c.def.name, ": input ", input, " must be i32 or i64, got ",
                          dtype_name(dtype));
}

int64_t cross_entropy_scratch(const Node &, const ops::OpDef &, llvm::ArrayRef<TensorType> inputs) {
  return inputs[1].num_elements() * static_cast<int64_t>(sizeof(double));
}

Status cross_entropy_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0}));
  ASSIGN_OR_RETURN(int reduction, reduction_code(c));
  ASSIGN_OR_RETURN(int bytes, index_bytes(c, 1));
  const int64_t classes = c.inputs[0].shape().back();
  return cuda_status(
      cross_entropy(in_f32(c, 0), c.inputs[1].data, bytes, c.inputs[1].num_elements(), classes,
                    c.attrs().get_int("ignore_index"), reduction, static_cast<double *>(c.scratch),
                    out_f32(c, 0), c.flag, c.stream),
      "launch");
}

int64_t cross_entropy_grad_scratch(const Node &, const ops::OpDef &, llvm::ArrayRef<TensorType>) {
  return sizeof(double);
}

Status cross_entropy_grad_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0, 1}));
  ASSIGN_OR_RETURN(int reduction, reduction_code(c));
  ASSIGN_OR_RETURN(int bytes, index_bytes(c, 2));
  const int64_t classes = c.inputs[1].shape().back();
  return cuda_status(cross_entropy_grad(in_f32(c, 0), in_f32(c, 1), c.inputs[2].data, bytes,
                                        c.inputs[2].num_elements(), classes,
                                        c.attrs().get_int("ignore_index"), reduction, out_f32(c, 0),
                                        c.flag, static_cast<double *>(c.scratch), c.stream),
                     "launch");
}

// This device's piece of a table (or logits) split over `parts` members:
// the first of its `rows` rows (classes) among rows x parts. An error unless
// the device runs in a tensor-parallel group of `parts` (parts 1 runs
// anywhere, as member 0 of 1).
struct Piece {
  int64_t parts = 1, first = 0, bound = 0;
};
Result<Piece> split_piece(const CudaKernelContext &c, int64_t rows) {
  Piece piece;
  piece.parts = c.attrs().get_int("parts");
  if (piece.parts < 1) return invalid_argument(c.def.name, ": parts must be at least 1");
  if (piece.parts > 1 && piece.parts != c.group)
    return failed_precondition(c.def.name, " of a tensor split over ", piece.parts,
                               " members runs in a tensor-parallel group of ", piece.parts,
                               "; this device is in one of ", c.group);
  piece.first = piece.parts == 1 ? 0 : rows * c.member;
  piece.bound = rows * piece.parts;
  return piece;
}

Status gather_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0}));
  ASSIGN_OR_RETURN(int bytes, index_bytes(c, 1));
  ASSIGN_OR_RETURN(Rows r, rows_at_axis(c, *c.inputs[0].type));
  ASSIGN_OR_RETURN(Piece piece, split_piece(c, r.axis));
  return cuda_status(gather(in_f32(c, 0), r.outer, r.axis, r.inner, c.inputs[1].data, bytes,
                            c.inputs[1].num_elements(), out_f32(c, 0), c.flag, c.stream,
                            piece.first, piece.bound),
                     "launch");
}

Status gather_grad_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0}));
  ASSIGN_OR_RETURN(int bytes, index_bytes(c, 1));
  ASSIGN_OR_RETURN(Rows r, rows_at_axis(c, *c.outputs[0].type));
  ASSIGN_OR_RETURN(Piece piece, split_piece(c, r.axis));
  return cuda_status(gather_grad(in_f32(c, 0), r.outer, r.axis, r.inner, c.inputs[1].data, bytes,
                                 c.inputs[1].num_elements(), out_f32(c, 0), c.flag, c.scratch,
                                 static_cast<size_t>(c.scratch_bytes), c.stream, piece.first,
                                 piece.bound),
                     "launch");
}

// Megatron's vocabulary-parallel cross entropy (ops/ops_nn.cc): the statistics
// of this member's piece of the logits, the loss from every member's, and
// the gradient of the piece.
Status vocab_parallel_stats_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0}));
  ASSIGN_OR_RETURN(int bytes, index_bytes(c, 1));
  const int64_t classes = c.inputs[0].shape().back();
  ASSIGN_OR_RETURN(Piece piece, split_piece(c, classes));
  return cuda_status(vocab_parallel_stats(in_f32(c, 0), c.inputs[1].data, bytes,
                                          c.inputs[1].num_elements(), classes, piece.first,
                                          piece.bound, c.attrs().get_int("ignore_index"),
                                          out_f32(c, 0), c.flag, c.stream),
                     "launch");
}

Status vocab_parallel_cross_entropy_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0, 2}));
  ASSIGN_OR_RETURN(int reduction, reduction_code(c));
  ASSIGN_OR_RETURN(int bytes, index_bytes(c, 1));
  const int64_t classes = c.inputs[0].shape().back();
  ASSIGN_OR_RETURN(Piece piece, split_piece(c, classes));
  return cuda_status(vocab_parallel_cross_entropy(
                         c.inputs[1].data, bytes, in_f32(c, 2), c.inputs[1].num_elements(),
                         piece.parts, piece.bound, c.attrs().get_int("ignore_index"), reduction,
                         static_cast<double *>(c.scratch), out_f32(c, 0), c.flag, c.stream),
                     "launch");
}

Status vocab_parallel_cross_entropy_grad_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0, 1, 3}));
  ASSIGN_OR_RETURN(int reduction, reduction_code(c));
  ASSIGN_OR_RETURN(int bytes, index_bytes(c, 2));
  const int64_t classes = c.inputs[1].shape().back();
  ASSIGN_OR_RETURN(Piece piece, split_piece(c, classes));
  return cuda_status(vocab_parallel_cross_entropy_grad(
                         in_f32(c, 0), in_f32(c, 1), c.inputs[2].data, bytes, in_f32(c, 3),
                         c.inputs[2].num_elements(), classes, piece.parts, piece.first,
                         c.attrs().get_int("ignore_index"), reduction, out_f32(c, 0), c.flag,
                         static_cast<double *>(c.scratch), c.stream),
                     "launch");
}

// The radix sort's room when nothing precedes the indexed axis (an embedding
// table indexed along axis 0, or [1, T, H] along 1): gather_grad sorts then.
int64_t gather_grad_scratch_bytes(const Node &node, const ops::OpDef &def,
                                  llvm::ArrayRef<TensorType> inputs) {
  const ops::AttrReader attrs(node, def);
  const std::vector<int64_t> shape = attrs.get_ints("shape");
  auto axis =
      ops::normalize_axis(attrs.get_int("axis"), static_cast<int64_t>(shape.size()), "axis");
  if (!axis.is_ok()) return 0;
  for (int64_t d = 0; d < *axis; ++d)
    if (shape[static_cast<size_t>(d)] != 1) return 0;
  return static_cast<int64_t>(
      gather_grad_scratch(inputs[1].num_elements(), shape[static_cast<size_t>(*axis)]));
}

// ---- pooling -------------------------------------------------------------------------

// The window of a pooling node over X (`x`, [N, C, H, W]) giving Y (`y`),
// and in `cudnn_mismatch` why cuDNN would not pool it as strata does (empty:
// it would; ops::cudnn_pool_mismatch).
Result<Window> pool_window(const CudaKernelContext &c, llvm::ArrayRef<int64_t> x,
                           llvm::ArrayRef<int64_t> y, std::string *cudnn_mismatch) {
  ASSIGN_OR_RETURN(ops::Window attrs, ops::read_window(c.def, c.attrs()));
  *cudnn_mismatch = ops::cudnn_pool_mismatch(attrs, x, y);
  if (x.size() != 4 || y.size() != 4)
    return invalid_argument(c.def.name, ": a 2-D window runs over [N, C, H, W]");
  Window w;
  w.planes = x[0] * x[1];
  w.h = x[2];
  w.w = x[3];
  w.out_h = y[2];
  w.out_w = y[3];
  w.kernel_h = attrs.kernel_h;
  w.kernel_w = attrs.kernel_w;
  w.stride_h = attrs.stride_h;
  w.stride_w = attrs.stride_w;
  w.pad_top = attrs.pad_top;
  w.pad_left = attrs.pad_left;
  w.pad_bottom = attrs.pad_bottom;
  w.pad_right = attrs.pad_right;
  w.dilation_h = attrs.dilation_h;
  w.dilation_w = attrs.dilation_w;
  if (c.def.find_attr("count_include_pad") != nullptr)
    w.include_pad = c.attrs().get_int("count_include_pad") != 0;
  return w;
}

// Whether this node's pooling or batch norm goes through cuDNN.
bool through_cudnn(const CudaKernelContext &c, const std::string &mismatch) {
  return c.cudnn != nullptr && c.cudnn_pool_norm && mismatch.empty();
}

template <bool kMax> Status pool_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0}));
  std::string mismatch;
  ASSIGN_OR_RETURN(Window w, pool_window(c, c.inputs[0].shape(), c.outputs[0].shape(), &mismatch));
  if (through_cudnn(c, mismatch)) return cudnn_pool(c, kMax, w);
  return cuda_status(pool(kMax, w, in_f32(c, 0), out_f32(c, 0), c.stream), "launch");
}

// cuDNN's max-pooling gradient needs Y, which MaxPool2dGrad recomputes.
int64_t max_pool_grad_scratch(const Node &, const ops::OpDef &, llvm::ArrayRef<TensorType> inputs) {
  return STRATA_HAVE_CUDNN ? inputs[0].size_bytes() : 0;
}

// MaxPool2dGrad(dY, X), AveragePool2dGrad(dY): dX has X's shape.
template <bool kMax> Status pool_grad_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0}));
  std::string mismatch;
  ASSIGN_OR_RETURN(Window w, pool_window(c, c.outputs[0].shape(), c.inputs[0].shape(), &mismatch));
  if (through_cudnn(c, mismatch)) return cudnn_pool_grad(c, kMax, w);
  return cuda_status(
      pool_grad(kMax, w, in_f32(c, 0), kMax ? in_f32(c, 1) : nullptr, out_f32(c, 0), c.stream),
      "launch");
}

Status global_average_pool_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0}));
  ASSIGN_OR_RETURN(Dims shape, dims_of(c.inputs[0].shape()));
  if (shape.d[2] * shape.d[3] == 0) // empty planes average to 0, as on the CPU
    return cuda_status(cudaMemsetAsync(c.outputs[0].data, 0,
                                       static_cast<size_t>(c.outputs[0].type->size_bytes()),
                                       c.stream),
                       "memset");
  const bool reduced[kMaxDims] = {false, false, true, true};
  return cuda_status(reduce(Reduce::kSum, in_f32(c, 0), shape, reduced,
                            static_cast<double>(shape.d[2] * shape.d[3]), out_f32(c, 0), c.stream),
                     "launch");
}

Status global_average_pool_grad_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0}));
  const auto x = c.outputs[0].shape();
  return cuda_status(spread_mean(in_f32(c, 0), out_f32(c, 0), x[0] * x[1], x[2] * x[3], c.stream),
                     "launch");
}

// Dropout(X[, step]): the identity outside training.
Status dropout_op(const CudaKernelContext &c) {
  ops::AttrReader attrs = c.attrs();
  if (attrs.get_int("training") == 0) return copy_op(c);
  RETURN_IF_ERROR(expect_f32(c, {0}));
  const double ratio = attrs.get_float("ratio");
  const auto threshold = static_cast<uint64_t>(ratio * double(uint64_t{1} << 24));
  const auto scale = static_cast<float>(1.0 / (1.0 - ratio));
  const bool has_step = c.inputs.size() > 1;
  int step_bytes = 8;
  if (has_step) {
    ASSIGN_OR_RETURN(step_bytes, index_bytes(c, 1));
  }
  return cuda_status(dropout(in_f32(c, 0), out_f32(c, 0), c.inputs[0].num_elements(),
                             static_cast<uint64_t>(attrs.get_int("seed")),
                             has_step ? c.inputs[1].data : nullptr, step_bytes, threshold, scale,
                             c.stream),
                     "launch");
}

Status reduce_max_grad_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0, 1}));
  const TensorType &x = *c.inputs[1].type;
  const std::vector<int64_t> axes = c.attrs().get_ints("axes");
  bool reduced[kMaxDims] = {};
  ASSIGN_OR_RETURN(Dims shape, dims_of(x.shape));
  for (int d = 0; d < shape.rank; ++d)
    reduced[d] = axes.empty();
  for (int64_t axis : axes) {
    ASSIGN_OR_RETURN(int64_t d, ops::normalize_axis(axis, x.rank(), "axes"));
    reduced[d] = true;
  }
  return cuda_status(
      reduce_max_grad(in_f32(c, 0), in_f32(c, 1), shape, reduced, out_f32(c, 0), c.stream),
      "launch");
}

int64_t mse_scratch(const Node &, const ops::OpDef &, llvm::ArrayRef<TensorType>) {
  return kNormBlocks * static_cast<int64_t>(sizeof(double));
}

Status mse_loss_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0, 1}));
  ASSIGN_OR_RETURN(int reduction, reduction_code(c));
  return cuda_status(mse_loss(in_f32(c, 0), in_f32(c, 1), c.inputs[0].num_elements(), reduction,
                              static_cast<double *>(c.scratch), out_f32(c, 0), c.stream),
                     "launch");
}

// MseLossGrad(dLoss, P, T) -> dP, dT.
Status mse_loss_grad_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0, 1, 2}));
  ASSIGN_OR_RETURN(int reduction, reduction_code(c));
  return cuda_status(mse_loss_grad(in_f32(c, 0), in_f32(c, 1), in_f32(c, 2),
                                   c.inputs[1].num_elements(), reduction, out_f32(c, 0),
                                   out_f32(c, 1), c.stream),
                     "launch");
}

// ---- batch norm ------------------------------------------------------------------------

// X [batch, channels, ...] as [batch, channels, inner].
std::tuple<int64_t, int64_t, int64_t> channel_dims(llvm::ArrayRef<int64_t> x) {
  return {x[0], x[1], num_elements(x.drop_front(2))};
}

Status batch_norm_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0, 1, 2, 3, 4}));
  const auto [batch, channels, inner] = channel_dims(c.inputs[0].shape());
  const double epsilon = c.attrs().get_float("epsilon");
  const bool training = c.attrs().get_int("training") != 0;
  if (through_cudnn(c, ops::cudnn_batch_norm_mismatch(batch, channels, inner, epsilon, training)))
    return cudnn_batch_norm(c, batch, channels, inner, epsilon, training);
  return cuda_status(batch_norm(in_f32(c, 0), in_f32(c, 1), in_f32(c, 2), in_f32(c, 3),
                                in_f32(c, 4), out_f32(c, 0), batch, channels, inner, epsilon,
                                training, c.stream),
                     "launch");
}

Status batch_norm_stats_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0}));
  const auto [batch, channels, inner] = channel_dims(c.inputs[0].shape());
  return cuda_status(batch_norm_stats(in_f32(c, 0), out_f32(c, 0), out_f32(c, 1), batch, channels,
                                      inner, c.stream),
                     "launch");
}

// BatchNormalizationGrad(dY, X, scale) -> dX, dScale, dBias.
Status batch_norm_grad_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0, 1, 2}));
  const auto [batch, channels, inner] = channel_dims(c.inputs[1].shape());
  const double epsilon = c.attrs().get_float("epsilon");
  if (through_cudnn(c, ops::cudnn_batch_norm_mismatch(batch, channels, inner, epsilon, true)))
    return cudnn_batch_norm_grad(c, batch, channels, inner, epsilon);
  return cuda_status(batch_norm_grad(in_f32(c, 0), in_f32(c, 1), in_f32(c, 2), out_f32(c, 0),
                                     out_f32(c, 1), out_f32(c, 2), batch, channels, inner, epsilon,
                                     c.stream),
                     "launch");
}

// ---- gradient norms --------------------------------------------------------------------

int64_t norm_scratch(const Node &, const ops::OpDef &, llvm::ArrayRef<TensorType> inputs) {
  return static_cast<int64_t>(inputs.size()) * kNormBlocks * static_cast<int64_t>(sizeof(double));
}

// GlobalNormScale (pair = false) and SumOfSquares (pair = true) of every input.
template <bool kPair> Status norm_op(const CudaKernelContext &c) {
  for (size_t k = 0; k < c.inputs.size(); ++k)
    RETURN_IF_ERROR(expect_f32(c, {k}));
  auto *partials = static_cast<double *>(c.scratch);
  for (size_t k = 0; k < c.inputs.size(); ++k)
    RETURN_IF_ERROR(cuda_status(sum_squares_partials(in_f32(c, k), c.inputs[k].num_elements(),
                                                     partials + k * kNormBlocks, c.stream),
                                "launch"));
  const double max_norm = kPair ? 0.0 : c.attrs().get_float("max_norm");
  return cuda_status(finish_norm(partials, static_cast<int64_t>(c.inputs.size()), kPair, max_norm,
                                 out_f32(c, 0), c.stream),
                     "launch");
}

int64_t norm_scale_scratch(const Node &, const ops::OpDef &, llvm::ArrayRef<TensorType>) {
  return sizeof(double);
}

// NormScale(pairs...) -> scale.
Status norm_scale_op(const CudaKernelContext &c) {
  auto *acc = static_cast<double *>(c.scratch);
  for (size_t k = 0; k < c.inputs.size(); ++k)
    RETURN_IF_ERROR(cuda_status(add_pair(in_f32(c, k), k == 0, acc, c.stream), "launch"));
  if (c.inputs.empty())
    RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(acc, 0, sizeof(double), c.stream), "memset"));
  return cuda_status(finish_pairs(acc, c.attrs().get_float("max_norm"), out_f32(c, 0), c.stream),
                     "launch");
}

// ---- optimizer ---------------------------------------------------------------------

Status learning_rate_op(const CudaKernelContext &c) {
  ops::AttrReader attrs = c.attrs();
  Schedule s;
  s.base_lr = attrs.get_float("base_lr");
  s.min_lr = attrs.get_float("min_lr");
  s.cosine = attrs.get_string("schedule") == "cosine";
  s.warmup = attrs.get_int("warmup_steps");
  s.total = attrs.get_int("total_steps");
  return cuda_status(learning_rate(s, c.inputs[0].as<int64_t>(), out_f32(c, 0), c.stream),
                     "launch");
}

Status sgd_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0, 1}));
  ops::AttrReader attrs = c.attrs();
  SgdParams p;
  p.momentum = static_cast<float>(attrs.get_float("momentum"));
  p.weight_decay = static_cast<float>(attrs.get_float("weight_decay"));
  p.keep = static_cast<float>(1.0 - attrs.get_float("dampening"));
  p.nesterov = attrs.get_int("nesterov") != 0;
  const bool has_buffer = c.inputs.size() >= 4;
  return cuda_status(
      sgd(p, in_f32(c, 0), in_f32(c, 1), in_f32(c, 2), has_buffer ? in_f32(c, 3) : nullptr,
          c.inputs.size() >= 5 ? c.inputs[4].as<int64_t>() : nullptr, out_f32(c, 0),
          has_buffer ? out_f32(c, 1) : nullptr, c.inputs[0].num_elements(), c.stream),
      "launch");
}

Status adam_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0, 1, 2, 3}));
  ops::AttrReader attrs = c.attrs();
  AdamParams p;
  p.beta1 = attrs.get_float("beta1");
  p.beta2 = attrs.get_float("beta2");
  p.epsilon = attrs.get_float("epsilon");
  p.weight_decay = attrs.get_float("weight_decay");
  p.decoupled = attrs.get_int("decoupled") != 0;
  return cuda_status(adam(p, in_f32(c, 0), in_f32(c, 1), in_f32(c, 2), in_f32(c, 3), in_f32(c, 4),
                          c.inputs[5].as<int64_t>(), out_f32(c, 0), out_f32(c, 1), out_f32(c, 2),
                          c.inputs[0].num_elements(), c.flag, c.stream),
                     "launch");
}

// ---- GEMMs ---------------------------------------------------------------------------

// One row-major product D[M, N] = alpha op(A) op(B) + beta D, `batch` times
// with the given element strides between matrices (0: the same matrix).
// cuBLASLt is column-major, so it computes D^T = op(B)^T op(A)^T: B goes first.
struct Product {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_d = 0;
  float alpha = 1, beta = 0;
  // A and B in half precision (strides in their elements): bf16, or f16 with
  // alpha and beta read from `scalars` on the device (they undo the
  // operands' scales, which the device chose).
  bool bf16 = false, f16 = false;
  const float *scalars = nullptr;
};

// Owns cuBLASLt descriptors for one call.
struct LtObjects {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  ~LtObjects() {
    if (preference) cublasLtMatmulPreferenceDestroy(preference);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

Status layout(cublasLtMatrixLayout_t *layout, cudaDataType_t type, uint64_t rows, uint64_t cols,
              int64_t ld, int64_t batch, int64_t stride) {
  RETURN_IF_ERROR(
      cublas_status(cublasLtMatrixLayoutCreate(layout, type, rows, cols, ld), "layout"));
  if (batch > 1) {
    if (batch > INT32_MAX)
      return unimplemented("a batch of ", batch, " matrices is beyond cuBLASLt's 32-bit count");
    const int32_t count = static_cast<int32_t>(batch);
    RETURN_IF_ERROR(
        cublas_status(cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                       &count, sizeof count),
                      "batch count"));
    RETURN_IF_ERROR(cublas_status(
        cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                         &stride, sizeof stride),
        "batch stride"));
  }
  return Status::ok();
}

// The largest power of two up to 256 that divides the address and the batch
// stride (in elements of `element` bytes; 0: no stride) in bytes.
uint32_t alignment(const void *pointer, int64_t stride, size_t element = sizeof(float)) {
  uint64_t bits = reinterpret_cast<uintptr_t>(pointer) | 256u;
  if (stride != 0) bits |= static_cast<uint64_t>(stride) * element;
  return static_cast<uint32_t>(bits & (~bits + 1));
}

// The descriptors and the algorithm of one product, kept per node: a node's
// shapes and buffers never change, so its first step's choice serves every
// later one (and the captured step uses the algorithm the eager one ran). A
// MatMul issued as several blocks plans once for all of them, for the least
// aligned block's addresses.
struct LtPlan {
  LtObjects lt;
  cublasLtMatmulHeuristicResult_t heuristic = {};
};

Result<std::shared_ptr<LtPlan>> plan_product(const CudaKernelContext &c, const Product &p,
                                             const void *a, const void *b, const float *d) {
  auto plan = std::make_shared<LtPlan>();
  LtObjects &lt = plan->lt;
  // TF32 applies to f32 operands only (cuBLASLt refuses it with half ones).
  const bool half = p.bf16 || p.f16;
  const cublasComputeType_t compute =
      c.tf32 && !half ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  RETURN_IF_ERROR(
      cublas_status(cublasLtMatmulDescCreate(&lt.desc, compute, CUDA_R_32F), "descriptor"));
  if (p.scalars != nullptr) {
    const cublasLtPointerMode_t mode = CUBLASLT_POINTER_MODE_DEVICE;
    RETURN_IF_ERROR(
        cublas_status(cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_POINTER_MODE,
                                                     &mode, sizeof mode),
                      "pointer mode"));
  }
  // cuBLASLt's first operand is B, its second A.
  const cublasOperation_t op_first = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  RETURN_IF_ERROR(cublas_status(cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                               &op_first, sizeof op_first),
                                "transa"));
  RETURN_IF_ERROR(cublas_status(cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                               &op_second, sizeof op_second),
                                "transb"));
  // B row-major [K, N] is column-major [N, K] (ld N); transposed, [K, N] (ld K).
  const uint64_t m = static_cast<uint64_t>(p.m), n = static_cast<uint64_t>(p.n),
                 k = static_cast<uint64_t>(p.k);
  // Operands f32, or bf16 / f16 under --precision; D always f32.
  const cudaDataType_t in = p.bf16 ? CUDA_R_16BF : p.f16 ? CUDA_R_16F : CUDA_R_32F;
  const size_t in_bytes = half ? 2 : sizeof(float);
  RETURN_IF_ERROR(p.trans_b ? layout(&lt.a, in, k, n, p.k, p.batch, p.stride_b)
                            : layout(&lt.a, in, n, k, p.n, p.batch, p.stride_b));
  RETURN_IF_ERROR(p.trans_a ? layout(&lt.b, in, m, k, p.m, p.batch, p.stride_a)
                            : layout(&lt.b, in, k, m, p.k, p.batch, p.stride_a));
  RETURN_IF_ERROR(layout(&lt.d, CUDA_R_32F, n, m, p.n, p.batch, p.stride_d));
  RETURN_IF_ERROR(cublas_status(cublasLtMatmulPreferenceCreate(&lt.preference), "preference"));
  const uint64_t workspace = c.workspace_bytes;
  RETURN_IF_ERROR(cublas_status(
      cublasLtMatmulPreferenceSetAttribute(lt.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &workspace, sizeof workspace),
      "workspace"));
  // cuBLASLt assumes 256-byte aligned operands unless told otherwise; per-batch
  // pointers and strides may be aligned to as little as one float.
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
       alignment(b, p.batch > 1 ? p.stride_b : 0, in_bytes)},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
       alignment(a, p.batch > 1 ? p.stride_a : 0, in_bytes)},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment(d, p.batch > 1 ? p.stride_d : 0)},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment(d, p.batch > 1 ? p.stride_d : 0)}};
  for (const auto &[attribute, bytes] : alignments)
    RETURN_IF_ERROR(cublas_status(
        cublasLtMatmulPreferenceSetAttribute(lt.preference, attribute, &bytes, sizeof bytes),
        "alignment"));
  int found = 0;
  RETURN_IF_ERROR(
      cublas_status(cublasLtMatmulAlgoGetHeuristic(c.lt, lt.desc, lt.a, lt.b, lt.d, lt.d,
                                                   lt.preference, 1, &plan->heuristic, &found),
                    "heuristic"));
  if (found == 0)
    return unimplemented("cuBLASLt has no algorithm for this ", p.m, "x", p.n, "x", p.k,
                         " product (batch ", p.batch, ")");
  return plan;
}

// `cache`: the node's slot for its plan (null: plan this call alone).
Status run_product(const CudaKernelContext &c, const Product &p, const void *a, const void *b,
                   float *d, std::shared_ptr<void> *cache) {
  if (p.m == 0 || p.n == 0 || p.batch == 0) return Status::ok();
  if (p.k == 0) {
    // An empty sum: D = beta * D (zeros without C), which cuBLASLt will not do.
    const int64_t n = p.batch * p.m * p.n;
    if (p.beta == 0.0f)
      return cuda_status(cudaMemsetAsync(d, 0, static_cast<size_t>(n) * sizeof(float), c.stream),
                         "memset");
    return cuda_status(unary(Unary::kScale, d, d, n, p.beta, 0.0f, c.stream), "launch");
  }
  std::shared_ptr<LtPlan> plan;
  if (cache != nullptr && *cache != nullptr) {
    plan = std::static_pointer_cast<LtPlan>(*cache);
  } else {
    ASSIGN_OR_RETURN(plan, plan_product(c, p, a, b, d));
    if (cache != nullptr) *cache = plan;
  }
  const LtObjects &lt = plan->lt;
  if (p.scalars != nullptr && p.beta == 0.0f) {
    // beta is read on the device: D (also C) must hold no NaN from its
    // bytes' earlier use, which 0 x NaN would keep.
    const int64_t elements = (p.batch - 1) * p.stride_d + p.m * p.n;
    RETURN_IF_ERROR(cuda_status(
        cudaMemsetAsync(d, 0, static_cast<size_t>(elements) * sizeof(float), c.stream), "memset"));
  }
  const float *alpha = p.scalars != nullptr ? p.scalars : &p.alpha;
  const float *beta = p.scalars != nullptr ? p.scalars + 1 : &p.beta;
  return cublas_status(cublasLtMatmul(c.lt, lt.desc, alpha, b, lt.a, a, lt.b, beta, d, lt.d, d,
                                      lt.d, &plan->heuristic.algo, c.workspace, c.workspace_bytes,
                                      c.stream),
                       "matmul");
}

// A product's operands (inputs 0 and 1) as the GEMM reads them: the f32
// tensors themselves, or under --precision bf16 / f16 their half copies in
// the staging (A, then B, then for f16 the scalars, each at a 256-byte
// boundary); p.bf16 / p.f16 say which. With f16 the scalars hold both
// operands' largest magnitudes (as bits) and the product's alpha and beta.
struct Operands {
  const std::byte *a = nullptr, *b = nullptr;
  size_t element = sizeof(float);
};
int64_t half_bytes(int64_t elements) { return (elements * 2 + 255) / 256 * 256; }
constexpr int64_t kF16Scalars = 256; // amax of A and B (bits), alpha, beta
Result<Operands> gemm_operands(const CudaKernelContext &c, Product &p) {
  Operands operands;
  if (c.half == nullptr) {
    operands.a = reinterpret_cast<const std::byte *>(in_f32(c, 0));
    operands.b = reinterpret_cast<const std::byte *>(in_f32(c, 1));
    return operands;
  }
  const int64_t a_elements = c.inputs[0].num_elements(), b_elements = c.inputs[1].num_elements();
  auto *a = static_cast<std::byte *>(c.half), *b = a + half_bytes(a_elements);
  auto *a16 = reinterpret_cast<uint16_t *>(a), *b16 = reinterpret_cast<uint16_t *>(b);
  if (!c.f16) {
    RETURN_IF_ERROR(cuda_status(to_bf16(in_f32(c, 0), a16, a_elements, c.stream), "launch"));
    RETURN_IF_ERROR(cuda_status(to_bf16(in_f32(c, 1), b16, b_elements, c.stream), "launch"));
    p.bf16 = true;
    return Operands{a, b, 2};
  }
  auto *amax = reinterpret_cast<unsigned *>(b + half_bytes(b_elements));
  auto *scalars = reinterpret_cast<float *>(amax + 2);
  RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(amax, 0, 2 * sizeof(unsigned), c.stream), "memset"));
  RETURN_IF_ERROR(cuda_status(f16_amax(in_f32(c, 0), a_elements, amax, c.stream), "launch"));
  RETURN_IF_ERROR(cuda_status(f16_amax(in_f32(c, 1), b_elements, amax + 1, c.stream), "launch"));
  RETURN_IF_ERROR(
      cuda_status(to_f16_scaled(in_f32(c, 0), a16, a_elements, amax, 0, c.stream), "launch"));
  RETURN_IF_ERROR(
      cuda_status(to_f16_scaled(in_f32(c, 1), b16, b_elements, amax, 1, c.stream), "launch"));
  RETURN_IF_ERROR(
      cuda_status(f16_gemm_scalars(amax, p.alpha, p.beta, scalars, c.stream), "launch"));
  p.f16 = true;
  p.scalars = scalars;
  return Operands{a, b, 2};
}

Status matmul_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0, 1}));
  ASSIGN_OR_RETURN(ops::MatMulDims dims,
                   ops::matmul_dims(c.def, c.attrs(), *c.inputs[0].type, *c.inputs[1].type));
  Product p;
  p.trans_a = dims.trans_a;
  p.trans_b = dims.trans_b;
  p.m = dims.m;
  p.n = dims.n;
  p.k = dims.k;
  ASSIGN_OR_RETURN(Operands operands, gemm_operands(c, p));
  const std::byte *a = operands.a, *b = operands.b;
  const size_t element = operands.element;
  float *d = out_f32(c, 0);
  const int64_t batch = num_elements(dims.batch);
  if (num_elements(dims.b_batch) == 1 && num_elements(dims.a_batch) == batch && !dims.trans_a) {
    // One B for every batch entry: one tall product.
    p.m *= batch;
    return run_product(c, p, a, b, d, c.cache);
  }
  const std::vector<int64_t> a_offsets = ops::batch_offsets(dims.a_batch, dims.batch, p.m * p.k);
  const std::vector<int64_t> b_offsets = ops::batch_offsets(dims.b_batch, dims.batch, p.k * p.n);
  // Strided products over blocks of the batch (one block when both operands
  // step evenly through all of it): one plan, kept for the node, serves
  // every block.
  const ops::BatchBlocks blocks = ops::strided_batch_blocks(dims.batch, a_offsets, b_offsets);
  p.batch = blocks.inner;
  p.stride_a = blocks.inner > 1 ? blocks.stride_a : 0;
  p.stride_b = blocks.inner > 1 ? blocks.stride_b : 0;
  p.stride_d = p.m * p.n;
  auto at = [&](const std::byte *base, int64_t offset) { return base + offset * element; };
  if (blocks.outer > 1 && c.cache != nullptr && *c.cache == nullptr && p.m > 0 && p.n > 0 &&
      p.k > 0) { // (empty products never reach cuBLASLt: run_product)
    // Planned for the least aligned block: alignment() reads only the low
    // bits of these addresses, and their OR has the lowest set bit of all.
    uintptr_t a_bits = 0, b_bits = 0, d_bits = 0;
    for (int64_t j = 0; j < blocks.outer; ++j) {
      const auto first = static_cast<size_t>(j * blocks.inner);
      a_bits |= reinterpret_cast<uintptr_t>(at(a, a_offsets[first]));
      b_bits |= reinterpret_cast<uintptr_t>(at(b, b_offsets[first]));
      d_bits |= reinterpret_cast<uintptr_t>(d + j * blocks.inner * p.m * p.n);
    }
    ASSIGN_OR_RETURN(*c.cache, plan_product(c, p, reinterpret_cast<const void *>(a_bits),
                                            reinterpret_cast<const void *>(b_bits),
                                            reinterpret_cast<const float *>(d_bits)));
  }
  for (int64_t j = 0; j < blocks.outer; ++j) {
    const auto first = static_cast<size_t>(j * blocks.inner);
    RETURN_IF_ERROR(run_product(c, p, at(a, a_offsets[first]), at(b, b_offsets[first]),
                                d + j * blocks.inner * p.m * p.n, c.cache));
  }
  return Status::ok();
}

Status gemm_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0, 1}));
  ops::AttrReader attrs = c.attrs();
  Product p;
  p.trans_a = attrs.get_int("trans_a") != 0;
  p.trans_b = attrs.get_int("trans_b") != 0;
  const auto a_shape = c.inputs[0].shape(), b_shape = c.inputs[1].shape();
  p.m = p.trans_a ? a_shape[1] : a_shape[0];
  p.k = p.trans_a ? a_shape[0] : a_shape[1];
  p.n = p.trans_b ? b_shape[0] : b_shape[1];
  p.alpha = static_cast<float>(attrs.get_float("alpha"));
  p.beta = static_cast<float>(attrs.get_float("beta"));
  float *d = out_f32(c, 0);
  if (c.inputs.size() > 2 && p.beta != 0.0f) {
    // C broadcast into D first; the product then scales it by beta and adds.
    RETURN_IF_ERROR(expect_f32(c, {2}));
    ASSIGN_OR_RETURN(Dims shape, dims_of(c.outputs[0].shape()));
    RETURN_IF_ERROR(
        cuda_status(broadcast_copy(in_f32(c, 2), broadcast_strides(c.inputs[2].shape(), shape), d,
                                   shape, c.stream),
                    "launch"));
  } else {
    p.beta = 0.0f;
  }
  ASSIGN_OR_RETURN(Operands operands, gemm_operands(c, p));
  return run_product(c, p, operands.a, operands.b, d, c.cache);
}

// ---- the table ------------------------------------------------------------------------

CudaOp op(std::string_view name, CudaKernelFn kernel, ScratchFn scratch = nullptr,
          std::string_view flag_meaning = {}) {
  return CudaOp{name, kernel, scratch, flag_meaning};
}

// The ops the registry marks Elementwise::kFusable: their kernel and their step
// in a fused chain.
template <Unary kOp> CudaOp unary_map(std::string_view name) {
  CudaOp entry = op(name, unary_op<kOp>);
  entry.fused = FusedStep{};
  entry.fused->op = static_cast<int>(kOp);
  return entry;
}
template <Binary kOp> CudaOp binary_map(std::string_view name) {
  CudaOp entry = op(name, binary_op<kOp>);
  entry.fused = FusedStep{};
  entry.fused->binary = 1;
  entry.fused->op = static_cast<int>(kOp);
  return entry;
}

const std::vector<CudaOp> &table() {
  static const std::vector<CudaOp> ops = [] {
    const std::string_view kBadLabel = "a label is outside [0, classes) and is not ignore_index";
    std::vector<CudaOp> t = {
        binary_map<Binary::kAdd>("Add"),
        op("AveragePool2d", pool_op<false>),
        op("AveragePool2dGrad", pool_grad_op<false>),
        op("AdamUpdate", adam_op, nullptr, "the step input is negative"),
        op("BatchNormStats", batch_norm_stats_op),
        op("BatchNormalization", batch_norm_op),
        op("BatchNormalizationGrad", batch_norm_grad_op),
        op("Cast", cast_op),
        unary_map<Unary::kClip>("Clip"),
        binary_map<Binary::kClipGrad>("ClipGrad"),
        op("Concat", concat_op),
        binary_map<Binary::kDiv>("Div"),
        op("Dropout", dropout_op),
        unary_map<Unary::kErf>("Erf"),
        unary_map<Unary::kExp>("Exp"),
        op("Expand", expand_op),
        op("Flatten", copy_op),
        op("Gather", gather_op, nullptr, "an index is outside the table"),
        op("GatherGrad", gather_grad_op, gather_grad_scratch_bytes,
           "an index is outside the table"),
        unary_map<Unary::kGeluErf>("Gelu"),
        binary_map<Binary::kGeluErfGrad>("GeluGrad"),
        op("Gemm", gemm_op),
        op("GlobalNormScale", norm_op<false>, norm_scratch),
        op("NormScale", norm_scale_op, norm_scale_scratch),
        op("SumOfSquares", norm_op<true>, norm_scratch),
        op("GlobalAveragePool", global_average_pool_op),
        op("GlobalAveragePoolGrad", global_average_pool_grad_op),
        op("Identity", copy_op),
        op("LayerNorm", layer_norm_op),
        op("LayerNormGrad", layer_norm_grad_op, layer_norm_grad_scratch),
        op("LearningRate", learning_rate_op),
        unary_map<Unary::kLog>("Log"),
        op("LogSoftmax", softmax_op<true>),
        op("LogSoftmaxGrad", softmax_grad_op<true>),
        op("MatMul", matmul_op),
        op("MaxPool2d", pool_op<true>),
        op("MaxPool2dGrad", pool_grad_op<true>, max_pool_grad_scratch),
        op("MseLoss", mse_loss_op, mse_scratch),
        op("MseLossGrad", mse_loss_grad_op),
        binary_map<Binary::kMul>("Mul"),
        unary_map<Unary::kNeg>("Neg"),
        binary_map<Binary::kPow>("Pow"),
        op("ReduceMax", reduce_op<Reduce::kMax, false>),
        op("ReduceMaxGrad", reduce_max_grad_op),
        op("ReduceMean", reduce_op<Reduce::kSum, true>),
        op("ReduceSum", reduce_op<Reduce::kSum, false>),
        unary_map<Unary::kRelu>("Relu"),
        binary_map<Binary::kReluGrad>("ReluGrad"),
        op("Reshape", copy_op),
        op("SgdUpdate", sgd_op),
        op("Slice", slice_op),
        op("SliceGrad", slice_grad_op),
        unary_map<Unary::kSigmoid>("Sigmoid"),
        binary_map<Binary::kSigmoidGrad>("SigmoidGrad"),
        op("Softmax", softmax_op<false>),
        op("SoftmaxCrossEntropy", cross_entropy_op, cross_entropy_scratch, kBadLabel),
        op("SoftmaxCrossEntropyGrad", cross_entropy_grad_op, cross_entropy_grad_scratch, kBadLabel),
        op("SoftmaxGrad", softmax_grad_op<false>),
        op("Split", split_op),
        unary_map<Unary::kSqrt>("Sqrt"),
        op("Squeeze", copy_op),
        binary_map<Binary::kSub>("Sub"),
        unary_map<Unary::kTanh>("Tanh"),
        binary_map<Binary::kTanhGrad>("TanhGrad"),
        op("Transpose", transpose_op),
        op("Unsqueeze", copy_op),
        op("VocabParallelCrossEntropy", vocab_parallel_cross_entropy_op, cross_entropy_scratch,
           kBadLabel),
        op("VocabParallelCrossEntropyGrad", vocab_parallel_cross_entropy_grad_op,
           cross_entropy_grad_scratch, kBadLabel),
        op("VocabParallelStats", vocab_parallel_stats_op, nullptr, kBadLabel),
        op("Where", where_op),
    };
    for (const CudaOp &entry : cudnn_ops())
      t.push_back(entry);
    std::sort(t.begin(), t.end(), [](const CudaOp &a, const CudaOp &b) { return a.name < b.name; });
    return t;
  }();
  return ops;
}

} // namespace

Result<Dims> shape_dims(llvm::ArrayRef<int64_t> shape) { return dims_of(shape); }
Dims operand_strides(llvm::ArrayRef<int64_t> operand, const Dims &shape) {
  return broadcast_strides(operand, shape);
}

Result<FusedStep> fused_step(const Node &node, const ops::OpDef &def) {
  const CudaOp *entry = find_cuda_op(node.op);
  if (def.traits.elementwise != ops::Elementwise::kFusable || entry == nullptr || !entry->fused)
    return invalid_argument("node '", node.name, "' (", node.op,
                            ") is not a fusable elementwise op");
  FusedStep step = *entry->fused;
  const ops::AttrReader attrs(node, def);
  // Gelu's and GeluGrad's tanh form.
  if (def.find_attr("approximate") != nullptr && attrs.get_string("approximate") == "tanh")
    step.op =
        step.binary ? static_cast<int>(Binary::kGeluTanhGrad) : static_cast<int>(Unary::kGeluTanh);
  // Clip's and ClipGrad's bounds.
  if (def.find_attr("min") != nullptr) {
    step.a = static_cast<float>(attrs.get_float("min"));
    step.b = static_cast<float>(attrs.get_float("max"));
  }
  return step;
}

int64_t half_staging_bytes(const Node &node, llvm::ArrayRef<TensorType> inputs) {
  if ((node.op != "MatMul" && node.op != "Gemm") || inputs.size() < 2) return 0;
  return half_bytes(inputs[0].num_elements()) + half_bytes(inputs[1].num_elements()) + kF16Scalars;
}

Status expect_f32(const CudaKernelContext &context, std::initializer_list<size_t> inputs) {
  for (size_t i : inputs)
    if (i < context.inputs.size() && context.inputs[i].dtype() != DType::kF32)
      return unimplemented(context.def.name, ": the CUDA backend runs f32 only, input ", i, " is ",
                           context.inputs[i].type->to_string());
  return Status::ok();
}

const CudaOp *find_cuda_op(std::string_view op) {
  const auto &t = table();
  auto it = std::lower_bound(t.begin(), t.end(), op,
                             [](const CudaOp &a, std::string_view name) { return a.name < name; });
  return it != t.end() && it->name == op ? &*it : nullptr;
}

std::vector<std::string_view> cuda_op_names() {
  std::vector<std::string_view> names;
  for (const CudaOp &op : table())
    names.push_back(op.name);
  return names;
}

std::vector<std::string_view> cudnn_preferred_ops() {
  if (!STRATA_HAVE_CUDNN) return {};
  return {"AveragePool2d",          "AveragePool2dGrad", "BatchNormalization",
          "BatchNormalizationGrad", "MaxPool2d",         "MaxPool2dGrad"};
}

} // namespace strata::cuda
