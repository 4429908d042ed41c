// The model zoo: parameter counts and FLOPs against hand counts, verification,
// determinism, and (through the CPU executor) that the GPT graph computes what a
// plain loop implementation of GPT-2 computes.
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include <gtest/gtest.h>

#include "graph/printer.h"
#include "graph/verifier.h"
#include "ops/registry.h"
#include "runtime/cpu/executor.h"
#include "tools/model_stats.h"
#include "tools/zoo.h"

namespace strata {
namespace {

using tools::compute_model_stats;
using tools::node_flops;

const ops::OpRegistry &registry() { return ops::OpRegistry::global(); }

Graph build(Result<Graph> result) {
  EXPECT_TRUE(result.is_ok()) << result.status().to_string();
  if (!result.is_ok()) return Graph();
  return std::move(result).value();
}

double op_flops(const Graph &graph, std::string_view op) {
  double total = 0;
  for (NodeId id = 0; id < graph.num_nodes(); ++id)
    if (graph.node(id).op == op) total += node_flops(graph, id);
  return total;
}

int64_t count_op(const Graph &graph, std::string_view op) {
  int64_t n = 0;
  for (const Node &node : graph.nodes())
    n += node.op == op;
  return n;
}

// Sum of the elements of parameters whose name starts with `prefix`.
int64_t params_under(const Graph &graph, std::string_view prefix) {
  int64_t n = 0;
  for (const Tensor &t : graph.tensors())
    if (t.kind == TensorKind::kParameter && std::string_view(t.name).starts_with(prefix))
      n += t.type.num_elements();
  return n;
}

// ---------------------------------------------------------------------------
// GPT

// Parameters written out by hand, independently of zoo::gpt_parameter_count:
// embeddings V*H + S*H; per layer qkv 3H^2+3H, proj H^2+H, fc1 4H^2+4H,
// fc2 4H^2+H, two LayerNorms 4H; final LayerNorm 2H; the tied head adds nothing.
int64_t gpt_params_by_hand(int64_t L, int64_t H, int64_t S, int64_t V) {
  int64_t per_layer =
      (3 * H * H + 3 * H) + (H * H + H) + (4 * H * H + 4 * H) + (4 * H * H + H) + 4 * H;
  return V * H + S * H + L * per_layer + 2 * H;
}

// MatMul FLOPs of one forward pass: per layer the four weight matmuls
// (2*B*S*12*H^2), the two attention matmuls (2 * 2*B*heads*S*S*hd), and the head.
double gpt_matmul_flops_by_hand(const zoo::GptOptions &o) {
  double B = double(o.batch), S = double(o.seq), H = double(o.hidden), V = double(o.vocab);
  double NH = double(o.heads), HD = H / NH, L = double(o.layers);
  double weights = 2 * B * S * 12 * H * H;
  double attention = 2 * (2 * B * NH * S * S * HD);
  double head = 2 * B * S * H * V;
  return L * (weights + attention) + head;
}

std::vector<zoo::GptOptions> gpt_configs() {
  std::vector<zoo::GptOptions> configs;
  configs.push_back({}); // defaults: 2 layers, hidden 128, 4 heads, seq 32, vocab 512, batch 2
  configs.push_back({.layers = 1, .hidden = 64, .heads = 4, .seq = 16, .vocab = 100, .batch = 1});
  configs.push_back({.layers = 3, .hidden = 96, .heads = 6, .seq = 24, .vocab = 1000, .batch = 3});
  configs.push_back({.layers = 4, .hidden = 32, .heads = 1, .seq = 7, .vocab = 33, .batch = 5});
  return configs;
}

TEST(GptTest, DefaultParameterCountIsKnownNumber) {
  // 512*128 + 32*128 + 2*(12*128^2 + 13*128) + 2*128
  Graph g = build(zoo::make_gpt({}));
  EXPECT_EQ(g.num_parameters(), 466432);
  EXPECT_EQ(zoo::gpt_parameter_count({}), 466432);
}

TEST(GptTest, ParameterCountMatchesFormula) {
  for (const zoo::GptOptions &o : gpt_configs()) {
    SCOPED_TRACE(str_cat("L=", o.layers, " H=", o.hidden, " S=", o.seq, " V=", o.vocab));
    Graph g = build(zoo::make_gpt(o));
    int64_t expected = gpt_params_by_hand(o.layers, o.hidden, o.seq, o.vocab);
    EXPECT_EQ(g.num_parameters(), expected);
    EXPECT_EQ(zoo::gpt_parameter_count(o), expected);
    const int64_t H = o.hidden;
    for (int64_t l = 0; l < o.layers; ++l)
      EXPECT_EQ(params_under(g, str_cat("layer", l, ".")), 12 * H * H + 13 * H) << "layer " << l;
    EXPECT_EQ(params_under(g, "wte"), o.vocab * H);
    EXPECT_EQ(params_under(g, "wpe"), o.seq * H);
    EXPECT_EQ(params_under(g, "ln_f."), 2 * H);
  }
}

TEST(GptTest, MatMulFlopsMatchHandCount) {
  for (const zoo::GptOptions &o : gpt_configs()) {
    SCOPED_TRACE(str_cat("L=", o.layers, " H=", o.hidden, " S=", o.seq, " V=", o.vocab));
    Graph g = build(zoo::make_gpt(o));
    EXPECT_EQ(count_op(g, "MatMul"), 6 * o.layers + 1);
    EXPECT_DOUBLE_EQ(op_flops(g, "MatMul"), gpt_matmul_flops_by_hand(o));
    // The total is the MatMuls plus everything else, each node counted once.
    auto stats = compute_model_stats(g);
    ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
    double rest = 0;
    for (NodeId id = 0; id < g.num_nodes(); ++id)
      if (g.node(id).op != "MatMul") rest += node_flops(g, id);
    EXPECT_DOUBLE_EQ(stats->flops, gpt_matmul_flops_by_hand(o) + rest);
    EXPECT_EQ(stats->nodes.size(), g.num_nodes());
    // Elementwise and normalization work is real but small next to the matmuls.
    EXPECT_GT(rest, 0);
    EXPECT_LT(rest, 0.5 * stats->flops);
  }
}

TEST(GptTest, InputsOutputsAndVerify) {
  zoo::GptOptions o{.layers = 2, .hidden = 64, .heads = 2, .seq = 8, .vocab = 50, .batch = 3};
  Graph g = build(zoo::make_gpt(o));
  Status verified = verify_graph(g, registry());
  EXPECT_TRUE(verified.is_ok()) << verified.to_string();
  ASSERT_EQ(g.inputs().size(), 1u);
  EXPECT_EQ(g.tensor(g.inputs()[0]).name, "tokens");
  EXPECT_EQ(g.tensor(g.inputs()[0]).type, (TensorType{DType::kI64, {3, 8}}));
  ASSERT_EQ(g.outputs().size(), 1u);
  EXPECT_EQ(g.tensor(g.outputs()[0]).type, (TensorType{DType::kF32, {3, 8, 50}}));
  EXPECT_TRUE(g.find_node("layer0.attn.qkv").has_value());
  EXPECT_TRUE(g.find_node("layer1.mlp.fc2").has_value());
  EXPECT_TRUE(g.find_node("logits").has_value());
  EXPECT_TRUE(g.find_tensor("layer1.attn.qkv.weight").has_value());
}

TEST(GptTest, InitializersAndDistinctSeeds) {
  Graph g = build(zoo::make_gpt({.layers = 2, .seed = 7}));
  std::set<uint64_t> seeds;
  int64_t params = 0;
  for (const Tensor &t : g.tensors()) {
    if (t.kind != TensorKind::kParameter) continue;
    ++params;
    EXPECT_EQ(t.data, nullptr) << t.name;
    seeds.insert(t.initializer.seed);
    std::string_view name = t.name;
    if (name.ends_with(".scale")) {
      EXPECT_EQ(t.initializer.kind, Initializer::Kind::kOnes) << t.name;
    } else if (name.ends_with(".bias")) {
      EXPECT_EQ(t.initializer.kind, Initializer::Kind::kZeros) << t.name;
    } else {
      EXPECT_EQ(t.initializer.kind, Initializer::Kind::kNormal) << t.name;
      EXPECT_EQ(t.initializer.a, 0.0) << t.name;
      EXPECT_EQ(t.initializer.b, 0.02) << t.name;
    }
  }
  EXPECT_EQ(params, 2 + 2 * 12 + 2);
  EXPECT_EQ(static_cast<int64_t>(seeds.size()), params);
}

TEST(GptTest, CausalMaskConstant) {
  Graph g = build(zoo::make_gpt({.seq = 5}));
  auto id = g.find_tensor("attn.causal_mask");
  ASSERT_TRUE(id.has_value());
  const Tensor &mask = g.tensor(*id);
  EXPECT_EQ(mask.kind, TensorKind::kConstant);
  ASSERT_EQ(mask.type, (TensorType{DType::kF32, {5, 5}}));
  ASSERT_NE(mask.data, nullptr);
  const float *m = reinterpret_cast<const float *>(mask.data->data());
  for (int q = 0; q < 5; ++q)
    for (int k = 0; k < 5; ++k)
      EXPECT_EQ(m[q * 5 + k], k <= q ? 0.0f : -1e9f) << q << "," << k;
}

TEST(GptTest, Deterministic) {
  zoo::GptOptions o{.layers = 2, .hidden = 32, .heads = 2, .seq = 4, .vocab = 20, .batch = 1};
  std::string a = print_graph(build(zoo::make_gpt(o)));
  std::string b = print_graph(build(zoo::make_gpt(o)));
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, b);
  Graph g1 = build(zoo::make_gpt(o));
  o.seed = 1;
  Graph g2 = build(zoo::make_gpt(o));
  ASSERT_EQ(g1.num_tensors(), g2.num_tensors());
  for (TensorId id = 0; id < g1.num_tensors(); ++id)
    if (g1.tensor(id).kind == TensorKind::kParameter) {
      EXPECT_NE(g1.tensor(id).initializer.seed, g2.tensor(id).initializer.seed)
          << g1.tensor(id).name;
    }
}

TEST(GptTest, RejectsBadOptions) {
  auto bad_heads = zoo::make_gpt({.hidden = 100, .heads = 3});
  ASSERT_FALSE(bad_heads.is_ok());
  EXPECT_NE(bad_heads.status().message().find("heads"), std::string::npos);
  EXPECT_FALSE(zoo::make_gpt({.layers = 0}).is_ok());
  EXPECT_FALSE(zoo::make_gpt({.vocab = -1}).is_ok());
  EXPECT_FALSE(zoo::make_gpt({.init_std = 0}).is_ok());
}

// The causal mask, seq x seq floats, is kept in the model file: a longer
// sequence is refused before anything is allocated (seq x seq x 4 bytes once
// wrapped around to a small allocation, or asked the host for terabytes).
TEST(GptTest, RejectsASequenceWhoseMaskAFileCannotHold) {
  for (int64_t seq : {zoo::kMaxGptSeq + 1, int64_t{1} << 20, int64_t{2147483647}}) {
    auto r = zoo::make_gpt({.layers = 1, .hidden = 8, .heads = 1, .seq = seq, .vocab = 4});
    ASSERT_FALSE(r.is_ok()) << seq;
    EXPECT_NE(r.status().message().find(str_cat("gpt seq ", seq, " is longer than 16383")),
              std::string::npos)
        << r.status().message();
  }
}

// ---------------------------------------------------------------------------
// GPT numerics: the graph against a loop implementation of the same model.

struct Weights {
  std::map<std::string, std::vector<float>> values;
  const std::vector<float> &operator[](const std::string &name) const {
    auto it = values.find(name);
    if (it == values.end()) ADD_FAILURE() << "no parameter " << name;
    static const std::vector<float> kEmpty;
    return it == values.end() ? kEmpty : it->second;
  }
};

using Matrix = std::vector<std::vector<float>>; // [rows][cols]

Matrix linear(const Matrix &x, const std::vector<float> &w, const std::vector<float> &b, int64_t in,
              int64_t out) {
  Matrix y(x.size(), std::vector<float>(out));
  for (size_t r = 0; r < x.size(); ++r)
    for (int64_t o = 0; o < out; ++o) {
      double acc = b.empty() ? 0.0 : b[o];
      for (int64_t i = 0; i < in; ++i)
        acc += double(x[r][i]) * w[i * out + o];
      y[r][o] = float(acc);
    }
  return y;
}

Matrix layer_norm(const Matrix &x, const std::vector<float> &scale,
                  const std::vector<float> &bias) {
  Matrix y = x;
  for (size_t r = 0; r < x.size(); ++r) {
    double mean = 0, var = 0;
    for (float v : x[r])
      mean += v;
    mean /= double(x[r].size());
    for (float v : x[r])
      var += (v - mean) * (v - mean);
    var /= double(x[r].size());
    for (size_t c = 0; c < x[r].size(); ++c)
      y[r][c] = float((x[r][c] - mean) / std::sqrt(var + 1e-5) * scale[c] + bias[c]);
  }
  return y;
}

// Logits [S][V] of one row of tokens.
Matrix reference_gpt(const zoo::GptOptions &o, const Weights &w, const int64_t *tokens) {
  const int64_t S = o.seq, H = o.hidden, NH = o.heads, HD = H / NH, V = o.vocab;
  Matrix x(S, std::vector<float>(H));
  for (int64_t s = 0; s < S; ++s)
    for (int64_t h = 0; h < H; ++h)
      x[s][h] = w["wte"][tokens[s] * H + h] + w["wpe"][s * H + h];
  for (int64_t l = 0; l < o.layers; ++l) {
    std::string p = str_cat("layer", l, ".");
    Matrix a = layer_norm(x, w[p + "ln1.scale"], w[p + "ln1.bias"]);
    Matrix qkv = linear(a, w[p + "attn.qkv.weight"], w[p + "attn.qkv.bias"], H, 3 * H);
    Matrix ctx(S, std::vector<float>(H, 0.0f));
    for (int64_t n = 0; n < NH; ++n)
      for (int64_t i = 0; i < S; ++i) {
        std::vector<double> score(i + 1);
        double top = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < HD; ++d)
            dot += double(qkv[i][n * HD + d]) * qkv[j][H + n * HD + d];
          score[j] = dot / std::sqrt(double(HD));
          top = std::max(top, score[j]);
        }
        double total = 0;
        for (double &sc : score)
          total += (sc = std::exp(sc - top));
        for (int64_t d = 0; d < HD; ++d) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j)
            acc += score[j] / total * qkv[j][2 * H + n * HD + d];
          ctx[i][n * HD + d] = float(acc);
        }
      }
    Matrix proj = linear(ctx, w[p + "attn.proj.weight"], w[p + "attn.proj.bias"], H, H);
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        x[s][h] += proj[s][h];
    Matrix m = layer_norm(x, w[p + "ln2.scale"], w[p + "ln2.bias"]);
    m = linear(m, w[p + "mlp.fc1.weight"], w[p + "mlp.fc1.bias"], H, 4 * H);
    for (auto &row : m)
      for (float &v : row)
        v = float(0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))));
    m = linear(m, w[p + "mlp.fc2.weight"], w[p + "mlp.fc2.bias"], 4 * H, H);
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        x[s][h] += m[s][h];
  }
  x = layer_norm(x, w["ln_f.scale"], w["ln_f.bias"]);
  // Tied head: logits = x wte^T, i.e. a linear layer with the transposed embedding.
  std::vector<float> wte_t(H * V);
  for (int64_t v = 0; v < V; ++v)
    for (int64_t h = 0; h < H; ++h)
      wte_t[h * V + v] = w["wte"][v * H + h];
  return linear(x, wte_t, {}, H, V);
}

TEST(GptNumericsTest, MatchesLoopImplementation) {
  // A larger init std than GPT-2's makes attention non-uniform, so a wrong
  // head split or mask shows up in the logits.
  zoo::GptOptions o{
      .layers = 2, .hidden = 16, .heads = 4, .seq = 6, .vocab = 13, .batch = 2, .init_std = 0.5};
  Graph g = build(zoo::make_gpt(o));
  Weights w;
  for (const Tensor &t : g.tensors()) {
    if (t.kind != TensorKind::kParameter) continue;
    auto value = runtime::materialize(t, ".");
    ASSERT_TRUE(value.is_ok()) << value.status().to_string();
    const float *data = value->as<float>();
    w.values[t.name].assign(data, data + t.type.num_elements());
  }
  std::vector<HostTensor> inputs = runtime::random_inputs(g, 3);
  ASSERT_EQ(inputs.size(), 1u);
  auto executor = runtime::CpuExecutor::create(g);
  ASSERT_TRUE(executor.is_ok()) << executor.status().to_string();
  std::vector<HostTensor> outputs;
  Status ran = (*executor)->run(inputs, &outputs);
  ASSERT_TRUE(ran.is_ok()) << ran.to_string();
  ASSERT_EQ(outputs.size(), 1u);
  ASSERT_EQ(outputs[0].type, (TensorType{DType::kF32, {2, 6, 13}}));
  const float *logits = outputs[0].as<float>();
  double max_err = 0, max_ref = 0;
  for (int64_t b = 0; b < o.batch; ++b) {
    Matrix ref = reference_gpt(o, w, inputs[0].as<int64_t>() + b * o.seq);
    for (int64_t s = 0; s < o.seq; ++s)
      for (int64_t v = 0; v < o.vocab; ++v) {
        double got = logits[(b * o.seq + s) * o.vocab + v];
        max_err = std::max(max_err, std::fabs(got - ref[s][v]));
        max_ref = std::max(max_ref, double(std::fabs(ref[s][v])));
      }
  }
  EXPECT_GT(max_ref, 0.1);
  EXPECT_LT(max_err, 1e-3 * std::max(1.0, max_ref)) << "largest |logit| " << max_ref;
}

TEST(GptNumericsTest, LaterTokensDoNotChangeEarlierLogits) {
  zoo::GptOptions o{
      .layers = 2, .hidden = 32, .heads = 4, .seq = 8, .vocab = 40, .batch = 1, .init_std = 0.3};
  Graph g = build(zoo::make_gpt(o));
  auto executor = runtime::CpuExecutor::create(g);
  ASSERT_TRUE(executor.is_ok()) << executor.status().to_string();
  std::vector<HostTensor> inputs = runtime::random_inputs(g, 11);
  std::vector<HostTensor> before, after;
  ASSERT_TRUE((*executor)->run(inputs, &before).is_ok());
  int64_t *tokens = inputs[0].as<int64_t>();
  tokens[o.seq - 1] = (tokens[o.seq - 1] + 1) % o.vocab; // change the last token only
  ASSERT_TRUE((*executor)->run(inputs, &after).is_ok());
  const float *x = before[0].as<float>(), *y = after[0].as<float>();
  for (int64_t i = 0; i < (o.seq - 1) * o.vocab; ++i)
    ASSERT_EQ(x[i], y[i]) << "position " << i / o.vocab << " saw a later token";
  bool last_changed = false;
  for (int64_t i = (o.seq - 1) * o.vocab; i < o.seq * o.vocab; ++i)
    last_changed |= x[i] != y[i];
  EXPECT_TRUE(last_changed);
}

// ---------------------------------------------------------------------------
// mlp and convnet

TEST(MlpTest, ParameterCountAndShapes) {
  // Defaults: 784 -> 256 -> 256 -> 10.
  Graph g = build(zoo::make_mlp({}));
  EXPECT_EQ(g.num_parameters(), (784 * 256 + 256) + (256 * 256 + 256) + (256 * 10 + 10));
  EXPECT_EQ(g.num_parameters(), 269322);
  EXPECT_EQ(zoo::mlp_parameter_count({}), 269322);
  EXPECT_EQ(g.tensor(g.inputs()[0]).type, (TensorType{DType::kF32, {32, 784}}));
  EXPECT_EQ(g.tensor(g.outputs()[0]).type, (TensorType{DType::kF32, {32, 10}}));
  EXPECT_EQ(count_op(g, "Gemm"), 3);
  EXPECT_EQ(count_op(g, "Relu"), 2);

  zoo::MlpOptions o{.batch = 4, .input = 5, .hidden = {7, 3, 11}, .classes = 2};
  Graph h = build(zoo::make_mlp(o));
  EXPECT_EQ(h.num_parameters(), (5 * 7 + 7) + (7 * 3 + 3) + (3 * 11 + 11) + (11 * 2 + 2));
  EXPECT_EQ(h.num_parameters(), zoo::mlp_parameter_count(o));
  EXPECT_EQ(h.tensor(h.outputs()[0]).type, (TensorType{DType::kF32, {4, 2}}));

  // No hidden layer: logistic regression.
  Graph lr = build(zoo::make_mlp({.batch = 2, .input = 3, .hidden = {}, .classes = 4}));
  EXPECT_EQ(lr.num_parameters(), 3 * 4 + 4);
}

TEST(MlpTest, GemmFlopsCoverTheMultiplyAdds) {
  zoo::MlpOptions o{.batch = 8, .input = 20, .hidden = {30}, .classes = 5};
  Graph g = build(zoo::make_mlp(o));
  // 2*M*N*K per layer, plus at most one pass over the output per alpha and beta*C.
  double mac = 2.0 * 8 * (20 * 30 + 30 * 5);
  double out = 8.0 * (30 + 5);
  double gemm = op_flops(g, "Gemm");
  EXPECT_GE(gemm, mac);
  EXPECT_LE(gemm, mac + 2 * out);
}

TEST(ConvnetTest, ParameterCountAndFlops) {
  // Defaults: 3x32x32 -> conv 16 -> pool -> conv 32 -> pool -> 32x8x8 -> fc 128 -> 10.
  Graph g = build(zoo::make_convnet({}));
  int64_t conv0 = 16 * 3 * 9 + 16, conv1 = 32 * 16 * 9 + 32;
  int64_t fc = 32 * 8 * 8 * 128 + 128, head = 128 * 10 + 10;
  EXPECT_EQ(g.num_parameters(), conv0 + conv1 + fc + head);
  EXPECT_EQ(g.num_parameters(), 268650);
  EXPECT_EQ(zoo::convnet_parameter_count({}), 268650);
  EXPECT_EQ(g.tensor(g.inputs()[0]).type, (TensorType{DType::kF32, {8, 3, 32, 32}}));
  EXPECT_EQ(g.tensor(g.outputs()[0]).type, (TensorType{DType::kF32, {8, 10}}));
  EXPECT_EQ(count_op(g, "Conv2d"), 2);
  EXPECT_EQ(count_op(g, "MaxPool2d"), 2);
  // Conv2d: 2*N*M*oH*oW*C*kH*kW, plus N*M*oH*oW for the bias.
  double c0 = 2.0 * 8 * 16 * 32 * 32 * 3 * 9 + 8.0 * 16 * 32 * 32;
  double c1 = 2.0 * 8 * 32 * 16 * 16 * 16 * 9 + 8.0 * 32 * 16 * 16;
  EXPECT_DOUBLE_EQ(op_flops(g, "Conv2d"), c0 + c1);

  zoo::ConvnetOptions o{.batch = 2,
                        .in_channels = 1,
                        .image_size = 24,
                        .channels = {4, 8, 6},
                        .fc_hidden = 0,
                        .classes = 3};
  Graph h = build(zoo::make_convnet(o));
  EXPECT_EQ(h.num_parameters(),
            (4 * 1 * 9 + 4) + (8 * 4 * 9 + 8) + (6 * 8 * 9 + 6) + (6 * 3 * 3 * 3 + 3));
  EXPECT_EQ(h.num_parameters(), zoo::convnet_parameter_count(o));
  EXPECT_EQ(h.tensor(h.outputs()[0]).type, (TensorType{DType::kF32, {2, 3}}));
}

TEST(ConvnetTest, RejectsImageSizeThatDoesNotPool) {
  auto r = zoo::make_convnet({.image_size = 30});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("divisible"), std::string::npos);
  EXPECT_FALSE(zoo::make_convnet({.channels = {}}).is_ok());
}

// The features the conv stages hand the dense layers are counted with an
// overflow check, not multiplied blindly.
TEST(ConvnetTest, RejectsFeaturesBeyondTheElementLimit) {
  auto r = zoo::make_convnet(
      {.batch = 1, .in_channels = 1, .image_size = 2147483646, .channels = {2147483647}});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("convnet features after the conv stages: shape "),
            std::string::npos)
      << r.status().message();
}

// ---------------------------------------------------------------------------
// All models

TEST(ZooTest, EveryModelVerifiesAndIsDeterministic) {
  std::vector<std::pair<std::string, std::function<Result<Graph>()>>> models = {
      {"mlp", [] { return zoo::make_mlp({}); }},
      {"convnet", [] { return zoo::make_convnet({}); }},
      {"gpt", [] { return zoo::make_gpt({}); }},
      {"gpt-big",
       [] {
         return zoo::make_gpt(
             {.layers = 12, .hidden = 768, .heads = 12, .seq = 1024, .vocab = 50257, .batch = 1});
       }},
  };
  for (auto &[name, make] : models) {
    SCOPED_TRACE(name);
    Graph g = build(make());
    Status verified = verify_graph(g, registry());
    EXPECT_TRUE(verified.is_ok()) << verified.to_string();
    EXPECT_EQ(print_graph(g), print_graph(build(make())));
    for (const Tensor &t : g.tensors())
      if (t.kind == TensorKind::kParameter) {
        EXPECT_TRUE(t.has_value_source()) << t.name;
      }
  }
}

TEST(ZooTest, Gpt2SmallHasTheKnownParameterCount) {
  // GPT-2 small with its 1024 positions and 50257-token vocabulary: 124,439,808
  // parameters (the published count, biases and LayerNorms included).
  Graph g = build(zoo::make_gpt(
      {.layers = 12, .hidden = 768, .heads = 12, .seq = 1024, .vocab = 50257, .batch = 1}));
  EXPECT_EQ(g.num_parameters(), 124439808);
}

TEST(ZooTest, MlpAndConvnetRun) {
  for (Graph g :
       {build(zoo::make_mlp({.batch = 4, .input = 12, .hidden = {8}, .classes = 3})),
        build(zoo::make_convnet(
            {.batch = 2, .image_size = 8, .channels = {4, 4}, .fc_hidden = 6, .classes = 5}))}) {
    SCOPED_TRACE(g.name());
    auto executor = runtime::CpuExecutor::create(g);
    ASSERT_TRUE(executor.is_ok()) << executor.status().to_string();
    std::vector<HostTensor> outputs;
    Status ran = (*executor)->run(runtime::random_inputs(g, 1), &outputs);
    ASSERT_TRUE(ran.is_ok()) << ran.to_string();
    ASSERT_EQ(outputs.size(), 1u);
    EXPECT_EQ(outputs[0].type, g.tensor(g.outputs()[0]).type);
    double abs_sum = 0;
    for (int64_t i = 0; i < outputs[0].type.num_elements(); ++i) {
      float v = outputs[0].as<float>()[i];
      ASSERT_TRUE(std::isfinite(v));
      abs_sum += std::fabs(v);
    }
    EXPECT_GT(abs_sum, 0);
  }
}

TEST(ModelStatsTest, HumanUnits) {
  EXPECT_EQ(tools::human_count(466432), "466.4K");
  EXPECT_EQ(tools::human_count(1234567), "1.23M");
  EXPECT_EQ(tools::human_count(999), "999");
  EXPECT_EQ(tools::human_flops(2.5e9), "2.50 GFLOP");
  EXPECT_EQ(tools::human_bytes(1024 * 1024), "1.00 MiB");
  EXPECT_EQ(tools::grouped(1234567), "1,234,567");
  EXPECT_EQ(tools::grouped(12), "12");
}

} // namespace
// Per-node GPU times summed per op type, largest first; untimed nodes (0:
// run inside a fused chain) are not counted.
TEST(OpTimes, SumsNodesPerOpLargestFirst) {
  auto mlp = zoo::make_mlp(zoo::MlpOptions{});
  ASSERT_TRUE(mlp.is_ok());
  const Graph &g = *mlp;
  std::vector<double> ms(g.num_nodes(), 0.0);
  double gemm = 0, relu = 0;
  int64_t gemms = 0;
  for (NodeId n = 0; n < g.num_nodes(); ++n) {
    if (g.node(n).op == "Gemm") {
      ms[n] = 0.5 + static_cast<double>(n);
      gemm += ms[n];
      ++gemms;
    } else if (g.node(n).op == "Relu") {
      ms[n] = 0.25;
      relu += ms[n];
    }
  }
  const auto rows = tools::op_times(g, ms);
  ASSERT_EQ(rows.size(), relu > 0 ? 2u : 1u);
  EXPECT_EQ(rows[0].op, "Gemm");
  EXPECT_EQ(rows[0].nodes, gemms);
  EXPECT_DOUBLE_EQ(rows[0].ms, gemm);
  if (relu > 0) {
    EXPECT_EQ(rows[1].op, "Relu");
    EXPECT_DOUBLE_EQ(rows[1].ms, relu);
  }
}

} // namespace strata
