// What the prompt attention kernels (prefill_attention_cpu_avx512bf16.cc,
// prefill_attention_cpu_avx512.cc, prefill_attention_cpu_amx.cc) share: the
// work items' order and the online-softmax step of one query row against one
// tile of keys. Internal to kernels/.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/prefill_attention/prefill_attention.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <cmath>
#include <limits>

#include "kernels/cpu/x86/exp_avx512.h"
#include "kernels/cpu/x86/isa_target.h"
#endif

namespace snapserve::kernels::cpu {

// Keys per tile: two 16-lane vectors of scores per query row.
inline constexpr int kTileKeys = 32;

// Work item `item` of prefill_attention.h's order (head-major; within a head
// the row groups 0, G-1, 1, G-2, ...): calls fn(head, first row).
template <typename Fn>
inline void for_item(int64_t item, int64_t rows_padded, int64_t group_rows, const Fn& fn) {
  const int64_t groups = rows_padded / group_rows;
  const int64_t i = item % groups;
  const int64_t group = i % 2 == 0 ? i / 2 : groups - 1 - i / 2;
  fn(item / groups, group * group_rows);
}

// Calls fn(std::integral_constant<int, D>{}) for the head size D of `dim`:
// the kernels are instantiated for 64 and 128 only (the callers' has_*
// checks refuse other sizes).
template <typename Fn>
inline void with_head_dim(int64_t dim, const Fn& fn) {
  if (dim == 64) {
    fn(std::integral_constant<int, 64>{});
  } else {
    fn(std::integral_constant<int, 128>{});
  }
}

// Where a work item's rows sit: the chunk's query row 0 is at position
// first_pos; the item's first `valid` rows are real (the last item of a head
// may be short); its last real row sees the keys of the first `tiles` tiles.
struct ItemRows {
  int64_t first_pos = 0, valid = 0, tiles = 0;
};
inline ItemRows item_rows(const AttentionShape& s, int64_t row0, int64_t group_rows) {
  ItemRows r;
  r.first_pos = s.keys - s.rows;
  r.valid = std::min(group_rows, s.rows - row0);
  r.tiles = (r.first_pos + row0 + r.valid - 1) / kTileKeys + 1;
  return r;
}

// The bfloat16 operands of the item at (head, row0) of dimension kDim: its
// q rows, and the k tiles and v pairs of the KV head that head reads.
struct Bf16Operands {
  const uint32_t* q;
  const uint16_t* k_tiles;
  const uint16_t* v_pairs;
};
template <int64_t kDim>
inline Bf16Operands bf16_operands(const PackedAttention& pa, int64_t head, int64_t row0) {
  const int64_t kv = head / (pa.heads / pa.kv_heads);
  return {pa.q_pairs + (head * pa.rows_padded + row0) * (kDim / 2),
          pa.k_tiles + kv * pa.tiles * (kDim / 2) * kTileKeys * 2,
          pa.v_pairs + kv * pa.tiles * (kTileKeys / 2) * kDim * 2};
}

#if defined(__x86_64__)

// How far a score may rise above the row's running max before the max
// moves: exp(score - max) <= e^8 ~ 2981 is still exact enough in float32
// and bfloat16, and a sum of 2^20 such weights is far from overflow. So after
// a row's first tile the max almost never moves, and the tile needs no
// horizontal max and no hard-to-predict branch: per row and tile, two
// compares against max + kHeadroom instead (a vector test), where headroom
// 0 (the max moving whenever a score passes it) needs a horizontal max and
// sum per tile (docs/quantized-weights.md, "Prompt attention").
inline constexpr float kHeadroom = 8.0f;

// A query row's running max (the shift of its weights) and the sum of its
// weights, kept as 16 lane sums until the end (no horizontal add per tile).
struct RowSoftmax {
  float max = -std::numeric_limits<float>::infinity();
  alignas(64) float sums[16] = {};

  SNAPSERVE_TARGET_AVX512F float sum() const { return _mm512_reduce_add_ps(_mm512_load_ps(sums)); }
};

// s0, s1: the row's scores against the tile's keys 0-15 and 16-31; `seen`:
// how many of the tile's keys the row may see (causality; the zero padding
// past the last key lies after every position). Where a visible score
// passes the running max by more than kHeadroom (always on the row's first
// tile, whose key 0 every row sees), the max moves to the tile's, the sums
// are rescaled by exp(old max - new max), and that factor is returned: the
// caller rescales the row's outputs by it (1 when the max stayed). Returns
// the tile's weights exp(score - max) in p0, p1: exactly 0 for the keys the
// row may not see. The sums take them in.
// kBf16Weights: the weights will be rounded to bfloat16 (the bfloat16
// kernels), so exp2_for_bf16_weights_avx512 is precise enough; else the
// float32 kernel's full-precision exp.
template <bool kBf16Weights>
SNAPSERVE_TARGET_AVX512DQ_FMA inline float softmax_tile_weights(__m512 s0, __m512 s1, int64_t seen,
                                                                RowSoftmax& row, __m512& p0,
                                                                __m512& p1) {
  __mmask16 m0 = 0xFFFF, m1 = 0xFFFF;
  if (seen < 32) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i limit = _mm512_set1_epi32(static_cast<int>(std::max<int64_t>(seen, 0)));
    m0 = _mm512_cmplt_epi32_mask(lane, limit);
    m1 = _mm512_cmplt_epi32_mask(_mm512_add_epi32(lane, _mm512_set1_epi32(16)), limit);
  }
  const __m512 ceiling = _mm512_set1_ps(row.max + kHeadroom);
  const __mmask16 up0 = _mm512_mask_cmp_ps_mask(m0, s0, ceiling, _CMP_GT_OQ);
  const __mmask16 up1 = _mm512_mask_cmp_ps_mask(m1, s1, ceiling, _CMP_GT_OQ);
  float factor = 1.0f;
  if ((up0 | up1) != 0) {
    const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    const float tile_max = _mm512_reduce_max_ps(
        _mm512_max_ps(_mm512_mask_mov_ps(ninf, m0, s0), _mm512_mask_mov_ps(ninf, m1, s1)));
    factor = std::exp(row.max - tile_max);
    _mm512_store_ps(row.sums, _mm512_mul_ps(_mm512_load_ps(row.sums), _mm512_set1_ps(factor)));
    row.max = tile_max;
  }
  if constexpr (kBf16Weights) {
    // 2^(score · log2 e - max · log2 e), one FMA for the argument. The
    // rounding of max · log2 e (~2^-24 of it) scales all of the row's
    // weights alike while the max stays, and cancels in the normalization.
    constexpr float kLog2e = 1.44269504088896341f;
    const __m512 log2e = _mm512_set1_ps(kLog2e), shift = _mm512_set1_ps(row.max * kLog2e);
    p0 = simd::exp2_for_bf16_weights_avx512(_mm512_fmsub_ps(s0, log2e, shift));
    p1 = simd::exp2_for_bf16_weights_avx512(_mm512_fmsub_ps(s1, log2e, shift));
  } else {
    const __m512 mx = _mm512_set1_ps(row.max);
    p0 = simd::exp_at_most_88_avx512(_mm512_sub_ps(s0, mx));
    p1 = simd::exp_at_most_88_avx512(_mm512_sub_ps(s1, mx));
  }
  if (seen < 32) {  // only a tile on the diagonal (or past the last key) hides keys
    p0 = _mm512_maskz_mov_ps(m0, p0);
    p1 = _mm512_maskz_mov_ps(m1, p1);
  }
  _mm512_store_ps(row.sums, _mm512_add_ps(_mm512_load_ps(row.sums), _mm512_add_ps(p0, p1)));
  return factor;
}

// softmax_tile_weights for a row whose kVecs output accumulators live in
// registers: they are rescaled here when the max moved.
template <int kVecs, bool kBf16Weights>
SNAPSERVE_TARGET_AVX512DQ_FMA inline void softmax_tile_row(__m512 s0, __m512 s1, int64_t seen,
                                                           RowSoftmax& row, __m512 (&acc)[kVecs],
                                                           __m512& p0, __m512& p1) {
  const float factor = softmax_tile_weights<kBf16Weights>(s0, s1, seen, row, p0, p1);
  if (factor != 1.0f) {
    const __m512 sc = _mm512_set1_ps(factor);
#pragma GCC unroll 8
    for (int j = 0; j < kVecs; ++j) acc[j] = _mm512_mul_ps(acc[j], sc);
  }
}

#endif  // __x86_64__

}  // namespace snapserve::kernels::cpu
