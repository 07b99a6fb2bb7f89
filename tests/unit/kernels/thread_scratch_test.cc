// kernels/cpu/thread_scratch.h: what a thread's slots reuse, and what they hand
// out afresh.
#include "kernels/cpu/thread_scratch.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <thread>

namespace snapserve::kernels::cpu {
namespace {

bool aligned64(const uint8_t* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

TEST(ThreadScratchTest, ASlotsMemoryComesBackOnTheNextCallGrownToTheLargest) {
  const uint8_t* first = nullptr;
  {
    const ThreadScratch a(0, 1000);
    ASSERT_TRUE(a.reused_slot());
    ASSERT_TRUE(aligned64(a.get()));
    std::memset(a.get(), 1, 1000);  // all of it is ours (ASan checks the bounds)
    first = a.get();
  }
  {
    const ThreadScratch again(0, 1000);
    EXPECT_EQ(again.get(), first);
  }
  const uint8_t* grown = nullptr;
  {
    const ThreadScratch big(0, 100000);
    EXPECT_TRUE(big.reused_slot());
    std::memset(big.get(), 2, 100000);
    grown = big.get();
  }
  const ThreadScratch small(0, 10);
  EXPECT_EQ(small.get(), grown);  // the slot kept its largest size
}

TEST(ThreadScratchTest, ARequestOverTheBoundGetsItsOwnMemory) {
  {
    const ThreadScratch huge(0, kThreadScratchKeptBytes + 1);
    EXPECT_FALSE(huge.reused_slot());
    EXPECT_TRUE(aligned64(huge.get()));
    std::memset(huge.get(), 3, static_cast<size_t>(kThreadScratchKeptBytes + 1));
  }
  const ThreadScratch at_the_bound(0, kThreadScratchKeptBytes);
  EXPECT_TRUE(at_the_bound.reused_slot());
}

TEST(ThreadScratchTest, ASlotInUseGetsItsOwnMemory) {
  const ThreadScratch outer(0, 4096);
  const ThreadScratch nested(0, 4096);
  EXPECT_TRUE(outer.reused_slot());
  EXPECT_FALSE(nested.reused_slot());
  EXPECT_NE(nested.get(), outer.get());
  EXPECT_TRUE(aligned64(nested.get()));
  const ThreadScratch other_slot(1, 4096);
  EXPECT_TRUE(other_slot.reused_slot());
  EXPECT_NE(other_slot.get(), outer.get());
}

TEST(ThreadScratchTest, EachThreadHasItsOwnSlots) {
  const ThreadScratch mine(0, 512);
  const uint8_t* theirs = nullptr;
  bool reused = false;
  std::thread([&] {
    const ThreadScratch s(0, 512);
    theirs = s.get();
    reused = s.reused_slot();
  }).join();
  EXPECT_TRUE(reused);  // the slot was free on that thread
  EXPECT_NE(theirs, mine.get());
}

TEST(ThreadScratchTest, RejectsASlotOutOfRange) {
  EXPECT_THROW(ThreadScratch(kThreadScratchSlots, 8), c10::Error);
  EXPECT_THROW(ThreadScratch(-1, 8), c10::Error);
}

}  // namespace
}  // namespace snapserve::kernels::cpu
