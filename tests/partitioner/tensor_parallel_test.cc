// Tensor parallelism: sharding propagation finds Megatron-LM's pattern on the
// zoo GPT without annotations, the local graph has the pieces' shapes, and
// pieces cut and join back to the full tensor.
#include <map>

#include <gtest/gtest.h>

#include "graph/builder.h"
#include "ops/registry.h"
#include "partitioner/search/tensor_parallel.h"
#include "plan/pieces.h"
#include "passes/make_training.h"
#include "tools/zoo.h"

namespace strata::partitioner {
namespace {

std::string source_root() {
  const char *root = std::getenv("STRATA_SOURCE_ROOT");
  return root ? root : ".";
}

Graph gpt(int64_t layers, int64_t hidden, int64_t heads, int64_t seq, int64_t batch,
          int64_t vocab = 512) {
  zoo::GptOptions o;
  o.layers = layers;
  o.hidden = hidden;
  o.heads = heads;
  o.seq = seq;
  o.vocab = vocab;
  o.batch = batch;
  return *zoo::make_gpt(o);
}

TensorParallelOptions on_h100(int parts) {
  auto cluster = load_cluster(source_root() + "/examples/clusters/h100-8x-nvlink.json");
  EXPECT_TRUE(cluster.is_ok()) << cluster.status().message();
  TensorParallelOptions options;
  options.parts = parts;
  options.device = cluster->device;
  std::vector<int> members;
  for (int m = 0; m < parts; ++m)
    members.push_back(m);
  options.link = link_for_group(*cluster, members);
  return options;
}

std::map<std::string, int> count_ops(const Graph &g) {
  std::map<std::string, int> counts;
  for (const Node &node : g.nodes())
    ++counts[node.op];
  return counts;
}

TEST(TensorParallelTest, FindsTheMegatronPatternOnTheGpt) {
  for (int parts : {2, 4}) {
    const int64_t layers = 3;
    Graph g = gpt(layers, 1024, 16, 512, 4);
    auto result = shard_tensor_parallel(g, on_h100(parts));
    ASSERT_TRUE(result.is_ok()) << result.status().message();
    EXPECT_EQ(result->rules.at("layer0.attn.qkv"), "column split (B by columns)");
    EXPECT_EQ(result->rules.at("layer0.attn.scores"), "batch dims (heads) split");
    EXPECT_EQ(result->rules.at("layer0.mlp.fc2"), "row split (the contracted dim; partial sums)");
    for (int64_t l = 0; l < layers; ++l) {
      const std::string p = str_cat("layer", l);
      EXPECT_EQ(result->specs.at(p + ".attn.qkv.weight"), ShardSpec::split(1, 3)) << p;
      EXPECT_EQ(result->specs.at(p + ".attn.qkv.bias"), ShardSpec::split(0, 3)) << p;
      EXPECT_EQ(result->specs.at(p + ".attn.proj.weight"), ShardSpec::split(0)) << p;
      EXPECT_EQ(result->specs.at(p + ".attn.proj.bias"), ShardSpec::replicated()) << p;
      EXPECT_EQ(result->specs.at(p + ".mlp.fc1.weight"), ShardSpec::split(1)) << p;
      EXPECT_EQ(result->specs.at(p + ".mlp.fc2.weight"), ShardSpec::split(0)) << p;
      EXPECT_EQ(result->specs.at(p + ".attn.softmax"), ShardSpec::split(1)) << p;
      EXPECT_EQ(result->specs.at(p + ".attn.proj"), ShardSpec::partial()) << p;
      EXPECT_EQ(result->specs.at(p + ".mlp.fc2"), ShardSpec::partial()) << p;
      EXPECT_EQ(result->specs.at(p + ".attn.residual"), ShardSpec::replicated()) << p;
    }
    // Forward: exactly one all-reduce per attention block and per MLP block.
    auto counts = count_ops(result->local);
    EXPECT_EQ(counts["TpAllReduce"], 2 * layers) << parts;
    EXPECT_EQ(counts["TpCopy"], 2 * layers) << parts;
    for (const Node &node : result->local.nodes()) {
      if (node.op != "TpAllReduce") continue;
      EXPECT_TRUE(node.name.ends_with(".attn.proj.tp_all_reduce") ||
                  node.name.ends_with(".mlp.fc2.tp_all_reduce"))
          << node.name;
    }
    // The pieces' shapes.
    const Graph &local = result->local;
    EXPECT_EQ(local.tensor(*local.find_tensor("layer0.mlp.fc1.weight")).type.shape,
              (Shape{1024, 4096 / parts}));
    EXPECT_EQ(local.tensor(*local.find_tensor("layer0.attn.qkv.weight")).type.shape,
              (Shape{1024, 3072 / parts}));
  }
}

// With split activations, partial sums may be reduce-scattered into split
// activations instead of all-reduced: on the GPT every block's partial output
// is, and each reduce-scatter's result is gathered before a whole use.
TEST(TensorParallelTest, SplitActivationsReduceScatterPartialSums) {
  const int64_t layers = 2;
  Graph g = gpt(layers, 1024, 16, 512, 4);
  TensorParallelOptions options = on_h100(2);
  options.split_activations = true;
  auto result = shard_tensor_parallel(g, options);
  ASSERT_TRUE(result.is_ok()) << result.status().message();
  auto counts = count_ops(result->local);
  EXPECT_EQ(counts["TpReduceScatter"], 2 * layers);
  EXPECT_EQ(counts["TpAllReduce"], 0);
  EXPECT_GE(counts["TpAllGather"], 2 * layers);
  for (const Node &node : result->local.nodes()) {
    if (node.op != "TpReduceScatter") continue;
    EXPECT_TRUE(node.name.ends_with(".attn.proj.tp_reduce_scatter") ||
                node.name.ends_with(".mlp.fc2.tp_reduce_scatter"))
        << node.name;
    const AttrValue *why = node.find_attr("why");
    ASSERT_NE(why, nullptr) << node.name;
    EXPECT_NE(std::get<std::string>(*why).find("partial sums"), std::string::npos) << node.name;
    // The piece is half the partial tensor along the chosen dim.
    const TensorType &in = result->local.tensor(node.inputs[0]).type;
    const TensorType &out = result->local.tensor(node.outputs[0]).type;
    EXPECT_EQ(in.num_elements(), 2 * out.num_elements()) << node.name;
  }
  EXPECT_EQ(result->specs.at("layer0.mlp.fc2"), ShardSpec::partial());
  EXPECT_TRUE(result->specs.at("layer0.mlp.residual").is_split());
}

// A column-split projection followed by a softmax over the split dim: the
// cheapest way to the softmax is an all-to-all that moves the split to the
// rows (each member sends 3/16 of the activation, where an all-gather would
// receive 3/4 of it), and the row-split result is gathered at the end.
Graph projection_softmax(int64_t rows, int64_t in, int64_t width) {
  GraphBuilder b("projection_softmax", ops::OpRegistry::global());
  TensorId x = b.input("x", DType::kF32, {rows, in});
  TensorId w1 = b.parameter("w1", DType::kF32, {in, width},
                            Initializer{Initializer::Kind::kNormal, 0.0, 0.1, 1});
  TensorId w2 = b.parameter("w2", DType::kF32, {width, 8},
                            Initializer{Initializer::Kind::kNormal, 0.0, 0.1, 2});
  TensorId h = b.op1("MatMul", {x, w1}, {}, "proj");
  TensorId p = b.op1("Softmax", {h}, {{"axis", int64_t{1}}}, "softmax");
  b.output(b.op1("MatMul", {p, w2}, {}, "head"));
  return *std::move(b).finish();
}

TEST(TensorParallelTest, AllToAllMovesASplitToAnotherDim) {
  auto result = shard_tensor_parallel(projection_softmax(1024, 4096, 4096), on_h100(4));
  ASSERT_TRUE(result.is_ok()) << result.status().message();
  EXPECT_EQ(result->specs.at("proj"), ShardSpec::split(1));
  EXPECT_EQ(result->specs.at("softmax"), ShardSpec::split(0));
  auto counts = count_ops(result->local);
  EXPECT_EQ(counts["TpAllToAll"], 1);
  for (const Node &node : result->local.nodes()) {
    if (node.op != "TpAllToAll") continue;
    EXPECT_EQ(node.int_attr("from_axis"), 1);
    EXPECT_EQ(node.int_attr("axis"), 0);
    EXPECT_EQ(result->local.tensor(node.outputs[0]).type.shape, (Shape{256, 4096}));
  }
}

// A piece of a split with outer 3 (a fused [Q | K | V] axis): member r holds,
// of each third, its r-th part; joining the pieces gives back the tensor.
TEST(TensorParallelTest, PiecesCutAndJoinAlongAStridedDim) {
  const std::vector<int64_t> shape = {2, 12, 3};
  TensorShard shard{"w", shape, 1, 3};
  const int parts = 2;
  std::vector<float> full(2 * 12 * 3);
  for (size_t i = 0; i < full.size(); ++i)
    full[i] = static_cast<float>(i);
  std::vector<std::vector<float>> pieces(parts, std::vector<float>(full.size() / parts));
  for (int r = 0; r < parts; ++r)
    plan::copy_piece(shard, parts, r, sizeof(float), reinterpret_cast<std::byte *>(full.data()),
               reinterpret_cast<std::byte *>(pieces[static_cast<size_t>(r)].data()), true);
  // Piece r is [2, 6, 3]: dim 1 index 2 * o + j of the piece is 4 * o + 2 * r + j of the full.
  for (int r = 0; r < parts; ++r)
    for (int64_t a = 0; a < 2; ++a)
      for (int64_t o = 0; o < 3; ++o)
        for (int64_t j = 0; j < 2; ++j)
          for (int64_t c = 0; c < 3; ++c) {
            const float got =
                pieces[static_cast<size_t>(r)][static_cast<size_t>((a * 6 + o * 2 + j) * 3 + c)];
            const float want = full[static_cast<size_t>((a * 12 + o * 4 + r * 2 + j) * 3 + c)];
            ASSERT_EQ(got, want) << r << " " << a << " " << o << " " << j << " " << c;
          }
  std::vector<float> joined(full.size(), -1);
  for (int r = 0; r < parts; ++r)
    plan::copy_piece(shard, parts, r, sizeof(float), reinterpret_cast<std::byte *>(joined.data()),
               reinterpret_cast<std::byte *>(pieces[static_cast<size_t>(r)].data()), false);
  EXPECT_EQ(joined, full);
}

// With the pieces known, the local graph is what one member runs: the ops of
// the forward graph at local shapes plus the Tp* collectives, every one with
// the reason it is there.
TEST(TensorParallelTest, LocalGraphCollectivesSayWhy) {
  Graph g = gpt(1, 1024, 16, 512, 4);
  auto result = shard_tensor_parallel(g, on_h100(2));
  ASSERT_TRUE(result.is_ok()) << result.status().message();
  for (const Node &node : result->local.nodes()) {
    if (node.op.rfind("Tp", 0) != 0) continue;
    const AttrValue *why = node.find_attr("why");
    ASSERT_NE(why, nullptr) << node.name;
    EXPECT_FALSE(std::get<std::string>(*why).empty()) << node.name;
  }
  const Node &reduce = result->local.node(*result->local.find_node("layer0.mlp.fc2.tp_all_reduce"));
  EXPECT_NE(std::get<std::string>(*reduce.find_attr("why")).find("row split"), std::string::npos);
  // Same node names, inputs and outputs as the forward graph.
  EXPECT_EQ(result->local.inputs().size(), g.inputs().size());
  EXPECT_EQ(result->local.outputs().size(), g.outputs().size());
  EXPECT_EQ(result->local.tensor(result->local.outputs()[0]).type, g.tensor(g.outputs()[0]).type);
  for (const Node &node : g.nodes())
    EXPECT_TRUE(result->local.find_node(node.name).has_value()) << node.name;
}

// With the loss in the graph and a vocabulary large against the hidden size
// (GPT-2's 50257 against 768 to 1600), the search finds Megatron-LM's
// vocabulary-parallel embedding and cross entropy: the tied table is stored
// split by rows, the lookup gives partial sums (one more all-reduce), and the
// logits stay split by class into the loss, whose members exchange three
// numbers per row instead of gathering the logits.
TEST(TensorParallelTest, FindsTheVocabularyParallelEmbeddingAndLoss) {
  for (int parts : {2, 4}) {
    const int64_t layers = 2;
    Graph g = gpt(layers, 1024, 16, 512, 4, 32768);
    passes::TrainingOptions training;
    auto with_loss = passes::add_loss(g, training);
    ASSERT_TRUE(with_loss.is_ok()) << with_loss.status().message();
    auto result = shard_tensor_parallel(*with_loss, on_h100(parts));
    ASSERT_TRUE(result.is_ok()) << result.status().message();
    EXPECT_EQ(result->specs.at("wte"), ShardSpec::split(0)) << parts;
    EXPECT_EQ(result->specs.at("embed.tokens"), ShardSpec::partial()) << parts;
    EXPECT_EQ(result->specs.at("logits"), ShardSpec::split(2)) << parts;
    EXPECT_EQ(result->specs.at("loss"), ShardSpec::replicated()) << parts;
    EXPECT_EQ(result->rules.at("embed.tokens"),
              "gather from a table split by rows (each member's rows; partial sums)");
    EXPECT_EQ(result->rules.at("logits"), "column split (B by columns)");
    const Graph &local = result->local;
    const Node &lookup = local.node(*local.find_node("embed.tokens"));
    EXPECT_EQ(lookup.int_attr("parts"), parts);
    EXPECT_EQ(local.tensor(*local.find_tensor("wte")).type.shape, (Shape{32768 / parts, 1024}));
    EXPECT_EQ(local.tensor(*local.find_tensor("logits")).type.shape,
              (Shape{4, 512, 32768 / parts}));
    EXPECT_EQ(local.node(*local.find_node("loss")).op, "VocabParallelCrossEntropy");
    auto counts = count_ops(local);
    EXPECT_EQ(counts["VocabParallelStats"], 1);
    // The lookup's partial sums are all-reduced; the logits are never
    // gathered: the loss's one gather is its statistics, 3 numbers per row.
    EXPECT_TRUE(local.find_node("embed.tokens.tp_all_reduce").has_value());
    EXPECT_EQ(counts["TpAllReduce"], 2 * layers + 1) << parts; // the blocks' and the lookup's
    int stats_gathers = 0;
    for (const Node &node : local.nodes()) {
      if (node.op != "TpAllGather") continue;
      EXPECT_NE(local.tensor(node.inputs[0]).name, "logits") << parts;
      if (local.tensor(node.outputs[0]).type.shape == Shape{4, 512, 3 * parts}) ++stats_gathers;
    }
    EXPECT_EQ(stats_gathers, 1) << parts;
  }
  // Without the loss in the graph, the logits are an output and whole.
  auto result = shard_tensor_parallel(gpt(2, 1024, 16, 512, 4, 32768), on_h100(2));
  ASSERT_TRUE(result.is_ok()) << result.status().message();
  EXPECT_EQ(count_ops(result->local)["VocabParallelStats"], 0);
}

// One member is no tensor parallelism; a model of ops without rules stays replicated.
TEST(TensorParallelTest, OneMemberAndUnknownOpsStayWhole) {
  EXPECT_FALSE(
      shard_tensor_parallel(gpt(1, 64, 4, 8, 2), TensorParallelOptions{0, {}, {}}).is_ok());
  auto result = shard_tensor_parallel(gpt(1, 64, 4, 8, 2), on_h100(1));
  ASSERT_TRUE(result.is_ok()) << result.status().message();
  EXPECT_TRUE(result->shards.empty());
}

} // namespace
} // namespace strata::partitioner
