// The op cases the CUDA backend is checked on: one node each, on inputs
// random_inputs makes valid. The GPU test (tests/runtime/cuda_executor_test.cc)
// runs them through the CUDA executor, the emulator test
// (ops/cuda_emulation_test.cc) through the op table on the CUDA emulator.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "graph/builder.h"
#include "graph/graph.h"
#include "ops/registry.h"
#include "strata_config.h"

namespace strata::test {

struct OpCase {
  std::string op;
  std::vector<Attribute> attrs;
  std::vector<TensorType> inputs;
  double tolerance = 1e-5;
  bool positive = false; // float inputs made positive (logs, roots, Adam's v)
};

// Relative difference of a against the reference b, scaled by max(1, |b|);
// two NaNs agree.
inline double difference(double a, double b) {
  if (std::isnan(a) && std::isnan(b)) return 0;
  return std::fabs(a - b) / std::max(1.0, std::fabs(b));
}

inline std::string describe(const OpCase &c) {
  std::string text = c.op + "(";
  for (const TensorType &t : c.inputs)
    text += t.to_string() + " ";
  return text + ")";
}

inline std::vector<OpCase> op_cases() {
  const DType f = DType::kF32;
  auto ints = [](std::vector<int64_t> v) { return AttrValue{std::move(v)}; };
  std::vector<OpCase> cases;
  for (const char *op : {"Relu", "Tanh", "Sigmoid", "Exp", "Neg", "Erf"})
    cases.push_back({op, {}, {{f, {3, 70}}}});
  cases.push_back({"Gelu", {}, {{f, {300}}}});
  cases.push_back({"Gelu", {{"approximate", std::string("tanh")}}, {{f, {300}}}});
  cases.push_back({"Log", {}, {{f, {64}}}, 1e-5, true});
  cases.push_back({"Sqrt", {}, {{f, {64}}}, 1e-5, true});
  cases.push_back({"Clip", {{"min", -0.5}, {"max", 0.5}}, {{f, {50}}}});
  cases.push_back({"Add", {}, {{f, {2, 3, 4}}, {f, {4}}}});
  cases.push_back({"Add", {}, {{DType::kI64, {}}, {DType::kI64, {}}}});
  cases.push_back({"Mul", {}, {{DType::kI32, {3, 4}}, {DType::kI32, {4}}}});
  cases.push_back({"Sub", {}, {{f, {2, 1, 4}}, {f, {3, 1}}}});
  cases.push_back({"Mul", {}, {{f, {5, 7}}, {f, {5, 7}}}});
  cases.push_back({"Div", {}, {{f, {4, 3}}, {f, {1, 3}}}, 1e-5, true});
  cases.push_back({"Pow", {}, {{f, {20}}, {f, {20}}}, 1e-5, true});
  for (const char *op : {"ReluGrad", "TanhGrad", "SigmoidGrad", "GeluGrad"})
    cases.push_back({op, {}, {{f, {4, 33}}, {f, {4, 33}}}});
  cases.push_back({"GeluGrad", {{"approximate", std::string("tanh")}}, {{f, {99}}, {f, {99}}}});
  cases.push_back({"ClipGrad", {{"min", -0.3}, {"max", 0.2}}, {{f, {40}}, {f, {40}}}});
  cases.push_back({"Expand", {{"shape", ints({2, 3, 4})}}, {{f, {3, 1}}}});
  cases.push_back({"Transpose", {{"perm", ints({2, 0, 1})}}, {{f, {2, 3, 4}}}});
  cases.push_back({"Transpose", {}, {{DType::kI64, {3, 5}}}});
  cases.push_back({"Reshape", {{"shape", ints({4, -1})}}, {{f, {2, 3, 4}}}});
  cases.push_back({"Concat", {{"axis", int64_t{1}}}, {{f, {2, 3, 4}}, {f, {2, 1, 4}}}});
  const std::vector<Attribute> cut = {{"starts", ints({1, -1})},
                                      {"ends", ints({4, -100})},
                                      {"axes", ints({0, 2})},
                                      {"steps", ints({2, -2})}};
  cases.push_back({"Slice", cut, {{f, {5, 3, 6}}}});
  cases.push_back({"Slice", cut, {{DType::kI64, {5, 3, 6}}}});
  std::vector<Attribute> cut_grad = cut;
  cut_grad.push_back({"shape", ints({5, 3, 6})});
  cases.push_back({"SliceGrad", cut_grad, {{f, {2, 3, 3}}}});
  cases.push_back({"Where", {}, {{DType::kBool, {3, 1}}, {f, {3, 4}}, {f, {4}}}});
  cases.push_back({"Where", {}, {{DType::kBool, {5}}, {DType::kI64, {5}}, {DType::kI64, {}}}});
  for (const char *to : {"i32", "i64", "bool", "f32"})
    cases.push_back({"Cast", {{"to", std::string(to)}}, {{f, {40}}}});
  cases.push_back({"Cast", {{"to", std::string("f32")}}, {{DType::kI64, {40}}}});
  cases.push_back({"Cast", {{"to", std::string("i32")}}, {{DType::kBool, {40}}}});
  cases.push_back({"Split", {{"axis", int64_t{1}}, {"split", ints({2, 3})}}, {{f, {2, 5, 3}}}});
  cases.push_back({"ReduceSum", {{"axes", ints({1})}, {"keepdims", int64_t{0}}}, {{f, {3, 4, 5}}}});
  cases.push_back({"ReduceMean", {{"axes", ints({0, 2})}}, {{f, {3, 4, 5}}}});
  cases.push_back({"ReduceMax", {}, {{f, {3, 4, 5}}}});
  // Few outputs folding many elements: the block-per-output kernels.
  cases.push_back({"ReduceSum", {{"axes", ints({0, 2})}}, {{f, {40, 3, 100}}}});
  cases.push_back({"ReduceMax", {{"keepdims", int64_t{0}}}, {{f, {50, 90}}}});
  cases.push_back({"ReduceMaxGrad", {{"axes", ints({0, 2})}}, {{f, {1, 4, 1}}, {f, {3, 4, 5}}}});
  cases.push_back({"Dropout",
                   {{"training", int64_t{1}}, {"ratio", 0.3}, {"seed", int64_t{7}}},
                   {{f, {1000}}, {DType::kI64, {}}}});
  cases.push_back({"Dropout", {{"training", int64_t{1}}, {"ratio", 0.5}}, {{f, {33}}}});
  cases.push_back({"Dropout", {}, {{f, {33}}}});
  for (const char *reduction : {"mean", "sum", "none"}) {
    const bool none = std::string(reduction) == "none";
    cases.push_back(
        {"MseLoss", {{"reduction", std::string(reduction)}}, {{f, {6, 7}}, {f, {6, 7}}}});
    cases.push_back({"MseLossGrad",
                     {{"reduction", std::string(reduction)}},
                     {{f, none ? Shape{6, 7} : Shape{}}, {f, {6, 7}}, {f, {6, 7}}}});
  }
  cases.push_back({"Softmax", {}, {{f, {4, 300}}}});
  cases.push_back({"Softmax", {{"axis", int64_t{1}}}, {{f, {2, 5, 3}}}});
  cases.push_back({"LogSoftmax", {}, {{f, {3, 17}}}});
  cases.push_back({"SoftmaxGrad", {}, {{f, {4, 9}}, {f, {4, 9}}}});
  cases.push_back({"LogSoftmaxGrad", {{"axis", int64_t{0}}}, {{f, {4, 9}}, {f, {4, 9}}}});
  cases.push_back({"LayerNorm", {}, {{f, {6, 40}}, {f, {40}}, {f, {40}}}});
  cases.push_back(
      {"LayerNorm", {{"axis", int64_t{1}}}, {{f, {3, 4, 5}}, {f, {4, 5}}, {f, {4, 5}}}});
  cases.push_back({"LayerNormGrad", {}, {{f, {6, 40}}, {f, {6, 40}}, {f, {40}}}});
  for (const char *reduction : {"mean", "sum", "none"})
    cases.push_back({"SoftmaxCrossEntropy",
                     {{"reduction", std::string(reduction)}},
                     {{f, {8, 10}}, {DType::kI64, {8}}}});
  cases.push_back({"SoftmaxCrossEntropy", {}, {{f, {2, 3, 7}}, {DType::kI32, {2, 3}}}});
  cases.push_back({"SoftmaxCrossEntropyGrad", {}, {{f, {}}, {f, {8, 10}}, {DType::kI64, {8}}}});
  cases.push_back({"SoftmaxCrossEntropyGrad",
                   {{"reduction", std::string("none")}},
                   {{f, {8}}, {f, {8, 10}}, {DType::kI32, {8}}}});
  // The vocabulary-parallel loss as one member of one (parts 1): the same
  // kernels as in a group, whose pieces the pipeline tests cover. Positive
  // statistics: their sums go through a log.
  const Attribute one_part{"parts", int64_t{1}};
  cases.push_back({"VocabParallelStats", {one_part}, {{f, {8, 10}}, {DType::kI64, {8}}}});
  for (const char *reduction : {"mean", "none"}) {
    const std::vector<Attribute> attrs = {one_part, {"reduction", std::string(reduction)}};
    const bool none = std::string_view(reduction) == "none";
    cases.push_back({"VocabParallelCrossEntropy",
                     attrs,
                     {{f, {8, 10}}, {DType::kI64, {8}}, {f, {8, 3}}},
                     1e-5,
                     true});
    cases.push_back(
        {"VocabParallelCrossEntropyGrad",
         attrs,
         {{f, none ? Shape{8} : Shape{}}, {f, {8, 10}}, {DType::kI32, {8}}, {f, {8, 3}}},
         1e-5,
         true});
  }
  cases.push_back({"Gather", {}, {{f, {10, 4}}, {DType::kI64, {2, 3}}}});
  cases.push_back({"Gather", {{"axis", int64_t{1}}}, {{f, {3, 7, 2}}, {DType::kI32, {4}}}});
  cases.push_back({"GatherGrad", {{"shape", ints({10, 4})}}, {{f, {12, 4}}, {DType::kI64, {12}}}});
  const std::vector<Attribute> window = {
      {"kernel_shape", ints({3, 3})}, {"strides", ints({2, 2})}, {"pads", ints({1, 1, 1, 1})}};
  std::vector<Attribute> dilated = {{"kernel_shape", ints({2, 3})},
                                    {"strides", ints({2, 1})},
                                    {"pads", ints({0, 1, 1, 0})},
                                    {"dilations", ints({2, 1})},
                                    {"ceil_mode", int64_t{1}}};
  // `window` and `convnet` run through cuDNN by default, `dilated` never.
  const std::vector<Attribute> convnet = {{"kernel_shape", ints({2, 2})},
                                          {"strides", ints({2, 2})}};
  cases.push_back({"MaxPool2d", window, {{f, {2, 3, 9, 8}}}});
  cases.push_back({"MaxPool2d", convnet, {{f, {2, 3, 8, 6}}}});
  cases.push_back({"MaxPool2d", dilated, {{f, {2, 3, 9, 8}}}});
  cases.push_back({"MaxPool2dGrad", window, {{f, {2, 3, 5, 4}}, {f, {2, 3, 9, 8}}}});
  cases.push_back({"MaxPool2dGrad", dilated, {{f, {2, 3, 5, 7}}, {f, {2, 3, 9, 8}}}});
  std::vector<Attribute> average = window;
  cases.push_back({"AveragePool2d", average, {{f, {2, 3, 9, 8}}}});
  average.push_back({"count_include_pad", int64_t{1}});
  cases.push_back({"AveragePool2d", average, {{f, {2, 3, 9, 8}}}});
  average.push_back({"input_shape", ints({2, 3, 9, 8})});
  cases.push_back({"AveragePool2dGrad", average, {{f, {2, 3, 5, 4}}}});
  cases.push_back({"GlobalAveragePool", {}, {{f, {2, 3, 5, 7}}}});
  const std::vector<TensorType> bn = {{f, {4, 3, 5, 6}}, {f, {3}}, {f, {3}}, {f, {3}}, {f, {3}}};
  // cuDNN's batch statistics are summed in another order than the CPU's.
  cases.push_back({"BatchNormalization", {{"training", int64_t{1}}}, bn, 1e-4});
  cases.push_back({"BatchNormalization", {}, bn, 1e-5, true}); // var > 0
  const std::vector<TensorType> bn1d = {{f, {8, 5}}, {f, {5}}, {f, {5}}, {f, {5}}, {f, {5}}};
  cases.push_back({"BatchNormalization", {{"training", int64_t{1}}}, bn1d, 1e-4});
  cases.push_back({"BatchNormStats", {}, {{f, {4, 3, 5, 6}}}});
  cases.push_back(
      {"BatchNormalizationGrad", {}, {{f, {4, 3, 5, 6}}, {f, {4, 3, 5, 6}}, {f, {3}}}, 1e-4});
  cases.push_back({"BatchNormalizationGrad", {}, {{f, {8, 5}}, {f, {8, 5}}, {f, {5}}}, 1e-4});
  cases.push_back(
      {"GlobalAveragePoolGrad", {{"input_shape", ints({2, 3, 5, 7})}}, {{f, {2, 3, 1, 1}}}});
  if (STRATA_HAVE_CUDNN) {
    const std::vector<Attribute> conv = {{"strides", ints({2, 1})},
                                         {"pads", ints({1, 2, 1, 2})},
                                         {"dilations", ints({1, 2})},
                                         {"group", int64_t{2}}};
    cases.push_back({"Conv2d", conv, {{f, {2, 4, 9, 8}}, {f, {6, 2, 3, 3}}, {f, {6}}}, 1e-4});
    cases.push_back({"Conv2d", {}, {{f, {2, 3, 8, 8}}, {f, {5, 3, 3, 3}}}, 1e-4});
    std::vector<Attribute> grad_input = conv;
    grad_input.push_back({"input_shape", ints({2, 4, 9, 8})});
    cases.push_back({"Conv2dGradInput", grad_input, {{f, {2, 6, 5, 8}}, {f, {6, 2, 3, 3}}}, 1e-4});
    std::vector<Attribute> grad_weight = conv;
    grad_weight.push_back({"weight_shape", ints({6, 2, 3, 3})});
    cases.push_back(
        {"Conv2dGradWeight", grad_weight, {{f, {2, 6, 5, 8}}, {f, {2, 4, 9, 8}}}, 1e-4});
  }
  cases.push_back({"MatMul", {}, {{f, {2, 3, 4, 5}}, {f, {5, 6}}}, 1e-4});
  cases.push_back({"MatMul", {}, {{f, {4, 5}}, {f, {2, 5, 3}}}, 1e-4});
  cases.push_back({"MatMul", {{"trans_b", int64_t{1}}}, {{f, {3, 4, 5}}, {f, {3, 6, 5}}}, 1e-4});
  cases.push_back({"MatMul", {{"trans_a", int64_t{1}}}, {{f, {3, 5, 4}}, {f, {3, 5, 6}}}, 1e-4});
  // Blocks of strided products: 2 of 3 (A fixed within a block), and 2 of
  // 3 with B's weights shared over the outer batch.
  cases.push_back({"MatMul", {}, {{f, {2, 1, 3, 4}}, {f, {1, 3, 4, 2}}}, 1e-4});
  cases.push_back({"MatMul", {}, {{f, {2, 3, 4, 5}}, {f, {3, 5, 6}}}, 1e-4});
  cases.push_back({"MatMul", {}, {{f, {5}}, {f, {5, 3}}}, 1e-4});
  cases.push_back({"MatMul", {}, {{f, {2, 4, 5}}, {f, {5}}}, 1e-4});
  cases.push_back(
      {"Gemm", {{"alpha", 0.5}, {"beta", 2.0}}, {{f, {4, 5}}, {f, {5, 3}}, {f, {3}}}, 1e-4});
  cases.push_back({"Gemm",
                   {{"trans_a", int64_t{1}}, {"trans_b", int64_t{1}}},
                   {{f, {5, 4}}, {f, {3, 5}}, {f, {4, 1}}},
                   1e-4});
  cases.push_back({"SgdUpdate",
                   {{"momentum", 0.9}, {"weight_decay", 0.01}},
                   {{f, {50}}, {f, {50}}, {f, {}}, {f, {50}}, {DType::kI64, {}}}});
  cases.push_back({"SgdUpdate",
                   {{"momentum", 0.9}, {"nesterov", int64_t{1}}},
                   {{f, {50}}, {f, {50}}, {f, {}}, {f, {50}}}});
  cases.push_back({"AdamUpdate",
                   {{"decoupled", int64_t{1}}, {"weight_decay", 0.1}},
                   {{f, {64}}, {f, {64}}, {f, {64}}, {f, {64}}, {f, {}}, {DType::kI64, {}}},
                   1e-5,
                   true});
  cases.push_back({"AdamUpdate",
                   {{"weight_decay", 0.1}},
                   {{f, {64}}, {f, {64}}, {f, {64}}, {f, {64}}, {f, {}}, {DType::kI64, {}}},
                   1e-5,
                   true});
  cases.push_back({"GlobalNormScale", {{"max_norm", 0.5}}, {{f, {300}}, {f, {7, 9}}, {f, {}}}});
  cases.push_back({"GlobalNormScale", {{"max_norm", 1e4}}, {{f, {50}}}});
  cases.push_back({"SumOfSquares", {}, {{f, {40000}}, {f, {3}}}});
  cases.push_back({"NormScale", {{"max_norm", 1.0}}, {{f, {2}}, {f, {2}}}, 1e-5, true});
  cases.push_back({"LearningRate",
                   {{"base_lr", 0.1},
                    {"schedule", std::string("cosine")},
                    {"warmup_steps", int64_t{1}},
                    {"total_steps", int64_t{10}}},
                   {{DType::kI64, {}}}});
  return cases;
}

inline Graph one_node(const OpCase &c) {
  GraphBuilder b("one_" + c.op, ops::OpRegistry::global());
  std::vector<TensorId> inputs;
  for (size_t i = 0; i < c.inputs.size(); ++i)
    inputs.push_back(b.input(str_cat("in", i), c.inputs[i].dtype, c.inputs[i].shape));
  for (TensorId id : b.op(c.op, inputs, c.attrs, "node"))
    b.output(id);
  auto graph = std::move(b).finish();
  EXPECT_TRUE(graph.is_ok()) << describe(c) << ": " << graph.status().message();
  return graph.is_ok() ? std::move(graph).value() : Graph("broken");
}

} // namespace strata::test
