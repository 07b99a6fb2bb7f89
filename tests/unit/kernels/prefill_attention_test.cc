// The prompt attention kernels (kernels/prefill_attention/prefill_attention.h), bfloat16 (on
// AVX512_BF16 and on AMX tiles) and float32, against a float64 softmax attention over the same
// operands (for the bfloat16 kernel, rounded to bfloat16 as it rounds them), on chunk shapes the
// model produces: whole prompts, later chunks (fewer rows than keys), grouped-query heads, row and
// key counts that are not multiples of the kernel's groups and tiles.
#include "kernels/prefill_attention/prefill_attention.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <string>

#include "kernels/cpu/cpu_isa.h"
#include "tests/unit/common/hardware_skip.h"

namespace snapserve::kernels {
namespace {

struct Shape {
  int64_t heads, kv_heads, rows, keys, dim;
};

// Float64 attention of q·scale, k and v (rounded to bfloat16 first when
// `bf16`); row r at position keys - rows + r sees keys <= its position +
// shift (shift -1: one key fewer).
at::Tensor Reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                     bool bf16, int64_t shift = 0) {
  auto round = [bf16](const at::Tensor& t) {
    return bf16 ? t.to(at::kBFloat16).to(at::kDouble) : t.to(at::kDouble);
  };
  const int64_t H = q.size(0), rows = q.size(1), Hkv = k.size(0), keys = k.size(1);
  at::Tensor qd = round(q * scale);
  at::Tensor kd = round(k).repeat_interleave(H / Hkv, 0);
  at::Tensor vd = round(v).repeat_interleave(H / Hkv, 0);
  at::Tensor scores = at::matmul(qd, kd.transpose(1, 2));  // [H, rows, keys]
  at::Tensor pos = at::arange(keys - rows, keys, at::kLong).unsqueeze(1);
  at::Tensor key = at::arange(keys, at::kLong).unsqueeze(0);
  scores = scores.masked_fill(key > pos + shift, -INFINITY);
  return at::matmul(at::softmax(scores, -1), vd);
}

// One kernel under test and what it may differ from the float64 reference.
struct Kernel {
  const char* name;
  bool (*available)(int64_t head_dim);
  at::Tensor (*run)(const at::Tensor&, const at::Tensor&, const at::Tensor&, double);
  bool bf16;  // operands rounded to bfloat16 (the reference rounds them too)
  // The output, a weighted mean of v's rows, may move by bound_exp2 *
  // max|v|:
  // - bfloat16: the softmax weights are rounded to bfloat16 as well
  //   (relative error <= 2^-9 each, plus a few float32 ulps from exp and the
  //   sums): at most ~2 * 2^-9 * max|v|; 2^-8.
  // - float32: every product and sum rounds to float32 (2^-24 relative) and
  //   exp is within 1 ulp: over the n <= 300 keys and D <= 128 terms of the
  //   shapes below, at most ~(n + D) * 2^-24 < 2^-15 of max|v|; 2^-14.
  int bound_exp2;
  // What the CPU level must have for it (its head sizes aside).
  const char* cpu_feature;
  bool (*cpu_has)();
};

// GoogleTest lists a parameter by its name (ctest's test names carry it),
// not by its bytes, which hold function addresses that change between runs.
void PrintTo(const Kernel& kernel, std::ostream* os) { *os << kernel.name; }

bool HasAvx512F() { return cpu_isa() >= CpuIsa::kAvx512; }

const Kernel kKernels[] = {
    {"bf16", has_prefill_attention_bf16, prefill_attention_bf16, true, -8, "avx512bf16",
     has_avx512_bf16},
    {"amx", has_prefill_attention_amx, prefill_attention_amx, true, -8, "amx-bf16", has_amx_bf16},
    {"f32", has_prefill_attention_f32, prefill_attention_f32, false, -14, "avx512f", HasAvx512F},
};

class PrefillAttentionTest : public ::testing::TestWithParam<Kernel> {
 protected:
  void SetUp() override {
    SNAPSERVE_SKIP_UNLESS_CPU(GetParam().cpu_has(), GetParam().cpu_feature);
    ASSERT_TRUE(GetParam().available(64)) << "every kernel takes head size 64";
  }
  at::Tensor Run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
    return GetParam().run(q, k, v, scale);
  }
  double Bound(const at::Tensor& v) {
    return std::ldexp(v.abs().max().item<double>(), GetParam().bound_exp2);
  }
};

INSTANTIATE_TEST_SUITE_P(Kernels, PrefillAttentionTest, ::testing::ValuesIn(kKernels),
                         [](const ::testing::TestParamInfo<Kernel>& info) {
                           return std::string(info.param.name);
                         });

TEST_P(PrefillAttentionTest, MatchesFloat64SoftmaxAttention) {
  at::manual_seed(0);
  const Shape shapes[] = {{9, 3, 37, 37, 64},  {9, 3, 300, 300, 64}, {9, 3, 50, 133, 64},
                          {4, 4, 1, 77, 64},   {3, 1, 33, 64, 64},   {8, 2, 65, 65, 128},
                          {8, 2, 7, 200, 128}, {2, 2, 32, 32, 64}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE(::testing::Message() << "H=" << s.heads << " Hkv=" << s.kv_heads << " rows="
                                      << s.rows << " keys=" << s.keys << " D=" << s.dim);
    // Scores of a few units, as the model's: softmax neither flat nor one-hot.
    const at::Tensor q = at::randn({s.heads, s.rows, s.dim}) * 2;
    const at::Tensor k = at::randn({s.kv_heads, s.keys, s.dim});
    const at::Tensor v = at::randn({s.kv_heads, s.keys, s.dim});
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.dim));
    if (!GetParam().available(s.dim)) {  // the AMX kernel's head size 128
      EXPECT_THROW(Run(q, k, v, scale), c10::Error);
      continue;
    }
    const at::Tensor got = Run(q, k, v, scale);
    ASSERT_EQ(got.sizes(), q.sizes());
    const at::Tensor want = Reference(q, k, v, scale, GetParam().bf16);
    const double err = (got.to(at::kDouble) - want).abs().max().item<double>();
    EXPECT_LE(err, Bound(v));
    // The bound has teeth: hiding each row's own key moves some output further.
    const double shifted =
        (Reference(q, k, v, scale, GetParam().bf16, -1) - want).abs().max().item<double>();
    if (s.keys > s.rows) EXPECT_GT(shifted, Bound(v));
  }
}

// The kernels move a row's softmax shift only when a score passes it by
// more than a headroom (prefill_attention_cpu_common.h, kHeadroom = 8):
// keys whose scores climb along the prompt, by steps of 0.5 (within the
// headroom, so the shift lags behind for several tiles) and then by jumps
// of 40 per tile (past it, so the shift and the outputs are rescaled), and
// a last tile far below the max. Every path must still match float64.
TEST_P(PrefillAttentionTest, MatchesFloat64WhenScoresClimbPastTheShift) {
  at::manual_seed(2);
  const int64_t keys = 260, dim = 64;
  // q is one unit vector per head; key j's score is climb[j] (scale 1).
  at::Tensor q = at::zeros({3, keys, dim});
  q.select(2, 0).fill_(1.0);
  at::Tensor climb = at::arange(keys, at::kFloat) * 0.5;
  climb.narrow(0, 128, 96).add_(at::arange(96, at::kFloat).div(32, "floor") * 40);
  climb.narrow(0, 224, 36).sub_(200);
  at::Tensor k = at::randn({1, keys, dim}) * 0.01;
  k.select(2, 0).copy_(climb.unsqueeze(0));
  const at::Tensor v = at::randn({1, keys, dim});
  const at::Tensor got = Run(q, k, v, 1.0);
  const at::Tensor want = Reference(q, k, v, 1.0, GetParam().bf16);
  const double err = (got.to(at::kDouble) - want).abs().max().item<double>();
  EXPECT_LE(err, Bound(v));
}

TEST_P(PrefillAttentionTest, RowsDoNotDependOnTheChunkAroundThem) {
  // A later chunk's rows equal the same rows of the whole prompt's call: the
  // engine's chunked prefill must not change a prompt's numbers.
  at::manual_seed(1);
  const at::Tensor q = at::randn({9, 130, 64}), k = at::randn({3, 130, 64}),
                   v = at::randn({3, 130, 64});
  const at::Tensor whole = Run(q, k, v, 0.125);
  const at::Tensor tail = Run(q.narrow(1, 70, 60).contiguous(), k, v, 0.125);
  EXPECT_TRUE(at::equal(tail, whole.narrow(1, 70, 60)));
}

TEST_P(PrefillAttentionTest, RejectsShapesItCannotServe) {
  const at::Tensor k = at::randn({3, 8, 64}), v = at::randn({3, 8, 64});
  EXPECT_THROW(Run(at::randn({9, 9, 64}), k, v, 1.0),
               c10::Error);                                         // rows > keys
  EXPECT_THROW(Run(at::randn({8, 4, 64}), k, v, 1.0), c10::Error);  // 8 % 3
  EXPECT_THROW(Run(at::randn({9, 4, 64}), k, v.narrow(1, 0, 7), 1.0), c10::Error);
  EXPECT_THROW(Run(at::randn({3, 4, 96}), at::randn({3, 8, 96}), at::randn({3, 8, 96}), 1.0),
               c10::Error);  // head size 96
  EXPECT_FALSE(GetParam().available(96));
}

// The AMX kernel's output written as o_proj's GEMM tiles
// (prefill_attention_amx_packed) is its float32 output as the GEMM packs it:
// o_proj's product on those tiles has the same bits as on the float32
// output, for a whole prompt (rows not a multiple of 32) and a later chunk.
TEST(PrefillAttentionAmxPacked, IsTheFloat32OutputAsOProjPacksIt) {
  SNAPSERVE_SKIP_UNLESS_CPU(has_amx_bf16(), "amx-bf16");
  ASSERT_TRUE(has_prefill_attention_amx(64));
  ASSERT_TRUE(amx_gemm_fits(576, 576));
  at::manual_seed(3);
  const at::Tensor k = at::randn({3, 130, 64}), v = at::randn({3, 130, 64});
  const at::Tensor o_proj = pack_amx_weight(at::randn({576, 576}) * 0.05);
  for (const int64_t rows : {130, 45}) {
    const at::Tensor q = at::randn({9, rows, 64});
    const at::Tensor h0 = at::randn({rows, 576});
    at::Tensor from_float32 = h0.clone();
    linear_amx_add_(from_float32,
                    prefill_attention_amx(q, k, v, 0.125).transpose(0, 1).reshape({rows, 576}),
                    o_proj);
    const AmxPackedRows packed = prefill_attention_amx_packed(q, k, v, 0.125);
    EXPECT_EQ(packed.m, rows);
    at::Tensor from_tiles = h0.clone();
    linear_amx_add_(from_tiles, packed, o_proj);
    EXPECT_TRUE(at::equal(from_tiles, from_float32)) << rows << " rows";
    EXPECT_FALSE(at::equal(from_tiles, h0));  // o_proj added something
  }
}

TEST(PrefillAttentionAmxPacked, OProjRefusesTilesOfAnotherShape) {
  SNAPSERVE_SKIP_UNLESS_CPU(has_amx_bf16(), "amx-bf16");
  ASSERT_TRUE(amx_gemm_fits(64, 64));
  const AmxPackedRows x = empty_amx_packed_rows(40, 64);
  at::Tensor h = at::zeros({40, 64});
  EXPECT_THROW(linear_amx_add_(h, x, pack_amx_weight(at::randn({64, 96}))), c10::Error);
  at::Tensor short_h = at::zeros({39, 64});
  EXPECT_THROW(linear_amx_add_(short_h, x, pack_amx_weight(at::randn({64, 64}))), c10::Error);
  EXPECT_THROW(empty_amx_packed_rows(40, 48), c10::Error);  // k not a multiple of 32
}

}  // namespace
}  // namespace snapserve::kernels
