// strata's own CUDA kernels, as host functions that enqueue them on a stream.
//
// This header is plain C++ over the CUDA runtime types: the .cu files that
// define these functions include nothing else of strata, and the C++ side
// (cuda_ops.cc) reads node attributes and shapes and calls them. Every
// function only enqueues work (no allocation, no synchronization), so a whole
// step can be captured into a CUDA Graph; the return value is the launch error
// (cudaSuccess when the kernel was enqueued).
//
// Tensors are dense, row-major, f32 unless an argument says otherwise. Shapes
// of up to kMaxDims dims travel by value in a Dims.
//
// Numerics. The kernels are compiled with --fmad=false (a * b + c rounds
// twice, as on the CPU; Gelu shares the CPU's own math, gelu_math.h; Pow by
// a one-element exponent of 2 or 1 is x * x or x, as on the CPU), reduce in
// double where the CPU does, and sum in a fixed order: block reductions in a
// fixed tree, column sums one thread per column, the embedding gradient one
// thread per table element scanning the indices in order. So a kernel gives
// bitwise the same result on every run, and a replayed CUDA Graph equals
// eager execution bitwise.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace strata::cuda {

constexpr int kMaxDims = 8;

// A shape, or the element strides of an operand read in a broadcast (stride 0
// along a broadcast dim).
struct Dims {
  int rank = 0;
  int64_t d[kMaxDims] = {};
};

enum class Unary : int {
  kRelu,
  kGeluErf,
  kGeluTanh,
  kTanh,
  kSigmoid,
  kExp,
  kLog,
  kSqrt,
  kNeg,
  kErf,
  kClip,  // uses a and b as min and max
  kScale, // y = a * x
};

enum class Binary : int {
  kAdd,
  kSub,
  kMul,
  kDiv,
  kPow,
  kPowScalar,    // a one-element exponent: 2 and 1 exactly (x * x, x), as on the CPU
  kReluGrad,     // (dY, X)
  kGeluErfGrad,  // (dY, X)
  kGeluTanhGrad, // (dY, X)
  kTanhGrad,     // (dY, Y)
  kSigmoidGrad,  // (dY, Y)
  kClipGrad,     // (dY, X), with a and b as min and max
};

// y[i] = op(x[i]) for n elements.
cudaError_t unary(Unary op, const float *x, float *y, int64_t n, float a, float b,
                  cudaStream_t stream);

// out = op(lhs, rhs) over `shape`, each operand read through its strides
// (0 along dims it broadcasts over); a and b are ClipGrad's bounds.
cudaError_t binary(Binary op, const float *lhs, const Dims &lhs_strides, const float *rhs,
                   const Dims &rhs_strides, float *out, const Dims &shape, float a, float b,
                   cudaStream_t stream);

// The same for integers (`bytes` 4 or 8; Add, Sub and Mul only), wrapping on
// overflow as the CPU kernels do.
cudaError_t binary_int(Binary op, const void *lhs, const Dims &lhs_strides, const void *rhs,
                       const Dims &rhs_strides, void *out, const Dims &shape, int bytes,
                       cudaStream_t stream);

// out (shape) = x read through `strides`: a broadcast copy (Expand, Gemm's C).
cudaError_t broadcast_copy(const float *x, const Dims &strides, float *out, const Dims &shape,
                           cudaStream_t stream);

// Y = X with dims permuted: out dim i is in dim perm[i]; `in_shape` is X's.
// `element_bytes` is 1, 2, 4 or 8.
cudaError_t transpose(const void *x, const Dims &in_shape, const int *perm, void *y,
                      int element_bytes, cudaStream_t stream);

// y (shape) = x[base + offset of each y element through `strides`] (Slice; a
// stride may be negative); `element_bytes` 1, 2, 4 or 8.
cudaError_t strided_copy(const void *x, int64_t base, const Dims &strides, void *y,
                         const Dims &shape, int element_bytes, cudaStream_t stream);
// y[base + offset of each x element through `strides`] = x (shape): SliceGrad's
// write into zeros (the caller clears y first).
cudaError_t strided_scatter(const void *x, const Dims &shape, void *y, int64_t base,
                            const Dims &strides, int element_bytes, cudaStream_t stream);
// Y = cond ? X : Z, broadcast together (cond is bool bytes; X, Z any element).
cudaError_t where(const uint8_t *cond, const Dims &cond_strides, const void *x,
                  const Dims &x_strides, const void *z, const Dims &z_strides, void *y,
                  const Dims &shape, int element_bytes, cudaStream_t stream);
// Cast between f32, i32, i64 and bool as the CPU does: float to integer
// truncates toward zero and saturates (NaN gives 0); to bool is != 0.
enum class Elem : int { kF32, kI32, kI64, kBool };
cudaError_t cast(const void *x, Elem from, void *y, Elem to, int64_t n, cudaStream_t stream);

// Sum (divided by `divisor`: 1 for a sum, the count for a mean) or max over the
// reduced dims: `shape` is the input's; reduced[d] for a reduced dim. Output
// dims keep their order, the reduced ones dropped. One thread per output
// element summing in double in index order, or a block per output when few
// outputs each fold many elements (a fixed tree); deterministic either way.
enum class Reduce : int { kSum, kMax };
cudaError_t reduce(Reduce op, const float *x, const Dims &shape, const bool *reduced,
                   double divisor, float *y, cudaStream_t stream);

// ReduceMaxGrad: dX (shape) is zero except at the first maximum of each
// reduced group of X (a NaN counts as the maximum), which gets the group's dY.
cudaError_t reduce_max_grad(const float *dy, const float *x, const Dims &shape, const bool *reduced,
                            float *dx, cudaStream_t stream);

// Softmax (or log-softmax) of X along a dim of size `axis`, with `outer` blocks
// before it and `inner` elements after it.
cudaError_t softmax(const float *x, float *y, int64_t outer, int64_t axis, int64_t inner, bool log,
                    cudaStream_t stream);
// dX from dY and Y: softmax: Y * (dY - sum(dY * Y)); log: dY - e^Y * sum(dY).
cudaError_t softmax_grad(const float *dy, const float *y, float *dx, int64_t outer, int64_t axis,
                         int64_t inner, bool log, cudaStream_t stream);

// LayerNorm over rows of `cols` elements: y = (x - mean) / sqrt(var + eps) *
// scale + bias (biased variance).
cudaError_t layer_norm(const float *x, const float *scale, const float *bias, float *y,
                       int64_t rows, int64_t cols, double epsilon, cudaStream_t stream);
// dX, dScale, dBias. dScale and dBias are summed over rows in row order by one
// thread per column (deterministic); `stats` is scratch for 2 * rows doubles.
cudaError_t layer_norm_grad(const float *dy, const float *x, const float *scale, float *dx,
                            float *dscale, float *dbias, int64_t rows, int64_t cols, double epsilon,
                            double *stats, cudaStream_t stream);

// Batch norm over X [batch, channels, inner] per channel, one block per
// channel, statistics in double as on the CPU (the f32 mean m centres X before
// squaring; sum (x - mean)^2 = sum (x - m)^2 - count (mean - m)^2).
// training: the batch's mean and biased variance; else `mean` and `var`.
cudaError_t batch_norm(const float *x, const float *scale, const float *bias, const float *mean,
                       const float *var, float *y, int64_t batch, int64_t channels, int64_t inner,
                       double epsilon, bool training, cudaStream_t stream);
// The batch's mean and unbiased variance per channel (BatchNormStats).
cudaError_t batch_norm_stats(const float *x, float *mean, float *var, int64_t batch,
                             int64_t channels, int64_t inner, cudaStream_t stream);
// dX, dScale, dBias of training-form batch norm (BatchNormalizationGrad).
cudaError_t batch_norm_grad(const float *dy, const float *x, const float *scale, float *dx,
                            float *dscale, float *dbias, int64_t batch, int64_t channels,
                            int64_t inner, double epsilon, cudaStream_t stream);

// Cross entropy of softmax(logits [rows, classes]) against integer labels
// (i32 or i64, `label_bytes` 4 or 8). `row_loss` (scratch for rows doubles)
// gets each row's loss (0 for ignored rows); `loss` gets the reduction:
// reduction 0 = mean over counted rows, 1 = sum (both in double, in row
// order), 2 = none (loss has one element per row). Labels outside
// [0, classes) that are not `ignore_index` set *bad_label (a device int) to 1.
cudaError_t cross_entropy(const float *logits, const void *labels, int label_bytes, int64_t rows,
                          int64_t classes, int64_t ignore_index, int reduction, double *row_loss,
                          float *loss, int *bad_label, cudaStream_t stream);
// Megatron's vocabulary-parallel cross entropy, over this member's piece of
// the logits ([rows, classes], classes [first, first + classes) of `total`):
// vocab_parallel_stats writes per row the piece's max, sum of e^(x - max)
// and the label's logit where the piece holds it (else 0); from every
// member's three (gathered: [rows, 3 parts]) vocab_parallel_cross_entropy
// reduces the rows' losses as cross_entropy does (`row_loss` scratch for rows
// doubles) and vocab_parallel_cross_entropy_grad writes d piece = (softmax -
// onehot) * dLoss (`weight` scratch for one double). Labels outside [0,
// total) that are not ignore_index set *bad_label.
cudaError_t vocab_parallel_stats(const float *piece, const void *labels, int label_bytes,
                                 int64_t rows, int64_t classes, int64_t first, int64_t total,
                                 int64_t ignore_index, float *stats, int *bad_label,
                                 cudaStream_t stream);
cudaError_t vocab_parallel_cross_entropy(const void *labels, int label_bytes, const float *stats,
                                         int64_t rows, int64_t parts, int64_t total,
                                         int64_t ignore_index, int reduction, double *row_loss,
                                         float *loss, int *bad_label, cudaStream_t stream);
cudaError_t vocab_parallel_cross_entropy_grad(const float *dloss, const float *piece,
                                              const void *labels, int label_bytes,
                                              const float *stats, int64_t rows, int64_t classes,
                                              int64_t parts, int64_t first, int64_t ignore_index,
                                              int reduction, float *dpiece, int *bad_label,
                                              double *weight, cudaStream_t stream);
// d logits = (softmax - onehot) * dLoss (per row for reduction none, divided by
// the counted rows for mean); a bad label sets *bad_label. `weight` is scratch
// for one double.
cudaError_t cross_entropy_grad(const float *dloss, const float *logits, const void *labels,
                               int label_bytes, int64_t rows, int64_t classes, int64_t ignore_index,
                               int reduction, float *dlogits, int *bad_label, double *weight,
                               cudaStream_t stream);

// Gather along an axis: data [outer, axis_size, inner], indices (i32 or i64,
// n of them) -> out [outer, n, inner]. Negative indices count from the end;
// an index out of range sets *bad_index and writes zeros. A table split by
// rows over tensor-parallel members (Megatron's vocabulary-parallel
// embedding): `data` holds rows [first, first + axis_size) of `bound`, and
// the other members' rows read as zeros (bound 0: the whole table).
cudaError_t gather(const float *data, int64_t outer, int64_t axis_size, int64_t inner,
                   const void *indices, int index_bytes, int64_t n, float *out, int *bad_index,
                   cudaStream_t stream, int64_t first = 0, int64_t bound = 0);
// dData [outer, axis_size, inner] = zeros plus dY rows added at the indices.
// Each output element sums its contributions in index order (deterministic);
// an index out of range sets *bad_index. With outer == 1 (an embedding table)
// the positions are first sorted by index with a stable radix sort (CUB), so
// the work is one pass over dY, when `scratch` (`scratch_bytes` of it) holds
// gather_grad_scratch(n, axis_size) bytes; else the unsorted kernel, n reads
// per element. With `first` and `bound` as gather's: only this member's rows.
cudaError_t gather_grad(const float *dy, int64_t outer, int64_t axis_size, int64_t inner,
                        const void *indices, int index_bytes, int64_t n, float *ddata,
                        int *bad_index, void *scratch, size_t scratch_bytes, cudaStream_t stream,
                        int64_t first = 0, int64_t bound = 0);
size_t gather_grad_scratch(int64_t n, int64_t axis_size);

// A pooling window over planes of h x w (MaxPool2d, AveragePool2d): output
// size out_h x out_w as the op inferred it (ONNX rounding, ceil mode).
struct Window {
  int64_t planes = 0, h = 0, w = 0, out_h = 0, out_w = 0;
  int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  bool include_pad = false; // average: padded positions count in the divisor
};
// Max pooling (padding never wins, NaN does) or average pooling, one thread per
// output element.
cudaError_t pool(bool max, const Window &window, const float *x, float *y, cudaStream_t stream);
// dX of either pool from dY (and X for max: the gradient goes to each window's
// first maximum). One thread per dX element gathers the windows that reach it
// in output order, so sums run in the CPU kernel's order.
cudaError_t pool_grad(bool max, const Window &window, const float *dy, const float *x, float *dx,
                      cudaStream_t stream);
// dX [planes, size] = dY[plane] / size (GlobalAveragePool's gradient).
cudaError_t spread_mean(const float *dy, float *dx, int64_t planes, int64_t size,
                        cudaStream_t stream);

// Gradient-norm pieces. Each input's sum of squares (in double) is reduced by
// up to kNormBlocks blocks into `partials` (kNormBlocks doubles per input,
// unused ones zero); the finishing kernels add them in a fixed order.
constexpr int kNormBlocks = 128;
cudaError_t sum_squares_partials(const float *x, int64_t n, double *partials, cudaStream_t stream);
// GlobalNormScale: scale = min(1, max_norm / (sqrt(total) + 1e-6)).
// SumOfSquares: out f32[2] = (hi, lo), hi = float(total), lo = float(total - hi).
cudaError_t finish_norm(const double *partials, int64_t inputs, bool pair, double max_norm,
                        float *out, cudaStream_t stream);
// NormScale over SumOfSquares pairs: acc (one double) += hi + lo of `pair`
// (first: acc = it), then finish_pairs writes the scale.
cudaError_t add_pair(const float *pair, bool first, double *acc, cudaStream_t stream);
cudaError_t finish_pairs(const double *acc, double max_norm, float *scale, cudaStream_t stream);

// Training Dropout: y = x * scale where the top 24 bits of hash(seed, step, i)
// are >= threshold, else 0 (the CPU kernel's counter-based hash); `step` may
// be null (step 0), an i32 or an i64 (`step_bytes`).
cudaError_t dropout(const float *x, float *y, int64_t n, uint64_t seed, const void *step,
                    int step_bytes, uint64_t threshold, float scale, cudaStream_t stream);

// MseLoss: reduction 2 (none) writes (p - t)^2 per element; 0 (mean) and 1
// (sum) reduce double(p - t)^2 through `partials` (kNormBlocks doubles).
cudaError_t mse_loss(const float *p, const float *t, int64_t n, int reduction, double *partials,
                     float *loss, cudaStream_t stream);
// dP = 2 w (p - t) in double, dT = -dP; w = dLoss[i] (none), dLoss (sum) or
// dLoss / n (mean).
cudaError_t mse_loss_grad(const float *dloss, const float *p, const float *t, int64_t n,
                          int reduction, float *dp, float *dt, cudaStream_t stream);

// An elementwise chain run as one kernel (passes/fuse_elementwise.h): each
// element goes through the steps in order, each a unary map or a binary of
// the running value and the chain's operands, and only the last value is
// written. Operand k >= 0 is input k, read at the element (mode 0), its one
// element (mode 1), or through its broadcast strides over `shape` (mode 2);
// -1 is the running value.
constexpr int kMaxFused = 16;
struct FusedStep {
  int binary = 0; // 0: Unary op, 1: Binary op
  int op = 0;
  int lhs = -1, rhs = -1;
  float a = 0, b = 0; // Clip's and ClipGrad's bounds
};
struct Fused {
  int steps = 0, inputs = 0;
  FusedStep step[kMaxFused];
  const float *input[kMaxFused] = {};
  int mode[kMaxFused] = {};
  Dims shape;                   // the chain's output shape
  Dims strides[kMaxFused] = {}; // mode 2: the input's broadcast strides
};
cudaError_t fused_elementwise(const Fused &program, float *out, int64_t n, cudaStream_t stream);

// y = x rounded to bfloat16 (to nearest, ties to even), as raw bits: the
// operands of a GEMM under --precision bf16.
cudaError_t to_bf16(const float *x, uint16_t *y, int64_t n, cudaStream_t stream);

// --precision f16: a GEMM operand in f16 scaled by a power of two, 2^s, that
// puts its largest magnitude just under 2^14 (so small gradients do not
// underflow f16's range and large values do not overflow it: per-operand
// scaling, no loss scaling). f16_amax raises *amax_bits (set to 0 first) to
// the bits of max |x| over x's finite elements (non-negative floats order as
// their bits); to_f16_scaled writes y = f16(x 2^s) for operand 0 (A) or 1
// (B), s from amax[0] and amax[1] (A's and B's: when both are tiny, their
// shifts are capped together so the product's unscaling stays a normal
// float); and f16_gemm_scalars writes {alpha 2^-(s_a + s_b), beta}, the
// product's scalars undoing both scales (device-side, for a captured step).
cudaError_t f16_amax(const float *x, int64_t n, unsigned *amax_bits, cudaStream_t stream);
cudaError_t to_f16_scaled(const float *x, uint16_t *y, int64_t n, const unsigned *amax, int operand,
                          cudaStream_t stream);
cudaError_t f16_gemm_scalars(const unsigned *amax, float alpha, float beta, float *scalars,
                             cudaStream_t stream);

// *any = 1 if any of the n flags is set, else 0 (one thread, in order).
cudaError_t any_flag(const int *flags, int64_t n, int *any, cudaStream_t stream);
// dst = src (bytes) unless *any: a step whose device checks failed writes no
// state update, as the CPU executor stops before its updates.
cudaError_t guarded_copy(void *dst, const void *src, int64_t bytes, const int *any,
                         cudaStream_t stream);

// Pipeline plans (runtime/cuda/cuda_pipeline.h): acc += src (a gradient summed
// over micro-batches, in micro-batch order), and acc /= divisor (their mean).
cudaError_t accumulate(float *acc, const float *src, int64_t n, cudaStream_t stream);
cudaError_t divide(float *acc, float divisor, int64_t n, cudaStream_t stream);
// A group's sum on one GPU: every out[o] = ((in[0] + in[1]) + in[2]) + ..., the
// members in group order, as the CPU communicator sums. In sum_members an out
// may be an in (in place: every element reads all ins before writing it);
// not in sum_members_block, whose reads and writes are at other offsets. Up to kMaxMembers
// buffers each way, passed by value.
constexpr int kMaxMembers = 64;
struct Members {
  int count = 0, outs = 0;
  const float *in[kMaxMembers] = {};
  float *out[kMaxMembers] = {};
};
// n elements of each in and out.
cudaError_t sum_members(const Members &members, int64_t n, cudaStream_t stream);
// The sum of one column block of row-major ins: out element (row, e) of
// [rows, run] is the sum of in element row * pitch + offset + e (a
// reduce-scatter's piece of a tensor cut along a dim).
cudaError_t sum_members_block(const Members &members, int64_t rows, int64_t run, int64_t pitch,
                              int64_t offset, cudaStream_t stream);

// The learning rate schedule of the LearningRate op, from the device step.
struct Schedule {
  double base_lr = 0, min_lr = 0;
  bool cosine = false;
  int64_t warmup = 0, total = 0;
};
cudaError_t learning_rate(const Schedule &schedule, const int64_t *step, float *lr,
                          cudaStream_t stream);

// SGD (PyTorch semantics; see ops_optimizer.cc): buf and new_buf may be null
// (no momentum); `step` may be null (no first-step copy).
struct SgdParams {
  float momentum = 0, weight_decay = 0;
  float keep = 1; // 1 - dampening, rounded once from double
  bool nesterov = false;
};
cudaError_t sgd(const SgdParams &p, const float *param, const float *grad, const float *lr,
                const float *buf, const int64_t *step, float *new_param, float *new_buf, int64_t n,
                cudaStream_t stream);

struct AdamParams {
  double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8, weight_decay = 0;
  bool decoupled = false;
};
// A negative step sets *bad_step; the outputs are then the inputs unchanged.
cudaError_t adam(const AdamParams &p, const float *param, const float *grad, const float *m,
                 const float *v, const float *lr, const int64_t *step, float *new_param,
                 float *new_m, float *new_v, int64_t n, int *bad_step, cudaStream_t stream);

} // namespace strata::cuda
