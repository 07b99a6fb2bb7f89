#include "engine/tokenizer/unicode.h"

#include <algorithm>

#include "engine/tokenizer/unicode_tables.h"

namespace snapserve::tokenizer {
namespace {

bool InRanges(const CodePointRange* ranges, size_t n, uint32_t cp) {
  const CodePointRange* end = ranges + n;
  const CodePointRange* it = std::upper_bound(
      ranges, end, cp, [](uint32_t c, const CodePointRange& r) { return c < r.lo; });
  return it != ranges && cp <= (it - 1)->hi;
}

}  // namespace

bool IsLetter(uint32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return InRanges(kLetterRanges, kLetterRangesSize, cp);
}

bool IsNumber(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return InRanges(kNumberRanges, kNumberRangesSize, cp);
}

bool IsWhitespace(uint32_t cp) {
  // White_Space (PropList.txt); stable across Unicode versions since 6.3.
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

size_t ValidSequenceLength(std::string_view s, bool* incomplete) {
  *incomplete = false;
  if (s.empty()) return 0;
  auto b = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  uint8_t c0 = b(0);
  if (c0 < 0x80) return 1;
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode Table 3-7)
  if (c0 >= 0xC2 && c0 <= 0xDF) {
    need = 2;
  } else if (c0 >= 0xE0 && c0 <= 0xEF) {
    need = 3;
    if (c0 == 0xE0) lo = 0xA0;
    if (c0 == 0xED) hi = 0x9F;
  } else if (c0 >= 0xF0 && c0 <= 0xF4) {
    need = 4;
    if (c0 == 0xF0) lo = 0x90;
    if (c0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= s.size()) {
      *incomplete = true;
      return 0;
    }
    uint8_t c = b(i);
    bool ok = i == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
    if (!ok) return 0;
  }
  return need;
}

std::vector<CodeUnit> DecodeUtf8(std::string_view text) {
  std::vector<CodeUnit> units;
  units.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    bool incomplete;
    size_t n = ValidSequenceLength(text.substr(i), &incomplete);
    if (n == 0) {
      units.push_back({kInvalidCodePoint, static_cast<uint32_t>(i), 1});
      ++i;
      continue;
    }
    auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(text[i + k])); };
    uint32_t cp;
    switch (n) {
      case 1:
        cp = b(0);
        break;
      case 2:
        cp = ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
        break;
      case 3:
        cp = ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
        break;
      default:
        cp = ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
    }
    units.push_back({cp, static_cast<uint32_t>(i), static_cast<uint32_t>(n)});
    i += n;
  }
  return units;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    bool incomplete;
    size_t n = ValidSequenceLength(bytes.substr(i), &incomplete);
    if (n > 0) {
      out.append(bytes.substr(i, n));
      i += n;
      continue;
    }
    // A maximal subpart: the lead byte plus the continuation bytes that were
    // still valid for it. It becomes one U+FFFD.
    size_t k = 1;
    while (i + k < bytes.size() && k < 4) {
      bool inc;
      size_t probe = ValidSequenceLength(bytes.substr(i, k + 1), &inc);
      if (probe != 0 || !inc) break;
      ++k;
    }
    // ValidSequenceLength(prefix of length k+1) being "incomplete" means byte
    // k still continues the sequence; stop at the first byte that does not.
    if (incomplete) k = bytes.size() - i;
    out.append("\xEF\xBF\xBD");
    i += k;
  }
  return out;
}

std::string Utf8LossyPerByte(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    bool incomplete;
    size_t n = ValidSequenceLength(bytes.substr(i), &incomplete);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(bytes.substr(i, n));
      i += n;
    }
  }
  return out;
}

}  // namespace snapserve::tokenizer
