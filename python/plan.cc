// Plans: loaded or compiled; inspected, saved, run forward (inference
// plans) or trained (training plans, through a Trainer).
#include "python/module.h"
#include "runtime/materialize.h"
#include "tools/inspect_json.h"
#include "tools/model_files.h"

namespace strata::python {
namespace {

using serialization::Plan;

// The micro-batches a pipeline step takes: every replica's.
int64_t step_microbatches(const Plan &plan) {
  return plan.pipeline ? int64_t{plan.pipeline->microbatches} * plan.pipeline->data_parallel : 1;
}

// The inputs of one whole step: the graph's, dim 0 times the micro-batches.
py::list batch_infos(const Plan &plan) {
  const std::vector<TensorType> types =
      runtime::pipeline_batch_types(plan.graph, step_microbatches(plan));
  py::list infos;
  for (size_t i = 0; i < types.size(); ++i)
    infos.append(tensor_info(plan.graph.tensor(plan.graph.inputs()[i]).name, types[i]));
  return infos;
}

py::object inspect(const PlanHandle &handle) {
  std::string text;
  const Status status = [&]() -> Status {
    py::gil_scoped_release release;
    Result<nlohmann::ordered_json> report = tools::plan_report(handle.plan, handle.source);
    if (!report.is_ok()) return report.status();
    if (handle.search) (*report)["search"] = tools::search_json(*handle.search);
    text = report->dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    return Status::ok();
  }();
  check(status);
  return parse_json(text);
}

py::object to_json(const PlanHandle &handle) {
  Result<std::string> text = [&]() -> Result<std::string> {
    py::gil_scoped_release release;
    return serialization::plan_to_json(handle.plan);
  }();
  return parse_json(value_or_throw(std::move(text)));
}

void save_plan(const PlanHandle &handle, py::handle path_arg) {
  const std::string path = path_text(path_arg);
  py::gil_scoped_release release;
  check(serialization::save_plan(handle.plan, path));
}

py::dict run(PlanHandle &handle, py::handle inputs, uint64_t seed, const std::string &backend) {
  if (handle.plan.mode == Plan::Mode::kTrain)
    throw StatusError(failed_precondition(
        handle.source, " is a training plan: train it with plan.trainer(), whose step(batch) "
                       "runs it; run() runs inference plans (compile without train=True)"));
  runtime::RunnerOptions options;
  options.backend = backend_of(backend);
  options.model_dir = handle.folder;
  options.source = handle.source;
  return run_forward(handle.forward, handle.plan.graph, options, inputs, seed);
}

std::string repr(const PlanHandle &handle) {
  const Plan &plan = handle.plan;
  std::string layout = "one device";
  if (plan.pipeline) {
    const serialization::PlanPipeline &p = *plan.pipeline;
    layout =
        str_cat("mesh ", p.data_parallel, "x", p.tensor_parallel, "x", p.stages, ", ",
                p.microbatches, " micro-batch", p.microbatches == 1 ? "" : "es", ", ", p.schedule);
  }
  return str_cat("<strata.Plan ", serialization::plan_mode_name(plan.mode), " '", plan.graph.name(),
                 "' from ", handle.source, ": ", layout, ">");
}

} // namespace

std::unique_ptr<PlanHandle> load_plan(const std::string &path) {
  Result<Plan> plan = [&]() -> Result<Plan> {
    py::gil_scoped_release release;
    return tools::load_plan_file(path);
  }();
  auto handle = std::make_unique<PlanHandle>();
  handle->plan = value_or_throw(std::move(plan));
  handle->source = path;
  handle->folder = tools::folder_of(path);
  return handle;
}

py::dict run_forward(ForwardRunner &forward, const Graph &graph,
                     const runtime::RunnerOptions &options, py::handle inputs, uint64_t seed) {
  std::vector<std::string> names;
  std::vector<TensorType> types;
  for (TensorId id : graph.inputs()) {
    names.push_back(graph.tensor(id).name);
    types.push_back(graph.tensor(id).type);
  }
  std::vector<HostTensor> tensors;
  if (!inputs.is_none()) tensors = to_batch(inputs, names, types);
  std::vector<HostTensor> outputs;
  const Status status = [&]() -> Status {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> running(forward.running);
    if (!forward.runner || forward.backend != options.backend) {
      forward.runner.reset();
      Result<std::unique_ptr<runtime::StepRunner>> made = runtime::make_runner(graph, options);
      if (!made.is_ok()) return made.status();
      forward.runner = std::move(made).value();
      forward.backend = options.backend;
    }
    if (tensors.empty() && !graph.inputs().empty()) tensors = runtime::random_inputs(graph, seed);
    return forward.runner->run(tensors, &outputs);
  }();
  tensors.clear(); // arrays read in place are let go under the GIL
  check(status);
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  py::dict results;
  for (size_t k = 0; k < outputs.size() && k < graph.outputs().size(); ++k)
    results[py::str(graph.tensor(graph.outputs()[k]).name)] = to_array(outputs[k]);
  return results;
}

void register_plan(py::module_ &m) {
  py::class_<PlanHandle>(m, "Plan", py::dynamic_attr(),
                         "A compiled plan: an inference or training step, on one device or "
                         "a mesh of them.")
      .def_property_readonly(
          "mode",
          [](const PlanHandle &h) {
            return std::string(serialization::plan_mode_name(h.plan.mode));
          },
          "'train' or 'infer'.")
      .def_property_readonly("source", [](const PlanHandle &h) { return h.source; })
      .def_property_readonly(
          "fingerprint", [](const PlanHandle &h) { return h.plan.fingerprint; },
          "SHA-256 of the model and the options; checkpoints carry it.")
      .def_property_readonly("model_fingerprint",
                             [](const PlanHandle &h) { return h.plan.model_fingerprint; })
      .def_property_readonly(
          "loss", [](const PlanHandle &h) { return h.plan.loss; },
          "The loss tensor's name ('' for an inference plan).")
      .def_property_readonly("loss_kind", [](const PlanHandle &h) { return h.plan.loss_kind; })
      .def_property_readonly("optimizer", [](const PlanHandle &h) { return h.plan.optimizer; })
      .def_property_readonly(
          "pipeline", [](const PlanHandle &h) { return h.plan.pipeline.has_value(); },
          "Whether it is a pipeline-, data- or tensor-parallel plan.")
      .def_property_readonly("devices", [](const PlanHandle &h) { return h.plan.programs.size(); })
      .def_property_readonly(
          "inputs",
          [](const PlanHandle &h) { return tensor_infos(h.plan.graph, h.plan.graph.inputs()); },
          "The graph inputs, at one micro-batch for a pipeline plan.")
      .def_property_readonly(
          "batch", [](const PlanHandle &h) { return batch_infos(h.plan); },
          "The inputs one whole step takes (what run() and a trainer's "
          "step() are given).")
      .def_property_readonly(
          "outputs",
          [](const PlanHandle &h) { return tensor_infos(h.plan.graph, h.plan.graph.outputs()); })
      .def("inspect", &inspect,
           "The plan's facts as Python objects: mode, fingerprints, loss, optimizer, inputs, "
           "the batch of a step, parameters, optimizer state, FLOPs, memory per device; for "
           "a pipeline plan its layout, predicted step and bubble, each device's stage "
           "(nodes, parameters, FLOPs, peak activations, predicted busy time, sends) and "
           "every transfer of a step with its size, count, predicted time and why "
           "(`strata inspect PLAN --comm`); with auto=True the search's candidates.")
      .def("to_json", &to_json,
           "The plan file's JSON form, what `strata inspect PLAN --format json` prints.")
      .def("save", &save_plan, py::arg("path"),
           "Writes the plan: .splan (binary) or .splan.json (text); byte-identical to "
           "`strata compile` with the same options.")
      .def("run", &run, py::arg("inputs") = py::none(), py::kw_only(), py::arg("seed") = 0,
           py::arg("backend") = "cpu",
           "Runs an inference plan once. inputs as for Model.run. Returns {output name: array}. "
           "Arrays of the input's dtype, C-contiguous and 64-byte aligned are read in place: "
           "no other thread may change them until run() returns.")
      .def("trainer", &make_trainer,
           "A Trainer of this training plan. Keywords: checkpoint (a folder to save into), "
           "resume (a checkpoint folder to start from), checkpoint_every (steps), data (a "
           "folder of <input>.npy batch stacks, as `strata run --data`), seed (of the 8 "
           "synthetic batches used without data), backend ('cpu' or 'cuda'), gpu, gpus, "
           "timeout (seconds any device waits for another).")
      .def("__repr__", &repr);

  m.def(
      "load_plan", [](py::handle path) { return load_plan(path_text(path)); }, py::arg("path"));
}

} // namespace strata::python
