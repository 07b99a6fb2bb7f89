// W3C traceparent parsing and trace/span ids (server/tracing/trace_context.h),
// against the examples and rules of the Trace Context specification
// (https://www.w3.org/TR/trace-context/, "traceparent Header").
#include "server/tracing/trace_context.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace snapserve::server::tracing {
namespace {

// The specification's own example.
constexpr char kExample[] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

TEST(TraceParentTest, ParsesTheSpecificationsExample) {
  const auto p = ParseTraceParent(kExample);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(ToHex(p->trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(ToHex(p->span_id), "00f067aa0ba902b7");
  EXPECT_EQ(p->flags, 1);
  EXPECT_TRUE(p->sampled());
}

TEST(TraceParentTest, ReadsTheSampledFlagAsBitZero) {
  EXPECT_FALSE(
      ParseTraceParent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")->sampled());
  // Other bits are future flags: kept, and they leave bit 0 alone.
  const auto p = ParseTraceParent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-fe");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->flags, 0xfe);
  EXPECT_FALSE(p->sampled());
}

TEST(TraceParentTest, IgnoresSurroundingSpacesAndTabs) {
  EXPECT_TRUE(ParseTraceParent(std::string(" \t") + kExample + " ").has_value());
}

TEST(TraceParentTest, RefusesMalformedHeaders) {
  for (const char* bad : {
           "",
           "00",
           // uppercase hex is invalid
           "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",
           // all-zero trace id or parent id
           "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
           "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
           // version ff is forbidden
           "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
           // version 00 has exactly four fields
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
           // wrong lengths and separators
           "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
           "00-4bf92f3577b34da6a3ce929d0e0e47366-00f067aa0ba902b-01",
           "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
           "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7_01",
           // non-hex characters
           "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
           "00-4bf92f3577b34da6a3ce929d0e0e473z-00f067aa0ba902b7-01",
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
       }) {
    EXPECT_FALSE(ParseTraceParent(bad).has_value()) << bad;
  }
}

TEST(TraceParentTest, AcceptsALaterVersionWithMoreFields) {
  // A parser of version 00 reads a later version's first four fields and
  // ignores what follows a '-'.
  const auto p =
      ParseTraceParent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(ToHex(p->span_id), "00f067aa0ba902b7");
  EXPECT_TRUE(
      ParseTraceParent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").has_value());
  // ... but not one whose fifth field is glued to the flags.
  EXPECT_FALSE(
      ParseTraceParent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x").has_value());
}

TEST(TraceIdsTest, NewIdsAreNonZeroAndDistinct) {
  std::set<std::string> traces;
  std::set<std::string> spans;
  for (int i = 0; i < 1000; ++i) {
    const TraceId t = NewTraceId();
    const SpanId s = NewSpanId();
    EXPECT_FALSE(IsZero(t));
    EXPECT_FALSE(IsZero(s));
    traces.insert(ToHex(t));
    spans.insert(ToHex(s));
  }
  // 1000 draws of 128 or 64 random bits: a collision would mean a broken source.
  EXPECT_EQ(traces.size(), 1000u);
  EXPECT_EQ(spans.size(), 1000u);
}

TEST(TraceIdsTest, NewIdsRoundTripThroughTraceparent) {
  const TraceId t = NewTraceId();
  const SpanId s = NewSpanId();
  const auto p = ParseTraceParent("00-" + ToHex(t) + "-" + ToHex(s) + "-01");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->trace_id, t);
  EXPECT_EQ(p->span_id, s);
}

}  // namespace
}  // namespace snapserve::server::tracing
