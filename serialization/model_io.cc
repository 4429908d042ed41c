#include "serialization/model_io.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include <flatbuffers/flatbuffers.h>
#include <flatbuffers/idl.h>

#include "graph/verifier.h"
#include "ops/registry.h"
#include "serialization/file_io.h"
#include "serialization/json_text.h"
#include "serialization/model_generated.h"
#include "serialization/model_io_internal.h"
#include "serialization/model_schema.h"
#include "serialization/safetensors.h"

namespace strata::serialization {
namespace {

namespace fs = std::filesystem;

// The newest schema revision this build reads and writes. A graph without
// state tensors and updates is written as revision 1 (see model.fbs).
constexpr uint32_t kSchemaVersion = 2;
// FlatBuffers offsets are 32-bit: no buffer reaches 2 GiB.
constexpr uint64_t kMaxModelBytes = FLATBUFFERS_MAX_BUFFER_SIZE - 1;
// JSON text is bigger than its binary; this bounds what the parser is handed.
constexpr uint64_t kMaxJsonBytes = uint64_t{1} << 30;
constexpr size_t kDataAlignment = 64;

} // namespace

std::string producer_string() { return std::string("strata ") + STRATA_VERSION; }

namespace {

// ---------------------------------------------------------------------------
// Writing

fb::DType to_fb(DType dtype) { return static_cast<fb::DType>(dtype); }
fb::TensorKind to_fb(TensorKind kind) { return static_cast<fb::TensorKind>(kind); }
fb::InitializerKind to_fb(Initializer::Kind kind) { return static_cast<fb::InitializerKind>(kind); }

flatbuffers::Offset<fb::Attribute> write_attribute(flatbuffers::FlatBufferBuilder &builder,
                                                   const Attribute &attr) {
  auto name = builder.CreateString(attr.name);
  flatbuffers::Offset<flatbuffers::String> s;
  flatbuffers::Offset<flatbuffers::Vector<int64_t>> ints;
  flatbuffers::Offset<flatbuffers::Vector<double>> floats;
  if (const auto *v = std::get_if<std::string>(&attr.value)) s = builder.CreateString(*v);
  if (const auto *v = std::get_if<std::vector<int64_t>>(&attr.value))
    ints = builder.CreateVector(*v);
  if (const auto *v = std::get_if<std::vector<double>>(&attr.value))
    floats = builder.CreateVector(*v);
  fb::AttributeBuilder table(builder);
  table.add_name(name);
  if (const auto *v = std::get_if<int64_t>(&attr.value)) table.add_i(*v);
  if (const auto *v = std::get_if<double>(&attr.value)) table.add_f(*v);
  if (!s.IsNull()) table.add_s(s);
  if (!ints.IsNull()) table.add_ints(ints);
  if (!floats.IsNull()) table.add_floats(floats);
  return table.Finish();
}

uint64_t inline_data_bytes(const Graph &graph, const std::map<TensorId, ExternalData> &external) {
  uint64_t inline_bytes = 0;
  for (TensorId id = 0; id < graph.num_tensors(); ++id) {
    const Tensor &t = graph.tensor(id);
    if (t.data != nullptr && !external.count(id)) inline_bytes += t.data->size() + kDataAlignment;
  }
  return inline_bytes;
}

// Revision 2 is needed only by graphs with state tensors or updates; others
// are written as revision 1 so their bytes stay what they always were.
uint32_t needed_schema_version(const Graph &graph) {
  if (!graph.updates().empty()) return 2;
  for (const Tensor &t : graph.tensors())
    if (t.kind == TensorKind::kState) return 2;
  return 1;
}

} // namespace

// Builds the canonical Model table. Every object is created in a fixed order
// from the graph, so equal graphs give equal bytes. `external` overrides the
// value source of the tensors it names (used when saving weights beside the model).
flatbuffers::Offset<fb::Model> write_model_table(flatbuffers::FlatBufferBuilder &builder,
                                                 const Graph &graph,
                                                 const std::map<TensorId, ExternalData> &external) {
  std::vector<flatbuffers::Offset<fb::Tensor>> tensors;
  tensors.reserve(graph.num_tensors());
  for (TensorId id = 0; id < graph.num_tensors(); ++id) {
    const Tensor &t = graph.tensor(id);
    auto name = builder.CreateString(t.name);
    auto shape = builder.CreateVector(t.type.shape.data(), t.type.shape.size());
    flatbuffers::Offset<flatbuffers::Vector<uint8_t>> data;
    flatbuffers::Offset<fb::ExternalData> ext;
    const ExternalData *ext_source = nullptr;
    if (auto it = external.find(id); it != external.end()) {
      ext_source = &it->second;
    } else if (t.external) {
      ext_source = &*t.external;
    }
    if (ext_source != nullptr) {
      auto path = builder.CreateString(ext_source->path);
      auto key = builder.CreateString(ext_source->key);
      ext = fb::CreateExternalData(builder, path, key);
    } else if (t.data != nullptr) {
      // What ForceVectorAlignment does, without its assertion that caps the
      // alignment at FLATBUFFERS_MAX_ALIGNMENT (32 in FlatBuffers 2.0.8).
      if (t.data->size() > 0) builder.PreAlign(t.data->size(), kDataAlignment);
      data = builder.CreateVector(t.data->bytes().data(), t.data->size());
    }
    flatbuffers::Offset<fb::Initializer> init;
    if (t.initializer.kind != Initializer::Kind::kNone)
      init = fb::CreateInitializer(builder, to_fb(t.initializer.kind), t.initializer.a,
                                   t.initializer.b, t.initializer.seed);
    fb::TensorBuilder table(builder);
    table.add_name(name);
    table.add_dtype(to_fb(t.type.dtype));
    table.add_shape(shape);
    table.add_kind(to_fb(t.kind));
    if (!data.IsNull()) table.add_data(data);
    if (!ext.IsNull()) table.add_external(ext);
    if (!init.IsNull()) table.add_initializer(init);
    tensors.push_back(table.Finish());
  }

  std::vector<flatbuffers::Offset<fb::Node>> nodes;
  nodes.reserve(graph.num_nodes());
  for (const Node &node : graph.nodes()) {
    auto name = builder.CreateString(node.name);
    auto op = builder.CreateString(node.op);
    auto inputs = builder.CreateVector(node.inputs.data(), node.inputs.size());
    auto outputs = builder.CreateVector(node.outputs.data(), node.outputs.size());
    std::vector<flatbuffers::Offset<fb::Attribute>> attrs;
    attrs.reserve(node.attrs.size());
    for (const Attribute &attr : node.attrs)
      attrs.push_back(write_attribute(builder, attr));
    auto attr_vector = builder.CreateVector(attrs);
    nodes.push_back(fb::CreateNode(builder, name, op, inputs, outputs, attr_vector));
  }

  auto name = builder.CreateString(graph.name());
  auto tensor_vector = builder.CreateVector(tensors);
  auto node_vector = builder.CreateVector(nodes);
  auto inputs = builder.CreateVector(graph.inputs().data(), graph.inputs().size());
  auto outputs = builder.CreateVector(graph.outputs().data(), graph.outputs().size());
  auto producer = builder.CreateString(producer_string());
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::StateUpdate>>> updates;
  if (!graph.updates().empty()) {
    std::vector<flatbuffers::Offset<fb::StateUpdate>> list;
    for (const StateUpdate &update : graph.updates())
      list.push_back(fb::CreateStateUpdate(builder, update.target, update.value));
    updates = builder.CreateVector(list);
  }
  return fb::CreateModel(builder, needed_schema_version(graph), name, tensor_vector, node_vector,
                         inputs, outputs, producer, updates);
}

namespace {

Result<std::vector<uint8_t>> build_flatbuffer(const Graph &graph,
                                              const std::map<TensorId, ExternalData> &external) {
  uint64_t inline_bytes = inline_data_bytes(graph, external);
  if (inline_bytes >= kMaxModelBytes / 2)
    return out_of_range("the model holds ", inline_bytes,
                        " bytes of inline data, too much for one FlatBuffer (2 GiB); save it "
                        "with external_threshold_bytes set so large weights go to a "
                        ".safetensors file");
  flatbuffers::FlatBufferBuilder builder(1024 + inline_bytes);
  fb::FinishModelBuffer(builder, write_model_table(builder, graph, external));
  return std::vector<uint8_t>(builder.GetBufferPointer(),
                              builder.GetBufferPointer() + builder.GetSize());
}

// ---------------------------------------------------------------------------
// JSON text (the helpers and why they exist: serialization/json_text.h)

using namespace json_text;

void append_attribute(std::string &out, const fb::Attribute &attr) {
  out += "{\"name\": ";
  append_json_string(out, attr.name());
  if (attr.i()) out += ", \"i\": " + std::to_string(*attr.i());
  if (attr.f()) {
    out += ", \"f\": ";
    append_double(out, *attr.f());
  }
  if (attr.s()) {
    out += ", \"s\": ";
    append_json_string(out, attr.s());
  }
  if (attr.ints()) {
    out += ", \"ints\": ";
    append_number_list(out, attr.ints());
  }
  if (attr.floats()) {
    out += ", \"floats\": ";
    append_number_list(out, attr.floats());
  }
  out += '}';
}

} // namespace

std::string model_json_text(const fb::Model &model) {
  std::string out;
  JsonObjectWriter root(out, 0);
  root.key("schema_version") += std::to_string(model.schema_version());
  append_json_string(root.key("name"), model.name());
  append_table_list(root.key("tensors"), model.tensors(), 2, [&](const fb::Tensor &t, int indent) {
    JsonObjectWriter obj(out, indent);
    append_json_string(obj.key("name"), t.name());
    append_json_string(obj.key("dtype"), fb::EnumNameDType(t.dtype()));
    append_number_list(obj.key("shape"), t.shape());
    append_json_string(obj.key("kind"), fb::EnumNameTensorKind(t.kind()));
    if (t.data()) append_number_list(obj.key("data"), t.data());
    if (const fb::ExternalData *ext = t.external()) {
      std::string &o = obj.key("external");
      o += "{\"path\": ";
      append_json_string(o, ext->path());
      o += ", \"key\": ";
      append_json_string(o, ext->key());
      o += '}';
    }
    if (const fb::Initializer *init = t.initializer()) {
      std::string &o = obj.key("initializer");
      o += "{\"kind\": \"";
      o += fb::EnumNameInitializerKind(init->kind());
      o += "\", \"a\": ";
      append_double(o, init->a());
      o += ", \"b\": ";
      append_double(o, init->b());
      o += ", \"seed\": " + std::to_string(init->seed()) + "}";
    }
    obj.close();
  });
  append_table_list(root.key("nodes"), model.nodes(), 2, [&](const fb::Node &n, int indent) {
    JsonObjectWriter obj(out, indent);
    append_json_string(obj.key("name"), n.name());
    append_json_string(obj.key("op"), n.op());
    append_number_list(obj.key("inputs"), n.inputs());
    append_number_list(obj.key("outputs"), n.outputs());
    if (n.attrs() && n.attrs()->size() > 0)
      append_table_list(obj.key("attrs"), n.attrs(), indent + 2,
                        [&](const fb::Attribute &a, int) { append_attribute(out, a); });
    obj.close();
  });
  append_number_list(root.key("inputs"), model.inputs());
  append_number_list(root.key("outputs"), model.outputs());
  append_json_string(root.key("producer"), model.producer());
  if (model.updates() && model.updates()->size() > 0)
    append_table_list(root.key("updates"), model.updates(), 2, [&](const fb::StateUpdate &u, int) {
      out += str_cat("{\"target\": ", u.target(), ", \"value\": ", u.value(), "}");
    });
  root.close();
  out += '\n';
  return out;
}

namespace {

// ---------------------------------------------------------------------------
// Loading

// Error prefixes: "file: tensor 'w1'" or, for a tensor without a name, "file: tensor 3".
std::string describe(std::string_view kind, uint32_t index, const flatbuffers::String *name) {
  if (name != nullptr && name->size() > 0) return str_cat(kind, " '", name->string_view(), "'");
  return str_cat(kind, " ", index);
}

// Every name in the model (its own and its tensors', nodes', ops' and
// attributes') is UTF-8 text without NUL bytes, checked before any error
// quotes one; the tensor or node is named by its index.
Status check_model_names(const fb::Model &model) {
  if (model.name()) RETURN_IF_ERROR(check_name("field name", model.name()->string_view()));
  if (model.tensors())
    for (uint32_t id = 0; id < model.tensors()->size(); ++id)
      if (const flatbuffers::String *name = model.tensors()->Get(id)->name())
        RETURN_IF_ERROR(
            check_name("field name", name->string_view()).with_context(str_cat("tensor ", id)));
  if (model.nodes())
    for (uint32_t id = 0; id < model.nodes()->size(); ++id) {
      const fb::Node &n = *model.nodes()->Get(id);
      const std::string where = str_cat("node ", id);
      if (n.name())
        RETURN_IF_ERROR(check_name("field name", n.name()->string_view()).with_context(where));
      if (n.op())
        RETURN_IF_ERROR(check_name("field op", n.op()->string_view()).with_context(where));
      for (uint32_t i = 0; n.attrs() && i < n.attrs()->size(); ++i)
        if (const flatbuffers::String *name = n.attrs()->Get(i)->name())
          RETURN_IF_ERROR(check_name(str_cat("field attrs[", i, "].name"), name->string_view())
                              .with_context(where));
    }
  return Status::ok();
}

} // namespace

std::string printable(llvm::ArrayRef<uint8_t> bytes) {
  return escape_bytes(std::string_view(reinterpret_cast<const char *>(bytes.data()), bytes.size()));
}

namespace {

// External paths are relative, have no `..` component, and (following symlinks
// that exist) resolve to a place inside the model's folder.
Status check_external_path(std::string_view path, std::string_view model_dir) {
  if (path.empty()) return invalid_argument("field external.path is empty");
  if (path.find('\0') != std::string_view::npos)
    return invalid_argument("field external.path contains a NUL byte");
  fs::path relative(path);
  if (relative.is_absolute() || relative.has_root_name() || relative.has_root_directory())
    return invalid_argument("field external.path '", path,
                            "' is absolute; it must be relative to the model's folder");
  for (const fs::path &part : relative)
    if (part == "..")
      return invalid_argument("field external.path '", path,
                              "' has a '..' component; it must stay inside the model's folder");
  fs::path folder = model_dir.empty() ? fs::path(".") : fs::path(model_dir);
  std::error_code error;
  fs::path canonical_folder = fs::weakly_canonical(folder, error);
  if (error) return Status::ok(); // no folder to resolve against: the lexical checks stand
  fs::path resolved = fs::weakly_canonical(folder / relative, error);
  if (error)
    return invalid_argument("field external.path '", path,
                            "' cannot be resolved: ", error.message());
  fs::path inside = resolved.lexically_relative(canonical_folder);
  if (inside.empty() || *inside.begin() == ".." || inside.is_absolute())
    return invalid_argument("field external.path '", path, "' resolves to '", resolved.string(),
                            "', outside the model's folder (through a symbolic link)");
  return Status::ok();
}

Result<AttrValue> read_attribute_value(const fb::Attribute &attr) {
  int count = attr.i().has_value() + attr.f().has_value() + (attr.s() != nullptr) +
              (attr.ints() != nullptr) + (attr.floats() != nullptr);
  if (count != 1)
    return invalid_argument("has ", count,
                            " values; exactly one of the fields i, f, s, ints, floats is needed");
  if (attr.i()) return AttrValue(*attr.i());
  if (attr.f()) return AttrValue(*attr.f());
  if (attr.s()) return AttrValue(attr.s()->str());
  if (attr.ints()) return AttrValue(copy_numbers(*attr.ints()));
  return AttrValue(copy_numbers(*attr.floats()));
}

} // namespace

// Semantic checks and conversion of a verified buffer.
Result<Graph> graph_from_model(const fb::Model &model, std::string_view model_dir) {
  if (model.schema_version() == 0) return invalid_argument("field schema_version is missing");
  if (model.schema_version() > kSchemaVersion)
    return failed_precondition("the file has schema version ", model.schema_version(),
                               " but this build of strata reads versions up to ", kSchemaVersion,
                               "; use a newer strata");

  RETURN_IF_ERROR(check_model_names(model));
  Graph graph(model.name() ? model.name()->str() : std::string());
  uint32_t num_tensors = model.tensors() ? model.tensors()->size() : 0;
  if (model.tensors())
    for (uint32_t id = 0; id < num_tensors; ++id) {
      const fb::Tensor &t = *model.tensors()->Get(id);
      std::string where = describe("tensor", id, t.name());
      auto fail = [&](const Status &status) { return status.with_context(where); };
      if (t.name() == nullptr || t.name()->size() == 0)
        return invalid_argument(where, ": field name is missing");
      auto dtype = static_cast<uint8_t>(t.dtype());
      if (dtype > static_cast<uint8_t>(fb::DType::MAX))
        return invalid_argument(where, ": field dtype has unknown value ", int{dtype});
      auto kind = static_cast<uint8_t>(t.kind());
      if (kind > static_cast<uint8_t>(fb::TensorKind::MAX))
        return invalid_argument(where, ": field kind has unknown value ", int{kind});

      Tensor tensor;
      tensor.name = t.name()->str();
      tensor.type.dtype = static_cast<DType>(dtype);
      tensor.kind = static_cast<TensorKind>(kind);
      if (t.shape()) {
        std::vector<int64_t> dims = copy_numbers(*t.shape());
        tensor.type.shape.assign(dims.begin(), dims.end());
      }
      // Count elements with overflow checks before anything is multiplied by
      // the element size or allocated.
      auto count = checked_num_elements(tensor.type.shape);
      if (!count.is_ok()) return fail(count.status().with_context("field shape"));
      int64_t needed = *count * static_cast<int64_t>(dtype_size(tensor.type.dtype));

      if (t.data()) {
        if (static_cast<int64_t>(t.data()->size()) != needed)
          return invalid_argument(where, ": field data has ", t.data()->size(), " bytes but ",
                                  tensor.type.to_string(), " needs ", needed);
        tensor.data = Blob::copy_of(t.data()->data(), t.data()->size());
      }
      if (const fb::ExternalData *ext = t.external()) {
        if (auto status =
                check_external_path(ext->path() ? ext->path()->string_view() : "", model_dir);
            !status.is_ok())
          return fail(status);
        if (ext->key() == nullptr || ext->key()->size() == 0)
          return invalid_argument(where, ": field external.key is empty");
        tensor.external = ExternalData{ext->path()->str(), ext->key()->str()};
      }
      if (const fb::Initializer *init = t.initializer()) {
        auto init_kind = static_cast<uint8_t>(init->kind());
        if (init_kind > static_cast<uint8_t>(fb::InitializerKind::MAX))
          return invalid_argument(where, ": field initializer.kind has unknown value ",
                                  int{init_kind});
        tensor.initializer = Initializer{static_cast<Initializer::Kind>(init_kind), init->a(),
                                         init->b(), init->seed()};
      }
      auto added = graph.add_tensor(std::move(tensor));
      if (!added.is_ok()) return fail(added.status());
    }

  std::vector<bool> produced(num_tensors, false);
  if (model.nodes())
    for (uint32_t id = 0; id < model.nodes()->size(); ++id) {
      const fb::Node &n = *model.nodes()->Get(id);
      std::string where = describe("node", id, n.name());
      if (n.name() == nullptr || n.name()->size() == 0)
        return invalid_argument(where, ": field name is missing");
      if (n.op() == nullptr || n.op()->size() == 0)
        return invalid_argument(where, ": field op is missing");
      where += str_cat(" (", n.op()->string_view(), ")");
      Node node;
      node.name = n.name()->str();
      node.op = n.op()->str();
      if (n.inputs())
        for (uint32_t i = 0; i < n.inputs()->size(); ++i) {
          uint32_t input = n.inputs()->Get(i);
          if (input >= num_tensors)
            return out_of_range(where, ": field inputs[", i, "] = ", input,
                                " is not a tensor index (the model has ", num_tensors, " tensors)");
          node.inputs.push_back(input);
        }
      if (n.outputs())
        for (uint32_t i = 0; i < n.outputs()->size(); ++i) {
          uint32_t output = n.outputs()->Get(i);
          if (output >= num_tensors)
            return out_of_range(where, ": field outputs[", i, "] = ", output,
                                " is not a tensor index (the model has ", num_tensors, " tensors)");
          if (produced[output])
            return invalid_argument(where, ": field outputs[", i, "]: tensor '",
                                    graph.tensor(output).name, "' is produced more than once");
          produced[output] = true;
          node.outputs.push_back(output);
        }
      if (n.attrs())
        for (uint32_t i = 0; i < n.attrs()->size(); ++i) {
          const fb::Attribute &a = *n.attrs()->Get(i);
          if (a.name() == nullptr || a.name()->size() == 0)
            return invalid_argument(where, ": field attrs[", i, "].name is missing");
          std::string attr_name = a.name()->str();
          if (node.find_attr(attr_name) != nullptr)
            return invalid_argument(where, ": attribute '", attr_name, "' is given twice");
          auto value = read_attribute_value(a);
          if (!value.is_ok())
            return value.status().with_context(str_cat(where, ": attribute '", attr_name, "'"));
          node.set_attr(std::move(attr_name), std::move(value).value());
        }
      auto added = graph.add_node(std::move(node));
      if (!added.is_ok()) return added.status().with_context(where);
    }

  if (model.inputs())
    for (uint32_t i = 0; i < model.inputs()->size(); ++i) {
      uint32_t id = model.inputs()->Get(i);
      if (id >= num_tensors)
        return out_of_range("field inputs[", i, "] = ", id,
                            " is not a tensor index (the model has ", num_tensors, " tensors)");
      graph.add_input(id);
    }
  if (model.outputs())
    for (uint32_t i = 0; i < model.outputs()->size(); ++i) {
      uint32_t id = model.outputs()->Get(i);
      if (id >= num_tensors)
        return out_of_range("field outputs[", i, "] = ", id,
                            " is not a tensor index (the model has ", num_tensors, " tensors)");
      graph.add_output(id);
    }

  if (model.updates())
    for (uint32_t i = 0; i < model.updates()->size(); ++i) {
      const fb::StateUpdate &u = *model.updates()->Get(i);
      for (uint32_t id : {u.target(), u.value()})
        if (id >= num_tensors)
          return out_of_range("field updates[", i, "].", id == u.target() ? "target" : "value",
                              " = ", id, " is not a tensor index (the model has ", num_tensors,
                              " tensors)");
      graph.add_update(StateUpdate{u.target(), u.value()});
    }
  if (model.schema_version() < 2 && needed_schema_version(graph) > 1)
    return invalid_argument("the file has schema version ", model.schema_version(),
                            " but uses state tensors or updates, which need version 2");

  // Types, shapes, cycles, updates and the ops themselves.
  RETURN_IF_ERROR(verify_graph(graph, ops::OpRegistry::global()));
  return graph;
}

Result<VerifiedBuffer> verify_structure(llvm::ArrayRef<uint8_t> bytes,
                                        std::string_view display_name, std::string_view kind,
                                        uint64_t max_bytes, const char *identifier,
                                        bool (*verify)(flatbuffers::Verifier &)) {
  if (bytes.size() < 8)
    return data_loss(display_name, ": only ", bytes.size(), " bytes; a ", kind,
                     " starts with an 8-byte header (truncated?)");
  if (bytes.size() > max_bytes)
    return out_of_range(display_name, ": ", bytes.size(), " bytes is more than a ", kind,
                        " can hold");
  // Builders pad every buffer to a multiple of its alignment (at least 4), so
  // any other size has lost bytes, even if only trailing padding.
  if (bytes.size() % 4 != 0)
    return data_loss(display_name, ": ", bytes.size(),
                     " bytes is not a whole FlatBuffer (a multiple of 4); truncated?");
  if (!flatbuffers::BufferHasIdentifier(bytes.data(), identifier))
    return invalid_argument(display_name, ": file identifier is '", printable(bytes.slice(4, 4)),
                            "' but a ", kind, " has '", identifier, "' (not a ",
                            kind.substr(kind.rfind(' ') + 1), " file?)");
  VerifiedBuffer buffer;
  buffer.data = bytes.data();
  if (reinterpret_cast<uintptr_t>(buffer.data) % alignof(uint64_t) != 0) {
    buffer.storage.resize((bytes.size() + 7) / 8);
    std::memcpy(buffer.storage.data(), bytes.data(), bytes.size());
    buffer.data = reinterpret_cast<const uint8_t *>(buffer.storage.data());
  }
  flatbuffers::Verifier::Options options;
  options.max_depth = 16;
  options.max_tables = 1 << 22;
  flatbuffers::Verifier verifier(buffer.data, bytes.size(), options);
  if (!verify(verifier))
    return data_loss(display_name,
                     ": the FlatBuffers structure is invalid (the file is truncated or corrupt)");
  return buffer;
}

namespace {

Result<Graph> load_verified_bytes(llvm::ArrayRef<uint8_t> bytes, std::string_view display_name,
                                  std::string_view model_dir) {
  ASSIGN_OR_RETURN(VerifiedBuffer buffer,
                   verify_structure(bytes, display_name, "strata model", kMaxModelBytes,
                                    fb::ModelIdentifier(), fb::VerifyModelBuffer));
  auto graph = graph_from_model(*fb::GetModel(buffer.data), model_dir);
  if (!graph.is_ok()) return graph.status().with_context(display_name);
  return graph;
}

std::string folder_of(const std::string &path) {
  fs::path folder = fs::path(path).parent_path();
  return folder.empty() ? std::string(".") : folder.string();
}

} // namespace

ModelFormat model_format_for_path(std::string_view path) {
  return fs::path(path).extension() == ".json" ? ModelFormat::kJson : ModelFormat::kBinary;
}

Result<Graph> load_model_from_buffer(llvm::ArrayRef<uint8_t> bytes, std::string_view display_name,
                                     std::string_view model_dir) {
  return load_verified_bytes(bytes, display_name, model_dir);
}

Result<std::vector<uint8_t>> json_to_flatbuffer(std::string_view json, const char *schema_text,
                                                std::string_view schema_name,
                                                std::string_view display_name) {
  if (json.size() > kMaxJsonBytes)
    return out_of_range(display_name, ": ", json.size(), " bytes of JSON is more than the limit");
  flatbuffers::IDLOptions options;
  // Hand-written files keep empty lists and strings: `"ints": []` is an
  // attribute whose value is the empty list, not a missing value.
  options.set_empty_strings_to_null = false;
  options.set_empty_vectors_to_null = false;
  options.allow_non_utf8 = true;
  flatbuffers::Parser parser(options);
  if (!parser.Parse(schema_text))
    return internal_error("the embedded ", schema_name, " schema does not parse: ", parser.error_);
  std::string text(json); // the parser wants a NUL-terminated string
  if (text.find('\0') != std::string::npos)
    return invalid_argument(display_name, ": the JSON text contains a NUL byte");
  if (!parser.Parse(text.c_str())) return invalid_argument(display_name, ": ", parser.error_);
  const uint8_t *data = parser.builder_.GetBufferPointer();
  return std::vector<uint8_t>(data, data + parser.builder_.GetSize());
}

Result<Graph> load_model_from_json(std::string_view json, std::string_view display_name,
                                   std::string_view model_dir) {
  ASSIGN_OR_RETURN(auto bytes, json_to_flatbuffer(json, kModelSchemaText, "model", display_name));
  return load_verified_bytes(bytes, display_name, model_dir);
}

Result<Graph> load_model(const std::string &path) {
  bool json = model_format_for_path(path) == ModelFormat::kJson;
  ASSIGN_OR_RETURN(auto bytes, read_file(path, json ? kMaxJsonBytes : kMaxModelBytes));
  if (json) {
    std::string_view text(reinterpret_cast<const char *>(bytes.data()), bytes.size());
    return load_model_from_json(text, path, folder_of(path));
  }
  return load_model_from_buffer(bytes, path, folder_of(path));
}

Result<std::vector<uint8_t>> model_to_flatbuffer(const Graph &graph) {
  return build_flatbuffer(graph, {});
}

Result<std::string> model_to_json(const Graph &graph) {
  ASSIGN_OR_RETURN(auto bytes, model_to_flatbuffer(graph));
  return model_json_text(*fb::GetModel(bytes.data()));
}

Status save_model(const Graph &graph, const std::string &path, const SaveOptions &options) {
  if (path.ends_with(".splan") || path.ends_with(".splan.json"))
    return invalid_argument(path, ": .splan and .splan.json name plans, and nothing would read "
                                  "a model written there; a model is .strata (binary) or .json");
  std::map<TensorId, ExternalData> external;
  if (options.external_threshold_bytes >= 0) {
    fs::path model_path(path);
    std::string weights_name = model_path.stem().string() + ".safetensors";
    std::map<std::string, HostTensor> weights;
    for (TensorId id = 0; id < graph.num_tensors(); ++id) {
      const Tensor &t = graph.tensor(id);
      if (t.data == nullptr ||
          static_cast<int64_t>(t.data->size()) <= options.external_threshold_bytes)
        continue;
      if (static_cast<int64_t>(t.data->size()) != t.type.size_bytes())
        return invalid_argument(path, ": tensor '", t.name, "': field data has ", t.data->size(),
                                " bytes but ", t.type.to_string(), " needs ", t.type.size_bytes());
      HostTensor host{t.type, Blob::zeroed(t.data->size())};
      if (t.data->size()) std::memcpy(host.data(), t.data->data(), t.data->size());
      weights.emplace(t.name, std::move(host));
      external.emplace(id, ExternalData{weights_name, t.name});
    }
    if (!weights.empty())
      RETURN_IF_ERROR(
          write_safetensors((model_path.parent_path() / weights_name).string(), weights));
  }
  auto bytes = build_flatbuffer(graph, external);
  if (!bytes.is_ok()) return bytes.status().with_context(path);
  if (model_format_for_path(path) == ModelFormat::kJson) {
    std::string text = model_json_text(*fb::GetModel(bytes->data()));
    return write_file_atomically(
        path, llvm::ArrayRef<uint8_t>(reinterpret_cast<const uint8_t *>(text.data()), text.size()));
  }
  return write_file_atomically(path, *bytes);
}

} // namespace strata::serialization
