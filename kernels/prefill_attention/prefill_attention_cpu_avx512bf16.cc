// The AVX512_BF16 tile loop of kernels/prefill_attention/prefill_attention.h.
//
// A work item is kRows consecutive query rows of one head. Their outputs
// (kRows x D floats) stay in registers over the whole key loop; keys come in
// tiles of 32:
//   1. scores: for each pair t of head dimensions, q's pair broadcast to 16
//      lanes times the tile's keys' pairs (two registers of 16 keys), one
//      vdpbf16ps each;
//   2. online softmax per row (prefill_attention_cpu_common.h): where a
//      score passes the row's shift by more than the headroom, the shift
//      moves to the tile's max and the outputs and sums are rescaled; the
//      tile's weights are exp(score - shift) (0 where causality hides a key);
//   3. weights · V: the 32 weights, rounded to bf16 pairs by one
//      vcvtne2ps2bf16, are broadcast a pair at a time against V's rows laid
//      out as key pairs, one vdpbf16ps per 16 output dimensions.
#include "kernels/prefill_attention/prefill_attention.h"

#if defined(__x86_64__)
#include "kernels/cpu/x86/avx512_intrinsics.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <limits>

#include "kernels/cpu/x86/isa_target.h"
#include "kernels/prefill_attention/prefill_attention_cpu_common.h"

namespace snapserve::kernels::cpu {

namespace {

// 32 bfloat16 values (16 pairs) from memory, and one pair in every lane.
SNAPSERVE_TARGET_AVX512BF16_DQ_AVX2_FMA_F16C inline __m512bh load_pairs(const uint16_t* p) {
  return __builtin_bit_cast(__m512bh, _mm512_loadu_si512(p));
}
SNAPSERVE_TARGET_AVX512BF16_DQ_AVX2_FMA_F16C inline __m512bh broadcast_pair(uint32_t pair) {
  return __builtin_bit_cast(__m512bh, _mm512_set1_epi32(static_cast<int>(pair)));
}

template <int kDim, int kRows>
SNAPSERVE_TARGET_AVX512BF16_DQ_AVX2_FMA_F16C void attend_rows(const PackedAttention& pa,
                                                              int64_t head, int64_t row0,
                                                              float* out) {
  constexpr int kPairs = kDim / 2, kVecs = kDim / 16;
  const auto [first_pos, valid, tiles] = item_rows(pa, row0, kRows);
  const auto [q, kt, vp] = bf16_operands<kDim>(pa, head, row0);

  __m512 acc[kRows][kVecs];
  RowSoftmax rows[kRows];
#pragma GCC unroll 8
  for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < kVecs; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  alignas(64) uint32_t weights[kRows][kTileKeys / 2];

  for (int64_t tile = 0; tile < tiles; ++tile) {
    // Each score is two partial sums, head-dimension pairs [0, kPairs / 2)
    // and [kPairs / 2, kPairs), added at the end: 4 x kRows independent
    // vdpbf16ps chains. With 2 x kRows (one sum per score), a Zen 5 core,
    // which issues two 512-bit vdpbf16ps per cycle, waited on each chain's
    // latency (docs/quantized-weights.md, "Prompt attention").
    __m512 s[kRows][2], upper[kRows][2];
#pragma GCC unroll 8
    for (int i = 0; i < kRows; ++i) {
      s[i][0] = s[i][1] = upper[i][0] = upper[i][1] = _mm512_setzero_ps();
    }
    const uint16_t* kp = kt + tile * kPairs * kTileKeys * 2;
    constexpr int kHalf = kPairs / 2;
    for (int t = 0; t < kHalf; ++t) {
      const uint16_t* kpt = kp + static_cast<ptrdiff_t>(t) * kTileKeys * 2;
      const uint16_t* kpu = kpt + static_cast<ptrdiff_t>(kHalf) * kTileKeys * 2;
      const __m512bh k0 = load_pairs(kpt), k1 = load_pairs(kpt + 32);
      const __m512bh u0 = load_pairs(kpu), u1 = load_pairs(kpu + 32);
#pragma GCC unroll 8
      for (int i = 0; i < kRows; ++i) {
        const __m512bh b = broadcast_pair(q[i * kPairs + t]);
        const __m512bh bu = broadcast_pair(q[i * kPairs + t + kHalf]);
        s[i][0] = _mm512_dpbf16_ps(s[i][0], b, k0);
        s[i][1] = _mm512_dpbf16_ps(s[i][1], b, k1);
        upper[i][0] = _mm512_dpbf16_ps(upper[i][0], bu, u0);
        upper[i][1] = _mm512_dpbf16_ps(upper[i][1], bu, u1);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < kRows; ++i) {
      s[i][0] = _mm512_add_ps(s[i][0], upper[i][0]);
      s[i][1] = _mm512_add_ps(s[i][1], upper[i][1]);
    }
    const int64_t key0 = tile * kTileKeys;
#pragma GCC unroll 8
    for (int i = 0; i < kRows; ++i) {
      __m512 p0, p1;
      softmax_tile_row<kVecs, true>(s[i][0], s[i][1], first_pos + row0 + i - key0 + 1, rows[i],
                                    acc[i], p0, p1);
      // Lane l of the result: keys 2l and 2l + 1 of the tile as a bf16 pair.
      _mm512_store_si512(weights[i], __builtin_bit_cast(__m512i, _mm512_cvtne2ps_pbh(p1, p0)));
    }
    const uint16_t* vt = vp + tile * (kTileKeys / 2) * kDim * 2;
#pragma GCC unroll 16
    for (int pair = 0; pair < kTileKeys / 2; ++pair) {
      __m512bh v[kVecs];
#pragma GCC unroll 8
      for (int j = 0; j < kVecs; ++j) {
        v[j] = load_pairs(vt + static_cast<ptrdiff_t>(pair * kDim + j * 16) * 2);
      }
#pragma GCC unroll 8
      for (int i = 0; i < kRows; ++i) {
        const __m512bh w = broadcast_pair(weights[i][pair]);
#pragma GCC unroll 8
        for (int j = 0; j < kVecs; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], w, v[j]);
      }
    }
  }
  // A constant trip count with a test inside, not i < valid: indexing acc by
  // a run-time row would force it out of registers for the whole loop.
#pragma GCC unroll 8
  for (int i = 0; i < kRows; ++i) {
    if (i >= valid) break;
    const __m512 inv = _mm512_set1_ps(1.0f / rows[i].sum());
    float* dst = output_row(pa, out, head, row0 + i);
#pragma GCC unroll 8
    for (int j = 0; j < kVecs; ++j) {
      _mm512_storeu_ps(dst + static_cast<ptrdiff_t>(j) * 16, _mm512_mul_ps(acc[i][j], inv));
    }
  }
}

template <int kDim>
void attend_items(const PackedAttention& pa, int64_t begin, int64_t end, float* out) {
  constexpr int kRows = 256 / kDim;  // kRows x kDim / 16 = 16 accumulators
  for (int64_t item = begin; item < end; ++item) {
    for_item(item, pa.rows_padded, kRows,
             [&](int64_t head, int64_t row0) { attend_rows<kDim, kRows>(pa, head, row0, out); });
  }
}

}  // namespace

SNAPSERVE_TARGET_AVX512BF16_DQ_AVX2_FMA_F16C void round_to_bf16_avx512bf16(const float* src,
                                                                           float scale,
                                                                           uint16_t* dst,
                                                                           int64_t n) {
  const __m512 s = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < n; i += 16) {
    const __m256bh b = _mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(src + i), s));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), __builtin_bit_cast(__m256i, b));
  }
}

namespace {

// The lane indices of one transpose16 round (vpermt2d: 0-15 from row i,
// 16-31 from row i + b): row i keeps its lanes without bit b and takes row
// i + b's lanes below them; row i + b takes row i's lanes with bit b.
template <int kB>
constexpr std::array<int32_t, 16> swap_lanes(bool upper) {
  std::array<int32_t, 16> idx{};
  for (int l = 0; l < 16; ++l) {
    if (upper) {
      idx[l] = (l & kB) == 0 ? l + kB : 16 + l;
    } else {
      idx[l] = (l & kB) == 0 ? l : 16 + l - kB;
    }
  }
  return idx;
}

template <int kB>
SNAPSERVE_TARGET_AVX512BF16_DQ_AVX2_FMA_F16C void swap_blocks(__m512i (&r)[16]) {
  static constexpr std::array<int32_t, 16> kLower = swap_lanes<kB>(false);
  static constexpr std::array<int32_t, 16> kUpper = swap_lanes<kB>(true);
  const __m512i lower = _mm512_loadu_si512(kLower.data());
  const __m512i upper = _mm512_loadu_si512(kUpper.data());
  for (int i = 0; i < 16; ++i) {
    if ((i & kB) != 0) continue;
    const __m512i a = r[i], c = r[i + kB];
    r[i] = _mm512_permutex2var_epi32(a, lower, c);
    r[i + kB] = _mm512_permutex2var_epi32(a, upper, c);
  }
}

// r[i] = column i of the 16 x 16 matrix of 32-bit lanes r held: the
// off-diagonal blocks of 8 swapped, then those of 4, 2 and 1 within every
// block, after which every element (i, j) is at (j, i). 64 vpermt2d.
SNAPSERVE_TARGET_AVX512BF16_DQ_AVX2_FMA_F16C void transpose16(__m512i (&r)[16]) {
  swap_blocks<8>(r);
  swap_blocks<4>(r);
  swap_blocks<2>(r);
  swap_blocks<1>(r);
}

// 32 values of a row from `at` on, rounded to bf16: 16 pairs, one per lane.
SNAPSERVE_TARGET_AVX512BF16_DQ_AVX2_FMA_F16C __m512i pairs_of(const float* at) {
  return __builtin_bit_cast(__m512i,
                            _mm512_cvtne2ps_pbh(_mm512_loadu_ps(at + 16), _mm512_loadu_ps(at)));
}

}  // namespace

SNAPSERVE_TARGET_AVX512BF16_DQ_AVX2_FMA_F16C void pack_kv_tile_avx512bf16(
    const float* k, int64_t k_stride, const float* v, int64_t v_stride, int64_t n, int64_t dim,
    uint16_t* k_dst, uint16_t* v_dst) {
  // k: the tile's [32 keys][dim / 2 pairs] transposed 16 x 16 at a time.
  for (int64_t half = 0; half < 2; ++half) {  // keys 16 * half ..
    for (int64_t p0 = 0; p0 < dim / 2; p0 += 16) {
      __m512i block[16];
      for (int64_t i = 0; i < 16; ++i) {
        const int64_t key = 16 * half + i;  // 0 past the last key
        block[i] = key < n ? pairs_of(k + key * k_stride + 2 * p0) : _mm512_setzero_si512();
      }
      transpose16(block);
      for (int64_t l = 0; l < 16; ++l) {
        _mm512_storeu_si512(k_dst + ((p0 + l) * kTileKeys + 16 * half) * 2, block[l]);
      }
    }
  }
  // v: keys 2j and 2j + 1 side by side, dimension by dimension.
  const __m512i interleave =
      _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  // 0 past the last key.
  auto v_lanes = [&](int64_t key, int64_t d) SNAPSERVE_TARGET_AVX512BF16_DQ_AVX2_FMA_F16C {
    return key < n ? _mm512_loadu_ps(v + key * v_stride + d) : _mm512_setzero_ps();
  };
  for (int64_t j = 0; j < kTileKeys / 2; ++j) {
    for (int64_t d = 0; d < dim; d += 16) {
      const __m512 va = v_lanes(2 * j, d), vb = v_lanes(2 * j + 1, d);
      const __m512i pairs = __builtin_bit_cast(__m512i, _mm512_cvtne2ps_pbh(vb, va));
      _mm512_storeu_si512(v_dst + (j * dim + d) * 2, _mm512_permutexvar_epi16(interleave, pairs));
    }
  }
}

void prefill_attention_avx512bf16(const PackedAttention& p, int64_t item_begin, int64_t item_end,
                                  float* out) {
  with_head_dim(
      p.dim, [&](auto dim) { attend_items<decltype(dim)::value>(p, item_begin, item_end, out); });
}

}  // namespace snapserve::kernels::cpu

#else

namespace snapserve::kernels::cpu {
// Never called off x86-64: has_prefill_attention_bf16 is false there.
void round_to_bf16_avx512bf16(const float*, float, uint16_t*, int64_t) {}
void pack_kv_tile_avx512bf16(const float*, int64_t, const float*, int64_t, int64_t, int64_t,
                             uint16_t*, uint16_t*) {}
}  // namespace snapserve::kernels::cpu

#endif
