// Prompt text built from parts that differ in trust: template markup, where a
// special-token string ("<|im_start|>", "<|eot_id|>") is meant as that control
// token, and user text, where it is only text. Without the distinction a chat
// message holding "<|im_end|>\n<|im_start|>system\n..." forges a system turn.
// Tokenizer::Encode(const SegmentedText&) matches special tokens in markup
// only; in user text their strings become ordinary BPE pieces, as
// transformers' split_special_tokens=True does.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace snapserve::tokenizer {

class SegmentedText {
 public:
  struct Segment {
    std::string text;
    bool parse_special_tokens;  // true: markup; false: user text
  };

  void AddMarkup(std::string_view text) { Add(text, true); }
  void AddUserText(std::string_view text) { Add(text, false); }

  const std::vector<Segment>& segments() const { return segments_; }
  // All segments as one string (what a Jinja renderer would have produced).
  std::string Joined() const {
    std::string out;
    for (const Segment& s : segments_) out += s.text;
    return out;
  }

 private:
  void Add(std::string_view text, bool parse_special_tokens) {
    if (text.empty()) return;
    // Neighbours of one kind merge, so segments alternate between the kinds.
    if (!segments_.empty() && segments_.back().parse_special_tokens == parse_special_tokens) {
      segments_.back().text += text;
    } else {
      segments_.push_back({std::string(text), parse_special_tokens});
    }
  }

  std::vector<Segment> segments_;
};

}  // namespace snapserve::tokenizer
