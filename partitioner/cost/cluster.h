// Cluster and device descriptions for the partitioner's cost model.
//
// A ClusterSpec says what strata may place work on: `nodes` machines with
// `devices_per_node` identical devices each, a link between two devices of the
// same node and a link between devices of different nodes. Every figure is a
// plain SI number (FLOP/s, bytes/s, bytes, seconds) so the cost model can combine
// them directly. Specs are read from JSON files (examples/clusters/*.json); the
// format is checked strictly: unknown keys, missing fields and non-positive
// figures are errors that name the file and the field path.
//
// JSON form:
//   {
//     "name": "h100-8x-nvlink",
//     "notes": "free text (optional)",
//     "nodes": 1,
//     "devices_per_node": 8,
//     "device": {
//       "name": "H100 SXM", "kind": "gpu",
//       "peak_flops": {"f32": 67e12, "tf32": 494.5e12, "f16": 989e12, "bf16": 989e12},
//       "memory_bandwidth": 3.35e12, "memory_bytes": 80000000000,
//       "launch_overhead_s": 3e-6,
//       "compute_efficiency": 0.8, "memory_efficiency": 0.9      (optional, default 1)
//     },
//     "intra_node": {"latency_s": 2e-6, "bandwidth_Bps": 370e9},
//     "inter_node": {"latency_s": 5e-6, "bandwidth_Bps": 50e9}, (required when nodes > 1)
//     "sources": {"device.peak_flops.bf16": "NVIDIA H100 datasheet", ...}   (optional)
//   }
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "graph/dtype.h"
#include "graph/status.h"

namespace strata::partitioner {

// Dense (non-sparse) peak arithmetic rate per element type, FLOP/s. Zero means
// "no separate figure": the device then runs that type at its f32 rate.
struct PeakFlops {
  double f32 = 0;
  double tf32 = 0; // f32 matmuls on tensor cores, when a plan allows them
  double f16 = 0;
  double bf16 = 0;
  friend bool operator==(const PeakFlops &, const PeakFlops &) = default;
};

struct DeviceSpec {
  std::string name;
  std::string kind = "cpu"; // "cpu" or "gpu"
  PeakFlops peak_flops;
  double memory_bandwidth = 0; // bytes per second, reads and writes together
  int64_t memory_bytes = 0;    // capacity available to one device
  double launch_overhead_s = 0;
  // Fractions of the peaks that real kernels reach, in (0, 1]; the cost model
  // multiplies the peaks by them.
  double compute_efficiency = 1.0;
  double memory_efficiency = 1.0;

  // Peak FLOP/s for arithmetic in `dtype`; with `tf32`, f32 uses the TF32 rate
  // where the device has one. Integer and bool types use the f32 rate.
  double peak_flops_for(DType dtype, bool tf32 = false) const;

  friend bool operator==(const DeviceSpec &, const DeviceSpec &) = default;
};

// A point-to-point link in the alpha-beta model: a message of n bytes takes
// latency_s + n / bandwidth_Bps.
struct LinkSpec {
  double latency_s = 0;
  double bandwidth_Bps = 0; // bytes per second, one direction
  friend bool operator==(const LinkSpec &, const LinkSpec &) = default;
};

struct ClusterSpec {
  std::string name;
  std::string notes;
  int nodes = 1;
  int devices_per_node = 1;
  DeviceSpec device; // every device of the cluster is this one
  LinkSpec intra_node;
  std::optional<LinkSpec> inter_node; // present whenever nodes > 1
  // Where each figure comes from, keyed by field path ("device.peak_flops.bf16").
  std::map<std::string, std::string> sources;

  int num_devices() const { return nodes * devices_per_node; }
  // The node holding global device index `device` (devices are numbered node-major).
  int node_of(int device) const { return device / devices_per_node; }

  friend bool operator==(const ClusterSpec &, const ClusterSpec &) = default;
};

// Parses and validates a spec. `display_name` (usually the file name) starts
// every error message: "h100.json: device.peak_flops.bf16 must be positive".
Result<ClusterSpec> parse_cluster(std::string_view json_text, std::string_view display_name);
// Reads and parses a spec file; errors name the path.
Result<ClusterSpec> load_cluster(const std::string &path);
// The JSON form, accepted back by parse_cluster (two-space indent, trailing newline).
std::string cluster_to_json(const ClusterSpec &spec);
// Checks the invariants parse_cluster enforces on a spec built in code.
Status validate_cluster(const ClusterSpec &spec, std::string_view display_name);

// The link between two devices (global indices): intra-node when they share a
// node, inter-node otherwise. Both indices must be in range.
const LinkSpec &link_between(const ClusterSpec &spec, int a, int b);
// The slowest link a collective over `devices` crosses: inter-node when the group
// spans nodes, intra-node otherwise.
const LinkSpec &link_for_group(const ClusterSpec &spec, std::span<const int> devices);

// This development machine: one node of `devices` CPU cores, each a device with
// the figures measured here (see examples/clusters/cpu-dev.json for the sources).
// Used by tests and when no --cluster is given.
ClusterSpec default_cpu_cluster(int devices = 2);

} // namespace strata::partitioner
