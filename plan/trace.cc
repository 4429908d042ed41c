#include "plan/trace.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "plan/instructions.h"
#include "plan/phases.h"

namespace strata::plan {

using serialization::InstrKind;
using serialization::PlanInstruction;
using serialization::PlanProgram;

namespace {

// Under ZB-H1, by node, whether it is in a W half of program `program`
// (split as the lowering splits: by what the program sends each
// micro-batch).
std::vector<char> weight_halves(const Graph &graph, const PlanProgram &program,
                                const StepPhases &phases) {
  std::vector<NodeId> backward;
  std::set<TensorId> sent;
  for (const PlanInstruction &instr : program.instructions) {
    if (instr.kind == InstrKind::kSend && instr.microbatch >= 0) sent.insert(instr.index);
    if (instr.kind == InstrKind::kCompute && instr.microbatch == 0 &&
        instr.index < phases.node_phase.size() &&
        phases.node_phase[instr.index] == Phase::kBackward)
      backward.push_back(instr.index);
  }
  std::vector<char> weight(graph.num_nodes(), 0);
  for (NodeId id : split_weight_half(graph, backward, [&](TensorId t) { return sent.contains(t); }))
    weight[id] = 1;
  return weight;
}

} // namespace

std::string chrome_trace(const Graph &graph, const std::vector<PlanProgram> &programs,
                         const std::vector<std::vector<TraceSpan>> &spans, int microbatches,
                         const serialization::PlanPipeline *pipeline) {
  const std::vector<int32_t> node_chunk =
      pipeline ? node_chunks(*pipeline) : std::vector<int32_t>{};
  auto phases = analyze_phases(graph, microbatches);
  auto escape = [](const std::string &text) {
    std::string out;
    for (char c : text) {
      if (c == '"' || c == '\\') out += '\\';
      if (static_cast<unsigned char>(c) < 0x20) continue;
      out += c;
    }
    return out;
  };
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  bool first = true;
  auto event = [&](const std::string &name, const char *category, int device, double start,
                   double end, const std::string &args) {
    char times[96];
    std::snprintf(times, sizeof times, "\"ts\": %.3f, \"dur\": %.3f", start * 1e6,
                  std::max(0.0, end - start) * 1e6);
    out += str_cat(first ? "" : ",\n", "{\"name\": \"", escape(name), "\", \"cat\": \"", category,
                   "\", \"ph\": \"X\", \"pid\": 0, \"tid\": ", device, ", ", times, ", \"args\": {",
                   args, "}}");
    first = false;
  };
  auto device_label = [&](size_t d) {
    return pipeline ? device_role(*pipeline, static_cast<int64_t>(d)) : str_cat("stage ", d);
  };
  for (size_t d = 0; d < programs.size(); ++d) {
    out += str_cat(first ? "" : ",\n",
                   "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": ", d,
                   ", \"args\": {\"name\": \"device ", d, " (", device_label(d), ")\"}}");
    first = false;
  }
  const bool zero_bubble = pipeline != nullptr && pipeline->schedule == "zb-h1";
  for (size_t d = 0; d < programs.size() && d < spans.size(); ++d) {
    const auto &instrs = programs[d].instructions;
    const std::vector<char> weight = zero_bubble && phases.is_ok()
                                         ? weight_halves(graph, programs[d], *phases)
                                         : std::vector<char>(graph.num_nodes(), 0);
    // The open block: its label, start, end, step and count.
    std::string label;
    const char *category = "";
    double start = 0, end = 0;
    int64_t step = -1, count = 0;
    auto flush = [&] {
      if (count > 0)
        event(label, category, static_cast<int>(d), start, end,
              str_cat("\"step\": ", step, ", \"instructions\": ", count));
      count = 0;
    };
    bool stream_named = false;
    for (const TraceSpan &span : spans[d]) {
      if (span.instruction >= instrs.size()) continue;
      const PlanInstruction &instr = instrs[span.instruction];
      if (span.stream) {
        // The communication stream: track programs.size() + d.
        const int track = static_cast<int>(programs.size() + d);
        if (!stream_named)
          out +=
              str_cat(",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": ", track,
                      ", \"args\": {\"name\": \"device ", d, " communication\"}}");
        stream_named = true;
        std::string name = describe_instruction(graph, instr);
        if (name.starts_with("start ")) name = name.substr(6);
        event(name, "collective", track, span.start_s, span.end_s,
              str_cat("\"step\": ", span.step));
        continue;
      }
      if (instr.kind == InstrKind::kSend || instr.kind == InstrKind::kRecv ||
          is_collective(instr.kind) || on_stream(instr.kind)) {
        // A receive, collective or bucket wait may wait: it ends the block. A
        // send (a copy) and a bucket start (a hand-over) are inside it.
        if (instr.kind != InstrKind::kSend && instr.kind != InstrKind::kStartBucket &&
            instr.kind != InstrKind::kStartGather)
          flush();
        const char *kind = instr.kind == InstrKind::kSend   ? "send"
                           : instr.kind == InstrKind::kRecv ? "recv"
                                                            : "collective";
        event(describe_instruction(graph, instr), kind, static_cast<int>(d), span.start_s,
              span.end_s, str_cat("\"step\": ", span.step));
        continue;
      }
      std::string this_label = "optimizer";
      const char *this_category = "step";
      if (instr.microbatch >= 0) {
        // An accumulation belongs to the block of the node that produced its input.
        NodeId node = instr.index;
        if (instr.kind == InstrKind::kAccumulate)
          node = instr.index < graph.num_tensors() ? graph.tensor(instr.index).producer : kNoNode;
        bool backward = false;
        if (phases.is_ok() && node < phases->node_phase.size())
          backward = phases->node_phase[node] == Phase::kBackward;
        const bool in_weight = backward && node < weight.size() && weight[node];
        this_label = str_cat(in_weight ? "W" : backward ? "B" : "F", instr.microbatch);
        if (node < node_chunk.size()) this_label += str_cat(" c", node_chunk[node]);
        this_category = backward ? "backward" : "forward";
      }
      if (count > 0 && (this_label != label || span.step != step)) flush();
      if (count == 0) {
        label = this_label;
        category = this_category;
        start = span.start_s;
        step = span.step;
      }
      end = span.end_s;
      ++count;
    }
    flush();
  }
  out += "\n]}\n";
  return out;
}

} // namespace strata::plan
