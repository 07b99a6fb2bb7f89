// Horizontal sums of AVX-512 vectors for the CPU kernels (linear, paged
// attention). Internal to kernels/. GCC 12 reports its shuffles as
// -W(maybe-)uninitialized uses (see linear_cpu_avx512.cc): include it after
// silencing those.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

namespace snapserve::kernels::simd {

// Lane i of the result: the sum of the 16 lanes of a[i], for i < 16, each in
// the same pairs as a one-vector tree (lane l + l+8, then + l+4, + l+2,
// + l+1). Lanes are regrouped across vectors between the stages, so the
// sixteen sums cost 15 vector adds (and 30 shuffles) instead of 64 scalar adds.
__attribute__((target("avx512f"))) inline __m512 sums_of_16(const __m512* a) {
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
