// Collective algorithms built from point-to-point messages, so a plan can choose
// how a group reduces. The four all-reduce algorithms of Thakur, Rabenseifner
// and Gropp (IJHPCA 2005) that the cost model prices:
//   ring               bandwidth-optimal: 2(p-1)/p of the data per device, 2(p-1)
//                      steps;
//   tree               binomial reduce then broadcast: 2 lg p steps of all of it;
//   recursive-doubling lg p exchanges of the whole vector with the member at
//                      distance p/2, p/4, ..., 1: latency-optimal;
//   rabenseifner       recursive-halving reduce-scatter then recursive-doubling
//                      all-gather: 2 lg p steps and the ring's bandwidth.
// They run over any Communicator (threads, MPI processes) with its send/recv,
// so every wait is bounded by its timeout.
//
// Groups whose size is not a power of two: recursive doubling and halving use
// the standard fold. With q = 2^floor(lg p) and r = p - q, member 2k + 1
// (k < r) first sends its vector to member 2k, which adds it; the q survivors
// (members 0, 2, ..., 2r - 2, 2r, 2r + 1, ..., p - 1) run the algorithm; then
// member 2k sends the result back to 2k + 1.
//
// Results are deterministic and the same bits on every member: each element is
// reduced once, along a fixed path, and then copied. Both partners of an
// exchange add in the same operand order (the lower member's value first).
// The order differs between algorithms (and from the communicator's own
// all_reduce, which sums in device order), so the plan fixes the algorithm of
// each group; recursive doubling and Rabenseifner are the exception: both add
// every element along the same tree (the distance p/2 first), so they give the
// same bits and a plan may pick either per group by size.
//
// Shards: every reduce-scatter leaves member i of a group of p (position in
// the group) with its chunk [i n/p, (i+1) n/p), the ZeRO-1 convention, with
// the bits of the same algorithm's all-reduce, so a ZeRO-1 step and a plain
// data-parallel step compute the same bits:
//   ring               the ring reduce-scatter (the ring all-reduce is that
//                      followed by the ring all-gather);
//   tree               the whole tree all-reduce (a tree scatters no faster);
//   recursive-doubling recursive halving: at distance d = p/2, ..., 1 a member
//   and rabenseifner   keeps the lower half of its chunks when bit d of its
//                      position is 0, the upper when it is 1, and adds in its
//                      partner's copy of it, so member i ends with chunk i.
//                      Where p is not a power of two, the fold first; the q
//                      survivors halve the p chunks among themselves, then send
//                      each chunk to its member.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>

#include "runtime/comm/communicator.h"

namespace strata::runtime {

enum class CollectiveAlgo : uint8_t { kRing, kTree, kRecursiveDoubling, kRabenseifner };
inline constexpr CollectiveAlgo kAllCollectiveAlgos[] = {
    CollectiveAlgo::kRing, CollectiveAlgo::kTree, CollectiveAlgo::kRecursiveDoubling,
    CollectiveAlgo::kRabenseifner};
// "ring", "tree", "recursive-doubling", "rabenseifner": the cost model's names
// (partitioner/cost/cost_model.h) and the plan's (PlanPipeline::group_algorithms).
std::string_view collective_algo_name(CollectiveAlgo algo);
// The algorithm of that name, or none.
std::optional<CollectiveAlgo> collective_algo_named(std::string_view name);

// `tag` is the base of the tags the messages use (each algorithm uses tag and
// tag + 1); it must not collide with other traffic between the members while
// the collective runs. `group` is strictly increasing and holds comm.rank().
//
// `chunks`, when not empty, are the p + 1 offsets of the chunks in `data` (0
// first, data.size() last) instead of an even split. A gradient bucket packs
// its tensors chunk by chunk (chunk c of every tensor, then chunk c + 1) and
// passes those offsets, so every element is summed along the path it takes
// when its tensor is reduced alone: bucketing keeps the bits. (The ring and
// recursive halving split at chunk boundaries, so an element's path depends
// only on its chunk; the tree and recursive doubling send whole vectors.)
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
// all of it. (The ring is used whatever the group's algorithm: it only copies,
// so the bits are the same either way.)
Status algo_all_gather(Communicator &comm, std::span<float> data, const Group &group, uint64_t tag,
                       std::string_view what);

// The shared-memory collectives, for a group whose members can read each
// other's buffers (comm.shares_memory(group): threads of one process, or MPI
// ranks on one host whose buffers are in their shared memory): the members
// swap where their buffers are (Communicator::share_address) in one
// Communicator::exchange, meet through segment_barrier, and each
// sums its own chunk straight from
// every member's memory, adding in the order `algo`'s messages would (none:
// increasing rank order, the communicator's own), so the result has the bits
// of algo_all_reduce / algo_reduce_scatter (or of the communicator's) with no
// message and no copy but the result's. Every part is chunked on its own,
// chunk c of a part of n elements being [c n / p, (c + 1) n / p): the bits of
// a bucket packed chunk by chunk. Each returns when no member reads another's
// memory any more.
//
// All-reduce of every part, in place: member i sums chunk i of each part,
// the group meets, then each copies every other chunk from its owner.
Status shared_all_reduce(Communicator &comm, std::span<const std::span<float>> parts,
                         const Group &group, std::optional<CollectiveAlgo> algo,
                         std::string_view what);
// Reduce-scatter: `out[k]` (chunk i's size) receives the sum of chunk i of
// `parts[k]` for member i; it may be that chunk of the part itself (in place).
// The parts are not changed otherwise.
Status shared_reduce_scatter(Communicator &comm, std::span<const std::span<float>> parts,
                             std::span<float *const> out, const Group &group,
                             std::optional<CollectiveAlgo> algo, std::string_view what);
// The same sums for members in separate address spaces that can each read
// the others' shared segments (MPI ranks on one host:
// Communicator::shared_segment, `segments[m]` member m's), over a bucket of
// elements that each member holds in its own memory, chunk c being
// [chunks[c], chunks[c + 1]) of it, as packed for algo_all_reduce. It goes in
// rounds of up to `block` elements (block / p of each chunk), so what is
// staged stays in cache: every member copies the round's part of each chunk
// into its segment (`pack(begin, end, to)`: elements [begin, end) of its
// bucket), member i sums its chunk's part in its own segment from every
// member's, and `take(begin, end, sum)` is called with the sums of [begin,
// end): every chunk's, read where its owner summed it (all, an all-reduce),
// or chunk i's alone (a reduce-scatter). Three rounds are staged at a time,
// in the thirds of each segment (kSegmentRounds x block floats), so the
// members meet (segment_barrier) once a round, and once more at the end of
// an all-reduce; then nobody reads another's segment any more.
using SegmentCopy = std::function<void(size_t begin, size_t end, float *to)>;
using SegmentTake = std::function<void(size_t begin, size_t end, const float *sum)>;
inline constexpr size_t kSegmentBlock = size_t{64} << 10; // elements per round (256 KiB)
inline constexpr size_t kSegmentRounds = 3;               // rounds staged at a time
inline constexpr size_t kSegmentBytes = kSegmentRounds * kSegmentBlock * sizeof(float);
Status segment_reduce(Communicator &comm, std::span<float *const> segments, const Group &group,
                      std::optional<CollectiveAlgo> algo, std::span<const size_t> chunks, bool all,
                      const SegmentCopy &pack, const SegmentTake &take, std::string_view what,
                      size_t block = kSegmentBlock);
// `output` (group size x bytes) receives every member's `input` in group
// order, copied from the members' memory.
Status shared_all_gather(Communicator &comm, const void *input, size_t bytes, void *output,
                         const Group &group, std::string_view what);
// Several all-gathers over one group with one exchange of addresses and one
// meeting after: piece j's `output` receives every member's piece j.
struct GatherPiece {
  const void *input = nullptr;
  size_t bytes = 0;
  void *output = nullptr;
};
Status shared_all_gather(Communicator &comm, std::span<const GatherPiece> pieces,
                         const Group &group, std::string_view what);
// The same for members in separate address spaces that read each other's
// shared segments (`segments[m]` member m's, shared_segment_bytes() each):
// the pieces' inputs, one after another, go through the segments in rounds
// of a segment's bytes, with two meetings (segment_barrier) a round.
Status segment_all_gather(Communicator &comm, std::span<std::byte *const> segments,
                          std::span<const GatherPiece> pieces, const Group &group,
                          std::string_view what);

} // namespace strata::runtime
