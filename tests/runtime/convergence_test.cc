// Training learns: the zoo MLP, a small zoo convnet and a small 2-layer GPT,
// trained by runtime::Trainer on the synthetic task (a few fixed random batches,
// cycled), each with SGD and AdamW. The mean loss over the last pass through the
// batches must end well below the mean over the first pass.
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "passes/make_training.h"
#include "runtime/trainer.h"
#include "tools/zoo.h"

namespace strata::runtime {
namespace {

constexpr int64_t kBatches = 4;

struct Case {
  std::string model;
  std::string optimizer;
  int64_t steps;
};

Graph forward_graph(const std::string &model) {
  Result<Graph> graph = invalid_argument("unknown model ", model);
  if (model == "mlp") {
    zoo::MlpOptions o;
    o.batch = 16;
    o.input = 32;
    o.hidden = {64};
    o.classes = 4;
    graph = zoo::make_mlp(o);
  } else if (model == "convnet") {
    zoo::ConvnetOptions o;
    o.batch = 8;
    o.image_size = 8;
    o.channels = {8, 16};
    o.fc_hidden = 32;
    o.classes = 4;
    graph = zoo::make_convnet(o);
  } else if (model == "gpt") {
    zoo::GptOptions o;
    o.layers = 2;
    o.hidden = 32;
    o.heads = 2;
    o.seq = 8;
    o.vocab = 16;
    o.batch = 4;
    graph = zoo::make_gpt(o);
  }
  EXPECT_TRUE(graph.is_ok()) << graph.status().message();
  return std::move(graph).value();
}

double mean(const std::vector<double> &values, size_t begin, size_t end) {
  return std::accumulate(values.begin() + static_cast<std::ptrdiff_t>(begin),
                         values.begin() + static_cast<std::ptrdiff_t>(end), 0.0) /
         static_cast<double>(end - begin);
}

class ConvergenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(ConvergenceTest, LossFalls) {
  const Case &c = GetParam();
  passes::TrainingOptions options;
  auto spec = passes::parse_optimizer(c.optimizer);
  ASSERT_TRUE(spec.is_ok()) << spec.status().message();
  options.optimizer = *spec;
  auto training = passes::make_training_graph(forward_graph(c.model), options);
  ASSERT_TRUE(training.is_ok()) << training.status().message();
  Graph graph = std::move(training).value();
  Dataset data = synthetic_dataset(graph, 7, kBatches);
  auto trainer = Trainer::create(std::move(graph), "loss", std::move(data));
  ASSERT_TRUE(trainer.is_ok()) << trainer.status().message();

  std::vector<double> losses;
  for (int64_t step = 0; step < c.steps; ++step) {
    auto loss = (*trainer)->train_step();
    ASSERT_TRUE(loss.is_ok()) << "step " << step << ": " << loss.status().message();
    ASSERT_TRUE(std::isfinite(*loss)) << "step " << step << ": loss " << *loss;
    losses.push_back(*loss);
  }
  EXPECT_EQ((*trainer)->step(), c.steps);
  // One full pass through the batches at each end, so batch-to-batch spread cancels.
  const double first = mean(losses, 0, kBatches);
  const double last = mean(losses, losses.size() - kBatches, losses.size());
  EXPECT_LT(last, 0.7 * first) << c.model << " with " << c.optimizer << ": first pass " << first
                               << ", last pass " << last;
  std::printf("[ loss     ] %s %s: %lld steps, first pass %.4f, last pass %.4f (%.2fx)\n",
              c.model.c_str(), c.optimizer.c_str(), static_cast<long long>(c.steps), first, last,
              last / first);
}

INSTANTIATE_TEST_SUITE_P(ZooModels, ConvergenceTest,
                         ::testing::Values(Case{"mlp", "sgd:lr=0.05,momentum=0.9", 60},
                                           Case{"mlp", "adamw:lr=0.01", 60},
                                           Case{"convnet", "sgd:lr=0.05,momentum=0.9", 100},
                                           Case{"convnet", "adamw:lr=0.01", 100},
                                           Case{"gpt", "sgd:lr=0.1,momentum=0.9", 200},
                                           Case{"gpt", "adamw:lr=0.01", 200}),
                         [](const ::testing::TestParamInfo<Case> &info) {
                           return info.param.model + "_" +
                                  info.param.optimizer.substr(0, info.param.optimizer.find(':'));
                         });

} // namespace
} // namespace strata::runtime
