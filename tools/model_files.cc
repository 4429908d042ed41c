#include "tools/model_files.h"

#include <filesystem>

#include "plan/verify.h"
#include "serialization/model_io.h"

namespace strata::tools {

Result<Graph> load_model_file(const std::string &path) {
  auto graph = serialization::load_model(path);
  if (!graph.is_ok()) {
    const Status &status = graph.status();
    if (status.message().find(path) == std::string::npos) return status.with_context(path);
    return status;
  }
  return graph;
}

Result<serialization::Plan> load_plan_file(const std::string &path) {
  ASSIGN_OR_RETURN(serialization::Plan plan, serialization::load_plan(path));
  RETURN_IF_ERROR(plan::verify_plan(plan).with_context(path));
  return plan;
}

std::string folder_of(const std::string &path) {
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  return folder.empty() ? std::string(".") : folder.string();
}

} // namespace strata::tools
