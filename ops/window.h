// The sliding window of Conv2d and the pools, as their attributes give it;
// shared by the CPU kernels and the CUDA backend.
#pragma once

#include "ops/registry.h"

namespace strata::ops {

struct Window {
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  bool ceil_mode = false;
  int64_t extent_h() const { return (kernel_h - 1) * dilation_h + 1; }
  int64_t extent_w() const { return (kernel_w - 1) * dilation_w + 1; }
};

// Reads strides, pads and (where the op has them) kernel_shape, dilations and
// ceil_mode; an error names the attribute with the wrong count or a value out
// of range.
Result<Window> read_window(const OpDef &def, const AttrReader &attrs);

// Why cuDNN's pooling would not compute a pool of X (`x`, [N, C, H, W]) to Y
// (`y`) over `window` as strata defines it, or empty when it would: cuDNN
// pads both sides alike, has no dilation, sizes the output by rounding down,
// needs every window to reach into the input (strata's max of a window wholly
// in the padding is -inf, cuDNN's the lowest float), non-empty tensors and
// 32-bit sizes. The CUDA backend falls back to its
// own kernels where this is not empty.
std::string cudnn_pool_mismatch(const Window &window, llvm::ArrayRef<int64_t> x,
                                llvm::ArrayRef<int64_t> y);
// The same for batch norm over X as [batch, channels, inner] (`training`:
// with the batch's statistics, and for the gradient): a non-negative epsilon,
// at least two values per channel, 32-bit sizes, and a batch within what
// cuDNN's spatial kernels take (65535 for inference, 880801 for training;
// PyTorch's limits, from CUDNN_STATUS_NOT_SUPPORTED reports).
//
// Where cuDNN takes a node it agrees with strata within rounding, with two
// exceptions: its batch statistics are f32 sums (strata's CPU and CUDA
// kernels sum in double; a channel with a large mean and a tiny variance
// drifts further), and a max-pooling window holding several NaNs sends its
// gradient to the first, strata's kernels to the last (as PyTorch does).
std::string cudnn_batch_norm_mismatch(int64_t batch, int64_t channels, int64_t inner,
                                      double epsilon, bool training);

} // namespace strata::ops
