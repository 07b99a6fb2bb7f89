// AVX-512 rows of RMSNorm, the rotary embedding and the SwiGLU gate
// (rowwise.h), 16 lanes at a time (the gate with AVX512_BF16, for its
// bfloat16 outputs). RMSNorm and the rotary embedding have the
// portable loops' bits: the same sum order (sum_of_squares_portable's
// partials are this file's two registers of 8 doubles), and element-wise
// products and sums that round as the scalar code writes them (no fused
// multiply-add: -ffp-contract=off, kernels/CMakeLists.txt). The gate has the
// AVX2 loop's bits (rowwise_cpu_avx2.cc): simd::exp_avx512 is exp_avx2 16
// lanes wide, and the last n % 8 lanes take libm as there.
#include "kernels/rowwise/rowwise.h"

#if defined(__x86_64__)
#include "kernels/cpu/x86/avx512_intrinsics.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "kernels/cpu/x86/exp_avx512.h"
#include "kernels/cpu/x86/isa_target.h"

namespace snapserve::kernels::cpu {

namespace {

SNAPSERVE_TARGET_AVX512F inline __mmask16 first_lanes(int64_t count) {
  return count >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << count) - 1);
}

// Partials j (lanes of lo) and j + 8 (lanes of hi), then the portable tree.
SNAPSERVE_TARGET_AVX512F double sum_of_squares(const float* x, int64_t n) {
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512d a = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
    const __m512d b = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
    lo = _mm512_add_pd(lo, _mm512_mul_pd(a, a));
    hi = _mm512_add_pd(hi, _mm512_mul_pd(b, b));
  }
  double tail = 0.0;
  for (; i < n; ++i) tail += static_cast<double>(x[i]) * x[i];
  const __m512d c = _mm512_add_pd(lo, hi);                    // p[j] + p[j + 8]
  const __m256d d = _mm256_add_pd(_mm512_castpd512_pd256(c),  // c[k] + c[k + 4]
                                  _mm512_extractf64x4_pd(c, 1));
  const __m128d e = _mm_add_pd(_mm256_castpd256_pd128(d),  // d[k] + d[k + 2]
                               _mm256_extractf128_pd(d, 1));
  return (_mm_cvtsd_f64(e) + _mm_cvtsd_f64(_mm_unpackhi_pd(e, e))) + tail;
}

// -v exactly (the sign bit flipped; AVX512F has no float xor).
SNAPSERVE_TARGET_AVX512F inline __m512 negate(__m512 v, __m512i sign) {
  return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), sign));
}

// The gate's 16 lanes from float32 or bfloat16 (widened exactly: the bits
// shifted up), and its products to float32 or bfloat16 (vcvtneps2bf16).
SNAPSERVE_TARGET_AVX512F inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
SNAPSERVE_TARGET_AVX512F inline __m512 load16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
SNAPSERVE_TARGET_AVX512F inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
SNAPSERVE_TARGET_AVX512BF16 inline void store16(uint16_t* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      __builtin_bit_cast(__m256i, _mm512_cvtneps_pbh(v)));
}

template <typename In, typename Out>
SNAPSERVE_TARGET_AVX512BF16 void silu_mul_row(const In* gate, const In* up, int64_t n, Out* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    store16(out + i, simd::silu_mul_avx512(load16(gate + i), load16(up + i)));
  if (i == n) return;
  // The last n % 16 through zero-padded copies: a whole eight of them as the
  // AVX2 loop's vector, the rest as its scalar tail (libm).
  alignas(64) In g[16] = {}, u[16] = {};
  std::copy(gate + i, gate + n, g);
  std::copy(up + i, up + n, u);
  alignas(64) float o[16];
  _mm512_store_ps(o, simd::silu_mul_avx512(load16(g), load16(u)));
  const int64_t vector_lanes = (n - i) / 8 * 8;
  for (int64_t l = vector_lanes; l < n - i; ++l) o[l] = silu_mul_scalar(g[l], u[l]);
  Out rounded[16];
  store16(rounded, _mm512_load_ps(o));
  std::copy(rounded, rounded + (n - i), out + i);
}

}  // namespace

SNAPSERVE_TARGET_AVX512F bool rms_norm_row_avx512(const float* x, const float* w, int64_t n,
                                                  float eps, float* out) {
  const __m512 scale = _mm512_set1_ps(rms_scale(sum_of_squares(x, n), n, eps));
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = first_lanes(n - j);
    const __m512 scaled = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + j), scale);
    _mm512_mask_storeu_ps(out + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, w + j), scaled));
  }
  return true;
}

SNAPSERVE_TARGET_AVX512BF16 bool rms_norm_row_avx512bf16(const float* x, const float* w, int64_t n,
                                                         float eps, uint16_t* out) {
  const __m512 scale = _mm512_set1_ps(rms_scale(sum_of_squares(x, n), n, eps));
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = first_lanes(n - j);
    const __m512 scaled = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + j), scale);
    const __m512 y = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, w + j), scaled);
    _mm256_mask_storeu_epi16(out + j, k, __builtin_bit_cast(__m256i, _mm512_cvtneps_pbh(y)));
  }
  return true;
}

// x[i] * cos[i] + (-x[i + half]) * sin[i] and x[i + half] * cos[i + half] +
// x[i] * sin[i + half], each product rounded, then the sum.
SNAPSERVE_TARGET_AVX512F bool rope_rotate_row_avx512(float* x, int64_t heads, int64_t head_stride,
                                                     int64_t d, const float* cos,
                                                     const float* sin) {
  const int64_t half = d / 2;
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * head_stride;
    for (int64_t i = 0; i < half; i += 16) {
      const __mmask16 k = first_lanes(half - i);  // lo and hi lanes never overlap
      const __m512 lo = _mm512_maskz_loadu_ps(k, v + i);
      const __m512 hi = _mm512_maskz_loadu_ps(k, v + i + half);
      const __m512 new_lo =
          _mm512_add_ps(_mm512_mul_ps(lo, _mm512_maskz_loadu_ps(k, cos + i)),
                        _mm512_mul_ps(negate(hi, sign), _mm512_maskz_loadu_ps(k, sin + i)));
      const __m512 new_hi =
          _mm512_add_ps(_mm512_mul_ps(hi, _mm512_maskz_loadu_ps(k, cos + i + half)),
                        _mm512_mul_ps(lo, _mm512_maskz_loadu_ps(k, sin + i + half)));
      _mm512_mask_storeu_ps(v + i, k, new_lo);
      _mm512_mask_storeu_ps(v + i + half, k, new_hi);
    }
  }
  return true;
}

bool silu_mul_row_avx512bf16(const float* gate, const float* up, int64_t n, float* out) {
  silu_mul_row(gate, up, n, out);
  return true;
}
bool silu_mul_row_avx512bf16(const uint16_t* gate, const uint16_t* up, int64_t n, float* out) {
  silu_mul_row(gate, up, n, out);
  return true;
}
bool silu_mul_row_avx512bf16(const float* gate, const float* up, int64_t n, uint16_t* out) {
  silu_mul_row(gate, up, n, out);
  return true;
}
bool silu_mul_row_avx512bf16(const uint16_t* gate, const uint16_t* up, int64_t n, uint16_t* out) {
  silu_mul_row(gate, up, n, out);
  return true;
}

}  // namespace snapserve::kernels::cpu

#else  // not x86-64: cpu_isa() is always kPortable, these are never called

namespace snapserve::kernels::cpu {
bool rms_norm_row_avx512(const float*, const float*, int64_t, float, float*) { return false; }
bool rms_norm_row_avx512bf16(const float*, const float*, int64_t, float, uint16_t*) {
  return false;
}
bool rope_rotate_row_avx512(float*, int64_t, int64_t, int64_t, const float*, const float*) {
  return false;
}
bool silu_mul_row_avx512bf16(const float*, const float*, int64_t, float*) { return false; }
bool silu_mul_row_avx512bf16(const uint16_t*, const uint16_t*, int64_t, float*) { return false; }
bool silu_mul_row_avx512bf16(const float*, const float*, int64_t, uint16_t*) { return false; }
bool silu_mul_row_avx512bf16(const uint16_t*, const uint16_t*, int64_t, uint16_t*) { return false; }
}  // namespace snapserve::kernels::cpu

#endif
