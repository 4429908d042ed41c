// Tests of the cost model: roofline op times, alpha-beta transfers and the
// collective formulas, checked against numbers worked out by hand.
#include "partitioner/cost/cost_model.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "graph/builder.h"

namespace strata::partitioner {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// alpha = 5 us, beta = 1 / (100 GB/s): easy numbers for hand computation.
const LinkSpec kLink{5e-6, 100e9};
constexpr double kGB = 1e9;

void expect_near_rel(double actual, double expected, double rel = 1e-12) {
  EXPECT_NEAR(actual, expected, std::abs(expected) * rel) << "expected " << expected;
}

TEST(Transfer, AlphaBeta) {
  expect_near_rel(transfer_time(1 * kGB, kLink), 5e-6 + 0.01);
  expect_near_rel(transfer_time(1, kLink), 5e-6 + 1e-11);
  EXPECT_EQ(transfer_time(0, kLink), 0.0);
}

TEST(AllReduce, RingOfOneGigabyteOverEightRanks) {
  // 2(p-1) a + 2((p-1)/p) n b = 14 * 5e-6 + 2 * 7/8 * 1e9 / 1e11 = 7e-5 + 0.0175
  expect_near_rel(all_reduce_time(kGB, 8, kLink, CollectiveAlgorithm::kRing, kInf), 0.01757);
  // + ((p-1)/p) n g with g = 1 / (200 GB/s): 7/8 * 1e9 / 2e11 = 0.004375
  expect_near_rel(all_reduce_time(kGB, 8, kLink, CollectiveAlgorithm::kRing, 200e9),
                  0.01757 + 0.004375);
}

TEST(AllReduce, OtherAlgorithmsByHand) {
  // Recursive doubling: lg p a + n lg p b + n lg p g = 3*5e-6 + 3*0.01 (+ 3*0.005).
  expect_near_rel(all_reduce_time(kGB, 8, kLink, CollectiveAlgorithm::kRecursiveDoubling, kInf),
                  0.030015);
  expect_near_rel(all_reduce_time(kGB, 8, kLink, CollectiveAlgorithm::kRecursiveDoubling, 200e9),
                  0.030015 + 0.015);
  // Rabenseifner: 2 lg p a + 2((p-1)/p) n b + ((p-1)/p) n g = 6*5e-6 + 0.0175 + 0.004375.
  expect_near_rel(all_reduce_time(kGB, 8, kLink, CollectiveAlgorithm::kRabenseifner, 200e9),
                  3e-5 + 0.0175 + 0.004375);
  // Tree (reduce + broadcast): 2 lg p (a + n b) + n lg p g = 6*(5e-6 + 0.01) + 3*0.005.
  expect_near_rel(all_reduce_time(kGB, 8, kLink, CollectiveAlgorithm::kTree, 200e9),
                  6 * (5e-6 + 0.01) + 0.015);
  // p = 6 is not a power of two: lg p rounds up to 3.
  expect_near_rel(all_reduce_time(kGB, 6, kLink, CollectiveAlgorithm::kRecursiveDoubling, kInf),
                  0.030015);
  // p = 6 ring: 10 a + 2 * 5/6 * 0.01.
  expect_near_rel(all_reduce_time(kGB, 6, kLink, CollectiveAlgorithm::kRing, kInf),
                  5e-5 + 2.0 * 5.0 / 6.0 * 0.01);
}

TEST(AllReduce, OneRankOrNoBytesIsFree) {
  for (CollectiveAlgorithm algorithm : kAllCollectiveAlgorithms) {
    EXPECT_EQ(all_reduce_time(kGB, 1, kLink, algorithm, kInf), 0.0);
    EXPECT_EQ(all_reduce_time(0, 8, kLink, algorithm, kInf), 0.0);
    EXPECT_EQ(all_gather_time(kGB, 1, kLink, algorithm), 0.0);
    EXPECT_EQ(reduce_scatter_time(kGB, 1, kLink, algorithm, kInf), 0.0);
    EXPECT_EQ(broadcast_time(kGB, 1, kLink, algorithm), 0.0);
  }
}

TEST(AllReduce, AlgorithmNamesRoundTrip) {
  for (CollectiveAlgorithm algorithm : kAllCollectiveAlgorithms)
    EXPECT_TRUE(collective_algorithm_named(collective_algorithm_name(algorithm)) == algorithm)
        << collective_algorithm_name(algorithm);
  EXPECT_FALSE(collective_algorithm_named("butterfly").has_value());
}

TEST(AllReduce, RingWinsLargeMessagesLosesTinyOnes) {
  for (int p : {4, 8, 16, 64}) {
    SCOPED_TRACE(p);
    double ring_large = all_reduce_time(kGB, p, kLink, CollectiveAlgorithm::kRing, 200e9);
    double rd_large =
        all_reduce_time(kGB, p, kLink, CollectiveAlgorithm::kRecursiveDoubling, 200e9);
    EXPECT_LT(ring_large, rd_large);
    double ring_tiny = all_reduce_time(8, p, kLink, CollectiveAlgorithm::kRing, 200e9);
    double rd_tiny = all_reduce_time(8, p, kLink, CollectiveAlgorithm::kRecursiveDoubling, 200e9);
    EXPECT_GT(ring_tiny, rd_tiny);
  }
}

TEST(AllReduce, BestAlgorithm) {
  // Tiny messages are latency-bound: recursive doubling's lg p steps win.
  CollectiveChoice tiny = best_all_reduce(8, 8, kLink, 200e9);
  EXPECT_EQ(tiny.algorithm, CollectiveAlgorithm::kRecursiveDoubling);
  expect_near_rel(tiny.time_s,
                  all_reduce_time(8, 8, kLink, CollectiveAlgorithm::kRecursiveDoubling, 200e9));
  // Large messages need the bandwidth-optimal 2((p-1)/p) n b term: ring or
  // Rabenseifner (the latter has fewer latency terms on a uniform link).
  CollectiveChoice large = best_all_reduce(kGB, 8, kLink, 200e9);
  EXPECT_EQ(large.algorithm, CollectiveAlgorithm::kRabenseifner);
  for (CollectiveAlgorithm algorithm : kAllCollectiveAlgorithms) {
    EXPECT_LE(large.time_s, all_reduce_time(kGB, 8, kLink, algorithm, 200e9));
  }
  EXPECT_EQ(collective_algorithm_name(large.algorithm), "rabenseifner");
}

TEST(OtherCollectives, ByHand) {
  const double n = kGB, b = 1e-11, a = 5e-6, g = 1.0 / 200e9;
  // All-gather, ring: 7a + 7/8 n b; recursive doubling: 3a + 7/8 n b.
  expect_near_rel(all_gather_time(n, 8, kLink, CollectiveAlgorithm::kRing), 7 * a + 0.875 * n * b);
  expect_near_rel(all_gather_time(n, 8, kLink, CollectiveAlgorithm::kRecursiveDoubling),
                  3 * a + 0.875 * n * b);
  expect_near_rel(all_gather_time(n, 8, kLink, CollectiveAlgorithm::kTree),
                  3 * a + 0.875 * n * b + 3 * (a + n * b));
  // Reduce-scatter, ring: 7a + 7/8 n (b + g); recursive halving: 3a + the same.
  expect_near_rel(reduce_scatter_time(n, 8, kLink, CollectiveAlgorithm::kRing, 200e9),
                  7 * a + 0.875 * n * (b + g));
  expect_near_rel(reduce_scatter_time(n, 8, kLink, CollectiveAlgorithm::kRabenseifner, 200e9),
                  3 * a + 0.875 * n * (b + g));
  // All-to-all: 7 messages of n / 64 each: 7a + 7/64 n b; one member moves nothing.
  expect_near_rel(all_to_all_time(n, 8, kLink), 7 * a + 7.0 / 64 * n * b);
  EXPECT_EQ(all_to_all_time(n, 1, kLink), 0.0);
  // Broadcast, binomial tree: 3 (a + n b); scatter + ring all-gather: (3 + 7) a + 2 * 7/8 n b.
  expect_near_rel(broadcast_time(n, 8, kLink, CollectiveAlgorithm::kTree), 3 * (a + n * b));
  expect_near_rel(broadcast_time(n, 8, kLink, CollectiveAlgorithm::kRing), 10 * a + 1.75 * n * b);
  expect_near_rel(broadcast_time(n, 8, kLink, CollectiveAlgorithm::kRabenseifner),
                  6 * a + 1.75 * n * b);
  // A ring all-reduce is a ring reduce-scatter followed by a ring all-gather.
  expect_near_rel(all_reduce_time(n, 8, kLink, CollectiveAlgorithm::kRing, 200e9),
                  reduce_scatter_time(n, 8, kLink, CollectiveAlgorithm::kRing, 200e9) +
                      all_gather_time(n, 8, kLink, CollectiveAlgorithm::kRing));
  // Rabenseifner = recursive halving + recursive doubling.
  expect_near_rel(all_reduce_time(n, 8, kLink, CollectiveAlgorithm::kRabenseifner, 200e9),
                  reduce_scatter_time(n, 8, kLink, CollectiveAlgorithm::kRabenseifner, 200e9) +
                      all_gather_time(n, 8, kLink, CollectiveAlgorithm::kRecursiveDoubling));
  // Large broadcasts prefer scatter + all-gather over the binomial tree.
  EXPECT_NE(best_collective(Collective::kBroadcast, n, 8, kLink, kInf).algorithm,
            CollectiveAlgorithm::kTree);
  EXPECT_EQ(best_collective(Collective::kBroadcast, 8, 8, kLink, kInf).algorithm,
            CollectiveAlgorithm::kTree);
}

TEST(Collectives, NvlinkBusBandwidthReproducesTheReference) {
  // With B = 370 GB/s per GPU, a large ring all-reduce shows nccl-tests' bus
  // bandwidth algbw * 2(p-1)/p of about 370 GB/s.
  const LinkSpec nvlink{2e-6, 370e9};
  const double n = 8 * kGB;
  double time = all_reduce_time(n, 8, nvlink, CollectiveAlgorithm::kRing, kInf);
  double busbw = n / time * 2.0 * 7.0 / 8.0;
  EXPECT_NEAR(busbw / 370e9, 1.0, 1e-3);
}

DeviceSpec test_gpu() {
  DeviceSpec device;
  device.name = "gpu";
  device.kind = "gpu";
  device.peak_flops.f32 = 50e12;
  device.peak_flops.bf16 = 1000e12;
  device.memory_bandwidth = 2e12;
  device.memory_bytes = 1 << 30;
  device.launch_overhead_s = 3e-6;
  device.compute_efficiency = 0.8;
  device.memory_efficiency = 0.5;
  return device;
}

TEST(Roofline, PicksComputeOrMemoryBound) {
  DeviceSpec device = test_gpu();
  // 1e12 FLOPs in bf16 at 800 TFLOP/s effective = 1.25 ms; 1e6 bytes at 1 TB/s = 1 us.
  ops::OpCost gemm{1e12, 6e5, 4e5};
  RooflineTime t = roofline(gemm, DType::kBF16, device);
  EXPECT_TRUE(t.compute_bound());
  expect_near_rel(t.compute_s, 1.25e-3);
  expect_near_rel(t.memory_s, 1e-6);
  expect_near_rel(t.total_s, 3e-6 + 1.25e-3);
  // The same work in f32 runs at 40 TFLOP/s effective: 25 ms.
  expect_near_rel(op_time(gemm, DType::kF32, device), 3e-6 + 25e-3);
  // An elementwise op: 1e8 FLOPs (0.125 us) against 2e9 bytes at 1 TB/s = 2 ms.
  ops::OpCost add{1e8, 1.2e9, 0.8e9};
  RooflineTime e = roofline(add, DType::kBF16, device);
  EXPECT_FALSE(e.compute_bound());
  expect_near_rel(e.total_s, 3e-6 + 2e-3);
  // No work: only the launch.
  EXPECT_EQ(op_time(ops::OpCost{}, DType::kF32, device), 3e-6);
  // Integer work uses the f32 rate.
  expect_near_rel(roofline(ops::OpCost{4e12, 0, 0}, DType::kI64, device).compute_s, 0.1);
}

TEST(Roofline, ReduceRate) {
  DeviceSpec device = test_gpu();
  // min(2e12 * 0.5 / 3, 1000e12 * 0.8 * 2 bytes): memory wins.
  expect_near_rel(reduce_bytes_per_second(device, DType::kBF16), 1e12 / 3);
  DeviceSpec slow = device;
  slow.peak_flops.f32 = 1e9;
  slow.compute_efficiency = 1.0;
  expect_near_rel(reduce_bytes_per_second(slow, DType::kF32), 4e9);
}

Graph matmul_graph(int64_t m, int64_t n, int64_t k) {
  GraphBuilder b("mm", ops::OpRegistry::global());
  TensorId x = b.input("x", DType::kF32, {m, k});
  TensorId w = b.parameter("w", DType::kF32, {k, n}, Initializer{Initializer::Kind::kZeros});
  TensorId y = b.op1("MatMul", {x, w}, {}, "matmul");
  TensorId z = b.op1("Relu", {y}, {}, "relu");
  b.output(z);
  Result<Graph> graph = std::move(b).finish();
  EXPECT_TRUE(graph.is_ok()) << graph.status().to_string();
  return std::move(graph).value();
}

TEST(NodeTime, MatMulOnTheCpuSpecIsTwoMnkOverPeak) {
  const int64_t m = 512, n = 1024, k = 768;
  Graph graph = matmul_graph(m, n, k);
  ClusterSpec cpu = default_cpu_cluster(2);
  NodeId matmul = *graph.find_node("matmul");
  double expected = 2.0 * m * n * k / cpu.device.peak_flops.f32;
  double time = node_time(graph, matmul, cpu.device);
  // Compute-bound: exactly launch + 2MNK / peak.
  expect_near_rel(time, cpu.device.launch_overhead_s + expected);
  EXPECT_NEAR(time / expected, 1.0, 0.01);
  EXPECT_EQ(node_compute_dtype(graph, matmul), DType::kF32);

  // Relu is memory-bound: 2 MN * 4 bytes at the memory bandwidth.
  NodeId relu = *graph.find_node("relu");
  double relu_time = node_time(graph, relu, cpu.device);
  expect_near_rel(relu_time,
                  cpu.device.launch_overhead_s + 2.0 * m * n * 4 / cpu.device.memory_bandwidth);
  expect_near_rel(graph_time(graph, cpu.device), time + relu_time);
}

} // namespace
} // namespace strata::partitioner
