// Counter-based random numbers for weights and test inputs.
//
// Element i of a tensor drawn with seed s depends only on (s, i): no generator
// state is carried from one element to the next. Any device can therefore draw any
// shard of a tensor on its own and get exactly the bytes a single device would
// have drawn for the whole tensor. Because initializers are stored as (kind, a, b,
// seed) in model files, the algorithm below is part of the file format: the same
// seed must give the same weights forever. Never change it; add a new initializer
// kind instead.
//
// The algorithm, exactly:
//
//  1. Random bits. bits(s, i) is Philox4x32-10 (Salmon et al., "Parallel random
//     numbers: as easy as 1, 2, 3", SC 2011) with
//       key     = (k0, k1) = (low 32 bits of s, high 32 bits of s)
//       counter = (c0, c1, c2, c3) = (low 32 bits of i, high 32 bits of i, 0, 0)
//     Ten rounds; each round, with M0 = 0xD2511F53 and M1 = 0xCD9E8D57,
//       (hi0, lo0) = 64-bit product M0 * c0,  (hi1, lo1) = 64-bit product M1 * c2
//       (c0, c1, c2, c3) = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)
//     and between rounds the key is bumped by (0x9E3779B9, 0xBB67AE85) modulo 2^32.
//     Of the four output words x0..x3 only x0 and x1 are used:
//       bits(s, i) = (x1 << 32) | x0.
//  2. Uniform in [0, 1): u(s, i) = (bits >> 11) * 2^-53, a double.
//  3. Normal(0, 1): Box-Muller on the two 32-bit halves, keeping the cosine branch:
//       u1 = (x0 + 1) * 2^-32 (in (0, 1]),  u2 = x1 * 2^-32 (in [0, 1))
//       z  = sqrt(-2 ln u1) * cos(2 pi u2), in double precision.
//  4. Integers in [0, n): the high 64 bits of the 128-bit product bits * n.
//
// Initializer values are computed in double (normal: a + b * z; uniform:
// a + (b - a) * u), rounded to f32 to nearest even, and for f16 and bf16 rounded
// once more from that f32 to nearest even. A uniform value whose f32 is at or
// above f32(b) becomes the largest f32 below f32(b) (when a < b), so f32 values
// stay in [a, b).
#pragma once

#include <array>
#include <cstdint>

#include "graph/graph.h"

namespace strata::runtime {

// The Philox4x32-10 block function: four 32-bit output words for a counter and
// a key (Random123's reference ordering).
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// The 64 random bits of element `index` under `seed` (step 1 above).
uint64_t random_bits(uint64_t seed, uint64_t index);
// A double uniform in [0, 1) (step 2).
double random_uniform(uint64_t seed, uint64_t index);
// A double drawn from normal(0, 1) (step 3).
double random_normal(uint64_t seed, uint64_t index);
// An integer uniform in [0, bound); 0 when bound is 0 (step 4).
uint64_t random_below(uint64_t seed, uint64_t index, uint64_t bound);

// A new seed for stream `stream` of `seed` (splitmix64 of their combination),
// so that related tensors (the inputs of one graph) draw unrelated values.
uint64_t derive_seed(uint64_t seed, uint64_t stream);

// Writes elements [begin, end) of a tensor of `type` filled by `initializer` into
// `out`, which points at element `begin` (so a shard writes into its own buffer).
// Floating dtypes take every initializer kind; integer and bool dtypes only
// zeros, ones and constant (a constant is rounded toward zero). An error names
// the dtype and the initializer kind.
Status fill_initializer(const Initializer &initializer, DType dtype, int64_t begin, int64_t end,
                        void *out);

} // namespace strata::runtime
