// The `strata` command line: one binary, one subcommand per task.
//
// This file only declares the subcommands and their options (CLI11) and turns
// failures into `strata: error: <cause>` on stderr with a non-zero exit status.
// The work itself lives in tools/commands.h (inspect, run) and tools/zoo.h.
#include <algorithm>
#include <charconv>
#include <csignal>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>

#include <unistd.h>

#include <CLI/CLI.hpp>

#include "ops/registry.h"
#include "runtime/cuda_executor.h"
#include "runtime/mpi_world.h"
#include "serialization/file_io.h"
#include "serialization/model_io.h"
#include "serialization/onnx_import.h"
#include "tools/commands.h"
#include "tools/model_stats.h"
#include "tools/zoo.h"

namespace strata::tools {

// `strata calibrate` (tools/calibrate.cc).
void add_calibrate(CLI::App &app, std::function<Status()> &action);

namespace {

constexpr int kExitFailure = 1; // the command ran and failed
constexpr int kExitUsage = 2;   // the command line itself is wrong

using Action = std::function<Status()>;

// Where a command word is required and argv has an unknown one there, says so
// ("unknown command 'frobnicate'") rather than CLI11's "A subcommand is required".
std::optional<std::string> unknown_command(const CLI::App &app, int argc, char **argv) {
  const CLI::App *level = &app;
  std::string path = app.get_name();
  for (int i = 1; i < argc && level->get_require_subcommand_min() > 0; ++i) {
    std::string word = argv[i];
    if (word.empty() || word[0] == '-') return std::nullopt;
    std::string names;
    const CLI::App *next = nullptr;
    for (const CLI::App *sub : level->get_subcommands([](const CLI::App *) { return true; })) {
      names += (names.empty() ? "" : ", ") + sub->get_name();
      if (sub->check_name(word)) next = sub;
    }
    if (next == nullptr)
      return str_cat("unknown command '", word, "' for `", path, "` (one of: ", names, ")");
    level = next;
    path += " " + next->get_name();
  }
  return std::nullopt;
}

// Edits (insertions, deletions, substitutions) between two words.
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The first --word on the command line that the deepest subcommand reached
// does not have, with its closest option name (at most two edits away):
// "unknown option --step for `strata run` (did you mean --steps?)".
std::optional<std::string> unknown_option(const CLI::App &app, int argc, char **argv) {
  const CLI::App *level = &app;
  std::string path = app.get_name();
  while (!level->get_subcommands().empty()) {
    level = level->get_subcommands().front();
    path += " " + level->get_name();
  }
  for (int i = 1; i < argc; ++i) {
    std::string_view word = argv[i];
    if (word == "--") break;
    if (!word.starts_with("--") || word.size() < 3) continue;
    const std::string name(word.substr(2, word.find('=') - 2));
    bool known = false;
    std::string closest;
    size_t best = 3;
    for (const CLI::Option *option : level->get_options()) {
      for (const std::string &long_name : option->get_lnames()) {
        if (long_name == name) known = true;
        if (size_t d = edit_distance(name, long_name); d < best) {
          best = d;
          closest = long_name;
        }
      }
    }
    if (known) continue;
    return str_cat("unknown option --", name, " for `", path, "`",
                   closest.empty() ? std::string() : str_cat(" (did you mean --", closest, "?)"));
  }
  return std::nullopt;
}

// A validator for integers with a lower bound, with a plain message.
CLI::Validator at_least(int64_t low) {
  return CLI::Validator(
      [low](std::string &text) -> std::string {
        int64_t value = 0;
        if (!CLI::detail::lexical_cast(text, value)) return "'" + text + "' is not an integer";
        if (value < low) return str_cat("must be at least ", low, ", got ", value);
        return "";
      },
      str_cat("INT>=", low));
}

// ---------------------------------------------------------------------------
// zoo

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

void add_output_option(CLI::App *sub, std::string *path) {
  sub->add_option("-o,--output", *path, "model file to write: .strata (binary) or .json (text)")
      ->required()
      ->type_name("FILE");
}

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
  m->add_option("--batch", mlp.batch, "rows of x")->capture_default_str();
  m->add_option("--input", mlp.input, "features per row of x")->capture_default_str();
  CLI::Option *hidden =
      m->add_option("--hidden", mlp.hidden, "widths of the hidden layers, comma separated")
          ->delimiter(',')
          ->capture_default_str();
  CLI::Option *width =
      m->add_option("--width", mlp_width, "width of every hidden layer (with --depth)")
          ->check(at_least(1))
          ->excludes(hidden);
  m->add_option("--depth", mlp_depth, "number of hidden layers (with --width)")
      ->check(at_least(0))
      ->excludes(hidden)
      ->needs(width);
  width->needs("--depth");
  m->add_option("--classes", mlp.classes, "width of the logits")->capture_default_str();
  m->add_option("--seed", mlp.seed, "seed the parameter seeds derive from")->capture_default_str();
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
  c->add_option("--batch", conv.batch, "images per batch")->capture_default_str();
  c->add_option("--in-channels", conv.in_channels, "channels of the input image")
      ->capture_default_str();
  c->add_option("--image-size", conv.image_size,
                "height and width of the image; divisible by 2^stages")
      ->capture_default_str();
  c->add_option("--channels", conv.channels, "output channels of each conv stage, comma separated")
      ->delimiter(',')
      ->capture_default_str();
  c->add_option("--fc-hidden", conv.fc_hidden,
                "width of the hidden fully connected layer (0: none)")
      ->capture_default_str();
  c->add_option("--classes", conv.classes, "width of the logits")->capture_default_str();
  c->add_option("--seed", conv.seed, "seed the parameter seeds derive from")->capture_default_str();
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
  g->add_option("--layers", gpt.layers, "decoder layers")->capture_default_str();
  g->add_option("--hidden", gpt.hidden, "model width; divisible by --heads")->capture_default_str();
  g->add_option("--heads", gpt.heads, "attention heads")->capture_default_str();
  g->add_option("--seq", gpt.seq, "sequence length (tokens per row)")->capture_default_str();
  g->add_option("--vocab", gpt.vocab, "vocabulary size")->capture_default_str();
  g->add_option("--batch", gpt.batch, "rows of tokens")->capture_default_str();
  g->add_option("--init-std", gpt.init_std, "stddev of the normal initializer of the weights")
      ->capture_default_str();
  g->add_option("--seed", gpt.seed, "seed the parameter seeds derive from")->capture_default_str();
  add_output_option(g, &gpt_out);
  g->footer("Graph: token + position embeddings -> per layer: LayerNorm, causal multi-head\n"
            "self-attention, residual, LayerNorm, Gelu MLP (4x hidden), residual -> LayerNorm\n"
            "-> logits through the token embedding (tied head).\n"
            "Parameters: V*H + S*H + L*(12*H^2 + 13*H) + 2*H.\n\n"
            "Example:\n  strata zoo gpt --layers 2 --hidden 128 --heads 4 --seq 32 --vocab 512 "
            "-o gpt.strata\n  strata inspect gpt.strata");
  g->callback([&action] { action = [] { return save_zoo_model(zoo::make_gpt(gpt), gpt_out); }; });
}

// ---------------------------------------------------------------------------
// convert

void add_convert(CLI::App &app, Action &action) {
  static std::string in, out;
  CLI::App *sub = app.add_subcommand(
      "convert", "Convert a model (.strata <-> .json) or a plan (.splan <-> .splan.json)");
  sub->add_option("IN", in, "model or plan to read")->required()->type_name("FILE");
  sub->add_option("-o,--output", out, "model to write; the extension picks the format")
      ->required()
      ->type_name("FILE");
  sub->footer("The file is verified on the way in, and written canonically: converting\n"
              "binary -> JSON -> binary gives back the same bytes.\n\n"
              "A plan's JSON form is named *.splan.json; any JSON file whose first key is\n"
              "\"plan_version\" is read as a plan too.\n\n"
              "Examples:\n  strata convert gpt.strata -o gpt.json\n"
              "  strata convert gpt.json -o gpt.strata\n"
              "  strata convert train.splan -o train.splan.json");
  sub->callback([&action] {
    action = []() -> Status {
      RETURN_IF_ERROR(serialization::check_not_input(out, in));
      if (serialization::file_is_plan(in)) return convert_plan(in, out, std::cout);
      ASSIGN_OR_RETURN(Graph graph, load_model_file(in));
      RETURN_IF_ERROR(serialization::save_model(graph, out));
      std::cout << "wrote " << out << " (" << graph.num_nodes() << " nodes, "
                << grouped(graph.num_parameters()) << " parameters)\n";
      return Status::ok();
    };
  });
}

// ---------------------------------------------------------------------------
// import

// "1x3x224x224" -> {1, 3, 224, 224}.
Result<std::vector<int64_t>> parse_dims(const std::string &text, const std::string &spec) {
  std::vector<int64_t> dims;
  size_t start = 0;
  while (start <= text.size()) {
    size_t x = text.find('x', start);
    if (x == std::string::npos) x = text.size();
    const std::string part = text.substr(start, x - start);
    int64_t value = -1;
    auto [end, error] = std::from_chars(part.data(), part.data() + part.size(), value);
    if (part.empty() || error != std::errc() || end != part.data() + part.size() || value < 0)
      return invalid_argument("--input-shape '", spec,
                              "': dims must be counts joined by x, e.g. x=1x3x224x224");
    dims.push_back(value);
    start = x + 1;
  }
  return dims;
}

void add_import(CLI::App &app, Action &action) {
  static std::string in, out;
  static std::vector<std::string> shapes, constants;
  CLI::App *sub =
      app.add_subcommand("import", "Import an ONNX model (opsets 11-17) as a strata model");
  sub->add_option("MODEL", in, "the .onnx file (external data beside it)")->required();
  sub->add_option("-o,--output", out, "model to write (.strata or .json)")
      ->required()
      ->type_name("FILE");
  sub->add_option("--input-shape", shapes,
                  "fix a graph input's dims, NAME=D0xD1x... (repeatable); needed for dynamic "
                  "dims such as a batch axis")
      ->type_name("NAME=DIMS");
  sub->add_option("--constant", constants,
                  "import this floating initializer as a constant, not a trainable weight "
                  "(a buffer such as an attention mask; repeatable)")
      ->type_name("NAME");
  sub->footer(
      "Initializers become weights; shape computations (Shape, Gather on shapes,\n"
      "Concat, ConstantOfShape, Range, Constant ...) are folded at import, so the\n"
      "model has static shapes. An op strata lacks is an error listing every such op\n"
      "and its nodes. External data is read only from files in the model's folder.\n\n"
      "Examples:\n  strata import resnet18.onnx --input-shape input=1x3x224x224 -o r.strata\n"
      "  strata import model.onnx -o model.strata && strata inspect model.strata\n"
      "  strata compile model.strata --train --loss mse -o train.splan");
  sub->callback([&action] {
    action = []() -> Status {
      RETURN_IF_ERROR(serialization::check_not_input(out, in));
      serialization::OnnxImportOptions options;
      for (const std::string &spec : shapes) {
        const size_t eq = spec.rfind('=');
        if (eq == std::string::npos || eq == 0)
          return invalid_argument("--input-shape '", spec, "': expected NAME=D0xD1x...");
        ASSIGN_OR_RETURN(auto dims, parse_dims(spec.substr(eq + 1), spec));
        options.input_shapes[spec.substr(0, eq)] = dims;
      }
      options.constants.insert(constants.begin(), constants.end());
      std::vector<std::string> warnings;
      ASSIGN_OR_RETURN(Graph graph, serialization::import_onnx(in, options, &warnings));
      for (const std::string &warning : warnings)
        std::cerr << "strata: warning: " << in << ": " << warning << "\n";
      RETURN_IF_ERROR(serialization::save_model(graph, out));
      std::cout << "wrote " << out << " (" << graph.num_nodes() << " nodes, "
                << grouped(graph.num_parameters()) << " parameters) from " << in << "\n";
      return Status::ok();
    };
  });
}

// ---------------------------------------------------------------------------
// inspect

void add_inspect(CLI::App &app, Action &action) {
  static InspectArgs args;
  static std::string out_path;
  CLI::App *sub = app.add_subcommand(
      "inspect", "Show a model: inputs, outputs, parameters, FLOPs per forward, per-op and "
                 "per-node costs");
  sub->add_option("FILE", args.path, "model (.strata, .json) or plan (.splan, .splan.json)")
      ->required();
  sub->add_option("--format", args.format,
                  "text (for people), json (for scripts) or dot (Graphviz); for a pipeline "
                  "plan also trace (the predicted schedule as a Chrome / Perfetto trace)")
      ->check(CLI::IsMember({"text", "json", "dot", "trace"}))
      ->capture_default_str();
  CLI::Option *all = sub->add_flag("--all", args.all_nodes, "list every node in the text form");
  sub->add_flag("--comm", args.comm,
                "pipeline plan: list every send, receive and all-reduce per step, its size, "
                "predicted time and why it is there");
  sub->add_option("--nodes", args.max_nodes, "rows of the per-node table in the text form")
      ->check(at_least(0))
      ->excludes(all)
      ->capture_default_str();
  sub->add_option("-o,--output", out_path,
                  "write to this file instead of stdout (- or /dev/stdout: stdout)")
      ->type_name("FILE");
  sub->footer("FLOPs come from the op registry's cost model (a multiply-add counts 2).\n\n"
              "Examples:\n  strata inspect gpt.strata\n"
              "  strata inspect gpt.strata --format json | jq .flops\n"
              "  strata inspect gpt.strata --format dot -o gpt.dot && dot -Tsvg gpt.dot > gpt.svg\n"
              "  strata inspect train.splan               # mode, fingerprint, options, memory\n"
              "  strata inspect train.splan --format json # the plan's JSON form\n"
              "  strata inspect pp.splan --format trace -o predicted.json  # pipeline schedule");
  sub->callback([&action] {
    action = []() -> Status {
      // "-" and /dev/stdout are stdout, where earlier output keeps its place.
      if (out_path.empty() || out_path == "-" || out_path == "/dev/stdout")
        return inspect_command(args, std::cout);
      RETURN_IF_ERROR(serialization::check_not_input(out_path, args.path));
      std::ostringstream text;
      RETURN_IF_ERROR(inspect_command(args, text));
      return serialization::write_file_atomically(out_path, std::move(text).str());
    };
  });
}

// ---------------------------------------------------------------------------
// run

void add_run(CLI::App &app, Action &action) {
  static RunArgs args;
  CLI::App *sub = app.add_subcommand(
      "run", "Run a model or plan on the CPU or a GPU; a training plan trains for --steps steps");
  sub->add_option("FILE", args.model, "model (.strata, .json) or plan (.splan, .splan.json)")
      ->required();
  sub->add_option("-i,--input", args.inputs,
                  "input values as .npy: NAME=FILE, or FILE for the next input in graph order; "
                  "repeat for several inputs (default: random inputs)")
      ->type_name("[NAME=]FILE");
  CLI::Option *output =
      sub->add_option("-o,--output", args.output, "write the model's single output here (.npy)")
          ->type_name("FILE");
  sub->add_option("--output-dir", args.output_dir, "write every output here as <name>.npy")
      ->excludes(output)
      ->type_name("DIR");
  sub->add_option("--repeat", args.repeat, "timed runs")->check(at_least(1))->capture_default_str();
  sub->add_option("--warmup", args.warmup, "untimed runs first")
      ->check(at_least(0))
      ->capture_default_str();
  sub->add_option("--seed", args.seed, "seed of the random inputs or synthetic training batches")
      ->capture_default_str();
  sub->add_option("--steps", args.steps,
                  "training plan: train until this many steps are done (counting resumed ones)")
      ->check(at_least(1))
      ->capture_default_str();
  sub->add_option("--data", args.data,
                  "training plan: folder with <input>.npy for every graph input, batches "
                  "stacked on a new first dim (default: 8 fixed synthetic batches)")
      ->type_name("DIR");
  sub->add_option("--checkpoint", args.checkpoint,
                  "training plan: save the weights + manifest.json here at the end, and when "
                  "Ctrl-C or SIGTERM stops the run (after the step in flight); the previous save "
                  "stays loadable until the new one is complete. A folder that holds a "
                  "checkpoint is refused unless --resume names it")
      ->type_name("DIR");
  sub->add_option("--checkpoint-every", args.checkpoint_every,
                  "training plan: also save every K steps (needs --checkpoint)")
      ->check(at_least(0))
      ->capture_default_str();
  sub->add_option("--resume", args.resume,
                  "training plan: continue from this checkpoint (same plan fingerprint)")
      ->type_name("DIR");
  sub->add_option("--log-every", args.log_every, "training plan: print the loss every K steps")
      ->check(at_least(1))
      ->capture_default_str();
  sub->add_option("--backend", args.backend,
                  "where the model or plan runs: cpu, or cuda (cuBLASLt, cuDNN and strata's "
                  "kernels, each GPU's whole step as one CUDA Graph; a pipeline, data- or "
                  "tensor-parallel plan's devices become streams of one GPU, or spread over "
                  "several with --gpus)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  sub->add_option("--gpu", args.gpu,
                  "--backend cuda: the GPU to run on (CUDA device ordinal; under mpirun each "
                  "rank takes the GPU of its local rank instead)")
      ->check(at_least(0))
      ->capture_default_str();
  sub->add_option("--gpus", args.gpus,
                  "--backend cuda, pipeline plan: the GPU of each plan device, e.g. 0,0,1,1 for "
                  "4 devices on 2 GPUs. Devices on one GPU are streams of it; GPUs talk over "
                  "NCCL, a host thread each (a group is on one GPU or one member per GPU). "
                  "Default: every device on --gpu")
      ->type_name("LIST");
  sub->add_flag("!--no-cuda-graph", args.cuda_graph,
                "--backend cuda: launch every kernel each step instead of replaying the step "
                "captured as a CUDA Graph (for comparison)");
  sub->add_flag("--op-times", args.op_times,
                "a model or one-device plan: after the runs, time every node and print the "
                "time per op type (Conv2d, Conv2dGradInput, Conv2dGradWeight, ...), largest "
                "first. CPU: each node's median of five more runs; --backend cuda: one more "
                "run, eagerly, with an event after every node");
  sub->add_flag("--tf32", args.tf32,
                "--backend cuda: f32 matrix products on TF32 tensor cores (faster, ~1e-3 "
                "relative error)");
  sub->add_option("--precision", args.precision,
                  "--backend cuda: f32, bf16 or f16 (mixed precision: MatMul and Gemm multiply "
                  "half-precision operands on the tensor cores with f32 accumulation; weights, "
                  "optimizer state and every other op stay f32. f16 scales each operand by a "
                  "power of two that fits it into f16's range, so small gradients survive "
                  "without loss scaling)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  sub->add_option("--pool-norm", args.pool_norm,
                  "--backend cuda: who runs pooling and batch norm: cudnn (where cuDNN computes "
                  "the node as strata defines it: no dilation, even padding, output rounded "
                  "down; strata's kernels elsewhere) or strata (its own kernels, which match the "
                  "CPU element for element; for comparison)")
      ->check(CLI::IsMember({"cudnn", "strata"}))
      ->capture_default_str();
  sub->add_option("--trace", args.trace,
                  "pipeline plan: write what every device did (Chrome / Perfetto trace JSON)")
      ->type_name("FILE");
  sub->add_option("--clock", args.clock,
                  "pipeline plan on the CPU: how --trace is timed: wall, or device: each device "
                  "thread's own CPU time, joined where it waits for another device; the step as "
                  "a core per device would run it, on a machine with fewer free cores than the "
                  "plan has devices. Adds a `device` line (step time by that clock) after the "
                  "`steady` one (wall time); reading the clocks costs a few percent of wall time")
      ->check(CLI::IsMember({"wall", "device"}))
      ->capture_default_str();
  sub->add_option("--timeout", args.timeout_s,
                  "pipeline plan: seconds any device waits for another before the run fails "
                  "(--backend cuda: a GPU's whole step, and NCCL's start-up)")
      ->capture_default_str();
  sub->add_option("--devices-per-rank", args.devices_per_rank,
                  "pipeline plan under mpirun: plan devices each rank runs as threads, or "
                  "with --backend cuda as streams of its GPU (ranks x this = the plan's devices)")
      ->check(at_least(1))
      ->capture_default_str();
  sub->footer("Without --input, floating inputs are drawn from normal(0, 1) and index inputs\n"
              "(e.g. token ids) from the range they index. Prints the median and minimum time\n"
              "per run, the planned activation memory, and a checksum of each output.\n\n"
              "Examples:\n  strata run gpt.strata --repeat 10 --output logits.npy\n"
              "  strata run mlp.strata --input x=batch.npy --output-dir out/\n\n"
              "Training (a plan from `strata compile --train`): step k reads batch k mod the\n"
              "number of batches, so a run resumed from a checkpoint continues exactly where\n"
              "the interrupted one stopped. The run ends with the steady step time (the\n"
              "median from the third step on).\n"
              "  strata run train.splan --steps 100 --log-every 10 --checkpoint ckpt\n"
              "  strata run train.splan --steps 200 --resume ckpt --checkpoint ckpt\n"
              "  strata run train.splan --steps 50 --data batches/   # x.npy, labels.npy\n"
              "  strata run train.splan --steps 20 --op-times         # time per op type\n\n"
              "A pipeline plan's devices are CPU threads. On a machine with fewer free cores\n"
              "than devices, --clock device times the step as a core per device would run it.\n"
              "  strata run pp.splan --steps 5 --trace t.json     # open in ui.perfetto.dev\n"
              "  strata run pp.splan --steps 5 --clock device --trace t.json\n\n"
              "On a GPU (`strata ops --backend cuda` says which ops have CUDA kernels); a\n"
              "pipeline, data- or tensor-parallel plan runs its devices as streams of one GPU,\n"
              "or over several GPUs (--gpus, NCCL between them) or MPI ranks (a GPU each).\n"
              "The run ends with the host's time per step to issue the work (median after\n"
              "capture): the launch overhead that replaying the captured step removes.\n"
              "  strata run train.splan --steps 100 --backend cuda\n"
              "  strata run train.splan --steps 100 --backend cuda --no-cuda-graph\n"
              "  strata run train.splan --steps 100 --backend cuda --precision bf16\n"
              "  strata run train.splan --steps 20 --backend cuda --op-times\n"
              "  strata run pp.splan --steps 100 --backend cuda --gpu 1\n"
              "  strata run pp4.splan --steps 100 --backend cuda --gpus 0,0,1,1\n"
              "  mpirun -np 8 strata run pp8.splan --steps 100 --backend cuda\n\n"
              "Several processes (Open MPI): the same plan, one device per rank, or\n"
              "--devices-per-rank K threads per rank; rank 0 prints, every rank checks that\n"
              "all run the same plan and strata, and a lost rank ends the whole job.\n"
              "  mpirun -np 4 strata run pp.splan --steps 5\n"
              "  mpirun -np 2 strata run pp.splan --steps 5 --devices-per-rank 2\n"
              "  mpirun -np 8 --hostfile hosts strata run pp.splan --checkpoint /shared/ck");
  sub->callback([&action] {
    action = [] {
      args.interactive = isatty(STDOUT_FILENO) != 0;
      return run_command(args, std::cout);
    };
  });
}

// ---------------------------------------------------------------------------
// compile

void add_compile(CLI::App &app, Action &action) {
  static CompileArgs args;
  CLI::App *sub = app.add_subcommand(
      "compile", "Compile a model into a plan (.splan); with --train, a training-step plan");
  sub->add_option("MODEL", args.model, "model file (.strata or .json)")->required();
  CLI::Option *train = sub->add_flag(
      "--train", args.train, "add a loss, the backward pass and the optimizer step to the graph");
  sub->add_option("--loss", args.loss, "softmax_cross_entropy (integer labels) or mse (targets)")
      ->check(CLI::IsMember({"softmax_cross_entropy", "mse"}))
      ->needs(train)
      ->capture_default_str();
  sub->add_option("--optimizer", args.optimizer,
                  "NAME[:key=value,...]: sgd, adam or adamw; keys lr, momentum, nesterov, wd, "
                  "beta1, beta2, eps, schedule (constant|cosine), warmup, total, min_lr, clip. "
                  "Defaults as in torch.optim: wd 0, but 0.01 for adamw; betas 0.9, 0.999; eps "
                  "1e-8")
      ->needs(train)
      ->capture_default_str();
  sub->add_option("--loss-input", args.output_tensor,
                  "the model output the loss reads (default: the model's first output)")
      ->needs(train)
      ->type_name("NAME");
  // Every other command's --output is the file it writes; here that is -o.
  // --output (once the loss input's name) is caught to say so.
  static std::string misplaced_output;
  sub->add_option("--output", misplaced_output)->group("");
  sub->add_option("-o", args.out, "plan file to write: .splan (binary) or .splan.json (text)")
      ->type_name("FILE");
  sub->add_option("--mesh", args.mesh,
                  "device mesh DPxTPxPP: PP pipeline stages, each replicated DP times (data "
                  "parallelism; gradients all-reduced), each replica split over TP devices "
                  "(tensor parallelism)")
      ->needs(train)
      ->type_name("DPxTPxPP");
  sub->add_option("--microbatches", args.microbatches,
                  "split each batch into M micro-batches (M divides the batch); gradients are "
                  "averaged, one optimizer step per batch (default 1)")
      ->needs(train)
      ->check(at_least(1))
      ->type_name("M");
  sub->add_option("--schedule", args.schedule,
                  "pipeline schedule: gpipe (all forwards, then all backwards), 1f1b "
                  "(PipeDream-Flush: less activation memory, same result) or interleaved "
                  "(1F1B over --chunks model chunks per device, Megatron-LM's: a bubble about "
                  "--chunks times smaller for more transfers; micro-batches a multiple of the "
                  "stages)")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved"}))
      ->needs(train)
      ->capture_default_str();
  sub->add_option("--chunks", args.chunks,
                  "--schedule interleaved: model chunks per device; the model is cut into "
                  "stages x chunks virtual stages, virtual stage k on device k mod stages "
                  "(default 2)")
      ->check(CLI::Range(2, 1024))
      ->needs(train)
      ->type_name("V");
  sub->add_option("--cluster", args.cluster,
                  "cluster spec (JSON; see examples/clusters/, `strata calibrate`) the stages are "
                  "balanced and the step predicted for (default: a CPU with one device per stage)")
      ->needs(train)
      ->type_name("FILE");
  sub->add_option("--stage-boundaries", args.stage_boundaries,
                  "instead of searching, cut after these forward nodes (P-1 names, comma "
                  "separated, in order; with --schedule interleaved P x --chunks - 1)")
      ->needs(train)
      ->delimiter(',')
      ->type_name("NODE,...");
  CLI::Option *auto_flag = sub->add_flag(
      "--auto", args.auto_plan,
      "search the mesh (DPxTPxPP), micro-batches, schedule (gpipe, 1f1b, interleaved with 2 "
      "chunks), ZeRO-1 and recomputation for --devices devices; keep the fastest predicted plan "
      "that "
      "fits in memory (above 64 "
      "devices candidates are estimated from the stage search, and only the winner compiled)");
  sub->add_option("--devices", args.devices,
                  "--auto: devices to use (default: every device of --cluster)")
      ->needs(auto_flag)
      ->check(at_least(1));
  sub->add_flag("--explain", args.explain,
                "--auto: print the best candidates and why the winner won")
      ->needs(auto_flag);
  sub->add_option("--zero", args.zero,
                  "1: shard the optimizer state over the data-parallel replicas (ZeRO-1: "
                  "reduce-scatter gradients, update a shard, all-gather parameters)")
      ->check(CLI::Range(0, 1))
      ->needs(train);
  sub->add_flag("--split-activations", args.split_activations,
                "tensor parallelism: let partial sums become split activations (reduce-scatter, "
                "all-gather before the next whole use) where the cost model finds it cheaper, "
                "so the work between blocks is split too, as in Megatron-LM's sequence "
                "parallelism; without it every block ends in one all-reduce")
      ->needs(train);
  sub->add_option("--bucket-mb", args.bucket_mb,
                  "data parallelism: sum gradients over the replicas in buckets of about this "
                  "many MiB, each started as soon as its gradients are final so the reduction "
                  "overlaps the rest of backward (PyTorch DDP's default is 25); 0 reduces every "
                  "gradient on its own at the end of backward")
      ->default_val(25)
      ->check(CLI::Range(0.0, 1048576.0))
      ->needs(train);
  sub->add_flag("--recompute", args.recompute,
                "activation recomputation: keep only the activations between layers for the "
                "backward pass and recompute the rest (about one more forward pass, much less "
                "activation memory)")
      ->needs(train);
  sub->add_flag("--profile", args.profile,
                "time every node of the training step on this CPU and balance and predict with "
                "those times instead of the cluster's roofline");
  auto_flag->excludes(sub->get_option("--mesh"))
      ->excludes(sub->get_option("--microbatches"))
      ->excludes(sub->get_option("--schedule"))
      ->excludes(sub->get_option("--stage-boundaries"))
      ->excludes(sub->get_option("--chunks"))
      ->excludes(sub->get_option("--recompute"))
      ->needs(train);
  sub->footer(
      "A training plan adds an input 'labels' (i64, the output's shape without its last\n"
      "dim; softmax_cross_entropy) or 'targets' (the output's type; mse), the scalar\n"
      "'loss' (mean), the gradients and the optimizer's update; its only output is the\n"
      "loss. Gradient clipping and learning-rate schedules are options of the optimizer\n"
      "string. The same model and options always give a byte-identical plan; its\n"
      "fingerprint (SHA-256 of the model and the options) is checked by --resume.\n\n"
      "Examples:\n"
      "  strata compile mlp.strata --train --loss softmax_cross_entropy \\\n"
      "      --optimizer sgd:lr=0.1,momentum=0.9 -o train.splan\n"
      "  strata compile gpt.strata --train \\\n"
      "      --optimizer adamw:lr=3e-4,wd=0.1,clip=1,schedule=cosine,warmup=100,total=1000 \\\n"
      "      -o train.splan\n"
      "  strata compile mlp.strata --train --loss mse --optimizer adam:lr=1e-3 -o reg.splan\n"
      "  strata compile mlp.strata -o infer.splan     # inference plan\n"
      "  strata run train.splan --steps 100\n\n"
      "Pipeline parallelism: --mesh 1x1xP cuts the forward graph into P stages of about\n"
      "equal predicted time (the backward and optimizer work follows its forward node),\n"
      "inserts the sends and receives between stages, schedules M micro-batches with\n"
      "GPipe, 1F1B or interleaved 1F1B (--chunks model chunks per device), plans each\n"
      "device's memory and checks the programs for deadlocks.\n"
      "The result trains to the same weights as one device (see docs/architecture.md).\n"
      "  strata compile gpt.strata --train --mesh 1x1x4 --microbatches 8 --schedule 1f1b \\\n"
      "      -o pp.splan\n"
      "  strata compile gpt.strata --train --mesh 1x1x2 --microbatches 4 \\\n"
      "      --cluster examples/clusters/cpu-dev.json -o pp2.splan   # this 2-core machine\n"
      "  strata inspect pp.splan                        # stages, memory, predicted bubble\n"
      "  strata run pp.splan --steps 5 --trace t.json   # 4 device threads; Perfetto trace\n\n"
      "Data parallelism: --mesh DPx1xPP replicates each stage DP times; each replica\n"
      "takes 1/DP of the batch and gradients are summed over the replicas (ring or\n"
      "tree, whichever the cost model prefers), in buckets that overlap the rest of\n"
      "backward (--bucket-mb). --zero 1 also shards the optimizer state over the\n"
      "replicas (ZeRO-1).\n"
      "  strata compile gpt.strata --train --mesh 2x1x2 --microbatches 4 --zero 1 -o dp.splan\n\n"
      "Tensor parallelism: --mesh DPxTPxPP with TP > 1 splits every stage's work over\n"
      "TP devices. Nothing is annotated: the compiler picks each tensor's split by the\n"
      "cost model (on a GPT: Megatron-LM's column/row split, attention by heads, one\n"
      "all-reduce per block each way); `strata inspect --comm` says why each one is there.\n"
      "  strata compile gpt.strata --train --mesh 1x2x2 --microbatches 4 -o tp.splan\n\n"
      "Memory: --recompute keeps only the activations between layers for backward and\n"
      "recomputes the rest (same results, about one more forward pass).\n"
      "  strata compile gpt.strata --train --mesh 1x1x4 --microbatches 16 --recompute -o "
      "r.splan\n\n"
      "--auto searches all of the above for N devices of a cluster and explains its choice.\n"
      "  strata compile gpt.strata --train --auto --devices 8 --explain -o auto.splan");
  sub->callback([&action] {
    action = []() -> Status {
      if (!misplaced_output.empty())
        return invalid_argument("compile writes its plan with -o FILE, and --output is not one "
                                "of its options (the tensor the loss reads is --loss-input NAME)");
      if (args.out.empty())
        return invalid_argument("-o FILE is required: the plan file to write (.splan or "
                                ".splan.json)");
      return compile_command(args, std::cout);
    };
  });
}

// ---------------------------------------------------------------------------
// simulate

void add_simulate(CLI::App &app, Action &action) {
  static SimulateArgs args;
  CLI::App *sub = app.add_subcommand(
      "simulate", "Predict a pipeline plan's step time and bubble on another cluster");
  sub->add_option("PLAN", args.plan, "pipeline plan (.splan, .splan.json)")->required();
  sub->add_option("--cluster", args.cluster,
                  "cluster spec JSON (default: the one the plan was compiled for)")
      ->type_name("FILE");
  sub->add_option("--trace", args.trace, "write the predicted schedule as a Chrome trace")
      ->type_name("FILE");
  sub->footer("Every device's program is replayed against the others: computation takes its\n"
              "roofline time on the cluster's device, a transfer the link's latency plus\n"
              "bytes / bandwidth, and a receive waits for its send. The stages stay as\n"
              "compiled; recompile to rebalance them for the new cluster.\n\n"
              "Examples:\n"
              "  strata simulate pp.splan --cluster examples/clusters/h100-8x-nvlink.json\n"
              "  strata simulate pp.splan --trace predicted.json");
  sub->callback([&action] { action = [] { return simulate_command(args, std::cout); }; });
}

// ---------------------------------------------------------------------------
// ops

void add_ops(CLI::App &app, Action &action) {
  static bool verbose = false;
  static std::string backend;
  CLI::App *sub = app.add_subcommand("ops", "List the ops strata knows, with their summaries");
  sub->add_flag("-v,--verbose", verbose, "also list each op's inputs, attributes and backends");
  sub->add_option("--backend", backend, "only the ops this backend runs (cpu or cuda)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub->footer("Examples:\n  strata ops\n  strata ops --verbose\n  strata ops --backend cuda");
  sub->callback([&action] {
    action = [] {
      const auto &registry = ops::OpRegistry::global();
      const std::vector<std::string_view> cuda_ops = runtime::cuda_backend_ops();
      auto on_cuda = [&](const ops::OpDef *def) {
        // Ops without inputs (Constant) are computed once at load on any backend.
        return std::binary_search(cuda_ops.begin(), cuda_ops.end(), def->name) ||
               (def->max_inputs == 0 && def->cpu_kernel != nullptr);
      };
      auto listed = [&](const ops::OpDef *def) {
        if (backend == "cuda") return on_cuda(def);
        if (backend == "cpu") return def->cpu_kernel != nullptr;
        return true;
      };
      size_t width = 0;
      for (const ops::OpDef *def : registry.all())
        width = std::max(width, def->name.size());
      if (backend == "cuda" && cuda_ops.empty())
        std::cout << "(none: " << runtime::cuda_unavailable_reason() << ")\n";
      for (const ops::OpDef *def : registry.all()) {
        if (!listed(def)) continue;
        std::string name(def->name);
        std::cout << name << std::string(width + 2 - name.size(), ' ') << def->summary << '\n';
        if (!verbose) continue;
        std::string indent(width + 2, ' ');
        if (def->min_inputs == def->max_inputs)
          std::cout << indent << "inputs: " << def->min_inputs << '\n';
        else
          std::cout << indent << "inputs: " << def->min_inputs << " to " << def->max_inputs << '\n';
        for (const ops::AttrSpec &attr : def->attrs) {
          std::cout << indent << "  " << attr.name << ": " << attr_type_name(attr.type);
          if (attr.default_value)
            std::cout << " = " << attr_value_to_string(*attr.default_value);
          else
            std::cout << " (required)";
          if (!attr.doc.empty()) std::cout << " -- " << attr.doc;
          std::cout << '\n';
        }
        std::cout << indent << "backends: " << (def->cpu_kernel ? "cpu" : "")
                  << (def->cpu_kernel && on_cuda(def) ? ", " : "") << (on_cuda(def) ? "cuda" : "")
                  << '\n';
      }
      if (registry.all().empty()) std::cout << "(no ops registered)\n";
      return Status::ok();
    };
  });
}

// The deepest subcommand the parser reached, as "strata zoo gpt".
std::string command_path(const CLI::App &app) {
  std::string path = app.get_name();
  const CLI::App *current = &app;
  while (true) {
    auto subs = current->get_subcommands();
    if (subs.empty()) break;
    current = subs.front();
    path += " " + current->get_name();
  }
  return path;
}

} // namespace
} // namespace strata::tools

int main(int argc, char **argv) {
  using namespace strata::tools;
  const auto launch = strata::runtime::detect_mpi_launch();
  CLI::App app("strata: a graph-compiled dataflow engine for distributed deep learning.\n"
               "Models are graphs of ops; strata builds, converts, inspects and runs them.",
               "strata");
  app.require_subcommand(1);
  app.set_version_flag("--version", "strata " STRATA_VERSION);
  app.footer("Examples:\n"
             "  strata zoo gpt --layers 2 --batch 8 -o gpt.strata      # build a model\n"
             "  strata inspect gpt.strata                              # parameters, FLOPs\n"
             "  strata run gpt.strata --output logits.npy              # run it on the CPU\n"
             "  strata convert gpt.strata -o gpt.json                  # readable form\n"
             "  strata import resnet18.onnx -o resnet18.strata         # from ONNX (PyTorch)\n"
             "  strata compile gpt.strata --train --optimizer adamw:lr=1e-3 -o t.splan\n"
             "  strata run t.splan --steps 30                          # train it\n"
             "  strata compile gpt.strata --train --mesh 1x1x4 --microbatches 8 -o pp.splan\n"
             "  strata run pp.splan --steps 5 --trace t.json           # 4-stage pipeline\n\n"
             "Run `strata <command> --help` for a command's options.");

  Action action;
  add_zoo(app, action);
  add_convert(app, action);
  add_import(app, action);
  add_inspect(app, action);
  add_compile(app, action);
  add_run(app, action);
  add_simulate(app, action);
  add_ops(app, action);
  add_calibrate(app, action);

  if (auto unknown = unknown_command(app, argc, argv)) {
    std::cerr << "strata: error: " << *unknown << "\n";
    return kExitUsage;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    std::optional<std::string> unknown;
    if (dynamic_cast<const CLI::ExtrasError *>(&e) != nullptr)
      unknown = unknown_option(app, argc, argv);
    std::cerr << "strata: error: " << (unknown ? *unknown : one_line(e.what())) << " (see `"
              << command_path(app) << " --help`)\n";
    return kExitUsage;
  }
  if (!action) {
    std::cerr << "strata: error: no command given (see `strata --help`)\n";
    return kExitUsage;
  }
  strata::Status status = strata::Status::ok();
  try {
    status = action();
  } catch (const std::bad_alloc &) {
    // Whatever a model or plan asked for beyond the checks of its sizes.
    status =
        strata::failed_precondition("out of memory: this host cannot allocate what the run needs");
  }
  if (!status.is_ok()) {
    std::cout.flush();
    if (!strata::runtime::claim_failure_report()) return kExitFailure;
    // One write: under mpirun, several ranks' messages share one terminal.
    std::cerr << strata::str_cat(
                     "strata: error: ",
                     launch && launch->size > 1 ? strata::str_cat("rank ", launch->rank, ": ") : "",
                     one_line(status.message()), "\n")
              << std::flush;
    if (int signal_number = training_stop_signal(); signal_number != 0) {
      // End by the signal itself, so that a calling shell stops too (a loop
      // over runs ends at Ctrl-C); 128 + it should that return.
      std::signal(signal_number, SIG_DFL);
      std::raise(signal_number);
      return 128 + signal_number;
    }
    return kExitFailure;
  }
  return 0;
}
