#include "serialization/onnx_import.h"

#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <stdexcept>
#include <tuple>

#include "graph/builder.h"
#include "graph/host_tensor.h"
#include "graph/verifier.h"
#include "ops/registry.h"
#include "serialization/file_io.h"

namespace strata::serialization {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kMaxModelBytes = uint64_t{2} << 30; // protobuf's own limit
// The most bytes of constants the import computes itself (ConstantOfShape,
// Range, Pad's fill, a folded op), in all: checked before each is allocated,
// so a small hostile file cannot make the import hold gigabytes (each such
// constant is also copied into the graph and the model file).
constexpr int64_t kMaxFoldedBytes = int64_t{256} << 20;
constexpr int kMinOpset = 11, kMaxOpset = 17;

std::string shape_text(llvm::ArrayRef<int64_t> dims) {
  std::string text = "[";
  for (size_t i = 0; i < dims.size(); ++i)
    text += str_cat(i ? ", " : "", dims[i]);
  return text + "]";
}

Result<DType> dtype_of(int32_t type, const std::string &where) {
  switch (type) {
  case onnx::TensorProto::FLOAT: return DType::kF32;
  case onnx::TensorProto::FLOAT16: return DType::kF16;
  case onnx::TensorProto::BFLOAT16: return DType::kBF16;
  case onnx::TensorProto::INT32: return DType::kI32;
  case onnx::TensorProto::INT64: return DType::kI64;
  case onnx::TensorProto::BOOL: return DType::kBool;
  default: break;
  }
  const std::string name =
      onnx::TensorProto::DataType_IsValid(type)
          ? onnx::TensorProto::DataType_Name(static_cast<onnx::TensorProto::DataType>(type))
          : str_cat("type ", type);
  return unimplemented(where, ": element type ", name,
                       " (strata imports float, float16, bfloat16, int32, int64, bool)");
}

// "INTS", "STRING", ...: an attribute type as ONNX names it.
std::string attribute_type_name(int type) {
  if (!onnx::AttributeProto::AttributeType_IsValid(type)) return str_cat("type ", type);
  return onnx::AttributeProto::AttributeType_Name(
      static_cast<onnx::AttributeProto::AttributeType>(type));
}

// The values of an integer tensor (i32 or i64), for shape-like inputs.
std::vector<int64_t> ints_of(const HostTensor &t) {
  std::vector<int64_t> out;
  const int64_t n = t.type.num_elements();
  for (int64_t i = 0; i < n; ++i)
    out.push_back(t.type.dtype == DType::kI32 ? t.as<int32_t>()[i] : t.as<int64_t>()[i]);
  return out;
}

// Element `i` of a tensor as a double, whatever its dtype.
double element_of(const HostTensor &t, int64_t i) {
  switch (t.type.dtype) {
  case DType::kF32: return t.as<float>()[i];
  case DType::kI32: return t.as<int32_t>()[i];
  case DType::kI64: return static_cast<double>(t.as<int64_t>()[i]);
  case DType::kF16: return f16_to_float(t.as<uint16_t>()[i]);
  case DType::kBF16: return bf16_to_float(t.as<uint16_t>()[i]);
  case DType::kBool: return t.as<uint8_t>()[i];
  }
  return 0;
}

double scalar_of(const HostTensor &t) { return element_of(t, 0); }

// An error naming `name` unless every element of the floating tensor `t` has
// a value of the integer dtype `to`, truncated toward zero: NaN, infinity and
// values beyond `to` have none (the Cast kernel would write 0 or a limit).
Status check_integer_values(const HostTensor &t, const std::string &name, DType to) {
  const int64_t n = t.type.num_elements();
  for (int64_t i = 0; i < n; ++i) {
    const double v = element_of(t, i);
    const bool fits = to == DType::kI32 ? v > -2147483649.0 && v < 2147483648.0
                                        : v >= -9223372036854775808.0 && v < 9223372036854775808.0;
    if (!fits) // NaN fails every comparison
      return invalid_argument("Cast of the constant '", name, "' to ", dtype_name(to), ": element ",
                              i, " is ", v, ", which has no ", dtype_name(to), " value");
  }
  return Status::ok();
}

HostTensor i64_tensor(const std::vector<int64_t> &values, bool scalar = false) {
  Shape shape;
  if (!scalar) shape.push_back(static_cast<int64_t>(values.size()));
  HostTensor t = HostTensor::zeros({DType::kI64, shape});
  for (size_t i = 0; i < values.size(); ++i)
    t.as<int64_t>()[i] = values[i];
  return t;
}

class Importer {
public:
  Importer(const onnx::ModelProto &model, const OnnxImportOptions &options, fs::path dir,
           std::string file, std::vector<std::string> *warnings,
           std::vector<std::string> *external_files)
      : model_(model), options_(options), dir_(std::move(dir)), file_(std::move(file)),
        warnings_(warnings), external_files_(external_files),
        builder_(model.graph().name().empty() ? "onnx" : model.graph().name(),
                 ops::OpRegistry::global()) {}

  Result<Graph> run() {
    RETURN_IF_ERROR(check_opset());
    RETURN_IF_ERROR(check_names());
    const onnx::GraphProto &graph = model_.graph();
    if (graph.output_size() == 0)
      return invalid_argument(file_, ": ",
                              graph.node_size() == 0 ? "the graph is empty (no nodes, no outputs)"
                                                     : "the graph declares no outputs",
                              "; a strata model computes at least one output");
    for (const onnx::TensorProto &init : graph.initializer()) {
      ASSIGN_OR_RETURN(HostTensor value,
                       tensor_of(init, str_cat("initializer '", init.name(), "'")));
      known_[init.name()] = std::move(value);
      initializers_.insert(init.name());
    }
    for (const std::string &name : options_.constants)
      if (!initializers_.contains(name))
        return invalid_argument("--constant names '", name, "', which is not an initializer of ",
                                file_);
    RETURN_IF_ERROR(add_inputs());
    ASSIGN_OR_RETURN(std::vector<const onnx::NodeProto *> order, topological_order());
    order = unmerge_initializers(std::move(order));
    warn_about_merged_initializers(order);
    RETURN_IF_ERROR(check_supported(order));
    RETURN_IF_ERROR(check_attributes(order));
    for (const onnx::NodeProto *node : order) {
      Status status = Status::ok();
      try {
        status = convert(*node);
      } catch (const std::out_of_range &) {
        // convert() reads the inputs and outputs an op needs with at(): a node
        // with fewer than its op takes is refused here, for every op alike.
        status = invalid_argument(node->op_type(), " with ", node->input_size(), " input(s) and ",
                                  node->output_size(),
                                  " output(s) lacks one the op needs (see the ONNX operator's "
                                  "inputs and outputs)");
      }
      if (status.is_ok()) status = builder_.status();
      if (!status.is_ok()) {
        // The builder's errors begin with the node already: "node 'bn'
        // (BatchNormalization): ...".
        const std::string where = str_cat("node '", label(*node), "'");
        if (status.message().starts_with(where + " (")) return status.with_context(file_);
        return status.with_context(str_cat(file_, ": ", where));
      }
    }
    std::set<std::string> output_names;
    for (const onnx::ValueInfoProto &output : graph.output()) {
      auto id_of = value(output.name());
      if (!id_of.is_ok())
        return std::move(id_of).take_status().with_context(
            str_cat(file_, ": graph output '", output.name(), "'"));
      const TensorId id = *id_of;
      builder_.output(id);
      output_names.insert(output.name());
    }
    ASSIGN_OR_RETURN(Graph result, std::move(builder_).finish());
    // Keep the ONNX value names: always for the graph outputs (moving aside a
    // tensor the builder happened to give that name), elsewhere where free.
    for (const auto &[name, id] : ids_) {
      auto taken = result.find_tensor(name);
      if (taken && *taken == id) continue;
      if (taken && output_names.contains(name))
        RETURN_IF_ERROR(result.rename_tensor(*taken, str_cat(name, ".node")));
      else if (taken)
        continue;
      RETURN_IF_ERROR(result.rename_tensor(id, name));
    }
    // What a model file is loaded with: nothing is written that strata
    // would then refuse to read.
    RETURN_IF_ERROR(verify_graph(result, ops::OpRegistry::global()).with_context(file_));
    return result;
  }

private:
  using Attrs = std::vector<Attribute>;

  static std::string label(const onnx::NodeProto &node) {
    return node.name().empty()
               ? str_cat(node.op_type(), " -> ", node.output_size() ? node.output(0) : "")
               : node.name();
  }

  Status check_opset() {
    opset_ = -1;
    for (const auto &import : model_.opset_import())
      if (import.domain().empty() || import.domain() == "ai.onnx")
        opset_ = static_cast<int>(import.version());
    if (opset_ < 0) return invalid_argument(file_, ": no ONNX opset is imported (opset_import)");
    if (opset_ < kMinOpset || opset_ > kMaxOpset)
      return unimplemented(file_, ": opset ", opset_, "; strata imports opsets ", kMinOpset, " to ",
                           kMaxOpset, " (re-export with opset_version in that range)");
    return Status::ok();
  }

  // Every name in the graph (its own, its values', nodes', ops' and
  // attributes') is UTF-8 text without NUL bytes, as strata's files and
  // reports need. Checked first, so that later errors can quote names.
  Status check_names() const {
    const onnx::GraphProto &graph = model_.graph();
    auto check = [&](std::string_view what, const std::string &name) {
      return check_name(what, name).with_context(file_);
    };
    RETURN_IF_ERROR(check("the graph name", graph.name()));
    for (const onnx::TensorProto &init : graph.initializer())
      RETURN_IF_ERROR(check("an initializer name", init.name()));
    for (const onnx::ValueInfoProto &input : graph.input())
      RETURN_IF_ERROR(check("a graph input name", input.name()));
    for (const onnx::ValueInfoProto &output : graph.output())
      RETURN_IF_ERROR(check("a graph output name", output.name()));
    for (int i = 0; i < graph.node_size(); ++i) {
      const onnx::NodeProto &node = graph.node(i);
      RETURN_IF_ERROR(check(str_cat("the name of node ", i), node.name()));
      RETURN_IF_ERROR(check(str_cat("the op_type of node ", i), node.op_type()));
      RETURN_IF_ERROR(check(str_cat("the domain of node ", i), node.domain()));
      for (const std::string &value : node.input())
        RETURN_IF_ERROR(check(str_cat("an input of node ", i), value));
      for (const std::string &value : node.output())
        RETURN_IF_ERROR(check(str_cat("an output of node ", i), value));
      for (const onnx::AttributeProto &a : node.attribute())
        RETURN_IF_ERROR(check(str_cat("an attribute name of node ", i), a.name()));
    }
    return Status::ok();
  }

  // ---- tensors --------------------------------------------------------------

  // A constant the import computes; all of them together hold at most
  // kMaxFoldedBytes.
  Result<HostTensor> folded_tensor(DType dtype, Shape shape) {
    const TensorType type{dtype, std::move(shape)};
    auto count = checked_num_elements(type.shape);
    if (!count.is_ok()) return std::move(count).take_status();
    const int64_t bytes = *count * static_cast<int64_t>(dtype_size(dtype));
    if (bytes > kMaxFoldedBytes - folded_bytes_)
      return invalid_argument(
          "it would compute a constant ", type.to_string(), " of ", bytes, " bytes at import",
          folded_bytes_ > 0 ? str_cat(" after ", folded_bytes_, " bytes of others") : "",
          "; strata folds constants of at most ", kMaxFoldedBytes >> 20, " MiB in all");
    folded_bytes_ += bytes;
    return HostTensor::zeros(type);
  }

  Result<HostTensor> tensor_of(const onnx::TensorProto &proto, const std::string &where) {
    ASSIGN_OR_RETURN(DType dtype, dtype_of(proto.data_type(), where));
    Shape shape;
    for (int64_t d : proto.dims()) {
      if (d < 0) return invalid_argument(file_, ": ", where, " has a negative dim");
      shape.push_back(d);
    }
    // Sizes are checked against the data before anything is allocated: a
    // corrupt dim must not ask the host for terabytes.
    const TensorType type{dtype, shape};
    auto count = checked_num_elements(shape);
    if (!count.is_ok())
      return std::move(count).take_status().with_context(str_cat(file_, ": ", where));
    const size_t n = static_cast<size_t>(*count);
    const size_t bytes = n * dtype_size(dtype);
    auto mismatch = [&](size_t got, const char *field) {
      return invalid_argument(file_, ": ", where, " is ", type.to_string(), " (", bytes,
                              " bytes) but its ", field, " holds ", got,
                              field == std::string("raw_data") ? " bytes" : " values");
    };
    if (proto.data_location() == onnx::TensorProto::EXTERNAL)
      return read_external(proto, where, type);
    if (proto.has_raw_data()) {
      if (proto.raw_data().size() != bytes) return mismatch(proto.raw_data().size(), "raw_data");
    } else if (dtype == DType::kF32) {
      if (static_cast<size_t>(proto.float_data_size()) != n)
        return mismatch(static_cast<size_t>(proto.float_data_size()), "float_data");
    } else if (dtype == DType::kI64) {
      if (static_cast<size_t>(proto.int64_data_size()) != n)
        return mismatch(static_cast<size_t>(proto.int64_data_size()), "int64_data");
    } else if (static_cast<size_t>(proto.int32_data_size()) != n) {
      // int32_data carries int32, bool, float16 and bfloat16 (as bits).
      return mismatch(static_cast<size_t>(proto.int32_data_size()), "int32_data");
    }
    HostTensor t = HostTensor::zeros(type);
    if (proto.has_raw_data()) {
      if (bytes) std::memcpy(t.data(), proto.raw_data().data(), bytes);
    } else if (dtype == DType::kF32) {
      std::copy(proto.float_data().begin(), proto.float_data().end(), t.as<float>());
    } else if (dtype == DType::kI64) {
      std::copy(proto.int64_data().begin(), proto.int64_data().end(), t.as<int64_t>());
    } else {
      for (size_t i = 0; i < n; ++i) {
        const int32_t v = proto.int32_data(static_cast<int>(i));
        if (dtype == DType::kI32)
          t.as<int32_t>()[i] = v;
        else if (dtype == DType::kBool)
          t.as<uint8_t>()[i] = v != 0;
        else
          t.as<uint16_t>()[i] = static_cast<uint16_t>(v);
      }
    }
    return t;
  }

  // External data, read only from a regular file inside the model's folder.
  Result<HostTensor> read_external(const onnx::TensorProto &proto, const std::string &where,
                                   const TensorType &type) {
    std::string location;
    int64_t offset = 0, length = -1;
    for (const auto &entry : proto.external_data()) {
      auto number = [&](int64_t *out) -> Status {
        errno = 0;
        char *end = nullptr;
        long long v = std::strtoll(entry.value().c_str(), &end, 10);
        if (entry.value().empty() || *end != '\0' || errno != 0 || v < 0)
          return invalid_argument(file_, ": ", where, ": external_data ", entry.key(), " '",
                                  entry.value(), "' is not a count");
        *out = v;
        return Status::ok();
      };
      if (entry.key() == "location")
        location = entry.value();
      else if (entry.key() == "offset")
        RETURN_IF_ERROR(number(&offset));
      else if (entry.key() == "length")
        RETURN_IF_ERROR(number(&length));
    }
    const std::string what = str_cat(file_, ": ", where, ": external data '", location, "'");
    const fs::path rel(location);
    if (location.empty()) return invalid_argument(what, " has no location");
    if (rel.is_absolute())
      return invalid_argument(what,
                              " is an absolute path; only files in the model's folder are read");
    for (const auto &part : rel)
      if (part == "..") return invalid_argument(what, " leaves the model's folder ('..')");
    std::error_code error;
    const fs::path folder = fs::canonical(dir_, error);
    if (error) return io_error(what, ": cannot resolve the model's folder: ", error.message());
    const fs::path full = fs::canonical(dir_ / rel, error);
    if (error) return not_found(what, ": no such file in ", folder.string());
    auto [end, ignored] = std::mismatch(folder.begin(), folder.end(), full.begin(), full.end());
    if (end != folder.end())
      return invalid_argument(what, " resolves to ", full.string(),
                              ", outside the model's folder (a symbolic link?)");
    if (!fs::is_regular_file(full, error)) return invalid_argument(what, " is not a regular file");
    if (external_files_ != nullptr && std::find(external_files_->begin(), external_files_->end(),
                                                full.string()) == external_files_->end())
      external_files_->push_back(full.string());
    const uint64_t size = fs::file_size(full, error);
    const uint64_t bytes = static_cast<uint64_t>(type.size_bytes());
    if (length >= 0 && static_cast<uint64_t>(length) != bytes)
      return invalid_argument(what, ": length ", length, " but ", type.to_string(), " needs ",
                              bytes, " bytes");
    if (static_cast<uint64_t>(offset) > size || bytes > size - static_cast<uint64_t>(offset))
      return invalid_argument(what, ": offset ", offset, " + ", bytes, " bytes is past its end (",
                              size, " bytes)");
    HostTensor t = HostTensor::zeros(type);
    std::ifstream in(full, std::ios::binary);
    in.seekg(offset);
    if (bytes && !in.read(reinterpret_cast<char *>(t.data()), static_cast<std::streamsize>(bytes)))
      return io_error(what, ": read failed");
    return t;
  }

  // ---- graph inputs and order ----------------------------------------------

  Status add_inputs() {
    std::set<std::string> names;
    for (const onnx::ValueInfoProto &input : model_.graph().input()) {
      if (initializers_.contains(input.name())) continue; // an old exporter's habit
      names.insert(input.name());
      const std::string where = str_cat(file_, ": graph input '", input.name(), "'");
      if (!input.type().has_tensor_type()) return unimplemented(where, " is not a tensor");
      const auto &type = input.type().tensor_type();
      ASSIGN_OR_RETURN(DType dtype, dtype_of(type.elem_type(), where));
      Shape shape;
      bool dynamic = !type.has_shape();
      for (const auto &dim : type.shape().dim()) {
        if (dim.has_dim_value() && dim.dim_value() >= 0)
          shape.push_back(dim.dim_value());
        else {
          dynamic = true;
          shape.push_back(-1);
        }
      }
      auto given = options_.input_shapes.find(input.name());
      if (given != options_.input_shapes.end()) {
        if (type.has_shape() && given->second.size() != shape.size())
          return invalid_argument(where, " has rank ", shape.size(), " but --input-shape gives ",
                                  shape_text(given->second));
        for (size_t i = 0; i < shape.size(); ++i)
          if (shape[i] >= 0 && shape[i] != given->second[i])
            return invalid_argument(where, " has dim ", i, " = ", shape[i],
                                    " but --input-shape gives ", given->second[i]);
        shape.assign(given->second.begin(), given->second.end());
      } else if (dynamic) {
        return invalid_argument(where, " has dynamic dims ", shape_text(shape),
                                "; fix them with --input-shape ", input.name(), "=",
                                "<d0>x<d1>...");
      }
      ids_[input.name()] = builder_.input(input.name(), dtype, shape);
    }
    for (const auto &[name, dims] : options_.input_shapes)
      if (!names.contains(name))
        return invalid_argument("--input-shape names '", name, "', which is not a graph input of ",
                                file_);
    return Status::ok();
  }

  Result<std::vector<const onnx::NodeProto *>> topological_order() {
    const auto &nodes = model_.graph().node();
    std::map<std::string, int> producer;
    for (int i = 0; i < nodes.size(); ++i)
      for (const std::string &out : nodes[i].output()) {
        if (out.empty()) continue;
        RETURN_IF_ERROR(check_single_definition(out, i, producer));
        producer[out] = i;
      }
    std::vector<int> pending(static_cast<size_t>(nodes.size()), 0);
    std::vector<std::vector<int>> readers(static_cast<size_t>(nodes.size()));
    for (int i = 0; i < nodes.size(); ++i) {
      for (const std::string &in : nodes[i].input()) {
        if (in.empty() || known_.contains(in) || ids_.contains(in)) continue;
        auto it = producer.find(in);
        if (it == producer.end())
          return invalid_argument(file_, ": node '", label(nodes[i]), "' reads '", in,
                                  "', which no node, graph input or initializer provides");
        ++pending[static_cast<size_t>(i)];
        readers[static_cast<size_t>(it->second)].push_back(i);
      }
    }
    std::deque<int> ready;
    for (int i = 0; i < nodes.size(); ++i)
      if (pending[static_cast<size_t>(i)] == 0) ready.push_back(i);
    std::vector<const onnx::NodeProto *> order;
    while (!ready.empty()) {
      const int i = ready.front();
      ready.pop_front();
      order.push_back(&nodes[i]);
      for (int r : readers[static_cast<size_t>(i)])
        if (--pending[static_cast<size_t>(r)] == 0) ready.push_back(r);
    }
    if (order.size() != static_cast<size_t>(nodes.size())) {
      std::string stuck;
      for (int i = 0; i < nodes.size(); ++i)
        if (pending[static_cast<size_t>(i)] > 0)
          stuck += str_cat(stuck.empty() ? "" : ", ", "'", label(nodes[i]), "'");
      return invalid_argument(file_,
                              ": the graph has a cycle; these nodes are on it or wait "
                              "for it: ",
                              stuck);
    }
    return order;
  }

  // ONNX graphs are in single static assignment form: a value that node i
  // produces is not produced by another node (`producer` so far), nor by the
  // same node twice, nor a graph input or an initializer. Otherwise one
  // definition would silently replace the other.
  Status check_single_definition(const std::string &value, int i,
                                 const std::map<std::string, int> &producer) const {
    const auto &nodes = model_.graph().node();
    if (auto it = producer.find(value); it != producer.end()) {
      if (it->second == i)
        return invalid_argument(file_, ": node '", label(nodes[i]), "' lists output '", value,
                                "' twice");
      return invalid_argument(file_, ": value '", value, "' is produced by both node '",
                              label(nodes[it->second]), "' and node '", label(nodes[i]),
                              "'; each value has one producer");
    }
    if (initializers_.contains(value) || ids_.contains(value))
      return invalid_argument(file_, ": node '", label(nodes[i]), "' produces '", value,
                              "', which is already ",
                              ids_.contains(value) ? "a graph input" : "an initializer",
                              "; each value has one producer");
    return Status::ok();
  }

  // ---- op support ----------------------------------------------------------

  static const std::map<std::string, std::string> &same_name_ops() {
    // ONNX op -> strata op, where inputs and outputs carry over unchanged.
    static const std::map<std::string, std::string> ops = {
        {"Add", "Add"},         {"Sub", "Sub"},
        {"Mul", "Mul"},         {"Div", "Div"},
        {"Pow", "Pow"},         {"Neg", "Neg"},
        {"Sqrt", "Sqrt"},       {"Exp", "Exp"},
        {"Log", "Log"},         {"Erf", "Erf"},
        {"Relu", "Relu"},       {"Tanh", "Tanh"},
        {"Sigmoid", "Sigmoid"}, {"Identity", "Identity"},
        {"MatMul", "MatMul"},   {"GlobalAveragePool", "GlobalAveragePool"},
    };
    return ops;
  }

  bool supported(const std::string &op) const {
    static const std::set<std::string> others = {
        "Constant",
        "Shape",
        "ConstantOfShape",
        "Range",
        "Size",
        "Gemm",
        "Conv",
        "MaxPool",
        "AveragePool",
        "BatchNormalization",
        "Flatten",
        "Reshape",
        "Transpose",
        "Concat",
        "Split",
        "Slice",
        "Squeeze",
        "Unsqueeze",
        "Gather",
        "Expand",
        "Softmax",
        "LogSoftmax",
        "ReduceMean",
        "ReduceSum",
        "ReduceMax",
        "Clip",
        "Cast",
        "Dropout",
        "LayerNormalization",
        "Pad",
        "Where",
        "Equal",
        "Less",
        "Greater",
        "LessOrEqual",
        "GreaterOrEqual",
        "Not",
        "And",
        "Or",
        "Trilu",
    };
    return same_name_ops().contains(op) || others.contains(op);
  }

  Status check_supported(const std::vector<const onnx::NodeProto *> &order) {
    std::map<std::string, std::vector<std::string>> missing;
    for (const onnx::NodeProto *node : order) {
      const bool domain_ok = node->domain().empty() || node->domain() == "ai.onnx";
      if (!domain_ok || !supported(node->op_type()))
        missing[domain_ok ? node->op_type() : str_cat(node->domain(), ".", node->op_type())]
            .push_back(label(*node));
    }
    if (missing.empty()) return Status::ok();
    std::string text;
    for (const auto &[op, nodes] : missing) {
      text += str_cat(text.empty() ? "" : "; ", op, " (node", nodes.size() == 1 ? " " : "s ");
      for (size_t i = 0; i < nodes.size() && i < 8; ++i)
        text += str_cat(i ? ", " : "", "'", nodes[i], "'");
      if (nodes.size() > 8) text += str_cat(", and ", nodes.size() - 8, " more");
      text += ")";
    }
    return unimplemented(file_, ": ", missing.size(), " ONNX op", missing.size() == 1 ? "" : "s",
                         " strata does not support: ", text);
  }

  // Every attribute is one the op's ONNX schema (at the model's opset)
  // defines, given once, of the schema's type: what the ONNX checker demands.
  // The conversion reads an attribute it cannot find as its default, so a
  // Transpose whose perm is a string would otherwise keep the default order.
  Status check_attributes(const std::vector<const onnx::NodeProto *> &order) const {
    for (const onnx::NodeProto *node : order) {
      Status status = check_attributes(*node);
      if (!status.is_ok())
        return std::move(status).with_context(str_cat(file_, ": node '", label(*node), "'"));
    }
    return Status::ok();
  }

  Status check_attributes(const onnx::NodeProto &node) const {
    const std::string &op = node.op_type();
    const onnx::OpSchema *schema = onnx::OpSchemaRegistry::Schema(op, opset_);
    // An op defined after the model's opset (LayerNormalization in an opset
    // 13 model): its definition at the newest opset strata imports.
    if (schema == nullptr) schema = onnx::OpSchemaRegistry::Schema(op, kMaxOpset);
    if (schema == nullptr)
      return internal_error("the ONNX library has no schema for ", op, " up to opset ", kMaxOpset);
    const std::string definition = str_cat("ONNX ", op, "-", schema->since_version());
    const auto &defined = schema->attributes();
    std::set<std::string> seen;
    for (const onnx::AttributeProto &a : node.attribute()) {
      if (!seen.insert(a.name()).second)
        return invalid_argument(op, " attribute '", a.name(), "' is given twice");
      const auto it = defined.find(a.name());
      if (it == defined.end()) {
        std::string names;
        for (const auto &entry : defined)
          names += str_cat(names.empty() ? "" : ", ", entry.first);
        return invalid_argument(
            op, " has no attribute '", a.name(), "' (", definition,
            names.empty() ? std::string(" takes none") : str_cat(" takes ", names), ")");
      }
      if (a.type() != it->second.type)
        return invalid_argument(op, " attribute '", a.name(), "' ",
                                a.type() == onnx::AttributeProto::UNDEFINED
                                    ? std::string("has no type")
                                    : str_cat("is ", attribute_type_name(a.type())),
                                "; ", definition, " takes ", attribute_type_name(it->second.type));
    }
    return Status::ok();
  }

  // ---- values --------------------------------------------------------------

  const HostTensor *known(const std::string &name) const {
    auto it = known_.find(name);
    return it == known_.end() ? nullptr : &it->second;
  }

  // PyTorch's exporter merges initializers with equal contents and gives each
  // former owner an Identity of the survivor, named as the original ('bn1.bias'
  // -> Identity -> 'layer4.1.bn2.bias'; even a fresh batch norm's running
  // variance and another's weight, both ones). An Identity computes nothing,
  // so its output becomes an initializer of its own with the same contents:
  // what the source model had, trained (or updated) apart, and a constant
  // only when --constant names it. Returns the nodes left to convert.
  std::vector<const onnx::NodeProto *>
  unmerge_initializers(std::vector<const onnx::NodeProto *> order) {
    std::vector<const onnx::NodeProto *> rest;
    for (const onnx::NodeProto *node : order) {
      const bool alias = node->op_type() == "Identity" && node->input_size() == 1 &&
                         node->output_size() == 1 && initializers_.contains(node->input(0)) &&
                         !initializers_.contains(node->output(0));
      if (!alias) {
        rest.push_back(node);
        continue;
      }
      const HostTensor &source = known_.at(node->input(0));
      HostTensor copy = HostTensor::zeros(source.type);
      if (copy.size_bytes()) std::memcpy(copy.data(), source.data(), copy.size_bytes());
      known_[node->output(0)] = std::move(copy);
      initializers_.insert(node->output(0));
    }
    return rest;
  }

  // Exporters merge initializers with equal contents (two fresh LayerNorms'
  // scales, say): the merged one then feeds the same input of several nodes of
  // one op, and training ties what the source model kept apart.
  void warn_about_merged_initializers(const std::vector<const onnx::NodeProto *> &order) {
    if (warnings_ == nullptr) return;
    std::map<std::tuple<std::string, std::string, int>, std::vector<std::string>> uses;
    for (const onnx::NodeProto *node : order)
      for (int i = 0; i < node->input_size(); ++i)
        if (initializers_.contains(node->input(i)) && !options_.constants.contains(node->input(i)))
          uses[{node->input(i), node->op_type(), i}].push_back(label(*node));
    for (const auto &[key, nodes] : uses) {
      const auto &[name, op, slot] = key;
      const HostTensor *k = known(name);
      const bool floating = k && (k->type.dtype == DType::kF32 || k->type.dtype == DType::kF16 ||
                                  k->type.dtype == DType::kBF16);
      if (nodes.size() < 2 || !floating || op == "Gather") continue;
      std::string list;
      for (size_t i = 0; i < nodes.size() && i < 4; ++i)
        list += str_cat(i ? ", " : "", "'", nodes[i], "'");
      warnings_->push_back(
          str_cat("initializer '", name, "' feeds input ", slot, " of ", nodes.size(), " ", op,
                  " nodes (", list, nodes.size() > 4 ? ", ..." : "",
                  "); they share one trainable tensor. If the exporter merged equal initializers, "
                  "perturb the weights before exporting or expect them to train together"));
    }
  }

  // A floating-point initializer: a weight, made a trainable parameter.
  bool is_weight(const std::string &name) const {
    const HostTensor *k = known(name);
    return k != nullptr && initializers_.contains(name) && !options_.constants.contains(name) &&
           (k->type.dtype == DType::kF32 || k->type.dtype == DType::kF16 ||
            k->type.dtype == DType::kBF16);
  }

  // The graph tensor of a value; a known one becomes a parameter (a floating
  // initializer: a weight) or a constant the first time a node reads it.
  Result<TensorId> value(const std::string &name) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const HostTensor *k = known(name);
    if (k == nullptr) return invalid_argument("value '", name, "' is not defined");
    auto blob = Blob::copy_of(k->data(), k->size_bytes());
    const bool weight = is_weight(name);
    TensorId id = weight ? builder_.parameter(name, k->type.dtype, k->type.shape, blob)
                         : builder_.constant(name, k->type.dtype, k->type.shape, blob);
    ids_[name] = id;
    return id;
  }

  Result<TensorType> type_of(const std::string &name) {
    if (const HostTensor *k = known(name)) return k->type;
    ASSIGN_OR_RETURN(TensorId id, value(name));
    return builder_.type(id);
  }

  // Adds strata op `op` over the ONNX values `inputs`, naming its outputs
  // `outputs`. When every input is known the op runs now, with strata's own
  // kernel, and its outputs are known too (constant folding).
  Status emit(std::string_view op, const std::vector<std::string> &inputs, Attrs attrs,
              const std::vector<std::string> &outputs, const std::string &node_name) {
    // Weights are never folded away: an op reading one stays in the graph so the
    // weight stays a trainable parameter (a positional embedding's Gather of
    // fixed positions, say).
    const bool all_known = std::all_of(inputs.begin(), inputs.end(), [&](const std::string &in) {
      return known(in) != nullptr && !is_weight(in);
    });
    if (all_known && op != "Dropout") return fold(op, inputs, std::move(attrs), outputs, node_name);
    std::vector<TensorId> ids;
    for (const std::string &in : inputs) {
      ASSIGN_OR_RETURN(TensorId id, value(in));
      ids.push_back(id);
    }
    auto outs = builder_.op(op, ids, std::move(attrs), node_name);
    RETURN_IF_ERROR(builder_.status());
    if (outs.size() < outputs.size())
      return internal_error(op, " made ", outs.size(), " outputs, the node has ", outputs.size());
    for (size_t i = 0; i < outputs.size(); ++i)
      if (!outputs[i].empty()) ids_[outputs[i]] = outs[i];
    return Status::ok();
  }

  Status fold(std::string_view op, const std::vector<std::string> &inputs, Attrs attrs,
              const std::vector<std::string> &outputs, const std::string &node_name) {
    const ops::OpRegistry &registry = ops::OpRegistry::global();
    GraphBuilder scratch("fold", registry);
    std::vector<TensorId> ids;
    for (const std::string &in : inputs) {
      const HostTensor &k = *known(in);
      ids.push_back(scratch.constant(str_cat("c", ids.size()), k.type.dtype, k.type.shape,
                                     Blob::copy_of(k.data(), k.size_bytes())));
    }
    auto outs = scratch.op(op, ids, std::move(attrs), node_name);
    RETURN_IF_ERROR(scratch.status());
    const Graph &g = scratch.graph();
    const Node &node = g.node(g.num_nodes() - 1);
    const ops::OpDef *def = registry.find(op);
    if (def == nullptr || def->cpu_kernel == nullptr)
      return unimplemented("folding ", op, ": no CPU kernel");
    std::vector<ops::ConstTensorView> in_views;
    for (size_t i = 0; i < inputs.size(); ++i)
      in_views.push_back({known(inputs[i])->data(), &g.tensor(ids[i]).type});
    std::vector<HostTensor> results;
    std::vector<ops::TensorView> out_views;
    for (TensorId id : outs) {
      ASSIGN_OR_RETURN(HostTensor result,
                       folded_tensor(g.tensor(id).type.dtype, g.tensor(id).type.shape));
      results.push_back(std::move(result));
    }
    for (size_t i = 0; i < outs.size(); ++i)
      out_views.push_back(
          {results[i].size_bytes() ? results[i].data() : nullptr, &g.tensor(outs[i]).type});
    // Outputs with no elements are made: there is nothing to compute (and
    // kernels are not run on buffers that do not exist).
    const bool any_output = std::any_of(results.begin(), results.end(),
                                        [](const HostTensor &r) { return r.size_bytes() > 0; });
    ops::KernelContext context{node, *def, in_views, out_views};
    if (any_output)
      RETURN_IF_ERROR(def->cpu_kernel(context).with_context(str_cat("folding ", op)));
    for (size_t i = 0; i < outputs.size() && i < results.size(); ++i)
      if (!outputs[i].empty()) known_[outputs[i]] = std::move(results[i]);
    return Status::ok();
  }

  void set_known(const onnx::NodeProto &node, int output, HostTensor value) {
    if (output < node.output_size() && !node.output(output).empty())
      known_[node.output(output)] = std::move(value);
  }

  // ---- attributes ----------------------------------------------------------

  static const onnx::AttributeProto *attr(const onnx::NodeProto &node, std::string_view name) {
    for (const auto &a : node.attribute())
      if (a.name() == name) return &a;
    return nullptr;
  }
  static int64_t attr_int(const onnx::NodeProto &node, std::string_view name, int64_t fallback) {
    const auto *a = attr(node, name);
    return a ? a->i() : fallback;
  }
  static double attr_float(const onnx::NodeProto &node, std::string_view name, double fallback) {
    const auto *a = attr(node, name);
    return a ? a->f() : fallback;
  }
  static std::optional<std::vector<int64_t>> attr_ints(const onnx::NodeProto &node,
                                                       std::string_view name) {
    const auto *a = attr(node, name);
    if (a == nullptr) return std::nullopt;
    return std::vector<int64_t>(a->ints().begin(), a->ints().end());
  }
  static std::string attr_string(const onnx::NodeProto &node, std::string_view name,
                                 std::string fallback) {
    const auto *a = attr(node, name);
    return a ? a->s() : fallback;
  }

  std::string input(const onnx::NodeProto &node, int i) const {
    return i < node.input_size() ? node.input(i) : std::string();
  }

  // A shape-like input that must be known at import (Reshape's shape, ...).
  Result<std::vector<int64_t>> known_ints(const onnx::NodeProto &node, int i, const char *what) {
    const HostTensor *k = known(input(node, i));
    if (k == nullptr)
      return unimplemented("its ", what, " input '", input(node, i),
                           "' is computed at run time; strata needs it fixed at import (give "
                           "--input-shape for dynamic inputs)");
    if (k->type.dtype != DType::kI64 && k->type.dtype != DType::kI32)
      return invalid_argument("its ", what, " input is ", k->type.to_string(), ", not integers");
    return ints_of(*k);
  }

  // ---- conversion ----------------------------------------------------------

  // `strata_op` over `inputs`, giving node n's first output.
  Status emit_one(const onnx::NodeProto &n, const std::vector<std::string> &outs,
                  std::string_view strata_op, const std::vector<std::string> &inputs,
                  Attrs attrs = {}) {
    return emit(strata_op, inputs, std::move(attrs), {outs.at(0)}, n.name());
  }

  Status convert(const onnx::NodeProto &n) {
    const std::string &op = n.op_type();
    std::vector<std::string> ins(n.input().begin(), n.input().end());
    std::vector<std::string> outs(n.output().begin(), n.output().end());
    auto one = [&](std::string_view strata_op, std::vector<std::string> inputs, Attrs attrs = {}) {
      return emit_one(n, outs, strata_op, inputs, std::move(attrs));
    };

    if (auto it = same_name_ops().find(op); it != same_name_ops().end())
      return one(it->second, ins);

    if (op == "Constant") return convert_constant(n);
    if (op == "Shape") return convert_shape(n, ins);
    if (op == "Size") {
      ASSIGN_OR_RETURN(TensorType type, type_of(ins.at(0)));
      set_known(n, 0, i64_tensor({type.num_elements()}, true));
      return Status::ok();
    }
    if (op == "ConstantOfShape") return convert_constant_of_shape(n);
    if (op == "Range") return convert_range(n, ins);
    if (op == "Gemm") {
      std::vector<std::string> inputs = {ins.at(0), ins.at(1)};
      if (!input(n, 2).empty()) inputs.push_back(ins[2]);
      return one("Gemm", inputs,
                 {{"alpha", attr_float(n, "alpha", 1.0)},
                  {"beta", attr_float(n, "beta", 1.0)},
                  {"trans_a", attr_int(n, "transA", 0)},
                  {"trans_b", attr_int(n, "transB", 0)}});
    }
    if (op == "Conv" || op == "MaxPool" || op == "AveragePool") return convert_window(n, ins, outs);
    if (op == "BatchNormalization") {
      if (outs.size() > 1 && std::any_of(outs.begin() + 1, outs.end(),
                                         [](const std::string &o) { return !o.empty(); }))
        return unimplemented("training-mode BatchNormalization outputs (running mean/var)");
      return one("BatchNormalization", {ins.at(0), ins.at(1), ins.at(2), ins.at(3), ins.at(4)},
                 {{"epsilon", attr_float(n, "epsilon", 1e-5)},
                  {"momentum", 1.0 - attr_float(n, "momentum", 0.9)}});
    }
    if (op == "Flatten") return one("Flatten", {ins.at(0)}, {{"axis", attr_int(n, "axis", 1)}});
    if (op == "Pad") return convert_pad(n, ins, outs);
    if (op == "Where") return one("Where", {ins.at(0), ins.at(1), ins.at(2)});
    if (op == "Equal" || op == "Less" || op == "Greater" || op == "LessOrEqual" ||
        op == "GreaterOrEqual" || op == "Not" || op == "And" || op == "Or" || op == "Trilu")
      return fold_logic(n, ins);
    if (op == "Reshape") {
      ASSIGN_OR_RETURN(std::vector<int64_t> shape, known_ints(n, 1, "shape"));
      if (attr_int(n, "allowzero", 0) != 0 &&
          std::find(shape.begin(), shape.end(), 0) != shape.end())
        return unimplemented("Reshape with allowzero = 1 and a 0 in the shape");
      return one("Reshape", {ins.at(0)}, {{"shape", shape}});
    }
    if (op == "Transpose") {
      Attrs attrs;
      if (auto perm = attr_ints(n, "perm")) attrs.push_back({"perm", *perm});
      return one("Transpose", {ins.at(0)}, std::move(attrs));
    }
    if (op == "Concat") return one("Concat", ins, {{"axis", attr_int(n, "axis", 0)}});
    if (op == "Split") return convert_split(n, ins, outs);
    if (op == "Slice") return convert_slice(n, ins, outs);
    if (op == "Squeeze" || op == "Unsqueeze") return convert_squeeze(n, ins, outs);
    if (op == "Gather")
      return one("Gather", {ins.at(0), ins.at(1)}, {{"axis", attr_int(n, "axis", 0)}});
    if (op == "Expand") {
      ASSIGN_OR_RETURN(std::vector<int64_t> shape, known_ints(n, 1, "shape"));
      return one("Expand", {ins.at(0)}, {{"shape", shape}});
    }
    if (op == "Softmax" || op == "LogSoftmax") return convert_softmax(n, ins, outs);
    if (op == "ReduceMean" || op == "ReduceSum" || op == "ReduceMax")
      return convert_reduce(n, ins, outs);
    if (op == "Clip") return convert_clip(n, ins, outs);
    if (op == "Cast") {
      ASSIGN_OR_RETURN(DType to, dtype_of(static_cast<int32_t>(attr_int(n, "to", 0)), "its 'to'"));
      // A constant is cast here, at import: to integers only if it has them.
      const HostTensor *value = known(ins.at(0));
      if (value != nullptr && !is_weight(ins.at(0)) && is_integer(to) &&
          is_floating(value->type.dtype))
        RETURN_IF_ERROR(check_integer_values(*value, ins.at(0), to));
      return one("Cast", {ins.at(0)}, {{"to", std::string(dtype_name(to))}});
    }
    if (op == "Dropout") {
      // Inference: the identity (the mask output, if read, is all true).
      if (outs.size() > 1 && !outs[1].empty()) return unimplemented("Dropout's mask output");
      return one("Identity", {ins.at(0)});
    }
    if (op == "LayerNormalization") {
      if (outs.size() > 1 && std::any_of(outs.begin() + 1, outs.end(),
                                         [](const std::string &o) { return !o.empty(); }))
        return unimplemented("LayerNormalization's mean / inverse-std outputs");
      if (input(n, 2).empty()) return unimplemented("LayerNormalization without a bias input");
      return one("LayerNorm", {ins.at(0), ins.at(1), ins.at(2)},
                 {{"axis", attr_int(n, "axis", -1)}, {"epsilon", attr_float(n, "epsilon", 1e-5)}});
    }
    return unimplemented("op ", op);
  }

  // Constant: its value is known at import.
  Status convert_constant(const onnx::NodeProto &n) {
    if (const auto *a = attr(n, "value")) {
      ASSIGN_OR_RETURN(HostTensor t, tensor_of(a->t(), "its value"));
      set_known(n, 0, std::move(t));
    } else if (const auto *f = attr(n, "value_float")) {
      HostTensor t = HostTensor::zeros({DType::kF32, {}});
      t.as<float>()[0] = f->f();
      set_known(n, 0, std::move(t));
    } else if (const auto *i = attr(n, "value_int")) {
      set_known(n, 0, i64_tensor({i->i()}, true));
    } else if (const auto *is = attr(n, "value_ints")) {
      set_known(n, 0, i64_tensor({is->ints().begin(), is->ints().end()}));
    } else if (const auto *fs_ = attr(n, "value_floats")) {
      HostTensor t = HostTensor::zeros({DType::kF32, {fs_->floats_size()}});
      std::copy(fs_->floats().begin(), fs_->floats().end(), t.as<float>());
      set_known(n, 0, std::move(t));
    } else {
      return unimplemented("a Constant without value, value_float(s) or value_int(s)");
    }
    return Status::ok();
  }

  // Shape: known at import from the input's type, between start and end.
  Status convert_shape(const onnx::NodeProto &n, const std::vector<std::string> &ins) {
    ASSIGN_OR_RETURN(TensorType type, type_of(ins.at(0)));
    std::vector<int64_t> dims(type.shape.begin(), type.shape.end());
    const int64_t rank = static_cast<int64_t>(dims.size());
    int64_t start = attr_int(n, "start", 0), end = attr_int(n, "end", rank);
    if (start < 0) start += rank;
    if (end < 0) end += rank;
    start = std::clamp<int64_t>(start, 0, rank);
    end = std::clamp<int64_t>(end, start, rank);
    set_known(n, 0, i64_tensor({dims.begin() + start, dims.begin() + end}));
    return Status::ok();
  }

  // ConstantOfShape: a known shape filled with the value (0.0f by default).
  Status convert_constant_of_shape(const onnx::NodeProto &n) {
    ASSIGN_OR_RETURN(std::vector<int64_t> shape, known_ints(n, 0, "shape"));
    HostTensor fill = HostTensor::zeros({DType::kF32, {1}});
    if (const auto *a = attr(n, "value")) {
      ASSIGN_OR_RETURN(fill, tensor_of(a->t(), "its value"));
    }
    for (int64_t d : shape)
      if (d < 0) return invalid_argument("ConstantOfShape with negative dim ", d);
    ASSIGN_OR_RETURN(HostTensor t,
                     folded_tensor(fill.type.dtype, Shape(shape.begin(), shape.end())));
    const size_t width = dtype_size(fill.type.dtype);
    for (int64_t i = 0; i < t.type.num_elements(); ++i)
      std::memcpy(t.data() + static_cast<size_t>(i) * width, fill.data(), width);
    set_known(n, 0, std::move(t));
    return Status::ok();
  }

  // Range: computed at import from known start, limit and delta.
  Status convert_range(const onnx::NodeProto &n, const std::vector<std::string> &ins) {
    for (int i = 0; i < 3; ++i)
      if (known(input(n, i)) == nullptr)
        return unimplemented("Range over values computed at run time");
    const HostTensor &start = *known(ins[0]);
    const double s = scalar_of(start), l = scalar_of(*known(ins[1])), d = scalar_of(*known(ins[2]));
    if (d == 0) return invalid_argument("Range with delta 0");
    const double steps = std::ceil((l - s) / d);
    if (!(steps <= static_cast<double>(kMaxTensorElements))) // NaN too
      return invalid_argument("Range from ", s, " to ", l, " by ", d, " has ", steps, " elements");
    const int64_t count = std::max<int64_t>(0, static_cast<int64_t>(steps));
    ASSIGN_OR_RETURN(HostTensor t, folded_tensor(start.type.dtype, {count}));
    for (int64_t i = 0; i < count; ++i) {
      const double v = s + static_cast<double>(i) * d;
      if (start.type.dtype == DType::kI64)
        t.as<int64_t>()[i] = static_cast<int64_t>(v);
      else if (start.type.dtype == DType::kI32)
        t.as<int32_t>()[i] = static_cast<int32_t>(v);
      else
        t.as<float>()[i] = static_cast<float>(v);
    }
    set_known(n, 0, std::move(t));
    return Status::ok();
  }

  // Slice: starts, ends, axes and steps are inputs, known at import.
  Status convert_slice(const onnx::NodeProto &n, const std::vector<std::string> &ins,
                       const std::vector<std::string> &outs) {
    ASSIGN_OR_RETURN(std::vector<int64_t> starts, known_ints(n, 1, "starts"));
    ASSIGN_OR_RETURN(std::vector<int64_t> ends, known_ints(n, 2, "ends"));
    Attrs attrs = {{"starts", starts}, {"ends", ends}};
    if (!input(n, 3).empty()) {
      ASSIGN_OR_RETURN(std::vector<int64_t> axes, known_ints(n, 3, "axes"));
      attrs.push_back({"axes", axes});
    }
    if (!input(n, 4).empty()) {
      ASSIGN_OR_RETURN(std::vector<int64_t> steps, known_ints(n, 4, "steps"));
      attrs.push_back({"steps", steps});
    }
    return emit_one(n, outs, "Slice", {ins.at(0)}, std::move(attrs));
  }

  // Squeeze and Unsqueeze: the axes an attribute (before opset 13) or an input.
  Status convert_squeeze(const onnx::NodeProto &n, const std::vector<std::string> &ins,
                         const std::vector<std::string> &outs) {
    const std::string &op = n.op_type();
    std::optional<std::vector<int64_t>> axes = attr_ints(n, "axes");
    if (!input(n, 1).empty()) {
      ASSIGN_OR_RETURN(std::vector<int64_t> from_input, known_ints(n, 1, "axes"));
      axes = from_input;
    }
    Attrs attrs;
    if (axes)
      attrs.push_back({"axes", *axes});
    else if (op == "Unsqueeze")
      return invalid_argument("Unsqueeze without axes");
    return emit_one(n, outs, op, {ins.at(0)}, std::move(attrs));
  }

  // Softmax and LogSoftmax, with the coerced 2-D form of opsets before 13.
  Status convert_softmax(const onnx::NodeProto &n, const std::vector<std::string> &ins,
                         const std::vector<std::string> &outs) {
    const std::string &op = n.op_type();
    ASSIGN_OR_RETURN(TensorType type, type_of(ins.at(0)));
    const int64_t rank = type.rank();
    int64_t axis = attr_int(n, "axis", opset_ < 13 ? 1 : -1);
    if (axis < 0) axis += rank;
    if (opset_ >= 13 || axis == rank - 1)
      return emit_one(n, outs, op, {ins.at(0)}, {{"axis", axis}});
    // Before opset 13 the input is viewed as 2-D at `axis` and normalized over
    // the trailing block: flatten, normalize the last dim, restore.
    const std::string flat = str_cat(outs[0], ".flat"), normed = str_cat(outs[0], ".normed");
    RETURN_IF_ERROR(emit("Flatten", {ins[0]}, {{"axis", axis}}, {flat}, n.name() + ".flatten"));
    RETURN_IF_ERROR(emit(op, {flat}, {{"axis", int64_t{-1}}}, {normed}, n.name()));
    return emit("Reshape", {normed},
                {{"shape", std::vector<int64_t>(type.shape.begin(), type.shape.end())}}, {outs[0]},
                n.name() + ".restore");
  }

  // ReduceMean, ReduceSum, ReduceMax: the axes an attribute or an input.
  Status convert_reduce(const onnx::NodeProto &n, const std::vector<std::string> &ins,
                        const std::vector<std::string> &outs) {
    const std::string &op = n.op_type();
    std::optional<std::vector<int64_t>> axes = attr_ints(n, "axes");
    if (!input(n, 1).empty()) {
      ASSIGN_OR_RETURN(std::vector<int64_t> from_input, known_ints(n, 1, "axes"));
      axes = from_input;
    }
    if (attr_int(n, "noop_with_empty_axes", 0) != 0 && (!axes || axes->empty()))
      return emit_one(n, outs, "Identity", {ins.at(0)});
    Attrs attrs = {{"keepdims", attr_int(n, "keepdims", 1)}};
    if (axes) attrs.push_back({"axes", *axes});
    return emit_one(n, outs, op, {ins.at(0)}, std::move(attrs));
  }

  // Clip: bounds as attributes before opset 11, known inputs after.
  Status convert_clip(const onnx::NodeProto &n, const std::vector<std::string> &ins,
                      const std::vector<std::string> &outs) {
    Attrs attrs;
    auto bound = [&](int i, const char *key) -> Status {
      if (input(n, i).empty()) return Status::ok();
      const HostTensor *k = known(input(n, i));
      if (k == nullptr) return unimplemented("a Clip ", key, " computed at run time");
      attrs.push_back({key, scalar_of(*k)});
      return Status::ok();
    };
    if (opset_ < 11) {
      if (const auto *a = attr(n, "min")) attrs.push_back({"min", static_cast<double>(a->f())});
      if (const auto *a = attr(n, "max")) attrs.push_back({"max", static_cast<double>(a->f())});
    } else {
      RETURN_IF_ERROR(bound(1, "min"));
      RETURN_IF_ERROR(bound(2, "max"));
    }
    return emit_one(n, outs, "Clip", {ins.at(0)}, std::move(attrs));
  }

  Status convert_window(const onnx::NodeProto &n, const std::vector<std::string> &ins,
                        const std::vector<std::string> &outs) {
    const std::string &op = n.op_type();
    ASSIGN_OR_RETURN(TensorType x, type_of(ins.at(0)));
    if (x.rank() != 4)
      return unimplemented(op, " over ", x.to_string(), " (strata has the 2-D form, rank-4 input)");
    std::vector<int64_t> kernel;
    if (op == "Conv") {
      ASSIGN_OR_RETURN(TensorType w, type_of(ins.at(1)));
      if (w.rank() != 4)
        return invalid_argument("Conv's weight is ", w.to_string(), "; the 2-D form takes rank 4");
      kernel = {w.shape[2], w.shape[3]};
    } else {
      auto k = attr_ints(n, "kernel_shape");
      if (!k || k->size() != 2) return invalid_argument(op, " needs a 2-D kernel_shape");
      kernel = *k;
    }
    std::vector<int64_t> strides = attr_ints(n, "strides").value_or(std::vector<int64_t>{1, 1});
    std::vector<int64_t> dilations = attr_ints(n, "dilations").value_or(std::vector<int64_t>{1, 1});
    std::vector<int64_t> pads = attr_ints(n, "pads").value_or(std::vector<int64_t>{0, 0, 0, 0});
    // The op's own checks come later; the padding computed here needs these.
    if (strides.size() != 2 || dilations.size() != 2 || pads.size() != 4)
      return invalid_argument(op, " has ", strides.size(), " strides, ", dilations.size(),
                              " dilations and ", pads.size(),
                              " pads; the 2-D form takes 2, 2 and 4");
    for (int64_t v : strides)
      if (v < 1) return invalid_argument(op, " has stride ", v, "; strides are at least 1");
    const std::string auto_pad = attr_string(n, "auto_pad", "NOTSET");
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      // Output = ceil(input / stride); the padding splits, the extra one at the
      // end (UPPER) or the start (LOWER).
      for (int d = 0; d < 2; ++d) {
        const int64_t in = x.shape[2 + d], s = strides[d];
        const int64_t out = (in + s - 1) / s;
        const int64_t total =
            std::max<int64_t>(0, (out - 1) * s + (kernel[d] - 1) * dilations[d] + 1 - in);
        const int64_t small = total / 2, big = total - small;
        pads[d] = auto_pad == "SAME_UPPER" ? small : big;
        pads[2 + d] = auto_pad == "SAME_UPPER" ? big : small;
      }
    } else if (auto_pad == "VALID") {
      pads = {0, 0, 0, 0};
    } else if (auto_pad != "NOTSET") {
      return invalid_argument(op, " auto_pad '", auto_pad, "'");
    }
    if (op == "Conv") {
      std::vector<std::string> inputs = {ins.at(0), ins.at(1)};
      if (!input(n, 2).empty()) inputs.push_back(ins[2]);
      return emit("Conv2d", inputs,
                  {{"strides", strides},
                   {"pads", pads},
                   {"dilations", dilations},
                   {"group", attr_int(n, "group", 1)}},
                  {outs.at(0)}, n.name());
    }
    if (op == "MaxPool") {
      if (outs.size() > 1 && !outs[1].empty()) return unimplemented("MaxPool's Indices output");
      return emit("MaxPool2d", {ins.at(0)},
                  {{"kernel_shape", kernel},
                   {"strides", strides},
                   {"pads", pads},
                   {"dilations", dilations},
                   {"ceil_mode", attr_int(n, "ceil_mode", 0)}},
                  {outs.at(0)}, n.name());
    }
    return emit("AveragePool2d", {ins.at(0)},
                {{"kernel_shape", kernel},
                 {"strides", strides},
                 {"pads", pads},
                 {"ceil_mode", attr_int(n, "ceil_mode", 0)},
                 {"count_include_pad", attr_int(n, "count_include_pad", 0)}},
                {outs.at(0)}, n.name());
  }

  // Comparisons, logic and Trilu have no strata op: they are folded when their
  // inputs are known at import (masks built from shapes and constants), and
  // refused otherwise.
  Status fold_logic(const onnx::NodeProto &n, const std::vector<std::string> &ins) {
    const std::string &op = n.op_type();
    std::vector<const HostTensor *> args;
    for (const std::string &in : ins) {
      if (in.empty()) continue;
      const HostTensor *k = known(in);
      if (k == nullptr)
        return unimplemented(op, " over '", in, "', which is computed at run time (strata folds ",
                             op, " only over values known at import)");
      args.push_back(k);
    }
    if (op == "Trilu") {
      const HostTensor &x = *args.at(0);
      if (x.type.rank() < 2) return invalid_argument("Trilu of ", x.type.to_string());
      const int64_t k = args.size() > 1 ? ints_of(*args[1]).at(0) : 0;
      const bool upper = attr_int(n, "upper", 1) != 0;
      HostTensor y = HostTensor::zeros(x.type);
      const int64_t rows = x.type.shape[x.type.rank() - 2], cols = x.type.shape.back();
      const size_t width = dtype_size(x.type.dtype);
      for (int64_t e = 0; e < x.type.num_elements(); ++e) {
        const int64_t i = (e / cols) % rows, j = e % cols;
        if (upper ? j - i >= k : j - i <= k)
          std::memcpy(y.data() + e * static_cast<int64_t>(width),
                      x.data() + e * static_cast<int64_t>(width), width);
      }
      set_known(n, 0, std::move(y));
      return Status::ok();
    }
    Shape shape = args[0]->type.shape;
    for (size_t a = 1; a < args.size(); ++a) {
      ASSIGN_OR_RETURN(shape, broadcast_shapes(shape, args[a]->type.shape));
    }
    ASSIGN_OR_RETURN(HostTensor y, folded_tensor(DType::kBool, shape));
    const int64_t total = y.type.num_elements();
    const Shape out_strides = contiguous_strides(shape);
    std::vector<Shape> own;
    for (const HostTensor *arg : args)
      own.push_back(contiguous_strides(arg->type.shape));
    for (int64_t e = 0; e < total; ++e) {
      double v[2] = {0, 0};
      for (size_t a = 0; a < args.size(); ++a) {
        // The element of argument a that output element e reads.
        const Shape &dims = args[a]->type.shape;
        const size_t offset = shape.size() - dims.size();
        int64_t at = 0;
        for (size_t d = 0; d < dims.size(); ++d) {
          const int64_t i = (e / out_strides[offset + d]) % shape[offset + d];
          if (dims[d] != 1) at += i * own[a][d];
        }
        v[a] = element_of(*args[a], at);
      }
      bool r = false;
      if (op == "Equal")
        r = v[0] == v[1];
      else if (op == "Less")
        r = v[0] < v[1];
      else if (op == "Greater")
        r = v[0] > v[1];
      else if (op == "LessOrEqual")
        r = v[0] <= v[1];
      else if (op == "GreaterOrEqual")
        r = v[0] >= v[1];
      else if (op == "Not")
        r = v[0] == 0;
      else if (op == "And")
        r = v[0] != 0 && v[1] != 0;
      else if (op == "Or")
        r = v[0] != 0 || v[1] != 0;
      y.as<uint8_t>()[e] = r;
    }
    set_known(n, 0, std::move(y));
    return Status::ok();
  }

  // Constant-mode Pad: along each padded axis, Concat blocks of the pad value
  // before and after (negative pads crop with Slice).
  Status convert_pad(const onnx::NodeProto &n, const std::vector<std::string> &ins,
                     const std::vector<std::string> &outs) {
    const std::string mode = attr_string(n, "mode", "constant");
    if (mode != "constant") return unimplemented("Pad mode '", mode, "' (only constant)");
    ASSIGN_OR_RETURN(TensorType x, type_of(ins.at(0)));
    std::vector<int64_t> pads;
    if (opset_ < 11) {
      pads = attr_ints(n, "pads").value_or(std::vector<int64_t>{});
    } else {
      ASSIGN_OR_RETURN(pads, known_ints(n, 1, "pads"));
    }
    const int64_t rank = x.rank();
    std::vector<int64_t> axes;
    if (!input(n, 3).empty()) {
      ASSIGN_OR_RETURN(axes, known_ints(n, 3, "axes"));
    } else {
      for (int64_t a = 0; a < rank; ++a)
        axes.push_back(a);
    }
    if (pads.size() != 2 * axes.size())
      return invalid_argument("Pad has ", pads.size(), " pads for ", axes.size(), " axes");
    double fill = 0;
    if (!input(n, 2).empty()) {
      const HostTensor *k = known(input(n, 2));
      if (k == nullptr) return unimplemented("a Pad value computed at run time");
      fill = scalar_of(*k);
    }
    std::string current = ins[0];
    Shape shape = x.shape;
    const size_t count = axes.size();
    for (size_t i = 0; i < count; ++i) {
      int64_t axis = axes[i] < 0 ? axes[i] + rank : axes[i];
      const int64_t before = pads[i], after = pads[count + i];
      if (before == 0 && after == 0) continue;
      const std::string step = str_cat(outs[0], ".pad", axis);
      if (before < 0 || after < 0) {
        RETURN_IF_ERROR(
            emit("Slice", {current},
                 {{"starts", std::vector<int64_t>{std::max<int64_t>(0, -before)}},
                  {"ends", std::vector<int64_t>{shape[axis] - std::max<int64_t>(0, -after)}},
                  {"axes", std::vector<int64_t>{axis}}},
                 {step + ".crop"}, n.name() + ".crop" + std::to_string(axis)));
        current = step + ".crop";
        shape[axis] -= std::max<int64_t>(0, -before) + std::max<int64_t>(0, -after);
      }
      std::vector<std::string> parts;
      for (int64_t size :
           {std::max<int64_t>(0, before), int64_t{-1}, std::max<int64_t>(0, after)}) {
        if (size == -1) {
          parts.push_back(current);
          continue;
        }
        if (size == 0) continue;
        Shape block = shape;
        block[axis] = size;
        ASSIGN_OR_RETURN(HostTensor t, folded_tensor(x.dtype, block));
        if (x.dtype != DType::kF32 && fill != 0)
          return unimplemented("Pad of ", x.to_string(), " with a non-zero value");
        for (int64_t e = 0; e < t.type.num_elements() && x.dtype == DType::kF32; ++e)
          t.as<float>()[e] = static_cast<float>(fill);
        const std::string name = str_cat(step, parts.empty() ? ".before" : ".after");
        known_[name] = std::move(t);
        parts.push_back(name);
      }
      shape[axis] += std::max<int64_t>(0, before) + std::max<int64_t>(0, after);
      const std::string next = i + 1 == count ? outs[0] : step;
      RETURN_IF_ERROR(emit("Concat", parts, {{"axis", axis}}, {next},
                           n.name() + ".pad" + std::to_string(axis)));
      current = next;
    }
    if (current != outs[0]) return emit("Identity", {current}, {}, {outs[0]}, n.name());
    return Status::ok();
  }

  Status convert_split(const onnx::NodeProto &n, const std::vector<std::string> &ins,
                       const std::vector<std::string> &outs) {
    ASSIGN_OR_RETURN(TensorType x, type_of(ins.at(0)));
    int64_t axis = attr_int(n, "axis", 0);
    if (axis < 0) axis += x.rank();
    if (axis < 0 || axis >= x.rank()) return invalid_argument("Split axis out of range");
    std::optional<std::vector<int64_t>> sizes = attr_ints(n, "split");
    if (!input(n, 1).empty()) {
      ASSIGN_OR_RETURN(std::vector<int64_t> from_input, known_ints(n, 1, "split"));
      sizes = from_input;
    }
    if (!sizes) {
      // Equal parts, the last one smaller if the dim does not divide (opset 18's rule).
      const int64_t parts = static_cast<int64_t>(outs.size()), dim = x.shape[axis];
      const int64_t each = (dim + parts - 1) / parts;
      sizes.emplace();
      for (int64_t p = 0, left = dim; p < parts; ++p, left -= each)
        sizes->push_back(std::min(each, left));
    }
    return emit("Split", {ins.at(0)}, {{"axis", axis}, {"split", *sizes}}, outs, n.name());
  }

  const onnx::ModelProto &model_;
  const OnnxImportOptions &options_;
  const fs::path dir_;
  const std::string file_;
  std::vector<std::string> *warnings_;
  std::vector<std::string> *external_files_;
  GraphBuilder builder_;
  int opset_ = 0;
  std::map<std::string, HostTensor> known_;
  int64_t folded_bytes_ = 0; // of the constants folded_tensor made
  std::set<std::string> initializers_;
  std::map<std::string, TensorId> ids_;
};

} // namespace

bool onnx_import_built() { return true; }

Result<Graph> import_onnx(const std::string &path, const OnnxImportOptions &options,
                          std::vector<std::string> *warnings,
                          std::vector<std::string> *external_files) {
  ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, read_file(path, kMaxModelBytes));
  onnx::ModelProto model;
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return data_loss(path, ": not a valid ONNX model (the protobuf does not parse: truncated or "
                           "not an .onnx file)");
  if (!model.has_graph()) return invalid_argument(path, ": the model has no graph");
  Importer importer(model, options,
                    fs::path(path).parent_path().empty() ? fs::path(".")
                                                         : fs::path(path).parent_path(),
                    path, warnings, external_files);
  return importer.run();
}

} // namespace strata::serialization
