// Conv2d and its two gradients, pooling and batch norm through cuDNN.
//
// These use cuDNN's descriptor API (cudnnConvolutionForward and friends), which
// cuDNN 9 still ships but marks deprecated in favour of its graph API; the
// deprecation warnings are silenced in this file only. Algorithms come from
// cuDNN's heuristics, restricted to deterministic ones that fit the shared
// workspace, with FMA math (no TF32) unless --tf32 allows tensor cores, so a
// replayed step equals an eager one bitwise and f32 results stay near the CPU's.
#include "ops/kernels/cuda/cuda_ops.h"

#include "strata_config.h"

#include <memory>

#if STRATA_HAVE_CUDNN
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include <cudnn.h>

#include "ops/kernels/cuda/cuda_status.h"
#endif

namespace strata::cuda {

#if !STRATA_HAVE_CUDNN

std::vector<CudaOp> cudnn_ops() { return {}; }
Status cudnn_pool(const CudaKernelContext &c, bool, const Window &) {
  return failed_precondition(c.def.name, ": this strata was built without cuDNN");
}
Status cudnn_pool_grad(const CudaKernelContext &c, bool, const Window &) {
  return failed_precondition(c.def.name, ": this strata was built without cuDNN");
}
Status cudnn_batch_norm(const CudaKernelContext &c, int64_t, int64_t, int64_t, double, bool) {
  return failed_precondition(c.def.name, ": this strata was built without cuDNN");
}
Status cudnn_batch_norm_grad(const CudaKernelContext &c, int64_t, int64_t, int64_t, double) {
  return failed_precondition(c.def.name, ": this strata was built without cuDNN");
}
Result<void *> start_cudnn(cudaStream_t) {
  return failed_precondition("this strata was built without cuDNN");
}
void destroy_cudnn(void *) {}

#else

namespace {

// The descriptors of one convolution; destroyed with it.
struct Convolution {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnMathType_t math = CUDNN_FMA_MATH;
  ~Convolution() {
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (bias) cudnnDestroyTensorDescriptor(bias);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
};

Status tensor4d(cudnnTensorDescriptor_t *desc, llvm::ArrayRef<int64_t> shape) {
  RETURN_IF_ERROR(cudnn_status(cudnnCreateTensorDescriptor(desc), "tensor descriptor"));
  return cudnn_status(
      cudnnSetTensor4dDescriptor(*desc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                                 static_cast<int>(shape[0]), static_cast<int>(shape[1]),
                                 static_cast<int>(shape[2]), static_cast<int>(shape[3])),
      "tensor descriptor");
}

// X [N, C, H, W], W [M, C / group, kH, kW], Y [N, M, oH, oW].
Status describe(const CudaKernelContext &c, llvm::ArrayRef<int64_t> x, llvm::ArrayRef<int64_t> w,
                llvm::ArrayRef<int64_t> y, Convolution *conv) {
  ops::AttrReader attrs = c.attrs();
  const std::vector<int64_t> strides = attrs.get_ints("strides");
  const std::vector<int64_t> pads = attrs.get_ints("pads");
  const std::vector<int64_t> dilations = attrs.get_ints("dilations");
  const int64_t group = attrs.get_int("group");
  if (strides.size() != 2 || pads.size() != 4 || dilations.size() != 2)
    return invalid_argument(c.def.name, ": needs 2 strides, 4 pads and 2 dilations");
  if (pads[0] != pads[2] || pads[1] != pads[3])
    return unimplemented(c.def.name, ": cuDNN pads both sides alike; pads [", pads[0], ", ",
                         pads[1], ", ", pads[2], ", ", pads[3],
                         "] (top, left, bottom, right) differ (run it with --backend cpu)");
  for (llvm::ArrayRef<int64_t> shape : {x, w, y})
    for (int64_t d : shape)
      if (d > (int64_t{1} << 31) - 1)
        return unimplemented(c.def.name, ": a dim of ", shape_to_string(shape),
                             " is too large for cuDNN's 32-bit descriptors");
  RETURN_IF_ERROR(tensor4d(&conv->x, x));
  RETURN_IF_ERROR(tensor4d(&conv->y, y));
  RETURN_IF_ERROR(cudnn_status(cudnnCreateFilterDescriptor(&conv->w), "filter descriptor"));
  RETURN_IF_ERROR(
      cudnn_status(cudnnSetFilter4dDescriptor(conv->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                              static_cast<int>(w[0]), static_cast<int>(w[1]),
                                              static_cast<int>(w[2]), static_cast<int>(w[3])),
                   "filter descriptor"));
  RETURN_IF_ERROR(
      cudnn_status(cudnnCreateConvolutionDescriptor(&conv->conv), "convolution descriptor"));
  RETURN_IF_ERROR(cudnn_status(cudnnSetConvolution2dDescriptor(
                                   conv->conv, static_cast<int>(pads[0]), static_cast<int>(pads[1]),
                                   static_cast<int>(strides[0]), static_cast<int>(strides[1]),
                                   static_cast<int>(dilations[0]), static_cast<int>(dilations[1]),
                                   CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                               "convolution descriptor"));
  RETURN_IF_ERROR(cudnn_status(cudnnSetConvolutionGroupCount(conv->conv, static_cast<int>(group)),
                               "group count"));
  conv->math = c.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  return cudnn_status(cudnnSetConvolutionMathType(conv->conv, conv->math), "math type");
}

// The first (fastest by cuDNN's heuristics) usable algorithm of `perf`:
// succeeded, deterministic, fits the workspace, and without TF32 unless allowed.
template <typename Perf>
Result<Perf> pick(const CudaKernelContext &c, const Perf *perf, int count, bool tf32) {
  for (int i = 0; i < count; ++i) {
    const Perf &p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.determinism != CUDNN_DETERMINISTIC ||
        p.memory > c.workspace_bytes)
      continue;
    // For f32 on Ampere and later, DEFAULT_MATH may use TF32: only FMA_MATH
    // keeps full f32; with --tf32 anything but down-conversion below TF32.
    const bool math_ok =
        tf32 ? p.mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION : p.mathType == CUDNN_FMA_MATH;
    if (!math_ok) continue;
    return p;
  }
  return unimplemented(c.def.name, ": cuDNN offers no deterministic algorithm that fits the ",
                       c.workspace_bytes >> 20, " MiB workspace");
}

constexpr int kAlgorithms = 8;

// A convolution's descriptors and chosen algorithm, kept per node: a node's
// shapes never change, so the first step's choice serves every later one (and
// the captured step runs the algorithm the eager one ran).
template <typename Algo> struct ConvPlan {
  Convolution conv;
  Algo algo{};
};

// The node's plan from its cache slot, or made: descriptors for X, W, Y, then
// cuDNN's heuristics through `query(conv, perf, &found)`, then pick().
template <typename Perf, typename Query>
auto plan_conv(const CudaKernelContext &c, llvm::ArrayRef<int64_t> x, llvm::ArrayRef<int64_t> w,
               llvm::ArrayRef<int64_t> y, Query query)
    -> Result<std::shared_ptr<ConvPlan<decltype(Perf{}.algo)>>> {
  using Plan = ConvPlan<decltype(Perf{}.algo)>;
  if (c.cache != nullptr && *c.cache != nullptr) return std::static_pointer_cast<Plan>(*c.cache);
  auto plan = std::make_shared<Plan>();
  RETURN_IF_ERROR(describe(c, x, w, y, &plan->conv));
  Perf perf[kAlgorithms];
  int found = 0;
  RETURN_IF_ERROR(cudnn_status(query(plan->conv, perf, &found), "algorithm"));
  ASSIGN_OR_RETURN(Perf chosen, pick(c, perf, found, c.tf32));
  if (c.tf32)
    RETURN_IF_ERROR(
        cudnn_status(cudnnSetConvolutionMathType(plan->conv.conv, chosen.mathType), "math type"));
  plan->algo = chosen.algo;
  if (c.cache != nullptr) *c.cache = plan;
  return plan;
}

Status conv_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0, 1, 2}));
  auto handle = static_cast<cudnnHandle_t>(c.cudnn);
  ASSIGN_OR_RETURN(auto plan,
                   plan_conv<cudnnConvolutionFwdAlgoPerf_t>(
                       c, c.inputs[0].shape(), c.inputs[1].shape(), c.outputs[0].shape(),
                       [&](const Convolution &v, cudnnConvolutionFwdAlgoPerf_t *perf, int *found) {
                         return cudnnGetConvolutionForwardAlgorithm_v7(
                             handle, v.x, v.w, v.conv, v.y, kAlgorithms, found, perf);
                       }));
  Convolution &conv = plan->conv;
  const float one = 1.0f, zero = 0.0f;
  RETURN_IF_ERROR(
      cudnn_status(cudnnConvolutionForward(handle, &one, conv.x, c.inputs[0].data, conv.w,
                                           c.inputs[1].data, conv.conv, plan->algo, c.workspace,
                                           c.workspace_bytes, &zero, conv.y, c.outputs[0].data),
                   "convolution"));
  if (c.inputs.size() < 3) return Status::ok();
  if (conv.bias == nullptr) {
    const int64_t bias_shape[4] = {1, c.outputs[0].shape()[1], 1, 1};
    RETURN_IF_ERROR(tensor4d(&conv.bias, bias_shape));
  }
  return cudnn_status(
      cudnnAddTensor(handle, &one, conv.bias, c.inputs[2].data, &one, conv.y, c.outputs[0].data),
      "bias");
}

// Conv2dGradInput(dY, W) -> dX.
Status conv_grad_input_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0, 1}));
  auto handle = static_cast<cudnnHandle_t>(c.cudnn);
  ASSIGN_OR_RETURN(auto plan, plan_conv<cudnnConvolutionBwdDataAlgoPerf_t>(
                                  c, c.outputs[0].shape(), c.inputs[1].shape(), c.inputs[0].shape(),
                                  [&](const Convolution &v, cudnnConvolutionBwdDataAlgoPerf_t *perf,
                                      int *found) {
                                    return cudnnGetConvolutionBackwardDataAlgorithm_v7(
                                        handle, v.w, v.y, v.conv, v.x, kAlgorithms, found, perf);
                                  }));
  const Convolution &conv = plan->conv;
  const float one = 1.0f, zero = 0.0f;
  return cudnn_status(cudnnConvolutionBackwardData(handle, &one, conv.w, c.inputs[1].data, conv.y,
                                                   c.inputs[0].data, conv.conv, plan->algo,
                                                   c.workspace, c.workspace_bytes, &zero, conv.x,
                                                   c.outputs[0].data),
                      "backward data");
}

// Conv2dGradWeight(dY, X) -> dW.
Status conv_grad_weight_op(const CudaKernelContext &c) {
  RETURN_IF_ERROR(expect_f32(c, {0, 1}));
  auto handle = static_cast<cudnnHandle_t>(c.cudnn);
  ASSIGN_OR_RETURN(auto plan, plan_conv<cudnnConvolutionBwdFilterAlgoPerf_t>(
                                  c, c.inputs[1].shape(), c.outputs[0].shape(), c.inputs[0].shape(),
                                  [&](const Convolution &v,
                                      cudnnConvolutionBwdFilterAlgoPerf_t *perf, int *found) {
                                    return cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                                        handle, v.x, v.y, v.conv, v.w, kAlgorithms, found, perf);
                                  }));
  const Convolution &conv = plan->conv;
  const float one = 1.0f, zero = 0.0f;
  return cudnn_status(cudnnConvolutionBackwardFilter(handle, &one, conv.x, c.inputs[1].data, conv.y,
                                                     c.inputs[0].data, conv.conv, plan->algo,
                                                     c.workspace, c.workspace_bytes, &zero, conv.w,
                                                     c.outputs[0].data),
                      "backward filter");
}

// ---- pooling and batch norm ---------------------------------------------------------

// A pooling node's descriptors: X [N, C, H, W] and Y [N, C, oH, oW].
struct PoolPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnPoolingDescriptor_t pool = nullptr;
  ~PoolPlan() {
    if (pool) cudnnDestroyPoolingDescriptor(pool);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
};

Result<std::shared_ptr<PoolPlan>> plan_pool(const CudaKernelContext &c, bool max, const Window &w,
                                            llvm::ArrayRef<int64_t> x, llvm::ArrayRef<int64_t> y) {
  if (c.cache != nullptr && *c.cache != nullptr)
    return std::static_pointer_cast<PoolPlan>(*c.cache);
  auto plan = std::make_shared<PoolPlan>();
  RETURN_IF_ERROR(tensor4d(&plan->x, x));
  RETURN_IF_ERROR(tensor4d(&plan->y, y));
  RETURN_IF_ERROR(cudnn_status(cudnnCreatePoolingDescriptor(&plan->pool), "pooling descriptor"));
  // Max: padding never wins and NaN propagates, as in strata's kernels; the
  // deterministic mode keeps a replayed step bitwise equal to an eager one.
  // Average: the divisor counts padding only with count_include_pad.
  const cudnnPoolingMode_t mode = max             ? CUDNN_POOLING_MAX_DETERMINISTIC
                                  : w.include_pad ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                                  : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
  RETURN_IF_ERROR(cudnn_status(
      cudnnSetPooling2dDescriptor(plan->pool, mode, CUDNN_PROPAGATE_NAN,
                                  static_cast<int>(w.kernel_h), static_cast<int>(w.kernel_w),
                                  static_cast<int>(w.pad_top), static_cast<int>(w.pad_left),
                                  static_cast<int>(w.stride_h), static_cast<int>(w.stride_w)),
      "pooling descriptor"));
  int n = 0, channels = 0, out_h = 0, out_w = 0;
  RETURN_IF_ERROR(cudnn_status(
      cudnnGetPooling2dForwardOutputDim(plan->pool, plan->x, &n, &channels, &out_h, &out_w),
      "pooling output size"));
  if (out_h != w.out_h || out_w != w.out_w)
    return internal_error(c.def.name, ": cuDNN pools to ", out_h, "x", out_w, ", the node to ",
                          w.out_h, "x", w.out_w);
  if (c.cache != nullptr) *c.cache = plan;
  return plan;
}

// A batch-norm node's descriptors: X as [batch, channels, inner, 1] and the
// per-channel parameters as [1, channels, 1, 1].
struct NormPlan {
  cudnnTensorDescriptor_t x = nullptr, channel = nullptr;
  ~NormPlan() {
    if (channel) cudnnDestroyTensorDescriptor(channel);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
};

Result<std::shared_ptr<NormPlan>> plan_norm(const CudaKernelContext &c, int64_t batch,
                                            int64_t channels, int64_t inner) {
  if (c.cache != nullptr && *c.cache != nullptr)
    return std::static_pointer_cast<NormPlan>(*c.cache);
  auto plan = std::make_shared<NormPlan>();
  const int64_t x[4] = {batch, channels, inner, 1}, channel[4] = {1, channels, 1, 1};
  RETURN_IF_ERROR(tensor4d(&plan->x, x));
  RETURN_IF_ERROR(tensor4d(&plan->channel, channel));
  if (c.cache != nullptr) *c.cache = plan;
  return plan;
}

} // namespace

Status cudnn_pool(const CudaKernelContext &c, bool max, const Window &w) {
  auto handle = static_cast<cudnnHandle_t>(c.cudnn);
  ASSIGN_OR_RETURN(auto plan, plan_pool(c, max, w, c.inputs[0].shape(), c.outputs[0].shape()));
  const float one = 1.0f, zero = 0.0f;
  return cudnn_status(cudnnPoolingForward(handle, plan->pool, &one, plan->x, c.inputs[0].data,
                                          &zero, plan->y, c.outputs[0].data),
                      "pooling");
}

// MaxPool2dGrad(dY, X) and AveragePool2dGrad(dY) -> dX.
Status cudnn_pool_grad(const CudaKernelContext &c, bool max, const Window &w) {
  auto handle = static_cast<cudnnHandle_t>(c.cudnn);
  ASSIGN_OR_RETURN(auto plan, plan_pool(c, max, w, c.outputs[0].shape(), c.inputs[0].shape()));
  const float one = 1.0f, zero = 0.0f;
  const void *dy = c.inputs[0].data;
  void *dx = c.outputs[0].data;
  // Average pooling's gradient does not depend on Y or X, but cuDNN takes
  // them (TensorFlow's AvgPoolGrad passes unset buffers): dY and dX stand in.
  if (!max)
    return cudnn_status(cudnnPoolingBackward(handle, plan->pool, &one, plan->y, dy, plan->y, dy,
                                             plan->x, dx, &zero, plan->x, dx),
                        "pooling gradient");
  if (c.scratch == nullptr || c.scratch_bytes < c.inputs[0].type->size_bytes())
    return internal_error(c.def.name, ": no room in its scratch for the recomputed output");
  const void *x = c.inputs[1].data;
  RETURN_IF_ERROR(cudnn_status(
      cudnnPoolingForward(handle, plan->pool, &one, plan->x, x, &zero, plan->y, c.scratch),
      "pooling (for its gradient)"));
  return cudnn_status(cudnnPoolingBackward(handle, plan->pool, &one, plan->y, c.scratch, plan->y,
                                           dy, plan->x, x, &zero, plan->x, dx),
                      "pooling gradient");
}

// BatchNormalization(X, scale, B, mean, var) -> Y, per channel over batch and
// inner: SPATIAL mode. Training normalizes with the batch's mean and biased
// variance and leaves the running statistics to BatchNormStats (none passed).
Status cudnn_batch_norm(const CudaKernelContext &c, int64_t batch, int64_t channels, int64_t inner,
                        double epsilon, bool training) {

  auto handle = static_cast<cudnnHandle_t>(c.cudnn);
  ASSIGN_OR_RETURN(auto plan, plan_norm(c, batch, channels, inner));
  const float one = 1.0f, zero = 0.0f;
  const void *x = c.inputs[0].data, *scale = c.inputs[1].data, *bias = c.inputs[2].data;
  void *y = c.outputs[0].data;
  if (training)
    return cudnn_status(
        cudnnBatchNormalizationForwardTraining(handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero,
                                               plan->x, x, plan->x, y, plan->channel, scale, bias,
                                               0.0, nullptr, nullptr, epsilon, nullptr, nullptr),
        "batch norm");
  return cudnn_status(cudnnBatchNormalizationForwardInference(
                          handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, plan->x, x, plan->x, y,
                          plan->channel, scale, bias, c.inputs[3].data, c.inputs[4].data, epsilon),
                      "batch norm");
}

// BatchNormalizationGrad(dY, X, scale) -> dX, dScale, dB; cuDNN recomputes the
// batch statistics from X (none saved).
Status cudnn_batch_norm_grad(const CudaKernelContext &c, int64_t batch, int64_t channels,
                             int64_t inner, double epsilon) {
  auto handle = static_cast<cudnnHandle_t>(c.cudnn);
  ASSIGN_OR_RETURN(auto plan, plan_norm(c, batch, channels, inner));
  const float one = 1.0f, zero = 0.0f;
  return cudnn_status(cudnnBatchNormalizationBackward(
                          handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero, plan->x,
                          c.inputs[1].data, plan->x, c.inputs[0].data, plan->x, c.outputs[0].data,
                          plan->channel, c.inputs[2].data, c.outputs[1].data, c.outputs[2].data,
                          epsilon, nullptr, nullptr),
                      "batch norm gradient");
}

std::vector<CudaOp> cudnn_ops() {
  return {CudaOp{"Conv2d", conv_op, nullptr, {}},
          CudaOp{"Conv2dGradInput", conv_grad_input_op, nullptr, {}},
          CudaOp{"Conv2dGradWeight", conv_grad_weight_op, nullptr, {}}};
}

Result<void *> start_cudnn(cudaStream_t stream) {
  cudnnHandle_t handle = nullptr;
  cudnnStatus_t status = cudnnCreate(&handle);
  if (status == CUDNN_STATUS_SUCCESS) status = cudnnSetStream(handle, stream);
  if (status != CUDNN_STATUS_SUCCESS) {
    if (handle) cudnnDestroy(handle);
    return cudnn_status(status, "could not start");
  }
  return static_cast<void *>(handle);
}

void destroy_cudnn(void *handle) {
  if (handle) cudnnDestroy(static_cast<cudnnHandle_t>(handle));
}

#endif

} // namespace strata::cuda
