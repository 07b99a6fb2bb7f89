// PagedKvCache against DenseKvStore (the model helper's contiguous store) as
// the oracle: the same prefill and decode calls must give the same attention;
// lanes of different lengths (PyramidKV, AdaKV) against attention written out
// densely here.
#include "engine/kv/paged_kv_cache.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>

#include "engine/model/dense_kv_store.h"

namespace snapserve::kv {
namespace {

constexpr int64_t kLayers = 3, kHeads = 6, kKvHeads = 2, kDim = 8;
constexpr int32_t kLanes = kLayers * kKvHeads;  // blocks one token takes in every lane

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
  auto paged = MakeCache(64 * kLanes);
  model::DenseKvStore dense(kLayers);
  const std::map<int64_t, int64_t> prompts = {{10, 5}, {11, 1}, {12, 13}};
  for (const auto& [seq, n] : prompts) {
    ASSERT_TRUE(paged->AddSequence(seq, paged->BlocksForUniform(n + 4)).ok());
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

// Mistral's sliding window: each lane a ring of W entries. DenseKvStore
// (the last W entries of a contiguous cache) is the oracle; W = 6 is not a
// multiple of the block size, and the prompts are shorter than, equal to and
// longer than the window.
TEST(PagedKvCacheTest, SlidingWindowAttendsOverTheLastEntriesOnly) {
  constexpr int64_t kWindow = 6;
  constexpr int32_t kBlock = 4;
  PagedKvCacheConfig config = SmallConfig(64 * kLanes, kBlock);
  config.sliding_window = kWindow;
  auto created = PagedKvCache::Create(config);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  PagedKvCache& paged = **created;
  model::DenseKvStore dense(kLayers, kWindow);
  const std::map<int64_t, int64_t> prompts = {{1, 3}, {2, 6}, {3, 13}};
  for (const auto& [seq, n] : prompts) {
    // A lane never needs more than the window's blocks, however long the request.
    EXPECT_EQ(paged.BlocksForUniform(n + 100), kLanes * 2);
    ASSERT_TRUE(paged.AddSequence(seq, paged.BlocksForUniform(n + 100)).ok());
    Prefill(paged, seq, n, 200 + seq);
    Prefill(dense, seq, n, 200 + seq);
    EXPECT_EQ(paged.num_tokens(seq), std::min(n, kWindow));
  }
  const std::vector<int64_t> all = {1, 2, 3};
  for (int step = 0; step < 9; ++step) {
    paged.BeginDecodeStep(all);
    dense.BeginDecodeStep(all);
    for (int64_t l = 0; l < kLayers; ++l) {
      const at::Tensor q = at::randn({3, kHeads, kDim});
      const at::Tensor k = at::randn({3, kKvHeads, kDim});
      const at::Tensor v = at::randn({3, kKvHeads, kDim});
      const at::Tensor got = paged.DecodeAttention(all, l, q, k, v);
      const at::Tensor want = dense.DecodeAttention(all, l, q, k, v);
      ASSERT_TRUE(at::allclose(got, want, 1e-5, 1e-5)) << "step " << step << " layer " << l;
    }
    paged.EndDecodeStep();
    dense.EndDecodeStep();
  }
  for (const auto& [seq, n] : prompts) {
    EXPECT_EQ(paged.num_tokens(seq), kWindow);
    EXPECT_EQ(paged.bytes_held(seq), kLanes * 2 * PagedKvCache::BytesPerBlock(config));
  }
  for (int64_t seq : all) paged.RemoveSequence(seq);
  EXPECT_EQ(paged.num_free_blocks(), 64 * kLanes);
  config.sliding_window = -1;
  EXPECT_FALSE(PagedKvCache::Create(config).ok());
}

TEST(PagedKvCacheTest, SelectorDecidesWhatIsCached) {
  auto cache = MakeCache(16 * kLanes);
  // Keep the even positions only, as a stand-in for SnapKV.
  KvSelector every_other = [](int64_t, const at::Tensor&, const at::Tensor& k,
                              const at::Tensor& v) {
    const at::Tensor idx = at::arange(0, k.size(1), 2);
    return KeptKv{k.index_select(1, idx), v.index_select(1, idx), {}};
  };
  ASSERT_TRUE(cache->AddSequence(1, cache->BlocksForUniform(4), every_other).ok());
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

// softmax(q K^T / sqrt(d)) V for the query heads [G, d] of one KV head,
// written out in float64.
at::Tensor DenseAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const at::Tensor scores =
      at::matmul(q.to(at::kDouble), k.to(at::kDouble).t()) / std::sqrt(static_cast<double>(kDim));
  return at::matmul(at::softmax(scores, -1), v.to(at::kDouble)).to(at::kFloat);
}

// PyramidKV keeps fewer entries in deeper layers, AdaKV different counts per
// head: every lane holds exactly its own count, decode attends over each
// lane's own entries, and only the blocks those counts need are taken.
TEST(PagedKvCacheTest, LayersAndHeadsKeepTheirOwnCounts) {
  constexpr int32_t kBlock = 4;
  auto cache = MakeCache(64, kBlock);
  // layer 0: 7 per head; layer 1: 3 per head; layer 2: head 0 keeps 1, head 1 keeps 6.
  const std::vector<std::vector<int64_t>> counts = {{7, 7}, {3, 3}, {1, 6}};
  KvSelector uneven = [&counts](int64_t layer, const at::Tensor&, const at::Tensor& k,
                                const at::Tensor& v) {
    const auto& c = counts[static_cast<size_t>(layer)];
    const int64_t m = std::max(c[0], c[1]);
    std::vector<int64_t> lengths = c;
    if (c[0] == c[1]) lengths.clear();  // the uniform form
    return KeptKv{k.narrow(1, 0, m), v.narrow(1, 0, m), lengths};
  };
  const LaneReservation need{{7 + 2, 3 + 2, (1 + 6) / 2 + 2}, /*heads_share=*/true};
  ASSERT_TRUE(cache->AddSequence(1, cache->BlocksFor(need), uneven).ok());
  at::manual_seed(5);
  std::vector<at::Tensor> ks, vs;
  for (int64_t l = 0; l < kLayers; ++l) {
    ks.push_back(at::randn({kKvHeads, 8, kDim}));
    vs.push_back(at::randn({kKvHeads, 8, kDim}));
    cache->StorePrefillLayer(1, l, at::randn({kHeads, 8, kDim}), ks.back(), vs.back());
  }
  int64_t total = 0, blocks = 0;
  for (int64_t l = 0; l < kLayers; ++l) {
    for (int64_t g = 0; g < kKvHeads; ++g) {
      const int64_t m = counts[static_cast<size_t>(l)][static_cast<size_t>(g)];
      EXPECT_EQ(cache->num_tokens(1, l, g), m) << l << "," << g;
      auto [k, v] = cache->GatherLane(1, l, g);
      EXPECT_TRUE(at::equal(k, ks[l][g].narrow(0, 0, m)));
      EXPECT_TRUE(at::equal(v, vs[l][g].narrow(0, 0, m)));
      total += m;
      blocks += (m + kBlock - 1) / kBlock;
    }
  }
  EXPECT_EQ(cache->total_entries(1), total);
  EXPECT_EQ(cache->bytes_held(1), blocks * PagedKvCache::BytesPerBlock(SmallConfig(0, kBlock)));
  EXPECT_THROW(cache->Gather(1, 2), c10::Error);  // heads of layer 2 differ

  // Two decode steps: each lane attends over its own entries plus the new ones.
  for (int step = 0; step < 2; ++step) {
    cache->BeginDecodeStep({1});
    for (int64_t l = 0; l < kLayers; ++l) {
      const at::Tensor q = at::randn({1, kHeads, kDim});
      const at::Tensor k = at::randn({1, kKvHeads, kDim});
      const at::Tensor v = at::randn({1, kKvHeads, kDim});
      std::vector<std::pair<at::Tensor, at::Tensor>> before;
      for (int64_t g = 0; g < kKvHeads; ++g) before.push_back(cache->GatherLane(1, l, g));
      const at::Tensor got = cache->DecodeAttention({1}, l, q, k, v);
      const int64_t group = kHeads / kKvHeads;
      for (int64_t g = 0; g < kKvHeads; ++g) {
        const at::Tensor all_k = at::cat({before[g].first, k[0][g].unsqueeze(0)});
        const at::Tensor all_v = at::cat({before[g].second, v[0][g].unsqueeze(0)});
        const at::Tensor want = DenseAttention(q[0].narrow(0, g * group, group), all_k, all_v);
        EXPECT_TRUE(at::allclose(got[0].narrow(0, g * group, group), want, 1e-5, 1e-5))
            << "step " << step << " layer " << l << " head " << g;
      }
    }
    cache->EndDecodeStep();
  }
  EXPECT_EQ(cache->num_tokens(1, 2, 0), 1 + 2);
  EXPECT_EQ(cache->num_tokens(1, 2, 1), 6 + 2);
  EXPECT_EQ(cache->num_tokens(1, 0, 1), 7 + 2);
  cache->RemoveSequence(1);
  EXPECT_EQ(cache->num_free_blocks(), 64);
}

// The heads of a layer may split its entries in any way: the shared bound
// covers the worst split.
TEST(PagedKvCacheTest, ReservationBoundsCoverEverySplit) {
  auto cache = MakeCache(100, 4);
  // Uniform: 2 heads * ceil(9 / 4) = 6 blocks per layer.
  EXPECT_EQ(cache->BlocksFor({{9, 9, 9}, false}), 18);
  EXPECT_EQ(cache->BlocksForUniform(9), 18);
  for (int64_t entries = 1; entries <= 12; ++entries) {
    const int64_t bound = cache->BlocksFor({{entries}, /*heads_share=*/true});
    int64_t worst = 0;
    for (int64_t a = 0; a <= 2 * entries; ++a) {
      worst = std::max(worst, (a + 3) / 4 + (2 * entries - a + 3) / 4);
    }
    EXPECT_EQ(bound, worst) << entries << " entries per head";
  }
}

TEST(PagedKvCacheTest, ReservationAccountingAndRemoval) {
  auto cache = MakeCache(10, 4);
  EXPECT_EQ(cache->num_free_blocks(), 10);
  ASSERT_TRUE(cache->AddSequence(1, 3).ok());
  EXPECT_EQ(cache->num_free_blocks(), 7);
  EXPECT_DOUBLE_EQ(cache->usage_ratio(), 0.3);
  EXPECT_EQ(cache->AddSequence(1, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(cache->CanReserve(7));
  EXPECT_FALSE(cache->CanReserve(8));
  EXPECT_EQ(cache->AddSequence(2, 8).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(cache->num_free_blocks(), 7);  // the failed add took nothing
  EXPECT_FALSE(cache->CanEverFit(11));
  EXPECT_EQ(cache->AddSequence(3, 11).code(), StatusCode::kResourceExhausted);
  cache->RemoveSequence(1);
  cache->RemoveSequence(1);  // unknown now: ignored
  EXPECT_EQ(cache->num_free_blocks(), 10);
  EXPECT_DOUBLE_EQ(cache->usage_ratio(), 0.0);
}

TEST(PagedKvCacheTest, DecodeBeyondThePoolThrows) {
  auto cache = MakeCache(kLanes, 4);  // one block per lane
  ASSERT_TRUE(cache->AddSequence(1, cache->BlocksForUniform(4)).ok());
  Prefill(*cache, 1, 4, 1);
  EXPECT_THROW(cache->BeginDecodeStep({1}), c10::Error);
}

TEST(PagedKvCacheTest, DecodeLayersRunInsideOneExplicitStep) {
  auto cache = MakeCache(8 * kLanes);
  ASSERT_TRUE(cache->AddSequence(1, cache->BlocksForUniform(4)).ok());
  ASSERT_TRUE(cache->AddSequence(2, cache->BlocksForUniform(4)).ok());
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
  const int64_t per_block = 2 * 4 * kDim * 4;  // K and V of one lane, 4 float entries
  EXPECT_EQ(PagedKvCache::NumBlocksForBudget(c, per_block * 7), 7);
  EXPECT_EQ(PagedKvCache::Create(c).status().code(), StatusCode::kResourceExhausted);
  c.num_blocks = 4;
  c.head_dim = 0;
  EXPECT_EQ(PagedKvCache::Create(c).status().code(), StatusCode::kInvalidArgument);
}

// --kv-cache-dtype=int8 (kernels/kv_append/kv_append.h): a lane block holds 16-value
// groups of int8 with a float32 scale each; what Gather reads back is the
// prompt's K and V within half a step of each group's scale, and a decode
// step attends over it like the dense store over the original values, up to
// that rounding.
TEST(PagedKvCacheTest, Int8CacheBudgetRoundTripAndDecode) {
  constexpr int64_t kD = 32;  // two groups of 16 per row
  PagedKvCacheConfig c = SmallConfig(0);
  c.head_dim = kD;
  c.dtype = at::kChar;
  const int64_t per_block = 2 * 4 * (kD + kD / 16 * 4);  // K and V: bytes + scales
  EXPECT_EQ(PagedKvCache::BytesPerBlock(c), per_block);
  EXPECT_EQ(PagedKvCache::NumBlocksForBudget(c, per_block * 5), 5);
  c.num_blocks = 8 * kLanes;
  auto created = PagedKvCache::Create(c);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  PagedKvCache& cache = **created;
  model::DenseKvStore dense(kLayers);
  ASSERT_TRUE(cache.AddSequence(1, cache.BlocksForUniform(9)).ok());
  at::manual_seed(5);
  std::vector<at::Tensor> keys;
  for (int64_t l = 0; l < kLayers; ++l) {
    const at::Tensor q = at::randn({kHeads, 7, kD});
    const at::Tensor k = at::randn({kKvHeads, 7, kD}) * 3;
    const at::Tensor v = at::randn({kKvHeads, 7, kD});
    cache.StorePrefillLayer(1, l, q, k, v);
    dense.StorePrefillLayer(1, l, q, k, v);
    keys.push_back(k);
  }
  for (int64_t l = 0; l < kLayers; ++l) {
    const at::Tensor got = cache.Gather(1, l).first;
    const at::Tensor step = keys[l].abs().view({kKvHeads, 7, 2, 16}).amax(-1, true) / 127;
    EXPECT_TRUE(
        ((got - keys[l]).abs().view({kKvHeads, 7, 2, 16}) <= step / 2 * 1.0001).all().item<bool>());
    EXPECT_GT((got - keys[l]).abs().max().item<float>(), 0.0f);  // rounded, not copied
  }
  cache.BeginDecodeStep({1});
  dense.BeginDecodeStep({1});
  for (int64_t l = 0; l < kLayers; ++l) {
    const at::Tensor q = at::randn({1, kHeads, kD});
    const at::Tensor k = at::randn({1, kKvHeads, kD});
    const at::Tensor v = at::randn({1, kKvHeads, kD});
    const at::Tensor got = cache.DecodeAttention({1}, l, q, k, v);
    const at::Tensor want = dense.DecodeAttention({1}, l, q, k, v);
    EXPECT_TRUE(at::allclose(got, want, 0.05, 0.05)) << (got - want).abs().max();
  }
  cache.EndDecodeStep();
  dense.EndDecodeStep();
  EXPECT_EQ(cache.num_tokens(1), 8);
  // Refused: a CUDA device (no kernel reads int8 there), a head_dim not in 16s.
  c.device = c10::Device(c10::kCUDA, 0);
  EXPECT_EQ(PagedKvCache::Create(c).status().code(), StatusCode::kInvalidArgument);
  c.device = c10::Device(c10::kCPU);
  c.head_dim = 24;
  EXPECT_EQ(PagedKvCache::Create(c).status().code(), StatusCode::kInvalidArgument);
}

// Resident memory of this process in bytes (Linux: VmRSS of /proc/self/status).
// A "Key:  N kB" figure of a /proc file, in bytes; -1 if absent.
int64_t ProcBytes(const char* path, const std::string& wanted) {
  std::ifstream file(path);
  std::string key;
  while (file >> key) {
    if (key == wanted) {
      int64_t kib = 0;
      file >> kib;
      return kib * 1024;
    }
    file.ignore(1 << 12, '\n');
  }
  return -1;
}

int64_t ResidentBytes() { return ProcBytes("/proc/self/status", "VmRSS:"); }

// What the kernel reports is the oracle: a prefaulted cache is resident at
// once, a plain one only where blocks were written.
TEST(PagedKvCacheTest, PrefaultMakesTheWholeCacheResident) {
  ASSERT_GE(ResidentBytes(), 0) << "no VmRSS in /proc/self/status";
  constexpr int64_t kCacheBytes = int64_t{256} << 20;
  PagedKvCacheConfig c = SmallConfig(0, 16);
  c.num_blocks = PagedKvCache::NumBlocksForBudget(c, kCacheBytes);
  for (bool prefault : {false, true}) {
    c.prefault = prefault;
    const int64_t before = ResidentBytes();
    auto cache = PagedKvCache::Create(c);
    ASSERT_TRUE(cache.ok()) << cache.status().ToString();
    const int64_t grown = ResidentBytes() - before;
    if (prefault) {
      EXPECT_GT(grown, kCacheBytes * 9 / 10) << "prefaulted cache not resident";
      EXPECT_EQ((*cache)->key_cache().abs().max().item<float>(), 0.0f);
    } else {
      EXPECT_LT(grown, kCacheBytes / 4) << "an untouched cache should not be resident";
    }
  }
}

// The kernel's accounting is the oracle again: the pool asks for
// transparent huge pages before its first write (granted wherever the
// kernel has them, whatever its mode), and with the mode `madvise` (Debian's
// default) or `always` a prefaulted pool is then backed (at least in part:
// only whole 2 MiB pages inside it qualify) by huge pages; with `never`, by
// none.
TEST(PagedKvCacheTest, CpuPoolAsksForHugePages) {
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  const std::string modes((std::istreambuf_iterator<char>(thp)), std::istreambuf_iterator<char>());
  const bool kernel_has_thp = !modes.empty();
  const bool thp_granted = kernel_has_thp && modes.find("[never]") == std::string::npos;
  ASSERT_GE(ProcBytes("/proc/self/smaps_rollup", "AnonHugePages:"), 0)
      << "no AnonHugePages in /proc/self/smaps_rollup (Linux 4.14 on has it)";
  PagedKvCacheConfig c = SmallConfig(0, 16);
  c.num_blocks = PagedKvCache::NumBlocksForBudget(c, int64_t{64} << 20);
  c.prefault = true;
  const int64_t before = ProcBytes("/proc/self/smaps_rollup", "AnonHugePages:");
  auto cache = PagedKvCache::Create(c);
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  EXPECT_EQ((*cache)->huge_pages(), kernel_has_thp) << modes;
  const int64_t grown = ProcBytes("/proc/self/smaps_rollup", "AnonHugePages:") - before;
  if (thp_granted) {
    EXPECT_GT(grown, 0) << "no huge page backs the prefaulted 64 MiB pool; modes: " << modes;
  } else {
    EXPECT_EQ(grown, 0) << "huge pages although the kernel's mode is: " << modes;
  }
  // A pool smaller than one huge page holds none.
  auto small = PagedKvCache::Create(SmallConfig(8));
  ASSERT_TRUE(small.ok());
  EXPECT_FALSE((*small)->huge_pages());
}

TEST(PagedKvCacheTest, RandomAddRemoveLeavesEveryBlockFree) {
  auto cache = MakeCache(32 * kLanes, 4);
  std::mt19937 rng(11);
  std::vector<int64_t> live;
  int64_t next = 0;
  for (int step = 0; step < 300; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      const int64_t tokens = 1 + rng() % 24;
      if (cache->AddSequence(next, cache->BlocksForUniform(tokens)).ok()) {
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
  EXPECT_EQ(cache->num_free_blocks(), 32 * kLanes);
}

}  // namespace
}  // namespace snapserve::kv
