// GpuRank as the execution core's transport: copies between the streams of
// one GPU, NCCL between GPUs (runtime/cuda/gpu_rank.h).
#include "runtime/cuda/gpu_rank.h"

#if STRATA_HAVE_CUDA

#include "ops/kernels/cuda/launch.h"
#include "runtime/comm/collectives.h"
#if STRATA_HAVE_NCCL
#include <nccl.h>
#endif

namespace strata::runtime {

namespace {

#if STRATA_HAVE_NCCL
ncclComm_t handle(const NcclComm &comm) { return static_cast<ncclComm_t>(comm.handle()); }
#endif

Status no_nccl() { return unimplemented("this strata was built without NCCL"); }

} // namespace

cudaStream_t GpuRank::stream_of(const core::Member &member) const {
  return device(member.device).stream;
}

Status GpuRank::arrive(llvm::ArrayRef<core::Member> members) {
  cudaStream_t lead = stream_of(members[0]);
  for (const core::Member &member : members) {
    cudaEvent_t arrived = extra(member.device, member.instruction).arrived;
    RETURN_IF_ERROR(cuda_check(cudaEventRecord(arrived, stream_of(member)), "event record"));
    RETURN_IF_ERROR(cuda_check(cudaStreamWaitEvent(lead, arrived, 0), "event wait"));
  }
  return Status::ok();
}

Status GpuRank::release(llvm::ArrayRef<core::Member> members) {
  cudaEvent_t done = *extra(members[0].device, members[0].instruction).reduced;
  RETURN_IF_ERROR(cuda_check(cudaEventRecord(done, stream_of(members[0])), "event record"));
  for (size_t m = 1; m < members.size(); ++m)
    RETURN_IF_ERROR(cuda_check(cudaStreamWaitEvent(stream_of(members[m]), done, 0), "event wait"));
  return Status::ok();
}

Status GpuRank::send(const core::Part &part, const core::Op &op) {
  // Staged at once, so the sender may reuse its buffer, as the CPU
  // communicator's sends copy; the event says the message is there.
  Device &from = device(part.device);
  Extra &x = extra(part.device, part.instruction);
  RETURN_IF_ERROR(copy(x.staging, op.data, op.bytes, from.stream));
  return cuda_check(cudaEventRecord(x.sent, from.stream), "event record");
}

Status GpuRank::recv(const core::Part &part, const core::Op &op) {
  Device &to = device(part.device);
  const Extra &x = extra(part.device, part.instruction);
  if (x.matching != nullptr) { // the send is on this GPU
    RETURN_IF_ERROR(cuda_check(cudaStreamWaitEvent(to.stream, x.matching->sent, 0), "event wait"));
    return copy(op.data, x.matching->staging, op.bytes, to.stream);
  }
#if STRATA_HAVE_NCCL
  const int peer = rank_of_device[static_cast<size_t>(op.peer)];
  RETURN_IF_ERROR(nccl_after_last(to.stream));
  RETURN_IF_ERROR(nccl(*world,
                       ncclRecv(op.data, op.bytes, ncclUint8, peer, handle(*world), to.stream),
                       str_cat("receive from GPU rank ", peer)));
  return nccl_mark(to.stream);
#else
  return no_nccl();
#endif
}

#if STRATA_HAVE_NCCL
// The other side of a receive on another GPU of a message staged here: the
// second stream sends it, so the sender's compute goes on.
Status GpuRank::send_out(const GpuRankStep &step) {
  Device &from = device(step.part.device);
  const Extra &x = extra(step.part.device, step.part.instruction);
  const core::Op &op = from.program.ops[step.part.instruction];
  RETURN_IF_ERROR(cuda_check(cudaStreamWaitEvent(from.side, x.sent, 0), "event wait"));
  RETURN_IF_ERROR(nccl_after_last(from.side));
  RETURN_IF_ERROR(
      nccl(*world, ncclSend(x.staging, op.bytes, ncclUint8, step.peer, handle(*world), from.side),
           str_cat("send to GPU rank ", step.peer)));
  return nccl_mark(from.side);
}
#endif

#if STRATA_HAVE_NCCL
// This GPU's member of an all-reduce, reduce-scatter (n elements for each
// member) or all-gather (n bytes from each) over `comm`, on its stream.
Status GpuRank::nccl_collective(NcclComm &comm, const core::Member &me, NcclOp op, size_t n,
                                std::string_view what) {
  cudaStream_t stream = stream_of(me);
  const ncclComm_t c = handle(comm);
  RETURN_IF_ERROR(nccl_after_last(stream));
  RETURN_IF_ERROR(nccl(comm,
                       op == NcclOp::kAllReduce
                           ? ncclAllReduce(me.in, me.out, n, ncclFloat32, ncclSum, c, stream)
                       : op == NcclOp::kReduceScatter
                           ? ncclReduceScatter(me.in, me.out, n, ncclFloat32, ncclSum, c, stream)
                           : ncclAllGather(me.in, me.out, n, ncclUint8, c, stream),
                       what));
  return nccl_mark(stream);
}

// This GPU's member of an all-to-all: its blocks for the others sent, theirs
// for it received beside them, its own copied.
Status GpuRank::nccl_all_to_all(NcclComm &comm, const core::Member &me, size_t block, int group) {
  cudaStream_t stream = stream_of(me);
  const size_t p = plan.group(group).size(), m = plan.position(group, me.device);
  const auto *outgoing = static_cast<const std::byte *>(me.in);
  auto *incoming = static_cast<std::byte *>(me.out);
  RETURN_IF_ERROR(nccl_after_last(stream));
  RETURN_IF_ERROR(nccl(comm, ncclGroupStart(), "group start"));
  Status status = Status::ok();
  for (size_t j = 0; j < p && status.is_ok(); ++j) {
    if (j == m) continue;
    const int peer = static_cast<int>(j);
    status =
        nccl(comm, ncclSend(outgoing + j * block, block, ncclUint8, peer, handle(comm), stream),
             "all-to-all");
    if (status.is_ok())
      status =
          nccl(comm, ncclRecv(incoming + j * block, block, ncclUint8, peer, handle(comm), stream),
               "all-to-all");
  }
  Status ended = nccl(comm, ncclGroupEnd(), "all-to-all");
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(ended);
  RETURN_IF_ERROR(nccl_mark(stream));
  return copy(incoming + m * block, outgoing + m * block, block, stream);
}
#else
Status GpuRank::nccl_collective(NcclComm &, const core::Member &, NcclOp, size_t,
                                std::string_view) {
  return no_nccl();
}
Status GpuRank::nccl_all_to_all(NcclComm &, const core::Member &, size_t, int) { return no_nccl(); }
#endif

// Sums are NCCL's where the group crosses GPUs (its order, not the CPU
// communicator's: equal to rounding); on one GPU the first member's stream
// adds the members' buffers in group order, as the CPU does.
Status GpuRank::all_reduce(llvm::ArrayRef<core::Member> members, size_t count,
                           const core::Collective &call) {
  if (NcclComm *comm = group_comm(call.group))
    return nccl_collective(*comm, members[0], NcclOp::kAllReduce, count, "all-reduce");
  RETURN_IF_ERROR(arrive(members));
  cuda::Members sum;
  sum.count = sum.outs = static_cast<int>(members.size());
  for (size_t m = 0; m < members.size(); ++m) {
    sum.in[m] = static_cast<const float *>(members[m].in);
    sum.out[m] = static_cast<float *>(members[m].out);
  }
  RETURN_IF_ERROR(cuda_check(
      cuda::sum_members(sum, static_cast<int64_t>(count), stream_of(members[0])), "launch"));
  return release(members);
}

Status GpuRank::reduce_scatter(llvm::ArrayRef<core::Member> members, size_t count,
                               const core::Collective &call, const plan::PieceLayout *blocks) {
  if (NcclComm *comm = group_comm(call.group))
    return nccl_collective(*comm, members[0], NcclOp::kReduceScatter,
                           count / plan.group(call.group).size(), "reduce-scatter");
  RETURN_IF_ERROR(arrive(members));
  const size_t p = members.size(), chunk = count / p;
  cudaStream_t stream = stream_of(members[0]);
  for (size_t c = 0; c < p; ++c) {
    cuda::Members sum;
    sum.count = static_cast<int>(p);
    sum.outs = 1;
    sum.out[0] = static_cast<float *>(members[c].out);
    for (size_t r = 0; r < p; ++r)
      sum.in[r] = static_cast<const float *>(members[r].in) + (blocks ? 0 : c * chunk);
    if (blocks == nullptr) {
      RETURN_IF_ERROR(
          cuda_check(cuda::sum_members(sum, static_cast<int64_t>(chunk), stream), "launch"));
      continue;
    }
    // Member c's column block of every row.
    const auto run = static_cast<int64_t>(blocks->run / sizeof(float));
    RETURN_IF_ERROR(cuda_check(cuda::sum_members_block(sum, static_cast<int64_t>(blocks->rows), run,
                                                       static_cast<int64_t>(p) * run,
                                                       static_cast<int64_t>(c) * run, stream),
                               "launch"));
  }
  return release(members);
}

Status GpuRank::all_gather(llvm::ArrayRef<core::Member> members, size_t bytes,
                           const core::Collective &call, const plan::PieceLayout *blocks) {
  if (NcclComm *comm = group_comm(call.group))
    return nccl_collective(*comm, members[0], NcclOp::kAllGather, bytes, "all-gather");
  RETURN_IF_ERROR(arrive(members));
  const size_t p = members.size();
  cudaStream_t stream = stream_of(members[0]);
  for (size_t m = 0; m < p; ++m)
    for (size_t r = 0; r < p; ++r) {
      auto *out = static_cast<std::byte *>(members[m].out);
      if (blocks == nullptr) {
        RETURN_IF_ERROR(copy(out + r * bytes, members[r].in, bytes, stream));
        continue;
      }
      // Member r's piece is column block r of every row.
      RETURN_IF_ERROR(copy_block(out + r * blocks->run, p * blocks->run, members[r].in, blocks->run,
                                 blocks->run, blocks->rows, stream));
    }
  return release(members);
}

Status GpuRank::all_to_all(llvm::ArrayRef<core::Member> members, size_t block,
                           const core::Collective &call) {
  if (NcclComm *comm = group_comm(call.group))
    return nccl_all_to_all(*comm, members[0], block, call.group);
  RETURN_IF_ERROR(arrive(members));
  cudaStream_t stream = stream_of(members[0]);
  for (size_t r = 0; r < members.size(); ++r)
    for (size_t j = 0; j < members.size(); ++j)
      RETURN_IF_ERROR(copy(static_cast<std::byte *>(members[r].out) + j * block,
                           static_cast<const std::byte *>(members[j].in) + r * block, block,
                           stream));
  return release(members);
}

// A member is there and its stream goes on; the reduction comes at the
// launch after the last member's arrival (reduce_bucket).
Status GpuRank::start_bucket(int device_index, uint32_t, const core::Bucket &, size_t instruction) {
  return cuda_check(
      cudaEventRecord(extra(device_index, instruction).arrived, device(device_index).stream),
      "event record");
}

// Beside the backward, on the second stream: the first member's over one
// GPU (adding each tensor's members in group order), this GPU's member's
// over NCCL.
Status GpuRank::reduce_bucket(llvm::ArrayRef<core::Part> members) {
  const core::Part &lead = members[0];
  Device &first = device(lead.device);
  const Extra &x = extra(lead.device, lead.instruction);
  const core::Bucket &bucket = first.program.buckets[first.program.ops[lead.instruction].bucket];
  if (NcclComm *comm = group_comm(bucket.group)) {
#if STRATA_HAVE_NCCL
    const size_t p = plan.group(bucket.group).size(), m = bucket.position;
    RETURN_IF_ERROR(cuda_check(cudaStreamWaitEvent(first.side, x.arrived, 0), "event wait"));
    RETURN_IF_ERROR(nccl_after_last(first.side));
    RETURN_IF_ERROR(nccl(*comm, ncclGroupStart(), "group start"));
    Status status = Status::ok();
    for (size_t t = 0; t < bucket.parts.size() && status.is_ok(); ++t) {
      float *data = bucket.parts[t].data();
      const size_t n = bucket.parts[t].size(), chunk = n / p;
      status =
          nccl(*comm,
               bucket.reduce_scatter
                   ? ncclReduceScatter(data, data + m * chunk, chunk, ncclFloat32, ncclSum,
                                       handle(*comm), first.side)
                   : ncclAllReduce(data, data, n, ncclFloat32, ncclSum, handle(*comm), first.side),
               "bucket reduction");
    }
    Status ended = nccl(*comm, ncclGroupEnd(), "bucket reduction");
    RETURN_IF_ERROR(status);
    RETURN_IF_ERROR(ended);
    RETURN_IF_ERROR(nccl_mark(first.side));
    return cuda_check(cudaEventRecord(*x.reduced, first.side), "event record");
#else
    return no_nccl();
#endif
  }
  for (const core::Part &part : members)
    RETURN_IF_ERROR(
        cuda_check(cudaStreamWaitEvent(first.side, extra(part.device, part.instruction).arrived, 0),
                   "event wait"));
  auto member = [&](size_t m) -> const core::Bucket & {
    const Device &d = device(members[m].device);
    return d.program.buckets[d.program.ops[members[m].instruction].bucket];
  };
  const size_t p = members.size();
  for (size_t t = 0; t < bucket.parts.size(); ++t) {
    const size_t n = bucket.parts[t].size();
    // An all-reduce's sum into every member; a reduce-scatter's chunk c into
    // member c's only (ZeRO-1: chunk c of n elements is [c n / p, (c + 1) n / p)).
    for (size_t c = 0; c < (bucket.reduce_scatter ? p : 1); ++c) {
      const size_t begin = bucket.reduce_scatter ? chunk_begin(n, p, c) : 0;
      const size_t end = bucket.reduce_scatter ? chunk_begin(n, p, c + 1) : n;
      cuda::Members sum;
      sum.count = static_cast<int>(p);
      for (size_t m = 0; m < p; ++m) {
        sum.in[m] = member(m).parts[t].data() + begin;
        if (!bucket.reduce_scatter) sum.out[sum.outs++] = member(m).parts[t].data();
      }
      if (bucket.reduce_scatter) sum.out[sum.outs++] = member(c).parts[t].data() + begin;
      RETURN_IF_ERROR(cuda_check(
          cuda::sum_members(sum, static_cast<int64_t>(end - begin), first.side), "launch"));
    }
  }
  return cuda_check(cudaEventRecord(*x.reduced, first.side), "event record");
}

Status GpuRank::wait_bucket(int device_index, uint32_t index, const core::Bucket &, size_t) {
  Device &d = device(device_index);
  return cuda_check(cudaStreamWaitEvent(d.stream, d.bucket_done.at(index), 0), "event wait");
}

#if STRATA_HAVE_NCCL
// An NCCL call's result, settled (non-blocking communicators may still be
// enqueueing it), bounded by the run's timeout.
Status GpuRank::nccl(NcclComm &comm, int result, std::string_view what) {
  return nccl_settle(comm, result, what, options.timeout, [this]() -> Status {
    if (stop != nullptr && stop->load()) return aborted_by_peer();
    return options.watch ? options.watch() : Status::ok();
  });
}

// Every NCCL call of this GPU starts after the one enqueued before it,
// whatever its stream: the calls are already in the same global order on
// every rank, and chained they never need two communicators' kernels
// resident at once (which NCCL warns can deadlock when they do not fit).
Status GpuRank::nccl_after_last(cudaStream_t stream) {
  if (nccl_stream_ == nullptr || nccl_stream_ == stream) return Status::ok();
  return cuda_check(cudaStreamWaitEvent(stream, nccl_done_, 0), "event wait");
}

Status GpuRank::nccl_mark(cudaStream_t stream) {
  nccl_stream_ = stream;
  return cuda_check(cudaEventRecord(nccl_done_, stream), "event record");
}

// The step's first update, over several GPUs: every local device's checks
// so far (combine_local_flags), then every GPU's (the maximum over
// `world`), into rank_any_, which every local update then reads.
Status GpuRank::share_flags() {
  RETURN_IF_ERROR(combine_local_flags());
  cudaStream_t stream = devices_.at(first_local())->stream;
  RETURN_IF_ERROR(nccl_after_last(stream));
  RETURN_IF_ERROR(nccl(
      *world, ncclAllReduce(rank_any_, rank_any_, 1, ncclInt32, ncclMax, handle(*world), stream),
      "all-reduce of the check flags"));
  RETURN_IF_ERROR(nccl_mark(stream));
  return cuda_check(cudaEventRecord(flags_shared_, stream), "event record");
}
#endif

} // namespace strata::runtime

#endif
