// A small graph for tensor-parallel tests: a projection whose softmax, with
// compute priced slow, pays for moving the split from the projection's
// columns to its rows, so tensor-parallel plans of it hold TpAllToAll nodes.
// Shared by the CPU and CUDA pipeline tests.
#pragma once

#include "graph/builder.h"
#include "ops/registry.h"
#include "partitioner/cost/cluster.h"
#include "partitioner/compile_pipeline.h"

namespace strata::testing_graphs {

inline Graph projection_softmax() {
  GraphBuilder b("projection_softmax", ops::OpRegistry::global());
  TensorId x = b.input("x", DType::kF32, {16, 32});
  TensorId w1 = b.parameter("w1", DType::kF32, {32, 64},
                            Initializer{Initializer::Kind::kNormal, 0.0, 0.5, 1});
  TensorId w2 =
      b.parameter("w2", DType::kF32, {64, 8}, Initializer{Initializer::Kind::kNormal, 0.0, 0.5, 2});
  TensorId h = b.op1("MatMul", {x, w1}, {}, "proj");
  TensorId p = b.op1("Softmax", {h}, {{"axis", int64_t{1}}}, "softmax");
  b.output(b.op1("MatMul", {p, w2}, {}, "head"));
  return *std::move(b).finish();
}

// Tensor parallelism over `tp` devices whose compute is priced slow, so that
// the plan moves the split (TpAllToAll) to split the softmax.
inline partitioner::PipelineCompileOptions slow_compute_tensor_parallel(int tp) {
  partitioner::PipelineCompileOptions pipeline;
  pipeline.tensor_parallel = tp;
  partitioner::ClusterSpec cluster = partitioner::default_cpu_cluster(tp);
  cluster.device.peak_flops.f32 = 1e6;
  pipeline.cluster = cluster;
  return pipeline;
}

} // namespace strata::testing_graphs
