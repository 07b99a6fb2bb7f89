// The JSON bodies the OpenAI HTTP API answers with: whole completions, the
// chunks of a stream, `usage` (with `prompt_tokens_details.cached_tokens`
// and the `kv_compression` block) and logprobs in each endpoint's shape
// (docs/api.md, "The OpenAI-compatible HTTP API").
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "server/http/openai_request.h"

namespace snapserve::server::http {

// What every body of one request repeats.
struct ResponseHeader {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kCompletions;
  std::string id;       // "cmpl-<request id>" or "chatcmpl-<request id>"
  int64_t created = 0;  // Unix seconds
  std::string model;
};

// The raw bytes of a token id (a partial UTF-8 character is possible).
using TokenBytesFn = std::function<std::string(uint32_t)>;

// The JSON text; invalid UTF-8 (a token that is part of a character) becomes
// U+FFFD, the exact bytes stay in the logprobs' `bytes`.
std::string Dump(const nlohmann::json& value);

// "stop" (EOS, a stop sequence, a stop token) or "length"; null otherwise.
nlohmann::json FinishReasonJson(engine::FinishReason reason);

nlohmann::json UsageJson(const engine::Usage& usage);

// Logprobs of `tokens` in the endpoint's shape: chat's {"content": [...]},
// or completions' {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
// `text_offset` counts from *offset, which advances past these tokens.
nlohmann::json LogprobsJson(OpenAiEndpoint endpoint,
                            const std::vector<engine::TokenLogprob>& tokens,
                            const TokenBytesFn& token_bytes, size_t* offset);

// A whole non-streamed answer.
nlohmann::json CompletionJson(const ResponseHeader& header, const std::string& text,
                              engine::FinishReason reason, const engine::Usage& usage,
                              nlohmann::json logprobs);

// One stream chunk holding a delta of text (chat: `role` in the first one)
// and its logprobs (null when not asked for); `finish_reason` null until the
// last chunk. With include_usage every chunk carries "usage": null.
nlohmann::json ChunkJson(const ResponseHeader& header, const std::string& text,
                         nlohmann::json logprobs, nlohmann::json finish_reason, bool first,
                         bool include_usage);

// The extra last chunk of stream_options.include_usage: no choices, usage.
nlohmann::json UsageChunkJson(const ResponseHeader& header, const engine::Usage& usage);

}  // namespace snapserve::server::http
