// TokenizerModel for byte-level BPE: a pre-tokenizer (the split rules of the
// model family) in front of ByteLevelBpe.
#pragma once

#include <utility>

#include "engine/tokenizer/byte_level_bpe.h"
#include "engine/tokenizer/pretokenizer.h"
#include "engine/tokenizer/tokenizer_model.h"

namespace snapserve::tokenizer {

class ByteLevelBpeModel final : public TokenizerModel {
 public:
  ByteLevelBpeModel(ByteLevelBpe bpe, PreTokenizerType pre) : bpe_(std::move(bpe)), pre_(pre) {}

  int32_t size() const override { return bpe_.size(); }
  void Encode(std::string_view text, std::vector<int32_t>* ids) const override;
  std::string_view TokenText(int32_t id) const override { return bpe_.token(id); }
  std::string TokenBytes(int32_t id) const override { return bpe_.TokenBytes(id); }
  int32_t Find(std::string_view text) const override { return bpe_.Find(text); }
  // Maximal-subpart replacement, as HF's ByteLevel decoder (Rust's from_utf8_lossy).
  std::string Text(std::string_view bytes) const override;

 private:
  ByteLevelBpe bpe_;
  PreTokenizerType pre_;
};

}  // namespace snapserve::tokenizer
