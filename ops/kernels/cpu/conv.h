// Two-dimensional convolution on the CPU, NCHW activations and MCkHkW weights
// (ONNX Conv): Y[n, m] = sum over the channels of m's group of X * W, plus bias.
#pragma once

#include <cstdint>

#include "graph/status.h"

namespace strata::ops::cpu {

// Every size of one convolution; out_h and out_w follow from the rest
// (floor((in + pads - dilation * (kernel - 1) - 1) / stride) + 1).
struct Conv2dParams {
  int64_t batch = 0;
  int64_t in_channels = 0;
  int64_t in_h = 0;
  int64_t in_w = 0;
  int64_t out_channels = 0;
  int64_t kernel_h = 0;
  int64_t kernel_w = 0;
  int64_t group = 1;
  int64_t stride_h = 1;
  int64_t stride_w = 1;
  int64_t pad_top = 0;
  int64_t pad_left = 0;
  int64_t pad_bottom = 0;
  int64_t pad_right = 0;
  int64_t dilation_h = 1;
  int64_t dilation_w = 1;
  int64_t out_h = 0;
  int64_t out_w = 0;
};

// Y = conv(X, W) (+ bias, which may be null). Uses a cached oneDNN convolution
// primitive when oneDNN is built in, else im2col and sgemm.
Status conv2d_forward(const Conv2dParams &params, const float *x, const float *w, const float *bias,
                      float *y);

// The im2col + sgemm path, always built; conv2d_forward falls back to it.
Status conv2d_forward_im2col(const Conv2dParams &params, const float *x, const float *w,
                             const float *bias, float *y);

// The gradients of Y = conv(X, W) given dY (bias gradients are a plain sum of dY
// over N, H and W). backward_data writes dX [N, C, H, W]; backward_weights writes
// dW [M, C/group, kH, kW]. Both overwrite their output. With oneDNN they run a
// cached backward primitive on the plain layouts, else im2col / col2im and sgemm.
// Results are the same bits for the same inputs and thread count.
Status conv2d_backward_data(const Conv2dParams &params, const float *dy, const float *w, float *dx);
Status conv2d_backward_weights(const Conv2dParams &params, const float *dy, const float *x,
                               float *dw);

// The im2col paths of the two above, always built.
Status conv2d_backward_data_im2col(const Conv2dParams &params, const float *dy, const float *w,
                                   float *dx);
Status conv2d_backward_weights_im2col(const Conv2dParams &params, const float *dy, const float *x,
                                      float *dw);

// Number of distinct oneDNN convolution primitives created so far (0 without
// oneDNN); repeated runs of one shape reuse a primitive.
int64_t conv2d_primitive_cache_size();
// The same for the backward (data and weights) primitives.
int64_t conv2d_backward_primitive_cache_size();

} // namespace strata::ops::cpu
