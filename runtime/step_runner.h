// StepRunner: what the Trainer drives. One run is one training step on one
// batch; the runner owns the parameters and state and applies the step's state
// updates. The single-device executors (CpuExecutor, CudaExecutor) and the
// pipeline runners (PipelineRunner: CPU threads or MPI ranks;
// CudaPipelineRunner: GPU streams, GPUs, MPI ranks) implement it;
// make_runner.h picks one for a plan.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "graph/host_tensor.h"

namespace strata::runtime {

class ProcessGroup;

// What a pipeline step consumes: the graph's input types with dim 0 times
// `microbatches` (every replica's micro-batches, one after another).
std::vector<TensorType> pipeline_batch_types(const Graph &graph, int64_t microbatches);
// Whether a pipeline step can cut its batch into `microbatches` slices: every
// graph input needs a dim 0 once there is more than one (the compiler never
// makes such a plan; a plan written by hand could).
Status check_pipeline_inputs(const Graph &graph, int64_t microbatches);

class StepRunner {
public:
  virtual ~StepRunner() = default;
  // The graph one device runs (for a pipeline: at micro-batch size).
  virtual const Graph &graph() const = 0;
  // The types of the batch one run consumes, one per graph input: the graph's
  // input types, with dim 0 times the micro-batches for a pipeline.
  virtual std::vector<TensorType> batch_types() const;
  // Runs one step on `inputs` (of batch_types()); outputs are the graph outputs
  // (for a pipeline: their mean over the micro-batches).
  virtual Status run(llvm::ArrayRef<HostTensor> inputs, std::vector<HostTensor> *outputs) = 0;
  // The current value of a parameter, state or constant tensor.
  virtual const HostTensor &value(TensorId id) const = 0;
  // Whether every value() since the last run() could be read: an error naming
  // the first that could not (a GPU that failed; its value() came back zero).
  // Whoever keeps values checks it (a checkpoint is then not committed).
  virtual Status read_status() const { return Status::ok(); }
  // Host seconds the last run() spent issuing the step to the devices
  // (copying the batch in, launching the kernels or replaying the captured
  // step), before it waited for them; negative where a runner does not
  // measure it (the CPU runners, whose host is the device) or the step
  // failed before it was issued.
  virtual double issue_seconds() const { return -1; }
  // The type value(id) has: the graph's, except for tensors a runner holds in
  // tensor-parallel pieces (the full tensor's).
  virtual TensorType value_type(TensorId id) const { return graph().tensor(id).type; }
  // Replaces a parameter or state tensor's value (resuming from a checkpoint);
  // `value` has value_type(id).
  virtual Status assign(TensorId id, const HostTensor &value) = 0;
  // What every assign() checks first: `id` is a parameter or state tensor of
  // `graph` and `value` has its type (or `type`, when given).
  static Status check_assignable(const Graph &graph, TensorId id, const HostTensor &value,
                                 const TensorType *type = nullptr);
  // The processes of a multi-process run; null when this process runs it all.
  virtual ProcessGroup *processes() const { return nullptr; }
  // Over several processes: the parameter and state tensors this process
  // writes to a checkpoint, by name; a shard of a tensor that several devices
  // hold in pieces is named "<name>@shard<i>of<n>", a tensor-parallel piece
  // "<name>@tp<m>of<T>" (possibly itself in shards). Unused otherwise.
  // An error where they cannot be read (a GPU that failed): the checkpoint is
  // then not committed.
  virtual Result<std::map<std::string, HostTensor>> checkpoint_pieces() const {
    return std::map<std::string, HostTensor>();
  }
};

} // namespace strata::runtime
