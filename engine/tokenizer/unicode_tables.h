// Unicode category tables for the pre-tokenizer (generated into
// unicode_tables.cc by scripts/gen_unicode_tables.py). Sorted, disjoint,
// inclusive code point ranges.
#pragma once

#include <cstddef>
#include <cstdint>

namespace snapserve::tokenizer {

struct CodePointRange {
  uint32_t lo;
  uint32_t hi;
};

extern const CodePointRange kLetterRanges[];  // general category L*
extern const size_t kLetterRangesSize;
extern const CodePointRange kNumberRanges[];  // general category N*
extern const size_t kNumberRangesSize;

}  // namespace snapserve::tokenizer
