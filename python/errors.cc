// strata's errors as Python exceptions, and keyword arguments read by name.
#include <algorithm>
#include <array>

#include "python/module.h"

namespace strata::python {
namespace {

// An exception class per status code, with the built-in exception a Python
// caller would catch for it (also a base where there is one).
struct ErrorClass {
  StatusCode code;
  const char *name; // "strata.<Name>"
  PyObject *builtin;
};

constexpr size_t kCodes = static_cast<size_t>(StatusCode::kInternal) + 1;
PyObject *base_error = nullptr;           // strata.Error; a reference kept for the process
std::array<PyObject *, kCodes> by_code{}; // its subclasses, by code

const char kErrorDoc[] =
    "A strata error. str(e) is strata's message, which names the file, node, tensor,\n"
    "option or rank at fault; e.code is its kind ('InvalidArgument', 'NotFound', ...).\n"
    "Each kind has a subclass (strata.InvalidArgumentError, ...), some of them also\n"
    "built-in exceptions (InvalidArgumentError is a ValueError, NotFoundError a\n"
    "LookupError, IoError an OSError, DeadlineExceededError a TimeoutError,\n"
    "UnimplementedError a NotImplementedError).";

// Raises `status` in Python: an instance of its code's class with `code` and
// `message` set.
void raise_status(const Status &status) {
  const size_t index = static_cast<size_t>(status.code());
  PyObject *type = index < kCodes && by_code[index] != nullptr ? by_code[index] : base_error;
  py::object instance = py::reinterpret_borrow<py::object>(type)(status.message());
  instance.attr("code") = std::string(status_code_name(status.code()));
  instance.attr("message") = status.message();
  PyErr_SetObject(type, instance.ptr());
}

PyObject *new_error_class(const char *name, PyObject *builtin) {
  PyObject *bases =
      builtin != nullptr ? PyTuple_Pack(2, base_error, builtin) : PyTuple_Pack(1, base_error);
  if (bases == nullptr) throw py::error_already_set();
  PyObject *type = PyErr_NewException(name, bases, nullptr);
  Py_DECREF(bases);
  if (type == nullptr) throw py::error_already_set();
  return type;
}

} // namespace

void check(const Status &status) {
  if (!status.is_ok()) throw StatusError(status);
}

void register_errors(py::module_ &m) {
  base_error = PyErr_NewExceptionWithDoc("strata.Error", kErrorDoc, PyExc_Exception, nullptr);
  if (base_error == nullptr) throw py::error_already_set();
  m.attr("Error") = py::reinterpret_borrow<py::object>(base_error);
  const ErrorClass classes[] = {
      {StatusCode::kInvalidArgument, "strata.InvalidArgumentError", PyExc_ValueError},
      {StatusCode::kNotFound, "strata.NotFoundError", PyExc_LookupError},
      {StatusCode::kAlreadyExists, "strata.AlreadyExistsError", nullptr},
      {StatusCode::kOutOfRange, "strata.OutOfRangeError", PyExc_ValueError},
      {StatusCode::kFailedPrecondition, "strata.FailedPreconditionError", nullptr},
      {StatusCode::kUnimplemented, "strata.UnimplementedError", PyExc_NotImplementedError},
      {StatusCode::kDataLoss, "strata.DataLossError", nullptr},
      {StatusCode::kIoError, "strata.IoError", PyExc_OSError},
      {StatusCode::kDeadlineExceeded, "strata.DeadlineExceededError", PyExc_TimeoutError},
      {StatusCode::kResourceExhausted, "strata.ResourceExhaustedError", nullptr},
      {StatusCode::kUnavailable, "strata.UnavailableError", nullptr},
      {StatusCode::kInternal, "strata.InternalError", nullptr},
  };
  for (const ErrorClass &c : classes) {
    PyObject *type = new_error_class(c.name, c.builtin);
    by_code[static_cast<size_t>(c.code)] = type;
    m.attr(std::string(c.name).substr(sizeof "strata." - 1).c_str()) =
        py::reinterpret_borrow<py::object>(type);
  }
  py::register_local_exception_translator([](std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const StatusError &e) {
      raise_status(e.status());
    }
  });
}

std::string path_text(py::handle path) {
  py::object text = py::module_::import("os").attr("fspath")(path);
  return text.cast<std::string>();
}

runtime::Backend backend_of(const std::string &name) {
  if (name == "cpu") return runtime::Backend::kCpu;
  if (name == "cuda") return runtime::Backend::kCuda;
  throw StatusError(invalid_argument("backend is 'cpu' or 'cuda', got '", name, "'"));
}

std::optional<py::object> Keywords::find(const char *name) {
  known_.insert(name);
  if (!kwargs_.contains(name)) return std::nullopt;
  py::object value = kwargs_[name];
  if (value.is_none()) return std::nullopt;
  return value;
}

py::type_error Keywords::wrong_type(const char *name, py::handle value,
                                    const char *expected) const {
  return py::type_error(
      str_cat(what_, ": ", name, " must be ", expected, ", not ", Py_TYPE(value.ptr())->tp_name));
}

void Keywords::read(const char *name, bool &value) {
  std::optional<py::object> found = find(name);
  if (!found) return;
  if (!py::isinstance<py::bool_>(*found)) throw wrong_type(name, *found, "True or False");
  value = found->cast<bool>();
}

void Keywords::read(const char *name, int64_t &value) {
  std::optional<py::object> found = find(name);
  if (!found) return;
  if (PyBool_Check(found->ptr()) || PyFloat_Check(found->ptr()))
    throw wrong_type(name, *found, "an integer");
  try {
    value = found->cast<int64_t>();
  } catch (const py::cast_error &) {
    throw wrong_type(name, *found, "an integer");
  }
}

void Keywords::read(const char *name, uint64_t &value) {
  std::optional<py::object> found = find(name);
  if (!found) return;
  if (PyBool_Check(found->ptr()) || PyFloat_Check(found->ptr()))
    throw wrong_type(name, *found, "an integer from 0 to 2**64 - 1");
  try {
    value = found->cast<uint64_t>();
  } catch (const py::cast_error &) {
    throw wrong_type(name, *found, "an integer from 0 to 2**64 - 1");
  }
}

void Keywords::read(const char *name, double &value) {
  std::optional<py::object> found = find(name);
  if (!found) return;
  if (PyBool_Check(found->ptr())) throw wrong_type(name, *found, "a number");
  try {
    value = found->cast<double>();
  } catch (const py::cast_error &) {
    throw wrong_type(name, *found, "a number");
  }
}

void Keywords::read(const char *name, std::string &value) {
  std::optional<py::object> found = find(name);
  if (!found) return;
  if (!py::isinstance<py::str>(*found) && !py::hasattr(*found, "__fspath__"))
    throw wrong_type(name, *found, "a str");
  value = path_text(*found);
}

void Keywords::read(const char *name, std::vector<std::string> &value) {
  std::optional<py::object> found = find(name);
  if (!found) return;
  value.clear();
  if (py::isinstance<py::str>(*found)) {
    // "a,b,c", as the command line takes it.
    const std::string text = found->cast<std::string>();
    for (size_t start = 0; start <= text.size();) {
      const size_t comma = std::min(text.find(',', start), text.size());
      value.push_back(text.substr(start, comma - start));
      start = comma + 1;
    }
    return;
  }
  if (!py::isinstance<py::list>(*found) && !py::isinstance<py::tuple>(*found))
    throw wrong_type(name, *found, "a list of str");
  for (py::handle item : *found) {
    if (!py::isinstance<py::str>(item)) throw wrong_type(name, item, "a list of str");
    value.push_back(item.cast<std::string>());
  }
}

py::object Keywords::get(const char *name) {
  std::optional<py::object> found = find(name);
  if (found) return *found;
  return py::none();
}

void Keywords::finish() const {
  for (auto item : kwargs_) {
    const std::string key = py::str(item.first);
    if (known_.count(key) != 0) continue;
    std::string names;
    for (const std::string &known : known_)
      names += str_cat(names.empty() ? "" : ", ", known);
    throw py::type_error(
        str_cat(what_, " got an unexpected keyword argument '", key, "' (it takes ", names, ")"));
  }
}

} // namespace strata::python
