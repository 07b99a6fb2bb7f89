#include "engine/kv/block_table.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

namespace snapserve::kv {
namespace {

TEST(BlockTableTest, SlotsFollowBlockIds) {
  BlockPool pool(8);
  // Take some blocks first so the table's ids are not 0, 1, 2.
  auto other = pool.Allocate(3);
  ASSERT_TRUE(other.ok());
  BlockTable table(4);
  ASSERT_TRUE(table.EnsureCapacity(10, pool).ok());
  ASSERT_EQ(table.block_ids().size(), 3u);
  EXPECT_EQ(table.capacity(), 12);
  for (int64_t t = 0; t < 12; ++t) {
    const Slot s = table.slot(t);
    EXPECT_EQ(s.block, table.block_ids()[t / 4]);
    EXPECT_EQ(s.offset, t % 4);
    EXPECT_EQ(table.slot_index(t), int64_t{s.block} * 4 + s.offset);
  }
  EXPECT_THROW(table.slot(12), c10::Error);
  EXPECT_THROW(table.slot(-1), c10::Error);
}

TEST(BlockTableTest, EnsureCapacityGrowsOnlyWhenNeeded) {
  BlockPool pool(8);
  BlockTable table(16);
  ASSERT_TRUE(table.EnsureCapacity(0, pool).ok());
  EXPECT_TRUE(table.block_ids().empty());
  ASSERT_TRUE(table.EnsureCapacity(16, pool).ok());
  EXPECT_EQ(table.block_ids().size(), 1u);
  ASSERT_TRUE(table.EnsureCapacity(5, pool).ok());  // never shrinks
  EXPECT_EQ(table.block_ids().size(), 1u);
  ASSERT_TRUE(table.EnsureCapacity(17, pool).ok());
  EXPECT_EQ(table.block_ids().size(), 2u);
  EXPECT_EQ(pool.num_free(), 6);
}

TEST(BlockTableTest, ExhaustionLeavesTableUnchanged) {
  BlockPool pool(2);
  BlockTable table(4);
  ASSERT_TRUE(table.EnsureCapacity(4, pool).ok());
  const Status st = table.EnsureCapacity(13, pool);  // needs 4 blocks, 3 more
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(table.block_ids().size(), 1u);
  EXPECT_EQ(pool.num_free(), 1);
}

TEST(BlockTableTest, TokenCountAndRelease) {
  BlockPool pool(4);
  BlockTable table(4);
  ASSERT_TRUE(table.EnsureCapacity(8, pool).ok());
  table.set_num_tokens(7);
  EXPECT_EQ(table.num_tokens(), 7);
  EXPECT_THROW(table.set_num_tokens(9), c10::Error);
  ASSERT_TRUE(table.Release(pool).ok());
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_EQ(table.num_tokens(), 0);
  EXPECT_TRUE(table.block_ids().empty());
}

TEST(BlockTableTest, BlocksFor) {
  EXPECT_EQ(BlockTable::BlocksFor(0, 16), 0);
  EXPECT_EQ(BlockTable::BlocksFor(1, 16), 1);
  EXPECT_EQ(BlockTable::BlocksFor(16, 16), 1);
  EXPECT_EQ(BlockTable::BlocksFor(17, 16), 2);
}

}  // namespace
}  // namespace snapserve::kv
