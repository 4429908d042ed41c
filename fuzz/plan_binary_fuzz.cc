// The binary plan loader (`.splan`), as `strata run`, `inspect`, `simulate`
// and `convert` read a plan: any bytes are refused with an error that names
// the file, or load as a plan that satisfies check_plan.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_util.h"
#include "fuzz/plan_checks.h"
#include "serialization/plan_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using namespace strata;
  const std::string &dir = fuzz::scratch_dir();
  auto plan =
      serialization::load_plan_from_buffer(llvm::ArrayRef<uint8_t>(data, size), "input.splan", dir);
  if (!plan.is_ok()) {
    fuzz::check_refusal(plan.status(), "input.splan");
    return 0;
  }
  fuzz::check_plan(*plan, "input.splan", dir);
  return 0;
}
