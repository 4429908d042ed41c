// NumPy arrays to strata's tensors and back, copying only what must be.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <memory>

#include "python/module.h"

namespace strata::python {
namespace {

std::atomic<int64_t> copied_bytes{0};

// The NumPy dtype of a strata dtype (bf16, which NumPy lacks: float32).
py::dtype numpy_dtype(DType dtype) {
  switch (dtype) {
  case DType::kF32: return py::dtype("float32");
  case DType::kF16: return py::dtype("float16");
  case DType::kBF16: return py::dtype("float32");
  case DType::kI32: return py::dtype("int32");
  case DType::kI64: return py::dtype("int64");
  case DType::kBool: return py::dtype("bool");
  }
  return py::dtype("float32");
}

// Whether `dtype` holds exactly strata's `want`, in this machine's byte order.
bool same_layout(const py::dtype &dtype, DType want) {
  const char order = dtype.byteorder();
  const bool little = std::endian::native == std::endian::little;
  const bool native =
      order == '=' || order == '|' || (order == '<' && little) || (order == '>' && !little);
  if (!native || want == DType::kBF16) return false;
  const char kind = want == DType::kBool ? 'b' : is_floating(want) ? 'f' : 'i';
  return dtype.kind() == kind && static_cast<size_t>(dtype.itemsize()) == dtype_size(want);
}

// Whether values of NumPy kind `kind` may become `want`: numbers become
// floats, integers become integers, booleans stay booleans.
bool convertible(char kind, DType want) {
  if (want == DType::kBool) return kind == 'b';
  if (is_integer(want)) return kind == 'i' || kind == 'u';
  return kind == 'f' || kind == 'i' || kind == 'u';
}

// Refuses an integer array holding a value that the integer dtype of `type`
// cannot hold, which NumPy's conversion would wrap (uint64 to int64, int64
// to int32) into another value, even a valid one: narrowing is only taken
// for values that fit. `dtype` names the array's dtype.
void check_integer_range(const py::array &array, const std::string &name, const TensorType &type,
                         const std::string &dtype) {
  // Signed integers no wider, unsigned ones narrower: every value fits.
  const char kind = array.dtype().kind();
  const size_t from = static_cast<size_t>(array.dtype().itemsize()), to = dtype_size(type.dtype);
  if (array.size() == 0 || (kind == 'i' && from <= to) || (kind == 'u' && from < to)) return;
  // As Python ints, which compare exactly whatever the two dtypes.
  py::object limits = py::module_::import("numpy").attr("iinfo")(numpy_dtype(type.dtype));
  const py::int_ low(array.attr("min")()), high(array.attr("max")());
  const py::int_ lowest(limits.attr("min")), highest(limits.attr("max"));
  if (low >= lowest && high <= highest) return;
  const py::int_ &outside = low < lowest ? low : high;
  throw StatusError(invalid_argument("input '", name, "' is ", type.to_string(), ": the ", dtype,
                                     " array holds ", std::string(py::repr(outside)), ", which ",
                                     dtype_name(type.dtype),
                                     " cannot hold (converting would wrap it)"));
}

std::string shape_text(const py::array &array) {
  std::string text = "(";
  for (py::ssize_t d = 0; d < array.ndim(); ++d)
    text += str_cat(d ? ", " : "", array.shape(d), array.ndim() == 1 ? "," : "");
  return text + ")";
}

// `value` as a NumPy array: itself, a PyTorch tensor's values (detached, on
// the CPU: a view of the tensor's memory where it is there already; a
// bfloat16 tensor's as float32, NumPy having no bfloat16), or whatever
// numpy.asarray makes of it.
py::array as_numpy(py::handle value, const std::string &name) {
  py::object source = py::reinterpret_borrow<py::object>(value);
  if (!py::isinstance<py::array>(value) && py::hasattr(value, "detach") &&
      py::hasattr(value, "numpy")) {
    source = value.attr("detach")();
    if (py::hasattr(source, "cpu")) source = source.attr("cpu")();
    if (py::hasattr(source, "dtype") && py::hasattr(source, "float") &&
        std::string(py::str(source.attr("dtype"))) == "torch.bfloat16")
      source = source.attr("float")();
    source = source.attr("numpy")();
  }
  py::array array = py::array::ensure(source);
  if (!array)
    throw StatusError(invalid_argument("input '", name, "': a ", Py_TYPE(value.ptr())->tp_name,
                                       " is not an array"));
  return array;
}

// The bytes of `array` (of `type`'s layout) in place: the blob holds a
// reference to the array, released under the GIL whichever thread drops it.
HostTensor borrow_in_place(const py::array &array, const TensorType &type) {
  PyObject *object = array.inc_ref().ptr();
  std::shared_ptr<const void> owner(object, [](PyObject *held) {
    py::gil_scoped_acquire gil;
    Py_DECREF(held);
  });
  auto *bytes = static_cast<std::byte *>(const_cast<void *>(array.data()));
  return HostTensor{
      type, Blob::borrowed(bytes, static_cast<size_t>(type.size_bytes()), std::move(owner))};
}

// A copy of `array` converted to `type`'s dtype, in strata's own memory.
HostTensor copy_converted(const py::array &array, const TensorType &type) {
  py::object contiguous = py::module_::import("numpy").attr("ascontiguousarray");
  HostTensor tensor = HostTensor::zeros(type);
  const size_t bytes = static_cast<size_t>(type.size_bytes());
  if (type.dtype == DType::kBF16) {
    py::array floats = contiguous(array, py::dtype("float32"));
    const auto *from = static_cast<const float *>(floats.data());
    auto *to = tensor.as<uint16_t>();
    for (int64_t i = 0; i < type.num_elements(); ++i)
      to[i] = float_to_bf16(from[i]);
  } else {
    py::array converted = contiguous(array, numpy_dtype(type.dtype));
    if (bytes) std::memcpy(tensor.data(), converted.data(), bytes);
  }
  copied_bytes += static_cast<int64_t>(bytes);
  return tensor;
}

} // namespace

int64_t input_bytes_copied() { return copied_bytes.load(); }

HostTensor to_host_tensor(py::handle value, const std::string &name, const TensorType &type) {
  py::array array = as_numpy(value, name);
  bool same_shape = array.ndim() == type.rank();
  for (py::ssize_t d = 0; same_shape && d < array.ndim(); ++d)
    same_shape = array.shape(d) == type.shape[static_cast<size_t>(d)];
  const std::string dtype = py::str(array.dtype());
  if (!same_shape)
    throw StatusError(invalid_argument("input '", name, "' is ", type.to_string(),
                                       ", got an array of shape ", shape_text(array), " (", dtype,
                                       ")"));
  if (!convertible(array.dtype().kind(), type.dtype))
    throw StatusError(
        invalid_argument("input '", name, "' is ", type.to_string(), ", got an array of ", dtype));
  if (is_integer(type.dtype)) check_integer_range(array, name, type, dtype);
  const bool aligned = reinterpret_cast<uintptr_t>(array.data()) % 64 == 0;
  const bool c_contiguous = (array.flags() & py::array::c_style) != 0;
  if (same_layout(array.dtype(), type.dtype) && c_contiguous && aligned)
    return borrow_in_place(array, type);
  return copy_converted(array, type);
}

std::vector<HostTensor> to_batch(py::handle batch, const std::vector<std::string> &names,
                                 const std::vector<TensorType> &types) {
  const size_t n = names.size();
  std::string listed;
  for (size_t i = 0; i < n; ++i)
    listed += str_cat(i ? ", " : "", names[i], " ", types[i].to_string());
  std::vector<HostTensor> tensors;
  if (py::isinstance<py::dict>(batch)) {
    py::dict values = py::reinterpret_borrow<py::dict>(batch);
    for (auto item : values) {
      const std::string key = py::str(item.first);
      if (std::find(names.begin(), names.end(), key) == names.end())
        throw StatusError(
            invalid_argument("the graph has no input '", key, "' (its inputs: ", listed, ")"));
    }
    for (size_t i = 0; i < n; ++i) {
      if (!values.contains(names[i]))
        throw StatusError(invalid_argument("no value for input '", names[i], "' (",
                                           types[i].to_string(), "); the inputs: ", listed));
      py::object value = values[py::str(names[i])];
      tensors.push_back(to_host_tensor(value, names[i], types[i]));
    }
    return tensors;
  }
  if (py::isinstance<py::list>(batch) || py::isinstance<py::tuple>(batch)) {
    const size_t given = py::len(batch);
    if (given != n)
      throw StatusError(invalid_argument(given, " value", given == 1 ? "" : "s", " for ", n,
                                         " input", n == 1 ? "" : "s", " (", listed, ")"));
    size_t i = 0;
    for (py::handle value : batch) {
      tensors.push_back(to_host_tensor(value, names[i], types[i]));
      ++i;
    }
    return tensors;
  }
  if (n != 1)
    throw StatusError(invalid_argument("one array for ", n, " inputs (", listed,
                                       "); give a list in input order or a dict by name"));
  tensors.push_back(to_host_tensor(batch, names[0], types[0]));
  return tensors;
}

py::array to_array(const HostTensor &tensor) {
  if (!tensor.blob) return to_array(HostTensor::zeros(tensor.type));
  std::vector<py::ssize_t> shape(tensor.type.shape.begin(), tensor.type.shape.end());
  if (tensor.type.dtype == DType::kBF16) {
    py::array_t<float> floats(shape);
    float *to = floats.mutable_data();
    const uint16_t *from = tensor.as<uint16_t>();
    for (int64_t i = 0; i < tensor.type.num_elements(); ++i)
      to[i] = bf16_to_float(from[i]);
    return floats;
  }
  auto keep = std::make_unique<std::shared_ptr<Blob>>(tensor.blob);
  py::capsule owner(keep.get(),
                    [](void *held) { delete static_cast<std::shared_ptr<Blob> *>(held); });
  keep.release();
  return py::array(numpy_dtype(tensor.type.dtype), shape, tensor.blob->data(), owner);
}

py::dict to_array_dict(const std::map<std::string, HostTensor> &tensors) {
  py::dict arrays;
  for (const auto &[name, tensor] : tensors)
    arrays[py::str(name)] = to_array(tensor);
  return arrays;
}

py::dict tensor_info(const std::string &name, const TensorType &type) {
  py::dict info;
  info["name"] = name;
  info["dtype"] = std::string(dtype_name(type.dtype));
  py::tuple shape(type.shape.size());
  for (size_t d = 0; d < type.shape.size(); ++d)
    shape[d] = py::int_(type.shape[d]);
  info["shape"] = shape;
  return info;
}

py::list tensor_infos(const Graph &graph, llvm::ArrayRef<TensorId> ids) {
  py::list infos;
  for (TensorId id : ids)
    infos.append(tensor_info(graph.tensor(id).name, graph.tensor(id).type));
  return infos;
}

py::object parse_json(const std::string &text) {
  return py::module_::import("json").attr("loads")(text);
}

} // namespace strata::python
