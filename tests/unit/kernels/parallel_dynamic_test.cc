// kernels/cpu/parallel_dynamic.h: every item runs exactly once, whatever the
// chunking, and a slow thread leaves its share (parallel_shares: its share's
// tail) to the others. A "slow" thread here is one held until the other has
// taken the work, so the outcome does not depend on timing.
#include "kernels/cpu/parallel_dynamic.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "tests/unit/kernels/two_threads_test_base.h"

namespace snapserve::kernels::cpu {
namespace {

using ParallelDynamicTest = TwoThreadsTest;

// Waits for `done` to hold, polling; false after a minute, which only turns
// a hang into a failure (the other thread needs microseconds).
template <typename Done>
bool WaitUntil(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

// How many times each item of [0, n) was passed to fn by `loop`
// (parallel_dynamic or parallel_shares).
template <typename Loop>
std::vector<int> Visits(int64_t n, int64_t chunk, Loop loop) {
  std::vector<std::atomic<int>> counts(static_cast<size_t>(n));
  loop(n, chunk, [&](int64_t begin, int64_t end) {
    EXPECT_LT(begin, end);
    EXPECT_LE(end - begin, std::max<int64_t>(chunk, 1));
    for (int64_t i = begin; i < end; ++i) counts[static_cast<size_t>(i)].fetch_add(1);
  });
  std::vector<int> out;
  out.reserve(counts.size());
  for (const auto& c : counts) out.push_back(c.load());
  return out;
}

TEST_F(ParallelDynamicTest, RunsEveryItemOnce) {
  const auto dynamic = [](int64_t n, int64_t chunk, const auto& fn) {
    parallel_dynamic(n, chunk, fn);
  };
  const auto shares = [](int64_t n, int64_t chunk, const auto& fn) {
    parallel_shares(n, chunk, fn);
  };
  for (int64_t n : {0, 1, 2, 17, 96, 4608}) {
    for (int64_t chunk : {0, 1, 3, 16, 5000}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " chunk=" << chunk);
      EXPECT_EQ(Visits(n, chunk, dynamic), std::vector<int>(static_cast<size_t>(n), 1));
      EXPECT_EQ(Visits(n, chunk, shares), std::vector<int>(static_cast<size_t>(n), 1));
    }
  }
}

TEST_F(ParallelDynamicTest, SharesRunFrontToBackAndASlowThreadsTailGoesToTheOther) {
  ASSERT_EQ(at::get_num_threads(), 2);
  // 16 items, shares [0, 8) and [8, 16). Thread 0 holds its first item until
  // thread 1 has run its own share in order and then taken one of thread
  // 0's items, from the back; thread 0's own items come in order from the
  // front.
  std::vector<int64_t> slow_items, fast_items;
  std::atomic<int> fast_done{0};
  bool waited = false;
  parallel_shares(16, 1, [&](int64_t begin, int64_t) {
    if (at::get_thread_num() == 0) {
      if (slow_items.empty()) waited = WaitUntil([&] { return fast_done.load() >= 9; });
      slow_items.push_back(begin);
    } else {
      fast_items.push_back(begin);
      fast_done.fetch_add(1);
    }
  });
  ASSERT_EQ(slow_items.size() + fast_items.size(), 16u);
  // Thread 0 may not have started before thread 1 took every item.
  if (!slow_items.empty()) EXPECT_TRUE(waited) << "thread 1 never took 9 items";
  EXPECT_LT(slow_items.size(), 8u);
  for (size_t i = 0; i < slow_items.size(); ++i) EXPECT_EQ(slow_items[i], static_cast<int64_t>(i));
  ASSERT_GE(fast_items.size(), 9u);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(fast_items[i], static_cast<int64_t>(8 + i));
  EXPECT_EQ(fast_items[8], 7);  // the slow share's last item
}

TEST_F(ParallelDynamicTest, RunsSeriallyInsideAnotherParallelRegion) {
  // Nested: at::parallel_for runs the inner loop inline on each outer thread.
  std::atomic<int> total{0};
  at::parallel_for(0, 2, 1, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      parallel_dynamic(50, 4,
                       [&](int64_t b, int64_t e) { total.fetch_add(static_cast<int>(e - b)); });
      parallel_shares(50, 4,
                      [&](int64_t b, int64_t e) { total.fetch_add(static_cast<int>(e - b)); });
    }
  });
  EXPECT_EQ(total.load(), 200);
}

TEST_F(ParallelDynamicTest, ASlowThreadLeavesItsShareToTheOther) {
  ASSERT_EQ(at::get_num_threads(), 2);
  // Thread 0 holds its first chunk until the other thread has taken all the
  // rest of the 16; with fixed shares each would take 8.
  std::atomic<int> slow_chunks{0}, fast_chunks{0};
  bool waited = true;
  parallel_dynamic(16, 1, [&](int64_t, int64_t) {
    if (at::get_thread_num() == 0) {
      slow_chunks.fetch_add(1);
      waited = WaitUntil([&] { return slow_chunks.load() + fast_chunks.load() == 16; }) && waited;
    } else {
      fast_chunks.fetch_add(1);
    }
  });
  EXPECT_TRUE(waited) << "the other thread did not take the remaining chunks";
  EXPECT_EQ(slow_chunks.load() + fast_chunks.load(), 16);
  EXPECT_LE(slow_chunks.load(), 1);
}

TEST_F(ParallelDynamicTest, ChunkForGivesEachThreadSeveralChunks) {
  EXPECT_EQ(chunk_for(4608), 4608 / 16);
  EXPECT_EQ(chunk_for(96), 6);
  EXPECT_EQ(chunk_for(5), 1);  // never 0
  EXPECT_EQ(chunk_for(0), 1);
}

}  // namespace
}  // namespace snapserve::kernels::cpu
