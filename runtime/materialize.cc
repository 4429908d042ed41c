#include "runtime/materialize.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include <sys/sysinfo.h>

#include "graph/units.h"
#include "ops/registry.h"
#include "runtime/random.h"
#include "serialization/safetensors.h"

namespace strata::runtime {

namespace {

// True when `path` is relative and has no ".." component, so it stays inside
// the folder it is joined to.
bool stays_inside(std::string_view path) {
  if (path.empty() || path.front() == '/') return false;
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string_view::npos) slash = path.size();
    if (path.substr(start, slash - start) == "..") return false;
    start = slash + 1;
  }
  return true;
}

} // namespace

Result<HostTensor> materialize(const Tensor &tensor, const std::string &model_dir) {
  auto context = [&] { return str_cat("materializing tensor '", tensor.name, "'"); };
  auto elements = checked_num_elements(tensor.type.shape);
  if (!elements.is_ok()) return elements.status().with_context(context());
  const int64_t size = tensor.type.size_bytes();

  if (tensor.data != nullptr) {
    if (static_cast<int64_t>(tensor.data->size()) != size)
      return invalid_argument("inline data has ", tensor.data->size(), " bytes, ",
                              tensor.type.to_string(), " needs ", size)
          .with_context(context());
    HostTensor out = HostTensor::zeros(tensor.type);
    if (size > 0) std::memcpy(out.data(), tensor.data->data(), static_cast<size_t>(size));
    return out;
  }
  if (tensor.external.has_value()) {
    const ExternalData &external = *tensor.external;
    if (!stays_inside(external.path))
      return invalid_argument("external data path '", external.path, "' leaves the model's folder")
          .with_context(context());
    std::string path = model_dir.empty() ? external.path : model_dir + "/" + external.path;
    auto read = serialization::read_safetensors_tensor(path, external.key, tensor.type);
    if (!read.is_ok()) return read.status().with_context(context());
    return std::move(read).value();
  }
  if (tensor.initializer.kind != Initializer::Kind::kNone) {
    HostTensor out = HostTensor::zeros(tensor.type);
    Status filled = fill_initializer(tensor.initializer, tensor.type.dtype, 0, *elements,
                                     size > 0 ? static_cast<void *>(out.data()) : nullptr);
    if (!filled.is_ok()) return filled.with_context(context());
    return out;
  }
  return invalid_argument("the ", tensor_kind_name(tensor.kind),
                          " has no data, external data or initializer")
      .with_context(context());
}

std::vector<HostTensor> random_inputs(const Graph &graph, uint64_t seed, int64_t microbatches) {
  // For integer inputs read as indices or labels: the smallest range a reader
  // allows (ops::OpTraits::index_range).
  const ops::OpRegistry &registry = ops::OpRegistry::global();
  const auto consumers = graph.consumers();
  auto index_bound = [&](TensorId input) -> std::optional<int64_t> {
    std::optional<int64_t> bound;
    for (NodeId user : consumers[input]) {
      const Node &node = graph.node(user);
      const ops::OpDef *def = registry.find(node.op);
      if (def == nullptr || def->traits.index_range == nullptr) continue;
      llvm::SmallVector<TensorType, 4> types;
      for (TensorId t : node.inputs)
        types.push_back(graph.tensor(t).type);
      for (size_t slot = 0; slot < node.inputs.size() && slot < 32; ++slot) {
        if (node.inputs[slot] != input || ((def->traits.integer_inputs >> slot) & 1u) == 0)
          continue;
        if (const std::optional<int64_t> range = def->traits.index_range(node, *def, types, slot))
          bound = bound ? std::min(*bound, *range) : *range;
      }
    }
    return bound;
  };

  std::vector<HostTensor> inputs;
  inputs.reserve(graph.inputs().size());
  for (size_t k = 0; k < graph.inputs().size(); ++k) {
    const TensorId id = graph.inputs()[k];
    TensorType type = graph.tensor(id).type;
    if (microbatches > 1 && type.rank() > 0) type.shape[0] *= microbatches;
    const uint64_t stream_seed = derive_seed(seed, k);
    HostTensor tensor = HostTensor::zeros(type);
    const int64_t n = type.num_elements();
    if (is_floating(type.dtype)) {
      Initializer normal{Initializer::Kind::kNormal, 0.0, 1.0, stream_seed};
      if (n > 0) fill_initializer(normal, type.dtype, 0, n, tensor.data()).ignore();
    } else {
      const int64_t bound = std::max<int64_t>(0, index_bound(id).value_or(2));
      for (int64_t i = 0; i < n; ++i) {
        auto value = static_cast<int64_t>(
            random_below(stream_seed, static_cast<uint64_t>(i), static_cast<uint64_t>(bound)));
        switch (type.dtype) {
        case DType::kI32: tensor.as<int32_t>()[i] = static_cast<int32_t>(value); break;
        case DType::kI64: tensor.as<int64_t>()[i] = value; break;
        case DType::kBool: tensor.as<uint8_t>()[i] = static_cast<uint8_t>(value != 0); break;
        default: break;
        }
      }
    }
    inputs.push_back(std::move(tensor));
  }
  return inputs;
}

Status check_host_memory(int64_t bytes, std::string_view what, std::string_view parts) {
  struct sysinfo info {};
  if (sysinfo(&info) != 0) return Status::ok(); // unknown: let the allocation decide
  const double unit = info.mem_unit, ram = static_cast<double>(info.totalram) * unit,
               swap = static_cast<double>(info.totalswap) * unit;
  if (static_cast<double>(bytes) <= ram + swap) return Status::ok();
  return resource_exhausted(what, " ", human_bytes(static_cast<double>(bytes)), " of memory (",
                            parts, "); this host has ", human_bytes(ram),
                            swap > 0 ? str_cat(" and ", human_bytes(swap), " of swap")
                                     : std::string(" and no swap"));
}


} // namespace strata::runtime
