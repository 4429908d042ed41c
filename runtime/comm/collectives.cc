#include "runtime/comm/collectives.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <functional>
#include <utility>
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

// A scratch buffer of at least n floats, kept per thread across calls (a fresh
// one would cost a page fault per page every step).
float *scratch(size_t n) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

// mine[e] = lower + upper for e < n, where `mine` is the lower member's operand
// when `mine_is_lower`: both partners of an exchange then compute the very same
// sums, bit for bit, whatever the addition's rounding.
void add_in_order(float *mine, const float *theirs, size_t n, bool mine_is_lower) {
  if (mine_is_lower)
    for (size_t e = 0; e < n; ++e)
      mine[e] = mine[e] + theirs[e];
  else
    for (size_t e = 0; e < n; ++e)
      mine[e] = theirs[e] + mine[e];
}

// The fold of a group of p members onto q = 2^floor(lg p) survivors for
// recursive doubling and halving (see the header): with r = p - q, member
// 2k + 1 (k < r) sits out; survivor j is member 2j for j < r, member j + r
// after. A power of two folds nothing.
struct Fold {
  size_t p, q, r;
  explicit Fold(size_t members)
      : p(members), q(std::bit_floor(members)), r(members - std::bit_floor(members)) {}
  bool sits_out(size_t i) const { return i < 2 * r && i % 2 == 1; }
  size_t survivor(size_t i) const { return i < 2 * r ? i / 2 : i - r; }
  size_t member(size_t j) const { return j < r ? 2 * j : j + r; }
};

// The fold's first step: member 2k + 1 sends its vector to member 2k, which
// adds it to its own (its own operand first).
Status fold_in(Communicator &comm, std::span<float> data, const Group &group, const Fold &fold,
               size_t i, uint64_t tag, std::string_view what) {
  if (i >= 2 * fold.r) return Status::ok();
  const size_t n = data.size();
  if (i % 2 == 1) return comm.send(data.data(), n * sizeof(float), group[i - 1], tag, what);
  float *incoming = scratch(n);
  RETURN_IF_ERROR(comm.recv(incoming, n * sizeof(float), group[i + 1], tag, what));
  add_in_order(data.data(), incoming, n, true);
  return Status::ok();
}

// The fold's last step: member 2k sends the result to member 2k + 1.
Status fold_out(Communicator &comm, std::span<float> data, const Group &group, const Fold &fold,
                size_t i, uint64_t tag, std::string_view what) {
  if (i >= 2 * fold.r) return Status::ok();
  const size_t bytes = data.size() * sizeof(float);
  if (i % 2 == 1) return comm.recv(data.data(), bytes, group[i - 1], tag, what);
  return comm.send(data.data(), bytes, group[i + 1], tag, what);
}

// Recursive doubling: after the fold, survivor j exchanges its whole vector
// with survivor j ^ d for d = q/2, q/4, ..., 1 and adds the two (the lower
// survivor's first), so every survivor holds the sum; the fold hands it on.
// The largest distance goes first, as in recursive halving, so the two add
// every element along the same tree and give the same bits.
Status recursive_doubling_all_reduce(Communicator &comm, std::span<float> data, const Group &group,
                                     size_t i, uint64_t tag, std::string_view what) {
  const Fold fold(group.size());
  const size_t n = data.size();
  RETURN_IF_ERROR(fold_in(comm, data, group, fold, i, tag, what));
  if (!fold.sits_out(i)) {
    const size_t j = fold.survivor(i);
    float *incoming = scratch(n);
    for (size_t d = fold.q / 2; d > 0; d /= 2) {
      const int peer = group[fold.member(j ^ d)];
      RETURN_IF_ERROR(comm.send(data.data(), n * sizeof(float), peer, tag, what));
      RETURN_IF_ERROR(comm.recv(incoming, n * sizeof(float), peer, tag, what));
      add_in_order(data.data(), incoming, n, (j & d) == 0);
    }
  }
  return fold_out(comm, data, group, fold, i, tag + 1, what);
}

// Chunks [begin, end) of the p.
struct ChunkRange {
  size_t begin, end;
};

// The chunks survivor j holds after the halving steps at distances q/2 down
// to `last` (none when last == q: all p chunks). Each step splits the range at
// its middle; j keeps the lower part when bit d of j is 0, the upper when 1.
// Survivor j of a power of two p = q ends (last = 1) with chunk j alone.
ChunkRange held_chunks(const Fold &fold, size_t j, size_t last) {
  ChunkRange range{0, fold.p};
  for (size_t d = fold.q / 2; d >= last && d > 0; d /= 2) {
    const size_t middle = range.begin + (range.end - range.begin) / 2;
    ((j & d) ? range.begin : range.end) = middle;
  }
  return range;
}

// The survivor whose halving ends with chunk c.
size_t holder_of(const Fold &fold, size_t c) {
  ChunkRange range{0, fold.p};
  size_t j = 0;
  for (size_t d = fold.q / 2; d > 0; d /= 2) {
    const size_t middle = range.begin + (range.end - range.begin) / 2;
    if (c >= middle) {
      j |= d;
      range.begin = middle;
    } else {
      range.end = middle;
    }
  }
  return j;
}

// Recursive halving over the survivors: at distance d = q/2, ..., 1 survivor
// j sends survivor j ^ d the half of its chunks that j ^ d keeps and adds in
// j ^ d's copy of the half it keeps (the lower survivor's operand first).
// Afterwards survivor j holds the sum of held_chunks(fold, j, 1). The halves
// are chunk ranges, so an element's path depends only on its chunk.
Status halve(Communicator &comm, std::span<float> data, const Group &group, const Fold &fold,
             size_t j, const Chunks &at, uint64_t tag, std::string_view what) {
  for (size_t d = fold.q / 2; d > 0; d /= 2) {
    const ChunkRange keep = held_chunks(fold, j, d), give = held_chunks(fold, j ^ d, d);
    const size_t keep_n = at(keep.end) - at(keep.begin), give_n = at(give.end) - at(give.begin);
    const int peer = group[fold.member(j ^ d)];
    float *incoming = scratch(keep_n);
    RETURN_IF_ERROR(
        comm.send(data.data() + at(give.begin), give_n * sizeof(float), peer, tag, what));
    RETURN_IF_ERROR(comm.recv(incoming, keep_n * sizeof(float), peer, tag, what));
    add_in_order(data.data() + at(keep.begin), incoming, keep_n, (j & d) == 0);
  }
  return Status::ok();
}

// Recursive doubling all-gather, the halving undone: at distance d = 1, 2,
// ..., q/2 survivor j sends its chunks to j ^ d and receives those of j ^ d;
// together they are what both held before the halving step at d.
Status double_up(Communicator &comm, std::span<float> data, const Group &group, const Fold &fold,
                 size_t j, const Chunks &at, uint64_t tag, std::string_view what) {
  for (size_t d = 1; d < fold.q; d *= 2) {
    const ChunkRange mine = held_chunks(fold, j, d), theirs = held_chunks(fold, j ^ d, d);
    const int peer = group[fold.member(j ^ d)];
    RETURN_IF_ERROR(comm.send(data.data() + at(mine.begin),
                              (at(mine.end) - at(mine.begin)) * sizeof(float), peer, tag, what));
    RETURN_IF_ERROR(comm.recv(data.data() + at(theirs.begin),
                              (at(theirs.end) - at(theirs.begin)) * sizeof(float), peer, tag,
                              what));
  }
  return Status::ok();
}

// Rabenseifner: the fold, recursive halving, recursive doubling, the fold back.
Status rabenseifner_all_reduce(Communicator &comm, std::span<float> data, const Group &group,
                               size_t i, uint64_t tag, std::string_view what,
                               std::span<const size_t> given) {
  const Fold fold(group.size());
  const Chunks at{data.size(), group.size(), given};
  RETURN_IF_ERROR(fold_in(comm, data, group, fold, i, tag, what));
  if (!fold.sits_out(i)) {
    const size_t j = fold.survivor(i);
    RETURN_IF_ERROR(halve(comm, data, group, fold, j, at, tag, what));
    RETURN_IF_ERROR(double_up(comm, data, group, fold, j, at, tag + 1, what));
  }
  return fold_out(comm, data, group, fold, i, tag + 1, what);
}

// The recursive-halving reduce-scatter: the fold, recursive halving, then
// every survivor sends each chunk it holds to the member it belongs to (none
// moves when p is a power of two: survivor i holds chunk i).
Status halving_reduce_scatter(Communicator &comm, std::span<float> data, const Group &group,
                              size_t i, uint64_t tag, std::string_view what,
                              std::span<const size_t> given) {
  const Fold fold(group.size());
  const Chunks at{data.size(), group.size(), given};
  RETURN_IF_ERROR(fold_in(comm, data, group, fold, i, tag, what));
  if (!fold.sits_out(i)) {
    const size_t j = fold.survivor(i);
    RETURN_IF_ERROR(halve(comm, data, group, fold, j, at, tag, what));
    const ChunkRange held = held_chunks(fold, j, 1);
    for (size_t c = held.begin; c < held.end; ++c)
      if (c != i)
        RETURN_IF_ERROR(comm.send(data.data() + at(c), (at(c + 1) - at(c)) * sizeof(float),
                                  group[c], tag + 1, what));
  }
  const size_t from = fold.member(holder_of(fold, i));
  if (from == i) return Status::ok();
  return comm.recv(data.data() + at(i), (at(i + 1) - at(i)) * sizeof(float), group[from], tag + 1,
                   what);
}

// ---------------------------------------------------------------------------
// Shared memory: the same sums, read straight from the members' buffers.

// How an algorithm adds up one chunk of p members' values: row `into` +=
// row `from` for each add in turn (rows are the members by group position),
// the sum ending in row `result`. Addition commutes bit for bit, so only the
// grouping matters, and it is the grouping the algorithm's messages give.
struct SumOrder {
  std::vector<std::pair<uint32_t, uint32_t>> adds;
  uint32_t result = 0;
};

SumOrder sum_order(std::optional<CollectiveAlgo> algo, size_t p, size_t chunk) {
  SumOrder order;
  auto add = [&](size_t into, size_t from) {
    order.adds.emplace_back(static_cast<uint32_t>(into), static_cast<uint32_t>(from));
  };
  if (!algo) { // the communicator's own: ((x0 + x1) + x2) + ...
    for (size_t k = 1; k < p; ++k)
      add(0, k);
    return order;
  }
  switch (*algo) {
  case CollectiveAlgo::kRing: { // chunk c travels c + 1, c + 2, ..., c
    const size_t first = (chunk + 1) % p;
    for (size_t k = 2; k <= p; ++k)
      add(first, (chunk + k) % p);
    order.result = static_cast<uint32_t>(first);
    return order;
  }
  case CollectiveAlgo::kTree: // binomial: the partner at distance 1, 2, 4, ...
    for (size_t mask = 1; mask < p; mask <<= 1)
      for (size_t i = 0; i + mask < p; i += 2 * mask)
        add(i, i + mask);
    return order;
  case CollectiveAlgo::kRecursiveDoubling:
  case CollectiveAlgo::kRabenseifner: { // the fold, then distance q/2, ..., 1
    const Fold fold(p);
    for (size_t k = 0; k < fold.r; ++k)
      add(2 * k, 2 * k + 1);
    for (size_t d = fold.q / 2; d > 0; d /= 2)
      for (size_t j = 0; j < d; ++j)
        add(fold.member(j), fold.member(j + d));
    return order;
  }
  }
  return order;
}

// out[e] = the sum over the rows of rows[k][e] in `order`, for e < n. `out`
// may be one of the rows (this member's own chunk).
void sum_rows(const std::vector<const float *> &rows, float *out, size_t n, const SumOrder &order) {
  if (rows.size() == 1) {
    if (out != rows[0]) std::copy(rows[0], rows[0] + n, out);
    return;
  }
  if (rows.size() == 2) { // one addition, whichever way round
    const float *a = rows[0], *b = rows[1];
    for (size_t e = 0; e < n; ++e)
      out[e] = a[e] + b[e];
    return;
  }
  // A block of every row at a time, small enough to stay in the cache.
  constexpr size_t kBlock = 1024;
  thread_local std::vector<float> block;
  block.resize(rows.size() * kBlock);
  for (size_t begin = 0; begin < n; begin += kBlock) {
    const size_t m = std::min(kBlock, n - begin);
    for (size_t k = 0; k < rows.size(); ++k)
      std::copy(rows[k] + begin, rows[k] + begin + m, block.data() + k * kBlock);
    for (auto [into, from] : order.adds) {
      float *to = block.data() + into * kBlock;
      const float *add = block.data() + from * kBlock;
      for (size_t e = 0; e < m; ++e)
        to[e] = to[e] + add[e];
    }
    const float *sum = block.data() + order.result * kBlock;
    std::copy(sum, sum + m, out + begin);
  }
}

// Where one of a member's parts is, as the others read it. The addresses
// themselves travel (not a pointer to the member's list), so a member that
// leaves early after a failure leaves nothing behind that another reads but
// the parts, which outlive the world's run.
struct Exposed {
  const void *data;
  size_t size; // elements of a part, bytes of a gathered piece
};

// The group as its members' ranks, and this member's position in it.
Result<std::pair<Group, size_t>> members_of(const Communicator &comm, const Group &group) {
  Group members = group;
  if (members.empty())
    for (int r = 0; r < comm.size(); ++r)
      members.push_back(r);
  ASSIGN_OR_RETURN(size_t i, position_in(comm, members));
  return std::make_pair(std::move(members), i);
}

// Every member's `mine`, member m's k-th at [m * mine.size() + k], each
// address as this member reaches it (Communicator::shared_address). A member
// showing another number fails the all-gather (its size differs); another
// size of the k-th is refused with mismatch(m, k, its size).
template <typename Mismatch>
Result<std::vector<Exposed>> expose(Communicator &comm, const std::vector<Exposed> &mine,
                                    const Group &group, std::string_view what,
                                    Mismatch &&mismatch) {
  struct Token {
    uint64_t address, size;
  };
  const size_t n = mine.size();
  std::vector<Token> tokens, all(group.size() * n);
  for (const Exposed &e : mine)
    tokens.push_back({comm.share_address(e.data), e.size});
  RETURN_IF_ERROR(comm.exchange(tokens.data(), n * sizeof(Token), all.data(), group, what));
  std::vector<Exposed> exposed(all.size());
  for (size_t m = 0; m < group.size(); ++m)
    for (size_t k = 0; k < n; ++k) {
      const Token &t = all[m * n + k];
      if (t.size != mine[k].size) return mismatch(m, k, t.size);
      exposed[m * n + k] = {comm.shared_address(group[m], t.address), t.size};
      if (exposed[m * n + k].data == nullptr && t.size > 0)
        return internal_error(what, ": device ", comm.rank(), " cannot reach device ", group[m],
                              "'s buffer (not in memory the two share)");
    }
  return exposed;
}

// Every member's parts, as expose.
Result<std::vector<Exposed>> expose(Communicator &comm, std::span<const std::span<float>> parts,
                                    const Group &group, std::string_view what) {
  std::vector<Exposed> mine;
  for (const std::span<float> &part : parts)
    mine.push_back({part.data(), part.size()});
  return expose(comm, mine, group, what, [&](size_t m, size_t, size_t) {
    return invalid_argument("device ", comm.rank(), " and device ", group[m],
                            " reduce parts of different sizes");
  });
}

// Member i's sums of chunk i of every part, into `out` (one per part).
void sum_own_chunks(const std::vector<Exposed> &all, size_t p, size_t i,
                    std::span<float *const> out, std::optional<CollectiveAlgo> algo) {
  const SumOrder order = sum_order(algo, p, i);
  std::vector<const float *> rows(p);
  for (size_t k = 0; k < out.size(); ++k) {
    const size_t n = all[i * out.size() + k].size;
    const size_t begin = chunk_begin(n, p, i), end = chunk_begin(n, p, i + 1);
    for (size_t m = 0; m < p; ++m)
      rows[m] = static_cast<const float *>(all[m * out.size() + k].data) + begin;
    sum_rows(rows, out[k], end - begin, order);
  }
}

} // namespace

Status shared_reduce_scatter(Communicator &comm, std::span<const std::span<float>> parts,
                             std::span<float *const> out, const Group &group,
                             std::optional<CollectiveAlgo> algo, std::string_view what) {
  ASSIGN_OR_RETURN(auto members, members_of(comm, group));
  const auto &[ranks, i] = members;
  if (out.size() != parts.size())
    return invalid_argument("a reduce-scatter of ", parts.size(), " parts with ", out.size(),
                            " outputs");
  ASSIGN_OR_RETURN(std::vector<Exposed> all, expose(comm, parts, ranks, what));
  sum_own_chunks(all, ranks.size(), i, out, algo);
  // Nobody leaves while another may still read its parts.
  return comm.segment_barrier(ranks, what);
}

Status shared_all_reduce(Communicator &comm, std::span<const std::span<float>> parts,
                         const Group &group, std::optional<CollectiveAlgo> algo,
                         std::string_view what) {
  ASSIGN_OR_RETURN(auto members, members_of(comm, group));
  const auto &[ranks, i] = members;
  const size_t p = ranks.size();
  std::vector<float *> out;
  for (const std::span<float> &part : parts)
    out.push_back(part.data() + chunk_begin(part.size(), p, i));
  ASSIGN_OR_RETURN(std::vector<Exposed> all, expose(comm, parts, ranks, what));
  sum_own_chunks(all, p, i, out, algo);
  RETURN_IF_ERROR(comm.segment_barrier(ranks, what)); // every chunk is summed
  for (size_t k = 0; k < parts.size(); ++k) {
    const size_t n = parts[k].size();
    for (size_t c = 0; c < p; ++c) {
      if (c == i) continue;
      const size_t begin = chunk_begin(n, p, c), end = chunk_begin(n, p, c + 1);
      const auto *from = static_cast<const float *>(all[c * parts.size() + k].data);
      std::copy(from + begin, from + end, parts[k].data() + begin);
    }
  }
  return comm.segment_barrier(ranks, what); // nobody reads another's chunks any more
}

Status segment_reduce(Communicator &comm, std::span<float *const> segments, const Group &group,
                      std::optional<CollectiveAlgo> algo, std::span<const size_t> chunks, bool all,
                      const SegmentCopy &pack, const SegmentTake &take, std::string_view what,
                      size_t block) {
  ASSIGN_OR_RETURN(size_t i, position_in(comm, group));
  const size_t p = group.size();
  if (segments.size() != p || chunks.size() != p + 1 || block < p)
    return invalid_argument("a shared reduction over ", p, " members with ", segments.size(),
                            " segments, ", chunks.size(), " chunk offsets and rounds of ", block,
                            " elements");
  if (comm.shared_segment_bytes() < kSegmentRounds * block * sizeof(float))
    return invalid_argument("a shared reduction in rounds of ", block, " elements needs ",
                            kSegmentRounds * block * sizeof(float), " bytes of segment, not ",
                            comm.shared_segment_bytes());
  // Round k stages elements [k s, (k + 1) s) of every chunk, chunk c at c s
  // in third k % 3 of each segment.
  const size_t s = block / p;
  size_t rounds = 0;
  for (size_t c = 0; c < p; ++c)
    rounds = std::max(rounds, (chunks[c + 1] - chunks[c] + s - 1) / s);
  auto range = [&](size_t c, size_t k) {
    const size_t begin = std::min(chunks[c] + k * s, chunks[c + 1]);
    return std::pair(begin, std::min(begin + s, chunks[c + 1]));
  };
  auto staged = [&](size_t m, size_t k, size_t c) {
    return segments[m] + (k % kSegmentRounds) * block + c * s;
  };
  auto stage = [&](size_t k) {
    for (size_t c = 0; c < p; ++c) {
      const auto [begin, end] = range(c, k);
      if (begin < end) pack(begin, end, staged(i, k, c));
    }
  };
  auto meet = [&] { return comm.segment_barrier(group, what); };
  const SumOrder order = sum_order(algo, p, i);
  std::vector<const float *> rows(p);
  // One meeting a round: after it, round k is summed (its sums may be
  // taken) and round k + 1 staged (it may be summed). A member stages round
  // k + 1 in the third that held round k - 2, which every member finished
  // taking before the meeting of round k - 1.
  stage(0);
  RETURN_IF_ERROR(meet());
  for (size_t k = 0; k < rounds; ++k) {
    const auto [begin, end] = range(i, k);
    for (size_t m = 0; m < p; ++m)
      rows[m] = staged(m, k, i);
    sum_rows(rows, staged(i, k, i), end - begin, order);
    if (k + 1 < rounds) stage(k + 1);
    if (!all && begin < end) take(begin, end, staged(i, k, i));
    RETURN_IF_ERROR(meet());
    if (all)
      for (size_t c = 0; c < p; ++c) {
        const auto [from, to] = range(c, k);
        if (from < to) take(from, to, staged(c, k, c));
      }
  }
  return all ? meet() : Status::ok(); // nobody reads another's any more
}

Status shared_all_gather(Communicator &comm, const void *input, size_t bytes, void *output,
                         const Group &group, std::string_view what) {
  const GatherPiece piece{input, bytes, output};
  return shared_all_gather(comm, std::span(&piece, 1), group, what);
}

Status shared_all_gather(Communicator &comm, std::span<const GatherPiece> pieces,
                         const Group &group, std::string_view what) {
  ASSIGN_OR_RETURN(auto members, members_of(comm, group));
  const auto &ranks = members.first;
  const size_t k = pieces.size();
  // Each piece's address and size: every member must gather the same sizes.
  std::vector<Exposed> mine;
  for (const GatherPiece &piece : pieces)
    mine.push_back({piece.input, piece.bytes});
  ASSIGN_OR_RETURN(std::vector<Exposed> all,
                   expose(comm, mine, ranks, what, [&](size_t m, size_t j, size_t theirs) {
                     return invalid_argument(what, ": piece ", j, " of an all-gather is ", theirs,
                                             " bytes on device ", ranks[m], " and ",
                                             pieces[j].bytes, " on device ", comm.rank());
                   }));
  for (size_t j = 0; j < k; ++j)
    for (size_t m = 0; m < ranks.size(); ++m) {
      const size_t bytes = pieces[j].bytes;
      std::byte *to = static_cast<std::byte *>(pieces[j].output) + m * bytes;
      const void *from = all[m * k + j].data;
      if (bytes > 0 && to != from) std::memcpy(to, from, bytes); // else in place
    }
  return comm.segment_barrier(ranks, what);
}

Status segment_all_gather(Communicator &comm, std::span<std::byte *const> segments,
                          std::span<const GatherPiece> pieces, const Group &group,
                          std::string_view what) {
  ASSIGN_OR_RETURN(size_t i, position_in(comm, group));
  const size_t p = group.size(), room = comm.shared_segment_bytes();
  if (segments.size() != p || room == 0)
    return invalid_argument("a shared all-gather over ", p, " members with ", segments.size(),
                            " segments of ", room, " bytes");
  size_t total = 0;
  for (const GatherPiece &piece : pieces)
    total += piece.bytes;
  // Calls fn(piece, offset in its input, bytes, offset in the round) for the
  // parts of the pieces that fall in bytes [begin, end) of their inputs
  // one after another.
  auto each = [&](size_t begin, size_t end, auto &&fn) {
    size_t at = 0;
    for (const GatherPiece &piece : pieces) {
      const size_t lo = std::max(at, begin), hi = std::min(at + piece.bytes, end);
      if (lo < hi) fn(piece, lo - at, hi - lo, lo - begin);
      at += piece.bytes;
    }
  };
  auto meet = [&] { return comm.segment_barrier(group, what); };
  for (size_t begin = 0; begin < total; begin += room) {
    const size_t end = std::min(total, begin + room);
    each(begin, end, [&](const GatherPiece &piece, size_t from, size_t n, size_t to) {
      std::memcpy(segments[i] + to, static_cast<const std::byte *>(piece.input) + from, n);
    });
    RETURN_IF_ERROR(meet()); // every member's part of the round is staged
    for (size_t m = 0; m < p; ++m)
      each(begin, end, [&](const GatherPiece &piece, size_t from, size_t n, size_t to) {
        std::byte *out = static_cast<std::byte *>(piece.output) + m * piece.bytes;
        if (m == i && out == piece.input) return; // in place
        std::memcpy(out + from, segments[m] + to, n);
      });
    RETURN_IF_ERROR(meet()); // nobody reads the round any more
  }
  return Status::ok();
}

std::string_view collective_algo_name(CollectiveAlgo algo) {
  switch (algo) {
  case CollectiveAlgo::kRing: return "ring";
  case CollectiveAlgo::kTree: return "tree";
  case CollectiveAlgo::kRecursiveDoubling: return "recursive-doubling";
  case CollectiveAlgo::kRabenseifner: return "rabenseifner";
  }
  return "?";
}

std::optional<CollectiveAlgo> collective_algo_named(std::string_view name) {
  for (CollectiveAlgo algo : kAllCollectiveAlgos)
    if (collective_algo_name(algo) == name) return algo;
  return std::nullopt;
}

Status algo_all_reduce(Communicator &comm, std::span<float> data, const Group &group,
                       CollectiveAlgo algo, uint64_t tag, std::string_view what,
                       std::span<const size_t> chunks) {
  ASSIGN_OR_RETURN(size_t i, position_in(comm, group));
  RETURN_IF_ERROR(check_chunks(chunks, data.size(), group.size()));
  if (group.size() < 2) return Status::ok();
  switch (algo) {
  case CollectiveAlgo::kTree: return tree_all_reduce(comm, data, group, i, tag, what);
  case CollectiveAlgo::kRecursiveDoubling:
    return recursive_doubling_all_reduce(comm, data, group, i, tag, what);
  case CollectiveAlgo::kRabenseifner:
    return rabenseifner_all_reduce(comm, data, group, i, tag, what, chunks);
  case CollectiveAlgo::kRing: break;
  }
  RETURN_IF_ERROR(ring_reduce_scatter(comm, data, group, i, tag, what, chunks));
  return ring_all_gather(comm, data, group, i, tag + 1, what, chunks);
}

Status algo_reduce_scatter(Communicator &comm, std::span<float> data, const Group &group,
                           CollectiveAlgo algo, uint64_t tag, std::string_view what,
                           std::span<const size_t> chunks) {
  ASSIGN_OR_RETURN(size_t i, position_in(comm, group));
  RETURN_IF_ERROR(check_chunks(chunks, data.size(), group.size()));
  if (group.size() < 2) return Status::ok();
  switch (algo) {
  case CollectiveAlgo::kTree: return tree_all_reduce(comm, data, group, i, tag, what);
  case CollectiveAlgo::kRecursiveDoubling:
  case CollectiveAlgo::kRabenseifner:
    return halving_reduce_scatter(comm, data, group, i, tag, what, chunks);
  case CollectiveAlgo::kRing: break;
  }
  return ring_reduce_scatter(comm, data, group, i, tag, what, chunks);
}

Status algo_all_gather(Communicator &comm, std::span<float> data, const Group &group, uint64_t tag,
                       std::string_view what) {
  ASSIGN_OR_RETURN(size_t i, position_in(comm, group));
  if (group.size() < 2) return Status::ok();
  return ring_all_gather(comm, data, group, i, tag, what);
}

} // namespace strata::runtime
