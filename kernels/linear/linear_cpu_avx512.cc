// AVX-512 tile kernel of the fixed-order CPU linear (linear_cpu_tiles.h).
//
// A 4 × 4 register tile (16 accumulators, 4 weight and 4 x vectors: 24 of the
// 32 zmm registers) does 16 multiply-adds per 8 loads, against 8 per 6 for
// the AVX2 2 × 4 tile; at batch 16 the kernel is compute bound, so that ratio
// is what sets the decode step time.
//
// Per output element: 16 lanes, lane l accumulating x[j]·w[j] for j ≡ l
// (mod 16) in increasing j with FMA; then lanes l and l + 8 added, then the
// same tree as the AVX2 path over the remaining 8; then the K % 16 tail.
#include "kernels/linear/linear_cpu_tiles.h"

#if defined(__x86_64__)
#include "kernels/cpu/x86/avx512_intrinsics.h"
#include "kernels/cpu/x86/isa_target.h"

// After avx512_intrinsics.h, whose pragmas cover its shuffles.
#include "kernels/cpu/x86/simd_sums.h"

namespace snapserve::kernels::cpu {

namespace {

constexpr int64_t kLanes = 16;
// Prefetch into L2 (locality 2, prefetcht1), not L1: the x rows of a
// batch-16 call (36 KiB) already overflow the 32 KiB L1 (L1 prefetch
// measured no gain; L2 did).
constexpr int kPrefetchLocality = 2;

// x rows i0 .. i0 + MX - 1 against weight rows wr[0 .. NW). With `next`, one
// cache line of each of a later tile's kTile rows is prefetched per step over
// K (a 16-float step is one 64-byte line), so those rows arrive from DRAM
// while earlier tiles compute.
template <int MX, int NW>
SNAPSERVE_TARGET_AVX512F_AVX2_FMA void block(const Problem& p, const float* const* wr, int64_t i0,
                                             int64_t n0, const float* const* next, int next_rows) {
  const int64_t k = p.k, k16 = k - k % kLanes;
  const float* x = p.x + i0 * k;
  __m512 acc[MX][NW];
#pragma GCC unroll 4
  for (int r = 0; r < MX; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < NW; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < k16; j += kLanes) {
    for (int c = 0; c < next_rows; ++c) {
      __builtin_prefetch(next[c] + j, 0, kPrefetchLocality);
    }
    __m512 wv[NW];
#pragma GCC unroll 4
    for (int c = 0; c < NW; ++c) wv[c] = _mm512_loadu_ps(wr[c] + j);
#pragma GCC unroll 4
    for (int r = 0; r < MX; ++r) {
      const __m512 xv = _mm512_loadu_ps(x + r * k + j);
#pragma GCC unroll 4
      for (int c = 0; c < NW; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
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
      for (int c = 0; c < 4; ++c) o[c] = add_tail(lanes[4 * r + c], x + r * k, wr[c], k16, k);
    }
  } else {
#pragma GCC unroll 4
    for (int r = 0; r < MX; ++r) {
      float* o = p.out + (i0 + r) * p.n_total + n0;
#pragma GCC unroll 4
      for (int c = 0; c < NW; ++c) {
        o[c] = add_tail(simd::lane_sum_avx512(acc[r][c]), x + r * k, wr[c], k16, k);
      }
    }
  }
}

}  // namespace

void tile_avx512(const Problem& p, const float* const* wr, int64_t rows, int64_t n0,
                 const float* const* next) {
  for_each_block(p.m, rows, next,
                 [&](auto mx, auto nw, int64_t i0, const float* const* first, int count) {
                   block<decltype(mx)::value, decltype(nw)::value>(p, wr, i0, n0, first, count);
                 });
}

}  // namespace snapserve::kernels::cpu

#else  // not x86-64: cpu_isa() is never kAvx512, the tile is never called

namespace snapserve::kernels::cpu {
void tile_avx512(const Problem&, const float* const*, int64_t, int64_t, const float* const*) {}
}  // namespace snapserve::kernels::cpu

#endif
