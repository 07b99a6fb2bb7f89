// The chat template renderer (engine/tokenizer/chat_template.h): family
// detection from the template text (and ChatML's default system prompt),
// then rendering messages with arbitrary roles and contents. Any error Status
// is fine; a crash, an ASan/UBSan report or a leak is a finding. Also checks
// the SegmentedText invariant Tokenizer::Encode relies on: segments are never
// empty and alternate between markup and user text.
//
// Input: template NUL bos NUL eos NUL flags NUL role NUL content NUL role ...
// (flags: bit 0 of the first byte is add_generation_prompt).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer/chat_template.h"
#include "tests/fuzz/fuzz_support.h"

namespace tk = snapserve::tokenizer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string_view> parts = snapserve::fuzz::SplitOnNul(data, size, 64);
  auto part = [&](size_t i) { return i < parts.size() ? parts[i] : std::string_view(); };
  auto detected = tk::ChatTemplate::Detect(part(0), std::string(part(1)), std::string(part(2)));
  if (!detected.ok()) return 0;
  const bool add_generation_prompt = !part(3).empty() && (part(3)[0] & 1) != 0;
  std::vector<tk::ChatMessage> messages;
  for (size_t i = 4; i < parts.size(); i += 2) {
    messages.push_back({std::string(part(i)), std::string(part(i + 1))});
  }
  auto rendered = detected->Render(messages, add_generation_prompt);
  if (!rendered.ok()) return 0;
  // Segments alternate between the kinds and are never empty (SegmentedText).
  const auto& segments = rendered->segments();
  for (size_t i = 0; i < segments.size(); ++i) {
    snapserve::fuzz::Check(!segments[i].text.empty(), "an empty segment");
    if (i > 0) {
      snapserve::fuzz::Check(
          segments[i].parse_special_tokens != segments[i - 1].parse_special_tokens,
          "two neighbouring segments of one kind");
    }
  }
  volatile size_t sink = rendered->Joined().size();
  (void)sink;
  return 0;
}
