#include "engine/kv/prefix_cache.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

namespace snapserve::kv {
namespace {

constexpr int64_t kLayers = 2, kHeads = 2, kDim = 4, kChunk = 4;

PrefixCacheConfig SmallConfig(int64_t capacity, uint64_t fingerprint = 7) {
  PrefixCacheConfig c;
  c.num_layers = kLayers;
  c.num_kv_heads = kHeads;
  c.head_dim = kDim;
  c.chunk_tokens = kChunk;
  c.capacity_chunks = capacity;
  c.fingerprint = fingerprint;
  return c;
}

std::unique_ptr<PrefixCache> MakeCache(int64_t capacity, uint64_t fingerprint = 7) {
  auto cache = PrefixCache::Create(SmallConfig(capacity, fingerprint));
  EXPECT_TRUE(cache.ok()) << cache.status().ToString();
  return std::move(*cache);
}

std::vector<int32_t> Tokens(int64_t n, int32_t first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

// Per-layer K/V of a prompt as the model would hand them over: [Hkv, n, D],
// every value distinct (layer, position and a tag for K or V).
std::vector<at::Tensor> PromptKv(int64_t n, float tag) {
  std::vector<at::Tensor> layers;
  for (int64_t l = 0; l < kLayers; ++l) {
    layers.push_back(at::arange(kHeads * n * kDim, at::kFloat).view({kHeads, n, kDim}) +
                     1000.f * static_cast<float>(l) + tag);
  }
  return layers;
}

// Inserts every full chunk of `tokens` the way a prompt's last chunk does.
void InsertPrompt(PrefixCache& cache, int64_t owner, const std::vector<int32_t>& tokens,
                  float tag = 0.f) {
  const auto n = static_cast<int64_t>(tokens.size());
  const std::vector<at::Tensor> k = PromptKv(n, tag), v = PromptKv(n, tag + 0.5f);
  cache.BeginInsert(owner, tokens, cache.ChainHashes(tokens));
  for (int64_t l = 0; l < kLayers; ++l) cache.WriteLayer(owner, l, k[l], v[l]);
  cache.CommitInsert(owner);
}

TEST(PrefixCacheTest, ChainHashesNameAChunkByEverythingBeforeIt) {
  auto cache = MakeCache(4);
  std::vector<int32_t> a = Tokens(11, 0);  // two full chunks and 3 tokens
  const std::vector<uint64_t> ha = cache->ChainHashes(a);
  ASSERT_EQ(ha.size(), 2u);
  // A longer prompt with the same start: the same names for the same chunks.
  const std::vector<uint64_t> longer = cache->ChainHashes(Tokens(16, 0));
  ASSERT_EQ(longer.size(), 4u);
  EXPECT_EQ(longer[0], ha[0]);
  EXPECT_EQ(longer[1], ha[1]);
  // A change in the first chunk renames every later chunk, though their
  // tokens are the same.
  std::vector<int32_t> b = a;
  b[0] = 99;
  const std::vector<uint64_t> hb = cache->ChainHashes(b);
  EXPECT_NE(hb[0], ha[0]);
  EXPECT_NE(hb[1], ha[1]);
  // Another model fingerprint names the same tokens differently.
  auto other = MakeCache(4, /*fingerprint=*/8);
  EXPECT_NE(other->ChainHashes(a)[0], ha[0]);
  EXPECT_EQ(StableHash("snapserve"), StableHash("snapserve"));
  EXPECT_NE(StableHash("snapserve"), StableHash("snapservE"));
}

TEST(PrefixCacheTest, CopiesOutExactlyTheRowsItWasGiven) {
  auto cache = MakeCache(4);
  const std::vector<int32_t> prompt = Tokens(10, 0);
  InsertPrompt(*cache, /*owner=*/1, prompt);
  EXPECT_EQ(cache->num_entries(), 2);

  // A second prompt sharing the first 9 tokens: both full chunks match.
  std::vector<int32_t> second = Tokens(13, 0);
  second[9] = 500;
  const std::vector<uint64_t> hashes = cache->ChainHashes(second);
  ASSERT_EQ(cache->CachedChunks(second, hashes, 3), 2);
  EXPECT_EQ(cache->CachedChunks(second, hashes, 1), 1);  // bounded by the caller

  std::vector<at::Tensor> keys, values;
  for (int64_t l = 0; l < kLayers; ++l) {
    keys.push_back(at::zeros({kHeads, 13, kDim}));
    values.push_back(at::zeros({kHeads, 13, kDim}));
  }
  cache->CopyOut(hashes, 2, keys, values);
  const std::vector<at::Tensor> want_k = PromptKv(10, 0.f), want_v = PromptKv(10, 0.5f);
  for (int64_t l = 0; l < kLayers; ++l) {
    EXPECT_TRUE(at::equal(keys[l].narrow(1, 0, 8), want_k[l].narrow(1, 0, 8)));
    EXPECT_TRUE(at::equal(values[l].narrow(1, 0, 8), want_v[l].narrow(1, 0, 8)));
    // Past the cached prefix nothing was written.
    EXPECT_TRUE(at::equal(keys[l].narrow(1, 8, 5), at::zeros({kHeads, 5, kDim})));
  }
}

TEST(PrefixCacheTest, AChunkIsServedOnlyAfterTheSamePrefix) {
  auto cache = MakeCache(4);
  InsertPrompt(*cache, 1, Tokens(8, 0));
  // The second chunk's tokens alone, after another first chunk: no hit.
  std::vector<int32_t> other = Tokens(8, 0);
  other[1] = 77;
  EXPECT_EQ(cache->CachedChunks(other, cache->ChainHashes(other), 2), 0);
  // Names of one prompt presented with another's tokens are refused.
  const std::vector<int32_t> own = Tokens(8, 0);
  EXPECT_EQ(cache->CachedChunks(other, cache->ChainHashes(own), 2), 0);
  EXPECT_EQ(cache->CachedChunks(own, cache->ChainHashes(own), 2), 2);
}

TEST(PrefixCacheTest, EvictsLeastRecentlyUsedAndAChainsFirstChunksLast) {
  auto cache = MakeCache(3);
  const std::vector<int32_t> a = Tokens(8, 0);    // chunks a0, a1
  const std::vector<int32_t> b = Tokens(4, 100);  // chunk b0
  InsertPrompt(*cache, 1, a);
  InsertPrompt(*cache, 2, b);
  EXPECT_EQ(cache->num_free_slots(), 0);
  EXPECT_DOUBLE_EQ(cache->usage_ratio(), 1.0);
  // Using a makes b the least recent; a's own order is a1 older than a0.
  EXPECT_EQ(cache->CachedChunks(a, cache->ChainHashes(a), 2), 2);
  InsertPrompt(*cache, 3, Tokens(4, 200));
  EXPECT_EQ(cache->evictions(), 1);
  EXPECT_EQ(cache->CachedChunks(b, cache->ChainHashes(b), 1), 0);  // a miss touches nothing
  // Next to go is a's second chunk (older than the new chunk), never its first.
  InsertPrompt(*cache, 4, Tokens(4, 300));
  EXPECT_EQ(cache->CachedChunks(a, cache->ChainHashes(a), 2), 1);
  EXPECT_EQ(cache->num_entries(), 3);
}

TEST(PrefixCacheTest, AbortedAndReplacedInsertionsGiveTheirSlotsBack) {
  auto cache = MakeCache(4);
  const std::vector<int32_t> p = Tokens(12, 0);
  cache->BeginInsert(1, p, cache->ChainHashes(p));
  EXPECT_EQ(cache->num_free_slots(), 1);  // three slots pending
  EXPECT_EQ(cache->num_entries(), 0);     // and nothing visible yet
  cache->AbortInsert(1);
  EXPECT_EQ(cache->num_free_slots(), 4);
  cache->BeginInsert(2, p, cache->ChainHashes(p));
  cache->BeginInsert(2, p, cache->ChainHashes(p));  // replaces, does not leak
  EXPECT_EQ(cache->num_free_slots(), 1);
  cache->AbortInsert(2);
  cache->AbortInsert(2);  // a second abort is a no-op
  EXPECT_EQ(cache->num_free_slots(), 4);
  // Two owners inserting the same chunks: the second commit frees its copy.
  cache->BeginInsert(3, p, cache->ChainHashes(p));
  InsertPrompt(*cache, 4, Tokens(4, 0));
  cache->CommitInsert(3);
  EXPECT_EQ(cache->num_entries(), 3);
  EXPECT_EQ(cache->num_entries() + cache->num_free_slots(), 4);
}

TEST(PrefixCacheTest, RandomTrafficNeverLosesASlot) {
  auto cache = MakeCache(5);
  std::mt19937 rng(1);
  for (int i = 0; i < 400; ++i) {
    const int64_t owner = i % 3;
    const std::vector<int32_t> p =
        Tokens(std::uniform_int_distribution<int64_t>(1, 14)(rng),
               static_cast<int32_t>(std::uniform_int_distribution<int>(0, 3)(rng) * 4));
    cache->BeginInsert(owner, p, cache->ChainHashes(p));
    if (rng() % 3 == 0) {
      cache->AbortInsert(owner);
    } else if (rng() % 2 == 0) {
      for (int64_t l = 0; l < kLayers; ++l) {
        const auto n = static_cast<int64_t>(p.size());
        cache->WriteLayer(owner, l, PromptKv(n, 0)[l], PromptKv(n, 1)[l]);
      }
      cache->CommitInsert(owner);
    }
  }
  for (int64_t owner = 0; owner < 3; ++owner) cache->AbortInsert(owner);
  EXPECT_EQ(cache->num_entries() + cache->num_free_slots(), 5);
  EXPECT_GT(cache->evictions(), 0);
}

TEST(PrefixCacheTest, APinnedChunkIsNotEvicted) {
  auto cache = MakeCache(1);
  const std::vector<int32_t> a = Tokens(4, 0);
  InsertPrompt(*cache, 1, a);
  {
    std::optional<PrefixCache::ChunkHandle> h = cache->Lookup(cache->ChainHashes(a)[0]);
    ASSERT_TRUE(h.has_value());
    EXPECT_EQ(h->k().sizes(), (std::vector<int64_t>{kLayers, kHeads, kChunk, kDim}));
    InsertPrompt(*cache, 2, Tokens(4, 50));  // no slot: skipped
    EXPECT_EQ(cache->CachedChunks(a, cache->ChainHashes(a), 1), 1);
  }
  InsertPrompt(*cache, 2, Tokens(4, 50));  // unpinned now: evicted
  EXPECT_EQ(cache->CachedChunks(a, cache->ChainHashes(a), 1), 0);
  EXPECT_FALSE(cache->Lookup(cache->ChainHashes(a)[0]).has_value());
}

TEST(PrefixCacheTest, InsertChecksTheNameAndShapeOfAChunkFromElsewhere) {
  auto source = MakeCache(2);
  auto target = MakeCache(2);
  const std::vector<int32_t> a = Tokens(4, 0);
  InsertPrompt(*source, 1, a);
  const uint64_t hash = source->ChainHashes(a)[0];
  std::optional<PrefixCache::ChunkHandle> h = source->Lookup(hash);
  ASSERT_TRUE(h.has_value());
  const uint64_t root = SmallConfig(2).fingerprint;
  EXPECT_FALSE(target->Insert(hash + 1, root, a, h->k(), h->v()));    // wrong name
  EXPECT_FALSE(target->Insert(hash, root + 1, a, h->k(), h->v()));    // wrong parent
  EXPECT_FALSE(target->Insert(hash, root, a, h->k()[0], h->v()[0]));  // wrong shape
  ASSERT_TRUE(target->Insert(hash, root, a, h->k(), h->v()));
  ASSERT_EQ(target->CachedChunks(a, target->ChainHashes(a), 1), 1);
  std::optional<PrefixCache::ChunkHandle> copy = target->Lookup(hash);
  EXPECT_TRUE(at::equal(copy->k(), h->k()));
  EXPECT_TRUE(at::equal(copy->v(), h->v()));
}

TEST(PrefixCacheTest, RefusesAMemoryThatHoldsNoChunk) {
  auto cache = PrefixCache::Create(SmallConfig(0));
  ASSERT_FALSE(cache.ok());
  EXPECT_EQ(cache.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace snapserve::kv
