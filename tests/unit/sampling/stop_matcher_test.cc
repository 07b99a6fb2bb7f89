#include "engine/sampling/stop_matcher.h"

#include <gtest/gtest.h>

namespace snapserve::sampling {
namespace {

StopCriteria Stops(std::vector<std::string> stop, int64_t max_new = 100) {
  StopCriteria c;
  c.max_new_tokens = max_new;
  c.stop = std::move(stop);
  c.eos_token_ids = {2};
  c.stop_token_ids = {7};
  return c;
}

TEST(StopMatcherTest, StopAcrossTokenBoundariesNeverLeaks) {
  StopMatcher m(Stops({"</end>"}));
  std::string streamed;
  for (const std::string piece : {"Hello", " wor", "ld<", "/e", "nd", "> more"}) {
    auto r = m.OnText(piece);
    streamed += r.emit;
    // Nothing of the stop sequence is ever visible, even mid-way.
    EXPECT_EQ(streamed.find('<'), std::string::npos) << streamed;
    if (r.stopped) break;
  }
  EXPECT_EQ(streamed, "Hello world");
  EXPECT_TRUE(m.stopped_on_sequence());
  EXPECT_EQ(m.matched_stop(), "</end>");
  EXPECT_TRUE(m.OnText("again").emit.empty());
  EXPECT_TRUE(m.Flush().empty());
}

TEST(StopMatcherTest, HoldsOnlyWhatCouldStillMatch) {
  StopMatcher m(Stops({"abc"}));
  EXPECT_EQ(m.OnText("xxa").emit, "xx");
  EXPECT_EQ(m.OnText("b").emit, "");
  EXPECT_EQ(m.OnText("d").emit, "abd");  // the prefix did not continue
  EXPECT_EQ(m.OnText("aab").emit, "a");  // "ab" may still become "abc"
  auto r = m.OnText("c tail");
  EXPECT_EQ(r.emit, "");
  EXPECT_TRUE(r.stopped);
}

TEST(StopMatcherTest, StopInsideOneTokenKeepsTextBefore) {
  StopMatcher m(Stops({"\n\n"}));
  auto r = m.OnText("line one\n\nline two");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.emit, "line one");
}

TEST(StopMatcherTest, EarliestOfSeveralStopsWins) {
  StopMatcher m(Stops({"world", "lo w", "o"}));
  auto r = m.OnText("hello world");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.emit, "hel");  // "lo w" starts before "o"
  EXPECT_EQ(m.matched_stop(), "lo w");
}

TEST(StopMatcherTest, FlushReleasesHeldPrefix) {
  StopMatcher m(Stops({"STOP"}));
  EXPECT_EQ(m.OnText("go ST").emit, "go ");
  EXPECT_EQ(m.Flush(), "ST");
}

TEST(StopMatcherTest, Utf8CharactersAreNeverSplit) {
  StopMatcher m(Stops({}));
  // "é" is C3 A9, "€" is E2 82 AC, "😀" is F0 9F 98 80.
  EXPECT_EQ(m.OnText("caf\xC3").emit, "caf");
  EXPECT_EQ(m.OnText("\xA9 \xE2\x82").emit, "\xC3\xA9 ");
  EXPECT_EQ(m.OnText("\xAC\xF0\x9F").emit, "\xE2\x82\xAC");
  EXPECT_EQ(m.OnText("\x98").emit, "");
  EXPECT_EQ(m.OnText("\x80!").emit, "\xF0\x9F\x98\x80!");
}

TEST(StopMatcherTest, Utf8StopSequences) {
  StopMatcher m(Stops({"終わり"}));
  std::string streamed;
  const std::string text = "これで終わりです";
  bool stopped = false;
  // One byte at a time: the worst case for both holds.
  for (char c : text) {
    auto r = m.OnText(std::string(1, c));
    streamed += r.emit;
    if (r.stopped) {
      stopped = true;
      break;
    }
  }
  EXPECT_TRUE(stopped);
  EXPECT_EQ(streamed, "これで");
}

TEST(StopMatcherTest, TokenBookkeeping) {
  StopMatcher m(Stops({}, 3));
  EXPECT_EQ(m.OnToken(5), std::nullopt);
  EXPECT_EQ(m.OnToken(7), FinishReason::kStopToken);
  StopMatcher eos(Stops({}, 3));
  EXPECT_EQ(eos.OnToken(2), FinishReason::kEos);
  StopMatcher length(Stops({}, 3));
  EXPECT_EQ(length.OnToken(5), std::nullopt);
  EXPECT_EQ(length.OnToken(5), std::nullopt);
  EXPECT_EQ(length.OnToken(5), FinishReason::kLength);
  EXPECT_EQ(length.num_generated(), 3);
  // EOS as the last allowed token reports EOS, not length.
  StopMatcher last(Stops({}, 1));
  EXPECT_EQ(last.OnToken(2), FinishReason::kEos);
}

TEST(StopMatcherTest, IgnoreEos) {
  StopCriteria c = Stops({}, 2);
  c.ignore_eos = true;
  StopMatcher m(c);
  EXPECT_EQ(m.OnToken(2), std::nullopt);
  EXPECT_EQ(m.OnToken(2), FinishReason::kLength);
  EXPECT_STREQ(finish_reason_name(FinishReason::kStopSequence), "stop_sequence");
}

TEST(StopMatcherTest, EmptyStopStringsAreIgnored) {
  StopMatcher m(Stops({""}));
  auto r = m.OnText("abc");
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(r.emit, "abc");
}

}  // namespace
}  // namespace snapserve::sampling
