// The HTTP/1.1 request parser of the OpenAI-compatible API: Beast's, with
// the server's limits. Header-only, so the fuzz harness
// (tests/fuzz/openai_http_fuzzer.cc) runs exactly what the server runs.
#pragma once

#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include <cstddef>

namespace snapserve::server::http {

using RequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;

// A head longer than `max_head_bytes` fails with header_limit (431), a body
// longer than `max_body_bytes` with body_limit (413), as soon as its
// Content-Length or its chunks say so: nothing beyond the limits is buffered.
inline void LimitRequestParser(RequestParser& parser, size_t max_head_bytes,
                               size_t max_body_bytes) {
  parser.header_limit(static_cast<std::uint32_t>(max_head_bytes));
  parser.body_limit(max_body_bytes);
}

}  // namespace snapserve::server::http
