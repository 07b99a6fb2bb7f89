#include "server/http/openai_conversion.h"

#include <nlohmann/json.hpp>

#include "server/request_conversion.h"
#include "server/server_config.h"

namespace snapserve::server::http {
namespace {

namespace v1 = snapserve::v1;

// gRPC field paths in the engine's messages and the HTTP names for them.
// Longer paths first: the first prefix that matches wins.
struct FieldName {
  std::string_view grpc;
  std::string_view http;
};
constexpr FieldName kFieldNames[] = {
    {"sampling.temperature", "temperature"},
    {"sampling.top_p", "top_p"},
    {"sampling.repetition_penalty", "repetition_penalty"},
    {"stopping.max_new_tokens", "max_tokens"},
    {"stopping.stop_token_ids", "stop"},
    {"stopping.stop", "stop"},
    {"logprobs.top_logprobs", "top_logprobs"},
    {"messages.messages", "messages"},
    {"messages", "messages"},
    {"input_ids.ids", "prompt"},
    {"prompt", "prompt"},
    {"input", "prompt"},
    {"kv_compression.window_size", "kv_compression.window"},
    {"kv_compression.max_capacity_prompt", "kv_compression.capacity"},
    {"kv_compression.kernel_size", "kv_compression.kernel"},
    {"kv_compression.method", "kv_compression.method"},
    {"kv_compression.pooling", "kv_compression.pooling"},
    {"kv_compression.sink_tokens", "kv_compression"},
    {"kv_compression.adakv_alpha_safeguard", "kv_compression"},
    {"kv_compression.pyramid_beta", "kv_compression"},
};

// The message with its gRPC field path replaced by the HTTP one, and that name.
std::pair<std::string, std::string> HttpNames(std::string_view message, OpenAiEndpoint endpoint) {
  for (const FieldName& f : kFieldNames) {
    if (message.substr(0, f.grpc.size()) != f.grpc) continue;
    const std::string_view rest = message.substr(f.grpc.size());
    // A whole path segment only ("prompt" must not match "prompt_tokens").
    if (!rest.empty() && rest.front() != ':' && rest.front() != '[' && rest.front() != '.') {
      continue;
    }
    std::string http(f.http);
    // The completions API asks for top logprobs through `logprobs: k`.
    if (http == "top_logprobs" && endpoint == OpenAiEndpoint::kCompletions) http = "logprobs";
    return {http + std::string(rest), http};
  }
  return {std::string(message), ""};
}

const char* ErrorType(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 429:
      return "rate_limit_error";
    case 500:
    case 501:
    case 503:
    case 504:
      return "server_error";
    default:
      return "invalid_request_error";
  }
}

}  // namespace

StatusOr<v1::GenerateRequest> ToGenerateRequest(const OpenAiRequest& r) {
  v1::GenerateRequest g;
  if (r.prompt) {
    g.set_prompt(*r.prompt);
  } else if (r.prompt_ids) {
    g.mutable_input_ids()->mutable_ids()->Add(r.prompt_ids->begin(), r.prompt_ids->end());
  } else {
    auto* messages = g.mutable_messages();
    for (const OpenAiMessage& m : r.messages) {
      auto* out = messages->add_messages();
      out->set_role(m.role);
      out->set_content(m.content);
    }
  }
  auto* sampling = g.mutable_sampling();
  sampling->set_temperature(r.temperature);
  sampling->set_top_p(r.top_p);
  sampling->set_top_k(r.top_k);
  sampling->set_repetition_penalty(r.repetition_penalty);
  if (r.seed) sampling->set_seed(*r.seed);
  auto* stopping = g.mutable_stopping();
  if (r.max_tokens) stopping->set_max_new_tokens(*r.max_tokens);
  for (const std::string& s : r.stop) stopping->add_stop(s);
  stopping->set_ignore_eos(r.ignore_eos);
  if (r.logprobs) {
    g.mutable_logprobs()->set_enabled(true);
    g.mutable_logprobs()->set_top_logprobs(r.top_logprobs);
  } else if (r.top_logprobs > 0) {
    // Left to the engine, which refuses top_logprobs without logprobs.
    g.mutable_logprobs()->set_top_logprobs(r.top_logprobs);
  }
  const OpenAiKvCompression& kv = r.kv_compression;
  auto* out = g.mutable_kv_compression();
  if (kv.method) {
    StatusOr<engine::KvMethod> method = ParseKvMethod(*kv.method);
    if (!method.ok()) {
      return Status::InvalidArgument("kv_compression.method: " + method.status().message());
    }
    out->set_method(ToProto(*method));
  }
  if (kv.pooling) {
    StatusOr<engine::KvPooling> pooling = ParseKvPooling(*kv.pooling);
    if (!pooling.ok()) {
      return Status::InvalidArgument("kv_compression.pooling: " + pooling.status().message());
    }
    out->set_pooling(*pooling == engine::KvPooling::kAvg ? v1::KvCompression::AVG
                                                         : v1::KvCompression::MAX);
  }
  out->set_max_capacity_prompt(kv.capacity);
  out->set_window_size(kv.window);
  out->set_kernel_size(kv.kernel);
  return g;
}

HttpError MakeHttpError(int status, std::string_view message, std::string_view param,
                        std::string_view code) {
  nlohmann::json error = {
      {"message", message},
      {"type", ErrorType(status)},
      {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
      {"code", code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code)}};
  return {status, nlohmann::json{{"error", std::move(error)}}.dump(
                      -1, ' ', false, nlohmann::json::error_handler_t::replace)};
}

HttpError HttpErrorFromStatus(const Status& status, std::string_view request_id,
                              OpenAiEndpoint endpoint) {
  // The gRPC mapping decides what the client may read (INTERNAL's message
  // holds only the request id).
  const grpc::Status client = ToGrpc(status, request_id);
  switch (status.code()) {
    case StatusCode::kInvalidArgument: {
      auto [message, param] = HttpNames(client.error_message(), endpoint);
      return MakeHttpError(400, message, param);
    }
    case StatusCode::kResourceExhausted:
      return MakeHttpError(429, client.error_message(), {}, "resource_exhausted");
    case StatusCode::kUnavailable:
      return MakeHttpError(503, client.error_message(), {}, "unavailable");
    case StatusCode::kNotFound:
      return MakeHttpError(404, client.error_message());
    case StatusCode::kDeadlineExceeded:
      return MakeHttpError(504, client.error_message(), {}, "deadline_exceeded");
    case StatusCode::kUnimplemented:
      return MakeHttpError(501, client.error_message());
    case StatusCode::kCancelled:
      // Nobody reads it (the client went away); 499 as nginx logs it.
      return MakeHttpError(499, client.error_message(), {}, "cancelled");
    default:
      return MakeHttpError(500, client.error_message(), {}, "internal_error");
  }
}

}  // namespace snapserve::server::http
