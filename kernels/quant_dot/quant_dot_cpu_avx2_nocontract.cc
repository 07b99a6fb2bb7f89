// AVX2 integer dot product of kernels/quant_dot/quant_dot.h: eight weight blocks at a
// time, each unpacked to 32 int8 lanes and multiplied with its activation
// block by one maddubs (u8 x s8 -> pairs) and one madd (pairs -> quads); the
// eight blocks' integer totals land in one vector (lane k = block b + k), whose
// float scaling and accumulation is exactly the portable path's per-block
// multiply-then-add (this file is compiled with -ffp-contract=off and its
// target has no "fma"). The scales of the eight blocks come in with one
// gather. Up to eight activation rows share each unpacked block.
#include "kernels/quant/block32_type_dispatch.h"
#include "kernels/quant_dot/quant_dot.h"
#include "kernels/quant_dot/quant_dot_cpu_block.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/x86/isa_target.h"
#include "kernels/cpu/x86/simd_sums.h"
#include "kernels/quant_dot/quant_dot_cpu_avx2_scales.h"

#define SNAPSERVE_INT8_ROWS_TARGET SNAPSERVE_TARGET_AVX2_F16C
#include "kernels/quant_dot/quant_dot_cpu_rows.h"

namespace snapserve::kernels::cpu {

namespace {

// 0xFF in byte j where bit j of `bits` is set.
SNAPSERVE_TARGET_AVX2_F16C inline __m256i bit_bytes(uint32_t bits) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i mask = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask);
}

// The 32 nibbles of a legacy 4-bit block in element order (low nibbles are
// elements 0..15, high nibbles 16..31).
SNAPSERVE_TARGET_AVX2_F16C inline __m256i nibbles(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i low = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low), _mm_and_si128(raw, low));
}

// A block's 32 small-integer weights as int8 lanes (signed types) or uint8
// (Q4_1/Q5_1), in element order. The scales are read eight blocks at a time
// (block_scales8), so this reads only the quants.
template <QuantType kType>
SNAPSERVE_TARGET_AVX2_F16C inline __m256i block_ints(const uint8_t* b) {
  if constexpr (kType == QuantType::kQ8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
  } else if constexpr (kType == QuantType::kQ4_0) {
    return _mm256_sub_epi8(nibbles(b + 2), _mm256_set1_epi8(8));
  } else if constexpr (kType == QuantType::kQ4_1) {
    return nibbles(b + 4);
  } else if constexpr (kType == QuantType::kQ5_0) {
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    const __m256i fifth = _mm256_and_si256(bit_bytes(qh), _mm256_set1_epi8(0x10));
    return _mm256_sub_epi8(_mm256_or_si256(nibbles(b + 6), fifth), _mm256_set1_epi8(16));
  } else {  // kQ5_1
    uint32_t qh;
    std::memcpy(&qh, b + 4, 4);
    const __m256i fifth = _mm256_and_si256(bit_bytes(qh), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(nibbles(b + 8), fifth);
  }
}

// The 8 int32 partial sums (elements 4l..4l+3) of one block's products with
// 32 int8 activations: maddubs (u8 x s8 -> pairs) then madd (pairs -> quads).
// No sum can saturate: |w| <= 128 and |x| <= 127.
template <QuantType kType>
SNAPSERVE_TARGET_AVX2_F16C inline __m256i block_products(__m256i w, const int8_t* x) {
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (kSignedInts<kType>) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xv, w)),
                             ones);
  } else {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, xv), ones);
  }
}

// Lane k of the result: the total of s[k]'s 8 lanes (integer adds: exact in
// any order).
SNAPSERVE_TARGET_AVX2_F16C inline __m256i totals_of_8(const __m256i* s) {
  const __m256i h01 = _mm256_hadd_epi32(s[0], s[1]), h23 = _mm256_hadd_epi32(s[2], s[3]);
  const __m256i h45 = _mm256_hadd_epi32(s[4], s[5]), h67 = _mm256_hadd_epi32(s[6], s[7]);
  const __m256i h0123 = _mm256_hadd_epi32(h01, h23), h4567 = _mm256_hadd_epi32(h45, h67);
  return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                          _mm256_permute2x128_si256(h0123, h4567, 0x31));
}

// The AVX2 steps of the row loops (quant_dot_cpu_rows.h).
struct Avx2Steps {
  static constexpr bool kCountsGroups = false;

  // One eight-block step of the row loops: blocks [b, b + count) of one
  // weight row, unpacked once, against activation rows i0 .. i0 + rows - 1.
  template <QuantType kType, int64_t kMaxRows, bool kPartial>
  SNAPSERVE_TARGET_AVX2_F16C static void step(const uint8_t* wrow, const QuantizedRows& xq,
                                              int64_t i0, int64_t rows, int64_t b,
                                              int64_t /*group*/, int64_t count, __m256* acc) {
    constexpr int64_t kB = kBlockBytes<kType>;
    const int64_t blocks = xq.blocks;
    __m256 d, m;
    if constexpr (kMaxRows == 1) {
      // Each block's products right after its unpacking: only the eight
      // products are live, so nothing spills out of the 16 registers.
      const int8_t* x = xq.q.data() + (i0 * blocks + b) * kDotBlock;
      __m256i p[8];
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        p[k] =
            kPartial && k >= count
                ? _mm256_setzero_si256()
                : block_products<kType>(block_ints<kType>(wrow + (b + k) * kB), x + k * kDotBlock);
      }
      block_scales8<kType, kPartial>(wrow + b * kB, count, &d, &m);
      acc[0] = add_block_totals<kType, kPartial>(acc[0], totals_of_8(p), d, m,
                                                 xq.d.data() + i0 * blocks + b,
                                                 xq.s.data() + i0 * blocks + b, count);
      return;
    }
    block_scales8<kType, kPartial>(wrow + b * kB, count, &d, &m);
    __m256i w[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      w[k] =
          kPartial && k >= count ? _mm256_setzero_si256() : block_ints<kType>(wrow + (b + k) * kB);
    }
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t row = (i0 + i) * blocks;
      const int8_t* x = xq.q.data() + (row + b) * kDotBlock;
      __m256i p[8];
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) p[k] = block_products<kType>(w[k], x + k * kDotBlock);
      acc[i] = add_block_totals<kType, kPartial>(
          acc[i], totals_of_8(p), d, m, xq.d.data() + row + b, xq.s.data() + row + b, count);
    }
  }
};

}  // namespace

bool int8_dot_avx2(const QuantMatrix& w, const QuantizedRows& xq, int64_t r_begin, int64_t r_end,
                   float* out, int64_t n_total) {
  return with_block32_type<kAllBlock32Types>(w.type, [&]<QuantType kType>() {
    int8_rows::rows_dot<Avx2Steps, kType>(w, xq, r_begin, r_end, out, n_total);
  });
}

}  // namespace snapserve::kernels::cpu

#else

namespace snapserve::kernels::cpu {
bool int8_dot_avx2(const QuantMatrix&, const QuantizedRows&, int64_t, int64_t, float*, int64_t) {
  return false;
}
}  // namespace snapserve::kernels::cpu

#endif
