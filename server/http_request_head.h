// The part of an HTTP/1.x request head that /metrics needs: where the head
// ends and its request line (method, target). Header fields are not needed:
// every answer closes the connection, and no supported method has a body.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace snapserve::server {

struct HttpRequestLine {
  std::string method;
  std::string target;  // e.g. "/metrics?x=1"
};

// The length of the head (through its blank line) at the start of `received`,
// or 0 while the blank line has not arrived. Bare LF line ends are accepted
// too (RFC 9112, 2.2).
size_t HttpHeadLength(std::string_view received);

// The request line of a complete head; std::nullopt when it is not
// "METHOD SP target SP HTTP/1.x" (answered 400). Empty lines before it are
// skipped (RFC 9112, 2.2).
std::optional<HttpRequestLine> ParseHttpRequestLine(std::string_view head);

}  // namespace snapserve::server
