// Registry-wide checks: the registry and the op catalog (docs/ops.md) list the
// same ops, every op is complete, and schema checks reject malformed nodes with
// messages that name the op and the attribute.
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

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

TEST(RegistryTest, InferTypesChecksSchemaFirst) {
  Result<llvm::SmallVector<TensorType, 2>> result =
      infer("Relu", {TensorType{DType::kF32, {2}}}, {int_attr("bogus", 1)});
  ASSERT_FALSE(result.is_ok());
  expect_error(result.status(), {"Relu", "'bogus'"});
}

} // namespace
} // namespace strata::ops
