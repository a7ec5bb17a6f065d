#include "lineage/chat/text.h"

#include "lineage/tokenizer/bpe_model.h"  // append_utf8
#include "lineage/chat/value.h"

namespace lineage::chat::jinja {

namespace {

// Python's str.isspace() set.
bool is_space_cp(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Simple one-to-one case pairs; the exceptions of each block are spelled out.
uint32_t upper_of(uint32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c < 0x80) return c;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c == 0xB5) return 0x39C;
  if (c >= 0x100 && c <= 0x17F) {
    if (c == 0x131) return 'I';
    if (c == 0x17F) return 'S';
    const bool odd_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (c == 0x138 || c == 0x149) return c;
    return odd_lower ? ((c & 1) == 0 ? c - 1 : c) : ((c & 1) == 1 ? c - 1 : c);
  }
  if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
  if (c == 0x3C2) return 0x3A3;
  if (c >= 0x3AC && c <= 0x3AF) return c == 0x3AC ? 0x386 : c - 37;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 63;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return c;
}

uint32_t lower_of(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0x80) return c;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
  if (c == 0x178) return 0xFF;
  if (c >= 0x100 && c <= 0x17F) {
    if (c == 0x130) return 'i';
    const bool odd_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (c == 0x138 || c == 0x149 || c == 0x17F) return c;
    return odd_lower ? ((c & 1) == 1 ? c + 1 : c) : ((c & 1) == 0 ? c + 1 : c);
  }
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 37;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 63;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}

bool cased(uint32_t c) { return upper_of(c) != c || lower_of(c) != c; }

bool contains(const std::vector<uint32_t>& set, uint32_t c) {
  for (uint32_t x : set)
    if (x == c) return true;
  return false;
}

}  // namespace

std::vector<uint32_t> decode_utf8(std::string_view s) {
  std::vector<uint32_t> cps;
  const std::vector<size_t> starts = code_point_starts(s);
  cps.reserve(starts.size());
  for (size_t k = 0; k < starts.size(); ++k) {
    const size_t b = starts[k], e = k + 1 < starts.size() ? starts[k + 1] : s.size();
    const unsigned char c = static_cast<unsigned char>(s[b]);
    if (e - b == 1) {
      cps.push_back(c);
      continue;
    }
    uint32_t cp = c & (0x7F >> (e - b));
    for (size_t j = b + 1; j < e; ++j) cp = (cp << 6) | (static_cast<unsigned char>(s[j]) & 0x3F);
    cps.push_back(cp);
  }
  return cps;
}

std::string encode_utf8(const std::vector<uint32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (uint32_t cp : cps) tokenizer::append_utf8(out, cp);
  return out;
}

std::string change_case(std::string_view s, Case mode) {
  // Bytes of invalid UTF-8 decode to values < 0x100 that are not letters here only if ASCII; keep
  // them byte-exact by mapping only valid multi-byte code points and ASCII.
  std::vector<uint32_t> cps = decode_utf8(s);
  const std::vector<size_t> starts = code_point_starts(s);
  bool previous_cased = false, word_start = true;
  for (size_t k = 0; k < cps.size(); ++k) {
    const size_t bytes = (k + 1 < starts.size() ? starts[k + 1] : s.size()) - starts[k];
    if (bytes == 1 && cps[k] >= 0x80) continue;  // an invalid byte stays as it is
    uint32_t& c = cps[k];
    switch (mode) {
      case Case::Upper: c = upper_of(c); break;
      case Case::Lower: c = lower_of(c); break;
      case Case::Capitalize: c = k == 0 ? upper_of(c) : lower_of(c); break;
      case Case::Title: {
        const bool is_cased_now = cased(c);
        c = previous_cased ? lower_of(c) : upper_of(c);
        previous_cased = is_cased_now;
        break;
      }
      case Case::JinjaTitle: {
        const bool separator = is_space_cp(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
        if (!separator) c = word_start ? upper_of(c) : lower_of(c);
        word_start = separator;
        break;
      }
    }
  }
  // Re-encode, copying invalid bytes through untouched.
  std::string out;
  out.reserve(s.size());
  for (size_t k = 0; k < cps.size(); ++k) {
    const size_t bytes = (k + 1 < starts.size() ? starts[k + 1] : s.size()) - starts[k];
    if (bytes == 1 && cps[k] >= 0x80) {
      out += s[starts[k]];
    } else {
      out += encode_utf8({cps[k]});
    }
  }
  return out;
}

bool is_cased(uint32_t cp, bool upper) { return upper ? lower_of(cp) != cp : upper_of(cp) != cp; }

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  const std::vector<uint32_t> cps = decode_utf8(s);
  const std::vector<size_t> starts = code_point_starts(s);
  const std::vector<uint32_t> set = chars ? decode_utf8(*chars) : std::vector<uint32_t>{};
  const auto strippable = [&](uint32_t c) { return chars ? contains(set, c) : is_space_cp(c); };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strippable(cps[b])) ++b;
  if (right)
    while (e > b && strippable(cps[e - 1])) --e;
  const size_t from = b < starts.size() ? starts[b] : s.size();
  const size_t to = e < starts.size() ? starts[e] : s.size();
  return std::string(s.substr(from, to - from));
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> parts;
  if (sep) {
    size_t from = 0;
    for (;;) {
      const size_t at = maxsplit >= 0 && int64_t(parts.size()) >= maxsplit ? std::string_view::npos : s.find(*sep, from);
      if (at == std::string_view::npos) break;
      parts.emplace_back(s.substr(from, at - from));
      from = at + sep->size();
    }
    parts.emplace_back(s.substr(from));
    return parts;
  }
  const std::vector<uint32_t> cps = decode_utf8(s);
  const std::vector<size_t> starts = code_point_starts(s);
  const auto byte_at = [&](size_t k) { return k < starts.size() ? starts[k] : s.size(); };
  size_t k = 0;
  for (;;) {
    while (k < cps.size() && is_space_cp(cps[k])) ++k;
    if (k >= cps.size()) break;
    if (maxsplit >= 0 && int64_t(parts.size()) >= maxsplit) {
      // The rest, with its trailing whitespace stripped, is the last piece.
      size_t e = cps.size();
      while (e > k && is_space_cp(cps[e - 1])) --e;
      parts.emplace_back(s.substr(byte_at(k), byte_at(e) - byte_at(k)));
      break;
    }
    const size_t b = k;
    while (k < cps.size() && !is_space_cp(cps[k])) ++k;
    parts.emplace_back(s.substr(byte_at(b), byte_at(k) - byte_at(b)));
  }
  return parts;
}

std::string replace(std::string_view s, std::string_view old, std::string_view with, int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {
    const std::vector<size_t> starts = code_point_starts(s);
    for (size_t k = 0; k <= starts.size(); ++k) {
      if (count < 0 || done < count) {
        out += with;
        ++done;
      }
      if (k < starts.size()) out += s.substr(starts[k], (k + 1 < starts.size() ? starts[k + 1] : s.size()) - starts[k]);
    }
    return out;
  }
  size_t from = 0;
  for (;;) {
    const size_t at = count >= 0 && done >= count ? std::string_view::npos : s.find(old, from);
    if (at == std::string_view::npos) break;
    out += s.substr(from, at - from);
    out += with;
    from = at + old.size();
    ++done;
  }
  out += s.substr(from);
  return out;
}

}  // namespace lineage::chat::jinja
