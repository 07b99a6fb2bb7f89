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

// Chat roles the templates know.
bool IsKnownChatRole(const std::string& role);

}  // namespace snapserve::engine
