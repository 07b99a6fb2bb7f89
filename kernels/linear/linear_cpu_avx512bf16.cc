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
#define SNAPSERVE_TILE_TARGET SNAPSERVE_TARGET_AVX512BF16_AVX2_FMA
#include "kernels/linear/linear_cpu_tile_avx512_driver.h"

namespace snapserve::kernels::cpu {

namespace {

// Thirty-two bfloat16 elements per step (one 64-byte line), one vdpbf16ps;
// the K % 32 elements are one more step with the missing elements zero,
// before the lane sum: a zero element adds an exact zero product.
struct BFloat16Step {
  using Elem = uint16_t;
  using Operand = __m512bh;
  static constexpr int64_t kStep = 32;
  [[gnu::always_inline]] SNAPSERVE_TILE_TARGET static __m512bh load(const uint16_t* p) {
    return __builtin_bit_cast(__m512bh, _mm512_loadu_si512(p));
  }
  // The first `count` (< 32) elements at p, the rest zero.
  [[gnu::always_inline]] SNAPSERVE_TILE_TARGET static __m512bh load_short(const uint16_t* p,
                                                                          int64_t count) {
    const __mmask32 mask = (__mmask32{1} << count) - 1;
    return __builtin_bit_cast(__m512bh, _mm512_maskz_loadu_epi16(mask, p));
  }
  [[gnu::always_inline]] SNAPSERVE_TILE_TARGET static __m512 madd(__m512 acc, __m512bh x,
                                                                  __m512bh w) {
    return _mm512_dpbf16_ps(acc, x, w);
  }
  template <int NW>
  [[gnu::always_inline]] SNAPSERVE_TILE_TARGET static void add_short_step(__m512* acc,
                                                                          const uint16_t* x,
                                                                          const uint16_t* const* wr,
                                                                          int64_t from, int64_t k) {
    const __m512bh xv = load_short(x + from, k - from);
#pragma GCC unroll 4
    for (int c = 0; c < NW; ++c) acc[c] = madd(acc[c], xv, load_short(wr[c] + from, k - from));
  }
  static float finish(float total, const uint16_t*, const uint16_t*, int64_t, int64_t) {
    return total;
  }
};

}  // namespace

void tile_avx512bf16(const Bf16Problem& p, const uint16_t* const* wr, int64_t rows, int64_t n0,
                     const uint16_t* const* next) {
  tile::run<BFloat16Step>(p, wr, rows, n0, next);
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
