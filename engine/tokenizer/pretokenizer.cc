#include "engine/tokenizer/pretokenizer.h"

#include "engine/common/bounded_text.h"
#include "engine/tokenizer/unicode.h"

namespace snapserve::tokenizer {
namespace {

using Units = std::vector<CodeUnit>;

// Invalid bytes (kInvalidCodePoint) count as "other": not a letter, number or
// space. (The reference would reject such text; we still tokenize it.)
bool L(const Units& u, size_t i) { return i < u.size() && IsLetter(u[i].cp); }
bool N(const Units& u, size_t i) { return i < u.size() && IsNumber(u[i].cp); }
bool S(const Units& u, size_t i) { return i < u.size() && IsWhitespace(u[i].cp); }
bool Is(const Units& u, size_t i, uint32_t c) { return i < u.size() && u[i].cp == c; }
bool Other(const Units& u, size_t i) { return i < u.size() && !L(u, i) && !N(u, i) && !S(u, i); }
bool CrLf(const Units& u, size_t i) { return Is(u, i, '\r') || Is(u, i, '\n'); }

size_t SkipWhile(const Units& u, size_t i, bool (*pred)(const Units&, size_t)) {
  while (pred(u, i)) ++i;
  return i;
}

// Matches 's 't 're 've 'm 'll 'd at i; returns the end or i when none.
// Case-insensitive matching follows Unicode simple case folding, under which
// U+017F (long s) folds to 's'.
size_t Contraction(const Units& u, size_t i, bool ignore_case) {
  if (!Is(u, i, '\'')) return i;
  auto at = [&](size_t k, char c) {
    if (k >= u.size()) return false;
    uint32_t cp = u[k].cp;
    if (cp == static_cast<uint32_t>(c)) return true;
    if (!ignore_case) return false;
    if (cp == static_cast<uint32_t>(c - 'a' + 'A')) return true;
    return c == 's' && cp == 0x17F;
  };
  for (char c : {'s', 't', 'm', 'd'}) {
    if (at(i + 1, c)) return i + 2;
  }
  for (const char* two : {"re", "ve", "ll"}) {
    if (at(i + 1, two[0]) && at(i + 2, two[1])) return i + 3;
  }
  return i;
}

// \s+(?!\S) then \s+: a run of spaces gives back its last one when a non-space
// follows, so that the space can prefix the next word.
size_t TrailingSpaces(const Units& u, size_t i) {
  size_t end = SkipWhile(u, i, S);
  if (end < u.size() && end - i >= 2) return end - 1;
  return end;
}

size_t MatchGpt2(const Units& u, size_t i) {
  if (size_t e = Contraction(u, i, false); e != i) return e;
  size_t j = Is(u, i, ' ') ? i + 1 : i;
  if (L(u, j)) return SkipWhile(u, j, L);
  if (N(u, j)) return SkipWhile(u, j, N);
  if (Other(u, j)) return SkipWhile(u, j, Other);
  // Without the optional space: u[i] is then a space, so only \s rules apply.
  return TrailingSpaces(u, i);
}

size_t MatchLlama3(const Units& u, size_t i) {
  if (size_t e = Contraction(u, i, true); e != i) return e;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (!CrLf(u, i) && !L(u, i) && !N(u, i) && L(u, i + 1)) return SkipWhile(u, i + 1, L);
  if (L(u, i)) return SkipWhile(u, i, L);
  // \p{N}{1,3}
  if (N(u, i)) {
    size_t e = i;
    while (e < i + 3 && N(u, e)) ++e;
    return e;
  }
  // ?[^\s\p{L}\p{N}]+[\r\n]*
  size_t j = Is(u, i, ' ') ? i + 1 : i;
  if (Other(u, j)) return SkipWhile(u, SkipWhile(u, j, Other), CrLf);
  // \s*[\r\n]+ : ends after the last \r or \n of the whitespace run.
  size_t run_end = SkipWhile(u, i, S);
  for (size_t k = run_end; k > i; --k) {
    if (CrLf(u, k - 1)) return k;
  }
  return TrailingSpaces(u, i);
}

template <typename Matcher>
void SplitWith(std::string_view text, const Units& u, size_t begin, size_t end, Matcher match,
               std::vector<std::string_view>* out) {
  // Matching sees the units from `begin` to the end of the segment only:
  // lookahead must not cross into the next segment.
  Units segment(u.begin() + static_cast<ptrdiff_t>(begin), u.begin() + static_cast<ptrdiff_t>(end));
  size_t i = 0;
  while (i < segment.size()) {
    size_t e = match(segment, i);
    if (e <= i) e = i + 1;  // unreachable with these rules; guarantees progress
    uint32_t from = segment[i].offset;
    uint32_t to = segment[e - 1].offset + segment[e - 1].length;
    out->push_back(text.substr(from, to - from));
    i = e;
  }
}

}  // namespace

StatusOr<PreTokenizerType> PreTokenizerFromGgufName(std::string_view name) {
  // Names from llama.cpp's convert_hf_to_gguf.py (`tokenizer.ggml.pre`).
  if (name == "gpt2" || name == "default") return PreTokenizerType::kGpt2;
  if (name == "llama-bpe" || name == "llama3") return PreTokenizerType::kLlama3;
  if (name == "smollm") return PreTokenizerType::kSmolLM;
  return Status::Unimplemented("pre-tokenizer '" + Bounded(name) + "' is not supported");
}

std::vector<std::string_view> PreTokenize(PreTokenizerType type, std::string_view text) {
  Units u = DecodeUtf8(text);
  std::vector<std::string_view> out;
  switch (type) {
    case PreTokenizerType::kGpt2:
      SplitWith(text, u, 0, u.size(), MatchGpt2, &out);
      break;
    case PreTokenizerType::kLlama3:
      SplitWith(text, u, 0, u.size(), MatchLlama3, &out);
      break;
    case PreTokenizerType::kSmolLM: {
      // Every \p{N} code point is its own piece; the text between is split by
      // the GPT-2 rules with no lookahead across the digit.
      size_t start = 0;
      for (size_t i = 0; i <= u.size(); ++i) {
        if (i < u.size() && !IsNumber(u[i].cp)) continue;
        if (i > start) SplitWith(text, u, start, i, MatchGpt2, &out);
        if (i < u.size()) out.push_back(text.substr(u[i].offset, u[i].length));
        start = i + 1;
      }
      break;
    }
  }
  return out;
}

}  // namespace snapserve::tokenizer
