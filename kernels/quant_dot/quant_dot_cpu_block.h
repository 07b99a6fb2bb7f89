// Internal to kernels/quant_dot/quant_dot_cpu*.cc: one legacy GGUF block as the
// integer dot product sees it (kernels/quant_dot/quant_dot.h).
#pragma once

#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

#include "kernels/quant/quant_blocks.h"

namespace snapserve::kernels::cpu {

inline constexpr int kDotBlock = 32;  // elements per legacy block and per activation block

inline float dot_half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// Block values as small integers v (Q4_0: nibble - 8, Q5_0: q - 16, Q8_0: q;
// Q4_1/Q5_1: the unsigned q, with the offset m): weight = d * v (+ m).
struct WeightBlock {
  int v[kDotBlock];
  float d = 0.0f, m = 0.0f;
  bool has_m = false;
};

inline WeightBlock read_block(QuantType type, const uint8_t* b) {
  WeightBlock w;
  w.d = dot_half_at(b);
  const uint8_t* qs = nullptr;
  uint32_t qh = 0;
  int bias = 0;
  bool fifth = false;
  switch (type) {
    case QuantType::kQ8_0:
      for (int j = 0; j < kDotBlock; ++j) w.v[j] = static_cast<int8_t>(b[2 + j]);
      return w;
    case QuantType::kQ4_0:
      qs = b + 2;
      bias = 8;
      break;
    case QuantType::kQ4_1:
      w.m = dot_half_at(b + 2);
      w.has_m = true;
      qs = b + 4;
      break;
    case QuantType::kQ5_0:
      std::memcpy(&qh, b + 2, 4);
      qs = b + 6;
      bias = 16;
      fifth = true;
      break;
    case QuantType::kQ5_1:
      w.m = dot_half_at(b + 2);
      w.has_m = true;
      std::memcpy(&qh, b + 4, 4);
      qs = b + 8;
      fifth = true;
      break;
    default:
      return w;
  }
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0F) | (fifth ? static_cast<int>((qh >> j) & 1) << 4 : 0);
    const int hi = (qs[j] >> 4) | (fifth ? static_cast<int>((qh >> (j + 16)) & 1) << 4 : 0);
    w.v[j] = lo - bias;
    w.v[j + 16] = hi - bias;
  }
  return w;
}

// One block's term of kernels/quant_dot/quant_dot.h's arithmetic, added to the
// accumulator lane it belongs to: the exact integer dot product of the
// block's 32 weights with 32 int8 activations (scale dx, scaled sum sx),
// times d * dx, then the Q4_1/Q5_1 offset m * sx; each a multiply then an
// add, never fused.
inline float add_block_term(const WeightBlock& wb, const int8_t* x, float dx, float sx,
                            float lane) {
  int sum = 0;
  for (int j = 0; j < kDotBlock; ++j) sum += wb.v[j] * x[j];
  lane = lane + (wb.d * dx) * static_cast<float>(sum);
  if (wb.has_m) lane = lane + wb.m * sx;
  return lane;
}

}  // namespace snapserve::kernels::cpu
