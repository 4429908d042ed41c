// Tests of the graph IR: dtypes, shapes, graph construction, topological order,
// the builder, the verifier and the printers. Ops come from a tiny resolver so
// this suite depends on nothing but graph/.
#include <cmath>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "graph/builder.h"
#include "graph/printer.h"
#include "graph/verifier.h"

namespace strata {
namespace {

// "Copy" passes its first input's type through; "Pair" outputs two copies;
// anything else is unknown.
class TinyResolver : public OpResolver {
public:
  Result<llvm::SmallVector<TensorType, 2>>
  infer_types(const Node &node, llvm::ArrayRef<TensorType> inputs) const override {
    if (node.op == "Copy" && inputs.size() >= 1) return llvm::SmallVector<TensorType, 2>{inputs[0]};
    if (node.op == "Pair" && inputs.size() == 1)
      return llvm::SmallVector<TensorType, 2>{inputs[0], inputs[0]};
    return not_found("unknown op '", node.op, "'");
  }
};

TEST(DTypeTest, NamesRoundTrip) {
  for (DType dtype : kAllDTypes)
    EXPECT_EQ(parse_dtype(dtype_name(dtype)), dtype);
  EXPECT_FALSE(parse_dtype("f64").has_value());
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kI64), 8u);
}

TEST(DTypeTest, HalfConversionsRoundToNearestEven) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f})
    EXPECT_EQ(f16_to_float(float_to_f16(v)), v) << v;
  EXPECT_EQ(float_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16(1e6f), 0x7c00);               // overflow -> inf
  EXPECT_EQ(float_to_f16(1.0f + 1.0f / 4096), 0x3c00); // tie rounds to even
  EXPECT_EQ(bf16_to_float(float_to_bf16(3.140625f)), 3.140625f);
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
}

TEST(ShapeTest, CheckedElementsCatchesNegativeAndOverflow) {
  EXPECT_EQ(*checked_num_elements({2, 3, 4}), 24);
  EXPECT_EQ(*checked_num_elements({}), 1);
  EXPECT_EQ(*checked_num_elements({5, 0}), 0);
  EXPECT_EQ(checked_num_elements({2, -1}).status().code(), StatusCode::kInvalidArgument);
  auto overflow = checked_num_elements({1 << 30, 1 << 30, 1 << 30});
  ASSERT_FALSE(overflow.is_ok());
  EXPECT_NE(overflow.status().message().find("2^53"), std::string::npos);
}

TEST(ShapeTest, ParseAndBroadcast) {
  EXPECT_EQ(*parse_shape("2x3x4"), (Shape{2, 3, 4}));
  EXPECT_TRUE(parse_shape("").value().empty());
  EXPECT_FALSE(parse_shape("2xx3").is_ok());
  EXPECT_FALSE(parse_shape("2x-3").is_ok());
  EXPECT_EQ(*broadcast_shapes({4, 1, 3}, {5, 1}), (Shape{4, 5, 3}));
  EXPECT_FALSE(broadcast_shapes({2, 3}, {4, 3}).is_ok());
  EXPECT_EQ(contiguous_strides({2, 3, 4}), (Shape{12, 4, 1}));
}

Graph diamond() {
  TinyResolver resolver;
  GraphBuilder b("diamond", resolver);
  TensorId x = b.input("x", DType::kF32, {2, 3});
  TensorId left = b.op1("Copy", {x}, {}, "left");
  TensorId right = b.op1("Copy", {x}, {}, "right");
  TensorId join = b.op1("Copy", {left, right}, {{"k", int64_t{1}}}, "join");
  b.output(join);
  return std::move(b).finish().value();
}

// A borrowed blob reads the caller's bytes in place and keeps their owner
// alive exactly as long as the blob lives; a blob of its own frees its bytes.
TEST(BlobTest, BorrowedBytesStayTheOwnersAndOutliveNoBlob) {
  auto owner = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4});
  std::weak_ptr<std::vector<float>> watch = owner;
  auto *bytes = reinterpret_cast<std::byte *>(owner->data());
  std::shared_ptr<Blob> blob = Blob::borrowed(bytes, 4 * sizeof(float), std::move(owner));
  EXPECT_EQ(blob->data(), bytes);
  EXPECT_EQ(blob->size(), 4 * sizeof(float));
  EXPECT_EQ(reinterpret_cast<const float *>(blob->data())[2], 3.0f);
  EXPECT_FALSE(watch.expired());
  blob.reset();
  EXPECT_TRUE(watch.expired());
  EXPECT_EQ(Blob::zeroed(3)->size(), 3u);
}

TEST(GraphTest, BuilderInfersTypesAndNamesOutputs) {
  Graph g = diamond();
  EXPECT_EQ(g.num_nodes(), 3u);
  auto join = g.find_tensor("join");
  ASSERT_TRUE(join.has_value());
  EXPECT_EQ(g.tensor(*join).type.to_string(), "f32[2, 3]");
  EXPECT_EQ(g.node(g.tensor(*join).producer).int_attr("k"), 1);
  TinyResolver resolver;
  EXPECT_TRUE(verify_graph(g, resolver).is_ok());
}

TEST(GraphTest, TopologicalOrderIsDeterministicAndDetectsCycles) {
  Graph g = diamond();
  auto order = g.topological_order();
  ASSERT_TRUE(order.is_ok());
  EXPECT_EQ(*order, (std::vector<NodeId>{0, 1, 2}));

  // a -> b -> a
  Graph cyclic("cyclic");
  Tensor ta{"ta", {DType::kF32, {1}}, TensorKind::kIntermediate, kNoNode, {}, {}, {}};
  Tensor tb = ta;
  tb.name = "tb";
  TensorId a = *cyclic.add_tensor(ta);
  TensorId bt = *cyclic.add_tensor(tb);
  ASSERT_TRUE(cyclic.add_node(Node{"na", "Copy", {bt}, {a}, {}}).is_ok());
  ASSERT_TRUE(cyclic.add_node(Node{"nb", "Copy", {a}, {bt}, {}}).is_ok());
  cyclic.add_output(a);
  auto bad = cyclic.topological_order();
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("cycle through node 'na'"), std::string::npos);
  TinyResolver resolver;
  EXPECT_FALSE(verify_graph(cyclic, resolver).is_ok());
}

TEST(GraphTest, AddRejectsDuplicatesAndSecondProducers) {
  Graph g("g");
  Tensor t{"t", {DType::kF32, {1}}, TensorKind::kIntermediate, kNoNode, {}, {}, {}};
  TensorId id = *g.add_tensor(t);
  EXPECT_EQ(g.add_tensor(t).status().code(), StatusCode::kAlreadyExists);
  ASSERT_TRUE(g.add_node(Node{"n1", "Copy", {}, {id}, {}}).is_ok());
  auto second = g.add_node(Node{"n2", "Copy", {}, {id}, {}});
  ASSERT_FALSE(second.is_ok());
  EXPECT_NE(second.status().message().find("produced by both node 'n1' and node 'n2'"),
            std::string::npos);
  EXPECT_EQ(g.add_node(Node{"n3", "Copy", {7}, {}, {}}).status().code(), StatusCode::kOutOfRange);
}

TEST(VerifierTest, NamesTheTensorWithWrongDataSize) {
  TinyResolver resolver;
  GraphBuilder b("g", resolver);
  float values[3] = {1, 2, 3};
  TensorId w = b.parameter("w", DType::kF32, {2, 2}, Blob::copy_of(values, sizeof values));
  b.output(b.op1("Copy", {w}));
  auto g = std::move(b).finish();
  ASSERT_TRUE(g.is_ok());
  Status s = verify_graph(*g, resolver);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("tensor 'w': field data has 12 bytes but f32[2, 2] needs 16"),
            std::string::npos)
      << s.message();
}

TEST(VerifierTest, RejectsDeclaredTypeThatDisagreesWithOp) {
  Graph g = diamond();
  g.mutable_tensor(*g.find_tensor("left")).type.shape = {3, 2};
  TinyResolver resolver;
  Status s = verify_graph(g, resolver);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("node 'left' (Copy): output tensor 'left' is declared f32[3, 2]"),
            std::string::npos)
      << s.message();
}

TEST(VerifierTest, RejectsUnknownOpAndMissingOutputs) {
  TinyResolver resolver;
  Graph g = diamond();
  g.mutable_node(0).op = "Frobnicate";
  Status s = verify_graph(g, resolver);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("node 'left' (Frobnicate): unknown op"), std::string::npos);

  Graph no_outputs = diamond();
  no_outputs.set_outputs({});
  EXPECT_NE(verify_graph(no_outputs, resolver).message().find("no outputs"), std::string::npos);
}

TEST(VerifierTest, ParameterNeedsExactlyOneValueSource) {
  TinyResolver resolver;
  GraphBuilder b("g", resolver);
  TensorId w = b.parameter("w", DType::kF32, {4}, Initializer{});
  b.output(b.op1("Copy", {w}));
  Graph g = std::move(b).finish().value();
  Status s = verify_graph(g, resolver);
  EXPECT_NE(s.message().find("needs exactly one of data, external data or an initializer"),
            std::string::npos)
      << s.message();
  g.mutable_tensor(w).initializer = {Initializer::Kind::kNormal, 0.0, 0.02, 7};
  EXPECT_TRUE(verify_graph(g, resolver).is_ok());
}

// An initializer must make values of its tensor's dtype: a NaN or negative
// stddev, reversed or infinite uniform bounds, a random initializer of an
// integer tensor and a constant an integer cannot hold are refused by the
// verifier, naming the tensor, the initializer and the value, instead of
// filling NaNs or failing only when the weights are first drawn.
TEST(VerifierTest, InitializersMustMakeValuesOfTheirDtype) {
  TinyResolver resolver;
  GraphBuilder b("g", resolver);
  TensorId w = b.parameter("w", DType::kF32, {4}, Initializer{Initializer::Kind::kOnes});
  TensorId k = b.parameter("k", DType::kI64, {2}, Initializer{Initializer::Kind::kOnes});
  b.output(b.op1("Copy", {w}));
  b.output(b.op1("Copy", {k}));
  Graph g = std::move(b).finish().value();
  ASSERT_TRUE(verify_graph(g, resolver).is_ok());
  using Kind = Initializer::Kind;
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  const struct {
    TensorId id;
    Initializer init;
    std::string cause;
  } cases[] = {
      {w,
       {Kind::kNormal, 0.0, nan, 1},
       "tensor 'w' (f32[4]): initializer normal: stddev nan must be finite and at least 0"},
      {w, {Kind::kNormal, 0.0, -0.02, 1}, "initializer normal: stddev -0.02 must be finite"},
      {w, {Kind::kNormal, 0.0, inf, 1}, "initializer normal: stddev inf must be finite"},
      {w, {Kind::kNormal, nan, 1.0, 1}, "initializer normal: mean nan is not finite"},
      {w,
       {Kind::kUniform, 1.0, -1.0, 1},
       "tensor 'w' (f32[4]): initializer uniform: bounds [1, -1) are reversed (low 1 > high -1)"},
      {w, {Kind::kUniform, -inf, 1.0, 1}, "initializer uniform: bounds [-inf, 1) must be finite"},
      {k,
       {Kind::kUniform, 0.0, 1.0, 1},
       "tensor 'k' (i64[2]): initializer uniform: needs a floating dtype"},
      {k, {Kind::kNormal, 0.0, 1.0, 1}, "initializer normal: needs a floating dtype"},
      {k,
       {Kind::kConstant, nan, 0.0, 0},
       "tensor 'k' (i64[2]): initializer constant: value nan is not finite, so it has no i64 "
       "value"},
      {k, {Kind::kConstant, 1e19, 0.0, 0}, "initializer constant: value 1e+19 does not fit i64"},
  };
  for (const auto &c : cases) {
    Graph bad = g;
    bad.mutable_tensor(c.id).initializer = c.init;
    Status s = verify_graph(bad, resolver);
    EXPECT_NE(s.message().find(c.cause), std::string::npos) << c.cause << "\n" << s.message();
  }
  // The edges are values: a zero stddev, equal bounds, a float tensor's
  // infinite constant, the most negative i64.
  for (const auto &[id, init] : std::vector<std::pair<TensorId, Initializer>>{
           {w, {Kind::kNormal, 0.0, 0.0, 1}},
           {w, {Kind::kUniform, 2.0, 2.0, 1}},
           {w, {Kind::kConstant, -inf, 0.0, 0}},
           {k, {Kind::kConstant, -9223372036854775808.0, 0.0, 0}}}) {
    Graph edge = g;
    edge.mutable_tensor(id).initializer = init;
    Status s = verify_graph(edge, resolver);
    EXPECT_TRUE(s.is_ok()) << s.message();
  }
}

// Names reach JSON reports and files unchanged, so the verifier refuses any
// that is not UTF-8 text, and the error shows the bytes escaped.
TEST(VerifierTest, NamesMustBeUtf8WithoutNul) {
  EXPECT_TRUE(check_name("name", "").is_ok());
  EXPECT_TRUE(check_name("name", "layer0.attn/q \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80").is_ok());
  for (std::string_view bad :
       {std::string_view("a\xff"), std::string_view("\xc3"), std::string_view("\xc0\xaf"),
        std::string_view("\xed\xa0\x80"), std::string_view("\xf4\x90\x80\x80")})
    EXPECT_NE(check_name("name", bad).message().find("is not valid UTF-8"), std::string::npos)
        << escape_bytes(bad);
  EXPECT_EQ(check_name("name", std::string_view("a\0b", 3)).message(),
            "name 'a\\x00b' holds a NUL byte; names are UTF-8 text without NUL bytes");
  EXPECT_EQ(escape_bytes("a\xff\n'"), "a\\xff\\x0a'");

  TinyResolver resolver;
  Graph tensor = diamond();
  ASSERT_TRUE(tensor.rename_tensor(*tensor.find_tensor("left"), "left\xff").is_ok());
  Status s = verify_graph(tensor, resolver);
  EXPECT_NE(s.message().find("tensor 1: name 'left\\xff' is not valid UTF-8"), std::string::npos)
      << s.message();
  Graph node = diamond();
  node.mutable_node(0).name = std::string("le\0ft", 5);
  s = verify_graph(node, resolver);
  EXPECT_NE(s.message().find("node 0: name 'le\\x00ft' holds a NUL byte"), std::string::npos)
      << s.message();
  Graph graph = diamond();
  graph.set_name("g\xe2\x82");
  EXPECT_NE(verify_graph(graph, resolver).message().find("the graph name 'g\\xe2\\x82'"),
            std::string::npos);
}

TEST(BuilderTest, FirstErrorSticks) {
  TinyResolver resolver;
  GraphBuilder b("g", resolver);
  TensorId x = b.input("x", DType::kF32, {2});
  TensorId bad = b.op1("Nope", {x}, {}, "broken");
  EXPECT_EQ(bad, kInvalidTensor);
  b.op1("Copy", {x}); // ignored after the first error
  auto g = std::move(b).finish();
  ASSERT_FALSE(g.is_ok());
  EXPECT_NE(g.status().message().find("node 'broken' (Nope): unknown op 'Nope'"), std::string::npos)
      << g.status().message();
}

TEST(BuilderTest, MultiOutputNamesAreUnique) {
  TinyResolver resolver;
  GraphBuilder b("g", resolver);
  TensorId x = b.input("x", DType::kF32, {2});
  auto outs = b.op("Pair", {x}, {}, "p");
  ASSERT_EQ(outs.size(), 2u);
  EXPECT_EQ(b.graph().tensor(outs[0]).name, "p");
  EXPECT_EQ(b.graph().tensor(outs[1]).name, "p:1");
}

TEST(PrinterTest, TextAndDotMentionEveryNode) {
  Graph g = diamond();
  std::string text = print_graph(g);
  EXPECT_NE(text.find("%join = Copy(%left, %right) {k = 1} -> f32[2, 3]"), std::string::npos)
      << text;
  std::string dot = graph_to_dot(g);
  EXPECT_EQ(dot.rfind("digraph", 0), 0u);
  for (const char *name : {"left", "right", "join"})
    EXPECT_NE(dot.find(name), std::string::npos);
}

TEST(StatusTest, ContextReadsOutsideIn) {
  Status s = invalid_argument("bad dim").with_context("tensor 'x'").with_context("model.strata");
  EXPECT_EQ(s.message(), "model.strata: tensor 'x': bad dim");
  EXPECT_EQ(s.to_string(), "InvalidArgument: model.strata: tensor 'x': bad dim");
  Result<int> r = not_found("nope");
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
}

// Running out of memory and a missing device are conditions of the machine,
// not bugs: each has its own code and name.
TEST(StatusTest, ResourceExhaustedAndUnavailableAreNamed) {
  Status full = resource_exhausted("out of memory: ", 3, " bytes");
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(full.to_string(), "ResourceExhausted: out of memory: 3 bytes");
  Status absent = unavailable("no GPU");
  EXPECT_EQ(absent.code(), StatusCode::kUnavailable);
  EXPECT_EQ(absent.to_string(), "Unavailable: no GPU");
}

} // namespace
} // namespace strata
