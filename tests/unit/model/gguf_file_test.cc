// GgufFile on small files built byte by byte here (layout from the GGUF spec,
// ggml/docs/gguf.md) and on the real SmolLM2 file, whose facts were read with
// gguf-py's GGUFReader.
#include "engine/model/gguf_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace snapserve::model {
namespace {

class Writer {
 public:
  template <typename T>
  Writer& Pod(T v) {
    const char* p = reinterpret_cast<const char*>(&v);
    bytes_.append(p, sizeof(T));
    return *this;
  }
  Writer& Str(const std::string& s) {
    Pod<uint64_t>(s.size());
    bytes_ += s;
    return *this;
  }
  Writer& Pad(size_t alignment) {
    while (bytes_.size() % alignment != 0) bytes_.push_back('\0');
    return *this;
  }
  Writer& Raw(const std::string& s) {
    bytes_ += s;
    return *this;
  }
  std::string& bytes() { return bytes_; }

 private:
  std::string bytes_;
};

std::string WriteTemp(const std::string& name, const std::string& bytes) {
  std::string path = (std::filesystem::temp_directory_path() /
                      ("gguf_file_test_" + std::to_string(::getpid()) + "_" + name))
                         .string();
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// A valid file: 3 metadata entries and one 4x2 F32 tensor.
Writer ValidFile(uint32_t tensor_type = 0, uint64_t tensor_offset = 0) {
  Writer w;
  w.Raw("GGUF").Pod<uint32_t>(3).Pod<uint64_t>(1).Pod<uint64_t>(4);
  w.Str("general.name").Pod<uint32_t>(8).Str("tiny");
  w.Str("llama.block_count").Pod<uint32_t>(4).Pod<uint32_t>(30);
  w.Str("llama.rope.freq_base").Pod<uint32_t>(6).Pod<float>(10000.0f);
  w.Str("tokenizer.ggml.tokens").Pod<uint32_t>(9).Pod<uint32_t>(8).Pod<uint64_t>(2);
  w.Str("a").Str("bc");
  w.Str("w").Pod<uint32_t>(2).Pod<uint64_t>(4).Pod<uint64_t>(2).Pod<uint32_t>(tensor_type);
  w.Pod<uint64_t>(tensor_offset);
  w.Pad(32);
  for (int i = 0; i < 8; ++i) w.Pod<float>(static_cast<float>(i));
  return w;
}

std::string OpenError(const std::string& name, const std::string& bytes) {
  std::string path = WriteTemp(name, bytes);
  auto file = GgufFile::Open(path);
  std::filesystem::remove(path);
  EXPECT_FALSE(file.ok());
  if (file.ok()) return "";
  EXPECT_NE(file.status().message().find(path), std::string::npos) << file.status().message();
  return file.status().message();
}

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(GgufFileTest, ReadsMetadataAndTensor) {
  std::string path = WriteTemp("valid", ValidFile().bytes());
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  const GgufFile& f = **file;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.GetString("general.name"), "tiny");
  EXPECT_EQ(f.GetInt("llama.block_count"), 30);
  EXPECT_EQ(f.GetFloat("llama.rope.freq_base"), 10000.0);
  EXPECT_EQ(f.GetFloat("llama.block_count"), 30.0);
  EXPECT_EQ(f.GetString("llama.block_count"), std::nullopt);
  EXPECT_EQ(f.GetStringArray("tokenizer.ggml.tokens"), (std::vector<std::string>{"a", "bc"}));
  EXPECT_FALSE(f.has("missing"));
  ASSERT_EQ(f.tensors().size(), 1u);
  const GgufTensorInfo* t = f.FindTensor("w");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dims, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(t->nbytes, 32u);
  float v[8];
  std::memcpy(v, t->data, sizeof(v));
  EXPECT_EQ(v[7], 7.0f);
  std::filesystem::remove(path);
}

TEST(GgufFileTest, RejectsBadHeaders) {
  Writer bad_magic = ValidFile();
  bad_magic.bytes()[0] = 'X';
  EXPECT_TRUE(Contains(OpenError("magic", bad_magic.bytes()), "bad magic"));
  Writer v1 = ValidFile();
  v1.bytes()[4] = 1;
  EXPECT_TRUE(Contains(OpenError("v1", v1.bytes()), "unsupported GGUF version 1"));
  EXPECT_TRUE(Contains(OpenError("empty", ""), "too small"));
}

TEST(GgufFileTest, RejectsAbsurdCountsWithoutAllocating) {
  Writer w;
  w.Raw("GGUF").Pod<uint32_t>(3).Pod<uint64_t>(uint64_t{1} << 60).Pod<uint64_t>(0);
  EXPECT_TRUE(Contains(OpenError("tensors", w.bytes()), "tensor count"));
  Writer kv;
  kv.Raw("GGUF").Pod<uint32_t>(3).Pod<uint64_t>(0).Pod<uint64_t>(uint64_t{1} << 60);
  EXPECT_TRUE(Contains(OpenError("kvs", kv.bytes()), "metadata count"));
  Writer arr;
  arr.Raw("GGUF").Pod<uint32_t>(3).Pod<uint64_t>(0).Pod<uint64_t>(1);
  arr.Str("x").Pod<uint32_t>(9).Pod<uint32_t>(8).Pod<uint64_t>(uint64_t{1} << 60);
  EXPECT_TRUE(Contains(OpenError("array", arr.bytes()), "array 'x' claims"));
  Writer str;
  str.Raw("GGUF").Pod<uint32_t>(3).Pod<uint64_t>(0).Pod<uint64_t>(1);
  str.Str("x").Pod<uint32_t>(8).Pod<uint64_t>(uint64_t{1} << 62).Raw("abc");
  EXPECT_TRUE(Contains(OpenError("string", str.bytes()), "string 'x' extends past end of file"));
}

TEST(GgufFileTest, RejectsTruncationAtEveryByte) {
  std::string bytes = ValidFile().bytes();
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    std::string path = WriteTemp("cut", bytes.substr(0, cut));
    auto file = GgufFile::Open(path);
    EXPECT_FALSE(file.ok()) << "cut at " << cut;
    std::filesystem::remove(path);
  }
}

TEST(GgufFileTest, RejectsTensorPastEnd) {
  std::string msg = OpenError("past", ValidFile(0, 64).bytes());
  EXPECT_TRUE(Contains(msg, "tensor 'w' extends past end of file")) << msg;
  EXPECT_TRUE(Contains(OpenError("unaligned", ValidFile(0, 4).bytes()), "not aligned"));
}

TEST(GgufFileTest, KeepsUnknownTypesAndNamesThem) {
  std::string path = WriteTemp("unknown", ValidFile(/*tensor_type=*/99).bytes());
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ((*file)->tensors()[0].type, 99u);
  EXPECT_EQ((*file)->tensors()[0].nbytes, 0u);
  EXPECT_EQ(GgufTypeName(99), "unknown(99)");
  EXPECT_EQ(GgufTypeName(static_cast<uint32_t>(GgufType::kQ4_1)), "Q4_1");
  EXPECT_EQ(GgufTypeName(12), "Q4_K");
  std::filesystem::remove(path);
}

// A corrupt tensor table makes names out of other fields' bytes; errors must
// quote them as bounded, printable text.
TEST(GgufFileTest, ShownNameEscapesAndBounds) {
  EXPECT_EQ(ShownName("blk.0.attn_q.weight"), "blk.0.attn_q.weight");
  EXPECT_EQ(ShownName(std::string("a\x00\xc0\n", 4) + "b"), "a\\x00\\xc0\\x0ab");
  const std::string shown = ShownName(std::string(5000, 'x'));
  EXPECT_EQ(shown, std::string(100, 'x') + "...(5000 bytes)");
}

TEST(GgufFileTest, RefusesOverlongTensorNames) {
  Writer w;
  w.Raw("GGUF").Pod<uint32_t>(3).Pod<uint64_t>(1).Pod<uint64_t>(0);
  w.Str(std::string(64, 'n')).Pod<uint32_t>(1).Pod<uint64_t>(8).Pod<uint32_t>(0).Pod<uint64_t>(0);
  w.Pad(32);
  for (int i = 0; i < 8; ++i) w.Pod<float>(0.0f);
  std::string msg = OpenError("longname", w.bytes());
  EXPECT_TRUE(Contains(msg, "tensor 0's name")) << msg;
  EXPECT_TRUE(Contains(msg, "is 64 bytes long (ggml allows 63)")) << msg;
}

TEST(GgufFileTest, RealSmolLm2File) {
  std::string path = std::string(SNAPSERVE_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  ASSERT_TRUE(std::filesystem::exists(path)) << "run `make model`";
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  const GgufFile& f = **file;
  // Facts from gguf-py's GGUFReader.
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(f.data_offset(), 1785664u);
  EXPECT_EQ(f.GetString("general.architecture"), "llama");
  EXPECT_EQ(f.GetInt("llama.attention.head_count_kv"), 3);
  EXPECT_EQ(f.GetString("tokenizer.ggml.pre"), "smollm");
  EXPECT_EQ(f.GetBool("tokenizer.ggml.add_bos_token"), false);
  EXPECT_EQ(f.GetStringArray("tokenizer.ggml.tokens")->size(), 49152u);
  EXPECT_EQ(f.GetStringArray("tokenizer.ggml.merges")->size(), 48900u);
  EXPECT_NEAR(*f.GetFloat("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-9);
  const GgufTensorInfo* emb = f.FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->dims, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(emb->type, static_cast<uint32_t>(GgufType::kQ8_0));
  EXPECT_EQ(emb->nbytes, 30081024u);
}

}  // namespace
}  // namespace snapserve::model
