#include "engine/tokenizer/tokenizer.h"

#include <algorithm>

namespace snapserve::tokenizer {

void Tokenizer::AddToken(const std::string& text, int32_t id, bool special) {
  if (id < 0 || id >= vocab_size()) return;
  if (special) special_[static_cast<size_t>(id)] = true;
  if (text.empty()) return;
  auto& bucket = added_[static_cast<unsigned char>(text[0])];
  for (const AddedToken& t : bucket) {
    if (t.text == text) return;
  }
  bucket.push_back({text, id});
  std::stable_sort(bucket.begin(), bucket.end(), [](const AddedToken& a, const AddedToken& b) {
    return a.text.size() > b.text.size();
  });
}

size_t Tokenizer::MatchAdded(std::string_view text, size_t pos, int32_t* id) const {
  for (const AddedToken& t : added_[static_cast<unsigned char>(text[pos])]) {
    if (text.compare(pos, t.text.size(), t.text) == 0) {
      *id = t.id;
      return t.text.size();
    }
  }
  return 0;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special_tokens,
                                       bool split_special_tokens) const {
  SegmentedText segmented;
  if (split_special_tokens) {
    segmented.AddUserText(text);
  } else {
    segmented.AddMarkup(text);
  }
  return Encode(segmented, add_special_tokens);
}

std::vector<int32_t> Tokenizer::Encode(const SegmentedText& text, bool add_special_tokens) const {
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = prefix_ids_;
  // Added tokens split the text first (leftmost, then longest, as HF's
  // AddedVocabulary does); the text between them (`stretch`) is pre-tokenized
  // on its own, so no regex rule sees across an added token and each stretch
  // gets its own SentencePiece dummy prefix.
  std::string stretch;
  for (const SegmentedText::Segment& segment : text.segments()) {
    const std::string_view s = segment.text;
    size_t start = 0;
    for (size_t i = 0; i < s.size();) {
      int32_t id;
      const size_t n = MatchAdded(s, i, &id);
      if (n == 0) {
        ++i;
        continue;
      }
      if (!segment.parse_special_tokens && IsSpecial(id)) {
        // As HF with encode_special_tokens: the whole match stays text (no
        // shorter added token is tried inside it).
        i += n;
        continue;
      }
      stretch.append(s.substr(start, i - start));
      model_->Encode(stretch, &ids);
      stretch.clear();
      ids.push_back(id);
      i += n;
      start = i;
    }
    stretch.append(s.substr(start));
  }
  model_->Encode(stretch, &ids);
  if (add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;  // HF drops ids it cannot map
    if (skip_special_tokens && IsSpecial(id)) continue;
    bytes += model_->TokenBytes(id);
  }
  if (model_->StripsLeadingSpace() && !bytes.empty() && bytes[0] == ' ') bytes.erase(0, 1);
  return model_->Text(bytes);
}

StatusOr<std::string> Tokenizer::ApplyChatTemplate(const std::vector<ChatMessage>& messages,
                                                   bool add_generation_prompt) const {
  if (chat_template_ == nullptr) return chat_template_error_;
  SNAPSERVE_ASSIGN_OR_RETURN(const SegmentedText text,
                             chat_template_->Render(messages, add_generation_prompt));
  return text.Joined();
}

StatusOr<std::vector<int32_t>> Tokenizer::EncodeChat(const std::vector<ChatMessage>& messages,
                                                     bool add_generation_prompt) const {
  if (chat_template_ == nullptr) return chat_template_error_;
  SNAPSERVE_ASSIGN_OR_RETURN(const SegmentedText text,
                             chat_template_->Render(messages, add_generation_prompt));
  return Encode(text, /*add_special_tokens=*/false);
}

StatusOr<Tokenizer::DocumentAndQuestion> Tokenizer::EncodeChatDocument(
    const std::vector<ChatMessage>& messages, std::string_view question) const {
  if (chat_template_ == nullptr) return chat_template_error_;
  if (messages.empty() || messages.back().role != "user") {
    return Status::InvalidArgument("with a question the last message must be the user's document");
  }
  // The template renders the document with a marker after it, and the
  // rendering is cut there: what a template writes around the content is
  // the same whatever the content ends with.
  constexpr std::string_view kMarker = "\x1f\x1esnapserve-question\x1e\x1f";
  std::vector<ChatMessage> marked = messages;
  for (const ChatMessage& m : marked) {
    if (m.content.find(kMarker) != std::string::npos) {
      return Status::InvalidArgument("a message holds the control characters 1F 1E");
    }
  }
  marked.back().content += kMarker;
  SNAPSERVE_ASSIGN_OR_RETURN(const SegmentedText text, chat_template_->Render(marked, true));
  SegmentedText document, rest;
  bool cut = false;
  for (const SegmentedText::Segment& s : text.segments()) {
    const size_t at = s.parse_special_tokens ? std::string::npos : s.text.find(kMarker);
    auto add = [](SegmentedText& t, const SegmentedText::Segment& seg, std::string_view part) {
      if (seg.parse_special_tokens) {
        t.AddMarkup(part);
      } else {
        t.AddUserText(part);
      }
    };
    if (cut) {
      add(rest, s, s.text);
    } else if (at == std::string::npos) {
      add(document, s, s.text);
    } else {
      document.AddUserText(std::string_view(s.text).substr(0, at));
      rest.AddUserText(question);
      rest.AddUserText(std::string_view(s.text).substr(at + kMarker.size()));
      cut = true;
    }
  }
  if (!cut) return Status::Internal("the chat template dropped the document's end marker");
  return DocumentAndQuestion{Encode(document, /*add_special_tokens=*/false),
                             Encode(rest, /*add_special_tokens=*/false)};
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && special_[static_cast<size_t>(id)];
}

std::string_view Tokenizer::TokenText(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return model_->TokenText(id);
}

std::string Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return model_->TokenBytes(id);
}

}  // namespace snapserve::tokenizer
