// Point-to-point and all-reduce throughput of strata's communicators, against
// the alpha-beta lower bound of the link they run on.
//
// Without a launcher the P devices are threads over the local communicator;
// under `mpirun -np P` they are ranks over the MPI communicator (one device
// per rank). For each size from 1 KiB to --max-mib MiB:
//   send/recv  device 0 sends n bytes to device 1 and gets them back; the time
//              is half the round trip; bound alpha + n / beta.
//   all-reduce each algorithm the plans may use (runtime/comm/collectives.h:
//              ring, tree, recursive doubling, Rabenseifner) on n bytes of f32
//              over all P devices; bound: that algorithm's alpha-beta cost
//              with the reduction left out (partitioner/cost/cost_model.h;
//              Thakur, Rabenseifner and Gropp, IJHPCA 2005), e.g. the ring's
//              2 (P - 1) (alpha + n / (P beta)).
//   shared     the path the runtime takes when the members share memory
//              (shared_all_reduce, each member reading the others' buffers:
//              threads, or MPI ranks on one host whose buffers are in the
//              MPI-3 shared window), in the ring's order of addition; bound:
//              the lowest of the four algorithms' bounds; memory bound: the
//              ring's, with beta the memcpy bandwidth of one device while
//              all P copy at once (members on one host share its memory,
//              which the alpha-beta model's independent links do not).
//   segments   MPI ranks only: the path the runtime takes when the host has
//              no room for the devices' memory in the window (copy into
//              this rank's shared segment, segment_reduce, copy out); the
//              same bounds.
// alpha and beta come from --alpha / --beta (measured by mpi_alpha_beta with
// MPI alone, which also times MPI_Allreduce: bench/run_comm.sh prints it
// beside these); without them they are the limits for threads sharing memory:
// alpha half the round trip of two threads spinning on one atomic, beta this
// process's memcpy bandwidth. Prints markdown tables with the ratio
// measured / bound per size (1.0 is the bound).
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "partitioner/cost/cost_model.h"
#include "runtime/comm/collectives.h"
#include "runtime/comm/local_communicator.h"
#include "runtime/comm/mpi_world.h"

namespace {

using namespace strata;
using namespace strata::runtime;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double memcpy_bandwidth() {
  const size_t n = size_t{256} << 20;
  std::vector<char> a(n, 1), b(n, 2);
  std::memcpy(b.data(), a.data(), n);
  double best = 1e9;
  for (int i = 0; i < 5; ++i) {
    auto start = Clock::now();
    std::memcpy(b.data(), a.data(), n);
    best = std::min(best, seconds_since(start));
  }
  return static_cast<double>(n) / best;
}

// Half the round trip of a flag between two spinning threads: how fast one
// core can tell another anything.
double spin_latency() {
  std::atomic<int> flag{0};
  const int rounds = 20000;
  std::thread other([&] {
    for (int i = 0; i < rounds; ++i) {
      while (flag.load(std::memory_order_acquire) != 2 * i + 1) {
      }
      flag.store(2 * i + 2, std::memory_order_release);
    }
  });
  auto start = Clock::now();
  for (int i = 0; i < rounds; ++i) {
    flag.store(2 * i + 1, std::memory_order_release);
    while (flag.load(std::memory_order_acquire) != 2 * i + 2) {
    }
  }
  const double t = seconds_since(start) / rounds / 2;
  other.join();
  return t;
}

std::string human(size_t bytes) {
  if (bytes >= (size_t{1} << 20)) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes >> 10) + " KiB";
}

constexpr size_t kAlgos = std::size(kAllCollectiveAlgos);
// Elements per round of the segment path (--block; the runtime's by default).
size_t g_block = kSegmentBlock;

struct Row {
  size_t bytes = 0;
  double sendrecv = 0;
  std::array<double, kAlgos> allreduce{}; // per kAllCollectiveAlgos entry
  double shared = 0;                      // 0: not measured
  double segments = 0;                    // 0: not measured
};

// One all-reduce of `data` over `all` the way the runtime sums a bucket
// whose members read each other's memory (runtime/cpu/comm_transport.cc).
Status shared_path(Communicator &comm, std::span<float> data, const Group &all) {
  return shared_all_reduce(comm, std::span(&data, 1), all, CollectiveAlgo::kRing, "bench");
}

// The same through the members' shared segments, `data` in private memory.
Status segment_path(Communicator &comm, std::span<float> data, const Group &all) {
  std::vector<float *> segments;
  for (int member : all)
    segments.push_back(reinterpret_cast<float *>(comm.shared_segment(member)));
  const size_t p = all.size();
  std::vector<size_t> chunks;
  for (size_t c = 0; c <= p; ++c)
    chunks.push_back(chunk_begin(data.size(), p, c));
  auto pack = [&](size_t begin, size_t end, float *to) {
    std::copy(data.begin() + begin, data.begin() + end, to);
  };
  auto take = [&](size_t begin, size_t end, const float *sum) {
    std::copy(sum, sum + (end - begin), data.begin() + begin);
  };
  return segment_reduce(comm, segments, all, CollectiveAlgo::kRing, chunks, true, pack, take,
                        "bench", g_block);
}

bool has_segments(const Communicator &comm, const Group &all) {
  for (int member : all)
    if (comm.shared_segment(member) == nullptr) return false;
  return true;
}

double median(std::vector<double> &times) {
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

// The median time of a barrier of `all`, of a segment barrier and of an
// exchange of 16 bytes (the meetings of the shared path), each timed over
// 100 in a row.
Status time_meetings(Communicator &comm, const Group &all, double *barrier, double *segment,
                     double *exchange) {
  std::vector<double> plain, shared, swapped;
  for (int r = 0; r < 5; ++r) {
    auto start = Clock::now();
    for (int i = 0; i < 100; ++i)
      RETURN_IF_ERROR(comm.barrier(all, "bench"));
    plain.push_back(seconds_since(start) / 100);
    start = Clock::now();
    for (int i = 0; i < 100; ++i)
      RETURN_IF_ERROR(comm.segment_barrier(all, "bench"));
    shared.push_back(seconds_since(start) / 100);
    start = Clock::now();
    uint64_t mine[2] = {1, 2};
    std::vector<uint64_t> theirs(2 * all.size());
    for (int i = 0; i < 100; ++i)
      RETURN_IF_ERROR(comm.exchange(mine, sizeof mine, theirs.data(), all, "bench"));
    swapped.push_back(seconds_since(start) / 100);
  }
  *barrier = median(plain);
  *segment = median(shared);
  *exchange = median(swapped);
  return Status::ok();
}

// What every device measures before the sizes; device 0's is printed.
struct Host {
  double barrier = 0, segment = 0; // a meeting, each way
  double exchange = 0;             // Communicator::exchange of 16 bytes
  double shared_beta = 0;          // one memcpy's bandwidth while every device copies
};

// This device's memcpy bandwidth while all of `all` copy at once (64 MiB,
// the best of 3): the memory a member of a shared-memory collective gets
// when the others move data too.
Result<double> concurrent_memcpy(Communicator &comm, const Group &all) {
  const size_t n = size_t{64} << 20;
  std::vector<char> a(n, 1), b(n, 2);
  double best = 1e9;
  for (int i = 0; i < 3; ++i) {
    RETURN_IF_ERROR(comm.barrier(all, "bench"));
    auto start = Clock::now();
    std::memcpy(b.data(), a.data(), n);
    best = std::min(best, seconds_since(start));
  }
  return static_cast<double>(n) / best;
}

// Runs on every device; device 0 fills `rows` and `host`. `memory` is the
// device's shared memory (DeviceWorld::shared_memory), or empty.
Status measure(Communicator &comm, size_t max_bytes, std::span<std::byte> memory,
               std::vector<Row> *rows, Host *host) {
  const int p = comm.size(), me = comm.rank();
  Group all;
  for (int d = 0; d < p; ++d)
    all.push_back(d);
  Host mine;
  RETURN_IF_ERROR(time_meetings(comm, all, &mine.barrier, &mine.segment, &mine.exchange));
  ASSIGN_OR_RETURN(mine.shared_beta, concurrent_memcpy(comm, all));
  if (me == 0) *host = mine;
  // The data lives where the runtime's buffers would: in the device's
  // shared memory if it has some.
  std::vector<float> own(memory.empty() ? max_bytes / sizeof(float) : 0);
  const std::span<float> data =
      memory.empty()
          ? std::span<float>(own)
          : std::span<float>(reinterpret_cast<float *>(memory.data()), max_bytes / sizeof(float));
  std::fill(data.begin(), data.end(), 1.0f);
  std::vector<float> private_data(has_segments(comm, all) ? data.size() : 0, 1.0f);
  uint64_t tag = 1;
  // Warm up every path once on small data (the first few hundred calls of a
  // communicator are slower: its tables grow, its threads settle).
  for (int i = 0; i < 300; ++i) {
    std::span<float> span(data.data(), 256);
    for (CollectiveAlgo algo : kAllCollectiveAlgos) {
      RETURN_IF_ERROR(algo_all_reduce(comm, span, all, algo, tag, "bench"));
      tag += 2;
    }
    if (comm.shares_memory(all)) RETURN_IF_ERROR(shared_path(comm, span, all));
  }
  std::fill(data.begin(), data.end(), 1.0f);
  for (size_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
    // Enough repetitions for ~0.2 s of traffic, at least 3.
    const int reps = static_cast<int>(std::clamp<size_t>((size_t{64} << 20) / bytes, 3, 200));
    std::vector<double> pp;
    std::array<std::vector<double>, kAlgos> ar;
    std::vector<double> shared, staged;
    const bool share = comm.shares_memory(all), segmented = !private_data.empty();
    for (int r = 0; r < reps + 1; ++r) {
      RETURN_IF_ERROR(comm.barrier());
      auto start = Clock::now();
      if (me == 0) {
        RETURN_IF_ERROR(comm.send(data.data(), bytes, 1, tag));
        RETURN_IF_ERROR(comm.recv(data.data(), bytes, 1, tag));
      } else if (me == 1) {
        RETURN_IF_ERROR(comm.recv(data.data(), bytes, 0, tag));
        RETURN_IF_ERROR(comm.send(data.data(), bytes, 0, tag));
      }
      const double t = seconds_since(start) / 2;
      ++tag;
      if (r > 0) pp.push_back(t); // the first one warms up
      std::span<float> span(data.data(), bytes / sizeof(float));
      for (size_t a = 0; a < kAlgos; ++a) {
        RETURN_IF_ERROR(comm.barrier());
        start = Clock::now();
        RETURN_IF_ERROR(algo_all_reduce(comm, span, all, kAllCollectiveAlgos[a], tag, "bench"));
        tag += 2; // each algorithm uses tag and tag + 1
        if (r > 0) ar[a].push_back(seconds_since(start));
        // Keep the values finite: the sum grows by p every time.
        std::fill(span.begin(), span.end(), 1.0f);
      }
      if (share) {
        RETURN_IF_ERROR(comm.barrier());
        start = Clock::now();
        RETURN_IF_ERROR(shared_path(comm, span, all));
        if (r > 0) shared.push_back(seconds_since(start));
        std::fill(span.begin(), span.end(), 1.0f);
      }
      if (segmented) {
        std::span<float> mine(private_data.data(), span.size());
        RETURN_IF_ERROR(comm.barrier());
        start = Clock::now();
        RETURN_IF_ERROR(segment_path(comm, mine, all));
        if (r > 0) staged.push_back(seconds_since(start));
        std::fill(mine.begin(), mine.end(), 1.0f);
      }
    }
    // The slowest device decides an all-reduce; take device 0's median.
    Row row{bytes, median(pp), {}};
    for (size_t a = 0; a < kAlgos; ++a)
      row.allreduce[a] = median(ar[a]);
    if (share) row.shared = median(shared);
    if (segmented) row.segments = median(staged);
    if (me == 0) rows->push_back(row);
  }
  return Status::ok();
}

// The two tables: send/recv, then each all-reduce algorithm, against their
// alpha-beta bounds.
void print_tables(const std::vector<Row> &rows, int ranks, double alpha, double beta,
                  double shared_beta) {
  std::printf("| size | send/recv | bound | ratio |\n");
  std::printf("|---:|---:|---:|---:|\n");
  for (const Row &row : rows) {
    const double bound = alpha + static_cast<double>(row.bytes) / beta;
    std::printf("| %s | %.1f us | %.1f us | %.2f |\n", human(row.bytes).c_str(), row.sendrecv * 1e6,
                bound * 1e6, row.sendrecv / bound);
  }
  std::printf("\nall-reduce: measured, alpha-beta bound, ratio\n\n| size |");
  for (CollectiveAlgo algo : kAllCollectiveAlgos)
    std::printf(" %s | bound | ratio |", std::string(collective_algo_name(algo)).c_str());
  const bool segments =
      std::any_of(rows.begin(), rows.end(), [](const Row &row) { return row.segments > 0; });
  std::printf(" shared | bound | ratio | memory bound | ratio |");
  if (segments) std::printf(" segments | ratio | memory ratio |");
  std::printf(" fastest |\n|---:|");
  for (size_t a = 0; a < kAlgos + 1; ++a)
    std::printf("---:|---:|---:|");
  std::printf("---:|---:|");
  if (segments) std::printf("---:|---:|---:|");
  std::printf("---|\n");
  const partitioner::LinkSpec link{alpha, beta};
  const double no_reduction = std::numeric_limits<double>::infinity();
  for (const Row &row : rows) {
    std::printf("| %s |", human(row.bytes).c_str());
    size_t fastest = 0;
    double lowest = no_reduction;
    for (size_t a = 0; a < kAlgos; ++a) {
      const auto algorithm =
          partitioner::collective_algorithm_named(collective_algo_name(kAllCollectiveAlgos[a]));
      const double bound = algorithm
                               ? partitioner::all_reduce_time(static_cast<double>(row.bytes), ranks,
                                                              link, *algorithm, no_reduction)
                               : 0;
      std::printf(" %.1f us | %.1f us | %.2f |", row.allreduce[a] * 1e6, bound * 1e6,
                  bound > 0 ? row.allreduce[a] / bound : 0);
      lowest = std::min(lowest, bound);
      if (row.allreduce[a] < row.allreduce[fastest]) fastest = a;
    }
    std::string best(collective_algo_name(kAllCollectiveAlgos[fastest]));
    double best_time = row.allreduce[fastest];
    // The ring's bound again, each member's link as fast as its memcpy
    // while every member copies.
    const double memory = partitioner::all_reduce_time(
        static_cast<double>(row.bytes), ranks, partitioner::LinkSpec{alpha, shared_beta},
        partitioner::CollectiveAlgorithm::kRing, no_reduction);
    if (row.shared > 0) {
      std::printf(" %.1f us | %.1f us | %.2f | %.1f us | %.2f |", row.shared * 1e6, lowest * 1e6,
                  row.shared / lowest, memory * 1e6, row.shared / memory);
      if (row.shared < best_time) best = "shared", best_time = row.shared;
    } else {
      std::printf(" - | - | - | - | - |");
    }
    if (segments) {
      if (row.segments > 0)
        std::printf(" %.1f us | %.2f | %.2f |", row.segments * 1e6, row.segments / lowest,
                    row.segments / memory);
      else
        std::printf(" - | - | - |");
      if (row.segments > 0 && row.segments < best_time) best = "segments";
    }
    std::printf(" %s |\n", best.c_str());
  }
}

} // namespace

int main(int argc, char **argv) {
  int ranks = 2;
  size_t max_mib = 256;
  double alpha = 0, beta = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--ranks")
      ranks = std::atoi(argv[i + 1]);
    else if (flag == "--max-mib")
      max_mib = static_cast<size_t>(std::atol(argv[i + 1]));
    else if (flag == "--alpha")
      alpha = std::atof(argv[i + 1]);
    else if (flag == "--block")
      g_block = static_cast<size_t>(std::atol(argv[i + 1]));
    else if (flag == "--beta")
      beta = std::atof(argv[i + 1]);
    else {
      std::fprintf(stderr, "comm_bench: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  const auto launch = detect_mpi_launch();
  const bool mpi = launch && launch->size > 1;
  if (mpi) ranks = launch->size;
  if (ranks < 2) {
    std::fprintf(stderr, "comm_bench: needs 2 or more devices\n");
    return 2;
  }
  if (beta <= 0) {
    beta = memcpy_bandwidth();
    if (!mpi) alpha = spin_latency();
  }
  const size_t max_bytes = max_mib << 20;
  std::vector<Row> rows;
  Host host;
  Status status;
  bool speaker = true;
  std::shared_ptr<MpiWorld> world;
  const auto timeout = std::chrono::milliseconds(600'000);
  if (mpi) {
    MpiWorldOptions options;
    options.timeout = timeout;
    options.shared_bytes = kSegmentRounds * g_block * sizeof(float);    // the "segments" column's
    options.memory_bytes.assign(static_cast<size_t>(ranks), max_bytes); // the "shared" column's
    auto created = MpiWorld::create(ranks, options);
    if (!created.is_ok()) {
      std::fprintf(stderr, "comm_bench: %s\n", created.status().message().c_str());
      return 1;
    }
    world = *created;
    speaker = world->rank() == 0;
    status = world->run([&](int device, Communicator &comm) {
      return measure(comm, max_bytes, world->shared_memory(device), &rows, &host);
    });
  } else {
    status = run_on_threads(
        ranks, [&](int, Communicator &comm) { return measure(comm, max_bytes, {}, &rows, &host); },
        timeout);
  }
  if (!status.is_ok()) {
    std::fprintf(stderr, "comm_bench: %s\n", status.message().c_str());
    if (world) world->finish(true);
    return 1;
  }
  if (speaker) {
    std::printf("%s communicator, %d devices; bound: alpha %.2e s, beta %.2f GB/s (%s)\n\n",
                mpi ? "MPI" : "local", ranks, alpha, beta / 1e9,
                mpi ? "MPI ping-pong, mpi_alpha_beta" : "spinning threads, memcpy");
    std::printf("meetings of all %d: barrier %.1f us, segment barrier %.1f us, exchange of 16 "
                "bytes %.1f us; memcpy while all %d copy: %.2f GB/s\n\n",
                ranks, host.barrier * 1e6, host.segment * 1e6, host.exchange * 1e6, ranks,
                host.shared_beta / 1e9);
    print_tables(rows, ranks, alpha, beta, host.shared_beta);
  }
  if (world) world->finish(false);
  return 0;
}
