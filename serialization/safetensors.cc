#include "serialization/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "serialization/file_io.h"

namespace strata::serialization {
namespace {

// The JSON header of real files is kilobytes; this bounds what is allocated
// from the untrusted length field.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

struct SafetensorsDType {
  std::string_view name;
  DType dtype;
};
constexpr SafetensorsDType kDTypes[] = {
    {"F32", DType::kF32}, {"F16", DType::kF16}, {"BF16", DType::kBF16},
    {"I32", DType::kI32}, {"I64", DType::kI64}, {"BOOL", DType::kBool},
};

std::string_view safetensors_dtype_name(DType dtype) {
  for (const auto &d : kDTypes)
    if (d.dtype == dtype) return d.name;
  return "?";
}

// One tensor's entry in the header, checked against the data section.
struct Entry {
  TensorType type;
  uint64_t begin = 0; // offsets into the data section
  uint64_t end = 0;
};

Status read_exactly(int fd, const std::string &path, void *out, uint64_t size, uint64_t offset) {
  auto *bytes = static_cast<uint8_t *>(out);
  uint64_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd, bytes + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return io_error(path, ": read failed: ", errno_text(errno));
    }
    if (n == 0) return data_loss(path, ": the file ends early (truncated)");
    done += static_cast<uint64_t>(n);
  }
  return Status::ok();
}

Result<Entry> parse_entry(const std::string &name, const nlohmann::json &value,
                          uint64_t data_size) {
  auto fail = [&](auto &&...args) {
    return invalid_argument("tensor '", name, "': ", std::forward<decltype(args)>(args)...);
  };
  if (!value.is_object()) return fail("the entry is not a JSON object");
  auto dtype_it = value.find("dtype");
  if (dtype_it == value.end() || !dtype_it->is_string()) return fail("field dtype is missing");
  const auto &dtype_name = dtype_it->get_ref<const std::string &>();
  Entry entry;
  bool known = false;
  for (const auto &d : kDTypes)
    if (d.name == dtype_name) {
      entry.type.dtype = d.dtype;
      known = true;
    }
  if (!known)
    return fail("field dtype '", dtype_name,
                "' is not supported (F32, F16, BF16, I32, I64 and BOOL are)");
  auto shape_it = value.find("shape");
  if (shape_it == value.end() || !shape_it->is_array()) return fail("field shape is missing");
  if (shape_it->size() > 64) return fail("field shape has more than 64 dimensions");
  for (const auto &dim : *shape_it) {
    if (!dim.is_number_integer()) return fail("field shape has a non-integer entry");
    if (dim.is_number_unsigned()) {
      uint64_t d = dim.get<uint64_t>();
      if (d > static_cast<uint64_t>(kMaxTensorElements))
        return fail("field shape has dimension ", d, ", too large");
      entry.type.shape.push_back(static_cast<int64_t>(d));
    } else {
      entry.type.shape.push_back(dim.get<int64_t>());
    }
  }
  auto count = checked_num_elements(entry.type.shape);
  if (!count.is_ok())
    return count.status().with_context(str_cat("tensor '", name, "': field shape"));
  auto offsets_it = value.find("data_offsets");
  if (offsets_it == value.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned())
    return fail("field data_offsets is not a pair of non-negative integers");
  entry.begin = (*offsets_it)[0].get<uint64_t>();
  entry.end = (*offsets_it)[1].get<uint64_t>();
  if (entry.begin > entry.end || entry.end > data_size)
    return fail("field data_offsets [", entry.begin, ", ", entry.end,
                "] is outside the data section of ", data_size, " bytes");
  uint64_t needed = static_cast<uint64_t>(*count) * dtype_size(entry.type.dtype);
  if (entry.end - entry.begin != needed)
    return fail("field data_offsets spans ", entry.end - entry.begin, " bytes but ",
                entry.type.to_string(), " needs ", needed);
  return entry;
}

// An open file with its parsed header.
struct OpenedFile {
  std::unique_ptr<FileDescriptor> file;
  nlohmann::json header;
  uint64_t data_start = 0;
  uint64_t data_size = 0;
};

Result<OpenedFile> open_safetensors(const std::string &path) {
  OpenedFile opened;
  opened.file = std::make_unique<FileDescriptor>(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  int fd = opened.file->get();
  if (fd < 0) {
    int error = errno;
    if (error == ENOENT) return not_found(path, ": ", errno_text(error));
    return io_error(path, ": cannot open: ", errno_text(error));
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0) return io_error(path, ": cannot stat: ", errno_text(errno));
  if (!S_ISREG(info.st_mode)) return invalid_argument(path, ": not a regular file");
  uint64_t file_size = static_cast<uint64_t>(info.st_size);
  if (file_size < 8)
    return data_loss(path, ": only ", file_size, " bytes; the 8-byte header length is missing");
  uint8_t length_bytes[8];
  RETURN_IF_ERROR(read_exactly(fd, path, length_bytes, 8, 0));
  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i)
    header_size |= static_cast<uint64_t>(length_bytes[i]) << (8 * i);
  if (header_size > kMaxHeaderBytes)
    return invalid_argument(path, ": header length ", header_size, " is more than the limit of ",
                            kMaxHeaderBytes, " bytes (corrupt?)");
  if (header_size > file_size - 8)
    return data_loss(path, ": header length ", header_size, " runs past the end of the ", file_size,
                     "-byte file (truncated)");
  std::string text(header_size, '\0');
  RETURN_IF_ERROR(read_exactly(fd, path, text.data(), header_size, 8));
  opened.header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (opened.header.is_discarded()) return invalid_argument(path, ": the header is not valid JSON");
  if (!opened.header.is_object())
    return invalid_argument(path, ": the header is not a JSON object");
  opened.data_start = 8 + header_size;
  opened.data_size = file_size - opened.data_start;
  return opened;
}

// Every tensor's entry, checked against the data section, which the entries
// must cover exactly, as the format requires: in offset order each tensor
// starts where the one before it ends, and the last ends at the end of the
// file. A byte no tensor owns means the file is not what its header says (a
// header length off by one, bytes appended or left between tensors).
Result<std::map<std::string, Entry>> parse_entries(const std::string &path,
                                                   const OpenedFile &opened) {
  std::map<std::string, Entry> entries;
  for (const auto &[name, value] : opened.header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) return invalid_argument(path, ": __metadata__ is not an object");
      continue;
    }
    auto entry = parse_entry(name, value, opened.data_size);
    if (!entry.is_ok()) return entry.status().with_context(path);
    entries.emplace(name, *entry);
  }
  std::vector<std::pair<const std::string *, const Entry *>> by_offset;
  for (const auto &[name, entry] : entries)
    by_offset.emplace_back(&name, &entry);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto &a, const auto &b) {
    return std::pair(a.second->begin, a.second->end) < std::pair(b.second->begin, b.second->end);
  });
  auto uncovered = [&](uint64_t begin, uint64_t end, std::string_view where) {
    return data_loss(path, ": data bytes [", begin, ", ", end, ") (file offsets [",
                     opened.data_start + begin, ", ", opened.data_start + end,
                     ")) belong to no tensor ", where,
                     "; the tensors' data_offsets must cover the data section exactly");
  };
  uint64_t covered = 0;
  const std::string *previous = nullptr;
  for (const auto &[name, entry] : by_offset) {
    if (entry->begin > covered)
      return uncovered(covered, entry->begin, str_cat("(before tensor '", *name, "')"));
    if (entry->begin < covered)
      return invalid_argument(path, ": tensor '", *name, "' at data_offsets [", entry->begin, ", ",
                              entry->end, "] overlaps tensor '", *previous, "', which ends at ",
                              covered);
    covered = entry->end;
    previous = name;
  }
  if (covered != opened.data_size)
    return uncovered(covered, opened.data_size,
                     "(after the last tensor: a wrong header length, or bytes appended?)");
  return entries;
}

} // namespace

Result<HostTensor> read_safetensors_tensor(const std::string &path, std::string_view key,
                                           const TensorType &expected) {
  ASSIGN_OR_RETURN(auto opened, open_safetensors(path));
  ASSIGN_OR_RETURN(auto entries, parse_entries(path, opened));
  auto it = entries.find(std::string(key));
  if (it == entries.end()) return not_found(path, ": no tensor '", key, "'");
  const Entry &entry = it->second;
  if (!(entry.type == expected))
    return invalid_argument(path, ": tensor '", key, "' is stored as ", entry.type.to_string(),
                            " but ", expected.to_string(), " is expected");
  HostTensor tensor = HostTensor::zeros(entry.type);
  RETURN_IF_ERROR(read_exactly(opened.file->get(), path, tensor.data(), entry.end - entry.begin,
                               opened.data_start + entry.begin));
  return tensor;
}

Result<std::map<std::string, HostTensor>> read_safetensors(const std::string &path) {
  ASSIGN_OR_RETURN(auto opened, open_safetensors(path));
  ASSIGN_OR_RETURN(auto entries, parse_entries(path, opened));
  std::map<std::string, HostTensor> tensors;
  for (const auto &[name, entry] : entries) {
    HostTensor tensor = HostTensor::zeros(entry.type);
    RETURN_IF_ERROR(read_exactly(opened.file->get(), path, tensor.data(), entry.end - entry.begin,
                                 opened.data_start + entry.begin));
    tensors.emplace(name, std::move(tensor));
  }
  return tensors;
}

Status write_safetensors(const std::string &path,
                         const std::map<std::string, HostTensor> &tensors) {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const auto &[name, tensor] : tensors) {
    if (name == "__metadata__") return invalid_argument(path, ": '__metadata__' is reserved");
    if (static_cast<int64_t>(tensor.size_bytes()) != tensor.type.size_bytes())
      return invalid_argument(path, ": tensor '", name, "' holds ", tensor.size_bytes(),
                              " bytes but ", tensor.type.to_string(), " needs ",
                              tensor.type.size_bytes());
    uint64_t size = tensor.size_bytes();
    header[name] = {
        {"dtype", safetensors_dtype_name(tensor.type.dtype)},
        {"shape", std::vector<int64_t>(tensor.type.shape.begin(), tensor.type.shape.end())},
        {"data_offsets", {offset, offset + size}}};
    offset += size;
  }
  std::string text = header.dump();
  // Spaces after the JSON are allowed; they make the data start 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<uint8_t> bytes;
  bytes.reserve(8 + text.size() + offset);
  for (int i = 0; i < 8; ++i)
    bytes.push_back(static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i)));
  bytes.insert(bytes.end(), text.begin(), text.end());
  for (const auto &[name, tensor] : tensors)
    if (tensor.size_bytes()) {
      const auto *data = reinterpret_cast<const uint8_t *>(tensor.data());
      bytes.insert(bytes.end(), data, data + tensor.size_bytes());
    }
  return write_file_atomically(path, bytes);
}

} // namespace strata::serialization
