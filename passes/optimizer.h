// Optimizers as graph ops: appends one training step's parameter update.
//
// append_optimizer adds, for a graph that already has gradients (from
// append_backward):
//  - a step counter: state tensor "optimizer.step" (i64 scalar, starts at 0,
//    incremented by every run); the learning rate of step t is computed in the
//    graph from it by the schedule (a LearningRate node);
//  - optional clipping of all gradients together by their global L2 norm;
//  - per parameter, its optimizer state as state tensors (SGD momentum buffer;
//    Adam/AdamW first and second moments), zero-initialized and named
//    "<parameter>.<state>" (e.g. "layer0.fc1.weight.adam_m");
//  - an update node per parameter (SgdUpdate or AdamUpdate) and a StateUpdate
//    for the parameter, each of its states and the step counter.
// The resulting graph run once is one optimizer step.
#pragma once

#include <string>
#include <string_view>

#include "graph/graph.h"
#include "passes/autodiff.h"

namespace strata::passes {

struct OptimizerSpec {
  enum class Kind { kSgd, kAdam, kAdamW };
  enum class Schedule { kConstant, kCosine };

  Kind kind = Kind::kSgd;
  double lr = 1e-3;
  // SGD: momentum (0 disables the buffer), Nesterov, weight decay added to the
  // gradient (L2). Adam: weight decay added to the gradient. AdamW: decoupled.
  double momentum = 0.0;
  bool nesterov = false;
  double weight_decay = 0.0; // parse_optimizer gives adamw torch's 0.01
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-8;
  // Learning-rate schedule: linear warm-up from 0 over `warmup_steps`, then
  // constant, or cosine decay to `min_lr` at `total_steps`.
  Schedule schedule = Schedule::kConstant;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;
  double min_lr = 0.0;
  // Clip gradients by global norm to at most this; 0 disables clipping.
  double clip_norm = 0.0;

  // "adamw:lr=0.0003,wd=0.1,beta1=0.9,beta2=0.95,eps=1e-8,warmup=100,schedule=cosine,total=1000,min_lr=0,clip=1"
  std::string to_string() const;
};

// Parses "NAME[:key=value,...]" where NAME is sgd, adam or adamw and keys are
// lr, momentum, nesterov (0/1), wd, beta1, beta2, eps, schedule (constant,
// cosine), warmup, total, min_lr, clip. Values are finite, with lr and eps
// > 0, momentum, wd, min_lr and clip >= 0, min_lr <= lr and the betas in
// [0, 1). An error names the bad key or value.
Result<OptimizerSpec> parse_optimizer(std::string_view text);

// Appends the optimizer step for `gradients` to `graph` (see the file comment).
// On error the graph is left unchanged.
Status append_optimizer(Graph &graph, llvm::ArrayRef<Gradient> gradients,
                        const OptimizerSpec &spec);

// Whether `op` belongs to the once-per-step part of a training step (the
// registry's OpDef::once_per_step: the optimizer ops, LearningRate,
// GlobalNormScale and its split form SumOfSquares + NormScale, SgdUpdate,
// AdamUpdate): micro-batching runs them, and everything computed from their
// outputs, once per step on the accumulated gradients.
bool is_step_op(std::string_view op);

} // namespace strata::passes
