// Synthetic models (engine/model/synthetic_weights.h): the spec, the presets'
// shapes, reproducible weights, and a forward pass through LoadModel.
#include "engine/model/synthetic_weights.h"

#include <gtest/gtest.h>

#include "engine/model/dense_kv_store.h"
#include "engine/model/llama_model.h"
#include "kernels/quant/quant_matrix.h"

namespace snapserve::model {
namespace {

SyntheticSpec Parse(const std::string& text) {
  auto spec = ParseSyntheticSpec(text);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  return spec.ok() ? std::move(spec).value() : SyntheticSpec{};
}

std::string ParseError(const std::string& text) {
  auto spec = ParseSyntheticSpec(text);
  EXPECT_FALSE(spec.ok()) << text;
  if (spec.ok()) return "";
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument) << spec.status().ToString();
  return spec.status().ToString();
}

// One matrix of `spec` as it is loaded on CPU: its blocks' bytes, or its
// dense values.
at::Tensor Matrix(const std::string& spec, const std::string& name) {
  auto source = OpenSyntheticWeights(Parse(spec));
  auto w = source->LoadLinear(name, at::kFloat, at::kCPU);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  if (!w.ok()) return {};
  return w->quantized() ? w->parts.at(0).data : w->dense;
}

TEST(SyntheticWeightsTest, ParsesSpecs) {
  EXPECT_TRUE(IsSyntheticSpec("synthetic:llama-3.2-1b"));
  EXPECT_FALSE(IsSyntheticSpec("models/synthetic:x.gguf"));

  SyntheticSpec a = Parse("synthetic:llama-3.2-1b");
  EXPECT_EQ(a.preset, "llama-3.2-1b");
  EXPECT_EQ(a.format, "q8_0");
  EXPECT_EQ(a.seed, 0u);

  SyntheticSpec b = Parse("synthetic:smollm2-135m?format=q4_1&seed=7");
  EXPECT_EQ(b.format, "q4_1");
  EXPECT_EQ(b.seed, 7u);
  EXPECT_EQ(b.BlockType(576), kernels::QuantType::kQ4_1);
  EXPECT_FALSE(b.DenseType().has_value());

  SyntheticSpec c = Parse("synthetic:llama-3.1-8b?seed=18446744073709551615&format=bf16");
  EXPECT_EQ(c.seed, 18446744073709551615ull);
  EXPECT_EQ(c.DenseType(), at::kBFloat16);
  EXPECT_FALSE(c.BlockType(4096).has_value());
}

TEST(SyntheticWeightsTest, BadSpecsNameTheChoices) {
  const std::string preset = ParseError("synthetic:llama-9b");
  EXPECT_NE(preset.find("unknown preset `llama-9b`"), std::string::npos) << preset;
  EXPECT_NE(preset.find("smollm2-135m"), std::string::npos) << preset;
  EXPECT_NE(preset.find("llama-3.1-8b"), std::string::npos) << preset;
  EXPECT_NE(preset.find("q4_k"), std::string::npos) << preset;

  const std::string format = ParseError("synthetic:llama-3.2-1b?format=q3_k");
  EXPECT_NE(format.find("unknown format `q3_k`"), std::string::npos) << format;
  EXPECT_NE(format.find("bf16"), std::string::npos) << format;

  EXPECT_NE(ParseError("synthetic:llama-3.2-1b?seed=-1").find("not an unsigned integer"),
            std::string::npos);
  EXPECT_NE(ParseError("synthetic:llama-3.2-1b?seed=18446744073709551616").find("64 bits"),
            std::string::npos);
  EXPECT_NE(ParseError("synthetic:llama-3.2-1b?dtype=bf16").find("parameter `dtype=bf16`"),
            std::string::npos);
  ParseError("synthetic:llama-3.2-1b?seed=1&seed=2");
  ParseError("synthetic:llama-3.2-1b?");
  ParseError("synthetic:");

  auto load = LoadModel("synthetic:nope", at::kFloat, at::kCPU, nullptr);
  ASSERT_FALSE(load.ok());
  EXPECT_EQ(load.status().code(), StatusCode::kInvalidArgument);
}

TEST(SyntheticWeightsTest, PresetsHaveThePublicShapes) {
  const ModelConfig s = Parse("synthetic:smollm2-135m").config;
  EXPECT_EQ(std::make_tuple(s.hidden, s.intermediate, s.num_layers, s.num_heads, s.num_kv_heads,
                            s.head_dim, s.vocab, s.tie_word_embeddings),
            std::make_tuple(576, 1536, 30, 9, 3, 64, 49152, true));
  const ModelConfig l1 = Parse("synthetic:llama-3.2-1b").config;
  EXPECT_EQ(std::make_tuple(l1.hidden, l1.intermediate, l1.num_layers, l1.num_heads,
                            l1.num_kv_heads, l1.head_dim, l1.vocab, l1.tie_word_embeddings),
            std::make_tuple(2048, 8192, 16, 32, 8, 64, 128256, true));
  EXPECT_EQ(l1.rope_theta, 500000.0);
  EXPECT_EQ(l1.rope_scaling.kind, RopeScaling::Kind::kLlama3);
  const ModelConfig l8 = Parse("synthetic:llama-3.1-8b").config;
  EXPECT_EQ(std::make_tuple(l8.hidden, l8.intermediate, l8.num_layers, l8.num_heads,
                            l8.num_kv_heads, l8.head_dim, l8.vocab, l8.tie_word_embeddings),
            std::make_tuple(4096, 14336, 32, 32, 8, 128, 128256, false));
  EXPECT_EQ(l8.rope_theta, 500000.0);
  // 8.03 B parameters, of which the embedding (not read by a decode step) 0.53 B.
  EXPECT_EQ(SyntheticDecodeBytes(Parse("synthetic:llama-3.1-8b?format=bf16"), at::kBFloat16),
            2 * (32 * int64_t{(4096 + 2048) * 4096 + 4096 * 4096 + 3 * 14336 * 4096} +
                 int64_t{128256} * 4096));
}

TEST(SyntheticWeightsTest, AssembledShapesFormatsAndDecodeBytes) {
  // q4_k on SmolLM2: rows of 576 (hidden) are not whole 256-element
  // super-blocks and fall back to Q5_0; down_proj's 1536 are.
  const SyntheticSpec spec = Parse("synthetic:smollm2-135m?format=q4_k");
  auto source = OpenSyntheticWeights(spec);
  auto w = AssembleWeights(spec.config, *source, at::kFloat, at::kCPU, nullptr);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_EQ(w->layers.size(), 30u);
  EXPECT_EQ(w->layers[0].qkv.format(), "Q5_0");
  EXPECT_EQ(w->layers[0].qkv.rows(), (9 + 2 * 3) * 64);
  EXPECT_EQ(w->layers[0].down.format(), "Q4_K");
  EXPECT_EQ(w->embed.format(), "Q5_0");
  EXPECT_EQ(w->embed.rows(), 49152);
  int64_t bytes = w->lm_head.nbytes();
  for (const LayerWeights& l : w->layers) {
    bytes += l.qkv.nbytes() + l.o_proj.nbytes() + l.gate_up.nbytes() + l.down.nbytes();
  }
  EXPECT_EQ(SyntheticDecodeBytes(spec, at::kFloat), bytes);
  EXPECT_TRUE(at::all(w->final_norm == 1.0f).item<bool>());
}

TEST(SyntheticWeightsTest, SameSpecSameBytesOtherSeedOtherBytes) {
  const std::string down = "model.layers.3.mlp.down_proj.weight";
  for (const char* format : {"q4_1", "q6_k", "bf16"}) {
    const std::string spec = std::string("synthetic:smollm2-135m?format=") + format;
    const at::Tensor a = Matrix(spec + "&seed=5", down);
    EXPECT_TRUE(at::equal(a, Matrix(spec + "&seed=5", down))) << format;
    EXPECT_FALSE(at::equal(a, Matrix(spec + "&seed=6", down))) << format;
    EXPECT_FALSE(at::equal(a, Matrix(spec + "&seed=5", "model.layers.4.mlp.down_proj.weight")))
        << format;
  }
}

TEST(SyntheticWeightsTest, WeightsAreSmallAndCentred) {
  const std::string down = "model.layers.0.mlp.down_proj.weight";
  for (const char* format : {"f32", "f16", "q8_0", "q4_0", "q4_1", "q5_1", "q4_k", "q6_k"}) {
    const std::string spec = std::string("synthetic:smollm2-135m?format=") + format;
    auto source = OpenSyntheticWeights(Parse(spec));
    auto t = source->Load(down, at::kFloat, at::kCPU);  // dense, decoded
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ(t->sizes(), (at::IntArrayRef{576, 1536}));
    const double rms = t->square().mean().sqrt().item<double>();
    EXPECT_NEAR(rms, 0.02, 0.004) << format;
    EXPECT_LT(std::abs(t->mean().item<double>()), 0.004) << format;
    EXPECT_TRUE(at::isfinite(*t).all().item<bool>()) << format;
  }
}

TEST(SyntheticWeightsTest, SmolLm2Q4_1RunsAForwardPass) {
  auto model =
      LoadModel("synthetic:smollm2-135m?format=q4_1&seed=1", at::kFloat, at::kCPU, nullptr);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  LlamaModel& m = **model;
  DenseKvStore store(m.config().num_layers, m.config().sliding_window);
  const at::Tensor prefill = m.Prefill(0, {1, 17, 4242, 49151, 9}, store);
  EXPECT_EQ(prefill.sizes(), (at::IntArrayRef{49152}));
  EXPECT_TRUE(at::isfinite(prefill).all().item<bool>());
  EXPECT_GT(prefill.std().item<double>(), 0.0);
  const at::Tensor decode = m.Decode({0}, {3}, {5}, store);
  EXPECT_EQ(decode.sizes(), (at::IntArrayRef{1, 49152}));
  EXPECT_TRUE(at::isfinite(decode).all().item<bool>());
}

}  // namespace
}  // namespace snapserve::model
