// PagedKvCache against DenseKvStore (the model helper's contiguous store) as
// the oracle: the same prefill and decode calls must give the same attention.
#include "engine/kv/paged_kv_cache.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "engine/model/dense_kv_store.h"

namespace snapserve::kv {
namespace {

constexpr int64_t kLayers = 3, kHeads = 6, kKvHeads = 2, kDim = 8;

PagedKvCacheConfig SmallConfig(int32_t num_blocks, int32_t block_size = 4) {
  PagedKvCacheConfig c;
  c.num_layers = kLayers;
  c.num_kv_heads = kKvHeads;
  c.head_dim = kDim;
  c.block_size = block_size;
  c.num_blocks = num_blocks;
  return c;
}

std::unique_ptr<PagedKvCache> MakeCache(int32_t num_blocks, int32_t block_size = 4) {
  auto cache = PagedKvCache::Create(SmallConfig(num_blocks, block_size));
  EXPECT_TRUE(cache.ok()) << cache.status().ToString();
  return std::move(cache).value();
}

void Prefill(model::KvStore& store, int64_t seq, int64_t n, uint64_t seed) {
  at::manual_seed(seed);
  for (int64_t l = 0; l < kLayers; ++l) {
    store.StorePrefillLayer(seq, l, at::randn({kHeads, n, kDim}), at::randn({kKvHeads, n, kDim}),
                            at::randn({kKvHeads, n, kDim}));
  }
}

TEST(PagedKvCacheTest, MatchesDenseStoreOverPrefillAndBatchedDecode) {
  auto paged = MakeCache(64);
  model::DenseKvStore dense(kLayers);
  const std::map<int64_t, int64_t> prompts = {{10, 5}, {11, 1}, {12, 13}};
  for (const auto& [seq, n] : prompts) {
    ASSERT_TRUE(paged->AddSequence(seq, n + 4).ok());
    Prefill(*paged, seq, n, 100 + seq);
    Prefill(dense, seq, n, 100 + seq);
    EXPECT_EQ(paged->num_tokens(seq), n);
  }
  // Steps with changing batch composition; growth past the reservation too.
  const std::vector<std::vector<int64_t>> steps = {{10, 11, 12}, {12, 10},     {11}, {10, 11, 12},
                                                   {10, 11, 12}, {12, 11, 10}, {10}, {10}};
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& seqs = steps[i];
    const int64_t b = static_cast<int64_t>(seqs.size());
    paged->BeginDecodeStep(seqs);
    dense.BeginDecodeStep(seqs);
    for (int64_t l = 0; l < kLayers; ++l) {
      const at::Tensor q = at::randn({b, kHeads, kDim});
      const at::Tensor k = at::randn({b, kKvHeads, kDim});
      const at::Tensor v = at::randn({b, kKvHeads, kDim});
      const at::Tensor got = paged->DecodeAttention(seqs, l, q, k, v);
      const at::Tensor want = dense.DecodeAttention(seqs, l, q, k, v);
      ASSERT_TRUE(at::allclose(got, want, 1e-5, 1e-5)) << "step " << i << " layer " << l;
    }
    paged->EndDecodeStep();
    dense.EndDecodeStep();
  }
  EXPECT_EQ(paged->num_tokens(10), 5 + 7);
  EXPECT_EQ(paged->num_tokens(11), 1 + 5);
  for (int64_t l = 0; l < kLayers; ++l) {
    auto [pk, pv] = paged->Gather(12, l);
    auto [dk, dv] = dense.Entries(12, l);
    EXPECT_TRUE(at::equal(pk, dk));
    EXPECT_TRUE(at::equal(pv, dv));
  }
}

TEST(PagedKvCacheTest, SelectorDecidesWhatIsCached) {
  auto cache = MakeCache(16);
  // Keep the even positions only, as a stand-in for SnapKV.
  KvSelector every_other = [](int64_t, const at::Tensor&, const at::Tensor& k,
                              const at::Tensor& v) {
    const at::Tensor idx = at::arange(0, k.size(1), 2);
    return std::make_pair(k.index_select(1, idx), v.index_select(1, idx));
  };
  ASSERT_TRUE(cache->AddSequence(1, 4, every_other).ok());
  at::manual_seed(3);
  std::vector<at::Tensor> ks;
  for (int64_t l = 0; l < kLayers; ++l) {
    ks.push_back(at::randn({kKvHeads, 9, kDim}));
    cache->StorePrefillLayer(1, l, at::randn({kHeads, 9, kDim}), ks.back(), ks.back() * 2);
  }
  EXPECT_EQ(cache->num_tokens(1), 5);
  for (int64_t l = 0; l < kLayers; ++l) {
    auto [k, v] = cache->Gather(1, l);
    const at::Tensor want = ks[l].index_select(1, at::arange(0, 9, 2));
    EXPECT_TRUE(at::equal(k, want));
    EXPECT_TRUE(at::equal(v, want * 2));
  }
}

TEST(PagedKvCacheTest, LayersMustKeepTheSameCount) {
  auto cache = MakeCache(16);
  int calls = 0;
  ASSERT_TRUE(cache
                  ->AddSequence(1, 8,
                                [&calls](int64_t, const at::Tensor&, const at::Tensor& k,
                                         const at::Tensor& v) {
                                  const int64_t m = calls++ == 0 ? 3 : 2;
                                  return std::make_pair(k.narrow(1, 0, m), v.narrow(1, 0, m));
                                })
                  .ok());
  const at::Tensor q = at::randn({kHeads, 4, kDim}), k = at::randn({kKvHeads, 4, kDim});
  cache->StorePrefillLayer(1, 0, q, k, k);
  EXPECT_THROW(cache->StorePrefillLayer(1, 1, q, k, k), c10::Error);
}

TEST(PagedKvCacheTest, ReservationAccountingAndRemoval) {
  auto cache = MakeCache(10, 4);
  EXPECT_EQ(cache->num_free_blocks(), 10);
  ASSERT_TRUE(cache->AddSequence(1, 9).ok());  // 3 blocks
  EXPECT_EQ(cache->num_free_blocks(), 7);
  EXPECT_DOUBLE_EQ(cache->usage_ratio(), 0.3);
  EXPECT_EQ(cache->AddSequence(1, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(cache->CanReserve(28));
  EXPECT_FALSE(cache->CanReserve(29));
  EXPECT_EQ(cache->AddSequence(2, 29).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(cache->num_free_blocks(), 7);  // the failed add took nothing
  EXPECT_FALSE(cache->CanEverFit(41));
  EXPECT_EQ(cache->AddSequence(3, 41).code(), StatusCode::kResourceExhausted);
  cache->RemoveSequence(1);
  cache->RemoveSequence(1);  // unknown now: ignored
  EXPECT_EQ(cache->num_free_blocks(), 10);
  EXPECT_DOUBLE_EQ(cache->usage_ratio(), 0.0);
}

TEST(PagedKvCacheTest, DecodeBeyondThePoolThrows) {
  auto cache = MakeCache(1, 4);
  ASSERT_TRUE(cache->AddSequence(1, 4).ok());
  Prefill(*cache, 1, 4, 1);
  EXPECT_THROW(cache->BeginDecodeStep({1}), c10::Error);
}

TEST(PagedKvCacheTest, DecodeLayersRunInsideOneExplicitStep) {
  auto cache = MakeCache(8);
  ASSERT_TRUE(cache->AddSequence(1, 4).ok());
  ASSERT_TRUE(cache->AddSequence(2, 4).ok());
  Prefill(*cache, 1, 2, 1);
  Prefill(*cache, 2, 2, 2);
  const at::Tensor q = at::randn({1, kHeads, kDim}), k = at::randn({1, kKvHeads, kDim});
  // No step begun: refused.
  EXPECT_THROW(cache->DecodeAttention({1}, 0, q, k, k), c10::Error);
  cache->BeginDecodeStep({1});
  EXPECT_THROW(cache->DecodeAttention({1}, 1, q, k, k), c10::Error);  // layer 0 first
  cache->DecodeAttention({1}, 0, q, k, k);
  EXPECT_THROW(cache->DecodeAttention({2}, 1, q, k, k), c10::Error);  // other sequences
  EXPECT_THROW(cache->EndDecodeStep(), c10::Error);                   // layers left
  EXPECT_EQ(cache->num_tokens(1), 2);
  // An abandoned step commits nothing; the next one starts over.
  cache->BeginDecodeStep({1, 2});
  const at::Tensor q2 = at::randn({2, kHeads, kDim}), k2 = at::randn({2, kKvHeads, kDim});
  for (int64_t l = 0; l < kLayers; ++l) cache->DecodeAttention({1, 2}, l, q2, k2, k2);
  cache->EndDecodeStep();
  EXPECT_EQ(cache->num_tokens(1), 3);
  EXPECT_EQ(cache->num_tokens(2), 3);
}

TEST(PagedKvCacheTest, BudgetAndBadConfigs) {
  PagedKvCacheConfig c = SmallConfig(0);
  const int64_t per_block = 2 * kLayers * kKvHeads * 4 * kDim * 4;
  EXPECT_EQ(PagedKvCache::NumBlocksForBudget(c, per_block * 7), 7);
  EXPECT_EQ(PagedKvCache::Create(c).status().code(), StatusCode::kResourceExhausted);
  c.num_blocks = 4;
  c.head_dim = 0;
  EXPECT_EQ(PagedKvCache::Create(c).status().code(), StatusCode::kInvalidArgument);
}

TEST(PagedKvCacheTest, RandomAddRemoveLeavesEveryBlockFree) {
  auto cache = MakeCache(32, 4);
  std::mt19937 rng(11);
  std::vector<int64_t> live;
  int64_t next = 0;
  for (int step = 0; step < 300; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      const int64_t tokens = 1 + rng() % 24;
      if (cache->AddSequence(next, tokens).ok()) {
        Prefill(*cache, next, 1 + rng() % tokens, step);
        live.push_back(next);
      }
      ++next;
    } else {
      const size_t i = rng() % live.size();
      cache->RemoveSequence(live[i]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  for (int64_t seq : live) cache->RemoveSequence(seq);
  EXPECT_EQ(cache->num_free_blocks(), 32);
}

}  // namespace
}  // namespace snapserve::kv
