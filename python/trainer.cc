// Training runs of a plan: steps on given or own batches, the weights and
// optimizer state, checkpoints.
#include <filesystem>
#include <iterator>
#include <limits>

#include "plan/checkpoint_layout.h"
#include "python/module.h"
#include "tools/training_setup.h"

namespace strata::python {
namespace {

using serialization::Plan;

// Plan.trainer's keywords, as errors about the runner's GPU options name them.
constexpr runtime::RunnerOptionNames kRunnerKeywords{"gpu=", "gpus=", "backend='cuda'"};

// Runs `body` on the open trainer with the GIL released and the trainer's
// lock held: one call at a time, however many Python threads share it.
template <typename Body> Status with_trainer(TrainerHandle &t, Body &&body) {
  py::gil_scoped_release release;
  std::lock_guard<std::mutex> running(t.running);
  if (!t.trainer) return failed_precondition("this trainer of ", t.source, " is closed");
  return body(*t.trainer);
}

bool same_folder(const std::string &a, const std::string &b) {
  if (a.empty() || b.empty()) return false;
  std::error_code error;
  return a == b || std::filesystem::equivalent(a, b, error);
}

// Refuses to save into `dir`, a folder other than the trainer's own, over a
// checkpoint that another plan wrote (or one whose manifest cannot be read);
// this plan's checkpoint there may be replaced.
Status check_replaceable(const TrainerHandle &t, const std::string &dir) {
  if (!tools::holds_checkpoint(dir)) return Status::ok();
  Result<std::string> fingerprint = serialization::read_checkpoint_fingerprint(dir);
  if (!fingerprint.is_ok())
    return fingerprint.status().with_context(
        str_cat("save(): ", dir, " holds a checkpoint, which this save would replace"));
  if (*fingerprint == t.fingerprint) return Status::ok();
  return failed_precondition("save(): ", dir, " holds a checkpoint of another plan (fingerprint ",
                             fingerprint->substr(0, 16), "..., this plan's ",
                             t.fingerprint.substr(0, 16),
                             "...), which this save would replace; save to another folder");
}

// Saves a checkpoint into `dir`: the trainer's own folder, which it holds, or
// another, held for this save.
Status save_into(TrainerHandle &t, const std::string &dir) {
  if (!same_folder(dir, t.checkpoint)) {
    ASSIGN_OR_RETURN(serialization::CheckpointLock lock,
                     serialization::CheckpointLock::acquire(dir));
    RETURN_IF_ERROR(check_replaceable(t, dir));
    return t.trainer->save_checkpoint(dir);
  }
  RETURN_IF_ERROR(t.trainer->save_checkpoint(dir));
  t.saved_step = t.trainer->step();
  return Status::ok();
}

// The run's settings from Plan.trainer's keywords.
struct TrainerSettings {
  std::string checkpoint, resume, data;
  int64_t checkpoint_every = 0;
  uint64_t seed = 0;
  runtime::RunnerOptions runner;
  double timeout_s = 30;
};

TrainerSettings trainer_settings(const PlanHandle &handle, const py::kwargs &kwargs) {
  TrainerSettings s;
  std::string backend = "cpu";
  int64_t gpu = 0;
  Keywords keywords(kwargs, "Plan.trainer()");
  keywords.read("checkpoint", s.checkpoint);
  keywords.read("resume", s.resume);
  keywords.read("checkpoint_every", s.checkpoint_every);
  keywords.read("data", s.data);
  keywords.read("seed", s.seed);
  keywords.read("backend", backend);
  keywords.read("gpu", gpu);
  keywords.read("gpus", s.runner.gpus);
  keywords.read("timeout", s.timeout_s);
  keywords.finish();
  if (handle.plan.mode != Plan::Mode::kTrain)
    throw StatusError(failed_precondition(handle.source, " is an inference plan; compile the "
                                                         "model with train=True to train it"));
  if (s.checkpoint_every < 0)
    throw StatusError(invalid_argument("checkpoint_every must be at least 0"));
  if (s.checkpoint_every > 0 && s.checkpoint.empty())
    throw StatusError(invalid_argument("checkpoint_every needs checkpoint=FOLDER"));
  s.runner.backend = backend_of(backend);
  if (gpu < 0 || gpu > std::numeric_limits<int>::max())
    throw StatusError(invalid_argument("gpu is a CUDA device ordinal, got ", gpu));
  s.runner.gpu = static_cast<int>(gpu);
  s.runner.model_dir = handle.folder;
  s.runner.source = handle.source;
  return s;
}

double step(TrainerHandle &t, py::handle batch) {
  const bool given = !batch.is_none();
  std::vector<HostTensor> tensors;
  if (given) tensors = to_batch(batch, t.input_names, t.batch_types);
  double loss = 0;
  const Status status = with_trainer(t, [&](runtime::Trainer &trainer) -> Status {
    ASSIGN_OR_RETURN(loss, given ? trainer.train_step(tensors) : trainer.train_step());
    if (t.checkpoint_every == 0 || trainer.step() % t.checkpoint_every != 0) return Status::ok();
    // The step stands (step_count counts it) though its loss is not returned.
    const Status saved = save_into(t, t.checkpoint);
    if (saved.is_ok()) return saved;
    return saved.with_context(str_cat("step ", trainer.step(), " trained (loss ", loss,
                                      ") but its checkpoint save failed"));
  });
  tensors.clear(); // arrays read in place are let go under the GIL
  check(status);
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  return loss;
}

// Every parameter and state tensor, or only the parameters, as arrays.
py::dict values(TrainerHandle &t, bool parameters_only) {
  std::map<std::string, HostTensor> tensors;
  check(with_trainer(t, [&](runtime::Trainer &trainer) -> Status {
    tensors = trainer.state();
    RETURN_IF_ERROR(trainer.runner().read_status());
    const Graph &graph = trainer.runner().graph();
    for (auto it = tensors.begin(); parameters_only && it != tensors.end();) {
      const std::optional<TensorId> id = graph.find_tensor(it->first);
      const bool parameter = id && graph.tensor(*id).kind == TensorKind::kParameter;
      it = parameter ? std::next(it) : tensors.erase(it);
    }
    return Status::ok();
  }));
  return to_array_dict(tensors);
}

void save_checkpoint(TrainerHandle &t, py::handle path) {
  const std::string dir = path.is_none() ? t.checkpoint : path_text(path);
  if (dir.empty())
    throw StatusError(
        invalid_argument("save() needs a folder: save(path), or plan.trainer(checkpoint=FOLDER)"));
  check(with_trainer(t, [&](runtime::Trainer &) { return save_into(t, dir); }));
}

void restore(TrainerHandle &t, py::handle path) {
  const std::string dir = path_text(path);
  check(with_trainer(t, [&](runtime::Trainer &trainer) -> Status {
    RETURN_IF_ERROR(trainer.restore_checkpoint(dir));
    if (same_folder(dir, t.checkpoint)) t.saved_step = trainer.step();
    return Status::ok();
  }));
}

// Ends the run: with `save_last`, the steps since the last save are saved
// first (a failed save leaves the trainer open); the runner and the
// checkpoint folder are let go.
void close_trainer(TrainerHandle &t, bool save_last) {
  const Status status = [&]() -> Status {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> running(t.running);
    if (!t.trainer) return Status::ok();
    if (save_last && !t.checkpoint.empty() && t.trainer->step() != t.saved_step)
      RETURN_IF_ERROR(save_into(t, t.checkpoint));
    t.trainer.reset();
    t.lock.reset();
    return Status::ok();
  }();
  check(status);
}

// A property of the open trainer.
template <typename T, typename Get> T read_property(TrainerHandle &t, Get get) {
  T value{};
  check(with_trainer(t, [&](runtime::Trainer &trainer) {
    value = get(trainer);
    return Status::ok();
  }));
  return value;
}

// A field of the handle that calls change under its lock (close, saves),
// read under that lock; unlike read_property, also once the trainer is closed.
template <typename Get> auto read_field(TrainerHandle &t, Get get) {
  py::gil_scoped_release release;
  std::lock_guard<std::mutex> running(t.running);
  return get(static_cast<const TrainerHandle &>(t));
}

py::dict read_checkpoint(py::handle path) {
  const std::string dir = path_text(path);
  Result<serialization::Checkpoint> checkpoint = [&]() -> Result<serialization::Checkpoint> {
    py::gil_scoped_release release;
    ASSIGN_OR_RETURN(serialization::Checkpoint read, serialization::read_checkpoint(dir, ""));
    // Pieces of several ranks joined by the layout record: every tensor whole.
    if (!read.layout.empty()) RETURN_IF_ERROR(plan::join_checkpoint(read, read.layout, dir));
    return read;
  }();
  const serialization::Checkpoint loaded = value_or_throw(std::move(checkpoint));
  py::dict result;
  result["step"] = loaded.step;
  result["fingerprint"] = loaded.fingerprint;
  result["ranks"] = loaded.ranks;
  if (!loaded.layout.empty()) {
    result["layout"] = loaded.layout.description;
    result["model"] = loaded.layout.model;
    result["optimizer"] = loaded.layout.optimizer;
  }
  result["tensors"] = to_array_dict(loaded.tensors);
  return result;
}

constexpr char kTrainerDoc[] =
    "A training run of a plan. step(batch) trains one step and returns its loss; fit() "
    "runs many (from an iterable of batches such as a PyTorch DataLoader); weights() and "
    "state() are NumPy copies of the parameters and of all state; state_dict() is for "
    "torch's load_state_dict. With checkpoint=FOLDER, save() saves there, as do close() "
    "and the end of a `with` block (also after Ctrl-C), and every checkpoint_every steps.";

} // namespace

std::unique_ptr<TrainerHandle> make_trainer(const PlanHandle &handle, const py::kwargs &kwargs) {
  TrainerSettings s = trainer_settings(handle, kwargs);
  const Plan &plan = handle.plan;
  auto t = std::make_unique<TrainerHandle>();
  t->source = handle.source;
  t->fingerprint = plan.fingerprint;
  t->checkpoint = s.checkpoint;
  t->checkpoint_every = s.checkpoint_every;
  const Status status = [&]() -> Status {
    py::gil_scoped_release release;
    RETURN_IF_ERROR(runtime::check_runner_options(plan, s.runner, kRunnerKeywords));
    ASSIGN_OR_RETURN(s.runner.timeout, runtime::timeout_from_seconds(s.timeout_s, "timeout="));
    // The data and the runner first, as `strata run` does: a trainer refused
    // for them leaves no checkpoint folder behind.
    ASSIGN_OR_RETURN(runtime::Dataset data, tools::training_data(plan, s.data, s.seed));
    ASSIGN_OR_RETURN(std::unique_ptr<runtime::StepRunner> runner,
                     runtime::make_runner(plan, s.runner, kRunnerKeywords));
    ASSIGN_OR_RETURN(t->lock, tools::claim_checkpoint_folder(s.checkpoint, s.resume, 0,
                                                             "checkpoint=", "resume="));
    t->batch_types = runner->batch_types();
    for (TensorId id : runner->graph().inputs())
      t->input_names.push_back(runner->graph().tensor(id).name);
    runtime::TrainerOptions options;
    options.model_dir = handle.folder;
    options.fingerprint = plan.fingerprint;
    options.layout = plan::checkpoint_layout(plan, plan::layout_description(plan, 1));
    auto created = runtime::Trainer::create(std::move(runner), plan.loss, std::move(data), options);
    if (!created.is_ok()) return created.status().with_context(handle.source);
    t->trainer = std::move(created).value();
    if (s.resume.empty()) return Status::ok();
    RETURN_IF_ERROR(t->trainer->restore_checkpoint(s.resume));
    if (same_folder(s.resume, s.checkpoint)) t->saved_step = t->trainer->step();
    return Status::ok();
  }();
  check(status);
  return t;
}

void register_trainer(py::module_ &m) {
  py::class_<TrainerHandle>(m, "Trainer", py::dynamic_attr(), kTrainerDoc)
      .def("step", &step, py::arg("batch") = py::none(),
           "Trains one step and returns its loss. batch: a dict {input name: array}, a list "
           "or tuple in input order (x, labels), or one array; NumPy arrays or PyTorch "
           "tensors, of the shapes in `batch`. None: the trainer's own next batch (its data "
           "folder, or synthetic batches). Arrays of the input's dtype, C-contiguous and "
           "64-byte aligned are read in place: no other thread may change them until step() "
           "returns.")
      .def(
          "weights", [](TrainerHandle &t) { return values(t, true); },
          "{name: array} of the parameters, copies taken now.")
      .def(
          "state", [](TrainerHandle &t) { return values(t, false); },
          "{name: array} of every parameter and state tensor (optimizer moments, "
          "'optimizer.step'): what a checkpoint holds.")
      .def("save", &save_checkpoint, py::arg("path") = py::none(),
           "Saves a checkpoint into path (default: the trainer's checkpoint folder). A "
           "folder holding a checkpoint of another plan is refused.")
      .def("restore", &restore, py::arg("path"),
           "Restores the weights, state and step count from a checkpoint of this plan.")
      .def("close", &close_trainer, py::kw_only(), py::arg("save") = true,
           "Saves the steps since the last save into the checkpoint folder (unless "
           "save=False), then lets go of the devices and the folder.")
      .def(
          "__enter__", [](TrainerHandle &t) -> TrainerHandle & { return t; },
          py::return_value_policy::reference)
      .def("__exit__",
           [](TrainerHandle &t, py::handle type, py::handle, py::handle) {
             const bool interrupted =
                 !type.is_none() && PyObject_IsSubclass(type.ptr(), PyExc_KeyboardInterrupt) == 1;
             close_trainer(t, type.is_none() || interrupted);
             return false;
           })
      .def_property_readonly(
          "step_count",
          [](TrainerHandle &t) {
            return read_property<int64_t>(t,
                                          [](runtime::Trainer &trainer) { return trainer.step(); });
          },
          "Steps done, counting those of a resumed checkpoint.")
      .def_property_readonly(
          "num_batches",
          [](TrainerHandle &t) {
            return read_property<int64_t>(
                t, [](runtime::Trainer &trainer) { return trainer.num_batches(); });
          },
          "Batches of the trainer's own data, which step() without a batch cycles through.")
      .def_property_readonly("data",
                             [](TrainerHandle &t) {
                               return read_property<std::string>(t, [](runtime::Trainer &trainer) {
                                 return trainer.data().description;
                               });
                             })
      .def_property_readonly(
          "batch",
          [](const TrainerHandle &t) {
            py::list infos;
            for (size_t i = 0; i < t.batch_types.size(); ++i)
              infos.append(tensor_info(t.input_names[i], t.batch_types[i]));
            return infos;
          },
          "The inputs one step takes: [{'name', 'dtype', 'shape'}].")
      .def_property_readonly("checkpoint", [](const TrainerHandle &t) { return t.checkpoint; })
      .def_property_readonly(
          "saved_step",
          [](TrainerHandle &t) {
            return read_field(t, [](const TrainerHandle &h) { return h.saved_step; });
          },
          "The step of the last save into the checkpoint folder (-1: none).")
      .def_property_readonly("closed", [](TrainerHandle &t) {
        return read_field(t, [](const TrainerHandle &h) { return !h.trainer; });
      });

  m.def("read_checkpoint", &read_checkpoint, py::arg("path"),
        "Reads a checkpoint folder: {'step', 'fingerprint', 'ranks', 'layout', 'model', "
        "'optimizer', 'tensors': {name: array}}, every tensor whole (the pieces of ZeRO and "
        "tensor-parallel ranks joined by the checkpoint's layout record). A checkpoint of an "
        "older strata has no record: no 'layout', 'model' or 'optimizer', tensors as stored.");
}

} // namespace strata::python
