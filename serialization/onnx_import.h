// ONNX import: an ONNX model file (opsets 11 to 17) becomes a strata Graph.
//
// - Initializers become parameters (floating point) or constants (integers);
//   external-data initializers are read only from regular files inside the
//   model's folder (no absolute paths, no "..", no symlink leading out), with
//   offset and length checked against the file and the tensor's size.
//   PyTorch's exporter merges equal initializers, giving each former owner an
//   Identity of the survivor; such an Identity becomes an initializer of its
//   own, under the source model's name, so merged batch-norm weights and
//   running statistics train and update apart.
// - Shapes are static: every graph input needs fixed dims, from the file or
//   from `input_shapes` (`--input-shape name=1x3x224x224`).
// - Nodes whose inputs are all known at import (Shape of a static tensor,
//   Constant, ConstantOfShape, Range, and any op over constants) are folded to
//   constants with strata's own kernels, so shape-computing subgraphs vanish
//   and shape inputs (Reshape, Expand, Slice, Split, Unsqueeze, ...) become
//   the static attributes strata ops take. A folded constant is at most 1 GiB.
// - An op strata cannot express is an error listing every such op with its
//   nodes, all at once. Malformed files (truncated protobuf, initializer sizes
//   that disagree with their dims, cycles, external paths that escape) are
//   refused with the cause, naming the node, tensor or file.
// - What the ONNX specification makes invalid is refused, never read as a
//   default: an attribute the op's schema (at the model's opset) does not
//   define, or of another type than the schema's; a value that two nodes
//   produce (or a node and a graph input or initializer); a name that is not
//   UTF-8 text without NUL bytes; a graph without outputs. The imported graph
//   passes the checks a model file is loaded with.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace strata::serialization {

struct OnnxImportOptions {
  // Fixes the dims of graph inputs, by input name.
  std::map<std::string, std::vector<int64_t>> input_shapes;
  // Floating initializers to import as constants, not trainable parameters
  // (buffers such as an attention mask, which ONNX stores like weights).
  std::set<std::string> constants;
};

// Whether this build can import ONNX (built with libonnx).
bool onnx_import_built();

// `warnings` (optional) receives what the user should know but that does not
// stop the import: one initializer feeding the same input of several nodes of
// one op (exporters merge initializers with equal contents, which ties weights
// that were separate in the source model). `external_files` (optional)
// receives the external-data files the import read, as found on disk, so that
// a caller can refuse to write over one of them.
Result<Graph> import_onnx(const std::string &path, const OnnxImportOptions &options = {},
                          std::vector<std::string> *warnings = nullptr,
                          std::vector<std::string> *external_files = nullptr);

} // namespace strata::serialization
