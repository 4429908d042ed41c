// Small kernels that check the CUDA emulator itself (cuda_emulation_test.cc):
// one right, the others breaking a rule the emulator should catch.
#pragma once

#include <cuda_runtime.h>

namespace strata::cuda_emulator::self_test {

// sums[b] = the sum of x[256 b .. 256 b + 255], by a shared-memory tree down to
// a warp and shuffles within it; `blocks` blocks of 256 threads.
cudaError_t block_sums(const float *x, float *sums, unsigned blocks);
// out[linear thread id] = its x + 1000 y + 100000 z coordinates plus block
// coordinates times 10^7, over a 3-D grid of 3-D blocks.
cudaError_t coordinates(int *out, dim3 grid, dim3 block);
// Threads 0-99 of a block of 128 wait at __syncthreads(); the rest return.
cudaError_t divergent_barrier(int *out);
// Lanes 0-15 of the warp shuffle with the full mask; 16-31 return.
cudaError_t half_warp_shuffle(float *out);
// A block of 2048 threads.
cudaError_t oversized_block(int *out);
// Two blocks of 64: each thread writes base + 100 block + its index to its
// shared slot and reads its right neighbour's after a barrier that
// `with_barrier` false leaves out. Without it, the emulator runs a block's
// threads one after another, first to last in block 0 and last to first in
// block 1, so a thread may read what the slot held before (as on a GPU).
cudaError_t neighbour_read(int *out, int base, bool with_barrier);

} // namespace strata::cuda_emulator::self_test
