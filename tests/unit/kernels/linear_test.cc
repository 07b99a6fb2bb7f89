// The CPU linear layer (float32 activations, float32 or bfloat16 weights)
// against a float64 ATen linear over the same weight values, and the property
// the engine relies on: a row's result is bit-identical whatever else is in
// the batch.
#include "kernels/linear/linear.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

namespace snapserve::kernels {
namespace {

at::Tensor Reference(const at::Tensor& x, const at::Tensor& w) {
  return at::linear(x.to(at::kDouble), w.to(at::kDouble)).to(at::kFloat);
}

// Tolerance for a K-term float32 dot product of O(1) values.
double Tolerance(int64_t k) { return 2e-6 * static_cast<double>(k); }

class LinearTest : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(LinearTest, MatchesFloat64ReferenceOverShapes) {
  at::manual_seed(0);
  // K not a multiple of 8, N not a multiple of 4 and odd m exercise every
  // tail; m above kLinearSmallRows takes the GEMM path.
  for (int64_t m : {1, 2, 3, 16, 64, 65, 200}) {
    for (int64_t k : {1, 7, 8, 64, 577}) {
      for (int64_t n : {1, 5, 576, 1031}) {
        const at::Tensor x = at::randn({m, k});
        const at::Tensor w = at::randn({n, k}).to(GetParam());
        const at::Tensor got = linear_float32(x, w);
        ASSERT_EQ(got.scalar_type(), at::kFloat);
        ASSERT_EQ(got.sizes(), (at::IntArrayRef{m, n}));
        const double err = (got - Reference(x, w)).abs().max().item<double>();
        EXPECT_LE(err, Tolerance(k)) << "m=" << m << " k=" << k << " n=" << n;
      }
    }
  }
}

TEST_P(LinearTest, LargeOutputIsSlicedCorrectly) {
  // N * K above the widening slice (2^19 elements) with m on the GEMM path.
  at::manual_seed(1);
  const at::Tensor x = at::randn({80, 576});
  const at::Tensor w = at::randn({2000, 576}).to(GetParam());
  const double err = (linear_float32(x, w) - Reference(x, w)).abs().max().item<double>();
  EXPECT_LE(err, Tolerance(576));
}

TEST_P(LinearTest, RowResultIndependentOfBatch) {
  at::manual_seed(2);
  const at::Tensor w = at::randn({1031, 577}).to(GetParam());
  const at::Tensor batch = at::randn({kLinearSmallRows, 577});
  const at::Tensor together = linear_float32(batch, w);
  // Rows that sit in a two-row pair in the batch and alone (or unpaired) in
  // smaller batches.
  for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{5}, kLinearSmallRows - 1}) {
    EXPECT_TRUE(at::equal(linear_float32(batch.narrow(0, i, 1), w)[0], together[i])) << "row " << i;
    const int64_t start = std::max<int64_t>(0, i - 2);
    EXPECT_TRUE(
        at::equal(linear_float32(batch.narrow(0, start, i - start + 1), w)[i - start], together[i]))
        << "row " << i << " in a batch of " << i - start + 1;
  }
  // A strided (non-contiguous) x gives the same result as its copy.
  const at::Tensor strided = at::randn({577, 3}).t();
  EXPECT_TRUE(at::equal(linear_float32(strided, w), linear_float32(strided.contiguous(), w)));
}

INSTANTIATE_TEST_SUITE_P(Weights, LinearTest, ::testing::Values(at::kFloat, at::kBFloat16),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

// DecodeDot::kBFloat16 (kernels/linear/decode_dot.h): x rounded to bfloat16 the way
// ATen rounds (to nearest even), every product of two bfloat16 values exact,
// sums in float32. So the float64 product of ATen's rounded x and the weights
// is the reference, to float32 summation's tolerance; an activation rounded
// the other way would be off by ~|x w| / 256, far outside it. Runs on every
// ISA path ctest selects: vdpbf16ps where the CPU has AVX512_BF16, the
// emulation below it.
at::Tensor Bf16Dot(const at::Tensor& x, const at::Tensor& w) {
  return linear_float32(x, w, PrefillGemm::kFloat32, DecodeDot::kBFloat16);
}

TEST(LinearBf16Dot, MatchesFloat64ReferenceOfRoundedActivations) {
  at::manual_seed(3);
  // K around the 32-element step and its tail, N not a multiple of 4, m
  // across the 4-row blocks up to kLinearSmallRows.
  for (int64_t m : {1, 2, 3, 5, 16, 64}) {
    for (int64_t k : {1, 7, 31, 32, 33, 64, 577}) {
      for (int64_t n : {1, 5, 576, 1031}) {
        const at::Tensor x = at::randn({m, k});
        const at::Tensor w = at::randn({n, k}).to(at::kBFloat16);
        const at::Tensor got = Bf16Dot(x, w);
        ASSERT_EQ(got.sizes(), (at::IntArrayRef{m, n}));
        const at::Tensor rounded = x.to(at::kBFloat16).to(at::kFloat);
        const double err = (got - Reference(rounded, w)).abs().max().item<double>();
        EXPECT_LE(err, Tolerance(k)) << "m=" << m << " k=" << k << " n=" << n;
      }
    }
  }
}

TEST(LinearBf16Dot, RowResultIndependentOfBatch) {
  at::manual_seed(4);
  const at::Tensor w = at::randn({1031, 577}).to(at::kBFloat16);
  const at::Tensor batch = at::randn({kLinearSmallRows, 577});
  const at::Tensor together = Bf16Dot(batch, w);
  for (int64_t i : {int64_t{0}, int64_t{3}, int64_t{6}, kLinearSmallRows - 1}) {
    EXPECT_TRUE(at::equal(Bf16Dot(batch.narrow(0, i, 1), w)[0], together[i])) << "row " << i;
    const int64_t start = std::max<int64_t>(0, i - 2);
    EXPECT_TRUE(
        at::equal(Bf16Dot(batch.narrow(0, start, i - start + 1), w)[i - start], together[i]))
        << "row " << i << " in a batch of " << i - start + 1;
  }
}

TEST(LinearBf16Dot, OnlyBFloat16WeightsAtDecodeSizedM) {
  at::manual_seed(5);
  const at::Tensor w = at::randn({40, 64});
  const at::Tensor x = at::randn({3, 64});
  // float32 weights: the float32 kernel, bit for bit.
  EXPECT_TRUE(at::equal(Bf16Dot(x, w), linear_float32(x, w)));
  // Prompt-sized m: the prompt GEMM, which the decode dot does not choose.
  const at::Tensor wb = w.to(at::kBFloat16);
  const at::Tensor prompt = at::randn({kLinearSmallRows + 1, 64});
  EXPECT_TRUE(at::equal(Bf16Dot(prompt, wb), linear_float32(prompt, wb)));
}

// PrefillGemm::kBFloat16 at prompt-sized m: x and the weights rounded to
// bfloat16 the way ATen rounds them (x by vcvtneps2bf16 where the CPU has
// it), then LibTorch's GEMM. Against ATen's own rounding and GEMM, bit for
// bit: normal inputs round the same way on every path (odd sizes: the
// conversion's tail).
TEST(LinearPrefillBf16, EqualsLibTorchOnAtenRoundedOperands) {
  at::manual_seed(6);
  for (const at::ScalarType wt : {at::kFloat, at::kBFloat16}) {
    const at::Tensor w = at::randn({77, 131}).to(wt);
    const at::Tensor x = at::randn({kLinearSmallRows + 9, 131});
    const at::Tensor want = at::linear(x.to(at::kBFloat16), w.to(at::kBFloat16)).to(at::kFloat);
    EXPECT_TRUE(at::equal(linear_float32(x, w, PrefillGemm::kBFloat16), want)) << wt;
    if (wt == at::kBFloat16) {  // the same product, left in bfloat16
      const at::Tensor kept = linear_bf16_gemm(x, w);
      EXPECT_EQ(kept.scalar_type(), at::kBFloat16);
      EXPECT_TRUE(at::equal(kept.to(at::kFloat), want));
    }
  }
}

TEST(Linear, EmptyInputs) {
  const at::Tensor w = at::randn({4, 8}).to(at::kBFloat16);
  EXPECT_EQ(linear_float32(at::randn({0, 8}), w).sizes(), (at::IntArrayRef{0, 4}));
  EXPECT_EQ(Bf16Dot(at::randn({0, 8}), w).sizes(), (at::IntArrayRef{0, 4}));
}

void ExpectError(const at::Tensor& x, const at::Tensor& w, const std::string& needle) {
  try {
    linear_float32(x, w);
    FAIL() << "expected an error mentioning " << needle;
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Linear, BadInputsNameTheArgument) {
  const at::Tensor w = at::randn({4, 8}).to(at::kBFloat16);
  ExpectError(at::randn({2, 8}).to(at::kBFloat16), w, "x: expected float32");
  ExpectError(at::randn({2, 8}), at::randn({4, 8}).to(at::kHalf),
              "w: expected float32 or bfloat16");
  ExpectError(at::randn({2, 7}), w, "w:");
  ExpectError(at::randn({2, 2, 8}), w, "x:");
  ExpectError(at::randn({2, 8}), at::randn({8, 4}).to(at::kBFloat16).t(), "contiguous");
}

}  // namespace
}  // namespace snapserve::kernels
