// AVX-512 piece of the CPU SnapKV selection; see snapkv_select_cpu_simd.h and,
// for the order of operations it must keep, snapkv_select_cpu.cc.
#include "kernels/cpu/x86/isa_target.h"
#include "kernels/snapkv_select/snapkv_select_cpu_simd.h"

#if defined(__x86_64__)
#include <immintrin.h>

namespace snapserve::kernels::detail::avx512 {

// AVX-512F implies FMA to the compiler, so the multiply and the add below
// stay two roundings only because this file is built with -ffp-contract=off
// (kernels/CMakeLists.txt).
namespace {

static_assert(kTileKeys == 16, "one key tile is one 16-lane register");

// Rows [0, R) by one key tile: R accumulators, one load and R broadcasts per
// head-dim step.
template <int R>
SNAPSERVE_TARGET_AVX512F void dot_tile(const float* q, const float* tile, int64_t d, int64_t stride,
                                       float* logits) {
  __m512 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t dd = 0; dd < d; ++dd) {
    const __m512 k = _mm512_loadu_ps(tile + dd * kTileKeys);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_set1_ps(q[r * d + dd]), k));
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(logits + r * stride, acc[r]);
}

template <int R>
SNAPSERVE_TARGET_AVX512F void dot_tail(const float* q, const float* tile, int64_t rows, int64_t d,
                                       int64_t stride, float* logits) {
  if constexpr (R > 0) {
    if (rows == R) return dot_tile<R>(q, tile, d, stride, logits);
    dot_tail<R - 1>(q, tile, rows, d, stride, logits);
  }
}

}  // namespace

SNAPSERVE_TARGET_AVX512F void dot_rows(const float* q, const float* tile, int64_t w, int64_t d,
                                       int64_t stride, float* logits) {
  constexpr int kRows = 8;
  int64_t i = 0;
  for (; i + kRows <= w; i += kRows) {
    dot_tile<kRows>(q + i * d, tile, d, stride, logits + i * stride);
  }
  dot_tail<kRows - 1>(q + i * d, tile, w - i, d, stride, logits + i * stride);
}

}  // namespace snapserve::kernels::detail::avx512

#else  // not x86-64: cpu_isa() is kPortable, never called

namespace snapserve::kernels::detail::avx512 {
void dot_rows(const float*, const float*, int64_t, int64_t, int64_t, float*) {}
}  // namespace snapserve::kernels::detail::avx512

#endif
