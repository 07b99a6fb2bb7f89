// Chat templates without Jinja: the template string from the model's metadata
// only identifies its family (ChatML, Llama-3, Mistral [INST]); the family is
// then rendered here in C++. A template of no known family is an error at load
// time rather than a silently wrong prompt at request time.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "engine/common/status_or.h"
#include "engine/tokenizer/segmented_text.h"

namespace snapserve::tokenizer {

struct ChatMessage {
  std::string role;
  std::string content;
};

class ChatTemplate {
 public:
  enum class Family { kChatMl, kLlama3, kMistral };

  // bos/eos: the texts of the model's BOS and EOS tokens, which some families
  // write into the prompt.
  static StatusOr<ChatTemplate> Detect(std::string_view jinja, std::string bos_text,
                                       std::string eos_text);

  Family family() const { return family_; }
  // The system prompt the template inserts when the conversation has none
  // (SmolLM2's "You are a helpful AI assistant named SmolLM, ..."); empty if none.
  const std::string& default_system_prompt() const { return default_system_; }

  // The template's own text (turn markers, role headers, BOS/EOS, the default
  // system prompt) is markup; each message's content is user text, so special
  // tokens written in it stay text when the result is tokenized.
  // InvalidArgument naming the role for a role the family does not know.
  StatusOr<SegmentedText> Render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) const;

 private:
  StatusOr<SegmentedText> RenderChatMl(const std::vector<ChatMessage>& messages,
                                       bool add_generation_prompt) const;
  StatusOr<SegmentedText> RenderLlama3(const std::vector<ChatMessage>& messages,
                                       bool add_generation_prompt) const;
  StatusOr<SegmentedText> RenderMistral(const std::vector<ChatMessage>& messages) const;

  Family family_ = Family::kChatMl;
  std::string default_system_;
  std::string bos_text_;
  std::string eos_text_;
};

}  // namespace snapserve::tokenizer
