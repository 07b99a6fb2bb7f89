// AVX2 + FMA block step of the CPU paged decode attention
// (paged_attention_cpu_block.h).
//
// A block's scores are computed eight entries at a time, one accumulator per
// entry over head_dim (eight independent FMA chains), and the eight dot
// products are then summed together across registers: seven vector adds for
// eight scores, where one horizontal sum per score cost about as many each.
// The output accumulator of a head stays in registers (64 floats at a time)
// while the block's values are added into it, instead of being loaded and
// stored once per entry. A 16-bit cache is widened as its rows are loaded
// (exactly: bfloat16 and float16 values are all floats), so it is folded
// with the same arithmetic as the float32 rows it stands for, and read once.
#include "kernels/paged_attention/paged_attention_cpu_block.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/x86/isa_target.h"
#include "kernels/cpu/x86/simd_sums.h"
#include "kernels/paged_attention/paged_attention_cpu_rows.h"
#include "kernels/paged_attention/paged_attention_cpu_softmax.h"

namespace snapserve::kernels::cpu {

namespace {

// scores[t] = q · k[t] for t < n (up to 7 more slots written, not meaningful).
template <typename Rows, typename E = typename Rows::Element>
SNAPSERVE_TARGET_AVX2_FMA_F16C void block_scores(const float* q, const E* k, int64_t n,
                                                 int64_t head_dim, float* scores,
                                                 SpreadPrefetch& pf) {
  for (int64_t t0 = 0; t0 < n; t0 += 8) {
    const E* rows[8];
    // Past the block's end a row repeats the last entry (no read beyond it).
    for (int i = 0; i < 8; ++i) rows[i] = k + std::min<int64_t>(t0 + i, n - 1) * head_dim;
    __m256 a[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) a[i] = _mm256_setzero_ps();
    for (int64_t d = 0; d < head_dim; d += 8) {
      pf.step();
      const __m256 qv = _mm256_loadu_ps(q + d);
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) a[i] = _mm256_fmadd_ps(qv, Rows::load8(rows[i] + d), a[i]);
    }
    _mm256_storeu_ps(scores + t0, simd::sums_of_8(a));
  }
}

// acc[0 .. 8R) = acc * rescale + Σ_t p[t] · v[t][0 .. 8R), accumulators in
// registers over the whole block.
template <int R, typename Rows, typename E = typename Rows::Element>
SNAPSERVE_TARGET_AVX2_FMA_F16C void accumulate_values(float* acc, float rescale, const float* p,
                                                      const E* v, int64_t n, int64_t head_dim,
                                                      SpreadPrefetch& pf) {
  __m256 a[R];
  const __m256 vr = _mm256_set1_ps(rescale);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) a[r] = _mm256_mul_ps(_mm256_loadu_ps(acc + int64_t{8} * r), vr);
  for (int64_t t = 0; t < n; ++t) {
    pf.step();
    const __m256 pt = _mm256_broadcast_ss(p + t);
    const E* row = v + t * head_dim;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      a[r] = _mm256_fmadd_ps(pt, Rows::load8(row + int64_t{8} * r), a[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(acc + int64_t{8} * r, a[r]);
}

template <typename Rows, typename E = typename Rows::Element>
SNAPSERVE_TARGET_AVX2_FMA_F16C void accumulate_all_values(float* acc, float rescale, const float* p,
                                                          const E* v, int64_t n, int64_t head_dim,
                                                          SpreadPrefetch& pf) {
  int64_t d = 0;
  for (; d + 64 <= head_dim; d += 64) {
    accumulate_values<8, Rows>(acc + d, rescale, p, v + d, n, head_dim, pf);
  }
  // The last head_dim % 64 floats: 1 .. 7 registers.
  using Tail = void (*)(float*, float, const float*, const E*, int64_t, int64_t, SpreadPrefetch&);
  static constexpr Tail kTails[] = {nullptr,
                                    accumulate_values<1, Rows>,
                                    accumulate_values<2, Rows>,
                                    accumulate_values<3, Rows>,
                                    accumulate_values<4, Rows>,
                                    accumulate_values<5, Rows>,
                                    accumulate_values<6, Rows>,
                                    accumulate_values<7, Rows>};
  if (const int64_t regs = (head_dim - d) / 8; regs > 0) {
    kTails[regs](acc + d, rescale, p, v + d, n, head_dim, pf);
  }
}

// The block step over rows of any element type; next_k / next_v: the next
// block's rows to prefetch (n of them: a block with a successor is full).
template <typename Rows, typename E = typename Rows::Element>
SNAPSERVE_TARGET_AVX2_FMA_F16C void fold_rows(const HeadGroup& hg, const E* k, const E* v,
                                              int64_t n, float* scores, const E* next_k,
                                              const E* next_v) {
  const int64_t D = hg.head_dim;
  constexpr int64_t kSize = sizeof(E);
  // The first head's passes prefetch the next block.
  SpreadPrefetch pf_k, pf_v, none;
  if (next_k != nullptr) pf_k = SpreadPrefetch(next_k, n * D * kSize, (n + 7) / 8 * (D / 8));
  if (next_v != nullptr) pf_v = SpreadPrefetch(next_v, n * D * kSize, n * ((D + 63) / 64));
  for (int64_t h = 0; h < hg.group; ++h) {
    block_scores<Rows>(hg.q + h * D, k, n, D, scores, h == 0 ? pf_k : none);
    const float rescale = softmax::fold_scores(hg, h, scores, n);
    accumulate_all_values<Rows>(hg.acc + h * D, rescale, scores, v, n, D, h == 0 ? pf_v : none);
  }
}

}  // namespace

void fold_block_avx2(const HeadGroup& hg, const float* k, const float* v, int64_t n, float* scores,
                     const float* next_k, const float* next_v) {
  fold_rows<Float32Rows>(hg, k, v, n, scores, next_k, next_v);
}

void fold_block_bfloat16_avx2(const HeadGroup& hg, const uint16_t* k, const uint16_t* v, int64_t n,
                              float* scores, const uint16_t* next_k, const uint16_t* next_v) {
  fold_rows<BFloat16Rows>(hg, k, v, n, scores, next_k, next_v);
}

void fold_block_float16_avx2(const HeadGroup& hg, const uint16_t* k, const uint16_t* v, int64_t n,
                             float* scores, const uint16_t* next_k, const uint16_t* next_v) {
  fold_rows<Float16Rows>(hg, k, v, n, scores, next_k, next_v);
}

}  // namespace snapserve::kernels::cpu

#else  // not x86-64: cpu_isa() is always kPortable, this is never called

namespace snapserve::kernels::cpu {
void fold_block_avx2(const HeadGroup&, const float*, const float*, int64_t, float*, const float*,
                     const float*) {}
void fold_block_bfloat16_avx2(const HeadGroup&, const uint16_t*, const uint16_t*, int64_t, float*,
                              const uint16_t*, const uint16_t*) {}
void fold_block_float16_avx2(const HeadGroup&, const uint16_t*, const uint16_t*, int64_t, float*,
                             const uint16_t*, const uint16_t*) {}
}  // namespace snapserve::kernels::cpu

#endif
