#include "engine/model/model_config.h"

#include <gtest/gtest.h>

#include <cmath>

namespace snapserve::model {
namespace {

const char* kLlama = R"({
  "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
  "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
  "vocab_size": 100, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
  "rope_theta": 500000.0, "tie_word_embeddings": true, "bos_token_id": 1,
  "eos_token_id": [2, 3]
})";

TEST(ModelConfigTest, ParsesLegacyLlamaConfig) {
  auto c = ParseHfConfig(kLlama, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, "llama");
  EXPECT_EQ(c->num_layers, 2);
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_EQ(c->head_dim, 16);  // hidden / heads when not explicit
  EXPECT_DOUBLE_EQ(c->rope_theta, 500000.0);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(c->rope_scaling.kind, RopeScaling::Kind::kNone);
  EXPECT_EQ(c->sliding_window, 0);
}

TEST(ModelConfigTest, ParsesRopeParametersLlama3AndExplicitHeadDim) {
  auto c = ParseHfConfig(R"({
    "model_type": "llama", "num_hidden_layers": 1, "hidden_size": 64, "head_dim": 32,
    "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 100,
    "max_position_embeddings": 2048,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 64}})",
                         "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->num_kv_heads, 4);  // defaults to num_attention_heads
  EXPECT_EQ(c->rope_scaling.kind, RopeScaling::Kind::kLlama3);
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 8.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 64);
}

TEST(ModelConfigTest, ParsesLegacyLinearScalingAndMistralWindow) {
  auto c = ParseHfConfig(R"({
    "model_type": "mistral", "num_hidden_layers": 1, "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1,
    "vocab_size": 100, "max_position_embeddings": 2048, "sliding_window": 16,
    "rope_scaling": {"type": "linear", "factor": 2.0}})",
                         "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, "mistral");
  EXPECT_EQ(c->sliding_window, 16);
  EXPECT_EQ(c->rope_scaling.kind, RopeScaling::Kind::kLinear);
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 2.0);
}

TEST(ModelConfigTest, RejectsBadConfigsWithTheFileName) {
  struct Case {
    const char* json;
    const char* expect;
  } cases[] = {
      {"{not json", "not valid JSON"},
      {R"({"num_hidden_layers": 1})", "model_type"},
      {R"({"model_type": "gpt2", "num_hidden_layers": 1})", "gpt2"},
      {R"({"model_type": "llama", "num_hidden_layers": "two"})", "num_hidden_layers"},
      {R"({"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 64,
           "intermediate_size": 8, "num_attention_heads": 4, "num_key_value_heads": 3,
           "vocab_size": 10, "max_position_embeddings": 8})",
       "num_key_value_heads"},
      {R"({"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 64,
           "intermediate_size": 8, "num_attention_heads": 4, "vocab_size": 10,
           "max_position_embeddings": 8, "rope_scaling": {"type": "yarn", "factor": 2.0}})",
       "yarn"},
  };
  for (const auto& tc : cases) {
    auto c = ParseHfConfig(tc.json, "/m/config.json");
    ASSERT_FALSE(c.ok()) << tc.json;
    EXPECT_NE(c.status().message().find("/m/config.json"), std::string::npos)
        << c.status().ToString();
    EXPECT_NE(c.status().message().find(tc.expect), std::string::npos) << c.status().ToString();
  }
}

// GGUF metadata can carry values no JSON config can: NaN and infinity pass a
// `<= 0` test, so Validate checks finiteness; and counts far beyond any model.
TEST(ModelConfigTest, ValidateRefusesNonFiniteFloatsAndAbsurdCounts) {
  auto base = ParseHfConfig(kLlama, "config.json");
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  struct Case {
    void (*mutate)(ModelConfig*);
    const char* expect;
  } cases[] = {
      {[](ModelConfig* c) { c->rope_theta = std::nan(""); }, "rope_theta is nan"},
      {[](ModelConfig* c) { c->rope_theta = INFINITY; }, "rope_theta is inf"},
      {[](ModelConfig* c) { c->rms_norm_eps = std::nan(""); }, "rms_norm_eps is nan"},
      {[](ModelConfig* c) { c->rms_norm_eps = -INFINITY; }, "rms_norm_eps is -inf"},
      {[](ModelConfig* c) {
         c->rope_scaling.kind = RopeScaling::Kind::kLinear;
         c->rope_scaling.factor = INFINITY;
       },
       "rope scaling factor is inf"},
      {[](ModelConfig* c) { c->num_layers = int64_t{1} << 40; }, "num_hidden_layers is"},
      {[](ModelConfig* c) { c->vocab = int64_t{1} << 30; }, "vocab_size is"},
      {[](ModelConfig* c) { c->hidden = -5; }, "hidden_size is -5"},
      {[](ModelConfig* c) { c->bos_token_id = 100; }, "bos_token_id 100 is outside the vocab"},
      {[](ModelConfig* c) {
         c->eos_token_ids = {2, 70000};
       },
       "eos_token_id 70000 is outside"},
  };
  for (const auto& tc : cases) {
    ModelConfig c = *base;
    tc.mutate(&c);
    Status s = c.Validate("/m/x.gguf");
    EXPECT_FALSE(s.ok()) << tc.expect;
    EXPECT_NE(s.message().find("/m/x.gguf"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(tc.expect), std::string::npos) << s.message();
  }
}

TEST(ModelConfigTest, MissingDirectoryIsNotFound) {
  auto c = LoadHfConfig("/nonexistent/model");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace snapserve::model
