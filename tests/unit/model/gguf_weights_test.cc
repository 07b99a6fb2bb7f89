// Dequantization and GGUF -> HF naming. The end-to-end check (un-permuted q/k,
// config from metadata) is the real-model parity test in
// tests/python/test_model_parity.py.
#include "engine/model/gguf_weights.h"

#include <gtest/gtest.h>

#include <cstring>

namespace snapserve::model {
namespace {

void PutHalf(uint8_t* p, uint16_t bits) { std::memcpy(p, &bits, 2); }

GgufTensorInfo Info(GgufType type, std::vector<int64_t> dims, const std::vector<uint8_t>& bytes) {
  return GgufTensorInfo{"blk.0.test.weight", std::move(dims), static_cast<uint32_t>(type), 0,
                        bytes.data(),        bytes.size()};
}

TEST(GgufWeightsTest, DequantizesQ4_1) {
  std::vector<uint8_t> block(20);
  PutHalf(&block[0], 0x3800);  // d = 0.5
  PutHalf(&block[2], 0xBC00);  // m = -1.0
  for (int j = 0; j < 16; ++j) block[4 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  auto t = DequantizeGgufTensor(Info(GgufType::kQ4_1, {32}, block), "f.gguf");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const float* v = t->data_ptr<float>();
  for (int j = 0; j < 16; ++j) {
    EXPECT_FLOAT_EQ(v[j], 0.5f * j - 1.0f) << j;
    EXPECT_FLOAT_EQ(v[j + 16], 0.5f * (15 - j) - 1.0f) << j;
  }
}

TEST(GgufWeightsTest, DequantizesQ4_0AndQ8_0) {
  std::vector<uint8_t> q4(18);
  PutHalf(&q4[0], 0x4000);  // d = 2
  for (int j = 0; j < 16; ++j) q4[2 + j] = static_cast<uint8_t>(j | (j << 4));
  auto a = DequantizeGgufTensor(Info(GgufType::kQ4_0, {32}, q4), "f.gguf");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  for (int j = 0; j < 16; ++j) {
    EXPECT_FLOAT_EQ(a->data_ptr<float>()[j], 2.0f * (j - 8));
    EXPECT_FLOAT_EQ(a->data_ptr<float>()[j + 16], 2.0f * (j - 8));
  }

  std::vector<uint8_t> q8(34);
  PutHalf(&q8[0], 0x3400);  // d = 0.25
  for (int j = 0; j < 32; ++j) q8[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j - 16));
  auto b = DequantizeGgufTensor(Info(GgufType::kQ8_0, {32}, q8), "f.gguf");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  for (int j = 0; j < 32; ++j) EXPECT_FLOAT_EQ(b->data_ptr<float>()[j], 0.25f * (j - 16));
}

TEST(GgufWeightsTest, ReversesDimsToPyTorchOrder) {
  std::vector<uint8_t> bytes(2 * 3 * 2);
  for (int i = 0; i < 6; ++i) PutHalf(&bytes[2 * i], 0x3C00);  // 1.0
  auto t = DequantizeGgufTensor(Info(GgufType::kF16, {3, 2}, bytes), "f.gguf");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->sizes(), at::IntArrayRef({2, 3}));
  EXPECT_TRUE(at::all(*t == 1.0f).item<bool>());
}

TEST(GgufWeightsTest, UnsupportedTypeNamesFileAndTensor) {
  // Q8_1 is a ggml type (activations of Q4_1/Q5_1 dot products) that no
  // model file stores: refused, naming file, tensor and type.
  std::vector<uint8_t> bytes(40);  // one Q8_1 block
  auto t = DequantizeGgufTensor(Info(GgufType::kQ8_1, {32}, bytes), "/m/model.gguf");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(t.status().message().find("/m/model.gguf"), std::string::npos);
  EXPECT_NE(t.status().message().find("blk.0.test.weight"), std::string::npos);
  EXPECT_NE(t.status().message().find("Q8_1"), std::string::npos) << t.status().ToString();
}

TEST(GgufWeightsTest, DequantizesKQuants) {
  // One Q4_K block: d = 1, dmin = 0.5, scale 2 and min 3 for every sub-block,
  // every nibble 5 (low) / 7 (high): values 2*5 - 1.5 and 2*7 - 1.5.
  std::vector<uint8_t> block(144);
  PutHalf(&block[0], 0x3C00);
  PutHalf(&block[2], 0x3800);
  for (int i = 0; i < 4; ++i) {
    block[4 + i] = 2;      // scales 0-3
    block[8 + i] = 3;      // mins 0-3
    block[12 + i] = 0x32;  // scales 4-7 low bits 2, mins 4-7 low bits 3
  }
  for (int i = 0; i < 128; ++i) block[16 + i] = 0x75;
  auto t = DequantizeGgufTensor(Info(GgufType::kQ4_K, {256}, block), "f.gguf");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const float* v = t->data_ptr<float>();
  for (int e = 0; e < 256; ++e) {
    const bool high = (e / 32) % 2 == 1;
    EXPECT_FLOAT_EQ(v[e], (high ? 14.0f : 10.0f) - 1.5f) << e;
  }
}

TEST(GgufWeightsTest, MapsHfNamesToGgufNames) {
  EXPECT_EQ(GgufNameForHf("model.embed_tokens.weight"), "token_embd.weight");
  EXPECT_EQ(GgufNameForHf("model.norm.weight"), "output_norm.weight");
  EXPECT_EQ(GgufNameForHf("lm_head.weight"), "output.weight");
  EXPECT_EQ(GgufNameForHf("model.layers.12.self_attn.q_proj.weight"), "blk.12.attn_q.weight");
  EXPECT_EQ(GgufNameForHf("model.layers.0.self_attn.o_proj.weight"), "blk.0.attn_output.weight");
  EXPECT_EQ(GgufNameForHf("model.layers.3.post_attention_layernorm.weight"),
            "blk.3.ffn_norm.weight");
  EXPECT_EQ(GgufNameForHf("model.layers.3.mlp.down_proj.weight"), "blk.3.ffn_down.weight");
  EXPECT_EQ(GgufNameForHf("model.layers.3.input_layernorm.weight"), "blk.3.attn_norm.weight");
  EXPECT_FALSE(GgufNameForHf("model.layers.3.mlp.experts.weight").has_value());
}

}  // namespace
}  // namespace snapserve::model
