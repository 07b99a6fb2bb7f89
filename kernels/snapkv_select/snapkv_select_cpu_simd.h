// SIMD pieces of the CPU SnapKV selection (snapkv_select_cpu.cc), compiled
// with function-level target attributes so the library still runs on CPUs
// without them (called only when cpu_isa() allows). Internal to kernels/:
// not for other callers.
#pragma once

#include <cstdint>

namespace snapserve::kernels::detail {

// Key tiles are kTileKeys positions wide; see snapkv_select_cpu.cc.
constexpr int64_t kTileKeys = 16;

namespace avx2 {

// logits[i][0, kTileKeys) for all w window rows against one key tile.
//   q:      [w, d]                    float32
//   tile:   [d, kTileKeys]            float32
//   logits: rows `stride` floats apart
void dot_rows(const float* q, const float* tile, int64_t w, int64_t d, int64_t stride,
              float* logits);

// Scales row[0, len) by `scale`, replaces it with exp(x - max) and returns the sum.
float softmax_numerators(float* row, int64_t len, float scale);

}  // namespace avx2

namespace avx512 {

// avx2::dot_rows with one 16-lane register per row (cpu_isa() >= kAvx512):
// each lane keeps the same mul-then-add chain, so the logits are the same bits.
void dot_rows(const float* q, const float* tile, int64_t w, int64_t d, int64_t stride,
              float* logits);

}  // namespace avx512

}  // namespace snapserve::kernels::detail
