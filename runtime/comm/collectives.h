// Collective algorithms built from point-to-point messages, so a plan can choose
// how a group reduces: the ring (bandwidth-optimal: 2(p-1)/p of the data per
// device) or the binomial tree (latency-optimal: 2 lg p steps), the two
// all-reduce algorithms of Thakur, Rabenseifner and Gropp (IJHPCA 2005) the cost
// model prices. They run over any Communicator (threads here; MPI processes
// later) with its send/recv, so every wait is bounded by its timeout.
//
// Results are deterministic and the same bits on every member: each element is
// reduced once, along a fixed path, and then copied. The order differs between
// algorithms (and from the communicator's own all_reduce, which sums in device
// order), so the plan fixes one algorithm per group.
//
// Shards: the ring's reduce-scatter leaves member i of a group of p (position
// in the group) with elements [i n/p, (i+1) n/p), the ZeRO-1 convention, and its
// all-reduce is that reduce-scatter followed by the ring all-gather, so a
// ZeRO-1 step and a plain data-parallel step compute the same bits.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "runtime/comm/communicator.h"

namespace strata::runtime {

enum class CollectiveAlgo : uint8_t { kRing, kTree };
std::string_view collective_algo_name(CollectiveAlgo algo); // "ring", "tree"

// `tag` is the base of the tags the messages use (each algorithm uses tag and
// tag + 1); it must not collide with other traffic between the members while
// the collective runs. `group` is strictly increasing and holds comm.rank().
//
// `chunks`, when not empty, are the p + 1 offsets of the ring's chunks in
// `data` (0 first, data.size() last) instead of an even split. A gradient
// bucket packs its tensors chunk by chunk (chunk c of every tensor, then chunk
// c + 1) and passes those offsets, so every element is summed along the path
// it takes when its tensor is reduced alone: bucketing keeps the bits.
Status algo_all_reduce(Communicator &comm, std::span<float> data, const Group &group,
                       CollectiveAlgo algo, uint64_t tag, std::string_view what,
                       std::span<const size_t> chunks = {});
// `data` holds the whole tensor; afterwards this member's shard of it (its
// chunk) holds the sum over the group (the rest of `data` is scratch).
Status algo_reduce_scatter(Communicator &comm, std::span<float> data, const Group &group,
                           CollectiveAlgo algo, uint64_t tag, std::string_view what,
                           std::span<const size_t> chunks = {});

// Where chunk k (0 <= k <= p) of n elements split p ways begins: k n / p.
inline size_t chunk_begin(size_t n, size_t p, size_t k) { return k * n / p; }
// `data` holds the whole tensor with this member's shard filled in; afterwards
// all of it. (The ring is used whatever `algo` is: a tree gathers no faster.)
Status algo_all_gather(Communicator &comm, std::span<float> data, const Group &group, uint64_t tag,
                       std::string_view what);

} // namespace strata::runtime
