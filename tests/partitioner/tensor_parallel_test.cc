// Tensor parallelism: sharding propagation finds Megatron-LM's pattern on the
// zoo GPT without annotations, the local graph has the pieces' shapes, and
// pieces cut and join back to the full tensor.
#include <map>

#include <gtest/gtest.h>

#include "partitioner/tensor_parallel.h"
#include "tools/zoo.h"

namespace strata::partitioner {
namespace {

std::string source_root() {
  const char *root = std::getenv("STRATA_SOURCE_ROOT");
  return root ? root : ".";
}

Graph gpt(int64_t layers, int64_t hidden, int64_t heads, int64_t seq, int64_t batch) {
  zoo::GptOptions o;
  o.layers = layers;
  o.hidden = hidden;
  o.heads = heads;
  o.seq = seq;
  o.vocab = 512;
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

} // namespace
} // namespace strata::partitioner
