// Tests of the vertical (pipeline stage) partitioner.
#include "partitioner/search/stage_partition.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>

#include <gmock/gmock.h>
#include <set>

#include <gtest/gtest.h>

#include "passes/make_training.h"
#include "tools/zoo.h"

namespace strata::partitioner {
namespace {

using ::testing::HasSubstr;

// The best bottleneck over every split, by enumeration; -1 when none fits.
double brute_force(const PartitionProblem &problem) {
  const size_t n = problem.items.size();
  const int p = problem.stages;
  double best = -1;
  std::vector<size_t> cuts;
  std::function<void(size_t, int)> go = [&](size_t begin, int s) {
    if (s == p - 1) {
      std::vector<size_t> all = cuts;
      auto solution = evaluate_partition(problem, all);
      if (solution && (best < 0 || solution->bottleneck < best)) best = solution->bottleneck;
      return;
    }
    for (size_t last = begin; last + 1 < n; ++last) {
      cuts.push_back(last);
      go(last + 1, s + 1);
      cuts.pop_back();
    }
  };
  go(0, 0);
  return best;
}

PartitionProblem random_problem(std::mt19937 &rng, bool with_memory) {
  std::uniform_int_distribution<int> size(1, 12), stage_count(1, 4);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  PartitionProblem problem;
  const int n = size(rng);
  problem.stages = std::min(n, stage_count(rng));
  for (int i = 0; i < n; ++i) {
    PartitionItem item;
    item.name = str_cat("n", i);
    item.time = std::floor(unit(rng) * 10);
    item.cut_cost = unit(rng) < 0.15 ? kUnlimited : std::floor(unit(rng) * 4);
    item.static_bytes = std::floor(unit(rng) * 8);
    item.activation_bytes = std::floor(unit(rng) * 4);
    problem.items.push_back(item);
  }
  if (with_memory) {
    problem.memory_capacity = 8 + std::floor(unit(rng) * 30);
    for (int s = 0; s < problem.stages; ++s)
      problem.in_flight.push_back(problem.stages - s);
  }
  return problem;
}

TEST(SolvePartition, MatchesBruteForceOnRandomInstances) {
  std::mt19937 rng(12345);
  int solved = 0, infeasible = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    PartitionProblem problem = random_problem(rng, trial % 2 == 1);
    double expected = brute_force(problem);
    auto result = solve_partition(problem);
    if (expected < 0) {
      EXPECT_FALSE(result.is_ok()) << "trial " << trial;
      ++infeasible;
      continue;
    }
    ASSERT_TRUE(result.is_ok()) << "trial " << trial << ": " << result.status().to_string();
    EXPECT_EQ(result->bottleneck, expected) << "trial " << trial;
    ASSERT_EQ(result->boundaries.size(), static_cast<size_t>(problem.stages - 1));
    // The reported partition is valid and agrees with an independent evaluation.
    auto check = evaluate_partition(problem, result->boundaries);
    ASSERT_TRUE(check.is_ok()) << check.status().to_string();
    EXPECT_EQ(check->bottleneck, result->bottleneck);
    EXPECT_EQ(check->stage_time, result->stage_time);
    ++solved;
  }
  EXPECT_GT(solved, 1000);
  EXPECT_GT(infeasible, 10);
}

PartitionItem item(std::string name, double time, double static_bytes = 0,
                   double activation_bytes = 0, double cut_cost = 0) {
  return {std::move(name), time, static_bytes, activation_bytes, cut_cost};
}

TEST(SolvePartition, MemoryCapacityForcesADifferentSplit) {
  PartitionProblem problem;
  problem.stages = 2;
  // By time alone the best cut is after "b" (5 | 5); "a" and "b" hold 8 bytes each.
  problem.items = {item("a", 1, 8), item("b", 4, 8), item("c", 4, 0), item("d", 1, 0)};
  auto free = solve_partition(problem);
  ASSERT_TRUE(free.is_ok()) << free.status().to_string();
  EXPECT_EQ(free->boundaries, std::vector<size_t>{1});
  EXPECT_EQ(free->bottleneck, 5);

  problem.memory_capacity = 10;
  auto tight = solve_partition(problem);
  ASSERT_TRUE(tight.is_ok()) << tight.status().to_string();
  EXPECT_EQ(tight->boundaries, std::vector<size_t>{0});
  EXPECT_EQ(tight->bottleneck, 9);
  EXPECT_LE(tight->stage_memory[0], 10);
  EXPECT_LE(tight->stage_memory[1], 10);
}

TEST(SolvePartition, InFlightMicroBatchesMultiplyActivations) {
  PartitionProblem problem;
  problem.stages = 2;
  problem.items = {item("a", 1, 0, 4), item("b", 1, 0, 4), item("c", 1, 0, 4), item("d", 1, 0, 4)};
  problem.memory_capacity = 8;
  problem.in_flight = {2, 1}; // stage 0 has room for one item, stage 1 for two
  auto result = solve_partition(problem);
  EXPECT_FALSE(result.is_ok()); // four items do not fit in 1 + 2
  problem.items.pop_back();
  result = solve_partition(problem);
  ASSERT_TRUE(result.is_ok()) << result.status().to_string();
  EXPECT_EQ(result->boundaries, std::vector<size_t>{0});
  EXPECT_EQ(result->stage_memory, (std::vector<double>{8, 8}));
}

TEST(SolvePartition, InfeasibleNamesTheLargestItem) {
  PartitionProblem problem;
  problem.stages = 2;
  problem.items = {item("small", 1, 10), item("huge.layer", 1, 100), item("tail", 1, 10)};
  problem.memory_capacity = 50;
  auto result = solve_partition(problem);
  ASSERT_FALSE(result.is_ok());
  EXPECT_THAT(result.status().message(), HasSubstr("no partition into 2 stages fits in 50 bytes"));
  EXPECT_THAT(result.status().message(), HasSubstr("'huge.layer', needs 100 bytes"));
}

TEST(SolvePartition, RejectsBadProblems) {
  PartitionProblem problem;
  problem.stages = 3;
  problem.items = {item("a", 1), item("b", 1)};
  EXPECT_FALSE(solve_partition(problem).is_ok()); // more stages than items
  problem.stages = 2;
  problem.items[0].cut_cost = kUnlimited;
  auto no_cut = solve_partition(problem);
  ASSERT_FALSE(no_cut.is_ok());
  EXPECT_THAT(no_cut.status().message(), HasSubstr("cut position"));
  problem.items[0].cut_cost = 0;
  problem.items[1].time = -1;
  EXPECT_FALSE(solve_partition(problem).is_ok());
}

TEST(SolvePartition, CutCostsEnterTheBottleneck) {
  PartitionProblem problem;
  problem.stages = 2;
  // Cutting after "a" gives max(1 + 0.5, 3) = 3, after "b" max(2 + 0.1, 2) = 2.1,
  // after "c" max(3 + 0.2, 1) = 3.2.
  problem.items = {item("a", 1, 0, 0, 0.5), item("b", 1, 0, 0, 0.1), item("c", 1, 0, 0, 0.2),
                   item("d", 1)};
  auto result = solve_partition(problem);
  ASSERT_TRUE(result.is_ok());
  EXPECT_EQ(result->boundaries, std::vector<size_t>{1});
  EXPECT_DOUBLE_EQ(result->bottleneck, 2.1);
  EXPECT_DOUBLE_EQ(result->total_cut_cost, 0.1);
}

TEST(SolvePartition, AmongOptimaTakesTheCheapestCutsThenTheEarliest) {
  // "big" alone sets the bottleneck; x, y, z split either after x (cost 0.5) or
  // after y (cost 0.1), both far below it: the cheaper total wins.
  PartitionProblem problem;
  problem.stages = 3;
  problem.items = {item("big", 10), item("x", 1, 0, 0, 0.5), item("y", 1, 0, 0, 0.1), item("z", 1)};
  auto first = solve_partition(problem);
  ASSERT_TRUE(first.is_ok());
  EXPECT_EQ(first->bottleneck, 10);
  EXPECT_EQ(first->boundaries, (std::vector<size_t>{0, 2}));
  for (int i = 0; i < 5; ++i) {
    auto again = solve_partition(problem);
    ASSERT_TRUE(again.is_ok());
    EXPECT_EQ(again->boundaries, first->boundaries);
  }
  // Equal time and cost everywhere: the earliest cut that reaches the optimum.
  PartitionProblem flat;
  flat.stages = 2;
  flat.items = {item("a", 0), item("b", 1), item("c", 0), item("d", 0), item("e", 1)};
  auto tie = solve_partition(flat);
  ASSERT_TRUE(tie.is_ok());
  EXPECT_EQ(tie->bottleneck, 1);
  EXPECT_EQ(tie->boundaries, std::vector<size_t>{1});
}

Graph small_gpt(int64_t layers, int64_t vocab = 128) {
  zoo::GptOptions options;
  options.layers = layers;
  options.hidden = 64;
  options.heads = 4;
  options.seq = 16;
  options.vocab = vocab;
  options.batch = 2;
  auto graph = zoo::make_gpt(options);
  EXPECT_TRUE(graph.is_ok()) << graph.status().to_string();
  return std::move(graph).value();
}

// The layer a node belongs to from its name ("layer3.attn.q" -> 3), or -1.
int layer_of(const std::string &name) {
  if (name.rfind("layer", 0) != 0) return -1;
  return std::stoi(name.substr(5, name.find('.') - 5));
}

TEST(PartitionStages, GptLayersSplitEvenlyAtLayerBoundaries) {
  Graph gpt = small_gpt(8);
  auto result = partition_stages(gpt, 4);
  ASSERT_TRUE(result.is_ok()) << result.status().to_string();
  const StageAssignment &a = *result;
  ASSERT_EQ(a.stages.size(), 4u);
  ASSERT_EQ(a.boundaries.size(), 3u);
  for (size_t i = 0; i < a.order.size(); ++i) {
    int layer = layer_of(a.order_names[i]);
    if (layer >= 0) {
      EXPECT_EQ(a.node_stage[a.order[i]], layer / 2) << a.order_names[i];
    }
  }
  // Each boundary is the last node of layer 1, 3, 5: the residual add.
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_EQ(layer_of(a.boundaries[s]), static_cast<int>(2 * s + 1)) << a.boundaries[s];
    ASSERT_EQ(a.stages[s].outgoing.size(), 1u) << "stage " << s;
    EXPECT_GT(a.stages[s].cut_time, 0);
  }
  EXPECT_TRUE(a.stages[3].outgoing.empty());
  // Embedding in the first stage, the head in the last; the tied embedding is shared.
  EXPECT_EQ(a.node_stage[*gpt.find_node("embed.tokens")], 0);
  EXPECT_EQ(a.node_stage[*gpt.find_node("logits")], 3);
  TensorId wte = *gpt.find_tensor("wte");
  EXPECT_EQ(a.tensor_stage[wte], 0);
  ASSERT_EQ(a.shared_parameters.size(), 1u);
  EXPECT_EQ(a.shared_parameters[0].tensor, wte);
  EXPECT_EQ(a.shared_parameters[0].stages, (std::vector<int>{0, 3}));
  // Statistics add up.
  size_t nodes = 0;
  double bottleneck = 0, param_bytes = 0;
  for (const StageInfo &info : a.stages) {
    nodes += info.num_nodes;
    bottleneck = std::max(bottleneck, info.time);
    param_bytes += info.parameter_bytes;
    EXPECT_DOUBLE_EQ(info.memory_bytes, info.static_bytes + info.in_flight * info.activation_bytes);
  }
  EXPECT_EQ(nodes, gpt.num_nodes());
  EXPECT_EQ(bottleneck, a.bottleneck);
  EXPECT_EQ(param_bytes, 4.0 * static_cast<double>(gpt.num_parameters()));
  EXPECT_EQ(a.stages[0].in_flight, 4);
  EXPECT_EQ(a.stages[3].in_flight, 1);
  // Same input, same answer.
  auto again = partition_stages(gpt, 4);
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(again->boundaries, a.boundaries);
  EXPECT_EQ(again->node_stage, a.node_stage);
}

TEST(PartitionStages, AnyCutPointsBalanceAtLeastAsWell) {
  Graph gpt = small_gpt(8);
  StagePartitionOptions options;
  options.cut_points = CutPoints::kAny;
  auto any = partition_stages(gpt, 4, options);
  auto narrow = partition_stages(gpt, 4);
  ASSERT_TRUE(any.is_ok()) << any.status().to_string();
  ASSERT_TRUE(narrow.is_ok());
  EXPECT_LE(any->bottleneck, narrow->bottleneck);
}

TEST(PartitionStages, MemoryCapacityErrorNamesANode) {
  Graph gpt = small_gpt(4, /*vocab=*/4096);
  StagePartitionOptions options;
  options.memory_capacity = 1000;
  auto result = partition_stages(gpt, 4, options);
  ASSERT_FALSE(result.is_ok());
  EXPECT_THAT(result.status().message(),
              HasSubstr("no partition into 4 stages fits in 1000 bytes"));
  // The token embedding is the largest single item: 4 MiB of weights, gradient and
  // Adam moments, plus its output (2 x 16 x 64 floats) for one micro-batch.
  EXPECT_THAT(result.status().message(), HasSubstr("'embed.tokens', needs 4202496 bytes"));
}

TEST(PartitionStages, ManualBoundariesAreRespectedAndValidated) {
  Graph gpt = small_gpt(4);
  auto searched = partition_stages(gpt, 2);
  ASSERT_TRUE(searched.is_ok());
  const std::string cut = searched->boundaries[0];

  StagePartitionOptions options;
  options.manual_boundaries = {"layer0.ln1"};
  auto manual = partition_stages(gpt, 2, options);
  ASSERT_TRUE(manual.is_ok()) << manual.status().to_string();
  EXPECT_TRUE(manual->manual);
  EXPECT_EQ(manual->boundaries, std::vector<std::string>{"layer0.ln1"});
  EXPECT_EQ(manual->node_stage[*gpt.find_node("layer0.ln1")], 0);
  EXPECT_EQ(manual->node_stage[*gpt.find_node("layer0.ln2")], 1);
  // layer0.ln1's output and the residual stream cross the cut.
  EXPECT_EQ(manual->stages[0].outgoing.size(), 2u);
  EXPECT_GE(manual->bottleneck, searched->bottleneck);

  options.manual_boundaries = {"no.such.node"};
  auto unknown = partition_stages(gpt, 2, options);
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_THAT(unknown.status().message(), HasSubstr("no forward node named 'no.such.node'"));

  options.manual_boundaries = {"layer2.ln1", "layer1.ln1"};
  auto backwards = partition_stages(gpt, 3, options);
  ASSERT_FALSE(backwards.is_ok());
  EXPECT_THAT(backwards.status().message(),
              HasSubstr("'layer1.ln1' does not come after 'layer2.ln1'"));

  options.manual_boundaries = {"layer1.ln1"};
  auto count = partition_stages(gpt, 3, options);
  ASSERT_FALSE(count.is_ok());
  EXPECT_THAT(count.status().message(), HasSubstr("3 stages need 2"));

  options.manual_boundaries = {"logits"};
  auto last = partition_stages(gpt, 2, options);
  ASSERT_FALSE(last.is_ok());
  EXPECT_THAT(last.status().message(), HasSubstr("last stage would be empty"));
}

TEST(PartitionStages, MlpSplitsBetweenLayers) {
  zoo::MlpOptions options;
  options.hidden = {512, 512, 512};
  auto mlp = zoo::make_mlp(options);
  ASSERT_TRUE(mlp.is_ok());
  auto result = partition_stages(*mlp, 2);
  ASSERT_TRUE(result.is_ok()) << result.status().to_string();
  EXPECT_EQ(result->stages[0].outgoing.size(), 1u);
  EXPECT_EQ(result->stages[0].num_nodes + result->stages[1].num_nodes, mlp->num_nodes());
}

TEST(AssignTrainingNodes, EveryNodeGetsAStageAndBackwardFollowsForward) {
  Graph gpt = small_gpt(4);
  passes::TrainingOptions training_options;
  training_options.optimizer.kind = passes::OptimizerSpec::Kind::kAdam;
  training_options.optimizer.clip_norm = 1.0;
  auto training = passes::make_training_graph(gpt, training_options);
  ASSERT_TRUE(training.is_ok()) << training.status().to_string();

  auto forward = partition_stages(gpt, 2);
  ASSERT_TRUE(forward.is_ok());
  auto mapped = assign_training_nodes(*training, *forward);
  ASSERT_TRUE(mapped.is_ok()) << mapped.status().to_string();
  ASSERT_EQ(mapped->node_stage.size(), training->num_nodes());
  size_t total = 0;
  for (size_t count : mapped->nodes_per_stage)
    total += count;
  EXPECT_EQ(total, training->num_nodes());

  for (NodeId id = 0; id < training->num_nodes(); ++id) {
    const Node &node = training->node(id);
    int stage = mapped->node_stage[id];
    ASSERT_GE(stage, 0) << node.name;
    ASSERT_LT(stage, 2) << node.name;
    if (auto f = gpt.find_node(node.name)) {
      EXPECT_EQ(stage, forward->node_stage[*f]) << node.name;
    }
    if (node.name.ends_with(".grad.accumulate")) {
      // Sums of contributions all made on one stage run there.
      std::set<int> stages;
      for (TensorId in : node.inputs)
        stages.insert(mapped->node_stage[training->tensor(in).producer]);
      if (stages.size() == 1) {
        EXPECT_EQ(stage, *stages.begin()) << node.name;
        continue;
      }
    }
    size_t grad = node.name.find(".grad.");
    if (grad != std::string::npos) {
      if (auto f = gpt.find_node(node.name.substr(0, grad))) {
        EXPECT_EQ(stage, forward->node_stage[*f]) << node.name;
      }
    }
  }
  // At the stage boundary the residual stream's two gradient contributions are
  // both made on stage 1: their sum runs there and crosses as one tensor.
  const std::string last_of_stage0 = forward->boundaries[0];
  auto boundary_sum = training->find_node(last_of_stage0 + ".grad.accumulate");
  ASSERT_TRUE(boundary_sum.has_value()) << last_of_stage0;
  EXPECT_EQ(mapped->node_stage[*boundary_sum], 1) << last_of_stage0;
  // The tied embedding's contributions come from both stages: the sum stays
  // with the parameter.
  EXPECT_EQ(mapped->node_stage[*training->find_node("wte.grad.accumulate")], 0);
  // Optimizer updates follow their parameter; the tied embedding lives in stage 0.
  EXPECT_EQ(mapped->node_stage[*training->find_node("wte.update")], 0);
  EXPECT_EQ(mapped->tensor_stage[*training->find_tensor("wte")], 0);
  EXPECT_EQ(mapped->node_stage[*training->find_node("layer3.mlp.fc2.weight.update")], 1);
  EXPECT_EQ(mapped->node_stage[*training->find_node("loss")], 1);

  // The training graph itself can be partitioned too: its forward part is split the
  // same way as the forward graph (plus the loss).
  auto direct = partition_stages(*training, 2);
  ASSERT_TRUE(direct.is_ok()) << direct.status().to_string();
  EXPECT_EQ(direct->order.size(), gpt.num_nodes() + 1);
  auto mapped_direct = assign_training_nodes(*training, *direct);
  ASSERT_TRUE(mapped_direct.is_ok()) << mapped_direct.status().to_string();
}

// Balancing a training graph on the whole step: a forward node stands for
// itself, its backward and its parameters' updates (once per step: 1/M each),
// where assign_training_nodes will put them. A layer whose backward is slow
// gets a stage of its own, which forward times scaled by a backward factor
// cannot see.
TEST(PartitionStages, TrainingGraphsBalanceTheWholeStep) {
  Graph gpt = small_gpt(8);
  passes::TrainingOptions training_options;
  training_options.optimizer.kind = passes::OptimizerSpec::Kind::kAdam;
  auto training = passes::make_training_graph(gpt, training_options);
  ASSERT_TRUE(training.is_ok()) << training.status().to_string();
  constexpr int kMicro = 4;
  auto time = [](const Graph &g, NodeId id) {
    const std::string &name = g.node(id).name;
    return name.starts_with("layer0.") && name.find(".grad.") != std::string::npos ? 0.004 : 0.001;
  };
  auto once = [&](NodeId id) { return passes::is_step_op(training->node(id).op); };
  StagePartitionOptions options;
  options.node_time = time;
  options.microbatches = kMicro;
  auto scaled = partition_stages(*training, 4, options);
  ASSERT_TRUE(scaled.is_ok()) << scaled.status().to_string();
  EXPECT_EQ(layer_of(scaled->boundaries[0]), 1) << "forward times alone split evenly";

  options.whole_step_times = true;
  options.once_per_step = once;
  auto whole = partition_stages(*training, 4, options);
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  EXPECT_EQ(layer_of(whole->boundaries[0]), 0) << whole->boundaries[0];
  // Each stage's time is that of the nodes that run there (gradient sums at
  // a boundary may run on the next stage: they are the difference allowed).
  std::vector<double> slack(4, 0.0);
  auto step_times = [&](const StageAssignment &stages) {
    auto placed = assign_training_nodes(*training, stages);
    EXPECT_TRUE(placed.is_ok()) << placed.status().to_string();
    std::vector<double> times(4, 0.0);
    for (NodeId id = 0; placed.is_ok() && id < training->num_nodes(); ++id) {
      const auto s = static_cast<size_t>(placed->node_stage[id]);
      times[s] += time(*training, id) / (once(id) ? kMicro : 1);
      if (&stages == &*whole && training->node(id).name.ends_with(".grad.accumulate")) {
        slack[s] += time(*training, id);
        if (s > 0) slack[s - 1] += time(*training, id);
      }
    }
    return times;
  };
  const std::vector<double> times = step_times(*whole);
  for (size_t s = 0; s < 4; ++s)
    EXPECT_NEAR(whole->stages[s].compute_time, times[s], slack[s] + 1e-12) << "stage " << s;
  // The step's real bottleneck is lower than with the even split.
  const std::vector<double> even = step_times(*scaled);
  EXPECT_LT(*std::max_element(times.begin(), times.end()),
            0.9 * *std::max_element(even.begin(), even.end()));
}

TEST(PartitionStages, Gpt3Shape96LayersInto96Stages) {
  zoo::GptOptions options;
  options.layers = 96;
  options.hidden = 12288;
  options.heads = 96;
  options.seq = 2048;
  options.vocab = 50257;
  options.batch = 1;
  auto start = std::chrono::steady_clock::now();
  auto gpt = zoo::make_gpt(options);
  ASSERT_TRUE(gpt.is_ok()) << gpt.status().to_string();
  auto built = std::chrono::steady_clock::now();
  auto result = partition_stages(*gpt, 96);
  auto done = std::chrono::steady_clock::now();
  ASSERT_TRUE(result.is_ok()) << result.status().to_string();
  auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  std::printf("[ timing   ] gpt-175B shape: %zu forward nodes; build %.0f ms, partition into 96 "
              "stages %.0f ms\n",
              result->order.size(), ms(built - start), ms(done - built));
  for (size_t i = 0; i < result->order.size(); ++i) {
    int layer = layer_of(result->order_names[i]);
    if (layer >= 0) {
      ASSERT_EQ(result->node_stage[result->order[i]], layer) << result->order_names[i];
    }
  }
  for (const StageInfo &info : result->stages)
    EXPECT_GT(info.num_nodes, 0u);
}

} // namespace
} // namespace strata::partitioner
