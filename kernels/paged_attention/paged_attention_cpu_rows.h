// Internal to kernels/paged_attention/paged_attention_cpu_*.cc: a cache row's elements as
// float32 vectors, one policy per cache dtype, so that each SIMD block step is
// written once for float32, bfloat16, float16 and int8 caches. Every bfloat16 and
// float16 value is a float32, so the widened rows are exact: a 16-bit cache
// is folded with the same arithmetic as a float32 copy of it.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/x86/isa_target.h"

namespace snapserve::kernels::cpu {

struct Float32Rows {
  using Element = float;
  SNAPSERVE_TARGET_AVX2_FMA_F16C static __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
  SNAPSERVE_TARGET_AVX512F_AVX2_FMA_F16C static __m512 load16(const float* p) {
    return _mm512_loadu_ps(p);
  }
};

// bfloat16 is the top half of a float32: each 16-bit value shifted up.
struct BFloat16Rows {
  using Element = uint16_t;
  SNAPSERVE_TARGET_AVX2_FMA_F16C static __m256 load8(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  SNAPSERVE_TARGET_AVX512F_AVX2_FMA_F16C static __m512 load16(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
};

// float16 through F16C (which the AVX2 level includes).
struct Float16Rows {
  using Element = uint16_t;
  SNAPSERVE_TARGET_AVX2_FMA_F16C static __m256 load8(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  SNAPSERVE_TARGET_AVX512F_AVX2_FMA_F16C static __m512 load16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
};

// An int8 cache (kernels/kv_append/kv_append.h, kv_append_int8): 16 values times
// their group's float32 scale, each value exactly float(q) · scale as
// widen_int8 (paged_attention_cpu.cc) computes it. The scale of the group
// at p is found from p's distance to the block's first value `base`; loads
// start at a group boundary (every caller loads at multiples of 16). AVX-512
// only: the other steps fold widened rows.
struct Int8Rows {
  using Element = int8_t;
  const int8_t* base = nullptr;
  const float* scales = nullptr;  // one per 16 values from base
  SNAPSERVE_TARGET_AVX512F_AVX2_FMA_F16C __m512 load16(const int8_t* p) const {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)),
                         _mm512_set1_ps(scales[(p - base) >> 4]));
  }
};

}  // namespace snapserve::kernels::cpu

#endif
