// `strata import`: an ONNX model as a strata model.
#include <charconv>
#include <filesystem>
#include <iostream>
#include <vector>

#include "serialization/file_io.h"
#include "serialization/model_io.h"
#include "serialization/onnx_import.h"
#include "tools/cli.h"
#include "tools/model_stats.h"

namespace strata::tools {
namespace {

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

// -o names a model file strata reads back: .strata (binary) or .json (text).
Status check_output_name(const std::string &out) {
  const std::filesystem::path extension = std::filesystem::path(out).extension();
  if (extension != ".strata" && extension != ".json")
    return invalid_argument("-o ", out,
                            ": import writes a strata model, named .strata (binary) "
                            "or .json (text)");
  if (out.ends_with(".splan.json"))
    return invalid_argument("-o ", out, ": .splan.json names a plan; a model is .strata or .json");
  return Status::ok();
}

// The model's external-data files are inputs too: writing over one would
// lose weights the model (and this import) reads.
Status check_not_external_data(const std::string &out, const std::string &in,
                               const std::vector<std::string> &external_files) {
  for (const std::string &file : external_files) {
    std::error_code error;
    if (std::filesystem::equivalent(out, file, error))
      return invalid_argument("the output ", out, " is ", file, ", external data of the input ", in,
                              "; write to another file (the weights would be lost)");
  }
  return Status::ok();
}

} // namespace

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
      RETURN_IF_ERROR(check_output_name(out));
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
      std::vector<std::string> warnings, external_files;
      ASSIGN_OR_RETURN(Graph graph,
                       serialization::import_onnx(in, options, &warnings, &external_files));
      RETURN_IF_ERROR(check_not_external_data(out, in, external_files));
      for (const std::string &warning : warnings)
        std::cerr << "strata: warning: " << in << ": " << warning << "\n";
      RETURN_IF_ERROR(serialization::save_model(graph, out));
      std::cout << "wrote " << out << " (" << graph.num_nodes() << " nodes, "
                << grouped(graph.num_parameters()) << " parameters) from " << in << "\n";
      return Status::ok();
    };
  });
}

} // namespace strata::tools
