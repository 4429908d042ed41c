// Tests of the autodiff pass: which nodes it differentiates, how it sums
// gradients of tensors read several times, and the errors it gives. The
// gradient rules of each op are checked in tests/ops/*_grad_test.cc.
#include <gtest/gtest.h>

#include "graph/verifier.h"
#include "tests/passes/grad_check.h"

namespace strata {
namespace {

using testing::check_gradients;
using testing::random_tensor;

TEST(AutodiffTest, SumsGradientsOfATensorReadTwice) {
  // out = x * x + x: dL/dx = R * (2x + 1), through two reads of x by Mul and one by Add.
  check_gradients(
      [](GraphBuilder &b, llvm::ArrayRef<TensorId> x) {
        TensorId square = b.op1("Mul", {x[0], x[0]});
        return b.op1("Add", {square, x[0]});
      },
      {random_tensor({DType::kF32, {3, 4}}, 1)});
}

TEST(AutodiffTest, BroadcastGradientsAreReducedToTheInputShape) {
  check_gradients(
      [](GraphBuilder &b, llvm::ArrayRef<TensorId> x) {
        TensorId sum = b.op1("Add", {x[0], x[1]});
        return b.op1("Mul", {sum, x[2]});
      },
      {random_tensor({DType::kF32, {2, 3, 4}}, 2), random_tensor({DType::kF32, {4}}, 3),
       random_tensor({DType::kF32, {3, 1}}, 4)});
}

TEST(AutodiffTest, LeavesTheForwardGraphAndSkipsUnrelatedNodes) {
  GraphBuilder b("g", ops::OpRegistry::global());
  TensorId x = b.input("x", DType::kF32, {4});
  TensorId w = b.input("w", DType::kF32, {4});
  TensorId unused = b.input("unused", DType::kF32, {4});
  TensorId side = b.op1("Mul", {unused, unused}, {}, "side");
  TensorId loss = b.op1("ReduceSum", {b.op1("Mul", {x, w})}, {{"keepdims", int64_t{0}}}, "loss");
  b.output(loss);
  b.output(side);
  Graph g = std::move(b).finish().value();
  const size_t forward_nodes = g.num_nodes();
  auto grads = passes::append_backward(g, loss, {w, unused});
  ASSERT_TRUE(grads.is_ok()) << grads.status().to_string();
  ASSERT_EQ(grads->size(), 2u);
  EXPECT_TRUE(verify_graph(g, ops::OpRegistry::global()).is_ok());
  // The forward nodes are untouched and no backward node reads `side`.
  for (NodeId id = 0; id < forward_nodes; ++id)
    EXPECT_FALSE(g.node(id).name.find(".grad") != std::string::npos);
  for (NodeId id = static_cast<NodeId>(forward_nodes); id < g.num_nodes(); ++id)
    for (TensorId input : g.node(id).inputs)
      EXPECT_NE(g.tensor(input).name, "side");
  // d loss / d unused is a zero constant.
  EXPECT_EQ(g.node(g.tensor((*grads)[1].gradient).producer).op, "Constant");
}

TEST(AutodiffTest, IsDeterministic) {
  auto build = [] {
    GraphBuilder b("g", ops::OpRegistry::global());
    TensorId x = b.input("x", DType::kF32, {2, 2});
    TensorId y = b.op1("Mul", {x, x});
    TensorId loss = b.op1("ReduceSum", {b.op1("Add", {y, x})}, {{"keepdims", int64_t{0}}});
    b.output(loss);
    Graph g = std::move(b).finish().value();
    EXPECT_TRUE(passes::append_backward(g, loss, {x}).is_ok());
    return g;
  };
  Graph a = build(), c = build();
  ASSERT_EQ(a.num_nodes(), c.num_nodes());
  for (NodeId id = 0; id < a.num_nodes(); ++id) {
    EXPECT_EQ(a.node(id).name, c.node(id).name);
    EXPECT_EQ(a.node(id).op, c.node(id).op);
  }
}

TEST(AutodiffTest, RejectsNonScalarLossAndIntegerTargets) {
  GraphBuilder b("g", ops::OpRegistry::global());
  TensorId x = b.input("x", DType::kF32, {4});
  TensorId i = b.input("i", DType::kI64, {4});
  TensorId y = b.op1("Mul", {x, x}, {}, "y");
  TensorId loss = b.op1("ReduceSum", {y}, {{"keepdims", int64_t{0}}}, "loss");
  b.output(loss);
  Graph g = std::move(b).finish().value();
  const size_t nodes = g.num_nodes();
  auto not_scalar = passes::append_backward(g, y, {x});
  ASSERT_FALSE(not_scalar.is_ok());
  EXPECT_NE(not_scalar.status().message().find("loss 'y' must be a floating-point scalar"),
            std::string::npos);
  auto integer = passes::append_backward(g, loss, {i});
  ASSERT_FALSE(integer.is_ok());
  EXPECT_NE(integer.status().message().find("'i': it is i64"), std::string::npos)
      << integer.status().message();
  EXPECT_EQ(g.num_nodes(), nodes) << "a failed pass must leave the graph as it was";
}

} // namespace
} // namespace strata
