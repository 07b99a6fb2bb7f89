// Safetensors parsing and HF-directory loading: bad files fail with a Status
// naming the file and the tensor, never a crash or a huge allocation.
#include "engine/model/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "engine/model/dense_kv_store.h"
#include "engine/model/llama_model.h"

namespace snapserve::model {
namespace {

namespace fs = std::filesystem;

struct FakeTensor {
  std::string name;
  std::vector<int64_t> shape;
};

std::string HeaderFor(const std::vector<FakeTensor>& tensors, uint64_t* data_bytes) {
  std::string h = "{";
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    uint64_t n = 4;
    std::string shape;
    for (size_t d = 0; d < tensors[i].shape.size(); ++d) {
      n *= tensors[i].shape[d];
      shape += (d ? "," : "") + std::to_string(tensors[i].shape[d]);
    }
    h += (i ? "," : "") + ("\"" + tensors[i].name + "\":{\"dtype\":\"F32\",\"shape\":[" + shape +
                           "],\"data_offsets\":[" + std::to_string(offset) + "," +
                           std::to_string(offset + n) + "]}");
    offset += n;
  }
  *data_bytes = offset;
  return h + "}";
}

void WriteRaw(const std::string& path, uint64_t header_len, const std::string& header,
              uint64_t data_bytes, uint32_t seed = 1) {
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((header_len >> (8 * i)) & 0xFF));
  out << header;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.2f);
  for (uint64_t i = 0; i < data_bytes / 4; ++i) {
    float f = dist(rng);
    out.write(reinterpret_cast<const char*>(&f), 4);
  }
}

void WriteSafetensors(const std::string& path, const std::vector<FakeTensor>& tensors) {
  uint64_t data_bytes = 0;
  std::string header = HeaderFor(tensors, &data_bytes);
  WriteRaw(path, header.size(), header, data_bytes);
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("snapserve_st_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

void ExpectError(const StatusOr<std::unique_ptr<SafetensorsFile>>& f, const std::string& path,
                 const std::string& needle) {
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find(path), std::string::npos) << f.status().ToString();
  EXPECT_NE(f.status().message().find(needle), std::string::npos) << f.status().ToString();
}

TEST_F(SafetensorsTest, ReadsTensorTable) {
  WriteSafetensors(Path("a.safetensors"), {{"w", {2, 3}}, {"b", {3}}});
  auto f = SafetensorsFile::Open(Path("a.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_EQ((*f)->tensors().size(), 2u);
  const SafetensorsTensor* w = (*f)->Find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(w->nbytes, 24u);
  EXPECT_EQ(w->dtype, SafetensorsDtype::kF32);
  EXPECT_EQ((*f)->Find("b")->data, w->data + 24);
  EXPECT_EQ((*f)->Find("missing"), nullptr);
}

TEST_F(SafetensorsTest, RejectsTruncatedFile) {
  const std::string p = Path("t.safetensors");
  WriteSafetensors(p, {{"w", {64, 64}}});
  fs::resize_file(p, fs::file_size(p) - 100);
  ExpectError(SafetensorsFile::Open(p), p, "tensor `w`");
  fs::resize_file(p, 5);
  ExpectError(SafetensorsFile::Open(p), p, "8-byte");
}

TEST_F(SafetensorsTest, RejectsAbsurdHeaderLengthBeforeAllocating) {
  const std::string p = Path("h.safetensors");
  WriteRaw(p, uint64_t{1} << 60, "{}", 0);
  ExpectError(SafetensorsFile::Open(p), p, "exceeds");
  WriteRaw(p, 4096, "{}", 0);  // plausible, but past the end of the file
  ExpectError(SafetensorsFile::Open(p), p, "past the end");
}

TEST_F(SafetensorsTest, RejectsMalformedJson) {
  const std::string p = Path("j.safetensors");
  const std::string header = R"({"w": {"dtype": "F32", "shape": [1])";
  WriteRaw(p, header.size(), header, 4);
  ExpectError(SafetensorsFile::Open(p), p, "JSON");
}

TEST_F(SafetensorsTest, RejectsInconsistentEntries) {
  const std::string p = Path("e.safetensors");
  std::string header = R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}})";
  WriteRaw(p, header.size(), header, 16);
  ExpectError(SafetensorsFile::Open(p), p, "shape and dtype need 16");
  header = R"({"w": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})";
  WriteRaw(p, header.size(), header, 8);
  ExpectError(SafetensorsFile::Open(p), p, "I64");
  header = R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})";
  WriteRaw(p, header.size(), header, 4);
  ExpectError(SafetensorsFile::Open(p), p, "tensor `w`");
}

// Found while writing the fuzz harness (tests/fuzz/safetensors_fuzzer.cc):
// a header key or dtype of any length used to be echoed whole into the error.
TEST_F(SafetensorsTest, ErrorsBoundTheEchoedNameAndDtype) {
  const std::string p = Path("n.safetensors");
  const std::string long_name(100000, 'n');
  std::string header =
      R"({")" + long_name + R"(": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})";
  WriteRaw(p, header.size(), header, 4);
  auto f = SafetensorsFile::Open(p);
  ExpectError(f, p, "shape and dtype need 8");
  EXPECT_LT(f.status().message().size(), 1000u);
  header = R"({"w": {"dtype": ")" + std::string(100000, 'D') +
           R"(", "shape": [1], "data_offsets": [0, 4]}})";
  WriteRaw(p, header.size(), header, 4);
  f = SafetensorsFile::Open(p);
  ExpectError(f, p, "is not supported");
  EXPECT_LT(f.status().message().size(), 1000u);
}

// The tiling rule of the reference implementation (safetensors'
// Metadata::validate): tests/python/test_safetensors_bad_files.py checks the
// same cases against the safetensors package itself.
TEST_F(SafetensorsTest, RejectsOverlappingTensors) {
  const std::string p = Path("o.safetensors");
  const std::string header = R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
      "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})";
  WriteRaw(p, header.size(), header, 24);
  ExpectError(SafetensorsFile::Open(p), p, "tensor `a` (bytes [0, 16)) overlaps tensor `b`");
  // The same bytes twice: one tensor would serve another's weights.
  const std::string twice = R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
      "b": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})";
  WriteRaw(p, twice.size(), twice, 16);
  ExpectError(SafetensorsFile::Open(p), p, "(bytes [0, 16)) overlaps");
  // An empty tensor inside another one's bytes.
  const std::string inside = R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
      "e": {"dtype": "F32", "shape": [0], "data_offsets": [8, 8]}})";
  WriteRaw(p, inside.size(), inside, 16);
  ExpectError(SafetensorsFile::Open(p), p, "overlaps tensor `e`");
}

TEST_F(SafetensorsTest, RejectsBytesThatBelongToNoTensor) {
  const std::string p = Path("g.safetensors");
  const std::string hole = R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]}})";
  WriteRaw(p, hole.size(), hole, 24);
  ExpectError(SafetensorsFile::Open(p), p, "bytes [8, 16) of the data section belong to no tensor");
  const std::string late = R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})";
  WriteRaw(p, late.size(), late, 16);
  ExpectError(SafetensorsFile::Open(p), p, "the first tensor, tensor `a`, must start at 0");
  const std::string tail = R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})";
  WriteRaw(p, tail.size(), tail, 16);
  ExpectError(SafetensorsFile::Open(p), p, "bytes [8, 16) of the data section belong to no tensor");
  WriteRaw(p, 2, "{}", 8);
  ExpectError(SafetensorsFile::Open(p), p, "the header lists none");
}

TEST_F(SafetensorsTest, AcceptsAnyHeaderOrderAndEmptyTensorsAtBoundaries) {
  const std::string p = Path("k.safetensors");
  const std::string header = R"({"b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},
      "end": {"dtype": "F32", "shape": [0], "data_offsets": [16, 16]},
      "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "start": {"dtype": "F32", "shape": [0, 3], "data_offsets": [0, 0]}})";
  WriteRaw(p, header.size(), header, 16);
  auto f = SafetensorsFile::Open(p);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->Find("b")->data, (*f)->Find("a")->data + 8);
}

// A tiny Llama directory: 1 layer, hidden 8, 2 heads of 4, 1 KV head.
const char* kTinyConfig = R"({"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 8,
  "intermediate_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1,
  "vocab_size": 10, "max_position_embeddings": 64, "tie_word_embeddings": false})";

std::vector<FakeTensor> TinyTensors() {
  const std::string p = "model.layers.0.";
  return {{"model.embed_tokens.weight", {10, 8}},
          {p + "input_layernorm.weight", {8}},
          {p + "self_attn.q_proj.weight", {8, 8}},
          {p + "self_attn.k_proj.weight", {4, 8}},
          {p + "self_attn.v_proj.weight", {4, 8}},
          {p + "self_attn.o_proj.weight", {8, 8}},
          {p + "post_attention_layernorm.weight", {8}},
          {p + "mlp.gate_proj.weight", {16, 8}},
          {p + "mlp.up_proj.weight", {16, 8}},
          {p + "mlp.down_proj.weight", {8, 16}},
          {"model.norm.weight", {8}},
          {"lm_head.weight", {10, 8}}};
}

class TinyModelTest : public SafetensorsTest {
 protected:
  void WriteModel(std::vector<FakeTensor> tensors) {
    std::ofstream(Path("config.json")) << kTinyConfig;
    WriteSafetensors(Path("model.safetensors"), tensors);
  }
  StatusOr<std::unique_ptr<LlamaModel>> Load() {
    return LoadModel(dir_.string(), at::kFloat, at::kCPU, /*log=*/nullptr);
  }
};

TEST_F(TinyModelTest, MissingTensorIsNamed) {
  auto tensors = TinyTensors();
  tensors.erase(tensors.begin() + 7);  // gate_proj
  WriteModel(tensors);
  auto m = Load();
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find("model.layers.0.mlp.gate_proj.weight"), std::string::npos)
      << m.status().ToString();
  EXPECT_NE(m.status().message().find(dir_.string()), std::string::npos);
}

TEST_F(TinyModelTest, WrongShapeIsNamed) {
  auto tensors = TinyTensors();
  tensors[3].shape = {8, 8};  // k_proj as if there were 2 KV heads
  WriteModel(tensors);
  auto m = Load();
  ASSERT_FALSE(m.ok());
  const std::string& msg = m.status().message();
  EXPECT_NE(msg.find("model.layers.0.self_attn.k_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[8, 8]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4, 8]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
}

TEST_F(TinyModelTest, ShardIndexNamingAMissingFileFails) {
  WriteModel(TinyTensors());
  std::ofstream(Path("model.safetensors.index.json"))
      << R"({"weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}})";
  auto m = Load();
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("model-00002-of-00002.safetensors"), std::string::npos);
}

// Self-consistency of the two paths (the oracle tests against transformers
// are in tests/python/test_model_parity.py): decoding token by token gives
// the same logits as one prefill over the whole sequence.
TEST_F(TinyModelTest, DecodeMatchesPrefill) {
  WriteModel(TinyTensors());
  auto m = Load();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const std::vector<int32_t> tokens = {1, 5, 9, 2, 2, 7, 0, 3};
  DenseKvStore full(1);
  at::Tensor expected = (*m)->Prefill(0, tokens, full, /*all_logits=*/true);
  ASSERT_EQ(expected.sizes(), at::IntArrayRef({8, 10}));

  DenseKvStore store(1);
  at::Tensor last = (*m)->Prefill(7, {tokens.begin(), tokens.begin() + 3}, store);
  EXPECT_TRUE(at::allclose(last, expected[2], 1e-5, 1e-5));
  for (int64_t pos = 3; pos < 8; ++pos) {
    at::Tensor logits = (*m)->Decode({7}, {tokens[pos]}, {pos}, store);
    EXPECT_TRUE(at::allclose(logits[0], expected[pos], 1e-5, 1e-5)) << "position " << pos;
  }
  EXPECT_EQ(store.Length(7, 0), 8);
}

}  // namespace
}  // namespace snapserve::model
