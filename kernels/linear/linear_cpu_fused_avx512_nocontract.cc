// Fused decode-and-dot of the fixed-order linear kernel (linear_cpu.cc) for
// GGUF Q4_0, Q4_1 and Q8_0 weights at one or two x rows, AVX-512F: the
// sixteen-lane counterpart of linear_cpu_fused_avx2_nocontract.cc (read that file's
// comment for why). Each block's 32 weights are decoded in two registers
// (elements 0-15: the low nibbles or first 16 bytes; 16-31: the high nibbles
// or last 16 bytes) with the decoder's two roundings (d * q, then + m; this
// file is compiled with -ffp-contract=off and its FMAs are explicit), and
// each output's accumulator takes the products in tile_avx512's order:
// lane l holds j = l (mod 16) over K ascending, then simd::lane_sum_avx512.
// So a row's result is the same bits as the scratch-buffer path gives it at
// any batch size.
#include "kernels/linear/linear_cpu_tiles.h"
#include "kernels/quant/block32_type_dispatch.h"
#include "kernels/quant/quant_matrix.h"

#if defined(__x86_64__)
#include "kernels/cpu/x86/avx512_intrinsics.h"

#include "kernels/cpu/x86/isa_target.h"
#include "kernels/cpu/x86/simd_sums.h"

#define SNAPSERVE_FUSED_TARGET SNAPSERVE_TARGET_AVX512F_AVX2_FMA_F16C
#include "kernels/linear/linear_cpu_fused_driver.h"

namespace snapserve::kernels::cpu {

namespace {

// 16 bytes at p as 32-bit lanes.
SNAPSERVE_TARGET_AVX512F_AVX2_FMA_F16C inline __m512i unsigned16(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The AVX-512 lanes of the fused tile (linear_cpu_fused_driver.h): a block's
// 32 weights as two vectors (elements 0-15, 16-31).
struct Avx512Lanes {
  using Vec = __m512;
  static constexpr int kGroups = 2;
  static constexpr int64_t kWidth = 16;

  [[gnu::always_inline]] SNAPSERVE_TARGET_AVX512F_AVX2_FMA_F16C static Vec zero() {
    return _mm512_setzero_ps();
  }
  [[gnu::always_inline]] SNAPSERVE_TARGET_AVX512F_AVX2_FMA_F16C static Vec fmadd_at(const float* x,
                                                                                    Vec v,
                                                                                    Vec acc) {
    return _mm512_fmadd_ps(_mm512_loadu_ps(x), v, acc);
  }
  [[gnu::always_inline]] SNAPSERVE_TARGET_AVX512F_AVX2_FMA_F16C static float sum(Vec acc) {
    return simd::lane_sum_avx512(acc);
  }

  // With the decoder's arithmetic (quant_blocks_cpu_avx2_nocontract.cc).
  template <QuantType kType>
  SNAPSERVE_TARGET_AVX512F_AVX2_FMA_F16C static void block_values(const uint8_t* b,
                                                                  Vec v[kGroups]) {
    if constexpr (kType == QuantType::kQ8_0) {
      const __m512 d = _mm512_set1_ps(fused::half_at(b));
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m512i q = _mm512_cvtepi8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + int64_t{16} * h)));
        v[h] = _mm512_mul_ps(_mm512_cvtepi32_ps(q), d);
      }
    } else {
      // Element j < 16: low nibble of qs[j]; j >= 16: high nibble of qs[j - 16].
      constexpr bool kOffset = kType == QuantType::kQ4_1;
      const __m512 s = _mm512_set1_ps(fused::half_at(b));
      const __m512 m = _mm512_set1_ps(kOffset ? fused::half_at(b + 2) : 0.0f);
      const __m512i raw = unsigned16(b + (kOffset ? 4 : 2));
      const __m512i low = _mm512_set1_epi32(0x0F);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        __m512i q =
            h == 0 ? _mm512_and_si512(raw, low) : _mm512_and_si512(_mm512_srli_epi32(raw, 4), low);
        if constexpr (!kOffset) q = _mm512_sub_epi32(q, _mm512_set1_epi32(8));
        v[h] = _mm512_mul_ps(s, _mm512_cvtepi32_ps(q));
        if constexpr (kOffset) v[h] = _mm512_add_ps(v[h], m);
      }
    }
  }
};

}  // namespace

bool tile_quant_fused_avx512(const Problem& p, const QuantMatrix& w, int64_t n0, int64_t rows) {
  return with_block32_type<kFusedDecodeTypes>(
      w.type, [&]<QuantType kType>() { fused::tile<Avx512Lanes, kType>(p, w, n0, rows); });
}

}  // namespace snapserve::kernels::cpu

#else

namespace snapserve::kernels::cpu {
bool tile_quant_fused_avx512(const Problem&, const QuantMatrix&, int64_t, int64_t) { return false; }
}  // namespace snapserve::kernels::cpu

#endif
