// Schedule() (engine/scheduler/step_planner.h): the policy as plain data, no
// model. Each test states the rule it checks.
#include "engine/scheduler/step_planner.h"

#include <gtest/gtest.h>

namespace snapserve::scheduler {
namespace {

StepLimits Limits(int64_t step_tokens = 64, int64_t max_batch = 16, int64_t max_prefill = 4096) {
  return {max_batch, step_tokens, max_prefill};
}

std::vector<int64_t> ChunkTokens(const StepPlan& plan) {
  std::vector<int64_t> t;
  for (const PromptChunk& c : plan.prefill) t.push_back(c.tokens);
  return t;
}

TEST(StepPlannerTest, EveryDecodeTokenRunsAndPromptChunksFillTheBudget) {
  ScheduleInput in;
  in.limits = Limits(/*step_tokens=*/64);
  in.free_blocks = 100;
  in.decoding = {{1}, {2}, {3}};
  // Remainders: 10 (a last chunk), 40, 30: the first two fit in 64 prompt
  // tokens (10 + 40 = 50; 30 more would exceed it).
  in.prefilling = {{10, 200, 10}, {11, 40, 40}, {12, 30, 30}};
  const StepPlan plan = Schedule(in);
  EXPECT_EQ(plan.decode, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(ChunkTokens(plan), (std::vector<int64_t>{10, 40}));
  EXPECT_EQ(plan.prefill[0].id, 10);
  EXPECT_EQ(plan.prefill[1].id, 11);
}

TEST(StepPlannerTest, PromptsAreCutOnTheSameGridWhateverElseRuns) {
  // A 150-token prompt runs as 64 + 64 + 22 with or without decoding
  // sequences beside it, so its numbers do not depend on the load.
  for (const int decoding : {0, 1, 16}) {
    ScheduleInput in;
    in.limits = Limits(/*step_tokens=*/64);
    in.free_blocks = 100;
    for (int i = 0; i < decoding; ++i) in.decoding.push_back({i});
    std::vector<int64_t> cuts;
    for (int64_t remaining = 150; remaining > 0;) {
      in.prefilling = {{100, 150, remaining}};
      const StepPlan plan = Schedule(in);
      ASSERT_EQ(plan.prefill.size(), 1u);
      cuts.push_back(plan.prefill[0].tokens);
      remaining -= plan.prefill[0].tokens;
    }
    EXPECT_EQ(cuts, (std::vector<int64_t>{64, 64, 22})) << decoding << " decoding";
  }
}

TEST(StepPlannerTest, DecodeTokensDoNotCrowdOutAWholeChunk) {
  // Two 32-token prompts fill a 64-token step exactly; sixteen decoding
  // sequences beside them do not push the second one to the next step
  // (chunks cannot be cut to fit what decode tokens would leave).
  ScheduleInput in;
  in.limits = Limits(/*step_tokens=*/64);
  in.free_blocks = 100;
  for (int i = 0; i < 16; ++i) in.decoding.push_back({i});
  in.prefilling = {{100, 32, 32}, {101, 32, 32}};
  const StepPlan plan = Schedule(in);
  EXPECT_EQ(plan.decode.size(), 16u);
  EXPECT_EQ(ChunkTokens(plan), (std::vector<int64_t>{32, 32}));
}

TEST(StepPlannerTest, PromptsProgressBesideAFullDecodeBatch) {
  ScheduleInput in;
  in.limits = Limits(/*step_tokens=*/4);
  in.free_blocks = 100;
  in.decoding = {{1}, {2}, {3}, {4}, {5}, {6}};
  in.prefilling = {{10, 50, 50}, {11, 2, 2}};
  const StepPlan plan = Schedule(in);
  EXPECT_EQ(plan.decode.size(), 6u);                        // nobody decoding is held back
  EXPECT_EQ(ChunkTokens(plan), (std::vector<int64_t>{4}));  // one chunk, no more
}

TEST(StepPlannerTest, ShortPromptsShareAStep) {
  ScheduleInput in;
  in.limits = Limits(/*step_tokens=*/64);
  in.free_blocks = 100;
  in.prefilling = {{10, 20, 20}, {11, 30, 30}, {12, 20, 20}};
  EXPECT_EQ(ChunkTokens(Schedule(in)), (std::vector<int64_t>{20, 30}));
}

TEST(StepPlannerTest, AdmittedPromptsGetChunksInTheSameStep) {
  ScheduleInput in;
  in.limits = Limits(/*step_tokens=*/64);
  in.free_blocks = 100;
  in.decoding = {{1}};
  in.waiting = {{20, 7, 90}};
  const StepPlan plan = Schedule(in);
  EXPECT_EQ(plan.admit, (std::vector<int64_t>{20}));
  ASSERT_EQ(plan.prefill.size(), 1u);
  EXPECT_EQ(plan.prefill[0].id, 20);
  EXPECT_EQ(plan.prefill[0].tokens, 64);
}

TEST(StepPlannerTest, EndedRequestsLeaveWhereverTheyAreAndFreeTheirRoom) {
  ScheduleInput in;
  in.limits = Limits(/*step_tokens=*/64, /*max_batch=*/2);
  in.free_blocks = 100;
  in.decoding = {{1, /*ends=*/true}, {2}};
  in.prefilling = {{10, 50, 50, /*ends=*/true}};
  in.waiting = {{20, 1, 10, /*ends=*/true}, {21, 1, 10}};
  const StepPlan plan = Schedule(in);
  EXPECT_EQ(plan.end, (std::vector<int64_t>{20, 10, 1}));
  EXPECT_EQ(plan.decode, (std::vector<int64_t>{2}));
  // Batch room 2: sequence 2 and the admitted 21 (the ended ones freed it).
  EXPECT_EQ(plan.admit, (std::vector<int64_t>{21}));
  EXPECT_EQ(ChunkTokens(plan), (std::vector<int64_t>{10}));
}

TEST(StepPlannerTest, AdmissionKeepsFcfsBlocksAndTheInPrefillBound) {
  ScheduleInput in;
  in.limits = Limits(/*step_tokens=*/64, /*max_batch=*/16, /*max_prefill=*/1000);
  // The head needs 8 blocks (128 tokens), only 5 free: nobody overtakes it.
  in.free_blocks = 5;
  in.waiting = {{20, 8, 100}, {21, 1, 10}};
  EXPECT_TRUE(Schedule(in).admit.empty());
  // A prompt in prefill holds 900 of the 1000-token bound: the 200-token head waits.
  in.free_blocks = 100;
  in.waiting = {{20, 16, 200}};
  in.prefilling = {{10, 900, 900}};
  EXPECT_TRUE(Schedule(in).admit.empty());
  // With none in prefill the head is admitted whatever its length.
  in.prefilling.clear();
  in.waiting = {{20, 188, 3000}, {21, 1, 10}};
  in.free_blocks = 1000;
  EXPECT_EQ(Schedule(in).admit, (std::vector<int64_t>{20}));
}

}  // namespace
}  // namespace snapserve::scheduler
