// Proves the CUDA wiring: the probe kernel runs where a GPU is present, and the
// suite skips with the reason (no driver, no device) where none is.
#include <vector>

#include <gtest/gtest.h>

#include "ops/kernels/cuda/probe.h"

namespace strata::cuda {
namespace {

TEST(CudaProbeTest, FillRoundTripsThroughTheDevice) {
  std::string reason;
  if (device_count(&reason) == 0) GTEST_SKIP() << "no usable GPU: " << reason;
  std::vector<float> host(1000, 0.0f);
  ASSERT_TRUE(fill_roundtrip(host.data(), static_cast<int>(host.size()), 2.5f, &reason)) << reason;
  for (float v : host) ASSERT_EQ(v, 2.5f);
}

} // namespace
} // namespace strata::cuda
