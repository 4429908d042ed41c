// The JSON plan loader (`.splan.json`), as `strata run`, `inspect`, `simulate`
// and `convert` read a plan: any text is refused with an error that names the
// file, or loads as a plan that satisfies check_plan.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "fuzz/plan_checks.h"
#include "serialization/plan_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using namespace strata;
  const std::string &dir = fuzz::scratch_dir();
  std::string_view text(reinterpret_cast<const char *>(data), size);
  auto plan = serialization::load_plan_from_json(text, "input.splan.json", dir);
  if (!plan.is_ok()) {
    fuzz::check_refusal(plan.status(), "input.splan.json");
    return 0;
  }
  fuzz::check_plan(*plan, "input.splan.json", dir);
  return 0;
}
