// The graph IR: tensors, nodes and the graph that owns them.
//
// A Graph is a static-shape dataflow graph. Tensors and nodes live in vectors and
// are referred to by index (TensorId, NodeId), so a graph copies cheaply and its
// serialized form maps one to one. Every tensor has exactly one producer: a node,
// or none for graph inputs, parameters and constants. Names of tensors are unique,
// and so are names of nodes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <llvm/ADT/ArrayRef.h>
#include <llvm/ADT/SmallVector.h>
#include <llvm/ADT/StringMap.h>

#include "graph/shape.h"
#include "graph/status.h"

namespace strata {

using TensorId = uint32_t;
using NodeId = uint32_t;
inline constexpr NodeId kNoNode = UINT32_MAX;

// Where a tensor's value comes from.
enum class TensorKind : uint8_t {
  kInput = 0,        // fed by the caller at every run
  kParameter = 1,    // a trainable weight: data, external data, or an initializer
  kConstant = 2,     // fixed data, never trained
  kIntermediate = 3, // produced by a node
  kState = 4,        // persistent but not trained: optimizer moments, step counters;
                     // valued like a parameter, changed only by a StateUpdate
};
std::string_view tensor_kind_name(TensorKind kind);

namespace detail {
// Frees a blob's bytes unless they are borrowed. Outside Blob so that it is
// complete (and default-constructible) where Blob's members need it.
struct BlobFree {
  bool owned = true; // false: borrowed memory, which the blob's owner keeps
  void operator()(std::byte *p) const;
};
} // namespace detail

// A read-only block of bytes, 64-byte aligned, shared between graph copies.
class Blob {
public:
  static std::shared_ptr<const Blob> copy_of(const void *data, size_t size);
  static std::shared_ptr<Blob> zeroed(size_t size);
  // `size` bytes at `data`, which the blob does not own: `owner` keeps them
  // alive and is released, on whichever thread drops the blob last, when the
  // blob goes. For callers that hand strata memory of their own without a
  // copy (the Python module's NumPy arrays), 64-byte aligned like every blob.
  static std::shared_ptr<Blob> borrowed(std::byte *data, size_t size,
                                        std::shared_ptr<const void> owner);

  const std::byte *data() const { return data_.get(); }
  std::byte *mutable_data() { return data_.get(); }
  size_t size() const { return size_; }
  llvm::ArrayRef<uint8_t> bytes() const {
    return {reinterpret_cast<const uint8_t *>(data_.get()), size_};
  }

private:
  using AlignedFree = detail::BlobFree;
  std::unique_ptr<std::byte[], AlignedFree> data_;
  size_t size_ = 0;
  std::shared_ptr<const void> owner_;
};

// How to fill a parameter that carries no data: the runtime draws it on the
// device that owns it, so a huge model is stored and planned in kilobytes.
struct Initializer {
  enum class Kind : uint8_t {
    kNone = 0,     // the tensor has data instead
    kZeros = 1,    //
    kOnes = 2,     //
    kConstant = 3, // every element is `a`
    kNormal = 4,   // normal(mean = a, stddev = b)
    kUniform = 5,  // uniform in [a, b)
  };
  Kind kind = Kind::kNone;
  double a = 0.0;
  double b = 0.0;
  uint64_t seed = 0;

  friend bool operator==(const Initializer &, const Initializer &) = default;
};
std::string_view initializer_kind_name(Initializer::Kind kind);

// Data stored outside the model file: a tensor of a .safetensors file beside it.
struct ExternalData {
  std::string path; // relative to the model's folder, never escaping it
  std::string key;  // the tensor's name in that file
  friend bool operator==(const ExternalData &, const ExternalData &) = default;
};

struct Tensor {
  std::string name;
  TensorType type;
  TensorKind kind = TensorKind::kIntermediate;
  NodeId producer = kNoNode;
  // At most one of these holds the value of a parameter or constant.
  std::shared_ptr<const Blob> data;
  std::optional<ExternalData> external;
  Initializer initializer;

  bool has_value_source() const {
    return data != nullptr || external.has_value() || initializer.kind != Initializer::Kind::kNone;
  }
};

// An attribute value: integer, float, string, or lists of integers or floats.
using AttrValue =
    std::variant<int64_t, double, std::string, std::vector<int64_t>, std::vector<double>>;
enum class AttrType : uint8_t { kInt = 0, kFloat = 1, kString = 2, kInts = 3, kFloats = 4 };
std::string_view attr_type_name(AttrType type);
inline AttrType attr_type(const AttrValue &value) { return static_cast<AttrType>(value.index()); }
std::string attr_value_to_string(const AttrValue &value);

struct Attribute {
  std::string name;
  AttrValue value;
  friend bool operator==(const Attribute &, const Attribute &) = default;
};

struct Node {
  std::string name;
  std::string op;
  llvm::SmallVector<TensorId, 4> inputs;
  llvm::SmallVector<TensorId, 2> outputs;
  std::vector<Attribute> attrs; // sorted by name, names unique

  const AttrValue *find_attr(std::string_view attr_name) const;
  // Sets or replaces an attribute, keeping the list sorted.
  void set_attr(std::string attr_name, AttrValue value);

  std::optional<int64_t> int_attr(std::string_view attr_name) const;
  std::optional<double> float_attr(std::string_view attr_name) const;
  std::optional<std::string> string_attr(std::string_view attr_name) const;
  std::optional<std::vector<int64_t>> ints_attr(std::string_view attr_name) const;
  std::optional<std::vector<double>> floats_attr(std::string_view attr_name) const;
};

// After each run, `target` (a parameter or state tensor) takes the value that
// `value` had in that run. Updates are how a training step changes its weights
// and optimizer state while every tensor keeps a single producer.
struct StateUpdate {
  TensorId target;
  TensorId value;
  friend bool operator==(const StateUpdate &, const StateUpdate &) = default;
};

// Names of graphs, tensors, nodes, ops and attributes are valid UTF-8 without
// NUL bytes, so that every file and report strata writes (JSON included)
// carries them unchanged. The error names `what` ("tensor 3: name") and shows
// the name through escape_bytes.
Status check_name(std::string_view what, std::string_view name);

// `text` with printable ASCII kept and every other byte written as \xNN: safe
// in an error message whatever the bytes are.
std::string escape_bytes(std::string_view text);

class Graph {
public:
  Graph() = default;
  explicit Graph(std::string name) : name_(std::move(name)) {}

  const std::string &name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }

  // Adds a tensor; its producer is set when a node that outputs it is added.
  // Fails if the name is taken.
  Result<TensorId> add_tensor(Tensor tensor);
  // Adds a node; its outputs must have no producer yet. Fails if the node name is
  // taken or an index is out of range.
  Result<NodeId> add_node(Node node);

  size_t num_tensors() const { return tensors_.size(); }
  size_t num_nodes() const { return nodes_.size(); }
  const Tensor &tensor(TensorId id) const { return tensors_[id]; }
  Tensor &mutable_tensor(TensorId id) { return tensors_[id]; }
  const Node &node(NodeId id) const { return nodes_[id]; }
  Node &mutable_node(NodeId id) { return nodes_[id]; }
  llvm::ArrayRef<Tensor> tensors() const { return tensors_; }
  llvm::ArrayRef<Node> nodes() const { return nodes_; }

  std::optional<TensorId> find_tensor(std::string_view name) const;
  // Gives tensor `id` a new name, unique in the graph (importers keep the
  // source's value names this way).
  Status rename_tensor(TensorId id, std::string name);
  std::optional<NodeId> find_node(std::string_view name) const;

  // Graph inputs (fed at every run) and outputs (returned), in order.
  llvm::ArrayRef<TensorId> inputs() const { return inputs_; }
  llvm::ArrayRef<TensorId> outputs() const { return outputs_; }
  void add_input(TensorId id) { inputs_.push_back(id); }
  void add_output(TensorId id) { outputs_.push_back(id); }
  void set_outputs(std::vector<TensorId> ids) { outputs_ = std::move(ids); }

  // End-of-run assignments, in order (each target at most once).
  llvm::ArrayRef<StateUpdate> updates() const { return updates_; }
  void add_update(StateUpdate update) { updates_.push_back(update); }

  // Nodes in an order where every producer precedes its consumers; among ready
  // nodes the one added first goes first, so the order is deterministic. An error
  // names a node on a cycle.
  Result<std::vector<NodeId>> topological_order() const;
  // For each tensor, the nodes that read it (a node reading a tensor twice is listed once).
  std::vector<llvm::SmallVector<NodeId, 2>> consumers() const;

  // Total elements of all parameter tensors.
  int64_t num_parameters() const;

  // A fresh name "base", "base_1", "base_2", ... unused by tensors and nodes.
  std::string unique_name(std::string_view base) const;

private:
  std::string name_;
  std::vector<Tensor> tensors_;
  std::vector<Node> nodes_;
  std::vector<TensorId> inputs_;
  std::vector<TensorId> outputs_;
  std::vector<StateUpdate> updates_;
  llvm::StringMap<TensorId> tensor_by_name_;
  llvm::StringMap<NodeId> node_by_name_;
};

// What the graph layer needs from the op registry: whether an op exists and what
// its outputs are. The ops layer implements it; graph/ never depends on ops/.
class OpResolver {
public:
  virtual ~OpResolver() = default;
  // Output types of `node` given its input types. An error names the op and the
  // offending input or attribute (the caller adds the node name).
  virtual Result<llvm::SmallVector<TensorType, 2>>
  infer_types(const Node &node, llvm::ArrayRef<TensorType> input_types) const = 0;
};

// An error of `node`'s type inference with the node in front: "node 'ln'
// (LayerNorm): attribute 'epsilon' = 0 ...". A message that starts with the
// op's name ("LayerNorm: attribute ...", as the registry's do) drops it, so
// the op is named once.
Status with_node_context(const Status &status, const Node &node);

} // namespace strata
