// The AMX prompt GEMM (kernels/prefill_gemm/prefill_gemm_amx.h) against a float64 product
// of the same bfloat16-rounded operands, on the model's shapes and on row
// counts that are not multiples of its 32-row blocks; its three outputs
// against each other; a row's bits against the rows beside it; the MLP in
// one pass against its three; refusals.
#include "kernels/prefill_gemm/prefill_gemm_amx.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/rowwise/rowwise.h"
#include "tests/unit/common/hardware_skip.h"

namespace snapserve::kernels {
namespace {

class PrefillGemmAmxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SNAPSERVE_SKIP_UNLESS_CPU(has_amx_bf16(), "amx-bf16");
    ASSERT_TRUE(amx_gemm_fits(32, 32));
    at::manual_seed(7);
  }
};

// x · wᵀ in float64 over x and w rounded to bfloat16 (to nearest even, as
// the kernel rounds them).
at::Tensor Reference(const at::Tensor& x, const at::Tensor& w) {
  return at::matmul(x.to(at::kBFloat16).to(at::kDouble), w.to(at::kBFloat16).to(at::kDouble).t());
}

// Each product of two bfloat16 values is exact in float32; only the k - 1
// float32 additions round, so an element may move by at most
// (k - 1) * 2^-24 * sum_i |x_i w_i| (the usual bound for recursive
// summation, to first order); the test allows k * 2^-24 of it.
at::Tensor Bound(const at::Tensor& x, const at::Tensor& w) {
  const at::Tensor magnitudes = at::matmul(x.to(at::kBFloat16).to(at::kDouble).abs(),
                                           w.to(at::kBFloat16).to(at::kDouble).abs().t());
  return magnitudes * (static_cast<double>(x.size(1)) * std::ldexp(1.0, -24));
}

TEST_F(PrefillGemmAmxTest, MatchesFloat64OnTheModelShapes) {
  // SmolLM2-135M's q/k/v, o, gate/up and down at prompt sizes, and rows
  // that leave a partial 32-row block.
  struct Shape {
    int64_t m, n, k;
  };
  for (const Shape& s : {Shape{2048, 960, 576}, Shape{300, 576, 576}, Shape{65, 3072, 576},
                         Shape{100, 576, 1536}, Shape{17, 64, 96}}) {
    const at::Tensor x = at::randn({s.m, s.k});
    const at::Tensor w = at::randn({s.n, s.k}) * 0.05;
    const at::Tensor y = linear_amx(x, pack_amx_weight(w), AmxOut::kFloat32);
    ASSERT_EQ(y.scalar_type(), at::kFloat);
    const at::Tensor excess = (y.to(at::kDouble) - Reference(x, w)).abs() - Bound(x, w);
    EXPECT_LE(excess.max().item<double>(), 0.0) << s.m << " x " << s.n << " x " << s.k;
  }
}

// The SwiGLU gate's bfloat16 output (kernels/rowwise/rowwise.h) is what the GEMM
// makes of its float32 output: the down product's bits either way.
TEST_F(PrefillGemmAmxTest, GateRoundedToBFloat16GivesTheFloat32InputsBits) {
  at::Tensor gate_up = at::randn({70, 2 * 1536}) * 4;
  gate_up.narrow(0, 3, 1).fill_(1e-20);  // subnormal products: 0 both ways
  const at::Tensor w = pack_amx_weight(at::randn({576, 1536}) * 0.05);
  const at::Tensor from_float = linear_amx(silu_mul(gate_up), w, AmxOut::kFloat32);
  const at::Tensor from_bf16 = linear_amx(silu_mul(gate_up, at::kBFloat16), w, AmxOut::kFloat32);
  EXPECT_TRUE(at::equal(from_float, from_bf16));
}

TEST_F(PrefillGemmAmxTest, TheBoundHasTeeth) {
  // Without the rounding of x to bfloat16 (the float32 product of float32
  // operands) the same check fails: it can tell the operands apart.
  const at::Tensor x = at::randn({64, 576}), w = at::randn({64, 576}) * 0.05;
  const at::Tensor float32_product = at::matmul(x.to(at::kDouble), w.to(at::kDouble).t());
  const at::Tensor excess = (float32_product - Reference(x, w)).abs() - Bound(x, w);
  EXPECT_GT(excess.max().item<double>(), 0.0);
}

TEST_F(PrefillGemmAmxTest, BFloat16OutputIsTheFloat32OneRounded) {
  const at::Tensor x = at::randn({100, 576}), w = at::randn({3072, 576}) * 0.05;
  const at::Tensor packed = pack_amx_weight(w);
  const at::Tensor y = linear_amx(x, packed, AmxOut::kFloat32);
  const at::Tensor yb = linear_amx(x, packed, AmxOut::kBFloat16);
  ASSERT_EQ(yb.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(yb, y.to(at::kBFloat16)));
}

TEST_F(PrefillGemmAmxTest, AddIntoHIsHPlusTheProduct) {
  const at::Tensor x = at::randn({77, 1536}), w = at::randn({576, 1536}) * 0.05;
  const at::Tensor packed = pack_amx_weight(w);
  const at::Tensor h0 = at::randn({77, 576});
  at::Tensor h = h0.clone();
  linear_amx_add_(h, x, packed);
  EXPECT_TRUE(at::equal(h, h0 + linear_amx(x, packed, AmxOut::kFloat32)));
}

TEST_F(PrefillGemmAmxTest, BFloat16InputIsTakenAsItIs) {
  const at::Tensor x = at::randn({50, 576}), w = at::randn({576, 576}) * 0.05;
  const at::Tensor packed = pack_amx_weight(w);
  EXPECT_TRUE(at::equal(linear_amx(x, packed, AmxOut::kFloat32),
                        linear_amx(x.to(at::kBFloat16), packed, AmxOut::kFloat32)));
}

TEST_F(PrefillGemmAmxTest, ARowsBitsDoNotDependOnTheRowsBesideIt) {
  // 300 rows split between threads in 32-row blocks, 70 rows (a partial
  // block), 5 rows (columns split between threads instead): row i is the
  // same bits in all three.
  const at::Tensor x = at::randn({300, 576}), w = at::randn({960, 576}) * 0.05;
  const at::Tensor packed = pack_amx_weight(w);
  const at::Tensor all = linear_amx(x, packed, AmxOut::kFloat32);
  EXPECT_TRUE(at::equal(linear_amx(x.narrow(0, 230, 70).contiguous(), packed, AmxOut::kFloat32),
                        all.narrow(0, 230, 70)));
  EXPECT_TRUE(at::equal(linear_amx(x.narrow(0, 3, 5).contiguous(), packed, AmxOut::kFloat32),
                        all.narrow(0, 3, 5)));
}

// The MLP in one pass has the bits of its three passes, each checked on its
// own above and in rowwise_test: 300 rows (split between threads by rows),
// 70 (a partial block), 5 (columns split instead), float32 and bfloat16 x.
TEST_F(PrefillGemmAmxTest, MlpInOnePassIsItsThreePassesWithinABf16Rounding) {
  const int64_t hidden = 576, inter = 1536;
  ASSERT_TRUE(amx_mlp_fits(inter, hidden));
  // Gate values over a few units, so silu runs through its whole curve.
  const at::Tensor gate_up_w = at::randn({2 * inter, hidden}) * 0.15;
  const at::Tensor down_w = at::randn({hidden, inter}) * 0.05;
  const at::Tensor gate_up = pack_amx_weight(gate_up_w), down = pack_amx_weight(down_w);
  const at::Tensor down_abs = down_w.to(at::kBFloat16).to(at::kDouble).abs();
  for (const int64_t m : {300, 70, 5}) {
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      const at::Tensor x = at::randn({m, hidden}).to(dtype);
      const at::Tensor h0 = at::randn({m, hidden});
      const at::Tensor gated = silu_mul(linear_amx(x, gate_up, AmxOut::kBFloat16), at::kBFloat16);
      at::Tensor three_passes = h0.clone();
      linear_amx_add_(three_passes, gated, down);
      at::Tensor one_pass = h0.clone();
      mlp_amx_add_(one_pass, x, gate_up, down);
      // The one pass's gate (simd::silu_mul_for_bf16_avx512, ~7e-5 from
      // silu_mul's) can round each bf16 input of down one step (2^-7 of it
      // at most) the other way; down then sums them in the same order. So
      // each output moves by at most 2^-7 · |gated| · |down|ᵀ.
      const at::Tensor bound = at::matmul(gated.to(at::kDouble).abs(), down_abs.t()) * 0x1p-7;
      const at::Tensor diff = (one_pass - three_passes).to(at::kDouble).abs();
      EXPECT_TRUE(at::all(diff <= bound).item<bool>()) << m << " rows, " << dtype;
      // The bound has teeth: it is far below what the MLP adds.
      EXPECT_LT(bound.max().item<double>(), 0.05 * (three_passes - h0).abs().max().item<double>());
      EXPECT_FALSE(at::equal(one_pass, h0));  // it added something
    }
  }
}

// The norm taken in the packing is rms_norm's bfloat16 rows (rowwise_test
// checks rms_norm against LibTorch's expression): the products' bits are
// those of rms_norm followed by the plain product, on 300 rows (split by rows
// between threads), 70 (a partial block) and 5 (columns split instead); the
// MLP with x = h itself, as the decoder layer calls it.
TEST_F(PrefillGemmAmxTest, NormInThePackingIsRmsNormsBits) {
  const int64_t hidden = 576, inter = 1536;
  const at::Tensor qkv = pack_amx_weight(at::randn({960, hidden}) * 0.05);
  const at::Tensor gate_up = pack_amx_weight(at::randn({2 * inter, hidden}) * 0.15);
  const at::Tensor down = pack_amx_weight(at::randn({hidden, inter}) * 0.05);
  const at::Tensor weight = at::rand({hidden}) + 0.5;
  const double eps = 1e-5;
  for (const int64_t m : {300, 70, 5}) {
    const at::Tensor h0 = at::randn({m, hidden}) * 3;
    const at::Tensor normed = rms_norm(h0, weight, eps, at::kBFloat16);
    EXPECT_TRUE(at::equal(linear_amx(h0, qkv, AmxOut::kFloat32, {&weight, eps}),
                          linear_amx(normed, qkv, AmxOut::kFloat32)))
        << m << " rows";
    at::Tensor two_passes = h0.clone();
    mlp_amx_add_(two_passes, normed, gate_up, down);
    at::Tensor in_place = h0.clone();
    mlp_amx_add_(in_place, in_place, gate_up, down, {&weight, eps});
    EXPECT_TRUE(at::equal(in_place, two_passes)) << m << " rows";
    EXPECT_FALSE(at::equal(in_place, h0));  // the MLP added something
  }
}

TEST_F(PrefillGemmAmxTest, NormRefusesWhatItCannotTake) {
  const at::Tensor packed = pack_amx_weight(at::randn({64, 64}));
  const at::Tensor weight = at::ones({64}), short_weight = at::ones({32});
  EXPECT_THROW(
      linear_amx(at::randn({40, 64}).to(at::kBFloat16), packed, AmxOut::kFloat32, {&weight, 1e-5}),
      c10::Error);  // a normed x is float32
  EXPECT_THROW(linear_amx(at::randn({40, 64}), packed, AmxOut::kFloat32, {&short_weight, 1e-5}),
               c10::Error);  // the weight is k long
}

TEST_F(PrefillGemmAmxTest, MlpRefusesShapesThatDoNotChain) {
  EXPECT_FALSE(amx_mlp_fits(48, 576));                               // inter not a multiple of 32
  const at::Tensor gate_up = pack_amx_weight(at::randn({128, 64}));  // inter 64, k 64
  at::Tensor h = at::zeros({8, 64});
  EXPECT_THROW(mlp_amx_add_(h, at::randn({8, 64}), gate_up, pack_amx_weight(at::randn({64, 96}))),
               c10::Error);  // down's k is not inter
  EXPECT_THROW(mlp_amx_add_(h, at::randn({8, 64}), gate_up, pack_amx_weight(at::randn({32, 64}))),
               c10::Error);  // down's n is not k
  at::Tensor narrow_h = at::zeros({8, 32});
  EXPECT_THROW(
      mlp_amx_add_(narrow_h, at::randn({8, 64}), gate_up, pack_amx_weight(at::randn({64, 64}))),
      c10::Error);
}

TEST_F(PrefillGemmAmxTest, RefusesWhatItCannotTake) {
  EXPECT_FALSE(amx_gemm_fits(48, 576));  // n not a multiple of 32
  EXPECT_FALSE(amx_gemm_fits(64, 40));   // k not a multiple of 32
  EXPECT_THROW(pack_amx_weight(at::randn({48, 64})), c10::Error);
  const at::Tensor packed = pack_amx_weight(at::randn({64, 64}));
  EXPECT_THROW(linear_amx(at::randn({40, 96}), packed, AmxOut::kFloat32), c10::Error);
  EXPECT_THROW(linear_amx(at::randn({40, 64}).to(at::kDouble), packed, AmxOut::kFloat32),
               c10::Error);
  at::Tensor h = at::zeros({40, 32});
  EXPECT_THROW(linear_amx_add_(h, at::randn({40, 64}), packed), c10::Error);
}

}  // namespace
}  // namespace snapserve::kernels
