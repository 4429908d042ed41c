#include "plan/checkpoint_layout.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>

#include "plan/pieces.h"

namespace strata::plan {
namespace {

namespace fs = std::filesystem;
using serialization::Checkpoint;
using serialization::CheckpointLayout;
using serialization::CheckpointTensor;

std::string short_digest(std::string_view digest) {
  return std::string(digest.substr(0, 16)) + (digest.size() > 16 ? "..." : "");
}

bool is_persistent(const Tensor &t) {
  return t.kind == TensorKind::kParameter || t.kind == TensorKind::kState;
}

// The type of a stored tensor "<name>" or "<name>@tp<m>of<T>" by the record:
// whole, or the piece's. nullopt for a name the record does not know or
// does not cut that way.
std::optional<TensorType> stored_type(const CheckpointLayout &layout, const std::string &name) {
  const size_t at = name.rfind("@tp");
  auto it = layout.tensors.find(name.substr(0, at));
  if (it == layout.tensors.end()) return std::nullopt;
  TensorType type = it->second.type;
  if (at == std::string::npos) return type;
  long long m = -1, t = -1;
  char tail = 0;
  const std::optional<serialization::TensorCut> &cut = it->second.cut;
  if (!cut || std::sscanf(name.c_str() + at, "@tp%lldof%lld%c", &m, &t, &tail) != 2 ||
      t != cut->parts || m < 0 || m >= t)
    return std::nullopt;
  type.shape[static_cast<size_t>(cut->dim)] /= cut->parts;
  return type;
}

// "<base>@<kind><i>of<n>" split at the last "@<kind>"; false when `name`
// has no such suffix, error when it has a malformed one.
Result<bool> split_piece(const std::string &name, const char *kind, std::string *base, int64_t *i,
                         int64_t *n) {
  const std::string marker = std::string("@") + kind;
  const size_t at = name.rfind(marker);
  if (at == std::string::npos) return false;
  long long index = -1, count = -1;
  char tail = 0;
  const std::string format = marker + "%lldof%lld%c";
  if (std::sscanf(name.c_str() + at, format.c_str(), &index, &count, &tail) != 2 || index < 0 ||
      count < 1 || index >= count)
    return invalid_argument("tensor '", name, "' looks like a piece but is not <name>", marker,
                            "<i>of<n>");
  *base = name.substr(0, at);
  *i = index;
  *n = count;
  return true;
}

// Joins the ZeRO shards "<base>@shard<i>of<n>" of every tensor (flat runs of
// its bytes, in order) into "<base>".
Status join_shards(Checkpoint &checkpoint, const CheckpointLayout &layout,
                   const std::string &manifest,
                   const std::function<std::string(const std::string &)> &file_of) {
  std::map<std::string, std::map<int64_t, std::string>> pieces;
  std::map<std::string, int64_t> piece_count;
  for (const auto &[name, value] : checkpoint.tensors) {
    std::string base;
    int64_t i = 0, n = 0;
    auto found = split_piece(name, "shard", &base, &i, &n);
    if (!found.is_ok()) return found.status().with_context(file_of(name));
    if (!*found) continue;
    auto [count, fresh] = piece_count.emplace(base, n);
    if (!fresh && count->second != n)
      return invalid_argument(file_of(name), ": tensor '", base, "' is stored in pieces of ",
                              count->second, " and of ", n);
    pieces[base][i] = name;
  }
  for (const auto &[base, parts] : pieces) {
    const std::string &first = parts.begin()->second;
    const std::optional<TensorType> type = stored_type(layout, base);
    if (!type)
      return invalid_argument(file_of(first), ": tensor '", base,
                              "' is not a parameter or state tensor of the checkpoint's layout");
    const int64_t n = piece_count.at(base);
    if (static_cast<int64_t>(parts.size()) != n)
      return not_found(manifest, ": tensor '", base, "' has ", parts.size(), " of its ", n,
                       " pieces (a rank's file is missing?)");
    int64_t bytes = 0;
    for (const auto &[i, name] : parts) {
      const HostTensor &piece = checkpoint.tensors.at(name);
      if (piece.type.dtype != type->dtype)
        return invalid_argument(file_of(name), ": piece '", name, "' (", piece.type.to_string(),
                                ") does not fit '", base, "' (", type->to_string(), ")");
      bytes += piece.size_bytes();
    }
    if (bytes != type->size_bytes())
      return invalid_argument(manifest, ": the pieces of '", base, "' hold ", bytes, " bytes; '",
                              base, "' (", type->to_string(), ") has ", type->size_bytes());
    HostTensor whole = HostTensor::zeros(*type);
    size_t offset = 0;
    for (const auto &[i, name] : parts) {
      const HostTensor &piece = checkpoint.tensors.at(name);
      if (piece.size_bytes()) std::memcpy(whole.data() + offset, piece.data(), piece.size_bytes());
      offset += static_cast<size_t>(piece.size_bytes());
    }
    checkpoint.file_of[base] = checkpoint.file_of[first];
    for (const auto &[i, name] : parts) {
      checkpoint.tensors.erase(name);
      checkpoint.file_of.erase(name);
    }
    checkpoint.tensors.insert_or_assign(base, std::move(whole));
  }
  return Status::ok();
}

// Joins the tensor-parallel pieces "<base>@tp<m>of<T>" of every tensor into
// "<base>", cut as the record says.
Status join_tp_pieces(Checkpoint &checkpoint, const CheckpointLayout &layout,
                      const std::string &manifest,
                      const std::function<std::string(const std::string &)> &file_of) {
  std::map<std::string, std::map<int64_t, std::string>> pieces;
  for (const auto &[name, value] : checkpoint.tensors) {
    std::string base;
    int64_t m = 0, t = 0;
    auto found = split_piece(name, "tp", &base, &m, &t);
    if (!found.is_ok()) return found.status().with_context(file_of(name));
    if (*found) pieces[base][m] = name;
  }
  for (const auto &[base, parts] : pieces) {
    const std::string &first = parts.begin()->second;
    auto record = layout.tensors.find(base);
    if (record == layout.tensors.end() || !record->second.cut)
      return invalid_argument(file_of(first), ": tensor '", first,
                              "' is a tensor-parallel piece of a tensor the checkpoint's layout "
                              "does not cut");
    const serialization::TensorCut &cut = *record->second.cut;
    std::vector<HostTensor> ordered;
    for (int64_t m = 0; m < cut.parts; ++m) {
      auto it = parts.find(m);
      if (it == parts.end())
        return not_found(manifest, ": tensor '", base, "' lacks tensor-parallel piece ", m, " of ",
                         cut.parts, " (a rank's file is missing?)");
      ordered.push_back(checkpoint.tensors.at(it->second));
    }
    if (parts.size() != static_cast<size_t>(cut.parts))
      return invalid_argument(file_of(first), ": tensor '", base, "' has ", parts.size(),
                              " tensor-parallel pieces; the layout cuts it in ", cut.parts);
    const TensorType &whole = record->second.type;
    serialization::PlanShard shard{
        base, {whole.shape.begin(), whole.shape.end()}, cut.dim, cut.outer};
    Tensor piece_tensor;
    piece_tensor.name = base;
    piece_tensor.type = *stored_type(layout, str_cat(base, "@tp0of", cut.parts));
    auto joined = plan::join_pieces(piece_tensor, shard, cut.parts, ordered);
    if (!joined.is_ok()) return joined.status().with_context(file_of(first));
    checkpoint.file_of[base] = checkpoint.file_of[first];
    for (const auto &[m, name] : parts) {
      checkpoint.tensors.erase(name);
      checkpoint.file_of.erase(name);
    }
    checkpoint.tensors.insert_or_assign(base, std::move(joined).value());
  }
  return Status::ok();
}

} // namespace

CheckpointLayout checkpoint_layout(const Graph &graph, std::string model, std::string optimizer,
                                   std::string description) {
  CheckpointLayout layout;
  layout.model = std::move(model);
  layout.optimizer = std::move(optimizer);
  layout.description = std::move(description);
  for (TensorId id = 0; id < graph.num_tensors(); ++id) {
    const Tensor &tensor = graph.tensor(id);
    if (!is_persistent(tensor)) continue;
    layout.tensors[tensor.name] =
        CheckpointTensor{tensor.kind == TensorKind::kParameter, tensor.type, std::nullopt};
  }
  return layout;
}

CheckpointLayout checkpoint_layout(const serialization::Plan &plan, std::string description) {
  CheckpointLayout layout =
      checkpoint_layout(plan.graph, plan.model_fingerprint, plan.optimizer, std::move(description));
  if (!plan.pipeline) return layout;
  for (const serialization::PlanShard &shard : plan.pipeline->shards) {
    auto it = layout.tensors.find(shard.tensor);
    if (it == layout.tensors.end()) continue;
    it->second.type.shape.assign(shard.full_shape.begin(), shard.full_shape.end());
    it->second.cut =
        serialization::TensorCut{shard.dim, shard.outer, plan.pipeline->tensor_parallel};
  }
  return layout;
}

CheckpointLayout without_cuts(CheckpointLayout layout) {
  for (auto &[name, tensor] : layout.tensors)
    tensor.cut.reset();
  return layout;
}

std::string layout_description(const serialization::Plan &plan, int ranks) {
  std::string text;
  if (!plan.pipeline) {
    text = "one device";
  } else {
    const serialization::PlanPipeline &p = *plan.pipeline;
    text = str_cat("mesh ", p.data_parallel, "x", p.tensor_parallel, "x", p.stages, " (DPxTPxPP), ",
                   p.microbatches, p.microbatches == 1 ? " micro-batch, " : " micro-batches, ",
                   p.schedule);
    if (p.chunks > 1) text += str_cat(" (", p.chunks, " chunks)");
    if (p.zero > 0) text += str_cat(", ZeRO-", p.zero);
  }
  if (ranks > 1) text += str_cat(", ", ranks, " ranks");
  return text;
}

Status check_resumable(const Checkpoint &checkpoint, std::string_view fingerprint,
                       const CheckpointLayout &mine, const std::string &manifest) {
  if (fingerprint.empty() || checkpoint.fingerprint == fingerprint) return Status::ok();
  const CheckpointLayout &theirs = checkpoint.layout;
  if (theirs.empty())
    return failed_precondition(
        manifest, ": the checkpoint was written by a plan with fingerprint ",
        short_digest(checkpoint.fingerprint), " but this plan's fingerprint is ",
        short_digest(fingerprint),
        ", and it does not record the layout it was written in (a checkpoint of an older "
        "strata); resume it with the plan that wrote it (same model and options), then save "
        "again");
  if (mine.model.empty())
    return failed_precondition(manifest, ": the checkpoint was written by a plan with fingerprint ",
                               short_digest(checkpoint.fingerprint), " (", theirs.description,
                               ") but this plan's fingerprint is ", short_digest(fingerprint),
                               ", and this run knows no model to compare it by");
  if (theirs.model != mine.model)
    return failed_precondition(manifest, ": the checkpoint is of another model (SHA-256 ",
                               short_digest(theirs.model), "; this plan's model is ",
                               short_digest(mine.model),
                               "); a checkpoint resumes plans of the model it was trained from");
  if (theirs.optimizer != mine.optimizer)
    return failed_precondition(manifest, ": the checkpoint was trained with optimizer '",
                               theirs.optimizer, "' but this plan's is '", mine.optimizer,
                               "'; compile the plan with the checkpoint's optimizer");
  return Status::ok();
}

Status join_checkpoint(Checkpoint &checkpoint, const CheckpointLayout &layout,
                       const std::string &dir) {
  const std::string manifest = (fs::path(dir) / serialization::kCheckpointManifestFile).string();
  auto file_of = [&](const std::string &name) {
    auto it = checkpoint.file_of.find(name);
    return it == checkpoint.file_of.end() ? manifest : (fs::path(dir) / it->second).string();
  };
  // Shards first: a tensor-parallel piece may itself be in shards.
  RETURN_IF_ERROR(join_shards(checkpoint, layout, manifest, file_of));
  return join_tp_pieces(checkpoint, layout, manifest, file_of);
}

Status check_checkpoint_tensors(const Checkpoint &checkpoint, const CheckpointLayout &want,
                                const std::string &dir) {
  const std::string manifest = (fs::path(dir) / serialization::kCheckpointManifestFile).string();
  auto file_of = [&](const std::string &name) {
    auto it = checkpoint.file_of.find(name);
    return it == checkpoint.file_of.end() ? manifest : (fs::path(dir) / it->second).string();
  };
  for (const auto &[name, value] : checkpoint.tensors)
    if (!want.tensors.contains(name))
      return invalid_argument(file_of(name), ": tensor '", name,
                              "' is not a parameter or state tensor of the plan");
  for (const auto &[name, record] : want.tensors) {
    const char *role = record.parameter ? "parameter" : "state";
    auto found = checkpoint.tensors.find(name);
    if (found == checkpoint.tensors.end())
      return not_found(manifest, ": tensor '", name, "' (", role, " ", record.type.to_string(),
                       ") is in none of the checkpoint's files");
    if (!(found->second.type == record.type))
      return invalid_argument(file_of(name), ": tensor '", name, "' is ",
                              found->second.type.to_string(), " but the plan has ",
                              record.type.to_string());
  }
  return Status::ok();
}

} // namespace strata::plan
