// What the end-to-end tests of the `strata` binary share: running it (or any
// shell command) and reading what it wrote.
#pragma once

#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

namespace strata::testing {

// A finished command: exit status (128 + signal when killed), its output and
// how long it took.
struct Outcome {
  int code = -1;
  std::string out, err;
  double seconds = 0;
};

inline std::string read_file(const std::filesystem::path &path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

inline void write_file(const std::filesystem::path &path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

// The binary under test: $STRATA_BINARY (the CUDA emulator's strata, for
// cli_emulated_test), $STRATA_BUILD_ROOT/tools/strata (meson sets it), or the
// build tree this test runs from (<build>/tests/tools/<test>).
inline std::filesystem::path strata_binary() {
  if (const char *binary = std::getenv("STRATA_BINARY")) return binary;
  if (const char *root = std::getenv("STRATA_BUILD_ROOT"))
    return std::filesystem::path(root) / "tools/strata";
  return std::filesystem::canonical("/proc/self/exe").parent_path().parent_path().parent_path() /
         "tools/strata";
}

// `arg` as one single-quoted shell word.
inline std::string quote(const std::string &arg) {
  std::string out = "'";
  for (char c : arg)
    out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs `command` with sh in folder `dir`, stdout and stderr captured there.
inline Outcome run_in(const std::filesystem::path &dir, const std::string &command) {
  const auto start = std::chrono::steady_clock::now();
  const std::string line =
      "cd " + quote(dir.string()) + " && " + command + " >stdout.txt 2>stderr.txt";
  const int status = std::system(line.c_str());
  Outcome o;
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  o.out = read_file(dir / "stdout.txt");
  o.err = read_file(dir / "stderr.txt");
  return o;
}

} // namespace strata::testing
