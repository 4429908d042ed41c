// Tests of the cluster spec: the shipped examples, strict validation with errors
// naming file and field, the JSON round trip, and link lookup.
#include "partitioner/cost/cluster.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace strata::partitioner {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

std::string example_path(const std::string &file) {
  const char *root = std::getenv("STRATA_SOURCE_ROOT");
  std::string base = root != nullptr ? root : ".";
  return base + "/examples/clusters/" + file;
}

std::string read_text(const std::string &path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Every numeric leaf under `value`, as a dotted path.
void numeric_paths(const Json &value, const std::string &path, std::vector<std::string> &out) {
  if (value.is_number()) out.push_back(path);
  if (!value.is_object()) return;
  for (const auto &item : value.items()) {
    numeric_paths(item.value(), path.empty() ? item.key() : path + "." + item.key(), out);
  }
}

TEST(ClusterSpec, ShippedExamplesParseAndCiteEveryFigure) {
  for (const char *file : {"cpu-dev.json", "h100-8x-nvlink.json", "h100-128-nodes.json"}) {
    SCOPED_TRACE(file);
    Result<ClusterSpec> spec = load_cluster(example_path(file));
    ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
    EXPECT_TRUE(validate_cluster(*spec, file).is_ok());
    // Every hardware figure (not the node and device counts) names its source.
    Json root = Json::parse(read_text(example_path(file)));
    std::vector<std::string> paths;
    numeric_paths(root, "", paths);
    for (const std::string &path : paths) {
      if (path == "nodes" || path == "devices_per_node") continue;
      EXPECT_TRUE(spec->sources.count(path)) << "no source for " << path;
    }
    // No source names a field that is not there.
    for (const auto &[key, text] : spec->sources) {
      EXPECT_NE(std::find(paths.begin(), paths.end(), key), paths.end()) << key;
      EXPECT_FALSE(text.empty()) << key;
    }
  }
}

TEST(ClusterSpec, H100FiguresMatchTheReferenceTable) {
  Result<ClusterSpec> spec = load_cluster(example_path("h100-8x-nvlink.json"));
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  EXPECT_EQ(spec->num_devices(), 8);
  EXPECT_EQ(spec->device.kind, "gpu");
  EXPECT_DOUBLE_EQ(spec->device.peak_flops.bf16, 989e12);
  EXPECT_DOUBLE_EQ(spec->device.peak_flops.f16, 989e12);
  EXPECT_DOUBLE_EQ(spec->device.peak_flops.f32, 67e12);
  EXPECT_DOUBLE_EQ(spec->device.peak_flops.tf32, 494.5e12);
  EXPECT_DOUBLE_EQ(spec->device.memory_bandwidth, 3.35e12);
  EXPECT_EQ(spec->device.memory_bytes, 80'000'000'000);
  EXPECT_DOUBLE_EQ(spec->intra_node.bandwidth_Bps, 370e9);
  EXPECT_FALSE(spec->inter_node.has_value());
  EXPECT_DOUBLE_EQ(spec->device.peak_flops_for(DType::kBF16), 989e12);
  EXPECT_DOUBLE_EQ(spec->device.peak_flops_for(DType::kF32), 67e12);
  EXPECT_DOUBLE_EQ(spec->device.peak_flops_for(DType::kF32, /*tf32=*/true), 494.5e12);

  Result<ClusterSpec> big = load_cluster(example_path("h100-128-nodes.json"));
  ASSERT_TRUE(big.is_ok()) << big.status().to_string();
  EXPECT_EQ(big->num_devices(), 1024);
  ASSERT_TRUE(big->inter_node.has_value());
  EXPECT_DOUBLE_EQ(big->inter_node->bandwidth_Bps, 50e9);
  EXPECT_EQ(big->device, spec->device);
}

TEST(ClusterSpec, CpuExampleMatchesTheBuiltInDefault) {
  Result<ClusterSpec> spec = load_cluster(example_path("cpu-dev.json"));
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  ClusterSpec builtin = default_cpu_cluster(2);
  EXPECT_TRUE(validate_cluster(builtin, "default").is_ok());
  EXPECT_EQ(spec->device.peak_flops.f32, builtin.device.peak_flops.f32);
  EXPECT_EQ(spec->device.memory_bandwidth, builtin.device.memory_bandwidth);
  EXPECT_EQ(spec->device.memory_bytes, builtin.device.memory_bytes);
  EXPECT_EQ(spec->intra_node, builtin.intra_node);
  EXPECT_EQ(spec->num_devices(), builtin.num_devices());
  EXPECT_EQ(default_cpu_cluster(6).num_devices(), 6);
}

TEST(ClusterSpec, JsonRoundTrip) {
  for (const char *file : {"cpu-dev.json", "h100-8x-nvlink.json", "h100-128-nodes.json"}) {
    Result<ClusterSpec> spec = load_cluster(example_path(file));
    ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
    std::string text = cluster_to_json(*spec);
    Result<ClusterSpec> again = parse_cluster(text, "again.json");
    ASSERT_TRUE(again.is_ok()) << again.status().to_string();
    EXPECT_EQ(*again, *spec) << file;
    EXPECT_EQ(cluster_to_json(*again), text);
  }
  ClusterSpec cpu = default_cpu_cluster(3);
  Result<ClusterSpec> again = parse_cluster(cluster_to_json(cpu), "cpu");
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_EQ(*again, cpu);
}

// A valid two-node spec to break one field at a time.
Json valid_spec() {
  return Json::parse(R"({
    "name": "t", "nodes": 2, "devices_per_node": 4,
    "device": {"name": "d", "kind": "gpu",
               "peak_flops": {"f32": 1e12, "bf16": 2e12},
               "memory_bandwidth": 1e12, "memory_bytes": 1000000,
               "launch_overhead_s": 0},
    "intra_node": {"latency_s": 1e-6, "bandwidth_Bps": 1e11},
    "inter_node": {"latency_s": 5e-6, "bandwidth_Bps": 1e10},
    "sources": {"device.peak_flops.f32": "made up"}
  })");
}

struct BadCase {
  std::string what;
  std::function<void(Json &)> edit;
  std::string message; // expected in the error, after "h100.json: "
};

TEST(ClusterSpec, ValidationErrorsNameFileAndField) {
  ASSERT_TRUE(parse_cluster(valid_spec().dump(), "h100.json").is_ok());
  std::vector<BadCase> cases = {
      {"zero bf16", [](Json &j) { j["device"]["peak_flops"]["bf16"] = 0; },
       "device.peak_flops.bf16 must be positive"},
      {"negative f32", [](Json &j) { j["device"]["peak_flops"]["f32"] = -1; },
       "device.peak_flops.f32 must be positive"},
      {"missing f32", [](Json &j) { j["device"]["peak_flops"].erase("f32"); },
       "device.peak_flops.f32 is missing"},
      {"unknown dtype", [](Json &j) { j["device"]["peak_flops"]["fp8"] = 1e15; },
       "unknown field device.peak_flops.fp8"},
      {"unknown top key", [](Json &j) { j["gpus"] = 8; }, "unknown field gpus"},
      {"unknown device key", [](Json &j) { j["device"]["hbm"] = 1; }, "unknown field device.hbm"},
      {"unknown link key", [](Json &j) { j["intra_node"]["bw"] = 1; },
       "unknown field intra_node.bw"},
      {"string bandwidth", [](Json &j) { j["device"]["memory_bandwidth"] = "fast"; },
       "device.memory_bandwidth must be a number"},
      {"zero bandwidth", [](Json &j) { j["intra_node"]["bandwidth_Bps"] = 0; },
       "intra_node.bandwidth_Bps must be positive"},
      {"negative latency", [](Json &j) { j["inter_node"]["latency_s"] = -1e-6; },
       "inter_node.latency_s must not be negative"},
      {"negative launch", [](Json &j) { j["device"]["launch_overhead_s"] = -1; },
       "device.launch_overhead_s must not be negative"},
      {"fractional nodes", [](Json &j) { j["nodes"] = 1.5; }, "nodes must be an integer"},
      {"zero nodes", [](Json &j) { j["nodes"] = 0; }, "nodes must be positive"},
      {"zero devices", [](Json &j) { j["devices_per_node"] = 0; },
       "devices_per_node must be positive"},
      {"zero memory", [](Json &j) { j["device"]["memory_bytes"] = 0; },
       "device.memory_bytes must be positive"},
      {"bad kind", [](Json &j) { j["device"]["kind"] = "tpu"; }, "device.kind must be"},
      {"empty name", [](Json &j) { j["name"] = ""; }, "name must not be empty"},
      {"missing device name", [](Json &j) { j["device"].erase("name"); }, "device.name is missing"},
      {"efficiency above 1", [](Json &j) { j["device"]["compute_efficiency"] = 1.5; },
       "device.compute_efficiency must be at most 1"},
      {"zero efficiency", [](Json &j) { j["device"]["memory_efficiency"] = 0; },
       "device.memory_efficiency must be positive"},
      {"missing inter-node link", [](Json &j) { j.erase("inter_node"); },
       "inter_node is missing (required when nodes > 1)"},
      {"link not an object", [](Json &j) { j["intra_node"] = 3; }, "intra_node must be an object"},
      {"missing device", [](Json &j) { j.erase("device"); }, "device is missing"},
      {"source not a string", [](Json &j) { j["sources"]["device.name"] = 1; },
       "sources.device.name must be a string"},
  };
  for (const BadCase &c : cases) {
    SCOPED_TRACE(c.what);
    Json spec = valid_spec();
    c.edit(spec);
    Result<ClusterSpec> parsed = parse_cluster(spec.dump(), "h100.json");
    ASSERT_FALSE(parsed.is_ok());
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.status().message(), HasSubstr("h100.json: " + c.message));
  }
}

TEST(ClusterSpec, SingleNodeNeedsNoInterNodeLink) {
  Json spec = valid_spec();
  spec["nodes"] = 1;
  spec.erase("inter_node");
  Result<ClusterSpec> parsed = parse_cluster(spec.dump(), "one.json");
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  EXPECT_FALSE(parsed->inter_node.has_value());
  EXPECT_EQ(parsed->device.compute_efficiency, 1.0);
  // f16 falls back to the f32 rate when the device names none.
  EXPECT_EQ(parsed->device.peak_flops_for(DType::kF16), 1e12);
  EXPECT_EQ(parsed->device.peak_flops_for(DType::kBF16), 2e12);
}

TEST(ClusterSpec, MalformedJsonAndMissingFile) {
  Result<ClusterSpec> parsed = parse_cluster("{\"name\": ", "broken.json");
  ASSERT_FALSE(parsed.is_ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("broken.json: not valid JSON"));
  // A number beyond a double's range is refused, not thrown past the parser.
  parsed = parse_cluster(R"({"name": "x", "nodes": 1e400})", "huge.json");
  ASSERT_FALSE(parsed.is_ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("huge.json: not valid JSON"));

  parsed = parse_cluster("[1, 2]", "array.json");
  ASSERT_FALSE(parsed.is_ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("array.json: a cluster spec must be"));

  parsed = load_cluster("/nonexistent/spec.json");
  ASSERT_FALSE(parsed.is_ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kIoError);
  EXPECT_THAT(parsed.status().message(), HasSubstr("/nonexistent/spec.json"));
}

TEST(ClusterSpec, ValidateRefusesBadSpecBuiltInCode) {
  ClusterSpec spec = default_cpu_cluster(2);
  spec.device.memory_bandwidth = 0;
  Status status = validate_cluster(spec, "built");
  EXPECT_THAT(status.message(), HasSubstr("built: device.memory_bandwidth must be positive"));
}

TEST(ClusterSpec, LinksBetweenDevices) {
  Result<ClusterSpec> spec = parse_cluster(valid_spec().dump(), "t.json");
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  EXPECT_EQ(spec->node_of(3), 0);
  EXPECT_EQ(spec->node_of(4), 1);
  EXPECT_EQ(link_between(*spec, 0, 3), spec->intra_node);
  EXPECT_EQ(link_between(*spec, 4, 7), spec->intra_node);
  EXPECT_EQ(link_between(*spec, 3, 4), *spec->inter_node);
  EXPECT_EQ(link_between(*spec, 7, 0), *spec->inter_node);
  std::vector<int> same_node = {4, 5, 6, 7};
  std::vector<int> across = {0, 4};
  EXPECT_EQ(link_for_group(*spec, same_node), spec->intra_node);
  EXPECT_EQ(link_for_group(*spec, across), *spec->inter_node);
}

} // namespace
} // namespace strata::partitioner
