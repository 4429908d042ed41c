// Helpers shared by the subcommands, and what main says about a command line
// CLI11 refuses.
#include "tools/cli.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <vector>

namespace strata::tools {
namespace {

// Edits (insertions, deletions, substitutions) between two words.
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = above;
    }
  }
  return row[b.size()];
}

} // namespace

CLI::Validator at_least(int64_t low) {
  return CLI::Validator(
      [low](std::string &text) -> std::string {
        int64_t value = 0;
        if (!CLI::detail::lexical_cast(text, value)) return "'" + text + "' is not an integer";
        // CLI11 reads a number beyond int64 as the nearest int64, silently.
        int64_t exact = 0;
        const char *begin = text.data() + (text.starts_with('+') ? 1 : 0);
        if (std::from_chars(begin, text.data() + text.size(), exact).ec ==
            std::errc::result_out_of_range)
          return str_cat("'", text, "' is not an integer from ", low, " to ",
                         std::numeric_limits<int64_t>::max());
        if (value < low) return str_cat("must be at least ", low, ", got ", value);
        return "";
      },
      str_cat("INT>=", low));
}

CLI::Validator not_empty_path(std::string_view kind) {
  return CLI::Validator(
      [kind = std::string(kind)](std::string &text) -> std::string {
        if (text.empty()) return str_cat("the path is empty; name ", kind);
        return "";
      },
      "");
}

CLI::Validator unsigned_64() {
  return CLI::Validator(
      [](std::string &text) -> std::string {
        uint64_t value = 0;
        const char *end = text.data() + text.size();
        auto [stop, error] = std::from_chars(text.data(), end, value);
        if (text.empty() || error != std::errc() || stop != end)
          return str_cat("'", text, "' is not an integer from 0 to ",
                         std::numeric_limits<uint64_t>::max());
        text = std::to_string(value);
        return "";
      },
      "UINT64");
}

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

std::optional<std::string> unknown_command(const CLI::App &app, int argc, char **argv) {
  const CLI::App *level = &app;
  std::string path = app.get_name();
  for (int i = 1; i < argc && level->get_require_subcommand_min() > 0; ++i) {
    std::string word = argv[i];
    if (word.empty() || word[0] == '-') return std::nullopt;
    std::string names;
    const CLI::App *next = nullptr;
    for (const CLI::App *sub : level->get_subcommands([](const CLI::App *) { return true; })) {
      names += (names.empty() ? "" : ", ") + sub->get_name();
      if (sub->check_name(word)) next = sub;
    }
    if (next == nullptr)
      return str_cat("unknown command '", word, "' for `", path, "` (one of: ", names, ")");
    level = next;
    path += " " + next->get_name();
  }
  return std::nullopt;
}

std::optional<std::string> unknown_option(const CLI::App &app, int argc, char **argv) {
  const CLI::App *level = &app;
  std::string path = app.get_name();
  while (!level->get_subcommands().empty()) {
    level = level->get_subcommands().front();
    path += " " + level->get_name();
  }
  for (int i = 1; i < argc; ++i) {
    std::string_view word = argv[i];
    if (word == "--") break;
    if (!word.starts_with("--") || word.size() < 3) continue;
    const std::string name(word.substr(2, word.find('=') - 2));
    bool known = false;
    std::string closest;
    size_t best = 3;
    for (const CLI::Option *option : level->get_options()) {
      for (const std::string &long_name : option->get_lnames()) {
        if (long_name == name) known = true;
        if (size_t d = edit_distance(name, long_name); d < best) {
          best = d;
          closest = long_name;
        }
      }
    }
    if (known) continue;
    return str_cat("unknown option --", name, " for `", path, "`",
                   closest.empty() ? std::string() : str_cat(" (did you mean --", closest, "?)"));
  }
  return std::nullopt;
}

std::string command_path(const CLI::App &app) {
  std::string path = app.get_name();
  const CLI::App *current = &app;
  while (true) {
    auto subs = current->get_subcommands();
    if (subs.empty()) break;
    current = subs.front();
    path += " " + current->get_name();
  }
  return path;
}

} // namespace strata::tools
