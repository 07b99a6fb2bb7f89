// The tokenizer's encode/decode (engine/tokenizer/tokenizer.h) on arbitrary
// bytes, with the reference tokenizer (reference_tokenizer.h): pre-tokenizer,
// Unicode categories, BPE merges, added-token matching, segmented (chat)
// encoding. Beyond not crashing it checks what byte-level BPE promises: every
// id is in the vocabulary, and decoding the ids of valid UTF-8 gives back the
// text. (Invalid input is not round-tripped: bytes that occur in no UTF-8
// text, such as 0xFF, have no token in SmolLM2's vocabulary and are dropped,
// byte_level_bpe.cc; HF tokenizers accept only valid UTF-8 at all.)
//
// Input: one flag byte (bit 0: add_special_tokens, bit 1: split_special_tokens,
// bit 2: also encode as segmented text), then the text.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/tokenizer/segmented_text.h"
#include "engine/tokenizer/unicode.h"
#include "tests/fuzz/fuzz_support.h"
#include "tests/fuzz/reference_tokenizer.h"

using snapserve::fuzz::Check;

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
  const bool valid_utf8 = snapserve::tokenizer::Utf8Lossy(text) == text;
  if (valid_utf8) {
    const std::vector<int32_t> plain = add_special ? tok.Encode(text, false, split_special) : ids;
    Check(tok.Decode(plain) == text, "Decode(Encode(text)) differs from the text");
  }
  (void)tok.Decode(ids, /*skip_special_tokens=*/true);

  if ((flags & 4) != 0) {
    // Alternate user text and markup at every newline.
    snapserve::tokenizer::SegmentedText segmented;
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
    if (valid_utf8) {
      const std::vector<int32_t> seg_plain = add_special ? tok.Encode(segmented, false) : seg_ids;
      Check(tok.Decode(seg_plain) == text, "Decode(Encode(segmented)) differs from the text");
    }
  }
  return 0;
}
