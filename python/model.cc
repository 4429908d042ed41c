// Models: loaded, imported from ONNX or built by the zoo; inspected, saved,
// run and compiled into plans.
#include <limits>

#include "python/module.h"
#include "serialization/model_io.h"
#include "serialization/onnx_import.h"
#include "tools/compile_model.h"
#include "tools/inspect_json.h"
#include "tools/model_files.h"
#include "tools/model_stats.h"
#include "tools/zoo.h"

namespace strata::python {
namespace {

std::unique_ptr<Model> model_of(Graph graph, std::string source) {
  auto model = std::make_unique<Model>();
  model->graph = std::move(graph);
  model->source = std::move(source);
  return model;
}

// What errors and plans call a model: its file, else its name.
std::string model_source(const Model &model) {
  if (!model.source.empty()) return model.source;
  return model.graph.name().empty() ? std::string("the model") : model.graph.name();
}

std::unique_ptr<Model> load_model(py::handle path_arg) {
  const std::string path = path_text(path_arg);
  Result<Graph> graph = [&]() -> Result<Graph> {
    py::gil_scoped_release release;
    return tools::load_model_file(path);
  }();
  return model_of(value_or_throw(std::move(graph)), path);
}

// strata.load: a plan file as a Plan, any other as a Model.
py::object load_any(py::handle path_arg) {
  const std::string path = path_text(path_arg);
  if (serialization::file_is_plan(path)) return py::cast(load_plan(path));
  return py::cast(load_model(path_arg));
}

// `item` (of a list or tuple a keyword takes) as an integer; nullopt for
// bools, floats and whatever else is not an integer within int64.
std::optional<int64_t> as_integer(py::handle item) {
  if (PyBool_Check(item.ptr()) || PyFloat_Check(item.ptr())) return std::nullopt;
  try {
    return item.cast<int64_t>();
  } catch (const py::cast_error &) {
    return std::nullopt;
  }
}

// An input shape for import_onnx: "1x3x224x224" or a sequence of dims.
std::vector<int64_t> dims_of(py::handle value, const std::string &name) {
  if (py::isinstance<py::str>(value)) {
    Result<Shape> shape = parse_shape(value.cast<std::string>());
    if (!shape.is_ok())
      throw StatusError(shape.status().with_context(str_cat("input_shapes['", name, "']")));
    return std::vector<int64_t>(shape->begin(), shape->end());
  }
  auto wrong_type = [&](py::handle given) {
    return py::type_error(str_cat("import_onnx: input_shapes['", name,
                                  "'] must be 'd0xd1x...' or a sequence of integers, not ",
                                  Py_TYPE(given.ptr())->tp_name));
  };
  if (!py::isinstance<py::iterable>(value)) throw wrong_type(value);
  std::vector<int64_t> dims;
  for (py::handle dim : value) {
    const std::optional<int64_t> given = as_integer(dim);
    if (!given) throw wrong_type(dim);
    const int64_t d = *given;
    if (d < 0)
      throw StatusError(invalid_argument("input_shapes['", name, "']: dims are counts, got ", d));
    dims.push_back(d);
  }
  return dims;
}

std::unique_ptr<Model> import_onnx(py::handle path_arg, py::handle shapes, py::handle constants) {
  const std::string path = path_text(path_arg);
  serialization::OnnxImportOptions options;
  if (!shapes.is_none()) {
    if (!py::isinstance<py::dict>(shapes))
      throw py::type_error("import_onnx: input_shapes is a dict {input name: shape}");
    for (auto item : py::reinterpret_borrow<py::dict>(shapes)) {
      const std::string name = py::str(item.first);
      options.input_shapes[name] = dims_of(item.second, name);
    }
  }
  if (!constants.is_none()) {
    // A str is iterable too, but as its characters.
    if (py::isinstance<py::str>(constants) || !py::isinstance<py::iterable>(constants))
      throw py::type_error(str_cat("import_onnx: constants takes a list of names, not ",
                                   Py_TYPE(constants.ptr())->tp_name));
    for (py::handle name : constants)
      options.constants.insert(std::string(py::str(name)));
  }
  std::vector<std::string> warnings, external_files;
  Result<Graph> graph = [&]() -> Result<Graph> {
    py::gil_scoped_release release;
    return serialization::import_onnx(path, options, &warnings, &external_files);
  }();
  std::unique_ptr<Model> model = model_of(value_or_throw(std::move(graph)), path);
  for (const std::string &warning : warnings)
    if (PyErr_WarnEx(PyExc_UserWarning, str_cat(path, ": ", warning).c_str(), 1) != 0)
      throw py::error_already_set();
  return model;
}

// A size of a zoo model: within int32, as `strata zoo` takes it.
int64_t zoo_size(Keywords &keywords, const char *name, int64_t value, int64_t low = 1,
                 int64_t high = std::numeric_limits<int32_t>::max()) {
  keywords.read(name, value);
  if (value < low || value > high)
    throw StatusError(
        invalid_argument(name, " must be between ", low, " and ", high, ", got ", value));
  return value;
}

std::vector<int64_t> zoo_sizes(Keywords &keywords, const char *name, std::vector<int64_t> sizes) {
  py::object given = keywords.get(name);
  if (given.is_none()) return sizes;
  if (py::isinstance<py::str>(given) || !py::isinstance<py::iterable>(given))
    throw keywords.wrong_type(name, given, "a list of integers");
  sizes.clear();
  for (py::handle size : given) {
    const std::optional<int64_t> integer = as_integer(size);
    if (!integer) throw keywords.wrong_type(name, size, "a list of integers");
    const int64_t value = *integer;
    if (value < 1 || value > std::numeric_limits<int32_t>::max())
      throw StatusError(invalid_argument(name, " holds sizes from 1 to ",
                                         std::numeric_limits<int32_t>::max(), ", got ", value));
    sizes.push_back(value);
  }
  return sizes;
}

std::unique_ptr<Model> zoo_mlp(const py::kwargs &kwargs) {
  Keywords keywords(kwargs, "strata.zoo.mlp()");
  zoo::MlpOptions options;
  options.batch = zoo_size(keywords, "batch", options.batch);
  options.input = zoo_size(keywords, "input", options.input);
  options.hidden = zoo_sizes(keywords, "hidden", options.hidden);
  options.classes = zoo_size(keywords, "classes", options.classes);
  keywords.read("seed", options.seed);
  keywords.finish();
  return model_of(value_or_throw(zoo::make_mlp(options)), "");
}

std::unique_ptr<Model> zoo_convnet(const py::kwargs &kwargs) {
  Keywords keywords(kwargs, "strata.zoo.convnet()");
  zoo::ConvnetOptions options;
  options.batch = zoo_size(keywords, "batch", options.batch);
  options.in_channels = zoo_size(keywords, "in_channels", options.in_channels);
  options.image_size = zoo_size(keywords, "image_size", options.image_size);
  options.channels = zoo_sizes(keywords, "channels", options.channels);
  options.fc_hidden = zoo_size(keywords, "fc_hidden", options.fc_hidden, 0);
  options.classes = zoo_size(keywords, "classes", options.classes);
  keywords.read("seed", options.seed);
  keywords.finish();
  return model_of(value_or_throw(zoo::make_convnet(options)), "");
}

std::unique_ptr<Model> zoo_gpt(const py::kwargs &kwargs) {
  Keywords keywords(kwargs, "strata.zoo.gpt()");
  zoo::GptOptions options;
  options.layers = zoo_size(keywords, "layers", options.layers, 1, 4096);
  options.hidden = zoo_size(keywords, "hidden", options.hidden);
  options.heads = zoo_size(keywords, "heads", options.heads);
  options.seq = zoo_size(keywords, "seq", options.seq, 1, zoo::kMaxGptSeq);
  options.vocab = zoo_size(keywords, "vocab", options.vocab);
  options.batch = zoo_size(keywords, "batch", options.batch);
  keywords.read("init_std", options.init_std);
  keywords.read("seed", options.seed);
  keywords.finish();
  return model_of(value_or_throw(zoo::make_gpt(options)), "");
}

// mesh=: "DPxTPxPP" or (DP, TP, PP).
std::string mesh_text(const Keywords &keywords, py::handle mesh) {
  constexpr const char *kExpected = "'DPxTPxPP' or a tuple of integers (DP, TP, PP)";
  if (py::isinstance<py::str>(mesh)) return mesh.cast<std::string>();
  if (!py::isinstance<py::tuple>(mesh) && !py::isinstance<py::list>(mesh))
    throw keywords.wrong_type("mesh", mesh, kExpected);
  std::string text;
  for (py::handle size : mesh) {
    const std::optional<int64_t> integer = as_integer(size);
    if (!integer) throw keywords.wrong_type("mesh", size, kExpected);
    text += str_cat(text.empty() ? "" : "x", *integer);
  }
  return text;
}

// What `strata compile`'s option parser refuses before the compiler sees the
// options: ranges, and options that need --train or exclude --auto.
void check_compile_options(const tools::CompileOptions &o, const py::kwargs &kwargs) {
  auto given = [&](const char *name) {
    if (!kwargs.contains(name)) return false;
    py::object value = kwargs[name];
    return !value.is_none();
  };
  for (const char *name : {"loss", "optimizer"})
    if (given(name) && !o.train)
      throw StatusError(invalid_argument(name, "= is for a training plan; add train=True"));
  if (given("microbatches") && (o.microbatches < 1 || o.microbatches > 1 << 20))
    throw StatusError(
        invalid_argument("microbatches must be between 1 and 1048576, got ", o.microbatches));
  if (given("chunks") && (o.chunks < 2 || o.chunks > 1024))
    throw StatusError(invalid_argument("chunks must be between 2 and 1024, got ", o.chunks));
  if (o.zero < 0 || o.zero > 3)
    throw StatusError(
        invalid_argument("zero is 0, 1 (ZeRO-1), 2 (ZeRO-2) or 3 (ZeRO-3), got ", o.zero));
  if (given("devices") && !o.auto_plan)
    throw StatusError(invalid_argument("devices= is the device count auto=True searches for; "
                                       "add auto=True, or give mesh="));
  if (given("devices") && (o.devices < 1 || o.devices > tools::kMaxDevices))
    throw StatusError(invalid_argument("devices must be between 1 and ", tools::kMaxDevices,
                                       ", got ", o.devices));
  if (!o.auto_plan) return;
  for (const char *name :
       {"mesh", "microbatches", "schedule", "stage_boundaries", "chunks", "recompute"})
    if (given(name))
      throw StatusError(invalid_argument("auto=True searches the mesh, micro-batches, schedule "
                                         "and recomputation itself; drop ",
                                         name, "="));
}

tools::CompileOptions compile_options(const py::kwargs &kwargs) {
  tools::CompileOptions o;
  Keywords keywords(kwargs, "Model.compile()");
  keywords.read("train", o.train);
  keywords.read("loss", o.loss);
  keywords.read("optimizer", o.optimizer);
  keywords.read("loss_input", o.output_tensor);
  if (py::object mesh = keywords.get("mesh"); !mesh.is_none()) o.mesh = mesh_text(keywords, mesh);
  keywords.read("microbatches", o.microbatches);
  keywords.read("schedule", o.schedule);
  keywords.read("chunks", o.chunks);
  keywords.read("cluster", o.cluster);
  keywords.read("stage_boundaries", o.stage_boundaries);
  keywords.read("profile", o.profile);
  keywords.read("zero", o.zero);
  bool prefetch = true;
  keywords.read("prefetch", prefetch);
  o.no_prefetch = !prefetch;
  keywords.read("bucket_mb", o.bucket_mb);
  keywords.read("recompute", o.recompute);
  keywords.read("split_activations", o.split_activations);
  keywords.read("auto", o.auto_plan);
  keywords.read("devices", o.devices);
  keywords.finish();
  check_compile_options(o, kwargs);
  return o;
}

std::unique_ptr<PlanHandle> compile(const Model &model, const py::kwargs &kwargs) {
  const tools::CompileOptions options = compile_options(kwargs);
  const std::string source = model_source(model);
  Result<tools::CompiledModel> compiled = [&]() -> Result<tools::CompiledModel> {
    py::gil_scoped_release release;
    return tools::compile_model(model.graph, options, source);
  }();
  tools::CompiledModel result = value_or_throw(std::move(compiled));
  auto plan = std::make_unique<PlanHandle>();
  plan->plan = std::move(result.plan);
  plan->search = std::move(result.search);
  plan->source = source;
  plan->folder = model.source.empty() ? std::string(".") : tools::folder_of(model.source);
  return plan;
}

py::object inspect(const Model &model) {
  std::string text;
  const Status status = [&]() -> Status {
    py::gil_scoped_release release;
    Result<tools::ModelStats> stats = tools::compute_model_stats(model.graph);
    if (!stats.is_ok()) return stats.status().with_context(model_source(model));
    const std::optional<passes::MemoryPlan> activations = tools::plan_activations(model.graph);
    text = tools::model_json(model.source, model.graph, *stats, activations)
               .dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    return Status::ok();
  }();
  check(status);
  return parse_json(text);
}

py::dict run(Model &model, py::handle inputs, uint64_t seed, const std::string &backend) {
  runtime::RunnerOptions options;
  options.backend = backend_of(backend);
  options.model_dir = model.source.empty() ? std::string(".") : tools::folder_of(model.source);
  options.source = model_source(model);
  return run_forward(model.forward, model.graph, options, inputs, seed);
}

std::string repr(const Model &model) {
  const Graph &g = model.graph;
  return str_cat("<strata.Model '", g.name(), "'",
                 model.source.empty() ? std::string() : str_cat(" from ", model.source), ": ",
                 g.inputs().size(), " input", g.inputs().size() == 1 ? "" : "s", ", ",
                 g.outputs().size(), " output", g.outputs().size() == 1 ? "" : "s", ", ",
                 tools::grouped(g.num_parameters()), " parameters>");
}

} // namespace

void register_model(py::module_ &m) {
  py::class_<Model>(m, "Model", py::dynamic_attr(),
                    "A model: a graph of ops with its weights (or their initializers).")
      .def_property_readonly("name", [](const Model &model) { return model.graph.name(); })
      .def_property_readonly(
          "source", [](const Model &model) { return model.source; },
          "The file it was read from ('' when built here).")
      .def_property_readonly(
          "inputs",
          [](const Model &model) { return tensor_infos(model.graph, model.graph.inputs()); },
          "[{'name', 'dtype', 'shape'}] of the graph inputs, in order.")
      .def_property_readonly(
          "outputs",
          [](const Model &model) { return tensor_infos(model.graph, model.graph.outputs()); })
      .def_property_readonly(
          "parameters", [](const Model &model) { return model.graph.num_parameters(); },
          "Elements of all parameter tensors.")
      .def("inspect", &inspect,
           "What `strata inspect MODEL --format json` prints, as Python objects: inputs, "
           "outputs, parameters, FLOPs and bytes per forward, activation memory, per op type "
           "and per node.")
      .def(
          "to_json",
          [](const Model &model) {
            return parse_json(value_or_throw(serialization::model_to_json(model.graph)));
          },
          "The model's JSON form (docs/formats.md) as Python objects.")
      .def(
          "save",
          [](const Model &model, py::handle path_arg) {
            const std::string path = path_text(path_arg);
            py::gil_scoped_release release;
            check(serialization::save_model(model.graph, path));
          },
          py::arg("path"), "Writes the model: .strata (binary) or .json (text).")
      .def("run", &run, py::arg("inputs") = py::none(), py::kw_only(), py::arg("seed") = 0,
           py::arg("backend") = "cpu",
           "Runs the model forward once. inputs: a dict {name: array}, a list in input order, "
           "or one array; None draws random inputs from seed. Returns {output name: array}. "
           "Arrays of the input's dtype, C-contiguous and 64-byte aligned are read in place: "
           "no other thread may change them until run() returns.")
      .def("compile", &compile,
           "Compiles the model into a Plan, as `strata compile` does with the options of the "
           "same names: train, loss, optimizer, loss_input, mesh ('DPxTPxPP' or a tuple), "
           "microbatches, schedule, chunks, cluster (a spec file), stage_boundaries, zero, "
           "prefetch (False: --no-prefetch), bucket_mb, recompute, split_activations, profile, "
           "auto, devices.")
      .def("__repr__", &repr);

  m.def("load", &load_any, py::arg("path"),
        "Loads a model (.strata, .json) as a Model or a plan (.splan, .splan.json) as a Plan, "
        "verified as `strata` verifies them.");
  m.def("load_model", &load_model, py::arg("path"));
  m.def("import_onnx", &import_onnx, py::arg("path"), py::kw_only(),
        py::arg("input_shapes") = py::none(), py::arg("constants") = py::none(),
        "Imports an ONNX model as `strata import` does. input_shapes fixes dynamic dims: "
        "{input name: (d0, d1, ...) or 'd0xd1x...'}; constants names floating initializers to "
        "keep as constants rather than weights. Warnings become Python warnings.");

  py::module_ zoo_module = m.def_submodule("zoo", "The model zoo of `strata zoo`.");
  zoo_module.def(
      "mlp", &zoo_mlp,
      "x f32[batch, input] -> (Gemm + Relu) per hidden layer -> Gemm -> logits. Keywords: "
      "batch, input, hidden (a list of widths), classes, seed.");
  zoo_module.def(
      "convnet", &zoo_convnet,
      "A small CNN. Keywords: batch, in_channels, image_size, channels, fc_hidden, classes, "
      "seed.");
  zoo_module.def(
      "gpt", &zoo_gpt,
      "A GPT-2 style decoder. Keywords: layers, hidden, heads, seq, vocab, batch, init_std, "
      "seed.");
}

} // namespace strata::python
