// The .safetensors reader, as external weights and checkpoints are read: any
// file is refused with an error that names it, or gives tensors that each hold
// exactly their type's bytes and that read_safetensors_tensor, asked for one
// by name and type, reads to the same values.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz/fuzz_util.h"
#include "serialization/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using namespace strata;
  static const std::string path = fuzz::scratch_dir() + "/input.safetensors";
  fuzz::write_file(path, data, size);
  auto tensors = serialization::read_safetensors(path);
  if (!tensors.is_ok()) {
    fuzz::check_refusal(tensors.status(), path);
    return 0;
  }
  for (const auto &[name, tensor] : *tensors) {
    fuzz::check(name != "__metadata__", "the metadata entry was read as a tensor");
    fuzz::check(static_cast<int64_t>(tensor.size_bytes()) == tensor.type.size_bytes(),
                "a tensor does not hold its type's bytes", name);
    auto one = serialization::read_safetensors_tensor(path, name, tensor.type);
    fuzz::check(one.is_ok(), "a tensor read_safetensors gives cannot be read by name",
                one.status().to_string());
    fuzz::check(one->size_bytes() == tensor.size_bytes() &&
                    (tensor.size_bytes() == 0 ||
                     std::memcmp(one->data(), tensor.data(), tensor.size_bytes()) == 0),
                "a tensor read by name differs from the same tensor read with all", name);
  }
  return 0;
}
