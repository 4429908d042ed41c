// ONNX import for builds without libonnx: says how to get it.
#include "serialization/onnx_import.h"

namespace strata::serialization {

bool onnx_import_built() { return false; }

Result<Graph> import_onnx(const std::string &path, const OnnxImportOptions &,
                          std::vector<std::string> *, std::vector<std::string> *) {
  return unimplemented(path, ": this strata was built without ONNX; install libonnx-dev and "
                             "libprotobuf-dev (scripts/setup) and rebuild to import it");
}

} // namespace strata::serialization
