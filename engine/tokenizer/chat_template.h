// Chat templates without Jinja: the template string from the model's metadata
// only identifies its family (ChatML, Llama-3, Mistral [INST]); the family is
// then rendered here in C++. A template of no known family is an error at load
// time rather than a silently wrong prompt at request time.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "engine/common/status_or.h"

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

  // InvalidArgument naming the role for a role the family does not know.
  StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                               bool add_generation_prompt) const;

 private:
  StatusOr<std::string> RenderChatMl(const std::vector<ChatMessage>& messages,
                                     bool add_generation_prompt) const;
  StatusOr<std::string> RenderLlama3(const std::vector<ChatMessage>& messages,
                                     bool add_generation_prompt) const;
  StatusOr<std::string> RenderMistral(const std::vector<ChatMessage>& messages) const;

  Family family_ = Family::kChatMl;
  std::string default_system_;
  std::string bos_text_;
  std::string eos_text_;
};

}  // namespace snapserve::tokenizer
