// Pieces of the model reader and writer that the plan file (serialization/plan_io.cc)
// reuses to embed a Model table. Not part of the public API: it exposes the
// generated FlatBuffers types.
#pragma once

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <flatbuffers/flatbuffers.h>

#include "graph/graph.h"
#include "serialization/model_generated.h"

namespace strata::serialization {

// "strata <version>", the producer field of every file strata writes.
std::string producer_string();

// Writes the canonical Model table of `graph` into `builder` (see model_io.cc).
flatbuffers::Offset<fb::Model> write_model_table(flatbuffers::FlatBufferBuilder &builder,
                                                 const Graph &graph,
                                                 const std::map<TensorId, ExternalData> &external);

// The canonical JSON text of a verified Model table, starting at column 0.
std::string model_json_text(const fb::Model &model);

// The semantic stage of loading a verified Model table. Errors name the field,
// node or tensor; the caller adds the file.
Result<Graph> graph_from_model(const fb::Model &model, std::string_view model_dir);

// Parses JSON text against a FlatBuffers schema and returns the binary buffer it
// describes (still unverified: the caller's loader verifies it). `schema_name`
// names the schema in the internal error should the embedded schema not parse.
Result<std::vector<uint8_t>> json_to_flatbuffer(std::string_view json, const char *schema_text,
                                                std::string_view schema_name,
                                                std::string_view display_name);

// A FlatBuffers file that passed the structural stage of loading. `data` points
// at 8-byte-aligned bytes (`storage` holds a copy when the input was not aligned),
// so the verifier and the accessors may read 8-byte scalars.
struct VerifiedBuffer {
  std::vector<uint64_t> storage;
  const uint8_t *data = nullptr;
};

// The structural stage shared by every strata file: size bounds, the file
// identifier, then the FlatBuffers verifier (`verify` runs the root type's
// verification). `kind` names the file kind in errors ("strata model").
Result<VerifiedBuffer> verify_structure(llvm::ArrayRef<uint8_t> bytes,
                                        std::string_view display_name, std::string_view kind,
                                        uint64_t max_bytes, const char *identifier,
                                        bool (*verify)(flatbuffers::Verifier &));

// Copies a vector of numbers through memcpy. The FlatBuffers verifier checks
// only the 4-byte alignment of a vector, so a corrupt or crafted file can place a
// vector of 8-byte numbers where a typed 8-byte load would be misaligned.
template <typename T> std::vector<T> copy_numbers(const flatbuffers::Vector<T> &vector) {
  std::vector<T> out(vector.size());
  if (!out.empty()) std::memcpy(out.data(), vector.Data(), out.size() * sizeof(T));
  return out;
}

// Bytes as text, with non-printable ones as \xNN (for file identifiers in errors).
std::string printable(llvm::ArrayRef<uint8_t> bytes);

} // namespace strata::serialization
