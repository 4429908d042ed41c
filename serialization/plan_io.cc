#include "serialization/plan_io.h"
#include "serialization/model_io.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
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

// The newest plan revision this build writes and reads. Revision 2 (pipeline
// plans) is written only by plans with a pipeline; others stay revision 1.
constexpr uint32_t kPlanVersion = 5;
constexpr uint32_t kPipelinePlanVersion = 2;
constexpr uint32_t kInterleavedPlanVersion = 4; // plans with model chunks per device
constexpr uint32_t kDigestPlanVersion = 5;      // every plan written now: graph_digest
constexpr uint64_t kMaxPlanBytes = FLATBUFFERS_MAX_BUFFER_SIZE - 1;
constexpr uint64_t kMaxJsonBytes = uint64_t{1} << 30;

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

static_assert(static_cast<uint8_t>(InstrKind::kCompute) ==
              static_cast<uint8_t>(fb::InstrKind::Compute));
static_assert(static_cast<uint8_t>(InstrKind::kSend) == static_cast<uint8_t>(fb::InstrKind::Send));
static_assert(static_cast<uint8_t>(InstrKind::kRecv) == static_cast<uint8_t>(fb::InstrKind::Recv));
static_assert(static_cast<uint8_t>(InstrKind::kAccumulate) ==
              static_cast<uint8_t>(fb::InstrKind::Accumulate));
static_assert(static_cast<uint8_t>(InstrKind::kScale) ==
              static_cast<uint8_t>(fb::InstrKind::Scale));
static_assert(static_cast<uint8_t>(InstrKind::kUpdate) ==
              static_cast<uint8_t>(fb::InstrKind::Update));
static_assert(static_cast<uint8_t>(InstrKind::kAllReduce) ==
              static_cast<uint8_t>(fb::InstrKind::AllReduce));
static_assert(static_cast<uint8_t>(InstrKind::kComputeShard) ==
              static_cast<uint8_t>(fb::InstrKind::ComputeShard));
static_assert(static_cast<uint8_t>(InstrKind::kStartBucket) ==
              static_cast<uint8_t>(fb::InstrKind::StartBucket));
static_assert(static_cast<uint8_t>(InstrKind::kWaitBucket) ==
              static_cast<uint8_t>(fb::InstrKind::WaitBucket));
static_assert(static_cast<uint8_t>(InstrKind::kReduceScatterAccumulate) ==
              static_cast<uint8_t>(fb::InstrKind::ReduceScatterAccumulate));
static_assert(static_cast<uint8_t>(InstrKind::kGatherParam) ==
              static_cast<uint8_t>(fb::InstrKind::GatherParam));
static_assert(static_cast<uint8_t>(InstrKind::kStartGather) ==
              static_cast<uint8_t>(fb::InstrKind::StartGather));
static_assert(static_cast<uint8_t>(InstrKind::kWaitGather) ==
              static_cast<uint8_t>(fb::InstrKind::WaitGather));
static_assert(fb::InstrKind::MAX == fb::InstrKind::WaitGather);
static_assert(sizeof(fb::Instruction) == 16 && sizeof(fb::Slot) == 16);

// Copies a vector of FlatBuffers structs through memcpy, like copy_numbers: the
// verifier checks only 4-byte alignment, and a Slot holds an 8-byte offset.
template <typename S> std::vector<S> copy_structs(const flatbuffers::Vector<const S *> *vector) {
  std::vector<S> out(vector != nullptr ? vector->size() : 0);
  if (!out.empty()) std::memcpy(out.data(), vector->Data(), out.size() * sizeof(S));
  return out;
}

template <typename V> size_t size_of(const V *vector) {
  return vector != nullptr ? vector->size() : 0;
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
  // A plan without a pipeline writes the revision 1 fields and the digest; a
  // pipeline plan always writes its programs' instructions, slots and holds,
  // and order and offsets only when not empty.
  // Whatever else the Plan holds is written too, for the loader to refuse.
  const bool pipelined = plan.pipeline.has_value();
  std::vector<flatbuffers::Offset<fb::Program>> programs;
  for (const PlanProgram &program : plan.programs) {
    flatbuffers::Offset<flatbuffers::Vector<uint32_t>> order;
    flatbuffers::Offset<flatbuffers::Vector<int64_t>> offsets;
    if (!pipelined || !program.order.empty()) order = builder.CreateVector(program.order);
    if (!pipelined || !program.offsets.empty()) offsets = builder.CreateVector(program.offsets);
    flatbuffers::Offset<flatbuffers::Vector<const fb::Instruction *>> instructions;
    flatbuffers::Offset<flatbuffers::Vector<const fb::Slot *>> slots;
    flatbuffers::Offset<flatbuffers::Vector<uint32_t>> holds;
    if (pipelined || !program.instructions.empty()) {
      std::vector<fb::Instruction> list;
      list.reserve(program.instructions.size());
      for (const PlanInstruction &instr : program.instructions)
        list.emplace_back(static_cast<fb::InstrKind>(instr.kind), instr.microbatch, instr.index,
                          instr.peer);
      instructions = builder.CreateVectorOfStructs(list);
    }
    if (pipelined || !program.slots.empty()) {
      std::vector<fb::Slot> list;
      list.reserve(program.slots.size());
      for (const PlanSlot &slot : program.slots)
        list.emplace_back(slot.tensor, slot.microbatch, slot.offset);
      slots = builder.CreateVectorOfStructs(list);
    }
    if (pipelined || !program.holds.empty()) holds = builder.CreateVector(program.holds);
    flatbuffers::Offset<flatbuffers::Vector<uint32_t>> sharded;
    if (!program.sharded_holds.empty()) sharded = builder.CreateVector(program.sharded_holds);
    flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::Bucket>>> buckets;
    if (!program.buckets.empty()) {
      std::vector<flatbuffers::Offset<fb::Bucket>> entries;
      for (const PlanBucket &bucket : program.buckets)
        entries.push_back(
            fb::CreateBucket(builder, builder.CreateVector(bucket.tensors), bucket.reduce_scatter));
      buckets = builder.CreateVector(entries);
    }
    programs.push_back(fb::CreateProgram(
        builder, program.device, order, program.arena_bytes, offsets, instructions, slots, holds,
        program.predicted_busy_s, sharded, program.shard_group, buckets));
  }
  auto program_vector = builder.CreateVector(programs);
  auto producer = builder.CreateString(producer_string());
  flatbuffers::Offset<fb::Pipeline> pipeline;
  if (pipelined) {
    const PlanPipeline &pp = *plan.pipeline;
    auto schedule = builder.CreateString(pp.schedule);
    auto node_stage = builder.CreateVector(pp.node_stage);
    auto boundaries = builder.CreateVectorOfStrings(pp.boundaries);
    auto cluster_json = builder.CreateString(pp.cluster_json);
    flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::Group>>> groups;
    if (!pp.groups.empty()) {
      std::vector<flatbuffers::Offset<fb::Group>> entries;
      for (size_t g = 0; g < pp.groups.size(); ++g) {
        const std::string algorithm = g < pp.group_algorithms.size() ? pp.group_algorithms[g] : "";
        auto devices = builder.CreateVector(pp.groups[g]);
        auto name = algorithm.empty() ? 0 : builder.CreateString(algorithm);
        entries.push_back(fb::CreateGroup(builder, devices, name));
      }
      groups = builder.CreateVector(entries);
    }
    flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::Shard>>> shards;
    if (!pp.shards.empty()) {
      std::vector<flatbuffers::Offset<fb::Shard>> entries;
      for (const PlanShard &shard : pp.shards) {
        auto name = builder.CreateString(shard.tensor);
        auto shape = builder.CreateVector(shard.full_shape);
        entries.push_back(fb::CreateShard(builder, name, shape, shard.dim, shard.outer));
      }
      shards = builder.CreateVector(entries);
    }
    pipeline = fb::CreatePipeline(
        builder, pp.stages, pp.microbatches, schedule, node_stage, boundaries, cluster_json,
        pp.predicted_step_s, pp.predicted_bubble, pp.data_parallel, groups, pp.zero,
        pp.tensor_parallel, pp.tp_groups_begin, shards, pp.bucket_bytes, pp.chunks);
  }
  // Every plan is written as revision 5 (the digest), which covers the
  // fields of every earlier revision.
  ASSIGN_OR_RETURN(std::string digest, graph_digest(plan.graph));
  auto digest_string = builder.CreateString(digest);
  auto root = fb::CreatePlan(builder, kDigestPlanVersion, static_cast<fb::PlanMode>(plan.mode),
                             model, loss, loss_kind, optimizer, model_fingerprint, fingerprint,
                             device_vector, program_vector, producer, pipeline, digest_string);
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

// An enum value by name, or by number when it has none (a value the loader refuses).
template <typename E> void append_enum(std::string &out, E value, const char *name) {
  if (name != nullptr && *name != '\0')
    append_json_string(out, name);
  else
    out += std::to_string(static_cast<unsigned>(value));
}

// A list of structs, one per line; `append_one` prints one struct.
template <typename S, typename Fn>
void append_struct_list(std::string &out, const flatbuffers::Vector<const S *> *v, int indent,
                        Fn &&append_one) {
  std::vector<S> items = copy_structs(v);
  if (items.empty()) {
    out += "[]";
    return;
  }
  out += '[';
  for (size_t i = 0; i < items.size(); ++i) {
    out += i ? ",\n" : "\n";
    out.append(static_cast<size_t>(indent + 2), ' ');
    append_one(items[i]);
  }
  out += '\n';
  out.append(static_cast<size_t>(indent), ' ');
  out += ']';
}

void append_string_list(std::string &out,
                        const flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>> *v) {
  out += '[';
  if (v != nullptr)
    for (flatbuffers::uoffset_t i = 0; i < v->size(); ++i) {
      if (i) out += ", ";
      append_json_string(out, v->Get(i));
    }
  out += ']';
}

// The canonical JSON text of a plan buffer. Fields are printed in schema order;
// a plan without a pipeline prints exactly the revision 1 fields (plus any
// revision 2 field the buffer holds, which its loader refuses).
std::string plan_json_text(const fb::Plan &plan) {
  const bool pipelined = plan.pipeline() != nullptr;
  std::string out;
  JsonObjectWriter root(out, 0);
  root.key("plan_version") += std::to_string(plan.plan_version());
  append_enum(root.key("mode"), plan.mode(), fb::EnumNamePlanMode(plan.mode()));
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
  append_table_list(
      root.key("programs"), plan.programs(), 2, [&](const fb::Program &p, int indent) {
        JsonObjectWriter obj(out, indent);
        obj.key("device") += std::to_string(p.device());
        if (!pipelined || p.order()) append_number_list(obj.key("order"), p.order());
        obj.key("arena_bytes") += std::to_string(p.arena_bytes());
        if (!pipelined || p.offsets()) append_number_list(obj.key("offsets"), p.offsets());
        if (pipelined || p.instructions())
          append_struct_list(
              obj.key("instructions"), p.instructions(), indent + 2, [&](const fb::Instruction &i) {
                out += "{\"kind\": ";
                append_enum(out, i.kind(), fb::EnumNameInstrKind(i.kind()));
                out += str_cat(", \"microbatch\": ", i.microbatch(), ", \"index\": ", i.index(),
                               ", \"peer\": ", i.peer(), "}");
              });
        if (pipelined || p.slots())
          append_struct_list(obj.key("slots"), p.slots(), indent + 2, [&](const fb::Slot &s) {
            out += str_cat("{\"tensor\": ", s.tensor(), ", \"microbatch\": ", s.microbatch(),
                           ", \"offset\": ", s.offset(), "}");
          });
        if (pipelined || p.holds()) append_number_list(obj.key("holds"), p.holds());
        if (pipelined || p.predicted_busy_s() != 0)
          append_double(obj.key("predicted_busy_s"), p.predicted_busy_s());
        if (p.sharded_holds()) append_number_list(obj.key("sharded_holds"), p.sharded_holds());
        if (p.shard_group() != -1) obj.key("shard_group") += std::to_string(p.shard_group());
        if (p.buckets())
          append_table_list(
              obj.key("buckets"), p.buckets(), indent + 2, [&](const fb::Bucket &b, int) {
                out += "{\"tensors\": ";
                append_number_list(out, b.tensors());
                out +=
                    str_cat(", \"reduce_scatter\": ", b.reduce_scatter() ? "true" : "false", "}");
              });
        obj.close();
      });
  append_json_string(root.key("producer"), plan.producer());
  if (const fb::Pipeline *pipe = plan.pipeline()) {
    JsonObjectWriter obj(root.key("pipeline"), 2);
    obj.key("stages") += std::to_string(pipe->stages());
    obj.key("microbatches") += std::to_string(pipe->microbatches());
    append_json_string(obj.key("schedule"), pipe->schedule());
    if (pipe->chunks() != 1) obj.key("chunks") += std::to_string(pipe->chunks());
    append_number_list(obj.key("node_stage"), pipe->node_stage());
    append_string_list(obj.key("boundaries"), pipe->boundaries());
    append_json_string(obj.key("cluster_json"), pipe->cluster_json());
    append_double(obj.key("predicted_step_s"), pipe->predicted_step_s());
    append_double(obj.key("predicted_bubble"), pipe->predicted_bubble());
    if (pipe->data_parallel() != 1)
      obj.key("data_parallel") += std::to_string(pipe->data_parallel());
    if (pipe->zero() != 0) obj.key("zero") += std::to_string(pipe->zero());
    if (pipe->bucket_bytes() != 0) obj.key("bucket_bytes") += std::to_string(pipe->bucket_bytes());
    if (pipe->tensor_parallel() != 1) {
      obj.key("tensor_parallel") += std::to_string(pipe->tensor_parallel());
      obj.key("tp_groups_begin") += std::to_string(pipe->tp_groups_begin());
    }
    if (pipe->shards() != nullptr) {
      std::string &out = obj.key("shards");
      out += "[";
      for (uint32_t i = 0; i < pipe->shards()->size(); ++i) {
        const fb::Shard *shard = pipe->shards()->Get(i);
        out += i ? ", {\"tensor\": " : "{\"tensor\": ";
        append_json_string(out, shard->tensor());
        out += ", \"full_shape\": ";
        append_number_list(out, shard->full_shape());
        out += str_cat(", \"dim\": ", shard->dim(), ", \"outer\": ", shard->outer(), "}");
      }
      out += "]";
    }
    if (pipe->groups() != nullptr) {
      std::string &out = obj.key("groups");
      out += "[";
      for (uint32_t i = 0; i < pipe->groups()->size(); ++i) {
        out += i ? ", {\"devices\": " : "{\"devices\": ";
        append_number_list(out, pipe->groups()->Get(i)->devices());
        if (pipe->groups()->Get(i)->algorithm() != nullptr) {
          out += ", \"algorithm\": ";
          append_json_string(out, pipe->groups()->Get(i)->algorithm());
        }
        out += "}";
      }
      out += "]";
    }
    obj.close();
  }
  if (plan.graph_digest() != nullptr)
    append_json_string(root.key("graph_digest"), plan.graph_digest());
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

std::string text_of(const flatbuffers::String *s) { return s ? s->str() : std::string(); }

bool finite_non_negative(double value) { return std::isfinite(value) && value >= 0; }

// The mesh: stages x data_parallel x tensor_parallel devices, one program
// each; ZeRO and the bucket size.
Status mesh_from_fb(const fb::Pipeline &q, size_t num_devices, size_t num_programs,
                    PlanPipeline &pipe) {
  pipe.stages = q.stages();
  if (pipe.stages < 1)
    return invalid_argument("field pipeline.stages = ", pipe.stages,
                            "; a pipeline has at least one stage");
  pipe.data_parallel = q.data_parallel();
  if (pipe.data_parallel < 1 || pipe.data_parallel > 1 << 20)
    return invalid_argument("field pipeline.data_parallel = ", pipe.data_parallel,
                            "; expected 1 or more replicas");
  pipe.tensor_parallel = q.tensor_parallel();
  if (pipe.tensor_parallel < 1 || pipe.tensor_parallel > 1 << 20)
    return invalid_argument("field pipeline.tensor_parallel = ", pipe.tensor_parallel,
                            "; expected 1 or more members");
  const int64_t total = int64_t{pipe.stages} * pipe.data_parallel * pipe.tensor_parallel;
  if (static_cast<size_t>(total) != num_devices || static_cast<size_t>(total) != num_programs)
    return invalid_argument("field pipeline.stages = ", pipe.stages,
                            " x data_parallel = ", pipe.data_parallel,
                            " x tensor_parallel = ", pipe.tensor_parallel, " but the plan has ",
                            num_devices, " devices and ", num_programs,
                            " programs; a pipeline has one device per stage, replica and member");
  pipe.zero = q.zero();
  if (pipe.zero < 0 || pipe.zero > 3)
    return invalid_argument("field pipeline.zero = ", pipe.zero, "; expected 0, 1, 2 or 3");
  pipe.bucket_bytes = q.bucket_bytes();
  if (pipe.bucket_bytes < 0)
    return invalid_argument("field pipeline.bucket_bytes = ", pipe.bucket_bytes, " is negative");
  return Status::ok();
}

// The collective groups, each of devices of the mesh, and the algorithm
// each reduces with.
Status groups_from_fb(const fb::Pipeline &q, PlanPipeline &pipe) {
  const int64_t total = int64_t{pipe.stages} * pipe.data_parallel * pipe.tensor_parallel;
  if (q.groups() != nullptr) {
    for (uint32_t i = 0; i < q.groups()->size(); ++i) {
      std::vector<int32_t> devices;
      if (q.groups()->Get(i)->devices() != nullptr)
        devices = copy_numbers(*q.groups()->Get(i)->devices());
      if (devices.size() < 2)
        return invalid_argument("field pipeline.groups[", i, "] has ", devices.size(),
                                " devices; a group has at least two");
      for (size_t k = 0; k < devices.size(); ++k) {
        if (devices[k] < 0 || devices[k] >= total)
          return out_of_range("field pipeline.groups[", i, "].devices[", k, "] = ", devices[k],
                              " is not a device 0..", total - 1);
        if (k > 0 && devices[k] <= devices[k - 1])
          return invalid_argument("field pipeline.groups[", i,
                                  "].devices is not strictly increasing");
      }
      pipe.groups.push_back(std::move(devices));
      std::string algorithm = text_of(q.groups()->Get(i)->algorithm());
      if (!algorithm.empty() && algorithm != "ring" && algorithm != "tree" &&
          algorithm != "recursive-doubling" && algorithm != "rabenseifner")
        return invalid_argument("field pipeline.groups[", i, "].algorithm is '", algorithm,
                                "'; expected ring, tree, recursive-doubling, rabenseifner or "
                                "nothing");
      pipe.group_algorithms.push_back(std::move(algorithm));
    }
    // No algorithm anywhere reads back as no list, as it was written.
    if (std::all_of(pipe.group_algorithms.begin(), pipe.group_algorithms.end(),
                    [](const std::string &a) { return a.empty(); }))
      pipe.group_algorithms.clear();
  }
  return Status::ok();
}

// With tensor parallelism, where its groups are in pipeline.groups: one per
// (stage, replica), of consecutive devices.
Status tp_groups_from_fb(const fb::Pipeline &q, PlanPipeline &pipe) {
  pipe.tp_groups_begin = q.tp_groups_begin();
  if (pipe.tensor_parallel > 1) {
    const int64_t needed = int64_t{pipe.stages} * pipe.data_parallel;
    if (pipe.tp_groups_begin < 0 ||
        pipe.tp_groups_begin + needed > static_cast<int64_t>(pipe.groups.size()))
      return invalid_argument("field pipeline.tp_groups_begin = ", pipe.tp_groups_begin, ": the ",
                              needed, " tensor-parallel groups are not in pipeline.groups (",
                              pipe.groups.size(), " groups)");
    for (int64_t k = 0; k < needed; ++k) {
      const auto &group = pipe.groups[static_cast<size_t>(pipe.tp_groups_begin + k)];
      for (int32_t m = 0; m < pipe.tensor_parallel; ++m)
        if (group.size() != static_cast<size_t>(pipe.tensor_parallel) ||
            group[static_cast<size_t>(m)] != k * pipe.tensor_parallel + m)
          return invalid_argument("field pipeline.groups[", pipe.tp_groups_begin + k,
                                  "] is not the tensor-parallel group of devices ",
                                  k * pipe.tensor_parallel, "..",
                                  (k + 1) * pipe.tensor_parallel - 1);
    }
  } else if (pipe.tp_groups_begin != -1) {
    return invalid_argument("field pipeline.tp_groups_begin is set without tensor parallelism");
  }
  return Status::ok();
}

// The parameters held in pieces: each a tensor of the model whose full
// shape is its piece's, cut along `dim` into tensor_parallel pieces.
Status shards_from_fb(const fb::Pipeline &q, const Graph &g, PlanPipeline &pipe) {
  if (q.shards() != nullptr) {
    if (pipe.tensor_parallel < 2)
      return invalid_argument("field pipeline.shards needs pipeline.tensor_parallel >= 2");
    for (uint32_t i = 0; i < q.shards()->size(); ++i) {
      const fb::Shard *s = q.shards()->Get(i);
      const std::string at = str_cat("field pipeline.shards[", i, "]");
      PlanShard shard;
      shard.tensor = text_of(s->tensor());
      RETURN_IF_ERROR(check_name(str_cat(at, ".tensor"), shard.tensor));
      if (s->full_shape() != nullptr) shard.full_shape = copy_numbers(*s->full_shape());
      shard.dim = s->dim();
      shard.outer = s->outer();
      auto id = g.find_tensor(shard.tensor);
      if (!id) return invalid_argument(at, " names tensor '", shard.tensor, "', not in the model");
      const TensorType &piece = g.tensor(*id).type;
      if (static_cast<int64_t>(shard.full_shape.size()) != piece.rank() || shard.dim < 0 ||
          shard.dim >= static_cast<int32_t>(piece.rank()) || shard.outer < 1)
        return invalid_argument(at, " ('", shard.tensor, "'): dim ", shard.dim,
                                " and full shape do not fit ", piece.to_string());
      for (size_t d = 0; d < static_cast<size_t>(piece.rank()); ++d) {
        const int64_t full = shard.full_shape[d], want = static_cast<int32_t>(d) == shard.dim
                                                             ? piece.shape[d] * pipe.tensor_parallel
                                                             : piece.shape[d];
        if (full != want || (static_cast<int32_t>(d) == shard.dim && full % shard.outer != 0) ||
            (static_cast<int32_t>(d) == shard.dim &&
             (full / shard.outer) % pipe.tensor_parallel != 0))
          return invalid_argument(at, " ('", shard.tensor, "'): a full shape of dim ", d, " = ",
                                  full, " does not fit the piece ", piece.to_string(), " cut in ",
                                  pipe.tensor_parallel, " (outer ", shard.outer, ")");
      }
      pipe.shards.push_back(std::move(shard));
    }
  }
  return Status::ok();
}

// Micro-batches, the schedule and its chunks.
Status schedule_from_fb(const fb::Pipeline &q, PlanPipeline &pipe) {
  pipe.microbatches = q.microbatches();
  if (pipe.microbatches < 1)
    return invalid_argument("field pipeline.microbatches = ", pipe.microbatches,
                            "; a step has at least one micro-batch");
  pipe.schedule = text_of(q.schedule());
  if (pipe.schedule != "gpipe" && pipe.schedule != "1f1b" && pipe.schedule != "interleaved" &&
      pipe.schedule != "zb-h1")
    return invalid_argument("field pipeline.schedule is '", pipe.schedule,
                            "'; expected gpipe, 1f1b, interleaved or zb-h1");
  pipe.chunks = q.chunks();
  if (pipe.schedule == "interleaved" ? pipe.chunks < 2 || pipe.chunks > 1024 : pipe.chunks != 1)
    return invalid_argument("field pipeline.chunks = ", pipe.chunks, " with schedule ",
                            pipe.schedule, "; expected ",
                            pipe.schedule == "interleaved" ? "2 to 1024" : "1");
  if (pipe.schedule == "interleaved" && (pipe.stages < 2 || pipe.microbatches % pipe.stages != 0))
    return invalid_argument("field pipeline.schedule: interleaved needs 2 or more stages and "
                            "micro-batches a multiple of them; the plan has ",
                            pipe.stages, " stages and ", pipe.microbatches, " micro-batches");
  return Status::ok();
}

// Every node's (virtual) stage, and the last node of each stage but the last.
Status stages_from_fb(const fb::Pipeline &q, const Graph &g, PlanPipeline &pipe) {
  const int64_t virtual_stages = int64_t{pipe.stages} * pipe.chunks;
  if (size_of(q.node_stage()) != g.num_nodes())
    return invalid_argument("field pipeline.node_stage has ", size_of(q.node_stage()),
                            " entries but the model has ", g.num_nodes(), " nodes");
  if (q.node_stage() != nullptr) pipe.node_stage = copy_numbers(*q.node_stage());
  for (NodeId n = 0; n < pipe.node_stage.size(); ++n)
    if (pipe.node_stage[n] < 0 || pipe.node_stage[n] >= virtual_stages)
      return out_of_range("field pipeline.node_stage[", n, "] = ", pipe.node_stage[n], ": node '",
                          g.node(n).name, "' is not in a stage 0..", virtual_stages - 1);
  if (size_of(q.boundaries()) != static_cast<size_t>(virtual_stages) - 1)
    return invalid_argument("field pipeline.boundaries has ", size_of(q.boundaries()),
                            " entries for ", virtual_stages, " stages; one per stage but the last");
  for (uint32_t i = 0; i < size_of(q.boundaries()); ++i) {
    std::string name = text_of(q.boundaries()->Get(i));
    RETURN_IF_ERROR(check_name(str_cat("field pipeline.boundaries[", i, "]"), name));
    auto node = g.find_node(name);
    if (!node)
      return invalid_argument("field pipeline.boundaries[", i, "] names node '", name,
                              "', not in the model");
    if (pipe.node_stage[*node] != static_cast<int32_t>(i))
      return invalid_argument("field pipeline.boundaries[", i, "]: node '", name, "' is in stage ",
                              pipe.node_stage[*node], ", not stage ", i);
    pipe.boundaries.push_back(std::move(name));
  }
  return Status::ok();
}

// The cluster it was compiled for and the predicted step.
Status predictions_from_fb(const fb::Pipeline &q, PlanPipeline &pipe) {
  pipe.cluster_json = text_of(q.cluster_json());
  pipe.predicted_step_s = q.predicted_step_s();
  if (!finite_non_negative(pipe.predicted_step_s))
    return invalid_argument("field pipeline.predicted_step_s = ", pipe.predicted_step_s,
                            " is not a finite time >= 0");
  pipe.predicted_bubble = q.predicted_bubble();
  if (!finite_non_negative(pipe.predicted_bubble) || pipe.predicted_bubble > 1)
    return invalid_argument("field pipeline.predicted_bubble = ", pipe.predicted_bubble,
                            " is not a fraction in [0, 1]");
  return Status::ok();
}

// The pipeline table (revision 2). The programs are checked against it later.
Result<PlanPipeline> pipeline_from_fb(const fb::Pipeline &q, const Graph &g, size_t num_devices,
                                      size_t num_programs) {
  PlanPipeline pipe;
  RETURN_IF_ERROR(mesh_from_fb(q, num_devices, num_programs, pipe));
  RETURN_IF_ERROR(groups_from_fb(q, pipe));
  RETURN_IF_ERROR(tp_groups_from_fb(q, pipe));
  RETURN_IF_ERROR(shards_from_fb(q, g, pipe));
  RETURN_IF_ERROR(schedule_from_fb(q, pipe));
  RETURN_IF_ERROR(stages_from_fb(q, g, pipe));
  RETURN_IF_ERROR(predictions_from_fb(q, pipe));
  return pipe;
}

// A program's gradient buckets (revision 3), after its instructions: every
// bucket is started once, over one group, and waited for once after that, by
// the end of the program; its tensors are accumulated buffers of this device,
// each in at most one bucket, and reduce-scatter buckets need ZeRO (1 or 2)
// and sizes the group divides.
Status buckets_from_fb(const fb::Program &q, const Graph &g, const PlanPipeline &pipe,
                       const std::string &where, PlanProgram &program) {
  const size_t count = size_of(q.buckets());
  std::vector<int64_t> started(count, -1), waited(count, -1), group(count, -1);
  for (size_t k = 0; k < program.instructions.size(); ++k) {
    const PlanInstruction &instr = program.instructions[k];
    if (instr.kind != InstrKind::kStartBucket && instr.kind != InstrKind::kWaitBucket) continue;
    const std::string at = str_cat(where, ".instructions[", k, "]");
    const bool start = instr.kind == InstrKind::kStartBucket;
    auto &seen = start ? started : waited;
    if (seen[instr.index] >= 0)
      return invalid_argument(at, ": bucket ", instr.index, " is ",
                              start ? "started" : "waited for", " twice (also at instruction ",
                              seen[instr.index], ")");
    if (!start && started[instr.index] < 0)
      return invalid_argument(at, ": waits for bucket ", instr.index, " before it is started");
    if (!start && group[instr.index] != instr.peer)
      return invalid_argument(at, ": waits for bucket ", instr.index, " over group ", instr.peer,
                              " but it was started over group ", group[instr.index]);
    seen[instr.index] = static_cast<int64_t>(k);
    group[instr.index] = instr.peer;
  }
  std::set<TensorId> bucketed;
  for (size_t b = 0; b < count; ++b) {
    const fb::Bucket &entry = *q.buckets()->Get(static_cast<flatbuffers::uoffset_t>(b));
    const std::string at = str_cat(where, ".buckets[", b, "]");
    if (started[b] < 0 || waited[b] < 0)
      return invalid_argument(at, " is never ", started[b] < 0 ? "started" : "waited for");
    PlanBucket bucket;
    if (entry.tensors() != nullptr) bucket.tensors = copy_numbers(*entry.tensors());
    bucket.reduce_scatter = entry.reduce_scatter();
    if (bucket.tensors.empty()) return invalid_argument(at, " has no tensors");
    if (bucket.reduce_scatter && pipe.zero < 1)
      return invalid_argument(at, ": reduce_scatter needs pipeline.zero = 1, 2 or 3");
    const auto members = static_cast<int64_t>(pipe.groups[static_cast<size_t>(group[b])].size());
    for (size_t k = 0; k < bucket.tensors.size(); ++k) {
      const TensorId id = bucket.tensors[k];
      if (id >= g.num_tensors())
        return out_of_range(at, ".tensors[", k, "] = ", id,
                            " is not a tensor index (the model has ", g.num_tensors(), " tensors)");
      const Tensor &tensor = g.tensor(id);
      if (tensor.kind != TensorKind::kIntermediate || tensor.type.dtype != DType::kF32)
        return invalid_argument(at, ".tensors[", k, "]: '", tensor.name,
                                "' is not an f32 intermediate; buckets reduce accumulated "
                                "gradients");
      if (!bucketed.insert(id).second)
        return invalid_argument(at, ".tensors[", k, "]: '", tensor.name, "' is in two buckets");
      if (bucket.reduce_scatter && tensor.type.num_elements() % members != 0)
        return invalid_argument(at, ".tensors[", k, "]: '", tensor.name, "' has ",
                                tensor.type.num_elements(), " elements, which ", members,
                                " devices do not divide");
    }
    program.buckets.push_back(std::move(bucket));
  }
  return Status::ok();
}

// Every buffer of a memory plan starts at a multiple of this (passes/plan_memory.h
// places them so), which the kernels' vector loads and the element types need.
constexpr int64_t kPlanAlignment = 64;

// A program's arena holds buffers of the model's tensors, a tensor at most
// once per micro-batch and once more, so it is never larger than all of them
// side by side at that count (256-byte aligned). A larger one is refused
// before anything allocates it: a corrupt or mistyped size would otherwise
// ask the host for terabytes.
Status check_arena_size(const std::string &where, int64_t arena_bytes, const Graph &g,
                        int64_t microbatches) {
  constexpr int64_t kAlign = 256;
  int64_t bound = 0;
  for (const Tensor &tensor : g.tensors()) {
    const int64_t bytes = (tensor.type.size_bytes() + kAlign - 1) / kAlign * kAlign;
    if (bytes > (std::numeric_limits<int64_t>::max() - bound) / (microbatches + 1))
      return Status::ok(); // beyond any int64 size
    bound += bytes * (microbatches + 1);
    if (bound >= arena_bytes) return Status::ok();
  }
  return out_of_range(where, ".arena_bytes = ", arena_bytes, " is more than the ", bound,
                      " bytes of every tensor of the model side by side, once per micro-batch "
                      "and once more");
}

// One instruction of a pipeline program: a known kind, naming what exists, its
// peer a device or a group of the pipeline, its micro-batch in range.
Status instruction_from_fb(const fb::Instruction &in, const fb::Program &q, const Graph &g,
                           const PlanPipeline &pipe, const std::string &at, PlanProgram &program) {
  const int64_t devices = int64_t{pipe.stages} * pipe.data_parallel * pipe.tensor_parallel,
                microbatches = pipe.microbatches;
  const int64_t self = program.device;
  auto kind_value = static_cast<uint8_t>(in.kind());
  if (kind_value > static_cast<uint8_t>(fb::InstrKind::MAX))
    return invalid_argument(at, ".kind has unknown value ", int{kind_value});
  auto kind = static_cast<InstrKind>(kind_value);
  std::string_view name = instr_kind_name(kind);
  const uint32_t index = in.index();
  const int64_t microbatch = in.microbatch(), peer = in.peer();
  RETURN_IF_ERROR(check_instruction_index(kind, index, size_of(q.buckets()), g, at));
  if (kind == InstrKind::kSend || kind == InstrKind::kRecv) {
    std::string_view direction = kind == InstrKind::kSend ? " to" : " from";
    if (peer < 0 || peer >= devices)
      return out_of_range(at, ": ", name, direction, " device ", peer,
                          ", which is not a device of the pipeline (0..", devices - 1, ")");
    if (peer == self)
      return invalid_argument(at, ": ", name, direction, " device ", peer, ", which is itself");
  }
  const bool grouped = kind == InstrKind::kAllReduce || kind == InstrKind::kReduceScatter ||
                       kind == InstrKind::kAllGather || kind == InstrKind::kComputeShard ||
                       kind == InstrKind::kStartBucket || kind == InstrKind::kWaitBucket ||
                       kind == InstrKind::kReduceScatterAccumulate ||
                       kind == InstrKind::kGatherParam || kind == InstrKind::kStartGather ||
                       kind == InstrKind::kWaitGather;
  const bool gathers = fills_gathered(kind) || kind == InstrKind::kWaitGather;
  if (grouped) {
    if (peer < 0 || static_cast<size_t>(peer) >= pipe.groups.size())
      return out_of_range(at, ": ", name, " over group ", peer, ", but the pipeline has ",
                          pipe.groups.size(), " groups");
    const auto &group = pipe.groups[static_cast<size_t>(peer)];
    if (std::find(group.begin(), group.end(), self) == group.end())
      return invalid_argument(at, ": ", name, " over group ", peer,
                              ", which does not include device ", self);
    const bool zero_only = kind == InstrKind::kReduceScatter || kind == InstrKind::kAllGather ||
                           kind == InstrKind::kComputeShard;
    if (zero_only && pipe.zero < 1)
      return invalid_argument(at, ": ", name, " needs pipeline.zero = 1, 2 or 3");
    if (gathers && pipe.zero != 3)
      return invalid_argument(at, ": ", name, " needs pipeline.zero = 3");
    if (kind == InstrKind::kReduceScatterAccumulate && pipe.zero < 2)
      return invalid_argument(at, ": ", name, " needs pipeline.zero = 2 or 3");
    if (kind == InstrKind::kReduceScatterAccumulate || gathers) {
      const Tensor &tensor = g.tensor(index);
      if (tensor.type.num_elements() % static_cast<int64_t>(group.size()) != 0)
        return invalid_argument(at, ": ", name, " of '", tensor.name, "', whose ",
                                tensor.type.num_elements(), " elements ", group.size(),
                                " devices do not divide");
    }
  }
  // Compute, send and recv run on a micro-batch or once per step (-1);
  // accumulate and reduce-scatter-accumulate add one micro-batch's buffer.
  const bool accumulates =
      kind == InstrKind::kAccumulate || kind == InstrKind::kReduceScatterAccumulate;
  if ((kind != InstrKind::kScale && kind != InstrKind::kUpdate && !grouped) || accumulates) {
    int64_t lowest = accumulates ? 0 : -1;
    if (microbatch < lowest || microbatch >= microbatches)
      return out_of_range(at, ": ", name, " on micro-batch ", microbatch, ", not in ", lowest, "..",
                          microbatches - 1, lowest < 0 ? " (-1 is once per step)" : "");
  }
  // ZeRO-3: a gather fills the buffer of a forward (0..M-1) or backward
  // (M..2M-1) block.
  if (gathers && (microbatch < 0 || microbatch >= 2 * microbatches))
    return out_of_range(at, ": ", name, " for block ", microbatch, ", not in 0..",
                        2 * microbatches - 1,
                        " (a micro-batch's forward, or M + the micro-batch for its backward)");
  program.instructions.push_back(PlanInstruction{kind, in.microbatch(), index, in.peer()});
  return Status::ok();
}

// A pipeline program's slots: buffers of the model's tensors, aligned and
// inside the arena (a ZeRO-2 shard's step buffer: its shard's bytes). After
// the instructions, which say which step buffers are shards.
Status slots_from_fb(const fb::Program &q, const Graph &g, const std::string &where,
                     const PlanPipeline &pipe, PlanProgram &program) {
  const size_t num_tensors = g.num_tensors();
  const int64_t microbatches = pipe.microbatches;
  const std::vector<bool> shards = shard_accumulated(program, num_tensors);
  const std::vector<bool> gathered = gathered_params(program, num_tensors);
  for (const fb::Slot &slot : copy_structs(q.slots())) {
    std::string at = str_cat(where, ".slots[", program.slots.size(), "]");
    if (slot.tensor() >= num_tensors)
      return out_of_range(at, ".tensor = ", slot.tensor(), " is not a tensor index (the model has ",
                          num_tensors, " tensors)");
    // A ZeRO-3 parameter's buffers are per block: 2M of them.
    const int64_t top = gathered[slot.tensor()] ? 2 * microbatches : microbatches;
    if (slot.microbatch() < -1 || slot.microbatch() >= top)
      return out_of_range(at, ".microbatch = ", slot.microbatch(), " is not in -1..", top - 1);
    const Tensor &tensor = g.tensor(slot.tensor());
    if (slot.offset() < 0) return invalid_argument(at, ".offset = ", slot.offset(), " is negative");
    if (slot.offset() % kPlanAlignment != 0)
      return invalid_argument(at, ".offset = ", slot.offset(), " is not a multiple of ",
                              kPlanAlignment, " bytes, as every buffer of a memory plan is");
    const int64_t bytes =
        slot_bytes(g, slot.tensor(), slot.microbatch(), shards, pipe.data_parallel);
    if (slot.offset() > program.arena_bytes || bytes > program.arena_bytes - slot.offset())
      return out_of_range(at, ".offset = ", slot.offset(), ": tensor '", tensor.name, "' (", bytes,
                          " bytes) does not fit the ", program.arena_bytes, "-byte arena");
    program.slots.push_back(PlanSlot{slot.tensor(), slot.microbatch(), slot.offset()});
  }
  return Status::ok();
}

// The parameters, state and constants a device holds, by strictly increasing id.
Status holds_from_fb(const fb::Program &q, const Graph &g, const std::string &where,
                     PlanProgram &program) {
  const size_t num_tensors = g.num_tensors();
  if (q.holds() != nullptr) program.holds = copy_numbers(*q.holds());
  for (size_t k = 0; k < program.holds.size(); ++k) {
    TensorId id = program.holds[k];
    if (id >= num_tensors)
      return out_of_range(where, ".holds[", k, "] = ", id, " is not a tensor index (the model has ",
                          num_tensors, " tensors)");
    const Tensor &tensor = g.tensor(id);
    if (tensor.kind != TensorKind::kParameter && tensor.kind != TensorKind::kState &&
        tensor.kind != TensorKind::kConstant)
      return invalid_argument(where, ".holds[", k, "]: tensor '", tensor.name, "' has kind ",
                              tensor_kind_name(tensor.kind),
                              "; a device holds parameters, state and constants");
    if (k > 0 && id <= program.holds[k - 1])
      return invalid_argument(where, ".holds[", k, "] = ", id, " does not follow ",
                              program.holds[k - 1], "; holds are strictly increasing tensor ids");
  }
  return Status::ok();
}

// ZeRO-1 and ZeRO-2: the held state kept as shards, and the group they are
// shards over.
Status shard_group_from_fb(const fb::Program &q, const PlanPipeline &pipe, const std::string &where,
                           PlanProgram &program) {
  const int64_t self = program.device;
  if (q.sharded_holds() != nullptr) program.sharded_holds = copy_numbers(*q.sharded_holds());
  program.shard_group = q.shard_group();
  if (!program.sharded_holds.empty()) {
    if (pipe.zero < 1)
      return invalid_argument(where, ".sharded_holds needs pipeline.zero = 1, 2 or 3");
    if (program.shard_group < 0 || static_cast<size_t>(program.shard_group) >= pipe.groups.size())
      return out_of_range(where, ".shard_group = ", program.shard_group, ", but the pipeline has ",
                          pipe.groups.size(), " groups");
    const auto &group = pipe.groups[static_cast<size_t>(program.shard_group)];
    if (std::find(group.begin(), group.end(), self) == group.end())
      return invalid_argument(where, ".shard_group = ", program.shard_group,
                              ", which does not include device ", self);
  } else if (program.shard_group != -1) {
    return invalid_argument(where, ".shard_group = ", program.shard_group,
                            " without sharded_holds");
  }
  return Status::ok();
}

// Each sharded hold is a held state tensor (under ZeRO-3 also a parameter)
// whose size the group divides.
Status check_sharded_holds(const Graph &g, const PlanPipeline &pipe, const std::string &where,
                           const PlanProgram &program) {
  for (size_t k = 0; k < program.sharded_holds.size(); ++k) {
    const TensorId id = program.sharded_holds[k];
    if (!std::binary_search(program.holds.begin(), program.holds.end(), id))
      return invalid_argument(where, ".sharded_holds[", k, "] = ", id, " is not in holds");
    // ZeRO-3 holds parameters as shards too; ZeRO-1 and 2 only state.
    const TensorKind kind = g.tensor(id).kind;
    if (kind != TensorKind::kState && !(pipe.zero == 3 && kind == TensorKind::kParameter))
      return invalid_argument(where, ".sharded_holds[", k, "]: '", g.tensor(id).name, "' is not a ",
                              pipe.zero == 3 ? "parameter or state tensor" : "state tensor");
    const int64_t members =
        static_cast<int64_t>(pipe.groups[static_cast<size_t>(program.shard_group)].size());
    if (g.tensor(id).type.num_elements() % members != 0)
      return invalid_argument(where, ".sharded_holds[", k, "]: '", g.tensor(id).name, "' has ",
                              g.tensor(id).type.num_elements(), " elements, which ", members,
                              " devices do not divide");
    if (k > 0 && id <= program.sharded_holds[k - 1])
      return invalid_argument(where, ".sharded_holds is not strictly increasing");
  }
  return Status::ok();
}

// A pipeline plan's program (revision 2): instructions, slots and holds instead
// of order and offsets. `where` is "field programs[i]"; `program.device` is set.
Status pipeline_program_from_fb(const fb::Program &q, const Graph &g, const PlanPipeline &pipe,
                                const std::string &where, PlanProgram &program) {
  const int64_t devices = int64_t{pipe.stages} * pipe.data_parallel * pipe.tensor_parallel,
                microbatches = pipe.microbatches;
  const int64_t self = program.device;
  if (self >= devices)
    return out_of_range(where, ".device = ", self, "; a pipeline's devices are 0..", devices - 1);
  if (size_of(q.order()) > 0)
    return invalid_argument(where, ".order has ", size_of(q.order()),
                            " entries; a pipeline plan's programs have instructions instead");
  if (size_of(q.offsets()) > 0)
    return invalid_argument(where, ".offsets has ", size_of(q.offsets()),
                            " entries; a pipeline plan's programs have slots instead");
  program.arena_bytes = q.arena_bytes();
  if (program.arena_bytes < 0)
    return invalid_argument(where, ".arena_bytes = ", program.arena_bytes, " is negative");
  const std::vector<fb::Instruction> instructions = copy_structs(q.instructions());
  for (size_t k = 0; k < instructions.size(); ++k)
    RETURN_IF_ERROR(instruction_from_fb(instructions[k], q, g, pipe,
                                        str_cat(where, ".instructions[", k, "]"), program));
  RETURN_IF_ERROR(slots_from_fb(q, g, where, pipe, program));
  RETURN_IF_ERROR(check_arena_size(where, program.arena_bytes, g, microbatches));
  RETURN_IF_ERROR(holds_from_fb(q, g, where, program));
  program.predicted_busy_s = q.predicted_busy_s();
  if (!finite_non_negative(program.predicted_busy_s))
    return invalid_argument(where, ".predicted_busy_s = ", program.predicted_busy_s,
                            " is not a finite time >= 0");
  RETURN_IF_ERROR(shard_group_from_fb(q, pipe, where, program));
  RETURN_IF_ERROR(buckets_from_fb(q, g, pipe, where, program));
  RETURN_IF_ERROR(check_sharded_holds(g, pipe, where, program));
  return Status::ok();
}

// A training plan's loss (a scalar graph output of a known kind) and optimizer.
Status check_training_fields(const Plan &plan) {
  const Graph &g = plan.graph;
  if (plan.loss.empty()) return invalid_argument("field loss is missing in a training plan");
  RETURN_IF_ERROR(check_name("field loss", plan.loss));
  auto loss = g.find_tensor(plan.loss);
  if (!loss) return invalid_argument("field loss names tensor '", plan.loss, "', not in the model");
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
  return Status::ok();
}

// The devices, each index once, all "cpu"; `device_indices` gets their indices.
Status devices_from_fb(const fb::Plan &p, Plan &plan, std::set<uint32_t> &device_indices) {
  if (p.devices() == nullptr || p.devices()->size() == 0)
    return invalid_argument("field devices is empty; a plan runs on at least one device");
  for (uint32_t i = 0; i < p.devices()->size(); ++i) {
    const fb::Device &d = *p.devices()->Get(i);
    if (!device_indices.insert(d.index()).second)
      return invalid_argument("field devices[", i, "].index = ", d.index(), " is given twice");
    if (d.kind() == nullptr || d.kind()->string_view() != "cpu")
      return invalid_argument("field devices[", i, "].kind is '", text_of(d.kind()),
                              "'; this build runs only \"cpu\"");
    plan.devices.push_back(PlanDevice{d.index(), d.kind()->str()});
  }
  return Status::ok();
}

// A program of a plan without a pipeline (revision 1): the order every node
// runs in, and each intermediate tensor's place in the arena.
Status sequential_program_from_fb(const fb::Program &q, const Graph &g, const std::string &where,
                                  PlanProgram &program) {
  // Revision 2 fields belong to pipeline plans only.
  for (auto [field, count] :
       {std::pair<const char *, size_t>{"instructions", size_of(q.instructions())},
        {"slots", size_of(q.slots())},
        {"holds", size_of(q.holds())},
        {"sharded_holds", size_of(q.sharded_holds())}})
    if (count > 0)
      return invalid_argument(where, ".", field, " has ", count,
                              " entries, but only pipeline plans have ", field);
  if (q.predicted_busy_s() != 0)
    return invalid_argument(where, ".predicted_busy_s = ", q.predicted_busy_s(),
                            ", but only pipeline plans have predicted times");
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
    } else if (offset % kPlanAlignment != 0) {
      return invalid_argument(where, ".offsets[", t, "] = ", offset, ": tensor '", tensor.name,
                              "' is not at a multiple of ", kPlanAlignment,
                              " bytes, as every buffer of a memory plan is");
    }
    program.offsets.push_back(offset);
  }
  RETURN_IF_ERROR(check_arena_size(where, program.arena_bytes, g, 1));
  return Status::ok();
}

// Revision 5 and later: the embedded model, as loaded, hashes to the digest
// the writer recorded. Earlier revisions have none and must not claim one.
Status check_graph_digest(const fb::Plan &p, const Graph &graph) {
  if (p.plan_version() < kDigestPlanVersion) {
    if (p.graph_digest() != nullptr)
      return invalid_argument("field graph_digest: the file has plan version ", p.plan_version(),
                              " but model digests need version ", kDigestPlanVersion);
    return Status::ok();
  }
  if (!is_hex_digest(p.graph_digest()))
    return invalid_argument("field graph_digest is ",
                            p.graph_digest() ? "not 64 lowercase hex digits" : "missing");
  ASSIGN_OR_RETURN(std::string digest, graph_digest(graph));
  if (digest != p.graph_digest()->string_view())
    return invalid_argument("field model: the embedded model's SHA-256 is ", digest,
                            ", not the graph_digest ", p.graph_digest()->string_view(),
                            " it was written with: the model was edited or corrupted since; "
                            "compile the plan again");
  return Status::ok();
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
  auto text = text_of;
  plan.loss = text(p.loss());
  plan.loss_kind = text(p.loss_kind());
  plan.optimizer = text(p.optimizer());
  plan.model_fingerprint = text(p.model_fingerprint());
  plan.fingerprint = text(p.fingerprint());
  plan.producer = text(p.producer());
  const Graph &g = plan.graph;

  if (plan.mode == Plan::Mode::kTrain) RETURN_IF_ERROR(check_training_fields(plan));
  if (!is_hex_digest(p.model_fingerprint()))
    return invalid_argument("field model_fingerprint is not 64 lowercase hex digits");
  if (!is_hex_digest(p.fingerprint()))
    return invalid_argument("field fingerprint is not 64 lowercase hex digits");

  RETURN_IF_ERROR(check_graph_digest(p, g));

  std::set<uint32_t> device_indices;
  RETURN_IF_ERROR(devices_from_fb(p, plan, device_indices));
  if (p.programs() == nullptr || p.programs()->size() != plan.devices.size())
    return invalid_argument("field programs has ", p.programs() ? p.programs()->size() : 0,
                            " entries for ", plan.devices.size(), " devices; one per device");
  if (p.pipeline() != nullptr) {
    if (p.plan_version() < kPipelinePlanVersion)
      return invalid_argument("field pipeline: the file has plan version ", p.plan_version(),
                              " but pipeline plans need version ", kPipelinePlanVersion);
    ASSIGN_OR_RETURN(plan.pipeline,
                     pipeline_from_fb(*p.pipeline(), g, plan.devices.size(), p.programs()->size()));
    if (plan.pipeline->chunks > 1 && p.plan_version() < kInterleavedPlanVersion)
      return invalid_argument("field pipeline.chunks: the file has plan version ", p.plan_version(),
                              " but interleaved plans need version ", kInterleavedPlanVersion);
  }
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
    if (plan.pipeline)
      RETURN_IF_ERROR(pipeline_program_from_fb(q, g, *plan.pipeline, where, program));
    else
      RETURN_IF_ERROR(sequential_program_from_fb(q, g, where, program));
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

Status check_instruction_index(InstrKind kind, uint32_t index, size_t num_buckets, const Graph &g,
                               const std::string &at) {
  const size_t num_nodes = g.num_nodes(), num_tensors = g.num_tensors();
  std::string_view name = instr_kind_name(kind);
  switch (kind) {
  case InstrKind::kCompute:
  case InstrKind::kComputeShard:
    if (index >= num_nodes)
      return out_of_range(at, ": compute of node ", index,
                          ", which is not a node index (the model has ", num_nodes, " nodes)");
    break;
  case InstrKind::kSend:
  case InstrKind::kRecv:
  case InstrKind::kAccumulate:
  case InstrKind::kScale:
  case InstrKind::kAllReduce:
  case InstrKind::kReduceScatter:
  case InstrKind::kAllGather:
  case InstrKind::kReduceScatterAccumulate:
  case InstrKind::kGatherParam:
  case InstrKind::kStartGather:
  case InstrKind::kWaitGather:
    if (index >= num_tensors)
      return out_of_range(at, ": ", name, " of tensor ", index,
                          ", which is not a tensor index (the model has ", num_tensors,
                          " tensors)");
    break;
  case InstrKind::kUpdate:
    if (index >= g.updates().size())
      return out_of_range(at, ": update ", index, ", but the model has ", g.updates().size(),
                          " state updates");
    break;
  case InstrKind::kStartBucket:
  case InstrKind::kWaitBucket:
    if (index >= num_buckets)
      return out_of_range(at, ": ", name, " ", index, ", but the program has ", num_buckets,
                          " buckets");
    break;
  }
  return Status::ok();
}

std::string_view instr_kind_name(InstrKind kind) {
  switch (kind) {
  case InstrKind::kCompute: return "compute";
  case InstrKind::kSend: return "send";
  case InstrKind::kRecv: return "recv";
  case InstrKind::kAccumulate: return "accumulate";
  case InstrKind::kScale: return "scale";
  case InstrKind::kUpdate: return "update";
  case InstrKind::kAllReduce: return "all-reduce";
  case InstrKind::kReduceScatter: return "reduce-scatter";
  case InstrKind::kAllGather: return "all-gather";
  case InstrKind::kComputeShard: return "compute-shard";
  case InstrKind::kStartBucket: return "start-bucket";
  case InstrKind::kWaitBucket: return "wait-bucket";
  case InstrKind::kReduceScatterAccumulate: return "reduce-scatter-accumulate";
  case InstrKind::kGatherParam: return "gather-param";
  case InstrKind::kStartGather: return "start-gather";
  case InstrKind::kWaitGather: return "wait-gather";
  }
  return "unknown";
}

std::vector<bool> shard_accumulated(const PlanProgram &program, size_t num_tensors) {
  std::vector<bool> shards(num_tensors, false);
  for (const PlanInstruction &instr : program.instructions)
    if (instr.kind == InstrKind::kReduceScatterAccumulate && instr.index < num_tensors)
      shards[instr.index] = true;
  return shards;
}

std::vector<bool> gathered_params(const PlanProgram &program, size_t num_tensors) {
  std::vector<bool> gathered(num_tensors, false);
  for (const PlanInstruction &instr : program.instructions)
    if (fills_gathered(instr.kind) && instr.index < num_tensors) gathered[instr.index] = true;
  return gathered;
}

int64_t slot_bytes(const Graph &graph, TensorId tensor, int32_t microbatch,
                   const std::vector<bool> &sharded, int64_t shards) {
  const int64_t bytes = graph.tensor(tensor).type.size_bytes();
  if (microbatch >= 0 || shards < 1 || tensor >= sharded.size() || !sharded[tensor]) return bytes;
  return bytes / shards;
}

std::string_view plan_mode_name(Plan::Mode mode) {
  return mode == Plan::Mode::kTrain ? "train" : "infer";
}

Result<std::string> graph_digest(const Graph &graph) {
  ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, model_to_flatbuffer(graph));
  return sha256_hex(bytes);
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
