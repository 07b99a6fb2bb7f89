// TokenizerModel for SentencePiece vocabularies (a Hugging Face directory's
// tokenizer.model: Llama-2, Mistral-7B-v0.1), run by the sentencepiece library
// itself (Debian's libsentencepiece) rather than re-implemented, so ids follow
// the model's original tokenizer, normalization rules included.
//
// The library runs inside its own module, libsnapserve_sentencepiece.so
// (sentencepiece_shim.h says why: its bundled protobuf clashes with the
// system one gRPC loads), which this class dlopen()s on first use and talks
// to through a small C interface; engine headers never see protobuf. When
// snapserve is built without the library (the LibTorch-only GPU build), Load
// fails with a message that says so. The library's Encode is const and
// thread-safe, so one loaded model serves every request thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/common/status_or.h"
#include "engine/tokenizer/tokenizer_model.h"

namespace snapserve::tokenizer {

// Raw bytes of a SentencePiece piece: "▁" (U+2581) stands for a space and a
// byte-fallback piece "<0xNN>" for that byte. Exposed for unit tests.
std::string SentencePieceBytes(std::string_view piece, bool is_byte_piece);

class SentencePieceModel final : public TokenizerModel {
 public:
  // NotFound or InvalidArgument naming `path`; Unimplemented without the library.
  static StatusOr<std::unique_ptr<SentencePieceModel>> Load(const std::string& path);
  static bool Available();  // whether snapserve was built with the library
  ~SentencePieceModel() override;

  int32_t size() const override { return static_cast<int32_t>(texts_.size()); }
  // Encodes one stretch of text as the library does, dummy prefix included:
  // every stretch between added tokens gets its own "▁", as in the sentencepiece
  // library and HF's legacy Llama normalizer (Prepend("▁") + Replace(" ", "▁")).
  void Encode(std::string_view text, std::vector<int32_t>* ids) const override;
  std::string_view TokenText(int32_t id) const override { return texts_[static_cast<size_t>(id)]; }
  std::string TokenBytes(int32_t id) const override { return bytes_[static_cast<size_t>(id)]; }
  int32_t Find(std::string_view text) const override;
  bool StripsLeadingSpace() const override { return strips_leading_space_; }
  // One U+FFFD per invalid byte, as the sentencepiece library decodes
  // byte-fallback pieces.
  std::string Text(std::string_view bytes) const override;

  // Pieces that HF turns into special added tokens: control pieces (<s>, </s>)
  // and the unknown piece.
  bool IsSpecialPiece(int32_t id) const { return special_[static_cast<size_t>(id)]; }
  int32_t bos_id() const { return bos_id_; }  // -1 when the model has none
  int32_t eos_id() const { return eos_id_; }

 private:
  SentencePieceModel();

  void* handle_ = nullptr;          // the module's processor; freed by the destructor
  std::vector<std::string> texts_;  // by id, precomputed: decoding never calls the library
  std::vector<std::string> bytes_;
  std::vector<bool> special_;
  bool strips_leading_space_ = false;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
};

}  // namespace snapserve::tokenizer
