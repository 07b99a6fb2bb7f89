#include "engine/common/bounded_text.h"

namespace snapserve {

std::string Bounded(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t cut = max_bytes;
  // Never split a multi-byte character: step back over continuation bytes
  // (10xxxxxx) to the start of the character that straddles the cut.
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return std::string(text.substr(0, cut)) + "\xE2\x80\xA6(" + std::to_string(text.size()) +
         " bytes)";
}

}  // namespace snapserve
