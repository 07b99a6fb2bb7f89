// The AVX-512 exps of the prompt attention's softmax (kernels/cpu/x86/exp_avx512.h)
// against libm's double-precision exp and exp2, over the range the softmax feeds them
// (scores minus their shift: far below 0 up to the headroom, 8) and beyond.
#include "kernels/cpu/x86/exp_avx512.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/x86/isa_target.h"
#include "tests/unit/common/hardware_skip.h"

namespace snapserve::kernels {
namespace {

#if defined(__x86_64__)

// Largest relative error of `exp16` (against `want`, in double) over
// [lo, hi] in `steps` even steps
// (results that are normal floats only; below, the weights are 0 for the
// softmax's purpose and the test checks them apart).
template <typename Exp>
double MaxRelativeError(Exp exp16, double (*want_of)(double), float lo, float hi, int steps) {
  double worst = 0.0;
  std::vector<float> x(16), y(16);
  for (int i = 0; i < steps; i += 16) {
    for (int j = 0; j < 16; ++j) x[j] = lo + (hi - lo) * static_cast<float>(i + j) / steps;
    exp16(x.data(), y.data());
    for (int j = 0; j < 16; ++j) {
      const double want = want_of(static_cast<double>(x[j]));
      if (want < 0x1p-126) continue;
      worst = std::max(worst, std::abs(y[j] - want) / want);
    }
  }
  return worst;
}

SNAPSERVE_TARGET_AVX512F_FMA void FullExp(const float* x, float* y) {
  _mm512_storeu_ps(y, simd::exp_at_most_88_avx512(_mm512_loadu_ps(x)));
}
SNAPSERVE_TARGET_AVX512DQ_FMA void Bf16WeightsExp2(const float* x, float* y) {
  _mm512_storeu_ps(y, simd::exp2_for_bf16_weights_avx512(_mm512_loadu_ps(x)));
}
double Exp(double x) { return std::exp(x); }
double Exp2(double x) { return std::exp2(x); }

class ExpAvx512 : public ::testing::Test {
 protected:
  void SetUp() override { SNAPSERVE_SKIP_UNLESS_CPU(cpu_isa() >= CpuIsa::kAvx512, "avx512f"); }
};

TEST_F(ExpAvx512, FullPrecisionIsWithinTwoUlps) {
  // A few float32 ulps (2^-23 relative each), as the float32 kernel's
  // bounds assume (tests/unit/kernels/prefill_attention_test.cc).
  EXPECT_LE(MaxRelativeError(FullExp, Exp, -87.0f, 88.0f, 1 << 20), 2 * 0x1p-23);
}

TEST_F(ExpAvx512, Bf16WeightsExp2IsFarBelowBf16Rounding) {
  // Its exp2 uses vreduceps, an AVX512DQ instruction.
  SNAPSERVE_SKIP_UNLESS_CPU(__builtin_cpu_supports("avx512dq"), "avx512dq");
  // The polynomial's 2.7e-6 (float32 evaluation included), far below
  // bfloat16's 2^-9 = 2e-3, over the softmax's range (t = (score - max) ·
  // log2 e: far below 0 up to the headroom's 8 · log2 e) and the float range.
  EXPECT_LE(MaxRelativeError(Bf16WeightsExp2, Exp2, -30.0f, 12.0f, 1 << 20), 3e-6);
  EXPECT_LE(MaxRelativeError(Bf16WeightsExp2, Exp2, -126.0f, 127.0f, 1 << 20), 3e-6);
  // Not vacuous: this one really is the cheaper, less precise exp.
  EXPECT_GT(MaxRelativeError(Bf16WeightsExp2, Exp2, -30.0f, 12.0f, 1 << 20), 1e-6);
  // Far below the float range the weight is 0 (or a denormal), not garbage.
  std::vector<float> x(16, -200.0f), y(16, 1.0f);
  x[1] = -1000.0f;
  x[2] = -3.0e38f;
  Bf16WeightsExp2(x.data(), y.data());
  for (float v : y) {
    EXPECT_GE(v, 0.0f);
    EXPECT_LT(v, 0x1p-126f);
  }
}

#endif  // __x86_64__

}  // namespace
}  // namespace snapserve::kernels
