// AVX-512 activation quantization of kernels/quant_dot/quant_dot.h: the steps of
// quantize_blocks_portable (quant_dot_cpu_nocontract.cc) on 16 lanes, with the same bits.
//
// Each 32-block needs two horizontal reductions: the largest |x| (for its
// scale) and the sum of its int8 values. Reducing one block's register at a
// time takes a chain of ~8 shuffles per reduction, and that was most of this
// function's time (docs/quantized-weights.md, "Int8 dot products"). So 16
// blocks go together: their 16 registers are folded by one tree into a
// single register whose lane j holds block j's result, ~3 shuffles and ops
// per block. Max and integer sums are exact in any order,
// and the scale and its reciprocal are IEEE divisions as in the scalar code,
// so the bits do not change.
#include "kernels/quant_dot/quant_dot.h"
#include "kernels/quant_dot/quant_dot_cpu_block.h"

#if defined(__x86_64__)
#include "kernels/cpu/x86/avx512_intrinsics.h"
#include "kernels/cpu/x86/isa_target.h"

namespace snapserve::kernels::cpu {

namespace {

constexpr int kTogether = 16;  // blocks per tree: one per lane of the result

// Lane pickers for the tree. At level L each input register holds 1 << L
// blocks' partials, w * 2 = 16 >> L lanes per block (w = 8 >> L); the two
// inputs side by side are the 32 lanes permutex2var indexes. Lane i of the
// result belongs to block i / w of the pair and is op(low lane, high lane)
// of that block's partials: the result holds twice the blocks, half the
// partials each. After level 3, lane j holds block j's whole reduction.
struct TreeIndex {
  alignas(64) int lanes[4][2][16];
};
constexpr TreeIndex make_tree_index() {
  TreeIndex t{};
  for (int level = 0; level < 4; ++level) {
    const int width = 8 >> level;
    for (int lane = 0; lane < 16; ++lane) {
      const int group = lane / width, offset = lane % width;
      t.lanes[level][0][lane] = group * 2 * width + offset;
      t.lanes[level][1][lane] = group * 2 * width + offset + width;
    }
  }
  return t;
}
alignas(64) constexpr TreeIndex kTreeIndex = make_tree_index();

// One fold: inputs a and b (32 lanes as permutex2var sees them) into one.
template <typename Op>
SNAPSERVE_TARGET_AVX512F inline __m512 fold_ps(__m512 a, __m512 b, __m512i lo, __m512i hi, Op op) {
  return op(_mm512_permutex2var_ps(a, lo, b), _mm512_permutex2var_ps(a, hi, b));
}

// One level of the tree over v[0 .. 2n), written back to v[0 .. n).
template <int kLevel, typename Op>
SNAPSERVE_TARGET_AVX512F inline void fold_level(__m512* v, Op op) {
  const __m512i lo = _mm512_load_si512(kTreeIndex.lanes[kLevel][0]);
  const __m512i hi = _mm512_load_si512(kTreeIndex.lanes[kLevel][1]);
#pragma GCC unroll 8
  for (int64_t i = 0; i < (kTogether >> kLevel) / 2; ++i) {
    v[i] = fold_ps(v[2 * i], v[2 * i + 1], lo, hi, op);
  }
}

// v[0..15] -> lane j = op over all 16 lanes of v[j]. Uses v as scratch; the
// levels and loops are unrolled so that v stays in registers.
template <typename Op>
SNAPSERVE_TARGET_AVX512F inline __m512 reduce_16(__m512* v, Op op) {
  fold_level<0>(v, op);
  fold_level<1>(v, op);
  fold_level<2>(v, op);
  fold_level<3>(v, op);
  return v[0];
}

struct MaxOp {
  SNAPSERVE_TARGET_AVX512F __m512 operator()(__m512 a, __m512 b) const {
    return _mm512_max_ps(a, b);
  }
};
// Integer sums carried in float registers' bits: the permutes only move lanes.
struct AddEpi32Op {
  SNAPSERVE_TARGET_AVX512F __m512 operator()(__m512 a, __m512 b) const {
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
  }
};

// One block's int8 values from x * inv, as quantize_blocks_portable rounds
// and clamps them (the clamp comes first here; for values inside ±127 that is
// the same, and outside both give ±127). Returns their sum's 16 partials.
SNAPSERVE_TARGET_AVX512F inline __m512i quantize_block(const float* xb, __m512 inv, int8_t* q) {
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m512i q0 = _mm512_cvt_roundps_epi32(
      _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_loadu_ps(xb), inv), lo), hi), kNearest);
  const __m512i q1 = _mm512_cvt_roundps_epi32(
      _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_loadu_ps(xb + 16), inv), lo), hi), kNearest);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(q0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(q1));
  return _mm512_add_epi32(q0, q1);
}

SNAPSERVE_TARGET_AVX512F inline __m512 abs_max_partials(const float* xb) {
  return _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xb)), _mm512_abs_ps(_mm512_loadu_ps(xb + 16)));
}

// scale = amax / 127 and inv = 1 / scale (0 where scale is 0), 16 blocks.
SNAPSERVE_TARGET_AVX512F inline void scales(__m512 amax, __m512* scale, __m512* inv) {
  *scale = _mm512_div_ps(amax, _mm512_set1_ps(127.0f));
  const __mmask16 positive = _mm512_cmp_ps_mask(*scale, _mm512_setzero_ps(), _CMP_GT_OQ);
  *inv = _mm512_maskz_div_ps(positive, _mm512_set1_ps(1.0f), *scale);
}

// 16 consecutive blocks.
SNAPSERVE_TARGET_AVX512F void quantize_16_blocks(const float* x, int8_t* q, float* d, float* s) {
  __m512 v[kTogether];
#pragma GCC unroll 16
  for (int64_t j = 0; j < kTogether; ++j) v[j] = abs_max_partials(x + j * kDotBlock);
  __m512 scale, inv;
  scales(reduce_16(v, MaxOp{}), &scale, &inv);
  alignas(64) float invs[kTogether];
  _mm512_store_ps(invs, inv);
#pragma GCC unroll 16
  for (int64_t j = 0; j < kTogether; ++j) {
    v[j] = _mm512_castsi512_ps(
        quantize_block(x + j * kDotBlock, _mm512_set1_ps(invs[j]), q + j * kDotBlock));
  }
  const __m512 sums = _mm512_cvtepi32_ps(_mm512_castps_si512(reduce_16(v, AddEpi32Op{})));
  _mm512_storeu_ps(d, scale);
  _mm512_storeu_ps(s, _mm512_mul_ps(scale, sums));
}

// The last blocks, fewer than 16: one at a time.
SNAPSERVE_TARGET_AVX512F void quantize_one_block(const float* x, int8_t* q, float* d, float* s) {
  __m512 scale, inv;
  scales(_mm512_set1_ps(_mm512_reduce_max_ps(abs_max_partials(x))), &scale, &inv);
  const __m512i sum = quantize_block(x, inv, q);
  *d = _mm512_cvtss_f32(scale);
  *s = *d * static_cast<float>(_mm512_reduce_add_epi32(sum));
}

}  // namespace

SNAPSERVE_TARGET_AVX512F bool quantize_blocks_avx512(const float* x, int64_t blocks, int8_t* q,
                                                     float* d, float* s) {
  int64_t i = 0;
  for (; i + kTogether <= blocks; i += kTogether) {
    quantize_16_blocks(x + i * kDotBlock, q + i * kDotBlock, d + i, s + i);
  }
  for (; i < blocks; ++i) quantize_one_block(x + i * kDotBlock, q + i * kDotBlock, d + i, s + i);
  return true;
}

}  // namespace snapserve::kernels::cpu

#else

namespace snapserve::kernels::cpu {
bool quantize_blocks_avx512(const float*, int64_t, int8_t*, float*, float*) { return false; }
}  // namespace snapserve::kernels::cpu

#endif
