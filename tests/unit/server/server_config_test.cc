#include "server/server_config.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>

namespace snapserve::server {
namespace {

std::map<std::string, std::string>* g_env = nullptr;

char* FakeGetenv(const char* name) {
  if (g_env == nullptr) return nullptr;
  auto it = g_env->find(name);
  return it == g_env->end() ? nullptr : it->second.data();
}

ParseResult Parse(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
  g_env = &env;
  ParseResult r = ParseServerConfig(args, &FakeGetenv);
  g_env = nullptr;
  return r;
}

TEST(ServerConfigTest, DefaultsMatchTheDesign) {
  ParseResult r = Parse({});
  ASSERT_FALSE(r.exit) << r.message;
  EXPECT_EQ(r.config.port, 50051);
  EXPECT_EQ(r.config.metrics_port, 9464);
  EXPECT_EQ(r.config.snapkv_window, 32);
  EXPECT_EQ(r.config.snapkv_capacity, 1024);
  EXPECT_EQ(r.config.snapkv_kernel, 7);
  EXPECT_EQ(r.config.snapkv_pooling, "max");
}

TEST(ServerConfigTest, PrefillChunkTokensFlagAndEnvironment) {
  EXPECT_EQ(Parse({}).config.prefill_chunk_tokens, 512);
  EXPECT_EQ(Parse({"--prefill-chunk-tokens=0"}).config.prefill_chunk_tokens, 0);
  EXPECT_EQ(Parse({}, {{"SNAPSERVE_PREFILL_CHUNK_TOKENS", "256"}}).config.prefill_chunk_tokens,
            256);
  ParseResult bad = Parse({"--prefill-chunk-tokens=-1"});
  EXPECT_TRUE(bad.exit);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.message.find("--prefill-chunk-tokens"), std::string::npos) << bad.message;
}

TEST(ServerConfigTest, DashesUnderscoresAndSeparateValues) {
  ParseResult r = Parse({"--kv-cache-memory=512MiB", "--max_queue", "7", "--model", "/m.gguf"});
  ASSERT_FALSE(r.exit) << r.message;
  EXPECT_EQ(r.config.kv_cache_memory, int64_t{512} << 20);
  EXPECT_EQ(r.config.max_queue, 7);
  EXPECT_EQ(r.config.model, "/m.gguf");
}

TEST(ServerConfigTest, EnvironmentIsOverriddenByCommandLine) {
  ParseResult r =
      Parse({"--port=6000"}, {{"SNAPSERVE_PORT", "5000"}, {"SNAPSERVE_DTYPE", "bfloat16"}});
  ASSERT_FALSE(r.exit) << r.message;
  EXPECT_EQ(r.config.port, 6000);
  EXPECT_EQ(r.config.dtype, "bfloat16");
}

TEST(ServerConfigTest, BadValuesNameTheFlag) {
  ParseResult r = Parse({"--max-batch-size=0"});
  EXPECT_TRUE(r.exit);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.message.find("--max-batch-size"), std::string::npos) << r.message;

  r = Parse({}, {{"SNAPSERVE_DEVICE", "tpu"}});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.message.find("SNAPSERVE_DEVICE"), std::string::npos) << r.message;

  r = Parse({"--snapkv-window=32", "--snapkv-capacity=32"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.message.find("--snapkv-window"), std::string::npos) << r.message;
}

TEST(ServerConfigTest, HelpExitsZero) {
  ParseResult r = Parse({"--help"});
  EXPECT_TRUE(r.exit);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.message.find("SNAPSERVE_SNAPKV_CAPACITY"), std::string::npos);
}

TEST(ServerConfigTest, ByteSizes) {
  EXPECT_EQ(ParseByteSize("2GiB"), int64_t{2} << 30);
  EXPECT_EQ(ParseByteSize("1e9"), 1000000000);
  EXPECT_EQ(ParseByteSize("100MB"), 100000000);
  EXPECT_EQ(ParseByteSize("12"), 12);
  EXPECT_EQ(ParseByteSize("lots"), -1);
  EXPECT_EQ(ParseByteSize("-5"), -1);
  EXPECT_EQ(ParseByteSize("3XB"), -1);
}

}  // namespace
}  // namespace snapserve::server
