// The body of an OpenAI `POST /v1/completions` or `POST /v1/chat/completions`
// request, read into a plain struct (docs/api.md, "The OpenAI-compatible HTTP
// API"). Only the JSON's shape is checked here: types, the fields this server
// refuses (n > 1, penalties, tools...), one prompt per request. Values are
// checked where gRPC's are (the engine's validation), after
// openai_conversion.h turns this into a GenerateRequest. Needs neither
// protobuf nor the engine, so the fuzz harness builds it alone.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace snapserve::server::http {

enum class OpenAiEndpoint { kCompletions, kChatCompletions };

struct OpenAiMessage {
  std::string role;
  std::string content;
};

// The `kv_compression` extension object; unset fields take the server's
// defaults, as gRPC's KvCompression.
struct OpenAiKvCompression {
  // "snapkv", "streaming_llm", "adakv", "pyramidkv", "keydiff", "none"
  std::optional<std::string> method;
  std::optional<std::string> pooling;  // "max", "avg"
  uint32_t capacity = 0;
  uint32_t window = 0;
  uint32_t kernel = 0;
};

struct OpenAiRequest {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kCompletions;
  std::optional<std::string> model;
  // Completions: `prompt` as text or token ids; chat: `messages`.
  std::optional<std::string> prompt;
  std::optional<std::vector<uint32_t>> prompt_ids;
  std::vector<OpenAiMessage> messages;

  std::optional<uint32_t> max_tokens;  // unset: the server's default
  float temperature = 1;               // OpenAI's default: sampling, not greedy
  float top_p = 1;
  uint32_t top_k = 0;            // extension (as vLLM's); 0: off
  float repetition_penalty = 0;  // extension (as vLLM's); 0 or 1: off
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool ignore_eos = false;  // extension (as vLLM's)

  // Completions: `logprobs: k` asks for them with k alternatives; chat:
  // `logprobs: true` and `top_logprobs: k`.
  bool logprobs = false;
  uint32_t top_logprobs = 0;

  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  OpenAiKvCompression kv_compression;
};

// A refusal: the request field it concerns (OpenAI's `param`) and why.
struct OpenAiParseError {
  std::string param;
  std::string message;
};

struct OpenAiParse {
  std::optional<OpenAiRequest> request;
  OpenAiParseError error;  // when request is empty
};

// Deeper JSON than this is refused before it is parsed.
inline constexpr int kMaxJsonDepth = 64;

OpenAiParse ParseOpenAiRequest(std::string_view body, OpenAiEndpoint endpoint);

}  // namespace snapserve::server::http
