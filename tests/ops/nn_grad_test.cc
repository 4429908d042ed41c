// Gradients of the neural-network ops: finite-difference checks of every rule
// (through passes::append_backward, see tests/passes/grad_check.h) and direct
// tests of the backward ops' kernels against plain loops in double.
#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include <gtest/gtest.h>

#include "ops/kernels/cpu/conv.h"
#include "ops/kernels/cpu/gemm.h"
#include "tests/ops/op_test_util.h"
#include "tests/passes/grad_check.h"

namespace strata {
namespace {

using ops::testing::expect_close;
using ops::testing::run_op;
using ops::testing::TestTensor;
using strata::testing::check_gradients;
using strata::testing::GradCheckOptions;

HostTensor randn(Shape shape, uint32_t seed, float scale = 1.0f) {
  return strata::testing::random_tensor(TensorType{DType::kF32, std::move(shape)}, seed, scale);
}

// Values k * spacing for k = 0 .. n-1 in a seeded random order, shifted to be
// centered: no two are closer than `spacing`, so a max never changes under a
// small finite-difference step.
HostTensor distinct(Shape shape, uint32_t seed, float spacing = 0.1f) {
  HostTensor t = HostTensor::zeros(TensorType{DType::kF32, std::move(shape)});
  const int64_t n = t.type.num_elements();
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  for (int64_t i = 0; i < n; ++i)
    t.as<float>()[i] = static_cast<float>(order[static_cast<size_t>(i)] - n / 2) * spacing;
  return t;
}

HostTensor labels_i64(Shape shape, const std::vector<int64_t> &values) {
  HostTensor t = HostTensor::zeros(TensorType{DType::kI64, std::move(shape)});
  std::memcpy(t.data(), values.data(), t.size_bytes());
  return t;
}

// A build function applying one op with the given attributes to all inputs.
strata::testing::BuildFn apply(std::string op, std::vector<Attribute> attrs) {
  return [op, attrs](GraphBuilder &b, llvm::ArrayRef<TensorId> x) {
    return b.op1(op, x, attrs, "under_test");
  };
}

// ---------------------------------------------------------------------------
// Finite-difference checks. Linear ops (MatMul, Gemm, Conv2d, pools) are exact up
// to f32 rounding; the others get a slightly looser tolerance for the O(h^2) term.

constexpr GradCheckOptions kLinear{5e-3, 1e-2};
constexpr GradCheckOptions kSmooth{1e-2, 1e-2};

TEST(MatMulGrad, Plain) {
  check_gradients(apply("MatMul", {}), {randn({3, 4}, 1), randn({4, 5}, 2)}, kLinear);
}

TEST(MatMulGrad, Transposes) {
  for (int64_t ta : {0, 1})
    for (int64_t tb : {0, 1}) {
      SCOPED_TRACE(::testing::Message() << "trans_a=" << ta << " trans_b=" << tb);
      Shape a = ta ? Shape{4, 3} : Shape{3, 4};
      Shape b = tb ? Shape{5, 4} : Shape{4, 5};
      check_gradients(apply("MatMul", {{"trans_a", ta}, {"trans_b", tb}}),
                      {randn(a, 3), randn(b, 4)}, kLinear);
    }
}

TEST(MatMulGrad, BatchedBroadcast) {
  // Batch [2, 1] against [3] broadcasts to [2, 3]; B is shared by A's batch too.
  for (int64_t ta : {0, 1})
    for (int64_t tb : {0, 1}) {
      SCOPED_TRACE(::testing::Message() << "trans_a=" << ta << " trans_b=" << tb);
      Shape a = ta ? Shape{2, 1, 4, 3} : Shape{2, 1, 3, 4};
      Shape b = tb ? Shape{3, 2, 4} : Shape{3, 4, 2};
      check_gradients(apply("MatMul", {{"trans_a", ta}, {"trans_b", tb}}),
                      {randn(a, 5), randn(b, 6)}, kLinear);
    }
  check_gradients(apply("MatMul", {}), {randn({2, 3, 4}, 7), randn({4, 2}, 8)}, kLinear);
  // A weight shared by every batch: its gradient is one product over all rows.
  check_gradients(apply("MatMul", {{"trans_b", int64_t{1}}}),
                  {randn({2, 3, 4}, 17), randn({2, 4}, 18)}, kLinear);
  check_gradients(apply("MatMul", {}), {randn({2, 2, 3, 4}, 19), randn({4, 5}, 20)}, kLinear);
  check_gradients(apply("MatMul", {}), {randn({2, 3, 4}, 21), randn({4}, 22)}, kLinear);
  check_gradients(apply("MatMul", {{"trans_b", int64_t{1}}}),
                  {randn({3, 4}, 9), randn({2, 5, 4}, 10)}, kLinear);
}

TEST(MatMulGrad, Vectors) {
  check_gradients(apply("MatMul", {}), {randn({4}, 11), randn({2, 4, 3}, 12)}, kLinear);
  check_gradients(apply("MatMul", {{"trans_a", int64_t{1}}}),
                  {randn({2, 4, 3}, 13), randn({4}, 14)}, kLinear);
  check_gradients(apply("MatMul", {}), {randn({4}, 15), randn({4}, 16)}, kLinear);
}

TEST(GemmGrad, TransposesAndScales) {
  for (int64_t ta : {0, 1})
    for (int64_t tb : {0, 1}) {
      SCOPED_TRACE(::testing::Message() << "trans_a=" << ta << " trans_b=" << tb);
      Shape a = ta ? Shape{4, 3} : Shape{3, 4};
      Shape b = tb ? Shape{5, 4} : Shape{4, 5};
      check_gradients(
          apply("Gemm", {{"trans_a", ta}, {"trans_b", tb}, {"alpha", 0.5}, {"beta", 2.0}}),
          {randn(a, 17), randn(b, 18), randn({3, 5}, 19)}, kLinear);
    }
}

TEST(GemmGrad, BroadcastC) {
  check_gradients(apply("Gemm", {{"beta", 1.5}}),
                  {randn({3, 4}, 20), randn({4, 5}, 21), randn({5}, 22)}, kLinear);
  check_gradients(apply("Gemm", {{"alpha", 2.0}}),
                  {randn({3, 4}, 23), randn({4, 5}, 24), randn({3, 1}, 25)}, kLinear);
  check_gradients(apply("Gemm", {{"beta", -1.0}}),
                  {randn({3, 4}, 26), randn({4, 5}, 27), randn({}, 28)}, kLinear);
  check_gradients(apply("Gemm", {}), {randn({3, 4}, 29), randn({4, 5}, 30)}, kLinear);
}

TEST(LayerNormGrad, LastAxis) {
  check_gradients(apply("LayerNorm", {}), {randn({3, 5}, 31), randn({5}, 32), randn({5}, 33)},
                  kSmooth);
}

TEST(LayerNormGrad, TwoTrailingAxes) {
  check_gradients(apply("LayerNorm", {{"axis", int64_t{-2}}, {"epsilon", 1e-3}}),
                  {randn({2, 3, 4}, 34), randn({3, 4}, 35), randn({3, 4}, 36)}, kSmooth);
}

TEST(SoftmaxCrossEntropyGrad, EachReduction) {
  for (const char *reduction : {"mean", "sum", "none"}) {
    SCOPED_TRACE(reduction);
    check_gradients(apply("SoftmaxCrossEntropy", {{"reduction", std::string(reduction)}}),
                    {randn({4, 5}, 37), labels_i64({4}, {1, 0, 4, 2})}, kSmooth);
  }
}

TEST(SoftmaxCrossEntropyGrad, IgnoreIndex) {
  for (const char *reduction : {"mean", "sum", "none"}) {
    SCOPED_TRACE(reduction);
    check_gradients(apply("SoftmaxCrossEntropy",
                          {{"reduction", std::string(reduction)}, {"ignore_index", int64_t{-1}}}),
                    {randn({2, 3, 4}, 38), labels_i64({2, 3}, {1, -1, 3, 0, -1, 2})}, kSmooth);
  }
}

TEST(MseLossGrad, EachReduction) {
  for (const char *reduction : {"mean", "sum", "none"}) {
    SCOPED_TRACE(reduction);
    check_gradients(apply("MseLoss", {{"reduction", std::string(reduction)}}),
                    {randn({3, 4}, 39), randn({3, 4}, 40)}, kSmooth);
  }
}

TEST(Conv2dGrad, PlainWithBias) {
  check_gradients(apply("Conv2d", {}),
                  {randn({2, 2, 5, 5}, 41), randn({3, 2, 3, 3}, 42), randn({3}, 43)}, kLinear);
}

TEST(Conv2dGrad, StridePadsDilationGroups) {
  check_gradients(apply("Conv2d", {{"strides", std::vector<int64_t>{2, 2}},
                                   {"pads", std::vector<int64_t>{1, 0, 2, 1}}}),
                  {randn({1, 2, 6, 5}, 44), randn({2, 2, 3, 2}, 45)}, kLinear);
  check_gradients(apply("Conv2d", {{"dilations", std::vector<int64_t>{2, 1}},
                                   {"pads", std::vector<int64_t>{1, 1, 1, 1}}}),
                  {randn({1, 1, 6, 5}, 46), randn({2, 1, 2, 3}, 47), randn({2}, 48)}, kLinear);
  check_gradients(apply("Conv2d", {{"group", int64_t{2}},
                                   {"strides", std::vector<int64_t>{1, 2}},
                                   {"pads", std::vector<int64_t>{0, 1, 0, 1}}}),
                  {randn({2, 4, 4, 5}, 49), randn({4, 2, 2, 2}, 50), randn({4}, 51)}, kLinear);
}

TEST(MaxPool2dGrad, Windows) {
  check_gradients(apply("MaxPool2d", {{"kernel_shape", std::vector<int64_t>{2, 2}},
                                      {"strides", std::vector<int64_t>{2, 2}}}),
                  {distinct({1, 2, 4, 4}, 52)}, kLinear);
  check_gradients(apply("MaxPool2d", {{"kernel_shape", std::vector<int64_t>{3, 3}},
                                      {"strides", std::vector<int64_t>{2, 2}},
                                      {"pads", std::vector<int64_t>{1, 1, 1, 1}},
                                      {"ceil_mode", int64_t{1}}}),
                  {distinct({2, 1, 6, 5}, 53)}, kLinear);
  check_gradients(apply("MaxPool2d", {{"kernel_shape", std::vector<int64_t>{2, 2}},
                                      {"dilations", std::vector<int64_t>{2, 1}}}),
                  {distinct({1, 1, 5, 4}, 54)}, kLinear);
  // Wide enough for the vectorized 2x2 stride-2 path and its scalar tail.
  check_gradients(apply("MaxPool2d", {{"kernel_shape", std::vector<int64_t>{2, 2}},
                                      {"strides", std::vector<int64_t>{2, 2}}}),
                  {distinct({1, 2, 4, 22}, 55)}, kLinear);
}

TEST(AveragePool2dGrad, PadsAndCeilMode) {
  for (int64_t include_pad : {0, 1})
    for (int64_t ceil_mode : {0, 1}) {
      SCOPED_TRACE(::testing::Message()
                   << "count_include_pad=" << include_pad << " ceil_mode=" << ceil_mode);
      check_gradients(apply("AveragePool2d", {{"kernel_shape", std::vector<int64_t>{3, 2}},
                                              {"strides", std::vector<int64_t>{2, 2}},
                                              {"pads", std::vector<int64_t>{1, 0, 1, 1}},
                                              {"ceil_mode", ceil_mode},
                                              {"count_include_pad", include_pad}}),
                      {randn({1, 2, 6, 5}, 55)}, kLinear);
    }
}

TEST(GlobalAveragePoolGrad, Planes) {
  check_gradients(apply("GlobalAveragePool", {}), {randn({2, 3, 3, 2}, 56)}, kLinear);
}

TEST(BatchNormalizationGrad, TrainingForm) {
  // The mean and var inputs are ignored in training: their gradients are zero.
  HostTensor var = randn({3}, 61);
  for (int64_t i = 0; i < 3; ++i)
    var.as<float>()[i] = 1.0f + std::abs(var.as<float>()[i]);
  check_gradients(apply("BatchNormalization", {{"training", int64_t{1}}}),
                  {randn({2, 3, 2, 2}, 57), randn({3}, 58), randn({3}, 59), randn({3}, 60), var},
                  kSmooth);
  HostTensor var2 = HostTensor::zeros(TensorType{DType::kF32, {2}});
  var2.as<float>()[0] = var2.as<float>()[1] = 2.0f;
  check_gradients(apply("BatchNormalization", {{"training", int64_t{1}}, {"epsilon", 1e-3}}),
                  {randn({4, 2}, 62), randn({2}, 63), randn({2}, 64), randn({2}, 65), var2},
                  kSmooth);
}

// ---------------------------------------------------------------------------
// Direct kernel tests of the backward ops against plain loops.

TestTensor test_tensor(Shape shape, uint32_t seed) {
  std::mt19937 rng(seed);
  return ops::testing::random_tensor(DType::kF32, std::move(shape), rng);
}

void expect_bitwise_equal(const TestTensor &a, const TestTensor &b, std::string_view what) {
  ASSERT_EQ(a.bytes.size(), b.bytes.size()) << what;
  EXPECT_EQ(std::memcmp(a.bytes.data(), b.bytes.data(), a.bytes.size()), 0)
      << what << ": two runs differ";
}

// Runs an op twice: the outputs must match bit for bit. Returns the first run.
std::vector<TestTensor> run_twice(std::string_view op, const std::vector<TestTensor> &inputs,
                                  std::vector<Attribute> attrs) {
  auto first = run_op(op, inputs, attrs);
  EXPECT_TRUE(first.status.is_ok()) << op << ": " << first.status.to_string();
  auto second = run_op(op, inputs, attrs);
  EXPECT_TRUE(second.status.is_ok()) << op << ": " << second.status.to_string();
  for (size_t i = 0; i < first.outputs.size() && i < second.outputs.size(); ++i)
    expect_bitwise_equal(first.outputs[i], second.outputs[i], op);
  return first.outputs;
}

struct ConvCase {
  Shape x, w;
  std::vector<int64_t> strides, pads, dilations;
  int64_t group;
};

// The textbook loops of both convolution gradients, in double.
void reference_conv_grads(const ConvCase &c, const TestTensor &dy, const TestTensor &x,
                          const TestTensor &w, std::vector<double> &dx, std::vector<double> &dw) {
  const int64_t n_count = c.x[0], channels = c.x[1], h = c.x[2], wd = c.x[3];
  const int64_t m_count = c.w[0], group_in = c.w[1], kh = c.w[2], kw = c.w[3];
  const int64_t oh = dy.type.shape[2], ow = dy.type.shape[3];
  const int64_t group_out = m_count / c.group;
  dx.assign(static_cast<size_t>(x.num_elements()), 0.0);
  dw.assign(static_cast<size_t>(w.num_elements()), 0.0);
  for (int64_t n = 0; n < n_count; ++n)
    for (int64_t m = 0; m < m_count; ++m)
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          const double g = dy.get(((n * m_count + m) * oh + oy) * ow + ox);
          for (int64_t ci = 0; ci < group_in; ++ci) {
            const int64_t cin = (m / group_out) * group_in + ci;
            for (int64_t ky = 0; ky < kh; ++ky)
              for (int64_t kx = 0; kx < kw; ++kx) {
                const int64_t iy = oy * c.strides[0] - c.pads[0] + ky * c.dilations[0];
                const int64_t ix = ox * c.strides[1] - c.pads[1] + kx * c.dilations[1];
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                const int64_t xi = ((n * channels + cin) * h + iy) * wd + ix;
                const int64_t wi = ((m * group_in + ci) * kh + ky) * kw + kx;
                dx[static_cast<size_t>(xi)] += g * w.get(wi);
                dw[static_cast<size_t>(wi)] += g * x.get(xi);
              }
          }
        }
}

TEST(Conv2dGradKernels, MatchPlainLoops) {
  const std::vector<ConvCase> cases = {
      {{2, 3, 7, 6}, {4, 3, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1},
      {{1, 4, 9, 8}, {6, 2, 3, 2}, {2, 3}, {0, 1, 2, 0}, {1, 2}, 2},
      {{3, 2, 5, 5}, {2, 1, 1, 1}, {2, 2}, {0, 0, 0, 0}, {1, 1}, 2},
      {{1, 1, 6, 6}, {1, 1, 2, 2}, {1, 1}, {1, 1, 1, 1}, {3, 2}, 1},
  };
  uint32_t seed = 100;
  for (const ConvCase &c : cases) {
    SCOPED_TRACE(::testing::Message() << "x " << shape_to_string(c.x) << " w "
                                      << shape_to_string(c.w) << " group " << c.group);
    std::vector<Attribute> conv_attrs{
        {"strides", c.strides}, {"pads", c.pads}, {"dilations", c.dilations}, {"group", c.group}};
    TestTensor x = test_tensor(c.x, seed++), w = test_tensor(c.w, seed++);
    auto forward = ops::testing::infer("Conv2d", {x.type, w.type}, conv_attrs);
    ASSERT_TRUE(forward.is_ok()) << forward.status().to_string();
    TestTensor dy = test_tensor((*forward)[0].shape, seed++);
    std::vector<double> dx_ref, dw_ref;
    reference_conv_grads(c, dy, x, w, dx_ref, dw_ref);

    std::vector<Attribute> data_attrs = conv_attrs;
    data_attrs.push_back({"input_shape", std::vector<int64_t>(c.x.begin(), c.x.end())});
    auto dx = run_twice("Conv2dGradInput", {dy, w}, data_attrs);
    ASSERT_EQ(dx.size(), 1u);
    expect_close(dx[0], dx_ref, 1e-4, 1e-4, "dX");
    std::vector<Attribute> weight_attrs = conv_attrs;
    weight_attrs.push_back({"weight_shape", std::vector<int64_t>(c.w.begin(), c.w.end())});
    auto dw = run_twice("Conv2dGradWeight", {dy, x}, weight_attrs);
    ASSERT_EQ(dw.size(), 1u);
    expect_close(dw[0], dw_ref, 1e-4, 1e-4, "dW");

    // The im2col fallback agrees with the same loops.
    ops::cpu::Conv2dParams p;
    p.batch = c.x[0];
    p.in_channels = c.x[1];
    p.in_h = c.x[2];
    p.in_w = c.x[3];
    p.out_channels = c.w[0];
    p.kernel_h = c.w[2];
    p.kernel_w = c.w[3];
    p.group = c.group;
    p.stride_h = c.strides[0];
    p.stride_w = c.strides[1];
    p.pad_top = c.pads[0];
    p.pad_left = c.pads[1];
    p.pad_bottom = c.pads[2];
    p.pad_right = c.pads[3];
    p.dilation_h = c.dilations[0];
    p.dilation_w = c.dilations[1];
    p.out_h = dy.type.shape[2];
    p.out_w = dy.type.shape[3];
    TestTensor dx2 = ops::testing::zeros(DType::kF32, c.x),
               dw2 = ops::testing::zeros(DType::kF32, c.w);
    ASSERT_TRUE(
        ops::cpu::conv2d_backward_data_im2col(p, dy.as<float>(), w.as<float>(), dx2.as<float>())
            .is_ok());
    ASSERT_TRUE(
        ops::cpu::conv2d_backward_weights_im2col(p, dy.as<float>(), x.as<float>(), dw2.as<float>())
            .is_ok());
    expect_close(dx2, dx_ref, 1e-4, 1e-4, "im2col dX");
    expect_close(dw2, dw_ref, 1e-4, 1e-4, "im2col dW");
  }
}

TEST(Conv2dGradKernels, RejectsMismatchedShapes) {
  TestTensor dy = test_tensor({1, 2, 3, 3}, 1), w = test_tensor({2, 1, 3, 3}, 2);
  auto bad = run_op("Conv2dGradInput", {dy, w},
                    {{"input_shape", std::vector<int64_t>{1, 1, 6, 6}}}); // forward gives 4x4
  EXPECT_FALSE(bad.status.is_ok());
  auto missing = run_op("Conv2dGradInput", {dy, w});
  EXPECT_FALSE(missing.status.is_ok());
}

TEST(MaxPool2dGradKernel, RoutesToFirstMaximum) {
  // Ties everywhere: the first tap in window order takes the gradient.
  TestTensor x = ops::testing::tensor(DType::kF32, {1, 1, 3, 4},
                                      {1, 5, 5, 2, //
                                       5, 3, 0, 2, //
                                       4, 4, 2, 2});
  TestTensor dy = ops::testing::tensor(DType::kF32, {1, 1, 2, 3}, {1, 2, 3, 4, 5, 6});
  auto dx = run_twice("MaxPool2dGrad", {dy, x}, {{"kernel_shape", std::vector<int64_t>{2, 2}}});
  ASSERT_EQ(dx.size(), 1u);
  // Windows (row-major): [1 5;5 3] -> (0,1); [5 5;3 0] -> (0,1); [5 2;0 2] -> (0,2);
  // [5 3;4 4] -> (1,0); [3 0;4 2] -> (2,1); [0 2;2 2] -> (1,3).
  expect_close(dx[0], {0, 3, 3, 0, 4, 0, 0, 6, 0, 5, 0, 0}, 0, 0, "dX");
}

// Wide rows take the vectorized path for windows inside the input: with ties
// everywhere (values 0..2) and NaNs, each gradient goes where a plain scan of
// the window puts it (the first maximum; a NaN wins), summed in output order.
TEST(MaxPool2dGradKernel, WideRowsMatchTheScan) {
  const int64_t planes = 2, h = 11, w = 37, k = 3, stride = 2, pad = 1;
  const int64_t oh = (h + 2 * pad - k) / stride + 1, ow = (w + 2 * pad - k) / stride + 1;
  std::mt19937 rng(7);
  TestTensor x = ops::testing::zeros(DType::kF32, {1, planes, h, w});
  for (int64_t i = 0; i < planes * h * w; ++i)
    x.as<float>()[i] =
        rng() % 40 == 0 ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(rng() % 3);
  TestTensor dy = test_tensor({1, planes, oh, ow}, 8);
  std::vector<float> want(static_cast<size_t>(planes * h * w), 0.0f);
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t oy = 0; oy < oh; ++oy)
      for (int64_t ox = 0; ox < ow; ++ox) {
        int64_t at = -1;
        float best = 0;
        for (int64_t ky = 0; ky < k; ++ky)
          for (int64_t kx = 0; kx < k; ++kx) {
            const int64_t iy = oy * stride - pad + ky, ix = ox * stride - pad + kx;
            if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
            const float v = x.as<float>()[(p * h + iy) * w + ix];
            if (at < 0 || v > best || v != v) best = v, at = (p * h + iy) * w + ix;
          }
        want[static_cast<size_t>(at)] += dy.as<float>()[(p * oh + oy) * ow + ox];
      }
  auto dx = run_twice("MaxPool2dGrad", {dy, x},
                      {{"kernel_shape", std::vector<int64_t>{k, k}},
                       {"strides", std::vector<int64_t>{stride, stride}},
                       {"pads", std::vector<int64_t>{pad, pad, pad, pad}}});
  ASSERT_EQ(dx.size(), 1u);
  ASSERT_EQ(dx[0].num_elements(), planes * h * w);
  EXPECT_EQ(std::memcmp(dx[0].bytes.data(), want.data(), want.size() * sizeof(float)), 0);
}

TEST(MaxPool2dGradKernel, PaddingNeverWins) {
  TestTensor x = ops::testing::tensor(DType::kF32, {1, 1, 2, 2}, {-3, -1, -4, -2});
  TestTensor dy = ops::testing::tensor(DType::kF32, {1, 1, 2, 2}, {1, 10, 100, 1000});
  auto dx = run_twice(
      "MaxPool2dGrad", {dy, x},
      {{"kernel_shape", std::vector<int64_t>{2, 2}}, {"pads", std::vector<int64_t>{1, 1, 0, 0}}});
  ASSERT_EQ(dx.size(), 1u);
  // Windows: {-3} -> 0; {-3,-1} -> 1; {-3,-4} -> 0; all four -> 1.
  expect_close(dx[0], {101, 1010, 0, 0}, 0, 0, "dX");
}

TEST(AveragePool2dGradKernel, MatchesAdjointOfForward) {
  // The forward is linear in X, so dX[i] = sum over outputs of dY * Y(e_i).
  for (int64_t include_pad : {0, 1})
    for (int64_t ceil_mode : {0, 1}) {
      SCOPED_TRACE(::testing::Message()
                   << "count_include_pad=" << include_pad << " ceil_mode=" << ceil_mode);
      std::vector<Attribute> attrs{{"kernel_shape", std::vector<int64_t>{3, 3}},
                                   {"strides", std::vector<int64_t>{2, 2}},
                                   {"pads", std::vector<int64_t>{1, 1, 1, 0}},
                                   {"ceil_mode", ceil_mode},
                                   {"count_include_pad", include_pad}};
      const Shape shape{1, 2, 5, 6};
      TestTensor basis = ops::testing::zeros(DType::kF32, shape);
      auto forward = ops::testing::infer("AveragePool2d", {basis.type}, attrs);
      ASSERT_TRUE(forward.is_ok());
      TestTensor dy = test_tensor((*forward)[0].shape, 7);
      std::vector<double> expected(static_cast<size_t>(basis.num_elements()));
      for (int64_t i = 0; i < basis.num_elements(); ++i) {
        basis.set(i, 1.0);
        TestTensor y = ops::testing::run_one("AveragePool2d", {basis}, attrs);
        basis.set(i, 0.0);
        double sum = 0;
        for (int64_t o = 0; o < y.num_elements(); ++o)
          sum += dy.get(o) * y.get(o);
        expected[static_cast<size_t>(i)] = sum;
      }
      std::vector<Attribute> grad_attrs = attrs;
      grad_attrs.push_back({"input_shape", std::vector<int64_t>(shape.begin(), shape.end())});
      auto dx = run_twice("AveragePool2dGrad", {dy}, grad_attrs);
      ASSERT_EQ(dx.size(), 1u);
      expect_close(dx[0], expected, 1e-6, 1e-5, "dX");
    }
}

TEST(GlobalAveragePoolGradKernel, SpreadsEvenly) {
  TestTensor dy = ops::testing::tensor(DType::kF32, {1, 2, 1, 1}, {6, -3});
  auto dx =
      run_twice("GlobalAveragePoolGrad", {dy}, {{"input_shape", std::vector<int64_t>{1, 2, 2, 3}}});
  ASSERT_EQ(dx.size(), 1u);
  expect_close(dx[0], {1, 1, 1, 1, 1, 1, -0.5, -0.5, -0.5, -0.5, -0.5, -0.5}, 0, 0, "dX");
}

// Normalization gradients in double over groups of `size` elements with stride
// 1 (LayerNorm rows) given as index lists.
void reference_norm_grad(const std::vector<std::vector<int64_t>> &groups, const TestTensor &dy,
                         const TestTensor &x, const std::vector<double> &gamma, double epsilon,
                         std::vector<double> &dx) {
  dx.assign(static_cast<size_t>(x.num_elements()), 0.0);
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const auto &idx = groups[gi];
    const double n = static_cast<double>(idx.size());
    double mean = 0, var = 0;
    for (int64_t i : idx)
      mean += x.get(i);
    mean /= n;
    for (int64_t i : idx)
      var += (x.get(i) - mean) * (x.get(i) - mean);
    var /= n;
    const double rstd = 1 / std::sqrt(var + epsilon);
    // Direct differentiation of y_j = gamma_j (x_j - mean) rstd, summed over j.
    for (size_t a = 0; a < idx.size(); ++a) {
      double sum = 0;
      for (size_t j = 0; j < idx.size(); ++j) {
        const double xj = (x.get(idx[j]) - mean);
        const double d_mean = -1 / n;
        const double d_var = 2 * (x.get(idx[a]) - mean) / n;
        const double dxhat = ((a == j ? 1.0 : 0.0) + d_mean) * rstd -
                             xj * 0.5 * std::pow(var + epsilon, -1.5) * d_var;
        const double g = gamma.size() == idx.size() ? gamma[j] : gamma[gi]; // LN: per position
        sum += dy.get(idx[j]) * g * dxhat;
      }
      dx[static_cast<size_t>(idx[a])] = sum;
    }
  }
}

TEST(LayerNormGradKernel, MatchesDirectDifferentiation) {
  TestTensor x = test_tensor({3, 2, 4}, 70), dy = test_tensor({3, 2, 4}, 71);
  TestTensor scale = test_tensor({2, 4}, 72);
  for (int64_t i = 0; i < x.num_elements(); ++i)
    x.set(i, x.get(i) + 100.0); // a large mean: the recomputation must stay accurate
  auto out = run_twice("LayerNormGrad", {dy, x, scale}, {{"axis", int64_t{1}}});
  ASSERT_EQ(out.size(), 3u);
  std::vector<std::vector<int64_t>> rows(3);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t i = 0; i < 8; ++i)
      rows[static_cast<size_t>(r)].push_back(r * 8 + i);
  std::vector<double> gamma(scale.values());
  std::vector<double> dx;
  reference_norm_grad(rows, dy, x, gamma, 1e-5, dx);
  expect_close(out[0], dx, 2e-4, 2e-4, "dX");
  std::vector<double> dscale(8, 0.0), dbias(8, 0.0);
  for (const auto &row : rows) {
    double mean = 0, var = 0;
    for (int64_t i : row)
      mean += x.get(i) / 8;
    for (int64_t i : row)
      var += (x.get(i) - mean) * (x.get(i) - mean) / 8;
    for (size_t j = 0; j < 8; ++j) {
      dscale[j] += dy.get(row[j]) * (x.get(row[j]) - mean) / std::sqrt(var + 1e-5);
      dbias[j] += dy.get(row[j]);
    }
  }
  expect_close(out[1], dscale, 1e-4, 1e-4, "dScale");
  expect_close(out[2], dbias, 1e-5, 1e-5, "dBias");
}

TEST(BatchNormalizationGradKernel, MatchesDirectDifferentiation) {
  TestTensor x = test_tensor({3, 2, 2, 2}, 80), dy = test_tensor({3, 2, 2, 2}, 81);
  TestTensor scale = test_tensor({2}, 82);
  auto out = run_twice("BatchNormalizationGrad", {dy, x, scale}, {});
  ASSERT_EQ(out.size(), 3u);
  std::vector<std::vector<int64_t>> channels(2);
  for (int64_t n = 0; n < 3; ++n)
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t i = 0; i < 4; ++i)
        channels[static_cast<size_t>(c)].push_back((n * 2 + c) * 4 + i);
  std::vector<double> dx;
  reference_norm_grad(channels, dy, x, scale.values(), 1e-5, dx);
  expect_close(out[0], dx, 1e-4, 1e-4, "dX");
  std::vector<double> dscale(2, 0.0), dbias(2, 0.0);
  for (size_t c = 0; c < 2; ++c) {
    double mean = 0, var = 0;
    for (int64_t i : channels[c])
      mean += x.get(i) / 12;
    for (int64_t i : channels[c])
      var += (x.get(i) - mean) * (x.get(i) - mean) / 12;
    for (int64_t i : channels[c]) {
      dscale[c] += dy.get(i) * (x.get(i) - mean) / std::sqrt(var + 1e-5);
      dbias[c] += dy.get(i);
    }
  }
  expect_close(out[1], dscale, 1e-5, 1e-5, "dScale");
  expect_close(out[2], dbias, 1e-5, 1e-5, "dBias");
}

TEST(BatchNormalizationTraining, UsesBatchStatistics) {
  TestTensor x = test_tensor({4, 2, 3}, 90);
  TestTensor scale = ops::testing::tensor(DType::kF32, {2}, {1, 2});
  TestTensor bias = ops::testing::tensor(DType::kF32, {2}, {0, 1});
  TestTensor junk = ops::testing::tensor(DType::kF32, {2}, {50, 7}); // ignored in training
  TestTensor y = ops::testing::run_one("BatchNormalization", {x, scale, bias, junk, junk},
                                       {{"training", int64_t{1}}});
  std::vector<double> expected(static_cast<size_t>(x.num_elements()));
  for (int64_t c = 0; c < 2; ++c) {
    double mean = 0, var = 0;
    for (int64_t n = 0; n < 4; ++n)
      for (int64_t i = 0; i < 3; ++i)
        mean += x.get((n * 2 + c) * 3 + i) / 12;
    for (int64_t n = 0; n < 4; ++n)
      for (int64_t i = 0; i < 3; ++i)
        var += std::pow(x.get((n * 2 + c) * 3 + i) - mean, 2) / 12;
    for (int64_t n = 0; n < 4; ++n)
      for (int64_t i = 0; i < 3; ++i) {
        const int64_t k = (n * 2 + c) * 3 + i;
        expected[static_cast<size_t>(k)] =
            (x.get(k) - mean) / std::sqrt(var + 1e-5) * scale.get(c) + bias.get(c);
      }
  }
  expect_close(y, expected, 1e-5, 1e-5, "Y");
}

// The kernels that split their work over the CPU threads (elementwise maps,
// batch norm by channel, pooling by plane, the optimizer updates by element)
// give the same bits on one thread and on three: each element's arithmetic
// does not depend on how the work is cut.
TEST(CpuThreads, KernelsGiveTheSameBitsOnAnyThreadCount) {
  std::mt19937 rng(31);
  using ops::testing::random_tensor;
  TestTensor x = random_tensor(DType::kF32, {4, 24, 30, 30}, rng, -2.0, 3.0);
  TestTensor dy = random_tensor(DType::kF32, {4, 24, 30, 30}, rng);
  TestTensor pooled_dy = random_tensor(DType::kF32, {4, 24, 15, 15}, rng);
  TestTensor scale = random_tensor(DType::kF32, {24}, rng, 0.5, 1.5);
  TestTensor bias = random_tensor(DType::kF32, {24}, rng);
  TestTensor v = random_tensor(DType::kF32, {4, 24, 30, 30}, rng, 0.1, 1.0);
  TestTensor lr = ops::testing::tensor(DType::kF32, {}, {0.1});
  TestTensor step = ops::testing::tensor(DType::kI64, {}, {3});
  const std::vector<Attribute> pool = {{"kernel_shape", std::vector<int64_t>{3, 3}},
                                       {"strides", std::vector<int64_t>{2, 2}},
                                       {"pads", std::vector<int64_t>{1, 1, 1, 1}}};
  auto all = [&] {
    std::vector<TestTensor> out;
    auto keep = [&](const char *op, const std::vector<TestTensor> &in,
                    std::vector<Attribute> attrs = {}) {
      auto result = run_op(op, in, std::move(attrs));
      EXPECT_TRUE(result.status.is_ok()) << op << ": " << result.status.message();
      for (TestTensor &t : result.outputs)
        out.push_back(std::move(t));
    };
    keep("BatchNormalization", {x, scale, bias, scale, scale}, {{"training", int64_t{1}}});
    keep("BatchNormStats", {x});
    keep("BatchNormalizationGrad", {dy, x, scale});
    keep("MaxPool2d", {x}, pool);
    keep("MaxPool2dGrad", {pooled_dy, x}, pool);
    keep("AveragePool2d", {x}, pool);
    keep("Relu", {x});
    keep("ReluGrad", {dy, x});
    keep("Add", {x, dy});
    keep("SgdUpdate", {x, dy, lr, dy, step}, {{"momentum", 0.9}});
    keep("AdamUpdate", {x, dy, dy, v, lr, step}, {{"decoupled", int64_t{1}}});
    return out;
  };
  ops::cpu::set_gemm_num_threads(1);
  const std::vector<TestTensor> one = all();
  ops::cpu::set_gemm_num_threads(3);
  const std::vector<TestTensor> three = all();
  ops::cpu::set_gemm_num_threads(0);
  ASSERT_EQ(one.size(), three.size());
  for (size_t i = 0; i < one.size(); ++i)
    ops::testing::expect_same_tensor(three[i], one[i], "output " + std::to_string(i));
}

TEST(SoftmaxCrossEntropyGradKernel, MatchesReference) {
  TestTensor logits = test_tensor({4, 3}, 91);
  TestTensor labels = ops::testing::tensor(DType::kI32, {4}, {2, -100, 0, 1});
  for (const char *reduction : {"mean", "sum", "none"}) {
    SCOPED_TRACE(reduction);
    const bool none = std::string(reduction) == "none";
    TestTensor dloss = none ? ops::testing::tensor(DType::kF32, {4}, {0.5, 2, -1, 3})
                            : ops::testing::tensor(DType::kF32, {}, {1.5});
    auto out = run_twice("SoftmaxCrossEntropyGrad", {dloss, logits, labels},
                         {{"reduction", std::string(reduction)}});
    ASSERT_EQ(out.size(), 1u);
    std::vector<double> expected(12, 0.0);
    for (int64_t r = 0; r < 4; ++r) {
      const int64_t label = static_cast<int64_t>(labels.get(r));
      if (label == -100) continue;
      double weight = none ? dloss.get(r) : dloss.get(0);
      if (std::string(reduction) == "mean") weight /= 3; // three counted rows
      double sum = 0;
      for (int64_t c = 0; c < 3; ++c)
        sum += std::exp(logits.get(r * 3 + c));
      for (int64_t c = 0; c < 3; ++c)
        expected[static_cast<size_t>(r * 3 + c)] =
            weight * (std::exp(logits.get(r * 3 + c)) / sum - (c == label ? 1 : 0));
    }
    expect_close(out[0], expected, 1e-6, 1e-5, "dLogits");
  }
}

TEST(MseLossGradKernel, MatchesReference) {
  TestTensor p = test_tensor({2, 3}, 92), t = test_tensor({2, 3}, 93);
  TestTensor dloss = ops::testing::tensor(DType::kF32, {}, {3});
  auto out = run_twice("MseLossGrad", {dloss, p, t}, {});
  ASSERT_EQ(out.size(), 2u);
  std::vector<double> dp(6), dt(6);
  for (int64_t i = 0; i < 6; ++i) {
    dp[static_cast<size_t>(i)] = 3.0 * 2 * (p.get(i) - t.get(i)) / 6;
    dt[static_cast<size_t>(i)] = -dp[static_cast<size_t>(i)];
  }
  expect_close(out[0], dp, 1e-6, 1e-5, "dPrediction");
  expect_close(out[1], dt, 1e-6, 1e-5, "dTarget");
}

TEST(BatchNormalizationGrad, InferenceFormHasNoRule) {
  GraphBuilder b("bn", ops::OpRegistry::global());
  TensorId x = b.input("x", DType::kF32, {2, 3});
  std::vector<TensorId> params;
  for (const char *name : {"scale", "bias", "mean", "var"})
    params.push_back(b.input(name, DType::kF32, {3}));
  TensorId y = b.op1("BatchNormalization", {x, params[0], params[1], params[2], params[3]});
  TensorId loss = b.op1("ReduceSum", {y}, {{"keepdims", int64_t{0}}});
  b.output(loss);
  auto graph = std::move(b).finish();
  ASSERT_TRUE(graph.is_ok()) << graph.status().to_string();
  auto grads = passes::append_backward(*graph, loss, {x});
  EXPECT_FALSE(grads.is_ok());
}

} // namespace
} // namespace strata
