// The AMX tile loop of kernels/prefill_attention/prefill_attention.h (head size 64).
//
// A work item is 16 query rows of one head: the rows of one tile. The eight
// tile registers, each 16 rows of 64 bytes, hold:
//   tmm0, tmm1  the rows' scores against keys 0-15 and 16-31 of a key tile
//               (float32);
//   tmm2        q's rows, 32 head dimensions (bf16 pairs), then the rows'
//               weights of the tile's 32 keys (bf16);
//   tmm3        k's tile, 16 head-dimension pairs x 16 keys, then v's,
//               16 key pairs x 16 head dimensions;
//   tmm4-tmm7   the rows' outputs, 16 head dimensions each (float32), for
//               the whole key loop.
// Keys come in tiles of 32, as in the AVX-512 kernels:
//   1. scores: four tdpbf16ps (two key halves x two halves of the head),
//      issued one tile ahead: the tile unit computes the next tile's
//      scores while AVX-512 runs this tile's softmax;
//   2. the scores go to memory, and each row takes the online-softmax step
//      the other kernels take (prefill_attention_cpu_common.h) in AVX-512
//      registers, its weights rounded to bf16 by one vcvtne2ps2bf16;
//   3. where a row's max moved past the headroom (rare after a row's first
//      tile), the outputs go to memory, are rescaled per row and come back;
//   4. weights · V: four tdpbf16ps, one per 16 output dimensions.
// A row's numbers depend only on its own q and on the keys up to its
// position, in tiles fixed by the key positions, whatever rows share its
// item: tdpbf16ps sums each output element from its own row and column, and
// tiles a row may not see add weights of exactly 0 (so the chunked prefill
// keeps a prompt's numbers, as prefill_attention_test checks).
#include "kernels/prefill_attention/prefill_attention.h"

#if defined(__x86_64__)
#include "kernels/cpu/x86/avx512_intrinsics.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/x86/amx_tiles.h"
#include "kernels/cpu/x86/isa_target.h"
#include "kernels/prefill_attention/prefill_attention_cpu_common.h"

namespace snapserve::kernels::cpu {

namespace {

using namespace amx;  // NOLINT(google-build-using-namespace): the tile vocabulary

// Output tiles 4-7 to and from `outs` [16 rows][64 dims].
constexpr int64_t kOutStride = 64 * sizeof(float);
void store_outputs(float (&outs)[kTileRows][64]) {
  tile_store<4>(&outs[0][0], kOutStride);
  tile_store<5>(&outs[0][16], kOutStride);
  tile_store<6>(&outs[0][32], kOutStride);
  tile_store<7>(&outs[0][48], kOutStride);
}
void load_outputs(const float (&outs)[kTileRows][64]) {
  tile_load<4>(&outs[0][0], kOutStride);
  tile_load<5>(&outs[0][16], kOutStride);
  tile_load<6>(&outs[0][32], kOutStride);
  tile_load<7>(&outs[0][48], kOutStride);
}

constexpr int64_t kDim = 64, kPairs = kDim / 2, kKeys = kTileKeys;

// 1. scores = q · k of key tile `tile`'s keys 0-15 (tmm0) and 16-31 (tmm1),
// stored to `scores`. Uses tmm0-tmm3.
void tile_scores(const uint32_t* q, const uint16_t* kt, int64_t tile,
                 float (&scores)[kTileRows][kTileKeys]) {
  // Row strides in bytes: q's rows (kPairs pairs), a k tile's pair rows (32
  // keys x 2), the scores' rows.
  constexpr int64_t kQStride = kPairs * 4, kKStride = kKeys * 4;
  constexpr int64_t kScoreStride = kKeys * sizeof(float);
  const uint16_t* kp = kt + tile * kPairs * kTileKeys * 2;
  const uint16_t* kp_upper = kp + (kPairs / 2) * kKeys * 2;  // head dims 32-63
  tile_zero<0>();
  tile_zero<1>();
  tile_load<2>(q, kQStride);
  tile_load<3>(kp, kKStride);
  tile_dot_bf16<0, 2, 3>();
  tile_load<3>(kp + 32, kKStride);
  tile_dot_bf16<1, 2, 3>();
  tile_load<2>(q + kPairs / 2, kQStride);
  tile_load<3>(kp_upper, kKStride);
  tile_dot_bf16<0, 2, 3>();
  tile_load<3>(kp_upper + 32, kKStride);
  tile_dot_bf16<1, 2, 3>();
  tile_store<0>(&scores[0][0], kScoreStride);
  tile_store<1>(&scores[0][16], kScoreStride);
}

SNAPSERVE_TARGET_AVX512BF16_DQ_AVX2_FMA_F16C void attend_rows(const PackedAttention& pa,
                                                              int64_t head, int64_t row0,
                                                              float* out) {
  const auto [first_pos, valid, tiles] = item_rows(pa, row0, kTileRows);
  const auto [q, kt, vp] = bf16_operands<kDim>(pa, head, row0);
  // Row strides in bytes: v's key-pair rows (kDim x 2), the weights' rows.
  constexpr int64_t kVStride = kDim * 4, kWeightStride = kKeys * 2;

  // Two tiles' scores: the next tile's are computed on the tile unit while
  // this tile's softmax runs in AVX-512 registers.
  alignas(64) float scores[2][kTileRows][kTileKeys];
  alignas(64) uint16_t weights[kTileRows][kTileKeys];
  alignas(64) float outs[kTileRows][kDim];
  RowSoftmax rows[kTileRows];
  float factors[kTileRows];

  tile_zero<4>();
  tile_zero<5>();
  tile_zero<6>();
  tile_zero<7>();
  tile_scores(q, kt, 0, scores[0]);
  for (int64_t tile = 0; tile < tiles; ++tile) {
    if (tile + 1 < tiles) tile_scores(q, kt, tile + 1, scores[(tile + 1) & 1]);
    const float(&tile_scores_now)[kTileRows][kTileKeys] = scores[tile & 1];

    // 2. the online softmax, row by row.
    const int64_t key0 = tile * kTileKeys;
    bool moved = false;
    for (int i = 0; i < kTileRows; ++i) {
      __m512 p0, p1;
      factors[i] = softmax_tile_weights<true>(_mm512_load_ps(tile_scores_now[i]),
                                              _mm512_load_ps(tile_scores_now[i] + 16),
                                              first_pos + row0 + i - key0 + 1, rows[i], p0, p1);
      moved |= factors[i] != 1.0f;
      _mm512_store_si512(weights[i], __builtin_bit_cast(__m512i, _mm512_cvtne2ps_pbh(p1, p0)));
    }
    // 3. rescaled outputs; on the first tile they are still 0.
    if (moved && tile > 0) {
      store_outputs(outs);
      for (int i = 0; i < kTileRows; ++i) {
        const __m512 f = _mm512_set1_ps(factors[i]);
        for (int j = 0; j < kDim; j += 16) {
          _mm512_store_ps(outs[i] + j, _mm512_mul_ps(_mm512_load_ps(outs[i] + j), f));
        }
      }
      load_outputs(outs);
    }
    // 4. outputs += weights · v, 16 head dimensions per tile.
    const uint16_t* vt = vp + tile * (kTileKeys / 2) * kDim * 2;
    tile_load<2>(&weights[0][0], kWeightStride);
    tile_load<3>(vt, kVStride);
    tile_dot_bf16<4, 2, 3>();
    tile_load<3>(vt + 32, kVStride);
    tile_dot_bf16<5, 2, 3>();
    tile_load<3>(vt + 64, kVStride);
    tile_dot_bf16<6, 2, 3>();
    tile_load<3>(vt + 96, kVStride);
    tile_dot_bf16<7, 2, 3>();
  }
  store_outputs(outs);
  for (int64_t i = 0; i < valid; ++i) {
    const __m512 inv = _mm512_set1_ps(1.0f / rows[i].sum());
    if (pa.o_proj_tiles != nullptr) {
      // o_proj's input: the head's 64 columns are two 32-column pieces of
      // the row's tiles, each rounded as the GEMM's packing rounds 32
      // float32 values (cpu::pack_amx_rows).
      const int64_t k = pa.heads * kDim;
      for (int j = 0; j < kDim; j += 32) {
        const __m512 lo = _mm512_mul_ps(_mm512_load_ps(outs[i] + j), inv);
        const __m512 hi = _mm512_mul_ps(_mm512_load_ps(outs[i] + j + 16), inv);
        _mm512_storeu_si512(pa.o_proj_tiles + amx_packed_offset(k, row0 + i, head * kDim + j),
                            __builtin_bit_cast(__m512i, _mm512_cvtne2ps_pbh(hi, lo)));
      }
      continue;
    }
    float* dst = output_row(pa, out, head, row0 + i);
    for (int j = 0; j < kDim; j += 16) {
      _mm512_storeu_ps(dst + j, _mm512_mul_ps(_mm512_load_ps(outs[i] + j), inv));
    }
  }
}

}  // namespace

void prefill_attention_amx(const PackedAttention& p, int64_t item_begin, int64_t item_end,
                           float* out) {
  // The configuration is per thread; this call may run on any of the pool's.
  static const TileConfig config = all_tiles_full();
  load_config(config);
  for (int64_t item = item_begin; item < item_end; ++item) {
    for_item(item, p.rows_padded, kAmxGroupRows,
             [&](int64_t head, int64_t row0) { attend_rows(p, head, row0, out); });
  }
  release_tiles();
}

}  // namespace snapserve::kernels::cpu

#else

namespace snapserve::kernels::cpu {
// Never called off x86-64: has_prefill_attention_amx is false there.
void prefill_attention_amx(const PackedAttention&, int64_t, int64_t, float*) {}
}  // namespace snapserve::kernels::cpu

#endif
