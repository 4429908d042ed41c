// The single-device CPU executor.
//
// An executor is built once from a verified graph: it orders the nodes, plans
// one arena for every intermediate tensor from their lifetimes (buffers whose
// lifetimes do not overlap share bytes), and materializes parameters and
// constants (inline data, external .safetensors data, or initializers drawn with
// a counter-based generator, so every element depends only on the seed and its
// index). Each run then executes the nodes in order with the registry's CPU
// kernels. Runs are deterministic: the same inputs give bitwise the same outputs.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "graph/host_tensor.h"
#include "runtime/materialize.h"
#include "passes/plan_memory.h"
#include "runtime/step_runner.h"

namespace strata::runtime {


struct ExecutorOptions {
  // Folder that external data paths are relative to (the model's folder).
  std::string model_dir = ".";
};

class CpuExecutor : public StepRunner {
public:
  static Result<std::unique_ptr<CpuExecutor>> create(Graph graph,
                                                     const ExecutorOptions &options = {});
  ~CpuExecutor() override;

  // Runs the graph on `inputs` (one per graph input, in order, matching types).
  // Errors name the input or the node whose kernel failed. Kernels read the
  // caller's input buffers in place; outputs are fresh copies. Runs share one
  // arena, so one executor runs one call at a time.
  Status run(llvm::ArrayRef<HostTensor> inputs, std::vector<HostTensor> *outputs) override;

  const Graph &graph() const override { return graph_; }

  // Runs the graph `repeats` times on `inputs`, timing each node's kernel, and
  // returns every node's median seconds (by NodeId). Outputs are not copied and
  // state updates are not applied: the weights stay as they are. What
  // `strata compile --profile` balances pipeline stages and predicts with.
  Result<std::vector<double>> profile(llvm::ArrayRef<HostTensor> inputs, int repeats);

  // The current value of a parameter, state or constant tensor (what the next run
  // reads; state updates change it after each run).
  const HostTensor &value(TensorId id) const override;
  // Replaces the value of a parameter or state tensor (resuming from a checkpoint).
  // An error names the tensor if it is not one or the type differs.
  Status assign(TensorId id, const HostTensor &value) override;
  const passes::MemoryPlan &memory_plan() const { return plan_; }
  // Bytes held by materialized parameters and constants.
  int64_t weight_bytes() const { return weight_bytes_; }

private:
  CpuExecutor() = default;
  Graph graph_;
  passes::MemoryPlan plan_;
  std::vector<NodeId> order_;
  int64_t weight_bytes_ = 0;
  struct State;
  std::unique_ptr<State> state_;
};

// What `strata compile --profile` measures: every node of `graph` on seeded
// random inputs with one GEMM thread (as a pipeline device thread runs), the
// median of 5 runs after one warm-up run (caches, oneDNN primitives). The GEMM
// thread count is back at the number of cores afterwards.
Result<std::vector<double>> profile_node_times(const Graph &graph);


} // namespace strata::runtime
