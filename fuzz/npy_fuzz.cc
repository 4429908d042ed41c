// The .npy reader, as `strata run --input` reads an array: any bytes are
// refused with an error that names the file, or give a tensor that holds
// exactly its type's bytes and that npy_bytes writes back as a file reading
// to the same type and values, whose bytes are a fixed point.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "serialization/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using namespace strata;
  auto tensor = serialization::parse_npy(llvm::ArrayRef<uint8_t>(data, size), "input.npy");
  if (!tensor.is_ok()) {
    fuzz::check_refusal(tensor.status(), "input.npy");
    return 0;
  }
  fuzz::check(static_cast<int64_t>(tensor->size_bytes()) == tensor->type.size_bytes(),
              "a parsed array does not hold its type's bytes", tensor->type.to_string());

  std::vector<uint8_t> written = serialization::npy_bytes(*tensor);
  auto again = serialization::parse_npy(written, "npy_bytes");
  fuzz::check(again.is_ok(), "npy_bytes writes what parse_npy refuses", again.status().to_string());
  fuzz::check(again->type == tensor->type, "an array changes type over npy_bytes",
              again->type.to_string());
  fuzz::check(again->size_bytes() == tensor->size_bytes() &&
                  (tensor->size_bytes() == 0 ||
                   std::memcmp(again->data(), tensor->data(), tensor->size_bytes()) == 0),
              "an array changes values over npy_bytes");
  fuzz::check(serialization::npy_bytes(*again) == written, "npy_bytes is not a fixed point");
  return 0;
}
