#include "tools/training_setup.h"

#include <filesystem>

#include "serialization/file_io.h"

namespace strata::tools {

namespace fs = std::filesystem;

Result<runtime::Dataset> training_data(const serialization::Plan &plan, const std::string &data_dir,
                                       uint64_t seed) {
  // A pipeline step takes microbatches x replicas micro-batches of the graph's batch.
  const int64_t microbatches =
      plan.pipeline ? int64_t{plan.pipeline->microbatches} * plan.pipeline->data_parallel : 1;
  if (!data_dir.empty()) return runtime::load_dataset(plan.graph, data_dir, microbatches);
  return runtime::synthetic_dataset(plan.graph, seed, 8, microbatches);
}

bool holds_checkpoint(const std::string &dir) {
  std::error_code error;
  return fs::exists(fs::path(dir) / serialization::kCheckpointManifestFile, error);
}

Result<std::optional<serialization::CheckpointLock>>
claim_checkpoint_folder(const std::string &checkpoint, const std::string &resume, int rank,
                        std::string_view checkpoint_option, std::string_view resume_option) {
  std::optional<serialization::CheckpointLock> lock;
  if (checkpoint.empty()) return lock;
  // A resume that cannot succeed is refused before the new folder is made.
  if (!resume.empty() && !holds_checkpoint(resume))
    return not_found(resume_option, " ", resume, ": not a checkpoint folder (it has no ",
                     serialization::kCheckpointManifestFile, ", or its first save did not finish)");
  RETURN_IF_ERROR(serialization::check_folder_writable(checkpoint, checkpoint_option));
  if (rank == 0) {
    auto locked = serialization::CheckpointLock::acquire(checkpoint);
    if (!locked.is_ok()) return locked.status().with_context(checkpoint_option);
    lock.emplace(std::move(locked).value());
  }
  std::error_code error;
  const bool resumes_it = !resume.empty() && fs::equivalent(resume, checkpoint, error);
  if (!resumes_it && holds_checkpoint(checkpoint))
    return failed_precondition(checkpoint_option, " ", checkpoint,
                               " already holds a checkpoint, which this run would "
                               "replace; continue it with ",
                               resume_option, " ", checkpoint, ", or save to another folder");
  return lock;
}

} // namespace strata::tools
