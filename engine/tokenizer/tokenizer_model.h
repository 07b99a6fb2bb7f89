// The vocabulary-and-algorithm half of a Tokenizer: what differs between
// byte-level BPE (GPT-2, Llama-3, SmolLM2) and SentencePiece (Llama-2,
// Mistral-7B-v0.1). Special tokens written in the text, BOS/EOS and chat
// templates are the same for both and live in Tokenizer; a model only sees
// text that holds no added token.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace snapserve::tokenizer {

class TokenizerModel {
 public:
  virtual ~TokenizerModel() = default;

  virtual int32_t size() const = 0;
  // Appends the ids of `text`, a stretch of input between added tokens.
  virtual void Encode(std::string_view text, std::vector<int32_t>* ids) const = 0;
  // The token's text as stored in the vocabulary; `id` must be in range.
  virtual std::string_view TokenText(int32_t id) const = 0;
  // The raw bytes `id` stands for (may be part of a UTF-8 character).
  virtual std::string TokenBytes(int32_t id) const = 0;
  // The id of a vocabulary text, or -1.
  virtual int32_t Find(std::string_view text) const = 0;

  // Decoding rules, shared by Tokenizer::Decode and IncrementalDecoder so the
  // two always agree:
  // Whether one space at the very start of the decoded bytes is dropped
  // (SentencePiece's dummy prefix, HF's Strip(" ", 1) decoder).
  virtual bool StripsLeadingSpace() const { return false; }
  // Turns decoded bytes into valid UTF-8. The split points IncrementalDecoder
  // uses (never inside a possibly incomplete character) must not change the
  // result: Text(a) + Text(b) == Text(a + b) for such a split.
  virtual std::string Text(std::string_view bytes) const = 0;
};

}  // namespace snapserve::tokenizer
