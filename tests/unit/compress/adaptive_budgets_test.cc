// AdaKV's and PyramidKV's rules (docs/compression-policies.md): validation,
// PyramidKV's layer budgets and AdaKV's selection on hand-checked scores.
// kvpress is their oracle on real prefills (tests/python/test_adaptive_kvpress.py).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>
#include <numeric>
#include <vector>

#include "engine/compress/adakv_selector.h"
#include "engine/compress/compression_policy.h"

namespace snapserve::compress {
namespace {

constexpr int64_t kMaxContext = 8192;

TEST(AdaptivePolicies, ValidateTheirOwnFields) {
  KvCompressionConfig defaults;
  KvCompressionOverrides req;
  req.method = KvMethod::kAdaKv;
  req.adakv_alpha = 1.5;
  auto bad = ResolveCompression(defaults, req, kMaxContext);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("kv_compression.adakv_alpha_safeguard"), std::string::npos)
      << bad.status().message();
  req.adakv_alpha = 0.5;
  req.kernel_size = 4;  // SnapKV's fields apply: they rank SnapKV's scores
  bad = ResolveCompression(defaults, req, kMaxContext);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("kernel_size"), std::string::npos);

  defaults.method = KvMethod::kPyramidKv;
  defaults.pyramid_beta = 0;  // a server default of 0 is refused at start
  bad = ResolveCompression(defaults, {}, kMaxContext);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("kv_compression.pyramid_beta"), std::string::npos);
  KvCompressionOverrides beta;
  beta.pyramid_beta = 3;
  auto ok = ResolveCompression(defaults, beta, kMaxContext);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->pyramid_beta, 3);
}

TEST(AdaptivePolicies, PyramidBudgetsFallFromLayerZeroAndSumToLayersTimesC) {
  KvCompressionConfig c;
  c.method = KvMethod::kPyramidKv;
  c.capacity = 100;
  c.window = 4;
  c.pyramid_beta = 20;
  // min = C / beta = 5, max = 2C - min = 195, step 47.5; halves round to even.
  EXPECT_EQ(PyramidLayerBudgets(c, 1000, 5), (std::vector<int64_t>{195, 148, 100, 52, 5}));
  EXPECT_EQ(LayerBudgets(c, 1000, 5), PyramidLayerBudgets(c, 1000, 5));
  // A short prompt caps layer 0 at n - w and lifts the last layer to match.
  const std::vector<int64_t> capped = PyramidLayerBudgets(c, 154, 3);
  EXPECT_EQ(capped, (std::vector<int64_t>{150, 100, 50}));
  // min = 5 < w = 8: no pyramid fits, SnapKV's uniform C.
  c.window = 8;
  EXPECT_EQ(PyramidLayerBudgets(c, 1000, 4), (std::vector<int64_t>(4, 100)));
  // Not compressed (n <= C): every layer keeps n.
  EXPECT_EQ(LayerBudgets(c, 90, 3), (std::vector<int64_t>(3, 90)));
  for (int64_t layers : {2, 7, 30}) {
    c.window = 4;
    const std::vector<int64_t> b = PyramidLayerBudgets(c, 3000, layers);
    EXPECT_EQ(std::accumulate(b.begin(), b.end(), int64_t{0}), layers * c.capacity) << layers;
    EXPECT_TRUE(std::is_sorted(b.rbegin(), b.rend())) << layers;
  }
}

at::Tensor Scores(std::vector<std::vector<float>> rows) {
  std::vector<at::Tensor> t;
  for (auto& r : rows) t.push_back(at::tensor(r, at::kFloat));
  return at::stack(t);
}

std::vector<int64_t> Row(const AdaKvSelection& s, int64_t g) {
  const at::Tensor row = s.positions[g].narrow(0, 0, s.lengths[static_cast<size_t>(g)]);
  return std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
}

TEST(AdaptivePolicies, AdaKvSpendsTheLayerBudgetOnItsBestScores) {
  // n = 8, w = 2, C = 4: 2 heads * 2 prefix entries = 4 for the whole layer.
  const at::Tensor s = Scores({{9, 8, 7, 0, 0, 0}, {1, 2, 3, 0, 0, 6}});
  const AdaKvSelection free_split = AdaKvSelect(s, 2, 4, /*head_floor=*/2);
  EXPECT_EQ(free_split.lengths, (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(Row(free_split, 0), (std::vector<int64_t>{0, 1, 2, 6, 7}));
  EXPECT_EQ(Row(free_split, 1), (std::vector<int64_t>{5, 6, 7}));
  EXPECT_EQ(free_split.positions[1][4].item<int64_t>(), 7);  // padding: the last position
  // A floor of C (alpha = 1) is SnapKV: each head its own top 2.
  const AdaKvSelection floored = AdaKvSelect(s, 2, 4, /*head_floor=*/4);
  EXPECT_EQ(Row(floored, 0), (std::vector<int64_t>{0, 1, 6, 7}));
  EXPECT_EQ(Row(floored, 1), (std::vector<int64_t>{2, 5, 6, 7}));
}

TEST(AdaptivePolicies, AdaKvTiesGoToTheLowerHeadThenPositionAndNanRanksLast) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor s = Scores({{nan, 1, 1, 1}, {1, 1, nan, nan}});
  // w = 1, C = 3: 4 prefix entries out of 8, all tied at 1 except the NaNs.
  const AdaKvSelection got = AdaKvSelect(s, 1, 3, /*head_floor=*/1);
  EXPECT_EQ(Row(got, 0), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(Row(got, 1), (std::vector<int64_t>{0, 4}));
}

}  // namespace
}  // namespace snapserve::compress
