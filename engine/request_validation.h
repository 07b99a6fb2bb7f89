// Checks of a GenerationRequest that need no model state beyond a few
// numbers: each failure is INVALID_ARGUMENT naming the field as the API
// spells it (docs/api.md, "Validation"), so a client can tell exactly what to fix.
// Context-length checks, which need the tokenized prompt, live in the engine.
#pragma once

#include <cstdint>

#include "engine/engine.h"

namespace snapserve::engine {

struct ValidationLimits {
  int64_t vocab_size = 0;
  int64_t max_new_tokens_limit = 0;
};

Status ValidateRequest(const GenerationRequest& request, const ValidationLimits& limits);

// Bytes of input text one token of context can stand for, at most: no
// vocabulary we know has a longer token (SmolLM2's longest is 81 bytes, a
// newline and 80 spaces), and each token covers at most one token's bytes of
// the text, so longer text cannot fit the context whatever it says.
inline constexpr int64_t kMaxInputBytesPerToken = 128;

// INVALID_ARGUMENT when the request's text (the prompt, or the messages'
// roles and contents) is longer than `max_context_tokens` x
// kMaxInputBytesPerToken bytes. Cheap (no tokenization), so it runs before
// the tokenizer ever sees a megabyte prompt that could never fit.
Status CheckInputBytes(const GenerationRequest& request, int64_t max_context_tokens);

// Chat roles the templates know.
bool IsKnownChatRole(const std::string& role);

}  // namespace snapserve::engine
