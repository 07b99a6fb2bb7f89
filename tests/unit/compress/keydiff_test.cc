// KeyDiff (docs/compression-policies.md, "KeyDiff"): its parameter rules in
// ResolveCompression and the rows its selector keeps. Parity with kvpress's
// KeyDiffPress on real keys is tests/python/test_keydiff_kvpress.py.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "engine/compress/compression_policy.h"
#include "engine/compress/keydiff_selector.h"

namespace snapserve::compress {
namespace {

constexpr int64_t kMaxContext = 8192;

KvCompressionOverrides KeyDiffRequest(uint32_t capacity, uint32_t window) {
  KvCompressionOverrides req;
  req.method = KvMethod::kKeyDiff;
  req.capacity = capacity;
  req.window = window;
  return req;
}

TEST(KeyDiffPolicy, HasNoWindowToValidate) {
  // A window at or above C and an even kernel: SnapKV refuses both.
  KvCompressionOverrides req = KeyDiffRequest(16, 64);
  req.kernel_size = 4;
  auto got = ResolveCompression({}, req, kMaxContext);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->method, KvMethod::kKeyDiff);
  EXPECT_EQ(KeptEntries(*got, 100), 16);
  EXPECT_EQ(KeptEntries(*got, 16), 16);
  EXPECT_FALSE(ShouldCompress(*got, 16));
}

TEST(KeyDiffPolicy, CapacityIsBoundedByTheContext) {
  auto got = ResolveCompression({}, KeyDiffRequest(kMaxContext + 1, 0), kMaxContext);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
}

TEST(KeyDiffSelector, KeepsTheKeysLeastLikeTheMeanDirectionPerHead) {
  // Head 0: keys along e0 except an opposite one (3) and an orthogonal one
  // (1); the mean unit key leans to e0, so -e0 ranks first, e1 second.
  // Head 1: the same keys one position later, so it keeps rows 2 and 4.
  const at::Tensor head0 =
      at::tensor({1.f, 0.f, 0.f, 1.f, 2.f, 0.f, -1.f, 0.f, 3.f, 0.f}).view({5, 2});
  const at::Tensor head1 = head0.roll(1, 0);
  const at::Tensor k = at::stack({head0, head1});  // [2, 5, 2]
  const at::Tensor v = at::arange(10, at::kFloat).view({2, 5, 1});
  KvCompressionConfig config;
  config.method = KvMethod::kKeyDiff;
  config.capacity = 2;
  EXPECT_TRUE(at::equal(KeyDiffKept(k, 2), at::tensor({1, 3, 2, 4}, at::kLong).view({2, 2})));
  const kv::KeptKv kept = MakeKeyDiffSelector(config)(0, at::Tensor(), k, v);
  EXPECT_TRUE(at::equal(kept.v, at::tensor({1.f, 3.f, 7.f, 9.f}).view({2, 2, 1})));
  EXPECT_TRUE(at::equal(kept.k.select(0, 0), head0.index_select(0, at::tensor({1, 3}))));
  EXPECT_TRUE(kept.head_lengths.empty());  // every head keeps C
}

TEST(KeyDiffSelector, ScoresAreNegativeCosinesToTheMeanUnitKey) {
  const at::Tensor k = at::randn({3, 7, 4}, at::kFloat);
  const at::Tensor unit = k / k.norm(2, -1, true);
  const at::Tensor anchor = unit.mean(1, true);
  const at::Tensor expected =
      -(unit * (anchor / anchor.norm(2, -1, true))).sum(-1);  // cosine as a dot of units
  EXPECT_TRUE(at::allclose(KeyDiffScores(k), expected, 1e-5, 1e-6));
}

}  // namespace
}  // namespace snapserve::compress
