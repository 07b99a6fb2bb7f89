// Internal to kernels/linear_cpu*.cc: the problem a tile kernel works on and
// the SIMD tile kernels, one per instruction set. Not for other callers.
//
// A tile kernel computes output columns n0 .. n0 + rows - 1 (rows <= kTile)
// for every x row. Whatever the tile shape, each output element is the same
// fixed sequence for a given instruction set (lanes accumulated over K in
// order, a fixed lane tree, then the K tail): linear_cpu.cc picks one
// instruction set per process, so a row's result never depends on the batch.
#pragma once

#include <cstdint>

#include "kernels/quant_matrix.h"

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

// AVX-512F: sixteen lanes, 4 x rows × 4 weight rows per register tile. Only
// when cpu_isa() (kernels/cpu_isa.h) is kAvx512. `next`: kTile rows of
// a tile computed later, prefetched meanwhile; nullptr for none.
void tile_avx512(const Problem& p, const float* const* wr, int64_t rows, int64_t n0,
                 const float* const* next);

// DecodeDot::kBFloat16 (kernels/linear.h): out [m, n_total] = x [m, k] ·
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
// bit (linear_cpu_fused_avx2.cc). False (nothing done) for other types.
inline constexpr int64_t kFusedMaxRows = 2;
bool tile_quant_fused_avx2(const Problem& p, const QuantMatrix& w, int64_t n0, int64_t rows);
// The same with tile_avx512's results (linear_cpu_fused_avx512.cc), AVX-512F.
bool tile_quant_fused_avx512(const Problem& p, const QuantMatrix& w, int64_t n0, int64_t rows);

}  // namespace snapserve::kernels::cpu
