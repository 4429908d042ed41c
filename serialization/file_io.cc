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

Status write_file_atomically(const std::string &path, llvm::ArrayRef<uint8_t> bytes) {
  namespace fs = std::filesystem;
  fs::path target(path);
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
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("write failed", errno);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0) return fail("fsync failed", errno);
  if (fd.close() != 0) return fail("close failed", errno);
  if (::rename(temp.c_str(), path.c_str()) != 0) return fail("rename failed", errno);
  // Make the rename itself durable.
  FileDescriptor dir(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() >= 0) ::fsync(dir.get());
  return Status::ok();
}

} // namespace strata::serialization
