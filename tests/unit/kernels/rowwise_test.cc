// The fused row-wise kernels (RMSNorm, rotary embedding, SwiGLU gate) against
// float64 references and the LibTorch expressions they replace in the model,
// and the property the engine relies on: a row's result does not depend on
// the other rows of the call.
#include "kernels/rowwise/rowwise.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "tests/unit/common/hardware_skip.h"

namespace snapserve::kernels {
namespace {

// |got - want| <= ulps float32 units of want's magnitude (plus a floor near 0).
void ExpectClose(const at::Tensor& got, const at::Tensor& want, double ulps) {
  const at::Tensor w = want.to(at::kDouble);
  const at::Tensor bound = w.abs() * (ulps * 0x1p-23) + 1e-30;
  const at::Tensor excess = (got.to(at::kDouble) - w).abs() - bound;
  EXPECT_LE(excess.max().item<double>(), 0.0)
      << "worst error " << (got.to(at::kDouble) - w).abs().max().item<double>();
}

TEST(RmsNorm, MatchesFloat64Reference) {
  at::manual_seed(0);
  for (int64_t m : {1, 3, 64, 300}) {
    for (int64_t n : {1, 7, 576, 2049}) {
      const at::Tensor x = at::randn({m, n}) * 3;
      const at::Tensor w = at::randn({n});
      const double eps = 1e-5;
      const at::Tensor xd = x.to(at::kDouble);
      const at::Tensor want = w.to(at::kDouble) * (xd * at::rsqrt(xd.pow(2).mean(-1, true) + eps));
      const at::Tensor got = rms_norm(x, w, eps);
      ASSERT_EQ(got.sizes(), x.sizes());
      // The scale is rounded once from an exact-ish mean (1/sqrt: 1.5 ulp),
      // then x * scale and w * (.) round once each: 4 ulps covers the chain.
      ExpectClose(got, want, 4);
    }
  }
}

// The AVX-512 row (when this CPU and the cap allow it) against the portable
// order of rowwise.h, bit for bit: lengths below, at and past 16, with tails.
TEST(RmsNorm, Avx512RowEqualsThePortableOrder) {
  SNAPSERVE_SKIP_UNLESS_CPU(cpu_isa() >= CpuIsa::kAvx512, "avx512f");
  at::manual_seed(4);
  // 64 rows per length, magnitudes spread over e^(+-9) within a row. (The
  // sum's order in double rarely shows after the mean's rounding to float;
  // the scale and the products are what this compares.)
  const std::vector<int64_t> lengths = {1, 7, 16, 17, 576, 2049};
  for (int64_t trial = 0; trial < static_cast<int64_t>(lengths.size()) * 64; ++trial) {
    const int64_t n = lengths[trial / 64];
    const at::Tensor x = at::randn({n}) * at::exp(at::randn({n}) * 3), w = at::randn({n});
    const float* xp = x.const_data_ptr<float>();
    const float* wp = w.const_data_ptr<float>();
    std::vector<float> got(n), want(n);
    ASSERT_TRUE(cpu::rms_norm_row_avx512(xp, wp, n, 1e-5f, got.data()));
    const float scale = cpu::rms_scale(cpu::sum_of_squares_portable(xp, n), n, 1e-5f);
    for (int64_t j = 0; j < n; ++j) want[j] = wp[j] * (xp[j] * scale);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), n * sizeof(float))) << "n = " << n;
  }
}

TEST(RmsNorm, RowResultIndependentOfBatch) {
  at::manual_seed(1);
  const at::Tensor x = at::randn({40, 576});
  const at::Tensor w = at::randn({576});
  const at::Tensor together = rms_norm(x, w, 1e-6);
  for (int64_t i : {0, 17, 39}) {
    EXPECT_TRUE(at::equal(rms_norm(x.narrow(0, i, 1), w, 1e-6), together.narrow(0, i, 1)));
  }
}

// Head sizes: the model's 64 (16-lane steps with no tail), 40 (the AVX-512
// path's masked tail of 4) and 6 (fewer lanes than one register).
class RopeRotate : public ::testing::TestWithParam<int64_t> {};
INSTANTIATE_TEST_SUITE_P(HeadSizes, RopeRotate, ::testing::Values(64, 40, 6));

TEST_P(RopeRotate, EqualsTheTensorExpressionBitForBit) {
  at::manual_seed(2);
  const int64_t rows = 5, h = 9, hkv = 3, d = GetParam();
  // A fused qkv output: q and k heads are rotated in place, v is left alone.
  const at::Tensor qkv = at::randn({rows, h + 2 * hkv, d});
  const at::Tensor angles = at::randn({rows, d}) * 10;
  const at::Tensor cos = angles.cos(), sin = angles.sin();
  const at::Tensor x = qkv.narrow(1, 0, h + hkv).clone();
  const at::Tensor rotated = at::cat({-x.narrow(-1, d / 2, d / 2), x.narrow(-1, 0, d / 2)}, -1);
  const at::Tensor want = x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1);
  const at::Tensor v_before = qkv.narrow(1, h + hkv, hkv).clone();
  at::Tensor qk = qkv.narrow(1, 0, h + hkv);
  rope_rotate_(qk, cos, sin);
  EXPECT_TRUE(at::equal(qkv.narrow(1, 0, h + hkv), want));
  EXPECT_TRUE(at::equal(qkv.narrow(1, h + hkv, hkv), v_before));
}

TEST(SiluMul, MatchesFloat64Reference) {
  at::manual_seed(3);
  for (int64_t m : {1, 4, 100}) {
    for (int64_t inter : {1, 7, 8, 1536, 1539}) {
      // Wide range: lanes beyond exp's polynomial range (|g| > 87) take libm.
      at::Tensor gate_up = at::randn({m, 2 * inter}) * 4;
      gate_up.index_put_({0, 0}, 95.0);
      if (inter > 1) gate_up.index_put_({0, 1}, -120.0);
      const at::Tensor g = gate_up.narrow(1, 0, inter).to(at::kDouble);
      const at::Tensor u = gate_up.narrow(1, inter, inter).to(at::kDouble);
      const at::Tensor want = g / (1 + at::exp(-g)) * u;
      const at::Tensor got = silu_mul(gate_up);
      ASSERT_EQ(got.sizes(), (at::IntArrayRef{m, inter}));
      // exp within 1 ulp (or libm's), then add, divide and multiply round
      // once each; 1 + e can amplify exp's error by at most 1 (e/(1+e) < 1).
      ExpectClose(got, want, 6);
    }
  }
}

TEST(SiluMul, RowResultIndependentOfBatch) {
  at::manual_seed(4);
  const at::Tensor gate_up = at::randn({33, 2 * 1536});
  const at::Tensor together = silu_mul(gate_up);
  for (int64_t i : {0, 32}) {
    EXPECT_TRUE(at::equal(silu_mul(gate_up.narrow(0, i, 1)), together.narrow(0, i, 1)));
  }
}

// A bfloat16 gate_up (the bfloat16 GEMM's product, kept unwidened) gives
// the bits of its float32 widening, on every path (odd widths: the tails).
TEST(SiluMul, BFloat16InputEqualsItsWidening) {
  at::manual_seed(5);
  for (int64_t inter : {1, 7, 1536, 1539}) {
    const at::Tensor gate_up = (at::randn({70, 2 * inter}) * 4).to(at::kBFloat16);
    const at::Tensor got = silu_mul(gate_up);
    EXPECT_EQ(got.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(got, silu_mul(gate_up.to(at::kFloat)))) << "inter=" << inter;
  }
}

// A bfloat16 result is the float32 result rounded to nearest even as
// LibTorch rounds it (no subnormal results here: |x| ~ 1), tails included.
TEST(RmsNorm, BFloat16OutputIsTheFloat32ResultRounded) {
  at::manual_seed(9);
  for (int64_t n : {1, 7, 576, 2049}) {
    const at::Tensor x = at::randn({70, n}) * 3;
    const at::Tensor w = at::randn({n});
    const at::Tensor f = rms_norm(x, w, 1e-5);
    const at::Tensor got = rms_norm(x, w, 1e-5, at::kBFloat16);
    ASSERT_EQ(got.scalar_type(), at::kBFloat16);
    ASSERT_TRUE((f.abs() >= std::numeric_limits<float>::min()).all().item<bool>());
    EXPECT_TRUE(at::equal(got.view(at::kShort), f.to(at::kBFloat16).view(at::kShort))) << "n=" << n;
  }
  EXPECT_THROW(rms_norm(at::randn({2, 8}), at::ones({8}), 1e-5, at::kHalf), c10::Error);
}

// The AVX-512 (AVX512_BF16) gate row and the AVX2 one (what this CPU runs under
// SNAPSERVE_CPU_ISA=avx2) give the same bits, float32 and bfloat16 inputs,
// tails of every length mod 16, and lanes past exp's polynomial range.
TEST(SiluMul, Avx512RowHasTheAvx2RowsBits) {
  SNAPSERVE_SKIP_UNLESS_CPU(has_avx512_bf16(), "avx512bf16");
  at::manual_seed(6);
  for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 24, 31, 1536, 1539}) {
    at::Tensor gate_up = at::randn({2 * n}) * 4;
    gate_up.index_put_({0}, 95.0);
    if (n > 2) gate_up.index_put_({n - 1}, -120.0);
    const at::Tensor as_bf16 = gate_up.to(at::kBFloat16);
    std::vector<float> avx2(n), avx512(n);
    const float* g = gate_up.const_data_ptr<float>();
    ASSERT_TRUE(cpu::silu_mul_row_avx2(g, g + n, n, avx2.data()));
    ASSERT_TRUE(cpu::silu_mul_row_avx512bf16(g, g + n, n, avx512.data()));
    EXPECT_EQ(std::memcmp(avx2.data(), avx512.data(), n * sizeof(float)), 0) << "n=" << n;
    const auto* b = static_cast<const uint16_t*>(as_bf16.const_data_ptr());
    ASSERT_TRUE(cpu::silu_mul_row_avx2(b, b + n, n, avx2.data()));
    ASSERT_TRUE(cpu::silu_mul_row_avx512bf16(b, b + n, n, avx512.data()));
    EXPECT_EQ(std::memcmp(avx2.data(), avx512.data(), n * sizeof(float)), 0) << "bf16 n=" << n;
  }
}

// A bfloat16 result is the float32 result rounded to nearest even, as
// LibTorch rounds it, but for subnormal results, which become a zero of their
// sign (vcvtneps2bf16's rule); on every path, tails included.
TEST(SiluMul, BFloat16OutputIsTheFloat32ResultRounded) {
  at::manual_seed(8);
  for (int64_t inter : {1, 7, 17, 1536, 1539}) {
    for (at::ScalarType in : {at::kFloat, at::kBFloat16}) {
      at::Tensor gate_up = at::randn({40, 2 * inter}) * 4;
      // Row 1: products below float32's smallest normal (gate ~1e-20 gives
      // silu ~5e-21; times up 1e-19 is ~5e-40).
      gate_up.narrow(0, 1, 1).narrow(1, 0, inter).fill_(1e-20);
      gate_up.narrow(0, 1, 1).narrow(1, inter, inter).fill_(-1e-19);
      gate_up = gate_up.to(in);
      const at::Tensor f = silu_mul(gate_up);
      const at::Tensor got = silu_mul(gate_up, at::kBFloat16);
      ASSERT_EQ(got.scalar_type(), at::kBFloat16);
      const at::Tensor normal = f.abs() >= std::numeric_limits<float>::min();
      const at::Tensor want = at::where(normal, f, f * 0).to(at::kBFloat16);
      EXPECT_TRUE(at::equal(got.view(at::kShort), want.view(at::kShort)))
          << "inter=" << inter << " in=" << in;
      EXPECT_FALSE(normal.narrow(0, 1, 1).any().item<bool>()) << "row 1 is not subnormal";
      EXPECT_TRUE(std::signbit(got[1][0].item<float>()));
    }
  }
}

TEST(Rowwise, RejectsWrongInputsWithAMessage) {
  EXPECT_THROW(silu_mul(at::randn({2, 8}), at::kHalf), c10::Error);
  const at::Tensor x = at::randn({2, 8});
  EXPECT_THROW(rms_norm(x.to(at::kDouble), at::ones({8}), 1e-5), c10::Error);
  EXPECT_THROW(rms_norm(x, at::ones({7}), 1e-5), c10::Error);
  EXPECT_THROW(silu_mul(at::randn({2, 7})), c10::Error);
  EXPECT_THROW(silu_mul(at::randn({2, 8}).to(at::kHalf)), c10::Error);
  at::Tensor odd = at::randn({2, 1, 7});
  EXPECT_THROW(rope_rotate_(odd, at::randn({2, 7}), at::randn({2, 7})), c10::Error);
  at::Tensor ok = at::randn({2, 1, 8});
  EXPECT_THROW(rope_rotate_(ok, at::randn({3, 8}), at::randn({3, 8})), c10::Error);
}

}  // namespace
}  // namespace snapserve::kernels
