#include "ops/kernels/cpu/conv.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "graph/units.h"
#include "ops/kernels/cpu/gemm.h"
#include "strata_config.h"

#if STRATA_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace strata::ops::cpu {
namespace {

// The error for memory a convolution could not get: how much, and for what.
// The caller adds which node (the executors name it).
Status out_of_memory(size_t bytes, std::string_view what) {
  return resource_exhausted("out of memory: ", what, " needs ",
                            human_bytes(static_cast<double>(bytes)), " (", bytes, " bytes)");
}

// A zeroed float buffer of `count` elements, or null where this host cannot
// give it (a huge patch matrix must be an error, not an exception).
std::unique_ptr<float[]> zeroed_floats(size_t count) {
  return std::unique_ptr<float[]>(new (std::nothrow) float[count]());
}

constexpr std::string_view kPatchMatrix = "a convolution's patch matrix (im2col)";

// Writes the patches of one group of one image as a [C/group * kH * kW, oH * oW]
// matrix; taps that fall into the padding are zero.
void im2col(const Conv2dParams &p, const float *x, int64_t channels, float *col) {
  const int64_t out_plane = p.out_h * p.out_w;
  for (int64_t c = 0; c < channels; ++c) {
    const float *plane = x + c * p.in_h * p.in_w;
    for (int64_t ky = 0; ky < p.kernel_h; ++ky) {
      for (int64_t kx = 0; kx < p.kernel_w; ++kx) {
        float *row = col + ((c * p.kernel_h + ky) * p.kernel_w + kx) * out_plane;
        for (int64_t oy = 0; oy < p.out_h; ++oy) {
          const int64_t iy = oy * p.stride_h - p.pad_top + ky * p.dilation_h;
          float *out = row + oy * p.out_w;
          if (iy < 0 || iy >= p.in_h) {
            std::fill(out, out + p.out_w, 0.0f);
            continue;
          }
          for (int64_t ox = 0; ox < p.out_w; ++ox) {
            const int64_t ix = ox * p.stride_w - p.pad_left + kx * p.dilation_w;
            out[ox] = (ix >= 0 && ix < p.in_w) ? plane[iy * p.in_w + ix] : 0.0f;
          }
        }
      }
    }
  }
}

// The adjoint of im2col: adds every entry of a [C/group * kH * kW, oH * oW]
// patch matrix back into the input position it was read from (padding taps are
// dropped). Accumulates into `x`, in a fixed order.
void col2im(const Conv2dParams &p, const float *col, int64_t channels, float *x) {
  const int64_t out_plane = p.out_h * p.out_w;
  for (int64_t c = 0; c < channels; ++c) {
    float *plane = x + c * p.in_h * p.in_w;
    for (int64_t ky = 0; ky < p.kernel_h; ++ky) {
      for (int64_t kx = 0; kx < p.kernel_w; ++kx) {
        const float *row = col + ((c * p.kernel_h + ky) * p.kernel_w + kx) * out_plane;
        for (int64_t oy = 0; oy < p.out_h; ++oy) {
          const int64_t iy = oy * p.stride_h - p.pad_top + ky * p.dilation_h;
          if (iy < 0 || iy >= p.in_h) continue;
          const float *in = row + oy * p.out_w;
          for (int64_t ox = 0; ox < p.out_w; ++ox) {
            const int64_t ix = ox * p.stride_w - p.pad_left + kx * p.dilation_w;
            if (ix >= 0 && ix < p.in_w) plane[iy * p.in_w + ix] += in[ox];
          }
        }
      }
    }
  }
}

#if STRATA_HAVE_DNNL
// A convolution for one set of sizes. The primitive picks its own (blocked)
// layouts, which run faster than plain NCHW on AVX-512 (but see 1x1 below); reorders
// convert from and to the caller's NCHW / [M, C/group, kH, kW] buffers where they
// differ. Primitives are immutable once built and run with a caller-owned
// scratchpad, so threads may share one.
struct CachedConv {
  dnnl::convolution_forward::primitive_desc desc;
  dnnl::convolution_forward primitive;
  dnnl::memory::desc user_src, user_weights, user_dst;
  std::optional<dnnl::reorder> src_reorder, weights_reorder, dst_reorder;
};

using ConvKey = std::array<int64_t, 19>;

ConvKey conv_key(const Conv2dParams &p, bool has_bias) {
  return {p.batch,      p.in_channels, p.in_h,       p.in_w,          p.out_channels,
          p.kernel_h,   p.kernel_w,    p.group,      p.stride_h,      p.stride_w,
          p.pad_top,    p.pad_left,    p.pad_bottom, p.pad_right,     p.dilation_h,
          p.dilation_w, p.out_h,       p.out_w,      has_bias ? 1 : 0};
}

const dnnl::engine &cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

std::optional<dnnl::reorder> make_reorder(const dnnl::memory::desc &from,
                                          const dnnl::memory::desc &to) {
  if (from == to) return std::nullopt;
  return dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), from, cpu_engine(), to));
}

// The oneDNN view of a convolution: its dims, plain NCHW source and destination
// and OIHW (GOIHW with groups) weight descriptors, and strides, dilations (counted
// from 0: 0 = dense) and paddings as oneDNN takes them.
struct OnednnConvShapes {
  dnnl::memory::dims src_dims, dst_dims, weight_dims;
  dnnl::memory::desc src, dst, weights;
  dnnl::memory::dims strides, dilates, pad_l, pad_r;
};

OnednnConvShapes onednn_shapes(const Conv2dParams &p) {
  using dnnl::memory;
  using tag = memory::format_tag;
  const auto f32 = memory::data_type::f32;
  OnednnConvShapes s;
  s.src_dims = {p.batch, p.in_channels, p.in_h, p.in_w};
  s.dst_dims = {p.batch, p.out_channels, p.out_h, p.out_w};
  s.weight_dims = p.group == 1 ? memory::dims{p.out_channels, p.in_channels, p.kernel_h, p.kernel_w}
                               : memory::dims{p.group, p.out_channels / p.group,
                                              p.in_channels / p.group, p.kernel_h, p.kernel_w};
  s.src = memory::desc(s.src_dims, f32, tag::nchw);
  s.dst = memory::desc(s.dst_dims, f32, tag::nchw);
  s.weights = memory::desc(s.weight_dims, f32, p.group == 1 ? tag::oihw : tag::goihw);
  s.strides = {p.stride_h, p.stride_w};
  s.dilates = {p.dilation_h - 1, p.dilation_w - 1};
  s.pad_l = {p.pad_top, p.pad_left};
  s.pad_r = {p.pad_bottom, p.pad_right};
  return s;
}

// A thread-safe map from a convolution's shape and attributes to its built
// primitives. Building (which JIT-compiles) happens outside the lock; when two
// threads build the same entry at once, the second copy is dropped.
template <typename Entry> class PrimitiveCache {
public:
  template <typename Build> std::shared_ptr<const Entry> get(const ConvKey &key, Build &&build) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = entries_.find(key);
      if (it != entries_.end()) return it->second;
    }
    std::shared_ptr<const Entry> built = build();
    std::lock_guard<std::mutex> lock(mutex_);
    return entries_.emplace(key, std::move(built)).first->second;
  }

  int64_t size() {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int64_t>(entries_.size());
  }

private:
  std::mutex mutex_;
  std::map<ConvKey, std::shared_ptr<const Entry>> entries_;
};

class ConvCache {
public:
  static ConvCache &instance() {
    static ConvCache cache;
    return cache;
  }

  std::shared_ptr<const CachedConv> get(const Conv2dParams &p, bool has_bias) {
    return cache_.get(conv_key(p, has_bias), [&] { return build(p, has_bias); });
  }
  int64_t size() { return cache_.size(); }

private:
  static std::shared_ptr<const CachedConv> build(const Conv2dParams &p, bool has_bias) {
    using dnnl::memory;
    using tag = memory::format_tag;
    const auto f32 = memory::data_type::f32;
    const OnednnConvShapes shapes = onednn_shapes(p);
    const memory::dims &strides = shapes.strides, &dilates = shapes.dilates;
    const memory::dims &pad_l = shapes.pad_l, &pad_r = shapes.pad_r;
    const memory::desc &user_src = shapes.src, &user_dst = shapes.dst;
    const memory::desc &user_weights = shapes.weights;
    // A 1x1 convolution is a GEMM over NCHW as it is; reordering costs it more than
    // it gains (measured). Larger kernels get the blocked layouts.
    const bool plain = p.kernel_h == 1 && p.kernel_w == 1;
    memory::desc src = plain ? user_src : memory::desc(shapes.src_dims, f32, tag::any);
    memory::desc dst = plain ? user_dst : memory::desc(shapes.dst_dims, f32, tag::any);
    memory::desc weights = plain ? user_weights : memory::desc(shapes.weight_dims, f32, tag::any);
    const auto prop = dnnl::prop_kind::forward_inference;
    const auto algo = dnnl::algorithm::convolution_direct;
    auto op = has_bias
                  ? dnnl::convolution_forward::desc(prop, algo, src, weights,
                                                    memory::desc({p.out_channels}, f32, tag::x),
                                                    dst, strides, dilates, pad_l, pad_r)
                  : dnnl::convolution_forward::desc(prop, algo, src, weights, dst, strides, dilates,
                                                    pad_l, pad_r);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::convolution_forward::primitive_desc desc(op, attr, cpu_engine());
    return std::make_shared<CachedConv>(CachedConv{
        desc, dnnl::convolution_forward(desc), user_src, user_weights, user_dst,
        make_reorder(user_src, desc.src_desc()), make_reorder(user_weights, desc.weights_desc()),
        make_reorder(desc.dst_desc(), user_dst)});
  }

  PrimitiveCache<CachedConv> cache_;
};

// 64-byte aligned scratch memory for one call; `data` is null for zero bytes
// and where the host could not give them (failed()).
struct AlignedBytes {
  explicit AlignedBytes(size_t size)
      : bytes(size), data(size == 0 ? nullptr : std::aligned_alloc(64, (size + 63) / 64 * 64)) {}
  ~AlignedBytes() { std::free(data); }
  AlignedBytes(const AlignedBytes &) = delete;
  AlignedBytes &operator=(const AlignedBytes &) = delete;
  bool failed() const { return bytes > 0 && data == nullptr; }
  size_t bytes;
  void *data;
};

// An operand in a primitive's layout: the caller's buffer where the layouts
// match (no reorder), else a copy in aligned memory of its own, filled from
// the caller's buffer (an input) or written back to it (an output).
class Operand {
public:
  Operand(const dnnl::memory &user, const dnnl::memory::desc &desc,
          const std::optional<dnnl::reorder> &reorder)
      : user_(user), reorder_(reorder), bytes_(reorder ? desc.get_size() : 0),
        memory_(reorder ? dnnl::memory(desc, cpu_engine(), bytes_.data) : user) {}
  bool allocated() const { return !bytes_.failed(); }
  // Bytes of its own copy (0 where it uses the caller's buffer).
  size_t own_bytes() const { return bytes_.bytes; }
  dnnl::memory &memory() { return memory_; }
  void fill(const dnnl::stream &stream) {
    if (reorder_) reorder_->execute(stream, user_, memory_);
  }
  void write_back(const dnnl::stream &stream) {
    if (reorder_) reorder_->execute(stream, memory_, user_);
  }

private:
  dnnl::memory user_;
  const std::optional<dnnl::reorder> &reorder_;
  AlignedBytes bytes_;
  dnnl::memory memory_;
};

Status conv2d_onednn(const Conv2dParams &p, const float *x, const float *w, const float *bias,
                     float *y) {
  try {
    std::shared_ptr<const CachedConv> conv = ConvCache::instance().get(p, bias != nullptr);
    const dnnl::engine &engine = cpu_engine();
    dnnl::stream stream(engine);
    // oneDNN's memory objects take non-const handles; it only reads inputs.
    dnnl::memory user_src(conv->user_src, engine, const_cast<float *>(x));
    dnnl::memory user_weights(conv->user_weights, engine, const_cast<float *>(w));
    dnnl::memory user_dst(conv->user_dst, engine, y);
    // Operands in the primitive's layouts: the caller's buffers where they match.
    Operand src(user_src, conv->desc.src_desc(), conv->src_reorder);
    Operand weights(user_weights, conv->desc.weights_desc(), conv->weights_reorder);
    Operand dst(user_dst, conv->desc.dst_desc(), conv->dst_reorder);
    if (!src.allocated() || !weights.allocated() || !dst.allocated())
      return out_of_memory(src.own_bytes() + weights.own_bytes() + dst.own_bytes(),
                           "a convolution's reordered operands");
    AlignedBytes scratch_bytes(conv->desc.scratchpad_desc().get_size());
    // oneDNN would take a null scratchpad and write through it.
    if (scratch_bytes.failed())
      return out_of_memory(scratch_bytes.bytes, "a convolution's oneDNN scratchpad");
    src.fill(stream);
    weights.fill(stream);
    dnnl::memory scratch(conv->desc.scratchpad_desc(), engine, scratch_bytes.data);
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, src.memory()},
                                               {DNNL_ARG_WEIGHTS, weights.memory()},
                                               {DNNL_ARG_DST, dst.memory()},
                                               {DNNL_ARG_SCRATCHPAD, scratch}};
    if (bias != nullptr)
      args.emplace(DNNL_ARG_BIAS,
                   dnnl::memory(conv->desc.bias_desc(), engine, const_cast<float *>(bias)));
    conv->primitive.execute(stream, args);
    dst.write_back(stream);
    stream.wait();
  } catch (const dnnl::error &e) {
    if (e.status == dnnl_out_of_memory)
      return resource_exhausted("out of memory: oneDNN convolution: ", e.what());
    return internal_error("oneDNN convolution failed: ", e.what());
  }
  return Status::ok();
}

// A backward convolution (data or weights) for one set of sizes. Like the
// forward, kernels larger than 1x1 run in the layouts oneDNN picks (blocked
// channels), with reorders from and to the caller's plain NCHW / [M, C/group,
// kH, kW] buffers; 1x1 ones run on the plain layouts as they are.
struct CachedConvBackward {
  dnnl::primitive primitive;
  // The caller's layouts and the primitive's: `input` is dY, `other` is W (data)
  // or X (weights), `output` is dX or dW.
  dnnl::memory::desc user_input, user_other, user_output;
  dnnl::memory::desc input, other, output;
  std::optional<dnnl::reorder> input_reorder, other_reorder, output_reorder;
  dnnl::memory::desc scratchpad;
};

enum class BackwardKind : int64_t { kData = 2, kWeights = 3 };

class ConvBackwardCache {
public:
  static ConvBackwardCache &instance() {
    static ConvBackwardCache cache;
    return cache;
  }

  std::shared_ptr<const CachedConvBackward> get(const Conv2dParams &p, BackwardKind kind) {
    ConvKey key = conv_key(p, false);
    key.back() = static_cast<int64_t>(kind);
    return cache_.get(key, [&] { return build(p, kind); });
  }
  int64_t size() { return cache_.size(); }

private:
  static std::shared_ptr<const CachedConvBackward> build(const Conv2dParams &p, BackwardKind kind) {
    using dnnl::memory;
    const OnednnConvShapes shapes = onednn_shapes(p);
    const memory::dims &strides = shapes.strides, &dilates = shapes.dilates;
    const memory::dims &pad_l = shapes.pad_l, &pad_r = shapes.pad_r;
    using tag = memory::format_tag;
    const auto f32 = memory::data_type::f32;
    const memory::desc &user_src = shapes.src, &user_dst = shapes.dst;
    const memory::desc &user_weights = shapes.weights;
    const bool plain = p.kernel_h == 1 && p.kernel_w == 1; // as the forward
    const memory::desc src = plain ? user_src : memory::desc(shapes.src_dims, f32, tag::any);
    const memory::desc dst = plain ? user_dst : memory::desc(shapes.dst_dims, f32, tag::any);
    const memory::desc weights =
        plain ? user_weights : memory::desc(shapes.weight_dims, f32, tag::any);
    const auto algo = dnnl::algorithm::convolution_direct;
    // Backward primitives take the matching forward (training) one as a hint.
    dnnl::convolution_forward::primitive_desc hint(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, src, weights, dst,
                                        strides, dilates, pad_l, pad_r),
        cpu_engine());
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    CachedConvBackward out;
    out.user_input = user_dst;
    if (kind == BackwardKind::kData) {
      dnnl::convolution_backward_data::primitive_desc desc(
          dnnl::convolution_backward_data::desc(algo, src, weights, dst, strides, dilates, pad_l,
                                                pad_r),
          attr, cpu_engine(), hint);
      out.primitive = dnnl::convolution_backward_data(desc);
      out.user_other = user_weights;
      out.user_output = user_src;
      out.input = desc.diff_dst_desc();
      out.other = desc.weights_desc();
      out.output = desc.diff_src_desc();
      out.scratchpad = desc.scratchpad_desc();
    } else {
      dnnl::convolution_backward_weights::primitive_desc desc(
          dnnl::convolution_backward_weights::desc(algo, src, weights, dst, strides, dilates, pad_l,
                                                   pad_r),
          attr, cpu_engine(), hint);
      out.primitive = dnnl::convolution_backward_weights(desc);
      out.user_other = user_src;
      out.user_output = user_weights;
      out.input = desc.diff_dst_desc();
      out.other = desc.src_desc();
      out.output = desc.diff_weights_desc();
      out.scratchpad = desc.scratchpad_desc();
    }
    out.input_reorder = make_reorder(out.user_input, out.input);
    out.other_reorder = make_reorder(out.user_other, out.other);
    out.output_reorder = make_reorder(out.output, out.user_output);
    return std::make_shared<CachedConvBackward>(std::move(out));
  }

  PrimitiveCache<CachedConvBackward> cache_;
};

Status conv2d_backward_onednn(const Conv2dParams &p, BackwardKind kind, const float *dy,
                              const float *other, float *out) {
  try {
    std::shared_ptr<const CachedConvBackward> conv = ConvBackwardCache::instance().get(p, kind);
    const dnnl::engine &engine = cpu_engine();
    dnnl::stream stream(engine);
    AlignedBytes scratch_bytes(conv->scratchpad.get_size());
    // oneDNN would take a null scratchpad and write through it.
    if (scratch_bytes.failed())
      return out_of_memory(scratch_bytes.bytes, "a convolution backward's oneDNN scratchpad");
    dnnl::memory scratch(conv->scratchpad, engine, scratch_bytes.data);
    // The caller's buffers, and the operands in the primitive's layouts
    // (reordered copies where they differ).
    dnnl::memory user_input(conv->user_input, engine, const_cast<float *>(dy));
    dnnl::memory user_other(conv->user_other, engine, const_cast<float *>(other));
    dnnl::memory user_output(conv->user_output, engine, out);
    Operand input(user_input, conv->input, conv->input_reorder);
    Operand other_operand(user_other, conv->other, conv->other_reorder);
    Operand output(user_output, conv->output, conv->output_reorder);
    if (!input.allocated() || !other_operand.allocated() || !output.allocated())
      return out_of_memory(input.own_bytes() + other_operand.own_bytes() + output.own_bytes(),
                           "a convolution backward's reordered operands");
    input.fill(stream);
    other_operand.fill(stream);
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_DIFF_DST, input.memory()},
                                               {DNNL_ARG_SCRATCHPAD, scratch}};
    if (kind == BackwardKind::kData) {
      args.emplace(DNNL_ARG_WEIGHTS, other_operand.memory());
      args.emplace(DNNL_ARG_DIFF_SRC, output.memory());
    } else {
      args.emplace(DNNL_ARG_SRC, other_operand.memory());
      args.emplace(DNNL_ARG_DIFF_WEIGHTS, output.memory());
    }
    conv->primitive.execute(stream, args);
    output.write_back(stream);
    stream.wait();
  } catch (const dnnl::error &e) {
    if (e.status == dnnl_out_of_memory)
      return resource_exhausted("out of memory: oneDNN convolution backward: ", e.what());
    return internal_error("oneDNN convolution backward failed: ", e.what());
  }
  return Status::ok();
}
#endif

} // namespace

Status conv2d_forward_im2col(const Conv2dParams &p, const float *x, const float *w,
                             const float *bias, float *y) {
  const int64_t group_in = p.in_channels / p.group;
  const int64_t group_out = p.out_channels / p.group;
  const int64_t patch = group_in * p.kernel_h * p.kernel_w;
  const int64_t out_plane = p.out_h * p.out_w;
  const size_t col_count = static_cast<size_t>(patch * out_plane);
  std::unique_ptr<float[]> col = zeroed_floats(col_count);
  if (col == nullptr) return out_of_memory(col_count * sizeof(float), kPatchMatrix);
  for (int64_t n = 0; n < p.batch; ++n) {
    for (int64_t g = 0; g < p.group; ++g) {
      const float *x_group = x + (n * p.in_channels + g * group_in) * p.in_h * p.in_w;
      float *y_group = y + (n * p.out_channels + g * group_out) * out_plane;
      im2col(p, x_group, group_in, col.get());
      sgemm(GemmShape{false, false, group_out, out_plane, patch}, 1.0f, w + g * group_out * patch,
            patch, col.get(), out_plane, 0.0f, y_group, out_plane);
    }
    if (bias != nullptr)
      for (int64_t m = 0; m < p.out_channels; ++m) {
        float *plane = y + (n * p.out_channels + m) * out_plane;
        for (int64_t i = 0; i < out_plane; ++i)
          plane[i] += bias[m];
      }
  }
  return Status::ok();
}

Status conv2d_forward(const Conv2dParams &params, const float *x, const float *w, const float *bias,
                      float *y) {
  if (params.batch == 0 || params.out_channels == 0 || params.out_h == 0 || params.out_w == 0)
    return Status::ok();
#if STRATA_HAVE_DNNL
  // oneDNN refuses empty reductions; the im2col path writes zeros (plus bias).
  if (params.in_channels > 0) return conv2d_onednn(params, x, w, bias, y);
#endif
  return conv2d_forward_im2col(params, x, w, bias, y);
}

Status conv2d_backward_data_im2col(const Conv2dParams &p, const float *dy, const float *w,
                                   float *dx) {
  const int64_t group_in = p.in_channels / p.group;
  const int64_t group_out = p.out_channels / p.group;
  const int64_t patch = group_in * p.kernel_h * p.kernel_w;
  const int64_t out_plane = p.out_h * p.out_w;
  std::fill(dx, dx + p.batch * p.in_channels * p.in_h * p.in_w, 0.0f);
  if (out_plane == 0 || patch == 0) return Status::ok();
  const size_t col_count = static_cast<size_t>(patch * out_plane);
  std::unique_ptr<float[]> col = zeroed_floats(col_count);
  if (col == nullptr) return out_of_memory(col_count * sizeof(float), kPatchMatrix);
  for (int64_t n = 0; n < p.batch; ++n)
    for (int64_t g = 0; g < p.group; ++g) {
      const float *dy_group = dy + (n * p.out_channels + g * group_out) * out_plane;
      float *dx_group = dx + (n * p.in_channels + g * group_in) * p.in_h * p.in_w;
      if (group_out == 0) continue;
      // col = W_g^T dY_g: the gradient of every patch entry, then scattered back.
      sgemm(GemmShape{true, false, patch, out_plane, group_out}, 1.0f, w + g * group_out * patch,
            patch, dy_group, out_plane, 0.0f, col.get(), out_plane);
      col2im(p, col.get(), group_in, dx_group);
    }
  return Status::ok();
}

Status conv2d_backward_weights_im2col(const Conv2dParams &p, const float *dy, const float *x,
                                      float *dw) {
  const int64_t group_in = p.in_channels / p.group;
  const int64_t group_out = p.out_channels / p.group;
  const int64_t patch = group_in * p.kernel_h * p.kernel_w;
  const int64_t out_plane = p.out_h * p.out_w;
  std::fill(dw, dw + p.out_channels * patch, 0.0f);
  if (out_plane == 0 || patch == 0 || group_out == 0) return Status::ok();
  const size_t col_count = static_cast<size_t>(patch * out_plane);
  std::unique_ptr<float[]> col = zeroed_floats(col_count);
  if (col == nullptr) return out_of_memory(col_count * sizeof(float), kPatchMatrix);
  for (int64_t n = 0; n < p.batch; ++n)
    for (int64_t g = 0; g < p.group; ++g) {
      im2col(p, x + (n * p.in_channels + g * group_in) * p.in_h * p.in_w, group_in, col.get());
      // dW_g += dY_g col^T, images added in order.
      sgemm(GemmShape{false, true, group_out, patch, out_plane}, 1.0f,
            dy + (n * p.out_channels + g * group_out) * out_plane, out_plane, col.get(), out_plane,
            1.0f, dw + g * group_out * patch, patch);
    }
  return Status::ok();
}

#if STRATA_HAVE_DNNL
namespace {
// oneDNN refuses empty sizes; the im2col paths handle them.
bool onednn_can_run(const Conv2dParams &p) {
  return p.batch > 0 && p.in_channels > 0 && p.out_channels > 0 && p.out_h > 0 && p.out_w > 0;
}
} // namespace
#endif

Status conv2d_backward_data(const Conv2dParams &params, const float *dy, const float *w,
                            float *dx) {
#if STRATA_HAVE_DNNL
  if (onednn_can_run(params)) return conv2d_backward_onednn(params, BackwardKind::kData, dy, w, dx);
#endif
  return conv2d_backward_data_im2col(params, dy, w, dx);
}

Status conv2d_backward_weights(const Conv2dParams &params, const float *dy, const float *x,
                               float *dw) {
#if STRATA_HAVE_DNNL
  if (onednn_can_run(params))
    return conv2d_backward_onednn(params, BackwardKind::kWeights, dy, x, dw);
#endif
  return conv2d_backward_weights_im2col(params, dy, x, dw);
}

int64_t conv2d_backward_primitive_cache_size() {
#if STRATA_HAVE_DNNL
  return ConvBackwardCache::instance().size();
#else
  return 0;
#endif
}

int64_t conv2d_primitive_cache_size() {
#if STRATA_HAVE_DNNL
  return ConvCache::instance().size();
#else
  return 0;
#endif
}

} // namespace strata::ops::cpu
