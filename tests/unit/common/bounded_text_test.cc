#include "engine/common/bounded_text.h"

#include <gtest/gtest.h>

#include <string>

namespace snapserve {
namespace {

TEST(BoundedTextTest, ShortTextIsUnchanged) {
  EXPECT_EQ(Bounded(""), "");
  EXPECT_EQ(Bounded("wizard"), "wizard");
  const std::string exact(kMaxEchoedBytes, 'x');
  EXPECT_EQ(Bounded(exact), exact);
}

TEST(BoundedTextTest, LongTextKeepsItsStartAndSaysItsLength) {
  const std::string big(1 << 20, 'r');
  const std::string b = Bounded(big);
  EXPECT_EQ(b, std::string(kMaxEchoedBytes, 'r') + "\xE2\x80\xA6(1048576 bytes)");
  EXPECT_LT(b.size(), kMaxEchoedBytes + 32);
  EXPECT_EQ(Bounded("abcdef", 3), "abc\xE2\x80\xA6(6 bytes)");
}

TEST(BoundedTextTest, NeverSplitsAUtf8Character) {
  // "é" is two bytes: a cut after 3 bytes of "aéé" would fall inside the second.
  EXPECT_EQ(Bounded("a\xC3\xA9\xC3\xA9", 4), "a\xC3\xA9\xE2\x80\xA6(5 bytes)");
  // A 4-byte character straddling the cut is dropped whole.
  EXPECT_EQ(Bounded("ab\xF0\x9F\x98\x80z", 4), "ab\xE2\x80\xA6(7 bytes)");
}

}  // namespace
}  // namespace snapserve
