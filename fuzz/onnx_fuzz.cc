// The ONNX importer, as `strata import` reads a model (without --input-shape
// or --constant). The input is written as model.onnx into a folder of this
// process's own that also holds weights.bin (six f32 values), so that
// external-data initializers have a file to read. Any file is refused with an
// error that is not an internal one, or imports as a graph that satisfies
// check_model (the importer promises the checks a model file is loaded with),
// and every external file it reports reading exists.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "fuzz/model_checks.h"
#include "serialization/onnx_import.h"

namespace {

const std::string &model_path() {
  static const std::string path = [] {
    const std::string &dir = strata::fuzz::scratch_dir();
    const float weights[6] = {0, 1, 2, 3, 4, 5};
    strata::fuzz::write_file(dir + "/weights.bin", reinterpret_cast<const uint8_t *>(weights),
                             sizeof weights);
    return dir + "/model.onnx";
  }();
  return path;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using namespace strata;
  const std::string &path = model_path();
  fuzz::write_file(path, data, size);
  std::vector<std::string> warnings, external_files;
  auto graph = serialization::import_onnx(path, {}, &warnings, &external_files);
  if (!graph.is_ok()) {
    fuzz::check_refusal(graph.status());
    return 0;
  }
  for (const std::string &file : external_files) {
    std::error_code error;
    fuzz::check(std::filesystem::exists(file, error), "the importer reports reading a missing file",
                file);
  }
  fuzz::check_model(*graph, fuzz::scratch_dir());
  return 0;
}
