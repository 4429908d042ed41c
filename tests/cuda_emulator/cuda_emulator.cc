// The CUDA emulator's kernel scheduler (block after block, a fiber per
// thread) and its error state. See cuda_emulator.h.
#include "tests/cuda_emulator/cuda_emulator.h"

#include <ucontext.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <vector>

#include "tests/cuda_emulator/state.h"

namespace strata::cuda_emulator {
namespace {

constexpr size_t kStackBytes = 64 * 1024;
constexpr int kWarp = 32;
constexpr size_t kSlotBytes = 16; // the largest value a shuffle exchanges

// A fiber's saved registers, and the switch between two. On x86-64 a few
// instructions: the callee-saved registers and the stack (kernels never
// change the FP control words, so all fibers share the thread's). glibc's
// swapcontext also saves the signal mask, a system call per switch, which
// made the emulated test suites several times slower.
#if defined(__x86_64__)
extern "C" void strata_emulator_switch(void **save, void *load);
asm(R"(
  .text
  .globl strata_emulator_switch
  .type strata_emulator_switch, @function
strata_emulator_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size strata_emulator_switch, .-strata_emulator_switch
)");

struct Context {
  void *sp = nullptr;
};

// `context` will start `entry` on the stack [stack, stack + bytes).
void prepare(Context &context, char *stack, size_t bytes, void (*entry)()) {
  auto top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t{15};
  auto *slot = reinterpret_cast<uint64_t *>(top);
  slot[-1] = 0;                                 // entry's return address: none
  slot[-2] = reinterpret_cast<uint64_t>(entry); // where the switch returns to
  for (int r = 3; r <= 8; ++r)
    slot[-r] = 0; // rbp, rbx, r12 - r15
  context.sp = &slot[-8];
}

void switch_to(Context &from, Context &to) { strata_emulator_switch(&from.sp, to.sp); }
#else
struct Context {
  ucontext_t context;
};

void prepare(Context &context, char *stack, size_t bytes, void (*entry)()) {
  getcontext(&context.context);
  context.context.uc_stack.ss_sp = stack;
  context.context.uc_stack.ss_size = bytes;
  context.context.uc_link = nullptr;
  makecontext(&context.context, entry, 0);
}

void switch_to(Context &from, Context &to) { swapcontext(&from.context, &to.context); }
#endif

enum class State { kReady, kAtBlockBarrier, kAtWarpBarrier, kDone };

struct Fiber {
  Context context;
  State state = State::kReady;
  uint3 index{};
  std::unique_ptr<char[]> stack;
};

struct Emulator {
  Context scheduler;
  std::vector<Fiber> fibers; // one per thread of a block, reused
  Fiber *current = nullptr;
  const std::function<void()> *body = nullptr;
  dim3 grid, block;
  uint3 block_index{};
  std::vector<unsigned char> slots; // kSlotBytes per thread, for shuffles
  std::vector<int> ready, at_warp;  // the scheduler's, kept between blocks
};

// One for the process: kernels run only under the runtime's lock
// (cuda_runtime.cc), one grid at a time, on whichever host thread drains.
Emulator emulator;

// Errors: the last one per host thread, as CUDA's; the sticky fault and the
// last message for the whole process.
thread_local cudaError_t last_error = cudaSuccess;
std::mutex message_mutex;
std::string last_message;
std::atomic<int> sticky_fault{cudaSuccess};

Fiber &current_fiber() {
  if (emulator.current == nullptr) {
    std::fprintf(stderr, "cuda_emulator: a kernel's built-in variable read outside a launch\n");
    std::abort();
  }
  return *emulator.current;
}

[[noreturn]] void fiber_entry() {
  (*emulator.body)();
  Fiber &fiber = *emulator.current;
  fiber.state = State::kDone;
  switch_to(fiber.context, emulator.scheduler); // never resumed
  std::abort();
}

// Suspends the running fiber in `state` until the scheduler releases it.
void wait_in(State state) {
  Fiber &fiber = current_fiber();
  fiber.state = state;
  switch_to(fiber.context, emulator.scheduler);
}

std::string coordinates(uint3 v) {
  return "(" + std::to_string(v.x) + "," + std::to_string(v.y) + "," + std::to_string(v.z) + ")";
}

bool fail(cudaError_t code, std::string message) {
  detail::fault(code, std::move(message));
  return false;
}

// Runs one block to the end; false (with the error kept) when it cannot.
bool run_block(const char *kernel) {
  const int threads = static_cast<int>(emulator.block.x * emulator.block.y * emulator.block.z);
  if (emulator.fibers.size() < static_cast<size_t>(threads)) emulator.fibers.resize(threads);
  emulator.slots.assign(static_cast<size_t>(threads) * kSlotBytes, 0);
  std::vector<int> &ready = emulator.ready;
  ready.clear();
  for (int t = 0; t < threads; ++t) {
    Fiber &fiber = emulator.fibers[t];
    if (!fiber.stack) fiber.stack.reset(new char[kStackBytes]);
    fiber.state = State::kReady;
    fiber.index = {static_cast<unsigned>(t) % emulator.block.x,
                   static_cast<unsigned>(t) / emulator.block.x % emulator.block.y,
                   static_cast<unsigned>(t) / (emulator.block.x * emulator.block.y)};
    // Stack tops 64 KiB apart would share cache sets: each starts at its own
    // offset into the 4 KiB a set index spans.
    const size_t colour = static_cast<size_t>(t * 7 % 64) * 64;
    prepare(fiber.context, fiber.stack.get(), kStackBytes - colour, fiber_entry);
    ready.push_back(t);
  }
  // Odd blocks run their threads last to first between barriers: work that
  // only some order of threads gets right shows in one or the other.
  const uint3 b = emulator.block_index;
  const bool backwards = (b.x + emulator.grid.x * (b.y + emulator.grid.y * b.z)) % 2 == 1;
  if (backwards) std::reverse(ready.begin(), ready.end());
  const int warps = (threads + kWarp - 1) / kWarp;
  std::vector<int> &at_warp = emulator.at_warp;
  at_warp.assign(static_cast<size_t>(warps), 0);
  int done = 0;
  auto where = [&] {
    return std::string("kernel '") + kernel + "', block " + coordinates(emulator.block_index);
  };
  for (;;) {
    // Run every ready thread until it finishes or waits.
    for (size_t r = 0; r < ready.size(); ++r) {
      Fiber &fiber = emulator.fibers[ready[r]];
      emulator.current = &fiber;
      switch_to(emulator.scheduler, fiber.context);
      emulator.current = nullptr;
      if (fiber.state == State::kDone)
        ++done;
      else if (fiber.state == State::kAtWarpBarrier)
        ++at_warp[ready[r] / kWarp];
    }
    ready.clear();
    if (done == threads) return true;
    // Warps whose lanes all wait at a shuffle go on.
    for (int w = 0; w < warps; ++w) {
      if (at_warp[w] == 0) continue;
      const int first = w * kWarp, last = std::min(threads, first + kWarp);
      if (at_warp[w] != last - first) {
        return fail(cudaErrorLaunchFailure,
                    where() + ", warp " + std::to_string(w) + ": " + std::to_string(at_warp[w]) +
                        " of its " + std::to_string(last - first) +
                        " lanes wait at a shuffle of the full warp while the others "
                        "have finished or wait at __syncthreads()");
      }
      for (int t = first; t < last; ++t) {
        emulator.fibers[t].state = State::kReady;
        ready.push_back(t);
      }
      at_warp[w] = 0;
    }
    if (!ready.empty()) {
      if (backwards) std::reverse(ready.begin(), ready.end());
      continue;
    }
    // Else every thread that has not finished waits at __syncthreads().
    if (done != 0) {
      return fail(cudaErrorLaunchFailure,
                  where() + ": " + std::to_string(done) + " of its " + std::to_string(threads) +
                      " threads finished while the others wait at __syncthreads()");
    }
    for (int t = 0; t < threads; ++t) {
      emulator.fibers[t].state = State::kReady;
      ready.push_back(t);
    }
    if (backwards) std::reverse(ready.begin(), ready.end());
  }
}

} // namespace

uint3 thread_index() { return emulator.current->index; }
uint3 block_index() { return emulator.block_index; }
dim3 block_dim() { return emulator.block; }
dim3 grid_dim() { return emulator.grid; }

void sync_threads() { wait_in(State::kAtBlockBarrier); }

void exchange_in_warp(void *value, size_t bytes, int delta) {
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
  const size_t lane = thread % kWarp, from = thread + static_cast<size_t>(delta);
  if (lane + static_cast<size_t>(delta) < kWarp && from < threads)
    std::memcpy(value, &emulator.slots[from * kSlotBytes], bytes);
  wait_in(State::kAtWarpBarrier);
}

cudaError_t run_grid(const char *kernel, dim3 grid, dim3 block, size_t shared_bytes,
                     const std::function<void()> &thread) {
  (void)shared_bytes;
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
          return detail::sticky();
        }
      }
  emulator.body = nullptr;
  return cudaSuccess;
}

cudaError_t launch(const char *kernel, dim3 grid, dim3 block, size_t shared_bytes,
                   cudaStream_t stream, std::function<void()> thread) {
  const uint64_t threads = static_cast<uint64_t>(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535 || shared_bytes > 48 * 1024) {
    return detail::set_error(cudaErrorInvalidConfiguration,
                             std::string("kernel '") + kernel + "' launched with grid " +
                                 coordinates({grid.x, grid.y, grid.z}) + " and block " +
                                 coordinates({block.x, block.y, block.z}) + ", which CUDA refuses");
  }
  auto work = [=, thread = std::move(thread)] {
    run_grid(kernel, grid, block, shared_bytes, thread);
  };
  return enqueue_made(
      stream, kernel,
      [work] {
        return Work{work, nullptr};
      },
      /*on_current_gpu=*/true);
}

std::string last_error_message() {
  std::lock_guard<std::mutex> lock(message_mutex);
  return last_message;
}

void reset() {
  sticky_fault = cudaSuccess;
  last_error = cudaSuccess;
}

namespace detail {

cudaError_t set_error(cudaError_t code, std::string message) {
  last_error = code;
  std::lock_guard<std::mutex> lock(message_mutex);
  last_message = std::move(message);
  return code;
}

cudaError_t fault(cudaError_t code, std::string message) {
  int expected = cudaSuccess;
  sticky_fault.compare_exchange_strong(expected, code);
  return set_error(code, std::move(message));
}

void note(std::string message) {
  std::lock_guard<std::mutex> lock(message_mutex);
  last_message = std::move(message);
}

cudaError_t sticky() { return static_cast<cudaError_t>(sticky_fault.load()); }

cudaError_t take_error() {
  const cudaError_t error = last_error != cudaSuccess ? last_error : sticky();
  last_error = cudaSuccess;
  return error;
}

cudaError_t peek_error() { return last_error != cudaSuccess ? last_error : sticky(); }

} // namespace detail
} // namespace strata::cuda_emulator
