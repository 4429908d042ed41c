// Elementwise chains: which nodes a backend may run as one kernel.
#include "passes/fuse_elementwise.h"

#include <gtest/gtest.h>

#include "graph/builder.h"
#include "ops/registry.h"
#include "passes/make_training.h"
#include "tools/zoo.h"

namespace strata::passes {
namespace {

Graph finish(GraphBuilder &b) {
  auto graph = std::move(b).finish();
  EXPECT_TRUE(graph.is_ok()) << graph.status().message();
  return std::move(graph).value();
}

std::vector<std::vector<std::string>> chains_of(const Graph &g, int max_nodes = 16,
                                                int max_operands = 16) {
  std::vector<std::vector<std::string>> named;
  for (const auto &chain :
       find_elementwise_chains(g, *g.topological_order(), max_nodes, max_operands)) {
    named.emplace_back();
    for (NodeId id : chain)
      named.back().push_back(g.node(id).name);
  }
  return named;
}

using Names = std::vector<std::vector<std::string>>;

TEST(FuseElementwise, ChainsFollowSingleReadersOfOneShape) {
  GraphBuilder b("g", ops::OpRegistry::global());
  TensorId x = b.input("x", DType::kF32, {4, 8});
  TensorId y = b.input("y", DType::kF32, {4, 8});
  TensorId s = b.input("s", DType::kF32, {});
  TensorId row = b.input("row", DType::kF32, {1, 8});
  // relu -> scale (by a scalar) -> add y: one chain.
  TensorId r = b.op1("Relu", {x}, {}, "relu");
  TensorId m = b.op1("Mul", {r, s}, {}, "scale");
  TensorId a = b.op1("Add", {m, y}, {}, "add");
  // add is read twice: the chain ends there.
  b.output(b.op1("Exp", {a}, {}, "exp"));
  b.output(b.op1("Tanh", {a}, {}, "tanh"));
    // A broadcast operand (a bias) is read through its strides: fusable.
  TensorId bias = b.op1("Add", {y, row}, {}, "bias");
  b.output(b.op1("Neg", {bias}, {}, "neg_bias"));
  // But a chain keeps one shape: a [1, 8] value broadcast into [4, 8] ends it.
  TensorId small = b.op1("Neg", {row}, {}, "neg_row");
  b.output(b.op1("Add", {small, x}, {}, "grow"));
  // A graph output inside would be lost: sig is kept, so it ends its chain.
  TensorId sig = b.op1("Sigmoid", {y}, {}, "sig");
  b.output(sig);
  b.output(b.op1("Sqrt", {sig}, {}, "root"));
  // An op that is not elementwise breaks a chain.
  TensorId n = b.op1("Neg", {x}, {}, "neg");
  TensorId t = b.op1("Transpose", {n}, {{"perm", AttrValue{std::vector<int64_t>{1, 0}}}}, "t");
  b.output(b.op1("Exp", {t}, {}, "exp_t"));
  Graph g = finish(b);
    EXPECT_EQ(chains_of(g), (Names{{"relu", "scale", "add"}, {"bias", "neg_bias"}}));
}

TEST(FuseElementwise, ChainsAreCappedInNodesAndOperands) {
  GraphBuilder b("g", ops::OpRegistry::global());
  TensorId v = b.input("x", DType::kF32, {16});
  std::vector<TensorId> extra;
  for (int i = 0; i < 6; ++i) {
    extra.push_back(b.input("e" + std::to_string(i), DType::kF32, {16}));
    v = b.op1("Add", {v, extra.back()}, {}, "add" + std::to_string(i));
  }
  b.output(v);
  Graph g = finish(b);
  EXPECT_EQ(chains_of(g), (Names{{"add0", "add1", "add2", "add3", "add4", "add5"}}));
  EXPECT_EQ(chains_of(g, 4), (Names{{"add0", "add1", "add2", "add3"}, {"add4", "add5"}}));
  // add0 reads x and e0, each later add one more tensor.
  EXPECT_EQ(chains_of(g, 16, 4), (Names{{"add0", "add1", "add2"}, {"add3", "add4", "add5"}}));
}

// In a training graph every chain's intermediates have no other reader and
// are neither graph outputs nor state updates, and every node is in one
// chain at most.
TEST(FuseElementwise, TheZooGptTrainingGraphHasSafeChains) {
  zoo::GptOptions o;
  o.layers = 2;
  o.hidden = 32;
  o.heads = 4;
  o.seq = 8;
  o.vocab = 64;
  o.batch = 4;
  TrainingOptions training;
  training.optimizer = *parse_optimizer("adamw:lr=0.01");
  const Graph g = *make_training_graph(*zoo::make_gpt(o), training);
  const auto order = *g.topological_order();
  const auto chains = find_elementwise_chains(g, order);
  ASSERT_FALSE(chains.empty());
  std::vector<int> readers(g.num_tensors(), 0);
  for (const Node &node : g.nodes())
    for (TensorId id : node.inputs)
      ++readers[id];
  std::vector<bool> seen(g.num_nodes(), false);
  for (const auto &chain : chains) {
    ASSERT_GE(chain.size(), 2u);
    for (size_t i = 0; i < chain.size(); ++i) {
      EXPECT_FALSE(seen[chain[i]]) << g.node(chain[i]).name;
      seen[chain[i]] = true;
      EXPECT_TRUE(fusable_elementwise(g, g.node(chain[i]))) << g.node(chain[i]).name;
      if (i + 1 == chain.size()) continue;
      const TensorId out = g.node(chain[i]).outputs[0];
      EXPECT_EQ(readers[out], 1) << g.tensor(out).name;
      const auto &next = g.node(chain[i + 1]).inputs;
      EXPECT_NE(std::find(next.begin(), next.end(), out), next.end()) << g.tensor(out).name;
      for (TensorId kept : g.outputs())
        EXPECT_NE(kept, out);
      for (const StateUpdate &update : g.updates())
        EXPECT_NE(update.value, out);
    }
  }
}

} // namespace
} // namespace strata::passes
