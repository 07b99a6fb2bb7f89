// Internal to kernels/linear/linear_cpu*.cc: the problem a tile kernel works on and
// the SIMD tile kernels, one per instruction set. Not for other callers.
//
// A tile kernel computes output columns n0 .. n0 + rows - 1 (rows <= kTile)
// for every x row. Whatever the tile shape, each output element is the same
// fixed sequence for a given instruction set (lanes accumulated over K in
// order, a fixed lane tree, then the K tail): linear_cpu.cc picks one
// instruction set per process, so a row's result never depends on the batch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/quant/quant_matrix.h"

namespace snapserve::kernels::cpu {

inline constexpr int64_t kTile = 4;  // weight rows per tile

// out [m, n_total] = x [m, k] · w [n_total, k]ᵀ
struct Problem {
  const float* x;
  float* out;
  int64_t m, k, n_total;
};

// The K tail of one dot product (from .. k-1), added to the lane total in order.
inline float add_tail(float total, const float* x, const float* w, int64_t from, int64_t k) {
  for (int64_t j = from; j < k; ++j) total += x[j] * w[j];
  return total;
}

// How the AVX-512 tile kernels walk a tile of `rows` (1 .. kTile) weight
// rows: the x rows in blocks of four, then one block of the 3, 2 or 1 left,
// each a call run_block(mx, nw, i0, next_first, next_rows) with mx and nw
// std::integral_constant<int, ...> (block height and tile width, for the
// kernels' register templates). The `next` tile's kTile rows (nullptr: none)
// are shared out for prefetching over the blocks, ceil(kTile / blocks) rows
// each from the first block on (one each at batch 16; all four from the only
// block at batch <= 4).
template <typename Row, typename RunBlock>
void for_each_block(int64_t m, int64_t rows, const Row* const* next, RunBlock&& run_block) {
  static_assert(kTile == 4, "the switches below cover 1 .. kTile weight rows");
  const int64_t blocks = (m + 3) / 4;
  const int64_t per_block = (kTile + blocks - 1) / blocks;
  auto first_for = [&](int64_t b) -> const Row* const* {
    return next == nullptr ? nullptr : next + std::min(kTile, b * per_block);
  };
  auto rows_for = [&](int64_t b) -> int {
    if (next == nullptr) return 0;
    return static_cast<int>(std::clamp<int64_t>(kTile - b * per_block, 0, per_block));
  };
  auto with_width = [&](auto nw) {
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) {
      run_block(std::integral_constant<int, 4>{}, nw, i, first_for(i / 4), rows_for(i / 4));
    }
    const int64_t b = i / 4;
    switch (m - i) {
      case 3:
        run_block(std::integral_constant<int, 3>{}, nw, i, first_for(b), rows_for(b));
        break;
      case 2:
        run_block(std::integral_constant<int, 2>{}, nw, i, first_for(b), rows_for(b));
        break;
      case 1:
        run_block(std::integral_constant<int, 1>{}, nw, i, first_for(b), rows_for(b));
        break;
      default:
        break;
    }
  };
  switch (rows) {
    case 4:
      with_width(std::integral_constant<int, 4>{});
      break;
    case 3:
      with_width(std::integral_constant<int, 3>{});
      break;
    case 2:
      with_width(std::integral_constant<int, 2>{});
      break;
    case 1:
      with_width(std::integral_constant<int, 1>{});
      break;
    default:
      break;
  }
}

// AVX-512F: sixteen lanes, 4 x rows × 4 weight rows per register tile. Only
// when cpu_isa() (kernels/cpu/cpu_isa.h) is kAvx512. `next`: kTile rows of
// a tile computed later, prefetched meanwhile; nullptr for none.
void tile_avx512(const Problem& p, const float* const* wr, int64_t rows, int64_t n0,
                 const float* const* next);

// DecodeDot::kBFloat16 (kernels/linear/linear.h): out [m, n_total] = x [m, k] ·
// w [n_total, k]ᵀ with x and w bfloat16 bits.
struct Bf16Problem {
  const uint16_t* x;
  float* out;
  int64_t m, k, n_total;
};

// AVX512_BF16: vdpbf16ps over bfloat16 weight rows read in place
// (linear_cpu_avx512bf16.cc). Only when has_avx512_bf16() (cpu_isa.h).
// `next` as for tile_avx512.
void tile_avx512bf16(const Bf16Problem& p, const uint16_t* const* wr, int64_t rows, int64_t n0,
                     const uint16_t* const* next);

// x [count] rounded to bfloat16 (to nearest even, vcvtneps2bf16) into dst.
void round_rows_to_bf16_avx512bf16(const float* x, int64_t count, uint16_t* dst);

// AVX2 + FMA, GGUF Q4_0/Q4_1/Q8_0 weights, m <= kFusedMaxRows: decodes each
// block in registers and multiplies at once, with tile_avx2's results bit for
// bit (linear_cpu_fused_avx2_nocontract.cc). False (nothing done) for other types.
inline constexpr int64_t kFusedMaxRows = 2;
bool tile_quant_fused_avx2(const Problem& p, const QuantMatrix& w, int64_t n0, int64_t rows);
// The same with tile_avx512's results (linear_cpu_fused_avx512_nocontract.cc), AVX-512F.
bool tile_quant_fused_avx512(const Problem& p, const QuantMatrix& w, int64_t n0, int64_t rows);

}  // namespace snapserve::kernels::cpu
