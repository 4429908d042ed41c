#include "tools/verify_reference.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "partitioner/compile_pipeline.h"
#include "partitioner/lowering/pipeline.h"
#include "passes/make_training.h"
#include "passes/optimizer.h"
#include "plan/verify.h"
#include "serialization/model_io.h"
#include "serialization/sha256.h"
#include "tools/compile_model.h"

namespace strata::tools {
namespace {

using serialization::Plan;

Status check_training_plan(const Plan &plan, const std::string &path) {
  if (plan.mode != Plan::Mode::kTrain)
    return invalid_argument(path, " is an inference plan; strata verify compares training runs "
                                  "(compile the model with --train)");
  return Status::ok();
}

// The micro-batches the reference runs per step: the plan's M per replica
// times its DP replicas (1 for a one-device plan).
Result<int> reference_microbatches(const Plan &plan, const std::string &path) {
  if (!plan.pipeline) return 1;
  const int64_t slices = int64_t{plan.pipeline->microbatches} * plan.pipeline->data_parallel;
  if (slices > std::numeric_limits<int>::max())
    return invalid_argument(path, ": ", plan.pipeline->microbatches, " micro-batches x ",
                            plan.pipeline->data_parallel,
                            " replicas are more micro-batches than one device runs (at most ",
                            std::numeric_limits<int>::max(), ")");
  return static_cast<int>(slices);
}

// The names of the model's tensors the plan's loss may have been compiled to
// read, the likeliest first: those its loss node reads, then the model's
// outputs (the default).
std::vector<std::string> loss_input_candidates(const Plan &plan, const Graph &forward) {
  std::vector<std::string> names;
  auto add = [&](const std::string &name) {
    if (forward.find_tensor(name).has_value() &&
        std::find(names.begin(), names.end(), name) == names.end())
      names.push_back(name);
  };
  if (const auto loss = plan.graph.find_tensor(plan.loss); loss.has_value()) {
    const NodeId producer = plan.graph.tensor(*loss).producer;
    if (producer != kNoNode)
      for (TensorId in : plan.graph.node(producer).inputs)
        add(plan.graph.tensor(in).name);
  }
  for (TensorId out : forward.outputs())
    add(forward.tensor(out).name);
  return names;
}

// The training options `plan` was compiled with from the model whose
// canonical bytes are `model_bytes`: the plan's loss and optimizer, and the
// loss input for which the options text gives the plan's fingerprint.
Result<passes::TrainingOptions> training_options_of(const Plan &plan, const std::string &path,
                                                    const Graph &forward,
                                                    llvm::ArrayRef<uint8_t> model_bytes,
                                                    const std::string &model_path) {
  passes::TrainingOptions training;
  training.loss = plan.loss_kind;
  auto spec = passes::parse_optimizer(plan.optimizer);
  if (!spec.is_ok())
    return spec.status().with_context(str_cat(path, ": field optimizer '", plan.optimizer, "'"));
  training.optimizer = *spec;
  const std::string parallel = plan.pipeline ? pipeline_options_text(plan) : std::string();
  const std::vector<std::string> candidates = loss_input_candidates(plan, forward);
  std::string tried;
  for (const std::string &output : candidates) {
    training.output = output;
    const std::string options_text = "mode=train\n" + training.to_string() + parallel;
    if (serialization::plan_fingerprint(model_bytes, options_text) == plan.fingerprint)
      return training;
    tried += str_cat(tried.empty() ? "" : ", ", "'", output, "'");
  }
  return invalid_argument(path, ": its fingerprint is not that of ", model_path,
                          " compiled with the plan's loss (", plan.loss_kind, ") and optimizer (",
                          plan.optimizer, ") reading ",
                          tried.empty() ? std::string("any of its tensors") : tried,
                          "; the plan's fields were edited, or it was compiled with another "
                          "--loss-input");
}

} // namespace

Result<Plan> reference_from_plan(const Plan &plan, const std::string &path) {
  RETURN_IF_ERROR(check_training_plan(plan, path));
  if (plan.pipeline && plan.pipeline->tensor_parallel > 1)
    return invalid_argument(path, ": its graph is what one of the ", plan.pipeline->tensor_parallel,
                            " members of a tensor-parallel group runs (a share of the model), "
                            "which one device cannot run alone; give the model it was compiled "
                            "from with --model");
  ASSIGN_OR_RETURN(const int microbatches, reference_microbatches(plan, path));
  partitioner::PipelineOptions lowering;
  lowering.stages = 1;
  lowering.microbatches = microbatches;
  lowering.bucket_bytes = 0; // one device: nothing to reduce
  lowering.schedule = partitioner::Schedule::k1F1B;
  const std::vector<int> node_stage(plan.graph.num_nodes(), 0);
  auto programs = partitioner::lower_pipeline(plan.graph, node_stage, lowering);
  if (!programs.is_ok())
    return programs.status().with_context(str_cat(path, ": lowering its graph for one device"));

  Plan reference;
  reference.mode = Plan::Mode::kTrain;
  reference.graph = plan.graph;
  reference.loss = plan.loss;
  reference.loss_kind = plan.loss_kind;
  reference.optimizer = plan.optimizer;
  reference.model_fingerprint = plan.model_fingerprint;
  reference.devices.push_back({0, "cpu"});
  reference.programs = std::move(programs).value();
  serialization::PlanPipeline pipeline;
  pipeline.stages = 1;
  pipeline.microbatches = microbatches;
  pipeline.schedule = std::string(partitioner::schedule_name(partitioner::Schedule::k1F1B));
  pipeline.node_stage.assign(plan.graph.num_nodes(), 0);
  if (plan.pipeline) pipeline.cluster_json = plan.pipeline->cluster_json;
  reference.pipeline = std::move(pipeline);
  RETURN_IF_ERROR(
      plan::verify_plan(reference).with_context(str_cat(path, ": its one-device reference")));
  return reference;
}

Result<Plan> reference_from_model(const Plan &plan, const std::string &path, const Graph &forward,
                                  const std::string &model_path) {
  RETURN_IF_ERROR(check_training_plan(plan, path));
  auto bytes = serialization::model_to_flatbuffer(forward);
  if (!bytes.is_ok()) return bytes.status().with_context(model_path);
  if (const std::string digest = serialization::sha256_hex(*bytes);
      digest != plan.model_fingerprint)
    return invalid_argument(model_path, " is not the model ", path,
                            " was compiled from (its fingerprint ", digest.substr(0, 16),
                            "... is not the plan's model fingerprint ",
                            plan.model_fingerprint.substr(0, 16), "...)");
  ASSIGN_OR_RETURN(passes::TrainingOptions training,
                   training_options_of(plan, path, forward, *bytes, model_path));
  ASSIGN_OR_RETURN(const int microbatches, reference_microbatches(plan, path));
  partitioner::PipelineCompileOptions options; // one stage, one replica, one member
  options.microbatches = microbatches;
  options.bucket_bytes = 0;
  // One device holds the whole model by design; the host's memory decides.
  options.check_memory = false;
  auto compiled = partitioner::compile_pipeline(forward, training, options);
  if (!compiled.is_ok())
    return compiled.status().with_context(
        str_cat(model_path, ": compiling the one-device reference"));
  compiled->model_fingerprint = plan.model_fingerprint;
  return compiled;
}

Tolerance default_tolerance(const Plan &plan) {
  const auto spec = passes::parse_optimizer(plan.optimizer);
  const bool adam = spec.is_ok() && spec->kind != passes::OptimizerSpec::Kind::kSgd;
  const bool clip = spec.is_ok() && spec->clip_norm > 0;
  std::string reorders; // what makes the plan's sums differ from one device's
  if (plan.pipeline) {
    const serialization::PlanPipeline &p = *plan.pipeline;
    if (p.tensor_parallel > 1)
      reorders = "tensor-parallel groups add partial products in another order than one device";
    else if (p.data_parallel > 1)
      reorders =
          str_cat("the replicas add their gradients in another order than one device",
                  p.zero >= 2 ? str_cat(" (ZeRO-", p.zero,
                                        ": each micro-batch's, before the micro-batches)")
                              : std::string());
    else if (clip && p.stages > 1)
      reorders = "clipping adds each stage's squared gradients apart, which can change the last "
                 "bit of the norm";
  }
  if (reorders.empty())
    return {0, "one device with the same micro-batches computes these very bits"};
  if (adam)
    return {2e-3, reorders + "; Adam turns the rounding noise of gradients that are exactly zero "
                             "into steps of about the learning rate"};
  return {1e-5, reorders};
}

} // namespace strata::tools
