#include "server/http_request_head.h"

namespace snapserve::server {

size_t HttpHeadLength(std::string_view received) {
  // A head ends at its first empty line: "\n" followed by "\r\n" or "\n".
  for (size_t i = received.find('\n'); i != std::string_view::npos;
       i = received.find('\n', i + 1)) {
    if (i + 1 < received.size() && received[i + 1] == '\n') return i + 2;
    if (i + 2 < received.size() && received[i + 1] == '\r' && received[i + 2] == '\n') {
      return i + 3;
    }
  }
  return 0;
}

std::optional<HttpRequestLine> ParseHttpRequestLine(std::string_view head) {
  while (!head.empty() && (head.front() == '\r' || head.front() == '\n')) head.remove_prefix(1);
  std::string_view line = head.substr(0, head.find('\n'));
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  const size_t first_space = line.find(' ');
  const size_t last_space = line.rfind(' ');
  if (first_space == std::string_view::npos || first_space == 0 || last_space == first_space + 1 ||
      last_space == first_space) {
    return std::nullopt;
  }
  const std::string_view version = line.substr(last_space + 1);
  if (version != "HTTP/1.1" && version != "HTTP/1.0") return std::nullopt;
  const std::string_view target = line.substr(first_space + 1, last_space - first_space - 1);
  if (target.find(' ') != std::string_view::npos) return std::nullopt;
  return HttpRequestLine{std::string(line.substr(0, first_space)), std::string(target)};
}

}  // namespace snapserve::server
