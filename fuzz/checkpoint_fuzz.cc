// The checkpoint reader, as `strata run --resume` reads a folder. The input is
// the manifest's text, a NUL byte, then the bytes of the one data file
// (model-step1.safetensors), written to a folder of this process's own.
// "@SIZE@" and "@SHA256@" in the manifest stand for that file's size and
// SHA-256, so that mutated data still passes the checksum and reaches the
// safetensors reader. Any folder is refused with an error that names the
// manifest or the data file, or gives a checkpoint whose every tensor holds
// exactly its type's bytes and names the file it came from. A checkpoint with
// a layout record is then joined by it (plan/checkpoint_layout.h), as a
// resume on another plan joins it: refused with a named error, or every
// tensor whole, of its record's type.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "plan/checkpoint_layout.h"
#include "serialization/checkpoint.h"
#include "serialization/sha256.h"

namespace {

void replace_all(std::string &text, std::string_view from, std::string_view to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
}

const std::string &checkpoint_dir() {
  static const std::string dir = [] {
    std::string path = strata::fuzz::scratch_dir() + "/checkpoint";
    std::filesystem::create_directories(path);
    return path;
  }();
  return dir;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using namespace strata;
  const std::string &dir = checkpoint_dir();
  std::string_view input(reinterpret_cast<const char *>(data), size);
  size_t split = input.find('\0');
  std::string manifest(input.substr(0, split));
  std::string_view weights =
      split == std::string_view::npos ? std::string_view() : input.substr(split + 1);
  replace_all(manifest, "@SIZE@", std::to_string(weights.size()));
  replace_all(manifest, "@SHA256@", serialization::sha256_hex(weights));
  fuzz::write_file(dir + "/" + serialization::kCheckpointManifestFile, manifest);
  fuzz::write_file(dir + "/model-step1.safetensors", weights);

  auto checkpoint = serialization::read_checkpoint(dir, "");
  if (!checkpoint.is_ok()) {
    fuzz::check_refusal(checkpoint.status(), dir);
    return 0;
  }
  fuzz::check(checkpoint->step >= 0, "a checkpoint has a negative step count");
  fuzz::check(checkpoint->ranks >= 1, "a checkpoint was written by no ranks");
  fuzz::check(checkpoint->file_of.size() == checkpoint->tensors.size(),
              "a checkpoint's tensors and their files disagree");
  for (const auto &[name, tensor] : checkpoint->tensors) {
    fuzz::check(checkpoint->file_of.count(name) == 1, "a checkpoint tensor has no file", name);
    fuzz::check(static_cast<int64_t>(tensor.size_bytes()) == tensor.type.size_bytes(),
                "a checkpoint tensor does not hold its type's bytes", name);
  }
  if (checkpoint->layout.empty()) return 0;
  const serialization::CheckpointLayout layout = checkpoint->layout;
  Status joined = plan::join_checkpoint(*checkpoint, layout, dir);
  if (!joined.is_ok()) {
    fuzz::check_refusal(joined, dir);
    return 0;
  }
  for (const auto &[name, tensor] : checkpoint->tensors) {
    fuzz::check(checkpoint->file_of.count(name) == 1, "a joined tensor has no file", name);
    fuzz::check(static_cast<int64_t>(tensor.size_bytes()) == tensor.type.size_bytes(),
                "a joined tensor does not hold its type's bytes", name);
  }
  Status complete = plan::check_checkpoint_tensors(*checkpoint, plan::without_cuts(layout), dir);
  if (!complete.is_ok()) {
    fuzz::check_refusal(complete, dir);
    return 0;
  }
  for (const auto &[name, record] : layout.tensors)
    fuzz::check(checkpoint->tensors.at(name).type == record.type,
                "a checked tensor is not of its record's type", name);
  return 0;
}
