// The OpenAI-compatible HTTP API's request path up to the engine: Beast's
// request parser with the server's limits (server/http/request_parser.h),
// then the JSON body reader (server/http/openai_request.h). The first byte
// picks the input's form: even, a whole HTTP request (head and body) whose
// body, once complete, goes to the reader; odd, a body alone, so the fuzzer
// need not get HTTP framing right to reach the JSON. Besides not crashing,
// checks what the server relies on: a complete request never holds more body
// than the limit, and a read request has exactly one input of its endpoint's
// kind, a refusal always says why.
#include <boost/asio/buffer.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "server/http/openai_request.h"
#include "server/http/request_parser.h"
#include "tests/fuzz/fuzz_support.h"

using snapserve::fuzz::Check;
namespace http = snapserve::server::http;

namespace {

constexpr size_t kMaxHead = 2048;
constexpr size_t kMaxBody = 4096;

void ReadBody(std::string_view body, http::OpenAiEndpoint endpoint) {
  const http::OpenAiParse parsed = http::ParseOpenAiRequest(body, endpoint);
  if (!parsed.request) {
    Check(!parsed.error.message.empty(), "a refusal without a message");
    return;
  }
  const http::OpenAiRequest& r = *parsed.request;
  Check(r.endpoint == endpoint, "endpoint not kept");
  if (endpoint == http::OpenAiEndpoint::kCompletions) {
    Check(r.prompt.has_value() != r.prompt_ids.has_value(), "not exactly one prompt");
    Check(r.messages.empty(), "messages on the completions endpoint");
  } else {
    Check(!r.prompt && !r.prompt_ids, "a prompt on the chat endpoint");
  }
  Check(!r.include_usage || r.stream, "include_usage without stream");
  Check(!r.max_tokens || *r.max_tokens >= 1, "max_tokens of 0 accepted");
}

void ReadHttp(std::string_view bytes) {
  http::RequestParser parser;
  http::LimitRequestParser(parser, kMaxHead, kMaxBody);
  parser.eager(true);
  boost::system::error_code ec;
  while (!bytes.empty() && !parser.is_done()) {
    const size_t used = parser.put(boost::asio::buffer(bytes.data(), bytes.size()), ec);
    if (ec == boost::beast::http::error::need_more) {
      ec = {};
      // need_more with nothing used: the rest cannot complete this part.
      if (used == 0) break;
    }
    if (ec) return;
    bytes.remove_prefix(used);
  }
  if (!parser.is_done()) {
    // As Beast's own read does: end of input before any byte is no message
    // (put_eof requires that some bytes were parsed).
    if (!parser.got_some()) return;
    parser.put_eof(ec);
    if (ec || !parser.is_done()) return;
  }
  const auto& request = parser.get();
  Check(request.body().size() <= kMaxBody, "a body beyond the limit");
  const std::string_view target(request.target().data(), request.target().size());
  const std::string_view path = target.substr(0, target.find('?'));
  if (path == "/v1/chat/completions") {
    ReadBody(request.body(), http::OpenAiEndpoint::kChatCompletions);
  } else {
    ReadBody(request.body(), http::OpenAiEndpoint::kCompletions);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    ReadHttp(rest);
  } else {
    ReadBody(rest, data[0] % 4 == 1 ? http::OpenAiEndpoint::kCompletions
                                    : http::OpenAiEndpoint::kChatCompletions);
  }
  return 0;
}
