// What each instruction of a pipeline plan does, written once for every
// backend.
//
// An issuer walks a device's resolved program (device_program.h) and issues
// each instruction through two interfaces a backend implements:
//  - DeviceBackend: the device's memory and compute: run a node (the CPU
//    kernel; the CUDA op table on the device's stream), copy, add, divide,
//    apply a state update;
//  - Transport: how devices meet: point-to-point messages, collectives over
//    a plan group, gradient buckets reduced beside the computation.
// Both are stream-ordered: a call's work happens after the device's earlier
// work and before its later work. On a CPU device thread that means the call
// does it now (a receive returns with the data); on a GPU it is enqueued on
// the device's stream, and a receive makes the stream wait for the send.
//
// A collective is issued with the members the issuer runs: on a CPU device
// thread its own device; on one GPU, where one host thread enqueues every
// device's work in a launch order (gpu_placement.h), every member at once;
// over NCCL, this GPU's member. So the same instruction semantics serve
// threads, MPI ranks, streams of one GPU and GPUs over NCCL.
//
// Tensor-parallel nodes: pieces cut in column blocks (plan::PieceLayout) are
// copied into and out of the device's collective staging here, by the
// device, so that a transport moves contiguous buffers only; a transport
// that can read and write the blocks in place (copies on one GPU) says so
// (strided) and no staging is used.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "runtime/comm/collectives.h"
#include "runtime/core/device_program.h"

namespace strata::runtime::core {

// One instruction of one device.
struct Part {
  int device = 0;
  size_t instruction = 0;
};

class DeviceBackend {
public:
  virtual ~DeviceBackend() = default;
  // An ordinary node (Compute or ComputeShard, not a tensor-parallel
  // collective) of instruction `instruction`.
  virtual Status run_node(size_t instruction) = 0;
  virtual Status copy(void *to, const void *from, size_t bytes) = 0;
  // `rows` rows of `width` bytes, `from_pitch` bytes apart, to `to_pitch`
  // bytes apart.
  virtual Status copy_rows(void *to, size_t to_pitch, const void *from, size_t from_pitch,
                           size_t width, size_t rows) = 0;
  virtual Status accumulate(float *sum, const float *add, size_t count) = 0;
  virtual Status divide(float *data, float divisor, size_t count) = 0;
  // Instruction `instruction`, a state update: op.bytes from op.source to
  // op.data, unless the backend's step checks failed (the CUDA backend's
  // device-side checks: a bad label keeps the weights).
  virtual Status update(size_t instruction) = 0;
};

// One member's buffers in a collective, and its instruction.
struct Member {
  int device = 0;
  size_t instruction = 0;
  const void *in = nullptr;
  void *out = nullptr;
};

// What a collective runs over: a plan group, the plan's algorithm for it
// (none: the transport's own), the tag of its messages, and what it is.
struct Collective {
  int group = -1;
  std::optional<CollectiveAlgo> algo;
  uint64_t tag = 0;
  std::string_view what;
};

class Transport {
public:
  virtual ~Transport() = default;
  // Instruction `part` (its op's data, bytes, peer and tag). A send may
  // return before the peer receives: the message is copied out first.
  virtual Status send(const Part &part, const Op &op) = 0;
  virtual Status recv(const Part &part, const Op &op) = 0;
  // f32 sums, each element in group order (as one device would add them):
  // every member's `out` receives the sum of the members' `in` (`count`
  // elements; in == out allowed).
  virtual Status all_reduce(llvm::ArrayRef<Member> members, size_t count,
                            const Collective &call) = 0;
  // `in` holds `count` elements; the member at position m of the group
  // receives in `out` the sum of elements [m count / p, (m + 1) count / p).
  // In place when out == in + that chunk. With `blocks` (only where
  // strided() says so), `in` is [rows, p, run] and member m receives the sum
  // of column block m instead.
  virtual Status reduce_scatter(llvm::ArrayRef<Member> members, size_t count,
                                const Collective &call,
                                const plan::PieceLayout *blocks = nullptr) = 0;
  // Every member's `out` receives the members' `in` (`bytes` each) in group
  // order. In place when in == out + position * bytes. With `blocks` (only
  // where strided() says so), `out` is [rows, p, run] and member r's `in`
  // its column block r.
  virtual Status all_gather(llvm::ArrayRef<Member> members, size_t bytes, const Collective &call,
                            const plan::PieceLayout *blocks = nullptr) = 0;
  // Whether the collectives of `group` read and write column blocks in place
  // (copies on one GPU); else the core stages them contiguously.
  virtual bool strided(int group) const { return false; }
  // `in` holds p blocks of `block` bytes, block j for the member at position
  // j; `out` receives block j from the member at position j (its own too).
  virtual Status all_to_all(llvm::ArrayRef<Member> members, size_t block,
                            const Collective &call) = 0;
  // A device reached StartBucket for its bucket `index` (its buffers final):
  // the bucket is reduced beside the device's computation, once every member
  // has started it.
  virtual Status start_bucket(int device, uint32_t index, const Bucket &bucket,
                              size_t instruction) = 0;
  // Where one issuer runs every member of a bucket's group (one GPU, or one
  // GPU's member over NCCL), the reduction itself, once all have started.
  virtual Status reduce_bucket(llvm::ArrayRef<Part> members) { return Status::ok(); }
  // The device's later work waits until its bucket `index` is reduced.
  virtual Status wait_bucket(int device, uint32_t index, const Bucket &bucket,
                             size_t instruction) = 0;
  // ZeRO-3 prefetch: one member's all-gathers of a batch of parameters
  // (each: its shard at `member.in`, the whole at `member.out`, `bytes` a
  // shard; one group) as task `index` of the device's communication stream,
  // after its tasks before; wait_gather waits for it. Without a stream: the
  // gathers, at once.
  struct Gather {
    Member member;
    size_t bytes = 0;
    Collective call;
  };
  virtual Status start_gathers(llvm::ArrayRef<Gather> gathers, uint32_t index) {
    for (const Gather &g : gathers)
      RETURN_IF_ERROR(all_gather(llvm::ArrayRef<Member>(g.member), g.bytes, g.call));
    return Status::ok();
  }
  virtual Status wait_gather(int device, uint32_t index, size_t instruction) {
    return Status::ok();
  }
};

// Issues instructions of the devices one issuer runs.
class Issuer {
public:
  // `programs` and `backends` by plan device (null for devices run
  // elsewhere); `divisor` is what Scale divides by (micro-batches x replicas).
  Issuer(const PipelinePlan &plan, std::vector<DeviceProgram *> programs,
         std::vector<DeviceBackend *> backends, Transport &transport);

  // One instruction of one device, or a collective's instruction on the
  // members this issuer runs (in group order), or with `reduce` a bucket's
  // reduction on them. The caller says which instruction an error is of.
  Status issue(llvm::ArrayRef<Part> parts, bool reduce = false);

private:
  Status tensor_parallel(llvm::ArrayRef<Part> parts);
  Status all_gather_pieces(llvm::ArrayRef<Part> parts);
  Status reduce_scatter_pieces(llvm::ArrayRef<Part> parts);
  Status all_to_all(llvm::ArrayRef<Part> parts);
  Status group_collective(llvm::ArrayRef<Part> parts);
  Status reduce_scatter_accumulate(llvm::ArrayRef<Part> parts);
  Status gather_param(llvm::ArrayRef<Part> parts);
  Op &op(const Part &part) {
    return programs_[static_cast<size_t>(part.device)]->ops[part.instruction];
  }
  DeviceBackend &backend(int device) { return *backends_[static_cast<size_t>(device)]; }
  DeviceProgram &program(int device) { return *programs_[static_cast<size_t>(device)]; }
  std::byte *staging(int device) { return program(device).staging; }

  const PipelinePlan &plan_;
  std::vector<DeviceProgram *> programs_;
  std::vector<DeviceBackend *> backends_;
  Transport &transport_;
  float divisor_;
};

} // namespace strata::runtime::core
