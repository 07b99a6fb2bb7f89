// StopMatcher: decides when a request stops and how much of its detokenized
// text may be streamed so far (docs/api.md, "GenerateRequest", `stopping`).
// Stop sequences are matched on the TEXT, so one spanning several tokens is
// caught; text that could still be the start of a stop sequence is held back
// until the next token decides, so a stop sequence never leaks partially into
// the stream. Bytes of an incomplete UTF-8 character at the end are held back
// as well. Knows nothing of tokenizers or sampling.
//
// Thread-compatible: one per request.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine_types.h"

namespace snapserve::sampling {

// The engine's (engine_types.h); OnToken never returns kUnspecified.
using engine::FinishReason;

struct StopCriteria {
  int64_t max_new_tokens = 0;     // > 0
  std::vector<std::string> stop;  // empty strings are ignored
  std::vector<int32_t> stop_token_ids;
  std::vector<int32_t> eos_token_ids;  // from the model
  bool ignore_eos = false;
};

class StopMatcher {
 public:
  explicit StopMatcher(StopCriteria criteria);

  // Call once per generated token, before its text. Returns why the request
  // ends with this token, if it does. For kEos and kStopToken the token's
  // text is not part of the output (do not pass it to OnText); for kLength it
  // is (pass it, then Flush). Stop/EOS ids win over the length limit.
  std::optional<FinishReason> OnToken(int32_t token);

  struct TextResult {
    std::string emit;      // safe to send now
    bool stopped = false;  // a stop sequence matched; nothing more will be emitted
  };
  // Appends newly detokenized text. Once a stop sequence matched, further
  // calls emit nothing.
  TextResult OnText(std::string_view text);

  // At the end of a request that did not stop on a sequence: everything still
  // held back (an incomplete UTF-8 tail is emitted as is).
  std::string Flush();

  int64_t num_generated() const { return num_generated_; }
  bool stopped_on_sequence() const { return stopped_; }
  // The stop sequence that matched (empty if none).
  const std::string& matched_stop() const { return matched_; }

 private:
  StopCriteria criteria_;
  int64_t num_generated_ = 0;
  std::string held_;  // text received but not emitted yet
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace snapserve::sampling
