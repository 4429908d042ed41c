// The CUDA emulator's scheduler (block after block, a fiber per thread) and
// the host side of the CUDA runtime over host memory. See cuda_emulator.h.
#include "tests/cuda_emulator/cuda_emulator.h"

#include <ucontext.h>

#include <cstdio>
#include <memory>
#include <vector>

namespace strata::cuda_emulator {
namespace {

constexpr size_t kStackBytes = 256 * 1024;
constexpr int kWarp = 32;
constexpr size_t kSlotBytes = 16; // the largest value a shuffle exchanges

enum class State { kReady, kAtBlockBarrier, kAtWarpBarrier, kDone };

struct Fiber {
  ucontext_t context;
  State state = State::kReady;
  uint3 index{};
  std::unique_ptr<char[]> stack;
};

struct Emulator {
  ucontext_t scheduler;
  std::vector<Fiber> fibers; // one per thread of a block, reused
  Fiber *current = nullptr;
  const std::function<void()> *body = nullptr;
  dim3 grid, block;
  uint3 block_index{};
  std::vector<unsigned char> slots; // kSlotBytes per thread, for shuffles
  cudaError_t error = cudaSuccess;
  std::string message;
  int64_t launches = 0;
};

thread_local Emulator emulator;

Fiber &current_fiber() {
  if (emulator.current == nullptr) {
    std::fprintf(stderr, "cuda_emulator: a kernel's built-in variable read outside a launch\n");
    std::abort();
  }
  return *emulator.current;
}

void fiber_entry() {
  (*emulator.body)();
  emulator.current->state = State::kDone;
  // uc_link returns to the scheduler.
}

// Suspends the running fiber in `state` until the scheduler releases it.
void wait_in(State state) {
  Fiber &fiber = current_fiber();
  fiber.state = state;
  swapcontext(&fiber.context, &emulator.scheduler);
}

std::string coordinates(uint3 v) {
  return "(" + std::to_string(v.x) + "," + std::to_string(v.y) + "," + std::to_string(v.z) + ")";
}

bool fail(cudaError_t code, std::string message) {
  if (emulator.error == cudaSuccess) {
    emulator.error = code;
    emulator.message = std::move(message);
  }
  return false;
}

// Runs one block to the end; false (with the error kept) when it cannot.
bool run_block(const char *kernel) {
  const int threads = static_cast<int>(emulator.block.x * emulator.block.y * emulator.block.z);
  if (emulator.fibers.size() < static_cast<size_t>(threads)) emulator.fibers.resize(threads);
  emulator.slots.assign(static_cast<size_t>(threads) * kSlotBytes, 0);
  for (int t = 0; t < threads; ++t) {
    Fiber &fiber = emulator.fibers[t];
    if (!fiber.stack) fiber.stack.reset(new char[kStackBytes]);
    fiber.state = State::kReady;
    fiber.index = {static_cast<unsigned>(t) % emulator.block.x,
                   static_cast<unsigned>(t) / emulator.block.x % emulator.block.y,
                   static_cast<unsigned>(t) / (emulator.block.x * emulator.block.y)};
    getcontext(&fiber.context);
    fiber.context.uc_stack.ss_sp = fiber.stack.get();
    fiber.context.uc_stack.ss_size = kStackBytes;
    fiber.context.uc_link = &emulator.scheduler;
    makecontext(&fiber.context, fiber_entry, 0);
  }
  const std::string where =
      std::string("kernel '") + kernel + "', block " + coordinates(emulator.block_index);
  for (;;) {
    for (int t = 0; t < threads; ++t) {
      Fiber &fiber = emulator.fibers[t];
      if (fiber.state != State::kReady) continue;
      emulator.current = &fiber;
      swapcontext(&emulator.scheduler, &fiber.context);
      emulator.current = nullptr;
    }
    // Every thread has now finished or waits at a barrier.
    int done = 0, at_block = 0;
    for (int t = 0; t < threads; ++t) {
      done += emulator.fibers[t].state == State::kDone;
      at_block += emulator.fibers[t].state == State::kAtBlockBarrier;
    }
    if (done == threads) return true;
    bool released = false;
    for (int w = 0; w * kWarp < threads; ++w) {
      const int first = w * kWarp, last = std::min(threads, first + kWarp);
      int waiting = 0;
      for (int t = first; t < last; ++t)
        waiting += emulator.fibers[t].state == State::kAtWarpBarrier;
      if (waiting == 0) continue;
      if (waiting != last - first) {
        return fail(cudaErrorLaunchFailure,
                    where + ", warp " + std::to_string(w) + ": " + std::to_string(waiting) +
                        " of its " + std::to_string(last - first) +
                        " lanes wait at a shuffle of the full warp while the others "
                        "have finished or wait at __syncthreads()");
      }
      for (int t = first; t < last; ++t)
        emulator.fibers[t].state = State::kReady;
      released = true;
    }
    if (released) continue;
    if (at_block + done == threads) {
      if (done != 0) {
        return fail(cudaErrorLaunchFailure,
                    where + ": " + std::to_string(done) + " of its " + std::to_string(threads) +
                        " threads finished while the others wait at __syncthreads()");
      }
      for (int t = 0; t < threads; ++t)
        emulator.fibers[t].state = State::kReady;
      continue;
    }
    return fail(cudaErrorLaunchFailure, where + ": its threads wait for each other");
  }
}

} // namespace

uint3 thread_index() { return current_fiber().index; }
uint3 block_index() { return emulator.block_index; }
dim3 block_dim() { return emulator.block; }
dim3 grid_dim() { return emulator.grid; }

void sync_threads() { wait_in(State::kAtBlockBarrier); }

void exchange_in_warp(void *value, size_t bytes, int source) {
  if (bytes > kSlotBytes) {
    std::fprintf(stderr, "cuda_emulator: a shuffle of %zu bytes\n", bytes);
    std::abort();
  }
  const uint3 index = current_fiber().index;
  const size_t thread = index.x + static_cast<size_t>(emulator.block.x) *
                                      (index.y + static_cast<size_t>(emulator.block.y) * index.z);
  std::memcpy(&emulator.slots[thread * kSlotBytes], value, bytes);
  wait_in(State::kAtWarpBarrier);
  const size_t threads =
      static_cast<size_t>(emulator.block.x) * emulator.block.y * emulator.block.z;
  const size_t from = thread - thread % kWarp + static_cast<size_t>(source);
  if (source >= 0 && from < threads) std::memcpy(value, &emulator.slots[from * kSlotBytes], bytes);
  wait_in(State::kAtWarpBarrier);
}

void run_grid(const char *kernel, dim3 grid, dim3 block, size_t shared_bytes,
              const std::function<void()> &thread) {
  ++emulator.launches;
  const uint64_t threads = static_cast<uint64_t>(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535 || shared_bytes > 48 * 1024) {
    fail(cudaErrorInvalidConfiguration, std::string("kernel '") + kernel + "' launched with grid " +
                                            coordinates({grid.x, grid.y, grid.z}) + " and block " +
                                            coordinates({block.x, block.y, block.z}) +
                                            ", which CUDA refuses");
    return;
  }
  if (emulator.body != nullptr) {
    std::fprintf(stderr, "cuda_emulator: kernel '%s' launched from a kernel\n", kernel);
    std::abort();
  }
  emulator.body = &thread;
  emulator.grid = grid;
  emulator.block = block;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        emulator.block_index = {x, y, z};
        if (!run_block(kernel)) {
          emulator.body = nullptr;
          return;
        }
      }
  emulator.body = nullptr;
}

std::string last_error_message() { return emulator.message; }

int64_t launches() { return emulator.launches; }

} // namespace strata::cuda_emulator

// The CUDA runtime's host API, as far as the kernels' callers use it: every
// call completes before it returns, on host memory.
using strata::cuda_emulator::emulator;

namespace {

bool overlap(const void *a, const void *b, size_t bytes) {
  const auto *x = static_cast<const char *>(a), *y = static_cast<const char *>(b);
  return bytes != 0 && x < y + bytes && y < x + bytes;
}

cudaError_t refuse(std::string message) {
  strata::cuda_emulator::emulator.error = cudaErrorInvalidValue;
  emulator.message = std::move(message);
  return cudaErrorInvalidValue;
}

} // namespace

extern "C" {

cudaError_t cudaGetLastError() {
  const cudaError_t error = emulator.error;
  emulator.error = cudaSuccess;
  return error;
}

cudaError_t cudaPeekAtLastError() { return emulator.error; }

const char *cudaGetErrorString(cudaError_t error) {
  switch (error) {
  case cudaSuccess: return "no error (emulated)";
  case cudaErrorInvalidValue: return "invalid argument (emulated)";
  case cudaErrorInvalidConfiguration: return "invalid configuration argument (emulated)";
  case cudaErrorLaunchFailure: return "unspecified launch failure (emulated)";
  default: return "an error of the CUDA emulator";
  }
}

const char *cudaGetErrorName(cudaError_t error) { return cudaGetErrorString(error); }

cudaError_t cudaMemsetAsync(void *pointer, int value, size_t bytes, cudaStream_t) {
  if (bytes == 0) return cudaSuccess;
  if (pointer == nullptr) return refuse("cudaMemsetAsync of a null pointer");
  std::memset(pointer, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *destination, const void *source, size_t bytes, cudaMemcpyKind,
                            cudaStream_t) {
  if (bytes == 0) return cudaSuccess;
  if (destination == nullptr || source == nullptr)
    return refuse("cudaMemcpyAsync with a null pointer");
  if (overlap(destination, source, bytes) && destination != source)
    return refuse("cudaMemcpyAsync between overlapping ranges");
  std::memcpy(destination, source, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpy2DAsync(void *destination, size_t destination_pitch, const void *source,
                              size_t source_pitch, size_t width, size_t height, cudaMemcpyKind,
                              cudaStream_t) {
  if (width == 0 || height == 0) return cudaSuccess;
  if (destination == nullptr || source == nullptr)
    return refuse("cudaMemcpy2DAsync with a null pointer");
  if (width > destination_pitch || width > source_pitch)
    return refuse("cudaMemcpy2DAsync with rows wider than a pitch");
  for (size_t row = 0; row < height; ++row)
    std::memcpy(static_cast<char *>(destination) + row * destination_pitch,
                static_cast<const char *>(source) + row * source_pitch, width);
  return cudaSuccess;
}

} // extern "C"
