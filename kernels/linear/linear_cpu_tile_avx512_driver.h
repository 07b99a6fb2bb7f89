// Internal to kernels/linear/linear_cpu_avx512*.cc: the register tile of the
// AVX-512 linear kernels, written once over a per-kernel step trait.
//
// The including file defines SNAPSERVE_TILE_TARGET as its kernel's target (a
// macro of kernels/cpu/x86/isa_target.h) first: the loops are compiled for
// that target in that file, so the trait's intrinsics inline into them as
// they would into a copy written there. A Step trait gives
//   Elem               the element type of x and weight rows (float, uint16_t)
//   Operand            one step's register (__m512, __m512bh)
//   kStep              elements per step
//   load(p)            kStep elements at p
//   madd(acc, x, w)    acc plus the products of x and w, one instruction
//   add_short_step(acc, x, w, from, k)
//                      the K % kStep elements from `from` before the lane
//                      sum (or nothing)
//   finish(total, x, w, from, k)
//                      the lane total with those elements added after the
//                      lane sum (or the total as it is)
// Every output element then takes the same sequence whatever the block
// shape: lanes accumulated over K in order, the fixed 16-lane tree of
// kernels/cpu/x86/simd_sums.h, the tail.
#pragma once

#include <cstdint>

#include "kernels/cpu/x86/avx512_intrinsics.h"
#include "kernels/cpu/x86/isa_target.h"
#include "kernels/linear/linear_cpu_tiles.h"

// After avx512_intrinsics.h, whose pragmas cover its shuffles.
#include "kernels/cpu/x86/simd_sums.h"

namespace snapserve::kernels::cpu::tile {

// Prefetch later weight rows into L2 (locality 2, prefetcht1), not L1: the x
// rows of a batch-16 call (36 KiB of float32) already overflow the 32 KiB L1
// (L1 prefetch measured no gain; L2 did).
inline constexpr int kPrefetchLocality = 2;

// x rows i0 .. i0 + MX - 1 against weight rows wr[0 .. NW). With `next`, one
// cache line of each of `next_rows` rows of a later tile is prefetched per
// step over K (a step is one 64-byte line), so those rows arrive from DRAM
// while earlier tiles compute.
template <typename Step, int MX, int NW, typename Problem>
SNAPSERVE_TILE_TARGET void block(const Problem& p, const typename Step::Elem* const* wr, int64_t i0,
                                 int64_t n0, const typename Step::Elem* const* next,
                                 int next_rows) {
  using Elem = typename Step::Elem;
  using Operand = typename Step::Operand;
  const int64_t k = p.k, k_steps = k - k % Step::kStep;
  const Elem* x = p.x + i0 * k;
  __m512 acc[MX][NW];
#pragma GCC unroll 4
  for (int r = 0; r < MX; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < NW; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < k_steps; j += Step::kStep) {
    for (int c = 0; c < next_rows; ++c) __builtin_prefetch(next[c] + j, 0, kPrefetchLocality);
    Operand wv[NW];
#pragma GCC unroll 4
    for (int c = 0; c < NW; ++c) wv[c] = Step::load(wr[c] + j);
#pragma GCC unroll 4
    for (int r = 0; r < MX; ++r) {
      const Operand xv = Step::load(x + r * k + j);
#pragma GCC unroll 4
      for (int c = 0; c < NW; ++c) acc[r][c] = Step::madd(acc[r][c], xv, wv[c]);
    }
  }
  if (k_steps < k) {
#pragma GCC unroll 4
    for (int r = 0; r < MX; ++r) {
      Step::template add_short_step<NW>(acc[r], x + r * k, wr, k_steps, k);
    }
  }
  if constexpr (MX == 4 && NW == 4) {
    __m512 v[16];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) v[4 * r + c] = acc[r][c];
    }
    const __m512 sums = simd::sums_of_16(v);
    float lanes[16];
    _mm512_storeu_ps(lanes, sums);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      float* o = p.out + (i0 + r) * p.n_total + n0;
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        o[c] = Step::finish(lanes[4 * r + c], x + r * k, wr[c], k_steps, k);
      }
    }
  } else {
#pragma GCC unroll 4
    for (int r = 0; r < MX; ++r) {
      float* o = p.out + (i0 + r) * p.n_total + n0;
#pragma GCC unroll 4
      for (int c = 0; c < NW; ++c) {
        o[c] = Step::finish(simd::lane_sum_avx512(acc[r][c]), x + r * k, wr[c], k_steps, k);
      }
    }
  }
}

// Output columns n0 .. n0 + rows - 1 for every x row, in the blocks of
// for_each_block (linear_cpu_tiles.h).
template <typename Step, typename Problem>
void run(const Problem& p, const typename Step::Elem* const* wr, int64_t rows, int64_t n0,
         const typename Step::Elem* const* next) {
  for_each_block(p.m, rows, next, [&](auto mx, auto nw, int64_t i0, auto first, int count) {
    block<Step, decltype(mx)::value, decltype(nw)::value>(p, wr, i0, n0, first, count);
  });
}

}  // namespace snapserve::kernels::cpu::tile
