// AVX-512 row quantizer of the int8 KV cache (kernels/kv_append/kv_append.h): one
// group of 16 values per vector, four groups' scales at a time, the portable
// quantize_kv_row's arithmetic
// (its scale and reciprocal are computed the same way, and vcvtps2dq rounds
// half to even as nearbyint does under the default rounding mode).
#include "kernels/kv_append/kv_append.h"

#if defined(__x86_64__)
#include "kernels/cpu/x86/avx512_intrinsics.h"
#include "kernels/cpu/x86/isa_target.h"

namespace snapserve::kernels::cpu {

namespace {

// One group of 16 values with its scale and reciprocal already known.
SNAPSERVE_TARGET_AVX512F void quantize_group(__m512 v, __m512 inv, int8_t* q) {
  __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(v, inv));
  r = _mm512_min_epi32(_mm512_max_epi32(r, _mm512_set1_epi32(-127)), _mm512_set1_epi32(127));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(r));
}

// Four groups (64 values, a head of 64) at once: their maxima by one tree of
// maxes over 128-bit blocks and then lanes (one horizontal max per group
// was most of the row's time: 1.9 % of a 2,048-token prefill into an int8
// cache), their scales and reciprocals by one division each, lane for lane
// the portable arithmetic.
SNAPSERVE_TARGET_AVX512F void quantize_four_groups(const float* x, int8_t* q, float* scales) {
  __m512 v[4], a[4];
  for (int g = 0; g < 4; ++g) {
    v[g] = _mm512_loadu_ps(x + g * kKvInt8Group);
    a[g] = _mm512_abs_ps(v[g]);
  }
  // Block i of m01: group 0's blocks i and i + 2 (i < 2), group 1's (i >= 2).
  const __m512 m01 = _mm512_max_ps(_mm512_shuffle_f32x4(a[0], a[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(a[0], a[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 m23 = _mm512_max_ps(_mm512_shuffle_f32x4(a[2], a[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(a[2], a[3], _MM_SHUFFLE(3, 2, 3, 2)));
  // Block g: group g's four lanes of maxima, then its max in every lane.
  __m512 m = _mm512_max_ps(_mm512_shuffle_f32x4(m01, m23, _MM_SHUFFLE(2, 0, 2, 0)),
                           _mm512_shuffle_f32x4(m01, m23, _MM_SHUFFLE(3, 1, 3, 1)));
  m = _mm512_max_ps(m, _mm512_permute_ps(m, _MM_SHUFFLE(2, 3, 0, 1)));
  m = _mm512_max_ps(m, _mm512_permute_ps(m, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 scale = _mm512_div_ps(m, _mm512_set1_ps(127.0f));
  const __m512 inv = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(scale, _mm512_setzero_ps(), _CMP_GT_OQ),
                                         _mm512_set1_ps(1.0f), scale);
  quantize_group(v[0], _mm512_shuffle_f32x4(inv, inv, 0x00), q);
  quantize_group(v[1], _mm512_shuffle_f32x4(inv, inv, 0x55), q + kKvInt8Group);
  quantize_group(v[2], _mm512_shuffle_f32x4(inv, inv, 0xAA), q + 2 * kKvInt8Group);
  quantize_group(v[3], _mm512_shuffle_f32x4(inv, inv, 0xFF), q + 3 * kKvInt8Group);
  const __m512i first_lanes = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  _mm_storeu_ps(scales, _mm512_castps512_ps128(_mm512_permutexvar_ps(first_lanes, scale)));
}

}  // namespace

SNAPSERVE_TARGET_AVX512F bool quantize_kv_row_avx512(const float* x, int64_t d, int8_t* q,
                                                     float* scales) {
  const int64_t groups = d / kKvInt8Group;
  int64_t g = 0;
  for (; g + 4 <= groups; g += 4) {
    quantize_four_groups(x + g * kKvInt8Group, q + g * kKvInt8Group, scales + g);
  }
  for (; g < groups; ++g) {
    const __m512 v = _mm512_loadu_ps(x + g * kKvInt8Group);
    const float amax = _mm512_reduce_max_ps(_mm512_abs_ps(v));
    const float scale = amax / 127.0f;
    const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    quantize_group(v, _mm512_set1_ps(inv), q + g * kKvInt8Group);
    scales[g] = scale;
  }
  return true;
}

}  // namespace snapserve::kernels::cpu

#else

namespace snapserve::kernels::cpu {
bool quantize_kv_row_avx512(const float*, int64_t, int8_t*, float*) { return false; }
}  // namespace snapserve::kernels::cpu

#endif
