// Strings that come from a client (chat roles, request ids, model names) or
// from a model's files (token and template names) end up in Status messages
// and log lines. Echoed whole, one request or one bad file can produce
// megabyte-long errors and log lines; Bounded() keeps the useful start and
// says how long the original was.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace snapserve {

// Enough to recognise any name a person would type.
inline constexpr size_t kMaxEchoedBytes = 200;

// `text` itself when at most `max_bytes` long; otherwise its first bytes (cut
// before a UTF-8 character that would not fit whole) followed by
// "…(N bytes)", where N is the length of `text`.
std::string Bounded(std::string_view text, size_t max_bytes = kMaxEchoedBytes);

}  // namespace snapserve
