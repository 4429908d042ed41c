#include "tools/inspect_checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "graph/units.h"
#include "serialization/checkpoint.h"
#include "tools/plan_text.h"

namespace strata::tools {
namespace {

// How one tensor is stored, from the names of its pieces
// "<base>[@tp<m>of<T>][@shard<i>of<n>]": T tensor-parallel pieces, each in n
// ZeRO shards (0: not cut that way).
struct Storage {
  long long pieces = 0, shards = 0;
  std::string text() const {
    if (pieces == 0 && shards == 0) return "whole";
    if (pieces == 0) return counted(shards, "ZeRO shard");
    std::string what = counted(pieces, "tensor-parallel piece");
    if (shards > 0) what += str_cat(", each in ", counted(shards, "ZeRO shard"));
    return what;
  }
};

std::map<std::string, Storage> storage_by_base(const serialization::Checkpoint &checkpoint) {
  std::map<std::string, Storage> storage;
  for (const auto &[name, value] : checkpoint.tensors) {
    const size_t at = name.find('@');
    Storage &s = storage[name.substr(0, at)];
    long long i = 0, n = 0;
    if (const size_t tp = name.find("@tp");
        tp != std::string::npos && std::sscanf(name.c_str() + tp, "@tp%lldof%lld", &i, &n) == 2)
      s.pieces = n;
    if (const size_t shard = name.find("@shard");
        shard != std::string::npos &&
        std::sscanf(name.c_str() + shard, "@shard%lldof%lld", &i, &n) == 2)
      s.shards = n;
  }
  return storage;
}

} // namespace

Result<nlohmann::ordered_json> checkpoint_report(const std::string &dir) {
  ASSIGN_OR_RETURN(serialization::Checkpoint checkpoint, serialization::read_checkpoint(dir, ""));
  nlohmann::ordered_json report;
  report["path"] = dir;
  report["step"] = checkpoint.step;
  report["fingerprint"] = checkpoint.fingerprint;
  report["ranks"] = checkpoint.ranks;
  std::vector<std::string> files;
  for (const auto &[name, file] : checkpoint.file_of)
    if (std::find(files.begin(), files.end(), file) == files.end()) files.push_back(file);
  std::sort(files.begin(), files.end());
  report["files"] = files;
  const serialization::CheckpointLayout &layout = checkpoint.layout;
  report["layout_recorded"] = !layout.empty();
  const std::map<std::string, Storage> storage = storage_by_base(checkpoint);
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  if (!layout.empty()) {
    report["model"] = layout.model;
    report["optimizer"] = layout.optimizer;
    report["layout"] = layout.description;
    int64_t counts[2] = {0, 0}, bytes[2] = {0, 0};
    for (const auto &[name, record] : layout.tensors) {
      auto found = storage.find(name);
      const int role = record.parameter ? 0 : 1;
      ++counts[role];
      bytes[role] += record.type.size_bytes();
      tensors.push_back({{"name", name},
                         {"role", record.parameter ? "parameter" : "state"},
                         {"type", record.type.to_string()},
                         {"stored", found == storage.end() ? "missing" : found->second.text()}});
    }
    report["parameters"] = {{"tensors", counts[0]}, {"bytes", bytes[0]}};
    report["state"] = {{"tensors", counts[1]}, {"bytes", bytes[1]}};
  } else {
    for (const auto &[name, value] : checkpoint.tensors)
      tensors.push_back({{"name", name}, {"type", value.type.to_string()}});
  }
  report["tensors"] = std::move(tensors);
  return report;
}

void print_checkpoint_text(const nlohmann::ordered_json &report, int64_t max_rows,
                           std::ostream &out) {
  auto field = [&](std::string_view name, const std::string &value) {
    out << name << std::string(name.size() < 11 ? 11 - name.size() : 1, ' ') << value << "\n";
  };
  field("checkpoint",
        str_cat(report["path"].get<std::string>(), " at step ", report["step"].get<int64_t>()));
  field("plan", str_cat("fingerprint ", report["fingerprint"].get<std::string>()));
  const auto &files = report["files"];
  field("files", str_cat(files.size(), " (", report["ranks"].get<int>(),
                         report["ranks"].get<int>() == 1 ? " process" : " processes",
                         "), sizes and SHA-256 checked"));
  if (!report["layout_recorded"].get<bool>()) {
    field("layout", "not recorded (a checkpoint of an older strata: it resumes only on the "
                    "plan that wrote it)");
  } else {
    field("layout", report["layout"].get<std::string>());
    field("model", str_cat(report["model"].get<std::string>(), " (source model's SHA-256)"));
    field("optimizer", report["optimizer"].get<std::string>());
    for (const char *role : {"parameters", "state"}) {
      const auto &totals = report[role];
      field(role == std::string("state") ? "opt. state" : "parameters",
            str_cat(counted(totals["tensors"].get<int64_t>(), "tensor"), ", ",
                    human_bytes(static_cast<double>(totals["bytes"].get<int64_t>()))));
    }
  }
  const auto &tensors = report["tensors"];
  size_t width = 6, type_width = 4;
  for (const auto &t : tensors) {
    width = std::max(width, t["name"].get<std::string>().size());
    type_width = std::max(type_width, t["type"].get<std::string>().size());
  }
  out << "\n"
      << "tensor" << std::string(width - 4, ' ') << "role       type"
      << (report["layout_recorded"].get<bool>() ? std::string(type_width - 2, ' ') + "stored"
                                                : std::string())
      << "\n";
  int64_t shown = 0;
  for (const auto &t : tensors) {
    if (max_rows >= 0 && shown++ >= max_rows) {
      out << "... " << tensors.size() - static_cast<size_t>(max_rows)
          << " more (--all lists every tensor)\n";
      break;
    }
    const std::string name = t["name"].get<std::string>();
    out << name << std::string(width - name.size() + 2, ' ');
    if (t.contains("role")) {
      const std::string role = t["role"].get<std::string>();
      const std::string type = t["type"].get<std::string>();
      out << role << std::string(11 - role.size(), ' ') << type
          << std::string(type_width - type.size() + 2, ' ') << t["stored"].get<std::string>()
          << "\n";
    } else {
      out << "?          " << t["type"].get<std::string>() << "\n";
    }
  }
}

} // namespace strata::tools
