// What the fuzz targets share: how a broken invariant stops the run, what every
// refusal of bad input must look like, and a scratch folder for the readers
// that take paths.
//
// A target either accepts its input, and then checks what the format promises
// of everything it accepts, or refuses it with an error. A broken promise
// prints what broke and ends in __builtin_trap(), which libFuzzer records as a
// crash with the input that caused it.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "graph/status.h"

namespace strata::fuzz {

[[noreturn]] inline void fail(std::string_view what, std::string_view detail = {}) {
  std::fprintf(stderr, "fuzz: invariant broken: %.*s\n", static_cast<int>(what.size()),
               what.data());
  if (!detail.empty())
    std::fprintf(stderr, "fuzz:   %.*s\n", static_cast<int>(detail.size()), detail.data());
  __builtin_trap();
}

inline void check(bool condition, std::string_view what, std::string_view detail = {}) {
  if (!condition) fail(what, detail);
}

// A refusal of bad input is an error (never ok), never kInternal (which means
// a bug in strata), has a message, and names `display_name` (the file) where
// one is given: every loader promises errors that say where.
inline void check_refusal(const Status &status, std::string_view display_name = {}) {
  check(!status.is_ok(), "an input was refused with an ok status");
  check(status.code() != StatusCode::kInternal,
        "bad input gave an internal error (a bug in strata)", status.to_string());
  check(!status.message().empty(), "an error has no message", status.to_string());
  if (!display_name.empty())
    check(status.message().find(display_name) != std::string::npos,
          "an error does not name the file it is about", status.to_string());
}

namespace detail {
inline std::string &scratch_storage() {
  static std::string dir;
  return dir;
}
inline void remove_scratch() {
  std::error_code error;
  std::filesystem::remove_all(scratch_storage(), error);
}
} // namespace detail

// A folder of this process's own under the temporary directory ($TMPDIR),
// created on first use and removed when the process exits normally.
inline const std::string &scratch_dir() {
  std::string &dir = detail::scratch_storage();
  if (dir.empty()) {
    std::error_code error;
    std::filesystem::path base = std::filesystem::temp_directory_path(error);
    if (error) base = "/tmp";
    std::string pattern = (base / "strata-fuzz-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::perror("fuzz: mkdtemp");
      std::abort();
    }
    dir = pattern;
    std::atexit(detail::remove_scratch);
  }
  return dir;
}

// Replaces the file at `path` with `size` bytes from `data`. Inputs are written
// whole every run, so no run sees what an earlier one left.
inline void write_file(const std::string &path, const uint8_t *data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (size > 0) out.write(reinterpret_cast<const char *>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}
inline void write_file(const std::string &path, std::string_view text) {
  write_file(path, reinterpret_cast<const uint8_t *>(text.data()), text.size());
}

} // namespace strata::fuzz
