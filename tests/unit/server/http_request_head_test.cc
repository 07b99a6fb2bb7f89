// server/http_request_head: where a request head ends and its request line.
#include "server/http_request_head.h"

#include <gtest/gtest.h>

namespace snapserve::server {
namespace {

TEST(HttpRequestHeadTest, HeadEndsAtTheFirstEmptyLine) {
  EXPECT_EQ(HttpHeadLength("GET / HTTP/1.1\r\nHost: x\r\n"), 0u);
  EXPECT_EQ(HttpHeadLength("GET / HTTP/1.1\r\nHost: x\r\n\r\nbody"), 27u);
  EXPECT_EQ(HttpHeadLength("GET / HTTP/1.1\nHost: x\n\n"), 24u);  // bare LF
  EXPECT_EQ(HttpHeadLength(""), 0u);
}

TEST(HttpRequestHeadTest, ParsesTheRequestLine) {
  auto line = ParseHttpRequestLine("\r\nGET /metrics?a=b HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(line.has_value());
  EXPECT_EQ(line->method, "GET");
  EXPECT_EQ(line->target, "/metrics?a=b");
  line = ParseHttpRequestLine("HEAD / HTTP/1.0\n\n");
  ASSERT_TRUE(line.has_value());
  EXPECT_EQ(line->method, "HEAD");
}

TEST(HttpRequestHeadTest, RejectsMalformedLines) {
  for (const char* bad :
       {"GET /metrics\r\n\r\n", "GET  HTTP/1.1\r\n\r\n", " / HTTP/1.1\r\n\r\n",
        "GET /a b HTTP/1.1\r\n\r\n", "GET / HTTP/2\r\n\r\n", "\r\n\r\n", "GARBAGE\r\n\r\n"}) {
    EXPECT_FALSE(ParseHttpRequestLine(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace snapserve::server
