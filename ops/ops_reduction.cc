// Reductions (ReduceSum, ReduceMean, ReduceMax) and the softmax family, their
// gradient rules and backward ops (ReduceMaxGrad, SoftmaxGrad, LogSoftmaxGrad).
//
// Determinism: every kernel visits the input in one fixed order that depends only
// on the shapes, so the same inputs give bitwise the same outputs on every run.
// Sums accumulate in double.
//
// The reduction kernel drops size-1 dimensions and merges neighbours that are
// both reduced or both kept, so the input becomes alternating runs of kept and
// reduced dimensions. It then walks the input once in memory order: when the
// innermost run is reduced, each row folds into one accumulator; when it is kept,
// each row adds elementwise into a row of accumulators.
#include <algorithm>
#include <cmath>
#include <limits>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "ops/registry.h"

namespace strata::ops {
namespace {

using TypeList = llvm::SmallVector<TensorType, 2>;

// A shape seen as [outer, n, inner] around `axis`: what softmax-like kernels
// loop over.
struct AxisSplit {
  int64_t outer = 1, n = 1, inner = 1;
};
AxisSplit split_at_axis(llvm::ArrayRef<int64_t> shape, int64_t axis) {
  AxisSplit s;
  for (int64_t d = 0; d < axis; ++d)
    s.outer *= shape[d];
  for (size_t d = static_cast<size_t>(axis) + 1; d < shape.size(); ++d)
    s.inner *= shape[d];
  s.n = shape[static_cast<size_t>(axis)];
  return s;
}

// Which dimensions of X a reduction folds: `axes`, or every one when empty.
Result<std::vector<bool>> reduced_dims(const Node &node, const OpDef &def, const TensorType &x) {
  std::vector<int64_t> axes = AttrReader(node, def).get_ints("axes");
  std::vector<bool> reduced(x.shape.size(), axes.empty());
  for (int64_t axis : axes) {
    Result<int64_t> d = normalize_axis(axis, x.rank(), "axes");
    if (!d.is_ok())
      return std::move(d).take_status().with_context(
          str_cat(def.name, " (input 0 is ", x.to_string(), ")"));
    if (reduced[*d])
      return invalid_argument(def.name, ": attribute 'axes' = ", shape_to_string(axes),
                              " repeats axis ", *d);
    reduced[*d] = true;
  }
  return reduced;
}

Result<TypeList> infer_reduce(const Node &node, const OpDef &def,
                              llvm::ArrayRef<TensorType> inputs) {
  const TensorType &x = inputs[0];
  if (def.name == "ReduceMean") {
    RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  } else if (x.dtype == DType::kBool) {
    return invalid_argument(def.name, ": input 0 must be numeric, got bool");
  }
  int64_t keepdims = AttrReader(node, def).get_int("keepdims");
  if (keepdims != 0 && keepdims != 1)
    return invalid_argument(def.name, ": attribute 'keepdims' = ", keepdims, " must be 0 or 1");
  ASSIGN_OR_RETURN(std::vector<bool> reduced, reduced_dims(node, def, x));
  Shape shape;
  for (size_t d = 0; d < reduced.size(); ++d) {
    if (!reduced[d])
      shape.push_back(x.shape[d]);
    else if (keepdims)
      shape.push_back(1);
  }
  return TypeList{TensorType{x.dtype, std::move(shape)}};
}

enum class Reduction { kSum, kMean, kMax };

// Max that lets NaN win: once the accumulator is NaN it stays NaN.
inline float nan_max(float acc, float v) { return (v > acc || v != v) ? v : acc; }

// Sum of a contiguous row in double, with four interleaved partial sums combined
// in a fixed order.
inline double row_sum(const float *x, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += x[i];
    s1 += x[i + 1];
    s2 += x[i + 2];
    s3 += x[i + 3];
  }
  for (; i < n; ++i)
    s0 += x[i];
  return (s0 + s1) + (s2 + s3);
}

inline float row_max(const float *x, int64_t n, float acc) {
  for (int64_t i = 0; i < n; ++i)
    acc = nan_max(acc, x[i]);
  return acc;
}

// out[k] = sum over r of x[r, k] (divided by rows for a mean), accumulated in
// double in row order.
void sum_leading_rows(const float *x, int64_t rows, int64_t cols, bool mean, float *out) {
  constexpr int64_t kBlock = 512;
  double acc[kBlock];
  for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
    const int64_t width = std::min(kBlock, cols - c0);
    std::fill(acc, acc + width, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const float *row = x + r * cols + c0;
      int64_t i = 0;
#if defined(__SSE2__)
      for (; i + 4 <= width; i += 4) {
        const __m128 v = _mm_loadu_ps(row + i);
        _mm_storeu_pd(acc + i, _mm_add_pd(_mm_loadu_pd(acc + i), _mm_cvtps_pd(v)));
        _mm_storeu_pd(acc + i + 2,
                      _mm_add_pd(_mm_loadu_pd(acc + i + 2), _mm_cvtps_pd(_mm_movehl_ps(v, v))));
      }
#endif
      for (; i < width; ++i)
        acc[i] += row[i];
    }
    const double count = static_cast<double>(rows);
    for (int64_t i = 0; i < width; ++i)
      out[c0 + i] = static_cast<float>(mean ? acc[i] / count : acc[i]);
  }
}

template <Reduction kKind> Status reduce_kernel(const KernelContext &context) {
  const ConstTensorView &x = context.inputs[0];
  if (x.dtype() != DType::kF32)
    return unimplemented(context.def.name, ": no CPU kernel for dtype ", dtype_name(x.dtype()));
  ASSIGN_OR_RETURN(std::vector<bool> reduced, reduced_dims(context.node, context.def, *x.type));
  const float *in = x.as<float>();
  float *out = context.outputs[0].as<float>();
  const int64_t out_count = context.outputs[0].num_elements();
  const int64_t total = x.num_elements();
  const int64_t folded = out_count == 0 ? 0 : total / out_count; // inputs per output

  // Merged runs of kept or reduced dimensions, outermost first.
  Shape dims;
  std::vector<bool> is_reduced;
  for (size_t d = 0; d < reduced.size(); ++d) {
    int64_t size = x.shape()[d];
    if (size == 1) continue;
    if (!dims.empty() && is_reduced.back() == reduced[d]) {
      dims.back() *= size;
    } else {
      dims.push_back(size);
      is_reduced.push_back(reduced[d]);
    }
  }
  if (dims.empty()) {
    dims.push_back(1);
    is_reduced.push_back(false);
  }
  // Output stride of each run: contiguous over kept runs, 0 over reduced ones.
  const size_t rank = dims.size();
  Shape out_strides(rank, 0);
  int64_t stride = 1;
  for (size_t d = rank; d-- > 0;) {
    if (is_reduced[d]) continue;
    out_strides[d] = stride;
    stride *= dims[d];
  }

  if constexpr (kKind != Reduction::kMax) {
    // Leading dimensions summed away ([R, K] -> [K], e.g. a bias gradient): in
    // blocks of columns with a stack accumulator, adding the rows in order as the
    // general loop does, so the results are bitwise the same.
    if (rank == 2 && is_reduced[0] && !is_reduced[1]) {
      sum_leading_rows(in, dims[0], dims[1], kKind == Reduction::kMean, out);
      return Status::ok();
    }
  }
  if constexpr (kKind == Reduction::kMax) {
    std::fill(out, out + out_count, -std::numeric_limits<float>::infinity());
  }
  std::vector<double> sums(kKind == Reduction::kMax ? 0 : out_count, 0.0);
  if (total > 0) {
    const int64_t inner = dims.back();
    const bool inner_reduced = is_reduced.back();
    Shape index(rank, 0);
    int64_t out_offset = 0;
    for (int64_t done = 0; done < total; done += inner) {
      const float *row = in + done;
      if constexpr (kKind == Reduction::kMax) {
        if (inner_reduced) {
          out[out_offset] = row_max(row, inner, out[out_offset]);
        } else {
          float *acc = out + out_offset;
          for (int64_t i = 0; i < inner; ++i)
            acc[i] = nan_max(acc[i], row[i]);
        }
      } else {
        if (inner_reduced) {
          sums[out_offset] += row_sum(row, inner);
        } else {
          double *acc = sums.data() + out_offset;
          for (int64_t i = 0; i < inner; ++i)
            acc[i] += row[i];
        }
      }
      for (size_t d = rank - 1; d-- > 0;) {
        out_offset += out_strides[d];
        if (++index[d] < dims[d]) break;
        out_offset -= out_strides[d] * dims[d];
        index[d] = 0;
      }
    }
  }
  if constexpr (kKind == Reduction::kSum) {
    for (int64_t i = 0; i < out_count; ++i)
      out[i] = static_cast<float>(sums[i]);
  } else if constexpr (kKind == Reduction::kMean) {
    // An empty reduction gives 0 / 0 = NaN.
    const double count = static_cast<double>(folded);
    for (int64_t i = 0; i < out_count; ++i)
      out[i] = static_cast<float>(sums[i] / count);
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------
// Softmax and LogSoftmax over one axis

Result<TypeList> infer_softmax(const Node &node, const OpDef &def,
                               llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_floating(def, inputs, 0));
  Result<int64_t> axis =
      normalize_axis(AttrReader(node, def).get_int("axis"), inputs[0].rank(), "axis");
  if (!axis.is_ok())
    return std::move(axis).take_status().with_context(
        str_cat(def.name, " (input 0 is ", inputs[0].to_string(), ")"));
  return TypeList{inputs[0]};
}

// Y = e^(X - max) / sum(e^(X - max)), or its logarithm
// X - max - log(sum(e^(X - max))), along the axis. Subtracting the max keeps every
// exponent <= 0, so nothing overflows.
template <bool kLog> Status softmax_kernel(const KernelContext &context) {
  const ConstTensorView &x = context.inputs[0];
  if (x.dtype() != DType::kF32)
    return unimplemented(context.def.name, ": no CPU kernel for dtype ", dtype_name(x.dtype()));
  ASSIGN_OR_RETURN(int64_t axis,
                   normalize_axis(context.attrs().get_int("axis"), x.type->rank(), "axis"));
  const auto [outer, n, inner] = split_at_axis(x.shape(), axis);
  if (outer * n * inner == 0) return Status::ok();
  const float *in = x.as<float>();
  float *out = context.outputs[0].as<float>();

  if (inner == 1) { // contiguous rows
    for (int64_t o = 0; o < outer; ++o) {
      const float *row = in + o * n;
      float *y = out + o * n;
      const float max = row_max(row, n, -std::numeric_limits<float>::infinity());
      double sum = 0;
      if constexpr (kLog) {
        for (int64_t i = 0; i < n; ++i)
          sum += std::exp(row[i] - max);
        // (x - max) first: it is exact for x near max, where it matters.
        const float log_sum = static_cast<float>(std::log(sum));
        for (int64_t i = 0; i < n; ++i)
          y[i] = (row[i] - max) - log_sum;
      } else {
        for (int64_t i = 0; i < n; ++i) {
          y[i] = std::exp(row[i] - max);
          sum += y[i];
        }
        const float scale = static_cast<float>(1.0 / sum);
        for (int64_t i = 0; i < n; ++i)
          y[i] *= scale;
      }
    }
    return Status::ok();
  }

  // Strided: process `inner` independent softmaxes side by side, so every inner
  // loop runs over contiguous memory.
  std::vector<float> max(inner);
  std::vector<double> sum(inner);
  std::vector<float> shift(inner);
  for (int64_t o = 0; o < outer; ++o) {
    const float *block = in + o * n * inner;
    float *y = out + o * n * inner;
    std::fill(max.begin(), max.end(), -std::numeric_limits<float>::infinity());
    std::fill(sum.begin(), sum.end(), 0.0);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t k = 0; k < inner; ++k)
        max[k] = nan_max(max[k], block[j * inner + k]);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t k = 0; k < inner; ++k) {
        float e = std::exp(block[j * inner + k] - max[k]);
        if constexpr (!kLog) y[j * inner + k] = e;
        sum[k] += e;
      }
    // LogSoftmax: log of the sum; Softmax: its reciprocal.
    for (int64_t k = 0; k < inner; ++k)
      shift[k] = kLog ? static_cast<float>(std::log(sum[k])) : static_cast<float>(1.0 / sum[k]);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t k = 0; k < inner; ++k) {
        if constexpr (kLog)
          y[j * inner + k] = (block[j * inner + k] - max[k]) - shift[k];
        else
          y[j * inner + k] *= shift[k];
      }
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------
// Backward ops

// ReduceMaxGrad(dY, X): dX is zero except at one position per reduced group, the
// first maximum in row-major order (a NaN counts as the maximum, as in the
// forward kernel), which receives that group's dY. Ties are not split: the whole
// gradient goes to the first of them, which keeps dX a valid subgradient and
// makes the choice depend only on X.
Result<TypeList> infer_reduce_max_grad(const Node &node, const OpDef &def,
                                       llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(expect_floating(def, inputs, 1));
  RETURN_IF_ERROR(expect_same_dtype(def, inputs));
  ASSIGN_OR_RETURN(TypeList reduced, infer_reduce(node, def, inputs.drop_front()));
  if (!(reduced[0] == inputs[0]))
    return invalid_argument(def.name, ": input 0 (dY) ", inputs[0].to_string(), " is not ",
                            reduced[0].to_string(), ", the reduction of input 1 ",
                            inputs[1].to_string());
  return TypeList{inputs[1]};
}

Status reduce_max_grad_kernel(const KernelContext &context) {
  const ConstTensorView &dy = context.inputs[0];
  const ConstTensorView &x = context.inputs[1];
  if (x.dtype() != DType::kF32)
    return unimplemented(context.def.name, ": no CPU kernel for dtype ", dtype_name(x.dtype()));
  ASSIGN_OR_RETURN(std::vector<bool> reduced, reduced_dims(context.node, context.def, *x.type));
  llvm::ArrayRef<int64_t> shape = x.shape();
  const size_t rank = shape.size();
  // Group stride of each input dimension: 0 where reduced.
  Shape group_strides(rank, 0);
  int64_t stride = 1;
  for (size_t d = rank; d-- > 0;) {
    if (reduced[d]) continue;
    group_strides[d] = stride;
    stride *= shape[d];
  }
  const int64_t groups = dy.num_elements();
  const float *in = x.as<float>();
  float *out = context.outputs[0].as<float>();
  const int64_t total = x.num_elements();
  std::fill(out, out + total, 0.0f);
  if (total == 0) return Status::ok();
  std::vector<int64_t> best(static_cast<size_t>(groups), -1);
  Shape index(rank, 0);
  int64_t group = 0;
  for (int64_t i = 0; i < total; ++i) {
    const int64_t b = best[group];
    const float v = in[i];
    if (b < 0 || v > in[b] || (v != v && in[b] == in[b])) best[group] = i;
    for (size_t d = rank; d-- > 0;) {
      group += group_strides[d];
      if (++index[d] < shape[d]) break;
      group -= group_strides[d] * shape[d];
      index[d] = 0;
    }
  }
  const float *g = dy.as<float>();
  for (int64_t k = 0; k < groups; ++k)
    if (best[k] >= 0) out[best[k]] = g[k];
  return Status::ok();
}

// SoftmaxGrad(dY, Y) and LogSoftmaxGrad(dY, Y), along `axis`:
//   Softmax:    dX = Y * (dY - sum(dY * Y))
//   LogSoftmax: dX = dY - e^Y * sum(dY)
Result<TypeList> infer_softmax_grad(const Node &node, const OpDef &def,
                                    llvm::ArrayRef<TensorType> inputs) {
  RETURN_IF_ERROR(infer_softmax(node, def, inputs.drop_front()).status());
  if (!(inputs[0] == inputs[1]))
    return invalid_argument(def.name, ": input 0 (dY) ", inputs[0].to_string(), " and input 1 (Y) ",
                            inputs[1].to_string(), " must have the same type");
  return TypeList{inputs[0]};
}

template <bool kLog> Status softmax_grad_kernel(const KernelContext &context) {
  const ConstTensorView &dy = context.inputs[0];
  const ConstTensorView &y = context.inputs[1];
  if (y.dtype() != DType::kF32)
    return unimplemented(context.def.name, ": no CPU kernel for dtype ", dtype_name(y.dtype()));
  ASSIGN_OR_RETURN(int64_t axis,
                   normalize_axis(context.attrs().get_int("axis"), y.type->rank(), "axis"));
  const auto [outer, n, inner] = split_at_axis(y.shape(), axis);
  const float *g = dy.as<float>();
  const float *v = y.as<float>();
  float *out = context.outputs[0].as<float>();
  std::vector<double> sum(static_cast<size_t>(inner));
  for (int64_t o = 0; o < outer; ++o) {
    const int64_t base = o * n * inner;
    std::fill(sum.begin(), sum.end(), 0.0);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t k = 0; k < inner; ++k) {
        const int64_t at = base + j * inner + k;
        sum[k] += kLog ? double(g[at]) : double(g[at]) * double(v[at]);
      }
    for (int64_t j = 0; j < n; ++j)
      for (int64_t k = 0; k < inner; ++k) {
        const int64_t at = base + j * inner + k;
        const auto s = static_cast<float>(sum[k]);
        if constexpr (kLog)
          out[at] = g[at] - std::exp(v[at]) * s;
        else
          out[at] = v[at] * (g[at] - s);
      }
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------
// Gradient rules

// dY of a reduction brought back to X's shape: reshaped to the keepdims shape,
// then expanded.
Result<TensorId> spread_back(GradContext &c, TensorId dy) {
  const TensorType x = c.type(c.input(0));
  ASSIGN_OR_RETURN(std::vector<bool> reduced, reduced_dims(c.node, c.def, x));
  std::vector<int64_t> kept;
  for (size_t d = 0; d < reduced.size(); ++d)
    kept.push_back(reduced[d] ? 1 : x.shape[d]);
  GraphBuilder &b = c.builder;
  if (c.attrs().get_int("keepdims") == 0)
    dy = b.op1("Reshape", {dy}, {{"shape", kept}}, c.grad_name("keepdims"));
  return b.op1("Expand", {dy}, {{"shape", std::vector<int64_t>(x.shape.begin(), x.shape.end())}},
               c.grad_name("expand"));
}

Status reduce_sum_grad(GradContext &c) {
  if (!c.needs_input_grad[0]) return Status::ok();
  ASSIGN_OR_RETURN(c.input_grads[0], spread_back(c, c.output_grads[0]));
  return Status::ok();
}

// The mean's gradient is the sum's, divided by the number of elements per group.
Status reduce_mean_grad(GradContext &c) {
  if (!c.needs_input_grad[0]) return Status::ok();
  const TensorType x = c.type(c.input(0));
  const int64_t outputs = c.type(c.output(0)).num_elements();
  const int64_t count = outputs == 0 ? 0 : x.num_elements() / outputs;
  TensorId scale = c.builder.op1(
      "Constant", {},
      {{"dtype", std::string(dtype_name(x.dtype))},
       {"value", std::vector<double>{count == 0 ? 0.0 : 1.0 / static_cast<double>(count)}}},
      c.grad_name("scale"));
  TensorId scaled = c.builder.op1("Mul", {c.output_grads[0], scale}, {}, c.grad_name("mul"));
  ASSIGN_OR_RETURN(c.input_grads[0], spread_back(c, scaled));
  return Status::ok();
}

Status reduce_max_grad(GradContext &c) {
  if (!c.needs_input_grad[0]) return Status::ok();
  c.input_grads[0] = c.builder.op1("ReduceMaxGrad", {c.output_grads[0], c.input(0)}, c.node.attrs,
                                   c.grad_name("max"));
  return Status::ok();
}

template <bool kLog> Status softmax_grad(GradContext &c) {
  if (!c.needs_input_grad[0]) return Status::ok();
  const char *op = kLog ? "LogSoftmaxGrad" : "SoftmaxGrad";
  c.input_grads[0] =
      c.builder.op1(op, {c.output_grads[0], c.output(0)}, c.node.attrs, c.grad_name(op));
  return Status::ok();
}

// Costs per input element: reductions 1 FLOP; softmax 4 (max, subtract and
// exponentiate, sum, scale).
OpCost per_input_cost(llvm::ArrayRef<TensorType> inputs, llvm::ArrayRef<TensorType> outputs,
                      double flops_per_element) {
  OpCost cost;
  cost.flops = flops_per_element * static_cast<double>(inputs[0].num_elements());
  cost.bytes_read = static_cast<double>(inputs[0].size_bytes());
  cost.bytes_written = static_cast<double>(outputs[0].size_bytes());
  return cost;
}
OpCost reduce_cost(const Node &, const OpDef &, llvm::ArrayRef<TensorType> inputs,
                   llvm::ArrayRef<TensorType> outputs) {
  return per_input_cost(inputs, outputs, 1);
}
OpCost softmax_cost(const Node &, const OpDef &, llvm::ArrayRef<TensorType> inputs,
                    llvm::ArrayRef<TensorType> outputs) {
  return per_input_cost(inputs, outputs, 4);
}

OpDef reduce(std::string_view name, std::string_view summary, CpuKernelFn kernel, GradFn grad,
             int inputs = 1, InferFn infer = infer_reduce) {
  return OpDef{
      name,
      summary,
      inputs,
      inputs,
      {{"axes", AttrType::kInts, AttrValue{std::vector<int64_t>{}},
        "axes to reduce; [] reduces all"},
       {"keepdims", AttrType::kInt, AttrValue{int64_t{1}}, "1 keeps reduced axes as size 1"}},
      infer,
      reduce_cost,
      kernel,
      grad};
}

OpDef softmax(std::string_view name, std::string_view summary, CpuKernelFn kernel, GradFn grad,
              int inputs = 1, InferFn infer = infer_softmax) {
  return OpDef{name,
               summary,
               inputs,
               inputs,
               {{"axis", AttrType::kInt, AttrValue{int64_t{-1}}, "axis normalized over"}},
               infer,
               softmax_cost,
               kernel,
               grad};
}

std::vector<OpDef> make_table() {
  // Tensor parallelism has no rule to split a reduction: it runs whole.
  constexpr OpTraits kReduction{.batch = BatchRule::kReduceAxes, .shard = ShardRule::kReplicated};
  constexpr OpTraits kSoftmax{.batch = BatchRule::kNormalizeAxis,
                              .shard = ShardRule::kNormalizeAxis};
  constexpr OpTraits kBackward{.batch = BatchRule::kNotForward, .shard = ShardRule::kReplicated};
  std::vector<OpDef> table;
  table.push_back(reduce("ReduceSum", "Y = sum of X over axes (1 FLOP per input element)",
                         reduce_kernel<Reduction::kSum>, reduce_sum_grad));
  table.back().traits = kReduction;
  table.push_back(reduce("ReduceMean", "Y = mean of X over axes (1 FLOP per input element)",
                         reduce_kernel<Reduction::kMean>, reduce_mean_grad));
  table.back().traits = kReduction;
  table.push_back(reduce("ReduceMax", "Y = max of X over axes (1 FLOP per input element)",
                         reduce_kernel<Reduction::kMax>, reduce_max_grad));
  table.back().traits = kReduction;
  table.push_back(softmax("Softmax", "Y = softmax of X along axis (4 FLOPs per input element)",
                          softmax_kernel<false>, softmax_grad<false>));
  table.back().traits = kSoftmax;
  table.push_back(softmax("LogSoftmax",
                          "Y = log of softmax of X along axis (4 FLOPs per input element)",
                          softmax_kernel<true>, softmax_grad<true>));
  table.back().traits = kSoftmax;
  // Backward ops (inputs dY first).
  table.push_back(reduce("ReduceMaxGrad",
                         "dX = dY at the first max of each reduced group of X, else 0",
                         reduce_max_grad_kernel, nullptr, 2, infer_reduce_max_grad));
  table.back().traits = kBackward;
  table.push_back(softmax("SoftmaxGrad", "dX = Y * (dY - sum(dY * Y)) along axis (inputs dY, Y)",
                          softmax_grad_kernel<false>, nullptr, 2, infer_softmax_grad));
  table.back().traits = kBackward;
  table.push_back(softmax("LogSoftmaxGrad", "dX = dY - e^Y * sum(dY) along axis (inputs dY, Y)",
                          softmax_grad_kernel<true>, nullptr, 2, infer_softmax_grad));
  table.back().traits = kBackward;
  return table;
}

} // namespace

std::span<const OpDef> reduction_ops() {
  static const std::vector<OpDef> table = make_table();
  return table;
}

} // namespace strata::ops
