// Optional bearer-token authentication of the Generation service
// (--auth-token-file; README, "Authentication"; docs/api.md, "Status codes").
//
// Where the check runs: in the Generation service's entry points, before
// admission, not in gRPC's own hooks. gRPC 1.51 offers two hooks and neither
// fits: an AuthMetadataProcessor attaches to server credentials and
// InsecureServerCredentials aborts the process when one is set (plaintext
// behind a mesh or gateway is this service's usual deployment), and a server
// interceptor can only Proceed (Hijack is client-side) or cancel the call
// (CANCELLED), so it cannot end a call with UNAUTHENTICATED. Checking in the service also leaves
// grpc.health.v1 and reflection open for kubelet probes, as intended.
#pragma once

#include <array>
#include <cstddef>
#include <map>
#include <string>
#include <string_view>

#include <grpcpp/support/status.h>
#include <grpcpp/support/string_ref.h>

#include "engine/common/status_or.h"

namespace snapserve::server {

// The longest token accepted in the file (and in a request): far above any
// real bearer token, small enough to compare in constant time every call.
inline constexpr size_t kMaxAuthTokenBytes = 4096;

// Reads the token file: one token, a single trailing "\n" or "\r\n" removed.
// Errors (unreadable, empty, longer than kMaxAuthTokenBytes, characters other
// than printable ASCII without spaces, more than one line) name the path but
// never the file's contents.
StatusOr<std::string> ReadAuthTokenFile(const std::string& path);

// The token part of an `authorization` value "Bearer <token>" (scheme
// case-insensitive, RFC 7235; exactly one space); ok is false when the value
// has another form (no scheme, another scheme, an empty token).
struct BearerParse {
  bool ok = false;
  std::string_view token;
};
BearerParse ParseBearer(std::string_view header_value);

// Compares `presented` with the configured token in time that depends on
// neither the secret's bytes nor its length: both sit in zero-padded
// fixed-size buffers and every byte is compared, the lengths folded in
// without a branch. Presented tokens longer than the maximum fail at once
// (that reveals only the public maximum).
class BearerAuth {
 public:
  explicit BearerAuth(std::string_view token);

  bool Matches(std::string_view presented) const;

  // OK, or UNAUTHENTICATED with a short message that never echoes what the
  // client sent. Reads the call's `authorization` metadata.
  grpc::Status Check(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const;

 private:
  std::array<unsigned char, kMaxAuthTokenBytes> token_{};
  size_t size_ = 0;
};

}  // namespace snapserve::server
