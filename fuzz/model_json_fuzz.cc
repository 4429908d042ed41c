// The JSON model loader (`.json`), as `strata inspect`, `compile`, `run` and
// `convert` read a model: any text is refused with an error that names the
// file, or loads as a model that satisfies check_model.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "fuzz/model_checks.h"
#include "serialization/model_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using namespace strata;
  const std::string &dir = fuzz::scratch_dir();
  std::string_view text(reinterpret_cast<const char *>(data), size);
  auto graph = serialization::load_model_from_json(text, "input.json", dir);
  if (!graph.is_ok()) {
    fuzz::check_refusal(graph.status(), "input.json");
    return 0;
  }
  fuzz::check_model(*graph, dir);
  return 0;
}
