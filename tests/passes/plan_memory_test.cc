#include "passes/plan_memory.h"

#include <algorithm>
#include <numeric>

#include <gtest/gtest.h>

namespace strata::passes {
namespace {

// Graphs are built by hand, with made-up ops: the planner reads only the
// structure, never the op semantics.
class GraphMaker {
public:
  TensorId input(const std::string &name, int64_t floats) {
    TensorId id = add(name, floats, TensorKind::kInput);
    graph.add_input(id);
    return id;
  }
  TensorId parameter(const std::string &name, int64_t floats) {
    return add(name, floats, TensorKind::kParameter);
  }
  // A node reading `inputs` and writing one f32 tensor of `floats` elements.
  TensorId op(const std::string &name, std::vector<TensorId> inputs, int64_t floats) {
    return op_multi(name, std::move(inputs), {floats})[0];
  }
  std::vector<TensorId> op_multi(const std::string &name, std::vector<TensorId> inputs,
                                 std::vector<int64_t> output_floats) {
    Node node;
    node.name = name;
    node.op = "Fake";
    node.inputs.assign(inputs.begin(), inputs.end());
    std::vector<TensorId> outputs;
    for (size_t i = 0; i < output_floats.size(); ++i) {
      TensorId id = add(i == 0 ? name : name + ":" + std::to_string(i), output_floats[i],
                        TensorKind::kIntermediate);
      outputs.push_back(id);
      node.outputs.push_back(id);
    }
    EXPECT_TRUE(graph.add_node(std::move(node)).is_ok());
    return outputs;
  }
  void output(TensorId id) { graph.add_output(id); }

  std::vector<NodeId> order() const {
    auto order = graph.topological_order();
    EXPECT_TRUE(order.is_ok()) << order.status().to_string();
    return *order;
  }

  Graph graph{"test"};

private:
  TensorId add(const std::string &name, int64_t floats, TensorKind kind) {
    Tensor t;
    t.name = name;
    t.type = {DType::kF32, {floats}};
    t.kind = kind;
    if (kind == TensorKind::kParameter) t.initializer.kind = Initializer::Kind::kZeros;
    auto id = graph.add_tensor(std::move(t));
    EXPECT_TRUE(id.is_ok());
    return *id;
  }
};

// Recomputes lifetimes from scratch and checks the plan against them: every
// intermediate is placed, aligned and inside the arena; nothing else is placed;
// and no two tensors whose lifetimes meet share a byte.
void check_plan(const Graph &graph, const std::vector<NodeId> &order, const MemoryPlan &plan,
                int64_t alignment) {
  ASSERT_EQ(plan.offsets.size(), graph.num_tensors());
  const auto n = static_cast<int64_t>(order.size());
  std::vector<int64_t> born(graph.num_tensors(), -1), dies(graph.num_tensors(), -1);
  for (int64_t step = 0; step < n; ++step) {
    const Node &node = graph.node(order[step]);
    for (TensorId out : node.outputs)
      born[out] = dies[out] = step;
  }
  for (int64_t step = 0; step < n; ++step)
    for (TensorId in : graph.node(order[step]).inputs)
      dies[in] = std::max(dies[in], step);
  for (TensorId out : graph.outputs())
    dies[out] = n + 1;

  int64_t naive = 0;
  std::vector<TensorId> planned;
  for (TensorId id = 0; id < graph.num_tensors(); ++id) {
    const Tensor &t = graph.tensor(id);
    if (t.kind != TensorKind::kIntermediate) {
      EXPECT_EQ(plan.offsets[id], -1) << t.name;
      continue;
    }
    const int64_t offset = plan.offsets[id];
    EXPECT_GE(offset, 0) << t.name;
    EXPECT_EQ(offset % alignment, 0) << t.name;
    EXPECT_LE(offset + t.type.size_bytes(), plan.arena_bytes) << t.name;
    naive += (t.type.size_bytes() + alignment - 1) / alignment * alignment;
    planned.push_back(id);
  }
  EXPECT_EQ(plan.naive_bytes, naive);
  EXPECT_LE(plan.arena_bytes, plan.naive_bytes);
  for (size_t i = 0; i < planned.size(); ++i)
    for (size_t j = i + 1; j < planned.size(); ++j) {
      TensorId a = planned[i], b = planned[j];
      const bool live_together = born[a] <= dies[b] && born[b] <= dies[a];
      const int64_t a_end = plan.offsets[a] + graph.tensor(a).type.size_bytes();
      const int64_t b_end = plan.offsets[b] + graph.tensor(b).type.size_bytes();
      const bool bytes_meet = plan.offsets[a] < b_end && plan.offsets[b] < a_end;
      EXPECT_FALSE(live_together && bytes_meet)
          << graph.tensor(a).name << " and " << graph.tensor(b).name << " overlap";
    }
}

TEST(PlanMemory, LongChainOfEqualTensorsNeedsTwoBuffers) {
  GraphMaker m;
  TensorId x = m.input("x", 64); // 256 bytes
  for (int i = 0; i < 20; ++i)
    x = m.op("n" + std::to_string(i), {x}, 64);
  m.output(x);
  auto order = m.order();
  auto plan = plan_memory(m.graph, order);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  check_plan(m.graph, order, *plan, 64);
  EXPECT_EQ(plan->arena_bytes, 2 * 256);
  EXPECT_EQ(plan->naive_bytes, 20 * 256);
  EXPECT_LT(plan->arena_bytes, plan->naive_bytes);
}

TEST(PlanMemory, NodeOutputNeverSharesBytesWithItsInput) {
  GraphMaker m;
  TensorId x = m.input("x", 16);
  TensorId a = m.op("a", {x}, 16);
  TensorId b = m.op("b", {a}, 16);
  m.output(b);
  auto order = m.order();
  auto plan = plan_memory(m.graph, order);
  ASSERT_TRUE(plan.is_ok());
  EXPECT_NE(plan->offsets[a], plan->offsets[b]);
  check_plan(m.graph, order, *plan, 64);
}

// Nodes a backend runs as one kernel at the last one's step (runs_at): what
// the kernel reads stays untouched until then, even where a node between
// would otherwise reuse its bytes.
TEST(PlanMemory, NodesRunLaterKeepTheirInputsUntilThen) {
  GraphMaker m;
  TensorId x = m.input("x", 16);
  TensorId e = m.op("e", {x}, 16);     // read by `first` only
  TensorId f = m.op("first", {e}, 16); // a chain: first, then second
  TensorId c = m.op("other", {x}, 16); // unrelated, between them
  TensorId g = m.op("second", {f, c}, 16);
  m.output(g);
  const std::vector<NodeId> order = {0, 1, 2, 3}; // e, first, other, second
  auto plain = plan_memory(m.graph, order);
  ASSERT_TRUE(plain.is_ok());
  // Run in order, `other` may take e's bytes once `first` has read them...
  EXPECT_EQ(plain->offsets[c], plain->offsets[e]);
  // ...but not when `first` runs at `second`'s step.
  auto fused = plan_memory(m.graph, order, 64, std::vector<int64_t>{0, 3, 2, 3});
  ASSERT_TRUE(fused.is_ok());
  EXPECT_NE(fused->offsets[c], fused->offsets[e]);
  EXPECT_NE(fused->offsets[g], fused->offsets[e]);
  EXPECT_NE(fused->offsets[g], fused->offsets[c]);
  EXPECT_FALSE(plan_memory(m.graph, order, 64, std::vector<int64_t>{0, 3}).is_ok());
}

TEST(PlanMemory, Diamond) {
  GraphMaker m;
  TensorId x = m.input("x", 100);
  TensorId top = m.op("top", {x}, 100);
  TensorId left = m.op("left", {top}, 300);
  TensorId right = m.op("right", {top}, 50);
  TensorId join = m.op("join", {left, right}, 100);
  TensorId after = m.op("after", {join}, 100);
  m.output(after);
  auto order = m.order();
  auto plan = plan_memory(m.graph, order);
  ASSERT_TRUE(plan.is_ok());
  check_plan(m.graph, order, *plan, 64);
  // `top` is read until `right` runs, so `left` and `right` can't take its place...
  EXPECT_NE(plan->offsets[top], plan->offsets[left]);
  // ...but `after` may reuse the bytes of `left` once `join` has read it.
  EXPECT_LT(plan->arena_bytes, plan->naive_bytes);
}

TEST(PlanMemory, GraphOutputsAreNeverOverwritten) {
  GraphMaker m;
  TensorId x = m.input("x", 64);
  TensorId early = m.op("early", {x}, 64); // an output, also read by the next node
  m.output(early);
  TensorId y = early;
  for (int i = 0; i < 6; ++i)
    y = m.op("n" + std::to_string(i), {y}, 64);
  m.output(y);
  auto order = m.order();
  auto plan = plan_memory(m.graph, order);
  ASSERT_TRUE(plan.is_ok());
  check_plan(m.graph, order, *plan, 64);
  // `early` stays live to the end, so no later tensor sits on its bytes.
  for (TensorId id = 0; id < m.graph.num_tensors(); ++id)
    if (id != early && m.graph.tensor(id).kind == TensorKind::kIntermediate) {
      EXPECT_NE(plan->offsets[id], plan->offsets[early]) << m.graph.tensor(id).name;
    }
  EXPECT_EQ(plan->arena_bytes, 3 * 256);
}

TEST(PlanMemory, ParametersAndInputsAreNotPlanned) {
  GraphMaker m;
  TensorId x = m.input("x", 8);
  TensorId w = m.parameter("w", 8);
  TensorId y = m.op("y", {x, w}, 8);
  m.output(y);
  auto plan = plan_memory(m.graph, m.order());
  ASSERT_TRUE(plan.is_ok());
  EXPECT_EQ(plan->offsets[x], -1);
  EXPECT_EQ(plan->offsets[w], -1);
  EXPECT_EQ(plan->offsets[y], 0);
  EXPECT_EQ(plan->arena_bytes, 64);
}

TEST(PlanMemory, MultipleOutputsAndUnreadOutputsGetTheirOwnBytes) {
  GraphMaker m;
  TensorId x = m.input("x", 32);
  auto split = m.op_multi("split", {x}, {32, 32, 32}); // the third is never read
  TensorId sum = m.op("sum", {split[0], split[1]}, 32);
  TensorId tail = m.op("tail", {sum}, 32);
  m.output(tail);
  auto order = m.order();
  auto plan = plan_memory(m.graph, order);
  ASSERT_TRUE(plan.is_ok());
  check_plan(m.graph, order, *plan, 64);
  EXPECT_NE(plan->offsets[split[0]], plan->offsets[split[2]]);
  EXPECT_NE(plan->offsets[split[1]], plan->offsets[split[2]]);
}

TEST(PlanMemory, ZeroSizeTensorsAreFine) {
  GraphMaker m;
  TensorId x = m.input("x", 0);
  TensorId a = m.op("a", {x}, 0);
  TensorId b = m.op("b", {a}, 16);
  m.output(b);
  auto order = m.order();
  auto plan = plan_memory(m.graph, order);
  ASSERT_TRUE(plan.is_ok());
  check_plan(m.graph, order, *plan, 64);
  EXPECT_EQ(plan->arena_bytes, 64);
}

TEST(PlanMemory, AlignmentIsHonoured) {
  GraphMaker m;
  TensorId x = m.input("x", 3);
  TensorId a = m.op("a", {x}, 3); // 12 bytes
  TensorId b = m.op("b", {a}, 5);
  TensorId c = m.op("c", {a, b}, 7);
  m.output(c);
  auto order = m.order();
  for (int64_t alignment : {1, 16, 64, 256}) {
    auto plan = plan_memory(m.graph, order, alignment);
    ASSERT_TRUE(plan.is_ok());
    check_plan(m.graph, order, *plan, alignment);
  }
  EXPECT_FALSE(plan_memory(m.graph, order, 48).is_ok());
  EXPECT_FALSE(plan_memory(m.graph, order, 0).is_ok());
}

// A wider random DAG checked exhaustively, several seeds.
TEST(PlanMemory, RandomDagsHaveNoLiveOverlap) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    GraphMaker m;
    uint32_t state = seed;
    auto next = [&] {
      state = state * 1664525u + 1013904223u;
      return state >> 8;
    };
    std::vector<TensorId> values = {m.input("x", 16)};
    for (int i = 0; i < 40; ++i) {
      std::vector<TensorId> ins = {values[next() % values.size()]};
      if (next() % 2) ins.push_back(values[next() % values.size()]);
      values.push_back(m.op("n" + std::to_string(i), ins, 1 + next() % 200));
    }
    m.output(values.back());
    m.output(values[values.size() / 2]);
    auto order = m.order();
    auto plan = plan_memory(m.graph, order);
    ASSERT_TRUE(plan.is_ok());
    check_plan(m.graph, order, *plan, 64);
    // Deterministic: the same graph and order plan the same way.
    auto again = plan_memory(m.graph, order);
    ASSERT_TRUE(again.is_ok());
    EXPECT_EQ(plan->offsets, again->offsets);
    EXPECT_EQ(plan->arena_bytes, again->arena_bytes);
  }
}

TEST(PlanMemory, OrderMustBeAPermutation) {
  GraphMaker m;
  TensorId x = m.input("x", 4);
  TensorId a = m.op("a", {x}, 4);
  TensorId b = m.op("b", {a}, 4);
  m.output(b);
  EXPECT_FALSE(plan_memory(m.graph, std::vector<NodeId>{0}).is_ok());       // missing
  EXPECT_FALSE(plan_memory(m.graph, std::vector<NodeId>{0, 0}).is_ok());    // repeated
  EXPECT_FALSE(plan_memory(m.graph, std::vector<NodeId>{0, 7}).is_ok());    // out of range
  EXPECT_FALSE(plan_memory(m.graph, std::vector<NodeId>{0, 1, 1}).is_ok()); // too long
  auto reversed = plan_memory(m.graph, std::vector<NodeId>{1, 0});          // not topological
  ASSERT_FALSE(reversed.is_ok());
  EXPECT_NE(reversed.status().message().find("'b'"), std::string::npos)
      << reversed.status().message();
  auto repeated = plan_memory(m.graph, std::vector<NodeId>{1, 1});
  ASSERT_FALSE(repeated.is_ok());
  EXPECT_NE(repeated.status().message().find("twice"), std::string::npos);
  EXPECT_TRUE(plan_memory(m.graph, std::vector<NodeId>{0, 1}).is_ok());
}

} // namespace
} // namespace strata::passes
