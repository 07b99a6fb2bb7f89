// Internal to kernels/paged_attention/paged_attention_cpu_*.cc: the softmax steps of one
// block's scores, shared by the AVX2 and AVX-512 block steps (both fold a
// block's scores the same way; only the dot products differ).
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/x86/exp_avx2.h"
#include "kernels/cpu/x86/isa_target.h"
#include "kernels/cpu/x86/simd_sums.h"
#include "kernels/paged_attention/paged_attention_cpu_block.h"

namespace snapserve::kernels::cpu::softmax {

// max(s[0 .. n)), eight lanes at a time (max is exact in any order).
SNAPSERVE_TARGET_AVX2_FMA inline float max_of(const float* s, int64_t n) {
  float m = s[0];
  int64_t t = 0;
  if (n >= 8) {
    __m256 v = _mm256_loadu_ps(s);
    for (t = 8; t + 8 <= n; t += 8) v = _mm256_max_ps(v, _mm256_loadu_ps(s + t));
    const __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 q = _mm_max_ps(h, _mm_movehl_ps(h, h));
    m = _mm_cvtss_f32(_mm_max_ss(q, _mm_shuffle_ps(q, q, 1)));
  }
  for (; t < n; ++t) m = std::max(m, s[t]);
  return m;
}

// s[t] = exp(s[t] - max) for t < n; returns their sum.
SNAPSERVE_TARGET_AVX2_FMA inline float exp_and_sum(float* s, int64_t n, float max) {
  const __m256 vm = _mm256_set1_ps(max);
  __m256 vsum = _mm256_setzero_ps();
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) {
    const __m256 e = simd::exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + t), vm));
    _mm256_storeu_ps(s + t, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  float sum = simd::lane_sum_avx2(vsum);
  for (; t < n; ++t) {
    s[t] = std::exp(s[t] - max);
    sum += s[t];
  }
  return sum;
}

// Folds head h's block scores s[0 .. n) into its running max and sum (the
// online softmax): s[t] becomes exp(s[t] - new max). Returns the factor the
// head's output accumulator must be scaled by before this block's values are
// added. exp(-inf) = 0 clears the empty state on the first block; past the
// first blocks the max seldom grows, and exp(0) is exactly 1: no call.
SNAPSERVE_TARGET_AVX2_FMA inline float fold_scores(const HeadGroup& hg, int64_t h, float* s,
                                                   int64_t n) {
  const float new_max = std::max(hg.run_max[h], max_of(s, n));
  const float rescale = new_max == hg.run_max[h] ? 1.f : std::exp(hg.run_max[h] - new_max);
  hg.run_sum[h] = hg.run_sum[h] * rescale + exp_and_sum(s, n, new_max);
  hg.run_max[h] = new_max;
  return rescale;
}

}  // namespace snapserve::kernels::cpu::softmax

#endif
