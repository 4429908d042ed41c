// Tests of the neural-network ops: every op against a plain reference written
// here in double precision, run through the registry into guarded buffers; the
// GEMM-backed ops on every GEMM backend built in; costs against hand counts; and
// the inference errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ops/kernels/cpu/conv.h"
#include "ops/kernels/cpu/gemm.h"
#include "ops/matmul_shape.h"
#include "ops/registry.h"
#include "ops/window.h"
#include "tests/ops/op_test_util.h"

namespace strata::ops {
namespace {

using namespace strata::ops::testing;

constexpr DType kF32 = DType::kF32;

// Runs `body` once per GEMM backend built in, restoring the default after.
template <typename Body> void for_each_gemm_backend(Body body) {
  const cpu::GemmBackend saved = cpu::gemm_backend();
  for (cpu::GemmBackend backend : {cpu::GemmBackend::kOneDnn, cpu::GemmBackend::kOpenBlas}) {
    if (!cpu::set_gemm_backend(backend)) continue;
    SCOPED_TRACE(std::string(cpu::gemm_backend_name(backend)));
    body();
  }
  ASSERT_TRUE(cpu::set_gemm_backend(saved));
}

// ---------------------------------------------------------------------------
// MatMul

struct Reference {
  Shape shape;
  std::vector<double> values;
};

// NumPy matmul in double, with trans_a/trans_b on operands of rank >= 2.
Reference reference_matmul(const TestTensor &a, const TestTensor &b, bool trans_a, bool trans_b) {
  const Shape &as = a.type.shape, &bs = b.type.shape;
  const bool a_vec = as.size() == 1, b_vec = bs.size() == 1;
  // Stored matrix sizes and batch shapes.
  const int64_t a_rows = a_vec ? 1 : as[as.size() - 2], a_cols = as.back();
  const int64_t b_rows = b_vec ? bs[0] : bs[bs.size() - 2], b_cols = b_vec ? 1 : bs.back();
  Shape a_batch(as.begin(), as.end() - (a_vec ? 1 : 2));
  Shape b_batch(bs.begin(), bs.end() - (b_vec ? 1 : 2));
  const bool ta = trans_a && !a_vec, tb = trans_b && !b_vec;
  const int64_t m = ta ? a_cols : a_rows, k = ta ? a_rows : a_cols;
  const int64_t n = tb ? b_rows : b_cols;
  const size_t rank = std::max(a_batch.size(), b_batch.size());
  Shape batch(rank, 1);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i < rank - a_batch.size() ? 1 : a_batch[i - (rank - a_batch.size())];
    int64_t db = i < rank - b_batch.size() ? 1 : b_batch[i - (rank - b_batch.size())];
    batch[i] = da == 1 ? db : da;
  }
  Reference out;
  out.shape = batch;
  if (!a_vec) out.shape.push_back(m);
  if (!b_vec) out.shape.push_back(n);
  const int64_t batch_count = num_elements(batch);
  for (int64_t bi = 0; bi < batch_count; ++bi) {
    Shape index = unravel(bi, batch);
    const int64_t a_base = broadcast_flat(index, a_batch) * a_rows * a_cols;
    const int64_t b_base = broadcast_flat(index, b_batch) * b_rows * b_cols;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < k; ++p) {
          double av = a.get(a_base + (ta ? p * a_cols + i : i * a_cols + p));
          double bv = b.get(b_base + (tb ? j * b_cols + p : p * b_cols + j));
          sum += av * bv;
        }
        out.values.push_back(sum);
      }
  }
  return out;
}

struct MatMulCase {
  Shape a, b;
  bool trans_a = false, trans_b = false;
};

TEST(MatMul, MatchesReference) {
  const std::vector<MatMulCase> cases = {
      {{3, 4}, {4, 5}},
      {{1, 1}, {1, 1}},
      {{64, 129}, {129, 96}},
      {{2, 3, 4}, {4, 5}},           // one B for the batch: folded into one product
      {{2, 3, 4}, {2, 4, 5}},        // batched, same batch
      {{2, 1, 3, 4}, {3, 4, 5}},     // batch dims broadcast both ways: [2, 3]
      {{3, 4}, {2, 4, 5}},           // A broadcast over B's batch
      {{4}, {4, 5}},                 // 1-D A
      {{3, 4}, {4}},                 // 1-D B
      {{4}, {4}},                    // dot product: scalar
      {{2, 3, 4}, {4}},              // batched matrix-vector
      {{7}, {2, 7, 3}},              // vector-batched matrix
      {{4, 3}, {4, 5}, true, false}, // trans_a
      {{3, 4}, {5, 4}, false, true}, // trans_b
      {{2, 4, 3}, {5, 4}, true, true},
      {{2, 4, 3}, {4, 5}, true, false}, // trans_a with a shared B: no folding
      {{4}, {5, 4}, true, true},        // trans ignored on the 1-D operand
      {{0, 4}, {4, 5}},
      {{3, 0}, {0, 2}}, // K = 0: zeros
  };
  uint32_t seed = 1;
  for (const MatMulCase &c : cases) {
    std::mt19937 rng(seed++);
    TestTensor a = random_tensor(kF32, c.a, rng);
    TestTensor b = random_tensor(kF32, c.b, rng);
    Reference want = reference_matmul(a, b, c.trans_a, c.trans_b);
    std::string what = shape_to_string(c.a) + " x " + shape_to_string(c.b) +
                       " trans_a=" + std::to_string(c.trans_a) +
                       " trans_b=" + std::to_string(c.trans_b);
    for_each_gemm_backend([&] {
      TestTensor y = run_one("MatMul", {a, b},
                             {int_attr("trans_a", c.trans_a), int_attr("trans_b", c.trans_b)});
      EXPECT_EQ(y.type.shape, want.shape) << what;
      expect_close(y, want.values, 1e-5, 1e-4, what);
    });
  }
}

// The CUDA backend issues a batched MatMul as strided products over blocks
// of its batch: every entry's offsets follow from its block's first entry
// and the strides, and the blocks are as large as the trailing dims allow.
TEST(MatMul, StridedBatchBlocksReproduceEveryOffset) {
  struct Case {
    Shape a_batch, b_batch;
    int64_t outer, inner;
  };
  const int64_t mk = 6, kn = 10; // matrix sizes of A and B
  const std::vector<Case> cases = {
      {{4}, {4}, 1, 4},             // both step through the batch
      {{4}, {1}, 1, 4},             // B shared by every entry
      {{2, 3}, {3}, 2, 3},          // weights shared over an outer batch
      {{2, 1}, {1, 3}, 2, 3},       // A fixed within a block of B's
      {{3, 1}, {1, 2}, 3, 2},       //
      {{2, 1, 2}, {1, 2, 1}, 4, 2}, // only the last dim steps evenly
      {{}, {}, 1, 1},               // no batch dims
  };
  for (const Case &c : cases) {
    const std::string what = shape_to_string(c.a_batch) + " x " + shape_to_string(c.b_batch);
    Shape batch = c.a_batch.size() >= c.b_batch.size() ? c.a_batch : c.b_batch;
    for (size_t i = 0; i < batch.size(); ++i) {
      const size_t from_end = batch.size() - 1 - i;
      auto dim = [&](const Shape &s) {
        return from_end < s.size() ? s[s.size() - 1 - from_end] : int64_t{1};
      };
      batch[i] = std::max(dim(c.a_batch), dim(c.b_batch));
    }
    const std::vector<int64_t> a = batch_offsets(c.a_batch, batch, mk);
    const std::vector<int64_t> b = batch_offsets(c.b_batch, batch, kn);
    const BatchBlocks blocks = strided_batch_blocks(batch, a, b);
    EXPECT_EQ(blocks.outer, c.outer) << what;
    EXPECT_EQ(blocks.inner, c.inner) << what;
    ASSERT_EQ(blocks.outer * blocks.inner, static_cast<int64_t>(a.size())) << what;
    for (int64_t j = 0; j < blocks.outer; ++j)
      for (int64_t i = 0; i < blocks.inner; ++i) {
        const auto e = static_cast<size_t>(j * blocks.inner + i);
        const auto first = static_cast<size_t>(j * blocks.inner);
        EXPECT_EQ(a[e], a[first] + i * blocks.stride_a) << what << " entry " << e;
        EXPECT_EQ(b[e], b[first] + i * blocks.stride_b) << what << " entry " << e;
      }
  }
}

TEST(MatMul, IsDeterministic) {
  std::mt19937 rng(7);
  TestTensor a = random_tensor(kF32, {4, 96, 300}, rng);
  TestTensor b = random_tensor(kF32, {300, 200}, rng);
  TestTensor first = run_one("MatMul", {a, b});
  for (int i = 0; i < 3; ++i)
    expect_same_tensor(run_one("MatMul", {a, b}), first, "MatMul rerun");
}

TEST(MatMul, InferenceErrors) {
  const TensorType a{kF32, {2, 3}}, b{kF32, {4, 5}};
  expect_error(infer("MatMul", {a, b}).status(), {"MatMul", "inner dimensions", "input 0 f32[2, 3]",
                                                  "K = 3", "input 1 f32[4, 5]", "K = 4"});
  expect_error(infer("MatMul", {TensorType{kF32, {2, 3, 4}}, TensorType{kF32, {3, 4, 5}}}).status(),
               {"batch dimensions", "f32[2, 3, 4]", "f32[3, 4, 5]"});
  expect_error(infer("MatMul", {TensorType{kF32, {}}, b}).status(), {"input 0", "rank >= 1"});
  expect_error(infer("MatMul", {TensorType{kF32, {2, 3}}, TensorType{kF32, {2, 3}}},
                     {int_attr("trans_a", 2)})
                   .status(),
               {"trans_a", "0 or 1"});
  expect_error(
      infer("MatMul", {TensorType{DType::kI32, {2, 3}}, TensorType{DType::kI32, {3, 2}}}).status(),
      {"floating"});
  // A shape that is fine once transposed.
  auto ok = infer("MatMul", {a, TensorType{kF32, {5, 3}}}, {int_attr("trans_b", 1)});
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ((*ok)[0].shape, (Shape{2, 5}));
}

TEST(MatMul, OtherDTypesAreUnimplemented) {
  TestTensor a = zeros(DType::kF16, {2, 3}), b = zeros(DType::kF16, {3, 2});
  RunResult result = run_op("MatMul", {a, b});
  EXPECT_EQ(result.status.code(), StatusCode::kUnimplemented);
  expect_error(result.status, {"MatMul", "f16"});
}

// ---------------------------------------------------------------------------
// Gemm

struct GemmCase {
  int64_t m, n, k;
  bool trans_a, trans_b;
  std::optional<Shape> c;
  double alpha, beta;
};

TEST(Gemm, MatchesReference) {
  const std::vector<GemmCase> cases = {
      {3, 5, 4, false, false, std::nullopt, 1.0, 1.0},
      {3, 5, 4, true, false, Shape{3, 5}, 1.0, 1.0},
      {3, 5, 4, false, true, Shape{5}, 0.5, 2.0},
      {3, 5, 4, true, true, Shape{3, 1}, -1.5, 0.25},
      {33, 17, 65, false, false, Shape{1, 17}, 2.0, -1.0},
      {6, 7, 8, false, false, Shape{}, 1.0, 3.0},
      {6, 7, 8, false, false, Shape{6, 7}, 1.0, 0.0}, // beta 0: C ignored
  };
  uint32_t seed = 100;
  for (const GemmCase &c : cases) {
    std::mt19937 rng(seed++);
    TestTensor a = random_tensor(kF32, c.trans_a ? Shape{c.k, c.m} : Shape{c.m, c.k}, rng);
    TestTensor b = random_tensor(kF32, c.trans_b ? Shape{c.n, c.k} : Shape{c.k, c.n}, rng);
    std::vector<TestTensor> inputs = {a, b};
    if (c.c) inputs.push_back(random_tensor(kF32, *c.c, rng));
    std::vector<double> want;
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < c.k; ++p)
          sum += a.get(c.trans_a ? p * c.m + i : i * c.k + p) *
                 b.get(c.trans_b ? j * c.k + p : p * c.n + j);
        double value = c.alpha * sum;
        if (c.c) {
          const Shape &cs = *c.c;
          int64_t ci = cs.size() == 2   ? (cs[0] == 1 ? 0 : i) * cs[1] + (cs[1] == 1 ? 0 : j)
                       : cs.size() == 1 ? (cs[0] == 1 ? 0 : j)
                                        : 0;
          value += c.beta * inputs[2].get(ci);
        }
        want.push_back(value);
      }
    std::string what = "Gemm m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) +
                       " k=" + std::to_string(c.k) +
                       " C=" + (c.c ? shape_to_string(*c.c) : std::string("none"));
    for_each_gemm_backend([&] {
      TestTensor y = run_one("Gemm", inputs,
                             {float_attr("alpha", c.alpha), float_attr("beta", c.beta),
                              int_attr("trans_a", c.trans_a), int_attr("trans_b", c.trans_b)});
      EXPECT_EQ(y.type.shape, (Shape{c.m, c.n})) << what;
      expect_close(y, want, 1e-5, 1e-4, what);
    });
  }
}

TEST(Gemm, InferenceErrors) {
  expect_error(infer("Gemm", {TensorType{kF32, {2, 3}}, TensorType{kF32, {4, 5}}}).status(),
               {"Gemm", "inner dimensions", "f32[2, 3]", "f32[4, 5]"});
  expect_error(
      infer("Gemm", {TensorType{kF32, {2, 3}}, TensorType{kF32, {3, 5}}, TensorType{kF32, {2, 4}}})
          .status(),
      {"input 2", "f32[2, 4]", "[2, 5]"});
  expect_error(infer("Gemm", {TensorType{kF32, {2, 3, 1}}, TensorType{kF32, {3, 5}}}).status(),
               {"input 0", "rank 2", "f32[2, 3, 1]"});
}

// ---------------------------------------------------------------------------
// LayerNorm

TEST(LayerNorm, MatchesReference) {
  struct Case {
    Shape x;
    int64_t axis;
    double offset; // added to X: a large mean tests the variance computation
  };
  const std::vector<Case> cases = {
      {{4, 8}, -1, 0.0}, {{2, 3, 5}, 1, 0.0}, {{3, 7}, 0, 0.0}, {{5, 64}, -1, 1000.0}};
  uint32_t seed = 200;
  for (const Case &c : cases) {
    std::mt19937 rng(seed++);
    TestTensor x = random_tensor(kF32, c.x, rng, c.offset - 1.0, c.offset + 1.0);
    const int64_t axis = c.axis < 0 ? c.axis + static_cast<int64_t>(c.x.size()) : c.axis;
    Shape norm_shape(c.x.begin() + axis, c.x.end());
    TestTensor scale = random_tensor(kF32, norm_shape, rng, 0.5, 1.5);
    TestTensor bias = random_tensor(kF32, norm_shape, rng);
    const double eps = 1e-5;
    const int64_t size = num_elements(norm_shape), rows = x.num_elements() / size;
    std::vector<double> want;
    for (int64_t r = 0; r < rows; ++r) {
      double mean = 0, var = 0;
      for (int64_t i = 0; i < size; ++i)
        mean += x.get(r * size + i) / static_cast<double>(size);
      for (int64_t i = 0; i < size; ++i)
        var += std::pow(x.get(r * size + i) - mean, 2) / static_cast<double>(size);
      for (int64_t i = 0; i < size; ++i)
        want.push_back((x.get(r * size + i) - mean) / std::sqrt(var + eps) * scale.get(i) +
                       bias.get(i));
    }
    TestTensor y = run_one("LayerNorm", {x, scale, bias}, {int_attr("axis", c.axis)});
    expect_close(y, want, 1e-5, 1e-5, "LayerNorm " + shape_to_string(c.x));
  }
}

TEST(LayerNorm, InferenceErrors) {
  expect_error(infer("LayerNorm",
                     {TensorType{kF32, {2, 3, 4}}, TensorType{kF32, {3, 4}}, TensorType{kF32, {4}}})
                   .status(),
               {"LayerNorm", "input 1 (scale)", "f32[3, 4]", "[4]", "f32[2, 3, 4]"});
  expect_error(
      infer("LayerNorm",
            {TensorType{kF32, {2, 3, 4}}, TensorType{kF32, {3, 4}}, TensorType{kF32, {3, 5}}},
            {int_attr("axis", 1)})
          .status(),
      {"input 2 (bias)", "f32[3, 5]", "[3, 4]"});
  expect_error(infer("LayerNorm",
                     {TensorType{kF32, {2, 3}}, TensorType{kF32, {3}}, TensorType{kF32, {3}}},
                     {int_attr("axis", 2)})
                   .status(),
               {"axis"});
}

// ---------------------------------------------------------------------------
// Conv2d

struct ConvCase {
  Shape x; // N, C, H, W
  Shape w; // M, C/group, kH, kW
  bool bias;
  std::vector<int64_t> strides, pads, dilations;
  int64_t group;
};

// Direct convolution in double.
Reference reference_conv(const TestTensor &x, const TestTensor &w, const TestTensor *bias,
                         const ConvCase &c) {
  const int64_t n = c.x[0], ch = c.x[1], h = c.x[2], wd = c.x[3];
  const int64_t m = c.w[0], cg = c.w[1], kh = c.w[2], kw = c.w[3];
  const int64_t oh = (h + c.pads[0] + c.pads[2] - c.dilations[0] * (kh - 1) - 1) / c.strides[0] + 1;
  const int64_t ow =
      (wd + c.pads[1] + c.pads[3] - c.dilations[1] * (kw - 1) - 1) / c.strides[1] + 1;
  const int64_t mg = m / c.group;
  Reference out{{n, m, oh, ow}, {}};
  for (int64_t b = 0; b < n; ++b)
    for (int64_t o = 0; o < m; ++o)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t xo = 0; xo < ow; ++xo) {
          double sum = bias ? bias->get(o) : 0.0;
          const int64_t g = o / mg;
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t ky = 0; ky < kh; ++ky)
              for (int64_t kx = 0; kx < kw; ++kx) {
                int64_t iy = y * c.strides[0] - c.pads[0] + ky * c.dilations[0];
                int64_t ix = xo * c.strides[1] - c.pads[1] + kx * c.dilations[1];
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                sum += x.get(((b * ch + g * cg + ci) * h + iy) * wd + ix) *
                       w.get(((o * cg + ci) * kh + ky) * kw + kx);
              }
          out.values.push_back(sum);
        }
  (void)ch;
  return out;
}

TEST(Conv2d, MatchesReference) {
  const std::vector<ConvCase> cases = {
      {{1, 1, 5, 5}, {1, 1, 3, 3}, false, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1},
      {{2, 3, 9, 8}, {4, 3, 3, 3}, true, {2, 2}, {1, 1, 1, 1}, {1, 1}, 1},    // stride 2, pad
      {{1, 2, 11, 10}, {3, 2, 3, 3}, true, {1, 1}, {2, 2, 2, 2}, {2, 2}, 1},  // dilation 2
      {{2, 4, 7, 7}, {6, 2, 3, 3}, true, {1, 1}, {1, 1, 1, 1}, {1, 1}, 2},    // groups 2
      {{1, 8, 10, 9}, {8, 1, 3, 3}, true, {2, 1}, {1, 0, 1, 2}, {1, 1}, 8},   // depthwise, uneven
      {{3, 16, 6, 6}, {8, 16, 1, 1}, false, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1}, // 1x1
      {{1, 3, 4, 4}, {2, 3, 4, 4}, true, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1},    // kernel = input
  };
  uint32_t seed = 300;
  for (const ConvCase &c : cases) {
    std::mt19937 rng(seed++);
    TestTensor x = random_tensor(kF32, c.x, rng);
    TestTensor w = random_tensor(kF32, c.w, rng);
    TestTensor b = random_tensor(kF32, {c.w[0]}, rng);
    std::vector<TestTensor> inputs = {x, w};
    if (c.bias) inputs.push_back(b);
    Reference want = reference_conv(x, w, c.bias ? &b : nullptr, c);
    std::string what = "Conv2d X" + shape_to_string(c.x) + " W" + shape_to_string(c.w) + " group " +
                       std::to_string(c.group);
    std::vector<Attribute> attrs = {ints_attr("strides", c.strides), ints_attr("pads", c.pads),
                                    ints_attr("dilations", c.dilations),
                                    int_attr("group", c.group)};
    TestTensor y = run_one("Conv2d", inputs, attrs);
    EXPECT_EQ(y.type.shape, want.shape) << what;
    expect_close(y, want.values, 1e-5, 1e-4, what);
    // The same again reuses the cached primitive and gives the same bits.
    const int64_t cached = cpu::conv2d_primitive_cache_size();
    expect_same_tensor(run_one("Conv2d", inputs, attrs), y, what + " rerun");
    EXPECT_EQ(cpu::conv2d_primitive_cache_size(), cached) << what;

    // The im2col path, which serves builds without oneDNN.
    cpu::Conv2dParams p{c.x[0],         c.x[1],        c.x[2],       c.x[3],       c.w[0],
                        c.w[2],         c.w[3],        c.group,      c.strides[0], c.strides[1],
                        c.pads[0],      c.pads[1],     c.pads[2],    c.pads[3],    c.dilations[0],
                        c.dilations[1], want.shape[2], want.shape[3]};
    TestTensor im2col = zeros(kF32, want.shape);
    ASSERT_TRUE(cpu::conv2d_forward_im2col(p, x.as<float>(), w.as<float>(),
                                           c.bias ? b.as<float>() : nullptr, im2col.as<float>())
                    .is_ok());
    expect_close(im2col, want.values, 1e-5, 1e-4, what + " im2col");
  }
}

// Sanitizers end the program at an allocation this large instead of failing it.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) ||                         \
    __has_feature(memory_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// A patch matrix no host can hold is an error saying how much it needed, not
// an exception or a crash. (oneDNN sizes its own scratchpad, which is checked
// the same way, so no shape reaches that check on purpose.)
TEST(Conv2d, APatchMatrixBeyondTheHostIsResourceExhausted) {
  if (kSanitized) GTEST_SKIP() << "the sanitizer would end the test at the allocation";
  // A 4096x2048 kernel over a padded 1x1 input: 2^23 patch rows by 2^23
  // output positions, 2^46 floats (256 TiB, more than a 47-bit address space
  // maps) of patches from 32 MiB of weights and 32 MiB of output.
  cpu::Conv2dParams p;
  p.batch = 1;
  p.in_channels = 1;
  p.in_h = 1;
  p.in_w = 1;
  p.out_channels = 1;
  p.kernel_h = 4096;
  p.kernel_w = 2048;
  p.pad_top = p.pad_bottom = 4095;
  p.pad_left = p.pad_right = 2047;
  p.out_h = 4096;
  p.out_w = 2048;
  std::vector<float> x(1), w(size_t{1} << 23), y(size_t{1} << 23);
  Status status = cpu::conv2d_forward_im2col(p, x.data(), w.data(), nullptr, y.data());
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.to_string();
  expect_error(status, {"out of memory", "patch matrix", "(281474976710656 bytes)"});
}

TEST(Conv2d, InferenceErrors) {
  const TensorType x{kF32, {1, 4, 8, 8}};
  expect_error(infer("Conv2d", {x, TensorType{kF32, {6, 3, 3, 3}}}).status(),
               {"Conv2d", "input 1 (W)", "f32[6, 3, 3, 3]", "C/group", "f32[1, 4, 8, 8]"});
  expect_error(
      infer("Conv2d", {x, TensorType{kF32, {6, 4, 3, 3}}}, {int_attr("group", 3)}).status(),
      {"group = 3", "must divide", "4", "6"});
  expect_error(
      infer("Conv2d", {x, TensorType{kF32, {2, 4, 11, 3}}}, {ints_attr("pads", {1, 0, 1, 0})})
          .status(),
      {"kernel 11x3", "larger than the padded input 10x8", "f32[1, 4, 8, 8]"});
  expect_error(infer("Conv2d", {x, TensorType{kF32, {2, 4, 3, 3}}, TensorType{kF32, {3}}}).status(),
               {"input 2 (bias)", "f32[3]", "[2]"});
  expect_error(
      infer("Conv2d", {x, TensorType{kF32, {2, 4, 3, 3}}}, {ints_attr("strides", {1})}).status(),
      {"strides", "2 values"});
  expect_error(
      infer("Conv2d", {TensorType{kF32, {4, 8, 8}}, TensorType{kF32, {2, 4, 3, 3}}}).status(),
      {"input 0", "rank 4", "f32[4, 8, 8]"});
  // A kernel without taps (its output would be the bias alone).
  for (const Shape &w : {Shape{2, 4, 0, 3}, Shape{2, 4, 3, 0}})
    expect_error(infer("Conv2d", {x, TensorType{kF32, w}}).status(),
                 {"Conv2d: input 1 (W) " + TensorType{kF32, w}.to_string() + " has a kernel of " +
                      std::to_string(w[2]) + "x" + std::to_string(w[3]),
                  "kH and kW must be at least 1"});
  expect_error(infer("Conv2dGradInput",
                     {TensorType{kF32, {1, 2, 9, 6}}, TensorType{kF32, {2, 4, 0, 3}}},
                     {ints_attr("input_shape", {1, 4, 8, 8})})
                   .status(),
               {"Conv2dGradInput", "has a kernel of 0x3"});
  // Window sizes beyond 32 bits (a fuzzed model: their dilated extent
  // overflowed int64) are refused by name.
  const int64_t huge = int64_t{1} << 40;
  expect_error(infer("MaxPool2d", {x},
                     {ints_attr("kernel_shape", {2, huge}), ints_attr("dilations", {1, huge})})
                   .status(),
               {"MaxPool2d", "attribute 'kernel_shape' holds 1099511627776", "2^31 - 1"});
  expect_error(infer("Conv2d", {x, TensorType{kF32, {2, 4, 3, 3}}},
                     {ints_attr("dilations", {1, huge})})
                   .status(),
               {"Conv2d", "attribute 'dilations' holds 1099511627776"});
}

// ---------------------------------------------------------------------------
// Pools

struct PoolCase {
  Shape x;
  std::vector<int64_t> kernel, strides, pads, dilations;
  bool ceil_mode;
  bool include_pad; // AveragePool2d only
};

int64_t reference_pool_size(int64_t in, int64_t k, int64_t s, int64_t p0, int64_t p1, int64_t d,
                            bool ceil_mode) {
  const double exact = static_cast<double>(in + p0 + p1 - (k - 1) * d - 1) / static_cast<double>(s);
  int64_t out = static_cast<int64_t>(ceil_mode ? std::ceil(exact) : std::floor(exact)) + 1;
  // ONNX: in ceil mode, a window starting in the end padding is dropped.
  if (ceil_mode && (out - 1) * s - p0 >= in) --out;
  return out;
}

Reference reference_pool(const TestTensor &x, const PoolCase &c, bool is_max) {
  const int64_t n = c.x[0], ch = c.x[1], h = c.x[2], w = c.x[3];
  const int64_t oh = reference_pool_size(h, c.kernel[0], c.strides[0], c.pads[0], c.pads[2],
                                         c.dilations[0], c.ceil_mode);
  const int64_t ow = reference_pool_size(w, c.kernel[1], c.strides[1], c.pads[1], c.pads[3],
                                         c.dilations[1], c.ceil_mode);
  Reference out{{n, ch, oh, ow}, {}};
  for (int64_t plane = 0; plane < n * ch; ++plane)
    for (int64_t y = 0; y < oh; ++y)
      for (int64_t xo = 0; xo < ow; ++xo) {
        double best = -std::numeric_limits<double>::infinity(), sum = 0;
        int64_t inside = 0, in_padded = 0;
        for (int64_t ky = 0; ky < c.kernel[0]; ++ky)
          for (int64_t kx = 0; kx < c.kernel[1]; ++kx) {
            const int64_t iy = y * c.strides[0] - c.pads[0] + ky * c.dilations[0];
            const int64_t ix = xo * c.strides[1] - c.pads[1] + kx * c.dilations[1];
            // Positions inside the explicitly padded input count with count_include_pad.
            if (iy < h + c.pads[2] && ix < w + c.pads[3]) ++in_padded;
            if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
            const double v = x.get((plane * h + iy) * w + ix);
            best = std::max(best, v);
            sum += v;
            ++inside;
          }
        out.values.push_back(
            is_max ? best : sum / static_cast<double>(c.include_pad ? in_padded : inside));
      }
  return out;
}

TEST(MaxPool2d, MatchesReference) {
  const std::vector<PoolCase> cases = {
      {{1, 1, 4, 4}, {2, 2}, {2, 2}, {0, 0, 0, 0}, {1, 1}, false, false},
      {{2, 3, 9, 8}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, false, false},
      {{2, 3, 9, 8}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, true, false},
      {{1, 2, 5, 5}, {2, 2}, {2, 2}, {1, 1, 1, 1}, {1, 1}, true, false}, // drops a window
      {{1, 2, 10, 11}, {3, 2}, {1, 2}, {2, 0, 1, 1}, {2, 2}, true, false},
      {{1, 1, 6, 7}, {2, 3}, {3, 2}, {0, 1, 1, 0}, {1, 1}, true, false},
      // 2x2 stride 2 without padding takes a vectorized path, four outputs at a
      // time; odd widths leave columns for the scalar tail.
      {{2, 3, 8, 12}, {2, 2}, {2, 2}, {0, 0, 0, 0}, {1, 1}, false, false},
      {{1, 2, 6, 19}, {2, 2}, {2, 2}, {0, 0, 0, 0}, {1, 1}, false, false},
      {{1, 2, 7, 21}, {2, 2}, {2, 2}, {0, 0, 0, 0}, {1, 1}, true, false},
      // Windows inside the input take a vectorized path, four outputs at a
      // time (ResNet's 3x3 stride 2; stride 1 and dilation), borders the generic.
      {{1, 2, 13, 29}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, false, false},
      {{1, 1, 9, 20}, {3, 3}, {1, 1}, {1, 1, 1, 1}, {2, 2}, false, false},
      {{1, 1, 8, 27}, {2, 3}, {1, 3}, {0, 2, 1, 0}, {1, 1}, true, false},
  };
  uint32_t seed = 400;
  for (const PoolCase &c : cases) {
    std::mt19937 rng(seed++);
    TestTensor x = random_tensor(kF32, c.x, rng, -3.0, -1.0); // all negative: padding must lose
    Reference want = reference_pool(x, c, true);
    TestTensor y = run_one("MaxPool2d", {x},
                           {ints_attr("kernel_shape", c.kernel), ints_attr("strides", c.strides),
                            ints_attr("pads", c.pads), ints_attr("dilations", c.dilations),
                            int_attr("ceil_mode", c.ceil_mode)});
    std::string what =
        "MaxPool2d X" + shape_to_string(c.x) + " ceil " + std::to_string(c.ceil_mode);
    EXPECT_EQ(y.type.shape, want.shape) << what;
    expect_close(y, want.values, 0, 0, what);
  }
}

TEST(AveragePool2d, MatchesReference) {
  const std::vector<PoolCase> cases = {
      {{1, 1, 4, 4}, {2, 2}, {2, 2}, {0, 0, 0, 0}, {1, 1}, false, false},
      {{2, 3, 9, 8}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, false, false},
      {{2, 3, 9, 8}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, false, true},
      {{2, 3, 9, 8}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, true, true},
      {{2, 3, 9, 8}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, true, false},
      {{1, 2, 6, 6}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, true, true},
      {{1, 2, 7, 5}, {3, 2}, {2, 3}, {0, 1, 2, 1}, {1, 1}, true, true},
  };
  uint32_t seed = 500;
  for (const PoolCase &c : cases) {
    std::mt19937 rng(seed++);
    TestTensor x = random_tensor(kF32, c.x, rng);
    Reference want = reference_pool(x, c, false);
    TestTensor y = run_one("AveragePool2d", {x},
                           {ints_attr("kernel_shape", c.kernel), ints_attr("strides", c.strides),
                            ints_attr("pads", c.pads), int_attr("ceil_mode", c.ceil_mode),
                            int_attr("count_include_pad", c.include_pad)});
    std::string what = "AveragePool2d X" + shape_to_string(c.x) + " ceil " +
                       std::to_string(c.ceil_mode) + " include_pad " +
                       std::to_string(c.include_pad);
    EXPECT_EQ(y.type.shape, want.shape) << what;
    expect_close(y, want.values, 1e-6, 1e-6, what);
  }
}

// Values computed with PyTorch's avg_pool2d(x, 3, 2, 1, ceil_mode=True,
// count_include_pad=True) on arange(25).reshape(5, 5), which ONNX agrees with.
TEST(AveragePool2d, MatchesPyTorchCeilModeWithPadding) {
  std::vector<double> x(25);
  for (int i = 0; i < 25; ++i)
    x[i] = i;
  TestTensor y = run_one("AveragePool2d", {tensor(kF32, {1, 1, 5, 5}, x)},
                         {ints_attr("kernel_shape", {3, 3}), ints_attr("strides", {2, 2}),
                          ints_attr("pads", {1, 1, 1, 1}), int_attr("ceil_mode", 1),
                          int_attr("count_include_pad", 1)});
  EXPECT_EQ(y.type.shape, (Shape{1, 1, 3, 3}));
  expect_close(y, {12.0 / 9, 3, 24.0 / 9, 7, 12, 9, 8, 13, 84.0 / 9}, 1e-5, 1e-5, "torch values");
  // ceil_mode's overhang past the end padding does not count (6x6 ones: 2/6).
  TestTensor ones = tensor(kF32, {1, 1, 6, 6}, std::vector<double>(36, 1.0));
  TestTensor z = run_one("AveragePool2d", {ones},
                         {ints_attr("kernel_shape", {3, 3}), ints_attr("strides", {2, 2}),
                          ints_attr("pads", {1, 1, 1, 1}), int_attr("ceil_mode", 1),
                          int_attr("count_include_pad", 1)});
  EXPECT_EQ(z.type.shape, (Shape{1, 1, 4, 4}));
  expect_close(z,
               {4.0 / 9, 6.0 / 9, 6.0 / 9, 2.0 / 6, 6.0 / 9, 1, 1, 3.0 / 6, 6.0 / 9, 1, 1, 3.0 / 6,
                2.0 / 6, 3.0 / 6, 3.0 / 6, 1.0 / 4},
               1e-6, 1e-6, "torch values, overhang");
}

TEST(Pool, InferenceErrors) {
  const TensorType x{kF32, {1, 2, 4, 4}};
  expect_error(infer("MaxPool2d", {x}).status(), {"MaxPool2d", "kernel_shape"});
  expect_error(infer("MaxPool2d", {x}, {ints_attr("kernel_shape", {5, 5})}).status(),
               {"kernel 5x5", "larger than the padded input 4x4"});
  expect_error(infer("AveragePool2d", {x},
                     {ints_attr("kernel_shape", {2, 2}), ints_attr("pads", {2, 0, 0, 0})})
                   .status(),
               {"pads must be smaller"});
  expect_error(
      infer("MaxPool2d", {TensorType{kF32, {2, 4, 4}}}, {ints_attr("kernel_shape", {2, 2})})
          .status(),
      {"rank 4", "f32[2, 4, 4]"});
  expect_error(
      infer("MaxPool2d", {x}, {ints_attr("kernel_shape", {2, 2}), ints_attr("strides", {0, 1})})
          .status(),
      {"strides", ">= 1"});
}

// A pool as cuDNN's descriptor API defines it: the top and left pads on both
// sides, no dilation, the output size rounded down, and windows that reach
// only the input's values (max ignores the padding; the average divides by
// the window's size with padding counted, else by its taps inside).
Reference cudnn_style_pool(const TestTensor &x, const PoolCase &c, bool is_max) {
  const int64_t h = c.x[2], w = c.x[3], pad_h = c.pads[0], pad_w = c.pads[1];
  const int64_t oh = (h + 2 * pad_h - c.kernel[0]) / c.strides[0] + 1;
  const int64_t ow = (w + 2 * pad_w - c.kernel[1]) / c.strides[1] + 1;
  Reference out{{c.x[0], c.x[1], oh, ow}, {}};
  for (int64_t plane = 0; plane < c.x[0] * c.x[1]; ++plane)
    for (int64_t y = 0; y < oh; ++y)
      for (int64_t xo = 0; xo < ow; ++xo) {
        double best = -std::numeric_limits<double>::infinity(), sum = 0;
        int64_t inside = 0;
        for (int64_t iy = y * c.strides[0] - pad_h; iy < y * c.strides[0] - pad_h + c.kernel[0];
             ++iy)
          for (int64_t ix = xo * c.strides[1] - pad_w; ix < xo * c.strides[1] - pad_w + c.kernel[1];
               ++ix) {
            if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
            const double v = x.get((plane * h + iy) * w + ix);
            best = std::max(best, v);
            sum += v;
            ++inside;
          }
        const int64_t divisor = c.include_pad ? c.kernel[0] * c.kernel[1] : inside;
        out.values.push_back(is_max ? best : sum / static_cast<double>(divisor));
      }
  return out;
}

// Where cudnn_pool_mismatch lets cuDNN pool, cuDNN's definition gives strata's
// results (shape and values, max and both averages); where it does not, the
// reason names what differs.
TEST(Pool, CudnnTakesOnlyWindowsItPoolsAsStrataDoes) {
  struct Case {
    PoolCase pool;
    std::string reason; // empty: cuDNN fits
  };
  const std::vector<Case> cases = {
      {{{2, 3, 9, 8}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, false, false}, ""},
      {{{2, 3, 9, 8}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, false, true}, ""},
      {{{1, 2, 8, 12}, {2, 2}, {2, 2}, {0, 0, 0, 0}, {1, 1}, false, false}, ""},
      {{{1, 2, 7, 6}, {3, 2}, {1, 2}, {2, 1, 2, 1}, {1, 1}, false, true}, ""},
      // ceil_mode that changes nothing (the sizes divide evenly) still fits.
      {{{1, 2, 8, 8}, {2, 2}, {2, 2}, {0, 0, 0, 0}, {1, 1}, true, false}, ""},
      {{{2, 3, 9, 8}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, true, false}, "ceil_mode"},
      {{{1, 1, 6, 7}, {2, 3}, {3, 2}, {0, 1, 1, 0}, {1, 1}, false, false}, "both sides alike"},
      {{{1, 1, 9, 20}, {3, 3}, {1, 1}, {1, 1, 1, 1}, {2, 2}, false, false}, "dilations"},
      {{{1, 1, 6, 6}, {2, 2}, {2, 2}, {2, 2, 2, 2}, {1, 1}, false, false}, "wholly in the padding"},
  };
  uint32_t seed = 450;
  for (const Case &k : cases) {
    const PoolCase &c = k.pool;
    Window window;
    window.kernel_h = c.kernel[0];
    window.kernel_w = c.kernel[1];
    window.stride_h = c.strides[0];
    window.stride_w = c.strides[1];
    window.pad_top = c.pads[0];
    window.pad_left = c.pads[1];
    window.pad_bottom = c.pads[2];
    window.pad_right = c.pads[3];
    window.dilation_h = c.dilations[0];
    window.dilation_w = c.dilations[1];
    std::mt19937 rng(seed++);
    // All negative: a pool that let the padding count (as 0) would differ.
    TestTensor x = random_tensor(kF32, c.x, rng, -3.0, -1.0);
    for (bool is_max : {true, false}) {
      const Reference strata = reference_pool(x, c, is_max);
      const std::string why = cudnn_pool_mismatch(window, c.x, strata.shape);
      const std::string what = shape_to_string(c.x) + (is_max ? " max" : " average");
      if (!k.reason.empty()) {
        EXPECT_NE(why.find(k.reason), std::string::npos) << what << ": " << why;
        continue;
      }
      EXPECT_EQ(why, "") << what;
      const Reference cudnn = cudnn_style_pool(x, c, is_max);
      ASSERT_EQ(cudnn.shape, strata.shape) << what;
      for (size_t i = 0; i < strata.values.size(); ++i)
        EXPECT_NEAR(cudnn.values[i], strata.values[i], 1e-12) << what << " at " << i;
    }
  }
  EXPECT_NE(cudnn_pool_mismatch(Window{}, {1, 1, int64_t{1} << 32, 1}, {1, 1, int64_t{1} << 32, 1})
                .find("32-bit"),
            std::string::npos);
  EXPECT_NE(cudnn_pool_mismatch(Window{}, {0, 3, 4, 4}, {0, 3, 4, 4}).find("no elements"),
            std::string::npos);
  EXPECT_EQ(cudnn_batch_norm_mismatch(4, 3, 30, 1e-5, true), "");
  EXPECT_EQ(cudnn_batch_norm_mismatch(70000, 3, 1, 0.0, true), "");
  EXPECT_NE(cudnn_batch_norm_mismatch(70000, 3, 1, 1e-5, false).find("beyond cuDNN's 65535"),
            std::string::npos);
  EXPECT_NE(cudnn_batch_norm_mismatch(1, 3, 1, 1e-5, true).find("one value per channel"),
            std::string::npos);
  EXPECT_NE(cudnn_batch_norm_mismatch(4, 0, 30, 1e-5, true).find("no channels"), std::string::npos);
  EXPECT_NE(cudnn_batch_norm_mismatch(4, 3, 30, -1e-5, true).find("epsilon"), std::string::npos);
  EXPECT_NE(cudnn_batch_norm_mismatch(4096, 64, int64_t{1} << 20, 1e-5, true).find("32-bit"),
            std::string::npos);
}

// ---------------------------------------------------------------------------
// GlobalAveragePool and BatchNormalization

TEST(GlobalAveragePool, MatchesReference) {
  std::mt19937 rng(600);
  TestTensor x = random_tensor(kF32, {2, 3, 4, 5}, rng);
  std::vector<double> want;
  for (int64_t p = 0; p < 6; ++p) {
    double sum = 0;
    for (int64_t i = 0; i < 20; ++i)
      sum += x.get(p * 20 + i);
    want.push_back(sum / 20);
  }
  TestTensor y = run_one("GlobalAveragePool", {x});
  EXPECT_EQ(y.type.shape, (Shape{2, 3, 1, 1}));
  expect_close(y, want, 1e-6, 1e-6, "GlobalAveragePool");
}

TEST(BatchNormalization, MatchesReference) {
  for (Shape shape : {Shape{2, 3, 4, 5}, Shape{4, 3}, Shape{2, 5, 7}}) {
    std::mt19937 rng(700 + static_cast<uint32_t>(shape.size()));
    const int64_t c = shape[1];
    TestTensor x = random_tensor(kF32, shape, rng, -2, 2);
    TestTensor scale = random_tensor(kF32, {c}, rng);
    TestTensor bias = random_tensor(kF32, {c}, rng);
    TestTensor mean = random_tensor(kF32, {c}, rng);
    TestTensor var = random_tensor(kF32, {c}, rng, 0.1, 2.0);
    const double eps = 1e-3;
    const int64_t inner = num_elements(llvm::ArrayRef<int64_t>(shape).drop_front(2));
    std::vector<double> want;
    for (int64_t i = 0; i < x.num_elements(); ++i) {
      const int64_t ch = (i / inner) % c;
      want.push_back((x.get(i) - mean.get(ch)) / std::sqrt(var.get(ch) + eps) * scale.get(ch) +
                     bias.get(ch));
    }
    TestTensor y =
        run_one("BatchNormalization", {x, scale, bias, mean, var}, {float_attr("epsilon", eps)});
    expect_close(y, want, 1e-5, 1e-5, "BatchNormalization " + shape_to_string(shape));
  }
  expect_error(infer("BatchNormalization",
                     {TensorType{kF32, {2, 3}}, TensorType{kF32, {3}}, TensorType{kF32, {3}},
                      TensorType{kF32, {4}}, TensorType{kF32, {3}}})
                   .status(),
               {"input 3 (mean)", "f32[4]", "[3]"});
}

// The norms divide by sqrt(variance + epsilon), and a constant row or channel
// has variance 0: an epsilon of 0 or less, NaN or infinity is refused when the
// node is checked, naming the op, the attribute and the value.
TEST(Norms, EpsilonMustBeAFinitePositiveNumber) {
  const TensorType x{kF32, {2, 3}}, c{kF32, {3}};
  const struct {
    const char *op;
    std::vector<TensorType> inputs;
  } norms[] = {
      {"LayerNorm", {x, c, c}},
      {"LayerNormGrad", {x, x, c}},
      {"BatchNormalization", {x, c, c, c, c}},
      {"BatchNormalizationGrad", {x, x, c}},
  };
  for (const auto &norm : norms) {
    auto fine = infer(norm.op, norm.inputs);
    EXPECT_TRUE(fine.is_ok()) << norm.op << ": " << fine.status().message();
    for (double eps : {0.0, -1e-5, std::nan(""), std::numeric_limits<double>::infinity()}) {
      const std::string value = str_cat(eps);
      expect_error(infer(norm.op, norm.inputs, {float_attr("epsilon", eps)}).status(),
                   {norm.op, "attribute 'epsilon' = " + value + " must be a finite number > 0"},
                   str_cat(norm.op, " epsilon ", value));
    }
  }
  expect_error(infer("BatchNormalization", {x, c, c, c, c}, {int_attr("training", 2)}).status(),
               {"BatchNormalization", "attribute 'training' must be 0 or 1, got 2"});
  expect_error(
      infer("BatchNormalization", {x, c, c, c, c}, {float_attr("momentum", std::nan(""))}).status(),
      {"BatchNormalization", "attribute 'momentum' = nan is outside [0, 1]"});
}

// Training mode on channels whose mean is large against their spread (the
// sums of non-negative activations deep in a ResNet): the normalized values
// keep their precision, as with PyTorch's centred computation. Folding the
// normalization into x * mul + add lost them to cancellation (errors of
// several percent in the gradients of the layers before).
TEST(BatchNormalization, TrainingKeepsChannelsWithLargeMeans) {
  const Shape shape{2, 3, 7, 7};
  std::mt19937 rng(710);
  TestTensor x = random_tensor(kF32, shape, rng, -1, 1);
  const double offsets[] = {0, 300, -5000};
  for (int64_t i = 0; i < x.num_elements(); ++i)
    x.set(i, offsets[(i / 49) % 3] + x.get(i) * 0.01);
  TestTensor scale = random_tensor(kF32, {3}, rng, 0.5, 2);
  TestTensor bias = random_tensor(kF32, {3}, rng);
  TestTensor mean = random_tensor(kF32, {3}, rng), var = random_tensor(kF32, {3}, rng, 0.5, 2);
  const double eps = 1e-5;
  std::vector<double> want;
  for (int64_t i = 0; i < x.num_elements(); ++i) {
    const int64_t ch = (i / 49) % 3;
    double sum = 0, squares = 0;
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t k = 0; k < 49; ++k)
        sum += x.get((n * 3 + ch) * 49 + k);
    const double mu = sum / 98;
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t k = 0; k < 49; ++k)
        squares += (x.get((n * 3 + ch) * 49 + k) - mu) * (x.get((n * 3 + ch) * 49 + k) - mu);
    want.push_back((x.get(i) - mu) / std::sqrt(squares / 98 + eps) * scale.get(ch) + bias.get(ch));
  }
  TestTensor y = run_one("BatchNormalization", {x, scale, bias, mean, var},
                         {float_attr("epsilon", eps), int_attr("training", 1)});
  expect_close(y, want, 1e-3, 1e-3, "BatchNormalization (training), large means");
}

// ---------------------------------------------------------------------------
// Losses

// Cross entropy of each row in double: logsumexp - logit[label].
std::vector<double> reference_cross_entropy(const TestTensor &logits,
                                            const std::vector<int64_t> &labels,
                                            int64_t ignore_index) {
  const int64_t classes = logits.type.shape.back();
  std::vector<double> losses;
  for (size_t r = 0; r < labels.size(); ++r) {
    if (labels[r] == ignore_index) {
      losses.push_back(std::nan(""));
      continue;
    }
    double max = -std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < classes; ++c)
      max = std::max(max, logits.get(static_cast<int64_t>(r) * classes + c));
    double sum = 0;
    for (int64_t c = 0; c < classes; ++c)
      sum += std::exp(logits.get(static_cast<int64_t>(r) * classes + c) - max);
    losses.push_back(max + std::log(sum) -
                     logits.get(static_cast<int64_t>(r) * classes + labels[r]));
  }
  return losses;
}

TEST(SoftmaxCrossEntropy, MatchesReference) {
  struct Case {
    Shape logits;
    DType label_type;
    double scale; // logits in [-scale, scale): large values test stability
  };
  const std::vector<Case> cases = {
      {{6, 5}, DType::kI64, 1.0}, {{2, 3, 4}, DType::kI32, 3.0}, {{4, 10}, DType::kI64, 1000.0}};
  uint32_t seed = 800;
  for (const Case &c : cases) {
    std::mt19937 rng(seed++);
    TestTensor logits = random_tensor(kF32, c.logits, rng, -c.scale, c.scale);
    const int64_t classes = c.logits.back();
    Shape label_shape(c.logits.begin(), c.logits.end() - 1);
    std::vector<int64_t> labels(static_cast<size_t>(num_elements(label_shape)));
    for (size_t i = 0; i < labels.size(); ++i)
      labels[i] = i % 3 == 1 ? -100 : static_cast<int64_t>(rng() % classes);
    std::vector<double> as_double(labels.begin(), labels.end());
    TestTensor label_tensor = tensor(c.label_type, label_shape, as_double);
    std::vector<double> losses = reference_cross_entropy(logits, labels, -100);
    double sum = 0;
    int counted = 0;
    std::vector<double> none;
    for (double l : losses) {
      none.push_back(std::isnan(l) ? 0.0 : l);
      if (!std::isnan(l)) sum += l, ++counted;
    }
    const std::string what = "SoftmaxCrossEntropy " + shape_to_string(c.logits);
    TestTensor mean = run_one("SoftmaxCrossEntropy", {logits, label_tensor});
    EXPECT_EQ(mean.type.shape, Shape{}) << what;
    expect_close(mean, {sum / counted}, 1e-5, 1e-5, what + " mean");
    expect_close(
        run_one("SoftmaxCrossEntropy", {logits, label_tensor}, {string_attr("reduction", "sum")}),
        {sum}, 1e-5, 1e-5, what + " sum");
    TestTensor each =
        run_one("SoftmaxCrossEntropy", {logits, label_tensor}, {string_attr("reduction", "none")});
    EXPECT_EQ(each.type.shape, label_shape) << what;
    expect_close(each, none, 1e-5, 1e-5, what + " none");
  }
}

TEST(SoftmaxCrossEntropy, IgnoreIndexAndErrors) {
  TestTensor logits = tensor(kF32, {2, 3}, {1, 2, 3, 4, 5, 6});
  // A custom ignore_index; every label ignored gives a mean of 0.
  TestTensor ignored = tensor(DType::kI64, {2}, {7, 7});
  expect_close(run_one("SoftmaxCrossEntropy", {logits, ignored}, {int_attr("ignore_index", 7)}),
               {0.0}, 0, 0, "all ignored");
  RunResult bad = run_op("SoftmaxCrossEntropy", {logits, tensor(DType::kI32, {2}, {0, 3})});
  expect_error(bad.status, {"label 3", "position 1", "3 classes"});
  bad = run_op("SoftmaxCrossEntropy", {logits, tensor(DType::kI64, {2}, {-1, 0})});
  expect_error(bad.status, {"label -1", "position 0"});

  const TensorType f32_logits{kF32, {4, 5}};
  expect_error(infer("SoftmaxCrossEntropy", {f32_logits, TensorType{kF32, {4}}}).status(),
               {"input 1 (labels)", "i32 or i64", "f32[4]"});
  expect_error(infer("SoftmaxCrossEntropy", {f32_logits, TensorType{DType::kI64, {4, 5}}}).status(),
               {"input 1 (labels)", "i64[4, 5]", "[4]", "f32[4, 5]"});
  expect_error(infer("SoftmaxCrossEntropy", {f32_logits, TensorType{DType::kI64, {4}}},
                     {string_attr("reduction", "avg")})
                   .status(),
               {"reduction", "avg"});
}

// The vocabulary-parallel cross entropy: each member's statistics of its
// piece of the logits, gathered, give every member SoftmaxCrossEntropy's loss
// of the whole logits, and the members' gradient pieces join into its gradient.
TEST(VocabParallelCrossEntropy, MembersPiecesGiveTheWholeLossAndGradient) {
  std::mt19937 rng(9090);
  TestTensor logits = random_tensor(kF32, {3, 4, 12}, rng, -8.0, 8.0);
  std::vector<double> labels;
  for (int i = 0; i < 12; ++i)
    labels.push_back(i % 5 == 2 ? -100 : static_cast<double>(rng() % 12));
  for (DType label_type : {DType::kI64, DType::kI32}) {
    TestTensor label_tensor = tensor(label_type, {3, 4}, labels);
    for (const char *reduction : {"mean", "sum", "none"}) {
      TestTensor whole = run_one("SoftmaxCrossEntropy", {logits, label_tensor},
                                 {string_attr("reduction", reduction)});
      TestTensor dloss = random_tensor(kF32, whole.type.shape, rng, 0.5, 1.5);
      TestTensor whole_grad = run_one("SoftmaxCrossEntropyGrad", {dloss, logits, label_tensor},
                                      {string_attr("reduction", reduction)});
      for (int64_t parts : {2, 3, 4}) {
        const std::string what = str_cat(reduction, ", ", parts, " parts");
        std::vector<TestTensor> pieces, stats;
        for (int r = 0; r < parts; ++r) {
          pieces.push_back(piece_of(logits, 2, parts, r));
          stats.push_back(run_one("VocabParallelStats", {pieces.back(), label_tensor},
                                  {int_attr("parts", parts)}, Member{static_cast<int>(parts), r}));
          EXPECT_EQ(stats.back().type.shape, (Shape{3, 4, 3})) << what;
        }
        // What TpAllGather along the last dim gives every member.
        TestTensor gathered = tensor(kF32, {3, 4, 3 * parts}, joined(stats, 2));
        std::vector<TestTensor> grads;
        for (int r = 0; r < parts; ++r) {
          const Member member{static_cast<int>(parts), r};
          const std::vector<Attribute> attrs = {int_attr("parts", parts),
                                                string_attr("reduction", reduction)};
          TestTensor loss = run_one("VocabParallelCrossEntropy",
                                    {pieces[r], label_tensor, gathered}, attrs, member);
          expect_close(loss, whole.values(), 1e-6, 1e-6, what + " loss");
          grads.push_back(run_one("VocabParallelCrossEntropyGrad",
                                  {dloss, pieces[r], label_tensor, gathered}, attrs, member));
        }
        expect_close(whole_grad, joined(grads, 2), 1e-7, 1e-5, what + " gradient");
      }
    }
  }
  // Labels are checked against every class; the group must be the split's.
  TestTensor piece = piece_of(logits, 2, 2, 0);
  RunResult bad = run_op("VocabParallelStats",
                         {piece, tensor(DType::kI64, {3, 4}, std::vector<double>(12, 12))},
                         {int_attr("parts", 2)}, Member{2, 0});
  expect_error(bad.status, {"VocabParallelStats", "label 12", "[0, 12)"});
  bad = run_op("VocabParallelStats", {piece, tensor(DType::kI64, {3, 4}, labels)},
               {int_attr("parts", 2)});
  expect_error(bad.status, {"split over 2", "group of 1"});
  expect_error(infer("VocabParallelCrossEntropy",
                     {piece.type, TensorType{DType::kI64, {3, 4}}, TensorType{kF32, {3, 4, 3}}},
                     {int_attr("parts", 2)})
                   .status(),
               {"stats", "f32[3, 4, 6]"});
}

TEST(MseLoss, MatchesReference) {
  std::mt19937 rng(900);
  TestTensor p = random_tensor(kF32, {3, 4, 5}, rng);
  TestTensor t = random_tensor(kF32, {3, 4, 5}, rng);
  std::vector<double> none;
  double sum = 0;
  for (int64_t i = 0; i < p.num_elements(); ++i) {
    double d = p.get(i) - t.get(i);
    none.push_back(d * d);
    sum += d * d;
  }
  expect_close(run_one("MseLoss", {p, t}), {sum / 60}, 1e-6, 1e-6, "mean");
  expect_close(run_one("MseLoss", {p, t}, {string_attr("reduction", "sum")}), {sum}, 1e-6, 1e-6,
               "sum");
  TestTensor each = run_one("MseLoss", {p, t}, {string_attr("reduction", "none")});
  EXPECT_EQ(each.type.shape, (Shape{3, 4, 5}));
  expect_close(each, none, 1e-6, 1e-6, "none");
  expect_error(infer("MseLoss", {TensorType{kF32, {3, 4}}, TensorType{kF32, {4, 3}}}).status(),
               {"MseLoss", "f32[3, 4]", "f32[4, 3]", "same shape"});
}

// ---------------------------------------------------------------------------
// Costs against hand counts.

double flops(std::string_view op, const std::vector<TensorType> &inputs,
             std::vector<Attribute> attrs = {}) {
  Node node = make_node(op, attrs);
  auto outputs = OpRegistry::global().infer_types(node, inputs);
  EXPECT_TRUE(outputs.is_ok()) << outputs.status().to_string();
  if (!outputs) return -1;
  return OpRegistry::global().cost(node, inputs, *outputs).flops;
}

TEST(NnCost, MatchesHandCounts) {
  // 2 * M * N * K.
  EXPECT_EQ(flops("MatMul", {TensorType{kF32, {2, 3}}, TensorType{kF32, {3, 4}}}), 48);
  EXPECT_EQ(flops("MatMul", {TensorType{kF32, {5, 2, 3}}, TensorType{kF32, {3, 4}}}), 240);
  EXPECT_EQ(flops("MatMul", {TensorType{kF32, {3}}, TensorType{kF32, {3}}}), 6);
  // Gemm: + M*N for beta*C, + M*N for alpha != 1.
  const std::vector<TensorType> gemm = {TensorType{kF32, {2, 3}}, TensorType{kF32, {3, 4}},
                                        TensorType{kF32, {4}}};
  EXPECT_EQ(flops("Gemm", gemm), 56);
  EXPECT_EQ(flops("Gemm", gemm, {float_attr("alpha", 2.0)}), 64);
  EXPECT_EQ(flops("Gemm", {gemm[0], gemm[1]}), 48);
  // Conv2d X [1, 2, 5, 5], W [4, 2, 3, 3]: 3x3 outputs; 2 * 4 * 9 * (2 * 9) = 1296, bias + 36.
  const TensorType x{kF32, {1, 2, 5, 5}}, w{kF32, {4, 2, 3, 3}};
  EXPECT_EQ(flops("Conv2d", {x, w}), 1296);
  EXPECT_EQ(flops("Conv2d", {x, w, TensorType{kF32, {4}}}), 1332);
  // Groups 2: each output sees one input channel.
  EXPECT_EQ(flops("Conv2d", {x, TensorType{kF32, {4, 1, 3, 3}}}, {int_attr("group", 2)}), 648);
  // Bytes: every input read once, the output written once.
  Node node = make_node("MatMul");
  std::vector<TensorType> in = {TensorType{kF32, {2, 3}}, TensorType{kF32, {3, 4}}};
  OpCost cost = OpRegistry::global().cost(node, in, {TensorType{kF32, {2, 4}}});
  EXPECT_EQ(cost.bytes_read, 4 * (6 + 12));
  EXPECT_EQ(cost.bytes_written, 4 * 8);
}

TEST(NnOps, AllRegisteredWithKernels) {
  for (std::string_view op :
       {"MatMul", "Gemm", "LayerNorm", "Conv2d", "MaxPool2d", "AveragePool2d", "GlobalAveragePool",
        "BatchNormalization", "SoftmaxCrossEntropy", "MseLoss"}) {
    const OpDef *def = OpRegistry::global().find(op);
    ASSERT_NE(def, nullptr) << op;
    EXPECT_NE(def->cpu_kernel, nullptr) << op;
    EXPECT_NE(def->infer, nullptr) << op;
  }
}

} // namespace
} // namespace strata::ops
