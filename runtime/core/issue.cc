#include "runtime/core/issue.h"

namespace strata::runtime::core {

using serialization::InstrKind;

Issuer::Issuer(const PipelinePlan &plan, std::vector<DeviceProgram *> programs,
               std::vector<DeviceBackend *> backends, Transport &transport)
    : plan_(plan), programs_(std::move(programs)), backends_(std::move(backends)),
      transport_(transport), divisor_(static_cast<float>(plan.slices())) {}

Status Issuer::issue(llvm::ArrayRef<Part> parts, bool reduce) {
  const Part &lead = parts[0];
  Op &first = op(lead);
  Status status = Status::ok();
  if (reduce) return transport_.reduce_bucket(parts);
  DeviceBackend &device = backend(lead.device);
  switch (first.kind) {
  case InstrKind::kCompute:
  case InstrKind::kComputeShard:
    status = first.collective == ops::Collective::kNone ? device.run_node(lead.instruction)
                                                        : tensor_parallel(parts);
    break;
  case InstrKind::kSend: status = transport_.send(lead, first); break;
  case InstrKind::kRecv: status = transport_.recv(lead, first); break;
  case InstrKind::kAccumulate:
    status = first.first ? device.copy(first.data, first.source, first.bytes)
                         : device.accumulate(reinterpret_cast<float *>(first.data),
                                             reinterpret_cast<const float *>(first.source),
                                             first.bytes / sizeof(float));
    break;
  case InstrKind::kScale:
    status =
        device.divide(reinterpret_cast<float *>(first.data), divisor_, first.bytes / sizeof(float));
    break;
  case InstrKind::kUpdate: status = device.update(lead.instruction); break;
  case InstrKind::kAllReduce:
  case InstrKind::kReduceScatter:
  case InstrKind::kAllGather: status = group_collective(parts); break;
  case InstrKind::kReduceScatterAccumulate: status = reduce_scatter_accumulate(parts); break;
  case InstrKind::kGatherParam:
  case InstrKind::kStartGather: status = gather_param(parts); break;
  case InstrKind::kWaitGather:
    status = transport_.wait_gather(lead.device, first.bucket, lead.instruction);
    break;
  case InstrKind::kStartBucket:
    status = transport_.start_bucket(lead.device, first.bucket,
                                     program(lead.device).buckets[first.bucket], lead.instruction);
    break;
  case InstrKind::kWaitBucket:
    status = transport_.wait_bucket(lead.device, first.bucket,
                                    program(lead.device).buckets[first.bucket], lead.instruction);
    break;
  }
  return status;
}

// AllReduce, ReduceScatter (also ZeRO-2's, of a micro-batch's buffer) and
// AllGather of a buffer, in place: the shard of the device at position r of
// the group is its r-th chunk.
Status Issuer::group_collective(llvm::ArrayRef<Part> parts) {
  const Op &first = op(parts[0]);
  const size_t count = first.bytes / sizeof(float);
  const size_t p = plan_.group(first.group).size(), chunk = count / p;
  std::vector<Member> members;
  for (const Part &part : parts) {
    Op &o = op(part);
    auto *full = reinterpret_cast<float *>(o.data);
    float *mine = full + chunk * o.position;
    switch (o.kind) {
    case InstrKind::kAllReduce:
      members.push_back({part.device, part.instruction, full, full});
      break;
    case InstrKind::kReduceScatter:
    case InstrKind::kReduceScatterAccumulate:
      members.push_back({part.device, part.instruction, full, mine});
      break;
    default: members.push_back({part.device, part.instruction, mine, full}); break;
    }
  }
  const Collective call{first.group, plan_.algorithm(first.group), first.tag, first.what};
  switch (first.kind) {
  case InstrKind::kAllReduce: return transport_.all_reduce(members, count, call);
  case InstrKind::kReduceScatter:
  case InstrKind::kReduceScatterAccumulate: return transport_.reduce_scatter(members, count, call);
  default: return transport_.all_gather(members, chunk * sizeof(float), call);
  }
}

// ZeRO-2: a micro-batch's buffer reduce-scattered in place (as ReduceScatter:
// the shard of the device at position r is its r-th chunk), then each
// member's shard copied (micro-batch 0) or added into its step buffer, which
// holds only that shard.
Status Issuer::reduce_scatter_accumulate(llvm::ArrayRef<Part> parts) {
  RETURN_IF_ERROR(group_collective(parts));
  const Op &first = op(parts[0]);
  const size_t chunk = first.bytes / sizeof(float) / plan_.group(first.group).size();
  for (const Part &part : parts) {
    const Op &o = op(part);
    const float *mine = reinterpret_cast<const float *>(o.data) + chunk * o.position;
    auto *sum = reinterpret_cast<float *>(o.sum);
    DeviceBackend &device = backend(part.device);
    RETURN_IF_ERROR(o.first ? device.copy(sum, mine, chunk * sizeof(float))
                            : device.accumulate(sum, mine, chunk));
  }
  return Status::ok();
}

// ZeRO-3: each member's held shard copied into its chunk of the block's
// buffer (position r: bytes [r b/p, (r+1) b/p)), then all-gathered in place.
Status Issuer::gather_param(llvm::ArrayRef<Part> parts) {
  const Op &first = op(parts[0]);
  const size_t p = plan_.group(first.group).size();
  // Prefetch: each member hands the batch its StartGather leads to its
  // communication stream (the batch's other StartGathers do nothing).
  if (first.kind == InstrKind::kStartGather) {
    for (const Part &part : parts) {
      std::vector<Transport::Gather> batch;
      for (uint32_t k = 0; k < op(part).batch; ++k) {
        const Op &o = program(part.device).ops[part.instruction + k];
        const size_t chunk = o.bytes / p;
        std::byte *mine = o.data + chunk * o.position;
        if (chunk > 0) RETURN_IF_ERROR(backend(part.device).copy(mine, o.source, chunk));
        batch.push_back({{part.device, part.instruction + k, mine, o.data},
                         chunk,
                         {o.group, plan_.algorithm(o.group), o.tag, o.what}});
      }
      if (!batch.empty()) RETURN_IF_ERROR(transport_.start_gathers(batch, op(part).bucket));
    }
    return Status::ok();
  }
  const size_t chunk = first.bytes / p;
  std::vector<Member> members;
  for (const Part &part : parts) {
    Op &o = op(part);
    std::byte *mine = o.data + chunk * o.position;
    if (chunk > 0) RETURN_IF_ERROR(backend(part.device).copy(mine, o.source, chunk));
    members.push_back({part.device, part.instruction, mine, o.data});
  }
  const Collective call{first.group, plan_.algorithm(first.group), first.tag, first.what};
  return transport_.all_gather(members, chunk, call);
}

Status Issuer::tensor_parallel(llvm::ArrayRef<Part> parts) {
  const Op &first = op(parts[0]);
  const Collective call{first.group, std::nullopt, first.tag, first.what};
  switch (first.collective) {
  case ops::Collective::kNone: break;
  case ops::Collective::kCopy: // identity forward; the gradient is all-reduced
    return backend(parts[0].device)
        .copy(first.outputs[0].data, first.inputs[0].data,
              static_cast<size_t>(first.inputs[0].type->size_bytes()));
  case ops::Collective::kSplit: { // this member's column block of every row
    const size_t run = first.piece.run;
    return backend(parts[0].device)
        .copy_rows(first.outputs[0].data, run,
                   static_cast<const std::byte *>(first.inputs[0].data) +
                       static_cast<size_t>(first.member) * run,
                   static_cast<size_t>(first.parts) * run, run, first.piece.rows);
  }
  case ops::Collective::kAllReduce: {
    std::vector<Member> members;
    for (const Part &part : parts)
      members.push_back(
          {part.device, part.instruction, op(part).inputs[0].data, op(part).outputs[0].data});
    return transport_.all_reduce(members, static_cast<size_t>(first.inputs[0].type->num_elements()),
                                 call);
  }
  case ops::Collective::kAllGather: return all_gather_pieces(parts);
  case ops::Collective::kReduceScatter: return reduce_scatter_pieces(parts);
  case ops::Collective::kAllToAll: return all_to_all(parts);
  }
  return internal_error("not a tensor-parallel node");
}

// Member r's piece is column block r of every row of the output: where the
// transport cannot place blocks itself, the pieces are gathered one after
// another, then each row interleaves them (where a piece is one row, the
// gathered pieces are the output).
Status Issuer::all_gather_pieces(llvm::ArrayRef<Part> parts) {
  const Op &first = op(parts[0]);
  const size_t bytes = static_cast<size_t>(first.inputs[0].type->size_bytes());
  const size_t p = static_cast<size_t>(first.parts), rows = first.piece.rows, run = first.piece.run;
  const Collective call{first.group, std::nullopt, first.tag, first.what};
  const bool staged = rows > 1 && !transport_.strided(first.group);
  std::vector<Member> members;
  for (const Part &part : parts)
    members.push_back({part.device, part.instruction, op(part).inputs[0].data,
                       staged ? staging(part.device) : op(part).outputs[0].data});
  RETURN_IF_ERROR(
      transport_.all_gather(members, bytes, call, rows > 1 && !staged ? &first.piece : nullptr));
  if (!staged) return Status::ok();
  for (const Part &part : parts) {
    auto *out = static_cast<std::byte *>(op(part).outputs[0].data);
    for (size_t r = 0; r < p; ++r)
      RETURN_IF_ERROR(
          backend(part.device)
              .copy_rows(out + r * run, p * run, staging(part.device) + r * bytes, run, run, rows));
  }
  return Status::ok();
}

// Member m gets the sum of column block m: where the transport cannot read
// blocks itself, each member's blocks are laid out one after another first
// (where a block is one row, they already are).
Status Issuer::reduce_scatter_pieces(llvm::ArrayRef<Part> parts) {
  const Op &first = op(parts[0]);
  const size_t count = static_cast<size_t>(first.inputs[0].type->num_elements());
  const size_t p = static_cast<size_t>(first.parts), rows = first.piece.rows, run = first.piece.run,
               piece = rows * run;
  const Collective call{first.group, std::nullopt, first.tag, first.what};
  const bool staged = rows > 1 && !transport_.strided(first.group);
  std::vector<Member> members;
  for (const Part &part : parts) {
    const auto *in = static_cast<const std::byte *>(op(part).inputs[0].data);
    if (!staged) {
      members.push_back({part.device, part.instruction, in, op(part).outputs[0].data});
      continue;
    }
    for (size_t r = 0; r < p; ++r)
      RETURN_IF_ERROR(
          backend(part.device)
              .copy_rows(staging(part.device) + r * piece, run, in + r * run, p * run, run, rows));
    members.push_back(
        {part.device, part.instruction, staging(part.device), op(part).outputs[0].data});
  }
  return transport_.reduce_scatter(members, count, call,
                                   rows > 1 && !staged ? &first.piece : nullptr);
}

// Block j of a member's input (cut along `axis`) goes to member j; member
// j's block for this one is piece j of the output (along `from_axis`).
Status Issuer::all_to_all(llvm::ArrayRef<Part> parts) {
  const Op &first = op(parts[0]);
  const plan::AllToAllLayout &layout = first.all_to_all;
  const size_t p = static_cast<size_t>(first.parts), block = layout.block;
  const Collective call{first.group, std::nullopt, first.tag, first.what};
  std::vector<Member> members;
  for (const Part &part : parts) {
    const auto *in = static_cast<const std::byte *>(op(part).inputs[0].data);
    std::byte *outgoing = staging(part.device);
    for (size_t j = 0; j < p; ++j)
      RETURN_IF_ERROR(backend(part.device)
                          .copy_rows(outgoing + j * block, layout.cut.run, in + j * layout.cut.run,
                                     p * layout.cut.run, layout.cut.run, layout.cut.rows));
    members.push_back({part.device, part.instruction, outgoing, outgoing + p * block});
  }
  RETURN_IF_ERROR(transport_.all_to_all(members, block, call));
  for (const Part &part : parts) {
    auto *out = static_cast<std::byte *>(op(part).outputs[0].data);
    const std::byte *incoming = staging(part.device) + p * block;
    for (size_t j = 0; j < p; ++j)
      RETURN_IF_ERROR(backend(part.device)
                          .copy_rows(out + j * layout.place.run, p * layout.place.run,
                                     incoming + j * block, layout.place.run, layout.place.run,
                                     layout.place.rows));
  }
  return Status::ok();
}

} // namespace strata::runtime::core
