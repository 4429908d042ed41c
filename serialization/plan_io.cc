#include "serialization/plan_io.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <flatbuffers/flatbuffers.h>
#include <flatbuffers/idl.h>

#include "serialization/file_io.h"
#include "serialization/json_text.h"
#include "serialization/model_io_internal.h"
#include "serialization/model_schema.h"
#include "serialization/plan_generated.h"
#include "serialization/plan_schema.h"
#include "serialization/sha256.h"

namespace strata::serialization {
namespace {

namespace fs = std::filesystem;
using namespace json_text;

// The plan revision this build writes and the newest it reads.
constexpr uint32_t kPlanVersion = 1;
constexpr uint64_t kMaxPlanBytes = FLATBUFFERS_MAX_BUFFER_SIZE - 1;
constexpr uint64_t kMaxJsonBytes = uint64_t{1} << 30;

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

// ---------------------------------------------------------------------------
// Writing

Result<std::vector<uint8_t>> build_plan(const Plan &plan) {
  flatbuffers::FlatBufferBuilder builder(4096);
  auto model = write_model_table(builder, plan.graph, {});
  auto loss = builder.CreateString(plan.loss);
  auto loss_kind = builder.CreateString(plan.loss_kind);
  auto optimizer = builder.CreateString(plan.optimizer);
  auto model_fingerprint = builder.CreateString(plan.model_fingerprint);
  auto fingerprint = builder.CreateString(plan.fingerprint);
  std::vector<flatbuffers::Offset<fb::Device>> devices;
  for (const PlanDevice &device : plan.devices)
    devices.push_back(fb::CreateDevice(builder, device.index, builder.CreateString(device.kind)));
  auto device_vector = builder.CreateVector(devices);
  std::vector<flatbuffers::Offset<fb::Program>> programs;
  for (const PlanProgram &program : plan.programs) {
    auto order = builder.CreateVector(program.order);
    auto offsets = builder.CreateVector(program.offsets);
    programs.push_back(
        fb::CreateProgram(builder, program.device, order, program.arena_bytes, offsets));
  }
  auto program_vector = builder.CreateVector(programs);
  auto producer = builder.CreateString(producer_string());
  auto root = fb::CreatePlan(builder, kPlanVersion, static_cast<fb::PlanMode>(plan.mode), model,
                             loss, loss_kind, optimizer, model_fingerprint, fingerprint,
                             device_vector, program_vector, producer);
  fb::FinishPlanBuffer(builder, root);
  if (builder.GetSize() > kMaxPlanBytes)
    return out_of_range("the plan needs ", builder.GetSize(), " bytes, more than one FlatBuffer");
  return std::vector<uint8_t>(builder.GetBufferPointer(),
                              builder.GetBufferPointer() + builder.GetSize());
}

// Indents every line but the first by `indent` spaces.
std::string reindent(std::string_view text, int indent) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    out += text[i];
    if (text[i] == '\n' && i + 1 < text.size()) out.append(static_cast<size_t>(indent), ' ');
  }
  return out;
}

std::string plan_json_text(const fb::Plan &plan) {
  std::string out;
  JsonObjectWriter root(out, 0);
  root.key("plan_version") += std::to_string(plan.plan_version());
  append_json_string(root.key("mode"), fb::EnumNamePlanMode(plan.mode()));
  append_json_string(root.key("loss"), plan.loss());
  append_json_string(root.key("loss_kind"), plan.loss_kind());
  append_json_string(root.key("optimizer"), plan.optimizer());
  append_json_string(root.key("model_fingerprint"), plan.model_fingerprint());
  append_json_string(root.key("fingerprint"), plan.fingerprint());
  append_table_list(root.key("devices"), plan.devices(), 2, [&](const fb::Device &d, int) {
    out += str_cat("{\"index\": ", d.index(), ", \"kind\": ");
    append_json_string(out, d.kind());
    out += '}';
  });
  append_table_list(root.key("programs"), plan.programs(), 2,
                    [&](const fb::Program &p, int indent) {
                      JsonObjectWriter obj(out, indent);
                      obj.key("device") += std::to_string(p.device());
                      append_number_list(obj.key("order"), p.order());
                      obj.key("arena_bytes") += std::to_string(p.arena_bytes());
                      append_number_list(obj.key("offsets"), p.offsets());
                      obj.close();
                    });
  append_json_string(root.key("producer"), plan.producer());
  // The model last: it is the long part.
  if (plan.model() != nullptr) {
    std::string model = model_json_text(*plan.model());
    while (!model.empty() && model.back() == '\n')
      model.pop_back();
    root.key("model") += reindent(model, 2);
  }
  root.close();
  out += '\n';
  return out;
}

// ---------------------------------------------------------------------------
// Loading

bool is_hex_digest(const flatbuffers::String *text) {
  if (text == nullptr || text->size() != 64) return false;
  for (char c : text->string_view())
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

Result<Plan> plan_from_fb(const fb::Plan &p, std::string_view model_dir) {
  if (p.plan_version() == 0) return invalid_argument("field plan_version is missing");
  if (p.plan_version() > kPlanVersion)
    return failed_precondition("the file has plan version ", p.plan_version(),
                               " but this build of strata reads versions up to ", kPlanVersion,
                               "; use a newer strata");
  auto mode = static_cast<uint8_t>(p.mode());
  if (mode > static_cast<uint8_t>(fb::PlanMode::MAX))
    return invalid_argument("field mode has unknown value ", int{mode});
  if (p.model() == nullptr) return invalid_argument("field model is missing");
  auto graph = graph_from_model(*p.model(), model_dir);
  if (!graph.is_ok()) return graph.status().with_context("field model");

  Plan plan;
  plan.mode = static_cast<Plan::Mode>(mode);
  plan.graph = std::move(graph).value();
  auto text = [](const flatbuffers::String *s) { return s ? s->str() : std::string(); };
  plan.loss = text(p.loss());
  plan.loss_kind = text(p.loss_kind());
  plan.optimizer = text(p.optimizer());
  plan.model_fingerprint = text(p.model_fingerprint());
  plan.fingerprint = text(p.fingerprint());
  plan.producer = text(p.producer());
  const Graph &g = plan.graph;

  if (plan.mode == Plan::Mode::kTrain) {
    if (plan.loss.empty()) return invalid_argument("field loss is missing in a training plan");
    auto loss = g.find_tensor(plan.loss);
    if (!loss)
      return invalid_argument("field loss names tensor '", plan.loss, "', not in the model");
    if (std::find(g.outputs().begin(), g.outputs().end(), *loss) == g.outputs().end())
      return invalid_argument("field loss: tensor '", plan.loss, "' is not a graph output");
    if (g.tensor(*loss).type.num_elements() != 1)
      return invalid_argument("field loss: tensor '", plan.loss, "' is ",
                              g.tensor(*loss).type.to_string(), ", not a scalar");
    if (plan.loss_kind != "softmax_cross_entropy" && plan.loss_kind != "mse")
      return invalid_argument("field loss_kind is '", plan.loss_kind,
                              "'; expected softmax_cross_entropy or mse");
    if (plan.optimizer.empty())
      return invalid_argument("field optimizer is missing in a training plan");
  }
  if (!is_hex_digest(p.model_fingerprint()))
    return invalid_argument("field model_fingerprint is not 64 lowercase hex digits");
  if (!is_hex_digest(p.fingerprint()))
    return invalid_argument("field fingerprint is not 64 lowercase hex digits");

  if (p.devices() == nullptr || p.devices()->size() == 0)
    return invalid_argument("field devices is empty; a plan runs on at least one device");
  std::set<uint32_t> device_indices;
  for (uint32_t i = 0; i < p.devices()->size(); ++i) {
    const fb::Device &d = *p.devices()->Get(i);
    if (!device_indices.insert(d.index()).second)
      return invalid_argument("field devices[", i, "].index = ", d.index(), " is given twice");
    if (d.kind() == nullptr || d.kind()->string_view() != "cpu")
      return invalid_argument("field devices[", i, "].kind is '", text(d.kind()),
                              "'; this build runs only \"cpu\"");
    plan.devices.push_back(PlanDevice{d.index(), d.kind()->str()});
  }
  if (p.programs() == nullptr || p.programs()->size() != plan.devices.size())
    return invalid_argument("field programs has ", p.programs() ? p.programs()->size() : 0,
                            " entries for ", plan.devices.size(), " devices; one per device");
  std::set<uint32_t> programmed;
  for (uint32_t i = 0; i < p.programs()->size(); ++i) {
    const fb::Program &q = *p.programs()->Get(i);
    std::string where = str_cat("field programs[", i, "]");
    if (!device_indices.count(q.device()))
      return invalid_argument(where, ".device = ", q.device(), " is not a device index");
    if (!programmed.insert(q.device()).second)
      return invalid_argument(where, ".device = ", q.device(), " has two programs");
    PlanProgram program;
    program.device = q.device();
    // The order: every node once, each after the producers of its inputs.
    size_t num_nodes = g.num_nodes();
    if (q.order() == nullptr || q.order()->size() != num_nodes)
      return invalid_argument(where, ".order has ", q.order() ? q.order()->size() : 0,
                              " entries but the model has ", num_nodes, " nodes");
    std::vector<bool> done(num_nodes, false);
    for (uint32_t k = 0; k < num_nodes; ++k) {
      NodeId id = q.order()->Get(k);
      if (id >= num_nodes)
        return out_of_range(where, ".order[", k, "] = ", id, " is not a node index");
      if (done[id])
        return invalid_argument(where, ".order[", k, "]: node '", g.node(id).name, "' comes twice");
      for (TensorId input : g.node(id).inputs) {
        NodeId producer = g.tensor(input).producer;
        if (producer != kNoNode && !done[producer])
          return invalid_argument(where, ".order[", k, "]: node '", g.node(id).name,
                                  "' comes before node '", g.node(producer).name,
                                  "', which produces its input '", g.tensor(input).name, "'");
      }
      done[id] = true;
      program.order.push_back(id);
    }
    program.arena_bytes = q.arena_bytes();
    if (program.arena_bytes < 0)
      return invalid_argument(where, ".arena_bytes = ", program.arena_bytes, " is negative");
    if (q.offsets() == nullptr || q.offsets()->size() != g.num_tensors())
      return invalid_argument(where, ".offsets has ", q.offsets() ? q.offsets()->size() : 0,
                              " entries but the model has ", g.num_tensors(), " tensors");
    const std::vector<int64_t> offsets = copy_numbers(*q.offsets());
    for (uint32_t t = 0; t < g.num_tensors(); ++t) {
      int64_t offset = offsets[t];
      const Tensor &tensor = g.tensor(t);
      if (offset == -1) {
        if (tensor.kind == TensorKind::kIntermediate && tensor.type.size_bytes() > 0)
          return invalid_argument(where, ".offsets[", t, "]: intermediate tensor '", tensor.name,
                                  "' has no place in the arena");
      } else if (tensor.kind != TensorKind::kIntermediate) {
        return invalid_argument(where, ".offsets[", t, "]: tensor '", tensor.name, "' is a ",
                                tensor_kind_name(tensor.kind), ", not in the arena");
      } else if (offset < 0 || offset > program.arena_bytes ||
                 tensor.type.size_bytes() > program.arena_bytes - offset) {
        return out_of_range(where, ".offsets[", t, "] = ", offset, ": tensor '", tensor.name, "' (",
                            tensor.type.size_bytes(), " bytes) does not fit the ",
                            program.arena_bytes, "-byte arena");
      }
      program.offsets.push_back(offset);
    }
    plan.programs.push_back(std::move(program));
  }
  return plan;
}

Result<Plan> load_verified_plan(llvm::ArrayRef<uint8_t> bytes, std::string_view display_name,
                                std::string_view model_dir) {
  ASSIGN_OR_RETURN(VerifiedBuffer buffer,
                   verify_structure(bytes, display_name, "strata plan", kMaxPlanBytes,
                                    fb::PlanIdentifier(), fb::VerifyPlanBuffer));
  auto plan = plan_from_fb(*fb::GetPlan(buffer.data), model_dir);
  if (!plan.is_ok()) return plan.status().with_context(display_name);
  return plan;
}

// model.fbs and plan.fbs as one schema for the JSON parser: the model's root
// declarations and the plan's include line are dropped.
std::string combined_schema() {
  std::string out;
  auto append_lines = [&](std::string_view text, std::initializer_list<std::string_view> skip) {
    size_t pos = 0;
    while (pos < text.size()) {
      size_t end = text.find('\n', pos);
      if (end == std::string_view::npos) end = text.size();
      std::string_view line = text.substr(pos, end - pos);
      bool keep = true;
      for (std::string_view prefix : skip)
        if (line.substr(0, prefix.size()) == prefix) keep = false;
      if (keep) {
        out += line;
        out += '\n';
      }
      pos = end + 1;
    }
  };
  append_lines(kModelSchemaText, {"root_type", "file_identifier", "file_extension"});
  append_lines(kPlanSchemaText, {"include "});
  return out;
}

std::string folder_of(const std::string &path) {
  fs::path folder = fs::path(path).parent_path();
  return folder.empty() ? std::string(".") : folder.string();
}

} // namespace

std::string_view plan_mode_name(Plan::Mode mode) {
  return mode == Plan::Mode::kTrain ? "train" : "infer";
}

std::string plan_fingerprint(llvm::ArrayRef<uint8_t> model_bytes, std::string_view options_text) {
  Sha256 hash;
  hash.update(model_bytes);
  uint8_t separator = 0;
  hash.update(&separator, 1);
  hash.update(options_text);
  return hash.hex_digest();
}

bool is_plan_path(std::string_view path) {
  return ends_with(path, ".splan") || ends_with(path, ".splan.json");
}

bool file_is_plan(const std::string &path) {
  if (is_plan_path(path)) return true;
  std::ifstream file(path, std::ios::binary);
  char head[64] = {};
  file.read(head, sizeof head);
  std::string_view text(head, static_cast<size_t>(file.gcount()));
  if (text.size() >= 8 && text.substr(4, 4) == "STRP") return true;
  size_t brace = text.find_first_not_of(" \t\r\n");
  if (brace == std::string_view::npos || text[brace] != '{') return false;
  size_t key = text.find_first_not_of(" \t\r\n", brace + 1);
  return key != std::string_view::npos && text.substr(key, 14) == "\"plan_version\"";
}

Result<Plan> load_plan_from_buffer(llvm::ArrayRef<uint8_t> bytes, std::string_view display_name,
                                   std::string_view model_dir) {
  return load_verified_plan(bytes, display_name, model_dir);
}

Result<Plan> load_plan_from_json(std::string_view json, std::string_view display_name,
                                 std::string_view model_dir) {
  ASSIGN_OR_RETURN(auto bytes,
                   json_to_flatbuffer(json, combined_schema().c_str(), "plan", display_name));
  return load_verified_plan(bytes, display_name, model_dir);
}

Result<Plan> load_plan(const std::string &path) {
  bool json = ends_with(path, ".json");
  ASSIGN_OR_RETURN(auto bytes, read_file(path, json ? kMaxJsonBytes : kMaxPlanBytes));
  if (json)
    return load_plan_from_json(
        std::string_view(reinterpret_cast<const char *>(bytes.data()), bytes.size()), path,
        folder_of(path));
  return load_plan_from_buffer(bytes, path, folder_of(path));
}

Result<std::vector<uint8_t>> plan_to_flatbuffer(const Plan &plan) { return build_plan(plan); }

Result<std::string> plan_to_json(const Plan &plan) {
  ASSIGN_OR_RETURN(auto bytes, build_plan(plan));
  return plan_json_text(*fb::GetPlan(bytes.data()));
}

Status save_plan(const Plan &plan, const std::string &path) {
  auto bytes = build_plan(plan);
  if (!bytes.is_ok()) return bytes.status().with_context(path);
  if (ends_with(path, ".json")) {
    std::string text = plan_json_text(*fb::GetPlan(bytes->data()));
    return write_file_atomically(
        path, llvm::ArrayRef<uint8_t>(reinterpret_cast<const uint8_t *>(text.data()), text.size()));
  }
  return write_file_atomically(path, *bytes);
}

} // namespace strata::serialization
