// Expected splits come from HF tokenizers' pre_tokenize_str on the same input
// (ByteLevel regex for gpt2, the Llama-3 Split regex, Digits+ByteLevel for
// SmolLM2), copied here as literals; tests/python/test_tokenizer_parity.py
// checks many more inputs against the live library.
#include "engine/tokenizer/pretokenizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace snapserve::tokenizer {
namespace {

std::vector<std::string> Split(PreTokenizerType type, std::string_view text) {
  std::vector<std::string> out;
  for (std::string_view p : PreTokenize(type, text)) out.emplace_back(p);
  return out;
}

using V = std::vector<std::string>;

TEST(PreTokenizerTest, Gpt2WordsSpacesAndContractions) {
  EXPECT_EQ(Split(PreTokenizerType::kGpt2, "Hello world, it's  me"),
            (V{"Hello", " world", ",", " it", "'s", " ", " me"}));
}

TEST(PreTokenizerTest, Gpt2TrailingSpacesAndNewlines) {
  EXPECT_EQ(Split(PreTokenizerType::kGpt2, "a\n\n  b   "), (V{"a", "\n\n ", " b", "   "}));
  EXPECT_EQ(Split(PreTokenizerType::kGpt2, "x\n y"), (V{"x", "\n", " y"}));
}

TEST(PreTokenizerTest, Gpt2NumbersAndPunctuation) {
  EXPECT_EQ(Split(PreTokenizerType::kGpt2, "abc 12345!?  ..."),
            (V{"abc", " 12345", "!?", " ", " ..."}));
}

TEST(PreTokenizerTest, SmolLmSplitsEveryDigit) {
  // Digits(individual_digits=true) isolates each \p{N} first, so the space
  // before a number stays alone instead of prefixing it.
  EXPECT_EQ(Split(PreTokenizerType::kSmolLM, "a 12\xD9\xA3 x"),
            (V{"a", " ", "1", "2", "\xD9\xA3", " x"}));
}

TEST(PreTokenizerTest, Llama3GroupsDigitsByThree) {
  EXPECT_EQ(Split(PreTokenizerType::kLlama3, "1234567 I'M"), (V{"123", "456", "7", " I", "'M"}));
}

TEST(PreTokenizerTest, Llama3NewlinesAttachToPunctuation) {
  EXPECT_EQ(Split(PreTokenizerType::kLlama3, "x;\n\n  \ny"), (V{"x", ";\n\n", "  \n", "y"}));
}

TEST(PreTokenizerTest, CjkAndEmojiAreLettersAndSymbols) {
  // 日本 are letters (Lo); the emoji is "other".
  EXPECT_EQ(Split(PreTokenizerType::kGpt2, "\xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80!"),
            (V{"\xE6\x97\xA5\xE6\x9C\xAC", " \xF0\x9F\x98\x80!"}));
}

TEST(PreTokenizerTest, PiecesCoverInvalidUtf8) {
  std::string text = "ab\xFF\xFE cd";
  std::string joined;
  for (const auto& p : Split(PreTokenizerType::kGpt2, text)) joined += p;
  EXPECT_EQ(joined, text);
}

TEST(PreTokenizerTest, UnknownGgufNameIsUnimplemented) {
  EXPECT_EQ(PreTokenizerFromGgufName("falcon").status().code(), StatusCode::kUnimplemented);
  EXPECT_TRUE(PreTokenizerFromGgufName("smollm").ok());
}

}  // namespace
}  // namespace snapserve::tokenizer
