// What every cluster spec parse_cluster accepts must satisfy: it validates,
// cluster_to_json gives text that parses back to an equal spec and is a fixed
// point, and the figures the cost model reads are there (at least one device,
// a positive f32 rate, an inter-node link wherever there are several nodes).
#pragma once

#include <string>

#include "fuzz/fuzz_util.h"
#include "graph/dtype.h"
#include "partitioner/cost/cluster.h"

namespace strata::fuzz {

inline void check_cluster(const partitioner::ClusterSpec &spec) {
  Status valid = partitioner::validate_cluster(spec, "parsed spec");
  check(valid.is_ok(), "an accepted cluster spec fails validate_cluster", valid.to_string());
  const std::string text = partitioner::cluster_to_json(spec);
  auto again = partitioner::parse_cluster(text, "cluster_to_json");
  check(again.is_ok(), "cluster_to_json gives text parse_cluster refuses",
        again.status().to_string());
  check(*again == spec, "a cluster spec changes over cluster_to_json and parse_cluster", text);
  check(partitioner::cluster_to_json(*again) == text, "cluster_to_json is not a fixed point", text);

  check(spec.num_devices() >= 1, "an accepted cluster spec has no devices", text);
  check(spec.nodes == 1 || spec.inter_node.has_value(),
        "an accepted cluster spec of several nodes has no inter-node link", text);
  check(spec.device.peak_flops_for(DType::kF32) > 0, "an accepted device computes nothing", text);
  const int last = spec.num_devices() - 1;
  const partitioner::LinkSpec &link = partitioner::link_between(spec, 0, last);
  check(link.bandwidth_Bps > 0, "a link of an accepted cluster spec has no bandwidth", text);
}

} // namespace strata::fuzz
