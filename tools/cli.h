// The `strata` command line's shared parts: how a subcommand is registered,
// and the helpers every command uses.
//
// Each command lives in its own tools/cmd_<name>.cc and exports one
// add_<name>(app, action): it adds the subcommand, its options and its help
// to `app`, and its callback sets `action` to the command's work. The work
// writes its report to stdout and returns an error Status whose message names
// the file, input or option at fault; main (tools/strata.cc) prints it as
// `strata: error: <message>`.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

#include "graph/graph.h"
#include "serialization/plan_io.h"
#include "tools/model_files.h"

namespace strata::tools {

using Action = std::function<Status()>;

void add_zoo(CLI::App &app, Action &action);       // tools/cmd_zoo.cc
void add_convert(CLI::App &app, Action &action);   // tools/cmd_convert.cc
void add_import(CLI::App &app, Action &action);    // tools/cmd_import.cc
void add_inspect(CLI::App &app, Action &action);   // tools/cmd_inspect.cc
void add_compile(CLI::App &app, Action &action);   // tools/cmd_compile.cc
void add_run(CLI::App &app, Action &action);       // tools/cmd_run.cc
void add_simulate(CLI::App &app, Action &action);  // tools/cmd_simulate.cc
void add_verify(CLI::App &app, Action &action);    // tools/cmd_verify.cc
void add_ops(CLI::App &app, Action &action);       // tools/cmd_ops.cc
void add_calibrate(CLI::App &app, Action &action); // tools/cmd_calibrate.cc
void add_export(CLI::App &app, Action &action);    // tools/cmd_export.cc
void add_reshard(CLI::App &app, Action &action);   // tools/cmd_reshard.cc

// The signal (SIGINT or SIGTERM) that stopped a training run, else 0: main
// then ends the process by that signal (exit status 128 + it in a shell).
int training_stop_signal();

// A validator for integers with a lower bound, with a plain message.
CLI::Validator at_least(int64_t low);
// A validator that refuses an empty path (`--checkpoint ""` would otherwise
// read as the option not given); `kind` says what to name ("a folder").
CLI::Validator not_empty_path(std::string_view kind);

// For an option taking any 64-bit unsigned integer (a seed), with
// ->transform(): CLI11 alone reads "-1" as 2^64 - 1 and a number past the
// range as the largest one. Both are refused, naming the range; other text is
// rewritten as plain decimal (CLI11 would read "010" as octal).
CLI::Validator unsigned_64();

// A one-line error message: newlines folded into "; ".
std::string one_line(std::string_view message);

// For main, when CLI11 refuses a command line. Where a command word is
// required and argv has an unknown one there, says so ("unknown command
// 'frobnicate'") rather than CLI11's "A subcommand is required".
std::optional<std::string> unknown_command(const CLI::App &app, int argc, char **argv);
// The first --word on the command line that the deepest subcommand reached
// does not have, with its closest option name (at most two edits away):
// "unknown option --step for `strata run` (did you mean --steps?)".
std::optional<std::string> unknown_option(const CLI::App &app, int argc, char **argv);
// The deepest subcommand the parser reached, as "strata zoo gpt".
std::string command_path(const CLI::App &app);

} // namespace strata::tools
