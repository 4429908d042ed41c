// Reading model and plan files the way every front end does (the `strata`
// command line and the Python module): the path in every error, and a plan's
// programs checked for what they mean before anyone runs or describes them.
#pragma once

#include <string>

#include "graph/graph.h"
#include "serialization/plan_io.h"

namespace strata::tools {

// Loads a model file and adds the path to any error that does not name it.
Result<Graph> load_model_file(const std::string &path);
// Loads a plan file and checks what its programs mean (plan/verify.h), so
// that no command reads an edited or corrupted plan as a good one. Errors
// name the path.
Result<serialization::Plan> load_plan_file(const std::string &path);

// The folder a model or plan file is in ("." for a bare name): where its
// external data paths start.
std::string folder_of(const std::string &path);

} // namespace strata::tools
