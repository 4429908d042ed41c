// The CUDA emulator's stand-in for CUB's device radix sort (tests only): the
// same call, sorted on the host in the stream's order (recorded while the
// stream is captured). Like CUB it asks for temporary storage (here 256 bytes
// plus 8 per item), refuses less, and writes all of it, so storage that
// overlaps another array shows.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <vector>

#include "tests/cuda_emulator/cuda_emulator.h"

namespace cub {

struct DeviceRadixSort {
  template <typename Key, typename Value, typename Count>
  static cudaError_t SortPairs(void *temp, size_t &temp_bytes, const Key *keys_in, Key *keys_out,
                               const Value *values_in, Value *values_out, Count count,
                               int begin_bit = 0, int end_bit = sizeof(Key) * 8,
                               cudaStream_t stream = nullptr) {
    const size_t n = static_cast<size_t>(count);
    const size_t needed = 256 + 8 * n;
    if (temp == nullptr) {
      temp_bytes = needed;
      return cudaSuccess;
    }
    if (temp_bytes < needed || begin_bit < 0 || end_bit > static_cast<int>(sizeof(Key) * 8) ||
        begin_bit >= end_bit)
      return cudaErrorInvalidValue;
    const int width = end_bit - begin_bit;
    const Key mask = width >= static_cast<int>(sizeof(Key) * 8)
                         ? static_cast<Key>(~Key{0})
                         : static_cast<Key>((Key{1} << width) - 1);
    return strata::cuda_emulator::enqueue(stream, "cub::DeviceRadixSort::SortPairs", [=] {
      std::vector<size_t> order(n);
      std::iota(order.begin(), order.end(), size_t{0});
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return ((keys_in[a] >> begin_bit) & mask) < ((keys_in[b] >> begin_bit) & mask);
      });
      std::vector<Key> keys(n);
      std::vector<Value> values(n);
      for (size_t i = 0; i < n; ++i) {
        keys[i] = keys_in[order[i]];
        values[i] = values_in[order[i]];
      }
      std::memset(temp, 0xCD, needed);
      std::copy(keys.begin(), keys.end(), keys_out);
      std::copy(values.begin(), values.end(), values_out);
    });
  }
};

} // namespace cub
