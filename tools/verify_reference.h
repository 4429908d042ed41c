// What `strata verify` checks a training plan against: the plan's one-device
// reference, and how close the two must stay.
//
// The reference is one device running the same training step with the same
// micro-batches: every step, the M x DP micro-batches the plan's devices share
// (M per replica, DP replicas) run one after another on one device and their
// gradients accumulate in that order, then the optimizer steps once. That is
// the run strata promises bitwise equality with for every pipeline depth and
// schedule (docs/architecture.md, "Invariants"); a full-batch run differs from
// it only in the order of the batch's sums. It is a one-stage pipeline plan
// (a PipelineRunner with one device thread runs it), trained on the plan's
// batches.
//
// It is built one of two ways:
//  - from the plan's own training graph (reference_from_plan), which a plan
//    without tensor parallelism embeds whole (at micro-batch size, every
//    parameter whole): the graph is lowered again for one device. This checks
//    what the plan adds to its graph (stages, schedule, replicas, ZeRO-1 and 2,
//    buckets) and how the runtime runs it, but not the graph itself: an edit
//    to the embedded graph is in the reference too;
//  - from the model the plan was compiled from (reference_from_model): the
//    model is compiled again for one device with the plan's loss, optimizer
//    and micro-batches, after checking that the model and those options are
//    what the plan's fingerprints say. This also checks the embedded graph,
//    and it is the only way for a tensor-parallel plan, whose graph is one
//    member's share of the model.
#pragma once

#include <string>

#include "graph/graph.h"
#include "serialization/plan_io.h"

namespace strata::tools {

// The one-device reference of training plan `plan` (read from `path`, named
// in errors), lowered from its own training graph. Errors: a
// tensor-parallel plan (its reference needs the model).
Result<serialization::Plan> reference_from_plan(const serialization::Plan &plan,
                                                const std::string &path);

// The one-device reference of `plan` compiled from `forward`, the model read
// from `model_path`. Errors name both files: a model whose fingerprint is not
// the plan's model fingerprint, or a plan whose fingerprint does not cover
// the model with the plan's loss and optimizer (an edited plan, or one
// compiled with a --loss-input that is neither an output of the model nor
// what the plan's loss reads).
Result<serialization::Plan> reference_from_model(const serialization::Plan &plan,
                                                 const std::string &path, const Graph &forward,
                                                 const std::string &model_path);

// How close a plan's run must stay to its reference's when the user gives no
// tolerance: 0 (bitwise) where strata promises the same bits (one device, or
// a pipeline of any depth and schedule without replicas or tensor
// parallelism), else a relative bound on the difference, 1e-5, or 2e-3 under
// Adam and AdamW, which turn rounding noise in gradients that are exactly
// zero (a bias that softmax ignores) into steps of about the learning rate.
struct Tolerance {
  double value = 0;
  std::string why; // for the `tolerance` line: why these bits, or what reorders the sums
};
Tolerance default_tolerance(const serialization::Plan &plan);

} // namespace strata::tools
