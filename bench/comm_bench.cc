// Point-to-point and all-reduce throughput of strata's communicators, against
// the alpha-beta lower bound of the link they run on.
//
// Without a launcher the P devices are threads over the local communicator;
// under `mpirun -np P` they are ranks over the MPI communicator (one device
// per rank). For each size from 1 KiB to --max-mib MiB:
//   send/recv  device 0 sends n bytes to device 1 and gets them back; the time
//              is half the round trip; bound alpha + n / beta.
//   all-reduce the ring all-reduce the plans use (runtime/comm/collectives.h) of n
//              bytes of f32 over all P devices; bound 2 (P - 1) (alpha +
//              n / (P beta)) (Thakur, Rabenseifner and Gropp, IJHPCA 2005).
// alpha and beta come from --alpha / --beta (measured by mpi_alpha_beta with
// MPI alone); without them they are the limits for threads sharing memory:
// alpha half the round trip of two threads spinning on one atomic, beta this
// process's memcpy bandwidth. Prints a markdown table with the
// ratio measured / bound per size (1.0 is the bound).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

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

struct Row {
  size_t bytes = 0;
  double sendrecv = 0, allreduce = 0;
};

// Runs on every device; device 0 fills `rows`.
Status measure(Communicator &comm, size_t max_bytes, std::vector<Row> *rows) {
  const int p = comm.size(), me = comm.rank();
  Group all;
  for (int d = 0; d < p; ++d)
    all.push_back(d);
  std::vector<float> data(max_bytes / sizeof(float), 1.0f);
  uint64_t tag = 1;
  for (size_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
    // Enough repetitions for ~0.2 s of traffic, at least 3.
    const int reps = static_cast<int>(std::clamp<size_t>((size_t{64} << 20) / bytes, 3, 200));
    std::vector<double> pp, ar;
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
      RETURN_IF_ERROR(comm.barrier());
      start = Clock::now();
      std::span<float> span(data.data(), bytes / sizeof(float));
      RETURN_IF_ERROR(algo_all_reduce(comm, span, all, CollectiveAlgo::kRing, tag, "bench"));
      tag += 2;
      const double u = seconds_since(start);
      if (r > 0) { // the first one warms up
        pp.push_back(t);
        ar.push_back(u);
      }
      // Keep the values finite: the sum grows by p every time.
      std::fill(span.begin(), span.end(), 1.0f);
    }
    // The slowest device decides an all-reduce; take device 0's median.
    std::nth_element(pp.begin(), pp.begin() + pp.size() / 2, pp.end());
    std::nth_element(ar.begin(), ar.begin() + ar.size() / 2, ar.end());
    if (me == 0) rows->push_back({bytes, pp[pp.size() / 2], ar[ar.size() / 2]});
  }
  return Status::ok();
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
  Status status;
  bool speaker = true;
  std::shared_ptr<MpiWorld> world;
  const auto timeout = std::chrono::milliseconds(600'000);
  if (mpi) {
    MpiWorldOptions options;
    options.timeout = timeout;
    auto created = MpiWorld::create(ranks, options);
    if (!created.is_ok()) {
      std::fprintf(stderr, "comm_bench: %s\n", created.status().message().c_str());
      return 1;
    }
    world = *created;
    speaker = world->rank() == 0;
    status = world->run([&](int, Communicator &comm) { return measure(comm, max_bytes, &rows); });
  } else {
    status = run_on_threads(
        ranks, [&](int, Communicator &comm) { return measure(comm, max_bytes, &rows); }, timeout);
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
    std::printf("| size | send/recv | bound | ratio | all-reduce (ring) | bound | ratio |\n");
    std::printf("|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const Row &row : rows) {
      const double n = static_cast<double>(row.bytes);
      const double pp_bound = alpha + n / beta;
      const double ar_bound = 2.0 * (ranks - 1) * (alpha + n / (ranks * beta));
      std::printf("| %s | %.1f us | %.1f us | %.2f | %.1f us | %.1f us | %.2f |\n",
                  human(row.bytes).c_str(), row.sendrecv * 1e6, pp_bound * 1e6,
                  row.sendrecv / pp_bound, row.allreduce * 1e6, ar_bound * 1e6,
                  row.allreduce / ar_bound);
    }
  }
  if (world) world->finish(false);
  return 0;
}
