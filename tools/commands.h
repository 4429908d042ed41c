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
#include "serialization/plan_io.h"

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
  // Training plans only.
  int64_t steps = 1;            // train until this many steps are done in total
  std::string data;             // folder of <input>.npy batch stacks; empty: synthetic
  std::string checkpoint;       // folder to save checkpoints in
  int64_t checkpoint_every = 0; // also save every this many steps (0: only at the end)
  std::string resume;           // checkpoint folder to continue from
  int64_t log_every = 1;        // print the loss every this many steps
  bool interactive = false;     // rewrite a progress line with \r (stdout is a terminal)
};
// Runs a model or a plan; a training plan trains (train_command).
Status run_command(const RunArgs &args, std::ostream &out);

struct CompileArgs {
  std::string model;
  bool train = false;
  std::string loss = "softmax_cross_entropy";
  std::string optimizer = "sgd:lr=0.01";
  std::string output_tensor; // the tensor the loss reads; empty: the first graph output
  std::string out;           // plan file to write
};
Status compile_command(const CompileArgs &args, std::ostream &out);

// The plan side of inspect and convert, and training runs (tools/plan_commands.cc).
Status inspect_plan(const InspectArgs &args, std::ostream &out);
Status convert_plan(const std::string &in, const std::string &out_path, std::ostream &out);
Status train_command(const RunArgs &args, serialization::Plan plan, std::ostream &out,
                     bool interactive);

// Loads a model file and adds the path to any error that does not name it.
Result<Graph> load_model_file(const std::string &path);

// A one-line error message: newlines folded into "; ".
std::string one_line(std::string_view message);

} // namespace strata::tools
