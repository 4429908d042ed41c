// Where a model's or training plan's time goes: every node timed on the CPU
// executor (runtime::profile_node_times: median of several runs), summed per op
// type, largest first. Usage: op_profile FILE [TOP]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "runtime/cpu/executor.h"
#include "serialization/model_io.h"
#include "serialization/plan_io.h"

int main(int argc, char **argv) {
  using namespace strata;
  if (argc < 2) {
    std::fprintf(stderr, "usage: op_profile MODEL.strata|PLAN.splan [TOP]\n");
    return 2;
  }
  const std::string path = argv[1];
  const size_t top = argc > 2 ? static_cast<size_t>(std::atoi(argv[2])) : 12;
  Graph graph;
  if (serialization::file_is_plan(path)) {
    auto plan = serialization::load_plan(path);
    if (!plan.is_ok()) {
      std::fprintf(stderr, "%s\n", plan.status().message().c_str());
      return 1;
    }
    graph = std::move(plan->graph);
  } else {
    auto model = serialization::load_model(path);
    if (!model.is_ok()) {
      std::fprintf(stderr, "%s\n", model.status().message().c_str());
      return 1;
    }
    graph = std::move(*model);
  }
  auto times = runtime::profile_node_times(graph);
  if (!times.is_ok()) {
    std::fprintf(stderr, "%s\n", times.status().message().c_str());
    return 1;
  }
  std::map<std::string, std::pair<double, int>> by_op;
  double total = 0;
  for (size_t i = 0; i < times->size(); ++i) {
    auto &entry = by_op[graph.node(static_cast<NodeId>(i)).op];
    entry.first += (*times)[i];
    entry.second += 1;
    total += (*times)[i];
  }
  std::vector<std::pair<std::string, std::pair<double, int>>> rows(by_op.begin(), by_op.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto &a, const auto &b) { return a.second.first > b.second.first; });
  std::printf(
      "%s: %.1f ms per run in %zu nodes\n\n| op | nodes | ms | share |\n|---|---:|---:|---:|\n",
      path.c_str(), total * 1e3, times->size());
  for (size_t i = 0; i < rows.size() && i < top; ++i)
    std::printf("| %s | %d | %.2f | %.1f%% |\n", rows[i].first.c_str(), rows[i].second.second,
                rows[i].second.first * 1e3, 100 * rows[i].second.first / total);
  return 0;
}
