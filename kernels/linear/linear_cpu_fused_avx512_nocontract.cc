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

#include <cstring>

#include "kernels/cpu/x86/isa_target.h"
#include "kernels/cpu/x86/simd_sums.h"

namespace snapserve::kernels::cpu {

namespace {

constexpr int64_t kBlock = 32;

SNAPSERVE_TARGET_AVX512F_AVX2_FMA_F16C inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return _cvtsh_ss(bits);  // exact, as every half -> float conversion
}

// 16 bytes at p as 32-bit lanes.
SNAPSERVE_TARGET_AVX512F_AVX2_FMA_F16C inline __m512i unsigned16(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The 32 weights of one block as two vectors (elements 0-15, 16-31), with the
// decoder's arithmetic (quant_blocks_cpu_avx2_nocontract.cc).
template <QuantType kType>
SNAPSERVE_TARGET_AVX512F_AVX2_FMA_F16C inline void block_values(const uint8_t* b, __m512 v[2]) {
  if constexpr (kType == QuantType::kQ8_0) {
    const __m512 d = _mm512_set1_ps(half_at(b));
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m512i q = _mm512_cvtepi8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + int64_t{16} * h)));
      v[h] = _mm512_mul_ps(_mm512_cvtepi32_ps(q), d);
    }
  } else {
    // Element j < 16: low nibble of qs[j]; j >= 16: high nibble of qs[j - 16].
    constexpr bool kOffset = kType == QuantType::kQ4_1;
    const __m512 s = _mm512_set1_ps(half_at(b));
    const __m512 m = _mm512_set1_ps(kOffset ? half_at(b + 2) : 0.0f);
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

// kRows weight rows from `wr` against x rows xa (and xb when kPair).
template <QuantType kType, int kRows, bool kPair>
SNAPSERVE_TARGET_AVX512F_AVX2_FMA_F16C inline void rows_dot(const uint8_t* const* wr,
                                                            int64_t blocks, const float* xa,
                                                            const float* xb, float* oa, float* ob) {
  constexpr int64_t kBytes = kType == QuantType::kQ8_0 ? 34 : (kType == QuantType::kQ4_1 ? 20 : 18);
  __m512 a[kRows], c[kRows];
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r) a[r] = c[r] = _mm512_setzero_ps();
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const float* xab = xa + blk * kBlock;
    const float* xbb = xb + blk * kBlock;
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      __m512 v[2];
      block_values<kType>(wr[r] + blk * kBytes, v);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        a[r] = _mm512_fmadd_ps(_mm512_loadu_ps(xab + int64_t{16} * h), v[h], a[r]);
      }
      if constexpr (kPair) {
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          c[r] = _mm512_fmadd_ps(_mm512_loadu_ps(xbb + int64_t{16} * h), v[h], c[r]);
        }
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    oa[r] = simd::lane_sum_avx512(a[r]);
    if constexpr (kPair) ob[r] = simd::lane_sum_avx512(c[r]);
  }
}

template <QuantType kType>
SNAPSERVE_TARGET_AVX512F_AVX2_FMA_F16C void tile(const Problem& p, const QuantMatrix& w, int64_t n0,
                                                 int64_t rows) {
  const int64_t blocks = p.k / kBlock;
  const uint8_t* wr[kTile] = {};
  for (int64_t r = 0; r < rows; ++r) wr[r] = w.row(n0 + r);
  for (int64_t i = 0; i < p.m; i += 2) {
    const float* xa = p.x + i * p.k;
    float* oa = p.out + i * p.n_total + n0;
    float* ob = oa + p.n_total;
    const bool pair = i + 1 < p.m;
    if (rows == kTile) {
      if (pair) {
        rows_dot<kType, kTile, true>(wr, blocks, xa, xa + p.k, oa, ob);
      } else {
        rows_dot<kType, kTile, false>(wr, blocks, xa, xa, oa, ob);
      }
      continue;
    }
    for (int64_t r = 0; r < rows; ++r) {  // a partial tile, the last columns
      if (pair) {
        rows_dot<kType, 1, true>(wr + r, blocks, xa, xa + p.k, oa + r, ob + r);
      } else {
        rows_dot<kType, 1, false>(wr + r, blocks, xa, xa, oa + r, ob + r);
      }
    }
  }
}

}  // namespace

bool tile_quant_fused_avx512(const Problem& p, const QuantMatrix& w, int64_t n0, int64_t rows) {
  return with_block32_type<kFusedDecodeTypes>(
      w.type, [&]<QuantType kType>() { tile<kType>(p, w, n0, rows); });
}

}  // namespace snapserve::kernels::cpu

#else

namespace snapserve::kernels::cpu {
bool tile_quant_fused_avx512(const Problem&, const QuantMatrix&, int64_t, int64_t) { return false; }
}  // namespace snapserve::kernels::cpu

#endif
