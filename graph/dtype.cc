#include "graph/dtype.h"

#include <bit>
#include <cmath>
#include <cstring>

namespace strata {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
  case DType::kF32: return 4;
  case DType::kF16: return 2;
  case DType::kBF16: return 2;
  case DType::kI32: return 4;
  case DType::kI64: return 8;
  case DType::kBool: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
  case DType::kF32: return "f32";
  case DType::kF16: return "f16";
  case DType::kBF16: return "bf16";
  case DType::kI32: return "i32";
  case DType::kI64: return "i64";
  case DType::kBool: return "bool";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (DType dtype : kAllDTypes)
    if (dtype_name(dtype) == name) return dtype;
  return std::nullopt;
}

bool is_floating(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

bool is_integer(DType dtype) { return dtype == DType::kI32 || dtype == DType::kI64; }

float f16_to_float(uint16_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  uint32_t out;
  if (exponent == 0) {
    if (mantissa == 0) {
      out = sign;
    } else { // subnormal: renormalize
      int shift = 0;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        ++shift;
      }
      mantissa &= 0x3ffu;
      out = sign | static_cast<uint32_t>(127 - 15 - shift + 1) << 23 | mantissa << 13;
    }
  } else if (exponent == 0x1f) {
    out = sign | 0x7f800000u | mantissa << 13;
  } else {
    out = sign | (exponent + 127 - 15) << 23 | mantissa << 13;
  }
  return std::bit_cast<float>(out);
}

uint16_t float_to_f16(float value) {
  uint32_t x = std::bit_cast<uint32_t>(value);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) // inf or nan
    return sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u);
  if (abs >= 0x477ff000u) // rounds to >= 65520: overflow to inf
    return sign | 0x7c00u;
  if (abs < 0x38800000u) { // below the smallest normal half: subnormal or zero
    float magnitude = std::bit_cast<float>(abs);
    // Scale so the half subnormal step (2^-24) becomes 1, then round to even.
    float scaled = magnitude * 16777216.0f;
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  uint32_t mantissa_odd = (abs >> 13) & 1u;
  abs += 0xfffu + mantissa_odd; // round to nearest even on the 13 dropped bits
  return sign | static_cast<uint16_t>((abs - (112u << 23)) >> 13);
}

float bf16_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

uint16_t float_to_bf16(float value) {
  uint32_t x = std::bit_cast<uint32_t>(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return static_cast<uint16_t>(x >> 16);
}

} // namespace strata
