#include "runtime/random.h"

#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

namespace strata::runtime {
namespace {

// Random123's published known-answer vectors for Philox4x32-10.
TEST(Random, PhiloxKnownAnswers) {
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (std::array<uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(
      philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
      (std::array<uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(
      philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
      (std::array<uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Random, BitsUseCounterAndKeyAsDocumented) {
  const uint64_t seed = 0x0123456789abcdefull, index = 0xfedcba9876543210ull;
  auto words = philox4x32_10({0x76543210, 0xfedcba98, 0, 0}, {0x89abcdef, 0x01234567});
  EXPECT_EQ(random_bits(seed, index), uint64_t{words[1]} << 32 | words[0]);
}

TEST(Random, SameSeedAndIndexGiveSameValue) {
  for (uint64_t i : {0ull, 1ull, 12345ull, 1ull << 40}) {
    EXPECT_EQ(random_bits(7, i), random_bits(7, i));
    EXPECT_EQ(random_normal(7, i), random_normal(7, i));
  }
}

TEST(Random, DifferentSeedsAndIndicesDiffer) {
  int same_seed = 0, same_index = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    same_seed += random_bits(1, i) == random_bits(2, i);
    same_index += random_bits(1, i) == random_bits(1, i + 1);
  }
  EXPECT_EQ(same_seed, 0);
  EXPECT_EQ(same_index, 0);
  EXPECT_NE(derive_seed(5, 0), derive_seed(5, 1));
  EXPECT_NE(derive_seed(5, 0), derive_seed(6, 0));
}

// Pinned values: the algorithm is part of the model-file contract, so any
// change to it must fail here.
TEST(Random, PinnedValuesForSeed42) {
  EXPECT_EQ(random_bits(42, 0), 0x77f5493b9ceaf053ull);
  EXPECT_EQ(random_bits(42, 1), 0x53ba6cfdfcdb2127ull);
  const double expected[4] = {-0.9701897896896211, -0.07318150799478833, -0.336961854669775,
                              -0.379737253734474};
  for (int i = 0; i < 4; ++i)
    EXPECT_NEAR(random_normal(42, static_cast<uint64_t>(i)), expected[i], 1e-12) << i;

  Initializer normal{Initializer::Kind::kNormal, 0.0, 1.0, 42};
  float values[4];
  ASSERT_TRUE(fill_initializer(normal, DType::kF32, 0, 4, values).is_ok());
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(values[i], static_cast<float>(expected[i])) << i;
}

TEST(Random, NormalMomentsAreRoughlyStandard) {
  const int n = 100000;
  double sum = 0, sum_sq = 0;
  for (int i = 0; i < n; ++i) {
    double z = random_normal(123, static_cast<uint64_t>(i));
    ASSERT_TRUE(std::isfinite(z));
    sum += z;
    sum_sq += z * z;
  }
  const double mean = sum / n, stddev = std::sqrt(sum_sq / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(stddev, 1.0, 0.02);
}

TEST(Random, UniformAndBelowStayInRange) {
  double sum = 0;
  std::vector<int> counts(7, 0);
  for (uint64_t i = 0; i < 70000; ++i) {
    double u = random_uniform(9, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    uint64_t k = random_below(9, i, 7);
    ASSERT_LT(k, 7u);
    ++counts[k];
  }
  EXPECT_NEAR(sum / 70000, 0.5, 0.01);
  for (int count : counts)
    EXPECT_NEAR(count, 10000, 500);
  EXPECT_EQ(random_below(9, 0, 0), 0u);
}

// A shard filled on its own equals the same slice of the whole tensor, for every
// kind and floating dtype; the large case also crosses the threaded path.
TEST(Random, RangeFillEqualsSliceOfWholeFill) {
  const Initializer inits[] = {
      {Initializer::Kind::kNormal, 0.5, 2.0, 99},
      {Initializer::Kind::kUniform, -1.0, 3.0, 7},
      {Initializer::Kind::kConstant, 1.5, 0.0, 0},
  };
  for (const Initializer &init : inits)
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (int64_t n : {int64_t{1000}, int64_t{300000}}) {
        const size_t width = dtype_size(dtype);
        std::vector<uint8_t> whole(static_cast<size_t>(n) * width);
        ASSERT_TRUE(fill_initializer(init, dtype, 0, n, whole.data()).is_ok());
        const int64_t begin = n / 3 + 1, end = n - n / 5;
        std::vector<uint8_t> part(static_cast<size_t>(end - begin) * width);
        ASSERT_TRUE(fill_initializer(init, dtype, begin, end, part.data()).is_ok());
        EXPECT_EQ(std::memcmp(part.data(), whole.data() + begin * width, part.size()), 0)
            << initializer_kind_name(init.kind) << " " << dtype_name(dtype) << " n=" << n;
      }
    }
}

TEST(Random, InitializerKinds) {
  float f[1000];
  Initializer uniform{Initializer::Kind::kUniform, -0.25, 0.25, 3};
  ASSERT_TRUE(fill_initializer(uniform, DType::kF32, 0, 1000, f).is_ok());
  for (float v : f) {
    EXPECT_GE(v, -0.25f);
    EXPECT_LT(v, 0.25f);
  }
  Initializer normal{Initializer::Kind::kNormal, 10.0, 0.5, 3};
  ASSERT_TRUE(fill_initializer(normal, DType::kF32, 0, 1000, f).is_ok());
  for (int i = 0; i < 1000; ++i)
    EXPECT_EQ(f[i], static_cast<float>(10.0 + 0.5 * random_normal(3, static_cast<uint64_t>(i))));

  uint16_t h[4];
  ASSERT_TRUE(fill_initializer(normal, DType::kBF16, 0, 4, h).is_ok());
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(h[i], float_to_bf16(f[i]));
  ASSERT_TRUE(fill_initializer(normal, DType::kF16, 0, 4, h).is_ok());
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(h[i], float_to_f16(f[i]));

  int32_t i32[3];
  ASSERT_TRUE(
      fill_initializer({Initializer::Kind::kOnes, 0, 0, 0}, DType::kI32, 0, 3, i32).is_ok());
  EXPECT_EQ(i32[2], 1);
  int64_t i64[3];
  ASSERT_TRUE(
      fill_initializer({Initializer::Kind::kConstant, -7, 0, 0}, DType::kI64, 0, 3, i64).is_ok());
  EXPECT_EQ(i64[1], -7);
  uint8_t b[2] = {1, 1};
  ASSERT_TRUE(
      fill_initializer({Initializer::Kind::kZeros, 0, 0, 0}, DType::kBool, 0, 2, b).is_ok());
  EXPECT_EQ(b[1], 0);

  Status bad = fill_initializer(normal, DType::kI32, 0, 3, i32);
  EXPECT_FALSE(bad.is_ok());
  EXPECT_NE(bad.message().find("i32"), std::string::npos) << bad.message();
  EXPECT_FALSE(
      fill_initializer({Initializer::Kind::kConstant, 1e12, 0, 0}, DType::kI32, 0, 3, i32).is_ok());
}

} // namespace
} // namespace strata::runtime
