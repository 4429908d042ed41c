#include "serialization/npy.h"

#include <cstring>

#include "serialization/file_io.h"

namespace strata::serialization {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;
// Larger files are refused before they are read.
constexpr uint64_t kMaxNpyBytes = uint64_t{1} << 40;
// Headers are a few dozen bytes; anything past this is not a real header.
constexpr uint32_t kMaxHeaderBytes = 1 << 20;

struct NpyDType {
  std::string_view descr;
  DType dtype;
};
constexpr NpyDType kNpyDTypes[] = {
    {"<f4", DType::kF32}, {"<f2", DType::kF16},  {"<i4", DType::kI32},
    {"<i8", DType::kI64}, {"|b1", DType::kBool},
};

// The header is a Python dict literal, e.g.
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// This reads exactly that subset: string keys; string, True/False and tuple of
// non-negative integer values.
class HeaderParser {
public:
  explicit HeaderParser(std::string_view text) : text_(text) {}

  Status parse(std::string &descr, bool &fortran_order, Shape &shape) {
    bool have_descr = false, have_order = false, have_shape = false;
    skip_space();
    if (!consume('{')) return error("expected '{' at the start of the header dict");
    while (true) {
      skip_space();
      if (consume('}')) break;
      std::string key;
      RETURN_IF_ERROR(parse_string(key));
      skip_space();
      if (!consume(':')) return error("expected ':' after key '" + key + "'");
      skip_space();
      if (key == "descr") {
        RETURN_IF_ERROR(parse_string(descr));
        have_descr = true;
      } else if (key == "fortran_order") {
        if (consume_word("True")) {
          fortran_order = true;
        } else if (consume_word("False")) {
          fortran_order = false;
        } else {
          return error("field fortran_order is not True or False");
        }
        have_order = true;
      } else if (key == "shape") {
        RETURN_IF_ERROR(parse_shape(shape));
        have_shape = true;
      } else {
        return error("unexpected key '" + key + "' in the header dict");
      }
      skip_space();
      if (consume(',')) continue;
      skip_space();
      if (consume('}')) break;
      return error("expected ',' or '}' in the header dict");
    }
    skip_space();
    if (pos_ != text_.size()) return error("unexpected text after the header dict");
    if (!have_descr) return error("the header has no field descr");
    if (!have_order) return error("the header has no field fortran_order");
    if (!have_shape) return error("the header has no field shape");
    return Status::ok();
  }

private:
  Status error(std::string_view what) const {
    return invalid_argument(what, " (header offset ", pos_, ")");
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\t' || text_[pos_] == '\r'))
      ++pos_;
  }
  bool consume(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool consume_word(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  Status parse_string(std::string &out) {
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"'))
      return error("expected a quoted string");
    char quote = text_[pos_++];
    size_t end = text_.find(quote, pos_);
    if (end == std::string_view::npos) return error("unterminated string");
    out.assign(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return Status::ok();
  }
  Status parse_shape(Shape &shape) {
    shape.clear();
    if (!consume('(')) return error("field shape is not a tuple");
    while (true) {
      skip_space();
      if (consume(')')) return Status::ok();
      if (pos_ >= text_.size() || text_[pos_] < '0' || text_[pos_] > '9')
        return error("field shape has an entry that is not a non-negative integer");
      int64_t value = 0;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        int digit = text_[pos_++] - '0';
        if (value > (kMaxTensorElements - digit) / 10)
          return error("field shape has a dimension that is too large");
        value = value * 10 + digit;
      }
      // Python 2 writers append L to longs.
      consume('L');
      if (shape.size() >= 64) return error("field shape has more than 64 dimensions");
      shape.push_back(value);
      skip_space();
      if (consume(',')) continue;
      skip_space();
      if (consume(')')) return Status::ok();
      return error("expected ',' or ')' in field shape");
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
};

uint32_t read_le(llvm::ArrayRef<uint8_t> bytes, size_t offset, size_t width) {
  uint32_t value = 0;
  for (size_t i = 0; i < width; ++i)
    value |= static_cast<uint32_t>(bytes[offset + i]) << (8 * i);
  return value;
}

std::optional<std::string_view> npy_descr(DType dtype) {
  for (const NpyDType &d : kNpyDTypes)
    if (d.dtype == dtype) return d.descr;
  return std::nullopt;
}

} // namespace

Result<HostTensor> parse_npy(llvm::ArrayRef<uint8_t> bytes, std::string_view display_name) {
  auto fail = [&](const Status &status) { return status.with_context(display_name); };
  if (bytes.size() < kMagicSize + 2 || std::memcmp(bytes.data(), kMagic, kMagicSize) != 0)
    return invalid_argument(display_name, ": not a .npy file (bad magic)");
  uint8_t major = bytes[6], minor = bytes[7];
  if (major < 1 || major > 3 || minor != 0)
    return unimplemented(display_name, ": .npy format version ", int{major}, ".", int{minor},
                         " is not supported (1.0 to 3.0 are)");
  size_t length_width = major == 1 ? 2 : 4;
  size_t header_start = 8 + length_width;
  if (bytes.size() < header_start)
    return data_loss(display_name, ": the file ends inside the header length (truncated)");
  uint32_t header_length = read_le(bytes, 8, length_width);
  if (header_length > kMaxHeaderBytes)
    return invalid_argument(display_name, ": header length ", header_length,
                            " is implausibly large");
  if (header_length > bytes.size() - header_start)
    return data_loss(display_name, ": header length ", header_length, " runs past the end of the ",
                     bytes.size(), "-byte file (truncated)");
  std::string_view header(reinterpret_cast<const char *>(bytes.data() + header_start),
                          header_length);

  std::string descr;
  bool fortran_order = false;
  Shape shape;
  if (auto status = HeaderParser(header).parse(descr, fortran_order, shape); !status.is_ok())
    return fail(status);
  std::optional<DType> dtype;
  for (const NpyDType &d : kNpyDTypes)
    if (d.descr == descr) dtype = d.dtype;
  if (!dtype) {
    if (!descr.empty() && descr[0] == '>')
      return unimplemented(display_name, ": field descr '", descr,
                           "' is big-endian; only little-endian arrays are supported");
    return unimplemented(display_name, ": field descr '", descr,
                         "' is not supported (use <f4, <f2, <i4, <i8 or |b1)");
  }
  if (fortran_order)
    return unimplemented(display_name,
                         ": field fortran_order is True; only C-order arrays are supported");
  auto count = checked_num_elements(shape);
  if (!count.is_ok()) return fail(count.status().with_context("field shape"));
  TensorType type{*dtype, shape};
  uint64_t needed = static_cast<uint64_t>(*count) * dtype_size(*dtype);
  uint64_t available = bytes.size() - header_start - header_length;
  if (available != needed)
    return data_loss(display_name, ": the data has ", available, " bytes but ", type.to_string(),
                     " needs ", needed, available < needed ? " (truncated)" : "");
  HostTensor tensor = HostTensor::zeros(type);
  if (needed) std::memcpy(tensor.data(), bytes.data() + header_start + header_length, needed);
  return tensor;
}

Result<HostTensor> read_npy(const std::string &path) {
  ASSIGN_OR_RETURN(auto bytes, read_file(path, kMaxNpyBytes));
  return parse_npy(bytes, path);
}

std::vector<uint8_t> npy_bytes(const HostTensor &tensor) {
  auto descr = npy_descr(tensor.type.dtype);
  assert(descr && "npy_bytes: the dtype has no NumPy equivalent");
  std::string header =
      str_cat("{'descr': '", descr.value_or("|V2"), "', 'fortran_order': False, 'shape': (");
  for (size_t i = 0; i < tensor.type.shape.size(); ++i)
    header += str_cat(i ? ", " : "", tensor.type.shape[i]);
  if (tensor.type.shape.size() == 1) header += ',';
  header += "), }";
  // Pad with spaces so the data starts 64-byte aligned; the header ends in '\n'.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::vector<uint8_t> out(10 + header.size() + tensor.size_bytes());
  std::memcpy(out.data(), kMagic, kMagicSize);
  out[6] = 1; // format version 1.0
  out[7] = 0;
  out[8] = static_cast<uint8_t>(header.size() & 0xff);
  out[9] = static_cast<uint8_t>(header.size() >> 8);
  std::memcpy(out.data() + 10, header.data(), header.size());
  if (tensor.size_bytes())
    std::memcpy(out.data() + 10 + header.size(), tensor.data(), tensor.size_bytes());
  return out;
}

Status write_npy(const std::string &path, const HostTensor &tensor) {
  if (!npy_descr(tensor.type.dtype))
    return unimplemented(path, ": ", dtype_name(tensor.type.dtype),
                         " has no NumPy dtype and cannot be written to .npy");
  if (tensor.type.shape.size() > 64)
    return invalid_argument(path, ": rank ", tensor.type.shape.size(),
                            " is more than a .npy 1.0 header holds here");
  if (static_cast<int64_t>(tensor.size_bytes()) != tensor.type.size_bytes())
    return invalid_argument(path, ": the tensor holds ", tensor.size_bytes(), " bytes but ",
                            tensor.type.to_string(), " needs ", tensor.type.size_bytes());
  return write_file_atomically(path, npy_bytes(tensor));
}

} // namespace strata::serialization
