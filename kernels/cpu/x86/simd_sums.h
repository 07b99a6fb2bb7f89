// Horizontal sums of SIMD registers for the CPU kernels (linear, paged
// attention), one definition of each tree. Internal to kernels/.
//
// GCC 12 reports the AVX-512 shuffles below as -W(maybe-)uninitialized uses
// where they are inlined (kernels/cpu/x86/avx512_intrinsics.h): a file that calls the
// AVX-512 sums includes this after that header, which silences them.
#pragma once

namespace snapserve::kernels::simd {

// The sum of 8 lanes in memory, in the tree lane_sum_avx2 uses on a register:
// (l0+l4, l1+l5, l2+l6, l3+l7), then pairs, then one.
inline float lane_sum_portable(const float* p) {
  return ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
}

}  // namespace snapserve::kernels::simd

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/x86/isa_target.h"

namespace snapserve::kernels::simd {

// The sum of the 8 lanes: (l0+l4, l1+l5, l2+l6, l3+l7), then pairs, then one
// (the tree of lane_sum_portable).
SNAPSERVE_TARGET_AVX2 inline float lane_sum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Lane i of the result: the sum of the 8 lanes of a[i], for i < 8 (adjacent
// pairs first: not lane_sum_avx2's tree, for kernels with no order to keep).
SNAPSERVE_TARGET_AVX2 inline __m256 sums_of_8(const __m256* a) {
  const __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
  // Low 128 bits: a[0..3]'s lanes 0..3 summed; high: their lanes 4..7.
  const __m256 h0123 = _mm256_hadd_ps(h01, h23), h4567 = _mm256_hadd_ps(h45, h67);
  return _mm256_add_ps(_mm256_permute2f128_ps(h0123, h4567, 0x20),
                       _mm256_permute2f128_ps(h0123, h4567, 0x31));
}

// The sum of the 16 lanes: lanes l and l + 8 first, then the AVX2 tree.
SNAPSERVE_TARGET_AVX512F_AVX2 inline float lane_sum_avx512(__m512 v) {
  const __m256 lo = _mm512_castps512_ps256(v);
  // Lanes 8..15 moved down to 0..7.
  const __m256 hi = _mm512_castps512_ps256(_mm512_shuffle_f32x4(v, v, 0xEE));
  return lane_sum_avx2(_mm256_add_ps(lo, hi));
}

// Lane i of the result: the sum of the 16 lanes of a[i], for i < 16, each in
// the same pairs as a one-vector tree (lane l + l+8, then + l+4, + l+2,
// + l+1). Lanes are regrouped across vectors between the stages, so the
// sixteen sums cost 15 vector adds (and 30 shuffles) instead of 64 scalar adds.
SNAPSERVE_TARGET_AVX512F_AVX2 inline __m512 sums_of_16(const __m512* a) {
  // Work on v[4c + r] = a[4r + c]: the last stage then leaves a[i] in lane i.
  __m512 v[16];
#pragma GCC unroll 4
  for (int64_t r = 0; r < 4; ++r) {
#pragma GCC unroll 4
    for (int64_t c = 0; c < 4; ++c) v[4 * c + r] = a[4 * r + c];
  }
  __m512 t[8], u[4], w[2];
  // t[q]: lanes 0..7 v[2q]'s l + l+8 (l < 8), lanes 8..15 v[2q+1]'s.
#pragma GCC unroll 8
  for (int64_t q = 0; q < 8; ++q) {
    t[q] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * q], v[2 * q + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * q], v[2 * q + 1], 0xEE));
  }
  // u[q]: 128-bit lane i holds v[4q + i]'s (l + l+8) + (l+4 + l+12), l < 4.
#pragma GCC unroll 4
  for (int64_t q = 0; q < 4; ++q) {
    u[q] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * q], t[2 * q + 1], 0x88),
                         _mm512_shuffle_f32x4(t[2 * q], t[2 * q + 1], 0xDD));
  }
  // w[q], lane i: [u[2q] pair sums 0, 1 (l + l+2), u[2q+1] pair sums 0, 1].
#pragma GCC unroll 2
  for (int64_t q = 0; q < 2; ++q) {
    w[q] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * q], u[2 * q + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(u[2 * q], u[2 * q + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // 128-bit lane i: the totals of v[i], v[4 + i], v[8 + i], v[12 + i], that is
  // of a[4i], a[4i + 1], a[4i + 2], a[4i + 3].
  return _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

}  // namespace snapserve::kernels::simd

#endif
