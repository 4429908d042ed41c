// The binary model loader (`.strata`), as `strata inspect`, `compile`, `run`
// and `convert` read a model: any bytes are refused with an error that names
// the file, or load as a model that satisfies check_model.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_util.h"
#include "fuzz/model_checks.h"
#include "serialization/model_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using namespace strata;
  const std::string &dir = fuzz::scratch_dir();
  auto graph = serialization::load_model_from_buffer(llvm::ArrayRef<uint8_t>(data, size),
                                                     "input.strata", dir);
  if (!graph.is_ok()) {
    fuzz::check_refusal(graph.status(), "input.strata");
    return 0;
  }
  fuzz::check_model(*graph, dir);
  return 0;
}
