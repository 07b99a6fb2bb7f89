// server/request_conversion: the one status-code table behind ToGrpc and
// GrpcCodeName.
#include "server/request_conversion.h"

#include <gtest/gtest.h>

namespace snapserve::server {
namespace {

TEST(RequestConversionTest, StatusCodesMapAndNameOnce) {
  const StatusCode all[] = {StatusCode::kOk,
                            StatusCode::kInvalidArgument,
                            StatusCode::kResourceExhausted,
                            StatusCode::kDeadlineExceeded,
                            StatusCode::kCancelled,
                            StatusCode::kUnavailable,
                            StatusCode::kNotFound,
                            StatusCode::kUnimplemented,
                            StatusCode::kInternal};
  for (StatusCode c : all) {
    const grpc::Status g = ToGrpc(c == StatusCode::kOk ? Status::Ok() : Status(c, "why"));
    // The gRPC code's name is the engine code's name: one table.
    EXPECT_EQ(GrpcCodeName(g.error_code()), status_code_name(c));
    if (c != StatusCode::kOk) {
      EXPECT_EQ(g.error_message(), "why");
    }
  }
  EXPECT_EQ(ToGrpc(Status::ResourceExhausted("full")).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(GrpcCodeName(grpc::StatusCode::DEADLINE_EXCEEDED), "DEADLINE_EXCEEDED");
  EXPECT_EQ(GrpcCodeName(grpc::StatusCode::ABORTED), "UNKNOWN");  // not an engine code
  EXPECT_EQ(GrpcCodeName(grpc::StatusCode::UNKNOWN), "UNKNOWN");
}

}  // namespace
}  // namespace snapserve::server
