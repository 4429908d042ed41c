// Shared helpers for op tests: tensors in any dtype, running an op's CPU kernel
// through the registry with guard bytes around every buffer, and comparisons
// against reference values computed in double.
//
// run_op() infers output types through OpRegistry::infer_types (so schema checks
// run too), places each input and output inside a larger buffer whose margins
// hold a guard pattern, prefills outputs with a poison pattern, runs the kernel,
// and reports a test failure if any margin changed or an input was modified.
#pragma once

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "graph/graph.h"
#include "ops/registry.h"

namespace strata::ops::testing {

// A tensor for tests: a type and its bytes.
struct TestTensor {
  TensorType type;
  std::vector<uint8_t> bytes; // type.size_bytes() bytes; operator new aligns them to 16

  template <typename T> T *as() { return reinterpret_cast<T *>(bytes.data()); }
  template <typename T> const T *as() const { return reinterpret_cast<const T *>(bytes.data()); }
  int64_t num_elements() const { return type.num_elements(); }

  // Element i as a double (bool: 0 or 1, any nonzero byte reads as 1).
  double get(int64_t i) const {
    switch (type.dtype) {
    case DType::kF32: return as<float>()[i];
    case DType::kF16: return f16_to_float(as<uint16_t>()[i]);
    case DType::kBF16: return bf16_to_float(as<uint16_t>()[i]);
    case DType::kI32: return as<int32_t>()[i];
    case DType::kI64: return static_cast<double>(as<int64_t>()[i]);
    case DType::kBool: return as<uint8_t>()[i] != 0 ? 1.0 : 0.0;
    }
    return 0;
  }
  // Stores `value` as element i: rounded for floating types, truncated for
  // integers (the value must fit), != 0 for bool.
  void set(int64_t i, double value) {
    switch (type.dtype) {
    case DType::kF32: as<float>()[i] = static_cast<float>(value); break;
    case DType::kF16: as<uint16_t>()[i] = float_to_f16(static_cast<float>(value)); break;
    case DType::kBF16: as<uint16_t>()[i] = float_to_bf16(static_cast<float>(value)); break;
    case DType::kI32: as<int32_t>()[i] = static_cast<int32_t>(value); break;
    case DType::kI64: as<int64_t>()[i] = static_cast<int64_t>(value); break;
    case DType::kBool: as<uint8_t>()[i] = value != 0 ? 1 : 0; break;
    }
  }
  std::vector<double> values() const {
    std::vector<double> out(static_cast<size_t>(num_elements()));
    for (int64_t i = 0; i < num_elements(); ++i)
      out[i] = get(i);
    return out;
  }
};

inline TestTensor zeros(DType dtype, Shape shape) {
  TestTensor t{TensorType{dtype, std::move(shape)}, {}};
  t.bytes.assign(static_cast<size_t>(t.type.size_bytes()), 0);
  return t;
}

inline TestTensor tensor(DType dtype, Shape shape, const std::vector<double> &values) {
  TestTensor t = zeros(dtype, std::move(shape));
  EXPECT_EQ(static_cast<int64_t>(values.size()), t.num_elements()) << "bad test tensor";
  for (int64_t i = 0; i < t.num_elements() && i < static_cast<int64_t>(values.size()); ++i)
    t.set(i, values[i]);
  return t;
}

template <typename T> TestTensor typed_tensor(DType dtype, Shape shape, std::vector<T> values) {
  TestTensor t = zeros(dtype, std::move(shape));
  EXPECT_EQ(values.size() * sizeof(T), t.bytes.size()) << "bad test tensor";
  std::memcpy(t.bytes.data(), values.data(), std::min(t.bytes.size(), values.size() * sizeof(T)));
  return t;
}

// Uniform values in [lo, hi) for floating types, integers in [lo, hi] for
// integer types, 0 or 1 for bool.
inline TestTensor random_tensor(DType dtype, Shape shape, std::mt19937 &rng, double lo = -1.0,
                                double hi = 1.0) {
  TestTensor t = zeros(dtype, std::move(shape));
  std::uniform_real_distribution<double> real(lo, hi);
  std::uniform_int_distribution<int64_t> integer(static_cast<int64_t>(lo),
                                                 static_cast<int64_t>(hi));
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    if (is_floating(dtype))
      t.set(i, real(rng));
    else if (dtype == DType::kBool)
      t.set(i, static_cast<double>(rng() & 1));
    else
      t.set(i, static_cast<double>(integer(rng)));
  }
  return t;
}

inline Node make_node(std::string_view op, std::vector<Attribute> attrs = {}) {
  Node node;
  node.name = "test_node";
  node.op = std::string(op);
  for (Attribute &attr : attrs)
    node.set_attr(std::move(attr.name), std::move(attr.value));
  return node;
}

inline std::vector<TensorType> types_of(const std::vector<TestTensor> &tensors) {
  std::vector<TensorType> types;
  for (const TestTensor &t : tensors)
    types.push_back(t.type);
  return types;
}

// Output types through the registry (schema check, then the op's infer).
inline Result<llvm::SmallVector<TensorType, 2>> infer(std::string_view op,
                                                      const std::vector<TensorType> &inputs,
                                                      std::vector<Attribute> attrs = {}) {
  return OpRegistry::global().infer_types(make_node(op, std::move(attrs)), inputs);
}

struct RunResult {
  Status status;
  std::vector<TestTensor> outputs;
};

// Bytes of guard margin before and after every buffer, and the patterns used.
inline constexpr size_t kGuardBytes = 64;
inline constexpr uint8_t kGuardByte = 0xAB;
inline constexpr uint8_t kPoisonByte = 0xCD; // prefilled into outputs

// A buffer with guard margins. The body starts kGuardBytes into 16-aligned storage.
struct GuardedBuffer {
  std::vector<uint64_t> storage;
  size_t size = 0;
  explicit GuardedBuffer(size_t body, uint8_t fill) : size(body) {
    storage.resize((2 * kGuardBytes + body + 7) / 8);
    auto *raw = reinterpret_cast<uint8_t *>(storage.data());
    std::memset(raw, kGuardByte, storage.size() * 8);
    std::memset(raw + kGuardBytes, fill, body);
  }
  uint8_t *body() { return reinterpret_cast<uint8_t *>(storage.data()) + kGuardBytes; }
  // Offset (relative to the body) of the first damaged guard byte, or 0 if intact
  // (offsets are never 0: the guard lies at negative or >= size offsets).
  int64_t damaged_guard() const {
    const auto *raw = reinterpret_cast<const uint8_t *>(storage.data());
    const size_t total = storage.size() * 8;
    for (size_t i = 0; i < total; ++i) {
      if (i >= kGuardBytes && i < kGuardBytes + size) continue;
      if (raw[i] != kGuardByte) return static_cast<int64_t>(i) - static_cast<int64_t>(kGuardBytes);
    }
    return 0;
  }
};

// A kernel's tensor-parallel group (KernelContext::group, member).
struct Member {
  int group = 1, member = 0;
};

// Runs `def`'s CPU kernel on `inputs` with outputs of `output_types`, checking
// guards and input immutability.
inline RunResult run_kernel(const OpDef &def, const Node &node,
                            const std::vector<TestTensor> &inputs,
                            llvm::ArrayRef<TensorType> output_types, Member member = {}) {
  RunResult result;
  std::vector<GuardedBuffer> in_buffers, out_buffers;
  in_buffers.reserve(inputs.size());
  out_buffers.reserve(output_types.size());
  std::vector<ConstTensorView> in_views;
  std::vector<TensorView> out_views;
  for (const TestTensor &t : inputs) {
    in_buffers.emplace_back(t.bytes.size(), 0);
    if (!t.bytes.empty()) std::memcpy(in_buffers.back().body(), t.bytes.data(), t.bytes.size());
  }
  for (size_t i = 0; i < inputs.size(); ++i)
    in_views.push_back(ConstTensorView{in_buffers[i].body(), &inputs[i].type});
  for (const TensorType &type : output_types)
    out_buffers.emplace_back(static_cast<size_t>(type.size_bytes()), kPoisonByte);
  for (size_t i = 0; i < output_types.size(); ++i)
    out_views.push_back(TensorView{out_buffers[i].body(), &output_types[i]});
  KernelContext context{node, def, in_views, out_views, member.group, member.member};
  result.status = def.cpu_kernel(context);
  for (size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_EQ(in_buffers[i].damaged_guard(), 0)
        << def.name << ": guard around input " << i << " damaged";
    EXPECT_TRUE(inputs[i].bytes.empty() || std::memcmp(in_buffers[i].body(), inputs[i].bytes.data(),
                                                       inputs[i].bytes.size()) == 0)
        << def.name << ": input " << i << " was modified";
  }
  for (size_t i = 0; i < output_types.size(); ++i) {
    EXPECT_EQ(out_buffers[i].damaged_guard(), 0)
        << def.name << ": output " << i << " " << output_types[i].to_string()
        << " written outside its buffer (byte offset shown)";
    TestTensor out{output_types[i], {}};
    out.bytes.assign(out_buffers[i].body(), out_buffers[i].body() + out_buffers[i].size);
    result.outputs.push_back(std::move(out));
  }
  return result;
}

// Infers output types through the registry and runs the op's CPU kernel. An
// inference error comes back as the status, with no outputs.
inline RunResult run_op(std::string_view op, const std::vector<TestTensor> &inputs,
                        std::vector<Attribute> attrs = {}, Member member = {}) {
  const OpDef *def = OpRegistry::global().find(op);
  if (def == nullptr) return {not_found("op ", op, " is not registered"), {}};
  Node node = make_node(op, std::move(attrs));
  std::vector<TensorType> input_types = types_of(inputs);
  Result<llvm::SmallVector<TensorType, 2>> types =
      OpRegistry::global().infer_types(node, input_types);
  if (!types.is_ok()) return {types.status(), {}};
  if (def->cpu_kernel == nullptr) return {unimplemented(op, " has no CPU kernel"), {}};
  return run_kernel(*def, node, inputs, *types, member);
}

// Runs an op that must succeed with exactly one output; returns that output.
inline TestTensor run_one(std::string_view op, const std::vector<TestTensor> &inputs,
                          std::vector<Attribute> attrs = {}, Member member = {}) {
  RunResult result = run_op(op, inputs, std::move(attrs), member);
  EXPECT_TRUE(result.status.is_ok()) << op << ": " << result.status.to_string();
  EXPECT_EQ(result.outputs.size(), 1u) << op;
  if (result.outputs.empty()) return TestTensor{};
  return std::move(result.outputs[0]);
}

// Expects `actual` to match `expected` elementwise: |a - e| <= atol + rtol * |e|,
// NaN only where NaN is expected, infinities exactly. Reports the first few misses.
inline void expect_close(const TestTensor &actual, const std::vector<double> &expected, double atol,
                         double rtol, std::string_view what = "") {
  ASSERT_EQ(actual.num_elements(), static_cast<int64_t>(expected.size()))
      << what << ": element count of " << actual.type.to_string();
  int failures = 0;
  for (int64_t i = 0; i < actual.num_elements(); ++i) {
    const double a = actual.get(i);
    const double e = expected[i];
    bool ok;
    if (std::isnan(e))
      ok = std::isnan(a);
    else if (std::isinf(e))
      ok = a == e;
    else
      ok = !std::isnan(a) && std::fabs(a - e) <= atol + rtol * std::fabs(e);
    if (!ok && failures++ < 5)
      ADD_FAILURE() << what << ": element " << i << " of " << actual.type.to_string() << " is " << a
                    << ", expected " << e << " (atol " << atol << ", rtol " << rtol << ")";
  }
  if (failures > 5) ADD_FAILURE() << what << ": " << failures << " elements differ in all";
}

// Expects identical type and bytes.
inline void expect_same_tensor(const TestTensor &actual, const TestTensor &expected,
                               std::string_view what = "") {
  EXPECT_EQ(actual.type.to_string(), expected.type.to_string()) << what;
  EXPECT_TRUE(actual.bytes == expected.bytes) << what << ": bytes differ";
}

// Piece `r` of `parts` of `t` along `axis` (f32 or integer elements), and the
// pieces joined back along it.
inline TestTensor piece_of(const TestTensor &t, int64_t axis, int64_t parts, int64_t r) {
  const Shape &shape = t.type.shape;
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d)
    outer *= shape[static_cast<size_t>(d)];
  for (size_t d = static_cast<size_t>(axis) + 1; d < shape.size(); ++d)
    inner *= shape[d];
  const int64_t n = shape[static_cast<size_t>(axis)], m = n / parts;
  Shape piece_shape = shape;
  piece_shape[static_cast<size_t>(axis)] = m;
  TestTensor out = zeros(t.type.dtype, piece_shape);
  int64_t k = 0;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = r * m; i < (r + 1) * m; ++i)
      for (int64_t j = 0; j < inner; ++j)
        out.set(k++, t.get((o * n + i) * inner + j));
  return out;
}
inline std::vector<double> joined(const std::vector<TestTensor> &pieces, int64_t axis) {
  const Shape &shape = pieces[0].type.shape;
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d)
    outer *= shape[static_cast<size_t>(d)];
  for (size_t d = static_cast<size_t>(axis) + 1; d < shape.size(); ++d)
    inner *= shape[d];
  const int64_t m = shape[static_cast<size_t>(axis)];
  std::vector<double> out;
  for (int64_t o = 0; o < outer; ++o)
    for (const TestTensor &p : pieces)
      for (int64_t i = 0; i < m * inner; ++i)
        out.push_back(p.get(o * m * inner + i));
  return out;
}

// Expects an error whose message contains every one of `parts`.
inline void expect_error(const Status &status, std::initializer_list<std::string_view> parts,
                         std::string_view what = "") {
  ASSERT_FALSE(status.is_ok()) << what << ": expected an error";
  for (std::string_view part : parts)
    EXPECT_NE(status.message().find(part), std::string::npos)
        << what << ": message \"" << status.message() << "\" lacks \"" << part << "\"";
}

inline Attribute attr(std::string name, AttrValue value) {
  return Attribute{std::move(name), std::move(value)};
}
inline Attribute int_attr(std::string name, int64_t value) { return attr(std::move(name), value); }
inline Attribute float_attr(std::string name, double value) { return attr(std::move(name), value); }
inline Attribute string_attr(std::string name, std::string value) {
  return attr(std::move(name), std::move(value));
}
inline Attribute ints_attr(std::string name, std::vector<int64_t> values) {
  return attr(std::move(name), std::move(values));
}
inline Attribute floats_attr(std::string name, std::vector<double> values) {
  return attr(std::move(name), std::move(values));
}

// Row-major multi-index of flat index `flat` in `shape`.
inline Shape unravel(int64_t flat, llvm::ArrayRef<int64_t> shape) {
  Shape index(shape.size(), 0);
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  return index;
}

// Flat index of `index` (right-aligned against `shape`; dims of size 1 broadcast).
inline int64_t broadcast_flat(llvm::ArrayRef<int64_t> index, llvm::ArrayRef<int64_t> shape) {
  int64_t flat = 0;
  const size_t offset = index.size() - shape.size();
  for (size_t d = 0; d < shape.size(); ++d)
    flat = flat * shape[d] + (shape[d] == 1 ? 0 : index[offset + d]);
  return flat;
}

} // namespace strata::ops::testing
