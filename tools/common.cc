// Helpers shared by the subcommands.
#include "serialization/model_io.h"
#include "tools/commands.h"

namespace strata::tools {

std::string one_line(std::string_view message) {
  std::string out;
  out.reserve(message.size());
  for (size_t i = 0; i < message.size(); ++i) {
    char c = message[i];
    if (c == '\r') continue;
    if (c == '\n') {
      while (!out.empty() && out.back() == ' ')
        out.pop_back();
      if (i + 1 < message.size()) out += "; ";
      continue;
    }
    out += c;
  }
  while (!out.empty() && (out.back() == ' ' || out.back() == ';'))
    out.pop_back();
  return out;
}

Result<Graph> load_model_file(const std::string &path) {
  auto graph = serialization::load_model(path);
  if (!graph.is_ok()) {
    const Status &status = graph.status();
    if (status.message().find(path) == std::string::npos) return status.with_context(path);
    return status;
  }
  return graph;
}

} // namespace strata::tools
