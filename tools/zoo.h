// The model zoo: small reference models built with the GraphBuilder.
//
// Each builder returns a verified-by-construction Graph whose parameters carry
// initializers (no data), so a model of any size is stored in kilobytes and drawn
// by the runtime. The same options always give the same graph, seeds included:
// every parameter's seed is derived from the model seed and the parameter's index.
//
//   mlp      x f32[batch, input] -> Gemm+Relu per hidden layer -> Gemm -> logits [batch, classes]
//   convnet  image f32[batch, 3, H, W] -> (Conv2d 3x3 + Relu + MaxPool2d 2x2) per stage
//            -> Flatten -> Gemm+Relu -> Gemm -> logits [batch, classes]
//   gpt      tokens i64[batch, seq] -> GPT-2 style decoder (pre-LayerNorm, causal
//            self-attention, Gelu MLP, tied embedding) -> logits f32[batch, seq, vocab]
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace strata::zoo {

struct MlpOptions {
  int64_t batch = 32;
  int64_t input = 784;
  std::vector<int64_t> hidden = {256, 256}; // width of each hidden layer; may be empty
  int64_t classes = 10;
  uint64_t seed = 0;
};

struct ConvnetOptions {
  int64_t batch = 8;
  int64_t in_channels = 3;
  int64_t image_size = 32;                  // height and width; divisible by 2^stages
  std::vector<int64_t> channels = {16, 32}; // output channels of each conv stage
  int64_t fc_hidden = 128;                  // width of the hidden fully connected layer; 0: none
  int64_t classes = 10;
  uint64_t seed = 0;
};

// The longest sequence make_gpt builds: its causal mask, a seq x seq f32
// constant, is kept in the model file, whose inline data stays under 1 GiB.
inline constexpr int64_t kMaxGptSeq = 16383;

struct GptOptions {
  int64_t layers = 2;
  int64_t hidden = 128;
  int64_t heads = 4; // divides hidden
  int64_t seq = 32;
  int64_t vocab = 512;
  int64_t batch = 2;
  double init_std = 0.02; // stddev of the normal initializer of every weight matrix
  uint64_t seed = 0;
};

Result<Graph> make_mlp(const MlpOptions &options);
Result<Graph> make_convnet(const ConvnetOptions &options);
Result<Graph> make_gpt(const GptOptions &options);

// Closed-form parameter counts, the contract the builders are tested against.
int64_t mlp_parameter_count(const MlpOptions &options);
int64_t convnet_parameter_count(const ConvnetOptions &options);
// V*H + S*H + L*(12*H^2 + 13*H) + 2*H (the output head shares the token embedding).
int64_t gpt_parameter_count(const GptOptions &options);

// The seed of parameter number `index` of a model seeded with `model_seed`:
// distinct per parameter, stable across releases (it is stored in model files).
uint64_t parameter_seed(uint64_t model_seed, uint64_t index);

} // namespace strata::zoo
