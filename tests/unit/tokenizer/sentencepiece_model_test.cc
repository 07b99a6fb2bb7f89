// SentencePiece pieces to bytes, per-byte replacement, and load errors.
// Encoding itself is checked against transformers and the sentencepiece
// library in tests/python/test_sentencepiece_parity.py (a model must be
// trained first, which needs the Python package).
#include "engine/tokenizer/sentencepiece_model.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/unicode.h"

namespace snapserve::tokenizer {
namespace {

TEST(SentencePieceBytesTest, SpaceSymbolIsASpace) {
  EXPECT_EQ(SentencePieceBytes("\xE2\x96\x81hello", false), " hello");
  EXPECT_EQ(SentencePieceBytes("\xE2\x96\x81\xE2\x96\x81", false), "  ");
  EXPECT_EQ(SentencePieceBytes("a\xE2\x96\x81"
                               "b",
                               false),
            "a b");
  EXPECT_EQ(SentencePieceBytes("\xE6\x97\xA5", false), "\xE6\x97\xA5");  // other text is as is
}

TEST(SentencePieceBytesTest, BytePieceIsThatByte) {
  EXPECT_EQ(SentencePieceBytes("<0x0A>", true), "\n");
  EXPECT_EQ(SentencePieceBytes("<0xE3>", true), "\xE3");
  EXPECT_EQ(SentencePieceBytes("<0xff>", true), "\xFF");
  EXPECT_EQ(SentencePieceBytes("<0x00>", true), std::string(1, '\0'));
  // Only pieces the model marks as byte pieces; a look-alike text stays text.
  EXPECT_EQ(SentencePieceBytes("<0x0A>", false), "<0x0A>");
  EXPECT_EQ(SentencePieceBytes("<0xZZ>", true), "<0xZZ>");
}

TEST(Utf8LossyPerByteTest, EveryInvalidByteIsOneReplacement) {
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(Utf8LossyPerByte("A\xFF"), "A" + fffd);
  EXPECT_EQ(Utf8LossyPerByte("\xE3\x81x"), fffd + fffd + "x");
  EXPECT_EQ(Utf8Lossy("\xE3\x81x"), fffd + "x");  // unlike the maximal-subpart rule
  EXPECT_EQ(Utf8LossyPerByte("\xF0\x9F\x98\x80\xED\xA0\x80"),
            "\xF0\x9F\x98\x80" + fffd + fffd + fffd);
  EXPECT_EQ(Utf8LossyPerByte("plain \xC3\xA9"), "plain \xC3\xA9");
}

class SentencePieceLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("sp_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& bytes) {
    std::string path = (dir_ / "tokenizer.model").string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(SentencePieceLoadTest, MissingFileIsNotFoundNamingIt) {
  const std::string path = (dir_ / "tokenizer.model").string();
  auto m = SentencePieceModel::Load(path);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(),
            SentencePieceModel::Available() ? StatusCode::kNotFound : StatusCode::kUnimplemented);
  EXPECT_EQ(m.status().message().rfind(path + ": ", 0), 0u) << m.status().message();
}

TEST_F(SentencePieceLoadTest, CorruptFileIsInvalidArgumentNamingIt) {
  const std::string path = Write("\x0a\xff\xff not a model");
  auto m = SentencePieceModel::Load(path);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message().rfind(path + ": ", 0), 0u) << m.status().message();
  if (SentencePieceModel::Available()) {
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(m.status().message().find("not a valid SentencePiece model"), std::string::npos);
  } else {
    EXPECT_NE(m.status().message().find("built without SentencePiece"), std::string::npos);
  }
}

TEST_F(SentencePieceLoadTest, DirectoryWithCorruptModelFailsNamingTheFile) {
  const std::string path = Write("garbage");
  auto t = Tokenizer::FromHfDirectory(dir_.string());
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find(path), std::string::npos) << t.status().message();
}

TEST_F(SentencePieceLoadTest, ByteLevelTokenizerJsonWinsOverTokenizerModel) {
  // A byte-level tokenizer.json is loaded as such even next to a tokenizer.model
  // (here a broken one, which must then not be read at all).
  Write("garbage");
  std::ofstream(dir_ / "tokenizer.json") << R"({"normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "decoder": {"type": "ByteLevel"}, "added_tokens": [],
    "model": {"type": "BPE", "merges": [], "vocab": {"a": 0, "b": 1}}})";
  auto t = Tokenizer::FromHfDirectory(dir_.string());
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ((*t)->Encode("ab", false), (std::vector<int32_t>{0, 1}));
}

TEST_F(SentencePieceLoadTest, DirectoryWithNeitherFileIsNotFound) {
  auto t = Tokenizer::FromHfDirectory(dir_.string());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_NE(t.status().message().find("tokenizer.model"), std::string::npos);
}

}  // namespace
}  // namespace snapserve::tokenizer
