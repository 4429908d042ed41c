#include "partitioner/cost/cluster.h"

#include <cassert>
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <sstream>

#include <nlohmann/json.hpp>

namespace strata::partitioner {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// Walks one JSON object, remembering its path for error messages. Every check
// returns an error that reads "<file>: <path>.<key> <problem>".
class ObjectReader {
public:
  ObjectReader(const Json &object, std::string_view file, std::string path)
      : object_(object), file_(file), path_(std::move(path)) {}

  std::string field(std::string_view key) const {
    return path_.empty() ? std::string(key) : str_cat(path_, ".", key);
  }
  Status error(std::string_view key, std::string_view problem) const {
    return invalid_argument(file_, ": ", field(key), " ", problem);
  }

  // Refuses keys outside `allowed`.
  Status only_keys(std::initializer_list<std::string_view> allowed) const {
    for (const auto &item : object_.items()) {
      bool known = false;
      for (std::string_view key : allowed)
        known = known || item.key() == key;
      if (!known) return invalid_argument(file_, ": unknown field ", field(item.key()));
    }
    return Status::ok();
  }

  bool has(std::string_view key) const { return object_.contains(key); }

  const Json *get(std::string_view key) const {
    auto it = object_.find(key);
    return it == object_.end() ? nullptr : &*it;
  }

  Result<std::string> string(std::string_view key, bool required, bool non_empty) const {
    const Json *value = get(key);
    if (value == nullptr) {
      if (required) return error(key, "is missing");
      return std::string();
    }
    if (!value->is_string()) return error(key, "must be a string");
    std::string text = value->get<std::string>();
    if (non_empty && text.empty()) return error(key, "must not be empty");
    return text;
  }

  // A finite number; `positive` refuses zero, otherwise zero is allowed.
  Result<double> number(std::string_view key, bool positive) const {
    const Json *value = get(key);
    if (value == nullptr) return error(key, "is missing");
    if (!value->is_number()) return error(key, "must be a number");
    double x = value->get<double>();
    if (!std::isfinite(x)) return error(key, "must be finite");
    if (positive && !(x > 0)) return error(key, "must be positive");
    if (!positive && x < 0) return error(key, "must not be negative");
    return x;
  }

  // A positive integer no larger than `max`. Integral floats (8e10) are accepted.
  Result<int64_t> integer(std::string_view key, double max) const {
    const Json *value = get(key);
    if (value == nullptr) return error(key, "is missing");
    if (!value->is_number()) return error(key, "must be a number");
    double x = value->get<double>();
    if (!std::isfinite(x) || x != std::floor(x)) return error(key, "must be an integer");
    if (x < 1) return error(key, "must be positive");
    if (x > max) return error(key, str_cat("must be at most ", max));
    if (value->is_number_integer()) return value->get<int64_t>();
    return static_cast<int64_t>(x);
  }

  Result<ObjectReader> object(std::string_view key, bool required = true) const {
    const Json *value = get(key);
    if (value == nullptr) return error(key, required ? "is missing" : "is absent");
    if (!value->is_object()) return error(key, "must be an object");
    return ObjectReader(*value, file_, field(key));
  }

  const Json &json() const { return object_; }

private:
  const Json &object_;
  std::string_view file_;
  std::string path_;
};

// An efficiency factor: optional, in (0, 1].
Result<double> efficiency(const ObjectReader &reader, std::string_view key) {
  if (!reader.has(key)) return 1.0;
  ASSIGN_OR_RETURN(double x, reader.number(key, /*positive=*/true));
  if (x > 1) return reader.error(key, "must be at most 1");
  return x;
}

Result<PeakFlops> parse_peaks(const ObjectReader &reader) {
  RETURN_IF_ERROR(reader.only_keys({"f32", "tf32", "f16", "bf16"}));
  PeakFlops peaks;
  ASSIGN_OR_RETURN(peaks.f32, reader.number("f32", /*positive=*/true));
  for (auto [key, slot] : {std::pair<std::string_view, double *>{"tf32", &peaks.tf32},
                           {"f16", &peaks.f16},
                           {"bf16", &peaks.bf16}}) {
    if (!reader.has(key)) continue;
    ASSIGN_OR_RETURN(*slot, reader.number(key, /*positive=*/true));
  }
  return peaks;
}

Result<DeviceSpec> parse_device(const ObjectReader &reader) {
  RETURN_IF_ERROR(
      reader.only_keys({"name", "kind", "peak_flops", "memory_bandwidth", "memory_bytes",
                        "launch_overhead_s", "compute_efficiency", "memory_efficiency"}));
  DeviceSpec device;
  ASSIGN_OR_RETURN(device.name, reader.string("name", /*required=*/true, /*non_empty=*/true));
  ASSIGN_OR_RETURN(device.kind, reader.string("kind", /*required=*/true, /*non_empty=*/true));
  if (device.kind != "cpu" && device.kind != "gpu") {
    return reader.error("kind", str_cat("must be \"cpu\" or \"gpu\", not \"", device.kind, "\""));
  }
  ASSIGN_OR_RETURN(ObjectReader peaks, reader.object("peak_flops"));
  ASSIGN_OR_RETURN(device.peak_flops, parse_peaks(peaks));
  ASSIGN_OR_RETURN(device.memory_bandwidth, reader.number("memory_bandwidth", true));
  // 2^53 bytes: the largest count a JSON double holds exactly.
  ASSIGN_OR_RETURN(device.memory_bytes, reader.integer("memory_bytes", 9007199254740992.0));
  ASSIGN_OR_RETURN(device.launch_overhead_s, reader.number("launch_overhead_s", false));
  ASSIGN_OR_RETURN(device.compute_efficiency, efficiency(reader, "compute_efficiency"));
  ASSIGN_OR_RETURN(device.memory_efficiency, efficiency(reader, "memory_efficiency"));
  return device;
}

Result<LinkSpec> parse_link(const ObjectReader &reader) {
  RETURN_IF_ERROR(reader.only_keys({"latency_s", "bandwidth_Bps"}));
  LinkSpec link;
  ASSIGN_OR_RETURN(link.latency_s, reader.number("latency_s", /*positive=*/false));
  ASSIGN_OR_RETURN(link.bandwidth_Bps, reader.number("bandwidth_Bps", /*positive=*/true));
  return link;
}

Result<ClusterSpec> parse_root(const Json &root, std::string_view file) {
  if (!root.is_object()) return invalid_argument(file, ": a cluster spec must be a JSON object");
  ObjectReader reader(root, file, "");
  RETURN_IF_ERROR(reader.only_keys({"name", "notes", "nodes", "devices_per_node", "device",
                                    "intra_node", "inter_node", "sources"}));
  ClusterSpec spec;
  ASSIGN_OR_RETURN(spec.name, reader.string("name", /*required=*/true, /*non_empty=*/true));
  ASSIGN_OR_RETURN(spec.notes, reader.string("notes", /*required=*/false, /*non_empty=*/false));
  // Bounds keep nodes * devices_per_node inside an int.
  ASSIGN_OR_RETURN(int64_t nodes, reader.integer("nodes", 1 << 20));
  ASSIGN_OR_RETURN(int64_t per_node, reader.integer("devices_per_node", 1 << 10));
  spec.nodes = static_cast<int>(nodes);
  spec.devices_per_node = static_cast<int>(per_node);
  ASSIGN_OR_RETURN(ObjectReader device, reader.object("device"));
  ASSIGN_OR_RETURN(spec.device, parse_device(device));
  ASSIGN_OR_RETURN(ObjectReader intra, reader.object("intra_node"));
  ASSIGN_OR_RETURN(spec.intra_node, parse_link(intra));
  if (reader.has("inter_node")) {
    ASSIGN_OR_RETURN(ObjectReader inter, reader.object("inter_node"));
    ASSIGN_OR_RETURN(spec.inter_node, parse_link(inter));
  } else if (spec.nodes > 1) {
    return reader.error("inter_node", "is missing (required when nodes > 1)");
  }
  if (reader.has("sources")) {
    ASSIGN_OR_RETURN(ObjectReader sources, reader.object("sources"));
    for (const auto &item : sources.json().items()) {
      if (!item.value().is_string()) return sources.error(item.key(), "must be a string");
      spec.sources.emplace(item.key(), item.value().get<std::string>());
    }
  }
  return spec;
}

OrderedJson link_json(const LinkSpec &link) {
  OrderedJson out = OrderedJson::object();
  out["latency_s"] = link.latency_s;
  out["bandwidth_Bps"] = link.bandwidth_Bps;
  return out;
}

} // namespace

double DeviceSpec::peak_flops_for(DType dtype, bool tf32) const {
  switch (dtype) {
  case DType::kF16: return peak_flops.f16 > 0 ? peak_flops.f16 : peak_flops.f32;
  case DType::kBF16: return peak_flops.bf16 > 0 ? peak_flops.bf16 : peak_flops.f32;
  case DType::kF32: return tf32 && peak_flops.tf32 > 0 ? peak_flops.tf32 : peak_flops.f32;
  default: return peak_flops.f32;
  }
}

Result<ClusterSpec> parse_cluster(std::string_view json_text, std::string_view display_name) {
  Json root;
  try {
    root = Json::parse(json_text.begin(), json_text.end());
  } catch (const Json::exception &e) { // a parse error, or a number out of range (1e400)
    return invalid_argument(display_name, ": not valid JSON: ", e.what());
  }
  return parse_root(root, display_name);
}

Result<ClusterSpec> load_cluster(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error(path, ": cannot open cluster spec");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return io_error(path, ": read failed");
  return parse_cluster(text.str(), path);
}

std::string cluster_to_json(const ClusterSpec &spec) {
  OrderedJson out = OrderedJson::object();
  out["name"] = spec.name;
  if (!spec.notes.empty()) out["notes"] = spec.notes;
  out["nodes"] = spec.nodes;
  out["devices_per_node"] = spec.devices_per_node;
  OrderedJson device = OrderedJson::object();
  device["name"] = spec.device.name;
  device["kind"] = spec.device.kind;
  OrderedJson peaks = OrderedJson::object();
  peaks["f32"] = spec.device.peak_flops.f32;
  if (spec.device.peak_flops.tf32 > 0) peaks["tf32"] = spec.device.peak_flops.tf32;
  if (spec.device.peak_flops.f16 > 0) peaks["f16"] = spec.device.peak_flops.f16;
  if (spec.device.peak_flops.bf16 > 0) peaks["bf16"] = spec.device.peak_flops.bf16;
  device["peak_flops"] = std::move(peaks);
  device["memory_bandwidth"] = spec.device.memory_bandwidth;
  device["memory_bytes"] = spec.device.memory_bytes;
  device["launch_overhead_s"] = spec.device.launch_overhead_s;
  device["compute_efficiency"] = spec.device.compute_efficiency;
  device["memory_efficiency"] = spec.device.memory_efficiency;
  out["device"] = std::move(device);
  out["intra_node"] = link_json(spec.intra_node);
  if (spec.inter_node) out["inter_node"] = link_json(*spec.inter_node);
  if (!spec.sources.empty()) {
    OrderedJson sources = OrderedJson::object();
    for (const auto &[key, text] : spec.sources)
      sources[key] = text;
    out["sources"] = std::move(sources);
  }
  return out.dump(2) + "\n";
}

Status validate_cluster(const ClusterSpec &spec, std::string_view display_name) {
  // One set of rules: check the spec through its JSON form.
  Result<ClusterSpec> parsed = parse_cluster(cluster_to_json(spec), display_name);
  return std::move(parsed).take_status();
}

const LinkSpec &link_between(const ClusterSpec &spec, int a, int b) {
  assert(a >= 0 && a < spec.num_devices() && b >= 0 && b < spec.num_devices());
  if (spec.node_of(a) == spec.node_of(b) || !spec.inter_node) return spec.intra_node;
  return *spec.inter_node;
}

const LinkSpec &link_for_group(const ClusterSpec &spec, std::span<const int> devices) {
  for (int device : devices) {
    if (spec.node_of(device) != spec.node_of(devices.front())) {
      return link_between(spec, devices.front(), device);
    }
  }
  return spec.intra_node;
}

ClusterSpec default_cpu_cluster(int devices) {
  assert(devices >= 1);
  ClusterSpec spec;
  spec.name = "cpu-default";
  spec.notes = "One node; each device is one CPU core of the development machine (AMD EPYC "
               "Zen 5, AVX-512). Figures as in examples/clusters/cpu-dev.json.";
  spec.nodes = 1;
  spec.devices_per_node = devices;
  spec.device.name = "cpu-core";
  spec.device.kind = "cpu";
  // One-thread oneDNN sgemm, 217.6-226.9 GFLOP/s (bench/results/2026-11-21-gemm-cpu.md).
  spec.device.peak_flops.f32 = 220e9;
  // Memory traffic of a one-thread 256 MiB memcpy, read + write bytes (measured here).
  spec.device.memory_bandwidth = 34e9;
  // Half of the machine's 24.7 GB (/proc/meminfo): the cores share it.
  spec.device.memory_bytes = 12'000'000'000;
  spec.device.launch_overhead_s = 1e-6; // assumed per-op dispatch cost
  // Copy between cores through shared memory: the same memcpy, bytes moved per second.
  spec.intra_node = LinkSpec{1e-6, 17e9};
  spec.sources = {
      {"device.peak_flops.f32", "bench/results/2026-11-21-gemm-cpu.md: one-thread oneDNN sgemm"},
      {"device.memory_bandwidth", "measured: one-thread memcpy of 256 MiB, read+write bytes"},
      {"device.memory_bytes", "half of MemTotal (24.7 GB)"},
      {"device.launch_overhead_s", "assumed"},
      {"intra_node.latency_s", "assumed"},
      {"intra_node.bandwidth_Bps", "measured: one-thread memcpy of 256 MiB, bytes copied"},
  };
  return spec;
}

} // namespace strata::partitioner
