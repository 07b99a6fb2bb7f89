// Errors cross module boundaries as a Status value, never as exceptions
// (modelled on Triton's status.h). The codes mirror the gRPC status codes the
// server maps them to in exactly one place (ToGrpc in
// server/request_conversion.cc; docs/api.md, "Status codes"), but this header
// includes nothing from gRPC.
#pragma once

#include <string>
#include <utility>

namespace snapserve {

enum class StatusCode {
  kOk,
  kInvalidArgument,
  kResourceExhausted,
  kDeadlineExceeded,
  kCancelled,
  kUnavailable,
  kNotFound,
  kUnimplemented,
  kInternal,
};

// Returns the canonical upper-case name ("INVALID_ARGUMENT", ...).
const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  static Status InvalidArgument(std::string m) {
    return {StatusCode::kInvalidArgument, std::move(m)};
  }
  static Status ResourceExhausted(std::string m) {
    return {StatusCode::kResourceExhausted, std::move(m)};
  }
  static Status DeadlineExceeded(std::string m) {
    return {StatusCode::kDeadlineExceeded, std::move(m)};
  }
  static Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace snapserve
