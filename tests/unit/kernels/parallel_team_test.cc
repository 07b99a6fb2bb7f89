// kernels/cpu/parallel_team.h: inside a team every loop's items run once each,
// on the team's threads at once; loops nested in an item stay on its thread;
// exceptions from the body or from any item end the team and propagate.
#include "kernels/cpu/parallel_team.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "kernels/cpu/parallel_dynamic.h"
#include "tests/unit/kernels/two_threads_test_base.h"

namespace snapserve::kernels {
namespace {

using ParallelTeamTest = TwoThreadsTest;

// How many times cpu::parallel_for(0, n, grain) passed each index; a range
// shorter than grain comes as one chunk, as from at::parallel_for.
std::vector<int> Visits(int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> counts(static_cast<size_t>(n));
  std::atomic<int> chunks{0};
  cpu::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    EXPECT_LT(begin, end);
    chunks.fetch_add(1);
    for (int64_t i = begin; i < end; ++i) counts[static_cast<size_t>(i)].fetch_add(1);
  });
  if (n > 0 && n < grain) EXPECT_EQ(chunks.load(), 1);
  std::vector<int> out;
  out.reserve(counts.size());
  for (const auto& c : counts) out.push_back(c.load());
  return out;
}

TEST_F(ParallelTeamTest, OutsideATeamNothingLeadsAndLoopsStillRun) {
  EXPECT_EQ(cpu::team_threads(), 0);
  EXPECT_EQ(Visits(100, 7), std::vector<int>(100, 1));
}

TEST_F(ParallelTeamTest, EveryLoopInATeamRunsEachItemOnce) {
  run_as_team([&] {
    EXPECT_EQ(cpu::team_threads(), at::get_num_threads());
    // Many short loops back to back, as in a decode step.
    for (int rep = 0; rep < 2000; ++rep) {
      for (int64_t n : {0, 1, 2, 3, 17, 64, 1000}) {
        for (int64_t grain : {1, 16, 64, 5000}) {
          SCOPED_TRACE(::testing::Message() << "n=" << n << " grain=" << grain);
          const std::vector<int> visits = Visits(n, grain);
          ASSERT_EQ(visits, std::vector<int>(static_cast<size_t>(n), 1));
        }
      }
      if (::testing::Test::HasFailure()) return;
    }
    for (int64_t n : {1, 5, 96, 4608}) {
      std::vector<std::atomic<int>> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
      cpu::parallel_shares(n, 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) a[static_cast<size_t>(i)].fetch_add(1);
      });
      cpu::parallel_dynamic(n, 3, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) b[static_cast<size_t>(i)].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_EQ(a[static_cast<size_t>(i)].load(), 1);
        EXPECT_EQ(b[static_cast<size_t>(i)].load(), 1);
      }
    }
  });
}

TEST_F(ParallelTeamTest, ItemsRunOnTheTeamsThreadsAtOnce) {
  ASSERT_EQ(at::get_num_threads(), 2);
  const std::thread::id caller = std::this_thread::get_id();
  std::set<std::thread::id> seen;
  std::mutex m;
  bool both_waited = true;
  run_as_team([&] {
    // Each of two items waits for the other to start: only two threads
    // running them at once get past the wait. The minute only turns a hang
    // into a failure.
    for (int rep = 0; rep < 50; ++rep) {
      std::atomic<int> started{0};
      cpu::run_items(2, [&](int64_t) {
        started.fetch_add(1);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
        while (started.load() < 2 && std::chrono::steady_clock::now() < deadline) {
        }
        const std::lock_guard<std::mutex> lock(m);
        if (started.load() < 2) both_waited = false;
        seen.insert(std::this_thread::get_id());
      });
      if (!both_waited) return;
    }
  });
  EXPECT_TRUE(both_waited) << "the team's items did not run at the same time";
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen.count(caller), 1u) << "the calling thread leads and takes items too";
}

TEST_F(ParallelTeamTest, ALoopInsideAnItemRunsOnTheItemsThread) {
  std::atomic<int> mismatches{0}, calls{0};
  run_as_team([&] {
    cpu::run_items(4, [&](int64_t) {
      EXPECT_EQ(cpu::team_threads(), 0);
      const std::thread::id outer = std::this_thread::get_id();
      cpu::parallel_for(0, 64, 1, [&](int64_t, int64_t) {
        calls.fetch_add(1);
        if (std::this_thread::get_id() != outer) mismatches.fetch_add(1);
      });
    });
    // The leader leads again once its item is done.
    EXPECT_EQ(cpu::team_threads(), at::get_num_threads());
  });
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_GE(calls.load(), 4);
}

TEST_F(ParallelTeamTest, AnItemsExceptionEndsTheTeamAndPropagates) {
  EXPECT_THROW(run_as_team([&] {
                 cpu::run_items(8, [&](int64_t i) { TORCH_CHECK(i != 5, "item 5 failed"); });
                 ADD_FAILURE() << "run_items returned after an item threw";
               }),
               c10::Error);
  EXPECT_EQ(cpu::team_threads(), 0);
  // A body's own exception, then a new team works as before.
  EXPECT_THROW(run_as_team([] { TORCH_CHECK(false, "the body failed"); }), c10::Error);
  std::atomic<int> sum{0};
  run_as_team([&] { cpu::run_items(10, [&](int64_t i) { sum.fetch_add(static_cast<int>(i)); }); });
  EXPECT_EQ(sum.load(), 45);
}

TEST_F(ParallelTeamTest, OneThreadOrANestedTeamRunsTheBodyInline) {
  at::set_num_threads(1);
  int ran = 0;
  run_as_team([&] {
    EXPECT_EQ(cpu::team_threads(), 0);
    ++ran;
  });
  at::set_num_threads(2);
  run_as_team([&] {
    run_as_team([&] { ++ran; });  // inside a team: inline, the outer team still leads
    EXPECT_EQ(cpu::team_threads(), at::get_num_threads());
  });
  EXPECT_EQ(ran, 2);
}

}  // namespace
}  // namespace snapserve::kernels
