// What every runner needs of the host before it runs: the values of
// parameters and constants (inline data, external .safetensors, or the
// counter-based initializers of runtime/random.h), random inputs, and the
// check that a run fits the host's memory before anything is allocated.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "graph/host_tensor.h"

namespace strata::runtime {

// Whether `bytes` of host memory can be had at all. More than this host's
// memory and swap together is a resource_exhausted error that says what needs
// how much (`what` ends "needs"; `parts` says of what, e.g. "1.0 GiB of
// activations, ...") and what the host has: before an allocation the kernel
// would refuse, or a run its out-of-memory killer would end without a word.
Status check_host_memory(int64_t bytes, std::string_view what, std::string_view parts);

// Fills a parameter or constant from its data, external file or initializer.
Result<HostTensor> materialize(const Tensor &tensor, const std::string &model_dir);

// Random values for every graph input, deterministic in `seed`: floats from
// normal(0, 1); integer inputs read as indices (by Gather or as loss labels) are
// drawn in [0, bound) from the dimension they index, other integers in [0, 2).
// Input k draws with the counter-based generator under derive_seed(seed, k).
// With `microbatches` > 1, dim 0 of every input is that many times the graph's:
// the full batch of a pipeline plan, drawn exactly as the full-batch graph's.
std::vector<HostTensor> random_inputs(const Graph &graph, uint64_t seed, int64_t microbatches = 1);

} // namespace strata::runtime
