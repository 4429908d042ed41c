// Reductions (ReduceSum, ReduceMean, ReduceMax) and the softmax family.
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

#include "ops/registry.h"

namespace strata::ops {
namespace {

using TypeList = llvm::SmallVector<TensorType, 2>;

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
  llvm::ArrayRef<int64_t> shape = x.shape();
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d)
    outer *= shape[d];
  for (size_t d = axis + 1; d < shape.size(); ++d)
    inner *= shape[d];
  const int64_t n = shape[axis];
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

OpDef reduce(std::string_view name, std::string_view summary, CpuKernelFn kernel) {
  return OpDef{
      name,
      summary,
      1,
      1,
      {{"axes", AttrType::kInts, AttrValue{std::vector<int64_t>{}},
        "axes to reduce; [] reduces all"},
       {"keepdims", AttrType::kInt, AttrValue{int64_t{1}}, "1 keeps reduced axes as size 1"}},
      infer_reduce,
      reduce_cost,
      kernel};
}

OpDef softmax(std::string_view name, std::string_view summary, CpuKernelFn kernel) {
  return OpDef{name,
               summary,
               1,
               1,
               {{"axis", AttrType::kInt, AttrValue{int64_t{-1}}, "axis normalized over"}},
               infer_softmax,
               softmax_cost,
               kernel};
}

std::vector<OpDef> make_table() {
  std::vector<OpDef> table;
  table.push_back(reduce("ReduceSum", "Y = sum of X over axes (1 FLOP per input element)",
                         reduce_kernel<Reduction::kSum>));
  table.push_back(reduce("ReduceMean", "Y = mean of X over axes (1 FLOP per input element)",
                         reduce_kernel<Reduction::kMean>));
  table.push_back(reduce("ReduceMax", "Y = max of X over axes (1 FLOP per input element)",
                         reduce_kernel<Reduction::kMax>));
  table.push_back(softmax("Softmax", "Y = softmax of X along axis (4 FLOPs per input element)",
                          softmax_kernel<false>));
  table.push_back(softmax("LogSoftmax",
                          "Y = log of softmax of X along axis (4 FLOPs per input element)",
                          softmax_kernel<true>));
  return table;
}

} // namespace

std::span<const OpDef> reduction_ops() {
  static const std::vector<OpDef> table = make_table();
  return table;
}

} // namespace strata::ops
