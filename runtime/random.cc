#include "runtime/random.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <thread>
#include <vector>

namespace strata::runtime {

namespace {

constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The value of element `index` in double precision.
double initializer_value(const Initializer &init, uint64_t index) {
  switch (init.kind) {
  case Initializer::Kind::kNone:
  case Initializer::Kind::kZeros: return 0.0;
  case Initializer::Kind::kOnes: return 1.0;
  case Initializer::Kind::kConstant: return init.a;
  case Initializer::Kind::kNormal: return init.a + init.b * random_normal(init.seed, index);
  case Initializer::Kind::kUniform:
    return init.a + (init.b - init.a) * random_uniform(init.seed, index);
  }
  return 0.0;
}

float to_f32(const Initializer &init, uint64_t index) {
  auto value = static_cast<float>(initializer_value(init, index));
  if (init.kind == Initializer::Kind::kUniform && init.a < init.b) {
    auto upper = static_cast<float>(init.b);
    if (value >= upper) value = std::nextafter(upper, -std::numeric_limits<float>::infinity());
  }
  return value;
}

template <typename Store> void fill_range(int64_t begin, int64_t end, const Store &store) {
  for (int64_t i = begin; i < end; ++i)
    store(i - begin, static_cast<uint64_t>(i));
}

// Runs fill_range over [begin, end), split across threads when the range is
// large. Every element depends only on its index, so the split cannot change
// the result.
template <typename Store> void parallel_fill(int64_t begin, int64_t end, const Store &store) {
  constexpr int64_t kMinPerThread = int64_t{1} << 16;
  const int64_t count = end - begin;
  const int64_t hardware = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t workers = std::min<int64_t>({hardware, 16, count / kMinPerThread});
  if (workers <= 1) {
    fill_range(begin, end, store);
    return;
  }
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(workers));
  const int64_t chunk = (count + workers - 1) / workers;
  for (int64_t w = 0; w < workers; ++w) {
    int64_t lo = begin + w * chunk, hi = std::min(end, lo + chunk);
    if (lo >= hi) break;
    threads.emplace_back([lo, hi, begin, &store] {
      for (int64_t i = lo; i < hi; ++i)
        store(i - begin, static_cast<uint64_t>(i));
    });
  }
  for (std::thread &thread : threads)
    thread.join();
}

} // namespace

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter,
                                      std::array<uint32_t, 2> key) {
  auto [c0, c1, c2, c3] = counter;
  auto [k0, k1] = key;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kPhiloxW0;
      k1 += kPhiloxW1;
    }
    uint64_t p0 = uint64_t{kPhiloxM0} * c0;
    uint64_t p1 = uint64_t{kPhiloxM1} * c2;
    auto hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    auto hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  return {c0, c1, c2, c3};
}

namespace {

struct Words {
  uint32_t x0, x1;
};

Words philox(uint64_t seed, uint64_t index) {
  auto out = philox4x32_10({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0, 0},
                           {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  return {out[0], out[1]};
}

} // namespace

uint64_t random_bits(uint64_t seed, uint64_t index) {
  Words w = philox(seed, index);
  return uint64_t{w.x1} << 32 | w.x0;
}

double random_uniform(uint64_t seed, uint64_t index) {
  return static_cast<double>(random_bits(seed, index) >> 11) * 0x1.0p-53;
}

double random_normal(uint64_t seed, uint64_t index) {
  Words w = philox(seed, index);
  double u1 = (static_cast<double>(w.x0) + 1.0) * 0x1.0p-32;
  double u2 = static_cast<double>(w.x1) * 0x1.0p-32;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

uint64_t random_below(uint64_t seed, uint64_t index, uint64_t bound) {
  unsigned __int128 product = static_cast<unsigned __int128>(random_bits(seed, index)) * bound;
  return static_cast<uint64_t>(product >> 64);
}

uint64_t derive_seed(uint64_t seed, uint64_t stream) {
  return splitmix64(seed ^ splitmix64(stream));
}

Status fill_initializer(const Initializer &init, DType dtype, int64_t begin, int64_t end,
                        void *out) {
  if (begin < 0 || end < begin)
    return invalid_argument("bad element range [", begin, ", ", end, ")");
  const bool random =
      init.kind == Initializer::Kind::kNormal || init.kind == Initializer::Kind::kUniform;
  if (init.kind == Initializer::Kind::kNone) return invalid_argument("no initializer to fill from");
  if (random && !is_floating(dtype))
    return invalid_argument("initializer ", initializer_kind_name(init.kind),
                            " needs a floating dtype, not ", dtype_name(dtype));
  switch (dtype) {
  case DType::kF32: {
    auto *dst = static_cast<float *>(out);
    parallel_fill(begin, end, [&](int64_t k, uint64_t i) { dst[k] = to_f32(init, i); });
    return Status::ok();
  }
  case DType::kF16: {
    auto *dst = static_cast<uint16_t *>(out);
    parallel_fill(begin, end,
                  [&](int64_t k, uint64_t i) { dst[k] = float_to_f16(to_f32(init, i)); });
    return Status::ok();
  }
  case DType::kBF16: {
    auto *dst = static_cast<uint16_t *>(out);
    parallel_fill(begin, end,
                  [&](int64_t k, uint64_t i) { dst[k] = float_to_bf16(to_f32(init, i)); });
    return Status::ok();
  }
  case DType::kI32:
  case DType::kI64:
  case DType::kBool: {
    const double value = initializer_value(init, 0);
    if (!std::isfinite(value))
      return invalid_argument("initializer value ", value, " does not fit ", dtype_name(dtype));
    if (dtype == DType::kI32) {
      if (value <= -2147483649.0 || value >= 2147483648.0)
        return out_of_range("initializer value ", value, " does not fit i32");
      std::fill_n(static_cast<int32_t *>(out), end - begin, static_cast<int32_t>(value));
    } else if (dtype == DType::kI64) {
      if (value <= -9223372036854775808.0 || value >= 9223372036854775808.0)
        return out_of_range("initializer value ", value, " does not fit i64");
      std::fill_n(static_cast<int64_t *>(out), end - begin, static_cast<int64_t>(value));
    } else {
      std::fill_n(static_cast<uint8_t *>(out), end - begin, value != 0.0 ? 1 : 0);
    }
    return Status::ok();
  }
  }
  return internal_error("unknown dtype ", static_cast<int>(dtype));
}

} // namespace strata::runtime
