#include "engine/request_validation.h"

#include <cmath>
#include <string>

#include "engine/common/bounded_text.h"

namespace snapserve::engine {
namespace {

// Bounds that keep one request from costing unbounded memory or time in the
// stop matcher; generous for any real use.
constexpr size_t kMaxStopSequences = 16;
constexpr size_t kMaxStopBytes = 256;
constexpr size_t kMaxRequestIdBytes = 256;
constexpr size_t kMaxStopTokenIds = 256;

Status Invalid(const std::string& field, const std::string& why) {
  return Status::InvalidArgument(field + ": " + why);
}

}  // namespace

Status CheckInputBytes(const GenerationRequest& r, int64_t max_context_tokens) {
  const int64_t limit = max_context_tokens * kMaxInputBytesPerToken;
  int64_t bytes = 0;
  const char* field = "prompt";
  if (r.prompt) bytes = static_cast<int64_t>(r.prompt->size());
  if (r.messages) {
    field = "messages";
    for (const ChatMessage& m : *r.messages) {
      bytes += static_cast<int64_t>(m.role.size() + m.content.size());
    }
  }
  if (r.question.size() > static_cast<size_t>(limit)) {
    return Invalid("question", std::to_string(r.question.size()) +
                                   " bytes of text cannot fit the context: the limit is " +
                                   std::to_string(limit) + " bytes");
  }
  if (bytes <= limit) return Status::Ok();
  return Invalid(field,
                 std::to_string(bytes) + " bytes of text cannot fit the context: the limit is " +
                     std::to_string(limit) + " bytes (" + std::to_string(max_context_tokens) +
                     " tokens x " + std::to_string(kMaxInputBytesPerToken) + " bytes per token)");
}

bool IsKnownChatRole(const std::string& role) {
  return role == "system" || role == "user" || role == "assistant";
}

Status ValidateRequest(const GenerationRequest& r, const ValidationLimits& limits) {
  if (r.request_id.size() > kMaxRequestIdBytes) {
    return Invalid("request_id", "longer than " + std::to_string(kMaxRequestIdBytes) + " bytes");
  }
  const int inputs =
      int{r.prompt.has_value()} + int{r.input_ids.has_value()} + int{r.messages.has_value()};
  if (inputs == 0) return Invalid("input", "one of prompt, input_ids or messages is required");
  if (inputs > 1) return Invalid("input", "give only one of prompt, input_ids or messages");
  if (r.prompt && r.prompt->empty()) return Invalid("prompt", "must not be empty");
  if (r.input_ids) {
    if (r.input_ids->empty()) return Invalid("input_ids.ids", "must not be empty");
    for (size_t i = 0; i < r.input_ids->size(); ++i) {
      if ((*r.input_ids)[i] >= limits.vocab_size) {
        return Invalid("input_ids.ids[" + std::to_string(i) + "]",
                       std::to_string((*r.input_ids)[i]) + " is not below the vocabulary size " +
                           std::to_string(limits.vocab_size));
      }
    }
  }
  if (r.messages) {
    if (r.messages->empty()) return Invalid("messages.messages", "must not be empty");
    for (size_t i = 0; i < r.messages->size(); ++i) {
      const std::string& role = (*r.messages)[i].role;
      if (!IsKnownChatRole(role)) {
        return Invalid("messages.messages[" + std::to_string(i) + "].role",
                       "unknown role '" + Bounded(role) + "' (expected system, user or assistant)");
      }
    }
  }

  if (!std::isfinite(r.temperature) || r.temperature < 0) {
    return Invalid("sampling.temperature",
                   "must be a finite number >= 0, got " + std::to_string(r.temperature));
  }
  if (!std::isfinite(r.top_p) || r.top_p < 0 || r.top_p > 1) {
    return Invalid("sampling.top_p", "must be in [0, 1], got " + std::to_string(r.top_p));
  }
  if (!std::isfinite(r.repetition_penalty) || r.repetition_penalty < 0) {
    return Invalid("sampling.repetition_penalty",
                   "must be a finite number >= 0, got " + std::to_string(r.repetition_penalty));
  }

  if (r.logprobs.top_logprobs > kMaxTopLogprobs) {
    return Invalid("logprobs.top_logprobs", "must be at most " + std::to_string(kMaxTopLogprobs) +
                                                ", got " + std::to_string(r.logprobs.top_logprobs));
  }
  // Asking for alternatives without the logprobs themselves is almost
  // certainly a client that forgot the flag: say so rather than guess.
  if (r.logprobs.top_logprobs > 0 && !r.logprobs.enabled) {
    return Invalid("logprobs.top_logprobs", "needs logprobs.enabled");
  }

  if (r.max_new_tokens > limits.max_new_tokens_limit) {
    return Invalid("stopping.max_new_tokens", std::to_string(r.max_new_tokens) +
                                                  " is above the server limit " +
                                                  std::to_string(limits.max_new_tokens_limit));
  }
  if (r.stop.size() > kMaxStopSequences) {
    return Invalid("stopping.stop", "at most " + std::to_string(kMaxStopSequences) + " sequences");
  }
  for (size_t i = 0; i < r.stop.size(); ++i) {
    // An empty stop sequence would match at every position: almost certainly
    // a client bug, so say so rather than guess what was meant.
    if (r.stop[i].empty()) {
      return Invalid("stopping.stop[" + std::to_string(i) + "]", "must not be empty");
    }
    if (r.stop[i].size() > kMaxStopBytes) {
      return Invalid("stopping.stop[" + std::to_string(i) + "]",
                     "longer than " + std::to_string(kMaxStopBytes) + " bytes");
    }
  }
  if (r.stop_token_ids.size() > kMaxStopTokenIds) {
    return Invalid("stopping.stop_token_ids", "at most " + std::to_string(kMaxStopTokenIds));
  }
  for (size_t i = 0; i < r.stop_token_ids.size(); ++i) {
    if (r.stop_token_ids[i] >= limits.vocab_size) {
      return Invalid("stopping.stop_token_ids[" + std::to_string(i) + "]",
                     std::to_string(r.stop_token_ids[i]) + " is not below the vocabulary size " +
                         std::to_string(limits.vocab_size));
    }
  }
  return Status::Ok();
}

}  // namespace snapserve::engine
