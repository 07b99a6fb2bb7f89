#include "server/http/openai_response.h"

namespace snapserve::server::http {
namespace {

using nlohmann::json;

// The engine reports prompt tokens served from a prefix cache once its Usage
// has the field; until then none are.
template <class U>
uint64_t CachedPromptTokens(const U& usage) {
  if constexpr (requires { usage.cached_prompt_tokens; }) {
    return usage.cached_prompt_tokens;
  } else {
    return 0;
  }
}

json Bytes(const std::string& bytes) {
  json out = json::array();
  for (unsigned char b : bytes) out.push_back(b);
  return out;
}

json ChatToken(uint32_t id, double logprob, const TokenBytesFn& token_bytes) {
  const std::string bytes = token_bytes(id);
  return {{"token", bytes}, {"logprob", logprob}, {"bytes", Bytes(bytes)}};
}

const char* ObjectName(OpenAiEndpoint endpoint, bool chunk) {
  if (endpoint == OpenAiEndpoint::kCompletions) return "text_completion";
  return chunk ? "chat.completion.chunk" : "chat.completion";
}

json Envelope(const ResponseHeader& header, bool chunk) {
  return {{"id", header.id},
          {"object", ObjectName(header.endpoint, chunk)},
          {"created", header.created},
          {"model", header.model}};
}

}  // namespace

std::string Dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

json FinishReasonJson(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kLength:
      return "length";
    case engine::FinishReason::kEos:
    case engine::FinishReason::kStopSequence:
    case engine::FinishReason::kStopToken:
      return "stop";
    case engine::FinishReason::kUnspecified:
      break;
  }
  return nullptr;
}

json UsageJson(const engine::Usage& u) {
  return {
      {"prompt_tokens", u.prompt_tokens},
      {"completion_tokens", u.completion_tokens},
      {"total_tokens", uint64_t{u.prompt_tokens} + u.completion_tokens},
      {"prompt_tokens_details", {{"cached_tokens", CachedPromptTokens(u)}}},
      // The extension: what compression did to this request's prompt KV, as
      // gRPC's Usage reports it (docs/api.md, "Usage").
      {"kv_compression",
       {{"method", engine::kv_method_name(u.kv_method)},
        {"original_entries", u.kv_prompt_entries},
        {"kept_entries", u.kv_kept_entries},
        {"kept_entries_total", u.kv_kept_entries_total},
        {"compression_ratio", u.compression_ratio},
        {"bytes_held", u.kv_bytes_held},
        {"retained_attention",
         u.retained_attention >= 0 ? json(u.retained_attention) : json(nullptr)}}},
  };
}

json LogprobsJson(OpenAiEndpoint endpoint, const std::vector<engine::TokenLogprob>& tokens,
                  const TokenBytesFn& token_bytes, size_t* offset) {
  if (endpoint == OpenAiEndpoint::kChatCompletions) {
    json content = json::array();
    for (const engine::TokenLogprob& t : tokens) {
      json entry = ChatToken(t.token_id, t.logprob, token_bytes);
      json top = json::array();
      for (const engine::TopLogprob& alt : t.top_logprobs) {
        top.push_back(ChatToken(alt.token_id, alt.logprob, token_bytes));
      }
      entry["top_logprobs"] = std::move(top);
      content.push_back(std::move(entry));
    }
    return {{"content", std::move(content)}};
  }
  json strings = json::array(), logprobs = json::array(), tops = json::array(),
       offsets = json::array();
  for (const engine::TokenLogprob& t : tokens) {
    const std::string bytes = token_bytes(t.token_id);
    strings.push_back(bytes);
    logprobs.push_back(t.logprob);
    json top = json::object();
    for (const engine::TopLogprob& alt : t.top_logprobs)
      top[token_bytes(alt.token_id)] = alt.logprob;
    tops.push_back(std::move(top));
    offsets.push_back(*offset);
    *offset += bytes.size();
  }
  return {{"tokens", std::move(strings)},
          {"token_logprobs", std::move(logprobs)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

json CompletionJson(const ResponseHeader& header, const std::string& text,
                    engine::FinishReason reason, const engine::Usage& usage, json logprobs) {
  json choice = {
      {"index", 0}, {"logprobs", std::move(logprobs)}, {"finish_reason", FinishReasonJson(reason)}};
  if (header.endpoint == OpenAiEndpoint::kCompletions) {
    choice["text"] = text;
  } else {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  }
  json body = Envelope(header, false);
  body["choices"] = json::array({std::move(choice)});
  body["usage"] = UsageJson(usage);
  return body;
}

json ChunkJson(const ResponseHeader& header, const std::string& text, json logprobs,
               json finish_reason, bool first, bool include_usage) {
  json choice = {
      {"index", 0}, {"logprobs", std::move(logprobs)}, {"finish_reason", std::move(finish_reason)}};
  if (header.endpoint == OpenAiEndpoint::kCompletions) {
    choice["text"] = text;
  } else {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (first || !text.empty()) delta["content"] = text;
    choice["delta"] = std::move(delta);
  }
  json body = Envelope(header, true);
  body["choices"] = json::array({std::move(choice)});
  if (include_usage) body["usage"] = nullptr;
  return body;
}

json UsageChunkJson(const ResponseHeader& header, const engine::Usage& usage) {
  json body = Envelope(header, true);
  body["choices"] = json::array();
  body["usage"] = UsageJson(usage);
  return body;
}

}  // namespace snapserve::server::http
