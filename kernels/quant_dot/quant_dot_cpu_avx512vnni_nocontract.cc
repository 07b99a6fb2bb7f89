// AVX-512 VNNI integer dot product of kernels/quant_dot/quant_dot.h. Two weight blocks
// share one 512-bit register (blocks b + p and b + p + 4 of an eight-block
// step, p = 0..3), unpacked to unsigned bytes and multiplied with their
// activations by one vpdpbusd (u8 x s8, four products summed into each int32
// lane). The signed types are made unsigned by a bias (Q4_0: +8, Q5_0: +16,
// Q8_0: +128) that is taken out again, exactly, as bias * sum(x_q) per block;
// the activations are laid out once per call to match the weights' register
// order (arrange_for_vnni in quant_dot_cpu_nocontract.cc). The eight blocks' integer
// totals then take the same float steps as on the AVX2 path
// (quant_dot_cpu_avx2_scales.h), so every output equals the portable one bit
// for bit; only the integer work, exact in any order, is done differently.
#include "kernels/quant/block32_type_dispatch.h"
#include "kernels/quant_dot/quant_dot.h"
#include "kernels/quant_dot/quant_dot_cpu_block.h"

#if defined(__x86_64__)
#include "kernels/cpu/x86/avx512_intrinsics.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/x86/isa_target.h"
#include "kernels/cpu/x86/simd_sums.h"
#include "kernels/quant_dot/quant_dot_cpu_avx2_scales.h"

#define SNAPSERVE_INT8_ROWS_TARGET SNAPSERVE_TARGET_AVX512VNNI_AVX2_F16C
#include "kernels/quant_dot/quant_dot_cpu_rows.h"

namespace snapserve::kernels::cpu {

namespace {

// Stands in for the blocks past a row's end in its last, partial step: any
// bytes would do (their activations are zero), these are never out of bounds.
alignas(64) constexpr uint8_t kZeroBlock[64] = {};

// The bias that makes a type's small integers unsigned, as a shift.
template <QuantType kType>
constexpr int kBiasShift = kType == QuantType::kQ4_0   ? 3
                           : kType == QuantType::kQ5_0 ? 4
                           : kType == QuantType::kQ8_0 ? 7
                                                       : -1;  // Q4_1/Q5_1: unsigned already

// Blocks a and b as 64 unsigned bytes in the pair order of quant_dot.h's
// VnniRows: a's elements 0..15, b's 0..15, a's 16..31, b's 16..31.
template <QuantType kType>
SNAPSERVE_TARGET_AVX512VNNI_AVX2_F16C inline __m512i pair_ints(const uint8_t* a, const uint8_t* b) {
  if constexpr (kType == QuantType::kQ8_0) {
    const __m512i ab = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 2))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)), 1);
    // a lo, a hi, b lo, b hi -> a lo, b lo, a hi, b hi; then q + 128.
    return _mm512_xor_si512(_mm512_shuffle_i64x2(ab, ab, _MM_SHUFFLE(3, 1, 2, 0)),
                            _mm512_set1_epi8(static_cast<char>(0x80)));
  } else {
    constexpr int kQs = kType == QuantType::kQ4_0   ? 2
                        : kType == QuantType::kQ4_1 ? 4
                        : kType == QuantType::kQ5_0 ? 6
                                                    : 8;
    const __m256i raw = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + kQs))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + kQs)), 1);
    // Low nibbles (elements 0..15) in the lower half, high ones above.
    const __m512i shifts = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    __m512i q = _mm512_and_si512(
        _mm512_srlv_epi16(_mm512_inserti64x4(_mm512_castsi256_si512(raw), raw, 1), shifts),
        _mm512_set1_epi8(0x0F));
    if constexpr (kType == QuantType::kQ5_0 || kType == QuantType::kQ5_1) {
      constexpr int kQh = kType == QuantType::kQ5_0 ? 2 : 4;
      uint32_t ha, hb;
      std::memcpy(&ha, a + kQh, 4);
      std::memcpy(&hb, b + kQh, 4);
      // Bit j of qh is element j's fifth bit; bytes in the same pair order.
      const __mmask64 fifth =
          static_cast<uint64_t>(ha & 0xFFFF) | static_cast<uint64_t>(hb & 0xFFFF) << 16 |
          static_cast<uint64_t>(ha >> 16) << 32 | static_cast<uint64_t>(hb >> 16) << 48;
      q = _mm512_mask_add_epi8(q, fifth, q, _mm512_set1_epi8(0x10));
    }
    return q;
  }
}

// Lane k: the total of block k of an eight-block step, from the four pair
// products p[j] (blocks j and j + 4; 128-bit lanes: j lo, j + 4 lo, j hi,
// j + 4 hi). Integer adds: exact in any order.
SNAPSERVE_TARGET_AVX512VNNI_AVX2_F16C inline __m256i totals_of_pairs(const __m512i* p) {
  const __m512i s01 =
      _mm512_add_epi32(_mm512_unpacklo_epi32(p[0], p[1]), _mm512_unpackhi_epi32(p[0], p[1]));
  const __m512i s23 =
      _mm512_add_epi32(_mm512_unpacklo_epi32(p[2], p[3]), _mm512_unpackhi_epi32(p[2], p[3]));
  // 128-bit lanes: blocks 0..3 lo, 4..7 lo, 0..3 hi, 4..7 hi.
  const __m512i t =
      _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
  return _mm512_castsi512_si256(
      _mm512_add_epi32(t, _mm512_shuffle_i64x2(t, t, _MM_SHUFFLE(1, 0, 3, 2))));
}

// The VNNI steps of the row loops (quant_dot_cpu_rows.h).
struct VnniSteps {
  static constexpr bool kCountsGroups = true;

  // One eight-block step (blocks [b, b + 8) of group g; kPartial: the row's
  // last `count` < 8 blocks) of one weight row, unpacked once, against
  // activation rows i0 .. i0 + rows - 1, added to acc[0 .. rows).
  template <QuantType kType, int64_t kMaxRows, bool kPartial>
  [[gnu::always_inline]] SNAPSERVE_TARGET_AVX512VNNI_AVX2_F16C static void step(
      const uint8_t* wrow, const QuantizedRows& xq, int64_t i0, int64_t rows, int64_t b, int64_t g,
      int64_t count, __m256* acc) {
    constexpr int64_t kB = kBlockBytes<kType>;
    const uint8_t* first = wrow + b * kB;
    // In the partial step, pairs whose first block is past the row hold
    // nothing (a 576-wide row's last step has 2 blocks: one pair of four).
    const int64_t pairs = kPartial ? std::min<int64_t>(4, count) : 4;
    const auto block = [&](int64_t j) {
      return !kPartial || j < count ? first + j * kB : kZeroBlock;
    };
    __m512i w[4];
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      w[p] = p < pairs ? pair_ints<kType>(block(p), block(p + 4)) : _mm512_setzero_si512();
    }
    __m256 d, m;
    block_scales8<kType, kPartial>(first, count, &d, &m);
    for (int64_t i = 0; i < (kMaxRows == 1 ? 1 : rows); ++i) {
      const int64_t row = i0 + i;
      const int8_t* x = xq.vnni_q.data() + (row * xq.vnni_groups + g) * 256;
      __m512i p[4];
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        p[j] = j < pairs ? _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[j],
                                               _mm512_loadu_si512(x + int64_t{64} * j))
                         : _mm512_setzero_si512();
      }
      __m256i totals = totals_of_pairs(p);
      if constexpr (kBiasShift<kType> >= 0) {
        const __m256i sums = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(xq.vnni_sums.data() + (row * xq.vnni_groups + g) * 8));
        totals = _mm256_sub_epi32(totals, _mm256_slli_epi32(sums, kBiasShift<kType>));
      }
      acc[i] =
          add_block_totals<kType, kPartial>(acc[i], totals, d, m, xq.d.data() + row * xq.blocks + b,
                                            xq.s.data() + row * xq.blocks + b, count);
    }
  }
};

}  // namespace

bool int8_dot_avx512vnni(const QuantMatrix& w, const QuantizedRows& xq, int64_t r_begin,
                         int64_t r_end, float* out, int64_t n_total) {
  if (xq.vnni_groups * 8 * kDotBlock < xq.k) return false;  // not arranged_for_vnni
  return with_block32_type<kAllBlock32Types>(w.type, [&]<QuantType kType>() {
    int8_rows::rows_dot<VnniSteps, kType>(w, xq, r_begin, r_end, out, n_total);
  });
}

}  // namespace snapserve::kernels::cpu

#else

namespace snapserve::kernels::cpu {
bool int8_dot_avx512vnni(const QuantMatrix&, const QuantizedRows&, int64_t, int64_t, float*,
                         int64_t) {
  return false;
}
}  // namespace snapserve::kernels::cpu

#endif
