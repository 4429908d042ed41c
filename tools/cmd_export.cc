// `strata export`: a checkpoint's weights as .safetensors for PyTorch and
// Hugging Face. The pieces any layout wrote (ZeRO-1 shards, tensor-parallel
// cuts, a file per rank) are joined by the checkpoint's layout record
// (plan/checkpoint_layout.h), and the parameters (with --with-optimizer
// every state tensor too) are written whole under their own names: one file,
// or above --max-shard-size Hugging Face's sharded layout, files
// <stem>-00001-of-0000N.safetensors and the index <OUT>.index.json.
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/units.h"
#include "plan/checkpoint_layout.h"
#include "serialization/checkpoint.h"
#include "serialization/file_io.h"
#include "serialization/safetensors.h"
#include "tools/cli.h"
#include "tools/plan_text.h"

namespace strata::tools {
namespace {

namespace fs = std::filesystem;

constexpr char kExtension[] = ".safetensors";

struct ExportArgs {
  std::string checkpoint;
  std::string output;
  bool with_optimizer = false;
  std::string max_shard_size = "5GB"; // save_pretrained's default
};

// "5GB" -> 5 * 10^9 bytes: a whole or decimal number and an optional unit,
// any case: B, KB, MB, GB, TB (powers of 1000, as Hugging Face's
// max_shard_size reads them) or KiB, MiB, GiB, TiB (powers of 1024). At
// least one byte, at most 2^62; nullopt for anything else.
std::optional<uint64_t> parse_byte_size(std::string_view text) {
  size_t digits = 0;
  while (digits < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.'))
    ++digits;
  const std::string_view number = text.substr(0, digits);
  std::string unit(text.substr(digits));
  for (char &c : unit)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::map<std::string, double> kUnits = {
      {"", 1.0},    {"b", 1.0},      {"kb", 1e3},     {"mb", 1e6},     {"gb", 1e9},
      {"tb", 1e12}, {"kib", 0x1p10}, {"mib", 0x1p20}, {"gib", 0x1p30}, {"tib", 0x1p40}};
  const auto scale = kUnits.find(unit);
  if (number.empty() || scale == kUnits.end() || number.find('.') != number.rfind('.') ||
      number == ".")
    return std::nullopt;
  constexpr double kLargest = static_cast<double>(uint64_t{1} << 62);
  if (number.find('.') == std::string_view::npos) {
    uint64_t whole = 0;
    auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), whole);
    if (error != std::errc() || end != number.data() + number.size()) return std::nullopt;
    const double bytes = static_cast<double>(whole) * scale->second;
    if (whole == 0 || bytes > kLargest) return std::nullopt;
    // Exact for plain byte counts, which a double would round past 2^53.
    return scale->second == 1.0 ? whole : static_cast<uint64_t>(bytes);
  }
  const double bytes = std::strtod(std::string(number).c_str(), nullptr) * scale->second;
  if (!(bytes >= 1) || bytes > kLargest) return std::nullopt;
  return static_cast<uint64_t>(bytes);
}

CLI::Validator byte_size() {
  return CLI::Validator(
      [](std::string &text) -> std::string {
        if (parse_byte_size(text)) return "";
        return str_cat("'", text,
                       "' is not a size of at least 1 byte: give bytes (1024) or a number with a "
                       "unit (500MB, 5GB, 2GiB)");
      },
      "");
}

// Names by name order into files of at most `limit` bytes of tensor data, as
// Hugging Face packs them: a tensor goes into the current file unless it
// would overflow it, else it starts the next; one larger than the limit is
// alone in its file.
std::vector<std::vector<std::string>> pack_shards(const std::map<std::string, HostTensor> &tensors,
                                                  uint64_t limit) {
  std::vector<std::vector<std::string>> shards;
  uint64_t filled = 0;
  for (const auto &[name, tensor] : tensors) {
    const uint64_t size = tensor.size_bytes();
    if (shards.empty() || (!shards.back().empty() && filled + size > limit)) {
      shards.emplace_back();
      filled = 0;
    }
    shards.back().push_back(name);
    filled += size;
  }
  return shards;
}

// "model-00002-of-00003.safetensors" beside `output` (model.safetensors).
std::string shard_path(const fs::path &output, size_t index, size_t count) {
  char suffix[64];
  std::snprintf(suffix, sizeof suffix, "-%05zu-of-%05zu", index + 1, count);
  return (output.parent_path() / str_cat(output.stem().string(), suffix, kExtension)).string();
}

// Whether `name` is a file of a sharded export of `stem`: <stem>-NNNNN-of-MMMMM.safetensors.
bool is_shard_name(const std::string &name, const std::string &stem) {
  const std::string_view pattern = "-00000-of-00000.safetensors";
  if (name.size() != stem.size() + pattern.size() || !name.starts_with(stem)) return false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = name[stem.size() + i];
    if (pattern[i] == '0' ? !std::isdigit(static_cast<unsigned char>(c)) : c != pattern[i])
      return false;
  }
  return true;
}

// What an export writes: the file names it writes (its shards or OUT) and,
// sharded, the index.
struct ExportFiles {
  std::vector<std::string> data;                // paths, in order
  std::vector<std::vector<std::string>> shards; // tensor names per data file
  std::string index;                            // empty: one file
};

ExportFiles plan_files(const std::string &output, const std::map<std::string, HostTensor> &tensors,
                       uint64_t limit) {
  ExportFiles files;
  files.shards = pack_shards(tensors, limit);
  if (files.shards.size() <= 1) {
    files.data = {output};
    return files;
  }
  for (size_t i = 0; i < files.shards.size(); ++i)
    files.data.push_back(shard_path(output, i, files.shards.size()));
  files.index = output + ".index.json";
  return files;
}

// Writes the data files, each atomically, then the index (last: a reader of
// the index finds every file it lists).
Status write_files(const ExportFiles &files, const std::map<std::string, HostTensor> &tensors) {
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total = 0;
  for (size_t i = 0; i < files.data.size(); ++i) {
    std::map<std::string, HostTensor> part;
    for (const std::string &name : files.shards[i]) {
      const HostTensor &tensor = tensors.at(name);
      part.emplace(name, tensor);
      weight_map[name] = fs::path(files.data[i]).filename().string();
      total += tensor.size_bytes();
    }
    RETURN_IF_ERROR(serialization::write_safetensors(files.data[i], part));
  }
  if (files.index.empty()) return Status::ok();
  nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  return serialization::write_file_atomically(files.index, index.dump(2) + "\n");
}

// After the export, what an earlier export to the same OUT left that a loader
// could take for it (as save_pretrained removes them): shard files of
// another count, and OUT beside a new index or an index beside a new OUT.
// Returns the names removed.
std::vector<std::string> remove_stale(const std::string &output, const ExportFiles &files) {
  const fs::path out(output);
  const fs::path folder = out.parent_path().empty() ? fs::path(".") : out.parent_path();
  std::set<std::string> written;
  for (const std::string &path : files.data)
    written.insert(fs::path(path).filename().string());
  std::vector<fs::path> stale;
  std::error_code error;
  for (const auto &entry : fs::directory_iterator(folder, error)) {
    const std::string name = entry.path().filename().string();
    if (is_shard_name(name, out.stem().string()) && !written.contains(name))
      stale.push_back(out.parent_path() / name);
  }
  stale.push_back(files.index.empty() ? fs::path(output + ".index.json") : out);
  std::vector<std::string> removed;
  for (const fs::path &path : stale)
    if (fs::is_regular_file(fs::symlink_status(path, error)) && fs::remove(path, error))
      removed.push_back(path.string());
  return removed;
}

// The checkpoint, joined: every tensor whole, as its layout record says.
Result<serialization::Checkpoint> read_joined(const std::string &dir) {
  ASSIGN_OR_RETURN(serialization::Checkpoint checkpoint, serialization::read_checkpoint(dir, ""));
  const std::string manifest = (fs::path(dir) / serialization::kCheckpointManifestFile).string();
  if (checkpoint.layout.empty())
    return failed_precondition(
        manifest, ": the checkpoint (step ", checkpoint.step,
        ") has no layout record (it predates manifest format 3), so its parameters cannot be "
        "told from its optimizer state nor its pieces joined; resume it on the plan that wrote "
        "it and save again, then export that: `strata run PLAN --resume ",
        dir, " --steps ", checkpoint.step + 1,
        " --checkpoint NEW` (one more step), or in Python plan.trainer(resume=\"", dir,
        "\").save(\"NEW\") (none)");
  RETURN_IF_ERROR(plan::join_checkpoint(checkpoint, checkpoint.layout, dir));
  RETURN_IF_ERROR(
      plan::check_checkpoint_tensors(checkpoint, plan::without_cuts(checkpoint.layout), dir));
  return checkpoint;
}

// Refuses to write (or, sharded, remove) the checkpoint's own files.
Status check_outputs(const std::string &output, const ExportFiles &files,
                     const serialization::Checkpoint &checkpoint, const std::string &dir) {
  std::set<std::string> inputs = {serialization::kCheckpointManifestFile};
  for (const auto &entry : checkpoint.file_of)
    inputs.insert(entry.second);
  std::vector<std::string> outputs = files.data;
  outputs.push_back(output);
  if (!files.index.empty()) outputs.push_back(files.index);
  for (const std::string &path : outputs)
    for (const std::string &input : inputs)
      RETURN_IF_ERROR(serialization::check_not_input(path, (fs::path(dir) / input).string()));
  return Status::ok();
}

// "4 parameters (1.25 KiB)", or of the optimizer state tensors.
std::string tensor_count(const std::map<std::string, HostTensor> &tensors,
                         const serialization::CheckpointLayout &layout, bool parameters) {
  int64_t count = 0;
  uint64_t bytes = 0;
  for (const auto &[name, tensor] : tensors)
    if (layout.tensors.at(name).parameter == parameters) {
      ++count;
      bytes += tensor.size_bytes();
    }
  return str_cat(counted(count, parameters ? "parameter" : "optimizer state tensor"), " (",
                 human_bytes(static_cast<double>(bytes)), ")");
}

// What was exported, where to, and what was removed.
void print_summary(const ExportArgs &args, const serialization::Checkpoint &checkpoint,
                   const std::map<std::string, HostTensor> &tensors, const ExportFiles &files,
                   const std::vector<std::string> &removed, std::ostream &out) {
  uint64_t total = 0;
  for (const auto &entry : tensors)
    total += entry.second.size_bytes();
  out << "checkpoint " << args.checkpoint << ": step " << checkpoint.step << ", written as "
      << checkpoint.layout.description << "\n";
  out << "tensors    " << tensor_count(tensors, checkpoint.layout, true);
  if (args.with_optimizer)
    out << " and " << tensor_count(tensors, checkpoint.layout, false) << ", "
        << human_bytes(static_cast<double>(total)) << " in all";
  out << "\n";
  if (files.index.empty()) {
    out << "wrote      " << args.output << "\n";
  } else {
    const std::string &limit = args.max_shard_size;
    const bool unitless = std::isdigit(static_cast<unsigned char>(limit.back())) != 0;
    out << "wrote      " << counted(static_cast<int64_t>(files.data.size()), "file") << " of up to "
        << limit << (unitless ? " bytes" : "")
        << " of tensors (a larger tensor alone): " << files.data.front() << " .. "
        << files.data.back() << ", and the index " << files.index << "\n";
  }
  for (const std::string &path : removed)
    out << "removed    " << path << " (an earlier export's, which a loader could take for this)\n";
}

Status export_command(const ExportArgs &args, std::ostream &out) {
  const std::optional<uint64_t> limit = parse_byte_size(args.max_shard_size);
  if (!limit)
    return invalid_argument("--max-shard-size '", args.max_shard_size,
                            "' is not a size of at least 1 byte");
  if (fs::path(args.output).extension() != kExtension)
    return invalid_argument("-o ", args.output,
                            ": name a .safetensors file (model.safetensors); a sharded export "
                            "names its files after it");
  RETURN_IF_ERROR(serialization::check_file_writable(args.output, "-o"));
  ASSIGN_OR_RETURN(serialization::Checkpoint checkpoint, read_joined(args.checkpoint));

  std::map<std::string, HostTensor> tensors;
  for (const auto &[name, record] : checkpoint.layout.tensors)
    if (record.parameter || args.with_optimizer) tensors.emplace(name, checkpoint.tensors.at(name));
  if (tensors.empty())
    return failed_precondition(args.checkpoint, ": the checkpoint records no parameters");
  const ExportFiles files = plan_files(args.output, tensors, *limit);
  RETURN_IF_ERROR(check_outputs(args.output, files, checkpoint, args.checkpoint));
  RETURN_IF_ERROR(write_files(files, tensors));
  const std::vector<std::string> removed = remove_stale(args.output, files);
  print_summary(args, checkpoint, tensors, files, removed, out);
  return Status::ok();
}

constexpr char kExportFooter[] =
    "Writes the checkpoint's weights, whole, as .safetensors under the model's own\n"
    "parameter names: what one device would have saved, whatever mesh, ZeRO stage\n"
    "or number of processes wrote it (its pieces are joined by the layout record\n"
    "of its manifest). --with-optimizer adds the optimizer state (moments,\n"
    "'optimizer.step'). The header's metadata is {\"format\": \"pt\"}.\n\n"
    "Up to --max-shard-size of tensor data (default 5GB, as Hugging Face's\n"
    "save_pretrained) goes into OUT alone. Above it the tensors are packed in name\n"
    "order into files named after OUT, model.safetensors ->\n"
    "model-00001-of-00003.safetensors ..., a tensor larger than the limit alone in\n"
    "its file, with the index model.safetensors.index.json: {\"metadata\":\n"
    "{\"total_size\": BYTES}, \"weight_map\": {tensor: file}}, Hugging Face's layout.\n"
    "Every file is written atomically, the index last; the files of an earlier\n"
    "export to the same OUT that a loader could take for this one (shards of\n"
    "another count, OUT beside a new index, an index beside a new OUT) are removed.\n\n"
    "A model from PyTorch (strata.from_torch, or strata import of a torch.onnx\n"
    "export without constant folding) keeps its state_dict names, so the file\n"
    "loads straight back into the module:\n"
    "  from safetensors.torch import load_file\n"
    "  module.load_state_dict(load_file(\"model.safetensors\"))\n"
    "  # sharded: each file of the index's weight_map\n"
    "  import json\n"
    "  files = set(json.load(open(\"model.safetensors.index.json\"))[\"weight_map\"].values())\n"
    "  module.load_state_dict({k: v for f in files for k, v in load_file(f).items()})\n"
    "(transformers' from_pretrained reads either form, named model.safetensors,\n"
    "beside the model's config.json.)\n"
    "A checkpoint from before manifest format 3 has no layout record: resume it\n"
    "with `strata run PLAN --resume DIR` on the plan that wrote it, save, and\n"
    "export that.\n\n"
    "Examples:\n"
    "  strata export ckpt -o model.safetensors\n"
    "  strata export ckpt -o out/model.safetensors --max-shard-size 2GiB\n"
    "  strata export ckpt -o full.safetensors --with-optimizer";

} // namespace

void add_export(CLI::App &app, Action &action) {
  static ExportArgs args;
  CLI::App *sub = app.add_subcommand(
      "export", "Write a checkpoint's weights as .safetensors for PyTorch and Hugging Face");
  sub->add_option("CKPT", args.checkpoint, "checkpoint folder (strata run --checkpoint)")
      ->required()
      ->check(not_empty_path("a checkpoint folder"))
      ->type_name("DIR");
  sub->add_option("-o,--output", args.output,
                  "weights file to write (.safetensors); sharded, the index is OUT.index.json")
      ->required()
      ->check(not_empty_path("a .safetensors file"))
      ->type_name("OUT");
  sub->add_flag("--with-optimizer", args.with_optimizer,
                "also write the optimizer state (moments, 'optimizer.step')");
  sub->add_option("--max-shard-size", args.max_shard_size,
                  "most bytes of tensors per file; above it, several files and an index "
                  "(500MB, 5GB, 2GiB, 1024)")
      ->check(byte_size())
      ->type_name("SIZE")
      ->capture_default_str();
  sub->footer(kExportFooter);
  sub->callback([&action] { action = [] { return export_command(args, std::cout); }; });
}

} // namespace strata::tools
