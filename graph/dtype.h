// Element types of tensors, and conversions for the 16-bit float formats.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace strata {

// The numbering is stored in model and plan files: values are only appended.
enum class DType : uint8_t {
  kF32 = 0,
  kF16 = 1,
  kBF16 = 2,
  kI32 = 3,
  kI64 = 4,
  kBool = 5,
};

inline constexpr DType kAllDTypes[] = {DType::kF32, DType::kF16, DType::kBF16,
                                       DType::kI32, DType::kI64, DType::kBool};

// Bytes per element.
std::size_t dtype_size(DType dtype);
// "f32", "f16", "bf16", "i32", "i64", "bool".
std::string_view dtype_name(DType dtype);
std::optional<DType> parse_dtype(std::string_view name);
bool is_floating(DType dtype);
bool is_integer(DType dtype);

// IEEE 754 binary16 and bfloat16 from and to float, rounding to nearest even.
float f16_to_float(uint16_t bits);
uint16_t float_to_f16(float value);
float bf16_to_float(uint16_t bits);
uint16_t float_to_bf16(float value);

} // namespace strata
