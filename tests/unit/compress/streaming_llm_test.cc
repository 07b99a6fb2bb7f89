// StreamingLLM (docs/compression-policies.md): its parameter rules in
// ResolveCompression and the positions its selector keeps.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "engine/compress/compression_policy.h"
#include "engine/compress/streaming_llm_selector.h"

namespace snapserve::compress {
namespace {

constexpr int64_t kMaxContext = 8192;

KvCompressionOverrides StreamingRequest(uint32_t capacity, uint32_t sink) {
  KvCompressionOverrides req;
  req.method = KvMethod::kStreamingLlm;
  req.capacity = capacity;
  req.sink_tokens = sink;
  return req;
}

TEST(StreamingLlmPolicy, SinkDefaultsToFour) {
  auto got = ResolveCompression({}, StreamingRequest(64, 0), kMaxContext);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->method, KvMethod::kStreamingLlm);
  EXPECT_EQ(got->sink_tokens, 4);
  EXPECT_EQ(got->capacity, 64);
}

TEST(StreamingLlmPolicy, SinkMustBeBelowCapacity) {
  auto got = ResolveCompression({}, StreamingRequest(16, 16), kMaxContext);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(got.status().message(),
            "kv_compression.sink_tokens: must be less than max_capacity_prompt (16 >= 16)");
  EXPECT_TRUE(ResolveCompression({}, StreamingRequest(16, 15), kMaxContext).ok());
}

TEST(StreamingLlmPolicy, SnapKvFieldsAreNotItsBusiness) {
  // C = 16 is below SnapKV's default window (32) and the kernel is even: both
  // would be refused for SnapKV, neither is read by StreamingLLM.
  KvCompressionOverrides req = StreamingRequest(16, 4);
  req.kernel_size = 4;
  EXPECT_TRUE(ResolveCompression({}, req, kMaxContext).ok());
}

TEST(StreamingLlmPolicy, CapacityAboveContextIsRejected) {
  auto got = ResolveCompression({}, StreamingRequest(10000, 4), kMaxContext);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().message(),
            "kv_compression.max_capacity_prompt: must be at most the model's context length "
            "(10000 > 8192)");
}

TEST(StreamingLlmPolicy, KeepsCOfLongerPrompts) {
  auto got = ResolveCompression({}, StreamingRequest(64, 4), kMaxContext);
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(ShouldCompress(*got, 64));  // n <= C: nothing dropped
  EXPECT_EQ(KeptEntries(*got, 64), 64);
  EXPECT_TRUE(ShouldCompress(*got, 65));
  EXPECT_EQ(KeptEntries(*got, 65), 64);
  EXPECT_EQ(KeptEntries(*got, 5000), 64);
}

TEST(StreamingLlmSelector, Span) {
  const StreamingLlmSpan s = StreamingLlmKept(/*n=*/100, /*capacity=*/10, /*sink=*/4);
  EXPECT_EQ(s.sink, 4);
  EXPECT_EQ(s.recent_begin, 94);  // 4 sinks + the last 6 positions
  const StreamingLlmSpan window_only = StreamingLlmKept(100, 10, 0);
  EXPECT_EQ(window_only.sink, 0);
  EXPECT_EQ(window_only.recent_begin, 90);
  EXPECT_ANY_THROW(StreamingLlmKept(10, 10, 4));  // n <= C never reaches a selector
  EXPECT_ANY_THROW(StreamingLlmKept(100, 10, 10));
}

TEST(StreamingLlmSelector, KeepsSinksAndRecentForEveryHead) {
  KvCompressionConfig config;
  config.method = KvMethod::kStreamingLlm;
  config.capacity = 8;
  config.sink_tokens = 3;
  const kv::KvSelector select = MakeStreamingLlmSelector(config);
  const int64_t heads = 2, n = 20, d = 4;
  // k[g, p, :] = 1000 g + p, so each kept row says which position it was.
  const at::Tensor pos = at::arange(n, at::kFloat).view({1, n, 1});
  const at::Tensor head = at::arange(heads, at::kFloat).view({heads, 1, 1}) * 1000;
  const at::Tensor k = (pos + head).expand({heads, n, d}).contiguous();
  const at::Tensor v = -k;
  const at::Tensor q = at::empty({6, 0, d});  // no queries: StreamingLLM scores nothing
  const kv::KeptKv kept = select(/*layer=*/0, q, k, v);
  const at::Tensor& kept_k = kept.k;
  const at::Tensor& kept_v = kept.v;
  EXPECT_TRUE(kept.head_lengths.empty());
  ASSERT_EQ(kept_k.sizes(), (at::IntArrayRef{heads, 8, d}));
  const std::vector<float> want = {0, 1, 2, 15, 16, 17, 18, 19};
  for (int64_t g = 0; g < heads; ++g) {
    for (int64_t i = 0; i < 8; ++i) {
      EXPECT_EQ(kept_k[g][i][0].item<float>(), 1000 * g + want[static_cast<size_t>(i)]);
      EXPECT_EQ(kept_v[g][i][d - 1].item<float>(), -(1000 * g + want[static_cast<size_t>(i)]));
    }
  }
}

}  // namespace
}  // namespace snapserve::compress
