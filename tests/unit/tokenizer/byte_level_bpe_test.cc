// BPE merges on tiny hand-made vocabularies: the expected ids follow from the
// merge ranks by hand (lowest rank first, leftmost on ties).
#include "engine/tokenizer/byte_level_bpe.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace snapserve::tokenizer {
namespace {

using Merges = std::vector<std::pair<std::string, std::string>>;

std::vector<int32_t> Encode(const ByteLevelBpe& bpe, std::string_view piece) {
  std::vector<int32_t> ids;
  bpe.Encode(piece, &ids);
  return ids;
}

TEST(ByteLevelBpeTest, ByteTableMatchesGpt2) {
  EXPECT_EQ(ByteToCodePoint('a'), static_cast<uint32_t>('a'));
  EXPECT_EQ(ByteToCodePoint(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(ByteToCodePoint('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(ByteToCodePoint(0xAD), 0x143u);  // the last shifted byte
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(ByteFromCodePoint(ByteToCodePoint(static_cast<uint8_t>(b))), b);
  }
  EXPECT_EQ(ByteFromCodePoint(' '), -1);
}

TEST(ByteLevelBpeTest, LowestRankMergesFirst) {
  //                                 0    1    2    3     4     5
  std::vector<std::string> vocab = {"a", "b", "c", "ab", "bc", "abc"};
  auto first_ab = ByteLevelBpe::Create(vocab, Merges{{"a", "b"}, {"b", "c"}, {"ab", "c"}}, false);
  ASSERT_TRUE(first_ab.ok());
  EXPECT_EQ(Encode(*first_ab, "abc"), (std::vector<int32_t>{5}));
  auto first_bc = ByteLevelBpe::Create(vocab, Merges{{"b", "c"}, {"a", "b"}, {"ab", "c"}}, false);
  ASSERT_TRUE(first_bc.ok());
  EXPECT_EQ(Encode(*first_bc, "abc"), (std::vector<int32_t>{0, 4}));
}

TEST(ByteLevelBpeTest, TiesMergeLeftmostFirst) {
  std::vector<std::string> vocab = {"a", "aa"};
  auto bpe = ByteLevelBpe::Create(vocab, Merges{{"a", "a"}}, false);
  ASSERT_TRUE(bpe.ok());
  EXPECT_EQ(Encode(*bpe, "aaa"), (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(Encode(*bpe, "aaaa"), (std::vector<int32_t>{1, 1}));
}

TEST(ByteLevelBpeTest, SpacesUseTheirByteLevelForm) {
  std::vector<std::string> vocab = {"\xC4\xA0", "x", "\xC4\xA0x"};  // Ġ, x, Ġx
  auto bpe = ByteLevelBpe::Create(vocab, Merges{{"\xC4\xA0", "x"}}, false);
  ASSERT_TRUE(bpe.ok());
  EXPECT_EQ(Encode(*bpe, " x"), (std::vector<int32_t>{2}));
  EXPECT_EQ(bpe->TokenBytes(2), " x");
}

TEST(ByteLevelBpeTest, IgnoreMergesTakesWholeWords) {
  // "abc" is in the vocabulary but no merge path reaches it.
  std::vector<std::string> vocab = {"a", "b", "c", "ab", "abc"};
  auto merging = ByteLevelBpe::Create(vocab, Merges{{"a", "b"}}, false);
  auto whole = ByteLevelBpe::Create(vocab, Merges{{"a", "b"}}, true);
  ASSERT_TRUE(merging.ok() && whole.ok());
  EXPECT_EQ(Encode(*merging, "abc"), (std::vector<int32_t>{3, 2}));
  EXPECT_EQ(Encode(*whole, "abc"), (std::vector<int32_t>{4}));
}

TEST(ByteLevelBpeTest, MergeOfUnknownTokenIsAnError) {
  auto bpe = ByteLevelBpe::Create({"a", "b"}, Merges{{"a", "b"}}, false);
  ASSERT_FALSE(bpe.ok());
  EXPECT_NE(bpe.status().message().find("merge 0"), std::string::npos);
}

TEST(ByteLevelBpeTest, AddedTokenTextDecodesRaw) {
  auto bpe = ByteLevelBpe::Create({"a", "<|x y|>"}, Merges{}, false);
  ASSERT_TRUE(bpe.ok());
  EXPECT_EQ(bpe->TokenBytes(1), "<|x y|>");  // ' ' stands for no byte
}

}  // namespace
}  // namespace snapserve::tokenizer
