#include "engine/tokenizer/chat_template.h"

#include <algorithm>
#include <initializer_list>

#include "engine/common/bounded_text.h"

namespace snapserve::tokenizer {
namespace {

bool Contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

bool OneOf(const std::string& role, std::initializer_list<std::string_view> roles) {
  return std::find(roles.begin(), roles.end(), role) != roles.end();
}

Status UnknownRole(const std::string& role, std::string_view family) {
  return Status::InvalidArgument("messages: unknown chat role '" + Bounded(role) + "' for the " +
                                 std::string(family) + " template");
}

// Undoes the escapes of a Jinja string literal (templates are written both with
// real newlines and with "\n" inside their literals).
std::string UnescapeJinja(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      char c = s[++i];
      out.push_back(c == 'n' ? '\n' : c == 't' ? '\t' : c);
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// Jinja's |trim: Python's str.strip() (whitespace at both ends).
std::string Trim(std::string_view s) {
  const char* ws = " \t\n\r\f\v";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return "";
  size_t e = s.find_last_not_of(ws);
  return std::string(s.substr(b, e - b + 1));
}

// ChatML templates that insert a system turn when the first message is not
// one (SmolLM2, Qwen2) guard it with `messages[0]['role'] != 'system'` and
// write the turn as a literal right after. Returns that literal's content.
std::string FindDefaultSystemPrompt(std::string_view jinja) {
  size_t guard = jinja.find("!= 'system'");
  if (guard == std::string_view::npos) guard = jinja.find("!= \"system\"");
  if (guard == std::string_view::npos) return "";
  for (std::string_view open : {"<|im_start|>system\\n", "<|im_start|>system\n"}) {
    size_t start = jinja.find(open, guard);
    if (start == std::string_view::npos) continue;
    start += open.size();
    size_t end = jinja.find("<|im_end|>", start);
    if (end == std::string_view::npos) return "";
    return UnescapeJinja(jinja.substr(start, end - start));
  }
  return "";
}

}  // namespace

StatusOr<ChatTemplate> ChatTemplate::Detect(std::string_view jinja, std::string bos_text,
                                            std::string eos_text) {
  ChatTemplate t;
  t.bos_text_ = std::move(bos_text);
  t.eos_text_ = std::move(eos_text);
  if (Contains(jinja, "<|im_start|>")) {
    t.family_ = Family::kChatMl;
    t.default_system_ = FindDefaultSystemPrompt(jinja);
  } else if (Contains(jinja, "<|start_header_id|>")) {
    // Llama 3.1+ templates inject a dated system header and tool blocks that
    // this renderer does not reproduce; refuse rather than render them wrong.
    if (Contains(jinja, "Cutting Knowledge Date")) {
      return Status::Unimplemented("chat template: the Llama 3.1+ template is not supported");
    }
    t.family_ = Family::kLlama3;
  } else if (Contains(jinja, "[INST]")) {
    t.family_ = Family::kMistral;
  } else if (jinja.empty()) {
    return Status::NotFound("the model has no chat template");
  } else {
    return Status::Unimplemented(
        "chat template of unknown family (supported: ChatML, Llama-3, Mistral [INST])");
  }
  return t;
}

StatusOr<SegmentedText> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                             bool add_generation_prompt) const {
  switch (family_) {
    case Family::kChatMl:
      return RenderChatMl(messages, add_generation_prompt);
    case Family::kLlama3:
      return RenderLlama3(messages, add_generation_prompt);
    case Family::kMistral:
      return RenderMistral(messages);
  }
  return Status::Internal("unreachable");
}

// Roles are checked against a fixed list before they are written, so they are
// markup like the rest of the header.
StatusOr<SegmentedText> ChatTemplate::RenderChatMl(const std::vector<ChatMessage>& messages,
                                                   bool add_generation_prompt) const {
  SegmentedText out;
  // The reference template inserts the default system turn inside its message
  // loop, so an empty conversation gets none either.
  if (!default_system_.empty() && !messages.empty() && messages[0].role != "system") {
    out.AddMarkup("<|im_start|>system\n" + default_system_ + "<|im_end|>\n");
  }
  for (const ChatMessage& m : messages) {
    if (!OneOf(m.role, {"system", "user", "assistant", "tool"})) {
      return UnknownRole(m.role, "ChatML");
    }
    out.AddMarkup("<|im_start|>" + m.role + "\n");
    out.AddUserText(m.content);
    out.AddMarkup("<|im_end|>\n");
  }
  if (add_generation_prompt) out.AddMarkup("<|im_start|>assistant\n");
  return out;
}

StatusOr<SegmentedText> ChatTemplate::RenderLlama3(const std::vector<ChatMessage>& messages,
                                                   bool add_generation_prompt) const {
  SegmentedText out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (!OneOf(m.role, {"system", "user", "assistant", "ipython", "tool"})) {
      return UnknownRole(m.role, "Llama-3");
    }
    if (i == 0) out.AddMarkup(bos_text_);
    out.AddMarkup("<|start_header_id|>" + m.role + "<|end_header_id|>\n\n");
    out.AddUserText(Trim(m.content));
    out.AddMarkup("<|eot_id|>");
  }
  if (add_generation_prompt) out.AddMarkup("<|start_header_id|>assistant<|end_header_id|>\n\n");
  return out;
}

StatusOr<SegmentedText> ChatTemplate::RenderMistral(
    const std::vector<ChatMessage>& messages) const {
  // Mistral-7B-Instruct v0.1/v0.2: user and assistant strictly alternate,
  // starting with the user; no system role.
  SegmentedText out;
  out.AddMarkup(bos_text_);
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (!OneOf(m.role, {"user", "assistant"})) return UnknownRole(m.role, "Mistral");
    if ((m.role == "user") != (i % 2 == 0)) {
      return Status::InvalidArgument(
          "messages: the Mistral template needs roles alternating user/assistant, starting with "
          "user");
    }
    if (m.role == "user") {
      out.AddMarkup("[INST] ");
      out.AddUserText(m.content);
      out.AddMarkup(" [/INST]");
    } else {
      out.AddUserText(m.content);
      out.AddMarkup(eos_text_);
    }
  }
  return out;
}

}  // namespace snapserve::tokenizer
