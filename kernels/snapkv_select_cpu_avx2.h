// AVX2 pieces of the CPU SnapKV selection (snapkv_select_cpu.cc), compiled
// with a function-level target attribute so the library still runs on CPUs
// without AVX2 (called only when cpu_isa() is kAvx2 or above). Internal to
// kernels/: not for other callers.
#pragma once

#include <cstdint>

namespace snapserve::kernels::detail::avx2 {

// Key tiles are kTileKeys positions wide; see snapkv_select_cpu.cc.
constexpr int64_t kTileKeys = 16;

// logits[i][0, kTileKeys) for all w window rows against one key tile.
//   q:      [w, d]                    float32
//   tile:   [d, kTileKeys]            float32
//   logits: rows `stride` floats apart
void dot_rows(const float* q, const float* tile, int64_t w, int64_t d, int64_t stride,
              float* logits);

// Scales row[0, len) by `scale`, replaces it with exp(x - max) and returns the sum.
float softmax_numerators(float* row, int64_t len, float scale);

}  // namespace snapserve::kernels::detail::avx2
