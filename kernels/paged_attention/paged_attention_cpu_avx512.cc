// AVX-512 block step of the CPU paged decode attention for grouped-query
// heads (paged_attention_cpu_block.h): the 2-4 query heads that share a KV
// head are folded together, so each K and V row is loaded (and, for a 16-bit
// or int8 cache, widened) once per block instead of once per head.
//
// Scores: four entries at a time, one 16-lane accumulator per (head, entry)
// over head_dim; the 4·G accumulators are then summed across lanes together
// (simd::sums_of_16). Values: the G heads' output accumulators stay in
// registers, 64 floats per head at a time, while the block's rows are added.
// The softmax steps are the AVX2 step's (paged_attention_cpu_softmax.h).
#include "kernels/paged_attention/paged_attention_cpu_block.h"

#if defined(__x86_64__)
#include "kernels/cpu/x86/avx512_intrinsics.h"

#include <algorithm>

#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/x86/isa_target.h"
#include "kernels/cpu/x86/simd_sums.h"
#include "kernels/paged_attention/paged_attention_cpu_rows.h"
#include "kernels/paged_attention/paged_attention_cpu_softmax.h"

namespace snapserve::kernels::cpu {

namespace {

constexpr int64_t kEntries = 4;  // entries scored at once: 4 · G <= 16 accumulators

// scores[h · stride + t] = q_h · k[t] for every head h < G and t < n (up to
// three more slots per head written, not meaningful).
template <typename Rows, int G, typename E = typename Rows::Element>
SNAPSERVE_TARGET_AVX512F_AVX2_FMA_F16C void group_scores(const Rows& kr, const float* q, const E* k,
                                                         int64_t n, int64_t head_dim, float* scores,
                                                         int64_t stride, SpreadPrefetch& pf) {
  for (int64_t t0 = 0; t0 < n; t0 += kEntries) {
    const E* rows[kEntries];
    // Past the block's end a row repeats the last entry (no read beyond it).
#pragma GCC unroll 4
    for (int64_t e = 0; e < kEntries; ++e) rows[e] = k + std::min(t0 + e, n - 1) * head_dim;
    __m512 acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t d = 0; d < head_dim; d += 16) {
      pf.step();
#pragma GCC unroll 4
      for (int64_t e = 0; e < kEntries; ++e) {
        const __m512 kv = kr.load16(rows[e] + d);
#pragma GCC unroll 4
        for (int h = 0; h < G; ++h) {
          acc[h * kEntries + e] =
              _mm512_fmadd_ps(_mm512_loadu_ps(q + h * head_dim + d), kv, acc[h * kEntries + e]);
        }
      }
    }
    // Lane h · 4 + e: head h's score of entry t0 + e.
    const __m512 sums = simd::sums_of_16(acc);
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, sums);
#pragma GCC unroll 4
    for (int h = 0; h < G; ++h) {
      _mm_storeu_ps(scores + h * stride + t0, _mm_load_ps(lanes + h * kEntries));
    }
  }
}

// acc_h[0 .. 64) = acc_h · rescale_h + Σ_t p_h[t] · v[t][0 .. 64) for every
// head h < G: 4 · G accumulators in registers over the whole block.
template <typename Rows, int G, typename E = typename Rows::Element>
SNAPSERVE_TARGET_AVX512F_AVX2_FMA_F16C void group_values(const Rows& vr, const HeadGroup& hg,
                                                         int64_t d0, const float* rescale,
                                                         const float* p, int64_t stride, const E* v,
                                                         int64_t n, SpreadPrefetch& pf) {
  const int64_t D = hg.head_dim;
  __m512 a[G][4];
#pragma GCC unroll 4
  for (int h = 0; h < G; ++h) {
    const __m512 r = _mm512_set1_ps(rescale[h]);
#pragma GCC unroll 4
    for (int64_t j = 0; j < 4; ++j) {
      a[h][j] = _mm512_mul_ps(_mm512_loadu_ps(hg.acc + h * D + d0 + 16 * j), r);
    }
  }
  for (int64_t t = 0; t < n; ++t) {
    pf.step();
    const E* row = v + t * D + d0;
    __m512 vrow[4];
#pragma GCC unroll 4
    for (int64_t j = 0; j < 4; ++j) vrow[j] = vr.load16(row + 16 * j);
#pragma GCC unroll 4
    for (int h = 0; h < G; ++h) {
      const __m512 ph = _mm512_set1_ps(p[h * stride + t]);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) a[h][j] = _mm512_fmadd_ps(ph, vrow[j], a[h][j]);
    }
  }
#pragma GCC unroll 4
  for (int h = 0; h < G; ++h) {
#pragma GCC unroll 4
    for (int64_t j = 0; j < 4; ++j) _mm512_storeu_ps(hg.acc + h * D + d0 + 16 * j, a[h][j]);
  }
}

// kr, vr: how K's and V's rows of this block load (Rows, paged_attention_cpu_rows.h).
template <typename Rows, int G, typename E = typename Rows::Element>
SNAPSERVE_TARGET_AVX512F_AVX2_FMA_F16C void fold_group(const Rows& kr, const Rows& vr,
                                                       const HeadGroup& hg, const E* k, const E* v,
                                                       int64_t n, float* scores, const E* next_k,
                                                       const E* next_v) {
  const int64_t D = hg.head_dim;
  const int64_t stride = score_stride(n);
  constexpr int64_t kSize = sizeof(E);
  SpreadPrefetch pf_k, pf_v;
  if (next_k != nullptr) pf_k = SpreadPrefetch(next_k, n * D * kSize, (n + 3) / 4 * (D / 16));
  if (next_v != nullptr) pf_v = SpreadPrefetch(next_v, n * D * kSize, n * (D / 64));
  group_scores<Rows, G>(kr, hg.q, k, n, D, scores, stride, pf_k);
  float rescale[G];
#pragma GCC unroll 4
  for (int h = 0; h < G; ++h) rescale[h] = softmax::fold_scores(hg, h, scores + h * stride, n);
  for (int64_t d0 = 0; d0 < D; d0 += 64) {
    group_values<Rows, G>(vr, hg, d0, rescale, scores, stride, v, n, pf_v);
  }
}

template <typename Rows, typename E = typename Rows::Element>
SNAPSERVE_TARGET_AVX512F_AVX2_FMA_F16C void fold_any_group(const HeadGroup& hg, const E* k,
                                                           const E* v, int64_t n, float* scores,
                                                           const E* next_k, const E* next_v,
                                                           const Rows& kr = {},
                                                           const Rows& vr = {}) {
  switch (hg.group) {
    case 2:
      return fold_group<Rows, 2>(kr, vr, hg, k, v, n, scores, next_k, next_v);
    case 3:
      return fold_group<Rows, 3>(kr, vr, hg, k, v, n, scores, next_k, next_v);
    default:  // 4: has_group_fold_avx512 admits no other
      return fold_group<Rows, 4>(kr, vr, hg, k, v, n, scores, next_k, next_v);
  }
}

}  // namespace

bool has_group_fold_avx512(int64_t group, int64_t head_dim) {
  return group >= 2 && group <= 4 && head_dim % 64 == 0;
}

void fold_group_avx512(const HeadGroup& hg, const float* k, const float* v, int64_t n,
                       float* scores, const float* next_k, const float* next_v) {
  fold_any_group<Float32Rows>(hg, k, v, n, scores, next_k, next_v);
}

void fold_group_bfloat16_avx512(const HeadGroup& hg, const uint16_t* k, const uint16_t* v,
                                int64_t n, float* scores, const uint16_t* next_k,
                                const uint16_t* next_v) {
  fold_any_group<BFloat16Rows>(hg, k, v, n, scores, next_k, next_v);
}

void fold_group_float16_avx512(const HeadGroup& hg, const uint16_t* k, const uint16_t* v, int64_t n,
                               float* scores, const uint16_t* next_k, const uint16_t* next_v) {
  fold_any_group<Float16Rows>(hg, k, v, n, scores, next_k, next_v);
}

void fold_group_int8_avx512(const HeadGroup& hg, const int8_t* k, const float* k_scales,
                            const int8_t* v, const float* v_scales, int64_t n, float* scores,
                            const int8_t* next_k, const int8_t* next_v) {
  fold_any_group<Int8Rows>(hg, k, v, n, scores, next_k, next_v, Int8Rows{k, k_scales},
                           Int8Rows{v, v_scales});
}

}  // namespace snapserve::kernels::cpu

#else  // not x86-64: cpu_isa() is always kPortable, this is never called

namespace snapserve::kernels::cpu {
bool has_group_fold_avx512(int64_t, int64_t) { return false; }
void fold_group_avx512(const HeadGroup&, const float*, const float*, int64_t, float*, const float*,
                       const float*) {}
void fold_group_bfloat16_avx512(const HeadGroup&, const uint16_t*, const uint16_t*, int64_t, float*,
                                const uint16_t*, const uint16_t*) {}
void fold_group_float16_avx512(const HeadGroup&, const uint16_t*, const uint16_t*, int64_t, float*,
                               const uint16_t*, const uint16_t*) {}
void fold_group_int8_avx512(const HeadGroup&, const int8_t*, const float*, const int8_t*,
                            const float*, int64_t, float*, const int8_t*, const int8_t*) {}
}  // namespace snapserve::kernels::cpu

#endif
