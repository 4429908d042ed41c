// The cluster spec parser, as `strata compile --cluster` and `strata simulate
// --cluster` read a spec and `strata inspect` reads the one a plan embeds: any
// text is refused with an error that names the file, or parses to a spec that
// satisfies check_cluster.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz/cluster_checks.h"
#include "fuzz/fuzz_util.h"
#include "partitioner/cost/cluster.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using namespace strata;
  std::string_view text(reinterpret_cast<const char *>(data), size);
  auto spec = partitioner::parse_cluster(text, "input.json");
  if (!spec.is_ok()) {
    fuzz::check_refusal(spec.status(), "input.json");
    return 0;
  }
  fuzz::check_cluster(*spec);
  return 0;
}
