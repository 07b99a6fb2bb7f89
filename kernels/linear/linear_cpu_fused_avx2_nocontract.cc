// Fused decode-and-dot of the fixed-order linear kernel (linear_cpu.cc) for
// GGUF Q4_0, Q4_1 and Q8_0 weights at one or two x rows (a decode step of one
// or two sequences), AVX2 + FMA only.
//
// The general path decodes a tile's weight rows into an L1 scratch buffer,
// then reads them back for the dot products; at one x row the decoding, the
// stores and the reloads cost several times the multiply-adds. Here each
// block's 32 weights are decoded in registers and fed straight to the FMAs.
// The numbers do not change: a weight is decoded with the same two roundings
// as quant_blocks_cpu_avx2_nocontract.cc (d * q, then + m; this file is compiled with
// -ffp-contract=off, kernels/CMakeLists.txt, and the FMAs are explicit
// intrinsics), and each output's accumulator takes the same products in the
// same order (8 lanes over K ascending, then simd::lane_sum_avx2) as
// tile_avx2. So a row's result is the same bits whichever path computed it,
// and batching invariance holds across m.
#include "kernels/linear/linear_cpu_tiles.h"
#include "kernels/quant/block32_type_dispatch.h"
#include "kernels/quant/quant_matrix.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/cpu/x86/isa_target.h"
#include "kernels/cpu/x86/simd_sums.h"

#define SNAPSERVE_FUSED_TARGET SNAPSERVE_TARGET_AVX2_FMA_F16C
#include "kernels/linear/linear_cpu_fused_driver.h"

namespace snapserve::kernels::cpu {

namespace {

// 8 bytes at p as 32-bit lanes.
SNAPSERVE_TARGET_AVX2_FMA_F16C inline __m256i unsigned8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// The AVX2 lanes of the fused tile (linear_cpu_fused_driver.h): a block's 32
// weights as four vectors of elements 8g .. 8g + 7.
struct Avx2Lanes {
  using Vec = __m256;
  static constexpr int kGroups = 4;
  static constexpr int kWidth = 8;

  [[gnu::always_inline]] SNAPSERVE_TARGET_AVX2_FMA_F16C static Vec zero() {
    return _mm256_setzero_ps();
  }
  [[gnu::always_inline]] SNAPSERVE_TARGET_AVX2_FMA_F16C static Vec fmadd_at(const float* x, Vec v,
                                                                            Vec acc) {
    return _mm256_fmadd_ps(_mm256_loadu_ps(x), v, acc);
  }
  [[gnu::always_inline]] SNAPSERVE_TARGET_AVX2_FMA_F16C static float sum(Vec acc) {
    return simd::lane_sum_avx2(acc);
  }

  // With the decoder's arithmetic (quant_blocks_cpu_avx2_nocontract.cc).
  template <QuantType kType>
  SNAPSERVE_TARGET_AVX2_FMA_F16C static void block_values(const uint8_t* b, Vec v[kGroups]) {
    if constexpr (kType == QuantType::kQ8_0) {
      const __m256 d = _mm256_set1_ps(fused::half_at(b));
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) {
        const __m256i q =
            _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * g)));
        v[g] = _mm256_mul_ps(_mm256_cvtepi32_ps(q), d);
      }
    } else {
      // Element j < 16: low nibble of qs[j]; j >= 16: high nibble of qs[j - 16].
      constexpr bool kOffset = kType == QuantType::kQ4_1;
      const __m256 s = _mm256_set1_ps(fused::half_at(b));
      const __m256 m = _mm256_set1_ps(kOffset ? fused::half_at(b + 2) : 0.0f);
      const uint8_t* qs = b + (kOffset ? 4 : 2);
      const __m256i low = _mm256_set1_epi32(0x0F);
      const __m256i raw[2] = {unsigned8(qs), unsigned8(qs + 8)};
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) {
        __m256i q = g < 2 ? _mm256_and_si256(raw[g], low)
                          : _mm256_and_si256(_mm256_srli_epi32(raw[g - 2], 4), low);
        if constexpr (!kOffset) q = _mm256_sub_epi32(q, _mm256_set1_epi32(8));
        v[g] = _mm256_mul_ps(s, _mm256_cvtepi32_ps(q));
        if constexpr (kOffset) v[g] = _mm256_add_ps(v[g], m);
      }
    }
  }
};

}  // namespace

bool tile_quant_fused_avx2(const Problem& p, const QuantMatrix& w, int64_t n0, int64_t rows) {
  return with_block32_type<kFusedDecodeTypes>(
      w.type, [&]<QuantType kType>() { fused::tile<Avx2Lanes, kType>(p, w, n0, rows); });
}

}  // namespace snapserve::kernels::cpu

#else

namespace snapserve::kernels::cpu {
bool tile_quant_fused_avx2(const Problem&, const QuantMatrix&, int64_t, int64_t) { return false; }
}  // namespace snapserve::kernels::cpu

#endif
