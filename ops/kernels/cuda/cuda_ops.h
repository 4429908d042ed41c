// The CUDA backend's op table: for each op it runs, the host function that
// checks the node and enqueues its work (cuBLASLt for MatMul and Gemm,
// strata's kernels in launch.h for the rest).
//
// A CUDA op only enqueues on the context's stream: no allocation, no
// synchronization, no host read of device data. Whatever it needs beyond its
// inputs and outputs it declares up front (scratch bytes), so the executor
// reserves it with the arena and a whole step can be captured into a CUDA
// Graph. Errors found on the device (a label or index out of range) raise the
// node's flag, which the executor reads after the step.
//
// How the ops run:
//  - MatMul and Gemm: cuBLASLt, f32 compute (TF32 only with --tf32).
//    cuBLASLt is column-major, so a row-major product is computed as
//    D^T = B^T A^T. A batched MatMul is one tall product when B is shared,
//    else strided calls over blocks of the batch (one call when both operands
//    step evenly; ops::strided_batch_blocks), one plan kept per node.
//  - Convolutions: cuDNN (cudnn_ops.cc), deterministic algorithms only, FMA
//    math unless --tf32.
//  - Pooling and batch norm: cuDNN where it computes the node as strata
//    defines it (ops/window.h), else, and with --pool-norm strata, strata's
//    kernels, which follow the CPU's window clipping and accumulation order
//    element for element. cuDNN's batch statistics are f32 sums: the two
//    agree within rounding, not bitwise.
//  - Everything else: strata's kernels (launch.h), including the optimizer
//    updates and the learning-rate schedule, which reads the step counter on
//    the device so a replayed step sees the new step. Concat and Split are
//    2-D copies, reshapes plain copies; a node without inputs (Constant) is
//    computed once on the CPU at load and copied into place each step.
// Ops on f16 or bf16 tensors (other than byte moves) and ops missing here make
// a runner's create() fail, naming every missing op and its nodes
// (check_cuda_ops); `strata ops --backend cuda` lists what runs.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <memory>
#include <optional>
#include <string>

#include <string_view>
#include <vector>

#include "ops/kernels/cuda/launch.h"
#include "ops/registry.h"

namespace strata::cuda {

struct CudaKernelContext {
  const Node &node;
  const ops::OpDef &def;
  llvm::ArrayRef<ops::ConstTensorView> inputs; // device pointers
  llvm::ArrayRef<ops::TensorView> outputs;     // device pointers
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void *workspace = nullptr; // cuBLASLt's, shared by every node
  size_t workspace_bytes = 0;
  void *scratch = nullptr; // this node's, scratch_bytes of it (its ScratchFn's or more)
  int *flag = nullptr;     // this node's device error flag (0: fine)
  bool tf32 = false;       // f32 GEMMs and convolutions may use TF32 tensor cores
  void *cudnn = nullptr;   // the cudnnHandle_t, bound to `stream` (null without cuDNN)
  // This node's slot for what it plans once (cuBLASLt and cuDNN descriptors
  // and algorithms), kept by the executor for the executor's life; null: plan
  // every time.
  std::shared_ptr<void> *cache = nullptr;
  // Mixed precision (--precision bf16 or f16): non-null, MatMul and Gemm
  // round their operands to half precision here (half_staging_bytes of it)
  // and multiply them on the tensor cores, accumulating and writing f32;
  // everything else stays f32. bf16, or with `f16` f16 operands, each scaled
  // by its own power of two into f16's range (launch.h's to_f16_scaled).
  void *half = nullptr;
  bool f16 = false;
  // In a tensor-parallel group of `group` devices, this device's position:
  // ops on its piece of a split tensor (Gather of a vocabulary-parallel
  // table, the vocabulary-parallel loss) need it. 0 of 1 elsewhere.
  int member = 0, group = 1;
  // Pooling and batch norm run through cuDNN when `cudnn` is set and cuDNN
  // computes the node as strata defines it (ops/window.h's cudnn_pool_mismatch
  // and cudnn_batch_norm_mismatch); false, or where it does not: strata's own
  // kernels, which follow the CPU's element for element.
  bool cudnn_pool_norm = true;
  int64_t scratch_bytes = 0;
  ops::AttrReader attrs() const { return ops::AttrReader(node, def); }
};

// A shape as the kernels take it (at most kMaxDims dims), and the strides that
// read `operand` broadcast to it (NumPy rules).
Result<Dims> shape_dims(llvm::ArrayRef<int64_t> shape);
Dims operand_strides(llvm::ArrayRef<int64_t> operand, const Dims &shape);

// The step of a fused elementwise chain (launch.h's Fused) that computes
// `node`, an op passes::fusable_elementwise accepts; the caller sets its
// operands. An error for any other op.
Result<FusedStep> fused_step(const Node &node, const ops::OpDef &def);

// What a node needs in CudaKernelContext::half under --precision bf16 or f16
// (0 for ops that stay f32): both operands in half precision and, for f16,
// their scales. One region serves every node of a stream.
int64_t half_staging_bytes(const Node &node, llvm::ArrayRef<TensorType> inputs);

using CudaKernelFn = Status (*)(const CudaKernelContext &context);
// Device scratch a node needs besides its outputs, from its input types.
using ScratchFn = int64_t (*)(const Node &node, const ops::OpDef &def,
                              llvm::ArrayRef<TensorType> inputs);

struct CudaOp {
  std::string_view name;
  CudaKernelFn kernel = nullptr;
  ScratchFn scratch = nullptr; // nullptr: none
  // What flag != 0 after a run means, for the error naming the node.
  std::string_view flag_meaning;
  // Its step in a fused elementwise chain (fused_step): set for exactly the
  // ops the registry marks ops::Elementwise::kFusable.
  std::optional<FusedStep> fused = std::nullopt;
};

// The CUDA op for `op`, or nullptr when the CUDA backend does not run it.
const CudaOp *find_cuda_op(std::string_view op);
// Every op the CUDA backend runs, sorted by name.
std::vector<std::string_view> cuda_op_names();

// The ops that need cuDNN (convolutions; none in a build without it).
std::vector<CudaOp> cudnn_ops();
// A cuDNN handle bound to `stream`, or why there is none: failed_precondition
// without cuDNN in the build, else cuDNN's reason as cuda_status.h maps it
// (out of memory, cuDNN unusable on this machine). destroy_cudnn(null) does
// nothing.
Result<void *> start_cudnn(cudaStream_t stream);
void destroy_cudnn(void *handle);

// The ops that take cuDNN when there is a handle and it fits the node
// (pooling and batch norm), else strata's kernels; none without cuDNN.
std::vector<std::string_view> cudnn_preferred_ops();

// Pooling and batch norm through cuDNN's descriptor API, for nodes the
// mismatch functions accept (descriptors kept in the context's cache). Max
// pooling's gradient recomputes Y into the node's scratch (cuDNN needs it;
// the graph passes only dY and X). Without cuDNN in the build: an error.
Status cudnn_pool(const CudaKernelContext &context, bool max, const Window &window);
Status cudnn_pool_grad(const CudaKernelContext &context, bool max, const Window &window);
// BatchNormalization(X, scale, B, mean, var) -> Y (training: batch
// statistics) and BatchNormalizationGrad(dY, X, scale) -> dX, dScale, dB, X
// taken as [batch, channels, inner, 1].
Status cudnn_batch_norm(const CudaKernelContext &context, int64_t batch, int64_t channels,
                        int64_t inner, double epsilon, bool training);
Status cudnn_batch_norm_grad(const CudaKernelContext &context, int64_t batch, int64_t channels,
                             int64_t inner, double epsilon);

// What an op with dtype `dtype` on input `index` lacks, or ok: the kernels are
// f32 (integers for indices and labels, any dtype for pure data movement).
Status expect_f32(const CudaKernelContext &context, std::initializer_list<size_t> inputs);

} // namespace strata::cuda
