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
#include "runtime/make_runner.h"
#include "serialization/plan_io.h"

namespace strata::tools {

struct InspectArgs {
  std::string path;
  std::string format = "text"; // text, json or dot; plans also trace
  int64_t max_nodes = 25;      // rows of the per-node table in text form
  bool all_nodes = false;
  bool comm = false; // pipeline plans: list every transfer and why it is there
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
  // Where a single-device model or plan runs: "cpu", or "cuda" (one GPU).
  std::string backend = "cpu";
  int gpu = 0;            // --backend cuda: the CUDA device ordinal
  std::string gpus;       // --backend cuda, pipeline plan: each plan device's GPU ("0,0,1,1")
  bool cuda_graph = true; // --backend cuda: capture the step once, replay it after
  bool tf32 = false;      // --backend cuda: f32 GEMMs on TF32 tensor cores
  std::string precision = "f32"; // --backend cuda: f32, or bf16 (GEMM operands in bf16)
  bool op_times = false;         // one-device model or plan: time every node after the run
  // --backend cuda: who runs pooling and batch norm, "cudnn" (where it computes
  // the node as strata defines it) or "strata" (its own kernels throughout).
  std::string pool_norm = "cudnn";
  // Pipeline plans only.
  std::string trace;          // write a Chrome / Perfetto trace of every device here
  std::string clock = "wall"; // wall or device (runtime/device_clock.h)
  double timeout_s = 30;      // bound on every wait between devices
  // Under an MPI launcher (mpirun -np N): plan devices each rank runs.
  int devices_per_rank = 1;
};
// Runs a model or a plan; a training plan trains (train_command).
Status run_command(const RunArgs &args, std::ostream &out);
// The signal (SIGINT or SIGTERM) that stopped a training run, else 0: main
// then ends the process by that signal (exit status 128 + it in a shell).
int training_stop_signal();
// The runner's options from `strata run`'s; the caller adds the timeout and,
// under an MPI launcher, the world.
runtime::RunnerOptions run_runner_options(const RunArgs &args);
// --op-times: times every node of a one-device runner's graph on `inputs` and
// prints the time per op type, largest first. The CPU takes each node's
// median of five more runs; the GPU runs once more, eagerly, an event after
// each node. A training graph's weights update each run on the GPU.
Status print_op_times(runtime::StepRunner &runner, llvm::ArrayRef<HostTensor> inputs,
                      std::ostream &out);

struct CompileArgs {
  std::string model;
  bool train = false;
  std::string loss = "softmax_cross_entropy";
  std::string optimizer = "sgd:lr=0.01";
  std::string output_tensor; // --loss-input: the tensor the loss reads; empty: the first output
  std::string out;           // plan file to write
  // Pipeline parallelism (training only).
  std::string mesh;                          // "DPxTPxPP"; TP must be 1 so far
  int64_t microbatches = 0;                  // 0: not given (1)
  std::string schedule = "1f1b";             // gpipe, 1f1b or interleaved
  int64_t chunks = 0;                        // interleaved: chunks per device; 0: not given (2)
  std::string cluster;                       // cluster spec JSON the costs are predicted for
  std::vector<std::string> stage_boundaries; // last forward node of each stage but the last
  bool profile = false;                      // time every node here instead of using the roofline
  int64_t zero = 0;                          // 1: shard the optimizer state over the replicas
  double bucket_mb = 25;                     // gradient bucket size in MiB; 0: no overlap
  bool recompute = false;                    // recompute activations in backward
  bool split_activations = false;            // TP: reduce-scatter partial sums into split ones
  // --auto: search the mesh, micro-batches and schedule for `devices` devices.
  bool auto_plan = false;
  int64_t devices = 0;  // 0: every device of the cluster
  bool explain = false; // print the candidates and why the winner won
};
Status compile_command(const CompileArgs &args, std::ostream &out);

struct SimulateArgs {
  std::string plan;
  std::string cluster; // spec file; empty: the one the plan was compiled for
  std::string trace;   // write the predicted schedule as a Chrome trace here
};
// Re-predicts a pipeline plan's step time and bubble for a cluster.
Status simulate_command(const SimulateArgs &args, std::ostream &out);

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
