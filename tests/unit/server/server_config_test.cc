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
  const engine::KvCompressionConfig& kv = r.config.engine.default_kv_compression;
  EXPECT_EQ(kv.method, engine::KvMethod::kSnapKv);
  EXPECT_EQ(kv.window, 32);
  EXPECT_EQ(kv.capacity, 1024);
  EXPECT_EQ(kv.kernel_size, 7);
  EXPECT_EQ(kv.pooling, engine::KvPooling::kMax);
  EXPECT_EQ(kv.sink_tokens, 4);  // StreamingLLM's paper value
  EXPECT_EQ(r.config.engine.dtype, engine::Dtype::kFloat32);
  EXPECT_EQ(r.config.engine.device, engine::Device::Cpu());
}

// The flags' defaults are the engine's: ServerConfig holds an EngineOptions
// and repeats none of its numbers.
TEST(ServerConfigTest, DefaultsAreTheEngineDefaults) {
  ParseResult r = Parse({});
  ASSERT_FALSE(r.exit) << r.message;
  const engine::EngineOptions defaults;
  const engine::EngineOptions& got = r.config.engine;
  EXPECT_EQ(got.kv_cache_memory_bytes, defaults.kv_cache_memory_bytes);
  EXPECT_EQ(got.max_batch_size, defaults.max_batch_size);
  EXPECT_EQ(got.max_queue, defaults.max_queue);
  EXPECT_EQ(got.max_new_tokens_limit, defaults.max_new_tokens_limit);
  EXPECT_EQ(got.default_max_new_tokens, defaults.default_max_new_tokens);
  EXPECT_EQ(got.max_step_tokens, defaults.max_step_tokens);
  EXPECT_EQ(got.threads, defaults.threads);
  // --help shows them.
  const std::string help = ServerHelp();
  EXPECT_NE(help.find("default '2147483648'"), std::string::npos);
  EXPECT_NE(help.find("default 'snapkv'"), std::string::npos);
  EXPECT_NE(help.find("default 'float32 (CUDA: bfloat16 unless exact)'"), std::string::npos);
  EXPECT_NE(help.find("default 'auto'"), std::string::npos);
  EXPECT_NE(help.find("default 'cpu'"), std::string::npos);
}

TEST(ServerConfigTest, EveryKvMethodName) {
  EXPECT_EQ(*ParseKvMethod("snapkv"), engine::KvMethod::kSnapKv);
  EXPECT_EQ(*ParseKvMethod("none"), engine::KvMethod::kNone);
  EXPECT_EQ(*ParseKvMethod("streaming_llm"), engine::KvMethod::kStreamingLlm);
  EXPECT_EQ(
      Parse({"--default-kv-method=streaming_llm"}).config.engine.default_kv_compression.method,
      engine::KvMethod::kStreamingLlm);
  EXPECT_EQ(Parse({"--default-kv-method=none"}).config.engine.default_kv_compression.method,
            engine::KvMethod::kNone);
  EXPECT_EQ(Parse({"--default-kv-method=snapkv"}).config.engine.default_kv_compression.method,
            engine::KvMethod::kSnapKv);
  for (engine::KvMethod m :
       {engine::KvMethod::kNone, engine::KvMethod::kSnapKv, engine::KvMethod::kStreamingLlm}) {
    EXPECT_EQ(*ParseKvMethod(engine::kv_method_name(m)), m);  // names round-trip
  }
}

TEST(ServerConfigTest, EveryPoolingName) {
  EXPECT_EQ(*ParseKvPooling("max"), engine::KvPooling::kMax);
  EXPECT_EQ(*ParseKvPooling("avg"), engine::KvPooling::kAvg);
  EXPECT_EQ(Parse({"--snapkv-pooling=avg"}).config.engine.default_kv_compression.pooling,
            engine::KvPooling::kAvg);
  EXPECT_EQ(Parse({"--snapkv-pooling=max"}).config.engine.default_kv_compression.pooling,
            engine::KvPooling::kMax);
}

TEST(ServerConfigTest, EveryDtypeName) {
  EXPECT_EQ(*ParseDtype("float32"), engine::Dtype::kFloat32);
  EXPECT_EQ(*ParseDtype("bfloat16"), engine::Dtype::kBFloat16);
  EXPECT_EQ(*ParseDtype("float16"), engine::Dtype::kFloat16);
  // int8 is the KV cache's alone: a model never computes in it.
  EXPECT_EQ(*ParseKvCacheDtype("int8"), engine::Dtype::kInt8);
  EXPECT_EQ(*ParseKvCacheDtype("bfloat16"), engine::Dtype::kBFloat16);
  EXPECT_FALSE(ParseDtype("int8").ok());
  EXPECT_FALSE(ParseKvCacheDtype("int4").ok());
  for (const char* name : {"float32", "bfloat16", "float16"}) {
    ParseResult r = Parse({std::string("--dtype=") + name});
    ASSERT_FALSE(r.exit) << r.message;
    EXPECT_STREQ(engine::dtype_name(r.config.engine.dtype), name);
  }
}

TEST(ServerConfigTest, EveryQuantizedDotName) {
  EXPECT_EQ(Parse({"--precision=exact"}).config.engine.linear_precision.dot,
            engine::QuantDot::kExact);
  EXPECT_EQ(Parse({"--quantized-dot=int8"}).config.engine.linear_precision.dot,
            engine::QuantDot::kInt8);
  EXPECT_EQ(Parse({"--quantized-dot=exact"}).config.engine.linear_precision.dot,
            engine::QuantDot::kExact);
  ParseResult bad = Parse({"--quantized-dot=fast"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.message, "--quantized-dot: expected one of exact|int8, got 'fast'");
  EXPECT_EQ(Parse({"--precision=exact"}).config.engine.linear_precision.prefill,
            engine::PrefillGemm::kFloat32);
  EXPECT_EQ(Parse({"--prefill-gemm=bfloat16"}).config.engine.linear_precision.prefill,
            engine::PrefillGemm::kBFloat16);
  EXPECT_EQ(Parse({"--prefill-gemm=int8"}).config.engine.linear_precision.prefill,
            engine::PrefillGemm::kInt8);
  ParseResult bad_gemm = Parse({"--prefill-gemm=int4"});
  EXPECT_EQ(bad_gemm.message, "--prefill-gemm: expected one of float32|bfloat16|int8, got 'int4'");
}

TEST(ServerConfigTest, DecodeDotNeedsBFloat16WeightsOnCpu) {
  EXPECT_EQ(Parse({}).config.engine.linear_precision.decode, engine::DecodeDot::kFloat32);
  EXPECT_EQ(
      Parse({"--dtype=bfloat16", "--decode-dot=bfloat16"}).config.engine.linear_precision.decode,
      engine::DecodeDot::kBFloat16);
  EXPECT_EQ(Parse({"--decode-dot=float32"}).config.engine.linear_precision.decode,
            engine::DecodeDot::kFloat32);
  ParseResult bad = Parse({"--decode-dot=int8"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.message, "--decode-dot: expected one of float32|bfloat16, got 'int8'");
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--decode-dot=bfloat16"},
        std::vector<std::string>{"--dtype=bfloat16", "--device=cuda", "--decode-dot=bfloat16"}}) {
    ParseResult refused = Parse(args);
    EXPECT_EQ(refused.exit_code, 2) << args[0];
    EXPECT_EQ(refused.message, "--decode-dot=bfloat16 needs --dtype=bfloat16 on --device=cpu");
  }
}

TEST(ServerConfigTest, EveryDeviceForm) {
  EXPECT_EQ(*ParseDevice("cpu"), engine::Device::Cpu());
  EXPECT_EQ(*ParseDevice("cuda"), engine::Device::Cuda());
  EXPECT_EQ(*ParseDevice("cuda:0"), engine::Device::Cuda(0));
  EXPECT_EQ(*ParseDevice("cuda:3"), engine::Device::Cuda(3));
  EXPECT_EQ(*ParseDevice("cuda:127"), engine::Device::Cuda(127));
  for (const char* name : {"cpu", "cuda", "cuda:0", "cuda:7"}) {
    ParseResult r = Parse({std::string("--device=") + name});
    ASSERT_FALSE(r.exit) << r.message;
    EXPECT_EQ(engine::device_name(r.config.engine.device), name);
  }
  for (const char* bad : {"tpu", "", "CPU", "cuda:", "cuda:x", "cuda:-1", "cuda:128", "cuda:1a"}) {
    StatusOr<engine::Device> d = ParseDevice(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().message(), std::string("expected cpu, cuda or cuda:N, got '") + bad + "'");
  }
}

// An unknown value names the flag (or its variable) and every accepted value.
TEST(ServerConfigTest, UnknownNamesListTheAcceptedValues) {
  struct Case {
    const char* flag;
    const char* message;
  };
  for (const Case& c : {
           Case{"--default-kv-method=h2o",
                "--default-kv-method: expected one of "
                "snapkv|streaming_llm|adakv|pyramidkv|keydiff|none, "
                "got 'h2o'"},
           Case{"--snapkv-pooling=min", "--snapkv-pooling: expected one of max|avg, got 'min'"},
           Case{"--dtype=int8", "--dtype: expected one of float32|bfloat16|float16, got 'int8'"},
           Case{"--device=tpu", "--device: expected cpu, cuda or cuda:N, got 'tpu'"},
           Case{"--device=cuda:x", "--device: expected cpu, cuda or cuda:N, got 'cuda:x'"},
       }) {
    ParseResult r = Parse({c.flag});
    EXPECT_TRUE(r.exit) << c.flag;
    EXPECT_EQ(r.exit_code, 2) << c.flag;
    EXPECT_EQ(r.message, c.message);
  }
  ParseResult env = Parse({}, {{"SNAPSERVE_DEFAULT_KV_METHOD", "None"}});
  EXPECT_EQ(env.exit_code, 2);
  EXPECT_EQ(env.message,
            "SNAPSERVE_DEFAULT_KV_METHOD: expected one of "
            "snapkv|streaming_llm|adakv|pyramidkv|keydiff|none, got 'None'");
  EXPECT_FALSE(ParseKvMethod("").ok());
  EXPECT_FALSE(ParseKvPooling("MAX").ok());
  EXPECT_FALSE(ParseDtype("fp16").ok());
}

TEST(ServerConfigTest, MaxStepTokensFlagAndEnvironment) {
  EXPECT_EQ(Parse({}).config.engine.max_step_tokens, engine::EngineOptions{}.max_step_tokens);
  EXPECT_EQ(Parse({"--max-step-tokens=64"}).config.engine.max_step_tokens, 64);
  EXPECT_EQ(Parse({}, {{"SNAPSERVE_MAX_STEP_TOKENS", "128"}}).config.engine.max_step_tokens, 128);
  for (const char* bad_value : {"--max-step-tokens=0", "--max-step-tokens=-1"}) {
    ParseResult bad = Parse({bad_value});
    EXPECT_TRUE(bad.exit);
    EXPECT_EQ(bad.exit_code, 2);
    EXPECT_NE(bad.message.find("--max-step-tokens"), std::string::npos) << bad.message;
  }
  // The flag it replaced is gone, not silently ignored.
  EXPECT_TRUE(Parse({"--prefill-chunk-tokens=512"}).exit);
}

TEST(ServerConfigTest, MetricsHostFollowsHostUnlessGiven) {
  EXPECT_EQ(Parse({}).config.metrics_host, "0.0.0.0");
  EXPECT_EQ(Parse({"--host=127.0.0.1"}).config.metrics_host, "127.0.0.1");
  EXPECT_EQ(
      Parse({"--host=127.0.0.1"}, {{"SNAPSERVE_METRICS_HOST", "0.0.0.0"}}).config.metrics_host,
      "0.0.0.0");
  EXPECT_EQ(
      Parse({"--metrics-host=::1"}, {{"SNAPSERVE_METRICS_HOST", "0.0.0.0"}}).config.metrics_host,
      "::1");
  ParseResult bad = Parse({"--metrics-host="});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.message.find("--metrics-host"), std::string::npos) << bad.message;
}

TEST(ServerConfigTest, AuthTokenFileFlagAndEnvironment) {
  EXPECT_EQ(Parse({}).config.auth_token_file, "");  // off by default
  EXPECT_EQ(Parse({"--auth-token-file=/run/secrets/token"}).config.auth_token_file,
            "/run/secrets/token");
  EXPECT_EQ(Parse({}, {{"SNAPSERVE_AUTH_TOKEN_FILE", "/etc/t"}}).config.auth_token_file, "/etc/t");
  ParseResult bad = Parse({"--auth-token-file="});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.message.find("--auth-token-file"), std::string::npos) << bad.message;
}

TEST(ServerConfigTest, DashesUnderscoresAndSeparateValues) {
  ParseResult r = Parse({"--kv-cache-memory=512MiB", "--max_queue", "7", "--model", "/m.gguf"});
  ASSERT_FALSE(r.exit) << r.message;
  EXPECT_EQ(r.config.engine.kv_cache_memory_bytes, int64_t{512} << 20);
  EXPECT_EQ(r.config.engine.max_queue, 7);
  EXPECT_EQ(r.config.engine.model_path, "/m.gguf");
}

TEST(ServerConfigTest, KvCachePrefaultIsABoolean) {
  EXPECT_FALSE(Parse({}).config.engine.kv_cache_prefault);
  EXPECT_TRUE(Parse({"--kv-cache-prefault=true"}).config.engine.kv_cache_prefault);
  EXPECT_TRUE(Parse({}, {{"SNAPSERVE_KV_CACHE_PREFAULT", "true"}}).config.engine.kv_cache_prefault);
  ParseResult bad = Parse({"--kv-cache-prefault=yes"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.message.find("--kv-cache-prefault"), std::string::npos) << bad.message;
}

TEST(ServerConfigTest, EnvironmentIsOverriddenByCommandLine) {
  ParseResult r =
      Parse({"--port=6000"}, {{"SNAPSERVE_PORT", "5000"}, {"SNAPSERVE_DTYPE", "bfloat16"}});
  ASSERT_FALSE(r.exit) << r.message;
  EXPECT_EQ(r.config.port, 6000);
  EXPECT_EQ(r.config.engine.dtype, engine::Dtype::kBFloat16);
}

TEST(ServerConfigTest, BadValuesNameTheFlag) {
  ParseResult r = Parse({"--max-batch-size=0"});
  EXPECT_TRUE(r.exit);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.message.find("--max-batch-size"), std::string::npos) << r.message;

  r = Parse({}, {{"SNAPSERVE_DEVICE", "tpu"}});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.message.find("SNAPSERVE_DEVICE"), std::string::npos) << r.message;

  r = Parse({"--kv-window=32", "--kv-capacity=32"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.message.find("--kv-window"), std::string::npos) << r.message;

  // Whatever the default method: a request may choose StreamingLLM.
  r = Parse({"--kv-sink-tokens=64", "--kv-window=8", "--kv-capacity=64"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.message, "--kv-sink-tokens must be less than --kv-capacity (64 >= 64)");
  EXPECT_EQ(Parse({"--kv-sink-tokens=0"}).config.engine.default_kv_compression.sink_tokens, 0);
}

TEST(ServerConfigTest, RenamedFlagsKeepTheirOldNamesWithAWarning) {
  ParseResult r = Parse({"--snapkv-window=16", "--snapkv_capacity=300"});
  ASSERT_FALSE(r.exit) << r.message;
  EXPECT_EQ(r.config.engine.default_kv_compression.window, 16);
  EXPECT_EQ(r.config.engine.default_kv_compression.capacity, 300);
  EXPECT_EQ(r.warnings, (std::vector<std::string>{"--snapkv-window is deprecated: use --kv-window",
                                                  "--snapkv-capacity is deprecated: use "
                                                  "--kv-capacity"}));
  EXPECT_TRUE(Parse({"--kv-window=16"}).warnings.empty());

  // The old variable works below the new one.
  r = Parse({}, {{"SNAPSERVE_SNAPKV_CAPACITY", "200"}});
  EXPECT_EQ(r.config.engine.default_kv_compression.capacity, 200);
  EXPECT_EQ(r.warnings, (std::vector<std::string>{"SNAPSERVE_SNAPKV_CAPACITY is deprecated: use "
                                                  "SNAPSERVE_KV_CAPACITY"}));
  r = Parse({}, {{"SNAPSERVE_SNAPKV_CAPACITY", "200"}, {"SNAPSERVE_KV_CAPACITY", "400"}});
  EXPECT_EQ(r.config.engine.default_kv_compression.capacity, 400);
  r = Parse({}, {{"SNAPSERVE_SNAPKV_WINDOW", "0"}});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.message.find("SNAPSERVE_SNAPKV_WINDOW"), std::string::npos) << r.message;
}

TEST(ServerConfigTest, BadValuesAreEchoedBounded) {
  const std::string huge(100000, '9');
  ParseResult r = Parse({"--port=" + huge});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.message.find("--port"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("(100000 bytes)"), std::string::npos) << r.message;
  EXPECT_LT(r.message.size(), 400u);
  r = Parse({}, {{"SNAPSERVE_DEVICE", huge}});
  EXPECT_LT(r.message.size(), 400u);
  r = Parse({"--" + huge + "=1"});
  EXPECT_LT(r.message.size(), 400u);
}

TEST(ServerConfigTest, HelpExitsZero) {
  ParseResult r = Parse({"--help"});
  EXPECT_TRUE(r.exit);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.message.find("SNAPSERVE_KV_CAPACITY"), std::string::npos);
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
