// The meaning of a plan's programs, checked against its graph: what the
// loader (serialization/plan_io.h) cannot see field by field. A plan that
// passes computes the step its graph describes; one that was edited or
// corrupted (an instruction removed, duplicated or moved, a flipped index or
// offset, a field that contradicts the programs) is refused before it trains
// anything. The compiler verifies every plan it writes, and every runner and
// the CLI verify every plan they read.
//
// A pipeline plan's rules are those of its lowering (partitioner/lowering/
// pipeline.h). Device d runs stage (d / TP) / DP of the mesh, in replica
// (d / TP) mod DP and member d mod TP; its stage's nodes are those whose
// pipeline.node_stage is that stage modulo the stages. Per device:
//  - coverage: every node of the stage is computed exactly once per
//    micro-batch 0..M-1 if it runs per micro-batch (plan::analyze_phases), or
//    exactly once (Compute or ComputeShard) if it is once-per-step work, and
//    no other node is computed; the micro-batches the programs compute are
//    pipeline.microbatches. Recomputation adds clones, which are nodes of
//    their own, so nothing is computed twice;
//  - dataflow: every buffer (tensor, micro-batch) an instruction reads was
//    written earlier on the device (by a Compute, a Recv or an Accumulate);
//    with one micro-batch the step buffer of an accumulated tensor is its
//    micro-batch 0 buffer. Parameters, state and constants a node reads are
//    held by the device, and no node reads one after its update. Graph inputs
//    are read per micro-batch;
//  - the step: each accumulated tensor the device computes (plan/phases.h) is
//    accumulated once per micro-batch, micro-batch 0 first (with M > 1),
//    summed over the device's replicas exactly once after that (all-reduce,
//    reduce-scatter or a gradient bucket, with DP > 1), then scaled exactly
//    once (with M x DP > 1), before anything reads it once per step; or, with
//    ZeRO-2, reduce-scattered into its shard once per micro-batch, micro-batch
//    0 first (even with M = 1), and nothing else (then its step buffer holds
//    only the shard and what was reduce-scattered is not read again), before
//    it is scaled once; a reduce-scattered tensor and a compute-shard's result
//    are read only on shards until gathered or summed; collectives run over
//    the device's replicas (the same stage and member);
//  - updates: every state update whose target the device holds is applied
//    exactly once, none other;
//  - memory: every slot lies inside the arena, and buffers live at the same
//    time do not share bytes (a ZeRO-2 shard's step buffer has 1/DP of its
//    tensor's bytes: serialization::slot_bytes).
// Across devices: every Send(tensor, mb) to a peer has exactly one matching
// Recv(tensor, mb) from the sender on the peer and vice versa, between
// devices of one replica and member, from the stage that computes the tensor.
// Plan fields: a pipeline plan trains; ZeRO-1 and ZeRO-2 need data
// parallelism, ZeRO-1 shards some state, ZeRO-2 reduce-scatters some gradient
// into its shard every micro-batch (and only ZeRO-2 does); sharded state needs
// ZeRO-1 or 2; a training plan's loss_kind is the loss its graph
// computes (softmax_cross_entropy reads the graph input "labels", mse
// "targets", as make_training builds them).
//
// Not checked: the embedded graph against the plan's fingerprints (they hash
// the source model, which the plan does not hold), values of weights, and the
// order of instructions beyond what the rules above need (deadlocks are
// plan::check_deadlock's).
#pragma once

#include "graph/status.h"
#include "serialization/plan_io.h"

namespace strata::plan {

// Errors name the field, or the device ("device 1 (stage 1)"), the
// instruction ("instruction 17 (compute 'fc2' (MatMul) mb 3)") and the
// tensor, node or update at fault.
Status verify_plan(const serialization::Plan &plan);

} // namespace strata::plan
