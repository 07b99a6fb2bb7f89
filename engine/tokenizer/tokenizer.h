// The tokenizer the engine and server use: text <-> ids, special tokens, chat
// templates. Two model families sit behind one TokenizerModel interface:
// byte-level BPE (GPT-2, Llama-3, SmolLM2; from a GGUF file's metadata or a
// Hugging Face tokenizer.json; bpe_model.h) and SentencePiece (Llama-2,
// Mistral-7B-v0.1; a Hugging Face directory's tokenizer.model;
// sentencepiece_model.h). Immutable after loading, so one instance is shared
// by all threads.
//
// Where a GGUF file and the model's original tokenizer.json disagree, this
// follows the original: SmolLM2's tokenizer.json splits every digit on its own
// (Digits(individual_digits=true) before ByteLevel) and its GGUF says so with
// tokenizer.ggml.pre = "smollm", but transformers' GGUF conversion drops that
// rule and uses plain ByteLevel. tests/python/test_tokenizer_parity.py checks
// both the agreement with the original rules and that the case is real.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/common/status_or.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/segmented_text.h"
#include "engine/tokenizer/tokenizer_model.h"

namespace snapserve::model {
class GgufFile;
}

namespace snapserve::tokenizer {

class Tokenizer {
 public:
  // Byte-level BPE metadata ("gpt2"); SentencePiece vocabularies stored in
  // GGUF ("llama") are refused with an error that names what is supported.
  static StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const model::GgufFile& gguf);
  // A byte-level BPE tokenizer.json or, failing that, a SentencePiece
  // tokenizer.model; plus tokenizer_config.json (chat template, bos/eos,
  // add_bos_token) when present.
  static StatusOr<std::unique_ptr<Tokenizer>> FromHfDirectory(const std::string& dir);

  // Added tokens written in the text are matched as tokens, special ones
  // (control tokens such as "<|im_end|>") too unless split_special_tokens,
  // which tokenizes their strings as plain text (transformers'
  // split_special_tokens=True). add_special_tokens adds what the model's
  // configuration says (BOS for Llama-3, nothing for SmolLM2).
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens,
                              bool split_special_tokens = false) const;
  // Special tokens are matched in markup segments only. Text between two
  // matched added tokens is tokenized as one stretch even when it spans
  // segments, so ids equal those of Encode(text.Joined()) whenever the user
  // text holds no special-token string.
  std::vector<int32_t> Encode(const SegmentedText& text, bool add_special_tokens) const;
  // Invalid UTF-8 from a partial sequence of tokens becomes U+FFFD (BPE: per
  // maximal invalid subpart, as HF; SentencePiece: per byte, as the library).
  // SentencePiece models drop the space their dummy prefix put at the start.
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;
  // Fails when the model has no (supported) chat template or a role is unknown.
  StatusOr<std::string> ApplyChatTemplate(const std::vector<ChatMessage>& messages,
                                          bool add_generation_prompt) const;
  // The ids of the rendered chat: the template's markup yields its special
  // tokens, message content is plain text (a "<|im_start|>" in it cannot open
  // a turn). Nothing is added beyond what the template writes (it writes BOS
  // where the model wants one).
  StatusOr<std::vector<int32_t>> EncodeChat(const std::vector<ChatMessage>& messages,
                                            bool add_generation_prompt) const;
  // A chat whose last message (a user's) is a document followed by
  // `question` (docs/api.md, "Documents and questions"): the ids of the
  // rendered chat up to the end of that message's content, and the ids of
  // the question with the rest of the rendering (the end of the turn, the
  // generation prompt). Both are plain text in the message's place.
  struct DocumentAndQuestion {
    std::vector<int32_t> document;
    std::vector<int32_t> question;
  };
  StatusOr<DocumentAndQuestion> EncodeChatDocument(const std::vector<ChatMessage>& messages,
                                                   std::string_view question) const;

  int32_t vocab_size() const { return model_->size(); }
  int32_t bos_id() const { return bos_id_; }  // -1 when the model has none
  int32_t eos_id() const { return eos_id_; }
  bool add_bos() const { return add_bos_; }
  bool IsSpecial(int32_t id) const;
  // The token's text as stored in the vocabulary (byte-level form, or the
  // SentencePiece piece with its "▁" and "<0xNN>"); "" if out of range.
  std::string_view TokenText(int32_t id) const;
  // The raw bytes a token stands for (may be a partial UTF-8 character).
  std::string TokenBytes(int32_t id) const;
  const TokenizerModel& model() const { return *model_; }

 private:
  struct AddedToken {
    std::string text;
    int32_t id;
  };
  explicit Tokenizer(std::unique_ptr<TokenizerModel> model) : model_(std::move(model)) {}
  // Registers a token matched verbatim in input text before pre-tokenization.
  void AddToken(const std::string& text, int32_t id, bool special);
  // Length of the longest added token starting at text[pos], and its id.
  size_t MatchAdded(std::string_view text, size_t pos, int32_t* id) const;

  std::unique_ptr<TokenizerModel> model_;
  // Added tokens by first byte, longest first, for longest-match lookup.
  std::vector<std::vector<AddedToken>> added_ = std::vector<std::vector<AddedToken>>(256);
  std::vector<bool> special_;  // by id
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  bool add_bos_ = false;
  bool add_eos_ = false;
  std::vector<int32_t> prefix_ids_;  // added by Encode(add_special_tokens=true)
  std::vector<int32_t> suffix_ids_;
  std::unique_ptr<ChatTemplate> chat_template_;
  Status chat_template_error_;

  friend class TokenizerLoader;
};

// Streaming detokenization: ids go in one at a time, text deltas come out that
// never split a UTF-8 character; bytes of an incomplete character are held
// until a later token completes them. The concatenated deltas plus Flush()
// equal Tokenizer::Decode of all ids.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false)
      : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}
  std::string Push(int32_t id);
  // Emits what is still held (an incomplete character becomes U+FFFD).
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  bool started_ = false;  // whether any byte has been decoded (leading-space rule)
  std::string pending_;
};

}  // namespace snapserve::tokenizer
