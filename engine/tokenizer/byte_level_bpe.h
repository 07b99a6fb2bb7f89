// Byte-level BPE model (GPT-2 family): the vocabulary, the merge ranks and the
// byte <-> printable-character mapping. It turns one pre-tokenized piece into
// ids and ids back into bytes. Knows nothing of special tokens, pre-tokenizer
// rules or chat formats (tokenizer.cc owns those).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/common/status_or.h"

namespace snapserve::tokenizer {

// GPT-2's bytes_to_unicode(): each byte as the code point its token text uses
// (printable bytes stand for themselves, the rest are shifted past U+0100).
uint32_t ByteToCodePoint(uint8_t byte);
// Inverse of ByteToCodePoint; -1 for a code point that stands for no byte.
int ByteFromCodePoint(uint32_t cp);

class ByteLevelBpe {
 public:
  // `tokens[i]` is the text of id i (in byte-level form); `merges` are pairs
  // of token texts, highest priority first. ignore_merges: a piece that is a
  // whole vocabulary entry is emitted as is (Llama-3's tokenizer.json).
  static StatusOr<ByteLevelBpe> Create(
      std::vector<std::string> tokens,
      const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges);

  // Appends the ids of one pre-tokenized piece (raw UTF-8 bytes).
  void Encode(std::string_view piece, std::vector<int32_t>* ids) const;

  int32_t size() const { return static_cast<int32_t>(tokens_.size()); }
  const std::string& token(int32_t id) const { return tokens_[static_cast<size_t>(id)]; }
  // The id of a token text, or -1.
  int32_t Find(std::string_view text) const;
  // The bytes a token stands for: its text mapped back through the byte
  // table, or its raw text when some character stands for no byte (added
  // tokens such as "<|im_end|>" are written in plain text).
  std::string TokenBytes(int32_t id) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t> ids_;
  std::unordered_map<uint64_t, Merge> merges_;
  int32_t byte_ids_[256];
  bool ignore_merges_ = false;
};

}  // namespace snapserve::tokenizer
