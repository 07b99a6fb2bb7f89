#include "engine/kv/document_cache.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace snapserve::kv {
namespace {

constexpr int64_t kHeads = 2, kDim = 4;

// A document of `layers` layers keeping `m` float32 entries per KV head:
// 2 * layers * kHeads * m * kDim * 4 bytes.
CompressedDocument Document(std::vector<int32_t> tokens, const std::string& settings,
                            int64_t layers, int64_t m, float tag = 0) {
  CompressedDocument d;
  d.tokens = std::move(tokens);
  d.settings = settings;
  for (int64_t l = 0; l < layers; ++l) {
    d.layers.push_back({at::full({kHeads, m, kDim}, tag + static_cast<float>(l)),
                        at::full({kHeads, m, kDim}, -tag),
                        {}});
  }
  return d;
}

constexpr int64_t kBytes = 2 * 2 * kHeads * 8 * kDim * 4;  // 2 layers, m = 8

TEST(DocumentCacheTest, FindsOnlyTheSameTokensAndSettings) {
  DocumentCache cache(10 * kBytes);
  ASSERT_TRUE(cache.Insert(Document({1, 2, 3}, "keydiff|C=8", 2, 8, 5)));
  const auto hit = cache.Lookup(std::vector<int32_t>{1, 2, 3}, "keydiff|C=8");
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(hit->bytes, kBytes);
  EXPECT_EQ(hit->entries, 2 * kHeads * 8);
  EXPECT_TRUE(at::equal(hit->layers[1].k, at::full({kHeads, 8, kDim}, 6.f)));
  EXPECT_EQ(cache.Lookup(std::vector<int32_t>{1, 2, 4}, "keydiff|C=8"), nullptr);
  EXPECT_EQ(cache.Lookup(std::vector<int32_t>{1, 2, 3}, "keydiff|C=9"), nullptr);
  EXPECT_EQ(cache.Lookup(std::vector<int32_t>{1, 2}, "keydiff|C=8"), nullptr);
}

TEST(DocumentCacheTest, EvictsLeastRecentlyUsedWithinItsBytes) {
  DocumentCache cache(2 * kBytes);
  ASSERT_TRUE(cache.Insert(Document({1}, "s", 2, 8)));
  ASSERT_TRUE(cache.Insert(Document({2}, "s", 2, 8)));
  ASSERT_NE(cache.Lookup(std::vector<int32_t>{1}, "s"), nullptr);  // {2} is now the oldest
  ASSERT_TRUE(cache.Insert(Document({3}, "s", 2, 8)));
  EXPECT_EQ(cache.num_entries(), 2);
  EXPECT_EQ(cache.bytes_used(), 2 * kBytes);
  EXPECT_EQ(cache.evictions(), 1);
  EXPECT_NE(cache.Lookup(std::vector<int32_t>{1}, "s"), nullptr);
  EXPECT_EQ(cache.Lookup(std::vector<int32_t>{2}, "s"), nullptr);
  EXPECT_NE(cache.Lookup(std::vector<int32_t>{3}, "s"), nullptr);
}

TEST(DocumentCacheTest, RefusesAnEntryLargerThanTheCache) {
  DocumentCache cache(kBytes);
  ASSERT_TRUE(cache.Insert(Document({1}, "s", 2, 8)));
  EXPECT_FALSE(cache.Insert(Document({2}, "s", 2, 9)));
  EXPECT_EQ(cache.num_entries(), 1);  // nothing evicted for it
  EXPECT_EQ(cache.bytes_used(), kBytes);
}

TEST(DocumentCacheTest, ReplacingAnEntryKeepsTheBytesRight) {
  DocumentCache cache(3 * kBytes);
  ASSERT_TRUE(cache.Insert(Document({1}, "s", 2, 8, 1)));
  ASSERT_TRUE(cache.Insert(Document({1}, "s", 2, 8, 2)));
  EXPECT_EQ(cache.num_entries(), 1);
  EXPECT_EQ(cache.bytes_used(), kBytes);
  EXPECT_TRUE(at::equal(cache.Lookup(std::vector<int32_t>{1}, "s")->layers[0].k,
                        at::full({kHeads, 8, kDim}, 2.f)));
}

TEST(DocumentCacheTest, AnEntryInUseOutlivesItsEviction) {
  DocumentCache cache(kBytes);
  ASSERT_TRUE(cache.Insert(Document({1}, "s", 2, 8, 3)));
  const auto held = cache.Lookup(std::vector<int32_t>{1}, "s");
  ASSERT_TRUE(cache.Insert(Document({2}, "s", 2, 8)));
  EXPECT_EQ(cache.Lookup(std::vector<int32_t>{1}, "s"), nullptr);
  EXPECT_EQ(cache.bytes_used(), kBytes);
  EXPECT_TRUE(at::equal(held->layers[0].k, at::full({kHeads, 8, kDim}, 3.f)));
}

TEST(DocumentCacheTest, CountsAdaptiveHeadLengths) {
  DocumentCache cache(10 * kBytes);
  CompressedDocument d = Document({1}, "adakv", 1, 8);
  d.layers[0].head_lengths = {3, 8};
  ASSERT_TRUE(cache.Insert(std::move(d)));
  EXPECT_EQ(cache.Lookup(std::vector<int32_t>{1}, "adakv")->entries, 11);
}

}  // namespace
}  // namespace snapserve::kv
