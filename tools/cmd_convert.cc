// `strata convert`: a model (.strata <-> .json) or a plan (.splan <->
// .splan.json), verified on the way in and written canonically.
#include <filesystem>
#include <iostream>

#include "serialization/file_io.h"
#include "serialization/model_io.h"
#include "serialization/plan_io.h"
#include "tools/cli.h"
#include "tools/model_stats.h"

namespace strata::tools {
namespace {

Status convert_plan(const std::string &in, const std::string &out_path, std::ostream &out) {
  ASSIGN_OR_RETURN(serialization::Plan plan, load_plan_file(in));
  if (!serialization::is_plan_path(out_path) &&
      std::filesystem::path(out_path).extension() != ".json")
    return invalid_argument("'", in, "' is a plan; write it as .splan or .splan.json, not '",
                            out_path, "'");
  RETURN_IF_ERROR(serialization::save_plan(plan, out_path));
  out << "wrote " << out_path << " (" << serialization::plan_mode_name(plan.mode) << " plan, "
      << plan.graph.num_nodes() << " nodes)\n";
  return Status::ok();
}

} // namespace

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

} // namespace strata::tools
