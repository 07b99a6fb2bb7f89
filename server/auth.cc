#include "server/auth.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <iterator>

namespace snapserve::server {
namespace {

// What a bearer token may contain: printable ASCII without spaces (RFC 6750's
// b64token is a subset). Anything else cannot arrive intact in a header value,
// so a file holding it is a mistake worth failing startup for.
bool IsTokenChar(unsigned char c) { return c > 0x20 && c < 0x7f; }

}  // namespace

StatusOr<std::string> ReadAuthTokenFile(const std::string& path) {
  const std::string where = "--auth-token-file " + path + ": ";
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::InvalidArgument(where + "cannot read the file");
  // Read one byte past the limit plus a line ending, so an absurdly long file
  // is refused without loading it.
  std::string text(kMaxAuthTokenBytes + 3, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) return Status::InvalidArgument(where + "cannot read the file");
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() == kMaxAuthTokenBytes + 3) {
    return Status::InvalidArgument(where + "longer than " + std::to_string(kMaxAuthTokenBytes) +
                                   " bytes; it must hold one token");
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (!text.empty() && text.back() == '\r') text.pop_back();
  if (text.empty()) return Status::InvalidArgument(where + "the file is empty");
  if (text.size() > kMaxAuthTokenBytes) {
    return Status::InvalidArgument(where + "longer than " + std::to_string(kMaxAuthTokenBytes) +
                                   " bytes; it must hold one token");
  }
  for (unsigned char c : text) {
    if (!IsTokenChar(c)) {
      return Status::InvalidArgument(
          where + "the token must be one line of printable ASCII without spaces");
    }
  }
  return text;
}

BearerParse ParseBearer(std::string_view value) {
  constexpr std::string_view kScheme = "bearer ";
  if (value.size() <= kScheme.size()) return {};
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(value[i])) != kScheme[i]) return {};
  }
  const std::string_view token = value.substr(kScheme.size());
  for (unsigned char c : token) {
    if (!IsTokenChar(c)) return {};
  }
  return {true, token};
}

BearerAuth::BearerAuth(std::string_view token) : size_(token.size()) {
  // ReadAuthTokenFile bounds the size; clamp anyway so a caller's mistake
  // cannot overflow the buffer.
  if (size_ > token_.size()) size_ = token_.size();
  std::copy_n(token.begin(), size_, token_.begin());
}

bool BearerAuth::Matches(std::string_view presented) const {
  if (presented.size() > token_.size()) return false;  // only the public bound leaks
  std::array<unsigned char, kMaxAuthTokenBytes> given{};
  std::copy(presented.begin(), presented.end(), given.begin());
  // Every byte of both padded buffers, no early exit; the length difference
  // joins the accumulator arithmetically, so a wrong length costs the same
  // time as a wrong byte.
  unsigned diff = 0;
  for (size_t i = 0; i < token_.size(); ++i) diff |= token_[i] ^ given[i];
  diff |= static_cast<unsigned>(size_ ^ presented.size());  // both <= kMaxAuthTokenBytes
  // Keep the compiler from turning the accumulation into an early return.
  volatile unsigned result = diff;
  return result == 0;
}

grpc::Status BearerAuth::Check(
    const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const {
  // Messages name what is wrong in general terms and never echo the value.
  const auto [first, last] = metadata.equal_range("authorization");
  if (first == last) {
    return {grpc::StatusCode::UNAUTHENTICATED, "missing 'authorization: Bearer <token>' metadata"};
  }
  if (std::next(first) != last) {
    return {grpc::StatusCode::UNAUTHENTICATED, "more than one 'authorization' metadata entry"};
  }
  const BearerParse parsed = ParseBearer({first->second.data(), first->second.size()});
  if (!parsed.ok) {
    return {grpc::StatusCode::UNAUTHENTICATED, "'authorization' must be 'Bearer <token>'"};
  }
  if (!Matches(parsed.token)) return {grpc::StatusCode::UNAUTHENTICATED, "invalid bearer token"};
  return grpc::Status::OK;
}

}  // namespace snapserve::server
