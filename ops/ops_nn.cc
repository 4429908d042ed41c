// The neural-network ops: matrix products, normalization, convolution, pooling
// and losses. Each entry below is the op's whole description; the heavy lifting
// is in ops/kernels/cpu (sgemm, conv2d_forward), the rest is plain loops.
//
// Costs (docs/ops.md, "FLOP counts"): MatMul and Gemm 2·M·N·K per matrix, Gemm
// adding M·N when alpha != 1 and M·N for beta·C when C is given and beta != 0;
// Conv2d 2·N·M·oH·oW·(C/group)·kH·kW (+ N·M·oH·oW with a bias). Per input element:
// LayerNorm 8, BatchNormalization 2, BatchNormStats 3, GlobalAveragePool 1,
// SoftmaxCrossEntropy 4 (per logit), MseLoss 3. Per output element: MaxPool2d
// kH·kW, AveragePool2d kH·kW + 1. Every op reads each input and writes each
// output once.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "ops/kernels/cpu/conv.h"
#include "ops/kernels/cpu/gemm.h"
#include "ops/kernels/cpu/parallel.h"
#include "ops/matmul_shape.h"
#include "ops/registry.h"
#include "ops/window.h"

namespace strata::ops {
namespace {

using TypeList = llvm::SmallVector<TensorType, 2>;

// ---------------------------------------------------------------------------
// Attribute specs and small helpers.

AttrSpec int_attr(std::string_view name, int64_t value, std::string_view doc) {
  return {name, AttrType::kInt, AttrValue(value), doc};
}
AttrSpec float_attr(std::string_view name, double value, std::string_view doc) {
  return {name, AttrType::kFloat, AttrValue(value), doc};
}
AttrSpec string_attr(std::string_view name, std::string value, std::string_view doc) {
  return {name, AttrType::kString, AttrValue(std::move(value)), doc};
}
AttrSpec ints_attr(std::string_view name, std::vector<int64_t> value, std::string_view doc) {
  return {name, AttrType::kInts, AttrValue(std::move(value)), doc};
}
AttrSpec required_ints_attr(std::string_view name, std::string_view doc) {
  return {name, AttrType::kInts, std::nullopt, doc};
}

std::string describe(const TensorType &type) { return type.to_string(); }

// Reads every input once and writes every output once, plus `flops`.
OpCost io_cost(llvm::ArrayRef<TensorType> inputs, llvm::ArrayRef<TensorType> outputs,
               double flops) {
  OpCost cost;
  for (const TensorType &t : inputs)
    cost.bytes_read += static_cast<double>(t.size_bytes());
  for (const TensorType &t : outputs)
    cost.bytes_written += static_cast<double>(t.size_bytes());
  cost.flops = flops;
  return cost;
}

double elements(const TensorType &type) { return static_cast<double>(type.num_elements()); }

// The kernels here are f32 only; an error names the op and the dtype it got.
Status require_f32(const KernelContext &context, std::initializer_list<size_t> indices) {
  for (size_t i : indices)
    if (i < context.inputs.size() && context.inputs[i].dtype() != DType::kF32)
      return unimplemented(context.def.name, ": no CPU kernel for ",
                           dtype_name(context.inputs[i].dtype()), " (input ", i,
                           "); only f32 is implemented");
  return Status::ok();
}

Status expect_rank(const OpDef &def, llvm::ArrayRef<TensorType> inputs, size_t index, int64_t rank,
                   std::string_view what) {
  if (inputs[index].rank() != rank)
    return invalid_argument(def.name, ": input ", index, " (", what, ") must have rank ", rank,
                            ", got ", describe(inputs[index]));
  return Status::ok();
}

Result<bool> read_flag(const OpDef &def, const AttrReader &attrs, std::string_view name) {
  int64_t value = attrs.get_int(name);
  if (value != 0 && value != 1)
    return invalid_argument(def.name, ": attribute '", name, "' must be 0 or 1, got ", value);
  return value == 1;
}

// The norms divide by sqrt(variance + epsilon), and a constant row or
// channel has variance 0: only a positive, finite epsilon keeps the result
// finite (ONNX and PyTorch take any float and give inf or NaN there).
Status expect_positive_epsilon(const Node &node, const OpDef &def) {
  const double epsilon = AttrReader(node, def).get_float("epsilon");
  if (!(epsilon > 0) || !std::isfinite(epsilon))
    return invalid_argument(def.name, ": attribute 'epsilon' = ", epsilon,
                            " must be a finite number > 0");
  return Status::ok();
}

enum class Reduction { kMean, kSum, kNone };

Result<Reduction> read_reduction(const OpDef &def, const AttrReader &attrs) {
  std::string value = attrs.get_string("reduction");
  if (value == "mean") return Reduction::kMean;
  if (value == "sum") return Reduction::kSum;
  if (value == "none") return Reduction::kNone;
  return invalid_argument(def.name,
                          ": attribute 'reduction' must be \"mean\", \"sum\" or "
                          "\"none\", got \"",
                          value, "\"");
}

// ---------------------------------------------------------------------------
// MatMul

} // namespace

Result<MatMulDims> matmul_dims(const OpDef &def, const AttrReader &attrs, const TensorType &a,
                               const TensorType &b) {
  ASSIGN_OR_RETURN(bool trans_a, read_flag(def, attrs, "trans_a"));
  ASSIGN_OR_RETURN(bool trans_b, read_flag(def, attrs, "trans_b"));
  for (const TensorType *t : {&a, &b})
    if (t->rank() == 0)
      return invalid_argument(def.name, ": input ", t == &a ? 0 : 1,
                              " must have rank >= 1, got the scalar ", describe(*t));
  MatMulDims dims;
  dims.a_vector = a.rank() == 1;
  dims.b_vector = b.rank() == 1;
  dims.trans_a = trans_a && !dims.a_vector;
  dims.trans_b = trans_b && !dims.b_vector;
  int64_t ka;
  if (dims.a_vector) {
    dims.m = 1;
    ka = a.shape[0];
  } else {
    int64_t rows = a.shape[a.rank() - 2], cols = a.shape[a.rank() - 1];
    dims.m = dims.trans_a ? cols : rows;
    ka = dims.trans_a ? rows : cols;
    dims.a_batch.assign(a.shape.begin(), a.shape.end() - 2);
  }
  int64_t kb;
  if (dims.b_vector) {
    dims.n = 1;
    kb = b.shape[0];
  } else {
    int64_t rows = b.shape[b.rank() - 2], cols = b.shape[b.rank() - 1];
    kb = dims.trans_b ? cols : rows;
    dims.n = dims.trans_b ? rows : cols;
    dims.b_batch.assign(b.shape.begin(), b.shape.end() - 2);
  }
  if (ka != kb)
    return invalid_argument(def.name, ": inner dimensions differ: input 0 ", describe(a),
                            " (trans_a=", trans_a ? 1 : 0, ") has K = ", ka, " but input 1 ",
                            describe(b), " (trans_b=", trans_b ? 1 : 0, ") has K = ", kb);
  dims.k = ka;
  auto batch = broadcast_shapes(dims.a_batch, dims.b_batch);
  if (!batch)
    return invalid_argument(def.name, ": batch dimensions of input 0 ", describe(a),
                            " and input 1 ", describe(b),
                            " do not broadcast: ", batch.status().message());
  dims.batch = std::move(batch).value();
  return dims;
}

Result<TypeList> infer_matmul(const Node &node, const OpDef &def,
                              llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  RETURN_IF_ERROR(expect_same_dtype(def, inputs));
  ASSIGN_OR_RETURN(MatMulDims dims, matmul_dims(def, AttrReader(node, def), inputs[0], inputs[1]));
  TensorType out{inputs[0].dtype, dims.batch};
  if (!dims.a_vector) out.shape.push_back(dims.m);
  if (!dims.b_vector) out.shape.push_back(dims.n);
  return TypeList{out};
}

OpCost matmul_cost(const Node &node, const OpDef &def, llvm::ArrayRef<TensorType> inputs,
                   llvm::ArrayRef<TensorType> outputs) {
  auto dims = matmul_dims(def, AttrReader(node, def), inputs[0], inputs[1]);
  if (!dims) return io_cost(inputs, outputs, 0);
  double batch = static_cast<double>(num_elements(dims->batch));
  return io_cost(inputs, outputs,
                 2.0 * batch * static_cast<double>(dims->m) * static_cast<double>(dims->n) *
                     static_cast<double>(dims->k));
}

BatchBlocks strided_batch_blocks(llvm::ArrayRef<int64_t> batch, llvm::ArrayRef<int64_t> a_offsets,
                                 llvm::ArrayRef<int64_t> b_offsets) {
  const int64_t count = num_elements(batch);
  // The stride within every block of `inner` entries, or -1 where the blocks
  // do not all step evenly by one stride.
  auto block_stride = [&](llvm::ArrayRef<int64_t> offsets, int64_t inner) -> int64_t {
    const int64_t stride = inner > 1 ? offsets[1] - offsets[0] : 0;
    for (int64_t j = 0; j < count; j += inner)
      for (int64_t i = 0; i < inner; ++i)
        if (offsets[static_cast<size_t>(j + i)] != offsets[static_cast<size_t>(j)] + i * stride)
          return -1;
    return stride;
  };
  // Trailing batch dims, most first: the first split that fits has the
  // largest inner.
  for (size_t split = 0; split <= batch.size(); ++split) {
    const int64_t inner = num_elements(batch.drop_front(split));
    if (inner == 0) return {0, 0, 0, 0};
    const int64_t stride_a = block_stride(a_offsets, inner);
    const int64_t stride_b = block_stride(b_offsets, inner);
    if (stride_a >= 0 && stride_b >= 0) return {count / inner, inner, stride_a, stride_b};
  }
  return {count, 1, 0, 0};
}

std::vector<int64_t> batch_offsets(llvm::ArrayRef<int64_t> operand_batch,
                                   llvm::ArrayRef<int64_t> batch, int64_t matrix_size) {
  const size_t rank = batch.size();
  // Strides of the operand's batch dims, aligned right, 0 where broadcast.
  std::vector<int64_t> strides(rank, 0);
  int64_t stride = matrix_size;
  for (size_t i = 0; i < operand_batch.size(); ++i) {
    size_t dim = operand_batch.size() - 1 - i;
    size_t out_dim = rank - 1 - i;
    strides[out_dim] = operand_batch[dim] == 1 ? 0 : stride;
    stride *= operand_batch[dim];
  }
  const int64_t count = num_elements(batch);
  std::vector<int64_t> offsets(static_cast<size_t>(count));
  std::vector<int64_t> index(rank, 0);
  int64_t offset = 0;
  for (int64_t i = 0; i < count; ++i) {
    offsets[static_cast<size_t>(i)] = offset;
    for (size_t d = rank; d-- > 0;) { // odometer step, last dim fastest
      offset += strides[d];
      if (++index[d] < batch[d]) break;
      offset -= strides[d] * batch[d];
      index[d] = 0;
    }
  }
  return offsets;
}

namespace {

Status matmul_kernel(const KernelContext &context) {
  RETURN_IF_ERROR(require_f32(context, {0, 1}));
  const ConstTensorView &a = context.inputs[0];
  const ConstTensorView &b = context.inputs[1];
  ASSIGN_OR_RETURN(MatMulDims dims, matmul_dims(context.def, context.attrs(), *a.type, *b.type));
  const int64_t m = dims.m, n = dims.n, k = dims.k;
  // Leading dimensions of the matrices as stored: a 1-D A is one row [1, K], a
  // 1-D B one column [K, 1].
  const int64_t lda = dims.trans_a ? m : k;
  const int64_t ldb = dims.b_vector ? 1 : (dims.trans_b ? k : n);
  const float *a_data = a.as<float>();
  const float *b_data = b.as<float>();
  float *y = context.outputs[0].as<float>();
  const int64_t batch = num_elements(dims.batch);
  const int64_t a_batch = num_elements(dims.a_batch);
  const int64_t b_batch = num_elements(dims.b_batch);
  cpu::GemmShape shape{dims.trans_a, dims.trans_b, m, n, k};
  if (b_batch == 1 && (a_batch == batch) && !dims.trans_a) {
    // One B for every batch entry: stack A's matrices into one tall product.
    shape.m = m * batch;
    cpu::sgemm(shape, 1.0f, a_data, lda, b_data, ldb, 0.0f, y, n);
    return Status::ok();
  }
  std::vector<int64_t> a_offsets = batch_offsets(dims.a_batch, dims.batch, m * k);
  std::vector<int64_t> b_offsets = batch_offsets(dims.b_batch, dims.batch, k * n);
  for (int64_t i = 0; i < batch; ++i) {
    size_t s = static_cast<size_t>(i);
    cpu::sgemm(shape, 1.0f, a_data + a_offsets[s], lda, b_data + b_offsets[s], ldb, 0.0f,
               y + i * m * n, n);
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------
// Gemm

struct GemmDims {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
};

Result<GemmDims> gemm_dims(const OpDef &def, const AttrReader &attrs,
                           llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_rank(def, inputs, 0, 2, "A"));
  RETURN_IF_ERROR(expect_rank(def, inputs, 1, 2, "B"));
  GemmDims dims;
  ASSIGN_OR_RETURN(dims.trans_a, read_flag(def, attrs, "trans_a"));
  ASSIGN_OR_RETURN(dims.trans_b, read_flag(def, attrs, "trans_b"));
  const Shape &a = inputs[0].shape, &b = inputs[1].shape;
  dims.m = dims.trans_a ? a[1] : a[0];
  dims.k = dims.trans_a ? a[0] : a[1];
  int64_t kb = dims.trans_b ? b[1] : b[0];
  dims.n = dims.trans_b ? b[0] : b[1];
  if (dims.k != kb)
    return invalid_argument(def.name, ": inner dimensions differ: input 0 ", describe(inputs[0]),
                            " (trans_a=", dims.trans_a ? 1 : 0, ") has K = ", dims.k,
                            " but input 1 ", describe(inputs[1]),
                            " (trans_b=", dims.trans_b ? 1 : 0, ") has K = ", kb);
  if (inputs.size() > 2) {
    const TensorType &c = inputs[2];
    bool ok = c.rank() <= 2;
    Shape target{dims.m, dims.n};
    for (int64_t i = 0; ok && i < c.rank(); ++i) {
      int64_t dim = c.shape[c.rank() - 1 - i];
      ok = dim == 1 || dim == target[1 - i];
    }
    if (!ok)
      return invalid_argument(def.name, ": input 2 (C) ", describe(c),
                              " does not broadcast to the output shape ", shape_to_string(target));
  }
  return dims;
}

Result<TypeList> infer_gemm(const Node &node, const OpDef &def, llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  RETURN_IF_ERROR(expect_same_dtype(def, inputs));
  ASSIGN_OR_RETURN(GemmDims dims, gemm_dims(def, AttrReader(node, def), inputs));
  return TypeList{TensorType{inputs[0].dtype, Shape{dims.m, dims.n}}};
}

OpCost gemm_cost(const Node &node, const OpDef &def, llvm::ArrayRef<TensorType> inputs,
                 llvm::ArrayRef<TensorType> outputs) {
  AttrReader attrs(node, def);
  auto dims = gemm_dims(def, attrs, inputs);
  if (!dims) return io_cost(inputs, outputs, 0);
  double mn = static_cast<double>(dims->m) * static_cast<double>(dims->n);
  double flops = 2.0 * mn * static_cast<double>(dims->k);
  if (attrs.get_float("alpha") != 1.0) flops += mn;
  if (inputs.size() > 2 && attrs.get_float("beta") != 0.0) flops += mn;
  return io_cost(inputs, outputs, flops);
}

llvm::SmallVector<TensorType, 3> input_types(const KernelContext &context) {
  llvm::SmallVector<TensorType, 3> types;
  for (const ConstTensorView &input : context.inputs)
    types.push_back(*input.type);
  return types;
}

Status gemm_kernel(const KernelContext &context) {
  RETURN_IF_ERROR(require_f32(context, {0, 1, 2}));
  AttrReader attrs = context.attrs();
  ASSIGN_OR_RETURN(GemmDims dims, gemm_dims(context.def, attrs, input_types(context)));
  const float alpha = static_cast<float>(attrs.get_float("alpha"));
  float beta = static_cast<float>(attrs.get_float("beta"));
  const int64_t m = dims.m, n = dims.n;
  float *y = context.outputs[0].as<float>();
  if (context.inputs.size() > 2 && beta != 0.0f) {
    // Broadcast C into Y; sgemm then scales it by beta and adds the product.
    const ConstTensorView &c = context.inputs[2];
    const float *c_data = c.as<float>();
    const int64_t rank = c.type->rank();
    const int64_t c_rows = rank == 2 ? c.shape()[0] : 1;
    const int64_t c_cols = rank >= 1 ? c.shape()[rank - 1] : 1;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        y[i * n + j] = c_data[(c_rows == 1 ? 0 : i) * c_cols + (c_cols == 1 ? 0 : j)];
  } else {
    beta = 0.0f;
  }
  const int64_t lda = context.inputs[0].shape()[1];
  const int64_t ldb = context.inputs[1].shape()[1];
  cpu::sgemm(cpu::GemmShape{dims.trans_a, dims.trans_b, m, n, dims.k}, alpha,
             context.inputs[0].as<float>(), lda, context.inputs[1].as<float>(), ldb, beta, y, n);
  return Status::ok();
}

// ---------------------------------------------------------------------------
// LayerNorm

Result<TypeList> infer_layer_norm(const Node &node, const OpDef &def,
                                  llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  RETURN_IF_ERROR(expect_positive_epsilon(node, def));
  RETURN_IF_ERROR(expect_same_dtype(def, inputs));
  const TensorType &x = inputs[0];
  int64_t axis_attr = AttrReader(node, def).get_int("axis");
  ASSIGN_OR_RETURN(int64_t axis, normalize_axis(axis_attr, x.rank(), "axis"));
  llvm::ArrayRef<int64_t> normalized = llvm::ArrayRef<int64_t>(x.shape).drop_front(axis);
  for (size_t i = 1; i < 3; ++i)
    if (llvm::ArrayRef<int64_t>(inputs[i].shape) != normalized)
      return invalid_argument(def.name, ": input ", i, i == 1 ? " (scale) " : " (bias) ",
                              describe(inputs[i]),
                              " must have the shape X.shape[axis:] = ", shape_to_string(normalized),
                              " (X ", describe(x), ", axis = ", axis_attr, ")");
  return TypeList{x};
}

OpCost layer_norm_cost(const Node &, const OpDef &, llvm::ArrayRef<TensorType> inputs,
                       llvm::ArrayRef<TensorType> outputs) {
  return io_cost(inputs, outputs, 8.0 * elements(inputs[0]));
}

Status layer_norm_kernel(const KernelContext &context) {
  RETURN_IF_ERROR(require_f32(context, {0, 1, 2}));
  AttrReader attrs = context.attrs();
  const ConstTensorView &x = context.inputs[0];
  ASSIGN_OR_RETURN(int64_t axis, normalize_axis(attrs.get_int("axis"), x.type->rank(), "axis"));
  const double epsilon = attrs.get_float("epsilon");
  const int64_t size = num_elements(x.shape().drop_front(axis));
  const int64_t rows = size == 0 ? 0 : x.num_elements() / size;
  const float *in = x.as<float>();
  const float *scale = context.inputs[1].as<float>();
  const float *bias = context.inputs[2].as<float>();
  float *out = context.outputs[0].as<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float *row = in + r * size;
    float *y = out + r * size;
    // Two passes in double: the mean first, then the mean squared deviation.
    double sum = 0;
    for (int64_t i = 0; i < size; ++i)
      sum += row[i];
    const double mean = sum / static_cast<double>(size);
    double squares = 0;
    for (int64_t i = 0; i < size; ++i) {
      double d = row[i] - mean;
      squares += d * d;
    }
    const double inv_std = 1.0 / std::sqrt(squares / static_cast<double>(size) + epsilon);
    for (int64_t i = 0; i < size; ++i)
      y[i] = static_cast<float>((row[i] - mean) * inv_std * scale[i] + bias[i]);
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------
// Sliding windows: Conv2d and the pools.

Result<std::vector<int64_t>> read_ints(const OpDef &def, const AttrReader &attrs,
                                       std::string_view name, size_t count, int64_t min_value) {
  std::vector<int64_t> values = attrs.get_ints(name);
  if (values.size() != count)
    return invalid_argument(def.name, ": attribute '", name, "' must have ", count, " values, got ",
                            values.size());
  for (int64_t v : values)
    if (v < min_value)
      return invalid_argument(def.name, ": attribute '", name, "' values must be >= ", min_value,
                              ", got ", v);
  return values;
}

} // namespace

Result<Window> read_window(const OpDef &def, const AttrReader &attrs) {
  Window w;
  if (def.find_attr("kernel_shape")) {
    ASSIGN_OR_RETURN(auto kernel, read_ints(def, attrs, "kernel_shape", 2, 1));
    w.kernel_h = kernel[0];
    w.kernel_w = kernel[1];
  }
  ASSIGN_OR_RETURN(auto strides, read_ints(def, attrs, "strides", 2, 1));
  ASSIGN_OR_RETURN(auto pads, read_ints(def, attrs, "pads", 4, 0));
  w.stride_h = strides[0];
  w.stride_w = strides[1];
  w.pad_top = pads[0];
  w.pad_left = pads[1];
  w.pad_bottom = pads[2];
  w.pad_right = pads[3];
  if (def.find_attr("dilations")) {
    ASSIGN_OR_RETURN(auto dilations, read_ints(def, attrs, "dilations", 2, 1));
    w.dilation_h = dilations[0];
    w.dilation_w = dilations[1];
  }
  if (def.find_attr("ceil_mode")) {
    ASSIGN_OR_RETURN(w.ceil_mode, read_flag(def, attrs, "ceil_mode"));
  }
  // Sizes beyond 32 bits describe no tensor strata can hold, and their
  // products (a dilated kernel's extent) would overflow.
  constexpr int64_t kLimit = (int64_t{1} << 31) - 1;
  for (const auto &[name, value] : {std::pair{"kernel_shape", w.kernel_h},
                                    {"kernel_shape", w.kernel_w},
                                    {"strides", w.stride_h},
                                    {"strides", w.stride_w},
                                    {"pads", w.pad_top},
                                    {"pads", w.pad_left},
                                    {"pads", w.pad_bottom},
                                    {"pads", w.pad_right},
                                    {"dilations", w.dilation_h},
                                    {"dilations", w.dilation_w}})
    if (value > kLimit)
      return invalid_argument(def.name, ": attribute '", name, "' holds ", value,
                              ", more than 2^31 - 1");
  return w;
}

namespace {
constexpr int64_t kInt32Max = (int64_t{1} << 31) - 1;
} // namespace

std::string cudnn_pool_mismatch(const Window &w, llvm::ArrayRef<int64_t> x,
                                llvm::ArrayRef<int64_t> y) {
  if (x.size() != 4 || y.size() != 4)
    return str_cat("X ", shape_to_string(x), " and Y ", shape_to_string(y),
                   " are not [N, C, H, W]");
  if (w.dilation_h != 1 || w.dilation_w != 1)
    return str_cat("dilations [", w.dilation_h, ", ", w.dilation_w, "]: cuDNN pools without");
  if (w.pad_top != w.pad_bottom || w.pad_left != w.pad_right)
    return str_cat("pads [", w.pad_top, ", ", w.pad_left, ", ", w.pad_bottom, ", ", w.pad_right,
                   "] (top, left, bottom, right): cuDNN pads both sides alike");
  if (w.pad_top >= w.kernel_h || w.pad_left >= w.kernel_w)
    return str_cat("pads ", w.pad_top, ", ", w.pad_left, " against a ", w.kernel_h, "x", w.kernel_w,
                   " window: a window may lie wholly in the padding");
  const int64_t h = x[2], width = x[3];
  if (num_elements(x) == 0 || num_elements(y) == 0) return "X or Y has no elements";
  if (w.stride_h < 1 || w.stride_w < 1 || h + 2 * w.pad_top < w.kernel_h ||
      width + 2 * w.pad_left < w.kernel_w)
    return "the window does not fit the padded input";
  const int64_t floor_h = (h + 2 * w.pad_top - w.kernel_h) / w.stride_h + 1;
  const int64_t floor_w = (width + 2 * w.pad_left - w.kernel_w) / w.stride_w + 1;
  if (floor_h != y[2] || floor_w != y[3])
    return str_cat("output ", y[2], "x", y[3], " is rounded up (ceil_mode); cuDNN's is ", floor_h,
                   "x", floor_w);
  for (int64_t d : {x[0], x[1], h, width, w.kernel_h, w.kernel_w, w.stride_h, w.stride_w})
    if (d > kInt32Max) return str_cat("a size of ", d, " is beyond cuDNN's 32-bit descriptors");
  if (num_elements(x) > kInt32Max)
    return str_cat("X's ", num_elements(x), " elements are beyond cuDNN's 32-bit indexing");
  return {};
}

std::string cudnn_batch_norm_mismatch(int64_t batch, int64_t channels, int64_t inner,
                                      double epsilon, bool training) {
  if (channels < 1) return "X has no channels";
  if (batch * inner < 2) return "one value per channel (cuDNN needs a batch to normalize over)";
  if (!(epsilon >= 0.0) || !std::isfinite(epsilon))
    return str_cat("epsilon ", epsilon, " is not a finite non-negative number");
  const int64_t most = training ? 880801 : 65535;
  if (batch > most)
    return str_cat("batch ", batch, " is beyond cuDNN's ", most, " for ",
                   training ? "training" : "inference");
  if (batch > kInt32Max || channels > kInt32Max || inner > kInt32Max ||
      batch * channels * inner > kInt32Max)
    return str_cat("X [", batch, ", ", channels, ", ", inner,
                   "] is beyond cuDNN's 32-bit descriptors");
  return {};
}

namespace {

// Output size along one dimension (ONNX): floor or ceil of
// (in + pads - extent) / stride + 1; in ceil mode a window that would start in
// the end padding is dropped.
int64_t window_output_size(int64_t in, int64_t extent, int64_t stride, int64_t pad_begin,
                           int64_t pad_end, bool ceil_mode) {
  int64_t span = in + pad_begin + pad_end - extent;
  int64_t out = (ceil_mode ? (span + stride - 1) / stride : span / stride) + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad_begin) --out;
  return out;
}

// Output [oH, oW] of a window over X [N, C, H, W]; an error if the kernel does
// not fit in the padded input.
Result<std::pair<int64_t, int64_t>> window_output(const OpDef &def, const TensorType &x,
                                                  const Window &w) {
  int64_t h = x.shape[2], wd = x.shape[3];
  if (w.extent_h() > h + w.pad_top + w.pad_bottom || w.extent_w() > wd + w.pad_left + w.pad_right)
    return invalid_argument(def.name, ": kernel ", w.kernel_h, "x", w.kernel_w, " (dilated ",
                            w.extent_h(), "x", w.extent_w(), ") is larger than the padded input ",
                            h + w.pad_top + w.pad_bottom, "x", wd + w.pad_left + w.pad_right,
                            " (input 0 ", describe(x), ")");
  return std::pair{
      window_output_size(h, w.extent_h(), w.stride_h, w.pad_top, w.pad_bottom, w.ceil_mode),
      window_output_size(wd, w.extent_w(), w.stride_w, w.pad_left, w.pad_right, w.ceil_mode)};
}

// ---------------------------------------------------------------------------
// Conv2d

Result<cpu::Conv2dParams> conv_params(const OpDef &def, const AttrReader &attrs,
                                      llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_rank(def, inputs, 0, 4, "X [N, C, H, W]"));
  RETURN_IF_ERROR(expect_rank(def, inputs, 1, 4, "W [M, C/group, kH, kW]"));
  const TensorType &x = inputs[0], &weights = inputs[1];
  if (weights.shape[2] < 1 || weights.shape[3] < 1)
    return invalid_argument(def.name, ": input 1 (W) ", describe(weights), " has a kernel of ",
                            weights.shape[2], "x", weights.shape[3],
                            "; kH and kW must be at least 1");
  int64_t group = attrs.get_int("group");
  if (group < 1) return invalid_argument(def.name, ": attribute 'group' must be >= 1, got ", group);
  const int64_t channels = x.shape[1], out_channels = weights.shape[0];
  if (channels % group != 0 || out_channels % group != 0)
    return invalid_argument(def.name, ": group = ", group, " must divide the input channels (",
                            channels, ", input 0 ", describe(x), ") and the output channels (",
                            out_channels, ", input 1 ", describe(weights), ")");
  if (weights.shape[1] != channels / group)
    return invalid_argument(def.name, ": input 1 (W) ", describe(weights),
                            " must have C/group = ", channels, "/", group, " = ", channels / group,
                            " channels in dim 1 (input 0 ", describe(x), ")");
  if (inputs.size() > 2 && (inputs[2].rank() != 1 || inputs[2].shape[0] != out_channels))
    return invalid_argument(def.name, ": input 2 (bias) ", describe(inputs[2]), " must be [",
                            out_channels, "] (the output channels of W ", describe(weights), ")");
  ASSIGN_OR_RETURN(Window w, read_window(def, attrs));
  w.kernel_h = weights.shape[2];
  w.kernel_w = weights.shape[3];
  ASSIGN_OR_RETURN(auto out, window_output(def, x, w));
  cpu::Conv2dParams p;
  p.batch = x.shape[0];
  p.in_channels = channels;
  p.in_h = x.shape[2];
  p.in_w = x.shape[3];
  p.out_channels = out_channels;
  p.kernel_h = w.kernel_h;
  p.kernel_w = w.kernel_w;
  p.group = group;
  p.stride_h = w.stride_h;
  p.stride_w = w.stride_w;
  p.pad_top = w.pad_top;
  p.pad_left = w.pad_left;
  p.pad_bottom = w.pad_bottom;
  p.pad_right = w.pad_right;
  p.dilation_h = w.dilation_h;
  p.dilation_w = w.dilation_w;
  p.out_h = out.first;
  p.out_w = out.second;
  return p;
}

Result<TypeList> infer_conv(const Node &node, const OpDef &def, llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  RETURN_IF_ERROR(expect_same_dtype(def, inputs));
  ASSIGN_OR_RETURN(cpu::Conv2dParams p, conv_params(def, AttrReader(node, def), inputs));
  return TypeList{TensorType{inputs[0].dtype, Shape{p.batch, p.out_channels, p.out_h, p.out_w}}};
}

OpCost conv_cost(const Node &node, const OpDef &def, llvm::ArrayRef<TensorType> inputs,
                 llvm::ArrayRef<TensorType> outputs) {
  auto p = conv_params(def, AttrReader(node, def), inputs);
  if (!p) return io_cost(inputs, outputs, 0);
  double outputs_count = static_cast<double>(p->batch) * static_cast<double>(p->out_channels) *
                         static_cast<double>(p->out_h) * static_cast<double>(p->out_w);
  double per_output = static_cast<double>(p->in_channels / p->group) *
                      static_cast<double>(p->kernel_h) * static_cast<double>(p->kernel_w);
  double flops = 2.0 * outputs_count * per_output;
  if (inputs.size() > 2) flops += outputs_count;
  return io_cost(inputs, outputs, flops);
}

Status conv_kernel(const KernelContext &context) {
  RETURN_IF_ERROR(require_f32(context, {0, 1, 2}));
  ASSIGN_OR_RETURN(cpu::Conv2dParams p,
                   conv_params(context.def, context.attrs(), input_types(context)));
  const float *bias = context.inputs.size() > 2 ? context.inputs[2].as<float>() : nullptr;
  return cpu::conv2d_forward(p, context.inputs[0].as<float>(), context.inputs[1].as<float>(), bias,
                             context.outputs[0].as<float>());
}

// ---------------------------------------------------------------------------
// MaxPool2d and AveragePool2d

Result<TypeList> infer_pool(const Node &node, const OpDef &def, llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  RETURN_IF_ERROR(expect_rank(def, inputs, 0, 4, "X [N, C, H, W]"));
  ASSIGN_OR_RETURN(Window w, read_window(def, AttrReader(node, def)));
  // Every window must overlap the input, so no output is made of padding alone.
  if (w.pad_top >= w.extent_h() || w.pad_bottom >= w.extent_h() || w.pad_left >= w.extent_w() ||
      w.pad_right >= w.extent_w())
    return invalid_argument(def.name, ": pads must be smaller than the (dilated) kernel ",
                            w.extent_h(), "x", w.extent_w());
  ASSIGN_OR_RETURN(auto out, window_output(def, inputs[0], w));
  const Shape &x = inputs[0].shape;
  return TypeList{TensorType{inputs[0].dtype, Shape{x[0], x[1], out.first, out.second}}};
}

OpCost pool_cost(const Node &node, const OpDef &def, llvm::ArrayRef<TensorType> inputs,
                 llvm::ArrayRef<TensorType> outputs) {
  auto w = read_window(def, AttrReader(node, def));
  if (!w) return io_cost(inputs, outputs, 0);
  double per_output = static_cast<double>(w->kernel_h * w->kernel_w);
  if (def.name == "AveragePool2d") per_output += 1; // the division
  return io_cost(inputs, outputs, per_output * elements(outputs[0]));
}

// The common max-pooling window: 2x2, stride 2, no padding or dilation, every
// window inside the input. Its kernels below visit the taps in the generic
// kernels' order with the same rule (a later tap wins when strictly larger, or
// NaN), without branches, so they give bitwise the generic kernels' results.
bool is_plain_2x2_stride_2(const Window &w, int64_t h, int64_t wd, int64_t out_h, int64_t out_w) {
  return w.kernel_h == 2 && w.kernel_w == 2 && w.stride_h == 2 && w.stride_w == 2 &&
         w.pad_top == 0 && w.pad_left == 0 && w.pad_bottom == 0 && w.pad_right == 0 &&
         w.dilation_h == 1 && w.dilation_w == 1 && 2 * out_h <= h && 2 * out_w <= wd;
}

inline bool max_pool_takes(float v, float best) { return v > best || v != v; }

#if defined(__SSE2__)
// Four lanes of max_pool_takes: all ones where v > best or v is NaN.
inline __m128 max_pool_takes4(__m128 v, __m128 best) {
  return _mm_or_ps(_mm_cmpgt_ps(v, best), _mm_cmpunord_ps(v, v));
}
inline __m128 select4(__m128 mask, __m128 a, __m128 b) {
  return _mm_or_ps(_mm_and_ps(mask, a), _mm_andnot_ps(mask, b));
}
// Splits 8 consecutive floats into their even and odd elements.
inline void deinterleave8(const float *p, __m128 *even, __m128 *odd) {
  const __m128 lo = _mm_loadu_ps(p), hi = _mm_loadu_ps(p + 4);
  *even = _mm_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0));
  *odd = _mm_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1));
}
#endif

void max_pool_2x2_stride_2(const float *in, float *out, int64_t planes, int64_t h, int64_t wd,
                           int64_t out_h, int64_t out_w) {
  for (int64_t plane = 0; plane < planes; ++plane) {
    const float *src = in + plane * h * wd;
    float *dst = out + plane * out_h * out_w;
    for (int64_t oy = 0; oy < out_h; ++oy) {
      const float *row0 = src + 2 * oy * wd;
      const float *row1 = row0 + wd;
      float *out_row = dst + oy * out_w;
      int64_t ox = 0;
#if defined(__SSE2__)
      for (; ox + 4 <= out_w; ox += 4) {
        __m128 a, b, c, d;
        deinterleave8(row0 + 2 * ox, &a, &b);
        deinterleave8(row1 + 2 * ox, &c, &d);
        __m128 best = a;
        best = select4(max_pool_takes4(b, best), b, best);
        best = select4(max_pool_takes4(c, best), c, best);
        best = select4(max_pool_takes4(d, best), d, best);
        _mm_storeu_ps(out_row + ox, best);
      }
#endif
      for (; ox < out_w; ++ox) {
        const float a = row0[2 * ox], b = row0[2 * ox + 1];
        const float c = row1[2 * ox], d = row1[2 * ox + 1];
        float best = a;
        best = max_pool_takes(b, best) ? b : best;
        best = max_pool_takes(c, best) ? c : best;
        best = max_pool_takes(d, best) ? d : best;
        out_row[ox] = best;
      }
    }
  }
}

// dX of the window above: each dY element added at its window's winning tap
// (dX is zeroed first; the windows do not overlap, so the SSE path stores
// 0 + dY at the winner and 0 elsewhere, the generic kernel's sums exactly).
void max_pool_grad_2x2_stride_2(const float *dy, const float *x, float *dx, int64_t planes,
                                int64_t h, int64_t wd, int64_t out_h, int64_t out_w) {
  for (int64_t plane = 0; plane < planes; ++plane) {
    const float *src = x + plane * h * wd;
    const float *g = dy + plane * out_h * out_w;
    float *dst = dx + plane * h * wd;
    for (int64_t oy = 0; oy < out_h; ++oy) {
      const int64_t base = 2 * oy * wd;
      int64_t ox = 0;
#if defined(__SSE2__)
      const __m128 zero = _mm_setzero_ps();
      for (; ox + 4 <= out_w; ox += 4) {
        __m128 a, b, c, d;
        deinterleave8(src + base + 2 * ox, &a, &b);
        deinterleave8(src + base + wd + 2 * ox, &c, &d);
        // One-hot masks of the winning tap, in the generic kernel's scan order.
        __m128 best = a;
        __m128 take_b = max_pool_takes4(b, best);
        best = select4(take_b, b, best);
        __m128 take_c = max_pool_takes4(c, best);
        best = select4(take_c, c, best);
        const __m128 take_d = max_pool_takes4(d, best);
        take_c = _mm_andnot_ps(take_d, take_c);
        take_b = _mm_andnot_ps(_mm_or_ps(take_c, take_d), take_b);
        const __m128 take_a = _mm_andnot_ps(_mm_or_ps(_mm_or_ps(take_b, take_c), take_d),
                                            _mm_castsi128_ps(_mm_set1_epi32(-1)));
        const __m128 grad = _mm_add_ps(zero, _mm_loadu_ps(g + oy * out_w + ox));
        const __m128 ga = _mm_and_ps(take_a, grad), gb = _mm_and_ps(take_b, grad);
        const __m128 gc = _mm_and_ps(take_c, grad), gd = _mm_and_ps(take_d, grad);
        float *row0 = dst + base + 2 * ox;
        float *row1 = row0 + wd;
        _mm_storeu_ps(row0, _mm_unpacklo_ps(ga, gb));
        _mm_storeu_ps(row0 + 4, _mm_unpackhi_ps(ga, gb));
        _mm_storeu_ps(row1, _mm_unpacklo_ps(gc, gd));
        _mm_storeu_ps(row1 + 4, _mm_unpackhi_ps(gc, gd));
      }
#endif
      for (; ox < out_w; ++ox) {
        const int64_t i0 = base + 2 * ox, i1 = i0 + 1, i2 = i0 + wd, i3 = i2 + 1;
        float best = src[i0];
        int64_t index = i0;
        if (max_pool_takes(src[i1], best)) best = src[i1], index = i1;
        if (max_pool_takes(src[i2], best)) best = src[i2], index = i2;
        if (max_pool_takes(src[i3], best)) best = src[i3], index = i3;
        dst[index] += g[oy * out_w + ox];
      }
    }
  }
}

// The taps k in [0, kernel) of a window starting at `start` (stride already
// applied, padding subtracted) with dilation `dilation` that land inside
// [0, size): [first, last). Clipping once per window keeps the tap loops free
// of bounds checks.
inline std::pair<int64_t, int64_t> valid_taps(int64_t start, int64_t kernel, int64_t dilation,
                                              int64_t size) {
  const int64_t first = start >= 0 ? 0 : (-start + dilation - 1) / dilation;
  const int64_t last =
      size - start <= 0 ? 0 : std::min(kernel, (size - start + dilation - 1) / dilation);
  return {first, std::max(first, last)};
}

// Outputs [lo, hi) of one axis whose whole window lies inside the input: there
// the taps need no bounds checks and sit at fixed offsets from the window's
// corner.
struct Interior {
  int64_t lo = 0, hi = 0;
  bool contains(int64_t o) const { return o >= lo && o < hi; }
};
Interior interior(int64_t size, int64_t pad, int64_t stride, int64_t extent, int64_t outputs) {
  Interior r;
  r.lo = std::min(outputs, (pad + stride - 1) / stride);
  r.hi = size - extent + pad < 0 ? 0 : std::min(outputs, (size - extent + pad) / stride + 1);
  r.hi = std::max(r.hi, r.lo);
  return r;
}
// The taps' offsets from a window's corner, in window order (rows, then columns).
std::vector<int64_t> tap_offsets(const Window &w, int64_t row_size) {
  std::vector<int64_t> offsets;
  for (int64_t ky = 0; ky < w.kernel_h; ++ky)
    for (int64_t kx = 0; kx < w.kernel_w; ++kx)
      offsets.push_back(ky * w.dilation_h * row_size + kx * w.dilation_w);
  return offsets;
}

// Max pooling of the interior outputs [first, last) of one output row whose
// windows start at `corner` (the first output's) and `stride` apart: the taps
// in window order with the generic rule (a later tap wins when strictly
// larger, or NaN), four outputs at a time without branches, so the results
// and the picked positions are bitwise the generic kernels'. `picked` (may be
// null) receives each output's chosen offset from `base`.
void max_pool_row(const float *base, int64_t corner, int64_t stride,
                  const std::vector<int64_t> &taps, int64_t count, float *out, int32_t *picked) {
  int64_t o = 0;
#if defined(__SSE2__)
  for (; o + 4 <= count; o += 4) {
    const int64_t c = corner + o * stride;
    auto load4 = [&](int64_t at) {
      const float *p = base + c + at;
      return _mm_set_ps(p[3 * stride], p[2 * stride], p[stride], p[0]);
    };
    __m128 best = load4(taps[0]);
    __m128i where = _mm_set_epi32(static_cast<int32_t>(c + taps[0] + 3 * stride),
                                  static_cast<int32_t>(c + taps[0] + 2 * stride),
                                  static_cast<int32_t>(c + taps[0] + stride),
                                  static_cast<int32_t>(c + taps[0]));
    for (size_t t = 1; t < taps.size(); ++t) {
      const __m128 v = load4(taps[t]);
      const __m128 take = max_pool_takes4(v, best);
      best = select4(take, v, best);
      if (picked != nullptr) {
        const __m128i at = _mm_set_epi32(static_cast<int32_t>(c + taps[t] + 3 * stride),
                                         static_cast<int32_t>(c + taps[t] + 2 * stride),
                                         static_cast<int32_t>(c + taps[t] + stride),
                                         static_cast<int32_t>(c + taps[t]));
        const __m128i mask = _mm_castps_si128(take);
        where = _mm_or_si128(_mm_and_si128(mask, at), _mm_andnot_si128(mask, where));
      }
    }
    if (out != nullptr) _mm_storeu_ps(out + o, best);
    if (picked != nullptr) _mm_storeu_si128(reinterpret_cast<__m128i *>(picked + o), where);
  }
#endif
  for (; o < count; ++o) {
    const int64_t c = corner + o * stride;
    int64_t best_at = c + taps[0];
    float best = base[best_at];
    for (size_t t = 1; t < taps.size(); ++t) {
      const float v = base[c + taps[t]];
      if (max_pool_takes(v, best)) best = v, best_at = c + taps[t];
    }
    if (out != nullptr) out[o] = best;
    if (picked != nullptr) picked[o] = static_cast<int32_t>(best_at);
  }
}

template <bool kMax> Status pool_kernel(const KernelContext &context) {
  RETURN_IF_ERROR(require_f32(context, {0}));
  AttrReader attrs = context.attrs();
  ASSIGN_OR_RETURN(Window w, read_window(context.def, attrs));
  bool include_pad = false;
  if constexpr (!kMax) {
    ASSIGN_OR_RETURN(include_pad, read_flag(context.def, attrs, "count_include_pad"));
  }
  const ConstTensorView &x = context.inputs[0];
  const TensorView &y = context.outputs[0];
  const int64_t planes = x.shape()[0] * x.shape()[1];
  const int64_t h = x.shape()[2], wd = x.shape()[3];
  const int64_t out_h = y.shape()[2], out_w = y.shape()[3];
  const float *in = x.as<float>();
  float *out = y.as<float>();
  const Interior rows = interior(h, w.pad_top, w.stride_h, w.extent_h(), out_h);
  const Interior cols = interior(wd, w.pad_left, w.stride_w, w.extent_w(), out_w);
  const std::vector<int64_t> taps = tap_offsets(w, wd);
  if constexpr (kMax) {
    if (is_plain_2x2_stride_2(w, h, wd, out_h, out_w)) {
      max_pool_2x2_stride_2(in, out, planes, h, wd, out_h, out_w);
      return Status::ok();
    }
  }
  // Planes split over the CPU threads (each plane's arithmetic is the same).
  cpu::parallel_for_items(planes, h * wd, [&](int64_t first, int64_t last) {
    for (int64_t plane = first; plane < last; ++plane) {
      const float *src = in + plane * h * wd;
      float *dst = out + plane * out_h * out_w;
      for (int64_t oy = 0; oy < out_h; ++oy) {
        const int64_t y0 = oy * w.stride_h - w.pad_top;
        if (kMax && rows.contains(oy) && cols.hi > cols.lo)
          // The windows inside the input, without bounds checks.
          max_pool_row(src, y0 * wd + cols.lo * w.stride_w - w.pad_left, w.stride_w, taps,
                       cols.hi - cols.lo, dst + oy * out_w + cols.lo, nullptr);
        for (int64_t ox = 0; ox < out_w; ++ox) {
          const int64_t x0 = ox * w.stride_w - w.pad_left;
          if constexpr (kMax) {
            if (rows.contains(oy) && cols.contains(ox)) continue;
            // Padding acts as -inf: taps outside the input are skipped. NaN wins.
            float best = -std::numeric_limits<float>::infinity();
            const auto [ky0, ky1] = valid_taps(y0, w.kernel_h, w.dilation_h, h);
            const auto [kx0, kx1] = valid_taps(x0, w.kernel_w, w.dilation_w, wd);
            for (int64_t ky = ky0; ky < ky1; ++ky) {
              const float *row = src + (y0 + ky * w.dilation_h) * wd + x0;
              for (int64_t kx = kx0; kx < kx1; ++kx) {
                const float v = row[kx * w.dilation_w];
                best = (v > best || v != v) ? v : best;
              }
            }
            dst[oy * out_w + ox] = best;
          } else {
            // The window clipped to the padded input counts with count_include_pad
            // (ceil mode's overhang past the end padding never counts); clipped to
            // the input itself without.
            const int64_t y1 = std::min(y0 + w.kernel_h, h + w.pad_bottom);
            const int64_t x1 = std::min(x0 + w.kernel_w, wd + w.pad_right);
            const int64_t padded_count = (y1 - y0) * (x1 - x0);
            const int64_t ys = std::max<int64_t>(y0, 0), ye = std::min(y1, h);
            const int64_t xs = std::max<int64_t>(x0, 0), xe = std::min(x1, wd);
            double sum = 0;
            for (int64_t iy = ys; iy < ye; ++iy)
              for (int64_t ix = xs; ix < xe; ++ix)
                sum += src[iy * wd + ix];
            const int64_t count = include_pad ? padded_count : (ye - ys) * (xe - xs);
            dst[oy * out_w + ox] = static_cast<float>(sum / static_cast<double>(count));
          }
        }
      }
    }
  });
  return Status::ok();
}

// ---------------------------------------------------------------------------
// GlobalAveragePool

Result<TypeList> infer_global_average_pool(const Node &, const OpDef &def,
                                           llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  RETURN_IF_ERROR(expect_rank(def, inputs, 0, 4, "X [N, C, H, W]"));
  const Shape &x = inputs[0].shape;
  return TypeList{TensorType{inputs[0].dtype, Shape{x[0], x[1], 1, 1}}};
}

OpCost global_average_pool_cost(const Node &, const OpDef &, llvm::ArrayRef<TensorType> inputs,
                                llvm::ArrayRef<TensorType> outputs) {
  return io_cost(inputs, outputs, elements(inputs[0]));
}

Status global_average_pool_kernel(const KernelContext &context) {
  RETURN_IF_ERROR(require_f32(context, {0}));
  const ConstTensorView &x = context.inputs[0];
  const int64_t planes = x.shape()[0] * x.shape()[1];
  const int64_t size = x.shape()[2] * x.shape()[3];
  const float *in = x.as<float>();
  float *out = context.outputs[0].as<float>();
  for (int64_t p = 0; p < planes; ++p) {
    double sum = 0;
    for (int64_t i = 0; i < size; ++i)
      sum += in[p * size + i];
    out[p] = size == 0 ? 0.0f : static_cast<float>(sum / static_cast<double>(size));
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------
// BatchNormalization (inference): Y = (X - mean) / sqrt(var + epsilon) * scale + bias
// per channel (dim 1). `momentum` is only read by make_training, which adds the
// running-statistics updates (see BatchNormStats below).

Result<TypeList> infer_batch_norm(const Node &node, const OpDef &def,
                                  llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  RETURN_IF_ERROR(expect_positive_epsilon(node, def));
  RETURN_IF_ERROR(read_flag(def, AttrReader(node, def), "training").status());
  const double momentum = AttrReader(node, def).get_float("momentum");
  if (!(momentum >= 0.0 && momentum <= 1.0))
    return invalid_argument(def.name, ": attribute 'momentum' = ", momentum, " is outside [0, 1]");
  RETURN_IF_ERROR(expect_same_dtype(def, inputs));
  const TensorType &x = inputs[0];
  if (x.rank() < 2)
    return invalid_argument(def.name, ": input 0 (X) must have rank >= 2 [N, C, ...], got ",
                            describe(x));
  static constexpr std::string_view kNames[] = {"X", "scale", "bias", "mean", "var"};
  for (size_t i = 1; i < 5; ++i)
    if (inputs[i].rank() != 1 || inputs[i].shape[0] != x.shape[1])
      return invalid_argument(def.name, ": input ", i, " (", kNames[i], ") ", describe(inputs[i]),
                              " must be [C] = [", x.shape[1], "] (X ", describe(x), ")");
  return TypeList{x};
}

OpCost batch_norm_cost(const Node &, const OpDef &, llvm::ArrayRef<TensorType> inputs,
                       llvm::ArrayRef<TensorType> outputs) {
  return io_cost(inputs, outputs, 2.0 * elements(inputs[0]));
}

// Mean and 1/sqrt(biased variance + epsilon) of channel c, two passes in double.
// Per-channel sums over the rows of one channel: each block of kBlockSum
// elements is summed in f32 across kLanes independent lanes (the compiler keeps
// them in one vector register), and the block totals in double. The order is
// fixed, so results are the same run to run; a lane adds kBlockSum / kLanes
// terms in f32 before its total joins the double sum.
constexpr int kLanes = 8;
constexpr int64_t kBlockSum = 256;

// The sum of f(row[i], other[i]) over a row.
template <typename F> double row_sum(const float *row, const float *other, int64_t inner, F f) {
  double total = 0;
  int64_t i = 0;
  for (; i + kBlockSum <= inner; i += kBlockSum) {
    float lanes[kLanes] = {};
    for (int64_t j = 0; j < kBlockSum; j += kLanes)
      for (int l = 0; l < kLanes; ++l)
        lanes[l] += f(row[i + j + l], other[i + j + l]);
    double block = 0;
    for (float lane : lanes)
      block += lane;
    total += block;
  }
  for (; i < inner; ++i)
    total += static_cast<double>(f(row[i], other[i]));
  return total;
}

// The sum of x over channel c of X [N, C, inner].
double channel_sum(const float *x, int64_t batch, int64_t channels, int64_t inner, int64_t c) {
  double sum = 0;
  for (int64_t n = 0; n < batch; ++n) {
    const float *row = x + (n * channels + c) * inner;
    sum += row_sum(row, row, inner, [](float v, float) { return v; });
  }
  return sum;
}

// The sum of (x - mean)^2 over channel c. The difference is taken from the
// f32 mean m (exact near the mean) and corrected for mean - m exactly:
// sum (x - mean)^2 = sum (x - m)^2 - count (mean - m)^2.
double channel_squares(const float *x, int64_t batch, int64_t channels, int64_t inner, int64_t c,
                       double mean) {
  const float m = static_cast<float>(mean);
  double sum = 0;
  for (int64_t n = 0; n < batch; ++n) {
    const float *row = x + (n * channels + c) * inner;
    sum += row_sum(row, row, inner, [m](float v, float) {
      const float d = v - m;
      return d * d;
    });
  }
  const double offset = mean - static_cast<double>(m);
  return std::max(0.0, sum - static_cast<double>(batch * inner) * offset * offset);
}

// The batch mean and 1 / sqrt(biased var + epsilon) of channel c, two passes in
// double.
std::pair<double, double> channel_stats(const float *x, int64_t batch, int64_t channels,
                                        int64_t inner, int64_t c, double epsilon) {
  const double count = static_cast<double>(batch * inner);
  const double mean = count == 0 ? 0.0 : channel_sum(x, batch, channels, inner, c) / count;
  const double var = count == 0 ? 0.0 : channel_squares(x, batch, channels, inner, c, mean) / count;
  return {mean, 1.0 / std::sqrt(var + epsilon)};
}

// body(c) for every channel c of X [batch, channels, inner], channels split
// over the CPU threads (each channel's arithmetic is the same on any number).
template <typename Body>
void for_channels(int64_t batch, int64_t channels, int64_t inner, Body body) {
  cpu::parallel_for_items(channels, batch * inner, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c)
      body(c);
  });
}

Status batch_norm_kernel(const KernelContext &context) {
  RETURN_IF_ERROR(require_f32(context, {0, 1, 2, 3, 4}));
  const double epsilon = context.attrs().get_float("epsilon");
  const ConstTensorView &x = context.inputs[0];
  const int64_t batch = x.shape()[0], channels = x.shape()[1];
  const int64_t inner = num_elements(x.shape().drop_front(2));
  const float *scale = context.inputs[1].as<float>();
  const float *bias = context.inputs[2].as<float>();
  const float *mean = context.inputs[3].as<float>();
  const float *var = context.inputs[4].as<float>();
  const float *in = x.as<float>();
  float *out = context.outputs[0].as<float>();
  ASSIGN_OR_RETURN(bool training, read_flag(context.def, context.attrs(), "training"));
  for_channels(batch, channels, inner, [&](int64_t c) {
    // Fold the normalization into one multiply-add per element. Training uses the
    // batch's own statistics instead of the mean and var inputs.
    double channel_mean = mean[c];
    double rstd = 1.0 / std::sqrt(static_cast<double>(var[c]) + epsilon);
    if (training)
      std::tie(channel_mean, rstd) = channel_stats(in, batch, channels, inner, c, epsilon);
    // X is centred in f32 first (x - m is exact near the mean): a channel
    // whose mean is large against its spread would otherwise lose the
    // normalized value in x * mul + add, two large terms that nearly cancel.
    const double factor = scale[c] * rstd;
    const float m = static_cast<float>(channel_mean);
    const float mul = static_cast<float>(factor);
    const float add =
        static_cast<float>(bias[c] - (channel_mean - static_cast<double>(m)) * factor);
    for (int64_t n = 0; n < batch; ++n) {
      const int64_t base = (n * channels + c) * inner;
      for (int64_t i = 0; i < inner; ++i)
        out[base + i] = (in[base + i] - m) * mul + add;
    }
  });
  return Status::ok();
}

// ---------------------------------------------------------------------------
// BatchNormStats(X) -> mean, unbiased var, each [C]: the batch statistics a
// training step folds into BatchNormalization's running mean and var
// (passes/make_training.cc), PyTorch style: the running variance takes the
// unbiased (n / (n - 1)) variance while the normalization uses the biased one.

Result<TypeList> infer_batch_norm_stats(const Node &, const OpDef &def,
                                        llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  const TensorType &x = inputs[0];
  if (x.rank() < 2)
    return invalid_argument(def.name, ": input 0 (X) must have rank >= 2 [N, C, ...], got ",
                            describe(x));
  const int64_t count = x.shape[0] * num_elements(llvm::ArrayRef<int64_t>(x.shape).drop_front(2));
  if (count < 2)
    return invalid_argument(def.name, ": X ", describe(x), " has ", count,
                            " value(s) per channel; the unbiased variance needs "
                            "more than one (N times the spatial size)");
  TensorType stat{x.dtype, {x.shape[1]}};
  return TypeList{stat, stat};
}

OpCost batch_norm_stats_cost(const Node &, const OpDef &, llvm::ArrayRef<TensorType> inputs,
                             llvm::ArrayRef<TensorType> outputs) {
  return io_cost(inputs, outputs, 3.0 * elements(inputs[0]));
}

Status batch_norm_stats_kernel(const KernelContext &context) {
  RETURN_IF_ERROR(require_f32(context, {0}));
  const ConstTensorView &x = context.inputs[0];
  const int64_t batch = x.shape()[0], channels = x.shape()[1];
  const int64_t inner = num_elements(x.shape().drop_front(2));
  const double count = static_cast<double>(batch * inner);
  const float *in = x.as<float>();
  float *mean_out = context.outputs[0].as<float>();
  float *var_out = context.outputs[1].as<float>();
  for_channels(batch, channels, inner, [&](int64_t c) {
    // The same two passes in double as channel_stats.
    const double mean = channel_sum(in, batch, channels, inner, c) / count;
    const double squares = channel_squares(in, batch, channels, inner, c, mean);
    mean_out[c] = static_cast<float>(mean);
    var_out[c] = static_cast<float>(squares / (count - 1.0));
  });
  return Status::ok();
}

// ---------------------------------------------------------------------------
// SoftmaxCrossEntropy: loss = logsumexp(logits) - logits[label] per row.

// Labels [...] (i32 or i64) for logits [..., classes] of rank >= 1.
Status expect_labels_of(const OpDef &def, const TensorType &logits, const TensorType &labels) {
  if (logits.rank() < 1)
    return invalid_argument(def.name, ": input 0 (logits) must have rank >= 1 [..., C], got ",
                            describe(logits));
  if (labels.dtype != DType::kI32 && labels.dtype != DType::kI64)
    return invalid_argument(def.name, ": input 1 (labels) must be i32 or i64, got ",
                            describe(labels));
  llvm::ArrayRef<int64_t> expected = llvm::ArrayRef<int64_t>(logits.shape).drop_back();
  if (llvm::ArrayRef<int64_t>(labels.shape) != expected)
    return invalid_argument(def.name, ": input 1 (labels) ", describe(labels),
                            " must have the logits' shape without the last dim, ",
                            shape_to_string(expected), " (logits ", describe(logits), ")");
  return Status::ok();
}

Result<TypeList> infer_softmax_cross_entropy(const Node &node, const OpDef &def,
                                             llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  const TensorType &logits = inputs[0], &labels = inputs[1];
  RETURN_IF_ERROR(expect_labels_of(def, logits, labels));
  ASSIGN_OR_RETURN(Reduction reduction, read_reduction(def, AttrReader(node, def)));
  if (reduction == Reduction::kNone) return TypeList{TensorType{logits.dtype, labels.shape}};
  return TypeList{TensorType{logits.dtype, Shape{}}};
}

OpCost softmax_cross_entropy_cost(const Node &, const OpDef &, llvm::ArrayRef<TensorType> inputs,
                                  llvm::ArrayRef<TensorType> outputs) {
  return io_cost(inputs, outputs, 4.0 * elements(inputs[0]));
}

// The labels of a cross entropy's rows (input `index`, i32 or i64) as i64,
// each checked against all `classes` classes unless it is `ignore_index`.
Result<std::vector<int64_t>> read_labels(const KernelContext &context, size_t index,
                                         int64_t classes, int64_t ignore_index) {
  const ConstTensorView &t = context.inputs[index];
  std::vector<int64_t> labels(static_cast<size_t>(t.num_elements()));
  for (size_t r = 0; r < labels.size(); ++r) {
    const int64_t label = t.dtype() == DType::kI32 ? t.as<int32_t>()[r] : t.as<int64_t>()[r];
    if (label != ignore_index && (label < 0 || label >= classes))
      return out_of_range(context.def.name, ": label ", label, " at position ", r,
                          " is outside [0, ", classes, ") for ", classes,
                          " classes and is not ignore_index (", ignore_index, ")");
    labels[r] = label;
  }
  return labels;
}

// Writes the per-row losses loss(r) reduced: rows labelled `ignore_index` add
// nothing (0 with "none"), and the mean over no counted row is 0, not NaN.
template <typename RowLoss>
void reduce_row_losses(const std::vector<int64_t> &labels, int64_t ignore_index,
                       Reduction reduction, float *out, RowLoss loss) {
  double total = 0;
  int64_t counted = 0;
  for (size_t r = 0; r < labels.size(); ++r) {
    if (labels[r] == ignore_index) {
      if (reduction == Reduction::kNone) out[r] = 0.0f;
      continue;
    }
    const double value = loss(r);
    if (reduction == Reduction::kNone) out[r] = static_cast<float>(value);
    total += value;
    ++counted;
  }
  if (reduction == Reduction::kSum) out[0] = static_cast<float>(total);
  if (reduction == Reduction::kMean)
    out[0] = counted == 0 ? 0.0f : static_cast<float>(total / static_cast<double>(counted));
}

// What scales row r's gradient: dLoss[r] ("none"), dLoss ("sum"), or dLoss over
// the counted rows ("mean"); 0 for rows labelled ignore_index.
struct RowWeights {
  Reduction reduction;
  const float *dloss;
  double shared = 0;
  double operator()(size_t r) const { return reduction == Reduction::kNone ? dloss[r] : shared; }
};
RowWeights row_weights(const std::vector<int64_t> &labels, int64_t ignore_index,
                       Reduction reduction, const float *dloss) {
  RowWeights w{reduction, dloss};
  const auto counted = std::count_if(labels.begin(), labels.end(),
                                     [&](int64_t label) { return label != ignore_index; });
  if (reduction == Reduction::kSum) w.shared = dloss[0];
  if (reduction == Reduction::kMean && counted > 0)
    w.shared = static_cast<double>(dloss[0]) / static_cast<double>(counted);
  return w;
}

Status softmax_cross_entropy_kernel(const KernelContext &context) {
  RETURN_IF_ERROR(require_f32(context, {0}));
  AttrReader attrs = context.attrs();
  ASSIGN_OR_RETURN(Reduction reduction, read_reduction(context.def, attrs));
  const int64_t ignore_index = attrs.get_int("ignore_index");
  const int64_t classes = context.inputs[0].shape().back();
  ASSIGN_OR_RETURN(const std::vector<int64_t> labels,
                   read_labels(context, 1, classes, ignore_index));
  const float *x = context.inputs[0].as<float>();
  reduce_row_losses(labels, ignore_index, reduction, context.outputs[0].as<float>(), [&](size_t r) {
    const float *row = x + static_cast<int64_t>(r) * classes;
    float max = row[0];
    for (int64_t c = 1; c < classes; ++c)
      max = std::max(max, row[c]);
    double sum = 0;
    for (int64_t c = 0; c < classes; ++c)
      sum += std::exp(static_cast<double>(row[c]) - max);
    return max + std::log(sum) - row[labels[r]];
  });
  return Status::ok();
}

// ---------------------------------------------------------------------------
// MseLoss: (prediction - target)^2, reduced.

Result<TypeList> infer_mse_loss(const Node &node, const OpDef &def,
                                llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  RETURN_IF_ERROR(expect_same_dtype(def, inputs));
  if (inputs[0].shape != inputs[1].shape)
    return invalid_argument(def.name, ": input 0 (prediction) ", describe(inputs[0]),
                            " and input 1 (target) ", describe(inputs[1]),
                            " must have the same shape");
  ASSIGN_OR_RETURN(Reduction reduction, read_reduction(def, AttrReader(node, def)));
  if (reduction == Reduction::kNone) return TypeList{inputs[0]};
  return TypeList{TensorType{inputs[0].dtype, Shape{}}};
}

OpCost mse_loss_cost(const Node &, const OpDef &, llvm::ArrayRef<TensorType> inputs,
                     llvm::ArrayRef<TensorType> outputs) {
  return io_cost(inputs, outputs, 3.0 * elements(inputs[0]));
}

Status mse_loss_kernel(const KernelContext &context) {
  RETURN_IF_ERROR(require_f32(context, {0, 1}));
  ASSIGN_OR_RETURN(Reduction reduction, read_reduction(context.def, context.attrs()));
  const int64_t count = context.inputs[0].num_elements();
  const float *p = context.inputs[0].as<float>();
  const float *t = context.inputs[1].as<float>();
  float *out = context.outputs[0].as<float>();
  double total = 0;
  for (int64_t i = 0; i < count; ++i) {
    const float d = p[i] - t[i];
    if (reduction == Reduction::kNone)
      out[i] = d * d;
    else
      total += static_cast<double>(d) * d;
  }
  if (reduction == Reduction::kSum) out[0] = static_cast<float>(total);
  if (reduction == Reduction::kMean)
    out[0] = count == 0 ? 0.0f : static_cast<float>(total / static_cast<double>(count));
  return Status::ok();
}

// ---------------------------------------------------------------------------
// Backward ops. Each computes the gradients of one forward op from the output
// gradient and the forward inputs it needs; all accumulate in a fixed order (in
// double where they reduce), so the same inputs give the same bits.

// Reads a required ints attribute holding a tensor shape of `rank` dims.
Result<Shape> read_shape_attr(const OpDef &def, const AttrReader &attrs, std::string_view name,
                              int64_t rank) {
  std::vector<int64_t> values = attrs.get_ints(name);
  if (static_cast<int64_t>(values.size()) != rank)
    return invalid_argument(def.name, ": attribute '", name, "' must have ", rank, " values, got ",
                            values.size());
  for (int64_t v : values)
    if (v < 0)
      return invalid_argument(def.name, ": attribute '", name, "' values must be >= 0, got ", v);
  return Shape(values.begin(), values.end());
}

Status expect_type(const OpDef &def, llvm::ArrayRef<TensorType> inputs, size_t index,
                   const TensorType &expected, std::string_view what) {
  if (!(inputs[index] == expected))
    return invalid_argument(def.name, ": input ", index, " (", what, ") ", describe(inputs[index]),
                            " must be ", describe(expected));
  return Status::ok();
}

// LayerNormGrad(dY, X, scale) -> dX, dScale, dBias.

Result<TypeList> infer_layer_norm_grad(const Node &node, const OpDef &def,
                                       llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  RETURN_IF_ERROR(expect_positive_epsilon(node, def));
  RETURN_IF_ERROR(expect_same_dtype(def, inputs));
  const TensorType &x = inputs[1];
  RETURN_IF_ERROR(expect_type(def, inputs, 0, x, "dY"));
  ASSIGN_OR_RETURN(int64_t axis,
                   normalize_axis(AttrReader(node, def).get_int("axis"), x.rank(), "axis"));
  TensorType scale{x.dtype, Shape(x.shape.begin() + axis, x.shape.end())};
  RETURN_IF_ERROR(expect_type(def, inputs, 2, scale, "scale"));
  return TypeList{x, scale, scale};
}

OpCost layer_norm_grad_cost(const Node &, const OpDef &, llvm::ArrayRef<TensorType> inputs,
                            llvm::ArrayRef<TensorType> outputs) {
  return io_cost(inputs, outputs, 14.0 * elements(inputs[1]));
}

Status layer_norm_grad_kernel(const KernelContext &context) {
  RETURN_IF_ERROR(require_f32(context, {0, 1, 2}));
  AttrReader attrs = context.attrs();
  const ConstTensorView &x = context.inputs[1];
  ASSIGN_OR_RETURN(int64_t axis, normalize_axis(attrs.get_int("axis"), x.type->rank(), "axis"));
  const double epsilon = attrs.get_float("epsilon");
  const int64_t size = num_elements(x.shape().drop_front(axis));
  const int64_t rows = size == 0 ? 0 : x.num_elements() / size;
  const float *dy = context.inputs[0].as<float>();
  const float *in = x.as<float>();
  const float *scale = context.inputs[2].as<float>();
  float *dx = context.outputs[0].as<float>();
  std::vector<double> dscale(static_cast<size_t>(size), 0.0), dbias(static_cast<size_t>(size), 0.0);
  std::vector<double> xhat(static_cast<size_t>(size));
  for (int64_t r = 0; r < rows; ++r) {
    const float *row = in + r * size;
    const float *g = dy + r * size;
    // The forward's statistics, recomputed the same way (two passes in double).
    double sum = 0;
    for (int64_t i = 0; i < size; ++i)
      sum += row[i];
    const double mean = sum / static_cast<double>(size);
    double squares = 0;
    for (int64_t i = 0; i < size; ++i) {
      const double d = row[i] - mean;
      squares += d * d;
    }
    const double rstd = 1.0 / std::sqrt(squares / static_cast<double>(size) + epsilon);
    // dX = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dY * scale.
    double sum_g = 0, sum_gx = 0;
    for (int64_t i = 0; i < size; ++i) {
      const size_t k = static_cast<size_t>(i);
      xhat[k] = (row[i] - mean) * rstd;
      const double gi = static_cast<double>(g[i]) * scale[i];
      sum_g += gi;
      sum_gx += gi * xhat[k];
      dscale[k] += static_cast<double>(g[i]) * xhat[k];
      dbias[k] += g[i];
    }
    const double mean_g = sum_g / static_cast<double>(size);
    const double mean_gx = sum_gx / static_cast<double>(size);
    for (int64_t i = 0; i < size; ++i) {
      const double gi = static_cast<double>(g[i]) * scale[i];
      dx[r * size + i] =
          static_cast<float>(rstd * (gi - mean_g - xhat[static_cast<size_t>(i)] * mean_gx));
    }
  }
  float *dscale_out = context.outputs[1].as<float>();
  float *dbias_out = context.outputs[2].as<float>();
  for (int64_t i = 0; i < size; ++i) {
    dscale_out[i] = static_cast<float>(dscale[static_cast<size_t>(i)]);
    dbias_out[i] = static_cast<float>(dbias[static_cast<size_t>(i)]);
  }
  return Status::ok();
}

// Conv2dGradInput(dY, W) -> dX and Conv2dGradWeight(dY, X) -> dW. The shape of
// the missing forward operand comes from an attribute.

Result<cpu::Conv2dParams> conv_grad_params(const OpDef &def, const AttrReader &attrs,
                                           llvm::ArrayRef<TensorType> inputs, bool grad_input) {
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  RETURN_IF_ERROR(expect_same_dtype(def, inputs));
  const DType dtype = inputs[0].dtype;
  llvm::SmallVector<TensorType, 2> forward;
  if (grad_input) {
    ASSIGN_OR_RETURN(Shape x, read_shape_attr(def, attrs, "input_shape", 4));
    forward = {TensorType{dtype, x}, inputs[1]};
  } else {
    ASSIGN_OR_RETURN(Shape w, read_shape_attr(def, attrs, "weight_shape", 4));
    forward = {inputs[1], TensorType{dtype, w}};
  }
  ASSIGN_OR_RETURN(cpu::Conv2dParams p, conv_params(def, attrs, forward));
  TensorType dy{dtype, Shape{p.batch, p.out_channels, p.out_h, p.out_w}};
  RETURN_IF_ERROR(expect_type(def, inputs, 0, dy, "dY"));
  return p;
}

template <bool kGradInput>
Result<TypeList> infer_conv_grad(const Node &node, const OpDef &def,
                                 llvm::ArrayRef<TensorType> inputs) {
  AttrReader attrs(node, def);
  ASSIGN_OR_RETURN(cpu::Conv2dParams p, conv_grad_params(def, attrs, inputs, kGradInput));
  (void)p;
  const char *name = kGradInput ? "input_shape" : "weight_shape";
  std::vector<int64_t> shape = attrs.get_ints(name);
  return TypeList{TensorType{inputs[0].dtype, Shape(shape.begin(), shape.end())}};
}

// The same multiply-adds as the forward convolution.
template <bool kGradInput>
OpCost conv_grad_cost(const Node &node, const OpDef &def, llvm::ArrayRef<TensorType> inputs,
                      llvm::ArrayRef<TensorType> outputs) {
  auto p = conv_grad_params(def, AttrReader(node, def), inputs, kGradInput);
  if (!p) return io_cost(inputs, outputs, 0);
  double outputs_count = static_cast<double>(p->batch) * static_cast<double>(p->out_channels) *
                         static_cast<double>(p->out_h) * static_cast<double>(p->out_w);
  double per_output = static_cast<double>(p->in_channels / p->group) *
                      static_cast<double>(p->kernel_h) * static_cast<double>(p->kernel_w);
  return io_cost(inputs, outputs, 2.0 * outputs_count * per_output);
}

template <bool kGradInput> Status conv_grad_kernel(const KernelContext &context) {
  RETURN_IF_ERROR(require_f32(context, {0, 1}));
  ASSIGN_OR_RETURN(cpu::Conv2dParams p, conv_grad_params(context.def, context.attrs(),
                                                         input_types(context), kGradInput));
  const float *dy = context.inputs[0].as<float>();
  const float *other = context.inputs[1].as<float>();
  float *out = context.outputs[0].as<float>();
  if constexpr (kGradInput) return cpu::conv2d_backward_data(p, dy, other, out);
  return cpu::conv2d_backward_weights(p, dy, other, out);
}

// MaxPool2dGrad(dY, X) -> dX: each output's gradient goes to the input position
// the forward picked (the first maximum in window order; padding never wins).

Result<TypeList> infer_max_pool_grad(const Node &node, const OpDef &def,
                                     llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_same_dtype(def, inputs));
  ASSIGN_OR_RETURN(TypeList forward, infer_pool(node, def, inputs.drop_front()));
  RETURN_IF_ERROR(expect_type(def, inputs, 0, forward[0], "dY"));
  return TypeList{inputs[1]};
}

// AveragePool2dGrad(dY) -> dX and GlobalAveragePoolGrad(dY) -> dX, X's shape
// from the attribute input_shape.

Result<TypeList> infer_average_pool_grad(const Node &node, const OpDef &def,
                                         llvm::ArrayRef<TensorType> inputs) {
  ASSIGN_OR_RETURN(Shape shape, read_shape_attr(def, AttrReader(node, def), "input_shape", 4));
  TensorType x{inputs[0].dtype, shape};
  ASSIGN_OR_RETURN(TypeList forward, infer_pool(node, def, {x}));
  RETURN_IF_ERROR(expect_type(def, inputs, 0, forward[0], "dY"));
  return TypeList{x};
}

OpCost pool_grad_cost(const Node &node, const OpDef &def, llvm::ArrayRef<TensorType> inputs,
                      llvm::ArrayRef<TensorType> outputs) {
  auto w = read_window(def, AttrReader(node, def));
  if (!w) return io_cost(inputs, outputs, 0);
  return io_cost(inputs, outputs,
                 static_cast<double>(w->kernel_h * w->kernel_w) * elements(inputs[0]));
}

template <bool kMax> Status pool_grad_kernel(const KernelContext &context) {
  RETURN_IF_ERROR(require_f32(context, {0, 1}));
  AttrReader attrs = context.attrs();
  ASSIGN_OR_RETURN(Window w, read_window(context.def, attrs));
  bool include_pad = false;
  if constexpr (!kMax) {
    ASSIGN_OR_RETURN(include_pad, read_flag(context.def, attrs, "count_include_pad"));
  }
  const ConstTensorView &dy_view = context.inputs[0];
  const TensorView &dx_view = context.outputs[0];
  const int64_t planes = dx_view.shape()[0] * dx_view.shape()[1];
  const int64_t h = dx_view.shape()[2], wd = dx_view.shape()[3];
  const int64_t out_h = dy_view.shape()[2], out_w = dy_view.shape()[3];
  const float *dy_data = dy_view.as<float>();
  const float *x_data = kMax ? context.inputs[1].as<float>() : nullptr;
  float *dx_data = dx_view.as<float>();
  std::fill(dx_data, dx_data + dx_view.num_elements(), 0.0f);
  const Interior rows = interior(h, w.pad_top, w.stride_h, w.extent_h(), out_h);
  const Interior cols = interior(wd, w.pad_left, w.stride_w, w.extent_w(), out_w);
  const std::vector<int64_t> taps = tap_offsets(w, wd);
  if constexpr (kMax) {
    if (is_plain_2x2_stride_2(w, h, wd, out_h, out_w)) {
      max_pool_grad_2x2_stride_2(dy_data, x_data, dx_data, planes, h, wd, out_h, out_w);
      return Status::ok();
    }
  }
  // Planes split over the CPU threads (each plane's arithmetic is the same).
  cpu::parallel_for_items(planes, h * wd, [&](int64_t first, int64_t last) {
    std::vector<int32_t> picked(static_cast<size_t>(std::max<int64_t>(cols.hi - cols.lo, 0)));
    if (kMax && h * wd > std::numeric_limits<int32_t>::max()) picked.clear(); // offsets too large
    for (int64_t plane = first; plane < last; ++plane) {
      const float *g = dy_data + plane * out_h * out_w;
      float *dst = dx_data + plane * h * wd;
      for (int64_t oy = 0; oy < out_h; ++oy) {
        const int64_t y0 = oy * w.stride_h - w.pad_top;
        const bool fast_row = kMax && rows.contains(oy) && !picked.empty();
        if (fast_row)
          // The windows inside the input: their picked positions first; the
          // gradients are then added in output order, as the generic loop does.
          max_pool_row(x_data + plane * h * wd, y0 * wd + cols.lo * w.stride_w - w.pad_left,
                       w.stride_w, taps, cols.hi - cols.lo, nullptr, picked.data());
        for (int64_t ox = 0; ox < out_w; ++ox) {
          if (fast_row && cols.contains(ox)) {
            dst[picked[static_cast<size_t>(ox - cols.lo)]] += g[oy * out_w + ox];
            continue;
          }
          const int64_t x0 = ox * w.stride_w - w.pad_left;
          const float grad = g[oy * out_w + ox];
          if constexpr (kMax) {
            // The forward's scan: a later tap wins only when strictly larger (or NaN).
            const float *src = x_data + plane * h * wd;
            int64_t best_index = -1;
            float best = -std::numeric_limits<float>::infinity();
            const auto [ky0, ky1] = valid_taps(y0, w.kernel_h, w.dilation_h, h);
            const auto [kx0, kx1] = valid_taps(x0, w.kernel_w, w.dilation_w, wd);
            for (int64_t ky = ky0; ky < ky1; ++ky) {
              const int64_t base = (y0 + ky * w.dilation_h) * wd + x0;
              for (int64_t kx = kx0; kx < kx1; ++kx) {
                const int64_t at = base + kx * w.dilation_w;
                const float v = src[at];
                if (best_index < 0 || v > best || v != v) {
                  best = v;
                  best_index = at;
                }
              }
            }
            if (best_index >= 0) dst[best_index] += grad;
          } else {
            // The forward's divisor, then an equal share to every input in the window.
            const int64_t y1 = std::min(y0 + w.kernel_h, h + w.pad_bottom);
            const int64_t x1 = std::min(x0 + w.kernel_w, wd + w.pad_right);
            const int64_t padded_count = (y1 - y0) * (x1 - x0);
            const int64_t ys = std::max<int64_t>(y0, 0), ye = std::min(y1, h);
            const int64_t xs = std::max<int64_t>(x0, 0), xe = std::min(x1, wd);
            const int64_t count = include_pad ? padded_count : (ye - ys) * (xe - xs);
            if (count <= 0) continue;
            const float share =
                static_cast<float>(static_cast<double>(grad) / static_cast<double>(count));
            for (int64_t iy = ys; iy < ye; ++iy)
              for (int64_t ix = xs; ix < xe; ++ix)
                dst[iy * wd + ix] += share;
          }
        }
      }
    }
  });
  return Status::ok();
}

Result<TypeList> infer_global_average_pool_grad(const Node &node, const OpDef &def,
                                                llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  ASSIGN_OR_RETURN(Shape shape, read_shape_attr(def, AttrReader(node, def), "input_shape", 4));
  TensorType dy{inputs[0].dtype, Shape{shape[0], shape[1], 1, 1}};
  RETURN_IF_ERROR(expect_type(def, inputs, 0, dy, "dY"));
  return TypeList{TensorType{inputs[0].dtype, shape}};
}

Status global_average_pool_grad_kernel(const KernelContext &context) {
  RETURN_IF_ERROR(require_f32(context, {0}));
  const TensorView &dx = context.outputs[0];
  const int64_t planes = dx.shape()[0] * dx.shape()[1];
  const int64_t size = dx.shape()[2] * dx.shape()[3];
  const float *dy = context.inputs[0].as<float>();
  float *out = dx.as<float>();
  for (int64_t p = 0; p < planes; ++p) {
    const float share = static_cast<float>(static_cast<double>(dy[p]) / static_cast<double>(size));
    std::fill(out + p * size, out + (p + 1) * size, share);
  }
  return Status::ok();
}

// BatchNormalizationGrad(dY, X, scale) -> dX, dScale, dBias for the training form
// (statistics of the batch, per channel over N and the spatial dims).

Result<TypeList> infer_batch_norm_grad(const Node &node, const OpDef &def,
                                       llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  RETURN_IF_ERROR(expect_positive_epsilon(node, def));
  RETURN_IF_ERROR(expect_same_dtype(def, inputs));
  const TensorType &x = inputs[1];
  if (x.rank() < 2)
    return invalid_argument(def.name, ": input 1 (X) must have rank >= 2 [N, C, ...], got ",
                            describe(x));
  RETURN_IF_ERROR(expect_type(def, inputs, 0, x, "dY"));
  TensorType channel{x.dtype, Shape{x.shape[1]}};
  RETURN_IF_ERROR(expect_type(def, inputs, 2, channel, "scale"));
  return TypeList{x, channel, channel};
}

OpCost batch_norm_grad_cost(const Node &, const OpDef &, llvm::ArrayRef<TensorType> inputs,
                            llvm::ArrayRef<TensorType> outputs) {
  return io_cost(inputs, outputs, 12.0 * elements(inputs[1]));
}

Status batch_norm_grad_kernel(const KernelContext &context) {
  RETURN_IF_ERROR(require_f32(context, {0, 1, 2}));
  const double epsilon = context.attrs().get_float("epsilon");
  const ConstTensorView &x = context.inputs[1];
  const int64_t batch = x.shape()[0], channels = x.shape()[1];
  const int64_t inner = num_elements(x.shape().drop_front(2));
  const double count = static_cast<double>(batch * inner);
  const float *dy = context.inputs[0].as<float>();
  const float *in = x.as<float>();
  const float *scale = context.inputs[2].as<float>();
  float *dx = context.outputs[0].as<float>();
  float *dscale = context.outputs[1].as<float>();
  float *dbias = context.outputs[2].as<float>();
  for_channels(batch, channels, inner, [&](int64_t c) {
    auto [mean, rstd] = channel_stats(in, batch, channels, inner, c, epsilon);
    // sum(dY) and sum(dY * xhat) = rstd * (sum(dY * (X - m)) - (mean - m) sum(dY)),
    // m the f32 mean, with the blocked sums above.
    const float m = static_cast<float>(mean);
    double sum_g = 0, sum_gd = 0;
    for (int64_t n = 0; n < batch; ++n) {
      const int64_t base = (n * channels + c) * inner;
      sum_g += row_sum(dy + base, dy + base, inner, [](float g, float) { return g; });
      sum_gd += row_sum(dy + base, in + base, inner, [m](float g, float v) { return g * (v - m); });
    }
    sum_gd -= sum_g * (mean - static_cast<double>(m));
    const double sum_gx = sum_gd * rstd;
    dscale[c] = static_cast<float>(sum_gx);
    dbias[c] = static_cast<float>(sum_g);
    if (count == 0) return;
    // dX = scale * rstd * (dY - mean(dY) - xhat * mean(dY * xhat)).
    const double mean_g = sum_g / count, mean_gx = sum_gx / count;
    // dX = a * dY + b * (X - mean) + d, the coefficients folded per channel in
    // double, then one f32 multiply-add chain per element that vectorizes.
    const double factor = static_cast<double>(scale[c]) * rstd;
    const double xcoef = -factor * rstd * mean_gx;
    // X is centred in f32 first (x - m is exact near the mean), so a large
    // mean does not cancel away the small terms.
    const float a = static_cast<float>(factor), b = static_cast<float>(xcoef);
    const float d = static_cast<float>(factor * (-mean_g) - xcoef * (mean - m));
    for (int64_t n = 0; n < batch; ++n) {
      const int64_t base = (n * channels + c) * inner;
      for (int64_t i = 0; i < inner; ++i)
        dx[base + i] = a * dy[base + i] + b * (in[base + i] - m) + d;
    }
  });
  return Status::ok();
}

// SoftmaxCrossEntropyGrad(dLoss, logits, labels) -> dLogits:
// (softmax(logits) - onehot(label)) times the row's share of dLoss.

Result<TypeList> infer_softmax_cross_entropy_grad(const Node &node, const OpDef &def,
                                                  llvm::ArrayRef<TensorType> inputs) {
  ASSIGN_OR_RETURN(TypeList forward, infer_softmax_cross_entropy(node, def, inputs.drop_front()));
  RETURN_IF_ERROR(expect_type(def, inputs, 0, forward[0], "dLoss"));
  return TypeList{inputs[1]};
}

Status softmax_cross_entropy_grad_kernel(const KernelContext &context) {
  RETURN_IF_ERROR(require_f32(context, {0, 1}));
  AttrReader attrs = context.attrs();
  ASSIGN_OR_RETURN(Reduction reduction, read_reduction(context.def, attrs));
  const int64_t ignore_index = attrs.get_int("ignore_index");
  const ConstTensorView &logits = context.inputs[1];
  const int64_t classes = logits.shape().back();
  ASSIGN_OR_RETURN(const std::vector<int64_t> labels,
                   read_labels(context, 2, classes, ignore_index));
  const RowWeights weight =
      row_weights(labels, ignore_index, reduction, context.inputs[0].as<float>());
  const float *x = logits.as<float>();
  float *dx = context.outputs[0].as<float>();
  std::vector<double> exps(static_cast<size_t>(classes));
  for (size_t r = 0; r < labels.size(); ++r) {
    float *out = dx + static_cast<int64_t>(r) * classes;
    if (labels[r] == ignore_index) {
      std::fill(out, out + classes, 0.0f);
      continue;
    }
    const float *row = x + static_cast<int64_t>(r) * classes;
    float max = row[0];
    for (int64_t c = 1; c < classes; ++c)
      max = std::max(max, row[c]);
    // Each exponential once, kept for the second pass (the same values the sum saw).
    double sum = 0;
    for (int64_t c = 0; c < classes; ++c) {
      exps[static_cast<size_t>(c)] = std::exp(static_cast<double>(row[c]) - max);
      sum += exps[static_cast<size_t>(c)];
    }
    for (int64_t c = 0; c < classes; ++c) {
      const double p = exps[static_cast<size_t>(c)] / sum;
      out[c] = static_cast<float>(weight(r) * (p - (c == labels[r] ? 1.0 : 0.0)));
    }
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------
// Vocabulary-parallel cross entropy (Megatron-LM's): the logits' last dim is
// split over `parts` tensor-parallel members, member r holding classes
// [r V / parts, (r + 1) V / parts). Three nodes replace SoftmaxCrossEntropy
// (partitioner/search/tensor_parallel.cc):
//
//   stats = VocabParallelStats(piece, labels)  per row: the piece's max m_r,
//           sum of exp(x - m_r), and the label's logit if the piece holds it
//           (else 0)
//   all   = TpAllGather(stats, axis -1)        every member's three, in order
//   loss  = VocabParallelCrossEntropy(piece, labels, all)
//           per row: m = max m_r, S = sum s_r exp(m_r - m), loss = m + log S - x[label]
//
// The loss is the same on every member; its gradient with respect to the
// piece (VocabParallelCrossEntropyGrad) is softmax - onehot on the piece's
// classes, with nothing to communicate. The piece is an input of the loss node
// so that the gradient reaches it there; none flows through the statistics.

Result<TypeList> infer_vocab_parallel_stats(const Node &node, const OpDef &def,
                                            llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  RETURN_IF_ERROR(read_parts(node, def).status());
  RETURN_IF_ERROR(expect_labels_of(def, inputs[0], inputs[1]));
  TensorType stats{inputs[0].dtype, inputs[1].shape};
  stats.shape.push_back(3);
  return TypeList{stats};
}

// The loss node's inputs: the piece, the labels and every member's stats.
Result<TypeList> infer_vocab_parallel_cross_entropy(const Node &node, const OpDef &def,
                                                    llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  ASSIGN_OR_RETURN(const int64_t parts, read_parts(node, def));
  RETURN_IF_ERROR(expect_labels_of(def, inputs[0], inputs[1]));
  TensorType stats{inputs[0].dtype, inputs[1].shape};
  stats.shape.push_back(3 * parts);
  RETURN_IF_ERROR(expect_type(def, inputs, 2, stats, "stats"));
  ASSIGN_OR_RETURN(Reduction reduction, read_reduction(def, AttrReader(node, def)));
  if (reduction == Reduction::kNone) return TypeList{TensorType{inputs[0].dtype, inputs[1].shape}};
  return TypeList{TensorType{inputs[0].dtype, Shape{}}};
}

Result<TypeList> infer_vocab_parallel_cross_entropy_grad(const Node &node, const OpDef &def,
                                                         llvm::ArrayRef<TensorType> inputs) {
  ASSIGN_OR_RETURN(TypeList forward,
                   infer_vocab_parallel_cross_entropy(node, def, inputs.drop_front()));
  RETURN_IF_ERROR(expect_type(def, inputs, 0, forward[0], "dLoss"));
  return TypeList{inputs[1]};
}

// This member's classes of a row, [first, first + classes), of `total`, and
// the rows' labels, checked against all `total` classes.
struct VocabPiece {
  int64_t classes = 0, first = 0, total = 0;
  std::vector<int64_t> labels;
  // The label's class in this piece, or -1.
  int64_t local(int64_t label) const {
    const int64_t at = label - first;
    return at >= 0 && at < classes ? at : -1;
  }
};

Result<VocabPiece> vocab_piece(const KernelContext &context, size_t logits, size_t labels) {
  const int64_t parts = context.attrs().get_int("parts");
  RETURN_IF_ERROR(expect_group(context, parts));
  VocabPiece piece;
  piece.classes = context.inputs[logits].shape().back();
  piece.first = parts == 1 ? 0 : piece.classes * context.member;
  piece.total = piece.classes * parts;
  ASSIGN_OR_RETURN(piece.labels, read_labels(context, labels, piece.total,
                                             context.attrs().get_int("ignore_index")));
  return piece;
}

Status vocab_parallel_stats_kernel(const KernelContext &context) {
  RETURN_IF_ERROR(require_f32(context, {0}));
  ASSIGN_OR_RETURN(const VocabPiece piece, vocab_piece(context, 0, 1));
  const int64_t ignore_index = context.attrs().get_int("ignore_index");
  const float *x = context.inputs[0].as<float>();
  float *out = context.outputs[0].as<float>();
  for (size_t r = 0; r < piece.labels.size(); ++r, out += 3) {
    const float *row = x + static_cast<int64_t>(r) * piece.classes;
    float max = row[0];
    for (int64_t c = 1; c < piece.classes; ++c)
      max = std::max(max, row[c]);
    double sum = 0;
    for (int64_t c = 0; c < piece.classes; ++c)
      sum += std::exp(static_cast<double>(row[c]) - max);
    const int64_t local = piece.labels[r] == ignore_index ? -1 : piece.local(piece.labels[r]);
    out[0] = max;
    out[1] = static_cast<float>(sum);
    out[2] = local >= 0 ? row[local] : 0.0f;
  }
  return Status::ok();
}

// Row r's max over every class, log of the sum of exp(x - max), and label logit,
// from every member's stats.
struct RowSoftmax {
  double max, log_sum, target;
};
RowSoftmax combine_stats(const float *stats, int64_t parts) {
  float max = stats[0];
  for (int64_t p = 1; p < parts; ++p)
    max = std::max(max, stats[3 * p]);
  double sum = 0, target = 0;
  for (int64_t p = 0; p < parts; ++p) {
    sum += static_cast<double>(stats[3 * p + 1]) *
           std::exp(static_cast<double>(stats[3 * p]) - static_cast<double>(max));
    target += stats[3 * p + 2];
  }
  return {max, std::log(sum), target};
}

Status vocab_parallel_cross_entropy_kernel(const KernelContext &context) {
  RETURN_IF_ERROR(require_f32(context, {0, 2}));
  const AttrReader attrs = context.attrs();
  ASSIGN_OR_RETURN(Reduction reduction, read_reduction(context.def, attrs));
  const int64_t parts = attrs.get_int("parts");
  ASSIGN_OR_RETURN(const VocabPiece piece, vocab_piece(context, 0, 1));
  const float *stats = context.inputs[2].as<float>();
  reduce_row_losses(piece.labels, attrs.get_int("ignore_index"), reduction,
                    context.outputs[0].as<float>(), [&](size_t r) {
                      const RowSoftmax row =
                          combine_stats(stats + static_cast<int64_t>(r) * 3 * parts, parts);
                      return row.max + row.log_sum - row.target;
                    });
  return Status::ok();
}

Status vocab_parallel_cross_entropy_grad_kernel(const KernelContext &context) {
  RETURN_IF_ERROR(require_f32(context, {0, 1, 3}));
  const AttrReader attrs = context.attrs();
  ASSIGN_OR_RETURN(Reduction reduction, read_reduction(context.def, attrs));
  const int64_t ignore_index = attrs.get_int("ignore_index");
  const int64_t parts = attrs.get_int("parts");
  ASSIGN_OR_RETURN(const VocabPiece piece, vocab_piece(context, 1, 2));
  const RowWeights weight =
      row_weights(piece.labels, ignore_index, reduction, context.inputs[0].as<float>());
  const float *x = context.inputs[1].as<float>();
  const float *stats = context.inputs[3].as<float>();
  float *dx = context.outputs[0].as<float>();
  for (size_t r = 0; r < piece.labels.size(); ++r) {
    float *out = dx + static_cast<int64_t>(r) * piece.classes;
    if (piece.labels[r] == ignore_index) {
      std::fill(out, out + piece.classes, 0.0f);
      continue;
    }
    const RowSoftmax row = combine_stats(stats + static_cast<int64_t>(r) * 3 * parts, parts);
    const float *in = x + static_cast<int64_t>(r) * piece.classes;
    const int64_t local = piece.local(piece.labels[r]);
    for (int64_t c = 0; c < piece.classes; ++c) {
      const double p = std::exp(static_cast<double>(in[c]) - row.max - row.log_sum);
      out[c] = static_cast<float>(weight(r) * (p - (c == local ? 1.0 : 0.0)));
    }
  }
  return Status::ok();
}

// MseLossGrad(dLoss, prediction, target) -> dPrediction, dTarget = -dPrediction.

Result<TypeList> infer_mse_loss_grad(const Node &node, const OpDef &def,
                                     llvm::ArrayRef<TensorType> inputs) {
  ASSIGN_OR_RETURN(TypeList forward, infer_mse_loss(node, def, inputs.drop_front()));
  RETURN_IF_ERROR(expect_type(def, inputs, 0, forward[0], "dLoss"));
  return TypeList{inputs[1], inputs[1]};
}

Status mse_loss_grad_kernel(const KernelContext &context) {
  RETURN_IF_ERROR(require_f32(context, {0, 1, 2}));
  ASSIGN_OR_RETURN(Reduction reduction, read_reduction(context.def, context.attrs()));
  const int64_t count = context.inputs[1].num_elements();
  const float *dloss = context.inputs[0].as<float>();
  const float *p = context.inputs[1].as<float>();
  const float *t = context.inputs[2].as<float>();
  float *dp = context.outputs[0].as<float>();
  float *dt = context.outputs[1].as<float>();
  double shared = 0;
  if (reduction == Reduction::kSum) shared = dloss[0];
  if (reduction == Reduction::kMean && count > 0)
    shared = static_cast<double>(dloss[0]) / static_cast<double>(count);
  for (int64_t i = 0; i < count; ++i) {
    const double weight = reduction == Reduction::kNone ? dloss[i] : shared;
    const float g = static_cast<float>(2.0 * weight * (static_cast<double>(p[i]) - t[i]));
    dp[i] = g;
    dt[i] = -g;
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------
// Gradient rules.

std::vector<int64_t> dims_of(llvm::ArrayRef<int64_t> shape) { return {shape.begin(), shape.end()}; }

// `x` reshaped to `shape`, or `x` itself when it already has it.
TensorId reshape_to(GradContext &c, TensorId x, llvm::ArrayRef<int64_t> shape,
                    std::string_view what) {
  if (x == kInvalidTensor || llvm::ArrayRef<int64_t>(c.type(x).shape) == shape) return x;
  return c.builder.op1("Reshape", {x}, {{"shape", dims_of(shape)}}, c.grad_name(what));
}

// A scalar constant of `dtype`.
TensorId scalar_constant(GradContext &c, double value, DType dtype, std::string_view what) {
  return c.builder.op1("Constant", {},
                       {{"dtype", std::string(dtype_name(dtype))},
                        {"shape", std::vector<int64_t>{}},
                        {"value", std::vector<double>{value}}},
                       c.grad_name(what));
}

int64_t flag(bool value) { return value ? 1 : 0; }

// Y = op(A) op(B) over broadcast batches: dop(A) = dY op(B)^T, dop(B) = op(A)^T dY,
// each written as one MatMul whose trans flags land the result in the operand's
// stored layout; broadcast batch dims are summed away afterwards. 1-D operands are
// handled as the matrices the forward promoted them to.
Status matmul_grad(GradContext &c) {
  const TensorId dy = c.output_grads[0];
  if (dy == kInvalidTensor) return Status::ok();
  const TensorType a = c.type(c.input(0)), b = c.type(c.input(1));
  ASSIGN_OR_RETURN(MatMulDims dims, matmul_dims(c.def, c.attrs(), a, b));
  const Shape a2 = dims.a_vector ? Shape{1, a.shape[0]} : a.shape;
  const Shape b2 = dims.b_vector ? Shape{b.shape[0], 1} : b.shape;
  Shape y2 = dims.batch;
  y2.push_back(dims.m);
  y2.push_back(dims.n);
  const bool ta = dims.trans_a, tb = dims.trans_b;
  GraphBuilder &builder = c.builder;
  auto matmul = [&](TensorId x, TensorId y, bool trans_x, bool trans_y, std::string_view what) {
    return builder.op1("MatMul", {x, y}, {{"trans_a", flag(trans_x)}, {"trans_b", flag(trans_y)}},
                       c.grad_name(what));
  };
  const TensorId dy2 = reshape_to(c, dy, y2, "dy_matrix");
  if (c.needs_input_grad[0]) {
    const TensorId b_matrix = reshape_to(c, c.input(1), b2, "b_matrix");
    TensorId g = ta ? matmul(b_matrix, dy2, tb, true, "a") : matmul(dy2, b_matrix, false, !tb, "a");
    g = reduce_to_shape(c, g, a2, "a.batch");
    c.input_grads[0] = reshape_to(c, g, a.shape, "a.shape");
  }
  if (c.needs_input_grad[1]) {
    if (b2.size() == 2 && a2.size() > 2 && !ta) {
      // A weight shared by every batch (x [..., m, k] times W [k, n]): one product
      // over all rows, instead of a product per batch and a sum over batches.
      const int64_t rows = num_elements(a2) / dims.k;
      const TensorId a_rows = reshape_to(c, c.input(0), Shape{rows, dims.k}, "a_rows");
      const TensorId dy_rows = reshape_to(c, dy, Shape{rows, dims.n}, "dy_rows");
      TensorId g = tb ? matmul(dy_rows, a_rows, true, false, "b")
                      : matmul(a_rows, dy_rows, true, false, "b");
      c.input_grads[1] = reshape_to(c, g, b.shape, "b.shape");
    } else {
      const TensorId a_matrix = reshape_to(c, c.input(0), a2, "a_matrix");
      TensorId g =
          tb ? matmul(dy2, a_matrix, true, ta, "b") : matmul(a_matrix, dy2, !ta, false, "b");
      g = reduce_to_shape(c, g, b2, "b.batch");
      c.input_grads[1] = reshape_to(c, g, b.shape, "b.shape");
    }
  }
  return Status::ok();
}

// Y = alpha op(A) op(B) + beta C: the MatMul rule with alpha folded into Gemm,
// and dC = beta * dY summed down to C's shape.
Status gemm_grad(GradContext &c) {
  const TensorId dy = c.output_grads[0];
  if (dy == kInvalidTensor) return Status::ok();
  AttrReader attrs = c.attrs();
  llvm::SmallVector<TensorType, 3> types;
  for (TensorId input : c.node.inputs)
    types.push_back(c.type(input));
  ASSIGN_OR_RETURN(GemmDims dims, gemm_dims(c.def, attrs, types));
  const double alpha = attrs.get_float("alpha"), beta = attrs.get_float("beta");
  const bool ta = dims.trans_a, tb = dims.trans_b;
  GraphBuilder &builder = c.builder;
  auto gemm = [&](TensorId x, TensorId y, bool trans_x, bool trans_y, std::string_view what) {
    return builder.op1("Gemm", {x, y},
                       {{"alpha", alpha}, {"trans_a", flag(trans_x)}, {"trans_b", flag(trans_y)}},
                       c.grad_name(what));
  };
  const TensorId a = c.input(0), b = c.input(1);
  if (c.needs_input_grad[0])
    c.input_grads[0] = ta ? gemm(b, dy, tb, true, "a") : gemm(dy, b, false, !tb, "a");
  if (c.needs_input_grad[1])
    c.input_grads[1] = tb ? gemm(dy, a, true, ta, "b") : gemm(a, dy, !ta, false, "b");
  if (types.size() > 2 && c.needs_input_grad[2] && beta != 0.0) {
    TensorId g = reduce_to_shape(c, dy, types[2].shape, "c");
    if (beta != 1.0)
      g = builder.op1("Mul", {g, scalar_constant(c, beta, types[2].dtype, "beta")}, {},
                      c.grad_name("c.scaled"));
    c.input_grads[2] = g;
  }
  return Status::ok();
}

// Forwards the attributes named in `names` (as the node has them, defaults filled in).
std::vector<Attribute> copy_ints_attrs(const AttrReader &attrs,
                                       std::initializer_list<std::string_view> names) {
  std::vector<Attribute> out;
  for (std::string_view name : names)
    out.push_back({std::string(name), attrs.get_ints(name)});
  return out;
}

Status layer_norm_grad(GradContext &c) {
  const TensorId dy = c.output_grads[0];
  if (dy == kInvalidTensor) return Status::ok();
  AttrReader attrs = c.attrs();
  auto outs = c.builder.op(
      "LayerNormGrad", {dy, c.input(0), c.input(1)},
      {{"axis", attrs.get_int("axis")}, {"epsilon", attrs.get_float("epsilon")}}, c.grad_name("x"));
  if (outs.size() != 3) return c.builder.status();
  for (size_t i = 0; i < 3; ++i)
    c.input_grads[i] = outs[i];
  return Status::ok();
}

Status conv_grad(GradContext &c) {
  const TensorId dy = c.output_grads[0];
  if (dy == kInvalidTensor) return Status::ok();
  AttrReader attrs = c.attrs();
  std::vector<Attribute> common = copy_ints_attrs(attrs, {"strides", "pads", "dilations"});
  common.push_back({"group", attrs.get_int("group")});
  if (c.needs_input_grad[0]) {
    std::vector<Attribute> a = common;
    a.push_back({"input_shape", dims_of(c.type(c.input(0)).shape)});
    c.input_grads[0] = c.builder.op1("Conv2dGradInput", {dy, c.input(1)}, a, c.grad_name("x"));
  }
  if (c.needs_input_grad[1]) {
    std::vector<Attribute> a = common;
    a.push_back({"weight_shape", dims_of(c.type(c.input(1)).shape)});
    c.input_grads[1] = c.builder.op1("Conv2dGradWeight", {dy, c.input(0)}, a, c.grad_name("w"));
  }
  if (c.node.inputs.size() > 2 && c.needs_input_grad[2])
    c.input_grads[2] = c.builder.op1(
        "ReduceSum", {dy}, {{"axes", std::vector<int64_t>{0, 2, 3}}, {"keepdims", int64_t{0}}},
        c.grad_name("bias"));
  return Status::ok();
}

Status max_pool_grad(GradContext &c) {
  const TensorId dy = c.output_grads[0];
  if (dy == kInvalidTensor || !c.needs_input_grad[0]) return Status::ok();
  AttrReader attrs = c.attrs();
  std::vector<Attribute> a =
      copy_ints_attrs(attrs, {"kernel_shape", "strides", "pads", "dilations"});
  a.push_back({"ceil_mode", attrs.get_int("ceil_mode")});
  c.input_grads[0] = c.builder.op1("MaxPool2dGrad", {dy, c.input(0)}, a, c.grad_name("x"));
  return Status::ok();
}

Status average_pool_grad(GradContext &c) {
  const TensorId dy = c.output_grads[0];
  if (dy == kInvalidTensor || !c.needs_input_grad[0]) return Status::ok();
  AttrReader attrs = c.attrs();
  std::vector<Attribute> a = copy_ints_attrs(attrs, {"kernel_shape", "strides", "pads"});
  a.push_back({"ceil_mode", attrs.get_int("ceil_mode")});
  a.push_back({"count_include_pad", attrs.get_int("count_include_pad")});
  a.push_back({"input_shape", dims_of(c.type(c.input(0)).shape)});
  c.input_grads[0] = c.builder.op1("AveragePool2dGrad", {dy}, a, c.grad_name("x"));
  return Status::ok();
}

Status global_average_pool_grad(GradContext &c) {
  const TensorId dy = c.output_grads[0];
  if (dy == kInvalidTensor || !c.needs_input_grad[0]) return Status::ok();
  c.input_grads[0] =
      c.builder.op1("GlobalAveragePoolGrad", {dy},
                    {{"input_shape", dims_of(c.type(c.input(0)).shape)}}, c.grad_name("x"));
  return Status::ok();
}

Status batch_norm_grad(GradContext &c) {
  const TensorId dy = c.output_grads[0];
  if (dy == kInvalidTensor) return Status::ok();
  AttrReader attrs = c.attrs();
  if (attrs.get_int("training") != 1)
    return unimplemented("BatchNormalization: gradients need the training form (training = 1); "
                         "the inference form with fixed statistics has no gradient rule yet");
  auto outs = c.builder.op("BatchNormalizationGrad", {dy, c.input(0), c.input(1)},
                           {{"epsilon", attrs.get_float("epsilon")}}, c.grad_name("x"));
  if (outs.size() != 3) return c.builder.status();
  // The mean and var inputs are not read in training, so they get no gradient.
  for (size_t i = 0; i < 3; ++i)
    c.input_grads[i] = outs[i];
  return Status::ok();
}

Status softmax_cross_entropy_grad_rule(GradContext &c) {
  const TensorId dloss = c.output_grads[0];
  if (dloss == kInvalidTensor || !c.needs_input_grad[0]) return Status::ok();
  AttrReader attrs = c.attrs();
  c.input_grads[0] = c.builder.op1("SoftmaxCrossEntropyGrad", {dloss, c.input(0), c.input(1)},
                                   {{"reduction", attrs.get_string("reduction")},
                                    {"ignore_index", attrs.get_int("ignore_index")}},
                                   c.grad_name("logits"));
  return Status::ok();
}

// The gradient reaches the piece through the loss node alone (see above).
Status vocab_parallel_cross_entropy_grad_rule(GradContext &c) {
  const TensorId dloss = c.output_grads[0];
  if (dloss == kInvalidTensor || !c.needs_input_grad[0]) return Status::ok();
  AttrReader attrs = c.attrs();
  c.input_grads[0] =
      c.builder.op1("VocabParallelCrossEntropyGrad", {dloss, c.input(0), c.input(1), c.input(2)},
                    {{"parts", attrs.get_int("parts")},
                     {"reduction", attrs.get_string("reduction")},
                     {"ignore_index", attrs.get_int("ignore_index")}},
                    c.grad_name("logits"));
  return Status::ok();
}

Status mse_loss_grad_rule(GradContext &c) {
  const TensorId dloss = c.output_grads[0];
  if (dloss == kInvalidTensor) return Status::ok();
  auto outs =
      c.builder.op("MseLossGrad", {dloss, c.input(0), c.input(1)},
                   {{"reduction", c.attrs().get_string("reduction")}}, c.grad_name("prediction"));
  if (outs.size() != 2) return c.builder.status();
  c.input_grads[0] = outs[0];
  c.input_grads[1] = outs[1];
  return Status::ok();
}

// ---------------------------------------------------------------------------
// The table.

// Labels (input k) pick a class of the logits just before them (input k - 1):
// the last dim, whole (a member's piece of logits split by class over `parts`
// members is one part of it).
std::optional<int64_t> label_range(const Node &node, const OpDef &,
                                   llvm::ArrayRef<TensorType> inputs, size_t input) {
  assert(input > 0 && "labels follow their logits");
  const TensorType &logits = inputs[input - 1];
  if (logits.rank() == 0) return std::nullopt;
  return capped_product(logits.shape.back(),
                        std::max<int64_t>(1, node.int_attr("parts").value_or(1)));
}

std::vector<OpDef> make_table() {
  constexpr OpTraits kPool{.batch = BatchRule::kPool, .shard = ShardRule::kPool};
  // The vocabulary-parallel loss: tensor parallelism puts it in place of
  // SoftmaxCrossEntropy, already split. Its shape inference keeps the batch out
  // of the classes dim.
  constexpr OpTraits kVocabParallel{.batch = BatchRule::kFollows,
                                    .shard = ShardRule::kReplicated,
                                    .integer_inputs = 1u << 1,
                                    .index_range = label_range};
  // Ops that gradient rules and make_training (BatchNormStats) add.
  constexpr OpTraits kBackward{.batch = BatchRule::kNotForward, .shard = ShardRule::kReplicated};
  std::vector<OpDef> table;
  table.push_back(
      OpDef{"MatMul",
            "NumPy matrix product of A and B: batch dims broadcast, a 1-D operand is promoted to a "
            "matrix and the added dim removed; trans_a/trans_b transpose the last two dims first",
            2,
            2,
            {int_attr("trans_a", 0, "1: use A with its last two dims swapped"),
             int_attr("trans_b", 0, "1: use B with its last two dims swapped")},
            infer_matmul,
            matmul_cost,
            matmul_kernel,
            matmul_grad});
  table.back().traits = {.batch = BatchRule::kFollows, .shard = ShardRule::kMatMul};
  table.push_back(
      OpDef{"Gemm",
            "Y = alpha * op(A) * op(B) + beta * C for matrices A, B; C broadcasts to [M, N]",
            2,
            3,
            {float_attr("alpha", 1.0, "scale of the product"),
             float_attr("beta", 1.0, "scale of C"), int_attr("trans_a", 0, "1: use A transposed"),
             int_attr("trans_b", 0, "1: use B transposed")},
            infer_gemm,
            gemm_cost,
            gemm_kernel,
            gemm_grad});
  table.back().traits = {.batch = BatchRule::kFollows, .shard = ShardRule::kMatMul};
  table.push_back(
      OpDef{"LayerNorm",
            "normalizes X over dims [axis, rank) to mean 0 and variance 1, then scales and shifts",
            3,
            3,
            {int_attr("axis", -1, "first normalized dim"),
             float_attr("epsilon", 1e-5, "added to the variance")},
            infer_layer_norm,
            layer_norm_cost,
            layer_norm_kernel,
            layer_norm_grad});
  table.back().traits = {.batch = BatchRule::kTrailingAxes, .shard = ShardRule::kNormalizeTrailing};
  table.push_back(
      OpDef{"Conv2d",
            "2-D convolution (cross-correlation) of X [N, C, H, W] with W [M, C/group, kH, kW], "
            "optional bias [M]",
            2,
            3,
            {ints_attr("strides", {1, 1}, "step of the window along H and W"),
             ints_attr("pads", {0, 0, 0, 0}, "zero padding: top, left, bottom, right"),
             ints_attr("dilations", {1, 1}, "spacing of the kernel taps along H and W"),
             int_attr("group", 1, "channel groups; C and M must be multiples")},
            infer_conv,
            conv_cost,
            conv_kernel,
            conv_grad});
  table.back().traits = {.batch = BatchRule::kConv, .shard = ShardRule::kConv};
  table.push_back(OpDef{"MaxPool2d",
                        "maximum over sliding windows of X [N, C, H, W]; padding never wins",
                        1,
                        1,
                        {required_ints_attr("kernel_shape", "window size kH, kW"),
                         ints_attr("strides", {1, 1}, "step of the window along H and W"),
                         ints_attr("pads", {0, 0, 0, 0}, "padding: top, left, bottom, right"),
                         ints_attr("dilations", {1, 1}, "spacing of the window taps along H and W"),
                         int_attr("ceil_mode", 0, "1: round the output size up (ONNX)")},
                        infer_pool,
                        pool_cost,
                        pool_kernel<true>,
                        max_pool_grad});
  table.back().traits = kPool;
  table.push_back(
      OpDef{"AveragePool2d",
            "mean over sliding windows of X [N, C, H, W]",
            1,
            1,
            {required_ints_attr("kernel_shape", "window size kH, kW"),
             ints_attr("strides", {1, 1}, "step of the window along H and W"),
             ints_attr("pads", {0, 0, 0, 0}, "zero padding: top, left, bottom, right"),
             int_attr("ceil_mode", 0, "1: round the output size up (ONNX)"),
             int_attr("count_include_pad", 0, "1: padded positions count in the divisor")},
            infer_pool,
            pool_cost,
            pool_kernel<false>,
            average_pool_grad});
  table.back().traits = kPool;
  table.push_back(OpDef{"GlobalAveragePool",
                        "mean of each [H, W] plane of X [N, C, H, W]: Y [N, C, 1, 1]",
                        1,
                        1,
                        {},
                        infer_global_average_pool,
                        global_average_pool_cost,
                        global_average_pool_kernel,
                        global_average_pool_grad});
  table.back().traits = kPool;
  table.push_back(
      OpDef{"BatchNormalization",
            "batch norm over dim 1: (X - mean) / sqrt(var + epsilon) * scale + bias; training = 1 "
            "uses the batch's statistics",
            5,
            5,
            {float_attr("epsilon", 1e-5, "added to the variance"),
             float_attr("momentum", 0.1,
                        "weight of the batch statistics in the running mean and var updates "
                        "that make_training adds (PyTorch semantics); the kernel ignores it"),
             int_attr("training", 0,
                      "1: normalize with the batch's mean and biased variance over N and the "
                      "spatial dims (the mean and var inputs are ignored)")},
            infer_batch_norm,
            batch_norm_cost,
            batch_norm_kernel,
            batch_norm_grad});
  table.back().traits = {.batch = BatchRule::kCombines, .shard = ShardRule::kReplicated};
  table.push_back(OpDef{"BatchNormStats",
                        "per-channel batch mean and unbiased variance of X [N, C, ...] over N and "
                        "the spatial dims, for BatchNormalization's running statistics",
                        1,
                        1,
                        {},
                        infer_batch_norm_stats,
                        batch_norm_stats_cost,
                        batch_norm_stats_kernel,
                        nullptr});
  table.back().traits = kBackward;
  table.push_back(
      OpDef{"SoftmaxCrossEntropy",
            "cross entropy of softmax(logits) over the last dim against integer labels",
            2,
            2,
            {string_attr("reduction", "mean", "\"mean\", \"sum\" or \"none\""),
             int_attr("ignore_index", -100, "labels equal to it add nothing and are not counted")},
            infer_softmax_cross_entropy,
            softmax_cross_entropy_cost,
            softmax_cross_entropy_kernel,
            softmax_cross_entropy_grad_rule});
  table.back().traits = {.batch = BatchRule::kClasses,
                         .shard = ShardRule::kCrossEntropy,
                         .integer_inputs = 1u << 1,
                         .index_range = label_range};
  table.push_back(OpDef{"VocabParallelStats",
                        "per row of this member's piece of vocabulary-split logits: its max, "
                        "sum of exp(x - max) and the label's logit if the piece holds it (else 0)",
                        2,
                        2,
                        {int_attr("parts", 1, "members the logits' last dim is split over"),
                         int_attr("ignore_index", -100, "labels equal to it add nothing")},
                        infer_vocab_parallel_stats,
                        softmax_cross_entropy_cost,
                        vocab_parallel_stats_kernel});
  table.back().traits = kVocabParallel;
  table.push_back(
      OpDef{"VocabParallelCrossEntropy",
            "SoftmaxCrossEntropy of logits split over the group by their last dim, from every "
            "member's VocabParallelStats (input 2, gathered); input 0 is this member's piece",
            3,
            3,
            {int_attr("parts", 1, "members the logits' last dim is split over"),
             string_attr("reduction", "mean", "\"mean\", \"sum\" or \"none\""),
             int_attr("ignore_index", -100, "labels equal to it add nothing and are not counted")},
            infer_vocab_parallel_cross_entropy,
            nullptr,
            vocab_parallel_cross_entropy_kernel,
            vocab_parallel_cross_entropy_grad_rule});
  table.back().traits = kVocabParallel;
  table.push_back(OpDef{"MseLoss",
                        "squared difference of prediction and target, reduced",
                        2,
                        2,
                        {string_attr("reduction", "mean", "\"mean\", \"sum\" or \"none\"")},
                        infer_mse_loss,
                        mse_loss_cost,
                        mse_loss_kernel,
                        mse_loss_grad_rule});
  // Prediction and target have one shape, so they carry the batch alike.
  table.back().traits = {.batch = BatchRule::kFollows, .shard = ShardRule::kReplicated};

  // Backward ops, made by the gradient rules above.
  table.push_back(OpDef{"LayerNormGrad",
                        "gradients of LayerNorm: dX, dScale, dBias from dY, X and scale",
                        3,
                        3,
                        {int_attr("axis", -1, "first normalized dim"),
                         float_attr("epsilon", 1e-5, "added to the variance")},
                        infer_layer_norm_grad,
                        layer_norm_grad_cost,
                        layer_norm_grad_kernel});
  table.back().traits = kBackward;
  table.push_back(OpDef{"Conv2dGradInput",
                        "gradient of Conv2d with respect to X, from dY and W",
                        2,
                        2,
                        {ints_attr("strides", {1, 1}, "step of the window along H and W"),
                         ints_attr("pads", {0, 0, 0, 0}, "zero padding: top, left, bottom, right"),
                         ints_attr("dilations", {1, 1}, "spacing of the kernel taps along H and W"),
                         int_attr("group", 1, "channel groups"),
                         required_ints_attr("input_shape", "shape of X [N, C, H, W]")},
                        infer_conv_grad<true>,
                        conv_grad_cost<true>,
                        conv_grad_kernel<true>});
  table.back().traits = kBackward;
  table.push_back(OpDef{"Conv2dGradWeight",
                        "gradient of Conv2d with respect to W, from dY and X",
                        2,
                        2,
                        {ints_attr("strides", {1, 1}, "step of the window along H and W"),
                         ints_attr("pads", {0, 0, 0, 0}, "zero padding: top, left, bottom, right"),
                         ints_attr("dilations", {1, 1}, "spacing of the kernel taps along H and W"),
                         int_attr("group", 1, "channel groups"),
                         required_ints_attr("weight_shape", "shape of W [M, C/group, kH, kW]")},
                        infer_conv_grad<false>,
                        conv_grad_cost<false>,
                        conv_grad_kernel<false>});
  table.back().traits = kBackward;
  table.push_back(OpDef{"MaxPool2dGrad",
                        "gradient of MaxPool2d: dY routed to the first maximum of each window of X",
                        2,
                        2,
                        {required_ints_attr("kernel_shape", "window size kH, kW"),
                         ints_attr("strides", {1, 1}, "step of the window along H and W"),
                         ints_attr("pads", {0, 0, 0, 0}, "padding: top, left, bottom, right"),
                         ints_attr("dilations", {1, 1}, "spacing of the window taps along H and W"),
                         int_attr("ceil_mode", 0, "1: round the output size up (ONNX)")},
                        infer_max_pool_grad,
                        pool_grad_cost,
                        pool_grad_kernel<true>});
  table.back().traits = kBackward;
  table.push_back(
      OpDef{"AveragePool2dGrad",
            "gradient of AveragePool2d: each window's dY spread evenly over its inputs",
            1,
            1,
            {required_ints_attr("kernel_shape", "window size kH, kW"),
             ints_attr("strides", {1, 1}, "step of the window along H and W"),
             ints_attr("pads", {0, 0, 0, 0}, "zero padding: top, left, bottom, right"),
             int_attr("ceil_mode", 0, "1: round the output size up (ONNX)"),
             int_attr("count_include_pad", 0, "1: padded positions count in the divisor"),
             required_ints_attr("input_shape", "shape of X [N, C, H, W]")},
            infer_average_pool_grad,
            pool_grad_cost,
            pool_grad_kernel<false>});
  table.back().traits = kBackward;
  table.push_back(OpDef{"GlobalAveragePoolGrad",
                        "gradient of GlobalAveragePool: dY [N, C, 1, 1] / (H * W) over each plane",
                        1,
                        1,
                        {required_ints_attr("input_shape", "shape of X [N, C, H, W]")},
                        infer_global_average_pool_grad,
                        nullptr,
                        global_average_pool_grad_kernel});
  table.back().traits = kBackward;
  table.push_back(OpDef{"BatchNormalizationGrad",
                        "gradients of training-form BatchNormalization: dX, dScale, dBias from "
                        "dY, X and scale",
                        3,
                        3,
                        {float_attr("epsilon", 1e-5, "added to the variance")},
                        infer_batch_norm_grad,
                        batch_norm_grad_cost,
                        batch_norm_grad_kernel});
  table.back().traits = kBackward;
  table.push_back(
      OpDef{"SoftmaxCrossEntropyGrad",
            "gradient of SoftmaxCrossEntropy with respect to the logits",
            3,
            3,
            {string_attr("reduction", "mean", "\"mean\", \"sum\" or \"none\""),
             int_attr("ignore_index", -100, "rows with this label get a zero gradient")},
            infer_softmax_cross_entropy_grad,
            softmax_cross_entropy_cost,
            softmax_cross_entropy_grad_kernel});
  table.back().traits = {.batch = BatchRule::kNotForward,
                         .shard = ShardRule::kReplicated,
                         .integer_inputs = 1u << 2,
                         .index_range = label_range};
  table.push_back(
      OpDef{"VocabParallelCrossEntropyGrad",
            "gradient of VocabParallelCrossEntropy with respect to this member's "
            "piece of the logits",
            4,
            4,
            {int_attr("parts", 1, "members the logits' last dim is split over"),
             string_attr("reduction", "mean", "\"mean\", \"sum\" or \"none\""),
             int_attr("ignore_index", -100, "rows with this label get a zero gradient")},
            infer_vocab_parallel_cross_entropy_grad,
            softmax_cross_entropy_cost,
            vocab_parallel_cross_entropy_grad_kernel});
  table.back().traits = {.batch = BatchRule::kNotForward,
                         .shard = ShardRule::kReplicated,
                         .integer_inputs = 1u << 2,
                         .index_range = label_range};
  table.push_back(OpDef{"MseLossGrad",
                        "gradients of MseLoss: dPrediction and dTarget = -dPrediction",
                        3,
                        3,
                        {string_attr("reduction", "mean", "\"mean\", \"sum\" or \"none\"")},
                        infer_mse_loss_grad,
                        nullptr,
                        mse_loss_grad_kernel});
  table.back().traits = kBackward;
  return table;
}

} // namespace

std::span<const OpDef> nn_ops() {
  static const std::vector<OpDef> table = make_table();
  return table;
}

} // namespace strata::ops
