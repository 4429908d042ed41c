// The subcommands of the `strata` command line, apart from their argument parsing
// (tools/strata.cc). Each writes its report to `out` and returns an error Status
// whose message names the file, input or option at fault; main prints it as
// `strata: error: <message>`.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace strata::tools {

struct InspectArgs {
  std::string path;
  std::string format = "text"; // text, json or dot
  int64_t max_nodes = 25;      // rows of the per-node table in text form
  bool all_nodes = false;
};
Status inspect_command(const InspectArgs &args, std::ostream &out);

struct RunArgs {
  std::string model;
  std::vector<std::string> inputs; // "name=path.npy" or "path.npy" (graph-input order)
  std::string output;              // the single output, as .npy
  std::string output_dir;          // every output, as <name>.npy
  int64_t repeat = 1;
  int64_t warmup = 1;
  uint64_t seed = 0;
};
Status run_command(const RunArgs &args, std::ostream &out);

// Loads a model file and adds the path to any error that does not name it.
Result<Graph> load_model_file(const std::string &path);

// A one-line error message: newlines folded into "; ".
std::string one_line(std::string_view message);

} // namespace strata::tools
