// The AVX-512 activation quantization
// (kernels/quant_dot/quant_dot_quantize_cpu_avx512_nocontract.cc, 16 blocks per reduction tree)
// against quantize_blocks_portable, bit for bit: every block count around the tree's 16 (the tail
// goes one block at a time), blocks of very different magnitudes side by side (each must keep its
// own scale: a lane mix-up in the tree would show), all-zero blocks (scale 0, all values 0) and
// values that land exactly half-way between two integers (round half to even).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/quant_dot/quant_dot.h"
#include "tests/unit/common/hardware_skip.h"

namespace snapserve::kernels {
namespace {

constexpr int kBlock = 32;

struct Quantized {
  std::vector<int8_t> q;
  std::vector<float> d, s;
};

Quantized Portable(const std::vector<float>& x) {
  const int64_t blocks = static_cast<int64_t>(x.size()) / kBlock;
  Quantized r{std::vector<int8_t>(x.size()), std::vector<float>(blocks),
              std::vector<float>(blocks)};
  cpu::quantize_blocks_portable(x.data(), blocks, r.q.data(), r.d.data(), r.s.data());
  return r;
}

Quantized Avx512(const std::vector<float>& x) {
  const int64_t blocks = static_cast<int64_t>(x.size()) / kBlock;
  Quantized r{std::vector<int8_t>(x.size()), std::vector<float>(blocks),
              std::vector<float>(blocks)};
  EXPECT_TRUE(cpu::quantize_blocks_avx512(x.data(), blocks, r.q.data(), r.d.data(), r.s.data()));
  return r;
}

bool SameBits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

void ExpectSame(const std::vector<float>& x) {
  const Quantized want = Portable(x), got = Avx512(x);
  ASSERT_EQ(got.q, want.q);
  for (size_t b = 0; b < want.d.size(); ++b) {
    EXPECT_TRUE(SameBits(got.d[b], want.d[b])) << "block " << b << " scale";
    EXPECT_TRUE(SameBits(got.s[b], want.s[b])) << "block " << b << " scaled sum";
  }
}

// Block b is scaled by 10^(b % 9 - 4): neighbours in one tree differ by 10x.
std::vector<float> RandomBlocks(int64_t blocks, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(blocks * kBlock);
  for (int64_t b = 0; b < blocks; ++b) {
    const float magnitude = std::pow(10.0f, static_cast<float>(b % 9 - 4));
    for (int j = 0; j < kBlock; ++j) x[b * kBlock + j] = normal(gen) * magnitude;
  }
  return x;
}

class QuantizeBlocksAvx512 : public ::testing::Test {
 protected:
  void SetUp() override {
    // The int8 kernels' AVX-512 path runs at the VNNI level.
    SNAPSERVE_SKIP_UNLESS_CPU(cpu_isa() >= CpuIsa::kAvx512Vnni, "avx512vnni");
  }
};

TEST_F(QuantizeBlocksAvx512, EqualsPortableForEveryCountAroundTheTree) {
  for (int64_t blocks : {0, 1, 15, 16, 17, 31, 32, 33, 48, 100}) {
    SCOPED_TRACE(blocks);
    ExpectSame(RandomBlocks(blocks, 7 + static_cast<uint32_t>(blocks)));
  }
}

TEST_F(QuantizeBlocksAvx512, EqualsPortableOnZeroBlocks) {
  std::vector<float> x = RandomBlocks(40, 3);
  for (int64_t b : {0, 5, 16, 31, 39}) std::fill_n(x.begin() + b * kBlock, kBlock, 0.0f);
  ExpectSame(x);
  const Quantized got = Avx512(x);
  EXPECT_EQ(got.d[5], 0.0f);
  EXPECT_EQ(got.s[5], 0.0f);
}

TEST_F(QuantizeBlocksAvx512, EqualsPortableOnHalfwayValues) {
  // amax 127 gives scale 1 and inv 1: x = k + 0.5 must round to even.
  std::vector<float> x(static_cast<size_t>(20) * kBlock);
  for (size_t i = 0; i < x.size(); ++i) {
    const int j = static_cast<int>(i % kBlock);
    x[i] = j == 0 ? 127.0f : static_cast<float>(j - 16) * ((i / kBlock) % 2 ? 1.0f : -1.0f) + 0.5f;
  }
  ExpectSame(x);
  const Quantized got = Avx512(x);
  EXPECT_EQ(got.q[1], 16);  // block 0, j = 1: 15.5
  EXPECT_EQ(got.q[2], 14);  // j = 2: 14.5
}

}  // namespace
}  // namespace snapserve::kernels
