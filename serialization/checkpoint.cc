#include "serialization/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "serialization/file_io.h"
#include "serialization/model_io_internal.h"
#include "serialization/safetensors.h"
#include "serialization/sha256.h"

namespace strata::serialization {
namespace {

namespace fs = std::filesystem;
// A manifest lists every tensor (format 3): room for some 100,000.
constexpr uint64_t kMaxManifestBytes = 16 << 20;
constexpr uint64_t kMaxWeightsBytes = uint64_t{1} << 40;

std::string short_digest(std::string_view digest) {
  return std::string(digest.substr(0, 16)) + (digest.size() > 16 ? "..." : "");
}

bool is_digits(std::string_view text) {
  return !text.empty() &&
         std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// What a manifest may list: a plain .safetensors file in the folder, no
// paths, nothing hidden.
bool is_plain_data_name(std::string_view name) {
  return !name.empty() && name.find('/') == std::string_view::npos && name.front() != '.' &&
         name.ends_with(".safetensors");
}

// The data files the manifest at `manifest_path` lists, as far as it can be
// read: the files of the checkpoint a commit replaces.
std::vector<std::string> listed_files(const std::string &manifest_path) {
  std::vector<std::string> names;
  auto bytes = read_file(manifest_path, kMaxManifestBytes);
  if (!bytes.is_ok()) return names;
  nlohmann::json manifest = nlohmann::json::parse(bytes->begin(), bytes->end(), nullptr,
                                                  /*allow_exceptions=*/false);
  if (!manifest.is_object() || !manifest.contains("files") || !manifest["files"].is_array())
    return names;
  for (const nlohmann::json &entry : manifest["files"])
    if (entry.is_object() && entry.contains("name") && entry["name"].is_string() &&
        is_plain_data_name(entry["name"].get<std::string>()))
      names.push_back(entry["name"].get<std::string>());
  return names;
}

// Once a commit is durable: removes the files of the checkpoint it replaced
// (`previous`, what the old manifest listed) and data files under the names
// checkpoint_file_name gives that the new manifest does not list (a save cut
// short before its commit). Anything else in the folder is not strata's and
// stays. A file that cannot be removed stays too: the new checkpoint is whole.
void remove_replaced_files(const std::string &dir, const std::vector<std::string> &previous,
                           const std::vector<CheckpointFile> &kept) {
  std::set<std::string> doomed(previous.begin(), previous.end());
  std::error_code error;
  for (const auto &entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (is_checkpoint_data_name(name)) doomed.insert(name);
  }
  for (const CheckpointFile &file : kept)
    doomed.erase(file.name);
  for (const std::string &name : doomed) {
    const fs::path path = fs::path(dir) / name;
    if (!fs::is_directory(fs::symlink_status(path, error))) fs::remove(path, error);
  }
}

// What is wrong with the data files `names` (in the manifest's order) of a
// checkpoint of `step` written by `ranks` processes, judged by their names,
// or empty when nothing is: a name checkpoint_file_name gives must be of that
// step and rank count, no rank may have two files, and when any file has
// such a name, or there are several ranks, every rank must have one. Other
// names (a version 1 folder's model.safetensors) say nothing about either.
std::string mismatched_names(int64_t step, int ranks, const std::vector<std::string> &names) {
  std::map<int, size_t> file_of_rank;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::optional<CheckpointDataName> parts = parse_checkpoint_data_name(names[i]);
    if (!parts) continue;
    const std::string file = str_cat("files[", i, "] is ", names[i]);
    if (parts->step != step) return str_cat(file, ", a file of step ", parts->step);
    if (parts->ranks != ranks)
      return str_cat(file, ", a file of ", parts->ranks, parts->ranks == 1 ? " rank" : " ranks");
    if (parts->rank >= parts->ranks)
      return str_cat(file, ", of rank ", parts->rank, " of only ", parts->ranks);
    auto [earlier, fresh] = file_of_rank.emplace(parts->rank, i);
    if (!fresh)
      return str_cat("files[", earlier->second, "] and files[", i, "] are both rank ", parts->rank,
                     "'s file");
  }
  if (file_of_rank.empty() && ranks == 1) return "";
  for (int rank = 0; rank < ranks; ++rank)
    if (!file_of_rank.contains(rank))
      return str_cat("no file of rank ", rank, " (", checkpoint_file_name(step, rank, ranks),
                     ") is listed");
  return "";
}

// Why `file` is not in `dir` as its writer left it (present, a regular file
// of `file.size` bytes, readable to its end), or empty when it is.
std::string absent_file(const std::string &dir, const CheckpointFile &file) {
  const std::string path = (fs::path(dir) / file.name).string();
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    const int cause = errno;
    if (cause == ENOENT) return "is missing";
    return str_cat("cannot be opened: ", errno_text(cause));
  }
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) return str_cat("cannot be examined: ", errno_text(errno));
  if (!S_ISREG(info.st_mode)) return "is not a regular file";
  const auto size = static_cast<uint64_t>(info.st_size);
  if (size != file.size)
    return str_cat("has ", size, " bytes here, not the ", file.size, " written");
  if (size == 0) return "";
  char last = 0;
  ssize_t got = 0;
  do {
    got = ::pread(fd.get(), &last, 1, static_cast<off_t>(size - 1));
  } while (got < 0 && errno == EINTR);
  if (got != 1)
    return str_cat("cannot be read: ", got < 0 ? errno_text(errno) : std::string("it ends early"));
  return "";
}

// The layout record (format 3) as manifest fields: model, optimizer, layout
// and, per tensor, its role, whole type and cut.
void add_layout(nlohmann::ordered_json &manifest, const CheckpointLayout &layout) {
  manifest["model"] = layout.model;
  manifest["optimizer"] = layout.optimizer;
  manifest["layout"] = layout.description;
  nlohmann::ordered_json tensors = nlohmann::ordered_json::object();
  for (const auto &[name, tensor] : layout.tensors) {
    nlohmann::ordered_json entry;
    entry["role"] = tensor.parameter ? "parameter" : "state";
    entry["dtype"] = std::string(dtype_name(tensor.type.dtype));
    entry["shape"] = std::vector<int64_t>(tensor.type.shape.begin(), tensor.type.shape.end());
    if (tensor.cut)
      entry["cut"] = {
          {"dim", tensor.cut->dim}, {"outer", tensor.cut->outer}, {"parts", tensor.cut->parts}};
    tensors[name] = std::move(entry);
  }
  manifest["tensors"] = std::move(tensors);
}

// An integer field of `object` within [low, high], or an error naming `where`.
Result<int64_t> bounded_field(const nlohmann::json &object, const char *name, int64_t low,
                              int64_t high, const std::string &where) {
  auto it = object.find(name);
  if (it == object.end() || !it->is_number_integer() || it->get<int64_t>() < low ||
      it->get<int64_t>() > high)
    return invalid_argument(where, ".", name, " is missing or not an integer from ", low, " to ",
                            high);
  return it->get<int64_t>();
}

// One tensor's record; `where` names it in errors.
Result<CheckpointTensor> parse_layout_tensor(const nlohmann::json &entry,
                                             const std::string &where) {
  if (!entry.is_object()) return invalid_argument(where, " is not an object");
  CheckpointTensor tensor;
  auto role = entry.find("role");
  if (role == entry.end() || !role->is_string() || (*role != "parameter" && *role != "state"))
    return invalid_argument(where, ".role is missing or not \"parameter\" or \"state\"");
  tensor.parameter = *role == "parameter";
  auto dtype = entry.find("dtype");
  std::optional<DType> parsed;
  if (dtype != entry.end() && dtype->is_string()) parsed = parse_dtype(dtype->get<std::string>());
  if (!parsed) return invalid_argument(where, ".dtype is missing or not a dtype name");
  tensor.type.dtype = *parsed;
  auto shape = entry.find("shape");
  constexpr size_t kMaxRank = 16;
  if (shape == entry.end() || !shape->is_array() || shape->size() > kMaxRank)
    return invalid_argument(where, ".shape is missing, not a list or of more than ", kMaxRank,
                            " dims");
  uint64_t bytes = dtype_size(tensor.type.dtype);
  for (const nlohmann::json &dim : *shape) {
    if (!dim.is_number_integer() || dim.get<int64_t>() < 0)
      return invalid_argument(where, ".shape holds something other than a size");
    const auto n = static_cast<uint64_t>(dim.get<int64_t>());
    if (n != 0 && bytes > kMaxWeightsBytes / n)
      return out_of_range(where, ".shape is larger than a checkpoint can hold");
    bytes *= n;
    tensor.type.shape.push_back(dim.get<int64_t>());
  }
  auto cut = entry.find("cut");
  if (cut == entry.end()) return tensor;
  const std::string at = where + ".cut";
  if (!cut->is_object()) return invalid_argument(at, " is not an object");
  TensorCut c;
  const int64_t rank = tensor.type.rank();
  ASSIGN_OR_RETURN(int64_t dim, bounded_field(*cut, "dim", 0, std::max<int64_t>(rank - 1, 0), at));
  ASSIGN_OR_RETURN(c.outer,
                   bounded_field(*cut, "outer", 1, std::numeric_limits<int32_t>::max(), at));
  ASSIGN_OR_RETURN(int64_t parts, bounded_field(*cut, "parts", 1, 4096, at));
  c.dim = static_cast<int32_t>(dim);
  c.parts = static_cast<int32_t>(parts);
  if (rank == 0 || tensor.type.shape[static_cast<size_t>(dim)] % (c.outer * c.parts) != 0)
    return invalid_argument(at, ": ", tensor.type.to_string(), " does not cut into ", c.parts,
                            " pieces along dim ", dim, " (outer ", c.outer, ")");
  tensor.cut = c;
  return tensor;
}

// The layout record of a manifest; empty when it has none (format 2, or a
// writer that gave none). `path` names the manifest in errors.
Result<CheckpointLayout> parse_layout(const nlohmann::json &manifest, const std::string &path) {
  CheckpointLayout layout;
  auto tensors = manifest.find("tensors");
  if (tensors == manifest.end()) return layout;
  for (const char *name : {"model", "optimizer", "layout"}) {
    auto it = manifest.find(name);
    if (it == manifest.end() || !it->is_string())
      return invalid_argument(path, ": field ", name,
                              " is missing or not a string (it goes with field tensors)");
  }
  layout.model = manifest["model"].get<std::string>();
  layout.optimizer = manifest["optimizer"].get<std::string>();
  layout.description = manifest["layout"].get<std::string>();
  if (!tensors->is_object() || tensors->empty())
    return invalid_argument(path, ": field tensors is not an object of tensor records");
  for (const auto &[name, entry] : tensors->items()) {
    if (name.empty() || name.find('@') != std::string::npos)
      return invalid_argument(path, ": field tensors has a record named '", name,
                              "'; a tensor name is not empty and holds no '@'");
    ASSIGN_OR_RETURN(CheckpointTensor tensor,
                     parse_layout_tensor(entry, str_cat(path, ": field tensors['", name, "']")));
    layout.tensors.emplace(name, std::move(tensor));
  }
  return layout;
}

// Refuses a commit of `files` that would leave a manifest read_checkpoint
// refuses: names it may not list or that do not fit `step` and `ranks`, and
// files not in `dir` as their writers left them. The error names every such
// file and, for a save of several ranks, the rank that wrote it.
Status check_commit(const std::string &dir, int64_t step, int ranks,
                    const std::vector<CheckpointFile> &files) {
  std::vector<std::string> names;
  for (const CheckpointFile &file : files) {
    if (!is_plain_data_name(file.name))
      return invalid_argument(dir, ": cannot commit '", file.name,
                              "': a manifest lists .safetensors files in the checkpoint folder");
    names.push_back(file.name);
  }
  if (const std::string mismatch = mismatched_names(step, ranks, names); !mismatch.empty())
    return invalid_argument(dir, ": cannot commit a checkpoint of step ", step, " by ", ranks,
                            ranks == 1 ? " rank: " : " ranks: ", mismatch);
  std::string problems;
  for (const CheckpointFile &file : files) {
    const std::string problem = absent_file(dir, file);
    if (problem.empty()) continue;
    const std::optional<CheckpointDataName> parts = parse_checkpoint_data_name(file.name);
    const std::string writer =
        parts && parts->ranks > 1 ? str_cat("rank ", parts->rank, "'s ") : std::string();
    problems += str_cat(problems.empty() ? "" : "; ", writer, file.name, " ", problem);
  }
  if (problems.empty()) return Status::ok();
  return failed_precondition(
      dir, ": the manifest would list files this folder lacks as written: ", problems,
      ranks > 1 ? " (no shared filesystem? every rank saves its file into this folder, and "
                  "rank 0, which commits, must find them all here)"
                : "");
}

// A temporary file that strata's own writes leave in a checkpoint folder
// when the process dies between creating it and renaming or removing it:
// ".<name>.tmp.XXXXXX" (write_file_atomically) for the manifest or a data
// file, or ".strata-write-check.XXXXXX" (a check_folder_writable probe),
// where X is one of mkstemp's letters and digits.
bool is_checkpoint_temporary(std::string_view name) {
  constexpr size_t kRandom = 6;
  constexpr std::string_view kTemporary = ".tmp.";
  if (name.size() <= kRandom + 1 || name.front() != '.') return false;
  const std::string_view random = name.substr(name.size() - kRandom);
  const bool alphanumeric = std::all_of(random.begin(), random.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  });
  if (!alphanumeric) return false;
  std::string_view base = name.substr(1, name.size() - 1 - kRandom);
  if (base == "strata-write-check.") return true;
  if (!base.ends_with(kTemporary)) return false;
  base.remove_suffix(kTemporary.size());
  return base == kCheckpointManifestFile || is_checkpoint_data_name(base);
}

// Removes the temporaries that saves killed mid-write left in `dir`. Only
// for the holder of the folder's lock: then no save is writing one.
void remove_stale_temporaries(const std::string &dir) {
  std::error_code error;
  std::vector<fs::path> stale;
  for (const auto &entry : fs::directory_iterator(dir, error))
    if (is_checkpoint_temporary(entry.path().filename().string()) &&
        !fs::is_directory(entry.symlink_status(error)))
      stale.push_back(entry.path());
  for (const fs::path &path : stale)
    fs::remove(path, error);
}

// The holder of the lock on `fd` as it recorded itself ("pid 12 on host"),
// or empty where it has not yet or the file holds something else.
std::string lock_holder(int fd) {
  char buf[320] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return "";
  std::string_view text(buf, static_cast<size_t>(n));
  text = text.substr(0, text.find('\n'));
  const size_t space = text.find(' ');
  const std::string_view pid = text.substr(0, space);
  const std::string_view host =
      space == std::string_view::npos ? std::string_view() : text.substr(space + 1);
  const bool printable =
      std::all_of(host.begin(), host.end(), [](char c) { return c > ' ' && c < 127; });
  if (!is_digits(pid) || !printable) return "";
  return host.empty() ? str_cat("pid ", pid) : str_cat("pid ", pid, " on ", host);
}

// What the holder of a lock records: "<pid> <host>\n".
std::string lock_record() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  return str_cat(::getpid(), " ", host, "\n");
}

} // namespace

Result<CheckpointLock> CheckpointLock::acquire(const std::string &dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) return io_error(dir, ": cannot create the checkpoint folder: ", error.message());
  const std::string path = (fs::path(dir) / kCheckpointLockFile).string();
  const int raw_fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (raw_fd < 0)
    return io_error(
        path, ": cannot create or open the checkpoint folder's lock file: ", errno_text(errno));
  auto fd = std::make_unique<FileDescriptor>(raw_fd);
  struct stat info {};
  if (::fstat(fd->get(), &info) != 0 || !S_ISREG(info.st_mode))
    return io_error(path, ": not a regular file (strata locks the checkpoint folder with it)");
  int locked = 0;
  do {
    locked = ::flock(fd->get(), LOCK_EX | LOCK_NB);
  } while (locked != 0 && errno == EINTR);
  if (locked != 0) {
    const int cause = errno;
    if (cause != EWOULDBLOCK) return io_error(path, ": cannot lock: ", errno_text(cause));
    const std::string holder = lock_holder(fd->get());
    return failed_precondition(dir, ": the checkpoint folder is in use by another strata run (",
                               holder.empty() ? std::string("its pid not yet recorded") : holder,
                               "; it holds ", path,
                               "); wait for that run to end, or save to another folder");
  }
  const std::string record = lock_record();
  if (::ftruncate(fd->get(), 0) != 0) return io_error(path, ": cannot write: ", errno_text(errno));
  const ssize_t written = ::pwrite(fd->get(), record.data(), record.size(), 0);
  if (written != static_cast<ssize_t>(record.size()))
    return io_error(
        path, ": cannot write: ", written < 0 ? errno_text(errno) : std::string("short write"));
  remove_stale_temporaries(dir);
  return CheckpointLock(std::move(fd));
}

bool is_checkpoint_data_name(std::string_view name) {
  constexpr std::string_view prefix = "model-step", suffix = ".safetensors";
  if (name.size() <= prefix.size() + suffix.size() || !name.starts_with(prefix) ||
      !name.ends_with(suffix))
    return false;
  // "<K>" or "<K>-rank<R>-of<N>".
  std::string_view middle = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  const size_t rank_at = middle.find("-rank");
  if (rank_at == std::string_view::npos) return is_digits(middle);
  const size_t of_at = middle.find("-of", rank_at);
  if (of_at == std::string_view::npos) return false;
  return is_digits(middle.substr(0, rank_at)) &&
         is_digits(middle.substr(rank_at + 5, of_at - rank_at - 5)) &&
         is_digits(middle.substr(of_at + 3));
}

std::optional<CheckpointDataName> parse_checkpoint_data_name(std::string_view name) {
  if (!is_checkpoint_data_name(name)) return std::nullopt;
  constexpr std::string_view prefix = "model-step", suffix = ".safetensors";
  const std::string_view middle =
      name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  auto number = [](std::string_view text, auto &out) {
    const char *end = text.data() + text.size();
    auto [stop, error] = std::from_chars(text.data(), end, out);
    return error == std::errc() && stop == end;
  };
  CheckpointDataName parts;
  const size_t rank_at = middle.find("-rank");
  if (rank_at == std::string_view::npos) {
    if (!number(middle, parts.step)) return std::nullopt;
    return parts;
  }
  const size_t of_at = middle.find("-of", rank_at);
  if (!number(middle.substr(0, rank_at), parts.step) ||
      !number(middle.substr(rank_at + 5, of_at - rank_at - 5), parts.rank) ||
      !number(middle.substr(of_at + 3), parts.ranks))
    return std::nullopt;
  return parts;
}

std::string checkpoint_file_name(int64_t step, int rank, int ranks) {
  if (ranks <= 1) return str_cat("model-step", step, ".safetensors");
  return str_cat("model-step", step, "-rank", rank, "-of", ranks, ".safetensors");
}

Result<CheckpointFile> write_checkpoint_file(const std::string &dir, const std::string &name,
                                             const std::map<std::string, HostTensor> &tensors) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) return io_error("cannot create checkpoint folder '", dir, "': ", error.message());
  std::string path = (fs::path(dir) / name).string();
  RETURN_IF_ERROR(write_safetensors(path, tensors));
  // Checksum what is on disk, not what was meant to be written.
  ASSIGN_OR_RETURN(auto bytes, read_file(path, kMaxWeightsBytes));
  return CheckpointFile{name, bytes.size(), sha256_hex(bytes)};
}

Status commit_checkpoint(const std::string &dir, std::string_view fingerprint, int64_t step,
                         int ranks, const std::vector<CheckpointFile> &files,
                         const CheckpointLayout &layout) {
  RETURN_IF_ERROR(check_commit(dir, step, ranks, files));
  nlohmann::ordered_json manifest;
  manifest["format"] = "strata-checkpoint";
  manifest["format_version"] = kCheckpointFormatVersion;
  manifest["fingerprint"] = std::string(fingerprint);
  manifest["step"] = step;
  manifest["ranks"] = ranks;
  manifest["files"] = nlohmann::ordered_json::array();
  for (const CheckpointFile &file : files)
    manifest["files"].push_back(
        {{"name", file.name}, {"size", file.size}, {"sha256", file.sha256}});
  if (!layout.empty()) add_layout(manifest, layout);
  manifest["producer"] = producer_string();
  std::string text = manifest.dump(2) + "\n";
  const std::string manifest_path = (fs::path(dir) / kCheckpointManifestFile).string();
  const std::vector<std::string> previous = listed_files(manifest_path);
  RETURN_IF_ERROR(write_file_atomically(
      manifest_path,
      llvm::ArrayRef<uint8_t>(reinterpret_cast<const uint8_t *>(text.data()), text.size())));
  // The commit is durable: the previous checkpoint's files can go.
  remove_replaced_files(dir, previous, files);
  return Status::ok();
}

Status write_checkpoint(const std::string &dir, const std::map<std::string, HostTensor> &tensors,
                        std::string_view fingerprint, int64_t step,
                        const CheckpointLayout &layout) {
  ASSIGN_OR_RETURN(CheckpointFile file,
                   write_checkpoint_file(dir, checkpoint_file_name(step, 0, 1), tensors));
  return commit_checkpoint(dir, fingerprint, step, 1, {file}, layout);
}

namespace {

// The manifest of the checkpoint in `dir`, read and parsed, with the fields
// that say whose checkpoint it is checked: format_version, fingerprint, step.
struct Manifest {
  std::string path;
  nlohmann::json json;
  std::string fingerprint;
  int64_t step = 0;
};

Result<Manifest> read_manifest(const std::string &dir) {
  Manifest manifest;
  manifest.path = (fs::path(dir) / kCheckpointManifestFile).string();
  const std::string &path = manifest.path;
  std::error_code error;
  if (!fs::exists(path, error))
    return not_found(path, ": no such file; '", dir,
                     "' is not a checkpoint folder (or its first save did not finish)");
  ASSIGN_OR_RETURN(auto bytes, read_file(path, kMaxManifestBytes));
  manifest.json =
      nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
  const nlohmann::json &parsed = manifest.json;
  if (parsed.is_discarded() || !parsed.is_object())
    return data_loss(path, ": not a JSON object (corrupt?)");
  auto field = [&](const char *name) -> const nlohmann::json * {
    auto it = parsed.find(name);
    return it == parsed.end() ? nullptr : &*it;
  };
  const nlohmann::json *version = field("format_version");
  if (version == nullptr || !version->is_number_integer())
    return invalid_argument(path, ": field format_version is missing or not an integer");
  if (version->get<int64_t>() > kCheckpointFormatVersion || version->get<int64_t>() < 1)
    return failed_precondition(path, ": field format_version is ", version->get<int64_t>(),
                               " but this build reads versions 1 to ", kCheckpointFormatVersion);
  const nlohmann::json *fingerprint = field("fingerprint");
  if (fingerprint == nullptr || !fingerprint->is_string())
    return invalid_argument(path, ": field fingerprint is missing or not a string");
  const nlohmann::json *step = field("step");
  if (step == nullptr || !step->is_number_integer() || step->get<int64_t>() < 0)
    return invalid_argument(path, ": field step is missing or not a count");
  manifest.fingerprint = fingerprint->get<std::string>();
  manifest.step = step->get<int64_t>();
  return manifest;
}

} // namespace

Result<std::string> read_checkpoint_fingerprint(const std::string &dir) {
  ASSIGN_OR_RETURN(Manifest manifest, read_manifest(dir));
  return std::move(manifest.fingerprint);
}

Result<Checkpoint> read_checkpoint(const std::string &dir, std::string_view expected_fingerprint) {
  ASSIGN_OR_RETURN(const Manifest head, read_manifest(dir));
  const std::string &manifest_path = head.path;
  const nlohmann::json &manifest = head.json;
  std::error_code error;
  auto field = [&](const char *name) -> const nlohmann::json * {
    auto it = manifest.find(name);
    return it == manifest.end() ? nullptr : &*it;
  };
  Checkpoint checkpoint;
  checkpoint.step = head.step;
  checkpoint.fingerprint = head.fingerprint;
  if (!expected_fingerprint.empty() && checkpoint.fingerprint != expected_fingerprint)
    return failed_precondition(
        manifest_path, ": the checkpoint was written by a plan with fingerprint ",
        short_digest(checkpoint.fingerprint), " but this plan's fingerprint is ",
        short_digest(expected_fingerprint),
        "; resume with the plan that wrote it (same model and options)");

  const nlohmann::json *ranks = field("ranks");
  if (ranks != nullptr && (!ranks->is_number_integer() || ranks->get<int64_t>() < 1 ||
                           ranks->get<int64_t>() > std::numeric_limits<int>::max()))
    return invalid_argument(manifest_path, ": field ranks is not a positive count");
  checkpoint.ranks = ranks ? static_cast<int>(ranks->get<int64_t>()) : 1;
  ASSIGN_OR_RETURN(checkpoint.layout, parse_layout(manifest, manifest_path));
  const nlohmann::json *files = field("files");
  if (files == nullptr || !files->is_array() || files->empty())
    return invalid_argument(manifest_path, ": field files is missing, empty or not a list");
  std::vector<std::string> names;
  for (size_t i = 0; i < files->size(); ++i) {
    const nlohmann::json &entry = (*files)[i];
    std::string where = str_cat(manifest_path, ": field files[", i, "]");
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
        !entry.contains("size") || !entry["size"].is_number_unsigned() ||
        !entry.contains("sha256") || !entry["sha256"].is_string())
      return invalid_argument(where, " needs name (string), size (count) and sha256 (string)");
    std::string name = entry["name"].get<std::string>();
    if (!is_plain_data_name(name))
      return invalid_argument(where, ".name is '", name,
                              "'; expected a .safetensors file name in the checkpoint folder");
    names.push_back(std::move(name));
  }
  // Before any file is read: the names must fit the step and the ranks.
  if (const std::string mismatch = mismatched_names(checkpoint.step, checkpoint.ranks, names);
      !mismatch.empty())
    return invalid_argument(manifest_path, ": field files does not fit fields step (",
                            checkpoint.step, ") and ranks (", checkpoint.ranks, "): ", mismatch);
  for (size_t i = 0; i < files->size(); ++i) {
    const nlohmann::json &entry = (*files)[i];
    const std::string &name = names[i];
    std::string path = (fs::path(dir) / name).string();
    if (!fs::exists(path, error))
      return not_found(path, ": missing (listed in ", manifest_path, ")");
    ASSIGN_OR_RETURN(auto bytes, read_file(path, kMaxWeightsBytes));
    uint64_t size = entry["size"].get<uint64_t>();
    if (bytes.size() != size)
      return data_loss(path, ": ", bytes.size(), " bytes but the manifest says ", size,
                       " (truncated or overwritten?)");
    std::string digest = sha256_hex(bytes);
    if (digest != entry["sha256"].get<std::string>())
      return data_loss(path, ": SHA-256 ", short_digest(digest), " does not match the manifest's ",
                       short_digest(entry["sha256"].get<std::string>()), " (corrupt?)");
    auto tensors = read_safetensors(path);
    if (!tensors.is_ok()) {
      if (tensors.status().message().find(path) == std::string::npos)
        return tensors.status().with_context(path);
      return tensors.status();
    }
    for (auto &[tensor_name, value] : *tensors) {
      auto [it, fresh] = checkpoint.file_of.emplace(tensor_name, name);
      if (!fresh)
        return data_loss(path, ": tensor '", tensor_name, "' is also in ", it->second,
                         "; a checkpoint holds each tensor once");
      checkpoint.tensors.emplace(tensor_name, std::move(value));
    }
  }
  return checkpoint;
}

} // namespace strata::serialization
