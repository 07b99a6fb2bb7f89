// A vector float32 exp for the CPU kernels' AVX2 paths (SnapKV selection,
// paged attention). Internal to kernels/.
//
// exp(x) = 2^n · p(r) with n = round(x·log2 e), r = x − n·ln 2 (in two
// parts) and p a degree-6 polynomial: within 1 ulp of glibc's expf over
// [-87, 88] (checked on every 97th float there). Lanes outside that range —
// where libm returns denormals, 0, inf or NaN — are recomputed with std::exp,
// so exact zeros (and with them exact ties) are libm's.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/x86/isa_target.h"

namespace snapserve::kernels::simd {

// "avx2" without "fma": the polynomial's multiply-adds round twice, as written.
SNAPSERVE_TARGET_AVX2 inline __m256 exp_avx2(__m256 x) {
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f)));
  r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 result = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  const __m256 in_range = _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ),
                                        _mm256_cmp_ps(x, _mm256_set1_ps(88.0f), _CMP_LE_OQ));
  if (_mm256_movemask_ps(in_range) == 0xFF) return result;
  float xs[8], es[8];
  _mm256_storeu_ps(xs, x);
  _mm256_storeu_ps(es, result);
  for (int l = 0; l < 8; ++l) {
    if (!(xs[l] >= -87.0f && xs[l] <= 88.0f)) es[l] = std::exp(xs[l]);
  }
  return _mm256_loadu_ps(es);
}

}  // namespace snapserve::kernels::simd

#endif
