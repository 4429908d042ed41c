// NCCL on the host, for the CUDA emulator (see cuda_emulator.h): communicators
// of one process (a rank per emulated GPU, on any host threads), splits, and
// the calls strata makes (all-reduce, all-gather, reduce-scatter, send and
// receive, in groups) as stream work that waits at the head of its stream
// until every rank's part has reached the head of its own, then runs once
// for all. The k-th call of each rank on a communicator meet, as in NCCL, and
// a call whose ranks disagree (operation, count, type) faults instead of
// hanging. Sums add the ranks in rank order.
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "tests/cuda_emulator/cuda_emulator.h"
#include "tests/cuda_emulator/state.h"

namespace strata::cuda_emulator {
namespace {

enum class Kind { kAllReduce, kAllGather, kReduceScatter, kSendRecv };

struct Args {
  Kind kind;
  const void *send = nullptr;
  void *recv = nullptr;
  size_t count = 0;
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;
};

// One NCCL operation: each member's arguments, who has reached it on its
// stream, and whether it ran.
struct Instance {
  size_t needed = 0;
  std::map<int, Args> args;
  std::set<int> arrived;
  bool done = false;
};

struct Clique;

struct Comm {
  std::shared_ptr<Clique> clique;
  int rank = 0;
  int device = 0; // the GPU current at its creation: its calls go to that GPU's streams
  bool aborted = false;
};

struct SplitCall {
  int color, key;
  ncclComm_t *slot;
};

struct Clique {
  int size = 0;
  std::vector<Comm *> members;
  std::map<int, uint64_t> collectives_made; // per rank
  std::map<uint64_t, std::shared_ptr<Instance>> collectives;
  std::map<std::pair<int, int>, uint64_t> sends_made, receives_made; // (from, to)
  std::map<std::tuple<int, int, uint64_t>, std::shared_ptr<Instance>> transfers;
  // Splits: per rank, how many it began; per round, every rank's call.
  std::map<int, uint64_t> splits_begun;
  std::map<uint64_t, std::map<int, SplitCall>> splits;
  std::set<uint64_t> splits_done;
};

std::mutex nccl_mutex; // cliques, communicators and splits
std::map<std::string, std::shared_ptr<Clique>> cliques;
std::atomic<uint64_t> next_id{1};
thread_local std::string last_error;

size_t type_bytes(ncclDataType_t type) {
  switch (type) {
  case ncclInt8:
  case ncclUint8: return 1;
  case ncclFloat16:
  case ncclBfloat16: return 2;
  case ncclInt32:
  case ncclUint32:
  case ncclFloat32: return 4;
  default: return 8;
  }
}

ncclResult_t fail(ncclResult_t result, std::string message) {
  last_error = "NCCL emulator: " + message;
  detail::note(last_error);
  return result;
}

// The reduction of `values` (one per rank, in rank order) of `type`.
template <typename T>
void reduce_into(T *out, const std::vector<const T *> &in, size_t n, ncclRedOp_t op) {
  for (size_t i = 0; i < n; ++i) {
    T value = in[0][i];
    for (size_t r = 1; r < in.size(); ++r)
      value = op == ncclMax ? (in[r][i] > value ? in[r][i] : value) : value + in[r][i];
    out[i] = value;
  }
}

// Runs one operation for every member (all have arrived).
void execute(Instance &instance) {
  const Args &first = instance.args.begin()->second;
  for (const auto &[member, args] : instance.args)
    if (args.kind != first.kind || args.count != first.count || args.type != first.type ||
        args.op != first.op) {
      detail::fault(cudaErrorLaunchFailure,
                    "NCCL emulator: the ranks of an NCCL call disagree on its operation, count or "
                    "type (rank " +
                        std::to_string(member) + ")");
      return;
    }
  const size_t n = first.count, bytes = n * type_bytes(first.type);
  const size_t ranks = instance.args.size();
  if (first.kind == Kind::kSendRecv) {
    std::memcpy(instance.args.at(1).recv, instance.args.at(0).send, bytes);
    return;
  }
  // Every input is read before any output is written (in place is allowed).
  std::vector<std::vector<char>> in;
  for (const auto &[member, args] : instance.args) {
    const size_t size = first.kind == Kind::kReduceScatter ? bytes * ranks : bytes;
    in.emplace_back(static_cast<const char *>(args.send),
                    static_cast<const char *>(args.send) + size);
  }
  auto reduce = [&](void *out, size_t offset) {
    if (first.type == ncclFloat32) {
      std::vector<const float *> parts;
      for (auto &b : in)
        parts.push_back(reinterpret_cast<const float *>(b.data() + offset));
      reduce_into(static_cast<float *>(out), parts, n, first.op);
    } else if (first.type == ncclInt32) {
      std::vector<const int32_t *> parts;
      for (auto &b : in)
        parts.push_back(reinterpret_cast<const int32_t *>(b.data() + offset));
      reduce_into(static_cast<int32_t *>(out), parts, n, first.op);
    } else {
      detail::fault(cudaErrorLaunchFailure, "NCCL emulator: a reduction of a type not emulated");
    }
  };
  for (auto &[member, args] : instance.args) {
    switch (first.kind) {
    case Kind::kAllReduce: reduce(args.recv, 0); break;
    case Kind::kReduceScatter: reduce(args.recv, static_cast<size_t>(member) * bytes); break;
    case Kind::kAllGather:
      for (size_t k = 0; k < ranks; ++k)
        std::memcpy(static_cast<char *>(args.recv) + k * bytes, in[k].data(), bytes);
      break;
    default: break;
    }
  }
}

// A call's part on this rank, made when it is queued: the k-th call of its
// kind meets the other ranks' k-th.
struct Part {
  std::shared_ptr<Instance> instance;
  int member;
};

Part make_part(const Comm &comm, const Args &args, int peer, bool sending) {
  Clique &c = *comm.clique;
  std::shared_ptr<Instance> instance;
  int member = comm.rank;
  if (args.kind == Kind::kSendRecv) {
    const int from = sending ? comm.rank : peer, to = sending ? peer : comm.rank;
    const uint64_t k = (sending ? c.sends_made : c.receives_made)[{from, to}]++;
    auto &slot = c.transfers[{from, to, k}];
    if (!slot) slot = std::make_shared<Instance>(), slot->needed = 2;
    instance = slot;
    member = sending ? 0 : 1;
    if (instance->args.size() == 1 || instance->done) c.transfers.erase({from, to, k});
  } else {
    const uint64_t k = c.collectives_made[comm.rank]++;
    auto &slot = c.collectives[k];
    if (!slot) slot = std::make_shared<Instance>(), slot->needed = static_cast<size_t>(c.size);
    instance = slot;
    if (instance->args.size() + 1 == instance->needed) c.collectives.erase(k);
  }
  instance->args[member] = args;
  return {instance, member};
}

// What a rank's calls on one stream need: a maker of their parts.
struct Call {
  Comm *comm;
  Args args;
  int peer;
  bool sending;
};

Make make_work(std::vector<Call> calls) {
  return [calls] {
    auto parts = std::make_shared<std::vector<Part>>();
    for (const Call &call : calls)
      parts->push_back(make_part(*call.comm, call.args, call.peer, call.sending));
    Work work;
    work.ready = [parts] {
      bool all = true;
      for (Part &part : *parts) {
        part.instance->arrived.insert(part.member);
        all &= part.instance->arrived.size() == part.instance->needed &&
               part.instance->args.size() == part.instance->needed;
      }
      return all;
    };
    work.run = [parts] {
      for (Part &part : *parts)
        if (!part.instance->done) {
          part.instance->done = true;
          execute(*part.instance);
        }
    };
    return work;
  };
}

thread_local int group_depth = 0;
thread_local std::vector<std::pair<cudaStream_t, Call>> grouped;

ncclResult_t submit(Comm *comm, cudaStream_t stream, const Args &args, int peer = -1,
                    bool sending = false) {
  if (comm == nullptr || comm->aborted)
    return fail(ncclInvalidArgument, "a call on no communicator");
  if (stream_device(stream) != comm->device)
    return fail(ncclInvalidArgument,
                "a call on a stream of GPU " + std::to_string(stream_device(stream)) +
                    " for a communicator of GPU " + std::to_string(comm->device));
  const bool reduces = args.kind == Kind::kAllReduce || args.kind == Kind::kReduceScatter;
  if (reduces && ((args.op != ncclSum && args.op != ncclMax) ||
                  (args.type != ncclFloat32 && args.type != ncclInt32)))
    return fail(ncclInvalidArgument,
                "a reduction other than a sum or maximum of f32 or i32 (not emulated)");
  if (args.kind == Kind::kSendRecv &&
      (peer < 0 || peer >= comm->clique->size || peer == comm->rank))
    return fail(ncclInvalidArgument, "a peer outside the communicator");
  const Call call{comm, args, peer, sending};
  if (group_depth > 0) {
    grouped.emplace_back(stream, call);
    return ncclSuccess;
  }
  return enqueue_made(stream, "NCCL call", make_work({call})) == cudaSuccess
             ? ncclSuccess
             : fail(ncclUnhandledCudaError, "the stream refused the call");
}

Comm *comm_of(ncclComm_t comm) { return reinterpret_cast<Comm *>(comm); }

} // namespace
} // namespace strata::cuda_emulator

using namespace strata::cuda_emulator;

extern "C" {

const char *ncclGetErrorString(ncclResult_t result) {
  switch (result) {
  case ncclSuccess: return "no error (emulated)";
  case ncclInProgress: return "operation in progress (emulated)";
  case ncclInvalidArgument: return "invalid argument (emulated)";
  case ncclInvalidUsage: return "invalid usage (emulated)";
  default: return "an NCCL error (emulated)";
  }
}

const char *ncclGetLastError(ncclComm_t) { return last_error.c_str(); }

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  std::memset(id->internal, 0, sizeof id->internal);
  const uint64_t n = next_id++;
  std::memcpy(id->internal, "emulated", 8);
  std::memcpy(id->internal + 8, &n, sizeof n);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *) {
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument,
                "rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  std::lock_guard<std::mutex> lock(nccl_mutex);
  auto &clique = cliques[std::string(id.internal, sizeof id.internal)];
  if (!clique) {
    clique = std::make_shared<Clique>();
    clique->size = nranks;
    clique->members.assign(static_cast<size_t>(nranks), nullptr);
  }
  if (clique->size != nranks || clique->members[static_cast<size_t>(rank)] != nullptr)
    return fail(ncclInvalidUsage,
                "ranks disagree on the communicator's size, or a rank joins twice");
  auto *c = new Comm{clique, rank, current_gpu()};
  clique->members[static_cast<size_t>(rank)] = c;
  *comm = reinterpret_cast<ncclComm_t>(c);
  return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *) {
  Comm *c = comm_of(comm);
  if (c == nullptr || c->aborted) return fail(ncclInvalidArgument, "a split of no communicator");
  std::lock_guard<std::mutex> lock(nccl_mutex);
  Clique &q = *c->clique;
  const uint64_t round = q.splits_begun[c->rank]++;
  q.splits[round][c->rank] = {color, key, newcomm};
  if (q.splits[round].size() < static_cast<size_t>(q.size)) return ncclInProgress;
  // Every rank has called: make each color's communicator, ranked by key
  // then by rank in the parent.
  std::map<int, std::vector<std::tuple<int, int, SplitCall>>> colors;
  for (const auto &[rank, call] : q.splits[round]) {
    if (call.color == NCCL_SPLIT_NOCOLOR) {
      *call.slot = nullptr;
      continue;
    }
    colors[call.color].emplace_back(call.key, rank, call);
  }
  for (auto &[colour, members] : colors) {
    std::sort(members.begin(), members.end(), [](const auto &a, const auto &b) {
      return std::tie(std::get<0>(a), std::get<1>(a)) < std::tie(std::get<0>(b), std::get<1>(b));
    });
    auto clique = std::make_shared<Clique>();
    clique->size = static_cast<int>(members.size());
    for (size_t r = 0; r < members.size(); ++r) {
      auto *made = new Comm{clique, static_cast<int>(r),
                            q.members[static_cast<size_t>(std::get<1>(members[r]))]->device};
      clique->members.push_back(made);
      *std::get<2>(members[r]).slot = reinterpret_cast<ncclComm_t>(made);
    }
  }
  q.splits.erase(round);
  q.splits_done.insert(round);
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *result) {
  Comm *c = comm_of(comm);
  if (c == nullptr) return fail(ncclInvalidArgument, "no communicator");
  std::lock_guard<std::mutex> lock(nccl_mutex);
  const Clique &q = *c->clique;
  // A split this rank began that not every rank has: in progress.
  const auto begun = q.splits_begun.find(c->rank);
  const uint64_t count = begun == q.splits_begun.end() ? 0 : begun->second;
  *result = ncclSuccess;
  for (uint64_t round = 0; round < count; ++round)
    if (q.splits_done.count(round) == 0) *result = ncclInProgress;
  if (detail::sticky() != cudaSuccess) *result = ncclUnhandledCudaError;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  Comm *c = comm_of(comm);
  if (c != nullptr) c->aborted = true; // kept: queued work may still name it
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return ncclCommAbort(comm); }

ncclResult_t ncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--group_depth > 0) return ncclSuccess;
  // One piece of work per stream, holding the group's calls on it.
  std::vector<std::pair<cudaStream_t, Call>> calls;
  calls.swap(grouped);
  std::vector<cudaStream_t> order;
  for (const auto &[stream, call] : calls)
    if (std::find(order.begin(), order.end(), stream) == order.end()) order.push_back(stream);
  for (cudaStream_t stream : order) {
    std::vector<Call> mine;
    for (const auto &[s, call] : calls)
      if (s == stream) mine.push_back(call);
    if (enqueue_made(stream, "NCCL group", make_work(mine)) != cudaSuccess)
      return fail(ncclUnhandledCudaError, "the stream refused the group");
  }
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return submit(comm_of(comm), stream, {Kind::kAllReduce, send, recv, count, type, op});
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return submit(comm_of(comm), stream, {Kind::kReduceScatter, send, recv, count, type, op});
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  return submit(comm_of(comm), stream, {Kind::kAllGather, send, recv, count, type, ncclSum});
}

ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return submit(comm_of(comm), stream, {Kind::kSendRecv, send, nullptr, count, type, ncclSum}, peer,
                true);
}

ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return submit(comm_of(comm), stream, {Kind::kSendRecv, nullptr, recv, count, type, ncclSum}, peer,
                false);
}

} // extern "C"
