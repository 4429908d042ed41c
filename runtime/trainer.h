// Training: a training-step graph (passes/make_training.h)
// run once per step on a fixed, cycled list of batches, with checkpoints.
//
// Step k (counting from 0) reads batch k mod num_batches, so a run stopped
// after k steps and resumed from its checkpoint reads the same batches and
// computes bitwise the same weights as a run that never stopped.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cpu/executor.h"
#include "serialization/checkpoint.h"

namespace strata::runtime {

// The batches a training run cycles through: each holds one tensor per graph
// input, in graph-input order.
struct Dataset {
  std::vector<std::vector<HostTensor>> batches;
  std::string description; // for people: "synthetic (8 batches, seed 0)"
};

// `count` batches of random_inputs(graph, seed + k), k = 0 .. count-1: a fixed
// task a model can fit, so the loss falls.
// With `microbatches` > 1 the batches are full pipeline batches (dim 0 of each
// input times `microbatches`), the same data the full-batch graph would get.
Dataset synthetic_dataset(const Graph &graph, uint64_t seed, int64_t count = 8,
                          int64_t microbatches = 1);

// Reads `<dir>/<input name>.npy` for every graph input. Each file stacks the
// batches along a new leading dimension: shape [num_batches, ...input shape];
// every file must hold the same number of batches. Errors name the file.
// `microbatches` as for synthetic_dataset.
Result<Dataset> load_dataset(const Graph &graph, const std::string &dir, int64_t microbatches = 1);

struct TrainerOptions {
  std::string model_dir = "."; // folder external data paths are relative to
  std::string fingerprint;     // of the plan; recorded in and checked against checkpoints
  // What checkpoints record of the model, optimizer and layout
  // (plan::checkpoint_layout of the plan); resuming a checkpoint of another
  // plan needs its model and optimizer. Empty: every parameter and state
  // tensor whole, at the runner's types, of no known model.
  serialization::CheckpointLayout layout;
  // Testing: called once this process's file of a checkpoint is durable and
  // before the commit (a crash injected here must leave the last checkpoint).
  std::function<void(int64_t step)> checkpoint_file_written;
};

class Trainer {
public:
  // `loss` names the scalar loss tensor, a graph output. `data` may hold no
  // batches when every step is given its own (train_step(batch)).
  static Result<std::unique_ptr<Trainer>> create(Graph graph, const std::string &loss, Dataset data,
                                                 const TrainerOptions &options = {});
  // The same around any runner (a pipeline: runtime/cpu/pipeline_runner.h).
  static Result<std::unique_ptr<Trainer>> create(std::unique_ptr<StepRunner> runner,
                                                 const std::string &loss, Dataset data,
                                                 const TrainerOptions &options = {});

  // Runs one step on batch step() mod num_batches and returns its loss; an
  // error when the trainer holds no batches.
  Result<double> train_step();
  // Runs one step on `batch` (one tensor per graph input, of the runner's
  // batch_types(): a pipeline's whole step) and returns its loss. It counts
  // as a step like any other: a later train_step() reads batch step() mod
  // num_batches, and a checkpoint records the steps of both kinds.
  Result<double> train_step(llvm::ArrayRef<HostTensor> batch);
  // Steps completed (restored by a checkpoint).
  int64_t step() const { return step_; }
  int64_t num_batches() const { return static_cast<int64_t>(data_.batches.size()); }
  const Dataset &data() const { return data_; }

  // Every parameter and state tensor by name: what a checkpoint holds.
  std::map<std::string, HostTensor> state() const;
  // Writes a checkpoint of the current state and step into folder `dir`.
  Status save_checkpoint(const std::string &dir) const;
  // Restores state and step from the checkpoint in `dir`: one written by this
  // plan, or by any plan of the same model and optimizer that recorded its
  // layout (plan/checkpoint_layout.h). Joined, it must hold exactly the
  // plan's parameters and state tensors with their whole types. Errors name
  // the file and tensor, or what differs from the plan that wrote it.
  Status restore_checkpoint(const std::string &dir);
  // After a restore from a checkpoint of another plan, that plan's layout
  // ("mesh 1x1x2 (DPxTPxPP), ..."); empty otherwise.
  const std::string &resharded_from() const { return resharded_from_; }

  const StepRunner &runner() const { return *executor_; }

private:
  Trainer() = default;
  Result<double> run_step(llvm::ArrayRef<HostTensor> batch);
  std::unique_ptr<StepRunner> executor_;
  Dataset data_;
  TrainerOptions options_;
  size_t loss_output_ = 0;
  int64_t step_ = 0;
  std::vector<TensorId> persistent_; // parameters and state tensors, in tensor order
  std::string resharded_from_;
};

} // namespace strata::runtime
