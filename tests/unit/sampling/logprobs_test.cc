// engine/sampling/logprobs: log-softmax values and top-k order on hand-built
// rows whose answers are known in closed form, which scores they start from
// (penalty and temperature, not top-k/top-p), and batch independence.
#include "engine/sampling/logprobs.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace snapserve::sampling {
namespace {

TEST(LogprobsTest, UniformRowIsMinusLogVocab) {
  const std::vector<double> scores(1000, 3.25);
  const engine::TokenLogprob l = LogprobsOfScores(scores, 17, 5);
  EXPECT_EQ(l.token_id, 17u);
  EXPECT_NEAR(l.logprob, -std::log(1000.0), 1e-6);
  // All tied: the smallest ids, in order.
  ASSERT_EQ(l.top_logprobs.size(), 5u);
  for (uint32_t i = 0; i < 5; ++i) {
    EXPECT_EQ(l.top_logprobs[i].token_id, i);
    EXPECT_NEAR(l.top_logprobs[i].logprob, -std::log(1000.0), 1e-6);
  }
}

TEST(LogprobsTest, KnownDistributionAndOrderWithTies) {
  // Scores log(p) for p = [.1, .4, .1, .4]: logprobs are log(p) whatever the
  // shift, and the ties go to the smaller id.
  const double shift = 40.0;
  const std::vector<double> scores = {std::log(.1) + shift, std::log(.4) + shift,
                                      std::log(.1) + shift, std::log(.4) + shift};
  const engine::TokenLogprob l = LogprobsOfScores(scores, 2, 4);
  EXPECT_NEAR(l.logprob, std::log(.1), 1e-6);
  ASSERT_EQ(l.top_logprobs.size(), 4u);
  const uint32_t order[] = {1, 3, 0, 2};
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(l.top_logprobs[i].token_id, order[i]) << i;
  EXPECT_NEAR(l.top_logprobs[0].logprob, std::log(.4), 1e-6);
  EXPECT_NEAR(l.top_logprobs[3].logprob, std::log(.1), 1e-6);
}

TEST(LogprobsTest, ZeroTopGivesTheChosenOnlyAndTopIsCappedByTheRow) {
  const std::vector<double> scores = {0.0, 1.0, 2.0};
  EXPECT_TRUE(LogprobsOfScores(scores, 0, 0).top_logprobs.empty());
  const engine::TokenLogprob l = LogprobsOfScores(scores, 0, 20);
  ASSERT_EQ(l.top_logprobs.size(), 3u);
  EXPECT_EQ(l.top_logprobs[0].token_id, 2u);
  // log_softmax([0, 1, 2])[0] = -log(1 + e + e^2).
  EXPECT_NEAR(l.logprob, -std::log(1 + std::exp(1.0) + std::exp(2.0)), 1e-6);
}

TEST(LogprobsTest, LargeLogitsDoNotOverflow) {
  const std::vector<double> scores = {1e4, 1e4 - std::log(3.0)};
  const engine::TokenLogprob l = LogprobsOfScores(scores, 1, 1);
  EXPECT_NEAR(l.logprob, std::log(.25), 1e-6);  // weights 1 and 1/3
  EXPECT_NEAR(l.top_logprobs[0].logprob, std::log(.75), 1e-6);
}

TEST(LogprobsTest, ScoresArePenalizedAndTemperedButNotTruncated) {
  SamplingParams p;
  p.temperature = 2.f;
  p.top_k = 1;  // would leave one candidate: the logprobs ignore it
  p.top_p = .5f;
  p.repetition_penalty = 2.f;
  const Sampler s(p, std::vector<int32_t>{0});
  const std::vector<double> x = s.LogprobScores(std::vector<float>{4.f, -2.f, 1.f});
  // Token 0 was seen: 4 / 2 = 2; then everything / temperature 2.
  EXPECT_EQ(x, (std::vector<double>{1.0, -1.0, 0.5}));

  SamplingParams greedy;  // temperature 0: scores at temperature 1
  EXPECT_EQ(Sampler(greedy).LogprobScores(std::vector<float>{4.f, -2.f}),
            (std::vector<double>{4.0, -2.0}));
}

TEST(LogprobsTest, BatchComputesOnlyRowsThatAskAndIgnoresNeighbours) {
  SamplingParams off;
  SamplingParams on;
  on.logprobs = {true, 2};
  Sampler a(off), b(on), c(on);
  const at::Tensor row = at::tensor({0.f, 3.f, 1.f, 3.f});
  const at::Tensor logits = at::stack({row * 5, row, row - 7});  // [3, 4]
  std::vector<Sampler*> samplers = {&a, &b};
  std::vector<int32_t> sampled = {1, 1};
  EXPECT_TRUE(BatchLogprobs(logits.narrow(0, 0, 1), std::span(samplers).first(1),
                            std::span(sampled).first(1))
                  .empty());  // nobody asks: nothing computed

  samplers = {&a, &b, &c};
  sampled = {1, 3, 3};
  const auto batch = BatchLogprobs(logits, samplers, sampled);
  ASSERT_EQ(batch.size(), 3u);
  EXPECT_FALSE(batch[0].has_value());
  ASSERT_TRUE(batch[1].has_value() && batch[2].has_value());
  // Shifting a row changes no logprob; alone or in a batch, the same values.
  Sampler* alone[] = {&b};
  const int32_t three[] = {3};
  const auto single = BatchLogprobs(logits.narrow(0, 1, 1), alone, three);
  for (const auto& l : {*batch[1], *batch[2], *single[0]}) {
    EXPECT_EQ(l.token_id, 3u);
    EXPECT_NEAR(l.logprob, 3.0 - std::log(2 * std::exp(3.0) + std::exp(1.0) + 1.0), 1e-6);
    ASSERT_EQ(l.top_logprobs.size(), 2u);
    EXPECT_EQ(l.top_logprobs[0].token_id, 1u);  // tie with 3: smaller id first
    EXPECT_EQ(l.top_logprobs[1].token_id, 3u);
  }
  EXPECT_EQ(batch[1]->logprob, single[0]->logprob);
}

}  // namespace
}  // namespace snapserve::sampling
