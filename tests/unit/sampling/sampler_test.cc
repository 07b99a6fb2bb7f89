#include "engine/sampling/sampler.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

namespace snapserve::sampling {
namespace {

TEST(SamplerTest, GreedyTiesGoToLowestId) {
  Sampler s(SamplingParams{});
  EXPECT_EQ(s.Sample(std::vector<float>{1.f, 3.f, 3.f, 2.f}), 1);
  EXPECT_EQ(s.Sample(std::vector<float>{5.f, 5.f, 5.f}), 0);
  EXPECT_EQ(Argmax(std::vector<float>{-2.f, -1.f, -1.f}), 1);
}

// LibTorch's argmax is the oracle where no NaN is involved (both return the
// first maximal index): rows of every length around the 16-lane pass,
// values drawn from a few levels so that ties are common, and -inf entries.
TEST(SamplerTest, ArgmaxEqualsLibTorchOnRandomRows) {
  at::manual_seed(7);
  for (int64_t n : {1, 2, 15, 16, 17, 31, 33, 100, 49152}) {
    for (int trial = 0; trial < 20; ++trial) {
      at::Tensor row = at::randint(0, 6, {n}).to(at::kFloat);
      if (trial % 3 == 0) row.masked_fill_(row == 0, -INFINITY);
      const std::vector<float> v(row.data_ptr<float>(), row.data_ptr<float>() + n);
      EXPECT_EQ(Argmax(v), row.argmax().item<int64_t>()) << "n=" << n << " trial " << trial;
    }
  }
}

// NaNs (a broken model's logits) are never chosen, except a NaN at index 0,
// which nothing improves on: what a loop keeping the first strict
// improvement returns.
TEST(SamplerTest, ArgmaxSkipsNaNsLikeTheFirstImprovementLoop) {
  const float nan = std::nanf("");
  EXPECT_EQ(Argmax(std::vector<float>{1.f, nan, 3.f, nan}), 2);
  EXPECT_EQ(Argmax(std::vector<float>{nan, 5.f, 9.f}), 0);
  std::vector<float> long_row(40, 1.f);
  long_row[20] = nan;
  long_row[37] = 2.f;
  EXPECT_EQ(Argmax(long_row), 37);
  EXPECT_EQ(Argmax(std::vector<float>(20, -INFINITY)), 0);
}

TEST(SamplerTest, BatchedGreedyFastPathUsesSameTieRule) {
  const at::Tensor logits = at::tensor({0.f, 2.f, 2.f, 1.f, 1.f, 7.f, 7.f, 7.f}).view({2, 4});
  Sampler a(SamplingParams{}), b(SamplingParams{});
  std::vector<Sampler*> rows = {&a, &b};
  EXPECT_EQ(SampleBatch(logits, rows), (std::vector<int32_t>{1, 1}));
  // A penalized greedy row takes the host path; the tie rule is the same.
  SamplingParams pen;
  pen.repetition_penalty = 1.5f;
  Sampler c(pen, std::vector<int32_t>{1});
  rows = {&a, &c};
  EXPECT_EQ(SampleBatch(logits, rows), (std::vector<int32_t>{1, 2}));
}

TEST(SamplerTest, RepetitionPenaltyDividesPositiveMultipliesNegative) {
  std::vector<float> l = {2.f, -2.f, 0.f, 4.f};
  ApplyRepetitionPenalty(l, std::vector<int32_t>{0, 1, 1, 2, 99, -5}, 2.f);
  EXPECT_EQ(l, (std::vector<float>{1.f, -4.f, 0.f, 4.f}));
}

TEST(SamplerTest, PenaltyCanChangeTheGreedyChoice) {
  SamplingParams p;
  p.repetition_penalty = 2.f;
  Sampler s(p, std::vector<int32_t>{0});
  const std::vector<float> logits = {3.f, 2.f};
  EXPECT_EQ(s.Sample(logits), 1);  // 3 / 2 < 2
  Sampler plain(SamplingParams{});
  EXPECT_EQ(plain.Sample(logits), 0);
}

TEST(SamplerTest, ProbabilitiesFollowTopKThenTopP) {
  SamplingParams p;
  p.temperature = 1.f;
  p.top_k = 3;
  p.top_p = 0.7f;
  Sampler s(p);
  // softmax of the top 3 of log([.4, .3, .2, .1]) is [4/9, 3/9, 2/9]; the
  // nucleus at 0.7 is the first two (4/9 < .7 <= 7/9), renormalized.
  const std::vector<float> logits = {std::log(.4f), std::log(.3f), std::log(.2f), std::log(.1f)};
  const std::vector<float> probs = s.Probabilities(logits);
  EXPECT_NEAR(probs[0], 4.f / 7.f, 1e-6);
  EXPECT_NEAR(probs[1], 3.f / 7.f, 1e-6);
  EXPECT_EQ(probs[2], 0.f);
  EXPECT_EQ(probs[3], 0.f);
}

TEST(SamplerTest, TopKTiesKeepLowerIds) {
  SamplingParams p;
  p.temperature = 1.f;
  p.top_k = 2;
  Sampler s(p);
  const std::vector<float> probs = s.Probabilities(std::vector<float>{1.f, 2.f, 2.f, 2.f});
  EXPECT_EQ(probs, (std::vector<float>{0.f, .5f, .5f, 0.f}));
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedDifferentTokens) {
  SamplingParams p;
  p.temperature = 1.f;
  p.seed = 42;
  std::vector<float> logits(1000);
  std::iota(logits.begin(), logits.end(), 0.f);
  for (float& l : logits) l = std::sin(l) * 3.f;
  Sampler a(p), b(p);
  p.seed = 43;
  Sampler c(p);
  std::vector<int32_t> ta, tb, tc;
  for (int i = 0; i < 50; ++i) {
    ta.push_back(a.Sample(logits));
    tb.push_back(b.Sample(logits));
    tc.push_back(c.Sample(logits));
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(SamplerTest, SampledTokenIsAlwaysInsideTheFilter) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 5;
  p.top_p = 0.9f;
  p.seed = 1;
  Sampler s(p);
  std::vector<float> logits(200);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>((i * 37) % 101) / 10.f;
  const std::vector<float> probs = s.Probabilities(logits);
  for (int i = 0; i < 500; ++i) EXPECT_GT(probs[s.Sample(logits)], 0.f);
}

}  // namespace
}  // namespace snapserve::sampling
