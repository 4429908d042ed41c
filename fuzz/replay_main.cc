// A fuzz target without libFuzzer, for the test suite: runs the target on every
// file of the corpus folders it is given, then on seeded mutations of them
// (bit flips, bytes set to edge values, truncations, erased, repeated and
// inserted chunks, splices of two inputs) until a time budget is spent. Built
// with the compiler of the build, so the sanitizer build runs every target
// briefly on each test run; scripts/fuzz runs the same targets under
// libFuzzer's coverage-guided search for as long as one asks.
//
//   <target>_replay [--seconds S] [--seed N] FOLDER...
//
// A broken invariant (a trap), a crash or a sanitizer report ends the process
// with a failure; the input that did it is written first to
// $STRATA_FUZZ_CRASH_DIR (default: the working folder) as crash-<target>.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
// Present under AddressSanitizer / UndefinedBehaviorSanitizer: called when a
// report ends the process.
extern "C" void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

namespace {

using Bytes = std::vector<uint8_t>;

// The input being run, for the crash handlers (read from a signal handler:
// plain pointers and a path prepared in advance).
const uint8_t *g_current = nullptr;
size_t g_current_size = 0;
char g_crash_path[4096] = {};

void save_current_input() {
  if (g_crash_path[0] == '\0') return;
  const int fd = ::open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  size_t done = 0;
  while (done < g_current_size) {
    const ssize_t n = ::write(fd, g_current + done, g_current_size - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  static const char kSaved[] = "replay: the input that failed is saved as ";
  (void)!::write(2, kSaved, sizeof kSaved - 1);
  (void)!::write(2, g_crash_path, std::strlen(g_crash_path));
  (void)!::write(2, "\n", 1);
}

void on_fatal_signal(int signal) {
  save_current_input();
  ::signal(signal, SIG_DFL);
  ::raise(signal);
}

void install_crash_handlers(const std::string &target) {
  const char *dir = std::getenv("STRATA_FUZZ_CRASH_DIR");
  const std::string path =
      std::string(dir != nullptr && *dir != '\0' ? dir : ".") + "/crash-" + target;
  std::snprintf(g_crash_path, sizeof g_crash_path, "%s", path.c_str());
  for (int signal : {SIGILL, SIGABRT, SIGSEGV, SIGBUS, SIGFPE})
    ::signal(signal, on_fatal_signal);
  if (__sanitizer_set_death_callback != nullptr) __sanitizer_set_death_callback(save_current_input);
}

void run_one(const Bytes &input) {
  g_current = input.data();
  g_current_size = input.size();
  LLVMFuzzerTestOneInput(input.data(), input.size());
}

// One random change of `input`, with `other` for splices.
void mutate(Bytes &input, const Bytes &other, std::mt19937_64 &rng) {
  auto below = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  static constexpr uint8_t kEdges[] = {0x00, 0x01, 0x7f, 0x80, 0xff, '0', '9', '-', '"', '{'};
  switch (rng() % 7) {
  case 0: // flip one to four bits
    for (size_t k = 0, n = 1 + below(4); k < n && !input.empty(); ++k)
      input[below(input.size())] ^= static_cast<uint8_t>(1u << below(8));
    break;
  case 1: // a byte set to an edge value
    if (!input.empty()) input[below(input.size())] = kEdges[below(std::size(kEdges))];
    break;
  case 2: // cut the end off
    input.resize(below(input.size() + 1));
    break;
  case 3: { // erase a chunk
    const size_t at = below(input.size() + 1);
    const size_t n = std::min(input.size() - at, 1 + below(64));
    input.erase(input.begin() + static_cast<ptrdiff_t>(at),
                input.begin() + static_cast<ptrdiff_t>(at + n));
    break;
  }
  case 4: { // repeat a chunk
    if (input.empty()) break;
    const size_t at = below(input.size());
    const size_t n = std::min(input.size() - at, 1 + below(64));
    Bytes chunk(input.begin() + static_cast<ptrdiff_t>(at),
                input.begin() + static_cast<ptrdiff_t>(at + n));
    input.insert(input.begin() + static_cast<ptrdiff_t>(below(input.size() + 1)), chunk.begin(),
                 chunk.end());
    break;
  }
  case 5: { // insert random bytes
    Bytes bytes(1 + below(8));
    for (uint8_t &b : bytes)
      b = static_cast<uint8_t>(rng());
    input.insert(input.begin() + static_cast<ptrdiff_t>(below(input.size() + 1)), bytes.begin(),
                 bytes.end());
    break;
  }
  default: { // splice: this input's head, the other's tail
    const size_t head = below(input.size() + 1), tail = below(other.size() + 1);
    input.resize(head);
    input.insert(input.end(), other.begin() + static_cast<ptrdiff_t>(tail), other.end());
    break;
  }
  }
}

Bytes read_all(const std::filesystem::path &path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

int usage(const char *self) {
  std::fprintf(stderr, "usage: %s [--seconds S] [--seed N] FOLDER...\n", self);
  return 2;
}

} // namespace

int main(int argc, char **argv) {
  double seconds = 3;
  uint64_t seed = 1;
  std::vector<std::filesystem::path> folders;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--seconds" || arg == "--seed") && i + 1 < argc) {
      char *end = nullptr;
      const char *value = argv[++i];
      if (arg == "--seconds")
        seconds = std::strtod(value, &end);
      else
        seed = std::strtoull(value, &end, 10);
      if (end == value || *end != '\0' || seconds < 0) return usage(argv[0]);
    } else if (arg.starts_with("--")) {
      return usage(argv[0]);
    } else {
      folders.emplace_back(arg);
    }
  }
  if (folders.empty()) return usage(argv[0]);
  const std::string target = std::filesystem::path(argv[0]).filename().string();
  install_crash_handlers(target);

  std::vector<Bytes> corpus;
  std::vector<std::filesystem::path> files;
  for (const auto &folder : folders) {
    std::error_code error;
    for (const auto &entry : std::filesystem::directory_iterator(folder, error))
      if (entry.is_regular_file()) files.push_back(entry.path());
    if (error) {
      std::fprintf(stderr, "%s: cannot read %s: %s\n", target.c_str(), folder.c_str(),
                   error.message().c_str());
      return 1;
    }
  }
  std::sort(files.begin(), files.end());
  for (const auto &file : files)
    corpus.push_back(read_all(file));
  if (corpus.empty()) {
    std::fprintf(stderr, "%s: no inputs in the folders given\n", target.c_str());
    return 1;
  }
  for (const Bytes &input : corpus)
    run_one(input);

  std::mt19937_64 rng(seed);
  const auto start = std::chrono::steady_clock::now();
  const auto budget = std::chrono::duration<double>(seconds);
  uint64_t mutations = 0;
  Bytes input;
  while (std::chrono::steady_clock::now() - start < budget) {
    input = corpus[mutations % corpus.size()];
    for (size_t k = 0, n = 1 + rng() % 4; k < n; ++k)
      mutate(input, corpus[rng() % corpus.size()], rng);
    run_one(input);
    ++mutations;
  }
  std::printf("%s: %zu corpus inputs, then %llu mutations of them (seed %llu, %.0f s): "
              "nothing broke\n",
              target.c_str(), corpus.size(), static_cast<unsigned long long>(mutations),
              static_cast<unsigned long long>(seed), seconds);
  return 0;
}
