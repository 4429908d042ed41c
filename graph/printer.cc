#include "graph/printer.h"

#include <sstream>

namespace strata {
namespace {

std::string value_source(const Tensor &t) {
  if (t.data) return str_cat("data ", t.data->size(), " bytes");
  if (t.external) return str_cat("external ", t.external->path, "#", t.external->key);
  const Initializer &init = t.initializer;
  switch (init.kind) {
  case Initializer::Kind::kNormal:
    return str_cat("normal(", init.a, ", ", init.b, ") seed ", init.seed);
  case Initializer::Kind::kUniform:
    return str_cat("uniform(", init.a, ", ", init.b, ") seed ", init.seed);
  case Initializer::Kind::kConstant: return str_cat("constant(", init.a, ")");
  default: return std::string(initializer_kind_name(init.kind));
  }
}

// Escapes a string for a double-quoted DOT label.
std::string dot_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

} // namespace

std::string print_graph(const Graph &graph) {
  std::ostringstream out;
  out << "graph " << graph.name() << " {\n";
  for (TensorId id : graph.inputs())
    out << "  input %" << graph.tensor(id).name << ": " << graph.tensor(id).type.to_string()
        << "\n";
  for (const Tensor &t : graph.tensors())
    if (t.kind == TensorKind::kParameter || t.kind == TensorKind::kConstant ||
        t.kind == TensorKind::kState)
      out << "  " << tensor_kind_name(t.kind) << " %" << t.name << ": " << t.type.to_string()
          << " = " << value_source(t) << "\n";
  auto order = graph.topological_order();
  if (!order.is_ok()) {
    out << "  # " << order.status().message() << "\n}\n";
    return out.str();
  }
  for (NodeId id : *order) {
    const Node &node = graph.node(id);
    out << "  ";
    for (size_t i = 0; i < node.outputs.size(); ++i)
      out << (i ? ", " : "") << "%" << graph.tensor(node.outputs[i]).name;
    out << " = " << node.op << "(";
    for (size_t i = 0; i < node.inputs.size(); ++i)
      out << (i ? ", " : "") << "%" << graph.tensor(node.inputs[i]).name;
    out << ")";
    if (!node.attrs.empty()) {
      out << " {";
      for (size_t i = 0; i < node.attrs.size(); ++i)
        out << (i ? ", " : "") << node.attrs[i].name << " = "
            << attr_value_to_string(node.attrs[i].value);
      out << "}";
    }
    out << " -> ";
    for (size_t i = 0; i < node.outputs.size(); ++i)
      out << (i ? ", " : "") << graph.tensor(node.outputs[i]).type.to_string();
    out << "  # " << node.name << "\n";
  }
  for (const StateUpdate &update : graph.updates())
    out << "  update %" << graph.tensor(update.target).name << " <- %"
        << graph.tensor(update.value).name << "\n";
  out << "  return ";
  for (size_t i = 0; i < graph.outputs().size(); ++i)
    out << (i ? ", " : "") << "%" << graph.tensor(graph.outputs()[i]).name;
  out << "\n}\n";
  return out.str();
}

std::string graph_to_dot(const Graph &graph) {
  std::ostringstream out;
  out << "digraph \"" << dot_escape(graph.name()) << "\" {\n  rankdir=TB;\n";
  for (TensorId id = 0; id < graph.num_tensors(); ++id) {
    const Tensor &t = graph.tensor(id);
    if (t.kind == TensorKind::kIntermediate) continue;
    out << "  t" << id << " [shape=ellipse, label=\"" << dot_escape(t.name) << "\\n"
        << t.type.to_string() << "\"];\n";
  }
  for (NodeId id = 0; id < graph.num_nodes(); ++id) {
    const Node &node = graph.node(id);
    out << "  n" << id << " [shape=box, label=\"" << dot_escape(node.op) << "\\n"
        << dot_escape(node.name) << "\"];\n";
    for (TensorId input : node.inputs) {
      const Tensor &t = graph.tensor(input);
      if (t.producer == kNoNode)
        out << "  t" << input << " -> n" << id << ";\n";
      else
        out << "  n" << t.producer << " -> n" << id << " [label=\"" << t.type.to_string()
            << "\"];\n";
    }
  }
  for (TensorId id : graph.outputs()) {
    const Tensor &t = graph.tensor(id);
    out << "  out" << id << " [shape=doubleoctagon, label=\"" << dot_escape(t.name) << "\"];\n";
    if (t.producer != kNoNode)
      out << "  n" << t.producer << " -> out" << id << " [label=\"" << t.type.to_string()
          << "\"];\n";
    else
      out << "  t" << id << " -> out" << id << ";\n";
  }
  out << "}\n";
  return out.str();
}

} // namespace strata
