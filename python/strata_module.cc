// The extension module strata._strata (python/module.h says what is where);
// python/strata/__init__.py re-exports it and adds the PyTorch helpers.
#include "python/module.h"
#include "serialization/onnx_import.h"

PYBIND11_MODULE(_strata, m) {
  namespace python = strata::python;
  m.doc() = "strata: models, plans and training from Python (see `help(strata)`).";
  m.attr("__version__") = STRATA_VERSION;
  m.attr("onnx_import_built") = strata::serialization::onnx_import_built();
  python::register_errors(m);
  python::register_model(m);
  python::register_plan(m);
  python::register_trainer(m);
  m.def("_input_bytes_copied", &python::input_bytes_copied,
        "Bytes of inputs copied on their way into strata since the module loaded (inputs "
        "read in place add nothing); for tests of zero copy.");
}
