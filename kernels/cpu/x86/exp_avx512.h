// Vector float32 exps for the AVX-512 kernels: for the prompt attention
// kernels' online softmax, a full-precision one and a cheaper one for
// weights that are rounded to bfloat16 next; for the row kernels, exp_avx2's
// bits 16 lanes wide, and the SwiGLU gate built on it. Internal to kernels/.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/x86/isa_target.h"

namespace snapserve::kernels::simd {

// exp(x) for x <= 88 (scores minus their running max, which may lie up to
// the softmax's headroom above it): 2^n · p(r), the degree-6 polynomial of
// kernels/cpu/x86/exp_avx2.h with fused multiply-adds; exp(88) ~ 1.7e38 is still
// finite. x below -87 is clamped there: exp(-87) ~ 1.6e-38 against a row sum
// >= 1 is nothing a softmax weight can hold.
SNAPSERVE_TARGET_AVX512F_FMA inline __m512 exp_at_most_88_avx512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// 2^t for the bfloat16 prompt attention's softmax weights, which are rounded
// to bfloat16 (relative error up to 2^-9) right after: 2^floor(t) · 2^f with
// f = t - floor(t) in [0, 1] (vreduceps, one instruction, exact), 2^f by a
// degree-4 polynomial, and the power of 2 by vscalefps, which floors t
// itself. The coefficients were fitted for the smallest largest relative
// error on [0, 1] (least squares on 4,000 Chebyshev nodes, reweighted towards
// the minimax): 2.7e-6 evaluated in float32, ~700 times below the bfloat16
// rounding, in 6 instructions where exp_at_most_88_avx512 takes 14. On AMX
// CPUs the tile products and the softmax's vector work do not overlap
// (docs/quantized-weights.md, "Prompt attention"), so each instruction
// counts: hence vreduceps (one instruction) rather than t rounded to nearest
// and subtracted (three). The caller folds the scores' shift and log2(e)
// into t with one FMA. Any finite t <= 127: far below 0, scalef gives 0 or
// a denormal.
// Needs AVX512DQ (vreduceps), which every CPU with AVX512_BF16 has.
SNAPSERVE_TARGET_AVX512DQ_FMA inline __m512 exp2_for_bf16_weights_avx512(__m512 t) {
  // imm 0x09: keep 0 fraction bits, round down, no precision exception.
  const __m512 f = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p = _mm512_set1_ps(0.013534885831177235f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.05201008543372154f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24144355952739716f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6930037140846252f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0000026226043701f));
  return _mm512_scalef_ps(p, t);
}

// simd::exp_avx2 (kernels/cpu/x86/exp_avx2.h) 16 lanes wide: the same operations in
// the same order, each rounded as there (no fused multiply-add:
// -ffp-contract=off, kernels/CMakeLists.txt), so each lane has exp_avx2's
// bits, libm's outside [-87, 88]. For the row kernels whose AVX2 and AVX-512
// paths must agree bit for bit (the SwiGLU gate, kernels/rowwise/rowwise.h).
SNAPSERVE_TARGET_AVX512F inline __m512 exp_avx512(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f)));
  r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  const __m512 result = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
  const __mmask16 in_range = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ) &
                             _mm512_cmp_ps_mask(x, _mm512_set1_ps(88.0f), _CMP_LE_OQ);
  if (in_range == 0xFFFF) return result;
  alignas(64) float xs[16], es[16];
  _mm512_store_ps(xs, x);
  _mm512_store_ps(es, result);
  for (int l = 0; l < 16; ++l) {
    if (!(xs[l] >= -87.0f && xs[l] <= 88.0f)) es[l] = std::exp(xs[l]);
  }
  return _mm512_load_ps(es);
}

// The SwiGLU gate, silu(g) * u = g / (1 + exp(-g)) * u, with exp_avx512 and
// the AVX2 row's operations in its order: the bits of silu_mul_row_avx2
// (kernels/rowwise/rowwise.h) lane for lane, where callers compile with
// -ffp-contract=off. For the AVX-512 row and the AMX MLP's epilogue
// (kernels/prefill_gemm/prefill_gemm_amx.h).
SNAPSERVE_TARGET_AVX512F inline __m512 silu_mul_avx512(__m512 g, __m512 u) {
  const __m512 minus_g = _mm512_castsi512_ps(  // the sign bit flipped: exact
      _mm512_xor_si512(_mm512_castps_si512(g), _mm512_set1_epi32(static_cast<int>(0x80000000u))));
  const __m512 e = exp_avx512(minus_g);
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

// silu(g) * u for an output rounded to bfloat16 right after (the AMX MLP's
// epilogue, kernels/prefill_gemm/prefill_gemm_amx.h): exp(-g) by
// exp2_for_bf16_weights_avx512, 1 / (1 + exp(-g)) by vrcp14ps (relative
// error <= 2^-14): ~7e-5 relative in all, ~30 times below bfloat16's 2^-9,
// in 11 instructions where silu_mul_avx512 takes ~30 and a division. For g
// far below 0, exp(-g) overflows to infinity and the result is 0, as silu's.
SNAPSERVE_TARGET_AVX512DQ_FMA inline __m512 silu_mul_for_bf16_avx512(__m512 g, __m512 u) {
  constexpr float kMinusLog2e = -1.44269504088896341f;
  const __m512 e = exp2_for_bf16_weights_avx512(_mm512_mul_ps(g, _mm512_set1_ps(kMinusLog2e)));
  return _mm512_mul_ps(_mm512_mul_ps(g, u),
                       _mm512_rcp14_ps(_mm512_add_ps(_mm512_set1_ps(1.0f), e)));
}

}  // namespace snapserve::kernels::simd

#endif
