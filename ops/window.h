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

} // namespace strata::ops
