// `strata zoo mlp|convnet|gpt`: builds a sample model and saves it.
#include <iostream>
#include <limits>

#include "serialization/model_io.h"
#include "tools/cli.h"
#include "tools/model_stats.h"
#include "tools/zoo.h"

namespace strata::tools {
namespace {

Status save_zoo_model(Result<Graph> built, const std::string &path) {
  if (!built.is_ok()) return built.status();
  const Graph &graph = *built;
  RETURN_IF_ERROR(serialization::save_model(graph, path));
  auto stats = compute_model_stats(graph);
  if (!stats.is_ok()) return stats.status();
  std::cout << "wrote " << path << ": " << graph.name() << ", " << grouped(stats->parameters)
            << " parameters (" << human_count(static_cast<double>(stats->parameters)) << ", "
            << human_bytes(static_cast<double>(stats->parameter_bytes)) << "), "
            << human_flops(stats->flops) << " per forward\n";
  return Status::ok();
}

// A size (batch, width, channels, ...): positive and within int32, so that
// the builders' products of a few sizes stay inside int64.
CLI::Range size_range(int64_t low = 1) {
  return CLI::Range(low, int64_t{std::numeric_limits<int32_t>::max()});
}
// Layers of a model.
CLI::Range layer_range(int64_t low) { return CLI::Range(low, int64_t{4096}); }

void add_output_option(CLI::App *sub, std::string *path) {
  sub->add_option("-o,--output", *path, "model file to write: .strata (binary) or .json (text)")
      ->required()
      ->type_name("FILE");
}

} // namespace

void add_zoo(CLI::App &app, Action &action) {
  CLI::App *zoo = app.add_subcommand("zoo", "Build a sample model and save it");
  zoo->require_subcommand(1);
  zoo->footer("Parameters are stored as initializers (kind, mean, stddev, seed), not data, so\n"
              "files stay small at any size; `strata run` draws them.\n\n"
              "Examples:\n"
              "  strata zoo gpt --layers 2 --hidden 128 --heads 4 -o gpt.strata\n"
              "  strata zoo mlp --hidden 512,256 -o mlp.json\n"
              "  strata zoo gpt --help");

  // mlp
  static zoo::MlpOptions mlp;
  static std::string mlp_out;
  static int64_t mlp_width = 0, mlp_depth = 0;
  CLI::App *m = zoo->add_subcommand(
      "mlp", "Multi-layer perceptron on x f32[batch, input] -> logits f32[batch, classes]");
  m->add_option("--batch", mlp.batch, "rows of x")->check(size_range())->capture_default_str();
  m->add_option("--input", mlp.input, "features per row of x")
      ->check(size_range())
      ->capture_default_str();
  CLI::Option *hidden =
      m->add_option("--hidden", mlp.hidden, "widths of the hidden layers, comma separated")
          ->delimiter(',')
          ->check(size_range())
          ->capture_default_str();
  CLI::Option *width =
      m->add_option("--width", mlp_width, "width of every hidden layer (with --depth)")
          ->check(size_range())
          ->excludes(hidden);
  m->add_option("--depth", mlp_depth, "number of hidden layers (with --width)")
      ->check(layer_range(0))
      ->excludes(hidden)
      ->needs(width);
  width->needs("--depth");
  m->add_option("--classes", mlp.classes, "width of the logits")
      ->check(size_range())
      ->capture_default_str();
  m->add_option("--seed", mlp.seed, "seed the parameter seeds derive from")
      ->transform(unsigned_64())
      ->capture_default_str();
  add_output_option(m, &mlp_out);
  m->footer("Graph: x -> (Gemm + Relu) per hidden layer -> Gemm -> logits.\n\n"
            "Example:\n  strata zoo mlp --batch 64 --input 784 --hidden 256,128 --classes 10 "
            "-o mlp.strata");
  m->callback([&action] {
    action = [] {
      if (mlp_width > 0) mlp.hidden.assign(static_cast<size_t>(mlp_depth), mlp_width);
      return save_zoo_model(zoo::make_mlp(mlp), mlp_out);
    };
  });

  // convnet
  static zoo::ConvnetOptions conv;
  static std::string conv_out;
  CLI::App *c = zoo->add_subcommand(
      "convnet", "Small CNN on images f32[batch, 3, size, size] -> logits f32[batch, classes]");
  c->add_option("--batch", conv.batch, "images per batch")
      ->check(size_range())
      ->capture_default_str();
  c->add_option("--in-channels", conv.in_channels, "channels of the input image")
      ->check(size_range())
      ->capture_default_str();
  c->add_option("--image-size", conv.image_size,
                "height and width of the image; divisible by 2^stages")
      ->check(size_range())
      ->capture_default_str();
  c->add_option("--channels", conv.channels, "output channels of each conv stage, comma separated")
      ->delimiter(',')
      ->check(size_range())
      ->capture_default_str();
  c->add_option("--fc-hidden", conv.fc_hidden,
                "width of the hidden fully connected layer (0: none)")
      ->check(size_range(0))
      ->capture_default_str();
  c->add_option("--classes", conv.classes, "width of the logits")
      ->check(size_range())
      ->capture_default_str();
  c->add_option("--seed", conv.seed, "seed the parameter seeds derive from")
      ->transform(unsigned_64())
      ->capture_default_str();
  add_output_option(c, &conv_out);
  c->footer("Graph: image -> (Conv2d 3x3 pad 1 + Relu + MaxPool2d 2x2) per stage -> Flatten\n"
            "-> Gemm + Relu -> Gemm -> logits.\n\n"
            "Example:\n  strata zoo convnet --batch 16 --image-size 32 --channels 32,64 "
            "-o cnn.strata");
  c->callback(
      [&action] { action = [] { return save_zoo_model(zoo::make_convnet(conv), conv_out); }; });

  // gpt
  static zoo::GptOptions gpt;
  static std::string gpt_out;
  CLI::App *g = zoo->add_subcommand(
      "gpt", "GPT-2 style decoder on tokens i64[batch, seq] -> logits f32[batch, seq, vocab]");
  g->add_option("--layers", gpt.layers, "decoder layers")
      ->check(layer_range(1))
      ->capture_default_str();
  g->add_option("--hidden", gpt.hidden, "model width; divisible by --heads")
      ->check(size_range())
      ->capture_default_str();
  g->add_option("--heads", gpt.heads, "attention heads")
      ->check(size_range())
      ->capture_default_str();
  g->add_option("--seq", gpt.seq,
                "sequence length (tokens per row; the causal mask, seq x seq floats, is kept in "
                "the model file)")
      ->check(CLI::Range(int64_t{1}, zoo::kMaxGptSeq))
      ->capture_default_str();
  g->add_option("--vocab", gpt.vocab, "vocabulary size")
      ->check(size_range())
      ->capture_default_str();
  g->add_option("--batch", gpt.batch, "rows of tokens")->check(size_range())->capture_default_str();
  g->add_option("--init-std", gpt.init_std, "stddev of the normal initializer of the weights")
      ->capture_default_str();
  g->add_option("--seed", gpt.seed, "seed the parameter seeds derive from")
      ->transform(unsigned_64())
      ->capture_default_str();
  add_output_option(g, &gpt_out);
  g->footer("Graph: token + position embeddings -> per layer: LayerNorm, causal multi-head\n"
            "self-attention, residual, LayerNorm, Gelu MLP (4x hidden), residual -> LayerNorm\n"
            "-> logits through the token embedding (tied head).\n"
            "Parameters: V*H + S*H + L*(12*H^2 + 13*H) + 2*H.\n\n"
            "Example:\n  strata zoo gpt --layers 2 --hidden 128 --heads 4 --seq 32 --vocab 512 "
            "-o gpt.strata\n  strata inspect gpt.strata");
  g->callback([&action] { action = [] { return save_zoo_model(zoo::make_gpt(gpt), gpt_out); }; });
}

} // namespace strata::tools
