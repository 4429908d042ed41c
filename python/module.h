// The extension module `strata._strata`: strata's models, plans and trainers
// for Python, built from the same libraries as the `strata` command line.
//
// - errors.cc   a failed Status becomes a strata.Error subclass by its code
//               (InvalidArgumentError is also a ValueError, ...), carrying
//               strata's message; keyword arguments are read by name.
// - arrays.cc   NumPy arrays (and PyTorch tensors) to HostTensors and back:
//               an input of the right dtype, C-contiguous and 64-byte aligned
//               is read in place; outputs and weights are arrays over
//               strata's own buffers, which they keep alive.
// - model.cc    strata.load, import_onnx, the zoo; Model: inspect, save,
//               run, compile.
// - plan.cc     Plan: inspect, to_json, save, run, trainer; forward runs.
// - trainer.cc  Trainer: steps on given or own batches, weights, state,
//               checkpoints.
//
// Every call that computes (compiling, running, a training step, saving)
// releases the GIL; one object runs one call at a time. A Ctrl-C during a
// call is seen when it returns: the step in flight completes, then
// KeyboardInterrupt is raised.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "graph/graph.h"
#include "graph/host_tensor.h"
#include "partitioner/search/auto_plan.h"
#include "runtime/make_runner.h"
#include "runtime/step_runner.h"
#include "runtime/trainer.h"
#include "serialization/checkpoint.h"
#include "serialization/plan_io.h"

namespace strata::python {

namespace py = pybind11;

// ---------------------------------------------------------------------------
// errors.cc

// A failed Status on its way to Python; the module's exception translator
// raises it as the strata exception of its code.
class StatusError : public std::exception {
public:
  explicit StatusError(Status status) : status_(std::move(status)) {}
  const char *what() const noexcept override { return status_.message().c_str(); }
  const Status &status() const { return status_; }

private:
  Status status_;
};

// Throws StatusError for a failed `status`.
void check(const Status &status);
// The value of `result`, or StatusError.
template <typename T> T value_or_throw(Result<T> result) {
  if (!result.is_ok()) throw StatusError(std::move(result).take_status());
  return std::move(result).value();
}

// strata.Error and a subclass per status code, and the translator.
void register_errors(py::module_ &m);

// Keyword arguments read by name and type; a keyword that no read asked for
// is refused, naming the keywords `what` takes. Wrong types and unknown
// keywords are TypeErrors, as Python's own calls make them.
class Keywords {
public:
  Keywords(const py::kwargs &kwargs, std::string what) : kwargs_(kwargs), what_(std::move(what)) {}
  // Each leaves `value` as it is when the keyword is absent or None.
  void read(const char *name, bool &value);
  void read(const char *name, int64_t &value);
  void read(const char *name, uint64_t &value);
  void read(const char *name, double &value);
  void read(const char *name, std::string &value); // a str, or an os.PathLike
  void read(const char *name, std::vector<std::string> &value);
  // The keyword's object (None when absent).
  py::object get(const char *name);
  // Refuses every keyword not read.
  void finish() const;
  // The TypeError of keyword `name` given `value` (or holding it) where it
  // takes `expected`: "<what>: <name> must be <expected>, not <type>".
  py::type_error wrong_type(const char *name, py::handle value, const char *expected) const;

private:
  std::optional<py::object> find(const char *name);
  const py::kwargs &kwargs_;
  std::string what_;
  std::set<std::string> known_;
};

// A path argument: a str or an os.PathLike, as text.
std::string path_text(py::handle path);

// A backend= argument, 'cpu' or 'cuda'; any other is an InvalidArgumentError.
runtime::Backend backend_of(const std::string &name);

// ---------------------------------------------------------------------------
// arrays.cc

// Bytes of inputs copied on their way into strata (arrays that could not be
// read in place), since the module was loaded.
int64_t input_bytes_copied();

// `value` (a NumPy array, a PyTorch tensor, or anything numpy.asarray
// reads) as the value of input `name` of `type`. Errors name the input.
HostTensor to_host_tensor(py::handle value, const std::string &name, const TensorType &type);
// The inputs of a run whose graph inputs are `names` and whose step takes
// `types` of them: a dict by input name, a list or tuple in input order, or
// one array for a graph of one input.
std::vector<HostTensor> to_batch(py::handle batch, const std::vector<std::string> &names,
                                 const std::vector<TensorType> &types);
// A NumPy array over the tensor's bytes, which it keeps alive (bf16: a
// float32 copy, NumPy having no bfloat16).
py::array to_array(const HostTensor &tensor);
// {name: array} of `tensors`.
py::dict to_array_dict(const std::map<std::string, HostTensor> &tensors);
// {"name", "dtype", "shape"} of a tensor, and a list of those for `ids`.
py::dict tensor_info(const std::string &name, const TensorType &type);
py::list tensor_infos(const Graph &graph, llvm::ArrayRef<TensorId> ids);
// Python objects (dict, list, ...) from JSON text.
py::object parse_json(const std::string &text);

// ---------------------------------------------------------------------------
// model.cc

// A graph's forward runner, made at its first run and kept for the next.
struct ForwardRunner {
  std::unique_ptr<runtime::StepRunner> runner;
  runtime::Backend backend = runtime::Backend::kCpu;
  std::mutex running;
};

struct Model {
  Graph graph;
  std::string source; // the file it was read from; empty when made here
  ForwardRunner forward;
};

void register_model(py::module_ &m);

// ---------------------------------------------------------------------------
// plan.cc

struct PlanHandle {
  serialization::Plan plan;
  std::string source;                            // the file it was read from or compiled from
  std::string folder = ".";                      // where the graph's external data paths start
  std::optional<partitioner::AutoResult> search; // compiled with auto=True
  ForwardRunner forward;                         // inference plans
};

// Loads and verifies a plan file.
std::unique_ptr<PlanHandle> load_plan(const std::string &path);

// Runs `graph` forward once on `inputs` (None: random inputs drawn from
// `seed`) with `forward`'s runner, made for `options` if it has none or
// another backend. Returns {output name: array}.
py::dict run_forward(ForwardRunner &forward, const Graph &graph,
                     const runtime::RunnerOptions &options, py::handle inputs, uint64_t seed);

void register_plan(py::module_ &m);

// ---------------------------------------------------------------------------
// trainer.cc

// A training run of a plan: the runtime's Trainer, the checkpoint folder it
// holds and saves into, and the types of the batch one step takes.
struct TrainerHandle {
  std::unique_ptr<runtime::Trainer> trainer; // null once closed
  std::optional<serialization::CheckpointLock> lock;
  std::string source;                   // the plan's file, named in errors
  std::string fingerprint;              // the plan's, which its checkpoints carry
  std::string checkpoint;               // folder saved into; empty: none
  int64_t checkpoint_every = 0;         // also save every this many steps
  int64_t saved_step = -1;              // the step of the last save into `checkpoint`
  std::vector<std::string> input_names; // the graph inputs, in order
  std::vector<TensorType> batch_types;  // what one step takes of each
  std::mutex running;
};

// A trainer of a training plan; `kwargs` as Plan.trainer takes them.
std::unique_ptr<TrainerHandle> make_trainer(const PlanHandle &plan, const py::kwargs &kwargs);

void register_trainer(py::module_ &m);

} // namespace strata::python
