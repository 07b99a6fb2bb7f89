// UTF-8 and Unicode-category helpers for the tokenizer. Decoding here is
// lenient where the tokenizer needs it to be (text from a client may hold
// invalid UTF-8; it still has to tokenize byte for byte) and replacement
// follows the "maximal subpart" rule that Rust's String::from_utf8_lossy (and
// so HF tokenizers) uses, so decoded text matches the reference exactly.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace snapserve::tokenizer {

bool IsLetter(uint32_t cp);      // \p{L}
bool IsNumber(uint32_t cp);      // \p{N}
bool IsWhitespace(uint32_t cp);  // \s: the Unicode White_Space property

// A code point and the bytes it came from. Invalid bytes decode one at a time
// to kInvalidCodePoint, so every byte of the input belongs to exactly one unit.
inline constexpr uint32_t kInvalidCodePoint = 0xFFFFFFFF;
struct CodeUnit {
  uint32_t cp;
  uint32_t offset;  // byte offset in the input
  uint32_t length;  // byte length (1..4)
};
std::vector<CodeUnit> DecodeUtf8(std::string_view text);

void AppendUtf8(uint32_t cp, std::string* out);

// Length of the valid UTF-8 sequence starting at s[0], or 0 if the bytes at the
// start are not a valid sequence. Sets *incomplete when s ends inside what is,
// so far, a valid sequence (more bytes could complete it).
size_t ValidSequenceLength(std::string_view s, bool* incomplete);

// Replaces each maximal invalid subpart by U+FFFD (Rust's from_utf8_lossy).
std::string Utf8Lossy(std::string_view bytes);
// Replaces each byte that starts no valid sequence by U+FFFD (the sentencepiece
// library's decoding of byte pieces: E3 81 gives two U+FFFD, not one).
std::string Utf8LossyPerByte(std::string_view bytes);

}  // namespace snapserve::tokenizer
