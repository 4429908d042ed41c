#include "runtime/comm/mpi_world.h"

// The C API only: the deprecated C++ bindings do not compile warning-free.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <list>
#include <map>
#include <mutex>
#include <new>
#include <thread>

#include <nlohmann/json.hpp>

#include "runtime/comm/host_transport.h"

namespace strata::runtime {

using namespace host_transport; // what the host transports share

namespace {

using Clock = std::chrono::steady_clock;

// MPI tags of the control communicator.
constexpr int kTagHeader = 1;
constexpr int kTagHeartbeat = 2;
constexpr int kTagAbort = 3;
constexpr int kTagAlive = 4;
// Payloads larger than this go as several messages (MPI counts are ints).
constexpr size_t kMaxChunk = size_t{1} << 30;

// An abort message's first byte: the failing rank's status code. A byte that
// names no error code (a peer of another version) reads as internal.
StatusCode abort_code(std::byte byte) {
  const auto code = static_cast<StatusCode>(std::to_integer<int>(byte));
  if (code == StatusCode::kOk || status_code_name(code) == "Unknown") return StatusCode::kInternal;
  return code;
}

struct Header {
  uint64_t tag = 0;
  int32_t src = 0; // endpoint: a device, or -1 - rank for a process
  int32_t dst = 0;
  uint64_t bytes = 0;
  uint32_t seq = 0; // MPI tag of the payload on the data communicator
  uint32_t unused = 0;
};

// Where a device is: what heartbeats carry.
struct Position {
  int64_t step = 0;
  int64_t instruction = -1;
};

// The launcher's SIGTERM: the handler only writes the signal number to a
// pipe; the signal thread reads it and does the work.
int g_signal_pipe[2] = {-1, -1};
std::atomic<MpiWorld::Impl *> g_impl{nullptr};

extern "C" void on_signal(int signal) {
  const char byte = static_cast<char>(signal);
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &byte, 1);
}

std::string format_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

// What makes two ranks' process ids comparable: the same kernel (boot id) and
// the same pid namespace. Ranks with the same key can ask the kernel whether
// the other's process still exists, without MPI.
std::string process_space() {
  std::string key = host_name();
  if (FILE *f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof buf, f) != nullptr) key += str_cat("|", buf);
    std::fclose(f);
    while (!key.empty() && key.back() == '\n')
      key.pop_back();
  }
  char ns[128] = {};
  const ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
  if (n > 0) key += str_cat("|", std::string_view(ns, static_cast<size_t>(n)));
  return key;
}

// True when process `pid` has ended (also when it is a zombie nobody reaped).
bool process_ended(long pid) {
  if (FILE *f = std::fopen(str_cat("/proc/", pid, "/stat").c_str(), "r")) {
    char buf[512] = {};
    const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    const std::string_view stat(buf, n);
    const size_t close = stat.rfind(')');
    return close != std::string_view::npos && close + 2 < stat.size() &&
           (stat[close + 2] == 'Z' || stat[close + 2] == 'X');
  }
  return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

int env_ms(const char *name, int fallback) {
  const char *v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

// Written by the signal thread; async-signal-safe output.
void write_stderr(const std::string &text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(2, text.data() + done, text.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
}

} // namespace

bool mpi_built() { return true; }

// ---------------------------------------------------------------------------

class MpiWorld::Impl : public WorldState {
public:
  Impl(int devices, const MpiWorldOptions &options)
      : WorldState(devices), devices_(devices), options_(options) {}

  // A receive a device posted: waits for its header, then its payload.
  struct Posted {
    int src = 0, dst = 0;
    uint64_t tag = 0;
    void *data = nullptr;
    size_t bytes = 0;
    std::string what;
    bool matched = false; // its header arrived
    bool done = false;
    bool abandoned = false; // the waiter gave up (the world failed): keep off `data`
    Status error;
  };
  // A header that arrived before its receive was posted, with the payload when
  // the sender is on this rank.
  struct Arrived {
    Header header;
    int src_rank = 0;
    std::vector<std::byte> local;
  };
  struct OutMessage {
    Header header;
    int dst_rank = 0;
    std::vector<std::byte> payload;
    std::vector<MPI_Request> requests;
  };
  // A payload on its way. It lands in `staging`, owned here, and is copied to
  // the receiver's buffer only if the receiver still waits for it: after a
  // failure the buffer may be gone while MPI still delivers.
  struct InRecv {
    std::shared_ptr<Posted> posted;
    int src_rank = 0;
    uint32_t seq = 0;
    std::vector<MPI_Request> requests;
    std::vector<std::byte> staging;
  };

  // ---- set-up -------------------------------------------------------------

  Status init() {
    // Bounded start-up: MPI_Init waits for every rank of the job.
    std::mutex init_mutex;
    std::condition_variable init_cv;
    bool init_done = false;
    const auto launch = detect_mpi_launch();
    const int my_rank = launch ? launch->rank : 0, job = launch ? launch->size : 1;
    std::thread watchdog([&] {
      std::unique_lock lock(init_mutex);
      if (!init_cv.wait_for(lock, options_.timeout, [&] { return init_done; })) {
        if (claim_failure_report())
          write_stderr(str_cat("strata: error: rank ", my_rank, " of ", job, " (host ", host_name(),
                               "): MPI start-up did not finish within ",
                               format_duration(options_.timeout),
                               ": at least one rank of the job never started or cannot reach "
                               "this one (MPI_Init waits for all ",
                               job,
                               " ranks); check that every host can run strata and reach the "
                               "others\n"));
        std::_Exit(1);
      }
    });
    // Catch the launcher's SIGTERM from here on, MPI_Init included.
    if (g_signal_pipe[0] < 0 && ::pipe(g_signal_pipe) == 0) {
      struct sigaction action = {};
      action.sa_handler = on_signal;
      sigemptyset(&action.sa_mask);
      action.sa_flags = SA_RESTART;
      sigaction(SIGTERM, &action, nullptr);
      sigaction(SIGINT, &action, nullptr);
      std::thread([my_rank, job] { signal_loop(my_rank, job); }).detach();
    }
    // Open MPI's shared-memory transport reads large messages straight from
    // the sender's memory; if the sender has died, that read crashes the
    // receiver. Copy through shared memory instead, so a survivor can report.
    setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", /*overwrite=*/0);
    int provided = 0;
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    if (rc == MPI_SUCCESS && provided >= MPI_THREAD_SERIALIZED) {
      MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
      share_memory(); // collective: within the start-up's bound
    }
    {
      std::lock_guard lock(init_mutex);
      init_done = true;
    }
    init_cv.notify_all();
    watchdog.join();
    if (rc != MPI_SUCCESS) return unavailable("MPI_Init_thread failed (code ", rc, ")");
    if (provided < MPI_THREAD_SERIALIZED)
      return failed_precondition("the MPI library offers thread level ", provided,
                                 "; strata needs MPI_THREAD_SERIALIZED");
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks_);
    MPI_Comm_dup(MPI_COMM_WORLD, &control_);
    MPI_Comm_dup(MPI_COMM_WORLD, &data_);
    MPI_Comm_set_errhandler(control_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(data_, MPI_ERRORS_RETURN);
    void *tag_ub = nullptr;
    int has = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &has);
    tag_limit_ = has ? *static_cast<int *>(tag_ub) : 32767;
    host_ = host_name();
    space_ = process_space();
    const int k = options_.devices_per_rank;
    if (k < 1) return invalid_argument("--devices-per-rank must be at least 1, got ", k);
    const std::string plan =
        str_cat("the plan has ", devices_, " device", devices_ == 1 ? "" : "s");
    if (devices_ % k != 0)
      layout_error_ =
          str_cat(plan, ", which do not split into ranks of ", k, " (--devices-per-rank)");
    else if (devices_ / k != ranks_)
      layout_error_ =
          str_cat(plan, "; with ", k, " device", k == 1 ? "" : "s", " per rank it needs ",
                  devices_ / k, " ranks, but the launcher started ", ranks_,
                  devices_ % ranks_ == 0 ? str_cat(" (run with -np ", devices_ / k,
                                                   ", or keep -np and pass --devices-per-rank ",
                                                   devices_ / ranks_, ")")
                                         : str_cat(" (run with -np ", devices_ / k, ")"));
    positions_.assign(static_cast<size_t>(std::max(devices_, ranks_ * k)), {});
    last_heard_.assign(static_cast<size_t>(ranks_), Clock::now());
    heard_.assign(static_cast<size_t>(ranks_), false);
    next_seq_.assign(static_cast<size_t>(ranks_), 0);
    alive_.assign(static_cast<size_t>(ranks_), false);
    progress_ = std::thread([this] { progress_loop(); });
    return Status::ok();
  }

  // The devices of the ranks on this host share a slot each in one MPI
  // shared-memory window: a segment of options_.shared_bytes, meeting
  // counters, and where the host has room for them, the devices' memory
  // (options_.memory_bytes). Every rank of a job of two or more makes the same
  // collective calls whatever its own sizes (its plan is compared with the
  // others' only later), and the window is used only if every rank made it
  // with the size the others expect: otherwise the buckets travel as
  // messages.
  void share_memory() {
    int ranks = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    if (ranks < 2 || options_.devices_per_rank < 1) return;
    int made = MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL,
                                   &node_) == MPI_SUCCESS;
    std::vector<int> world_ranks; // of this host's ranks, in node order
    if (made) {
      MPI_Comm_set_errhandler(node_, MPI_ERRORS_RETURN);
      world_ranks = node_world_ranks();
      // Each device's place among the host's, for the mailboxes.
      const int k = options_.devices_per_rank;
      host_index_.assign(static_cast<size_t>(ranks * k), -1);
      for (size_t r = 0; r < world_ranks.size(); ++r)
        for (int j = 0; j < k; ++j)
          host_index_[static_cast<size_t>(world_ranks[r] * k + j)] = static_cast<int>(r) * k + j;
      host_devices_ = static_cast<int>(world_ranks.size()) * k;
    }
    // The devices' memory goes in only if every host has room for it.
    int fits = made && memory_fits(world_ranks), agreed = 0;
    if (MPI_Allreduce(&fits, &agreed, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS)
      agreed = 0;
    with_memory_ = agreed != 0;
    int me = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    const size_t per_rank = options_.shared_bytes > 0 || with_memory_ ? rank_bytes(me) : 0;
    if (made) {
      void *base = nullptr;
      made = MPI_Win_allocate_shared(static_cast<MPI_Aint>(per_rank), 1, MPI_INFO_NULL, node_,
                                     &base, &window_) == MPI_SUCCESS;
      if (!made) window_ = MPI_WIN_NULL;
      if (made) MPI_Win_set_errhandler(window_, MPI_ERRORS_RETURN);
      // The meeting counters and mailboxes of this rank's part start at
      // zero (MPI does not promise zeroed memory; the devices' memory is
      // zeroed as it is handed out); the barrier below publishes them.
      if (made && base != nullptr && per_rank > 0) {
        auto *slot = static_cast<std::byte *>(base);
        for (int j = 0; j < options_.devices_per_rank; ++j) {
          std::memset(slot, 0, memory_at());
          slot += slot_bytes(me * options_.devices_per_rank + j);
        }
      }
    }
    // Made on every rank, and with room on every rank: each rank's plan may
    // differ until they are compared.
    int mine[2] = {made, made && per_rank > 0}, all[2] = {0, 0};
    if (MPI_Allreduce(mine, all, 2, MPI_INT, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS)
      all[0] = all[1] = 0;
    if (!all[0]) {
      // Freeing is collective and a rank that could not make the window
      // would not come: MPI_Finalize frees it.
      window_ = MPI_WIN_NULL;
      with_memory_ = false;
      return;
    }
    if (!all[1]) { // freed at the end by every rank; no segments
      with_memory_ = false;
      return;
    }
    segments_.assign(static_cast<size_t>(ranks), nullptr);
    for (size_t r = 0; r < world_ranks.size(); ++r) {
      MPI_Aint size = 0;
      int unit = 0;
      void *segment = nullptr;
      const int world = world_ranks[r];
      if (MPI_Win_shared_query(window_, static_cast<int>(r), &size, &unit, &segment) ==
              MPI_SUCCESS &&
          static_cast<size_t>(size) == rank_bytes(world))
        segments_[static_cast<size_t>(world)] = static_cast<std::byte *>(segment);
    }
    // Every rank zeroed its part before anyone reads a counter.
    MPI_Barrier(node_);
  }

  // The world ranks of this host's ranks, in the order of node_.
  std::vector<int> node_world_ranks() const {
    int node_size = 0;
    MPI_Comm_size(node_, &node_size);
    MPI_Group world_group, node_group;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    MPI_Comm_group(node_, &node_group);
    std::vector<int> node_ranks(static_cast<size_t>(node_size)), world_ranks(node_ranks.size());
    for (int r = 0; r < node_size; ++r)
      node_ranks[static_cast<size_t>(r)] = r;
    MPI_Group_translate_ranks(node_group, node_size, node_ranks.data(), world_group,
                              world_ranks.data());
    MPI_Group_free(&world_group);
    MPI_Group_free(&node_group);
    return world_ranks;
  }

  // Whether the memory of every device of `world_ranks` (this host's) fits
  // in the file system behind Open MPI's shared windows with room to spare.
  // The window's pages are taken as they are touched, and a touch beyond
  // the file system's size kills the process, so this is checked first.
  bool memory_fits(const std::vector<int> &world_ranks) {
    // For the tests and benchmarks of the other path (segments only).
    if (std::getenv("STRATA_DEBUG_PRIVATE_MEMORY") != nullptr) return false;
    if (options_.memory_bytes.size() != static_cast<size_t>(devices_) ||
        std::all_of(options_.memory_bytes.begin(), options_.memory_bytes.end(),
                    [](size_t n) { return n == 0; }))
      return false;
    const char *dir = std::getenv("OMPI_MCA_osc_sm_backing_directory");
    struct statvfs fs = {};
    if (::statvfs(dir != nullptr && *dir != '\0' ? dir : "/dev/shm", &fs) != 0) return false;
    const double room = static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize);
    double need = 0;
    for (int r : world_ranks)
      need += static_cast<double>(rank_bytes(r, /*memory=*/true));
    return need + 256.0 * (1 << 20) <= room;
  }

  // Each device's slot in the window: its segment (shared_bytes, rounded up
  // to a cache line), its meeting counters (per channel and per device of
  // the job, how many shared-memory meetings it has entered with that
  // device; see meet_in_segments), then its memory (with_memory_).
  static constexpr size_t kLine = 64;
  // Bytes of one mailbox (see exchange_in_segments): a line for the
  // writer's size, then what it offers.
  static constexpr size_t kMailbox = 4096;
  static size_t round_to_line(size_t n) { return (n + kLine - 1) / kLine * kLine; }
  size_t counters_at() const { return round_to_line(options_.shared_bytes); }
  size_t mailboxes_at() const {
    return counters_at() + round_to_line(2 * static_cast<size_t>(devices_) * sizeof(uint64_t));
  }
  size_t memory_at() const {
    return mailboxes_at() + 4 * static_cast<size_t>(host_devices_) * kMailbox;
  }
  // Device `device`'s memory bytes in the window, if it holds the memory.
  size_t memory_bytes(int device, bool memory) const {
    const auto d = static_cast<size_t>(device);
    return memory && d < options_.memory_bytes.size() ? options_.memory_bytes[d] : 0;
  }
  size_t memory_bytes(int device) const { return memory_bytes(device, with_memory_); }
  size_t slot_bytes(int device, bool memory) const {
    return memory_at() + round_to_line(memory_bytes(device, memory));
  }
  size_t slot_bytes(int device) const { return slot_bytes(device, with_memory_); }
  // World rank `rank`'s part of the window: its devices' slots.
  size_t rank_bytes(int rank, bool memory) const {
    size_t bytes = 0;
    for (int j = 0; j < options_.devices_per_rank; ++j)
      bytes += slot_bytes(rank * options_.devices_per_rank + j, memory);
    return bytes;
  }
  size_t rank_bytes(int rank) const { return rank_bytes(rank, with_memory_); }
  std::atomic_ref<uint64_t> meetings(int owner, int channel, int peer) const {
    std::byte *counters = segment(owner) + counters_at();
    const size_t at =
        static_cast<size_t>(channel) * static_cast<size_t>(devices_) + static_cast<size_t>(peer);
    return std::atomic_ref<uint64_t>(reinterpret_cast<uint64_t *>(counters)[at]);
  }

  // A barrier of `group` (every member has a segment: ranks on this host)
  // through the window instead of messages: this device counts one more
  // meeting with each member, then waits until each member has counted as
  // many with it. Pairs meet in the same order on both sides (a channel's
  // segment collectives are issued in plan order), so the counts agree. What
  // a member wrote before the meeting, the others see after it (release
  // and acquire on the counters). A waiter spins, then yields, then naps, so
  // a long wait does not take a core from the computation; a failure of the
  // world or the timeout ends it.
  Status meet_in_segments(int device, int channel, const Group &group, std::string_view what) {
    std::vector<std::pair<int, uint64_t>> expect;
    for (int peer : group)
      if (peer != device) {
        std::atomic_ref<uint64_t> mine = meetings(device, channel, peer);
        const uint64_t count = mine.load(std::memory_order_relaxed) + 1;
        mine.store(count, std::memory_order_release);
        expect.emplace_back(peer, count);
      }
    const auto start = Clock::now();
    for (const auto &[peer, count] : expect) {
      std::atomic_ref<uint64_t> theirs = meetings(peer, channel, device);
      for (int round = 0; theirs.load(std::memory_order_acquire) < count; ++round) {
        if (round < 4096) continue; // about 10 us of spinning
        const auto waited = Clock::now() - start;
        if (waited < std::chrono::microseconds(100)) {
          std::this_thread::yield();
          continue;
        }
        std::this_thread::sleep_for(
            std::chrono::microseconds(waited < std::chrono::milliseconds(5) ? 20 : 200));
        std::lock_guard lock(mutex_);
        const std::string operation = operation_text("shared-memory barrier with", peer, 0, what);
        if (failed_) return cascaded_locked(device, operation);
        if (waited >= options_.timeout) return timed_out_locked(device, peer, operation);
      }
    }
    return Status::ok();
  }

  // An all-gather of `bytes` through the window: each member writes its size
  // and, if it fits, `mine` into its mailbox for each other member, they
  // meet, and each reads the others' mailboxes for it. False (nothing
  // gathered): every member offers the same size, too large for a mailbox.
  // Members offering different sizes all fail. A device has two mailboxes
  // per channel and reader on its host, used by turns: the one of the
  // parity of the pair's meetings before this one, which both sides know
  // (their counts agree), so a writer's next use of a mailbox comes two
  // meetings later, after the reader has read it.
  Result<bool> exchange_in_segments(int device, int channel, const Group &group, const void *mine,
                                    size_t bytes, void *all, std::string_view what) {
    auto mailbox = [&](int owner, int reader, uint64_t count) {
      const auto box = (static_cast<size_t>(channel) * static_cast<size_t>(host_devices_) +
                        static_cast<size_t>(host_index_[static_cast<size_t>(reader)])) *
                           2 +
                       count % 2;
      return segment(owner) + mailboxes_at() + box * kMailbox;
    };
    const bool fits = bytes <= kMailbox - kLine;
    std::vector<uint64_t> counts;
    for (int peer : group) {
      const uint64_t count = meetings(device, channel, peer).load(std::memory_order_relaxed);
      counts.push_back(count);
      if (peer == device) continue;
      std::byte *box = mailbox(device, peer, count);
      const uint64_t size = bytes;
      std::memcpy(box, &size, sizeof size);
      if (fits) std::memcpy(box + kLine, mine, bytes);
    }
    RETURN_IF_ERROR(meet_in_segments(device, channel, group, what));
    for (size_t m = 0; m < group.size(); ++m) {
      if (group[m] == device) continue;
      const std::byte *box = mailbox(group[m], device, counts[m]);
      uint64_t size = 0;
      std::memcpy(&size, box, sizeof size);
      if (size != bytes) {
        std::lock_guard lock(mutex_);
        return fail_locked(device, StatusCode::kInvalidArgument,
                           operation_text("shared-memory exchange with", group[m], 0, what),
                           str_cat("it offers ", size, " bytes and this device ", bytes));
      }
    }
    if (!fits) return false;
    for (size_t m = 0; m < group.size(); ++m)
      std::memcpy(static_cast<std::byte *>(all) + m * bytes,
                  group[m] == device ? mine : mailbox(group[m], device, counts[m]) + kLine, bytes);
    return true;
  }

  // Device `device`'s part of its rank's shared segment, or null.
  std::byte *segment(int device) const {
    if (segments_.empty() || device < 0) return nullptr;
    std::byte *base = segments_[static_cast<size_t>(rank_of(device))];
    if (base == nullptr) return nullptr;
    for (int d = device - device % options_.devices_per_rank; d < device; ++d)
      base += slot_bytes(d);
    return base;
  }

  // Device `device`'s memory in the window (with_memory_), or empty.
  std::span<std::byte> memory(int device) const {
    std::byte *slot = with_memory_ ? segment(device) : nullptr;
    if (slot == nullptr) return {};
    return {slot + memory_at(), memory_bytes(device)};
  }

  // Frees the window (collective: every rank, before MPI_Finalize).
  void free_shared_memory() {
    if (window_ != MPI_WIN_NULL) MPI_Win_free(&window_);
    if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
    segments_.clear();
  }

  // From now on the signal thread asks this world who is lost.
  void start_signal_thread() { g_impl = this; }

  // ---- names --------------------------------------------------------------

  int rank_of(int endpoint) const {
    return endpoint < 0 ? -1 - endpoint : endpoint / options_.devices_per_rank;
  }
  bool local(int endpoint) const { return rank_of(endpoint) == rank_; }

  // "device 2 (stage 1) on rank 1"; a process is "rank 1".
  std::string name_locked(int endpoint) const override {
    if (endpoint < 0) return str_cat("rank ", -1 - endpoint);
    std::string name = WorldState::name_locked(endpoint);
    if (ranks_ > 1) name += str_cat(" on rank ", rank_of(endpoint));
    return name;
  }

  // "send to device 3 (stage 3) on rank 3 (activation ...)"; the tag only when
  // nothing better describes the message.
  std::string operation_text(std::string_view verb, int peer, uint64_t tag,
                             std::string_view what) const {
    if (what.empty()) return str_cat(verb, " ", name_locked(peer), ", tag ", tag);
    return str_cat(verb, " ", name_locked(peer), " (", what, ")");
  }

  // "rank 1 is lost: ..." for the ranks nothing was heard from for `quiet`
  // or longer, with where they were; empty when there are none.
  std::string lost_ranks_locked(Clock::time_point now, std::chrono::milliseconds quiet) const {
    std::string text;
    for (int r = 0; r < ranks_; ++r) {
      const auto silence = now - last_heard_[static_cast<size_t>(r)];
      if (r == rank_ || silence < quiet) continue;
      text += str_cat(text.empty() ? "" : "; ", "rank ", r, " is lost: nothing heard from it for ",
                      format_seconds(std::chrono::duration<double>(silence).count()),
                      " (stopped, hung or unreachable); ", whereabouts_locked(r));
    }
    return text;
  }

  // "rank 1 (host h, devices 2-3): last reported step 4, instruction 17 (send
  // 'x' ...) 0.3 s ago"
  std::string whereabouts_locked(int rank) const {
    std::string text = str_cat("rank ", rank, " (devices ");
    const int k = options_.devices_per_rank;
    text += k == 1 ? str_cat(rank) : str_cat(rank * k, "-", rank * k + k - 1);
    text += ")";
    if (!heard_[static_cast<size_t>(rank)]) return text + " never reported";
    const double ago =
        std::chrono::duration<double>(Clock::now() - last_heard_[static_cast<size_t>(rank)])
            .count();
    std::string at;
    for (int d = rank * k; d < rank * k + k; ++d) {
      const Position &p = positions_[static_cast<size_t>(d)];
      if (!at.empty()) at += "; ";
      if (k > 1) at += str_cat("device ", d, " ");
      if (p.instruction < 0) {
        at += p.step == 0 ? std::string("start-up") : str_cat("the end of step ", p.step);
      } else {
        at += str_cat("step ", p.step, ", instruction ", p.instruction);
        if (describe_) at += str_cat(" (", describe_(d, p.instruction), ")");
      }
    }
    return str_cat(text, " was last heard from ", format_seconds(ago), " ago, at ", at);
  }

  // ---- failure ------------------------------------------------------------

  // The code goes first, one byte, so the other ranks report what kind of
  // failure it was (out of memory is not a bug).
  void on_failure_locked(bool spread) override {
    if (spread) abort_to_send_ = str_cat(static_cast<char>(cascade_.code()), cascade_.message());
    cv_.notify_all();
    progress_cv_.notify_one();
  }

  void fail(const Status &reason) {
    std::lock_guard lock(mutex_);
    std::string text = str_cat("rank ", rank_, ": ", reason.message());
    set_failure_locked(Status(reason.code(), text), text);
  }

  // ---- point to point ------------------------------------------------------

  // A send copies the data and returns: after a failure the caller's buffer
  // may be gone while MPI still sends.
  Status send(int src, int dst, const void *data, size_t bytes, uint64_t tag,
              std::string_view what) {
    std::unique_lock lock(mutex_);
    const std::string operation = operation_text("send to", dst, tag, what);
    if (failed_) return cascaded_locked(src, operation);
    // Communicators check their peers (a device may send to itself, as in the
    // local world); this guards the processes' messages, never to themselves.
    if (dst < -ranks_ || dst >= devices_ || (dst < 0 && dst == src))
      return fail_locked(src, StatusCode::kInvalidArgument, operation, "no such peer");
    Header header{tag, src, dst, bytes, 0, 0};
    if (local(dst)) {
      deliver_locked(header, rank_, data);
      return Status::ok();
    }
    const int dst_rank = rank_of(dst);
    header.seq =
        next_seq_[static_cast<size_t>(dst_rank)]++ % static_cast<uint32_t>(std::max(tag_limit_, 1));
    auto message = std::make_unique<OutMessage>();
    message->header = header;
    message->dst_rank = dst_rank;
    message->payload = buffers_.take(bytes);
    if (bytes) std::memcpy(message->payload.data(), data, bytes);
    outbox_.push_back(std::move(message));
    progress_cv_.notify_one();
    return Status::ok();
  }

  // A header (and, from this rank, its payload) reached destination `dst`.
  void deliver_locked(const Header &header, int src_rank, const void *local_data) {
    auto &posted = posted_[header.dst];
    for (auto it = posted.begin(); it != posted.end(); ++it) {
      Posted &p = **it;
      if (p.matched || p.src != header.src || p.tag != header.tag) continue;
      p.matched = true;
      if (p.bytes != header.bytes) {
        p.error = fail_locked(
            p.dst, StatusCode::kInvalidArgument, operation_text("recv from", p.src, p.tag, p.what),
            str_cat("the sender sent ", header.bytes, " bytes, the receiver expects ", p.bytes));
        p.done = true;
        posted.erase(it);
        cv_.notify_all();
        return;
      }
      if (src_rank == rank_) {
        if (p.bytes) std::memcpy(p.data, local_data, p.bytes);
        p.done = true;
        cv_.notify_all();
      } else {
        to_receive_.push_back({*it, src_rank, header.seq, {}, {}});
        progress_cv_.notify_one(); // a device matched a header: post the receive now
      }
      posted.erase(it);
      return;
    }
    Arrived arrived{header, src_rank, {}};
    if (src_rank == rank_ && header.bytes) {
      arrived.local.resize(header.bytes);
      std::memcpy(arrived.local.data(), local_data, header.bytes);
    }
    arrived_[header.dst].push_back(std::move(arrived));
  }

  std::shared_ptr<Posted> post(int dst, int src, void *data, size_t bytes, uint64_t tag,
                               std::string_view what, Status *error) {
    std::lock_guard lock(mutex_);
    const std::string operation = operation_text("recv from", src, tag, what);
    if (failed_) {
      *error = cascaded_locked(dst, operation);
      return nullptr;
    }
    if (src < -ranks_ || src >= devices_ || (src < 0 && src == dst)) {
      *error = fail_locked(dst, StatusCode::kInvalidArgument, operation, "no such peer");
      return nullptr;
    }
    auto p = std::make_shared<Posted>();
    p->src = src;
    p->dst = dst;
    p->tag = tag;
    p->data = data;
    p->bytes = bytes;
    p->what = std::string(what);
    auto &arrived = arrived_[dst];
    for (auto it = arrived.begin(); it != arrived.end(); ++it) {
      if (it->header.src != src || it->header.tag != tag) continue;
      Arrived a = std::move(*it);
      arrived.erase(it);
      posted_[dst].push_front(p); // deliver_locked matches it first
      deliver_locked(a.header, a.src_rank, a.local.data());
      if (p->done && !p->error.is_ok()) {
        *error = p->error;
        return nullptr;
      }
      return p;
    }
    posted_[dst].push_back(p);
    return p;
  }

  Status wait(const std::shared_ptr<Posted> &p) {
    std::unique_lock lock(mutex_);
    const std::string operation = operation_text("recv from", p->src, p->tag, p->what);
    const auto deadline = Clock::now() + options_.timeout;
    ++waiters_;
    wait_began_ = Clock::now(); // the newest wait's start
    progress_cv_.notify_one();
    struct Leave {
      int &count;
      ~Leave() { --count; }
    } leave{waiters_};
    while (!p->done && !failed_) {
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !p->done && !failed_) {
        p->abandoned = true;
        return timed_out_locked(p->dst, p->src, operation);
      }
    }
    if (p->done) return p->error;
    p->abandoned = true;
    return cascaded_locked(p->dst, operation);
  }

  // Ends the world when `device`'s `operation` with `peer` timed out. A rank
  // that went silent is the cause: the error leads with it; else it says
  // where the peer's rank was last heard from.
  Status timed_out_locked(int device, int peer, const std::string &operation) {
    const std::string lost = lost_ranks_locked(
        Clock::now(), std::max(std::chrono::milliseconds(1000), 10 * options_.heartbeat));
    if (!lost.empty()) {
      const std::string text = str_cat(lost, " (", name_locked(device), " timed out after ",
                                       format_duration(options_.timeout), " in ", operation, ")");
      set_failure_locked(Status(StatusCode::kDeadlineExceeded, text), text, true);
      return Status(StatusCode::kDeadlineExceeded, text);
    }
    std::string problem = str_cat("timed out after ", format_duration(options_.timeout));
    const int peer_rank = rank_of(peer);
    if (peer_rank != rank_) problem += str_cat("; ", whereabouts_locked(peer_rank));
    return fail_locked(device, StatusCode::kDeadlineExceeded, operation, problem);
  }

  void abandon(const std::shared_ptr<Posted> &p) {
    std::lock_guard lock(mutex_);
    p->abandoned = true;
  }

  bool ready(const std::shared_ptr<Posted> &p) {
    std::lock_guard lock(mutex_);
    return p->done || failed_;
  }

  // ---- progress thread -----------------------------------------------------

  void progress_loop() {
    // Naps of tens of microseconds: the kernel's default slack (50 us) would
    // double them.
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    auto last_beat = Clock::now() - options_.heartbeat;
    auto last_progress = Clock::now();
    int idle = 0;
    while (true) {
      bool busy = false;
      std::vector<std::unique_ptr<OutMessage>> to_send;
      std::vector<InRecv> to_post;
      std::string abort_text;
      bool stop = false, ping = false;
      {
        std::lock_guard lock(mutex_);
        to_send.swap(outbox_);
        to_post.swap(to_receive_);
        abort_text.swap(abort_to_send_);
        stop = stop_;
        ping = ping_;
        ping_ = false;
      }
      for (auto &message : to_send) {
        busy = true;
        start_send(*message);
        sending_.push_back(std::move(message));
      }
      for (InRecv &in : to_post) {
        busy = true;
        in.staging = buffers_.take(in.posted->bytes);
        std::byte *base = in.staging.data();
        for (size_t off = 0; off < in.posted->bytes; off += kMaxChunk) {
          const size_t n = std::min(kMaxChunk, in.posted->bytes - off);
          MPI_Request request;
          MPI_Irecv(base + off, static_cast<int>(n), MPI_BYTE, in.src_rank,
                    static_cast<int>(in.seq), data_, &request);
          in.requests.push_back(request);
        }
        receiving_.push_back(std::move(in));
      }
      if (!abort_text.empty()) {
        for (int r = 0; r < ranks_; ++r) {
          if (r == rank_) continue;
          auto message = std::make_unique<OutMessage>();
          message->payload.assign(reinterpret_cast<const std::byte *>(abort_text.data()),
                                  reinterpret_cast<const std::byte *>(abort_text.data()) +
                                      abort_text.size());
          MPI_Request request;
          MPI_Isend(message->payload.data(), static_cast<int>(message->payload.size()), MPI_BYTE, r,
                    kTagAbort, control_, &request);
          message->requests.push_back(request);
          control_sends_.push_back(std::move(message));
        }
      }
      if (ping) {
        for (int r = 0; r < ranks_; ++r) {
          if (r == rank_) continue;
          auto message = std::make_unique<OutMessage>();
          message->payload.resize(1);
          MPI_Request request;
          MPI_Isend(message->payload.data(), 1, MPI_BYTE, r, kTagAlive, control_, &request);
          message->requests.push_back(request);
          control_sends_.push_back(std::move(message));
        }
      }
      busy |= test_sends(sending_);
      busy |= test_sends(control_sends_);
      in_flight_ = sending_.size() + control_sends_.size();
      busy |= test_receives();
      busy |= poll_control();
      const auto now = Clock::now();
      bool moved = false, new_step = false, waited_on = false, fresh = false;
      {
        std::lock_guard lock(mutex_);
        moved = moved_;
        new_step = new_step_;
        waited_on = waiters_ > 0 || !outbox_.empty();
        fresh = waiters_ > 0 && now - wait_began_ < kFreshWait;
      }
      // A beat every `heartbeat`, and sooner (a quarter of it) when a device
      // moved on, so the others know where this rank was if it dies.
      if (now - last_beat >= options_.heartbeat || new_step ||
          (moved && now - last_beat >= options_.heartbeat / 4)) {
        last_beat = now;
        send_heartbeats();
        check_lost(now);
      }
      if (stop && sending_.empty() && receiving_.empty()) break;
      // While a transfer is in flight MPI needs this thread to keep polling
      // (large messages move in fragments, each needing a poll on both sides):
      // it spins, yielding. (Napping then, even 5 us at a time, was measured
      // to slow a 45 MB all-reduce by a third.) A receive is posted only when
      // its sender's header is here, so it is under way; a send may wait for
      // a receiver still computing (a pipeline sends ahead), so it keeps the
      // thread spinning only kSendSpin past the last progress. A device
      // waiting for a header needs a poll too, but its peer may be computing
      // for a long while, and a spinning thread takes half the core of the
      // device computing beside it: after a few idle rounds the thread naps,
      // up to kWaitNap, and when nothing at all is expected, up to kIdleNap.
      // Except in a wait's first kFreshWait: most waits (a meeting, a small
      // collective) end within microseconds, and a nap would be most of
      // their time. A device that sends or begins to wait cuts a nap short.
      if (busy) last_progress = now;
      const bool sending = !sending_.empty() && now - last_progress < kSendSpin;
      if (busy || sending || !receiving_.empty()) {
        idle = 0;
      } else {
        idle = std::min(idle + 1, kIdleNap);
        const int cap = waited_on || !sending_.empty() ? kWaitNap : kIdleNap;
        if (idle > kSpins && !fresh) {
          std::unique_lock lock(mutex_);
          const bool began = waiters_ > 0 && Clock::now() - wait_began_ < kFreshWait;
          if (outbox_.empty() && to_receive_.empty() && !stop_ && !ping_ &&
              abort_to_send_.empty() && !began)
            progress_cv_.wait_for(lock, std::chrono::microseconds(std::min(idle, cap)));
        } else {
          std::this_thread::yield();
        }
      }
    }
  }

  void start_send(OutMessage &message) {
    MPI_Request request;
    MPI_Isend(&message.header, sizeof(Header), MPI_BYTE, message.dst_rank, kTagHeader, control_,
              &request);
    message.requests.push_back(request);
    for (size_t off = 0; off < message.payload.size(); off += kMaxChunk) {
      const size_t n = std::min(kMaxChunk, message.payload.size() - off);
      MPI_Isend(message.payload.data() + off, static_cast<int>(n), MPI_BYTE, message.dst_rank,
                static_cast<int>(message.header.seq), data_, &request);
      message.requests.push_back(request);
    }
  }

  static bool all_done(std::vector<MPI_Request> &requests) {
    int done = 0;
    MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
    return done != 0;
  }

  bool test_sends(std::list<std::unique_ptr<OutMessage>> &list) {
    bool any = false;
    for (auto it = list.begin(); it != list.end();) {
      if (all_done((*it)->requests)) {
        buffers_.give(std::move((*it)->payload));
        it = list.erase(it);
        any = true;
      } else {
        ++it;
      }
    }
    return any;
  }

  bool test_receives() {
    bool any = false;
    for (auto it = receiving_.begin(); it != receiving_.end();) {
      if (all_done(it->requests)) {
        {
          std::lock_guard lock(mutex_);
          Posted &p = *it->posted;
          if (!p.abandoned && p.bytes) std::memcpy(p.data, it->staging.data(), p.bytes);
          p.done = true;
        }
        buffers_.give(std::move(it->staging));
        cv_.notify_all();
        it = receiving_.erase(it);
        any = true;
      } else {
        ++it;
      }
    }
    return any;
  }

  // Receives whatever control messages arrived: headers, heartbeats, aborts,
  // liveness answers.
  bool poll_control() {
    bool any = false;
    for (int round = 0; round < 64; ++round) {
      int flag = 0;
      MPI_Message handle;
      MPI_Status status;
      MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, control_, &flag, &handle, &status);
      if (!flag) break;
      any = true;
      int count = 0;
      MPI_Get_count(&status, MPI_BYTE, &count);
      std::vector<std::byte> buffer(static_cast<size_t>(std::max(count, 1)));
      MPI_Mrecv(buffer.data(), count, MPI_BYTE, &handle, MPI_STATUS_IGNORE);
      const int from = status.MPI_SOURCE;
      std::lock_guard lock(mutex_);
      last_heard_[static_cast<size_t>(from)] = Clock::now();
      heard_[static_cast<size_t>(from)] = true;
      switch (status.MPI_TAG) {
      case kTagHeader: {
        Header header;
        if (static_cast<size_t>(count) != sizeof header) break;
        std::memcpy(&header, buffer.data(), sizeof header);
        deliver_locked(header, from, nullptr);
        break;
      }
      case kTagHeartbeat: {
        const size_t k = static_cast<size_t>(options_.devices_per_rank);
        if (static_cast<size_t>(count) != k * sizeof(Position)) break;
        std::memcpy(&positions_[static_cast<size_t>(from) * k], buffer.data(),
                    k * sizeof(Position));
        break;
      }
      case kTagAbort: {
        if (count < 1) break;
        std::string text(reinterpret_cast<const char *>(buffer.data()) + 1,
                         static_cast<size_t>(count) - 1);
        set_failure_locked(Status(abort_code(buffer[0]), text), text, false);
        break;
      }
      case kTagAlive: alive_[static_cast<size_t>(from)] = true; break;
      default: break;
      }
    }
    return any;
  }

  void send_heartbeats() {
    std::vector<std::byte> payload;
    {
      std::lock_guard lock(mutex_);
      const size_t k = static_cast<size_t>(options_.devices_per_rank);
      moved_ = new_step_ = false;
      payload.resize(k * sizeof(Position));
      std::memcpy(payload.data(), &positions_[static_cast<size_t>(rank_) * k], payload.size());
    }
    for (int r = 0; r < ranks_; ++r) {
      if (r == rank_) continue;
      auto message = std::make_unique<OutMessage>();
      message->payload = payload;
      MPI_Request request;
      MPI_Isend(message->payload.data(), static_cast<int>(message->payload.size()), MPI_BYTE, r,
                kTagHeartbeat, control_, &request);
      message->requests.push_back(request);
      control_sends_.push_back(std::move(message));
    }
  }

  // A rank not heard from for the timeout is lost: it stopped, hung or can no
  // longer reach this one.
  void check_lost(Clock::time_point now) {
    std::lock_guard lock(mutex_);
    if (failed_) return;
    const std::string lost = lost_ranks_locked(now, options_.timeout);
    if (!lost.empty()) set_failure_locked(Status(StatusCode::kDeadlineExceeded, lost), lost, true);
  }

  // ---- the launcher's SIGTERM ----------------------------------------------

  static void signal_loop(int my_rank, int job) {
    char byte = 0;
    while (::read(g_signal_pipe[0], &byte, 1) != 1) {
    }
    const int signal = byte;
    if (!claim_failure_report()) {
      // Another thread is writing this rank's report: let it finish the line.
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::_Exit(1);
    }
    Impl *impl = g_impl.load();
    if (impl == nullptr)
      write_stderr(str_cat("strata: error: rank ", my_rank, " of ", job, " (host ", host_name(),
                           "): stopped by the launcher (", signal == SIGINT ? "SIGINT" : "SIGTERM",
                           ") before this rank had joined the job or after it left\n"));
    else
      write_stderr(impl->termination_report(signal));
    std::_Exit(1);
  }

  // Asks every rank whether it is alive (they all got the same SIGTERM), and
  // names those that do not answer within a few hundred milliseconds: the
  // launcher sends SIGKILL one second after SIGTERM.
  //
  // A rank in the same process space (same host and pid namespace) is also
  // asked of the kernel, at once: its process either exists or has ended. That
  // answer holds even when this rank's MPI progress is stuck: after a peer
  // was killed, a survivor was seen (rarely) to receive nothing more at all.
  std::string termination_report(int signal) {
    std::vector<int> ended, running; // same-space peers, as the kernel says
    {
      // Answers that came before this rank's own SIGTERM count too.
      std::lock_guard lock(mutex_);
      ping_ = true;
      for (size_t r = 0; r < peers_.size(); ++r) {
        if (static_cast<int>(r) == rank_ || peers_[r].space != space_) continue;
        (process_ended(peers_[r].pid) ? ended : running).push_back(static_cast<int>(r));
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(env_ms("STRATA_DEBUG_ALIVE_MS", 400)));
    // For the failure tests: this rank acts as if no MPI answer reached it,
    // as when its MPI progress stopped.
    const bool deaf = env_ms("STRATA_DEBUG_DEAF_RANK", -1) == rank_;
    auto has = [](const std::vector<int> &ranks, int r) {
      return std::find(ranks.begin(), ranks.end(), r) != ranks.end();
    };
    std::lock_guard lock(mutex_);
    std::string lost;
    for (int r = 0; r < ranks_; ++r) {
      if (r == rank_ || has(running, r) || (!deaf && alive_[static_cast<size_t>(r)])) continue;
      lost += str_cat(lost.empty() ? "" : "; ", whereabouts_locked(r));
      if (has(ended, r))
        lost +=
            str_cat(", and its process (pid ", peers_[static_cast<size_t>(r)].pid, ") has ended");
    }
    std::string here;
    const int k = options_.devices_per_rank;
    for (int d = rank_ * k; d < rank_ * k + k; ++d) {
      const Position &p = positions_[static_cast<size_t>(d)];
      here +=
          str_cat(here.empty() ? "" : "; ", name_locked(d), " was at ",
                  p.instruction < 0 ? str_cat("the end of step ", p.step)
                                    : str_cat("step ", p.step, ", instruction ", p.instruction));
      if (p.instruction >= 0 && describe_) here += str_cat(" (", describe_(d, p.instruction), ")");
    }
    std::string text =
        str_cat("strata: error: rank ", rank_, " of ", ranks_, " (host ", host_,
                "): stopped by the launcher (", signal == SIGINT ? "SIGINT" : "SIGTERM", ")");
    if (failed_)
      text += str_cat(" after the job failed: ", failure_.message());
    else if (!lost.empty())
      text += str_cat(" because a rank was lost: ", lost);
    else
      text += ": every rank answered, so the job was interrupted, not broken";
    return str_cat(text, ". ", here, "\n");
  }

  // ---- process group --------------------------------------------------------

  Status process_send(int to, const std::string &data, std::string_view what) {
    const uint64_t size = data.size();
    RETURN_IF_ERROR(send(-1 - rank_, -1 - to, &size, sizeof size, 1, what));
    return send(-1 - rank_, -1 - to, data.data(), data.size(), 2, what);
  }
  Status process_recv(int from, std::string *data, std::string_view what) {
    uint64_t size = 0;
    Status error;
    auto p = post(-1 - rank_, -1 - from, &size, sizeof size, 1, what, &error);
    if (!p) return error;
    RETURN_IF_ERROR(wait(p));
    if (size > (uint64_t{1} << 32)) return internal_error("rank ", from, " sent ", size, " bytes");
    data->assign(size, '\0');
    p = post(-1 - rank_, -1 - from, data->data(), size, 2, what, &error);
    if (!p) return error;
    return wait(p);
  }

  // Stops the progress thread once this rank's messages are delivered.
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    progress_cv_.notify_one();
    if (progress_.joinable()) progress_.join();
  }

  // Waits (bounded) until this rank's sends are out of its hands.
  void drain(std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      std::lock_guard lock(mutex_);
      if (outbox_.empty() && abort_to_send_.empty() && in_flight_ == 0) break;
    }
  }

  const int devices_;
  const MpiWorldOptions options_;
  std::string layout_error_; // devices, devices per rank and ranks do not fit
  int rank_ = 0, ranks_ = 1;
  int tag_limit_ = 32767;
  std::string host_;
  // Each rank's process id and process space, known once the ranks agreed.
  struct Peer {
    long pid = 0;
    std::string space;
  };
  std::string space_;
  std::vector<Peer> peers_;
  MPI_Comm control_ = MPI_COMM_NULL, data_ = MPI_COMM_NULL;
  // The shared-memory window of this host's ranks, and each world rank's
  // segment in it as mapped here (null: another host); see share_memory().
  MPI_Comm node_ = MPI_COMM_NULL;
  MPI_Win window_ = MPI_WIN_NULL;
  std::vector<std::byte *> segments_;
  bool with_memory_ = false;    // the devices' memory is in the window
  int host_devices_ = 0;        // devices on this host
  std::vector<int> host_index_; // per device of the job: its place on this host, or -1
  std::thread progress_;

  std::condition_variable cv_; // mutex_ guards what follows
  bool stop_ = false, ping_ = false, moved_ = false, new_step_ = false;
  int waiters_ = 0;    // device threads blocked in wait()
  BufferPool buffers_; // payload copies, recycled by size
  std::string abort_to_send_;
  std::vector<Position> positions_;
  std::vector<Clock::time_point> last_heard_;
  std::vector<bool> heard_, alive_;
  std::vector<uint32_t> next_seq_;
  std::map<int, std::deque<std::shared_ptr<Posted>>> posted_;
  std::map<int, std::deque<Arrived>> arrived_;
  std::vector<std::unique_ptr<OutMessage>> outbox_;
  std::vector<InRecv> to_receive_;
  std::function<std::string(int, int64_t)> describe_;
  std::atomic<size_t> in_flight_{0}; // messages the progress thread still sends
  // The progress thread's naps in microseconds (see progress_loop).
  static constexpr int kSpins = 20, kWaitNap = 50, kIdleNap = 200;
  static constexpr std::chrono::microseconds kSendSpin{1000}, kFreshWait{300};
  std::condition_variable progress_cv_; // wakes the progress thread from a nap
  Clock::time_point wait_began_;        // when the newest wait began
  // Progress thread only.
  std::list<std::unique_ptr<OutMessage>> sending_, control_sends_;
  std::list<InRecv> receiving_;
};

// ---------------------------------------------------------------------------

namespace {

// A receive in flight (one that failed at once is a CompletedRequest).
class MpiRequest : public Request {
public:
  MpiRequest(MpiWorld::Impl *world, std::shared_ptr<MpiWorld::Impl::Posted> posted)
      : world_(world), posted_(std::move(posted)) {}
  ~MpiRequest() override { world_->abandon(posted_); }
  bool ready() override { return world_->ready(posted_); }
  Status wait() override { return world_->wait(posted_); }

private:
  MpiWorld::Impl *world_;
  std::shared_ptr<MpiWorld::Impl::Posted> posted_;
};

// One device's communicator. Collectives are point-to-point messages with
// tags in their own space (the two top bits set, then the channel bit, then a
// per-group sequence). Channel 1 is the device's communication stream (its
// gradient buckets): its collectives count their own sequence, so they never
// meet channel 0's on the same group. (Point-to-point tags are the caller's;
// the plan keeps the two channels' apart.)
class MpiCommunicator : public Communicator {
public:
  MpiCommunicator(MpiWorld::Impl *world, MpiWorld *owner, int device, int devices, int channel = 0)
      : world_(world), owner_(owner), device_(device), devices_(devices), channel_(channel),
        calls_(device, devices) {}

  int rank() const override { return device_; }
  int size() const override { return devices_; }
  std::chrono::milliseconds timeout() const override { return owner_->timeout(); }
  void set_label(std::string label) override { owner_->set_label(device_, std::move(label)); }
  void abort(Status reason) override {
    world_->fail_device(device_, Status(reason.code(), str_cat("aborted: ", reason.message())));
  }
  std::byte *shared_segment(int device) const override { return world_->segment(device); }
  size_t shared_segment_bytes() const override { return world_->options_.shared_bytes; }
  Status segment_barrier(const Group &group, std::string_view what) override {
    if (!in_segments(group)) return barrier(group, what);
    return world_->meet_in_segments(device_, channel_, all_of(group), what);
  }
  Status exchange(const void *mine, size_t bytes, void *all, const Group &group,
                  std::string_view what) override {
    if (!in_segments(group)) return all_gather(mine, bytes, all, group, what);
    ASSIGN_OR_RETURN(bool done, world_->exchange_in_segments(device_, channel_, all_of(group), mine,
                                                             bytes, all, what));
    return done ? Status::ok() : all_gather(mine, bytes, all, group, what);
  }
  // Devices of this rank (--devices-per-rank) are threads of one process;
  // the devices of this host's ranks share their memory in the window.
  bool shares_memory(const Group &group) const override {
    auto reachable = [&](int d) { return world_->local(d) || !world_->memory(d).empty(); };
    if (group.empty()) {
      for (int d = 0; d < devices_; ++d)
        if (!reachable(d)) return false;
      return true;
    }
    return std::all_of(group.begin(), group.end(), reachable);
  }
  // A buffer in this device's memory in the window travels as its offset
  // there; any other as its address, with the top bit set, which only the
  // devices of this process may use.
  uint64_t share_address(const void *data) const override {
    const std::span<std::byte> mine = world_->memory(device_);
    const auto *p = static_cast<const std::byte *>(data);
    if (!mine.empty() && p >= mine.data() && p <= mine.data() + mine.size())
      return static_cast<uint64_t>(p - mine.data());
    return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(data)) | kProcessAddress;
  }
  const void *shared_address(int member, uint64_t token) const override {
    if (token & kProcessAddress)
      return world_->local(member)
                 ? reinterpret_cast<const void *>(static_cast<uintptr_t>(token & ~kProcessAddress))
                 : nullptr;
    const std::span<std::byte> theirs = world_->memory(member);
    return token <= theirs.size() && !theirs.empty() ? theirs.data() + token : nullptr;
  }

protected:
  static constexpr uint64_t kProcessAddress = uint64_t{1} << 63;

  // `group`, or every device for an empty one.
  Group all_of(const Group &group) const {
    if (!group.empty()) return group;
    Group every(static_cast<size_t>(devices_));
    for (int d = 0; d < devices_; ++d)
      every[static_cast<size_t>(d)] = d;
    return every;
  }
  // Whether every member of `group` has a segment mapped here.
  bool in_segments(const Group &group) const {
    const Group members = all_of(group);
    return std::all_of(members.begin(), members.end(),
                       [&](int d) { return world_->segment(d) != nullptr; });
  }

  Status send_impl(const void *data, std::size_t bytes, int peer, uint64_t tag,
                   std::string_view what) override {
    RETURN_IF_ERROR(world_->check_peer(device_, "send to", peer, tag, what));
    return world_->send(device_, peer, data, bytes, tag, what);
  }
  Status recv_impl(void *data, std::size_t bytes, int peer, uint64_t tag,
                   std::string_view what) override {
    RETURN_IF_ERROR(world_->check_peer(device_, "recv from", peer, tag, what));
    Status error;
    auto posted = world_->post(device_, peer, data, bytes, tag, what, &error);
    if (!posted) return error;
    return world_->wait(posted);
  }
  // A copy, as send: the caller's buffer may go away after a failure while
  // MPI would still read it.
  std::unique_ptr<Request> isend_impl(const void *data, std::size_t bytes, int peer, uint64_t tag,
                                      std::string_view what) override {
    return std::make_unique<CompletedRequest>(send_impl(data, bytes, peer, tag, what));
  }
  std::unique_ptr<Request> irecv_impl(void *data, std::size_t bytes, int peer, uint64_t tag,
                                      std::string_view what) override {
    Status error = world_->check_peer(device_, "recv from", peer, tag, what);
    std::shared_ptr<MpiWorld::Impl::Posted> posted;
    if (error.is_ok()) posted = world_->post(device_, peer, data, bytes, tag, what, &error);
    if (!posted) return std::make_unique<CompletedRequest>(std::move(error));
    return std::make_unique<MpiRequest>(world_, std::move(posted));
  }

  Status all_reduce_impl(void *data, std::size_t count, ReduceType type, const Group &group,
                         std::string_view what) override {
    RETURN_IF_ERROR(world_->check_collective(
        device_, calls_, {CollectiveKind::kAllReduce, count, type, -1, 0}, group, what));
    return sum_over_members(data, count, type, with_what("all-reduce", what));
  }

  Status reduce_scatter_impl(const void *input, std::size_t input_count, void *output,
                             std::size_t output_count, ReduceType type, const Group &group,
                             std::string_view what) override {
    RETURN_IF_ERROR(world_->check_collective(
        device_, calls_, {CollectiveKind::kReduceScatter, output_count, type, -1, input_count},
        group, what));
    const size_t width = element_size(type);
    std::vector<std::byte> sum(input_count * width);
    if (!sum.empty()) std::memcpy(sum.data(), input, sum.size());
    RETURN_IF_ERROR(sum_over_members(sum.data(), input_count, type, with_what("all-reduce", what)));
    const size_t chunk = output_count * width;
    if (chunk) std::memcpy(output, sum.data() + calls_.position() * chunk, chunk);
    return Status::ok();
  }

  Status all_gather_impl(const void *input, std::size_t bytes, void *output, const Group &group,
                         std::string_view what) override {
    RETURN_IF_ERROR(world_->check_collective(
        device_, calls_, {CollectiveKind::kAllGather, bytes, ReduceType::kF32, -1, 0}, group,
        what));
    const std::vector<int> &members = calls_.members();
    const uint64_t tag = next_tag();
    const std::string operation = with_what("all-gather", what);
    auto *out = static_cast<std::byte *>(output);
    if (bytes) std::memcpy(out + calls_.position() * bytes, input, bytes);
    for (int peer : members)
      if (peer != device_) RETURN_IF_ERROR(send_impl(input, bytes, peer, tag, operation));
    for (size_t m = 0; m < members.size(); ++m)
      if (members[m] != device_)
        RETURN_IF_ERROR(recv_impl(out + m * bytes, bytes, members[m], tag, operation));
    return Status::ok();
  }

  Status broadcast_impl(void *data, std::size_t bytes, int root, const Group &group,
                        std::string_view what) override {
    RETURN_IF_ERROR(world_->check_collective(
        device_, calls_, {CollectiveKind::kBroadcast, bytes, ReduceType::kF32, root, 0}, group,
        what));
    const uint64_t tag = next_tag();
    const std::string operation = with_what("broadcast", what);
    if (device_ != root) return recv_impl(data, bytes, root, tag, operation);
    for (int peer : calls_.members())
      if (peer != device_) RETURN_IF_ERROR(send_impl(data, bytes, peer, tag, operation));
    return Status::ok();
  }

  Status barrier_impl(const Group &group, std::string_view what) override {
    RETURN_IF_ERROR(world_->check_collective(
        device_, calls_, {CollectiveKind::kBarrier, 0, ReduceType::kF32, -1, 0}, group, what));
    float token = 0;
    return sum_over_members(&token, 1, ReduceType::kF32,
                            with_what("all-reduce", with_what("barrier", what)));
  }

private:
  // Sums the checked group's `data` in place on every member, each element in
  // increasing device order, ((x0 + x1) + x2) + ..., so every member has the
  // local world's bits. Member i sums chunk i (elements [i n / p, (i + 1) n /
  // p)): every member sends it its chunk i; then every member sends its sum
  // to the others. Two rounds whose messages are all under way
  // at once, instead of a round trip through the first member.
  Status sum_over_members(void *data, size_t count, ReduceType type, const std::string &operation) {
    const std::vector<int> &members = calls_.members();
    const uint64_t tag = next_tag();
    const size_t p = members.size(), i = calls_.position(), width = element_size(type);
    auto *base = static_cast<std::byte *>(data);
    auto at = [&](size_t c) { return c * count / p * width; }; // chunk c's first byte
    const size_t mine = at(i + 1) - at(i);
    // Sends copy, so each round's sends go before its receives.
    for (size_t m = 0; m < p; ++m)
      if (m != i)
        RETURN_IF_ERROR(send_impl(base + at(m), at(m + 1) - at(m), members[m], tag, operation));
    std::vector<std::byte> theirs(mine * p);
    for (size_t m = 0; m < p; ++m)
      if (m != i)
        RETURN_IF_ERROR(recv_impl(theirs.data() + m * mine, mine, members[m], tag, operation));
    if (mine > 0) {
      std::memcpy(theirs.data() + i * mine, base + at(i), mine);
      for (size_t m = 1; m < p; ++m)
        add_elements(type, theirs.data(), theirs.data() + m * mine, mine / width);
      std::memcpy(base + at(i), theirs.data(), mine);
    }
    for (size_t m = 0; m < p; ++m)
      if (m != i) RETURN_IF_ERROR(send_impl(base + at(i), mine, members[m], tag, operation));
    for (size_t m = 0; m < p; ++m)
      if (m != i)
        RETURN_IF_ERROR(recv_impl(base + at(m), at(m + 1) - at(m), members[m], tag, operation));
    return Status::ok();
  }

  // The tag of the checked group's next collective.
  uint64_t next_tag() {
    uint64_t hash = 1469598103934665603ull;
    for (int m : calls_.members())
      hash = (hash ^ static_cast<uint64_t>(m)) * 1099511628211ull;
    const auto seq = static_cast<uint32_t>(calls_.next_sequence());
    return (uint64_t{3} << 62) | (static_cast<uint64_t>(channel_) << 61) |
           ((hash & 0x1fffffffull) << 32) | seq;
  }

  MpiWorld::Impl *world_;
  MpiWorld *owner_;
  int device_, devices_, channel_;
  CollectiveCalls calls_;
};

MpiWorld *g_world = nullptr;

} // namespace

// ---------------------------------------------------------------------------

MpiWorld::MpiWorld(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MpiWorld::~MpiWorld() {
  if (g_world == this) g_world = nullptr;
  if (g_impl == impl_.get()) g_impl = nullptr;
  impl_->stop();
}

Result<std::shared_ptr<MpiWorld>> MpiWorld::create(int num_devices,
                                                   const MpiWorldOptions &options) {
  if (g_world != nullptr) return failed_precondition("this process already joined an MPI job");
  if (options.timeout.count() <= 0) return invalid_argument("the timeout must be positive");
  if (num_devices < 1) return invalid_argument("the plan has no devices");
  auto impl = std::make_unique<Impl>(num_devices, options);
  RETURN_IF_ERROR(impl->init());
  std::shared_ptr<MpiWorld> world(new MpiWorld(std::move(impl)));
  g_world = world.get();
  world->impl_->start_signal_thread();
  return world;
}

int MpiWorld::num_devices() const { return impl_->devices_; }
bool MpiWorld::is_local(int device) const { return impl_->local(device); }
std::chrono::milliseconds MpiWorld::timeout() const { return impl_->options_.timeout; }
int MpiWorld::rank() const { return impl_->rank_; }
std::span<std::byte> MpiWorld::shared_memory(int device) const {
  return is_local(device) ? impl_->memory(device) : std::span<std::byte>();
}
int MpiWorld::size() const { return impl_->ranks_; }

void MpiWorld::report(int device, int64_t step, int64_t instruction) {
  std::lock_guard lock(impl_->mutex_);
  auto &position = impl_->positions_[static_cast<size_t>(device)];
  // A new step is news the other ranks hear at once; other moves within a
  // quarter heartbeat.
  if (position.step != step) impl_->new_step_ = true;
  position = {step, instruction};
  impl_->moved_ = true;
}

void MpiWorld::set_describer(std::function<std::string(int, int64_t)> describe) {
  std::lock_guard lock(impl_->mutex_);
  impl_->describe_ = std::move(describe);
}

void MpiWorld::set_label(int device, std::string label) {
  impl_->set_label(device, std::move(label));
}

void MpiWorld::fail(const Status &reason) { impl_->fail(reason); }
Status MpiWorld::failure() const { return impl_->failure(); }

Status MpiWorld::run(const std::function<Status(int device, Communicator &)> &body) {
  return run_with_side(
      [&](int device, Communicator &comm, Communicator *) { return body(device, comm); });
}

Status MpiWorld::run_with_side(
    const std::function<Status(int device, Communicator &, Communicator *)> &body) {
  RETURN_IF_ERROR(failure());
  std::vector<int> locals;
  for (int d = 0; d < impl_->devices_; ++d)
    if (is_local(d)) locals.push_back(d);
  run_device_threads(
      locals,
      [&](int device) {
        MpiCommunicator comm(impl_.get(), this, device, impl_->devices_);
        MpiCommunicator side(impl_.get(), this, device, impl_->devices_, 1);
        return body(device, comm, &side);
      },
      [&](int device, const Status &error) { impl_->fail_device(device, error); });
  return failure();
}

Status MpiWorld::gather(const std::string &mine, std::vector<std::string> *all,
                        std::string_view what) {
  all->clear();
  if (rank() != 0) return impl_->process_send(0, mine, what);
  all->push_back(mine);
  for (int r = 1; r < size(); ++r) {
    std::string data;
    RETURN_IF_ERROR(impl_->process_recv(r, &data, what));
    all->push_back(std::move(data));
  }
  return Status::ok();
}

Status MpiWorld::broadcast(std::string *data, std::string_view what) {
  if (rank() != 0) return impl_->process_recv(0, data, what);
  for (int r = 1; r < size(); ++r)
    RETURN_IF_ERROR(impl_->process_send(r, *data, what));
  return Status::ok();
}

Status MpiWorld::agree(const std::string &fingerprint, const std::string &plan,
                       const std::vector<std::pair<std::string, std::string>> &settings) {
  nlohmann::ordered_json mine = {
      {"strata version", STRATA_VERSION},
      {"plan fingerprint", fingerprint},
      {"world size", size()},
      {"plan devices", impl_->devices_},
      {"devices per rank", impl_->options_.devices_per_rank},
      {"timeout (ms)", static_cast<int64_t>(impl_->options_.timeout.count())},
  };
  for (const auto &[name, value] : settings)
    mine[name] = value;
  std::vector<std::string> all;
  RETURN_IF_ERROR(
      gather(str_cat(mine.dump(), "\n", plan, "\n", impl_->host_), &all, "start-up agreement"));
  std::string verdict;
  if (rank() == 0) {
    std::vector<nlohmann::ordered_json> fields;
    std::vector<std::string> plans, hosts;
    for (const std::string &entry : all) {
      const size_t a = entry.find('\n'), b = entry.rfind('\n');
      fields.push_back(nlohmann::ordered_json::parse(entry.substr(0, a), nullptr, false));
      plans.push_back(entry.substr(a + 1, b - a - 1));
      hosts.push_back(entry.substr(b + 1));
    }
    for (const auto &[key, value] : mine.items()) {
      // Group the ranks by what they have.
      std::map<std::string, std::vector<int>> by_value;
      for (size_t r = 0; r < fields.size(); ++r) {
        const auto &f = fields[r];
        by_value[f.is_object() && f.contains(key) ? f[key].dump() : "(nothing)"].push_back(
            static_cast<int>(r));
      }
      if (by_value.size() == 1) continue;
      std::string differs = str_cat("the ranks disagree on the ", key, ":");
      for (const auto &[v, ranks] : by_value) {
        std::string list;
        for (int r : ranks)
          list += str_cat(list.empty() ? "" : ", ", r, " (", plans[static_cast<size_t>(r)], " on ",
                          hosts[static_cast<size_t>(r)], ")");
        differs += str_cat(" rank", ranks.size() == 1 ? " " : "s ", list, " ha",
                           ranks.size() == 1 ? "s " : "ve ", v, ";");
      }
      differs.pop_back();
      verdict += str_cat(verdict.empty() ? "" : "; ", differs);
    }
    if (verdict.empty() && !impl_->layout_error_.empty()) verdict = impl_->layout_error_;
    if (!verdict.empty())
      verdict += "; every rank must run the same plan and options with the same strata";
  }
  RETURN_IF_ERROR(broadcast(&verdict, "start-up agreement"));
  if (!verdict.empty()) return failed_precondition("start-up check failed: ", verdict);
  // Every rank learns every rank's process, for the termination report.
  std::string table;
  RETURN_IF_ERROR(gather(str_cat(::getpid(), " ", impl_->space_), &all, "start-up agreement"));
  for (const std::string &entry : all)
    table += str_cat(entry, "\n");
  RETURN_IF_ERROR(broadcast(&table, "start-up agreement"));
  std::vector<Impl::Peer> peers;
  for (std::string_view rest = table; !rest.empty();) {
    const size_t end = rest.find('\n');
    const std::string_view line = rest.substr(0, end);
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
    const size_t space = line.find(' ');
    if (space == std::string_view::npos) break;
    peers.push_back({std::atol(std::string(line.substr(0, space)).c_str()),
                     std::string(line.substr(space + 1))});
  }
  if (peers.size() != static_cast<size_t>(size()))
    return internal_error("start-up agreement: got ", peers.size(), " rank processes for ", size(),
                          " ranks");
  std::lock_guard lock(impl_->mutex_);
  impl_->peers_ = std::move(peers);
  return Status::ok();
}

void MpiWorld::finish(bool failed) {
  if (!failed && failure().is_ok()) {
    // Everyone reaches here before anyone finalizes: a rank finalizing early
    // would look like a lost rank to the others.
    std::string token = "done";
    std::vector<std::string> all;
    Status status = gather(token, &all, "finish");
    if (status.is_ok()) status = broadcast(&token, "finish");
    if (status.is_ok()) {
      impl_->stop();
      // MPI_Finalize waits for every rank; bound it like every other wait.
      const auto limit = impl_->options_.timeout;
      const int me = rank();
      std::thread([limit, me] {
        std::this_thread::sleep_for(limit);
        if (claim_failure_report())
          write_stderr(str_cat("strata: error: rank ", me, ": MPI_Finalize did not finish within ",
                               format_duration(limit), "; a rank was lost after the run\n"));
        std::_Exit(1);
      }).detach();
      impl_->free_shared_memory();
      MPI_Finalize();
      return;
    }
    if (claim_failure_report()) write_stderr(str_cat("strata: error: ", status.message(), "\n"));
  }
  claim_failure_report();
  // Give the failure report time to leave this rank, then let the launcher end
  // the job.
  impl_->drain(std::chrono::milliseconds(500));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);
}

} // namespace strata::runtime
