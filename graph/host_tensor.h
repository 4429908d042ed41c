// HostTensor: a typed block of host memory, for values crossing the API (graph
// inputs and outputs, .npy files, checkpoints, materialized weights).
#pragma once

#include <memory>

#include "graph/dtype.h"
#include "graph/graph.h"

namespace strata {

struct HostTensor {
  TensorType type;
  std::shared_ptr<Blob> blob; // exactly type.size_bytes() bytes, 64-byte aligned

  // A zero-filled tensor of `type`.
  static HostTensor zeros(TensorType type) {
    HostTensor t{std::move(type), nullptr};
    t.blob = Blob::zeroed(static_cast<size_t>(t.type.size_bytes()));
    return t;
  }
  std::byte *data() { return blob->mutable_data(); }
  const std::byte *data() const { return blob->data(); }
  size_t size_bytes() const { return blob ? blob->size() : 0; }
  template <typename T> T *as() { return reinterpret_cast<T *>(data()); }
  template <typename T> const T *as() const { return reinterpret_cast<const T *>(data()); }

  // Element `i` as a double, whatever the dtype (for printing and comparing).
  double element(int64_t i) const {
    switch (type.dtype) {
    case DType::kF32: return as<float>()[i];
    case DType::kF16: return f16_to_float(as<uint16_t>()[i]);
    case DType::kBF16: return bf16_to_float(as<uint16_t>()[i]);
    case DType::kI32: return as<int32_t>()[i];
    case DType::kI64: return static_cast<double>(as<int64_t>()[i]);
    case DType::kBool: return as<uint8_t>()[i] != 0;
    }
    return 0;
  }
};

} // namespace strata
