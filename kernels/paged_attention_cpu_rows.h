// Internal to kernels/paged_attention_cpu_*.cc: a cache row's elements as
// float32 vectors, one policy per cache dtype, so that each SIMD block step is
// written once for float32, bfloat16 and float16 caches. Every bfloat16 and
// float16 value is a float32, so the widened rows are exact: a 16-bit cache
// is folded with the same arithmetic as a float32 copy of it.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

namespace snapserve::kernels::cpu {

#define SNAPSERVE_ROWS_AVX2 __attribute__((target("avx2,fma,f16c")))
#define SNAPSERVE_ROWS_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))

struct Float32Rows {
  using Element = float;
  SNAPSERVE_ROWS_AVX2 static __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
  SNAPSERVE_ROWS_AVX512 static __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
};

// bfloat16 is the top half of a float32: each 16-bit value shifted up.
struct BFloat16Rows {
  using Element = uint16_t;
  SNAPSERVE_ROWS_AVX2 static __m256 load8(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  SNAPSERVE_ROWS_AVX512 static __m512 load16(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
};

// float16 through F16C (which the AVX2 level includes).
struct Float16Rows {
  using Element = uint16_t;
  SNAPSERVE_ROWS_AVX2 static __m256 load8(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  SNAPSERVE_ROWS_AVX512 static __m512 load16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
};

}  // namespace snapserve::kernels::cpu

#endif
