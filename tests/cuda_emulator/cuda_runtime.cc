// The CUDA runtime's host API over host memory, for the CUDA emulator (see
// cuda_emulator.h): devices, memory, streams, events and CUDA Graphs, with
// CUDA's capture rules.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/cuda_emulator/cuda_emulator.h"
#include "tests/cuda_emulator/state.h"

namespace strata::cuda_emulator {
namespace {

using detail::set_error;

// A CUDA Graph's node: how to make its work (anew at every launch: a
// captured NCCL call meets its peers afresh each replay) and the nodes it
// waits for.
struct Node {
  const char *what;
  Make make;
  std::vector<size_t> after;
};

// The nodes in an order their edges allow, taking the latest ready node each
// time: work that no edge orders runs in the reverse of the order it was
// captured, so a missing dependency shows as a wrong read.
std::vector<size_t> linear_order(const std::vector<Node> &nodes) {
  std::vector<size_t> waiting(nodes.size()), order;
  std::vector<std::vector<size_t>> next(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    waiting[i] = nodes[i].after.size();
    for (size_t j : nodes[i].after)
      next[j].push_back(i);
  }
  std::set<size_t> ready;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (waiting[i] == 0) ready.insert(i);
  while (!ready.empty()) {
    const size_t i = *ready.rbegin();
    ready.erase(i);
    order.push_back(i);
    for (size_t j : next[i])
      if (--waiting[j] == 0) ready.insert(j);
  }
  return order;
}

struct Stream;

// A capture in progress: its nodes, the stream it began on, the streams that
// joined it, and why it can no longer end well.
struct Capture {
  Stream *origin = nullptr;
  std::thread::id thread; // whose unsafe calls invalidate it
  std::vector<Node> nodes;
  std::set<Stream *> streams;
  std::string invalid; // "" while valid
};

// Work queued on a stream: done when the emulator must (a query, a
// synchronizing call), in an order that keeps each stream's order and every
// wait (see drain).
struct Item {
  uint64_t sequence; // order of enqueueing, over all streams
  const char *what;
  Work work;
  Stream *wait_for = nullptr; // a wait: until that stream ran `wait_until` items
  uint64_t wait_until = 0;
};

struct Stream {
  int device = -1;       // the GPU current at its creation (-1: the legacy stream, any)
  bool blocking = false; // synchronizes with the legacy stream
  std::deque<Item> queue;
  uint64_t enqueued = 0, done = 0;
  // While capturing: the capture, and the nodes the next one waits for.
  std::shared_ptr<Capture> capture;
  std::set<size_t> frontier;
  std::optional<size_t> last; // its last node
};

struct Event {
  int device = 0; // the GPU current at its creation
  bool timing = true;
  // Recorded outside a capture: the stream, and how many of its items precede.
  Stream *stream = nullptr;
  uint64_t position = 0;
  bool time_set = false;
  std::chrono::steady_clock::time_point time;
  // Recorded in a capture.
  std::shared_ptr<Capture> capture;
  std::set<size_t> frontier;
};

struct GraphOf {
  std::vector<Node> nodes;
};

// Everything shared, under one lock (held while queued work runs: the work
// calls nothing back).
std::recursive_mutex mutex;
Stream legacy_stream; // the default stream, 0
std::set<Stream *> streams;
std::set<Event *> events;
std::set<GraphOf *> graphs;
std::map<const char *, size_t, std::less<>> allocations; // device memory: start, bytes
uint64_t sequence = 0;
thread_local int current_device = 0;

Stream *stream_of(cudaStream_t stream) {
  if (stream == nullptr) return &legacy_stream;
  auto *s = reinterpret_cast<Stream *>(stream);
  return streams.count(s) != 0 ? s : nullptr;
}

Event *event_of(cudaEvent_t event) {
  auto *e = reinterpret_cast<Event *>(event);
  return events.count(e) != 0 ? e : nullptr;
}

bool is_device(const void *pointer) {
  const auto *p = static_cast<const char *>(pointer);
  auto it = allocations.upper_bound(p);
  if (it == allocations.begin()) return false;
  --it;
  return p < it->first + std::max<size_t>(it->second, 1);
}

bool runnable(const Stream &s) {
  const Item &head = s.queue.front();
  if (head.wait_for != nullptr && head.wait_for->done < head.wait_until) return false;
  return !head.work.ready || head.work.ready();
}

// Runs queued work, any stream's, until `enough()` holds: each time the
// ready stream whose next item was enqueued last. Used to bring the other
// GPUs' parts of an NCCL call to the heads of their streams. False when
// nothing can run before it holds: work waits for another GPU's part not
// queued yet, or (a fault) streams wait for each other.
bool drain(const std::function<bool()> &enough) {
  while (!enough()) {
    Stream *pick = nullptr;
    bool meeting = false;
    auto consider = [&](Stream *s) {
      if (s->queue.empty()) return;
      if (!runnable(*s)) {
        meeting |= static_cast<bool>(s->queue.front().work.ready);
        return;
      }
      if (pick == nullptr || s->queue.front().sequence > pick->queue.front().sequence) pick = s;
    };
    consider(&legacy_stream);
    for (Stream *s : streams)
      consider(s);
    if (pick == nullptr) {
      if (!meeting)
        detail::fault(cudaErrorLaunchFailure, "streams wait for each other: nothing can run");
      return false;
    }
    Item item = std::move(pick->queue.front());
    pick->queue.pop_front();
    if (item.work.run) item.work.run();
    ++pick->done;
  }
  return true;
}

// Runs queued work until `s` has done `until` items, and only what that
// needs: a stream's items in order, and another stream's as far as a wait
// at the head demands. Work nothing waits for runs as late as it can, so
// work that should have waited for it and did not reads stale data, and a
// test fails where a GPU would race. False as drain().
bool reach(Stream *s, uint64_t until) {
  std::vector<std::pair<Stream *, uint64_t>> goals{{s, until}};
  while (!goals.empty()) {
    auto [goal, count] = goals.back();
    if (goal->done >= count) {
      goals.pop_back();
      continue;
    }
    Item &head = goal->queue.front();
    if (head.wait_for != nullptr && head.wait_for->done < head.wait_until) {
      for (const auto &[other, unused] : goals)
        if (other == head.wait_for) {
          detail::fault(cudaErrorLaunchFailure, "streams wait for each other: nothing can run");
          return false;
        }
      goals.emplace_back(head.wait_for, head.wait_until);
      continue;
    }
    if (head.work.ready && !head.work.ready()) {
      // An NCCL call: the other GPUs' parts must reach their heads (drain
      // may run this one too, once it can).
      const uint64_t done = goal->done;
      if (!drain([goal, done] { return goal->done != done || runnable(*goal); })) return false;
      continue;
    }
    Item item = std::move(goal->queue.front());
    goal->queue.pop_front();
    if (item.work.run) item.work.run();
    ++goal->done;
  }
  return true;
}

bool reach_end(Stream *s) { return reach(s, s->enqueued); }

// Every stream's work, the stream whose last work was issued last first.
bool reach_all() {
  for (;;) {
    Stream *pick = nullptr;
    auto consider = [&](Stream *s) {
      if (s->done < s->enqueued &&
          (pick == nullptr || s->queue.back().sequence > pick->queue.back().sequence))
        pick = s;
    };
    consider(&legacy_stream);
    for (Stream *s : streams)
      consider(s);
    if (pick == nullptr) return true;
    if (!reach_end(pick)) return false;
  }
}

// attempt(), retried while it is stuck on other GPUs' parts of NCCL calls
// that other host threads have yet to queue: unlocked between tries,
// bounded; false on a fault or after a minute.
bool settle(std::unique_lock<std::recursive_mutex> &lock, const std::function<bool()> &attempt) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!attempt()) {
    if (detail::sticky() != cudaSuccess) return false;
    if (std::chrono::steady_clock::now() > deadline) {
      detail::fault(cudaErrorLaunchFailure,
                    "an NCCL call waited a minute for its peers on other GPUs");
      return false;
    }
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    lock.lock();
  }
  return true;
}

void push(Stream *s, const char *what, Work work, Stream *wait_for = nullptr,
          uint64_t wait_until = 0) {
  s->queue.push_back({++sequence, what, std::move(work), wait_for, wait_until});
  ++s->enqueued;
}

// The legacy stream and blocking streams wait for each other's earlier work.
void legacy_waits(Stream *s) {
  if (s == &legacy_stream) {
    for (Stream *other : streams)
      if (other->blocking && other->enqueued > 0)
        push(s, "legacy stream wait", {}, other, other->enqueued);
  } else if (s->blocking && legacy_stream.enqueued > 0) {
    push(s, "legacy stream wait", {}, &legacy_stream, legacy_stream.enqueued);
  }
}

// A capture the calling thread has going, if any.
std::shared_ptr<Capture> capture_of_this_thread() {
  for (Stream *s : streams)
    if (s->capture && s->capture->thread == std::this_thread::get_id()) return s->capture;
  return nullptr;
}

// A call CUDA does not allow while the thread captures (thread-local mode):
// it fails, and so will the capture's end.
cudaError_t refuse_in_capture(const char *call) {
  std::shared_ptr<Capture> capture = capture_of_this_thread();
  if (!capture) return cudaSuccess;
  if (capture->invalid.empty())
    capture->invalid = std::string(call) + " was called while the stream was being captured";
  return set_error(cudaErrorStreamCaptureUnsupported, capture->invalid);
}

int device_count() {
  const char *text = std::getenv("STRATA_CUDA_EMULATOR_GPUS");
  const int count = text != nullptr ? std::atoi(text) : 1;
  return count >= 0 ? count : 0;
}

bool overlap(const void *a, const void *b, size_t bytes) {
  const auto *x = static_cast<const char *>(a), *y = static_cast<const char *>(b);
  return bytes != 0 && x < y + bytes && y < x + bytes;
}

cudaError_t refuse(std::string message) {
  return set_error(cudaErrorInvalidValue, std::move(message));
}

// Work on `s` (locked): a node of its capture, or an item of its queue.
cudaError_t add_work(Stream *s, const char *what, Make make) {
  if (s->capture) {
    Capture &c = *s->capture;
    c.nodes.push_back({what, std::move(make), {s->frontier.begin(), s->frontier.end()}});
    s->frontier = {c.nodes.size() - 1};
    s->last = c.nodes.size() - 1;
    return cudaSuccess;
  }
  if (s == &legacy_stream && capture_of_this_thread())
    return set_error(cudaErrorStreamCaptureImplicit,
                     std::string(what) + " on the legacy stream during a capture");
  legacy_waits(s);
  push(s, what, make());
  return cudaSuccess;
}

Make plain(std::function<void()> run) {
  return [run = std::move(run)] { return Work{run, nullptr}; };
}

} // namespace

cudaError_t enqueue(cudaStream_t stream, const char *what, std::function<void()> work) {
  return enqueue_made(stream, what, plain(std::move(work)));
}

int stream_device(cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  Stream *s = stream_of(stream);
  return s != nullptr && s->device >= 0 ? s->device : current_device;
}

int current_gpu() { return current_device; }

cudaError_t enqueue_made(cudaStream_t stream, const char *what, Make make, bool on_current_gpu) {
  if (detail::sticky() != cudaSuccess) return detail::sticky();
  std::lock_guard<std::recursive_mutex> lock(mutex);
  Stream *s = stream_of(stream);
  if (s == nullptr) return refuse(std::string(what) + " on a stream that does not exist");
  if (on_current_gpu && s->device >= 0 && s->device != current_device)
    return set_error(cudaErrorInvalidResourceHandle,
                     std::string(what) + " on a stream of GPU " + std::to_string(s->device) +
                         " while GPU " + std::to_string(current_device) + " is current");
  return add_work(s, what, std::move(make));
}

} // namespace strata::cuda_emulator

using namespace strata::cuda_emulator;
namespace detail = strata::cuda_emulator::detail;

extern "C" {

cudaError_t cudaGetLastError() { return detail::take_error(); }

cudaError_t cudaPeekAtLastError() { return detail::peek_error(); }

const char *cudaGetErrorString(cudaError_t error) {
  switch (error) {
  case cudaSuccess: return "no error (emulated)";
  case cudaErrorInvalidValue: return "invalid argument (emulated)";
  case cudaErrorInvalidConfiguration: return "invalid configuration argument (emulated)";
  case cudaErrorLaunchFailure: return "unspecified launch failure (emulated)";
  case cudaErrorInvalidDevice: return "invalid device ordinal (emulated)";
  case cudaErrorMemoryAllocation: return "out of memory (emulated)";
  case cudaErrorNoDevice: return "no CUDA-capable device is detected (emulated)";
  case cudaErrorInsufficientDriver:
    return "CUDA driver version is insufficient for CUDA runtime version (emulated)";
  case cudaErrorStreamCaptureUnsupported:
    return "operation not permitted when stream is capturing (emulated)";
  case cudaErrorStreamCaptureInvalidated:
    return "operation failed due to a previous error during capture (emulated)";
  case cudaErrorStreamCaptureUnjoined:
    return "capture was not joined to the origin stream (emulated)";
  case cudaErrorStreamCaptureUnmatched: return "capture was not begun on this stream (emulated)";
  case cudaErrorStreamCaptureImplicit:
    return "operation would make the legacy stream depend on a capturing blocking stream "
           "(emulated)";
  case cudaErrorIllegalState: return "the operation is not permitted in this state (emulated)";
  case cudaErrorInvalidResourceHandle: return "invalid resource handle (emulated)";
  default: return "an error of the CUDA emulator";
  }
}

const char *cudaGetErrorName(cudaError_t error) { return cudaGetErrorString(error); }

cudaError_t cudaGetDeviceCount(int *count) {
  *count = device_count();
  if (*count == 0) return set_error(cudaErrorNoDevice, "STRATA_CUDA_EMULATOR_GPUS is 0");
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count())
    return set_error(cudaErrorInvalidDevice, "cudaSetDevice(" + std::to_string(device) + ")");
  current_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
  *device = current_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device) {
  if (device < 0 || device >= device_count())
    return set_error(cudaErrorInvalidDevice,
                     "cudaGetDeviceProperties of GPU " + std::to_string(device));
  std::memset(prop, 0, sizeof *prop);
  std::snprintf(prop->name, sizeof prop->name, "CUDA emulator (host memory) %d", device);
  prop->totalGlobalMem = size_t{16} << 30;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->warpSize = 32;
  prop->memPitch = 0x7fffffff;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free, size_t *total) {
  *total = size_t{16} << 30;
  std::lock_guard<std::recursive_mutex> lock(mutex);
  size_t used = 0;
  for (const auto &[pointer, bytes] : allocations)
    used += bytes;
  *free = used < *total ? *total - used : 0;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void **pointer, size_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  *pointer = nullptr;
  if (cudaError_t refused = refuse_in_capture("cudaMalloc")) return refused;
  size_t used = 0;
  for (const auto &[p, b] : allocations)
    used += b;
  if (bytes > (size_t{16} << 30) - used)
    return set_error(cudaErrorMemoryAllocation, "cudaMalloc of " + std::to_string(bytes) +
                                                    " bytes beyond the emulated 16 GiB");
  // Mapped, so that zeroing it can hand its pages back (see zero()): the
  // executors clear their whole arena, cuBLASLt's workspace included, which
  // the emulated libraries never touch.
  void *memory = mmap(nullptr, std::max<size_t>(bytes, 1), PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) return set_error(cudaErrorMemoryAllocation, "host allocation failed");
  allocations[static_cast<const char *>(memory)] = bytes;
  *pointer = memory;
  return cudaSuccess;
}

cudaError_t cudaFree(void *pointer) {
  std::unique_lock<std::recursive_mutex> lock(mutex);
  if (pointer == nullptr) return cudaSuccess;
  if (cudaError_t refused = refuse_in_capture("cudaFree")) return refused;
  auto it = allocations.find(static_cast<const char *>(pointer));
  if (it == allocations.end()) return refuse("cudaFree of a pointer cudaMalloc did not return");
  settle(lock, reach_all); // cudaFree waits for the device
  munmap(pointer, std::max<size_t>(it->second, 1));
  allocations.erase(it);
  return cudaSuccess;
}

// Copies as CUDA orders them: device to device in the stream's order; from
// pageable host memory (all host memory here: nothing is pinned), the source
// is read at the call; to it, the call returns once the copy is done.
static cudaError_t emulated_copy(std::unique_lock<std::recursive_mutex> &lock, void *destination,
                                 const void *source, size_t bytes, Stream *s, bool wait,
                                 const char *what) {
  if (bytes == 0) return cudaSuccess;
  if (destination == nullptr || source == nullptr)
    return refuse(std::string(what) + " with a null pointer");
  if (overlap(destination, source, bytes) && destination != source)
    return refuse(std::string(what) + " between overlapping ranges");
  const bool from_host = !is_device(source), to_host = !is_device(destination);
  if (s->capture && (from_host || to_host)) {
    if (s->capture->invalid.empty())
      s->capture->invalid = std::string(what) +
                            " of pageable host memory was called while the stream was being "
                            "captured";
    return set_error(cudaErrorStreamCaptureUnsupported, s->capture->invalid);
  }
  std::function<void()> work;
  if (from_host) {
    auto bytes_now = std::make_shared<std::vector<char>>(static_cast<const char *>(source),
                                                         static_cast<const char *>(source) + bytes);
    work = [=] { std::memcpy(destination, bytes_now->data(), bytes); };
  } else {
    work = [=] { std::memcpy(destination, source, bytes); };
  }
  if (cudaError_t error = add_work(s, what, plain(std::move(work)))) return error;
  if (wait || to_host) settle(lock, [s] { return reach_end(s); });
  return detail::sticky();
}

cudaError_t cudaMemcpy(void *destination, const void *source, size_t bytes, cudaMemcpyKind) {
  std::unique_lock<std::recursive_mutex> lock(mutex);
  if (cudaError_t refused = refuse_in_capture("cudaMemcpy")) return refused;
  if (detail::sticky() != cudaSuccess) return detail::sticky();
  return emulated_copy(lock, destination, source, bytes, &legacy_stream, true, "cudaMemcpy");
}

cudaError_t cudaMemcpyAsync(void *destination, const void *source, size_t bytes, cudaMemcpyKind,
                            cudaStream_t stream) {
  std::unique_lock<std::recursive_mutex> lock(mutex);
  if (detail::sticky() != cudaSuccess) return detail::sticky();
  Stream *s = stream_of(stream);
  if (s == nullptr) return refuse("cudaMemcpyAsync on a stream that does not exist");
  return emulated_copy(lock, destination, source, bytes, s, false, "cudaMemcpyAsync");
}

// Zeroes [pointer, pointer + bytes) of mapped memory: whole pages are handed
// back (they read as zeros again), the ends are cleared.
void zero(void *pointer, size_t bytes) {
  const size_t page = 4096;
  auto *begin = static_cast<char *>(pointer);
  char *first =
      reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(begin) + page - 1) / page * page);
  char *last = reinterpret_cast<char *>(reinterpret_cast<uintptr_t>(begin + bytes) / page * page);
  if (first >= last || madvise(first, static_cast<size_t>(last - first), MADV_DONTNEED) != 0) {
    std::memset(begin, 0, bytes);
    return;
  }
  std::memset(begin, 0, static_cast<size_t>(first - begin));
  std::memset(last, 0, static_cast<size_t>(begin + bytes - last));
}

cudaError_t cudaMemsetAsync(void *pointer, int value, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (pointer == nullptr) return refuse("cudaMemsetAsync of a null pointer");
  bool device = false;
  {
    std::lock_guard<std::recursive_mutex> lock(mutex);
    device = is_device(pointer);
  }
  if (value == 0 && device && bytes >= (size_t{1} << 20))
    return enqueue(stream, "cudaMemsetAsync", [=] { zero(pointer, bytes); });
  return enqueue(stream, "cudaMemsetAsync", [=] { std::memset(pointer, value, bytes); });
}

cudaError_t cudaMemcpy2DAsync(void *destination, size_t destination_pitch, const void *source,
                              size_t source_pitch, size_t width, size_t height, cudaMemcpyKind,
                              cudaStream_t stream) {
  if (width == 0 || height == 0) return cudaSuccess;
  if (destination == nullptr || source == nullptr)
    return refuse("cudaMemcpy2DAsync with a null pointer");
  if (width > destination_pitch || width > source_pitch)
    return refuse("cudaMemcpy2DAsync with rows wider than a pitch");
  if (destination_pitch > 0x7fffffff || source_pitch > 0x7fffffff)
    return refuse("cudaMemcpy2DAsync with a pitch beyond the device's limit");
  {
    std::lock_guard<std::recursive_mutex> lock(mutex);
    if (!is_device(destination) || !is_device(source))
      return refuse("cudaMemcpy2DAsync of host memory (not emulated)");
  }
  return enqueue(stream, "cudaMemcpy2DAsync", [=] {
    for (size_t row = 0; row < height; ++row)
      std::memcpy(static_cast<char *>(destination) + row * destination_pitch,
                  static_cast<const char *>(source) + row * source_pitch, width);
  });
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  auto *s = new Stream;
  s->device = current_device;
  s->blocking = (flags & cudaStreamNonBlocking) == 0;
  streams.insert(s);
  *stream = reinterpret_cast<cudaStream_t>(s);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) { return cudaStreamCreateWithFlags(stream, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  std::unique_lock<std::recursive_mutex> lock(mutex);
  Stream *s = stream_of(stream);
  if (s == nullptr || s == &legacy_stream)
    return set_error(cudaErrorInvalidResourceHandle, "cudaStreamDestroy of an unknown stream");
  if (s->capture)
    return set_error(cudaErrorStreamCaptureUnsupported,
                     "cudaStreamDestroy of a stream being captured");
  settle(lock, [s] { return reach_end(s); }); // its work still completes
  // Waits on it that other streams have queued are past it now.
  for (Stream *other : streams)
    for (Item &item : other->queue)
      if (item.wait_for == s) item.wait_for = nullptr;
  for (Event *e : events)
    if (e->stream == s) e->stream = nullptr;
  streams.erase(s);
  delete s;
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  Stream *s = stream_of(stream);
  if (s == nullptr) return set_error(cudaErrorInvalidResourceHandle, "cudaStreamQuery");
  if (s->capture) {
    if (s->capture->invalid.empty())
      s->capture->invalid = "cudaStreamQuery of the stream being captured";
    return set_error(cudaErrorStreamCaptureUnsupported, s->capture->invalid);
  }
  // Not ready while it waits for another GPU's part of an NCCL call.
  if (!reach_end(s) && detail::sticky() == cudaSuccess) return cudaErrorNotReady;
  return detail::sticky();
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  std::unique_lock<std::recursive_mutex> lock(mutex);
  Stream *s = stream_of(stream);
  if (s == nullptr) return set_error(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize");
  if (cudaError_t refused = refuse_in_capture("cudaStreamSynchronize")) return refused;
  settle(lock, [s] { return reach_end(s); });
  return detail::sticky();
}

cudaError_t cudaDeviceSynchronize() {
  std::unique_lock<std::recursive_mutex> lock(mutex);
  if (cudaError_t refused = refuse_in_capture("cudaDeviceSynchronize")) return refused;
  settle(lock, reach_all);
  return detail::sticky();
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  auto *e = new Event;
  e->device = current_device;
  e->timing = (flags & cudaEventDisableTiming) == 0;
  events.insert(e);
  *event = reinterpret_cast<cudaEvent_t>(e);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) { return cudaEventCreateWithFlags(event, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  Event *e = event_of(event);
  if (e == nullptr)
    return set_error(cudaErrorInvalidResourceHandle, "cudaEventDestroy of an unknown event");
  events.erase(e); // a queued record of it finds it gone
  delete e;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  Event *e = event_of(event);
  Stream *s = stream_of(stream);
  if (e == nullptr || s == nullptr)
    return set_error(cudaErrorInvalidResourceHandle, "cudaEventRecord: unknown event or stream");
  if (s->device >= 0 && e->device != s->device)
    return set_error(cudaErrorInvalidResourceHandle,
                     "cudaEventRecord of an event of GPU " + std::to_string(e->device) +
                         " on a stream of GPU " + std::to_string(s->device));
  if (s->capture) {
    e->capture = s->capture;
    e->frontier = s->frontier;
    e->stream = nullptr;
    return cudaSuccess;
  }
  e->capture.reset();
  e->time_set = false;
  legacy_waits(s);
  push(s, "cudaEventRecord",
       {[e] {
          if (events.count(e) == 0) return;
          e->time = std::chrono::steady_clock::now();
          e->time_set = true;
        },
        nullptr});
  e->stream = s;
  e->position = s->enqueued;
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  Event *e = event_of(event);
  if (e == nullptr) return set_error(cudaErrorInvalidResourceHandle, "cudaEventQuery");
  if (e->capture) {
    if (e->capture->invalid.empty())
      e->capture->invalid = "cudaEventQuery of an event recorded in a capture";
    return set_error(cudaErrorStreamCaptureUnsupported, e->capture->invalid);
  }
  if (e->stream != nullptr) {
    Stream *s = e->stream;
    const uint64_t position = e->position;
    if (!reach(s, position) && detail::sticky() == cudaSuccess) return cudaErrorNotReady;
  }
  return detail::sticky();
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  std::unique_lock<std::recursive_mutex> lock(mutex);
  Event *e = event_of(event);
  if (e == nullptr) return set_error(cudaErrorInvalidResourceHandle, "cudaEventSynchronize");
  if (cudaError_t refused = refuse_in_capture("cudaEventSynchronize")) return refused;
  if (e->stream != nullptr) {
    Stream *s = e->stream;
    const uint64_t position = e->position;
    settle(lock, [s, position] { return reach(s, position); });
  }
  return detail::sticky();
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  Event *a = event_of(start), *b = event_of(end);
  if (a == nullptr || b == nullptr || !a->timing || !b->timing)
    return set_error(cudaErrorInvalidResourceHandle,
                     "cudaEventElapsedTime of an event without timing");
  if (!a->time_set || !b->time_set)
    return set_error(cudaErrorNotReady, "cudaEventElapsedTime of an event not yet reached");
  *ms = std::chrono::duration<float, std::milli>(b->time - a->time).count();
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  Event *e = event_of(event);
  Stream *s = stream_of(stream);
  if (e == nullptr || s == nullptr)
    return set_error(cudaErrorInvalidResourceHandle,
                     "cudaStreamWaitEvent: unknown event or stream");
  if (e->capture) {
    if (s->capture && s->capture != e->capture)
      return set_error(cudaErrorStreamCaptureIsolation, "cudaStreamWaitEvent across two captures");
    if (!s->capture) {
      // The stream joins the capture.
      s->capture = e->capture;
      s->capture->streams.insert(s);
      s->frontier.clear();
      s->last.reset();
    }
    s->frontier.insert(e->frontier.begin(), e->frontier.end());
    return cudaSuccess;
  }
  if (s->capture) {
    // An event recorded outside the capture: the graph cannot wait for it.
    if (s->capture->invalid.empty())
      s->capture->invalid = "a captured stream waited for an event recorded outside the capture";
    return set_error(cudaErrorStreamCaptureIsolation, s->capture->invalid);
  }
  if (e->stream == nullptr) return cudaSuccess; // never recorded, or its stream gone: no wait
  legacy_waits(s);
  push(s, "cudaStreamWaitEvent", {}, e->stream, e->position);
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  Stream *s = stream_of(stream);
  if (s == nullptr || s == &legacy_stream)
    return set_error(cudaErrorStreamCaptureUnsupported, "capture of the legacy stream");
  if (s->capture) return set_error(cudaErrorIllegalState, "the stream is already capturing");
  auto capture = std::make_shared<Capture>();
  capture->origin = s;
  capture->thread = std::this_thread::get_id();
  capture->streams.insert(s);
  s->capture = capture;
  s->frontier.clear();
  s->last.reset();
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  *graph = nullptr;
  Stream *s = stream_of(stream);
  if (s == nullptr || !s->capture)
    return set_error(cudaErrorIllegalState, "cudaStreamEndCapture of a stream not capturing");
  std::shared_ptr<Capture> capture = s->capture;
  if (capture->origin != s)
    return set_error(cudaErrorStreamCaptureUnmatched,
                     "cudaStreamEndCapture on a stream that joined the capture, not its origin");
  // Every joined stream's last node must precede the origin's end.
  std::set<size_t> before(s->frontier.begin(), s->frontier.end());
  std::vector<size_t> todo(before.begin(), before.end());
  while (!todo.empty()) {
    const size_t node = todo.back();
    todo.pop_back();
    for (size_t parent : capture->nodes[node].after)
      if (before.insert(parent).second) todo.push_back(parent);
  }
  bool joined = true;
  for (Stream *other : capture->streams)
    if (other != s && other->last && before.count(*other->last) == 0) joined = false;
  for (Stream *member : capture->streams) {
    member->capture.reset();
    member->frontier.clear();
    member->last.reset();
  }
  // Events recorded in it were never recorded outside it.
  for (Event *e : events)
    if (e->capture == capture) {
      e->capture.reset();
      e->frontier.clear();
    }
  if (!capture->invalid.empty())
    return set_error(cudaErrorStreamCaptureInvalidated, capture->invalid);
  if (!joined)
    return set_error(cudaErrorStreamCaptureUnjoined,
                     "the capture ended before the origin stream waited for the last work of "
                     "every stream that joined it");
  auto *g = new GraphOf{std::move(capture->nodes)};
  graphs.insert(g);
  *graph = reinterpret_cast<cudaGraph_t>(g);
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus *status) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  Stream *s = stream_of(stream);
  if (s == nullptr) return set_error(cudaErrorInvalidResourceHandle, "cudaStreamIsCapturing");
  *status = !s->capture                   ? cudaStreamCaptureStatusNone
            : s->capture->invalid.empty() ? cudaStreamCaptureStatusActive
                                          : cudaStreamCaptureStatusInvalidated;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  auto *g = reinterpret_cast<GraphOf *>(graph);
  if (graphs.count(g) == 0) return refuse("cudaGraphInstantiate of an unknown graph");
  auto *copy = new GraphOf{g->nodes};
  graphs.insert(copy);
  *exec = reinterpret_cast<cudaGraphExec_t>(copy);
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  auto *g = reinterpret_cast<GraphOf *>(exec);
  if (graphs.count(g) == 0) return refuse("cudaGraphLaunch of an unknown graph");
  if (detail::sticky() != cudaSuccess) return detail::sticky();
  Stream *s = stream_of(stream);
  if (s == nullptr) return refuse("cudaGraphLaunch on a stream that does not exist");
  if (s->capture) return refuse("cudaGraphLaunch into a capture (not emulated)");
  // Its nodes, made anew, queue on the stream in an order their edges allow.
  for (size_t i : linear_order(g->nodes))
    if (cudaError_t error = add_work(s, g->nodes[i].what, g->nodes[i].make)) return error;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  auto *g = reinterpret_cast<GraphOf *>(graph);
  if (graphs.erase(g) == 0) return refuse("cudaGraphDestroy of an unknown graph");
  delete g;
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  return cudaGraphDestroy(reinterpret_cast<cudaGraph_t>(exec));
}

} // extern "C"
