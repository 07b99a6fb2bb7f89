// Reproducible pseudo-random data for synthetic weights
// (engine/model/synthetic_weights.h) and the kernel tests: a small 64-bit
// generator and valid random blocks of every block format (quant_blocks.h).
// The same seed gives the same bytes on every machine.
#pragma once

#include <cstdint>

#include "kernels/quant/quant_blocks.h"

namespace snapserve::kernels {

// SplitMix64 (Steele, Lea and Flood, 2014): one add and a mix per output;
// plenty for weights nobody reads, and fast enough to fill gigabytes.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Approximately N(0, 1) from one next(): four 16-bit uniforms summed,
  // centred and scaled (Irwin-Hall, n = 4; bounded by +-3.46). No
  // transcendental functions, so a few ns per value.
  float approx_normal() {
    const uint64_t r = next();
    float sum = 0.0f;
    for (int i = 0; i < 4; ++i) sum += static_cast<float>((r >> (16 * i)) & 0xFFFF);
    // Each term has mean 32767.5 and variance ~65536^2 / 12: the sum's
    // standard deviation is 65536 / sqrt(3).
    return (sum - 4.0f * 32767.5f) * (1.7320508f / 65536.0f);
  }

 private:
  uint64_t state_;
};

// A seed made of two words (a tensor's seed and a chunk index, ...).
inline uint64_t mix_seed(uint64_t a, uint64_t b) {
  return SplitMix64(a ^ (b * 0xD1B54A32D192ED03ull + 0x8CB92BA72F3D8DD7ull)).next();
}

// Fills `blocks` blocks of `type` at `dst` with random bytes, then sets every
// float16 scale field (d, and m or dmin where the type has one) to
// ~N(0, half_stddev), finite: every block decodes to finite values.
void random_blocks(QuantType type, uint64_t seed, float half_stddev, int64_t blocks, uint8_t* dst);

}  // namespace snapserve::kernels
