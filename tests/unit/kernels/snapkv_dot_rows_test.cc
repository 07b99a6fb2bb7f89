// The SIMD window logits of the CPU SnapKV scores (kernels/snapkv_select/snapkv_select_cpu_simd.h)
// against the chain every path promises (snapkv_select_cpu.cc): for each key,
// q[0]*k[0], then + q[1]*k[1], ... each product and each sum rounded to float.
// Exact ties between identical keys rest on every path giving these bits.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/snapkv_select/snapkv_select_cpu_simd.h"
#include "tests/unit/common/hardware_skip.h"

namespace snapserve::kernels::detail {
namespace {

using DotRows = void (*)(const float*, const float*, int64_t, int64_t, int64_t, float*);

// The promised order, written out; volatile keeps the compiler from fusing
// the multiply into the add whatever the flags.
float ChainedDot(const float* q, const float* tile, int64_t d, int64_t key) {
  float acc = 0.0f;
  for (int64_t dd = 0; dd < d; ++dd) {
    const volatile float product = q[dd] * tile[dd * kTileKeys + key];
    acc = acc + product;
  }
  return acc;
}

void ExpectChainBits(DotRows dot_rows) {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal;
  for (int64_t d : {1, 3, 64, 128}) {
    for (int64_t w = 1; w <= 19; ++w) {
      std::vector<float> q(static_cast<size_t>(w * d)), tile(static_cast<size_t>(d * kTileKeys));
      for (float& x : q) x = normal(gen);
      for (float& x : tile) x = normal(gen);
      const int64_t stride = 3 * kTileKeys;  // rows of a wider logits matrix
      std::vector<float> logits(static_cast<size_t>(w * stride), -1.0f);
      dot_rows(q.data(), tile.data(), w, d, stride, logits.data());
      for (int64_t i = 0; i < w; ++i) {
        for (int64_t key = 0; key < kTileKeys; ++key) {
          const float want = ChainedDot(q.data() + i * d, tile.data(), d, key);
          const float got = logits[static_cast<size_t>(i * stride + key)];
          uint32_t want_bits, got_bits;
          std::memcpy(&want_bits, &want, 4);
          std::memcpy(&got_bits, &got, 4);
          ASSERT_EQ(got_bits, want_bits) << "d " << d << " w " << w << " row " << i << " key "
                                         << key << ": " << got << " vs " << want;
        }
        // Columns past the tile are another tile's: untouched.
        EXPECT_EQ(logits[static_cast<size_t>(i * stride + kTileKeys)], -1.0f);
      }
    }
  }
}

TEST(SnapKvDotRows, Avx2GivesTheChainsBits) {
  SNAPSERVE_SKIP_UNLESS_CPU(cpu_isa() >= CpuIsa::kAvx2, "avx2");
  ExpectChainBits(avx2::dot_rows);
}

TEST(SnapKvDotRows, Avx512GivesTheChainsBits) {
  SNAPSERVE_SKIP_UNLESS_CPU(cpu_isa() >= CpuIsa::kAvx512, "avx512f");
  ExpectChainBits(avx512::dot_rows);
}

}  // namespace
}  // namespace snapserve::kernels::detail
