// AVX-512 row quantizer of the int8 KV cache (kernels/kv_append.h): one
// group of 16 values per vector, the portable quantize_kv_row's arithmetic
// (its scale and reciprocal are computed the same way, and vcvtps2dq rounds
// half to even as nearbyint does under the default rounding mode).
#include "kernels/kv_append.h"

#if defined(__x86_64__)
#include "kernels/avx512_intrinsics.h"

namespace snapserve::kernels::cpu {

__attribute__((target("avx512f"))) bool quantize_kv_row_avx512(const float* x, int64_t d, int8_t* q,
                                                               float* scales) {
  for (int64_t g = 0; g < d / kKvInt8Group; ++g) {
    const __m512 v = _mm512_loadu_ps(x + g * kKvInt8Group);
    const float amax = _mm512_reduce_max_ps(_mm512_abs_ps(v));
    const float scale = amax / 127.0f;
    const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(v, _mm512_set1_ps(inv)));
    r = _mm512_min_epi32(_mm512_max_epi32(r, _mm512_set1_epi32(-127)), _mm512_set1_epi32(127));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + g * kKvInt8Group), _mm512_cvtepi32_epi8(r));
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
