#include "engine/scheduler/admission_policy.h"

#include <gtest/gtest.h>

namespace snapserve::scheduler {
namespace {

AdmissionLimits Limits(int64_t free_blocks, int64_t running = 0, int64_t max_batch = 16,
                       int64_t budget = 4096) {
  return {free_blocks, running, max_batch, budget};
}

TEST(AdmissionPolicyTest, AdmitsWhileBlocksLast) {
  // Each needs 4 blocks; 10 free blocks fit two.
  std::vector<WaitingCandidate> w(3, {4, 10});
  EXPECT_EQ(AdmitCount(w, Limits(10)), 2);
  EXPECT_EQ(AdmitCount(w, Limits(12)), 3);
  EXPECT_EQ(AdmitCount(w, Limits(3)), 0);
}

TEST(AdmissionPolicyTest, HeadOfLineIsNotOvertaken) {
  // The head needs 8 blocks, only 5 are free: the small one behind it waits,
  // so a big request is never starved by small ones.
  std::vector<WaitingCandidate> w = {{8, 10}, {1, 10}};
  EXPECT_EQ(AdmitCount(w, Limits(5)), 0);
}

TEST(AdmissionPolicyTest, BatchSizeBounds) {
  std::vector<WaitingCandidate> w(5, {1, 1});
  EXPECT_EQ(AdmitCount(w, Limits(100, /*running=*/14, /*max_batch=*/16)), 2);
  EXPECT_EQ(AdmitCount(w, Limits(100, 16, 16)), 0);
}

TEST(AdmissionPolicyTest, PrefillBudgetKeepsDecodeGoingButNeverStarvesLongPrompts) {
  std::vector<WaitingCandidate> w = {{500, 6000}, {1, 10}};
  // The first exceeds the budget alone and is admitted anyway; the second waits.
  EXPECT_EQ(AdmitCount(w, Limits(1000, 0, 16, 4096)), 1);
  std::vector<WaitingCandidate> small = {{7, 2000}, {7, 2000}, {7, 2000}};
  EXPECT_EQ(AdmitCount(small, Limits(1000, 0, 16, 4096)), 2);
}

TEST(AdmissionPolicyTest, EmptyQueue) { EXPECT_EQ(AdmitCount({}, Limits(100)), 0); }

}  // namespace
}  // namespace snapserve::scheduler
