// A vector float32 exp for the AVX-512 prompt attention kernels (the
// online softmax's weights). Internal to kernels/.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

namespace snapserve::kernels::simd {

// exp(x) for x <= 88 (scores minus their running max, which may lie up to
// the softmax's headroom above it): 2^n · p(r), the degree-6 polynomial of
// kernels/exp_avx2.h with fused multiply-adds; exp(88) ~ 1.7e38 is still
// finite. x below -87 is clamped there: exp(-87) ~ 1.6e-38 against a row sum
// >= 1 is nothing a softmax weight can hold.
__attribute__((target("avx512f,fma"))) inline __m512 exp_at_most_88_avx512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

}  // namespace snapserve::kernels::simd

#endif
