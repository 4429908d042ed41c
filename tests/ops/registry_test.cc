// Registry-wide checks: the registry and the op catalog (docs/ops.md) list the
// same ops, every op is complete and declares its traits, the traits agree with
// each other, and schema checks reject malformed nodes with messages that name
// the op and the attribute.
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "graph/verifier.h"
#include "tests/ops/op_test_util.h"

namespace strata::ops {
namespace {

using namespace strata::ops::testing;

std::string trim(std::string_view text) {
  size_t begin = text.find_first_not_of(" \t");
  size_t end = text.find_last_not_of(" \t\r");
  if (begin == std::string_view::npos) return "";
  return std::string(text.substr(begin, end - begin + 1));
}

// Op names in the first column of every "| op | ..." table of the catalog.
// A cell may list several ops separated by commas.
std::set<std::string> documented_ops() {
  const char *root = std::getenv("STRATA_SOURCE_ROOT");
  EXPECT_NE(root, nullptr) << "STRATA_SOURCE_ROOT is not set (run through meson test)";
  std::string path = std::string(root ? root : ".") + "/docs/ops.md";
  std::ifstream file(path);
  EXPECT_TRUE(file.good()) << "cannot read " << path;
  std::set<std::string> ops;
  bool in_op_table = false;
  std::string line;
  while (std::getline(file, line)) {
    if (line.empty() || line[0] != '|') {
      in_op_table = false;
      continue;
    }
    std::string first = trim(std::string_view(line).substr(1, line.find('|', 1) - 1));
    if (first == "op") { // header row
      in_op_table = true;
      continue;
    }
    if (!in_op_table || first.find_first_not_of("-: ") == std::string::npos) continue;
    std::stringstream names(first);
    std::string name;
    while (std::getline(names, name, ','))
      if (!trim(name).empty()) ops.insert(trim(name));
  }
  return ops;
}

TEST(RegistryTest, CatalogParsesToKnownOps) {
  std::set<std::string> ops = documented_ops();
  // A sanity check on the parser itself: a few ops from different tables.
  for (const char *op :
       {"Add", "Pow", "Sigmoid", "Reshape", "Constant", "LogSoftmax", "MatMul", "MseLoss"})
    EXPECT_TRUE(ops.count(op)) << op;
  EXPECT_FALSE(ops.count("op"));
  EXPECT_GE(ops.size(), 40u);
}

TEST(RegistryTest, EveryDocumentedOpIsRegistered) {
  for (const std::string &op : documented_ops())
    EXPECT_NE(OpRegistry::global().find(op), nullptr)
        << op << " is in docs/ops.md but not registered";
}

TEST(RegistryTest, EveryRegisteredOpIsDocumented) {
  std::set<std::string> documented = documented_ops();
  for (const OpDef *def : OpRegistry::global().all())
    EXPECT_TRUE(documented.count(std::string(def->name)))
        << def->name << " is registered but not in docs/ops.md";
}

TEST(RegistryTest, EveryOpIsComplete) {
  auto all = OpRegistry::global().all();
  ASSERT_FALSE(all.empty());
  for (size_t i = 0; i < all.size(); ++i) {
    const OpDef &def = *all[i];
    EXPECT_FALSE(def.summary.empty()) << def.name;
    EXPECT_NE(def.infer, nullptr) << def.name << " has no infer";
    EXPECT_NE(def.cpu_kernel, nullptr) << def.name << " has no CPU kernel";
    EXPECT_LE(def.min_inputs, def.max_inputs) << def.name;
    EXPECT_GE(def.min_inputs, 0) << def.name;
    EXPECT_EQ(OpRegistry::global().find(def.name), &def) << def.name;
    if (i > 0) {
      EXPECT_LT(all[i - 1]->name, def.name) << "not sorted or duplicated";
    }
    std::set<std::string_view> names;
    for (const AttrSpec &spec : def.attrs) {
      EXPECT_TRUE(names.insert(spec.name).second) << def.name << "." << spec.name << " twice";
      EXPECT_FALSE(spec.doc.empty()) << def.name << "." << spec.name;
      if (spec.default_value) {
        EXPECT_EQ(attr_type(*spec.default_value), spec.type)
            << def.name << "." << spec.name << ": default of the wrong type";
      }
      EXPECT_EQ(def.find_attr(spec.name), &spec);
    }
  }
}

TEST(RegistryTest, EveryOpDeclaresItsTraits) {
  for (const OpDef *def : OpRegistry::global().all()) {
    EXPECT_NE(def->traits.batch, BatchRule::kUndeclared) << def->name << " declares no batch rule";
    EXPECT_NE(def->traits.shard, ShardRule::kUndeclared) << def->name << " declares no shard rule";
  }
}

// The traits as text, so that a mismatch shows which differ.
std::string describe(Elementwise elementwise, Linearity linearity, BatchRule batch, ShardRule shard,
                     Collective collective, uint32_t integer_inputs, bool index_range) {
  return str_cat("elementwise ", static_cast<int>(elementwise), ", linearity ",
                 static_cast<int>(linearity), ", batch ", static_cast<int>(batch), ", shard ",
                 static_cast<int>(shard), ", collective ", static_cast<int>(collective),
                 ", integer inputs ", integer_inputs, index_range ? ", index range" : "");
}

// What every op declares. Adding an op adds a row: each of its traits, the
// defaulted ones too, is a choice.
struct Expected {
  Elementwise elementwise = Elementwise::kNone;
  Linearity linearity = Linearity::kNone;
  BatchRule batch = BatchRule::kUndeclared;
  ShardRule shard = ShardRule::kUndeclared;
  Collective collective = Collective::kNone;
  uint32_t integer_inputs = 0;
  bool index_range = false;
};

std::map<std::string_view, Expected> expected_traits() {
  using B = BatchRule;
  using C = Collective;
  using E = Elementwise;
  using L = Linearity;
  using S = ShardRule;
  const Expected forward_map{E::kFusable, L::kNone, B::kElementwise, S::kElementwise};
  const Expected fused_grad{
      .elementwise = E::kFusable, .batch = B::kNotForward, .shard = S::kReplicated};
  const Expected backward{.batch = B::kNotForward, .shard = S::kReplicated};
  const Expected reshape{.batch = B::kReshape, .shard = S::kReshape};
  const Expected pool{.batch = B::kPool, .shard = S::kPool};
  const Expected vocab_parallel{.batch = B::kFollows,
                                .shard = S::kReplicated,
                                .integer_inputs = 1u << 1,
                                .index_range = true};
  const Expected labels_grad{.batch = B::kNotForward,
                             .shard = S::kReplicated,
                             .integer_inputs = 1u << 2,
                             .index_range = true};
  auto collective = [](C c) {
    return Expected{.batch = B::kNotForward, .shard = S::kReplicated, .collective = c};
  };
  auto step_counter = [](int input) {
    return Expected{
        .batch = B::kNotForward, .shard = S::kReplicated, .integer_inputs = 1u << input};
  };
  auto linear = [&](L linearity) {
    Expected e = forward_map;
    e.linearity = linearity;
    return e;
  };
  return {
      // Elementwise.
      {"Add", linear(L::kJoint)},
      {"Sub", linear(L::kJoint)},
      {"Mul", linear(L::kEachInput)},
      {"Div", linear(L::kFirstInput)},
      {"Pow", forward_map},
      {"Neg", linear(L::kJoint)},
      {"Sqrt", forward_map},
      {"Exp", forward_map},
      {"Log", forward_map},
      {"Erf", forward_map},
      {"Relu", forward_map},
      {"Tanh", forward_map},
      {"Sigmoid", forward_map},
      {"Gelu", forward_map},
      {"Clip", forward_map},
      {"Identity", {E::kUnfused, L::kJoint, B::kElementwise, S::kElementwise}},
      {"Cast", {E::kUnfused, L::kNone, B::kElementwise, S::kElementwise}},
      {"Where", {E::kUnfused, L::kNone, B::kElementwise, S::kElementwise}},
      {"Dropout",
       {.elementwise = E::kUnfused,
        .batch = B::kDropout,
        .shard = S::kReplicated,
        .integer_inputs = 1u << 1}},
      {"ReluGrad", fused_grad},
      {"TanhGrad", fused_grad},
      {"SigmoidGrad", fused_grad},
      {"GeluGrad", fused_grad},
      {"ClipGrad", fused_grad},
      // Shape.
      {"Reshape", {.batch = B::kReshapeAttr, .shard = S::kReshape}},
      {"Flatten", reshape},
      {"Squeeze", reshape},
      {"Unsqueeze", reshape},
      {"Transpose", {.batch = B::kFollows, .shard = S::kTranspose}},
      {"Concat", {.batch = B::kConcatAxis, .shard = S::kOtherAxis}},
      {"Split", {.batch = B::kSplitAxis, .shard = S::kOtherAxis}},
      {"Slice", {.batch = B::kSlice, .shard = S::kReplicated}},
      {"Gather",
       {.batch = B::kGatherAxis,
        .shard = S::kGather,
        .integer_inputs = 1u << 1,
        .index_range = true}},
      {"Constant", {.batch = B::kFollows, .shard = S::kReplicated}},
      {"Expand", {.batch = B::kExpand, .shard = S::kReplicated}},
      {"SliceGrad", backward},
      {"GatherGrad",
       {.batch = B::kNotForward,
        .shard = S::kReplicated,
        .integer_inputs = 1u << 1,
        .index_range = true}},
      // Reduction.
      {"ReduceSum", {.batch = B::kReduceAxes, .shard = S::kReplicated}},
      {"ReduceMean", {.batch = B::kReduceAxes, .shard = S::kReplicated}},
      {"ReduceMax", {.batch = B::kReduceAxes, .shard = S::kReplicated}},
      {"Softmax", {.batch = B::kNormalizeAxis, .shard = S::kNormalizeAxis}},
      {"LogSoftmax", {.batch = B::kNormalizeAxis, .shard = S::kNormalizeAxis}},
      {"ReduceMaxGrad", backward},
      {"SoftmaxGrad", backward},
      {"LogSoftmaxGrad", backward},
      // Neural network.
      {"MatMul", {.batch = B::kFollows, .shard = S::kMatMul}},
      {"Gemm", {.batch = B::kFollows, .shard = S::kMatMul}},
      {"LayerNorm", {.batch = B::kTrailingAxes, .shard = S::kNormalizeTrailing}},
      {"Conv2d", {.batch = B::kConv, .shard = S::kConv}},
      {"MaxPool2d", pool},
      {"AveragePool2d", pool},
      {"GlobalAveragePool", pool},
      {"BatchNormalization", {.batch = B::kCombines, .shard = S::kReplicated}},
      {"BatchNormStats", backward},
      {"SoftmaxCrossEntropy",
       {.batch = B::kClasses,
        .shard = S::kCrossEntropy,
        .integer_inputs = 1u << 1,
        .index_range = true}},
      {"VocabParallelStats", vocab_parallel},
      {"VocabParallelCrossEntropy", vocab_parallel},
      {"MseLoss", {.batch = B::kFollows, .shard = S::kReplicated}},
      {"LayerNormGrad", backward},
      {"Conv2dGradInput", backward},
      {"Conv2dGradWeight", backward},
      {"MaxPool2dGrad", backward},
      {"AveragePool2dGrad", backward},
      {"GlobalAveragePoolGrad", backward},
      {"BatchNormalizationGrad", backward},
      {"SoftmaxCrossEntropyGrad", labels_grad},
      {"VocabParallelCrossEntropyGrad", labels_grad},
      {"MseLossGrad", backward},
      // Optimizer.
      {"SgdUpdate", step_counter(4)},
      {"AdamUpdate", step_counter(5)},
      {"LearningRate", step_counter(0)},
      {"GlobalNormScale", backward},
      {"SumOfSquares", backward},
      {"NormScale", backward},
      // Tensor-parallel collectives.
      {"TpCopy", collective(C::kCopy)},
      {"TpAllReduce", collective(C::kAllReduce)},
      {"TpAllGather", collective(C::kAllGather)},
      {"TpReduceScatter", collective(C::kReduceScatter)},
      {"TpAllToAll", collective(C::kAllToAll)},
      {"TpSplit", collective(C::kSplit)},
  };
}

TEST(RegistryTest, TraitsMatchTheTable) {
  const std::map<std::string_view, Expected> table = expected_traits();
  EXPECT_EQ(table.size(), 80u);
  std::set<std::string_view> registered;
  for (const OpDef *def : OpRegistry::global().all()) {
    registered.insert(def->name);
    auto row = table.find(def->name);
    if (row == table.end()) {
      ADD_FAILURE() << def->name << " is registered but has no row in expected_traits()";
      continue;
    }
    const OpTraits &t = def->traits;
    const Expected &e = row->second;
    EXPECT_EQ(describe(t.elementwise, t.linearity, t.batch, t.shard, t.collective, t.integer_inputs,
                       t.index_range != nullptr),
              describe(e.elementwise, e.linearity, e.batch, e.shard, e.collective, e.integer_inputs,
                       e.index_range))
        << def->name;
  }
  for (const auto &[name, expected] : table)
    EXPECT_TRUE(registered.contains(name)) << name << " has a row but is not registered";
}

bool is_parallel_op(const OpDef &def) {
  for (const OpDef &parallel : parallel_ops())
    if (&parallel == &def) return true;
  return false;
}

// The traits cannot contradict each other or the schema.
TEST(RegistryTest, TraitsAgree) {
  for (const OpDef *def : OpRegistry::global().all()) {
    const OpTraits &t = def->traits;
    const std::string_view name = def->name;
    if (t.elementwise == Elementwise::kFusable) {
      EXPECT_GE(def->min_inputs, 1) << name << ": a fused step reads one or two operands";
      EXPECT_LE(def->max_inputs, 2) << name << ": a fused step reads one or two operands";
    }
    if (t.shard == ShardRule::kElementwise) {
      EXPECT_NE(t.elementwise, Elementwise::kNone) << name;
    }
    if (t.linearity != Linearity::kNone) {
      EXPECT_EQ(t.shard, ShardRule::kElementwise) << name << ": only elementwise rules read it";
    }
    EXPECT_EQ(t.collective != Collective::kNone, is_parallel_op(*def)) << name;
    if (t.collective != Collective::kNone) {
      EXPECT_NE(def->find_attr("parts"), nullptr) << name << ": a collective has a group size";
    }
    if (def->once_per_step) {
      EXPECT_EQ(t.batch, BatchRule::kNotForward) << name;
    }
    if (name.ends_with("Grad")) {
      EXPECT_EQ(t.batch, BatchRule::kNotForward) << name;
    }
    for (int k = 0; k < 32; ++k) {
      if ((t.integer_inputs >> k) & 1u) {
        EXPECT_LT(k, def->max_inputs) << name << ": integer input " << k << " does not exist";
      }
    }
    if (t.index_range != nullptr) {
      EXPECT_NE(t.integer_inputs, 0u) << name;
    }
    const bool reads_axis = t.batch == BatchRule::kNormalizeAxis ||
                            t.batch == BatchRule::kGatherAxis || t.batch == BatchRule::kSplitAxis ||
                            t.batch == BatchRule::kConcatAxis ||
                            t.batch == BatchRule::kTrailingAxes;
    if (reads_axis) {
      EXPECT_NE(def->find_attr("axis"), nullptr) << name;
    }
    if (t.batch == BatchRule::kReduceAxes) {
      EXPECT_NE(def->find_attr("axes"), nullptr) << name;
    }
    if (t.batch == BatchRule::kReshapeAttr || t.batch == BatchRule::kExpand) {
      EXPECT_NE(def->find_attr("shape"), nullptr) << name;
    }
  }
}

// Where an index or a label comes from: the dim it selects along, whole.
TEST(RegistryTest, IndexRangesAreTheIndexedDim) {
  const OpRegistry &registry = OpRegistry::global();
  auto range = [&](std::string_view op, std::vector<Attribute> attrs,
                   std::vector<TensorType> inputs, size_t input) {
    const OpDef &def = *registry.find(op);
    return def.traits.index_range(make_node(op, std::move(attrs)), def, inputs, input);
  };
  const TensorType table{DType::kF32, {5, 7}};
  const TensorType indices{DType::kI64, {3}};
  EXPECT_EQ(range("Gather", {}, {table, indices}, 1), 5);
  EXPECT_EQ(range("Gather", {int_attr("axis", -1)}, {table, indices}, 1), 7);
  // A member's piece of a table split over 2 members: the whole has 14 rows.
  EXPECT_EQ(range("Gather", {int_attr("axis", 1), int_attr("parts", 2)}, {table, indices}, 1), 14);
  EXPECT_FALSE(range("Gather", {int_attr("axis", 2)}, {table, indices}, 1).has_value());
  const TensorType dy{DType::kF32, {3, 7}};
  EXPECT_EQ(range("GatherGrad", {ints_attr("shape", {5, 7})}, {dy, indices}, 1), 5);
  const TensorType logits{DType::kF32, {4, 10}};
  const TensorType labels{DType::kI64, {4}};
  EXPECT_EQ(range("SoftmaxCrossEntropy", {}, {logits, labels}, 1), 10);
  EXPECT_EQ(range("VocabParallelStats", {int_attr("parts", 4)}, {logits, labels}, 1), 40);
  const TensorType loss{DType::kF32, {}};
  EXPECT_EQ(range("SoftmaxCrossEntropyGrad", {}, {loss, logits, labels}, 2), 10);
}

// Found by fuzzing plan_binary: a piece whose dim times parts overflowed
// int64 in type inference (UBSan). The sum is refused by size.
TEST(RegistryTest, AllGatherRefusesAWholeTooLargeToHold) {
  const OpRegistry &registry = OpRegistry::global();
  const TensorType piece{DType::kF32, {int64_t{1} << 61, 1}};
  Node node = make_node("TpAllGather", {int_attr("parts", 8), int_attr("axis", 0),
                                        int_attr("outer", 1), string_attr("why", "test")});
  auto types = registry.infer_types(node, {piece});
  ASSERT_FALSE(types.is_ok());
  expect_error(types.status(), {"TpAllGather", "gathered from 8 parts"});
  const TensorType fits{DType::kF32, {6, 1}};
  auto whole = registry.infer_types(node, {fits});
  ASSERT_TRUE(whole.is_ok()) << whole.status().message();
  EXPECT_EQ((*whole)[0].shape, (Shape{48, 1}));
  // Parts beyond any group are refused by every op that reads them.
  Node many = make_node("TpAllGather", {int_attr("parts", kMaxParts + 1), int_attr("axis", 0),
                                        int_attr("outer", 1), string_attr("why", "test")});
  auto refused = registry.infer_types(many, {fits});
  ASSERT_FALSE(refused.is_ok());
  expect_error(refused.status(), {"parts must be 1 to 4096"});
}

TEST(RegistryTest, CollectiveOfAnOpName) {
  EXPECT_EQ(collective_of("TpReduceScatter"), Collective::kReduceScatter);
  EXPECT_EQ(collective_of("TpCopy"), Collective::kCopy);
  EXPECT_EQ(collective_of("Add"), Collective::kNone);
  EXPECT_EQ(collective_of("NoSuchOp"), Collective::kNone);
  EXPECT_TRUE(communicates_forward(Collective::kAllToAll));
  EXPECT_FALSE(communicates_forward(Collective::kCopy));
  EXPECT_FALSE(communicates_forward(Collective::kSplit));
  EXPECT_TRUE(sums(Collective::kReduceScatter));
  EXPECT_FALSE(sums(Collective::kAllGather));
  EXPECT_TRUE(whole_is_input(Collective::kSplit));
  EXPECT_FALSE(whole_is_input(Collective::kAllGather));
}

TEST(RegistryTest, UnknownOpIsNotFound) {
  Status status = OpRegistry::global().check_schema(make_node("NoSuchOp"), 1);
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  expect_error(status, {"NoSuchOp"});
  EXPECT_EQ(OpRegistry::global().find("NoSuchOp"), nullptr);
}

TEST(RegistryTest, CheckSchemaRejectsMalformedNodes) {
  const OpRegistry &registry = OpRegistry::global();
  // Unknown attribute.
  Status unknown = registry.check_schema(make_node("Add", {int_attr("alpha", 1)}), 2);
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidArgument);
  expect_error(unknown, {"Add", "'alpha'"});
  // Wrong attribute type.
  expect_error(registry.check_schema(make_node("Concat", {string_attr("axis", "0")}), 2),
               {"Concat", "'axis'", "int", "string"});
  expect_error(registry.check_schema(make_node("Reshape", {floats_attr("shape", {2.0})}), 1),
               {"Reshape", "'shape'", "ints", "floats"});
  // Missing required attribute.
  expect_error(registry.check_schema(make_node("Reshape"), 1), {"Reshape", "'shape'"});
  expect_error(registry.check_schema(make_node("Cast"), 1), {"Cast", "'to'"});
  // Wrong input counts.
  expect_error(registry.check_schema(make_node("Add"), 1), {"Add", "2", "1"});
  expect_error(registry.check_schema(make_node("Relu"), 2), {"Relu", "1", "2"});
  expect_error(registry.check_schema(make_node("Concat", {int_attr("axis", 0)}), 0),
               {"Concat", "1 to 64", "0"});
  expect_error(registry.check_schema(make_node("Concat", {int_attr("axis", 0)}), 65),
               {"Concat", "65"});
  expect_error(registry.check_schema(make_node("Constant", {floats_attr("value", {1})}), 1),
               {"Constant", "0"});
  // Well-formed nodes pass; an int is accepted for a float attribute.
  EXPECT_TRUE(registry.check_schema(make_node("Clip", {int_attr("min", 0)}), 1).is_ok());
  EXPECT_TRUE(registry.check_schema(make_node("Concat", {int_attr("axis", 0)}), 64).is_ok());
  EXPECT_TRUE(registry.check_schema(make_node("Add"), 2).is_ok());
}

// An attribute out of its op's range fails the graph's verification, and
// the builder's, naming the node, its op (once), the attribute and the value.
TEST(RegistryTest, VerifierNamesTheNodeOfAnAttributeOutOfRange) {
  const OpRegistry &registry = OpRegistry::global();
  GraphBuilder b("g", registry);
  TensorId x = b.input("x", DType::kF32, {2, 3});
  TensorId scale = b.parameter("scale", DType::kF32, {3}, Initializer{Initializer::Kind::kOnes});
  TensorId bias = b.parameter("bias", DType::kF32, {3}, Initializer{Initializer::Kind::kZeros});
  b.output(b.op1("LayerNorm", {x, scale, bias}, {}, "ln"));
  Graph g = std::move(b).finish().value();
  ASSERT_TRUE(verify_graph(g, registry).is_ok());
  g.mutable_node(*g.find_node("ln")).set_attr("epsilon", 0.0);
  const std::string expected =
      "node 'ln' (LayerNorm): attribute 'epsilon' = 0 must be a finite number > 0";
  EXPECT_EQ(verify_graph(g, registry).message(), expected);
  GraphBuilder again("g", registry);
  TensorId y = again.input("y", DType::kF32, {2, 3});
  TensorId ones = again.parameter("ones", DType::kF32, {3}, Initializer{Initializer::Kind::kOnes});
  again.op1("LayerNorm", {y, ones, ones}, {{"epsilon", 0.0}}, "ln");
  EXPECT_EQ(again.status().message(), expected);
}

TEST(RegistryTest, InferTypesChecksSchemaFirst) {
  Result<llvm::SmallVector<TensorType, 2>> result =
      infer("Relu", {TensorType{DType::kF32, {2}}}, {int_attr("bogus", 1)});
  ASSERT_FALSE(result.is_ok());
  expect_error(result.status(), {"Relu", "'bogus'"});
}

} // namespace
} // namespace strata::ops
