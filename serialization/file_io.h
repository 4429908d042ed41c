// Whole-file reads and crash-safe writes for the serialization layer.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <llvm/ADT/ArrayRef.h>

#include "graph/status.h"

namespace strata::serialization {

// Owns a file descriptor and closes it when it goes out of scope.
class FileDescriptor {
public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor &) = delete;
  FileDescriptor &operator=(const FileDescriptor &) = delete;
  int get() const { return fd_; }
  // Closes now, reporting the error close() gives (delayed write errors show up here).
  int close() {
    int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

private:
  int fd_;
};

// Reads the whole file; an error if it is larger than `max_bytes`. Errors name
// the path and the operating system's reason.
Result<std::vector<uint8_t>> read_file(const std::string &path, uint64_t max_bytes);

// Writes `bytes` to a temporary file in the same folder, fsyncs it, renames it
// over `path` and fsyncs the folder. On failure the temporary file is removed
// and `path` is untouched. Where `path` is a symbolic link, the file it names
// is replaced and the link stays; where it is a FIFO or a device (/dev/null,
// a terminal), there is nothing to replace and the bytes are written to it.
Status write_file_atomically(const std::string &path, llvm::ArrayRef<uint8_t> bytes);
// The same for text.
Status write_file_atomically(const std::string &path, std::string_view text);

// Checks, before any work, that a file can be written at `path` later: not a
// folder, in an existing folder this process may write to. `what` names the
// option in the error ("--trace").
Status check_file_writable(const std::string &path, std::string_view what);

// The same for a folder that will be created if needed: an existing folder
// this process may write to, or a path whose nearest existing ancestor is one.
Status check_folder_writable(const std::string &path, std::string_view what);

// An error if `output` is the file `input` (same file, by any path): a command
// must not replace what it reads.
Status check_not_input(const std::string &output, const std::string &input);

// "strerror(errno)" for the current errno.
std::string errno_text(int error);

} // namespace strata::serialization
