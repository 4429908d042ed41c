#include "runtime/trainer.h"

#include <cstdio>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "plan/checkpoint_layout.h"
#include "runtime/comm/device_world.h"
#include "serialization/checkpoint.h"
#include "serialization/npy.h"

namespace strata::runtime {
namespace {

namespace fs = std::filesystem;

bool is_persistent(const Tensor &t) {
  return t.kind == TensorKind::kParameter || t.kind == TensorKind::kState;
}

double scalar_value(const HostTensor &t) {
  switch (t.type.dtype) {
  case DType::kF32: return t.as<float>()[0];
  case DType::kF16: return f16_to_float(t.as<uint16_t>()[0]);
  case DType::kBF16: return bf16_to_float(t.as<uint16_t>()[0]);
  default: return 0.0;
  }
}

// "f32[num_batches, 4, 8]": what a --data file for an input of `type` holds.
std::string stacked_type_text(const TensorType &type) {
  std::string text = str_cat(dtype_name(type.dtype), "[num_batches");
  for (int64_t d : type.shape)
    text += str_cat(", ", d);
  return text + "]";
}

// Whether `batch` is what a run of `graph` consumes: one tensor per graph
// input, of `types`. `what` names the batch in errors ("batch 3").
Status check_batch_types(const Graph &graph, const std::vector<TensorType> &types,
                         llvm::ArrayRef<HostTensor> batch, std::string_view what) {
  if (batch.size() != graph.inputs().size())
    return invalid_argument(what, " has ", batch.size(), " tensors for ", graph.inputs().size(),
                            " graph inputs");
  for (size_t i = 0; i < graph.inputs().size(); ++i)
    if (!(batch[i].type == types[i]))
      return invalid_argument(what, ": input '", graph.tensor(graph.inputs()[i]).name, "' is ",
                              batch[i].type.to_string(), " but the plan needs ",
                              types[i].to_string());
  return Status::ok();
}

} // namespace

Status StepRunner::check_assignable(const Graph &graph, TensorId id, const HostTensor &value,
                                    const TensorType *type) {
  if (id >= graph.num_tensors()) return out_of_range("tensor index ", id, " is past the graph");
  const Tensor &tensor = graph.tensor(id);
  if (tensor.kind != TensorKind::kParameter && tensor.kind != TensorKind::kState)
    return invalid_argument("cannot assign to '", tensor.name, "': it is a ",
                            tensor_kind_name(tensor.kind));
  const TensorType &want = type ? *type : tensor.type;
  if (!(value.type == want))
    return invalid_argument("cannot assign ", value.type.to_string(), " to '", tensor.name,
                            "', which is ", want.to_string());
  return Status::ok();
}

std::vector<TensorType> StepRunner::batch_types() const {
  std::vector<TensorType> types;
  for (TensorId id : graph().inputs())
    types.push_back(graph().tensor(id).type);
  return types;
}

std::vector<TensorType> pipeline_batch_types(const Graph &graph, int64_t microbatches) {
  std::vector<TensorType> types;
  for (TensorId id : graph.inputs()) {
    TensorType type = graph.tensor(id).type;
    if (type.rank() > 0) type.shape[0] *= microbatches;
    types.push_back(std::move(type));
  }
  return types;
}

Status check_pipeline_inputs(const Graph &graph, int64_t microbatches) {
  if (microbatches <= 1) return Status::ok();
  for (TensorId id : graph.inputs()) {
    const Tensor &input = graph.tensor(id);
    if (input.type.rank() == 0)
      return invalid_argument("input '", input.name, "' is a scalar (", input.type.to_string(),
                              "), but the plan cuts dim 0 of every input, the batch, into ",
                              microbatches, " micro-batches over its replicas");
  }
  return Status::ok();
}

Dataset synthetic_dataset(const Graph &graph, uint64_t seed, int64_t count, int64_t microbatches) {
  Dataset data;
  for (int64_t k = 0; k < count; ++k)
    data.batches.push_back(random_inputs(graph, seed + static_cast<uint64_t>(k), microbatches));
  data.description = str_cat("synthetic (", count, " fixed random batches, seed ", seed, ")");
  return data;
}

Result<Dataset> load_dataset(const Graph &graph, const std::string &dir, int64_t microbatches) {
  Dataset data;
  int64_t num_batches = -1;
  std::string first_path;
  for (TensorId id : graph.inputs()) {
    Tensor input = graph.tensor(id);
    if (microbatches > 1 && input.type.rank() > 0) input.type.shape[0] *= microbatches;
    std::string path = (fs::path(dir) / (input.name + ".npy")).string();
    std::error_code error;
    if (!fs::exists(path, error))
      return not_found(path,
                       ": missing; a data folder needs <input>.npy for every graph input (input '",
                       input.name, "' is ", input.type.to_string(), ")");
    auto stacked = serialization::read_npy(path);
    if (!stacked.is_ok()) {
      if (stacked.status().message().find(path) == std::string::npos)
        return stacked.status().with_context(path);
      return stacked.status();
    }
    const TensorType &type = stacked->type;
    bool shape_ok = type.dtype == input.type.dtype && type.rank() == input.type.rank() + 1 &&
                    llvm::ArrayRef<int64_t>(type.shape).drop_front() ==
                        llvm::ArrayRef<int64_t>(input.type.shape);
    if (!shape_ok)
      return invalid_argument(path, ": holds ", type.to_string(), " but input '", input.name,
                              "' needs ", stacked_type_text(input.type),
                              " (batches stacked along a new first dimension)");
    int64_t count = type.shape[0];
    if (count < 1) return invalid_argument(path, ": holds no batches (first dimension is 0)");
    if (num_batches >= 0 && count != num_batches)
      return invalid_argument(path, ": holds ", count, " batches but ", first_path, " holds ",
                              num_batches, "; every input needs the same number");
    if (num_batches < 0) {
      num_batches = count;
      first_path = path;
      data.batches.resize(static_cast<size_t>(count));
    }
    size_t bytes = static_cast<size_t>(input.type.size_bytes());
    for (int64_t k = 0; k < count; ++k) {
      HostTensor batch = HostTensor::zeros(input.type);
      if (bytes) std::memcpy(batch.data(), stacked->data() + static_cast<size_t>(k) * bytes, bytes);
      data.batches[static_cast<size_t>(k)].push_back(std::move(batch));
    }
  }
  if (num_batches < 0)
    return invalid_argument("the plan's graph has no inputs to feed from a data folder");
  data.description = str_cat(dir, " (", num_batches, " batches)");
  return data;
}

Result<std::unique_ptr<Trainer>> Trainer::create(Graph graph, const std::string &loss, Dataset data,
                                                 const TrainerOptions &options) {
  ExecutorOptions executor_options;
  executor_options.model_dir = options.model_dir;
  ASSIGN_OR_RETURN(std::unique_ptr<CpuExecutor> executor,
                   CpuExecutor::create(std::move(graph), executor_options));
  return create(std::unique_ptr<StepRunner>(std::move(executor)), loss, std::move(data), options);
}

Result<std::unique_ptr<Trainer>> Trainer::create(std::unique_ptr<StepRunner> runner,
                                                 const std::string &loss, Dataset data,
                                                 const TrainerOptions &options) {
  const Graph &graph = runner->graph();
  auto loss_id = graph.find_tensor(loss);
  if (!loss_id) return invalid_argument("loss tensor '", loss, "' is not in the graph");
  auto it = std::find(graph.outputs().begin(), graph.outputs().end(), *loss_id);
  if (it == graph.outputs().end())
    return invalid_argument("loss tensor '", loss, "' is not a graph output");
  const std::vector<TensorType> types = runner->batch_types();
  for (size_t k = 0; k < data.batches.size(); ++k)
    RETURN_IF_ERROR(check_batch_types(graph, types, data.batches[k], str_cat("batch ", k)));
  std::unique_ptr<Trainer> trainer(new Trainer());
  trainer->loss_output_ = static_cast<size_t>(it - graph.outputs().begin());
  for (TensorId id = 0; id < graph.num_tensors(); ++id)
    if (is_persistent(graph.tensor(id))) trainer->persistent_.push_back(id);
  trainer->executor_ = std::move(runner);
  trainer->data_ = std::move(data);
  trainer->options_ = options;
  if (trainer->options_.layout.empty()) {
    // No plan's record: every parameter and state tensor whole, of the types
    // the runner holds.
    serialization::CheckpointLayout &layout = trainer->options_.layout;
    for (TensorId id : trainer->persistent_) {
      const Tensor &tensor = graph.tensor(id);
      layout.tensors[tensor.name] = {tensor.kind == TensorKind::kParameter,
                                     trainer->executor_->value_type(id), std::nullopt};
    }
  }
  return trainer;
}

Result<double> Trainer::train_step() {
  if (data_.batches.empty())
    return failed_precondition("the trainer holds no batches; give each step its batch");
  return run_step(data_.batches[static_cast<size_t>(step_ % num_batches())]);
}

Result<double> Trainer::train_step(llvm::ArrayRef<HostTensor> batch) {
  RETURN_IF_ERROR(check_batch_types(executor_->graph(), executor_->batch_types(), batch,
                                    str_cat("the batch of step ", step_ + 1)));
  return run_step(batch);
}

Result<double> Trainer::run_step(llvm::ArrayRef<HostTensor> batch) {
  std::vector<HostTensor> outputs;
  Status status = executor_->run(batch, &outputs);
  if (!status.is_ok()) return status.with_context(str_cat("training step ", step_ + 1));
  ++step_;
  return scalar_value(outputs[loss_output_]);
}

std::map<std::string, HostTensor> Trainer::state() const {
  std::map<std::string, HostTensor> tensors;
  for (TensorId id : persistent_) {
    const HostTensor &value = executor_->value(id);
    // A copy: the executor keeps changing its own buffers.
    HostTensor copy = HostTensor::zeros(value.type);
    if (value.size_bytes()) std::memcpy(copy.data(), value.data(), value.size_bytes());
    tensors.emplace(executor_->graph().tensor(id).name, std::move(copy));
  }
  return tensors;
}

Status Trainer::save_checkpoint(const std::string &dir) const {
  ProcessGroup *processes = executor_->processes();
  if (processes == nullptr || processes->size() == 1) {
    std::map<std::string, HostTensor> tensors = state();
    RETURN_IF_ERROR(executor_->read_status().with_context(
        str_cat("checkpoint ", dir, " at step ", step_,
                " was not saved (the previous one stays): reading the weights")));
    ASSIGN_OR_RETURN(serialization::CheckpointFile file,
                     serialization::write_checkpoint_file(
                         dir, serialization::checkpoint_file_name(step_, 0, 1), tensors));
    if (options_.checkpoint_file_written) options_.checkpoint_file_written(step_);
    return serialization::commit_checkpoint(dir, options_.fingerprint, step_, 1, {file},
                                            plan::without_cuts(options_.layout));
  }
  // Every rank writes its file; rank 0 commits the manifest only once all of
  // them are durable, then tells everyone how it went.
  const int rank = processes->rank(), ranks = processes->size();
  auto written = [&]() -> Result<serialization::CheckpointFile> {
    ASSIGN_OR_RETURN(auto pieces, executor_->checkpoint_pieces());
    return serialization::write_checkpoint_file(
        dir, serialization::checkpoint_file_name(step_, rank, ranks), pieces);
  }();
  if (written.is_ok() && options_.checkpoint_file_written) options_.checkpoint_file_written(step_);
  nlohmann::json entry;
  if (written.is_ok())
    entry = {{"name", written->name}, {"size", written->size}, {"sha256", written->sha256}};
  else
    entry = {{"error", written.status().message()}};
  std::vector<std::string> entries;
  RETURN_IF_ERROR(processes->gather(entry.dump(), &entries, "checkpoint files"));
  std::string verdict;
  if (rank == 0) {
    std::vector<serialization::CheckpointFile> files;
    for (size_t r = 0; r < entries.size() && verdict.empty(); ++r) {
      nlohmann::json e = nlohmann::json::parse(entries[r], nullptr, false);
      if (e.is_discarded() || !e.is_object())
        verdict = str_cat("rank ", r, " sent a malformed checkpoint entry");
      else if (e.contains("error"))
        verdict = str_cat("rank ", r, ": ", e["error"].get<std::string>());
      else
        files.push_back({e["name"].get<std::string>(), e["size"].get<uint64_t>(),
                         e["sha256"].get<std::string>()});
    }
    if (verdict.empty()) {
      Status committed = serialization::commit_checkpoint(dir, options_.fingerprint, step_, ranks,
                                                          files, options_.layout);
      if (!committed.is_ok()) verdict = str_cat("rank 0: ", committed.message());
    }
  }
  RETURN_IF_ERROR(processes->broadcast(&verdict, "checkpoint commit"));
  if (!verdict.empty())
    return io_error("checkpoint ", dir, " at step ", step_,
                    " was not committed (the previous one "
                    "stays): ",
                    verdict);
  return Status::ok();
}

Status Trainer::restore_checkpoint(const std::string &dir) {
  ASSIGN_OR_RETURN(serialization::Checkpoint checkpoint, serialization::read_checkpoint(dir, ""));
  const std::string manifest = (fs::path(dir) / serialization::kCheckpointManifestFile).string();
  RETURN_IF_ERROR(
      plan::check_resumable(checkpoint, options_.fingerprint, options_.layout, manifest));
  // Pieces are joined by the checkpoint's own record of its layout; one
  // without a record was written by this very plan (check_resumable).
  const bool recorded = !checkpoint.layout.empty();
  RETURN_IF_ERROR(
      plan::join_checkpoint(checkpoint, recorded ? checkpoint.layout : options_.layout, dir));
  RETURN_IF_ERROR(
      plan::check_checkpoint_tensors(checkpoint, plan::without_cuts(options_.layout), dir));
  const Graph &graph = executor_->graph();
  for (TensorId id : persistent_) {
    const std::string &name = graph.tensor(id).name;
    Status assigned = executor_->assign(id, checkpoint.tensors.at(name));
    if (!assigned.is_ok())
      return assigned.with_context((fs::path(dir) / checkpoint.file_of[name]).string());
  }
  step_ = checkpoint.step;
  resharded_from_.clear();
  if (!options_.fingerprint.empty() && checkpoint.fingerprint != options_.fingerprint)
    resharded_from_ = checkpoint.layout.description;
  return Status::ok();
}

} // namespace strata::runtime
