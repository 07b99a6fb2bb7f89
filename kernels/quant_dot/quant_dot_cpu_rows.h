// Internal to kernels/quant_dot/quant_dot_cpu_*_nocontract.cc: the loops of the
// SIMD int8 dot products over weight rows, activation rows and eight-block
// steps, written once over a per-ISA Steps trait. Only those files include
// it, so it is always compiled with -ffp-contract=off.
//
// The including file defines SNAPSERVE_INT8_ROWS_TARGET as its ISA's target
// (a macro of kernels/cpu/x86/isa_target.h) first: the loops are compiled for
// that target in that file, as if written there. Steps::step<kType, kMaxRows,
// kPartial>(wrow, xq, i0, rows, b, group, count, acc) adds the eight-block
// step starting at block b (the group-th of its row; kPartial: the row's last
// `count` < 8 blocks) of one weight row, against activation rows i0 .. i0 +
// rows - 1, to acc[0 .. rows): eight blocks' scaled totals per __m256, as
// quant_dot_cpu_avx2_scales.h adds them. Steps::kCountsGroups: whether its
// steps read `group` (else it stays 0, and no counter is kept for it).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/x86/isa_target.h"
#include "kernels/cpu/x86/simd_sums.h"
#include "kernels/quant/quant_matrix.h"
#include "kernels/quant_dot/quant_dot.h"

namespace snapserve::kernels::cpu::int8_rows {

// Activation rows that share one unpacked weight step (their accumulators
// live on the stack between the eight-block steps).
inline constexpr int64_t kSharedRows = 8;

// One weight row against activation rows i0 .. i0 + rows - 1 (rows <=
// kMaxRows): the arithmetic of kernels/quant_dot/quant_dot.h, eight blocks per
// vector step (the last step partial when blocks % 8 != 0). Results go to
// out[(i0 + i) * n_total].
template <typename Steps, QuantType kType, int64_t kMaxRows>
SNAPSERVE_INT8_ROWS_TARGET void row_dot(const uint8_t* wrow, const QuantizedRows& xq, int64_t i0,
                                        int64_t rows, float* out, int64_t n_total) {
  const int64_t blocks = xq.blocks;
  __m256 acc[kMaxRows];
  for (int64_t i = 0; i < kMaxRows; ++i) acc[i] = _mm256_setzero_ps();
  int64_t b = 0, g = 0;
  for (; b + 8 <= blocks; b += 8, g += Steps::kCountsGroups ? 1 : 0) {
    Steps::template step<kType, kMaxRows, false>(wrow, xq, i0, rows, b, g, 8, acc);
  }
  if (b < blocks) {
    Steps::template step<kType, kMaxRows, true>(wrow, xq, i0, rows, b, g, blocks - b, acc);
  }
  for (int64_t i = 0; i < (kMaxRows == 1 ? 1 : rows); ++i) {
    out[(i0 + i) * n_total] = simd::lane_sum_avx2(acc[i]);
  }
}

// Weight rows [r_begin, r_end) against every activation row: one row at a
// time at m = 1, else kSharedRows rows per unpacked step.
template <typename Steps, QuantType kType>
SNAPSERVE_INT8_ROWS_TARGET void rows_dot(const QuantMatrix& w, const QuantizedRows& xq,
                                         int64_t r_begin, int64_t r_end, float* out,
                                         int64_t n_total) {
  for (int64_t r = r_begin; r < r_end; ++r) {
    if (xq.m == 1) {
      row_dot<Steps, kType, 1>(w.row(r), xq, 0, 1, out + r, n_total);
      continue;
    }
    for (int64_t i0 = 0; i0 < xq.m; i0 += kSharedRows) {
      row_dot<Steps, kType, kSharedRows>(w.row(r), xq, i0, std::min(kSharedRows, xq.m - i0),
                                         out + r, n_total);
    }
  }
}

}  // namespace snapserve::kernels::cpu::int8_rows
