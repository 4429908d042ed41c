// Helpers shared by the serialization tests: temporary folders and running
// the system Python (which has NumPy) on a script.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace strata::serialization::testing {

// A fresh folder under the system temp folder, removed with everything in it.
class TempDir {
public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "strata_ser_XXXXXX").string();
    char *made = ::mkdtemp(pattern.data());
    if (made == nullptr) {
      ADD_FAILURE() << "mkdtemp failed";
      return;
    }
    path_ = made;
  }
  ~TempDir() {
    std::error_code error;
    std::filesystem::remove_all(path_, error);
  }
  TempDir(const TempDir &) = delete;
  TempDir &operator=(const TempDir &) = delete;
  const std::filesystem::path &path() const { return path_; }
  std::string file(const std::string &name) const { return (path_ / name).string(); }

private:
  std::filesystem::path path_;
};

// A plan's JSON text as an older revision would have written it: version
// `version` and no graph_digest (revision 5's field).
inline std::string as_plan_revision(std::string json, int version) {
  const std::string current = "\"plan_version\": 5,";
  const size_t at = json.find(current);
  if (at == std::string::npos) {
    ADD_FAILURE() << "no " << current << " in the plan";
    return json;
  }
  json.replace(at, current.size(), "\"plan_version\": " + std::to_string(version) + ",");
  const size_t digest = json.find("\n  \"graph_digest\": ");
  if (digest != std::string::npos) json.erase(digest, json.find('\n', digest + 1) - digest);
  return json;
}

// The interpreter with NumPy; the `python3` on PATH may lack it.
inline constexpr const char *kSystemPython = "/usr/bin/python3";

// True when the system Python can import `module`.
inline bool python_has(const std::string &module) {
  std::string command = std::string(kSystemPython) + " -c 'import " + module + "' > /dev/null 2>&1";
  return std::system(command.c_str()) == 0;
}

// Runs `script` with the system Python; returns its exit status and stdout.
inline int run_python(const std::string &script, std::string *output = nullptr) {
  TempDir dir;
  std::string script_path = dir.file("script.py");
  std::FILE *file = std::fopen(script_path.c_str(), "w");
  if (file == nullptr) return -1;
  std::fputs(script.c_str(), file);
  std::fclose(file);
  std::string command = std::string(kSystemPython) + " " + script_path + " 2>&1";
  std::FILE *pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  std::string text;
  char buf[256];
  while (std::fgets(buf, sizeof(buf), pipe) != nullptr)
    text += buf;
  int status = ::pclose(pipe);
  if (output) *output = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

} // namespace strata::serialization::testing
