// Internal to kernels/quant_dot/quant_dot_cpu_avx2_nocontract.cc and
// quant_dot_cpu_avx512vnni_nocontract.cc: the float side of an eight-block step of
// kernels/quant_dot/quant_dot.h's arithmetic, shared by every SIMD path so that they stay bit-equal
// to the portable one. A path computes the eight blocks' exact integer totals however it likes
// (maddubs on AVX2, vpdpbusd on VNNI) and hands them to add_block_totals.
// Include only from x86-64 translation units compiled with -ffp-contract=off.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/x86/isa_target.h"
#include "kernels/quant/quant_blocks.h"

namespace snapserve::kernels::cpu {

// The helpers below are SNAPSERVE_TARGET_AVX2_F16C. F16C: the block scales
// are halves (every AVX2 path of cpu_isa.h has it). Wider targets may inline
// these (their instruction sets include this one).

// Types whose small-integer weights are signed (Q4_1/Q5_1: unsigned plus an
// offset term).
template <QuantType kType>
constexpr bool kSignedInts =
    kType == QuantType::kQ8_0 || kType == QuantType::kQ4_0 || kType == QuantType::kQ5_0;

template <QuantType kType>
constexpr int kBlockBytes = kType == QuantType::kQ8_0   ? 34
                            : kType == QuantType::kQ4_0 ? 18
                            : kType == QuantType::kQ4_1 ? 20
                            : kType == QuantType::kQ5_0 ? 22
                                                        : 24;

// All lanes (count 8) or the first `count` lanes, as a mask vector.
SNAPSERVE_TARGET_AVX2_F16C inline __m256i first_lanes(int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// The half-precision d (first two bytes) and m (next two; unused by the
// signed types) of `count` <= 8 consecutive blocks at `first`, as floats
// (0 in the lanes past count): one gather of each block's first 4 bytes,
// the halves split apart and converted exactly.
template <QuantType kType, bool kPartial>
SNAPSERVE_TARGET_AVX2_F16C inline void block_scales8(const uint8_t* first, int64_t count, __m256* d,
                                                     __m256* m) {
  constexpr int kB = kBlockBytes<kType>;
  const __m256i offsets = _mm256_setr_epi32(0, kB, 2 * kB, 3 * kB, 4 * kB, 5 * kB, 6 * kB, 7 * kB);
  const int* base = reinterpret_cast<const int*>(first);
  const __m256i heads = kPartial ? _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), base,
                                                               offsets, first_lanes(count), 1)
                                 : _mm256_i32gather_epi32(base, offsets, 1);
  // Per 128 bits: d0..d3, m0..m3 | d4..d7, m4..m7; then d0..d7 | m0..m7.
  const __m256i halves = _mm256_permute4x64_epi64(
      _mm256_packus_epi32(_mm256_and_si256(heads, _mm256_set1_epi32(0xFFFF)),
                          _mm256_srli_epi32(heads, 16)),
      0xD8);
  *d = _mm256_cvtph_ps(_mm256_castsi256_si128(halves));
  *m = _mm256_cvtph_ps(_mm256_extracti128_si256(halves, 1));
}

// 8 floats at p, or the first `count` (0 past them).
template <bool kPartial>
SNAPSERVE_TARGET_AVX2_F16C inline __m256 load8(const float* p, int64_t count) {
  return kPartial ? _mm256_maskload_ps(p, first_lanes(count)) : _mm256_loadu_ps(p);
}

// Adds blocks [b, b + count) (count = 8, or fewer when kPartial: the last
// blocks of a row) of one weight row against one activation row to `acc`,
// lane k taking block b + k, whose exact integer dot product is totals[k];
// d and m are the blocks' scales (block_scales8), dx and sx the activation
// blocks' scale and scaled sum. The lanes past count get (0 * 0) * t
// (+ 0 * 0): adding +0 leaves every float32 bit as it was (a lane that
// starts at +0 can never become -0), so they match the portable path, which
// adds nothing.
template <QuantType kType, bool kPartial>
SNAPSERVE_TARGET_AVX2_F16C inline __m256 add_block_totals(__m256 acc, __m256i totals, __m256 d,
                                                          __m256 m, const float* dx,
                                                          const float* sx, int64_t count) {
  acc = _mm256_add_ps(
      acc, _mm256_mul_ps(_mm256_mul_ps(d, load8<kPartial>(dx, count)), _mm256_cvtepi32_ps(totals)));
  if constexpr (!kSignedInts<kType>) {
    acc = _mm256_add_ps(acc, _mm256_mul_ps(m, load8<kPartial>(sx, count)));
  }
  return acc;
}

}  // namespace snapserve::kernels::cpu
