// The CUDA backend's op table and strata's own CUDA kernels, run on the CUDA
// emulator (tests/cuda_emulator) against the CPU kernels: no GPU needed. Every
// op case of cuda_op_cases.h runs through the real op function (attributes,
// shapes and strides to launches, scratch, flags) and the real kernel code,
// or the emulated cuBLASLt and cuDNN calls it makes.
//
// Each buffer is guarded on both sides; outputs start as a pattern no op
// writes, so an element left unwritten shows; inputs must come back as they
// went in. The emulator rounds device math as glibc does, so transcendental
// ops agree more closely here than on a GPU; the tolerances are the GPU test's.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "graph/host_tensor.h"
#include "ops/kernels/cuda/cuda_ops.h"
#include "ops/kernels/cuda/cuda_status.h"
#include "ops/registry.h"
#include "runtime/cpu/executor.h"
#include "strata_config.h"
#include "tests/cuda_emulator/cuda_emulator.h"
#include "tests/cuda_emulator/self_test_kernels.h"
#include "tests/ops/cuda_op_cases.h"

namespace strata::test {
namespace {

constexpr size_t kGuard = 256; // a multiple of the alignment
constexpr unsigned char kGuardByte = 0xA5;
constexpr unsigned char kUnwritten = 0x7F; // f32 3.4e38 everywhere

// A buffer of emulated device memory (host memory the emulator knows as the
// GPU's), with guard bytes on both sides. The test reads and writes it
// directly, between synchronized runs.
class Guarded {
public:
  Guarded(size_t bytes, unsigned char fill) : bytes_(bytes) {
    EXPECT_EQ(cudaMalloc(&memory_, bytes + 2 * kGuard), cudaSuccess);
    std::memset(memory_, kGuardByte, bytes + 2 * kGuard);
    std::memset(data(), fill, bytes);
  }
  ~Guarded() { cudaFree(memory_); }
  Guarded(Guarded &&other) noexcept : bytes_(other.bytes_), memory_(other.memory_) {
    other.memory_ = nullptr;
  }
  Guarded(const Guarded &) = delete;
  Guarded &operator=(const Guarded &) = delete;
  Guarded &operator=(Guarded &&) = delete;
  // 256-byte aligned, as the executor's regions are.
  unsigned char *data() { return static_cast<unsigned char *>(memory_) + kGuard; }
  // The first guard byte that changed, or "".
  std::string check(const std::string &what) {
    const auto *base = static_cast<const unsigned char *>(memory_);
    for (size_t i = 0; i < kGuard; ++i)
      if (base[i] != kGuardByte) return what + ": a byte before it changed; ";
    for (size_t i = 0; i < kGuard; ++i)
      if (base[kGuard + bytes_ + i] != kGuardByte)
        return what + ": byte " + std::to_string(i) + " past its end changed; ";
    return "";
  }

private:
  size_t bytes_;
  void *memory_ = nullptr;
};

// What the executor gives every node: cuBLASLt, cuDNN and their workspace.
struct Libraries {
  Libraries() {
    EXPECT_EQ(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
    Result<void *> handle = cuda::start_cudnn(nullptr);
    if (handle.is_ok()) cudnn = *handle;
    EXPECT_TRUE(handle.is_ok() || !STRATA_HAVE_CUDNN) << handle.status().message();
    EXPECT_EQ(cudaMalloc(&workspace, kWorkspace), cudaSuccess);
  }
  ~Libraries() {
    cublasLtDestroy(lt);
    cuda::destroy_cudnn(cudnn);
    cudaFree(workspace);
  }
  static constexpr size_t kWorkspace = 1 << 20;
  cublasLtHandle_t lt = nullptr;
  void *cudnn = nullptr;
  void *workspace = nullptr;
};

struct EmulatedRun {
  std::vector<HostTensor> outputs;
  int flag = 0;
  std::string error; // a failed call, a guard or an input that changed
};

// `c`'s node through its CUDA op function on the emulator.
EmulatedRun run_emulated(const Graph &graph, const std::vector<HostTensor> &inputs,
                         const cuda::CudaOp &op, std::shared_ptr<void> *cache,
                         const Libraries &libraries, bool cudnn_pool_norm) {
  const Node &node = graph.node(0);
  const ops::OpDef &def = *ops::OpRegistry::global().find(node.op);
  EmulatedRun run;
  std::vector<Guarded> in, out;
  std::vector<ops::ConstTensorView> in_views;
  std::vector<ops::TensorView> out_views;
  std::vector<TensorType> in_types;
  for (size_t k = 0; k < node.inputs.size(); ++k) {
    in.emplace_back(inputs[k].size_bytes(), 0);
    std::memcpy(in.back().data(), inputs[k].data(), inputs[k].size_bytes());
    in_types.push_back(graph.tensor(node.inputs[k]).type);
  }
  for (size_t k = 0; k < node.inputs.size(); ++k)
    in_views.push_back({in[k].data(), &graph.tensor(node.inputs[k]).type});
  for (TensorId id : node.outputs)
    out.emplace_back(static_cast<size_t>(graph.tensor(id).type.size_bytes()), kUnwritten);
  for (size_t k = 0; k < node.outputs.size(); ++k)
    out_views.push_back({out[k].data(), &graph.tensor(node.outputs[k]).type});
  const int64_t scratch_bytes = op.scratch ? op.scratch(node, def, in_types) : 0;
  Guarded scratch(static_cast<size_t>(scratch_bytes), 0xCD);
  Guarded flag(sizeof(int), 0);
  cuda::CudaKernelContext context{node, def, in_views, out_views};
  context.scratch = scratch_bytes > 0 ? scratch.data() : nullptr;
  context.scratch_bytes = scratch_bytes;
  context.flag = reinterpret_cast<int *>(flag.data());
  context.cache = cache;
  context.lt = libraries.lt;
  context.workspace = libraries.workspace;
  context.workspace_bytes = Libraries::kWorkspace;
  context.cudnn = libraries.cudnn;
  context.cudnn_pool_norm = cudnn_pool_norm;
  Status status = op.kernel(context);
  if (status.is_ok() && cudaDeviceSynchronize() != cudaSuccess)
    status = internal_error("the device failed");
  if (!status.is_ok()) {
    run.error = status.message() + " (" + cuda_emulator::last_error_message() + ")";
    return run;
  }
  if (cudaGetLastError() != cudaSuccess) {
    run.error = "a launch failed: " + cuda_emulator::last_error_message();
    return run;
  }
  std::memcpy(&run.flag, flag.data(), sizeof(int));
  for (size_t k = 0; k < in.size(); ++k) {
    run.error += in[k].check("input " + std::to_string(k));
    if (std::memcmp(in[k].data(), inputs[k].data(), inputs[k].size_bytes()) != 0)
      run.error += "input " + std::to_string(k) + " changed; ";
  }
  for (size_t k = 0; k < out.size(); ++k) {
    run.error += out[k].check("output " + std::to_string(k));
    HostTensor t = HostTensor::zeros(graph.tensor(node.outputs[k]).type);
    std::memcpy(t.data(), out[k].data(), t.size_bytes());
    run.outputs.push_back(std::move(t));
  }
  run.error += scratch.check("the scratch") + flag.check("the flag");
  return run;
}

std::vector<HostTensor> inputs_for(const OpCase &c, const Graph &graph) {
  std::vector<HostTensor> inputs = runtime::random_inputs(graph, 7);
  if (c.positive)
    for (HostTensor &t : inputs)
      if (t.type.dtype == DType::kF32)
        for (int64_t i = 0; i < t.type.num_elements(); ++i)
          t.as<float>()[i] = std::fabs(t.as<float>()[i]) + 0.1f;
  return inputs;
}

std::vector<HostTensor> run_cpu(const Graph &graph, const std::vector<HostTensor> &inputs) {
  const Node &node = graph.node(0);
  const ops::OpDef &def = *ops::OpRegistry::global().find(node.op);
  std::vector<ops::ConstTensorView> in;
  std::vector<ops::TensorView> out;
  std::vector<HostTensor> outputs;
  for (size_t k = 0; k < node.inputs.size(); ++k)
    in.push_back({inputs[k].data(), &graph.tensor(node.inputs[k]).type});
  for (TensorId id : node.outputs)
    outputs.push_back(HostTensor::zeros(graph.tensor(id).type));
  for (size_t k = 0; k < outputs.size(); ++k)
    out.push_back({outputs[k].data(), &graph.tensor(node.outputs[k]).type});
  Status status = def.cpu_kernel(ops::KernelContext{node, def, in, out});
  EXPECT_TRUE(status.is_ok()) << status.message();
  return outputs;
}

// The emulator runs threads as CUDA would, and refuses what CUDA would not
// run, before the op tests below rely on it.
TEST(CudaEmulator, BlocksSumThroughSharedMemoryAndShuffles) {
  std::vector<float> x(3 * 256);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(i % 97);
  std::vector<float> sums(3, -1.0f);
  ASSERT_EQ(cuda_emulator::self_test::block_sums(x.data(), sums.data(), 3), cudaSuccess)
      << cuda_emulator::last_error_message();
  for (int b = 0; b < 3; ++b) {
    float expected = 0;
    for (int i = 0; i < 256; ++i)
      expected += x[b * 256 + i];
    EXPECT_EQ(sums[b], expected) << "block " << b;
  }
}

TEST(CudaEmulator, ThreadsAndBlocksSeeTheirCoordinates) {
  const dim3 grid(3, 2, 2), block(4, 3, 2);
  std::vector<int> out(3 * 2 * 2 * 4 * 3 * 2, -1);
  ASSERT_EQ(cuda_emulator::self_test::coordinates(out.data(), grid, block), cudaSuccess);
  size_t i = 0;
  for (unsigned bz = 0; bz < 2; ++bz)
    for (unsigned by = 0; by < 2; ++by)
      for (unsigned bx = 0; bx < 3; ++bx)
        for (unsigned tz = 0; tz < 2; ++tz)
          for (unsigned ty = 0; ty < 3; ++ty)
            for (unsigned tx = 0; tx < 4; ++tx)
              EXPECT_EQ(out[i++], static_cast<int>(tx + 1000 * ty + 100000 * tz +
                                                   10000000 * (bx + 10 * by + 100 * bz)));
}

TEST(CudaEmulator, RefusesWhatCudaWouldNotRun) {
  std::vector<int> out(2048, 0);
  // A kernel that faults on a GPU faults every later call, until reset.
  EXPECT_EQ(cuda_emulator::self_test::divergent_barrier(out.data()), cudaErrorLaunchFailure);
  EXPECT_NE(cuda_emulator::last_error_message().find("28 of its 128 threads finished while the "
                                                     "others wait at __syncthreads()"),
            std::string::npos)
      << cuda_emulator::last_error_message();
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  std::vector<float> lanes(32, 0);
  EXPECT_EQ(cuda_emulator::self_test::half_warp_shuffle(lanes.data()), cudaErrorLaunchFailure);
  cuda_emulator::reset();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cuda_emulator::self_test::half_warp_shuffle(lanes.data()), cudaErrorLaunchFailure);
  EXPECT_NE(cuda_emulator::last_error_message().find("16 of its 32 lanes wait at a shuffle"),
            std::string::npos)
      << cuda_emulator::last_error_message();
  cuda_emulator::reset();
  // A launch shape CUDA refuses fails the launch alone.
  EXPECT_EQ(cuda_emulator::self_test::oversized_block(out.data()), cudaErrorInvalidConfiguration);
  EXPECT_EQ(out[0], 0); // nothing ran
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(CudaEmulator, AMissingBarrierShowsAsAWrongRead) {
  std::vector<int> out(128, -1);
  auto expected = [](int base, int i) { return base + 100 * (i / 64) + (i % 64 + 1) % 64; };
  ASSERT_EQ(cuda_emulator::self_test::neighbour_read(out.data(), 1000, true), cudaSuccess);
  for (int i = 0; i < 128; ++i)
    EXPECT_EQ(out[i], expected(1000, i)) << i;
  ASSERT_EQ(cuda_emulator::self_test::neighbour_read(out.data(), 2000, false), cudaSuccess);
  int wrong[2] = {0, 0};
  for (int i = 0; i < 128; ++i)
    wrong[i / 64] += out[i] != expected(2000, i);
  // Block 0 runs first to last: every thread but the last reads its
  // neighbour's slot before the neighbour writes it. Block 1 runs last to
  // first: only thread 63, which runs first and reads slot 0, reads early.
  EXPECT_EQ(wrong[0], 63);
  EXPECT_EQ(wrong[1], 1);
}

// Work on two streams runs in an order only their waits constrain: the later
// issued first where nothing orders them, so a missing wait reads stale data.
TEST(CudaEmulator, StreamsKeepOnlyTheWaitsTheyAreGiven) {
  cudaStream_t a = nullptr, b = nullptr;
  cudaEvent_t written = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&written, cudaEventDisableTiming), cudaSuccess);
  void *x = nullptr, *y = nullptr;
  ASSERT_EQ(cudaMalloc(&x, 64), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&y, 64), cudaSuccess);
  for (bool wait : {false, true}) {
    std::memset(x, 0, 64);
    std::memset(y, 0, 64);
    ASSERT_EQ(cudaMemsetAsync(x, 7, 64, a), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(written, a), cudaSuccess);
    if (wait) {
      ASSERT_EQ(cudaStreamWaitEvent(b, written, 0), cudaSuccess);
    }
    ASSERT_EQ(cudaMemcpyAsync(y, x, 64, cudaMemcpyDeviceToDevice, b), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(static_cast<unsigned char *>(y)[0], wait ? 7 : 0) << (wait ? "with" : "without");
  }
  // Work runs only when waited for, and then only what that needs: B's write,
  // issued between A's two pieces of work, has not run when A's copy does.
  void *z = nullptr;
  ASSERT_EQ(cudaMalloc(&z, 64), cudaSuccess);
  std::memset(x, 0, 64);
  ASSERT_EQ(cudaMemsetAsync(z, 1, 64, a), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(x, 9, 64, b), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(y, x, 64, cudaMemcpyDeviceToDevice, a), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(a), cudaSuccess);
  EXPECT_EQ(static_cast<unsigned char *>(y)[0], 0);
  EXPECT_EQ(static_cast<unsigned char *>(x)[0], 0); // B's write is still queued
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
  EXPECT_EQ(static_cast<unsigned char *>(x)[0], 9);
  cudaFree(z);
  // A copy from host memory reads it at the call, as from pageable memory.
  std::vector<unsigned char> host(64, 3);
  ASSERT_EQ(cudaMemcpyAsync(x, host.data(), 64, cudaMemcpyHostToDevice, a), cudaSuccess);
  host.assign(64, 4);
  ASSERT_EQ(cudaStreamSynchronize(a), cudaSuccess);
  EXPECT_EQ(static_cast<unsigned char *>(x)[63], 3);
  cudaFree(x);
  cudaFree(y);
  cudaEventDestroy(written);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

// Captures follow CUDA's rules: a stream joins by waiting on an event of the
// capture and must be joined back; allocation and synchronization fail inside
// one and spoil it; a replay runs the nodes in an order their edges allow.
TEST(CudaEmulator, CapturesFollowCudasRules) {
  cudaStream_t origin = nullptr, side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&origin, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), cudaSuccess);
  void *x = nullptr;
  ASSERT_EQ(cudaMalloc(&x, 64), cudaSuccess);
  auto capture = [&](bool joined, cudaGraph_t *graph) {
    EXPECT_EQ(cudaStreamBeginCapture(origin, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    EXPECT_EQ(cudaEventRecord(fork, origin), cudaSuccess);
    EXPECT_EQ(cudaStreamWaitEvent(side, fork, 0), cudaSuccess);
    EXPECT_EQ(cudaMemsetAsync(x, 1, 32, side), cudaSuccess);
    EXPECT_EQ(cudaEventRecord(join, side), cudaSuccess);
    if (joined) {
      EXPECT_EQ(cudaStreamWaitEvent(origin, join, 0), cudaSuccess);
    }
    // After the join: runs after the side's memset, and overwrites it.
    EXPECT_EQ(cudaMemsetAsync(x, 2, 16, origin), cudaSuccess);
    return cudaStreamEndCapture(origin, graph);
  };
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(capture(false, &graph), cudaErrorStreamCaptureUnjoined);
  EXPECT_EQ(graph, nullptr);
  cudaGetLastError();
  ASSERT_EQ(capture(true, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  std::memset(x, 0, 64);
  EXPECT_EQ(static_cast<unsigned char *>(x)[0], 0); // nothing ran while capturing
  ASSERT_EQ(cudaGraphLaunch(exec, origin), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(origin), cudaSuccess);
  EXPECT_EQ(static_cast<unsigned char *>(x)[0], 2);
  EXPECT_EQ(static_cast<unsigned char *>(x)[20], 1);
  // cudaMalloc while capturing fails, and so does the capture's end.
  ASSERT_EQ(cudaStreamBeginCapture(origin, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  void *more = nullptr;
  EXPECT_EQ(cudaMalloc(&more, 64), cudaErrorStreamCaptureUnsupported);
  cudaGraph_t spoilt = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(origin, &spoilt), cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(x);
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
  cudaStreamDestroy(origin);
  cudaStreamDestroy(side);
}

// A cuBLASLt algorithm serves operands as aligned as those it was chosen for.
TEST(CudaEmulator, MatmulRefusesOperandsLessAlignedThanItsAlgorithm) {
  cublasLtHandle_t lt = nullptr;
  ASSERT_EQ(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t layout = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  ASSERT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&layout, CUDA_R_32F, 2, 2, 2), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&preference), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t result = {};
  int found = 0;
  ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(lt, desc, layout, layout, layout, layout, preference, 1,
                                           &result, &found),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(found, 1);
  float *m = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void **>(&m), 1024), cudaSuccess);
  const float a[4] = {1, 2, 3, 4}; // column-major [[1, 3], [2, 4]]
  std::memcpy(m, a, sizeof a);
  std::memcpy(m + 64, a, sizeof a);
  const float one = 1, zero = 0;
  // A, B and D 256-byte aligned, as the default preference assumes.
  EXPECT_EQ(cublasLtMatmul(lt, desc, &one, m, layout, m + 64, layout, &zero, m + 128, layout,
                           m + 128, layout, &result.algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(m[128], 7.0f);  // 1 * 1 + 3 * 2
  EXPECT_EQ(m[131], 22.0f); // 2 * 3 + 4 * 4
  // D 4 floats off: refused.
  EXPECT_EQ(cublasLtMatmul(lt, desc, &one, m, layout, m + 64, layout, &zero, m + 132, layout,
                           m + 132, layout, &result.algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_NE(cuda_emulator::last_error_message().find("less aligned"), std::string::npos);
  cudaFree(m);
  cublasLtMatmulPreferenceDestroy(preference);
  cublasLtMatrixLayoutDestroy(layout);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(lt);
}

// An error of CUDA is reported once: cuda_status clears it, so the next
// kernel launcher's own cudaGetLastError() does not blame its kernel. Out of
// GPU memory is a condition of the run, not a bug in strata.
TEST(CudaStatus, OutOfGpuMemoryIsResourceExhaustedAndReportedOnce) {
  void *memory = nullptr;
  const cudaError_t error = cudaMalloc(&memory, size_t{1} << 40); // more than any GPU has
  ASSERT_EQ(error, cudaErrorMemoryAllocation);
  ASSERT_EQ(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
  const Status status = cuda::cuda_status(error, "allocating 1.00 TiB");
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.to_string();
  EXPECT_EQ(status.message(), str_cat("CUDA allocating 1.00 TiB: out of GPU memory (",
                                      cudaGetErrorString(cudaErrorMemoryAllocation), ")"));
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Each failure of CUDA, cuBLASLt and cuDNN means one thing (graph/status.h):
// out of memory, no usable device or library, or a bug in strata.
TEST(CudaStatus, FailuresMapToWhatTheyMean) {
  EXPECT_TRUE(cuda::cuda_status(cudaSuccess, "launch").is_ok());
  for (cudaError_t absent :
       {cudaErrorNoDevice, cudaErrorInsufficientDriver, cudaErrorInvalidDevice})
    EXPECT_EQ(cuda::cuda_status(absent, "device count").code(), StatusCode::kUnavailable)
        << cudaGetErrorString(absent);
  for (cudaError_t bug :
       {cudaErrorInvalidValue, cudaErrorInvalidConfiguration, cudaErrorLaunchFailure})
    EXPECT_EQ(cuda::cuda_status(bug, "launch").code(), StatusCode::kInternal)
        << cudaGetErrorString(bug);
  EXPECT_EQ(cuda::cuda_status(cudaErrorNoDevice, "device count").message(),
            str_cat("CUDA device count: ", cudaGetErrorString(cudaErrorNoDevice)));

  EXPECT_TRUE(cuda::cublas_status(CUBLAS_STATUS_SUCCESS, "layout").is_ok());
  EXPECT_EQ(cuda::cublas_status(CUBLAS_STATUS_ALLOC_FAILED, "descriptor").code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(cuda::cublas_status(CUBLAS_STATUS_NOT_INITIALIZED, "could not start").code(),
            StatusCode::kUnavailable);
  const Status invalid = cuda::cublas_status(CUBLAS_STATUS_INVALID_VALUE, "layout");
  EXPECT_EQ(invalid.code(), StatusCode::kInternal);
  EXPECT_EQ(invalid.message(), "cuBLASLt layout: CUBLAS_STATUS_INVALID_VALUE");

#if STRATA_HAVE_CUDNN
  EXPECT_TRUE(cuda::cudnn_status(CUDNN_STATUS_SUCCESS, "convolution").is_ok());
  EXPECT_EQ(cuda::cudnn_status(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED, "convolution")
                .code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(cuda::cudnn_status(CUDNN_STATUS_NOT_INITIALIZED, "could not start").code(),
            StatusCode::kUnavailable);
  const Status bad = cuda::cudnn_status(CUDNN_STATUS_BAD_PARAM, "convolution");
  EXPECT_EQ(bad.code(), StatusCode::kInternal);
  EXPECT_EQ(bad.message(),
            str_cat("cuDNN convolution: ", cudnnGetErrorString(CUDNN_STATUS_BAD_PARAM)));
#endif
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(CudaEmulation, EveryOpCaseMatchesTheCpu) {
  const Libraries libraries;
  int compared = 0;
  for (const OpCase &c : op_cases()) {
    SCOPED_TRACE(describe(c));
    Graph graph = one_node(c);
    ASSERT_EQ(graph.num_nodes(), 1);
    const cuda::CudaOp *op = cuda::find_cuda_op(graph.node(0).op);
    ASSERT_NE(op, nullptr) << "no CUDA op";
    const std::vector<HostTensor> inputs = inputs_for(c, graph);
    const std::vector<HostTensor> expected = run_cpu(graph, inputs);
    // Pooling and batch norm through cuDNN where it fits, and through
    // strata's kernels.
    for (bool cudnn_pool_norm : {true, false}) {
      std::shared_ptr<void> cache;
      for (int pass = 0; pass < 2; ++pass) { // the second with what the first planned
        SCOPED_TRACE(str_cat(pass == 0 ? "first run" : "second run",
                             cudnn_pool_norm ? "" : ", strata's pool/norm kernels"));
        const EmulatedRun got =
            run_emulated(graph, inputs, *op, &cache, libraries, cudnn_pool_norm);
        ASSERT_EQ(got.error, "");
        EXPECT_EQ(got.flag, 0) << op->flag_meaning;
        ASSERT_EQ(got.outputs.size(), expected.size());
        for (size_t k = 0; k < expected.size(); ++k) {
          if (expected[k].type.dtype != DType::kF32) {
            EXPECT_EQ(
                std::memcmp(got.outputs[k].data(), expected[k].data(), expected[k].size_bytes()), 0)
                << "output " << k;
            continue;
          }
          double worst = 0;
          int64_t worst_at = 0;
          for (int64_t i = 0; i < expected[k].type.num_elements(); ++i) {
            const double d = difference(got.outputs[k].as<float>()[i], expected[k].as<float>()[i]);
            if (d > worst) worst = d, worst_at = i;
          }
          EXPECT_LE(worst, c.tolerance)
              << "output " << k << " element " << worst_at << ": "
              << got.outputs[k].as<float>()[worst_at] << " against the CPU's "
              << expected[k].as<float>()[worst_at];
        }
      }
    }
    ++compared;
  }
  EXPECT_GE(compared, 100);
}

// Fused chains hold the ops the registry marks fusable
// (passes::fusable_elementwise), so the CUDA op table needs a fused step for
// each, and has one for no other op.
TEST(CudaOps, ExactlyTheFusableOpsHaveAFusedStep) {
  for (const ops::OpDef *def : ops::OpRegistry::global().all()) {
    const cuda::CudaOp *op = cuda::find_cuda_op(def->name);
    EXPECT_EQ(def->traits.elementwise == ops::Elementwise::kFusable,
              op != nullptr && op->fused.has_value())
        << def->name;
  }
}

TEST(CudaOps, FusedStepsReadTheOpsAttributes) {
  const ops::OpRegistry &registry = ops::OpRegistry::global();
  auto node = [](std::string op) {
    Node n;
    n.name = "n";
    n.op = std::move(op);
    return n;
  };
  Node gelu = node("GeluGrad");
  gelu.set_attr("approximate", std::string("tanh"));
  const Result<cuda::FusedStep> gelu_step = cuda::fused_step(gelu, *registry.find("GeluGrad"));
  ASSERT_TRUE(gelu_step.is_ok()) << gelu_step.status().to_string();
  EXPECT_EQ(gelu_step->binary, 1);
  EXPECT_EQ(gelu_step->op, static_cast<int>(cuda::Binary::kGeluTanhGrad));

  Node clip = node("Clip");
  clip.set_attr("min", -1.5);
  const Result<cuda::FusedStep> clip_step = cuda::fused_step(clip, *registry.find("Clip"));
  ASSERT_TRUE(clip_step.is_ok()) << clip_step.status().to_string();
  EXPECT_EQ(clip_step->binary, 0);
  EXPECT_EQ(clip_step->op, static_cast<int>(cuda::Unary::kClip));
  EXPECT_EQ(clip_step->a, -1.5f);
  EXPECT_EQ(clip_step->b, std::numeric_limits<float>::infinity());

  Node cast = node("Cast");
  cast.set_attr("to", std::string("f32"));
  EXPECT_FALSE(cuda::fused_step(cast, *registry.find("Cast")).is_ok());
}

} // namespace
} // namespace strata::test
