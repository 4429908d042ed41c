// `strata run`'s options and what its two modes share: running a model or
// an inference plan (tools/cmd_run.cc) and training a training plan
// (tools/cmd_run_train.cc).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "runtime/make_runner.h"
#include "serialization/plan_io.h"

namespace strata::tools {

// The flags that errors about the runner's GPU options name (`strata verify`
// runs on the CPU and sets none of them).
constexpr runtime::RunnerOptionNames kRunnerFlags{"--gpu", "--gpus", "--backend cuda"};

// A bound on --steps far beyond any real run, inside int64 so that a number
// CLI11 would saturate to the largest int64 is refused instead.
constexpr int64_t kMaxSteps = int64_t{1} << 40;

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
  std::string clock = "wall"; // wall or device (runtime/comm/device_clock.h)
  double timeout_s = 30;      // bound on every wait between devices
  // Under an MPI launcher (mpirun -np N): plan devices each rank runs.
  int devices_per_rank = 1;
};

// The runner's options from `strata run`'s; the caller adds the timeout and,
// under an MPI launcher, the world.
runtime::RunnerOptions run_runner_options(const RunArgs &args);

// --op-times: times every node of a one-device runner's graph on `inputs` and
// prints the time per op type, largest first. The CPU takes each node's
// median of five more runs; the GPU runs once more, eagerly, an event after
// each node. A training graph's weights update each run on the GPU.
Status print_op_times(runtime::StepRunner &runner, llvm::ArrayRef<HostTensor> inputs,
                      std::ostream &out);

// Trains a training plan until --steps steps are done, or under an MPI
// launcher this process's devices of it, the job joined first.
Status train_command(const RunArgs &args, const serialization::Plan &plan, std::ostream &out);

} // namespace strata::tools
