// AVX512_BF16 tile kernel of the fixed-order CPU linear under
// DecodeDot::kBFloat16 (kernels/linear/linear.h): bfloat16 weight rows read in
// place, activation rows already rounded to bfloat16, one vdpbf16ps per 32
// elements of a weight row and an x row.
//
// Per output element: 16 float32 lanes; lane l accumulates, in increasing j,
// the products of pair l of every 32-element step (elements 2l and 2l + 1,
// vdpbf16ps's own pairing: both products are exact in float32, and the
// instruction adds them to the lane); the K % 32 tail is one more step with
// the missing elements zero; then the lanes are summed in the fixed tree of
// kernels/cpu/x86/simd_sums.h. The sequence does not depend on the tile shape or on
// the batch row, so a row's result does not depend on the batch.
//
// Compared with the float32-activation tile (linear_cpu_avx512.cc) a step
// multiplies twice as many weights per instruction and reads the weights
// where they are, without widening them into a scratch row first.
#include "kernels/linear/linear_cpu_tiles.h"

#if defined(__x86_64__)
#include "kernels/cpu/x86/avx512_intrinsics.h"
#include "kernels/cpu/x86/isa_target.h"

// After avx512_intrinsics.h, whose pragmas cover its shuffles.
#include "kernels/cpu/x86/simd_sums.h"

namespace snapserve::kernels::cpu {

namespace {

constexpr int64_t kStep = 32;  // bfloat16 elements per vdpbf16ps (one 64-byte line)
// As the float32 tile: prefetch later weight rows into L2 (linear_cpu_avx512.cc).
constexpr int kPrefetchLocality = 2;

SNAPSERVE_TARGET_AVX512BF16_AVX2_FMA inline __m512bh load_pairs(const uint16_t* p) {
  return __builtin_bit_cast(__m512bh, _mm512_loadu_si512(p));
}

// The first `count` (< 32) elements at p, the rest zero: a zero element adds
// an exact zero product to its lane.
SNAPSERVE_TARGET_AVX512BF16_AVX2_FMA inline __m512bh load_tail(const uint16_t* p, int64_t count) {
  const __mmask32 mask = (__mmask32{1} << count) - 1;
  return __builtin_bit_cast(__m512bh, _mm512_maskz_loadu_epi16(mask, p));
}

// x rows i0 .. i0 + MX - 1 against weight rows wr[0 .. NW); `next_rows` rows
// of `next` prefetched one line per step.
template <int MX, int NW>
SNAPSERVE_TARGET_AVX512BF16_AVX2_FMA void block(const Bf16Problem& p, const uint16_t* const* wr,
                                                int64_t i0, int64_t n0, const uint16_t* const* next,
                                                int next_rows) {
  const int64_t k = p.k, k32 = k - k % kStep;
  const uint16_t* x = p.x + i0 * k;
  __m512 acc[MX][NW];
#pragma GCC unroll 4
  for (int r = 0; r < MX; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < NW; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < k32; j += kStep) {
    for (int c = 0; c < next_rows; ++c) __builtin_prefetch(next[c] + j, 0, kPrefetchLocality);
    __m512bh wv[NW];
#pragma GCC unroll 4
    for (int c = 0; c < NW; ++c) wv[c] = load_pairs(wr[c] + j);
#pragma GCC unroll 4
    for (int r = 0; r < MX; ++r) {
      const __m512bh xv = load_pairs(x + r * k + j);
#pragma GCC unroll 4
      for (int c = 0; c < NW; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
    }
  }
  if (k32 < k) {
#pragma GCC unroll 4
    for (int r = 0; r < MX; ++r) {
      const __m512bh xv = load_tail(x + r * k + k32, k - k32);
#pragma GCC unroll 4
      for (int c = 0; c < NW; ++c) {
        acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, load_tail(wr[c] + k32, k - k32));
      }
    }
  }
  if constexpr (MX == 4 && NW == 4) {
    __m512 v[16];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) v[4 * r + c] = acc[r][c];
    }
    const __m512 sums = simd::sums_of_16(v);
    float lanes[16];
    _mm512_storeu_ps(lanes, sums);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) p.out[(i0 + r) * p.n_total + n0 + c] = lanes[4 * r + c];
    }
  } else {
#pragma GCC unroll 4
    for (int r = 0; r < MX; ++r) {
#pragma GCC unroll 4
      for (int c = 0; c < NW; ++c) {
        p.out[(i0 + r) * p.n_total + n0 + c] = simd::lane_sum_avx512(acc[r][c]);
      }
    }
  }
}

}  // namespace

void tile_avx512bf16(const Bf16Problem& p, const uint16_t* const* wr, int64_t rows, int64_t n0,
                     const uint16_t* const* next) {
  for_each_block(p.m, rows, next,
                 [&](auto mx, auto nw, int64_t i0, const uint16_t* const* first, int count) {
                   block<decltype(mx)::value, decltype(nw)::value>(p, wr, i0, n0, first, count);
                 });
}

SNAPSERVE_TARGET_AVX512BF16_AVX2_FMA void round_rows_to_bf16_avx512bf16(const float* x,
                                                                        int64_t count,
                                                                        uint16_t* dst) {
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m256bh b = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), __builtin_bit_cast(__m256i, b));
  }
  if (i < count) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (count - i)) - 1);
    const __m256bh b = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, x + i));
    _mm256_mask_storeu_epi16(dst + i, mask, __builtin_bit_cast(__m256i, b));
  }
}

}  // namespace snapserve::kernels::cpu

#else  // not x86-64: has_avx512_bf16() is false, these are never called

namespace snapserve::kernels::cpu {
void tile_avx512bf16(const Bf16Problem&, const uint16_t* const*, int64_t, int64_t,
                     const uint16_t* const*) {}
void round_rows_to_bf16_avx512bf16(const float*, int64_t, uint16_t*) {}
}  // namespace snapserve::kernels::cpu

#endif
