#include "engine/common/status.h"

#include <gtest/gtest.h>

#include <iterator>
#include <set>
#include <string>

namespace snapserve {
namespace {

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, CarriesCodeAndMessage) {
  Status s = Status::InvalidArgument("sampling.temperature: must not be NaN");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.ToString(), "INVALID_ARGUMENT: sampling.temperature: must not be NaN");
}

TEST(StatusTest, CodeNamesMatchGrpcSpelling) {
  EXPECT_STREQ(status_code_name(StatusCode::kResourceExhausted), "RESOURCE_EXHAUSTED");
  EXPECT_STREQ(status_code_name(StatusCode::kDeadlineExceeded), "DEADLINE_EXCEEDED");
  EXPECT_STREQ(status_code_name(StatusCode::kUnavailable), "UNAVAILABLE");
}

TEST(StatusTest, EveryCodeHasItsOwnName) {
  const StatusCode all[] = {StatusCode::kOk,
                            StatusCode::kInvalidArgument,
                            StatusCode::kResourceExhausted,
                            StatusCode::kDeadlineExceeded,
                            StatusCode::kCancelled,
                            StatusCode::kUnavailable,
                            StatusCode::kNotFound,
                            StatusCode::kUnimplemented,
                            StatusCode::kInternal};
  std::set<std::string> names;
  for (StatusCode c : all) {
    const std::string name = status_code_name(c);
    EXPECT_NE(name, "UNKNOWN");
    names.insert(name);
  }
  EXPECT_EQ(names.size(), std::size(all));
}

}  // namespace
}  // namespace snapserve
