// Internal to kernels/linear/linear_cpu_fused_*_nocontract.cc: the loops of the
// fused decode-and-dot tile, written once over a per-ISA lanes trait. Only
// those files include it, so it is always compiled with -ffp-contract=off.
//
// The including file defines SNAPSERVE_FUSED_TARGET as its ISA's target
// (a macro of kernels/cpu/x86/isa_target.h) first: the loops are compiled
// for that target in that file, as if written there, so the compiler inlines
// the trait's intrinsics into them exactly as it did when each file had its
// own copy. A Lanes trait gives the vector type (Vec), the number of vectors
// a block's 32 weights decode into (kGroups, each kWidth floats wide), and
// zero(), fmadd_at(x, v, acc) (acc + x[0 .. kWidth) · v, one explicit FMA),
// sum(acc) (the lane tree of that ISA's scratch-buffer tile) and
// block_values<kType>(block, v).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/x86/isa_target.h"
#include "kernels/linear/linear_cpu_tiles.h"
#include "kernels/quant/quant_matrix.h"

namespace snapserve::kernels::cpu::fused {

inline constexpr int64_t kBlock = 32;  // weights per GGUF block

// The float16 at p (a block's scale or offset) as a float: exact, as every
// half -> float conversion.
SNAPSERVE_FUSED_TARGET inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return _cvtsh_ss(bits);
}

// kRows weight rows from `wr` against x rows xa (and xb when kPair); the
// sizes are template arguments so the accumulators stay in registers. Each
// accumulator takes its products over K ascending, as the scratch-buffer
// tile of the same ISA does.
template <typename Lanes, QuantType kType, int kRows, bool kPair>
SNAPSERVE_FUSED_TARGET inline void rows_dot(const uint8_t* const* wr, int64_t blocks,
                                            const float* xa, const float* xb, float* oa,
                                            float* ob) {
  using Vec = typename Lanes::Vec;
  constexpr int64_t kBytes = kType == QuantType::kQ8_0 ? 34 : (kType == QuantType::kQ4_1 ? 20 : 18);
  Vec a[kRows], c[kRows];
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r) a[r] = c[r] = Lanes::zero();
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const float* xab = xa + blk * kBlock;
    const float* xbb = xb + blk * kBlock;
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      Vec v[Lanes::kGroups];
      Lanes::template block_values<kType>(wr[r] + blk * kBytes, v);
#pragma GCC unroll 4
      for (int g = 0; g < Lanes::kGroups; ++g) {
        a[r] = Lanes::fmadd_at(xab + Lanes::kWidth * g, v[g], a[r]);
      }
      if constexpr (kPair) {
        for (int g = 0; g < Lanes::kGroups; ++g) {
          c[r] = Lanes::fmadd_at(xbb + Lanes::kWidth * g, v[g], c[r]);
        }
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    oa[r] = Lanes::sum(a[r]);
    if constexpr (kPair) ob[r] = Lanes::sum(c[r]);
  }
}

// Output columns n0 .. n0 + rows - 1 (rows <= kTile) of every x row, two x
// rows at a time (one when m is odd, last).
template <typename Lanes, QuantType kType>
SNAPSERVE_FUSED_TARGET void tile(const Problem& p, const QuantMatrix& w, int64_t n0, int64_t rows) {
  const int64_t blocks = p.k / kBlock;
  const uint8_t* wr[kTile] = {};
  for (int64_t r = 0; r < rows; ++r) wr[r] = w.row(n0 + r);
  for (int64_t i = 0; i < p.m; i += 2) {
    const float* xa = p.x + i * p.k;
    float* oa = p.out + i * p.n_total + n0;
    float* ob = oa + p.n_total;
    const bool pair = i + 1 < p.m;
    if (rows == kTile) {
      if (pair) {
        rows_dot<Lanes, kType, kTile, true>(wr, blocks, xa, xa + p.k, oa, ob);
      } else {
        rows_dot<Lanes, kType, kTile, false>(wr, blocks, xa, xa, oa, ob);
      }
      continue;
    }
    for (int64_t r = 0; r < rows; ++r) {  // a partial tile, the last columns
      if (pair) {
        rows_dot<Lanes, kType, 1, true>(wr + r, blocks, xa, xa + p.k, oa + r, ob + r);
      } else {
        rows_dot<Lanes, kType, 1, false>(wr + r, blocks, xa, xa, oa + r, ob + r);
      }
    }
  }
}

}  // namespace snapserve::kernels::cpu::fused
