#include "runtime/comm/collectives.h"

#include <algorithm>
#include <vector>

namespace strata::runtime {

namespace {

// Elements [at(k), at(k + 1)) are chunk k: an even split, or the caller's.
struct Chunks {
  size_t n, p;
  std::span<const size_t> given;
  size_t operator()(size_t k) const { return given.empty() ? chunk_begin(n, p, k) : given[k]; }
};

Status check_chunks(std::span<const size_t> chunks, size_t n, size_t p) {
  if (chunks.empty()) return Status::ok();
  if (chunks.size() != p + 1 || chunks.front() != 0 || chunks.back() != n ||
      !std::is_sorted(chunks.begin(), chunks.end()))
    return invalid_argument("the ring's chunk offsets are not ", p + 1,
                            " increasing offsets from 0 to ", n);
  return Status::ok();
}

Result<size_t> position_in(const Communicator &comm, const Group &group) {
  auto it = std::find(group.begin(), group.end(), comm.rank());
  if (it == group.end())
    return invalid_argument("device ", comm.rank(), " is not in the collective's group");
  return static_cast<size_t>(it - group.begin());
}

// The ring reduce-scatter: after p - 1 steps member i holds the sum of chunk i.
// At step s member i sends chunk (i - s - 1) and adds the received chunk
// (i - s - 2) to its own, so chunk c is summed along c + 1, c + 2, ..., c.
Status ring_reduce_scatter(Communicator &comm, std::span<float> data, const Group &group, size_t i,
                           uint64_t tag, std::string_view what, std::span<const size_t> given) {
  const size_t p = group.size(), n = data.size();
  const int next = group[(i + 1) % p], prev = group[(i + p - 1) % p];
  const Chunks chunk_begin{n, p, given};
  size_t largest = 0;
  for (size_t k = 0; k < p; ++k)
    largest = std::max(largest, chunk_begin(k + 1) - chunk_begin(k));
  // One scratch chunk per thread, kept across calls: a fresh one would cost a
  // page fault per page every step.
  thread_local std::vector<float> incoming;
  if (incoming.size() < largest) incoming.resize(largest);
  for (size_t s = 0; s + 1 < p; ++s) {
    const size_t out = (i + 2 * p - s - 1) % p, in = (i + 2 * p - s - 2) % p;
    const size_t out_begin = chunk_begin(out), out_end = chunk_begin(out + 1);
    const size_t in_begin = chunk_begin(in), in_end = chunk_begin(in + 1);
    RETURN_IF_ERROR(
        comm.send(data.data() + out_begin, (out_end - out_begin) * sizeof(float), next, tag, what));
    RETURN_IF_ERROR(
        comm.recv(incoming.data(), (in_end - in_begin) * sizeof(float), prev, tag, what));
    for (size_t e = in_begin; e < in_end; ++e)
      data[e] += incoming[e - in_begin];
  }
  return Status::ok();
}

// The ring all-gather from "member i holds chunk i": at step s member i sends
// chunk (i - s) and receives chunk (i - s - 1).
Status ring_all_gather(Communicator &comm, std::span<float> data, const Group &group, size_t i,
                       uint64_t tag, std::string_view what, std::span<const size_t> given = {}) {
  const size_t p = group.size(), n = data.size();
  const int next = group[(i + 1) % p], prev = group[(i + p - 1) % p];
  const Chunks chunk_begin{n, p, given};
  for (size_t s = 0; s + 1 < p; ++s) {
    const size_t out = (i + p - s) % p, in = (i + 2 * p - s - 1) % p;
    const size_t out_begin = chunk_begin(out), out_end = chunk_begin(out + 1);
    const size_t in_begin = chunk_begin(in), in_end = chunk_begin(in + 1);
    RETURN_IF_ERROR(
        comm.send(data.data() + out_begin, (out_end - out_begin) * sizeof(float), next, tag, what));
    RETURN_IF_ERROR(
        comm.recv(data.data() + in_begin, (in_end - in_begin) * sizeof(float), prev, tag, what));
  }
  return Status::ok();
}

// Binomial tree: reduce to position 0 (a member at position i sends its partial
// sum to i - mask at the first set bit `mask` of i, after adding what i + mask,
// i + 2 mask, ... sent it), then broadcast back down the same tree.
Status tree_all_reduce(Communicator &comm, std::span<float> data, const Group &group, size_t i,
                       uint64_t tag, std::string_view what) {
  const size_t p = group.size(), n = data.size();
  const size_t bytes = n * sizeof(float);
  std::vector<float> incoming(n);
  size_t mask = 1;
  for (; mask < p; mask <<= 1) {
    if (i & mask) {
      RETURN_IF_ERROR(comm.send(data.data(), bytes, group[i - mask], tag, what));
      break;
    }
    if (i + mask < p) {
      RETURN_IF_ERROR(comm.recv(incoming.data(), bytes, group[i + mask], tag, what));
      for (size_t e = 0; e < n; ++e)
        data[e] += incoming[e];
    }
  }
  // Broadcast: receive from the parent (if any), then send to the children in
  // the reverse order of the reduction.
  if (i != 0) RETURN_IF_ERROR(comm.recv(data.data(), bytes, group[i - mask], tag + 1, what));
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (i + mask < p && (i & mask) == 0 && (i % (mask << 1)) == 0)
      RETURN_IF_ERROR(comm.send(data.data(), bytes, group[i + mask], tag + 1, what));
  return Status::ok();
}

} // namespace

std::string_view collective_algo_name(CollectiveAlgo algo) {
  return algo == CollectiveAlgo::kRing ? "ring" : "tree";
}

Status algo_all_reduce(Communicator &comm, std::span<float> data, const Group &group,
                       CollectiveAlgo algo, uint64_t tag, std::string_view what,
                       std::span<const size_t> chunks) {
  ASSIGN_OR_RETURN(size_t i, position_in(comm, group));
  RETURN_IF_ERROR(check_chunks(chunks, data.size(), group.size()));
  if (group.size() < 2) return Status::ok();
  if (algo == CollectiveAlgo::kTree) return tree_all_reduce(comm, data, group, i, tag, what);
  RETURN_IF_ERROR(ring_reduce_scatter(comm, data, group, i, tag, what, chunks));
  return ring_all_gather(comm, data, group, i, tag + 1, what, chunks);
}

Status algo_reduce_scatter(Communicator &comm, std::span<float> data, const Group &group,
                           CollectiveAlgo algo, uint64_t tag, std::string_view what,
                           std::span<const size_t> chunks) {
  ASSIGN_OR_RETURN(size_t i, position_in(comm, group));
  RETURN_IF_ERROR(check_chunks(chunks, data.size(), group.size()));
  if (group.size() < 2) return Status::ok();
  if (algo == CollectiveAlgo::kTree) return tree_all_reduce(comm, data, group, i, tag, what);
  return ring_reduce_scatter(comm, data, group, i, tag, what, chunks);
}

Status algo_all_gather(Communicator &comm, std::span<float> data, const Group &group, uint64_t tag,
                       std::string_view what) {
  ASSIGN_OR_RETURN(size_t i, position_in(comm, group));
  if (group.size() < 2) return Status::ok();
  return ring_all_gather(comm, data, group, i, tag, what);
}

} // namespace strata::runtime
