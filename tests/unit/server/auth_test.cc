// Bearer-token authentication (server/auth.h): the token file's parsing, the
// header's parsing, the comparison, and the status a call gets.
#include "server/auth.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace snapserve::server {
namespace {

class TokenFileTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& bytes) {
    std::ofstream(path_, std::ios::binary) << bytes;
    return path_;
  }
  void TearDown() override { std::filesystem::remove(path_); }
  std::string path_ = (std::filesystem::temp_directory_path() /
                       ("snapserve-auth-test-" + std::to_string(::getpid()) + ".token"))
                          .string();
};

TEST_F(TokenFileTest, TrimsOneTrailingLineEnding) {
  EXPECT_EQ(*ReadAuthTokenFile(Write("s3cr3t-token\n")), "s3cr3t-token");
  EXPECT_EQ(*ReadAuthTokenFile(Write("s3cr3t-token\r\n")), "s3cr3t-token");
  EXPECT_EQ(*ReadAuthTokenFile(Write("s3cr3t-token")), "s3cr3t-token");
}

TEST_F(TokenFileTest, RefusesUnreadableEmptyLongAndMultiLineFiles) {
  auto error = [](const StatusOr<std::string>& r) {
    EXPECT_FALSE(r.ok());
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_NE(error(ReadAuthTokenFile("/nonexistent/snapserve.token")).find("cannot read"),
            std::string::npos);
  EXPECT_NE(error(ReadAuthTokenFile(Write(""))).find("empty"), std::string::npos);
  EXPECT_NE(error(ReadAuthTokenFile(Write("\n"))).find("empty"), std::string::npos);
  // The longest accepted token, then one byte more.
  EXPECT_TRUE(ReadAuthTokenFile(Write(std::string(kMaxAuthTokenBytes, 'a') + "\n")).ok());
  EXPECT_NE(error(ReadAuthTokenFile(Write(std::string(kMaxAuthTokenBytes + 1, 'a'))))
                .find("longer than 4096"),
            std::string::npos);
  EXPECT_NE(error(ReadAuthTokenFile(Write(std::string(1 << 20, 'a')))).find("longer than"),
            std::string::npos);
  const std::string two_lines = error(ReadAuthTokenFile(Write("first\nsecond\n")));
  EXPECT_NE(two_lines.find("one line"), std::string::npos);
  EXPECT_EQ(two_lines.find("first"), std::string::npos) << "the error echoes the file";
  EXPECT_FALSE(ReadAuthTokenFile(Write("has space")).ok());
  EXPECT_FALSE(ReadAuthTokenFile(Write("tab\there")).ok());
  EXPECT_FALSE(ReadAuthTokenFile(Write("\n\n")).ok());  // only one line ending is trimmed
}

TEST(ParseBearerTest, AcceptsOnlyTheBearerScheme) {
  EXPECT_EQ(ParseBearer("Bearer abc.def").token, "abc.def");
  EXPECT_TRUE(ParseBearer("bearer abc").ok);  // schemes are case-insensitive (RFC 7235)
  EXPECT_TRUE(ParseBearer("BEARER abc").ok);
  EXPECT_FALSE(ParseBearer("").ok);
  EXPECT_FALSE(ParseBearer("Bearer").ok);
  EXPECT_FALSE(ParseBearer("Bearer ").ok);
  EXPECT_FALSE(ParseBearer("abc").ok);
  EXPECT_FALSE(ParseBearer("Basic YWxhZGRpbjpvcGVuc2VzYW1l").ok);
  EXPECT_FALSE(ParseBearer("Bearerabc").ok);
  EXPECT_FALSE(ParseBearer("Bearer  abc").ok);  // two spaces: the token would start with one
  EXPECT_FALSE(ParseBearer("Bearer abc def").ok);
}

TEST(BearerAuthTest, MatchesOnlyTheExactToken) {
  const BearerAuth auth("correct-horse");
  EXPECT_TRUE(auth.Matches("correct-horse"));
  EXPECT_FALSE(auth.Matches(""));
  EXPECT_FALSE(auth.Matches("correct-hors"));    // prefix
  EXPECT_FALSE(auth.Matches("correct-horsee"));  // one byte more
  EXPECT_FALSE(auth.Matches("Correct-horse"));   // first byte differs
  EXPECT_FALSE(auth.Matches("correct-horsf"));   // last byte differs
  // The padding is zeros: a presented token padded with NULs still differs by length.
  EXPECT_FALSE(auth.Matches(std::string("correct-horse\0", 14)));
  EXPECT_FALSE(auth.Matches(std::string(kMaxAuthTokenBytes, 'c')));
  EXPECT_FALSE(auth.Matches(std::string(kMaxAuthTokenBytes + 1, 'c')));
  // Every single-byte change of the token is refused.
  const std::string token = "correct-horse";
  for (size_t i = 0; i < token.size(); ++i) {
    std::string changed = token;
    changed[i] ^= 1;
    EXPECT_FALSE(auth.Matches(changed)) << i;
  }
  // A token of the maximum length matches itself and not its one-byte change.
  const std::string longest(kMaxAuthTokenBytes, 'z');
  const BearerAuth long_auth(longest);
  EXPECT_TRUE(long_auth.Matches(longest));
  std::string last_changed = longest;
  last_changed.back() = 'y';
  EXPECT_FALSE(long_auth.Matches(last_changed));
}

using Metadata = std::multimap<grpc::string_ref, grpc::string_ref>;

TEST(BearerAuthTest, CheckGivesUnauthenticatedWithoutEchoingTheToken) {
  const BearerAuth auth("s3cr3t");
  EXPECT_TRUE(auth.Check(Metadata{{"authorization", "Bearer s3cr3t"}}).ok());

  const std::string wrong = "Bearer guessed-token-xyz";
  const std::vector<Metadata> refused = {
      {},
      {{"x-other", "Bearer s3cr3t"}},
      {{"authorization", "Basic s3cr3t"}},
      {{"authorization", "s3cr3t"}},
      {{"authorization", wrong}},
      {{"authorization", "Bearer s3cr3u"}},
      {{"authorization", "Bearer s3cr3t"}, {"authorization", "Bearer other"}},
  };
  for (const Metadata& m : refused) {
    const grpc::Status s = auth.Check(m);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(s.error_message().find("guessed"), std::string::npos) << s.error_message();
    EXPECT_EQ(s.error_message().find("s3cr3"), std::string::npos) << s.error_message();
    EXPECT_LT(s.error_message().size(), 80u);
  }
}

}  // namespace
}  // namespace snapserve::server
