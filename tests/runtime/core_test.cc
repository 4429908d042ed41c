// The execution core's reading of a plan (runtime/core/pipeline_plan.h):
// which part of each tensor a device holds, how parts make whole values and
// checkpoint pieces, and the errors resolve_program gives a plan whose
// buffers it cannot place. Both pipeline runners rely on these; here they
// are checked on their own, without running a step.
#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include <gtest/gtest.h>

#include "partitioner/compile_pipeline.h"
#include "passes/optimizer.h"
#include "plan/checkpoint_layout.h"
#include "runtime/core/device_program.h"
#include "runtime/core/pipeline_plan.h"
#include "tools/zoo.h"

namespace strata::runtime::core {
namespace {

serialization::Plan compile_gpt(int dp, int tp, int zero) {
  zoo::GptOptions o;
  o.layers = 2;
  o.hidden = 32;
  o.heads = 2;
  o.seq = 8;
  o.vocab = 64;
  o.batch = 8;
  passes::TrainingOptions training;
  training.optimizer = *passes::parse_optimizer("adamw:lr=1e-3");
  partitioner::PipelineCompileOptions mesh;
  mesh.data_parallel = dp;
  mesh.tensor_parallel = tp;
  mesh.zero = zero;
  mesh.microbatches = 2;
  auto plan = partitioner::compile_pipeline(*zoo::make_gpt(o), training, mesh);
  EXPECT_TRUE(plan.is_ok()) << plan.status().message();
  return std::move(plan).value();
}

// A whole value of `type` whose every byte says where it is.
HostTensor numbered(const TensorType &type, uint32_t seed) {
  HostTensor value = HostTensor::zeros(type);
  for (size_t i = 0; i < value.size_bytes(); ++i)
    value.data()[i] = static_cast<std::byte>((i * 131 + seed * 7 + i / 253) & 0xff);
  return value;
}

// Every device's parts, as split_value writes them.
using Parts = std::map<std::pair<int, TensorId>, HostTensor>;

Parts split_all(const PipelinePlan &plan, const std::map<TensorId, HostTensor> &values) {
  Parts parts;
  for (const auto &[id, value] : values) {
    bool held = false;
    Status split = plan.split_value(id, value, [&](int d, const std::byte *data, size_t bytes) {
      held = true;
      HostTensor part = HostTensor::zeros(plan.held(d, id).type);
      EXPECT_EQ(part.size_bytes(), bytes) << plan.graph().tensor(id).name << " on device " << d;
      if (bytes > 0) std::memcpy(part.data(), data, bytes);
      parts[{d, id}] = std::move(part);
      return Status::ok();
    });
    EXPECT_TRUE(split.is_ok() && held) << plan.graph().tensor(id).name;
  }
  return parts;
}

// Over data parallelism, tensor parallelism and ZeRO-1 together, a value cut
// into every holder's part is put together again bitwise, from the parts of
// every device or of the first holder's group only; the pieces a process
// would checkpoint carry the names the trainer joins.
TEST(PipelinePlan, PartsMakeTheWholeValueAgain) {
  const serialization::Plan compiled = compile_gpt(2, 2, 1);
  auto made = PipelinePlan::create(compiled, "test plan");
  ASSERT_TRUE(made.is_ok()) << made.status().message();
  const PipelinePlan &plan = **made;
  ASSERT_EQ(plan.num_devices(), 4);
  const Graph &g = plan.graph();
  std::map<TensorId, HostTensor> values;
  size_t pieces = 0, shards = 0;
  for (TensorId id = 0; id < g.num_tensors(); ++id) {
    const Tensor &t = g.tensor(id);
    if (t.kind != TensorKind::kParameter && t.kind != TensorKind::kState) continue;
    values.emplace(id, numbered(plan.value_type(id), id));
    pieces += plan.tp_shard(id) != nullptr;
    for (int d = 0; d < plan.num_devices(); ++d)
      shards += plan.holds(d, id) && plan.held(d, id).shard >= 0;
  }
  ASSERT_GT(pieces, 0u);
  ASSERT_GT(shards, 0u);
  const Parts parts = split_all(plan, values);
  auto read = [&](int d, TensorId id) -> std::optional<HostTensor> {
    auto it = parts.find({d, id});
    if (it == parts.end()) return std::nullopt;
    return it->second;
  };
  auto everywhere = [](int) { return true; };
  for (const auto &[id, want] : values) {
    std::optional<HostTensor> got = plan.whole_value(id, everywhere, read);
    ASSERT_TRUE(got.has_value()) << g.tensor(id).name;
    ASSERT_EQ(got->size_bytes(), want.size_bytes()) << g.tensor(id).name;
    EXPECT_EQ(std::memcmp(got->data(), want.data(), want.size_bytes()), 0) << g.tensor(id).name;
  }
  // Without one member of a tensor-parallel group, a tensor in pieces cannot
  // be put together here; one held whole still can.
  auto without_member_1 = [](int d) { return d != 1; };
  for (const auto &[id, want] : values)
    EXPECT_EQ(plan.whole_value(id, without_member_1, read).has_value(),
              plan.tp_shard(id) == nullptr)
        << g.tensor(id).name;

  // Checkpoint pieces: a tensor in pieces as "@tp<m>of2", a ZeRO-1 shard as
  // "@shard<i>of2"; joined back, the whole value.
  const auto written = plan.checkpoint_pieces(everywhere, read);
  std::set<std::string> suffixes;
  for (const auto &[name, value] : written)
    if (name.find('@') != std::string::npos) suffixes.insert(name.substr(name.find('@')));
  EXPECT_TRUE(suffixes.contains("@tp0of2") || suffixes.contains("@tp0of2@shard0of2"));
  EXPECT_TRUE(suffixes.contains("@shard1of2") || suffixes.contains("@tp1of2@shard1of2"));
  // Joined by the compiled plan's layout record alone (what a resume on
  // any other plan does): every tensor whole, bitwise.
  serialization::Checkpoint checkpoint;
  checkpoint.tensors = written;
  for (const auto &[name, value] : written)
    checkpoint.file_of[name] = "model-step1-rank0-of2.safetensors";
  const serialization::CheckpointLayout layout = plan::checkpoint_layout(compiled, "2x2x1");
  Status joined = plan::join_checkpoint(checkpoint, layout, "ck");
  ASSERT_TRUE(joined.is_ok()) << joined.message();
  Status complete = plan::check_checkpoint_tensors(checkpoint, plan::without_cuts(layout), "ck");
  ASSERT_TRUE(complete.is_ok()) << complete.message();
  for (const auto &[id, want] : values) {
    const HostTensor &whole = checkpoint.tensors.at(g.tensor(id).name);
    ASSERT_EQ(whole.type, want.type) << g.tensor(id).name;
    EXPECT_EQ(std::memcmp(whole.data(), want.data(), want.size_bytes()), 0) << g.tensor(id).name;
  }
  // Without one tensor-parallel piece the join names the tensor and the
  // missing piece.
  for (const auto &[name, value] : written) {
    if (name.find("@tp1of2") == std::string::npos) continue;
    serialization::Checkpoint partial;
    partial.tensors = written;
    partial.tensors.erase(name);
    Status refused = plan::join_checkpoint(partial, layout, "ck");
    EXPECT_FALSE(refused.is_ok());
    EXPECT_NE(refused.message().find(name.substr(0, name.find('@'))), std::string::npos)
        << refused.message();
    break;
  }
}

// A plan whose program reads a buffer it never places is refused when the
// program is resolved, naming the device, the instruction and the buffer.
TEST(ResolveProgram, NamesTheInstructionWhoseBufferIsMissing) {
  serialization::Plan compiled = compile_gpt(1, 1, 0);
  auto &slots = compiled.programs[0].slots;
  ASSERT_FALSE(slots.empty());
  const std::string missing = compiled.graph.tensor(slots.back().tensor).name;
  slots.pop_back();
  auto made = PipelinePlan::create(compiled, "test plan");
  ASSERT_TRUE(made.is_ok()) << made.status().message();
  std::vector<std::byte> arena(static_cast<size_t>(compiled.programs[0].arena_bytes));
  std::vector<HostTensor> held;
  DeviceMemory memory;
  memory.arena = arena.data();
  memory.held = [&](TensorId id) -> std::byte * {
    held.push_back(HostTensor::zeros((*made)->held(0, id).type));
    return held.back().size_bytes() ? held.back().data() : nullptr;
  };
  auto program = resolve_program(**made, 0, memory);
  ASSERT_FALSE(program.is_ok());
  const std::string message = program.status().message();
  EXPECT_NE(message.find("device 0 instruction "), std::string::npos) << message;
  EXPECT_NE(message.find("'" + missing + "'"), std::string::npos) << message;
  EXPECT_NE(message.find("has no buffer in the plan"), std::string::npos) << message;
}

// What a plan cannot be read as: programs out of device order, a group naming
// a device the plan lacks.
TEST(PipelinePlan, RefusesWhatNoBackendCouldRun) {
  serialization::Plan swapped = compile_gpt(2, 1, 0);
  std::swap(swapped.programs[0], swapped.programs[1]);
  auto made = PipelinePlan::create(swapped, "test plan");
  ASSERT_FALSE(made.is_ok());
  EXPECT_NE(made.status().message().find("test plan: program 0 is for device 1"), std::string::npos)
      << made.status().message();
  serialization::Plan stray = compile_gpt(2, 1, 0);
  stray.pipeline->groups.push_back({0, 7});
  made = PipelinePlan::create(stray, "test plan");
  ASSERT_FALSE(made.is_ok());
  EXPECT_NE(made.status().message().find("names device 7; the plan has 2"), std::string::npos)
      << made.status().message();
}

// A plan whose programs do not compute its step (a replica drops an update,
// and trains on to other weights than its peer) is refused before a backend
// allocates anything, naming the device and the update.
TEST(PipelinePlan, RefusesProgramsThatDoNotComputeTheStep) {
  serialization::Plan plan = compile_gpt(2, 1, 0);
  auto &instrs = plan.programs[1].instructions;
  auto update = std::find_if(instrs.begin(), instrs.end(), [](const auto &instr) {
    return instr.kind == serialization::InstrKind::kUpdate;
  });
  ASSERT_NE(update, instrs.end());
  instrs.erase(update);
  auto made = PipelinePlan::create(plan, "test plan");
  ASSERT_FALSE(made.is_ok());
  EXPECT_NE(made.status().message().find(
                "test plan: device 1 (stage 0 replica 1): never applies update "),
            std::string::npos)
      << made.status().message();
}

} // namespace
} // namespace strata::runtime::core
