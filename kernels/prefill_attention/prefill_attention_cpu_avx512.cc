// The AVX-512F float32 tile loop of kernels/prefill_attention/prefill_attention.h.
//
// The bfloat16 kernel's loop (prefill_attention_cpu_avx512bf16.cc) with
// float32 operands and one FMA per product: a work item is kRows consecutive
// query rows of one head, whose outputs (kRows x D floats) stay in registers
// over the whole key loop; keys come in tiles of 32:
//   1. scores: for each head dimension, q's element broadcast to 16 lanes
//      times the tile's keys' elements (two registers of 16 keys);
//   2. the online softmax step of each row (prefill_attention_cpu_common.h);
//   3. weights · V: each key's weight broadcast against its V row, one FMA
//      per 16 output dimensions.
// Per tile and row, 2·D FMAs for the scores and D for the weights, against
// ~60 softmax instructions. LibTorch's flash attention, which it replaces,
// repeats K and V per query head and runs MKL's sgemm over 256 x 512 blocks
// (bench/attention_kernels.py compares the two).
#include "kernels/prefill_attention/prefill_attention.h"

#if defined(__x86_64__)
#include "kernels/cpu/x86/avx512_intrinsics.h"

#include <algorithm>
#include <cstddef>
#include <vector>

#include "kernels/cpu/x86/isa_target.h"
#include "kernels/prefill_attention/prefill_attention_cpu_common.h"

namespace snapserve::kernels::cpu {

namespace {

// One query row's state between key blocks: its unnormalized output and
// its softmax statistics.
template <int kDim>
struct RowState {
  alignas(64) float acc[kDim];
  RowSoftmax softmax;
};

// Tiles [tile_begin, tile_end) of the keys for rows row0 .. row0 + kRows - 1
// of one head, continuing their states (acc in registers meanwhile).
template <int kDim, int kRows>
SNAPSERVE_TARGET_AVX512DQ_AVX2_FMA void attend_tiles(const PackedAttentionF32& pa, int64_t head,
                                                     int64_t row0, int64_t tile_begin,
                                                     int64_t tile_end,
                                                     RowState<kDim> (&state)[kRows]) {
  constexpr int kVecs = kDim / 16;
  const int64_t group = pa.heads / pa.kv_heads, kv = head / group;
  const ItemRows item = item_rows(pa, row0, kRows);
  const int64_t first_pos = item.first_pos;
  tile_end = std::min(tile_end, item.tiles);
  if (tile_begin >= tile_end) return;
  const float* q = pa.q + (head * pa.rows_padded + row0) * kDim;
  const float* kt = pa.k_tiles + kv * pa.tiles * kDim * kTileKeys;
  const float* vr = pa.v_rows + kv * pa.tiles * kTileKeys * kDim;

  __m512 acc[kRows][kVecs];
  RowSoftmax rows[kRows];
#pragma GCC unroll 8
  for (int i = 0; i < kRows; ++i) {
    rows[i] = state[i].softmax;
#pragma GCC unroll 8
    for (int j = 0; j < kVecs; ++j) acc[i][j] = _mm512_load_ps(state[i].acc + j * 16);
  }
  alignas(64) float weights[kRows][kTileKeys];

  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    __m512 s[kRows][2];
#pragma GCC unroll 8
    for (int i = 0; i < kRows; ++i) s[i][0] = s[i][1] = _mm512_setzero_ps();
    const float* kp = kt + tile * kDim * kTileKeys;
#pragma GCC unroll 4
    for (int d = 0; d < kDim; ++d) {
      const __m512 k0 = _mm512_loadu_ps(kp + static_cast<ptrdiff_t>(d) * kTileKeys);
      const __m512 k1 = _mm512_loadu_ps(kp + static_cast<ptrdiff_t>(d) * kTileKeys + 16);
#pragma GCC unroll 8
      for (int i = 0; i < kRows; ++i) {
        const __m512 b = _mm512_set1_ps(q[i * kDim + d]);
        s[i][0] = _mm512_fmadd_ps(b, k0, s[i][0]);
        s[i][1] = _mm512_fmadd_ps(b, k1, s[i][1]);
      }
    }
    const int64_t key0 = tile * kTileKeys;
#pragma GCC unroll 8
    for (int i = 0; i < kRows; ++i) {
      __m512 p0, p1;
      softmax_tile_row<kVecs, false>(s[i][0], s[i][1], first_pos + row0 + i - key0 + 1, rows[i],
                                     acc[i], p0, p1);
      _mm512_store_ps(weights[i], p0);
      _mm512_store_ps(weights[i] + 16, p1);
    }
    const float* vt = vr + tile * kTileKeys * kDim;
#pragma GCC unroll 4
    for (int key = 0; key < kTileKeys; ++key) {
      __m512 v[kVecs];
#pragma GCC unroll 8
      for (int j = 0; j < kVecs; ++j) {
        v[j] = _mm512_loadu_ps(vt + static_cast<ptrdiff_t>(key) * kDim +
                               static_cast<ptrdiff_t>(j) * 16);
      }
#pragma GCC unroll 8
      for (int i = 0; i < kRows; ++i) {
        const __m512 w = _mm512_set1_ps(weights[i][key]);
#pragma GCC unroll 8
        for (int j = 0; j < kVecs; ++j) acc[i][j] = _mm512_fmadd_ps(w, v[j], acc[i][j]);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < kRows; ++i) {
    state[i].softmax = rows[i];
#pragma GCC unroll 8
    for (int j = 0; j < kVecs; ++j) _mm512_store_ps(state[i].acc + j * 16, acc[i][j]);
  }
}

// The finished rows' outputs: acc / sum.
template <int kDim, int kRows>
SNAPSERVE_TARGET_AVX512DQ_AVX2_FMA void store_rows(const PackedAttentionF32& pa, int64_t head,
                                                   int64_t row0,
                                                   const RowState<kDim> (&state)[kRows],
                                                   float* out) {
  const int64_t valid = std::min<int64_t>(kRows, pa.rows - row0);
  for (int64_t i = 0; i < valid; ++i) {
    const __m512 inv = _mm512_set1_ps(1.0f / state[i].softmax.sum());
    float* dst = output_row(pa, out, head, row0 + i);
    for (int j = 0; j < kDim / 16; ++j) {
      _mm512_storeu_ps(
          dst + static_cast<ptrdiff_t>(j) * 16,
          _mm512_mul_ps(_mm512_load_ps(state[i].acc + static_cast<ptrdiff_t>(j) * 16), inv));
    }
  }
}

// A thread's chunk of items, blocked over the keys: every item of the chunk
// takes one block of kBlockTiles tiles before any takes the next, so a
// block's K and V (16 KiB per tile pair at D = 64) are read from L1 by all
// the chunk's rows instead of streaming the whole head's K and V (1 MiB at
// 2,048 tokens, more than L2 holds) past each row group. A row's operations
// and their order are those of an unblocked loop: the bits do not change.
template <int kDim>
void attend_items(const PackedAttentionF32& pa, int64_t begin, int64_t end, float* out) {
  constexpr int kRows = 256 / kDim;  // kRows x kDim / 16 = 16 accumulators
  constexpr int64_t kBlockTiles = 2 * 64 / kDim;
  using Group = RowState<kDim>[kRows];
  std::vector<Group> states(static_cast<size_t>(end - begin));
  for (Group& g : states) {
    for (RowState<kDim>& r : g) std::fill_n(r.acc, kDim, 0.0f);
  }
  for (int64_t tile = 0; tile < pa.tiles; tile += kBlockTiles) {
    for (int64_t item = begin; item < end; ++item) {
      for_item(item, pa.rows_padded, kRows, [&](int64_t head, int64_t row0) {
        attend_tiles<kDim, kRows>(pa, head, row0, tile, tile + kBlockTiles,
                                  states[static_cast<size_t>(item - begin)]);
      });
    }
  }
  for (int64_t item = begin; item < end; ++item) {
    for_item(item, pa.rows_padded, kRows, [&](int64_t head, int64_t row0) {
      store_rows<kDim, kRows>(pa, head, row0, states[static_cast<size_t>(item - begin)], out);
    });
  }
}

}  // namespace

void prefill_attention_avx512(const PackedAttentionF32& p, int64_t item_begin, int64_t item_end,
                              float* out) {
  with_head_dim(
      p.dim, [&](auto dim) { attend_items<decltype(dim)::value>(p, item_begin, item_end, out); });
}

}  // namespace snapserve::kernels::cpu

#endif
