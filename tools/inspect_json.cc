#include "tools/inspect_json.h"

#include <cmath>
#include <map>

#include "ops/registry.h"
#include "partitioner/compile_pipeline.h"
#include "plan/instructions.h"
#include "runtime/step_runner.h"
#include "tools/plan_text.h"

namespace strata::tools {
namespace {

using Json = nlohmann::ordered_json;
using serialization::Plan;

// FLOP and byte totals are integral in practice; JSON shows them as integers then.
Json number(double value) {
  if (value == std::floor(value) && std::fabs(value) < 9.0e15) return static_cast<int64_t>(value);
  return value;
}

Json type_json(const std::string &name, const TensorType &type) {
  return {{"name", name},
          {"dtype", std::string(dtype_name(type.dtype))},
          {"shape", std::vector<int64_t>(type.shape.begin(), type.shape.end())}};
}

Json tensor_json(const Graph &graph, TensorId id) {
  const Tensor &t = graph.tensor(id);
  return type_json(t.name, t.type);
}

Json tensor_list_json(const Graph &graph, llvm::ArrayRef<TensorId> ids) {
  Json list = Json::array();
  for (TensorId id : ids)
    list.push_back(tensor_json(graph, id));
  return list;
}

// The inputs of one whole step: a pipeline step takes every replica's
// micro-batches at once.
Json batch_json(const Plan &plan) {
  const int64_t microbatches =
      plan.pipeline ? int64_t{plan.pipeline->microbatches} * plan.pipeline->data_parallel : 1;
  const std::vector<TensorType> types = runtime::pipeline_batch_types(plan.graph, microbatches);
  Json list = Json::array();
  for (size_t i = 0; i < types.size(); ++i)
    list.push_back(type_json(plan.graph.tensor(plan.graph.inputs()[i]).name, types[i]));
  return list;
}

// A pipeline's layout and predictions.
Json pipeline_json(const Plan &plan, const partitioner::ClusterSpec &cluster) {
  const serialization::PlanPipeline &p = *plan.pipeline;
  const double ideal =
      (p.stages - 1.0) / (static_cast<double>(p.chunks) * p.microbatches + p.stages - 1.0);
  size_t buckets = 0;
  for (const auto &program : plan.programs)
    buckets += program.buckets.size();
  std::map<std::string, int> collectives; // tensor-parallel ones per micro-batch
  for (const Node &node : plan.graph.nodes())
    if (ops::collective_of(node.op) != ops::Collective::kNone) ++collectives[node.op];
  return {{"stages", p.stages},
          {"microbatches", p.microbatches},
          {"schedule", p.schedule},
          {"chunks", p.chunks},
          {"data_parallel", p.data_parallel},
          {"tensor_parallel", p.tensor_parallel},
          {"zero", p.zero},
          {"devices", plan.programs.size()},
          {"cluster", cluster.name},
          {"predicted_step_s", p.predicted_step_s},
          {"predicted_bubble", p.predicted_bubble},
          {"ideal_bubble", ideal},
          {"boundaries", p.boundaries},
          {"group_algorithms", p.group_algorithms},
          {"bucket_bytes", p.bucket_bytes},
          {"buckets", buckets},
          {"tensors_in_pieces", p.shards.size()},
          {"collectives_per_microbatch", collectives},
          {"recomputed_nodes", recomputed_nodes(plan.graph)}};
}

// Each device's share of a pipeline step.
Json stages_json(const Plan &plan) {
  Json list = Json::array();
  const std::vector<StageRow> rows = stage_rows(plan);
  for (size_t d = 0; d < rows.size(); ++d) {
    const StageRow &r = rows[d];
    Json sends = Json::array();
    for (const auto &[peer, bytes] : r.sent)
      sends.push_back({{"to", peer}, {"bytes", number(bytes)}});
    list.push_back({{"device", d},
                    {"role", plan::device_role(*plan.pipeline, static_cast<int64_t>(d))},
                    {"nodes", r.nodes},
                    {"parameters", r.parameters},
                    {"flops", number(r.flops)},
                    {"arena_bytes", r.arena},
                    {"predicted_busy_s", r.busy},
                    {"sends", std::move(sends)},
                    {"all_reduced_bytes", number(r.reduced)}});
  }
  return list;
}

// Every transfer of a step, its size, predicted time and why it is there.
Json transfers_json(const Plan &plan, const partitioner::ClusterSpec &cluster) {
  Json list = Json::array();
  const auto rows = partitioner::explain_transfers(plan.graph, plan.programs, plan.pipeline->groups,
                                                   partitioner::plan_costs(plan, cluster));
  for (const auto &row : rows) {
    const std::string algorithm = group_algorithm(*plan.pipeline, row.group, row.gather);
    list.push_back({{"from", row.from},
                    {"to", row.to >= 0 ? Json(row.to) : Json(nullptr)},
                    {"group", row.group >= 0 ? Json(row.group) : Json(nullptr)},
                    {"algorithm", algorithm.empty() ? Json(nullptr) : Json(algorithm)},
                    {"tensor", plan.graph.tensor(row.tensor).name},
                    {"bytes", number(row.bytes)},
                    {"count", row.count},
                    {"seconds", row.seconds},
                    {"why", row.why}});
  }
  return list;
}

// A plan of one device: its program's nodes and memory.
Json device_json(const Plan &plan, const PlanNumbers &n) {
  Json list = Json::array();
  for (const serialization::PlanProgram &program : plan.programs) {
    std::string kind = "cpu";
    for (const auto &device : plan.devices)
      if (device.index == program.device) kind = device.kind;
    list.push_back({{"device", str_cat(kind, ":", program.device)},
                    {"nodes", program.order.size()},
                    {"arena_bytes", program.arena_bytes},
                    {"weight_bytes", n.parameter_bytes + n.state_bytes}});
  }
  return list;
}

} // namespace

std::optional<passes::MemoryPlan> plan_activations(const Graph &graph) {
  auto order = graph.topological_order();
  if (!order.is_ok()) return std::nullopt;
  auto plan = passes::plan_memory(graph, *order);
  if (!plan.is_ok()) return std::nullopt;
  return std::move(plan).value();
}

nlohmann::ordered_json model_json(const std::string &path, const Graph &graph,
                                  const ModelStats &stats,
                                  const std::optional<passes::MemoryPlan> &activations) {
  Json j;
  j["file"] = path;
  j["name"] = graph.name();
  j["inputs"] = tensor_list_json(graph, graph.inputs());
  j["outputs"] = tensor_list_json(graph, graph.outputs());
  j["parameters"] = stats.parameters;
  j["parameter_bytes"] = stats.parameter_bytes;
  j["constant_bytes"] = stats.constant_bytes;
  j["num_nodes"] = graph.num_nodes();
  j["num_tensors"] = graph.num_tensors();
  j["flops"] = number(stats.flops);
  j["bytes"] = number(stats.bytes);
  if (activations)
    j["activations"] = {{"arena_bytes", activations->arena_bytes},
                        {"naive_bytes", activations->naive_bytes}};
  j["ops"] = Json::array();
  for (const OpTypeStats &op : stats.ops)
    j["ops"].push_back({{"op", op.op},
                        {"count", op.count},
                        {"flops", number(op.flops)},
                        {"share", stats.flops > 0 ? op.flops / stats.flops : 0.0}});
  j["nodes"] = Json::array();
  for (const NodeStats &ns : stats.nodes) {
    const Node &node = graph.node(ns.node);
    Json inputs = Json::array(), outputs = Json::array();
    for (TensorId id : node.inputs)
      inputs.push_back(graph.tensor(id).name);
    for (TensorId id : node.outputs)
      outputs.push_back(tensor_json(graph, id));
    j["nodes"].push_back({{"name", node.name},
                          {"op", node.op},
                          {"inputs", std::move(inputs)},
                          {"outputs", std::move(outputs)},
                          {"flops", number(ns.flops)},
                          {"bytes", number(ns.bytes)}});
  }
  return j;
}

Result<nlohmann::ordered_json> plan_report(const Plan &plan, std::string_view source) {
  const Graph &g = plan.graph;
  PlanNumbers n = plan_numbers(g);
  const bool train = plan.mode == Plan::Mode::kTrain;
  Json j;
  j["file"] = std::string(source);
  j["mode"] = std::string(serialization::plan_mode_name(plan.mode));
  j["model"] = g.name();
  j["fingerprint"] = plan.fingerprint;
  j["model_fingerprint"] = plan.model_fingerprint;
  if (train) {
    j["loss"] = {{"kind", plan.loss_kind}, {"tensor", plan.loss}};
    j["optimizer"] = plan.optimizer;
  }
  j["inputs"] = tensor_list_json(g, g.inputs());
  j["outputs"] = tensor_list_json(g, g.outputs());
  j["batch"] = batch_json(plan);
  j["parameters"] = n.parameters;
  j["parameter_bytes"] = n.parameter_bytes;
  j["trainable_tensors"] = n.trainable_tensors;
  if (train)
    j["optimizer_state"] = {
        {"tensors", n.state_tensors}, {"bytes", n.state_bytes}, {"updates", g.updates().size()}};
  j["num_nodes"] = g.num_nodes();
  j["num_tensors"] = g.num_tensors();
  if (!plan.pipeline) {
    j["flops"] = number(n.flops); // per run, or per step of a training plan
    j["devices"] = device_json(plan, n);
    if (!plan.producer.empty()) j["producer"] = plan.producer;
    return j;
  }
  ASSIGN_OR_RETURN(partitioner::ClusterSpec cluster,
                   partitioner::parse_cluster(plan.pipeline->cluster_json, source));
  double flops = 0; // per step: every micro-batch, on every device
  for (const StageRow &row : stage_rows(plan))
    flops += row.flops;
  j["flops"] = number(flops);
  j["pipeline"] = pipeline_json(plan, cluster);
  j["stages"] = stages_json(plan);
  j["transfers"] = transfers_json(plan, cluster);
  if (!plan.producer.empty()) j["producer"] = plan.producer;
  return j;
}

nlohmann::ordered_json search_json(const partitioner::AutoResult &search) {
  Json candidates = Json::array();
  for (const partitioner::AutoCandidate &c : search.candidates) {
    Json row = {{"label", c.label()},
                {"data_parallel", c.data_parallel},
                {"tensor_parallel", c.tensor_parallel},
                {"stages", c.stages},
                {"microbatches", c.microbatches},
                {"schedule", std::string(partitioner::schedule_name(c.schedule))},
                {"chunks", c.chunks},
                {"zero", c.zero},
                {"recompute", c.recompute},
                {"estimated", c.estimated}};
    if (!c.error.empty()) {
      row["error"] = c.error;
    } else {
      row["predicted_step_s"] = c.step_s;
      row["predicted_bubble"] = c.bubble;
      row["memory_bytes"] = c.memory;
      row["moved_bytes"] = number(c.comm_bytes);
      row["fits"] = c.fits;
    }
    candidates.push_back(std::move(row));
  }
  return {{"candidates", std::move(candidates)},
          {"winner", search.winner},
          {"reason", search.reason},
          {"search_seconds", search.search_seconds}};
}

} // namespace strata::tools
