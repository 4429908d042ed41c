// Activation recomputation: which activations stay, what is cloned, and that a
// step with recomputation gives bitwise the single-device executor's result.
#include <gtest/gtest.h>

#include "passes/make_training.h"
#include "passes/recompute.h"
#include "runtime/trainer.h"
#include "tools/zoo.h"

namespace strata::passes {
namespace {

Graph gpt(int64_t layers) {
  zoo::GptOptions o;
  o.layers = layers;
  o.hidden = 32;
  o.heads = 2;
  o.seq = 8;
  o.vocab = 64;
  o.batch = 4;
  return *zoo::make_gpt(o);
}

TrainingOptions adamw() {
  TrainingOptions options;
  options.optimizer = *parse_optimizer("adamw:lr=0.01");
  return options;
}

TEST(RecomputeTest, KeepsTheResidualStreamAndClonesTheRest) {
  const Graph training = *make_training_graph(gpt(3), adamw());
  RecomputeStats stats;
  auto recomputed = recompute_activations(training, &stats);
  ASSERT_TRUE(recomputed.is_ok()) << recomputed.status().message();
  EXPECT_GT(stats.cloned, 20u);
  // Every clone is named after its original and computes the same op.
  size_t clones = 0;
  for (const Node &node : recomputed->nodes()) {
    if (!node.name.ends_with(kRecomputeSuffix)) continue;
    ++clones;
    auto original =
        recomputed->find_node(node.name.substr(0, node.name.size() - kRecomputeSuffix.size()));
    ASSERT_TRUE(original.has_value()) << node.name;
    EXPECT_EQ(recomputed->node(*original).op, node.op);
    EXPECT_EQ(recomputed->node(*original).attrs, node.attrs);
  }
  EXPECT_EQ(clones, stats.cloned);
  // Backward reads the residual stream between layers, not what a layer computes
  // inside: no backward node reads the attention probabilities of layer 0.
  const auto consumers = recomputed->consumers();
  const TensorId probs = *recomputed->find_tensor("layer0.attn.softmax");
  for (NodeId c : consumers[probs])
    EXPECT_FALSE(recomputed->node(c).name.find(".grad") != std::string::npos)
        << recomputed->node(c).name;
  // Layer 1 is recomputed from its input, the residual stream after layer 0.
  bool read_by_a_clone = false;
  for (NodeId c : consumers[*recomputed->find_tensor("layer0.mlp.residual")])
    read_by_a_clone |= recomputed->node(c).name.ends_with(kRecomputeSuffix);
  EXPECT_TRUE(read_by_a_clone);
}

// One device, the whole batch: recomputation changes no bit of the step.
TEST(RecomputeTest, TrainsBitwiseLikeWithout) {
  const Graph training = *make_training_graph(gpt(2), adamw());
  const Graph recomputed = *recompute_activations(training);
  auto run = [](Graph graph) {
    auto data = runtime::synthetic_dataset(graph, 5);
    auto trainer = runtime::Trainer::create(std::move(graph), "loss", std::move(data));
    EXPECT_TRUE(trainer.is_ok()) << trainer.status().message();
    std::vector<double> losses;
    for (int s = 0; s < 3; ++s)
      losses.push_back(*(*trainer)->train_step());
    return std::make_pair(losses, (*trainer)->state());
  };
  auto [plain_losses, plain_state] = run(training);
  auto [losses, state] = run(recomputed);
  EXPECT_EQ(losses, plain_losses);
  ASSERT_EQ(state.size(), plain_state.size());
  for (const auto &[name, value] : plain_state) {
    ASSERT_TRUE(state.contains(name)) << name;
    EXPECT_EQ(std::memcmp(state.at(name).data(), value.data(), value.size_bytes()), 0) << name;
  }
}

TEST(RecomputeTest, AGraphWithoutLayersIsUnchanged) {
  zoo::MlpOptions o;
  o.batch = 4;
  o.input = 3;
  o.hidden = {};
  o.classes = 2;
  const Graph training = *make_training_graph(*zoo::make_mlp(o), adamw());
  RecomputeStats stats;
  auto recomputed = recompute_activations(training, &stats);
  ASSERT_TRUE(recomputed.is_ok()) << recomputed.status().message();
  EXPECT_EQ(stats.cloned, 0u);
  EXPECT_EQ(recomputed->num_nodes(), training.num_nodes());
}

} // namespace
} // namespace strata::passes
