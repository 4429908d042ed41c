// Static tensor shapes.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include <llvm/ADT/ArrayRef.h>
#include <llvm/ADT/SmallVector.h>

#include "graph/dtype.h"
#include "graph/status.h"

namespace strata {

// Dimensions outermost first. Every dimension is >= 0; a rank-0 shape is a scalar.
using Shape = llvm::SmallVector<int64_t, 6>;

// The largest element count or byte size strata accepts for one tensor (2^53),
// well past any real tensor and small enough that sums of sizes cannot overflow.
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 53;

// Number of elements; an error if a dimension is negative or the product overflows
// kMaxTensorElements.
Result<int64_t> checked_num_elements(llvm::ArrayRef<int64_t> shape);
// Number of elements of a shape already known to be valid.
int64_t num_elements(llvm::ArrayRef<int64_t> shape);

// "[2, 3, 4]".
std::string shape_to_string(llvm::ArrayRef<int64_t> shape);
// Parses "2x3x4" (a scalar is "scalar" or the empty string).
Result<Shape> parse_shape(std::string_view text);

// Row-major strides in elements.
Shape contiguous_strides(llvm::ArrayRef<int64_t> shape);

// NumPy broadcasting of two shapes; an error names both shapes.
Result<Shape> broadcast_shapes(llvm::ArrayRef<int64_t> a, llvm::ArrayRef<int64_t> b);

// A dtype and a shape: what a tensor is, without its data.
struct TensorType {
  DType dtype = DType::kF32;
  Shape shape;

  int64_t num_elements() const { return strata::num_elements(shape); }
  int64_t size_bytes() const { return num_elements() * static_cast<int64_t>(dtype_size(dtype)); }
  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  friend bool operator==(const TensorType &a, const TensorType &b) {
    return a.dtype == b.dtype && a.shape == b.shape;
  }
  // "f32[2, 3]".
  std::string to_string() const;
};

} // namespace strata
