#include "server/http/openai_request.h"

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

namespace snapserve::server::http {
namespace {

using nlohmann::json;

// The nesting depth of a JSON text (strings skipped), without parsing it:
// a body of 16 MiB of '[' is refused in one pass.
bool DeeperThan(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

// Thrown inside the parser, caught once in ParseOpenAiRequest.
struct Refusal {
  OpenAiParseError error;
};

[[noreturn]] void Refuse(std::string param, std::string message) {
  throw Refusal{{std::move(param), std::move(message)}};
}

// A field counts as absent when missing or null (OpenAI's clients send null
// for "not given").
const json* Field(const json& body, const char* name) {
  const auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

bool Bool(const json& value, const std::string& param) {
  if (!value.is_boolean()) Refuse(param, param + ": must be a boolean");
  return value.get<bool>();
}

float Number(const json& value, const std::string& param) {
  if (!value.is_number()) Refuse(param, param + ": must be a number");
  const double x = value.get<double>();
  if (!std::isfinite(x) || std::fabs(x) > std::numeric_limits<float>::max()) {
    Refuse(param, param + ": must be a finite number");
  }
  return static_cast<float>(x);
}

int64_t Integer(const json& value, const std::string& param) {
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      Refuse(param, param + ": out of range");
    }
    return static_cast<int64_t>(u);
  }
  if (!value.is_number_integer()) Refuse(param, param + ": must be an integer");
  return value.get<int64_t>();
}

uint32_t Count(const json& value, const std::string& param, int64_t min) {
  const int64_t x = Integer(value, param);
  if (x < min || x > std::numeric_limits<uint32_t>::max()) {
    Refuse(param, param + ": must be an integer in [" + std::to_string(min) + ", 4294967295]");
  }
  return static_cast<uint32_t>(x);
}

std::string String(const json& value, const std::string& param) {
  if (!value.is_string()) Refuse(param, param + ": must be a string");
  return value.get<std::string>();
}

std::vector<uint32_t> TokenIds(const json& value, const std::string& param) {
  std::vector<uint32_t> ids;
  ids.reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    ids.push_back(Count(value[i], param + "[" + std::to_string(i) + "]", 0));
  }
  return ids;
}

// Fields that change what a request means and that this server does not
// implement: refused unless absent or at their no-op value, never ignored.
void RefuseUnsupported(const json& body) {
  if (const json* n = Field(body, "n"); n && !(n->is_number_integer() && *n == 1)) {
    Refuse("n", "n: only n=1 is supported (one choice per request)");
  }
  if (const json* b = Field(body, "best_of"); b && !(b->is_number_integer() && *b == 1)) {
    Refuse("best_of", "best_of: only 1 is supported");
  }
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    if (const json* p = Field(body, name); p && !(p->is_number() && p->get<double>() == 0)) {
      Refuse(name, std::string(name) + ": not supported (use repetition_penalty)");
    }
  }
  if (const json* e = Field(body, "echo"); e && !(e->is_boolean() && !e->get<bool>())) {
    Refuse("echo", "echo: not supported");
  }
  if (const json* s = Field(body, "suffix");
      s && !(s->is_string() && s->get<std::string>().empty())) {
    Refuse("suffix", "suffix: not supported");
  }
  if (const json* l = Field(body, "logit_bias"); l && !(l->is_object() && l->empty())) {
    Refuse("logit_bias", "logit_bias: not supported");
  }
  for (const char* name : {"tools", "functions"}) {
    if (const json* t = Field(body, name); t && !(t->is_array() && t->empty())) {
      Refuse(name, std::string(name) + ": tool calls are not supported");
    }
  }
  if (const json* t = Field(body, "tool_choice"); t && !(t->is_string() && *t == "none")) {
    Refuse("tool_choice", "tool_choice: tool calls are not supported");
  }
  if (const json* r = Field(body, "response_format");
      r && !(r->is_object() && r->contains("type") && (*r)["type"] == "text")) {
    Refuse("response_format", "response_format: only {\"type\": \"text\"} is supported");
  }
}

// `prompt`: a string, an array holding one string, an array of token ids, or
// an array holding one array of token ids. Several prompts would be several
// choices, which n=1 rules out.
void ReadPrompt(const json& body, OpenAiRequest& r) {
  const json* p = Field(body, "prompt");
  if (p == nullptr) Refuse("prompt", "prompt: required");
  if (p->is_string()) {
    r.prompt = p->get<std::string>();
    return;
  }
  if (!p->is_array()) Refuse("prompt", "prompt: must be a string or an array");
  if (p->size() == 1 && (*p)[0].is_string()) {
    r.prompt = (*p)[0].get<std::string>();
  } else if (p->size() == 1 && (*p)[0].is_array()) {
    r.prompt_ids = TokenIds((*p)[0], "prompt[0]");
  } else if (!p->empty() && (*p)[0].is_number()) {
    r.prompt_ids = TokenIds(*p, "prompt");
  } else {
    Refuse("prompt", "prompt: exactly one prompt per request (a string or an array of token ids)");
  }
}

// A message's `content`: a string, or an array of text parts (images and
// audio are refused).
std::string Content(const json& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) Refuse(param, param + ": must be a string or an array of text parts");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string where = param + "[" + std::to_string(i) + "]";
    if (!part.is_object() || !part.contains("type") || part["type"] != "text") {
      Refuse(param, where + ": only parts of type \"text\" are supported");
    }
    const json* t = Field(part, "text");
    if (t == nullptr) Refuse(param, where + ".text: required");
    text += String(*t, where + ".text");
  }
  return text;
}

void ReadMessages(const json& body, OpenAiRequest& r) {
  const json* m = Field(body, "messages");
  if (m == nullptr) Refuse("messages", "messages: required");
  if (!m->is_array()) Refuse("messages", "messages: must be an array");
  for (size_t i = 0; i < m->size(); ++i) {
    const json& message = (*m)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!message.is_object()) Refuse("messages", where + ": must be an object");
    const json* role = Field(message, "role");
    if (role == nullptr) Refuse("messages", where + ".role: required");
    OpenAiMessage out;
    out.role = String(*role, where + ".role");
    // OpenAI's newer name for the system role.
    if (out.role == "developer") out.role = "system";
    if (const json* c = Field(message, "content")) out.content = Content(*c, where + ".content");
    r.messages.push_back(std::move(out));
  }
}

void ReadStop(const json& body, OpenAiRequest& r) {
  const json* s = Field(body, "stop");
  if (s == nullptr) return;
  if (s->is_string()) {
    r.stop.push_back(s->get<std::string>());
    return;
  }
  if (!s->is_array()) Refuse("stop", "stop: must be a string or an array of strings");
  for (size_t i = 0; i < s->size(); ++i) {
    r.stop.push_back(String((*s)[i], "stop[" + std::to_string(i) + "]"));
  }
}

void ReadLogprobs(const json& body, OpenAiRequest& r) {
  const json* l = Field(body, "logprobs");
  if (r.endpoint == OpenAiEndpoint::kCompletions) {
    // The legacy API's `logprobs: k`: the chosen token's logprob and k others.
    if (l == nullptr) return;
    r.logprobs = true;
    r.top_logprobs = Count(*l, "logprobs", 0);
    return;
  }
  if (l != nullptr) r.logprobs = Bool(*l, "logprobs");
  if (const json* t = Field(body, "top_logprobs")) r.top_logprobs = Count(*t, "top_logprobs", 0);
}

void ReadKvCompression(const json& body, OpenAiRequest& r) {
  const json* kv = Field(body, "kv_compression");
  if (kv == nullptr) return;
  if (!kv->is_object()) Refuse("kv_compression", "kv_compression: must be an object");
  for (const auto& [key, value] : kv->items()) {
    const std::string param = "kv_compression." + key;
    if (value.is_null()) continue;
    if (key == "method") {
      r.kv_compression.method = String(value, param);
    } else if (key == "pooling") {
      r.kv_compression.pooling = String(value, param);
    } else if (key == "capacity") {
      r.kv_compression.capacity = Count(value, param, 0);
    } else if (key == "window") {
      r.kv_compression.window = Count(value, param, 0);
    } else if (key == "kernel") {
      r.kv_compression.kernel = Count(value, param, 0);
    } else {
      // Our own extension: a misspelt field is an error, not a silent default.
      Refuse(param, param + ": unknown field (method, capacity, window, kernel, pooling)");
    }
  }
}

OpenAiRequest Read(const json& body, OpenAiEndpoint endpoint) {
  if (!body.is_object()) Refuse("", "the request body must be a JSON object");
  RefuseUnsupported(body);
  OpenAiRequest r;
  r.endpoint = endpoint;
  if (const json* m = Field(body, "model")) r.model = String(*m, "model");
  if (endpoint == OpenAiEndpoint::kCompletions) {
    ReadPrompt(body, r);
  } else {
    ReadMessages(body, r);
  }
  // The chat API's newer name wins over the older one when both are sent.
  if (const json* m = Field(body, "max_tokens")) r.max_tokens = Count(*m, "max_tokens", 1);
  if (const json* m = Field(body, "max_completion_tokens")) {
    r.max_tokens = Count(*m, "max_completion_tokens", 1);
  }
  if (const json* t = Field(body, "temperature")) r.temperature = Number(*t, "temperature");
  if (const json* t = Field(body, "top_p")) r.top_p = Number(*t, "top_p");
  if (const json* k = Field(body, "top_k")) {
    const int64_t top_k = Integer(*k, "top_k");
    // vLLM's -1 means "off", as 0 does here.
    if (top_k < -1 || top_k > std::numeric_limits<uint32_t>::max()) {
      Refuse("top_k", "top_k: must be -1, 0 (off) or a positive integer");
    }
    r.top_k = top_k < 0 ? 0 : static_cast<uint32_t>(top_k);
  }
  if (const json* p = Field(body, "repetition_penalty")) {
    r.repetition_penalty = Number(*p, "repetition_penalty");
  }
  // OpenAI's seed is a signed 64-bit integer; its bits seed the generator.
  if (const json* s = Field(body, "seed")) r.seed = static_cast<uint64_t>(Integer(*s, "seed"));
  if (const json* e = Field(body, "ignore_eos")) r.ignore_eos = Bool(*e, "ignore_eos");
  ReadStop(body, r);
  ReadLogprobs(body, r);
  if (const json* s = Field(body, "stream")) r.stream = Bool(*s, "stream");
  if (const json* o = Field(body, "stream_options")) {
    if (!r.stream) Refuse("stream_options", "stream_options: only allowed with stream: true");
    if (!o->is_object()) Refuse("stream_options", "stream_options: must be an object");
    if (const json* u = Field(*o, "include_usage")) {
      r.include_usage = Bool(*u, "stream_options.include_usage");
    }
  }
  ReadKvCompression(body, r);
  return r;
}

}  // namespace

OpenAiParse ParseOpenAiRequest(std::string_view body, OpenAiEndpoint endpoint) {
  if (DeeperThan(body, kMaxJsonDepth)) {
    return {
        std::nullopt,
        {"", "the request body nests deeper than " + std::to_string(kMaxJsonDepth) + " levels"}};
  }
  const json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return {std::nullopt, {"", "the request body is not valid JSON"}};
  try {
    return {Read(parsed, endpoint), {}};
  } catch (const Refusal& refusal) {
    return {std::nullopt, refusal.error};
  } catch (const json::exception& e) {
    // A shape the readers above did not foresee; never a crash.
    return {std::nullopt, {"", std::string("malformed request: ") + e.what()}};
  }
}

}  // namespace snapserve::server::http
