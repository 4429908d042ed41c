// `strata calibrate`: measures this machine's CPU and writes a cluster spec for it.
//
// Each core is one device. Measured: the one-thread sgemm rate (the f32 peak),
// the one-thread memcpy rate (memory bandwidth and the link between cores), a
// thread-to-thread hand-off through shared memory (link latency) and the cost of
// a minimal GEMM call (launch overhead). Memory capacity is the machine's
// physical memory split evenly between the devices.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <thread>
#include <vector>

#include "ops/kernels/cpu/gemm.h"
#include "partitioner/cost/cluster.h"
#include "tools/cli.h"

namespace strata::tools {
namespace {

using Clock = std::chrono::steady_clock;

// Best wall time of `body` over `repeats` calls (the least disturbed run).
double best_seconds(int repeats, const std::function<void()> &body) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    auto start = Clock::now();
    body();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

double measure_sgemm_flops(int64_t size, int repeats) {
  ops::cpu::set_gemm_num_threads(1);
  std::vector<float> a(size * size, 1.0f), b(size * size, 0.5f), c(size * size);
  ops::cpu::GemmShape shape{false, false, size, size, size};
  auto call = [&] {
    ops::cpu::sgemm(shape, 1.0f, a.data(), size, b.data(), size, 0.0f, c.data(), size);
  };
  call(); // warm up: library initialization, page faults
  double seconds = best_seconds(repeats, call);
  ops::cpu::set_gemm_num_threads(0);
  return 2.0 * static_cast<double>(size * size * size) / seconds;
}

// Seconds per minimal (1x1x1) GEMM call: the fixed cost of dispatching a kernel.
double measure_call_overhead() {
  ops::cpu::set_gemm_num_threads(1);
  float a = 1, b = 1, c = 0;
  ops::cpu::GemmShape shape{false, false, 1, 1, 1};
  constexpr int kCalls = 2000;
  double seconds = best_seconds(5, [&] {
    for (int i = 0; i < kCalls; ++i)
      ops::cpu::sgemm(shape, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1);
  });
  ops::cpu::set_gemm_num_threads(0);
  return seconds / kCalls;
}

// Bytes copied per second by one thread's memcpy of `bytes`.
double measure_copy_rate(size_t bytes, int repeats) {
  std::vector<char> from(bytes, 1), to(bytes, 2);
  std::memcpy(to.data(), from.data(), bytes); // warm up
  double seconds = best_seconds(repeats, [&] { std::memcpy(to.data(), from.data(), bytes); });
  return static_cast<double>(bytes) / seconds;
}

// One-way hand-off latency between two threads through a shared atomic: the best
// of several batches, so a batch where the peer was descheduled does not count.
double measure_handoff_latency() {
  constexpr int kBatches = 20, kRounds = 1000;
  std::atomic<int> turn{0};
  std::thread peer([&] {
    for (int i = 0; i < kBatches * kRounds; ++i) {
      while (turn.load(std::memory_order_acquire) != 2 * i + 1) {
      }
      turn.store(2 * i + 2, std::memory_order_release);
    }
  });
  double best = 1e30;
  for (int batch = 0; batch < kBatches; ++batch) {
    auto start = Clock::now();
    for (int j = 0; j < kRounds; ++j) {
      int i = batch * kRounds + j;
      turn.store(2 * i + 1, std::memory_order_release);
      while (turn.load(std::memory_order_acquire) != 2 * i + 2) {
      }
    }
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  peer.join();
  return best / (2.0 * kRounds);
}

struct CalibrateArgs {
  std::string out; // empty: stdout
  int devices = 0; // 0: one per core
  std::string name = "cpu-calibrated";
  bool quick = false;
};

Status calibrate_command(const CalibrateArgs &args, std::ostream &report) {
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int devices = args.devices > 0 ? args.devices : cores;
  const int64_t gemm_size = args.quick ? 512 : 1024;
  const size_t copy_bytes = args.quick ? (size_t{64} << 20) : (size_t{256} << 20);
  const int repeats = args.quick ? 3 : 8;

  // Copy first: GEMM libraries may leave worker threads spinning afterwards.
  double copy = measure_copy_rate(copy_bytes, repeats);
  double flops = measure_sgemm_flops(gemm_size, repeats);
  double overhead = measure_call_overhead();
  double latency = cores > 1 ? measure_handoff_latency() : 1e-6;

  char date[32] = "";
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::localtime(&now));
  long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
  double physical = pages > 0 && page_size > 0 ? static_cast<double>(pages) * page_size : 0;

  partitioner::ClusterSpec spec = partitioner::default_cpu_cluster(devices);
  spec.name = args.name;
  spec.notes = str_cat("Written by `strata calibrate` on ", date, ": one node, ", devices,
                       " devices, each one CPU core (", cores, " cores found).");
  spec.device.peak_flops = {};
  spec.device.peak_flops.f32 = flops;
  spec.device.memory_bandwidth = 2 * copy; // read and write traffic
  if (physical > 0) spec.device.memory_bytes = static_cast<int64_t>(physical / devices);
  spec.device.launch_overhead_s = overhead;
  spec.intra_node = {latency, copy};
  std::string when = str_cat("measured by strata calibrate on ", date, ": ");
  std::string gemm = gemm_backend_name(ops::cpu::gemm_backend()).data();
  spec.sources = {
      {"device.peak_flops.f32",
       str_cat(when, "one-thread sgemm (", gemm, ") ", gemm_size, "^3, best of ", repeats)},
      {"device.memory_bandwidth",
       str_cat(when, "one-thread memcpy of ", copy_bytes >> 20, " MiB, read+write bytes")},
      {"device.memory_bytes", "physical memory (sysconf) divided by the device count"},
      {"device.launch_overhead_s", str_cat(when, "cost of a 1x1x1 sgemm call")},
      {"device.compute_efficiency", "1: the peak is a measured sgemm rate"},
      {"device.memory_efficiency", "1: the bandwidth is a measured copy rate"},
      {"intra_node.latency_s",
       cores > 1 ? str_cat(when, "one-way hand-off between two threads through an atomic")
                 : "assumed (one core: no hand-off to measure)"},
      {"intra_node.bandwidth_Bps", str_cat(when, "one-thread memcpy, bytes copied")},
  };
  RETURN_IF_ERROR(partitioner::validate_cluster(spec, "calibrated spec"));
  std::string text = partitioner::cluster_to_json(spec);
  if (args.out.empty()) {
    report << text;
    return Status::ok();
  }
  std::ofstream file(args.out, std::ios::binary | std::ios::trunc);
  if (!file) return io_error(args.out, ": cannot open for writing");
  file << text;
  file.close();
  if (!file) return io_error(args.out, ": write failed");
  report << "sgemm f32 " << flops / 1e9 << " GFLOP/s per core, memcpy " << copy / 1e9
         << " GB/s, call overhead " << overhead * 1e6 << " us, hand-off latency " << latency * 1e6
         << " us\nwrote " << args.out << " (" << devices << " devices)\n";
  return Status::ok();
}

} // namespace

void add_calibrate(CLI::App &app, Action &action) {
  static CalibrateArgs args;
  CLI::App *sub = app.add_subcommand(
      "calibrate", "Measure this machine's CPU and write a cluster spec (JSON) for it");
  sub->add_option("-o,--output", args.out, "spec file to write (default: print it)")
      ->check(not_empty_path("a spec file"));
  sub->add_option("--devices", args.devices, "devices (cores) in the spec (default: all cores)")
      ->check(CLI::Range(1, 4096));
  sub->add_option("--name", args.name, "the spec's name");
  sub->add_flag("--quick", args.quick, "smaller, faster measurements (less accurate)");
  sub->footer("Examples:\n  strata calibrate -o cpu.json\n  strata calibrate --quick");
  sub->callback([&action] { action = [] { return calibrate_command(args, std::cout); }; });
}

} // namespace strata::tools
