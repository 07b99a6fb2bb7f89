// AVX2 pieces of the CPU SnapKV selection; see snapkv_select_cpu_simd.h and,
// for the order of operations they must keep, snapkv_select_cpu.cc.
#include "kernels/snapkv_select/snapkv_select_cpu_simd.h"

#include "kernels/cpu/x86/exp_avx2.h"
#include "kernels/cpu/x86/isa_target.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace snapserve::kernels::detail::avx2 {

// SNAPSERVE_TARGET_AVX2, not an FMA set: without FMA instructions available
// the compiler cannot contract the multiply and the add below into one rounding.
namespace {

// Rows [0, R) by one key tile: 2R accumulators, two loads and R broadcasts per
// head-dim step.
template <int R>
SNAPSERVE_TARGET_AVX2 void dot_tile_avx2(const float* q, const float* tile, int64_t d,
                                         int64_t stride, float* logits) {
  __m256 lo[R], hi[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
  for (int64_t dd = 0; dd < d; ++dd) {
    const __m256 k0 = _mm256_loadu_ps(tile + dd * kTileKeys);
    const __m256 k1 = _mm256_loadu_ps(tile + dd * kTileKeys + 8);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 qv = _mm256_broadcast_ss(q + r * d + dd);
      lo[r] = _mm256_add_ps(lo[r], _mm256_mul_ps(qv, k0));
      hi[r] = _mm256_add_ps(hi[r], _mm256_mul_ps(qv, k1));
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(logits + r * stride, lo[r]);
    _mm256_storeu_ps(logits + r * stride + 8, hi[r]);
  }
}

}  // namespace

SNAPSERVE_TARGET_AVX2 void dot_rows(const float* q, const float* tile, int64_t w, int64_t d,
                                    int64_t stride, float* logits) {
  int64_t i = 0;
  for (; i + 4 <= w; i += 4) dot_tile_avx2<4>(q + i * d, tile, d, stride, logits + i * stride);
  const float* qi = q + i * d;
  float* li = logits + i * stride;
  switch (w - i) {
    case 3:
      dot_tile_avx2<3>(qi, tile, d, stride, li);
      break;
    case 2:
      dot_tile_avx2<2>(qi, tile, d, stride, li);
      break;
    case 1:
      dot_tile_avx2<1>(qi, tile, d, stride, li);
      break;
    default:
      break;
  }
}

// Scales row[0, len) by `scale`, replaces it with exp(x − max) and returns
// the sum (eight partial sums, then the lanes in order, then the tail).
SNAPSERVE_TARGET_AVX2 float softmax_numerators(float* row, int64_t len, float scale) {
  const int64_t len8 = len - len % 8;
  const __m256 vscale = _mm256_set1_ps(scale);
  __m256 vmax = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < len8; j += 8) {
    const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(row + j), vscale);
    _mm256_storeu_ps(row + j, x);
    vmax = _mm256_max_ps(x, vmax);  // a NaN x leaves vmax as it was (as std::max below)
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, vmax);
  float max_logit = -std::numeric_limits<float>::infinity();
  for (float l : lanes) max_logit = std::max(max_logit, l);
  for (int64_t j = len8; j < len; ++j) {
    row[j] *= scale;
    max_logit = std::max(max_logit, row[j]);
  }
  const __m256 vm = _mm256_set1_ps(max_logit);
  __m256 vsum = _mm256_setzero_ps();
  for (int64_t j = 0; j < len8; j += 8) {
    const __m256 x = _mm256_sub_ps(_mm256_loadu_ps(row + j), vm);
    const __m256 e = simd::exp_avx2(x);
    _mm256_storeu_ps(row + j, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  _mm256_storeu_ps(lanes, vsum);
  float sum = 0.0f;
  for (float l : lanes) sum += l;
  for (int64_t j = len8; j < len; ++j) {
    row[j] = std::exp(row[j] - max_logit);
    sum += row[j];
  }
  return sum;
}

}  // namespace snapserve::kernels::detail::avx2

#else  // not x86-64: cpu_isa() is kPortable, never called

namespace snapserve::kernels::detail::avx2 {
void dot_rows(const float*, const float*, int64_t, int64_t, int64_t, float*) {}
float softmax_numerators(float*, int64_t, float) { return 0.0f; }
}  // namespace snapserve::kernels::detail::avx2

#endif
