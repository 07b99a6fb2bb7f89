// engine/compress/compression_policy: merging a request's KvCompression overrides
// over the server defaults, and the InvalidArgument messages the API promises.
#include "engine/compress/compression_policy.h"

#include <gtest/gtest.h>

namespace snapserve::compress {
namespace {

using kernels::GroupReduce;
using kernels::PoolingKind;

constexpr int64_t kMaxContext = 8192;

TEST(CompressPolicy, EmptyRequestTakesServerDefaults) {
  const KvCompressionConfig defaults;
  auto got = ResolveCompression(defaults, {}, kMaxContext);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->method, KvMethod::kSnapKv);
  EXPECT_EQ(got->window, 32);
  EXPECT_EQ(got->capacity, 1024);
  EXPECT_EQ(got->kernel_size, 7);
  EXPECT_EQ(got->pooling, PoolingKind::kMax);
  EXPECT_EQ(got->group_reduce, GroupReduce::kMean);
}

TEST(CompressPolicy, SetFieldsOverrideDefaults) {
  KvCompressionOverrides req;
  req.window = 16;
  req.capacity = 2048;
  req.kernel_size = 5;
  req.pooling = PoolingKind::kAvg;
  auto got = ResolveCompression({}, req, kMaxContext);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->window, 16);
  EXPECT_EQ(got->capacity, 2048);
  EXPECT_EQ(got->kernel_size, 5);
  EXPECT_EQ(got->pooling, PoolingKind::kAvg);

  KvCompressionOverrides partial;  // only one field: the rest stay default
  partial.kernel_size = 3;
  auto got2 = ResolveCompression({}, partial, kMaxContext);
  ASSERT_TRUE(got2.ok());
  EXPECT_EQ(got2->kernel_size, 3);
  EXPECT_EQ(got2->window, 32);
  EXPECT_EQ(got2->capacity, 1024);
}

void ExpectInvalid(const KvCompressionConfig& defaults, const KvCompressionOverrides& req,
                   const std::string& message, int64_t max_context = kMaxContext) {
  auto got = ResolveCompression(defaults, req, max_context);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(got.status().message(), message);
}

TEST(CompressPolicy, EvenKernelIsRejected) {
  KvCompressionOverrides req;
  req.kernel_size = 4;
  ExpectInvalid({}, req, "kv_compression.kernel_size: must be odd, got 4");
}

TEST(CompressPolicy, WindowMustBeBelowCapacity) {
  KvCompressionOverrides req;
  req.capacity = 16;  // default window 32
  ExpectInvalid({}, req,
                "kv_compression.window_size: must be less than max_capacity_prompt (32 >= 16)");
  req.window = 16;
  ExpectInvalid({}, req,
                "kv_compression.window_size: must be less than max_capacity_prompt (16 >= 16)");
  req.window = 15;
  EXPECT_TRUE(ResolveCompression({}, req, kMaxContext).ok());
}

TEST(CompressPolicy, ZeroWindowInDefaultsIsRejected) {
  KvCompressionConfig defaults;
  defaults.window = 0;  // a request cannot send 0 (it means unset); a bad config can
  ExpectInvalid(defaults, {}, "kv_compression.window_size: must be at least 1, got 0");
}

TEST(CompressPolicy, CapacityAboveContextIsRejected) {
  KvCompressionOverrides req;
  req.capacity = 10000;
  ExpectInvalid({}, req,
                "kv_compression.max_capacity_prompt: must be at most the model's context length "
                "(10000 > 8192)");
  req.capacity = 8192;  // equal is fine (never compresses a fitting prompt)
  EXPECT_TRUE(ResolveCompression({}, req, kMaxContext).ok());
}

TEST(CompressPolicy, HugeKernelIsRejected) {
  KvCompressionOverrides req;
  req.kernel_size = 4000001;
  ExpectInvalid({}, req,
                "kv_compression.kernel_size: must be at most the model's context length "
                "(4000001 > 8192)");
}

TEST(CompressPolicy, MethodNoneSkipsValidation) {
  KvCompressionOverrides req;
  req.method = KvMethod::kNone;
  req.kernel_size = 4;  // unused when nothing is compressed
  auto got = ResolveCompression({}, req, kMaxContext);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->method, KvMethod::kNone);
  EXPECT_EQ(KeptEntries(*got, 5000), 5000);
  EXPECT_FALSE(ShouldCompress(*got, 5000));
}

TEST(CompressPolicy, RequestCanEnableSnapKvOverNoneDefault) {
  KvCompressionConfig defaults;
  defaults.method = KvMethod::kNone;
  KvCompressionOverrides req;
  req.method = KvMethod::kSnapKv;
  auto got = ResolveCompression(defaults, req, kMaxContext);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->method, KvMethod::kSnapKv);
}

TEST(CompressPolicy, KeptEntries) {
  const KvCompressionConfig config;  // C = 1024
  EXPECT_EQ(KeptEntries(config, 1), 1);
  EXPECT_EQ(KeptEntries(config, 1024), 1024);  // n <= C: everything (step 1)
  EXPECT_EQ(KeptEntries(config, 1025), 1024);
  EXPECT_EQ(KeptEntries(config, 8000), 1024);
  EXPECT_FALSE(ShouldCompress(config, 1024));
  EXPECT_TRUE(ShouldCompress(config, 1025));
}

TEST(CompressPolicy, ToSnapKvParams) {
  KvCompressionConfig config;
  config.pooling = PoolingKind::kAvg;
  config.group_reduce = GroupReduce::kMax;
  const kernels::SnapKvParams p = ToSnapKvParams(config);
  EXPECT_EQ(p.window, 32);
  EXPECT_EQ(p.capacity, 1024);
  EXPECT_EQ(p.kernel_size, 7);
  EXPECT_EQ(p.pooling, PoolingKind::kAvg);
  EXPECT_EQ(p.group_reduce, GroupReduce::kMax);
}

}  // namespace
}  // namespace snapserve::compress
