// Unicode character classes used by the GPT-2 pre-tokenizer: \p{L}, \p{N} and \s, as ranges
// generated from node's regex engine (tools/gen_unicode_tables.mjs) so they match js-tiktoken.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lineage::io::unicode {

struct CodePointRange {
  uint32_t lo;  // inclusive
  uint32_t hi;  // inclusive
};

extern const CodePointRange kLetterRanges[];  // \p{L}
extern const std::size_t kLetterRangesCount;
extern const CodePointRange kNumberRanges[];  // \p{N}
extern const std::size_t kNumberRangesCount;
extern const CodePointRange kSpaceRanges[];   // ECMAScript \s
extern const std::size_t kSpaceRangesCount;
extern const char kUnicodeVersion[];          // the Unicode version the tables were generated from

}  // namespace lineage::io::unicode
