#include "serialization/file_io.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace strata::serialization {

std::string errno_text(int error) { return std::strerror(error); }

Result<std::vector<uint8_t>> read_file(const std::string &path, uint64_t max_bytes) {
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    int error = errno;
    if (error == ENOENT) return not_found(path, ": ", errno_text(error));
    return io_error(path, ": cannot open: ", errno_text(error));
  }
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) return io_error(path, ": cannot stat: ", errno_text(errno));
  if (!S_ISREG(info.st_mode)) return invalid_argument(path, ": not a regular file");
  uint64_t size = static_cast<uint64_t>(info.st_size);
  if (size > max_bytes)
    return out_of_range(path, ": the file has ", size, " bytes, more than the limit of ",
                        max_bytes);
  std::vector<uint8_t> bytes(size);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::read(fd.get(), bytes.data() + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return io_error(path, ": read failed: ", errno_text(errno));
    }
    if (n == 0) return data_loss(path, ": the file shrank while being read");
    done += static_cast<size_t>(n);
  }
  return bytes;
}

namespace {

// A folder this process may create files in.
Status check_writable_dir(const std::filesystem::path &dir, const std::string &path,
                          std::string_view what) {
  std::error_code error;
  if (!std::filesystem::is_directory(dir, error))
    return io_error(what, " ", path, ": ", dir.string(), " is not a folder");
  // A file created and removed: the only test that also holds for root, read-only
  // file systems and the likes of /proc.
  std::string probe = (dir / ".strata-write-check.XXXXXX").string();
  int fd = ::mkostemp(probe.data(), O_CLOEXEC);
  if (fd < 0)
    return io_error(what, " ", path, ": cannot write in ", dir.string(), ": ", errno_text(errno));
  ::close(fd);
  ::unlink(probe.c_str());
  return Status::ok();
}

} // namespace

Status check_file_writable(const std::string &path, std::string_view what) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (path.empty()) return invalid_argument(what, ": the path is empty");
  if (fs::is_directory(path, error))
    return io_error(what, " ", path, ": is a folder; give a file name");
  fs::path folder = fs::path(path).parent_path();
  if (folder.empty()) folder = ".";
  if (!fs::exists(folder, error))
    return not_found(what, " ", path, ": folder ", folder.string(), " does not exist");
  return check_writable_dir(folder, path, what);
}

Status check_folder_writable(const std::string &path, std::string_view what) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (path.empty()) return invalid_argument(what, ": the path is empty");
  fs::path dir = fs::absolute(path, error);
  if (error) return io_error(what, " ", path, ": ", error.message());
  while (!fs::exists(dir, error) && dir.has_relative_path())
    dir = dir.parent_path();
  if (fs::exists(dir, error) && !fs::is_directory(dir, error))
    return io_error(what, " ", path, ": ", dir.string(), " is a file, not a folder");
  return check_writable_dir(dir, path, what);
}

Status check_not_input(const std::string &output, const std::string &input) {
  std::error_code error;
  if (std::filesystem::equivalent(output, input, error))
    return invalid_argument("the output ", output, " is the input ", input,
                            "; write to another file (the input would be lost)");
  return Status::ok();
}

namespace {

// write(2) until every byte is out; errno on failure.
bool write_all(int fd, llvm::ArrayRef<uint8_t> bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

} // namespace

Status write_file_atomically(const std::string &path, std::string_view text) {
  return write_file_atomically(
      path, llvm::ArrayRef<uint8_t>(reinterpret_cast<const uint8_t *>(text.data()), text.size()));
}

Status write_file_atomically(const std::string &path, llvm::ArrayRef<uint8_t> bytes) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (fs::exists(status) && !fs::is_regular_file(status) && !fs::is_directory(status)) {
    // A FIFO or a device: nothing to replace, the bytes go to it.
    FileDescriptor fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
    if (fd.get() < 0) return io_error(path, ": cannot open: ", errno_text(errno));
    if (!write_all(fd.get(), bytes)) return io_error(path, ": write failed: ", errno_text(errno));
    if (fd.close() != 0) return io_error(path, ": close failed: ", errno_text(errno));
    return Status::ok();
  }
  fs::path target(path);
  // A link is followed: the file it names is replaced, the link stays.
  // (Followed by hand: a link to a file not yet written is followed too.)
  for (int hops = 0; hops < 40 && fs::is_symlink(fs::symlink_status(target, error)); ++hops) {
    fs::path next = fs::read_symlink(target, error);
    if (error) break;
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  fs::path folder = target.parent_path();
  if (folder.empty()) folder = ".";
  std::string temp = (folder / ("." + target.filename().string() + ".tmp.XXXXXX")).string();
  int raw_fd = ::mkostemp(temp.data(), O_CLOEXEC);
  if (raw_fd < 0)
    return io_error(path, ": cannot create a temporary file in ", folder.string(), ": ",
                    errno_text(errno));
  FileDescriptor fd(raw_fd);
  auto fail = [&](std::string_view what, int error) {
    ::unlink(temp.c_str());
    return io_error(path, ": ", what, ": ", errno_text(error));
  };
  // mkstemp creates the file private to the owner; a model is an ordinary file.
  if (::fchmod(fd.get(), 0644) != 0) return fail("chmod failed", errno);
  if (!write_all(fd.get(), bytes)) return fail("write failed", errno);
  if (::fsync(fd.get()) != 0) return fail("fsync failed", errno);
  if (fd.close() != 0) return fail("close failed", errno);
  if (::rename(temp.c_str(), target.c_str()) != 0) return fail("rename failed", errno);
  // Make the rename itself durable.
  FileDescriptor dir(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() >= 0) ::fsync(dir.get());
  return Status::ok();
}

} // namespace strata::serialization
