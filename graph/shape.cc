#include "graph/shape.h"

#include <charconv>

namespace strata {

Result<int64_t> checked_num_elements(llvm::ArrayRef<int64_t> shape) {
  int64_t count = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t dim = shape[i];
    if (dim < 0)
      return invalid_argument("dimension ", i, " of shape ", shape_to_string(shape),
                              " is negative");
    if (dim != 0 && count > kMaxTensorElements / dim)
      return out_of_range("shape ", shape_to_string(shape), " has more than 2^53 elements");
    count *= dim;
  }
  return count;
}

int64_t num_elements(llvm::ArrayRef<int64_t> shape) {
  int64_t count = 1;
  for (int64_t dim : shape)
    count *= dim;
  return count;
}

std::string shape_to_string(llvm::ArrayRef<int64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

Result<Shape> parse_shape(std::string_view text) {
  Shape shape;
  if (text.empty() || text == "scalar") return shape;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('x', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view piece = text.substr(start, end - start);
    int64_t dim = 0;
    auto [ptr, ec] = std::from_chars(piece.data(), piece.data() + piece.size(), dim);
    if (piece.empty() || ec != std::errc() || ptr != piece.data() + piece.size() || dim < 0)
      return invalid_argument("bad shape '", text, "': expected dimensions like 2x3x4");
    shape.push_back(dim);
    start = end + 1;
  }
  RETURN_IF_ERROR(checked_num_elements(shape).status());
  return shape;
}

Shape contiguous_strides(llvm::ArrayRef<int64_t> shape) {
  Shape strides(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i)
    strides[i] = strides[i + 1] * shape[i + 1];
  return strides;
}

Result<Shape> broadcast_shapes(llvm::ArrayRef<int64_t> a, llvm::ArrayRef<int64_t> b) {
  size_t rank = std::max(a.size(), b.size());
  Shape out(rank, 1);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1)
      return invalid_argument("shapes ", shape_to_string(a), " and ", shape_to_string(b),
                              " do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::string TensorType::to_string() const {
  return str_cat(dtype_name(dtype), shape_to_string(shape));
}

} // namespace strata
