// Kimi's pre-tokenizer (moonshotai tokenization_kimi.py pat_str; bpe_model.h has the pattern) as a
// hand-written scanner. tiktoken runs the pattern on fancy-regex over the Rust regex crate: leftmost-
// first alternation with backtracking, so each alternative below returns the end its first
// successful path reaches, not the longest match. Classes: unicode_tables_tiktoken.cpp.
#include <algorithm>
#include <array>

#include "lineage/core/error.h"
#include "lineage/tokenizer/bpe_model.h"
#include "lineage/tokenizer/unicode_tables.h"

namespace lineage::tokenizer {
namespace {

using unicode::TiktokenClass;

uint8_t classes_slow(uint32_t cp) {
  const unicode::ClassRange* begin = unicode::kTiktokenClassRanges;
  const unicode::ClassRange* end = begin + unicode::kTiktokenClassRangesCount;
  const auto* it = std::upper_bound(begin, end, cp, [](uint32_t v, const unicode::ClassRange& r) { return v < r.lo; });
  return it != begin && cp <= (it - 1)->hi ? (it - 1)->classes : 0;
}

// ASCII is most text; a table saves the binary search.
const std::array<uint8_t, 128>& ascii_classes() {
  static const std::array<uint8_t, 128> table = [] {
    std::array<uint8_t, 128> t{};
    for (uint32_t c = 0; c < 128; ++c) t[c] = classes_slow(c);
    return t;
  }();
  return table;
}

constexpr uint8_t kLetter = unicode::kUpperOrTitle | unicode::kLower | unicode::kModifierOrOther;

// One code point with what the pattern asks of it.
struct Char {
  uint32_t cp;
  int length;
  uint8_t classes;  // TiktokenClass bits; none for an invalid byte

  bool han() const { return classes & unicode::kHan; }
  bool space() const { return classes & unicode::kWhiteSpace; }
  bool number() const { return classes & unicode::kNumeric; }
  bool line_break() const { return cp == '\r' || cp == '\n'; }
  // [^\r\n\p{L}\p{N}]: the one character that may lead a word.
  bool leads_word() const { return !line_break() && !(classes & (kLetter | unicode::kNumeric)); }
  // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]
  bool upper() const { return !han() && (classes & (unicode::kUpperOrTitle | unicode::kModifierOrOther | unicode::kMark)); }
  // [\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]
  bool lower() const { return !han() && (classes & (unicode::kLower | unicode::kModifierOrOther | unicode::kMark)); }
  // [^\s\p{L}\p{N}]
  bool other() const { return !(classes & (unicode::kWhiteSpace | kLetter | unicode::kNumeric)); }
};

class KimiScanner {
 public:
  explicit KimiScanner(std::string_view text) : text_(text) {}

  // End of the match at `i` (< size); the alternatives in the pattern's order.
  size_t match(size_t i) const {
    const Char c = at(i);
    if (c.han()) return run_end(i, &Char::han);
    if (const size_t end = letters(i, &KimiScanner::lower_tail)) return end;
    if (const size_t end = letters(i, &KimiScanner::upper_tail)) return end;
    if (c.number()) return numbers(i);
    if (const size_t end = punctuation(i)) return end;
    return spaces(i);
  }

 private:
  Char at(size_t i) const {
    const CodePoint c = decode_utf8(text_, i);
    const uint8_t classes = c.cp == kInvalidCodePoint ? 0 : c.cp < 128 ? ascii_classes()[c.cp] : classes_slow(c.cp);
    return {c.cp, c.length, classes};
  }

  size_t run_end(size_t i, bool (Char::*in)() const) const {
    while (i < text_.size()) {
      const Char c = at(i);
      if (!(c.*in)()) break;
      i += size_t(c.length);
    }
    return i;
  }

  // "[^\r\n\p{L}\p{N}]?" then `tail` (one of the two letter alternatives). The optional leading
  // character is taken first; where the rest then fails, the regex retries without it.
  size_t letters(size_t i, size_t (KimiScanner::*tail)(size_t) const) const {
    const Char c = at(i);
    if (c.leads_word() && i + size_t(c.length) < text_.size()) {
      if (const size_t end = (this->*tail)(i + size_t(c.length))) return end;
    }
    return (this->*tail)(i);
  }

  // "U*W+C?" (U, W: the upper and lower classes above; they share Lm, Lo and M). U* backtracks to
  // the last position where W+ can start; W+ and C? are greedy. 0 when it does not match at `s`.
  size_t lower_tail(size_t s) const {
    size_t pos = s;
    size_t w_start = std::string_view::npos;
    while (pos < text_.size()) {
      const Char c = at(pos);
      if (c.lower()) w_start = pos;
      if (!c.upper()) break;
      pos += size_t(c.length);
    }
    if (w_start == std::string_view::npos) return 0;
    return contraction_end(run_end(w_start, &Char::lower));
  }

  // "U+W*C?": all greedy, so the first path succeeds as soon as U+ matches once.
  size_t upper_tail(size_t s) const {
    const size_t u_end = run_end(s, &Char::upper);
    if (u_end == s) return 0;
    return contraction_end(run_end(u_end, &Char::lower));
  }

  // "(?i:'s|'t|'re|'ve|'m|'ll|'d)?" at `i`. The regex crate folds case with Unicode's simple case
  // folding, under which 's' also matches U+017F LATIN SMALL LETTER LONG S.
  size_t contraction_end(size_t i) const {
    if (i >= text_.size() || text_[i] != '\'' || i + 1 >= text_.size()) return i;
    const Char a = at(i + 1);
    const uint32_t la = a.cp | 0x20;  // ASCII lower case (other code points only compare unequal)
    if (a.cp < 128 && (la == 's' || la == 't' || la == 'm' || la == 'd')) return i + 2;
    if (a.cp == 0x017F) return i + 1 + size_t(a.length);
    if (a.cp >= 128 || i + 2 >= text_.size()) return i;
    const uint32_t lb = uint32_t(uint8_t(text_[i + 2])) | 0x20;
    if ((la == 'r' && lb == 'e') || (la == 'v' && lb == 'e') || (la == 'l' && lb == 'l')) return i + 3;
    return i;
  }

  // "\p{N}{1,3}"
  size_t numbers(size_t i) const {
    for (int k = 0; k < 3 && i < text_.size(); ++k) {
      const Char c = at(i);
      if (!c.number()) break;
      i += size_t(c.length);
    }
    return i;
  }

  // " ?[^\s\p{L}\p{N}]+[\r\n]*", or 0.
  size_t punctuation(size_t i) const {
    size_t s = i;
    if (text_[i] == ' ' && i + 1 < text_.size() && at(i + 1).other()) {
      s = i + 1;
    } else if (!at(i).other()) {
      return 0;
    }
    size_t end = run_end(s, &Char::other);
    while (end < text_.size() && (text_[end] == '\r' || text_[end] == '\n')) ++end;
    return end;
  }

  // "\s*[\r\n]+|\s+(?!\S)|\s+" at a white-space character (every other character matched above).
  size_t spaces(size_t i) const {
    size_t end = i;
    size_t last_break = std::string_view::npos;  // the last \r or \n of the run
    size_t last_start = i;                       // where the run's last character starts
    while (end < text_.size()) {
      const Char c = at(end);
      if (!c.space()) break;
      if (c.line_break()) last_break = end;
      last_start = end;
      end += size_t(c.length);
    }
    // \s* backtracks to the run's last line break, which [\r\n]+ then takes (what follows the
    // run is not white space, so not a line break either).
    if (last_break != std::string_view::npos) return last_break + 1;
    if (end == text_.size()) return end;    // \s+(?!\S) at the end of the text
    if (last_start > i) return last_start;  // \s+(?!\S): the last one leads the next word
    return end;                             // \s+: a single white-space character
  }

  std::string_view text_;
};

}  // namespace

void split_kimi(std::string_view text, std::vector<std::string_view>& words) {
  const KimiScanner scanner(text);
  for (size_t i = 0; i < text.size();) {
    const size_t end = scanner.match(i);
    LINEAGE_CHECK(end > i, "split_kimi: no alternative matched at byte ", i);
    words.push_back(text.substr(i, end - i));
    i = end;
  }
}

}  // namespace lineage::tokenizer
