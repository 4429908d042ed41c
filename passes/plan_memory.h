// Memory planning: assigns every intermediate tensor an offset in one arena.
//
// A tensor is live from the step of the node that produces it to the step of its
// last reader (graph outputs and the values of state updates stay live to the end). Tensors whose
// lifetimes do not overlap may share bytes. Offsets are aligned; the arena size is the peak the
// plan needs, known before anything runs.
#pragma once

#include <vector>

#include "graph/graph.h"

namespace strata::passes {

struct MemoryPlan {
  // Per tensor: byte offset in the arena, or -1 for tensors outside it (inputs,
  // parameters, constants).
  std::vector<int64_t> offsets;
  int64_t arena_bytes = 0; // the peak: arena size
  int64_t naive_bytes = 0; // sum of all planned tensors, without reuse
};

// Plans the intermediates of `graph` for execution in `order` (a topological order).
// `runs_at`, when given, is per node the step at which it reads and writes
// (a backend running several nodes as one kernel at the last one's step);
// lifetimes then follow it, so what the kernel reads stays untouched until it
// runs and what it writes does not share bytes with what it reads.
Result<MemoryPlan> plan_memory(const Graph &graph, llvm::ArrayRef<NodeId> order,
                               int64_t alignment = 64, llvm::ArrayRef<int64_t> runs_at = {});

// One buffer to place: its size and the steps [first, last] (both inclusive)
// during which its bytes must not be touched by anything else.
struct BufferLifetime {
  int64_t size = 0;
  int64_t first = 0;
  int64_t last = 0;
  int64_t offset = -1; // the result
};

// The placement plan_memory uses, for any list of buffers (pipeline programs
// plan (tensor, micro-batch) buffers with it): greedy by size, largest first,
// each at the lowest aligned offset where it clashes with no placed buffer whose
// lifetime meets its own; ties go to the earlier buffer in the list. Zero-size
// buffers get offset 0. Returns the arena size (the peak, aligned).
int64_t place_buffers(std::vector<BufferLifetime> &buffers, int64_t alignment = 64);

} // namespace strata::passes
