#include "engine/kv/block_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

namespace snapserve::kv {
namespace {

TEST(BlockPoolTest, AllocatesEveryBlockOnceThenFreesAll) {
  BlockPool pool(8);
  EXPECT_EQ(pool.num_total(), 8);
  EXPECT_EQ(pool.num_free(), 8);
  auto a = pool.Allocate(5);
  ASSERT_TRUE(a.ok());
  auto b = pool.Allocate(3);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(pool.num_free(), 0);
  std::set<int32_t> ids(a->begin(), a->end());
  ids.insert(b->begin(), b->end());
  EXPECT_EQ(ids, (std::set<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_TRUE(pool.Free(*a).ok());
  EXPECT_TRUE(pool.Free(*b).ok());
  EXPECT_EQ(pool.num_free(), 8);
}

TEST(BlockPoolTest, ExhaustionIsResourceExhaustedAndAllOrNothing) {
  BlockPool pool(4);
  auto a = pool.Allocate(3);
  ASSERT_TRUE(a.ok());
  auto b = pool.Allocate(2);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.num_free(), 1);  // nothing taken by the failed call
  EXPECT_TRUE(pool.Allocate(1).ok());
}

TEST(BlockPoolTest, ZeroAndNegativeCounts) {
  BlockPool pool(2);
  auto none = pool.Allocate(0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  EXPECT_EQ(pool.Allocate(-1).status().code(), StatusCode::kInvalidArgument);
}

TEST(BlockPoolTest, DoubleFreeIsDetectedAndChangesNothing) {
  BlockPool pool(4);
  auto a = pool.Allocate(2);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(pool.Free(*a).ok());
  const Status st = pool.Free(*a);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("double free"), std::string::npos);
  EXPECT_EQ(pool.num_free(), 4);
}

TEST(BlockPoolTest, DuplicateInOneCallFreesNothing) {
  BlockPool pool(4);
  auto a = pool.Allocate(2);
  ASSERT_TRUE(a.ok());
  const std::vector<int32_t> twice = {(*a)[0], (*a)[1], (*a)[0]};
  EXPECT_FALSE(pool.Free(twice).ok());
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_TRUE(pool.is_allocated((*a)[0]));
  EXPECT_TRUE(pool.is_allocated((*a)[1]));
  EXPECT_TRUE(pool.Free(*a).ok());
}

TEST(BlockPoolTest, ForeignBlockIsDetected) {
  BlockPool pool(4);
  auto a = pool.Allocate(1);
  ASSERT_TRUE(a.ok());
  for (int32_t bad : {-1, 4, 1000}) {
    const Status st = pool.Free({(*a)[0], bad});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("does not belong"), std::string::npos);
  }
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_TRUE(pool.is_allocated((*a)[0]));
}

TEST(BlockPoolTest, BudgetArithmetic) {
  // SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64, float32, 16-token blocks.
  const int64_t per_block = BlockPool::BytesPerBlock(30, 3, 16, 64, 4);
  EXPECT_EQ(per_block, 2 * 30 * 3 * 16 * 64 * 4);
  EXPECT_EQ(BlockPool::BlocksForBudget(per_block * 10 + per_block - 1, per_block), 10);
  EXPECT_EQ(BlockPool::BlocksForBudget(per_block - 1, per_block), 0);
  EXPECT_EQ(BlockPool::BlocksForBudget(0, per_block), 0);
}

TEST(BlockPoolTest, RandomMixLeavesEveryBlockFree) {
  BlockPool pool(64);
  std::mt19937 rng(7);
  std::map<int, std::vector<int32_t>> owners;
  int next = 0;
  for (int step = 0; step < 5000; ++step) {
    if (owners.empty() || rng() % 2 == 0) {
      const int64_t n = rng() % 10;
      auto blocks = pool.Allocate(n);
      if (blocks.ok()) {
        owners[next++] = *blocks;
      } else {
        EXPECT_EQ(blocks.status().code(), StatusCode::kResourceExhausted);
        EXPECT_LT(pool.num_free(), n);
      }
    } else {
      auto it = owners.begin();
      std::advance(it, rng() % owners.size());
      ASSERT_TRUE(pool.Free(it->second).ok());
      owners.erase(it);
    }
    int64_t held = 0;
    for (const auto& [id, blocks] : owners) held += static_cast<int64_t>(blocks.size());
    ASSERT_EQ(held + pool.num_free(), pool.num_total());
  }
  for (const auto& [id, blocks] : owners) ASSERT_TRUE(pool.Free(blocks).ok());
  EXPECT_EQ(pool.num_free(), pool.num_total());
  for (int32_t b = 0; b < pool.num_total(); ++b) EXPECT_FALSE(pool.is_allocated(b));
}

}  // namespace
}  // namespace snapserve::kv
