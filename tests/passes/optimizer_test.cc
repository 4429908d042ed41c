// Tests of the optimizer pass (passes/optimizer.cc): parsing and printing of
// optimizer specs, the state, nodes and updates append_optimizer adds, and
// training steps run by the CPU executor against PyTorch's numbers.
#include <cmath>
#include <cstring>
#include <limits>

#include <gtest/gtest.h>

#include "graph/verifier.h"
#include "ops/registry.h"
#include "passes/optimizer.h"
#include "runtime/cpu/executor.h"

namespace strata {
namespace {

using passes::append_optimizer;
using passes::Gradient;
using passes::OptimizerSpec;
using passes::parse_optimizer;

void expect_error(const Status &status, std::initializer_list<std::string_view> parts) {
  ASSERT_FALSE(status.is_ok()) << "expected an error";
  for (std::string_view part : parts)
    EXPECT_NE(status.message().find(part), std::string::npos)
        << "message \"" << status.message() << "\" lacks \"" << part << "\"";
}

void expect_same_spec(const OptimizerSpec &a, const OptimizerSpec &b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.lr, b.lr);
  EXPECT_EQ(a.momentum, b.momentum);
  EXPECT_EQ(a.nesterov, b.nesterov);
  EXPECT_EQ(a.weight_decay, b.weight_decay);
  EXPECT_EQ(a.beta1, b.beta1);
  EXPECT_EQ(a.beta2, b.beta2);
  EXPECT_EQ(a.epsilon, b.epsilon);
  EXPECT_EQ(a.schedule, b.schedule);
  EXPECT_EQ(a.warmup_steps, b.warmup_steps);
  EXPECT_EQ(a.total_steps, b.total_steps);
  EXPECT_EQ(a.min_lr, b.min_lr);
  EXPECT_EQ(a.clip_norm, b.clip_norm);
}

TEST(ParseOptimizerTest, ReadsEveryKey) {
  auto adamw = parse_optimizer("adamw:lr=0.0003,wd=0.1,beta1=0.9,beta2=0.95,eps=1e-8,warmup=100,"
                               "schedule=cosine,total=1000,min_lr=0,clip=1");
  ASSERT_TRUE(adamw.is_ok()) << adamw.status().to_string();
  EXPECT_EQ(adamw->kind, OptimizerSpec::Kind::kAdamW);
  EXPECT_EQ(adamw->lr, 0.0003);
  EXPECT_EQ(adamw->weight_decay, 0.1);
  EXPECT_EQ(adamw->beta2, 0.95);
  EXPECT_EQ(adamw->epsilon, 1e-8);
  EXPECT_EQ(adamw->warmup_steps, 100);
  EXPECT_EQ(adamw->schedule, OptimizerSpec::Schedule::kCosine);
  EXPECT_EQ(adamw->total_steps, 1000);
  EXPECT_EQ(adamw->clip_norm, 1.0);

  auto sgd = parse_optimizer("sgd:lr=0.5,momentum=0.9,nesterov=1,wd=1e-4");
  ASSERT_TRUE(sgd.is_ok()) << sgd.status().to_string();
  EXPECT_EQ(sgd->kind, OptimizerSpec::Kind::kSgd);
  EXPECT_EQ(sgd->momentum, 0.9);
  EXPECT_TRUE(sgd->nesterov);
  EXPECT_EQ(sgd->weight_decay, 1e-4);

  auto plain = parse_optimizer("adam");
  ASSERT_TRUE(plain.is_ok()) << plain.status().to_string();
  expect_same_spec(*plain, OptimizerSpec{.kind = OptimizerSpec::Kind::kAdam});
}

TEST(ParseOptimizerTest, ErrorsNameTheKeyOrValue) {
  expect_error(parse_optimizer("rmsprop:lr=1").status(), {"unknown optimizer 'rmsprop'", "sgd"});
  expect_error(parse_optimizer("adamw:lrr=0.1").status(),
               {"optimizer 'adamw': unknown key 'lrr' (keys: lr, wd, beta1", "clip)"});
  expect_error(parse_optimizer("adam:momentum=0.9").status(), {"unknown key 'momentum'"});
  expect_error(parse_optimizer("sgd:beta1=0.9").status(), {"unknown key 'beta1'", "momentum"});
  expect_error(parse_optimizer("sgd:lr=abc").status(), {"optimizer 'sgd'", "lr='abc'", "number"});
  expect_error(parse_optimizer("sgd:lr=0").status(), {"lr must be positive"});
  expect_error(parse_optimizer("sgd:lr=-1").status(), {"lr must be positive"});
  expect_error(parse_optimizer("sgd:lr=0.1,lr=0.2").status(), {"'lr' is given twice"});
  expect_error(parse_optimizer("sgd:nesterov=2").status(), {"nesterov='2'", "0 or 1"});
  expect_error(parse_optimizer("sgd:nesterov=1").status(), {"nesterov needs momentum"});
  expect_error(parse_optimizer("sgd:warmup=1.5").status(), {"warmup='1.5'", "integer"});
  expect_error(parse_optimizer("adam:schedule=step").status(), {"schedule='step'"});
  expect_error(parse_optimizer("adam:schedule=cosine,warmup=10").status(),
               {"schedule=cosine needs total"});
  expect_error(parse_optimizer("adam:beta2=1").status(), {"beta2"});
  expect_error(parse_optimizer("adam:lr").status(), {"'lr' is not key=value"});
  expect_error(parse_optimizer("adam:lr=0.1,").status(), {"trailing ','"});
  expect_error(parse_optimizer("adam:").status(), {"nothing after ':'"});
  expect_error(parse_optimizer("adam:clip=-1").status(), {"clip must be >= 0"});
}

// Values that would train on NaN or against the schedule are refused, naming
// the option and the value: an eps of 0 divides by zero where a second
// moment is still 0, and a cosine schedule cannot decay from lr up to a
// larger min_lr.
TEST(ParseOptimizerTest, RefusesValuesOutsideTheirRange) {
  expect_error(parse_optimizer("adamw:eps=0").status(),
               {"optimizer 'adamw': eps must be positive, got 0"});
  expect_error(parse_optimizer("adam:eps=-1e-8").status(),
               {"optimizer 'adam': eps must be positive, got -1e-08"});
  expect_error(parse_optimizer("adam:lr=0.001,schedule=cosine,total=10,min_lr=0.01").status(),
               {"optimizer 'adam': min_lr must be at most lr, got min_lr=0.01 and lr=0.001"});
  expect_error(parse_optimizer("sgd:lr=0.1,min_lr=0.2").status(),
               {"min_lr must be at most lr, got min_lr=0.2 and lr=0.1"});
  expect_error(parse_optimizer("adamw:wd=-0.1").status(), {"wd must be >= 0, got -0.1"});
  expect_error(parse_optimizer("adam:beta1=-0.5").status(), {"beta1 must be in [0, 1), got -0.5"});
  expect_error(parse_optimizer("adam:eps=nan").status(), {"eps='nan' is not a number"});
  EXPECT_TRUE(parse_optimizer("adam:lr=0.01,schedule=cosine,total=10,min_lr=0.01").is_ok());
}

// torch.optim's defaults: weight decay 0, but 0.01 for AdamW.
TEST(ParseOptimizerTest, DefaultsAreTorchs) {
  EXPECT_EQ(parse_optimizer("adamw:lr=1e-3")->weight_decay, 0.01);
  EXPECT_EQ(parse_optimizer("adamw:lr=1e-3,wd=0")->weight_decay, 0.0);
  EXPECT_EQ(parse_optimizer("adam:lr=1e-3")->weight_decay, 0.0);
  EXPECT_EQ(parse_optimizer("sgd:lr=1e-3")->weight_decay, 0.0);
  const OptimizerSpec adamw = *parse_optimizer("adamw");
  EXPECT_EQ(adamw.beta1, 0.9);
  EXPECT_EQ(adamw.beta2, 0.999);
  EXPECT_EQ(adamw.epsilon, 1e-8);
  EXPECT_NE(adamw.to_string().find(",wd=0.01,"), std::string::npos) << adamw.to_string();
}

TEST(ParseOptimizerTest, ToStringRoundTrips) {
  for (const char *text :
       {"sgd", "adam", "adamw", "sgd:lr=0.1,momentum=0.9,nesterov=1,wd=0.01",
        "adamw:lr=0.0003,wd=0.1,beta1=0.9,beta2=0.95,eps=1e-8,warmup=100,schedule=cosine,"
        "total=1000,min_lr=1e-5,clip=1",
        "adam:lr=0.123456789012345,wd=3.3e-7,warmup=7,clip=0.25"}) {
    auto spec = parse_optimizer(text);
    ASSERT_TRUE(spec.is_ok()) << text << ": " << spec.status().to_string();
    const std::string canonical = spec->to_string();
    auto again = parse_optimizer(canonical);
    ASSERT_TRUE(again.is_ok()) << canonical << ": " << again.status().to_string();
    expect_same_spec(*spec, *again);
    EXPECT_EQ(again->to_string(), canonical);
  }
  EXPECT_EQ(parse_optimizer("sgd:momentum=0.9,lr=0.1")->to_string(),
            "sgd:lr=0.1,momentum=0.9,nesterov=0,wd=0,warmup=0,schedule=constant,total=0,min_lr=0,"
            "clip=0");
}

// ---------------------------------------------------------------------------
// Graphs whose gradients are fed as inputs (no autodiff needed)

constexpr float kW0[6] = {0.5f, -1.0f, 0.25f, 2.0f, -0.75f, 1.5f};
constexpr float kB0[3] = {0.1f, -0.3f, 0.2f};

HostTensor f32_tensor(Shape shape, const std::vector<float> &values) {
  HostTensor t = HostTensor::zeros(TensorType{DType::kF32, std::move(shape)});
  std::memcpy(t.data(), values.data(), values.size() * sizeof(float));
  return t;
}

// The gradients fed at `step`: the same as grads() in optimizer_reference.py.
std::vector<HostTensor> gradient_for(int step) {
  std::vector<float> gw, gb;
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 3; ++c)
      gw.push_back(static_cast<float>(((r * 3 + c) % 5 - 2) * 0.5 + 0.25 * step));
  for (int c = 0; c < 3; ++c)
    gb.push_back(static_cast<float>((c - 1) * 0.75 - 0.5 * step));
  return {f32_tensor({2, 3}, gw), f32_tensor({3}, gb)};
}

struct FedGraph {
  Graph graph;
  TensorId w, b;
  std::vector<Gradient> gradients;
};

// Parameters w [2, 3] and b [3] with inline data; their gradients are graph
// inputs; the output is a stand-in loss.
FedGraph fed_graph() {
  GraphBuilder builder("fed", ops::OpRegistry::global());
  TensorId w = builder.parameter("w", DType::kF32, {2, 3}, Blob::copy_of(kW0, sizeof kW0));
  TensorId b = builder.parameter("b", DType::kF32, {3}, Blob::copy_of(kB0, sizeof kB0));
  TensorId gw = builder.input("grad_w", DType::kF32, {2, 3});
  TensorId gb = builder.input("grad_b", DType::kF32, {3});
  TensorId loss =
      builder.op1("ReduceSum", {builder.op1("Add", {w, b})}, {{"keepdims", int64_t{0}}}, "loss");
  builder.output(loss);
  auto graph = std::move(builder).finish();
  EXPECT_TRUE(graph.is_ok()) << graph.status().to_string();
  return FedGraph{std::move(graph).value(), w, b, {{w, gw}, {b, gb}}};
}

std::vector<float> values_of(const HostTensor &t) {
  const int64_t n = t.type.num_elements();
  return std::vector<float>(t.as<float>(), t.as<float>() + n);
}

TEST(AppendOptimizerTest, AddsStateNodesAndUpdates) {
  FedGraph fed = fed_graph();
  const size_t tensors_before = fed.graph.num_tensors();
  auto spec = parse_optimizer("adamw:lr=0.01,wd=0.1,clip=1");
  ASSERT_TRUE(spec.is_ok());
  ASSERT_TRUE(append_optimizer(fed.graph, fed.gradients, *spec).is_ok());
  const Graph &g = fed.graph;
  EXPECT_TRUE(verify_graph(g, ops::OpRegistry::global()).is_ok());
  EXPECT_GT(g.num_tensors(), tensors_before);

  auto expect_state = [&](std::string_view name, const TensorType &type) {
    auto id = g.find_tensor(name);
    ASSERT_TRUE(id.has_value()) << name;
    const Tensor &t = g.tensor(*id);
    EXPECT_EQ(t.kind, TensorKind::kState) << name;
    EXPECT_EQ(t.type.to_string(), type.to_string()) << name;
    EXPECT_EQ(t.initializer.kind, Initializer::Kind::kZeros) << name;
    EXPECT_EQ(t.producer, kNoNode) << name;
  };
  expect_state("optimizer.step", TensorType{DType::kI64, {}});
  expect_state("w.adam_m", TensorType{DType::kF32, {2, 3}});
  expect_state("w.adam_v", TensorType{DType::kF32, {2, 3}});
  expect_state("b.adam_m", TensorType{DType::kF32, {3}});
  expect_state("b.adam_v", TensorType{DType::kF32, {3}});
  EXPECT_FALSE(g.find_tensor("w.momentum").has_value());

  for (const char *node : {"optimizer.lr", "optimizer.clip_scale", "optimizer.next_step",
                           "w.update", "b.update", "w.clipped_grad"})
    EXPECT_TRUE(g.find_node(node).has_value()) << node;
  EXPECT_EQ(g.node(*g.find_node("optimizer.lr")).op, "LearningRate");
  EXPECT_EQ(g.node(*g.find_node("w.update")).op, "AdamUpdate");
  EXPECT_EQ(g.node(*g.find_node("w.update")).int_attr("decoupled"), 1);
  EXPECT_EQ(g.node(*g.find_node("optimizer.clip_scale")).op, "GlobalNormScale");

  // w, w.adam_m, w.adam_v, b, b.adam_m, b.adam_v and the step.
  ASSERT_EQ(g.updates().size(), 7u);
  std::vector<std::string> targets;
  for (const StateUpdate &u : g.updates())
    targets.push_back(g.tensor(u.target).name);
  EXPECT_EQ(targets, (std::vector<std::string>{"w", "w.adam_m", "w.adam_v", "b", "b.adam_m",
                                               "b.adam_v", "optimizer.step"}));
  // The graph's outputs are unchanged.
  ASSERT_EQ(g.outputs().size(), 1u);
  EXPECT_EQ(g.tensor(g.outputs()[0]).name, "loss");
}

TEST(AppendOptimizerTest, SgdStateDependsOnMomentum) {
  FedGraph plain = fed_graph();
  ASSERT_TRUE(
      append_optimizer(plain.graph, plain.gradients, *parse_optimizer("sgd:lr=0.1")).is_ok());
  EXPECT_FALSE(plain.graph.find_tensor("w.momentum").has_value());
  EXPECT_EQ(plain.graph.updates().size(), 3u);
  EXPECT_FALSE(plain.graph.find_node("optimizer.clip_scale").has_value());

  FedGraph momentum = fed_graph();
  ASSERT_TRUE(append_optimizer(momentum.graph, momentum.gradients,
                               *parse_optimizer("sgd:lr=0.1,momentum=0.9"))
                  .is_ok());
  EXPECT_TRUE(momentum.graph.find_tensor("w.momentum").has_value());
  EXPECT_TRUE(momentum.graph.find_tensor("b.momentum").has_value());
  EXPECT_EQ(momentum.graph.updates().size(), 5u);
  EXPECT_TRUE(verify_graph(momentum.graph, ops::OpRegistry::global()).is_ok());
}

// A snapshot of what append_optimizer may change.
struct GraphSize {
  size_t tensors, nodes, updates, outputs;
  bool operator==(const GraphSize &) const = default;
};
GraphSize size_of(const Graph &g) {
  return {g.num_tensors(), g.num_nodes(), g.updates().size(), g.outputs().size()};
}

TEST(AppendOptimizerTest, FailureLeavesTheGraphUnchanged) {
  const OptimizerSpec adam = *parse_optimizer("adam");
  {
    // A clash with a state name is found only after some tensors were added.
    FedGraph fed = fed_graph();
    GraphBuilder builder(std::move(fed.graph), ops::OpRegistry::global());
    builder.parameter("b.adam_v", DType::kF32, {3}, Initializer{Initializer::Kind::kZeros});
    fed.graph = std::move(builder).finish().value();
    const GraphSize before = size_of(fed.graph);
    Status status = append_optimizer(fed.graph, fed.gradients, adam);
    expect_error(status, {"b.adam_v"});
    EXPECT_EQ(size_of(fed.graph), before);
    EXPECT_FALSE(fed.graph.find_tensor("optimizer.step").has_value());
  }
  {
    FedGraph fed = fed_graph();
    const GraphSize before = size_of(fed.graph);
    std::vector<Gradient> wrong = {{fed.w, fed.gradients[1].gradient}};
    expect_error(append_optimizer(fed.graph, wrong, adam), {"grad_b", "'w'", "[2, 3]"});
    std::vector<Gradient> not_param = {{fed.gradients[0].gradient, fed.gradients[0].gradient}};
    expect_error(append_optimizer(fed.graph, not_param, adam), {"grad_w", "input", "parameter"});
    std::vector<Gradient> twice = {fed.gradients[0], fed.gradients[0]};
    expect_error(append_optimizer(fed.graph, twice, adam), {"'w'", "two gradients"});
    expect_error(append_optimizer(fed.graph, {}, adam), {"no gradients"});
    OptimizerSpec bad = adam;
    bad.lr = 0;
    expect_error(append_optimizer(fed.graph, fed.gradients, bad), {"lr must be positive"});
    EXPECT_EQ(size_of(fed.graph), before);
  }
  {
    // A second optimizer on the same graph is refused.
    FedGraph fed = fed_graph();
    ASSERT_TRUE(append_optimizer(fed.graph, fed.gradients, adam).is_ok());
    const GraphSize before = size_of(fed.graph);
    expect_error(append_optimizer(fed.graph, fed.gradients, adam), {"already has an optimizer"});
    EXPECT_EQ(size_of(fed.graph), before);
  }
}

// A spec built in code, not parsed, is checked as parse_optimizer checks
// one: NaN and infinite values too, which the parser never reads.
TEST(AppendOptimizerTest, RefusesSpecsOutsideTheirRange) {
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  const struct {
    double OptimizerSpec::*field;
    double value;
    const char *cause;
  } edits[] = {
      {&OptimizerSpec::lr, nan, "optimizer 'adam': lr must be positive, got nan"},
      {&OptimizerSpec::epsilon, nan, "optimizer 'adam': eps must be positive, got nan"},
      {&OptimizerSpec::epsilon, 0.0, "optimizer 'adam': eps must be positive, got 0"},
      {&OptimizerSpec::epsilon, inf, "optimizer 'adam': eps must be positive, got inf"},
      {&OptimizerSpec::beta2, nan, "optimizer 'adam': beta2 must be in [0, 1), got nan"},
      {&OptimizerSpec::weight_decay, inf, "optimizer 'adam': wd must be >= 0, got inf"},
      {&OptimizerSpec::clip_norm, inf, "optimizer 'adam': clip must be >= 0, got inf"},
      {&OptimizerSpec::min_lr, 1.0,
       "optimizer 'adam': min_lr must be at most lr, got min_lr=1 and lr=0.001"},
  };
  FedGraph fed = fed_graph();
  const GraphSize before = size_of(fed.graph);
  for (const auto &edit : edits) {
    OptimizerSpec spec = *parse_optimizer("adam");
    spec.*edit.field = edit.value;
    expect_error(append_optimizer(fed.graph, fed.gradients, spec), {edit.cause});
  }
  EXPECT_EQ(size_of(fed.graph), before);
}

// Runs three steps of `spec` on the fed graph; returns w and b after each.
std::vector<std::vector<float>> run_three_steps(const std::string &spec_text,
                                                std::vector<int64_t> *steps = nullptr,
                                                std::vector<float> *lrs = nullptr) {
  std::vector<std::vector<float>> result;
  FedGraph fed = fed_graph();
  auto spec = parse_optimizer(spec_text);
  EXPECT_TRUE(spec.is_ok()) << spec.status().to_string();
  if (!spec.is_ok()) return result;
  Status status = append_optimizer(fed.graph, fed.gradients, *spec);
  EXPECT_TRUE(status.is_ok()) << status.to_string();
  if (!status.is_ok()) return result;
  const TensorId step = *fed.graph.find_tensor("optimizer.step");
  fed.graph.add_output(*fed.graph.find_tensor("optimizer.lr"));
  auto executor = runtime::CpuExecutor::create(std::move(fed.graph));
  EXPECT_TRUE(executor.is_ok()) << executor.status().to_string();
  if (!executor.is_ok()) return result;
  for (int s = 0; s < 3; ++s) {
    std::vector<HostTensor> outputs;
    status = (*executor)->run(gradient_for(s), &outputs);
    EXPECT_TRUE(status.is_ok()) << status.to_string();
    if (!status.is_ok()) return result;
    std::vector<float> values = values_of((*executor)->value(fed.w));
    for (float v : values_of((*executor)->value(fed.b)))
      values.push_back(v);
    result.push_back(values);
    if (steps) steps->push_back(*(*executor)->value(step).as<int64_t>());
    if (lrs) lrs->push_back(*outputs[1].as<float>());
  }
  return result;
}

void expect_steps_near(const std::vector<std::vector<float>> &actual,
                       const std::vector<std::vector<float>> &expected, double tolerance) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t s = 0; s < actual.size(); ++s) {
    ASSERT_EQ(actual[s].size(), expected[s].size());
    for (size_t i = 0; i < actual[s].size(); ++i)
      EXPECT_NEAR(actual[s][i], expected[s][i], tolerance) << "step " << s << " element " << i;
  }
}

// The expected values below are printed by tests/passes/optimizer_reference.py
// (PyTorch 1.13, Debian's /usr/bin/python3): the same parameters and gradients
// through torch.optim and clip_grad_norm_.
TEST(OptimizerStepTest, SgdNesterovWeightDecayMatchesPyTorch) {
  std::vector<int64_t> steps;
  auto actual = run_three_steps("sgd:lr=0.1,momentum=0.9,nesterov=1,wd=0.01", &steps);
  expect_steps_near(actual,
                    {
                        {0.689050019, -0.903100014, 0.249524996, 1.90120006, -0.93857497, 1.68715,
                         0.242310002, -0.299430013, 0.0571200028},
                        {0.910835803, -0.812574148, 0.201348394, 1.71296775, -1.25468421,
                         1.90622938, 0.540018618, -0.203618094, -0.0514005199},
                        {1.13683259, -0.752869725, 0.0853314698, 1.41951513, -1.71014333,
                         2.12879753, 1.02714837, 0.0277300179, -0.0789199248},
                    },
                    1e-6);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3}));
}

TEST(OptimizerStepTest, AdamWMatchesPyTorch) {
  auto actual = run_three_steps("adamw:lr=0.01,wd=0.1,beta1=0.9,beta2=0.95,eps=1e-8");
  expect_steps_near(actual,
                    {
                        {0.509500027, -0.989000022, 0.249750003, 1.98800004, -0.759249985,
                         1.50849998, 0.109899998, -0.299700022, 0.189799994},
                        {0.518851042, -0.978618145, 0.242150664, 1.97615159, -0.768459678,
                         1.51685202, 0.119560406, -0.292050719, 0.180810586},
                        {0.527857125, -0.970284939, 0.233785093, 1.96440423, -0.777632892,
                         1.52486014, 0.129094556, -0.283635259, 0.176054358},
                    },
                    1e-6);
}

TEST(OptimizerStepTest, AdamWithClippingMatchesPyTorch) {
  auto actual = run_three_steps("adam:lr=0.01,wd=0.05,clip=1");
  expect_steps_near(actual,
                    {
                        {0.50999999, -0.99000001, 0.24000001, 1.99000001, -0.75999999, 1.50999999,
                         0.109999999, -0.290000021, 0.189999998},
                        {0.519735456, -0.980513573, 0.231910333, 1.98001206, -0.770008028,
                         1.51966631, 0.11987517, -0.282143265, 0.181301445},
                        {0.528705776, -0.972306609, 0.223145336, 1.96999121, -0.780025065,
                         1.52831137, 0.129809201, -0.273490429, 0.176021636},
                    },
                    1e-6);
}

TEST(OptimizerStepTest, StepCounterDrivesTheSchedule) {
  std::vector<int64_t> steps;
  std::vector<float> lrs;
  auto actual = run_three_steps("sgd:lr=0.3,warmup=2", &steps, &lrs);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3}));
  ASSERT_EQ(lrs.size(), 3u);
  EXPECT_FLOAT_EQ(lrs[0], 0.15f);
  EXPECT_FLOAT_EQ(lrs[1], 0.3f);
  EXPECT_FLOAT_EQ(lrs[2], 0.3f);
  // Plain SGD: w -= lr * g with the scheduled lr.
  ASSERT_EQ(actual.size(), 3u);
  double w0 = kW0[0];
  for (int s = 0; s < 3; ++s) {
    w0 -= lrs[s] * gradient_for(s)[0].as<float>()[0];
    EXPECT_NEAR(actual[s][0], w0, 1e-6) << "step " << s;
  }

  lrs.clear();
  run_three_steps("adam:lr=1,schedule=cosine,total=2,min_lr=0.5", nullptr, &lrs);
  ASSERT_EQ(lrs.size(), 3u);
  EXPECT_FLOAT_EQ(lrs[0], 1.0f);
  EXPECT_FLOAT_EQ(lrs[1], 0.75f);
  EXPECT_FLOAT_EQ(lrs[2], 0.5f);
}

// ---------------------------------------------------------------------------
// End to end with autodiff

TEST(OptimizerStepTest, TrainsThroughAutodiff) {
  // loss = sum((x w)^2), so dloss/dw = 2 x^T (x w).
  const float x0[4] = {1.0f, 2.0f, -0.5f, 0.25f};
  const float w0[4] = {0.3f, -0.2f, 0.1f, 0.4f};
  GraphBuilder builder("mlp", ops::OpRegistry::global());
  TensorId x = builder.input("x", DType::kF32, {2, 2});
  TensorId w = builder.parameter("w", DType::kF32, {2, 2}, Blob::copy_of(w0, sizeof w0));
  TensorId y = builder.op1("MatMul", {x, w});
  TensorId loss =
      builder.op1("ReduceSum", {builder.op1("Mul", {y, y})}, {{"keepdims", int64_t{0}}}, "loss");
  builder.output(loss);
  Graph graph = std::move(builder).finish().value();
  auto grads = passes::append_backward(graph, loss, {w});
  ASSERT_TRUE(grads.is_ok()) << grads.status().to_string();
  const OptimizerSpec spec = *parse_optimizer("sgd:lr=0.01,momentum=0.9,wd=0.1");
  ASSERT_TRUE(append_optimizer(graph, *grads, spec).is_ok());
  ASSERT_TRUE(verify_graph(graph, ops::OpRegistry::global()).is_ok());
  auto executor = runtime::CpuExecutor::create(std::move(graph));
  ASSERT_TRUE(executor.is_ok()) << executor.status().to_string();

  double wr[4], buf[4] = {0, 0, 0, 0};
  for (int i = 0; i < 4; ++i)
    wr[i] = w0[i];
  for (int s = 0; s < 3; ++s) {
    std::vector<HostTensor> outputs;
    ASSERT_TRUE((*executor)->run({f32_tensor({2, 2}, {x0, x0 + 4})}, &outputs).is_ok());
    // Reference step in double.
    double xw[4], g[4];
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 2; ++c)
        xw[r * 2 + c] = x0[r * 2] * wr[c] + x0[r * 2 + 1] * wr[2 + c];
    for (int k = 0; k < 2; ++k)
      for (int c = 0; c < 2; ++c)
        g[k * 2 + c] = 2 * (x0[k] * xw[c] + x0[2 + k] * xw[2 + c]);
    for (int i = 0; i < 4; ++i) {
      const double d = g[i] + 0.1 * wr[i];
      buf[i] = s == 0 ? d : 0.9 * buf[i] + d;
      wr[i] -= 0.01 * buf[i];
    }
    std::vector<float> actual = values_of((*executor)->value(w));
    for (int i = 0; i < 4; ++i)
      EXPECT_NEAR(actual[i], wr[i], 1e-5) << "step " << s << " element " << i;
  }
}

} // namespace
} // namespace strata
