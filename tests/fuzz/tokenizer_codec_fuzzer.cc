// The tokenizer's encode/decode (engine/tokenizer/tokenizer.h) on arbitrary
// bytes, with the reference tokenizer (reference_tokenizer.h): pre-tokenizer,
// Unicode categories, BPE merges, added-token matching, segmented (chat)
// encoding. Beyond not crashing it checks what byte-level BPE promises: every
// id is in the vocabulary, and decoding the ids gives back the input bytes
// (then made valid UTF-8 as Utf8Lossy does), less the bytes that have no
// token. SmolLM2's vocabulary lacks 21 byte tokens (0x04, 0x13, the lead
// bytes 0xF1 and 0xF2, 0xFF, ...); with no unknown token those bytes are
// dropped, as HF tokenizers' BPE drops them (byte_level_bpe.cc).
//
// Input: one flag byte (bit 0: add_special_tokens, bit 1: split_special_tokens,
// bit 2: also encode as segmented text), then the text.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer/byte_level_bpe.h"
#include "engine/tokenizer/segmented_text.h"
#include "engine/tokenizer/unicode.h"
#include "tests/fuzz/fuzz_support.h"
#include "tests/fuzz/reference_tokenizer.h"

using snapserve::fuzz::Check;
namespace tk = snapserve::tokenizer;

namespace {

// `text` as the tokenizer can represent it: without the bytes that have no
// token, then made valid UTF-8.
std::string Representable(std::string_view text) {
  static const std::vector<bool> kMissing = [] {
    std::vector<bool> missing(256);
    for (int b = 0; b < 256; ++b) {
      std::string token;
      tk::AppendUtf8(tk::ByteToCodePoint(static_cast<uint8_t>(b)), &token);
      missing[b] = snapserve::fuzz::ReferenceTokenizer().model().Find(token) < 0;
    }
    return missing;
  }();
  std::string kept;
  for (unsigned char c : text) {
    if (!kMissing[c]) kept.push_back(static_cast<char>(c));
  }
  return tk::Utf8Lossy(kept);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)snapserve::fuzz::ReferenceTokenizer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto& tok = snapserve::fuzz::ReferenceTokenizer();
  const uint8_t flags = data[0];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const bool add_special = (flags & 1) != 0;
  const bool split_special = (flags & 2) != 0;

  const std::vector<int32_t> ids = tok.Encode(text, add_special, split_special);
  for (int32_t id : ids) Check(id >= 0 && id < tok.vocab_size(), "id out of the vocabulary");
  const std::string expected = Representable(text);
  const std::vector<int32_t> plain = add_special ? tok.Encode(text, false, split_special) : ids;
  Check(tok.Decode(plain) == expected, "Decode(Encode(text)) differs from the text");
  (void)tok.Decode(ids, /*skip_special_tokens=*/true);

  if ((flags & 4) != 0) {
    // Alternate user text and markup at every newline.
    tk::SegmentedText segmented;
    bool user = true;
    std::string_view rest = text;
    while (!rest.empty()) {
      const size_t nl = rest.find('\n');
      const std::string_view piece =
          rest.substr(0, nl == std::string_view::npos ? rest.size() : nl + 1);
      if (user) {
        segmented.AddUserText(piece);
      } else {
        segmented.AddMarkup(piece);
      }
      user = !user;
      rest.remove_prefix(piece.size());
    }
    const std::vector<int32_t> seg_ids = tok.Encode(segmented, add_special);
    for (int32_t id : seg_ids) Check(id >= 0 && id < tok.vocab_size(), "id out of the vocabulary");
    const std::vector<int32_t> seg_plain = add_special ? tok.Encode(segmented, false) : seg_ids;
    Check(tok.Decode(seg_plain) == expected, "Decode(Encode(segmented)) differs from the text");
  }
  return 0;
}
