#include "tools/zoo.h"

#include <cmath>
#include <limits>

#include "graph/builder.h"
#include "ops/registry.h"

namespace strata::zoo {

uint64_t parameter_seed(uint64_t model_seed, uint64_t index) {
  // SplitMix64 finalizer over the pair: neighbouring indices and seeds land far apart.
  uint64_t z = model_seed * 0x9E3779B97F4A7C15ull + (index + 1) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

namespace {

// A GraphBuilder that numbers parameters so each gets its own derived seed.
class ZooBuilder {
public:
  ZooBuilder(std::string name, uint64_t seed)
      : b(std::move(name), ops::OpRegistry::global()), seed_(seed) {}

  TensorId normal(std::string name, Shape shape, double stddev) {
    Initializer init{Initializer::Kind::kNormal, 0.0, stddev, next_seed()};
    return b.parameter(std::move(name), DType::kF32, std::move(shape), init);
  }
  TensorId zeros(std::string name, Shape shape) {
    Initializer init{Initializer::Kind::kZeros, 0.0, 0.0, next_seed()};
    return b.parameter(std::move(name), DType::kF32, std::move(shape), init);
  }
  TensorId ones(std::string name, Shape shape) {
    Initializer init{Initializer::Kind::kOnes, 0.0, 0.0, next_seed()};
    return b.parameter(std::move(name), DType::kF32, std::move(shape), init);
  }

  // A fully connected layer y = x W + b through Gemm (x is 2-D).
  TensorId dense(TensorId x, int64_t in, int64_t out, double stddev, const std::string &name) {
    TensorId w = normal(name + ".weight", {in, out}, stddev);
    TensorId bias = zeros(name + ".bias", {out});
    return b.op1("Gemm", {x, w, bias}, {}, name);
  }

  // y = x W + b through MatMul and Add (x of any rank >= 2).
  TensorId linear(TensorId x, int64_t in, int64_t out, double stddev, const std::string &name) {
    TensorId w = normal(name + ".weight", {in, out}, stddev);
    TensorId bias = zeros(name + ".bias", {out});
    TensorId y = b.op1("MatMul", {x, w}, {}, name);
    return b.op1("Add", {y, bias}, {}, name + ".add_bias");
  }

  TensorId layer_norm(TensorId x, int64_t width, const std::string &name) {
    TensorId scale = ones(name + ".scale", {width});
    TensorId bias = zeros(name + ".bias", {width});
    return b.op1("LayerNorm", {x, scale, bias}, {{"epsilon", 1e-5}}, name);
  }

  GraphBuilder b;

private:
  uint64_t next_seed() { return parameter_seed(seed_, index_++); }
  uint64_t seed_;
  uint64_t index_ = 0;
};

Status positive(int64_t value, std::string_view what) {
  if (value <= 0) return invalid_argument(what, " must be positive, got ", value);
  return Status::ok();
}

double he_std(int64_t fan_in) { return std::sqrt(2.0 / static_cast<double>(fan_in)); }

} // namespace

// ---------------------------------------------------------------------------
// mlp

int64_t mlp_parameter_count(const MlpOptions &o) {
  int64_t total = 0;
  int64_t width = o.input;
  for (int64_t h : o.hidden) {
    total += width * h + h;
    width = h;
  }
  return total + width * o.classes + o.classes;
}

Result<Graph> make_mlp(const MlpOptions &o) {
  RETURN_IF_ERROR(positive(o.batch, "mlp batch"));
  RETURN_IF_ERROR(positive(o.input, "mlp input width"));
  RETURN_IF_ERROR(positive(o.classes, "mlp classes"));
  for (int64_t h : o.hidden)
    RETURN_IF_ERROR(positive(h, "mlp hidden width"));

  ZooBuilder z("mlp", o.seed);
  TensorId x = z.b.input("x", DType::kF32, {o.batch, o.input});
  int64_t width = o.input;
  for (size_t i = 0; i < o.hidden.size(); ++i) {
    std::string name = str_cat("fc", i);
    x = z.dense(x, width, o.hidden[i], he_std(width), name);
    x = z.b.op1("Relu", {x}, {}, name + ".relu");
    width = o.hidden[i];
  }
  TensorId logits = z.dense(x, width, o.classes, 1.0 / std::sqrt(double(width)), "head");
  z.b.output(logits);
  return std::move(z.b).finish();
}

// ---------------------------------------------------------------------------
// convnet

namespace {
int64_t convnet_spatial_out(const ConvnetOptions &o) {
  return o.image_size >> static_cast<int>(o.channels.size());
}
} // namespace

int64_t convnet_parameter_count(const ConvnetOptions &o) {
  int64_t total = 0;
  int64_t c = o.in_channels;
  for (int64_t out : o.channels) {
    total += out * c * 3 * 3 + out;
    c = out;
  }
  int64_t s = convnet_spatial_out(o);
  int64_t width = c * s * s;
  if (o.fc_hidden > 0) {
    total += width * o.fc_hidden + o.fc_hidden;
    width = o.fc_hidden;
  }
  return total + width * o.classes + o.classes;
}

Result<Graph> make_convnet(const ConvnetOptions &o) {
  RETURN_IF_ERROR(positive(o.batch, "convnet batch"));
  RETURN_IF_ERROR(positive(o.in_channels, "convnet input channels"));
  RETURN_IF_ERROR(positive(o.image_size, "convnet image size"));
  RETURN_IF_ERROR(positive(o.classes, "convnet classes"));
  if (o.fc_hidden < 0)
    return invalid_argument("convnet fc hidden width must be >= 0, got ", o.fc_hidden);
  if (o.channels.empty()) return invalid_argument("convnet needs at least one conv stage");
  if (o.channels.size() > 16) return invalid_argument("convnet has at most 16 conv stages");
  for (int64_t c : o.channels)
    RETURN_IF_ERROR(positive(c, "convnet channels"));
  int64_t divisor = int64_t{1} << o.channels.size();
  if (o.image_size % divisor != 0)
    return invalid_argument("convnet image size ", o.image_size, " must be divisible by ", divisor,
                            " (", o.channels.size(), " stages of 2x2 pooling)");
  const int64_t s = convnet_spatial_out(o);
  auto flat = checked_num_elements({o.channels.back(), s, s});
  if (!flat.is_ok()) return flat.status().with_context("convnet features after the conv stages");

  ZooBuilder z("convnet", o.seed);
  TensorId x =
      z.b.input("image", DType::kF32, {o.batch, o.in_channels, o.image_size, o.image_size});
  int64_t c = o.in_channels;
  for (size_t i = 0; i < o.channels.size(); ++i) {
    std::string name = str_cat("conv", i);
    int64_t out = o.channels[i];
    TensorId w = z.normal(name + ".weight", {out, c, 3, 3}, he_std(c * 9));
    TensorId bias = z.zeros(name + ".bias", {out});
    x = z.b.op1("Conv2d", {x, w, bias}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}}, name);
    x = z.b.op1("Relu", {x}, {}, name + ".relu");
    x = z.b.op1(
        "MaxPool2d", {x},
        {{"kernel_shape", std::vector<int64_t>{2, 2}}, {"strides", std::vector<int64_t>{2, 2}}},
        name + ".pool");
    c = out;
  }
  x = z.b.op1("Flatten", {x}, {{"axis", int64_t{1}}}, "flatten");
  int64_t width = *flat;
  if (o.fc_hidden > 0) {
    x = z.dense(x, width, o.fc_hidden, he_std(width), "fc");
    x = z.b.op1("Relu", {x}, {}, "fc.relu");
    width = o.fc_hidden;
  }
  TensorId logits = z.dense(x, width, o.classes, 1.0 / std::sqrt(double(width)), "head");
  z.b.output(logits);
  return std::move(z.b).finish();
}

// ---------------------------------------------------------------------------
// gpt

int64_t gpt_parameter_count(const GptOptions &o) {
  const int64_t H = o.hidden;
  return o.vocab * H + o.seq * H + o.layers * (12 * H * H + 13 * H) + 2 * H;
}

Result<Graph> make_gpt(const GptOptions &o) {
  RETURN_IF_ERROR(positive(o.layers, "gpt layers"));
  RETURN_IF_ERROR(positive(o.hidden, "gpt hidden"));
  RETURN_IF_ERROR(positive(o.heads, "gpt heads"));
  RETURN_IF_ERROR(positive(o.seq, "gpt seq"));
  RETURN_IF_ERROR(positive(o.vocab, "gpt vocab"));
  RETURN_IF_ERROR(positive(o.batch, "gpt batch"));
  if (o.seq > kMaxGptSeq)
    return invalid_argument("gpt seq ", o.seq, " is longer than ", kMaxGptSeq,
                            ": the causal mask, a seq x seq f32 constant, is kept in the model "
                            "file, whose inline data stays under 1 GiB");
  if (o.hidden % o.heads != 0)
    return invalid_argument("gpt hidden (", o.hidden, ") must be divisible by heads (", o.heads,
                            ")");
  if (!(o.init_std > 0) || !std::isfinite(o.init_std))
    return invalid_argument("gpt init std must be positive, got ", o.init_std);

  const int64_t B = o.batch, S = o.seq, H = o.hidden, NH = o.heads, HD = H / NH, V = o.vocab;
  const double init_std = o.init_std;
  ZooBuilder z("gpt", o.seed);
  GraphBuilder &b = z.b;

  TensorId tokens = b.input("tokens", DType::kI64, {B, S});
  TensorId wte = z.normal("wte", {V, H}, init_std);
  TensorId wpe = z.normal("wpe", {S, H}, init_std);

  // Causal mask: 0 where a query may attend (key <= query), -1e9 above the diagonal.
  // A large finite value rather than -inf keeps Softmax free of inf - inf.
  auto mask_blob = Blob::zeroed(static_cast<size_t>(S * S) * sizeof(float));
  float *mask = reinterpret_cast<float *>(mask_blob->mutable_data());
  for (int64_t q = 0; q < S; ++q)
    for (int64_t k = q + 1; k < S; ++k)
      mask[q * S + k] = -1e9f;
  TensorId causal_mask = b.constant("attn.causal_mask", DType::kF32, {S, S}, std::move(mask_blob));
  TensorId scale =
      b.scalar(static_cast<float>(1.0 / std::sqrt(static_cast<double>(HD))), "attn.scale");

  TensorId h = b.op1("Gather", {wte, tokens}, {{"axis", int64_t{0}}}, "embed.tokens");
  h = b.op1("Add", {h, wpe}, {}, "embed.add_positions");

  for (int64_t l = 0; l < o.layers; ++l) {
    const std::string p = str_cat("layer", l);
    // Attention block.
    TensorId x = z.layer_norm(h, H, p + ".ln1");
    TensorId qkv = z.linear(x, H, 3 * H, init_std, p + ".attn.qkv");
    qkv = b.op1("Reshape", {qkv}, {{"shape", std::vector<int64_t>{B, S, 3, NH, HD}}},
                p + ".attn.split_heads");
    // [B, S, 3, NH, HD] -> [3, B, NH, S, HD], then one slice per q, k, v.
    qkv = b.op1("Transpose", {qkv}, {{"perm", std::vector<int64_t>{2, 0, 3, 1, 4}}},
                p + ".attn.heads_first");
    auto parts =
        b.op("Split", {qkv}, {{"axis", int64_t{0}}, {"split", std::vector<int64_t>{1, 1, 1}}},
             p + ".attn.split_qkv");
    TensorId qkv_parts[3] = {kInvalidTensor, kInvalidTensor, kInvalidTensor};
    static constexpr const char *kPartNames[3] = {"q", "k", "v"};
    for (size_t i = 0; i < 3 && parts.size() == 3; ++i)
      qkv_parts[i] = b.op1("Squeeze", {parts[i]}, {{"axes", std::vector<int64_t>{0}}},
                           p + ".attn." + kPartNames[i]);
    TensorId scores = b.op1("MatMul", {qkv_parts[0], qkv_parts[1]}, {{"trans_b", int64_t{1}}},
                            p + ".attn.scores");
    scores = b.op1("Mul", {scores, scale}, {}, p + ".attn.scale");
    scores = b.op1("Add", {scores, causal_mask}, {}, p + ".attn.mask");
    TensorId probs = b.op1("Softmax", {scores}, {{"axis", int64_t{-1}}}, p + ".attn.softmax");
    TensorId ctx = b.op1("MatMul", {probs, qkv_parts[2]}, {}, p + ".attn.context");
    ctx = b.op1("Transpose", {ctx}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}},
                p + ".attn.seq_first");
    ctx = b.op1("Reshape", {ctx}, {{"shape", std::vector<int64_t>{B, S, H}}},
                p + ".attn.merge_heads");
    TensorId attn = z.linear(ctx, H, H, init_std, p + ".attn.proj");
    h = b.op1("Add", {h, attn}, {}, p + ".attn.residual");

    // MLP block.
    x = z.layer_norm(h, H, p + ".ln2");
    x = z.linear(x, H, 4 * H, init_std, p + ".mlp.fc1");
    x = b.op1("Gelu", {x}, {}, p + ".mlp.gelu");
    x = z.linear(x, 4 * H, H, init_std, p + ".mlp.fc2");
    h = b.op1("Add", {h, x}, {}, p + ".mlp.residual");
  }

  h = z.layer_norm(h, H, "ln_f");
  // The output head reuses the token embedding: logits = h wte^T.
  TensorId logits = b.op1("MatMul", {h, wte}, {{"trans_b", int64_t{1}}}, "logits");
  b.output(logits);
  return std::move(b).finish();
}

} // namespace strata::zoo
