// AVX-512 VNNI kernel of the int8 prompt GEMM (kernels/prefill_gemm/prefill_gemm_int8.h).
//
// A tile is kRows activation rows by one 32-row panel (two 16-lane vectors).
// Per 32-block: eight quads, each two weight loads and 2 · kRows vpdpbusd
// against the rows' four activation bytes broadcast; then per (row, vector)
// one conversion, one multiply (scale · d_x) and two FMAs. The weights of a
// panel (k = 576: 18 KiB) stay in L1 while every activation row passes.
#include "kernels/prefill_gemm/prefill_gemm_int8.h"

#if defined(__x86_64__)
#include "kernels/cpu/x86/avx512_intrinsics.h"
#include "kernels/cpu/x86/isa_target.h"

#include <algorithm>
#include <cstring>

namespace snapserve::kernels::cpu {

namespace {

// Rows per tile: 8 int32 + 8 float accumulators, 2 weight vectors and the
// scales fit the 32 registers.
constexpr int64_t kTileRows = 4;

SNAPSERVE_TARGET_AVX512VNNI_FMA_F16C inline __m512i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Adds quad g's products of two weight vectors (tiles 0 and 1) to the sums.
template <int64_t kRows>
SNAPSERVE_TARGET_AVX512VNNI_FMA_F16C inline void quad_products(const PanelActivations& x,
                                                               __m512i w0, __m512i w1, int64_t i0,
                                                               int64_t b, int64_t g,
                                                               __m512i (&sum)[kRows][2]) {
#pragma GCC unroll 8
  for (int64_t r = 0; r < kRows; ++r) {
    const __m512i xr = broadcast4(x.q + (i0 + r) * x.k + b * kPanelBlock + g * 4);
    sum[r][0] = _mm512_dpbusd_epi32(sum[r][0], w0, xr);
    sum[r][1] = _mm512_dpbusd_epi32(sum[r][1], w1, xr);
  }
}

// The exact integer sums of one 32-block of one panel for kRows rows.
template <int64_t kRows, bool kNibbles>
SNAPSERVE_TARGET_AVX512VNNI_FMA_F16C inline void block_sums(const PanelActivations& x,
                                                            const uint8_t* blk, int64_t i0,
                                                            int64_t b, __m512i (&sum)[kRows][2]) {
#pragma GCC unroll 8
  for (int64_t r = 0; r < kRows; ++r) sum[r][0] = sum[r][1] = _mm512_setzero_si512();
  if constexpr (kNibbles) {
    const __m512i low = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int64_t g = 0; g < 4; ++g) {
      const __m512i v0 = _mm512_loadu_si512(blk + g * 128);
      const __m512i v1 = _mm512_loadu_si512(blk + g * 128 + 64);
      quad_products<kRows>(x, _mm512_and_si512(v0, low), _mm512_and_si512(v1, low), i0, b, g, sum);
      quad_products<kRows>(x, _mm512_and_si512(_mm512_srli_epi16(v0, 4), low),
                           _mm512_and_si512(_mm512_srli_epi16(v1, 4), low), i0, b, g + 4, sum);
    }
  } else {
#pragma GCC unroll 8
    for (int64_t g = 0; g < 8; ++g) {
      quad_products<kRows>(x, _mm512_loadu_si512(blk + g * 128),
                           _mm512_loadu_si512(blk + g * 128 + 64), i0, b, g, sum);
    }
  }
}

// 16 float16 values as float32.
SNAPSERVE_TARGET_AVX512VNNI_FMA_F16C inline __m512 load_halves(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Block b's float steps (prefill_gemm_int8.h), in block order. kBiased:
// the type's small integers were made unsigned by a bias (Q4_0, Q5_0, Q8_0;
// m is 0), so the offset is -bias * d; else (Q4_1, Q5_1) it is m as stored.
template <int64_t kRows, bool kBiased>
SNAPSERVE_TARGET_AVX512VNNI_FMA_F16C inline void block_terms(const PanelActivations& x,
                                                             const uint16_t* sc, __m512 neg_bias,
                                                             int64_t blocks, int64_t i0, int64_t b,
                                                             const __m512i (&sum)[kRows][2],
                                                             __m512 (&acc)[kRows][2]) {
  const __m512 scale0 = load_halves(sc), scale1 = load_halves(sc + 16);
  // m - bias * d, the portable path's offset: one of the two terms is 0 and
  // the product is exact. Without a bias it is m itself (m + d * -0.0f is m,
  // the sign of a zero m included), which saves two FMAs per block.
  __m512 off0, off1;
  if constexpr (kBiased) {
    off0 = _mm512_fmadd_ps(scale0, neg_bias, load_halves(sc + 32));
    off1 = _mm512_fmadd_ps(scale1, neg_bias, load_halves(sc + 48));
  } else {
    off0 = load_halves(sc + 32);
    off1 = load_halves(sc + 48);
  }
#pragma GCC unroll 8
  for (int64_t r = 0; r < kRows; ++r) {
    const int64_t xb = (i0 + r) * blocks + b;
    const __m512 dx = _mm512_set1_ps(x.d[xb]), sx = _mm512_set1_ps(x.s[xb]);
    acc[r][0] =
        _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r][0]), _mm512_mul_ps(scale0, dx), acc[r][0]);
    acc[r][1] =
        _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r][1]), _mm512_mul_ps(scale1, dx), acc[r][1]);
    acc[r][0] = _mm512_fmadd_ps(off0, sx, acc[r][0]);
    acc[r][1] = _mm512_fmadd_ps(off1, sx, acc[r][1]);
  }
}

// How far ahead a tile that streams its panel from memory asks for the
// bytes and scales it will read: kPrefetchBlocks blocks (4 KiB of nibbles,
// 8 KiB of bytes), running on into the next panel, which lies right after
// this one. At one activation row a block is too little work for the
// hardware prefetchers to run far enough ahead of the loads (they do not
// follow a stream across 4 KiB pages); asked for this far ahead, the lines
// arrive in time (2, 4, 6 and 12 blocks and the T1 and NTA hints were no
// better; docs/quantized-weights.md, "Int8 panels").
constexpr int64_t kPrefetchBlocks = 8;

template <int64_t kStep, int64_t kBlockBytes>
SNAPSERVE_TARGET_AVX512VNNI_FMA_F16C inline void prefetch_ahead(const uint8_t* bytes,
                                                                const uint16_t* scales, int64_t b) {
  const auto* pb = reinterpret_cast<const char*>(bytes + (b + kPrefetchBlocks) * kBlockBytes);
#pragma GCC unroll 64
  for (int64_t l = 0; l < kStep * kBlockBytes; l += 64) _mm_prefetch(pb + l, _MM_HINT_T0);
  const auto* ps = reinterpret_cast<const char*>(scales + (b + kPrefetchBlocks) * 2 * kPanelRows);
#pragma GCC unroll 8
  for (int64_t l = 0; l < kStep * 2 * kPanelRows * 2; l += 64) _mm_prefetch(ps + l, _MM_HINT_T0);
}

// Rows i0 .. i0 + kRows - 1 against one panel; columns [0, cols) of the
// panel are stored. kStep blocks' integer sums are computed before their
// float steps: at one or two rows a block alone is too little independent
// work to hide vpdpbusd's latency. The float steps keep block order, so the
// bits do not depend on kRows or kStep. `stream`: this tile is the first
// to read the panel (it comes from memory), so it prefetches ahead.
template <int64_t kRows, int64_t kStep, bool kNibbles, bool kBiased>
SNAPSERVE_TARGET_AVX512VNNI_FMA_F16C void tile(const PanelActivations& x, const uint8_t* bytes,
                                               const uint16_t* scales, float bias, int64_t blocks,
                                               int64_t i0, float* out, int64_t ldo, int64_t cols,
                                               bool accumulate, bool stream) {
  constexpr int64_t kBlockBytes = kNibbles ? 512 : 1024;
  const __m512 neg_bias = _mm512_set1_ps(-bias);
  // The tile's outputs: 4 rows of 128 bytes at a stride of the matrix's
  // width, which no hardware prefetcher follows. Asked for now, they arrive
  // long before the stores (and the loads of AddLinear's accumulation)
  // after the block loop, which otherwise wait for them
  // (docs/quantized-weights.md, "Int8 panels").
#pragma GCC unroll 8
  for (int64_t r = 0; r < kRows; ++r) {
    const float* o = out + (i0 + r) * ldo;
    _mm_prefetch(reinterpret_cast<const char*>(o), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(o + 16), _MM_HINT_T0);
  }
  __m512 acc[kRows][2];
#pragma GCC unroll 8
  for (int64_t r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + kStep <= blocks; b += kStep) {
    if (stream) prefetch_ahead<kStep, kBlockBytes>(bytes, scales, b);
    __m512i sum[kStep][kRows][2];
#pragma GCC unroll 8
    for (int64_t s = 0; s < kStep; ++s) {
      block_sums<kRows, kNibbles>(x, bytes + (b + s) * kBlockBytes, i0, b + s, sum[s]);
    }
#pragma GCC unroll 8
    for (int64_t s = 0; s < kStep; ++s) {
      block_terms<kRows, kBiased>(x, scales + (b + s) * 2 * kPanelRows, neg_bias, blocks, i0, b + s,
                                  sum[s], acc);
    }
  }
  for (; b < blocks; ++b) {
    if (stream) prefetch_ahead<1, kBlockBytes>(bytes, scales, b);
    __m512i sum[kRows][2];
    block_sums<kRows, kNibbles>(x, bytes + b * kBlockBytes, i0, b, sum);
    block_terms<kRows, kBiased>(x, scales + b * 2 * kPanelRows, neg_bias, blocks, i0, b, sum, acc);
  }
  const __mmask16 m0 = cols >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << cols) - 1);
  const __mmask16 m1 =
      cols >= 32 ? 0xFFFF : (cols <= 16 ? 0 : static_cast<__mmask16>((1u << (cols - 16)) - 1));
#pragma GCC unroll 8
  for (int64_t r = 0; r < kRows; ++r) {
    float* o = out + (i0 + r) * ldo;
    if (accumulate) {
      acc[r][0] = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, o), acc[r][0]);
      acc[r][1] = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, o + 16), acc[r][1]);
    }
    _mm512_mask_storeu_ps(o, m0, acc[r][0]);
    _mm512_mask_storeu_ps(o + 16, m1, acc[r][1]);
  }
}

}  // namespace

namespace {

template <bool kNibbles, bool kBiased>
SNAPSERVE_TARGET_AVX512VNNI_FMA_F16C void panels(const PanelActivations& x, const Int8Panels& w,
                                                 int64_t p_begin, int64_t p_end, float* out,
                                                 int64_t ldo, bool accumulate) {
  const uint8_t* bytes = w.bytes.const_data_ptr<uint8_t>();
  const auto* scales = static_cast<const uint16_t*>(w.scales.const_data_ptr());
  for (int64_t p = p_begin; p < p_end; ++p) {
    const uint8_t* pb = bytes + p * w.blocks * w.block_bytes();
    const uint16_t* ps = scales + p * w.blocks * 2 * kPanelRows;
    const int64_t cols = std::min(kPanelRows, w.n - p * kPanelRows);
    float* po = out + p * kPanelRows;
    int64_t i = 0;
    for (; i + kTileRows <= x.m; i += kTileRows) {
      tile<kTileRows, 1, kNibbles, kBiased>(x, pb, ps, w.bias, w.blocks, i, po, ldo, cols,
                                            accumulate, i == 0);
    }
    if (x.m - i >= 2) {
      tile<2, 2, kNibbles, kBiased>(x, pb, ps, w.bias, w.blocks, i, po, ldo, cols, accumulate,
                                    i == 0);
      i += 2;
    }
    if (i < x.m) {
      tile<1, 4, kNibbles, kBiased>(x, pb, ps, w.bias, w.blocks, i, po, ldo, cols, accumulate,
                                    i == 0);
    }
  }
}

}  // namespace

bool int8_panels_avx512vnni(const PanelActivations& x, const Int8Panels& w, int64_t p_begin,
                            int64_t p_end, float* out, int64_t ldo, bool accumulate) {
  const bool biased = w.bias != 0.0f;
  if (w.nibbles) {
    biased ? panels<true, true>(x, w, p_begin, p_end, out, ldo, accumulate)
           : panels<true, false>(x, w, p_begin, p_end, out, ldo, accumulate);
  } else {
    biased ? panels<false, true>(x, w, p_begin, p_end, out, ldo, accumulate)
           : panels<false, false>(x, w, p_begin, p_end, out, ldo, accumulate);
  }
  return true;
}

}  // namespace snapserve::kernels::cpu

#else

namespace snapserve::kernels::cpu {
bool int8_panels_avx512vnni(const PanelActivations&, const Int8Panels&, int64_t, int64_t, float*,
                            int64_t, bool) {
  return false;
}
}  // namespace snapserve::kernels::cpu

#endif
