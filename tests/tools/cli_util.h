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
#include <vector>

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

// A row of the device table `strata run` ends a pipeline plan's training
// with. A cell of "-" (not measured) reads as -1 or "-".
struct DeviceRow {
  int device = -1;
  double predicted_busy_ms = -1, measured_busy_ms = -1;
  std::string planned_arena, allocated_arena, held; // as printed: "1.20 MiB"
};

// The rows of that table in `out`, in order; empty where it has none.
inline std::vector<DeviceRow> device_rows(const std::string &out) {
  std::vector<DeviceRow> rows;
  const std::string header =
      "\ndevice  predicted busy  measured busy  planned arena  allocated arena  weights+state\n";
  const size_t at = out.find(header);
  if (at == std::string::npos) return rows;
  std::istringstream lines(out.substr(at + header.size()));
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    DeviceRow row;
    if (!(fields >> row.device)) break; // the `memory` line ends the table
    // "5.100 ms" or "-"; "1.20 MiB" or "-".
    auto read_time = [&fields](double &ms) {
      std::string value, unit;
      if (!(fields >> value) || value == "-") return;
      if (fields >> unit && unit == "ms") ms = std::strtod(value.c_str(), nullptr);
    };
    auto read_bytes = [&fields](std::string &text) {
      std::string value, unit;
      if (!(fields >> value) || value == "-") {
        text = value;
        return;
      }
      fields >> unit;
      text = value + " " + unit;
    };
    read_time(row.predicted_busy_ms);
    read_time(row.measured_busy_ms);
    read_bytes(row.planned_arena);
    read_bytes(row.allocated_arena);
    read_bytes(row.held);
    rows.push_back(row);
  }
  return rows;
}

} // namespace strata::testing
