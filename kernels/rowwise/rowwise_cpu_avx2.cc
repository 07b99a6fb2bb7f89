// AVX2 SwiGLU gate (rowwise.h): silu(g) * u = g / (1 + exp(-g)) * u, eight
// lanes at a time; the tail falls back to libm like the portable loop.
#include "kernels/rowwise/rowwise.h"

#include <bit>
#include <cmath>
#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/cpu/x86/exp_avx2.h"
#include "kernels/cpu/x86/isa_target.h"
#endif

namespace snapserve::kernels::cpu {

#if defined(__x86_64__)
namespace {

// Eight floats from float32 or bfloat16 (widened exactly: the bits shifted up).
SNAPSERVE_TARGET_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
SNAPSERVE_TARGET_AVX2 inline __m256 load8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <typename T>
SNAPSERVE_TARGET_AVX2 void silu_mul_row(const T* gate, const T* up, int64_t n, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = load8(gate + i);
    const __m256 e = simd::exp_avx2(_mm256_xor_ps(g, sign));
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, load8(up + i)));
  }
  for (; i < n; ++i) out[i] = silu_mul_scalar(gate[i], up[i]);
}

}  // namespace

bool silu_mul_row_avx2(const float* gate, const float* up, int64_t n, float* out) {
  silu_mul_row(gate, up, n, out);
  return true;
}
bool silu_mul_row_avx2(const uint16_t* gate, const uint16_t* up, int64_t n, float* out) {
  silu_mul_row(gate, up, n, out);
  return true;
}
#else  // not x86-64: cpu_isa() is always kPortable, this is never called
bool silu_mul_row_avx2(const float*, const float*, int64_t, float*) { return false; }
bool silu_mul_row_avx2(const uint16_t*, const uint16_t*, int64_t, float*) { return false; }
#endif

}  // namespace snapserve::kernels::cpu
