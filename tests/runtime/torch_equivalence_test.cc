// Training equivalence with PyTorch: 3 training steps of each zoo model (mlp,
// convnet, gpt) under SGD (momentum, weight decay) and AdamW match PyTorch 1.13's
// losses and final parameters.
//
// The references are tests/reference/<model>_<optimizer>.safetensors, written by
// tests/reference/make_training_references.py (PyTorch is needed only to
// regenerate them). Each holds the initial parameters (init/<name>, strata
// names and layout), the 3 batches of every training-graph input (data/<input>,
// stacked along a leading dimension), PyTorch's loss per step (loss) and its
// parameters after the 3 steps (final/<name>); its __metadata__ gives the model,
// its zoo options and the optimizer string.
//
// Tolerance: a value a (strata) matches b (PyTorch) when
//   |a - b| <= 1e-4 * max(1, max |b| over the tensor),
// for every parameter element and for each step's loss (a tensor of 3). PyTorch's
// own f32 and f64 runs of these cases agree within 3e-6 by the same measure.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "passes/make_training.h"
#include "runtime/trainer.h"
#include "serialization/safetensors.h"
#include "tools/zoo.h"

namespace strata::runtime {
namespace {

namespace fs = std::filesystem;

constexpr double kTolerance = 1e-4;
constexpr int kSteps = 3;

fs::path reference_dir() {
  const char *root = std::getenv("STRATA_SOURCE_ROOT");
  return fs::path(root ? root : ".") / "tests" / "reference";
}

// The __metadata__ object of a .safetensors file (string values).
std::map<std::string, std::string> read_metadata(const fs::path &path) {
  std::map<std::string, std::string> out;
  std::ifstream in(path, std::ios::binary);
  uint64_t length = 0;
  in.read(reinterpret_cast<char *>(&length), sizeof(length));
  if (!in || length > (uint64_t{1} << 24)) return out;
  std::string header(length, '\0');
  in.read(header.data(), static_cast<std::streamsize>(length));
  if (!in) return out;
  auto json = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object() || !json.contains("__metadata__")) return out;
  for (const auto &[key, value] : json["__metadata__"].items())
    if (value.is_string()) out[key] = value.get<std::string>();
  return out;
}

int64_t integer(const std::map<std::string, std::string> &meta, const std::string &key) {
  auto it = meta.find(key);
  EXPECT_NE(it, meta.end()) << "metadata key " << key;
  return it == meta.end() ? 0 : std::stoll(it->second);
}

std::vector<int64_t> integers(const std::map<std::string, std::string> &meta,
                              const std::string &key) {
  std::vector<int64_t> out;
  auto it = meta.find(key);
  EXPECT_NE(it, meta.end()) << "metadata key " << key;
  if (it == meta.end()) return out;
  std::stringstream ss(it->second);
  for (std::string item; std::getline(ss, item, ',');)
    out.push_back(std::stoll(item));
  return out;
}

Result<Graph> build_model(const std::map<std::string, std::string> &meta) {
  const std::string model = meta.count("model") ? meta.at("model") : "";
  if (model == "mlp") {
    zoo::MlpOptions o;
    o.batch = integer(meta, "batch");
    o.input = integer(meta, "input");
    o.hidden = integers(meta, "hidden");
    o.classes = integer(meta, "classes");
    return zoo::make_mlp(o);
  }
  if (model == "convnet") {
    zoo::ConvnetOptions o;
    o.batch = integer(meta, "batch");
    o.in_channels = integer(meta, "in_channels");
    o.image_size = integer(meta, "image_size");
    o.channels = integers(meta, "channels");
    o.fc_hidden = integer(meta, "fc_hidden");
    o.classes = integer(meta, "classes");
    return zoo::make_convnet(o);
  }
  if (model == "gpt") {
    zoo::GptOptions o;
    o.layers = integer(meta, "layers");
    o.hidden = integer(meta, "hidden");
    o.heads = integer(meta, "heads");
    o.seq = integer(meta, "seq");
    o.vocab = integer(meta, "vocab");
    o.batch = integer(meta, "batch");
    return zoo::make_gpt(o);
  }
  return invalid_argument("unknown model '", model, "'");
}

// max |a - b| / max(1, max |b|) over the elements of two f32 tensors.
double relative_error(const float *a, const float *b, int64_t n) {
  double scale = 1.0, worst = 0.0;
  for (int64_t i = 0; i < n; ++i)
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  for (int64_t i = 0; i < n; ++i) {
    double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (std::isnan(d)) return INFINITY;
    worst = std::max(worst, d);
  }
  return worst / scale;
}

// Batch k of a tensor stacking batches along its leading dimension.
HostTensor batch_of(const HostTensor &stacked, int64_t k) {
  TensorType type{stacked.type.dtype,
                  Shape(stacked.type.shape.begin() + 1, stacked.type.shape.end())};
  HostTensor out = HostTensor::zeros(type);
  const size_t bytes = static_cast<size_t>(type.size_bytes());
  std::memcpy(out.data(), stacked.data() + static_cast<size_t>(k) * bytes, bytes);
  return out;
}

class TorchEquivalenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TorchEquivalenceTest, ThreeStepsMatchPyTorch) {
  const fs::path path = reference_dir() / (GetParam() + ".safetensors");
  ASSERT_TRUE(fs::exists(path)) << path << " is missing (STRATA_SOURCE_ROOT set?)";
  const auto meta = read_metadata(path);
  ASSERT_TRUE(meta.count("optimizer") && meta.count("model")) << path << ": no metadata";
  auto read = serialization::read_safetensors(path.string());
  ASSERT_TRUE(read.is_ok()) << read.status().message();
  const std::map<std::string, HostTensor> &ref = *read;

  // The zoo model with the reference's initial parameters in place of its initializers.
  auto built = build_model(meta);
  ASSERT_TRUE(built.is_ok()) << built.status().message();
  Graph forward = std::move(built).value();
  int64_t parameters = 0;
  for (TensorId id = 0; id < static_cast<TensorId>(forward.num_tensors()); ++id) {
    Tensor &t = forward.mutable_tensor(id);
    if (t.kind != TensorKind::kParameter) continue;
    ++parameters;
    auto it = ref.find("init/" + t.name);
    ASSERT_NE(it, ref.end()) << "no init/" << t.name;
    ASSERT_EQ(it->second.type, t.type) << t.name;
    t.data = Blob::copy_of(it->second.data(), it->second.size_bytes());
    t.initializer = Initializer{};
  }
  int64_t init_tensors = 0, final_tensors = 0;
  for (const auto &[name, value] : ref) {
    init_tensors += name.starts_with("init/");
    final_tensors += name.starts_with("final/");
  }
  EXPECT_EQ(init_tensors, parameters);
  EXPECT_EQ(final_tensors, parameters);

  passes::TrainingOptions options;
  options.loss = meta.count("loss_fn") ? meta.at("loss_fn") : "softmax_cross_entropy";
  auto optimizer = passes::parse_optimizer(meta.at("optimizer"));
  ASSERT_TRUE(optimizer.is_ok()) << optimizer.status().message();
  options.optimizer = *optimizer;
  auto training = passes::make_training_graph(forward, options);
  ASSERT_TRUE(training.is_ok()) << training.status().message();

  Dataset data;
  for (int64_t k = 0; k < kSteps; ++k) {
    std::vector<HostTensor> batch;
    for (TensorId input : training->inputs()) {
      const Tensor &t = training->tensor(input);
      auto it = ref.find("data/" + t.name);
      ASSERT_NE(it, ref.end()) << "no data/" << t.name;
      ASSERT_EQ(it->second.type.shape.size(), t.type.shape.size() + 1) << t.name;
      ASSERT_EQ(it->second.type.shape[0], kSteps) << t.name;
      HostTensor b = batch_of(it->second, k);
      ASSERT_EQ(b.type, t.type) << t.name;
      batch.push_back(std::move(b));
    }
    data.batches.push_back(std::move(batch));
  }
  auto created = Trainer::create(std::move(training).value(), "loss", std::move(data));
  ASSERT_TRUE(created.is_ok()) << created.status().message();
  Trainer &trainer = **created;

  float losses[kSteps];
  for (int k = 0; k < kSteps; ++k) {
    auto loss = trainer.train_step();
    ASSERT_TRUE(loss.is_ok()) << loss.status().message();
    losses[k] = static_cast<float>(*loss);
  }
  const HostTensor &ref_loss = ref.at("loss");
  ASSERT_EQ(ref_loss.type.num_elements(), kSteps);
  const double loss_error = relative_error(losses, ref_loss.as<float>(), kSteps);
  EXPECT_LE(loss_error, kTolerance) << "losses " << losses[0] << " " << losses[1] << " "
                                    << losses[2] << " vs PyTorch " << ref_loss.as<float>()[0] << " "
                                    << ref_loss.as<float>()[1] << " " << ref_loss.as<float>()[2];

  const auto state = trainer.state();
  double worst = 0.0;
  std::string worst_name;
  for (const auto &[name, expected] : ref) {
    if (!name.starts_with("final/")) continue;
    const std::string param = name.substr(6);
    auto it = state.find(param);
    ASSERT_NE(it, state.end()) << "strata has no parameter " << param;
    ASSERT_EQ(it->second.type, expected.type) << param;
    const double error =
        relative_error(it->second.as<float>(), expected.as<float>(), expected.type.num_elements());
    EXPECT_LE(error, kTolerance) << param;
    if (error >= worst) {
      worst = error;
      worst_name = param;
    }
  }
  std::cout << "[ reference ] " << GetParam() << ": loss rel err " << loss_error
            << ", parameters max rel err " << worst << " (" << worst_name << ")" << std::endl;
}

INSTANTIATE_TEST_SUITE_P(Zoo, TorchEquivalenceTest,
                         ::testing::Values("mlp_sgd", "mlp_adamw", "convnet_sgd", "convnet_adamw",
                                           "gpt_sgd", "gpt_adamw"),
                         [](const auto &info) { return info.param; });

} // namespace
} // namespace strata::runtime
