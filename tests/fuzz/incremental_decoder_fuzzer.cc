// Streaming detokenization (IncrementalDecoder, engine/tokenizer/tokenizer.h)
// and the UTF-8 helpers under it (engine/tokenizer/unicode.h), with the
// reference tokenizer (reference_tokenizer.h). Checks the documented
// contracts: every delta is valid UTF-8 (no character split across deltas),
// the deltas plus Flush() equal Tokenizer::Decode of all ids; DecodeUtf8
// covers every input byte exactly once; Utf8Lossy's output is valid UTF-8.
//
// Input: one flag byte (bit 0: skip_special_tokens), then ids as 2-byte
// little-endian numbers taken modulo (vocabulary size + 8), so a few ids are
// out of range. The whole input also goes through the UTF-8 helpers as text.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer/unicode.h"
#include "tests/fuzz/fuzz_support.h"
#include "tests/fuzz/reference_tokenizer.h"

using snapserve::fuzz::Check;
namespace tk = snapserve::tokenizer;

namespace {

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    bool incomplete = false;
    const size_t n = tk::ValidSequenceLength(s.substr(i), &incomplete);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

void CheckUtf8Helpers(std::string_view text) {
  const std::vector<tk::CodeUnit> units = tk::DecodeUtf8(text);
  size_t at = 0;
  for (const tk::CodeUnit& u : units) {
    Check(u.offset == at && u.length >= 1 && u.length <= 4, "DecodeUtf8 units do not tile");
    at += u.length;
    if (u.cp != tk::kInvalidCodePoint) {
      std::string back;
      tk::AppendUtf8(u.cp, &back);
      Check(back == text.substr(u.offset, u.length), "AppendUtf8 does not re-encode a unit");
    }
  }
  Check(at == text.size(), "DecodeUtf8 units do not cover the text");
  const std::string lossy = tk::Utf8Lossy(text);
  Check(IsValidUtf8(lossy), "Utf8Lossy output is not valid UTF-8");
  Check(IsValidUtf8(text) == (lossy == text), "Utf8Lossy changed valid text or kept invalid");
  Check(IsValidUtf8(tk::Utf8LossyPerByte(text)), "Utf8LossyPerByte output is not valid UTF-8");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)snapserve::fuzz::ReferenceTokenizer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  CheckUtf8Helpers(std::string_view(reinterpret_cast<const char*>(data), size));
  if (size == 0) return 0;
  const auto& tok = snapserve::fuzz::ReferenceTokenizer();
  const bool skip_special = (data[0] & 1) != 0;
  const uint32_t modulus = static_cast<uint32_t>(tok.vocab_size()) + 8;
  std::vector<int32_t> ids;
  for (size_t i = 1; i + 1 < size; i += 2) {
    const uint32_t raw = data[i] | (static_cast<uint32_t>(data[i + 1]) << 8);
    ids.push_back(static_cast<int32_t>(raw % modulus));
  }
  tk::IncrementalDecoder decoder(tok, skip_special);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string delta = decoder.Push(id);
    Check(IsValidUtf8(delta), "a delta is not valid UTF-8");
    streamed += delta;
  }
  const std::string tail = decoder.Flush();
  Check(IsValidUtf8(tail), "Flush() is not valid UTF-8");
  streamed += tail;
  Check(streamed == tok.Decode(ids, skip_special), "deltas + Flush() differ from Decode");
  return 0;
}
