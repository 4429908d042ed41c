#include "serialization/model_io.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "graph/builder.h"
#include "graph/verifier.h"
#include "ops/registry.h"
#include "serialization/model_generated.h"
#include "serialization/safetensors.h"
#include "test_util.h"

namespace strata::serialization {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

std::shared_ptr<const Blob> floats_blob(std::vector<float> values) {
  return Blob::copy_of(values.data(), values.size() * sizeof(float));
}

// A small graph that uses every kind of value source and every attribute type:
// inline data, an initializer, external data, and int, float, string, ints and
// floats attributes.
Graph make_test_graph() {
  GraphBuilder b("test_model", ops::OpRegistry::global());
  TensorId x = b.input("x", DType::kF32, {2, 4});
  TensorId w =
      b.parameter("w", DType::kF32, {4, 3}, floats_blob({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  // Values that a 12-decimal text form would lose.
  TensorId bias = b.parameter("bias", DType::kF32, {3},
                              Initializer{Initializer::Kind::kNormal, 1e-20, 1.0 / 3.0, 42});
  TensorId mm = b.op1("MatMul", {x, w}, {{"trans_a", int64_t{0}}}, "mm");
  TensorId add = b.op1("Add", {mm, bias}, {}, "add");
  TensorId relu = b.op1("Relu", {add}, {}, "relu");
  TensorId clip = b.op1("Clip", {relu},
                        {{"max", 6.0}, {"min", -std::numeric_limits<double>::infinity()}}, "clip");
  TensorId gelu = b.op1("Gelu", {clip}, {{"approximate", std::string("tanh")}}, "gelu");
  TensorId t = b.op1("Transpose", {gelu}, {{"perm", std::vector<int64_t>{1, 0}}}, "transpose");
  TensorId k =
      b.op1("Constant", {},
            {{"shape", std::vector<int64_t>{3, 2}}, {"value", std::vector<double>{0.1}}}, "k");
  TensorId scale = b.parameter("scale", DType::kF32, {3, 2}, Initializer{Initializer::Kind::kOnes});
  TensorId sum = b.op1("Add", {t, k}, {}, "sum");
  TensorId out = b.op1("Mul", {sum, scale}, {}, "out");
  b.output(out);
  auto graph = std::move(b).finish();
  EXPECT_TRUE(graph.is_ok()) << graph.status().to_string();
  Graph g = std::move(graph).value();
  // Move `scale` to a file beside the model.
  Tensor &s = g.mutable_tensor(scale);
  s.initializer = Initializer{};
  s.external = ExternalData{"weights/extra.safetensors", "scale"};
  EXPECT_TRUE(verify_graph(g, ops::OpRegistry::global()).is_ok());
  return g;
}

void expect_graphs_equal(const Graph &a, const Graph &b) {
  EXPECT_EQ(a.name(), b.name());
  ASSERT_EQ(a.num_tensors(), b.num_tensors());
  for (TensorId id = 0; id < a.num_tensors(); ++id) {
    const Tensor &x = a.tensor(id), &y = b.tensor(id);
    SCOPED_TRACE(x.name);
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.type, y.type);
    EXPECT_EQ(x.kind, y.kind);
    EXPECT_EQ(x.producer, y.producer);
    ASSERT_EQ(x.data == nullptr, y.data == nullptr);
    if (x.data) {
      EXPECT_EQ(x.data->bytes(), y.data->bytes());
    }
    EXPECT_EQ(x.external, y.external);
    EXPECT_EQ(x.initializer, y.initializer);
  }
  ASSERT_EQ(a.num_nodes(), b.num_nodes());
  for (NodeId id = 0; id < a.num_nodes(); ++id) {
    const Node &x = a.node(id), &y = b.node(id);
    SCOPED_TRACE(x.name);
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.op, y.op);
    EXPECT_EQ(x.inputs, y.inputs);
    EXPECT_EQ(x.outputs, y.outputs);
    EXPECT_EQ(x.attrs, y.attrs);
  }
  EXPECT_EQ(a.inputs(), b.inputs());
  EXPECT_EQ(a.outputs(), b.outputs());
}

std::vector<uint8_t> to_bytes(const Graph &g) {
  auto bytes = model_to_flatbuffer(g);
  EXPECT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  return bytes.is_ok() ? *bytes : std::vector<uint8_t>{};
}

std::string read_text(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_text(const std::string &path, const std::string &text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

TEST(ModelIo, FormatFollowsTheExtension) {
  EXPECT_EQ(model_format_for_path("a/b.json"), ModelFormat::kJson);
  EXPECT_EQ(model_format_for_path("a/b.strata"), ModelFormat::kBinary);
  EXPECT_EQ(model_format_for_path("model"), ModelFormat::kBinary);
}

TEST(ModelIo, BinaryRoundTripKeepsEverything) {
  Graph g = make_test_graph();
  std::vector<uint8_t> bytes = to_bytes(g);
  auto loaded = load_model_from_buffer(bytes, "m.strata", ".");
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  expect_graphs_equal(g, *loaded);
  // Saving is canonical: what was loaded saves to the same bytes.
  EXPECT_EQ(to_bytes(*loaded), bytes);
}

TEST(ModelIo, FileStartsWithIdentifierAndRecordsVersionAndProducer) {
  std::vector<uint8_t> bytes = to_bytes(make_test_graph());
  ASSERT_GE(bytes.size(), 8u);
  EXPECT_EQ(std::string(bytes.begin() + 4, bytes.begin() + 8), "STRM");
  const fb::Model *model = fb::GetModel(bytes.data());
  EXPECT_EQ(model->schema_version(), 1u);
  EXPECT_EQ(model->producer()->str(), std::string("strata ") + STRATA_VERSION);
}

TEST(ModelIo, InlineDataIs64ByteAligned) {
  // Odd sizes before and after, so alignment does not happen by luck.
  GraphBuilder b("aligned", ops::OpRegistry::global());
  bool flags[3] = {true, false, true};
  TensorId c0 = b.constant("c0", DType::kBool, {3}, Blob::copy_of(flags, 3));
  TensorId c1 = b.constant("c1", DType::kF32, {5}, floats_blob({1, 2, 3, 4, 5}));
  TensorId c2 = b.constant("c2", DType::kBool, {1}, Blob::copy_of(flags, 1));
  TensorId c3 = b.constant("c3", DType::kF32, {7}, floats_blob({1, 2, 3, 4, 5, 6, 7}));
  b.output(c0);
  b.output(c1);
  b.output(c2);
  b.output(c3);
  auto g = std::move(b).finish();
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  std::vector<uint8_t> bytes = to_bytes(*g);
  const fb::Model *model = fb::GetModel(bytes.data());
  int checked = 0;
  for (const fb::Tensor *t : *model->tensors()) {
    ASSERT_NE(t->data(), nullptr);
    auto offset = static_cast<size_t>(t->data()->Data() - bytes.data());
    EXPECT_EQ(offset % 64, 0u) << t->name()->str() << " at offset " << offset;
    ++checked;
  }
  EXPECT_EQ(checked, 4);
  auto loaded = load_model_from_buffer(bytes, "aligned.strata", ".");
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  expect_graphs_equal(*g, *loaded);
}

TEST(ModelIo, JsonRoundTripIsByteIdentical) {
  std::vector<uint8_t> bytes = to_bytes(make_test_graph());
  auto loaded = load_model_from_buffer(bytes, "m.strata", ".");
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  auto json = model_to_json(*loaded);
  ASSERT_TRUE(json.is_ok()) << json.status().to_string();
  EXPECT_THAT(*json, HasSubstr("\"kind\": \"Parameter\""));
  EXPECT_THAT(*json, HasSubstr("\"approximate\""));
  auto from_json = load_model_from_json(*json, "m.json", ".");
  ASSERT_TRUE(from_json.is_ok()) << from_json.status().to_string() << "\n" << *json;
  EXPECT_EQ(to_bytes(*from_json), bytes) << *json;
  // The text form is canonical too.
  auto json_again = model_to_json(*from_json);
  ASSERT_TRUE(json_again.is_ok());
  EXPECT_EQ(*json_again, *json);
}

TEST(ModelIo, SaveAndLoadFilesInBothForms) {
  TempDir dir;
  Graph g = make_test_graph();
  ASSERT_TRUE(save_model(g, dir.file("m.strata")).is_ok());
  ASSERT_TRUE(save_model(g, dir.file("m.json")).is_ok());
  auto binary = load_model(dir.file("m.strata"));
  ASSERT_TRUE(binary.is_ok()) << binary.status().to_string();
  auto json = load_model(dir.file("m.json"));
  ASSERT_TRUE(json.is_ok()) << json.status().to_string();
  expect_graphs_equal(g, *binary);
  expect_graphs_equal(g, *json);
  std::string on_disk = read_text(dir.file("m.strata"));
  std::vector<uint8_t> bytes = to_bytes(g);
  EXPECT_EQ(std::vector<uint8_t>(on_disk.begin(), on_disk.end()), bytes);
  // No temporary files are left behind.
  int files = 0;
  for ([[maybe_unused]] const auto &entry : std::filesystem::directory_iterator(dir.path()))
    ++files;
  EXPECT_EQ(files, 2);
}

// Saving through a symbolic link replaces the file it names; the link stays.
// A model is never written under a plan's name, which nothing would read.
TEST(ModelIo, SaveFollowsLinksAndRefusesPlanNames) {
  TempDir dir;
  std::filesystem::create_directories(dir.file("real"));
  std::filesystem::create_symlink("real/m.strata", dir.file("link.strata"));
  Graph g = make_test_graph();
  ASSERT_TRUE(save_model(g, dir.file("link.strata")).is_ok());
  EXPECT_TRUE(std::filesystem::is_symlink(dir.file("link.strata")));
  std::string on_disk = read_text(dir.file("real/m.strata"));
  std::vector<uint8_t> bytes = to_bytes(g);
  EXPECT_EQ(std::vector<uint8_t>(on_disk.begin(), on_disk.end()), bytes);
  // A device is written to, never replaced (as root, a rename would replace it).
  ASSERT_TRUE(save_model(g, "/dev/null").is_ok());
  EXPECT_TRUE(std::filesystem::is_character_file("/dev/null"));
  for (const char *name : {"m.splan", "m.splan.json"}) {
    Status status = save_model(g, dir.file(name));
    ASSERT_FALSE(status.is_ok()) << name;
    EXPECT_THAT(status.message(), HasSubstr("name plans"));
    EXPECT_FALSE(std::filesystem::exists(dir.file(name)));
  }
}

TEST(ModelIo, SaveReportsThePathWhenTheFolderIsMissing) {
  TempDir dir;
  Status status = save_model(make_test_graph(), dir.file("no/such/folder/m.strata"));
  ASSERT_FALSE(status.is_ok());
  EXPECT_THAT(status.message(), HasSubstr("no/such/folder/m.strata"));
  EXPECT_THAT(status.message(), HasSubstr("No such file or directory"));
}

TEST(ModelIo, LoadReportsAMissingFile) {
  auto loaded = load_model("/nonexistent/strata/model.strata");
  ASSERT_FALSE(loaded.is_ok());
  EXPECT_THAT(loaded.status().message(), HasSubstr("/nonexistent/strata/model.strata"));
}

TEST(ModelIo, HandWrittenExampleLoadsAndVerifies) {
  std::string path = std::string(STRATA_SOURCE_ROOT) + "/examples/tiny_mlp.json";
  auto g = load_model(path);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  EXPECT_EQ(g->name(), "tiny_mlp");
  EXPECT_TRUE(verify_graph(*g, ops::OpRegistry::global()).is_ok());
  ASSERT_EQ(g->num_nodes(), 3u);
  EXPECT_EQ(g->node(0).op, "MatMul");
  EXPECT_EQ(g->node(2).op, "Relu");
  auto w = g->find_tensor("w");
  ASSERT_TRUE(w.has_value());
  ASSERT_NE(g->tensor(*w).data, nullptr);
  EXPECT_EQ(g->tensor(*w).data->size(), 48u);
  float first;
  std::memcpy(&first, g->tensor(*w).data->data(), sizeof(first));
  EXPECT_EQ(first, 1.0f);
  // Through the canonical writer and back.
  std::vector<uint8_t> bytes = to_bytes(*g);
  auto reloaded = load_model_from_buffer(bytes, "tiny_mlp.strata", ".");
  ASSERT_TRUE(reloaded.is_ok()) << reloaded.status().to_string();
  expect_graphs_equal(*g, *reloaded);
}

// --- External data -------------------------------------------------------------

TEST(ModelIo, LargeWeightsGoToASafetensorsFileBesideTheModel) {
  TempDir dir;
  Graph g = make_test_graph();
  g.mutable_tensor(*g.find_tensor("scale")).external.reset();
  g.mutable_tensor(*g.find_tensor("scale")).initializer = Initializer{Initializer::Kind::kOnes};
  SaveOptions options;
  options.external_threshold_bytes = 0;
  ASSERT_TRUE(save_model(g, dir.file("net.strata"), options).is_ok());
  ASSERT_TRUE(std::filesystem::exists(dir.file("net.safetensors")));

  auto loaded = load_model(dir.file("net.strata"));
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  const Tensor &w = loaded->tensor(*loaded->find_tensor("w"));
  EXPECT_EQ(w.data, nullptr);
  ASSERT_TRUE(w.external.has_value());
  EXPECT_EQ(w.external->path, "net.safetensors");
  EXPECT_EQ(w.external->key, "w");
  // Initializers stay initializers.
  EXPECT_EQ(loaded->tensor(*loaded->find_tensor("bias")).initializer.kind,
            Initializer::Kind::kNormal);

  auto values = read_safetensors_tensor(dir.file(w.external->path), w.external->key, w.type);
  ASSERT_TRUE(values.is_ok()) << values.status().to_string();
  const Tensor &original = g.tensor(*g.find_tensor("w"));
  EXPECT_EQ(values->blob->bytes(), original.data->bytes());

  auto wrong =
      read_safetensors_tensor(dir.file("net.safetensors"), "w", TensorType{DType::kF16, {4, 3}});
  ASSERT_FALSE(wrong.is_ok());
  EXPECT_THAT(wrong.status().message(), HasSubstr("f32[4, 3]"));
  EXPECT_THAT(wrong.status().message(), HasSubstr("f16[4, 3]"));

  // A threshold above every tensor keeps the data inline.
  options.external_threshold_bytes = 1000;
  ASSERT_TRUE(save_model(g, dir.file("small.strata"), options).is_ok());
  EXPECT_FALSE(std::filesystem::exists(dir.file("small.safetensors")));
  auto inline_model = load_model(dir.file("small.strata"));
  ASSERT_TRUE(inline_model.is_ok()) << inline_model.status().to_string();
  EXPECT_NE(inline_model->tensor(*inline_model->find_tensor("w")).data, nullptr);
}

// --- Robustness ----------------------------------------------------------------

// A small model, a few hundred bytes, with data, an initializer and attributes.
Graph make_small_graph() {
  GraphBuilder b("small", ops::OpRegistry::global());
  TensorId x = b.input("x", DType::kF32, {2, 2});
  TensorId w = b.parameter("w", DType::kF32, {2, 2}, floats_blob({1, 2, 3, 4}));
  TensorId bias = b.parameter("b", DType::kF32, {2}, Initializer{Initializer::Kind::kZeros});
  TensorId mm = b.op1("MatMul", {x, w}, {{"trans_b", int64_t{1}}}, "mm");
  TensorId add = b.op1("Add", {mm, bias}, {}, "add");
  TensorId clip = b.op1("Clip", {add}, {{"max", 6.0}}, "clip");
  b.output(clip);
  auto g = std::move(b).finish();
  EXPECT_TRUE(g.is_ok()) << g.status().to_string();
  return std::move(g).value();
}

TEST(ModelIoRobustness, EveryTruncationIsACleanError) {
  std::vector<uint8_t> bytes = to_bytes(make_small_graph());
  ASSERT_GT(bytes.size(), 100u);
  ASSERT_LT(bytes.size(), 2048u);
  for (size_t length = 0; length < bytes.size(); ++length) {
    // A fresh copy of exactly `length` bytes, so reading past it is caught by sanitizers.
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(length));
    auto loaded = load_model_from_buffer(prefix, "small.strata", ".");
    ASSERT_FALSE(loaded.is_ok()) << "a " << length << "-byte prefix loaded";
    EXPECT_THAT(loaded.status().message(), HasSubstr("small.strata"));
  }
}

TEST(ModelIoRobustness, EveryByteFlipIsAnErrorOrAValidGraph) {
  std::vector<uint8_t> bytes = to_bytes(make_small_graph());
  int errors = 0, loads = 0;
  for (uint8_t pattern : {uint8_t{0xFF}, uint8_t{0x01}, uint8_t{0x80}}) {
    for (size_t i = 0; i < bytes.size(); ++i) {
      std::vector<uint8_t> corrupt = bytes;
      corrupt[i] ^= pattern;
      auto loaded = load_model_from_buffer(corrupt, "small.strata", ".");
      if (!loaded.is_ok()) {
        ++errors;
        EXPECT_THAT(loaded.status().message(), HasSubstr("small.strata"));
        continue;
      }
      ++loads;
      Status verified = verify_graph(*loaded, ops::OpRegistry::global());
      EXPECT_TRUE(verified.is_ok()) << "flip at " << i << ": " << verified.to_string();
      // Whatever loads also saves and loads again.
      auto again = model_to_flatbuffer(*loaded);
      ASSERT_TRUE(again.is_ok());
      EXPECT_TRUE(load_model_from_buffer(*again, "again.strata", ".").is_ok());
    }
  }
  // Most flips must be caught; a flip in a data byte or a name legitimately loads.
  EXPECT_GT(errors, loads);
  EXPECT_GT(loads, 0);
}

TEST(ModelIoRobustness, TruncatedJsonIsAnError) {
  auto json = model_to_json(make_small_graph());
  ASSERT_TRUE(json.is_ok());
  size_t last_brace = json->rfind('}');
  ASSERT_NE(last_brace, std::string::npos);
  for (size_t length = 0; length < last_brace; length += 1) {
    auto loaded = load_model_from_json(json->substr(0, length), "small.json", ".");
    ASSERT_FALSE(loaded.is_ok()) << "a " << length << "-character prefix loaded";
    EXPECT_THAT(loaded.status().message(), HasSubstr("small.json"));
  }
  EXPECT_TRUE(load_model_from_json(*json, "small.json", ".").is_ok());
}

TEST(ModelIoRobustness, EveryJsonCharacterFlipIsAnErrorOrAValidGraph) {
  auto json = model_to_json(make_small_graph());
  ASSERT_TRUE(json.is_ok());
  int errors = 0;
  for (char replacement : {'\xff', '0', '"', '-'}) {
    for (size_t i = 0; i < json->size(); ++i) {
      std::string corrupt = *json;
      if (corrupt[i] == replacement) continue;
      corrupt[i] = replacement;
      auto loaded = load_model_from_json(corrupt, "small.json", ".");
      if (!loaded.is_ok()) {
        ++errors;
        EXPECT_THAT(loaded.status().message(), HasSubstr("small.json"));
        continue;
      }
      EXPECT_TRUE(verify_graph(*loaded, ops::OpRegistry::global()).is_ok());
    }
  }
  EXPECT_GT(errors, 0);
}

// --- Semantic errors -------------------------------------------------------------

// A valid model as JSON text; tests break one thing at a time.
constexpr const char *kBaseJson = R"({
  "schema_version": 1,
  "name": "base",
  "tensors": [
    {"name": "x", "dtype": "F32", "shape": [2, 2], "kind": "Input"},
    {"name": "w1", "dtype": "F32", "shape": [2, 2], "kind": "Parameter",
     "data": [0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64]},
    {"name": "y", "shape": [2, 2]},
    {"name": "z", "shape": [2, 2]}
  ],
  "nodes": [
    {"name": "mm", "op": "MatMul", "inputs": [0, 1], "outputs": [2],
     "attrs": [{"name": "trans_b", "i": 1}, {"name": "trans_a", "i": 0}]},
    {"name": "act", "op": "Relu", "inputs": [2], "outputs": [3]}
  ],
  "inputs": [0],
  "outputs": [3]
})";

std::string replace_once(std::string text, const std::string &from, const std::string &to) {
  size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "'" << from << "' is not in the base model";
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

// Loads the base model with one edit and returns the error message.
std::string error_for(const std::string &from, const std::string &to,
                      const std::string &model_dir = ".") {
  auto loaded = load_model_from_json(replace_once(kBaseJson, from, to), "m.strata", model_dir);
  if (loaded.is_ok()) return "(loaded without error)";
  return loaded.status().message();
}

TEST(ModelIoSemantics, TheBaseModelIsValid) {
  auto loaded = load_model_from_json(kBaseJson, "m.strata", ".");
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  // Attributes written out of order are sorted.
  const Node &mm = loaded->node(0);
  ASSERT_EQ(mm.attrs.size(), 2u);
  EXPECT_EQ(mm.attrs[0].name, "trans_a");
  EXPECT_EQ(mm.int_attr("trans_b"), 1);
}

TEST(ModelIoSemantics, BadNodeInputIndex) {
  std::string message = error_for(R"("inputs": [0, 1])", R"("inputs": [0, 9])");
  EXPECT_THAT(message, HasSubstr("m.strata: node 'mm' (MatMul): field inputs[1] = 9"));
}

TEST(ModelIoSemantics, BadGraphOutputIndex) {
  EXPECT_THAT(error_for(R"("outputs": [3]
})",
                        R"("outputs": [4]
})"),
              HasSubstr("m.strata: field outputs[0] = 4 is not a tensor index"));
}

TEST(ModelIoSemantics, Cycle) {
  // mm reads z, which act computes from mm's output.
  std::string message = error_for(R"("inputs": [0, 1])", R"("inputs": [3, 1])");
  EXPECT_THAT(message, HasSubstr("m.strata"));
  EXPECT_THAT(message, HasSubstr("cycle"));
}

TEST(ModelIoSemantics, TensorProducedTwice) {
  std::string message =
      error_for(R"("inputs": [2], "outputs": [3])", R"("inputs": [0], "outputs": [2])");
  EXPECT_THAT(message, HasSubstr("m.strata: node 'act' (Relu): field outputs[0]: tensor 'y' "
                                 "is produced more than once"));
}

TEST(ModelIoSemantics, NegativeDimension) {
  std::string message =
      error_for(R"("shape": [2, 2], "kind": "Input")", R"("shape": [2, -2], "kind": "Input")");
  EXPECT_THAT(message, HasSubstr("m.strata: tensor 'x': field shape"));
  EXPECT_THAT(message, HasSubstr("negative"));
}

TEST(ModelIoSemantics, OverflowingShapeIsRefusedBeforeAnyAllocation) {
  // 2^40 x 2^40 elements: the byte count would overflow 64 bits.
  std::string message =
      error_for(R"("name": "w1", "dtype": "F32", "shape": [2, 2])",
                R"("name": "w1", "dtype": "F32", "shape": [1099511627776, 1099511627776])");
  EXPECT_THAT(message, HasSubstr("m.strata: tensor 'w1': field shape"));
  EXPECT_THAT(message, HasSubstr("2^53"));
}

TEST(ModelIoSemantics, DataSizeMismatch) {
  std::string message =
      error_for(R"("data": [0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64])",
                R"("data": [0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64])");
  EXPECT_THAT(message, HasSubstr("m.strata: tensor 'w1': field data has 12 bytes but f32[2, 2] "
                                 "needs 16"));
}

TEST(ModelIoSemantics, UnknownOp) {
  std::string message = error_for(R"("op": "Relu")", R"("op": "Frobnicate")");
  EXPECT_THAT(message, HasSubstr("m.strata"));
  EXPECT_THAT(message, HasSubstr("'act'"));
  EXPECT_THAT(message, HasSubstr("Frobnicate"));
}

TEST(ModelIoSemantics, WrongDeclaredOutputShape) {
  std::string message =
      error_for(R"({"name": "z", "shape": [2, 2]})", R"({"name": "z", "shape": [2, 3]})");
  EXPECT_THAT(message, HasSubstr("m.strata"));
  EXPECT_THAT(message, HasSubstr("'z'"));
}

TEST(ModelIoSemantics, AttributeNeedsExactlyOneValue) {
  std::string message =
      error_for(R"({"name": "trans_b", "i": 1})", R"({"name": "trans_b", "i": 1, "f": 2.0})");
  EXPECT_THAT(message,
              HasSubstr("m.strata: node 'mm' (MatMul): attribute 'trans_b': has 2 values"));
  message = error_for(R"({"name": "trans_b", "i": 1})", R"({"name": "trans_b"})");
  EXPECT_THAT(message, HasSubstr("attribute 'trans_b': has 0 values"));
  message = error_for(R"({"name": "trans_b", "i": 1})", R"({"name": "trans_a", "i": 1})");
  EXPECT_THAT(message, HasSubstr("attribute 'trans_a' is given twice"));
}

// Names must be UTF-8 text without NUL bytes (JSON reports of a model would
// throw on anything else); the error shows the bytes escaped.
TEST(ModelIoSemantics, NamesThatAreNotUtf8AreRefused) {
  EXPECT_THAT(error_for(R"("name": "w1")", "\"name\": \"w1\xff\""),
              HasSubstr("m.strata: tensor 1: field name 'w1\\xff' is not valid UTF-8"));
  EXPECT_THAT(error_for(R"("name": "act")", "\"name\": \"a\xc3(t\""),
              HasSubstr("m.strata: node 1: field name 'a\\xc3(t' is not valid UTF-8"));
  EXPECT_THAT(error_for(R"("name": "base")", "\"name\": \"b\xe2\x82\""),
              HasSubstr("m.strata: field name 'b\\xe2\\x82' is not valid UTF-8"));
  EXPECT_THAT(error_for(R"("name": "trans_b")", "\"name\": \"trans_b\xa0\""),
              HasSubstr("m.strata: node 0: field attrs[0].name 'trans_b\\xa0' is not valid"));
  // A valid non-ASCII name loads.
  auto loaded = load_model_from_json(
      replace_once(kBaseJson, R"("name": "w1")", "\"name\": \"w\xc3\xa9\""), "m.strata", ".");
  EXPECT_TRUE(loaded.is_ok()) << loaded.status().message();

  // The binary form, with a NUL byte in a tensor name and in an op.
  TempDir dir;
  GraphBuilder b("nul", ops::OpRegistry::global());
  TensorId x = b.input(std::string("x\0y", 3), DType::kF32, {2});
  b.output(b.op1("Relu", {x}, {}, "act"));
  Graph g = std::move(b).finish().value();
  ASSERT_TRUE(save_model(g, dir.file("m.strata")).is_ok());
  auto nul = load_model(dir.file("m.strata"));
  ASSERT_FALSE(nul.is_ok());
  EXPECT_THAT(nul.status().message(),
              HasSubstr("m.strata: tensor 0: field name 'x\\x00y' holds a NUL byte"));
  ASSERT_TRUE(g.rename_tensor(0, "x").is_ok());
  g.mutable_node(0).op = std::string("Re\0lu", 5);
  ASSERT_TRUE(save_model(g, dir.file("op.strata")).is_ok());
  auto op = load_model(dir.file("op.strata"));
  ASSERT_FALSE(op.is_ok());
  EXPECT_THAT(op.status().message(),
              HasSubstr("op.strata: node 0: field op 'Re\\x00lu' holds a NUL byte"));
}

TEST(ModelIoSemantics, NewerSchemaVersionIsRefused) {
  std::string message = error_for(R"("schema_version": 1)", R"("schema_version": 3)");
  EXPECT_THAT(message, HasSubstr("m.strata: the file has schema version 3 but this build of "
                                 "strata reads versions up to 2"));
  message = error_for(R"("schema_version": 1,)", "");
  EXPECT_THAT(message, HasSubstr("schema_version is missing"));
}

TEST(ModelIoSemantics, WrongFileIdentifier) {
  std::vector<uint8_t> bytes = to_bytes(make_small_graph());
  std::memcpy(bytes.data() + 4, "ONNX", 4);
  auto loaded = load_model_from_buffer(bytes, "m.strata", ".");
  ASSERT_FALSE(loaded.is_ok());
  EXPECT_THAT(loaded.status().message(),
              HasSubstr("m.strata: file identifier is 'ONNX' but a strata model has 'STRM'"));
}

TEST(ModelIoSemantics, MalformedJsonNamesTheFileAndLine) {
  std::string message = error_for(R"("kind": "Input")", R"("kind": "Output")");
  EXPECT_THAT(message, HasSubstr("m.strata: "));
  EXPECT_THAT(message, HasSubstr("Output"));
  message = error_for(R"("name": "base")", R"("name": "base", "colour": 3)");
  EXPECT_THAT(message, HasSubstr("colour"));
}

// Enum values out of range cannot be written in JSON; build the buffer directly.
TEST(ModelIoSemantics, UnknownEnumValues) {
  auto build = [](uint8_t dtype, uint8_t kind, uint8_t init_kind) {
    flatbuffers::FlatBufferBuilder fbb;
    auto name = fbb.CreateString("t");
    auto shape = fbb.CreateVector(std::vector<int64_t>{2});
    auto init = fb::CreateInitializer(fbb, static_cast<fb::InitializerKind>(init_kind), 0, 0, 0);
    auto tensor = fb::CreateTensor(fbb, name, static_cast<fb::DType>(dtype), shape,
                                   static_cast<fb::TensorKind>(kind), 0, 0, init);
    auto tensors = fbb.CreateVector(std::vector{tensor});
    auto outputs = fbb.CreateVector(std::vector<uint32_t>{0});
    auto model = fb::CreateModel(fbb, 1, fbb.CreateString("enums"), tensors, 0, 0, outputs);
    fb::FinishModelBuffer(fbb, model);
    return std::vector<uint8_t>(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
  };
  auto good = load_model_from_buffer(build(0, 1, 1), "e.strata", ".");
  EXPECT_TRUE(good.is_ok()) << good.status().to_string();
  auto bad_dtype = load_model_from_buffer(build(9, 1, 1), "e.strata", ".");
  ASSERT_FALSE(bad_dtype.is_ok());
  EXPECT_THAT(bad_dtype.status().message(),
              HasSubstr("e.strata: tensor 't': field dtype has unknown value 9"));
  auto bad_kind = load_model_from_buffer(build(0, 7, 1), "e.strata", ".");
  ASSERT_FALSE(bad_kind.is_ok());
  EXPECT_THAT(bad_kind.status().message(), HasSubstr("field kind has unknown value 7"));
  auto bad_init = load_model_from_buffer(build(0, 1, 200), "e.strata", ".");
  ASSERT_FALSE(bad_init.is_ok());
  EXPECT_THAT(bad_init.status().message(),
              HasSubstr("field initializer.kind has unknown value 200"));
}

// --- External paths ----------------------------------------------------------------

std::string with_external(const std::string &path) {
  return replace_once(kBaseJson,
                      R"("data": [0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64])",
                      R"("external": {"path": ")" + path + R"(", "key": "w1"})");
}

std::string external_error(const std::string &path, const std::string &model_dir) {
  auto loaded = load_model_from_json(with_external(path), "m.strata", model_dir);
  if (loaded.is_ok()) return "(loaded without error)";
  return loaded.status().message();
}

TEST(ModelIoExternalPaths, RelativePathsInsideTheFolderAreAccepted) {
  TempDir dir;
  EXPECT_EQ(external_error("m.safetensors", dir.path().string()), "(loaded without error)");
  EXPECT_EQ(external_error("weights/./m.safetensors", dir.path().string()),
            "(loaded without error)");
}

TEST(ModelIoExternalPaths, ParentComponentsAreRefused) {
  TempDir dir;
  std::string message = external_error("../escape.safetensors", dir.path().string());
  EXPECT_THAT(message, HasSubstr("m.strata: tensor 'w1': field external.path "
                                 "'../escape.safetensors' has a '..' component"));
  message = external_error("sub/../../escape.safetensors", dir.path().string());
  EXPECT_THAT(message, HasSubstr("'..' component"));
}

TEST(ModelIoExternalPaths, AbsolutePathsAreRefused) {
  TempDir dir;
  std::string message = external_error("/etc/passwd", dir.path().string());
  EXPECT_THAT(message, HasSubstr("m.strata: tensor 'w1': field external.path '/etc/passwd' is "
                                 "absolute"));
}

TEST(ModelIoExternalPaths, SymlinksLeavingTheFolderAreRefused) {
  TempDir outside;
  TempDir dir;
  write_text(outside.file("secret.safetensors"), "x");
  std::filesystem::create_symlink(outside.file("secret.safetensors"), dir.file("link.safetensors"));
  std::filesystem::create_directory_symlink(outside.path(), dir.file("linkdir"));
  std::string message = external_error("link.safetensors", dir.path().string());
  EXPECT_THAT(message, HasSubstr("m.strata: tensor 'w1': field external.path "
                                 "'link.safetensors' resolves to"));
  EXPECT_THAT(message, HasSubstr("outside the model's folder"));
  message = external_error("linkdir/secret.safetensors", dir.path().string());
  EXPECT_THAT(message, HasSubstr("outside the model's folder"));

  // A link that stays inside the folder is fine.
  write_text(dir.file("real.safetensors"), "x");
  std::filesystem::create_symlink("real.safetensors", dir.file("inside.safetensors"));
  EXPECT_EQ(external_error("inside.safetensors", dir.path().string()), "(loaded without error)");
}

TEST(ModelIoExternalPaths, EmptyKeyIsRefused) {
  std::string json = replace_once(with_external("w.safetensors"), R"("key": "w1")", R"("key": "")");
  auto loaded = load_model_from_json(json, "m.strata", ".");
  ASSERT_FALSE(loaded.is_ok());
  EXPECT_THAT(loaded.status().message(), HasSubstr("tensor 'w1': field external.key is empty"));
}

} // namespace
} // namespace strata::serialization
