#include "graph/graph.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <queue>

#include <llvm/Support/ConvertUTF.h>

#include "strata_config.h"

#if STRATA_LLVM_STATIC && defined(__linux__)
#include <errno.h>
#include <sys/random.h>
#include <time.h>
#endif

namespace strata {

std::string_view tensor_kind_name(TensorKind kind) {
  switch (kind) {
  case TensorKind::kInput: return "input";
  case TensorKind::kParameter: return "parameter";
  case TensorKind::kConstant: return "constant";
  case TensorKind::kIntermediate: return "intermediate";
  case TensorKind::kState: return "state";
  }
  return "?";
}

std::string_view initializer_kind_name(Initializer::Kind kind) {
  switch (kind) {
  case Initializer::Kind::kNone: return "none";
  case Initializer::Kind::kZeros: return "zeros";
  case Initializer::Kind::kOnes: return "ones";
  case Initializer::Kind::kConstant: return "constant";
  case Initializer::Kind::kNormal: return "normal";
  case Initializer::Kind::kUniform: return "uniform";
  }
  return "?";
}

std::string_view attr_type_name(AttrType type) {
  switch (type) {
  case AttrType::kInt: return "int";
  case AttrType::kFloat: return "float";
  case AttrType::kString: return "string";
  case AttrType::kInts: return "ints";
  case AttrType::kFloats: return "floats";
  }
  return "?";
}

std::string attr_value_to_string(const AttrValue &value) {
  std::ostringstream out;
  std::visit(
      [&](const auto &v) {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, std::string>) {
          out << '"' << v << '"';
        } else if constexpr (std::is_same_v<V, int64_t> || std::is_same_v<V, double>) {
          out << v;
        } else {
          out << '[';
          for (size_t i = 0; i < v.size(); ++i)
            out << (i ? ", " : "") << v[i];
          out << ']';
        }
      },
      value);
  return out.str();
}

std::string escape_bytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f) {
      out += c;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", byte);
      out += buf;
    }
  }
  return out;
}

Status with_node_context(const Status &status, const Node &node) {
  std::string_view message = status.message();
  const std::string own = node.op + ": ";
  if (message.starts_with(own)) message.remove_prefix(own.size());
  return Status(status.code(), str_cat("node '", node.name, "' (", node.op, "): ", message));
}

Status check_name(std::string_view what, std::string_view name) {
  if (name.find('\0') != std::string_view::npos)
    return invalid_argument(what, " '", escape_bytes(name),
                            "' holds a NUL byte; names are UTF-8 text without NUL bytes");
  const auto *begin = reinterpret_cast<const llvm::UTF8 *>(name.data());
  if (!llvm::isLegalUTF8String(&begin, begin + name.size()))
    return invalid_argument(what, " '", escape_bytes(name),
                            "' is not valid UTF-8; names are UTF-8 text without NUL bytes");
  return Status::ok();
}

void detail::BlobFree::operator()(std::byte *p) const {
  if (owned) std::free(p);
}

std::shared_ptr<Blob> Blob::zeroed(size_t size) {
  auto blob = std::make_shared<Blob>();
  size_t rounded = (std::max<size_t>(size, 1) + 63) / 64 * 64;
  auto *raw = static_cast<std::byte *>(std::aligned_alloc(64, rounded));
  if (raw == nullptr) throw std::bad_alloc();
  std::memset(raw, 0, rounded);
  blob->data_.reset(raw);
  blob->size_ = size;
  return blob;
}

std::shared_ptr<Blob> Blob::borrowed(std::byte *data, size_t size,
                                     std::shared_ptr<const void> owner) {
  auto blob = std::make_shared<Blob>();
  blob->data_ = std::unique_ptr<std::byte[], AlignedFree>(data, AlignedFree{false});
  blob->size_ = size;
  blob->owner_ = std::move(owner);
  return blob;
}

std::shared_ptr<const Blob> Blob::copy_of(const void *data, size_t size) {
  auto blob = zeroed(size);
  if (size) std::memcpy(blob->mutable_data(), data, size);
  return blob;
}

const AttrValue *Node::find_attr(std::string_view attr_name) const {
  auto it = std::lower_bound(attrs.begin(), attrs.end(), attr_name,
                             [](const Attribute &a, std::string_view n) { return a.name < n; });
  if (it == attrs.end() || it->name != attr_name) return nullptr;
  return &it->value;
}

void Node::set_attr(std::string attr_name, AttrValue value) {
  auto it = std::lower_bound(attrs.begin(), attrs.end(), attr_name,
                             [](const Attribute &a, const std::string &n) { return a.name < n; });
  if (it != attrs.end() && it->name == attr_name) {
    it->value = std::move(value);
    return;
  }
  attrs.insert(it, Attribute{std::move(attr_name), std::move(value)});
}

namespace {
template <typename T> std::optional<T> typed_attr(const Node &node, std::string_view attr_name) {
  const AttrValue *value = node.find_attr(attr_name);
  if (value == nullptr) return std::nullopt;
  if (const T *typed = std::get_if<T>(value)) return *typed;
  return std::nullopt;
}
} // namespace

std::optional<int64_t> Node::int_attr(std::string_view n) const {
  return typed_attr<int64_t>(*this, n);
}
std::optional<double> Node::float_attr(std::string_view n) const {
  // An integer literal is accepted where a float is expected.
  if (auto i = typed_attr<int64_t>(*this, n)) return static_cast<double>(*i);
  return typed_attr<double>(*this, n);
}
std::optional<std::string> Node::string_attr(std::string_view n) const {
  return typed_attr<std::string>(*this, n);
}
std::optional<std::vector<int64_t>> Node::ints_attr(std::string_view n) const {
  return typed_attr<std::vector<int64_t>>(*this, n);
}
std::optional<std::vector<double>> Node::floats_attr(std::string_view n) const {
  if (auto i = typed_attr<std::vector<int64_t>>(*this, n))
    return std::vector<double>(i->begin(), i->end());
  return typed_attr<std::vector<double>>(*this, n);
}

Result<TensorId> Graph::add_tensor(Tensor tensor) {
  if (tensor.name.empty()) return invalid_argument("tensor ", tensors_.size(), " has no name");
  TensorId id = static_cast<TensorId>(tensors_.size());
  if (!tensor_by_name_.try_emplace(tensor.name, id).second)
    return already_exists("tensor name '", tensor.name, "' is used twice");
  tensor.producer = kNoNode;
  tensors_.push_back(std::move(tensor));
  return id;
}

Result<NodeId> Graph::add_node(Node node) {
  if (node.name.empty()) return invalid_argument("node ", nodes_.size(), " has no name");
  NodeId id = static_cast<NodeId>(nodes_.size());
  for (TensorId input : node.inputs)
    if (input >= tensors_.size())
      return out_of_range("node '", node.name, "' reads tensor index ", input,
                          " but the graph has ", tensors_.size(), " tensors");
  for (TensorId output : node.outputs) {
    if (output >= tensors_.size())
      return out_of_range("node '", node.name, "' writes tensor index ", output,
                          " but the graph has ", tensors_.size(), " tensors");
    const Tensor &t = tensors_[output];
    if (t.producer != kNoNode)
      return invalid_argument("tensor '", t.name, "' is produced by both node '",
                              nodes_[t.producer].name, "' and node '", node.name, "'");
    if (t.kind != TensorKind::kIntermediate)
      return invalid_argument("node '", node.name, "' writes tensor '", t.name, "', which is a ",
                              tensor_kind_name(t.kind), " (only intermediates have producers)");
  }
  if (!node_by_name_.try_emplace(node.name, id).second)
    return already_exists("node name '", node.name, "' is used twice");
  for (TensorId output : node.outputs)
    tensors_[output].producer = id;
  nodes_.push_back(std::move(node));
  return id;
}

Status Graph::rename_tensor(TensorId id, std::string name) {
  if (id >= tensors_.size()) return out_of_range("tensor index ", id, " is past the graph");
  if (tensors_[id].name == name) return Status::ok();
  if (name.empty()) return invalid_argument("a tensor name cannot be empty");
  if (tensor_by_name_.count(name))
    return already_exists("a tensor named '", name, "' already exists");
  tensor_by_name_.erase(tensors_[id].name);
  tensor_by_name_[name] = id;
  tensors_[id].name = std::move(name);
  return Status::ok();
}

std::optional<TensorId> Graph::find_tensor(std::string_view name) const {
  auto it = tensor_by_name_.find(name);
  if (it == tensor_by_name_.end()) return std::nullopt;
  return it->second;
}

std::optional<NodeId> Graph::find_node(std::string_view name) const {
  auto it = node_by_name_.find(name);
  if (it == node_by_name_.end()) return std::nullopt;
  return it->second;
}

std::vector<llvm::SmallVector<NodeId, 2>> Graph::consumers() const {
  std::vector<llvm::SmallVector<NodeId, 2>> result(tensors_.size());
  for (NodeId id = 0; id < nodes_.size(); ++id)
    for (TensorId input : nodes_[id].inputs)
      if (result[input].empty() || result[input].back() != id) result[input].push_back(id);
  return result;
}

Result<std::vector<NodeId>> Graph::topological_order() const {
  std::vector<uint32_t> pending(nodes_.size(), 0);
  auto users = consumers();
  for (NodeId id = 0; id < nodes_.size(); ++id)
    for (TensorId input : nodes_[id].inputs)
      if (tensors_[input].producer != kNoNode) ++pending[id];
  std::priority_queue<NodeId, std::vector<NodeId>, std::greater<>> ready;
  for (NodeId id = 0; id < nodes_.size(); ++id)
    if (pending[id] == 0) ready.push(id);
  std::vector<NodeId> order;
  order.reserve(nodes_.size());
  while (!ready.empty()) {
    NodeId id = ready.top();
    ready.pop();
    order.push_back(id);
    for (TensorId output : nodes_[id].outputs)
      for (NodeId user : users[output]) {
        // A user reading this tensor k times was counted k times.
        for (TensorId input : nodes_[user].inputs)
          if (input == output) --pending[user];
        if (pending[user] == 0) ready.push(user);
      }
  }
  if (order.size() != nodes_.size()) {
    for (NodeId id = 0; id < nodes_.size(); ++id)
      if (pending[id] != 0)
        return invalid_argument("the graph has a cycle through node '", nodes_[id].name, "' (",
                                nodes_[id].op, ")");
  }
  return order;
}

int64_t Graph::num_parameters() const {
  int64_t total = 0;
  for (const Tensor &t : tensors_)
    if (t.kind == TensorKind::kParameter) total += t.type.num_elements();
  return total;
}

std::string Graph::unique_name(std::string_view base) const {
  std::string candidate(base);
  for (int suffix = 1; tensor_by_name_.count(candidate) || node_by_name_.count(candidate); ++suffix)
    candidate = str_cat(base, "_", suffix);
  return candidate;
}

} // namespace strata

#if STRATA_LLVM_STATIC && defined(__linux__)
// LLVM's support library, when linked statically (-Dllvm_static=true, as in
// scripts/gpu-check's bundle), calls arc4random wherever the C library it was
// built against has one (glibc 2.36 and later). Defined here, in an object
// every program links, the programs also load on older C libraries (GPU
// images on Ubuntu 22.04 have 2.35). LLVM draws only temporary file names
// from it.
extern "C" uint32_t arc4random() noexcept {
  uint32_t value = 0;
  for (;;) {
    ssize_t got = getrandom(&value, sizeof value, 0);
    if (got == static_cast<ssize_t>(sizeof value)) return value;
    if (got < 0 && errno != EINTR) break;
  }
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<uint32_t>(now.tv_nsec) ^ static_cast<uint32_t>(now.tv_sec);
}
#endif
