// Unicode NFC as UAX #15 defines it: canonical decomposition, canonical ordering (stable, by combining
// class), canonical composition with the blocking rule, Hangul by the arithmetic of Unicode §3.12.
// Reference: Python's unicodedata.normalize("NFC") (tables: tools/gen_nfc_tables.py) and JavaScript's
// String.prototype.normalize("NFC"); nfc_test.cpp compares with Python over every code point.
#include "lineage/tokenizer/nfc.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "lineage/tokenizer/bpe_model.h"
#include "lineage/tokenizer/unicode_tables.h"

namespace lineage::tokenizer {
namespace {

using unicode::CodePointRange;

// Hangul syllables: S = SBase + (L * VCount + V) * TCount + T, T = 0 for an LV syllable.
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kSCount = kLCount * kVCount * kTCount;

bool is_hangul_syllable(uint32_t cp) { return cp - kSBase < kSCount; }

uint8_t combining_class(uint32_t cp) {
  if (cp < 0x300) return 0;
  const auto* begin = unicode::kCombiningClassRanges;
  const auto* end = begin + unicode::kCombiningClassRangesCount;
  const auto* it = std::upper_bound(begin, end, cp, [](uint32_t c, const auto& r) { return c < r.lo; });
  return it != begin && cp <= (it - 1)->hi ? (it - 1)->ccc : 0;
}

const unicode::Decomposition* find_decomposition(uint32_t cp) {
  const auto* end = unicode::kDecompositions + unicode::kDecompositionsCount;
  const auto* it = std::lower_bound(unicode::kDecompositions, end, cp,
                                    [](const auto& d, uint32_t c) { return d.cp < c; });
  return it != end && it->cp == cp ? it : nullptr;
}

// The primary composite of first + second, or 0 if there is none.
uint32_t compose(uint32_t first, uint32_t second) {
  if (first - kLBase < kLCount && second - kVBase < kVCount) {
    return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
  }
  if (is_hangul_syllable(first) && (first - kSBase) % kTCount == 0 && second - (kTBase + 1) < kTCount - 1) {
    return first + (second - kTBase);
  }
  const auto* end = unicode::kCompositions + unicode::kCompositionsCount;
  const auto before = [](const unicode::Composition& c, const std::pair<uint32_t, uint32_t>& key) {
    return c.first < key.first || (c.first == key.first && c.second < key.second);
  };
  const auto* it = std::lower_bound(unicode::kCompositions, end, std::pair{first, second}, before);
  return it != end && it->first == first && it->second == second ? it->composite : 0;
}

// The code points NFC may change or merge with what precedes them: combining class != 0, a
// decomposition that does not compose back (singletons, exclusions, non-starter decompositions), the
// second of a composite (Hangul V and T jamo too). Every other code point ("stable") is its own NFC
// and starts a segment whose NFC does not depend on the text before it (UAX #15's boundaries).
struct UnstableSet {
  std::vector<CodePointRange> ranges;  // sorted, disjoint
  uint32_t first = 0;                  // the lowest unstable code point
};

const UnstableSet& unstable_set() {
  static const UnstableSet set = [] {
    std::vector<uint32_t> composites, cps;
    for (size_t k = 0; k < unicode::kCompositionsCount; ++k) {
      composites.push_back(unicode::kCompositions[k].composite);
      cps.push_back(unicode::kCompositions[k].second);
    }
    std::sort(composites.begin(), composites.end());
    for (size_t k = 0; k < unicode::kCombiningClassRangesCount; ++k) {
      const auto& r = unicode::kCombiningClassRanges[k];
      for (uint32_t c = r.lo; c <= r.hi; ++c) cps.push_back(c);
    }
    for (size_t k = 0; k < unicode::kDecompositionsCount; ++k) {
      const uint32_t c = unicode::kDecompositions[k].cp;
      if (!std::binary_search(composites.begin(), composites.end(), c)) cps.push_back(c);
    }
    for (uint32_t c = kVBase; c < kVBase + kVCount; ++c) cps.push_back(c);
    for (uint32_t c = kTBase + 1; c < kTBase + kTCount; ++c) cps.push_back(c);
    std::sort(cps.begin(), cps.end());
    UnstableSet s;
    for (const uint32_t c : cps) {
      if (!s.ranges.empty() && c <= s.ranges.back().hi + 1) {
        s.ranges.back().hi = std::max(s.ranges.back().hi, c);
      } else {
        s.ranges.push_back({c, c});
      }
    }
    s.first = s.ranges.front().lo;
    return s;
  }();
  return set;
}

bool is_stable(uint32_t cp, const UnstableSet& set) {
  if (cp < set.first) return true;
  const auto it = std::upper_bound(set.ranges.begin(), set.ranges.end(), cp,
                                   [](uint32_t c, const CodePointRange& r) { return c < r.lo; });
  return !(it != set.ranges.begin() && cp <= (it - 1)->hi);
}

struct Char {
  uint32_t cp;
  uint8_t ccc;
};

void append_decomposition(uint32_t cp, std::vector<Char>& buf) {
  if (is_hangul_syllable(cp)) {
    const uint32_t s = cp - kSBase;
    buf.push_back({kLBase + s / (kVCount * kTCount), 0});
    buf.push_back({kVBase + s % (kVCount * kTCount) / kTCount, 0});
    if (s % kTCount != 0) buf.push_back({kTBase + s % kTCount, 0});
  } else if (const unicode::Decomposition* d = find_decomposition(cp)) {
    for (uint32_t k = 0; k < d->length; ++k) {
      const uint32_t c = unicode::kDecompositionPool[d->offset + k];
      buf.push_back({c, combining_class(c)});
    }
  } else {
    buf.push_back({cp, combining_class(cp)});
  }
}

// Appends the NFC of `segment` (valid UTF-8) to `out`; `buf` is scratch space.
void normalize_segment(std::string_view segment, std::vector<Char>& buf, std::string& out) {
  buf.clear();
  for (size_t i = 0; i < segment.size();) {
    const CodePoint c = decode_utf8(segment, i);
    append_decomposition(c.cp, buf);
    i += c.length;
  }
  // Canonical ordering: each run of non-starters, stably by combining class.
  const auto by_ccc = [](const Char& a, const Char& b) { return a.ccc < b.ccc; };
  for (size_t k = 0; k < buf.size();) {
    if (buf[k].ccc == 0) {
      ++k;
      continue;
    }
    size_t j = k;
    while (j < buf.size() && buf[j].ccc != 0) ++j;
    if (j - k > 1) std::stable_sort(buf.begin() + k, buf.begin() + j, by_ccc);
    k = j;
  }
  // Canonical composition: a character composes with the last starter unless blocked, i.e. unless a
  // character between them has class 0 or a class >= its own (in canonical order, the last one kept).
  constexpr size_t kNone = SIZE_MAX;
  size_t starter = kNone;
  size_t w = 0;  // characters kept so far
  for (size_t r = 0; r < buf.size(); ++r) {
    const Char ch = buf[r];
    if (starter != kNone && (w - 1 == starter || buf[w - 1].ccc < ch.ccc)) {
      if (const uint32_t composite = compose(buf[starter].cp, ch.cp)) {
        buf[starter].cp = composite;
        continue;
      }
    }
    if (ch.ccc == 0) starter = w;
    buf[w++] = ch;
  }
  for (size_t k = 0; k < w; ++k) append_utf8(out, buf[k].cp);
}

}  // namespace

std::string nfc(std::string_view text) {
  const size_t n = text.size();
  size_t i = 0;
  while (i < n && uint8_t(text[i]) < 0x80) ++i;
  if (i == n) return std::string(text);

  const UnstableSet& unstable = unstable_set();
  std::string out;
  out.reserve(n);
  std::vector<Char> buf;
  size_t copied = 0;         // text[0, copied) is in `out`
  // Where the segment of text[i] starts: its last stable code point (here the last ASCII byte), or
  // the text after an invalid byte.
  size_t segment_start = i > 0 ? i - 1 : 0;
  // The end of the segment that goes on at text[j]: the next stable code point or invalid byte.
  const auto segment_end = [&](size_t j) {
    while (j < n && uint8_t(text[j]) >= 0x80) {
      const CodePoint c = decode_utf8(text, j);
      if (c.cp == kInvalidCodePoint || is_stable(c.cp, unstable)) break;
      j += c.length;
    }
    return j;
  };
  while (i < n) {
    if (uint8_t(text[i]) < 0x80) {
      segment_start = i++;
      continue;
    }
    const CodePoint c = decode_utf8(text, i);
    if (c.cp == kInvalidCodePoint) {
      segment_start = ++i;
      continue;
    }
    if (is_stable(c.cp, unstable)) {
      segment_start = i;
      i += c.length;
      continue;
    }
    const size_t end = segment_end(i + c.length);
    out.append(text.substr(copied, segment_start - copied));
    normalize_segment(text.substr(segment_start, end - segment_start), buf, out);
    copied = segment_start = i = end;
  }
  out.append(text.substr(copied));
  return out;
}

}  // namespace lineage::tokenizer
