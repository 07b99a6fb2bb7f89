// AVX-512 VNNI kernel of the int8 prompt GEMM (kernels/prefill_gemm_int8.h).
//
// A tile is kRows activation rows by one 32-row panel (two 16-lane vectors).
// Per 32-block: eight quads, each two weight loads and 2 · kRows vpdpbusd
// against the rows' four activation bytes broadcast; then per (row, vector)
// one conversion, one multiply (scale · d_x) and two FMAs. The weights of a
// panel (k = 576: 18 KiB) stay in L1 while every activation row passes.
#include "kernels/prefill_gemm_int8.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cstring>

// GCC 12's AVX-512 intrinsics pass an undefined "passthrough" vector to the
// masked builtins, which -W(maybe-)uninitialized reports at every inlined use.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace snapserve::kernels::cpu {

namespace {

#define SNAPSERVE_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma")))

constexpr int64_t kBlockBytes = kPanelRows * kPanelBlock;
// Rows per tile: 8 int32 + 8 float accumulators, 2 weight vectors and the
// scales fit the 32 registers.
constexpr int64_t kTileRows = 4;

SNAPSERVE_VNNI inline __m512i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Rows i0 .. i0 + kRows - 1 against one panel; columns [0, cols) of the
// panel are stored.
template <int64_t kRows>
SNAPSERVE_VNNI void tile(const PanelActivations& x, const uint8_t* bytes, const float* scales,
                         int64_t blocks, int64_t i0, float* out, int64_t ldo, int64_t cols) {
  __m512 acc[kRows][2];
  #pragma GCC unroll 8
  for (int64_t r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = bytes + b * kBlockBytes;
    __m512i sum[kRows][2];
    #pragma GCC unroll 8
    for (int64_t r = 0; r < kRows; ++r) sum[r][0] = sum[r][1] = _mm512_setzero_si512();
    #pragma GCC unroll 8
    for (int64_t g = 0; g < 8; ++g) {
      const __m512i w0 = _mm512_loadu_si512(blk + g * 128);
      const __m512i w1 = _mm512_loadu_si512(blk + g * 128 + 64);
      #pragma GCC unroll 8
      for (int64_t r = 0; r < kRows; ++r) {
        const __m512i xr = broadcast4(x.q + (i0 + r) * x.k + b * kPanelBlock + g * 4);
        sum[r][0] = _mm512_dpbusd_epi32(sum[r][0], w0, xr);
        sum[r][1] = _mm512_dpbusd_epi32(sum[r][1], w1, xr);
      }
    }
    const float* sc = scales + b * 2 * kPanelRows;
    const __m512 scale0 = _mm512_loadu_ps(sc), scale1 = _mm512_loadu_ps(sc + 16);
    const __m512 off0 = _mm512_loadu_ps(sc + 32), off1 = _mm512_loadu_ps(sc + 48);
    #pragma GCC unroll 8
    for (int64_t r = 0; r < kRows; ++r) {
      const int64_t xb = (i0 + r) * blocks + b;
      const __m512 dx = _mm512_set1_ps(x.d[xb]), sx = _mm512_set1_ps(x.s[xb]);
      acc[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r][0]), _mm512_mul_ps(scale0, dx), acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r][1]), _mm512_mul_ps(scale1, dx), acc[r][1]);
      acc[r][0] = _mm512_fmadd_ps(off0, sx, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(off1, sx, acc[r][1]);
    }
  }
  const __mmask16 m0 = cols >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << cols) - 1);
  const __mmask16 m1 =
      cols >= 32 ? 0xFFFF : (cols <= 16 ? 0 : static_cast<__mmask16>((1u << (cols - 16)) - 1));
  #pragma GCC unroll 8
  for (int64_t r = 0; r < kRows; ++r) {
    float* o = out + (i0 + r) * ldo;
    _mm512_mask_storeu_ps(o, m0, acc[r][0]);
    _mm512_mask_storeu_ps(o + 16, m1, acc[r][1]);
  }
}

}  // namespace

bool int8_panels_avx512vnni(const PanelActivations& x, const Int8Panels& w, int64_t p_begin,
                            int64_t p_end, float* out, int64_t ldo) {
  const uint8_t* bytes = w.bytes.const_data_ptr<uint8_t>();
  const float* scales = w.scales.const_data_ptr<float>();
  for (int64_t p = p_begin; p < p_end; ++p) {
    const uint8_t* pb = bytes + p * w.blocks * kBlockBytes;
    const float* ps = scales + p * w.blocks * 2 * kPanelRows;
    const int64_t cols = std::min(kPanelRows, w.n - p * kPanelRows);
    float* po = out + p * kPanelRows;
    int64_t i = 0;
    for (; i + kTileRows <= x.m; i += kTileRows) {
      tile<kTileRows>(x, pb, ps, w.blocks, i, po, ldo, cols);
    }
    for (; i < x.m; ++i) tile<1>(x, pb, ps, w.blocks, i, po, ldo, cols);
  }
  return true;
}

}  // namespace snapserve::kernels::cpu

#else

namespace snapserve::kernels::cpu {
bool int8_panels_avx512vnni(const PanelActivations&, const Int8Panels&, int64_t, int64_t, float*,
                            int64_t) {
  return false;
}
}  // namespace snapserve::kernels::cpu

#endif
