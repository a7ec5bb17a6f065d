// Python's str methods over UTF-8, as chat templates call them: strip/split/replace with Python's
// rules (str.split() splits on runs of whitespace, str.strip() strips Unicode whitespace, a chars
// argument is a set of code points), and case mapping for Latin-1, Latin Extended-A, Greek and
// Cyrillic (other scripts are left as they are; docs/chat-templates.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lineage::chat::jinja {

std::vector<uint32_t> decode_utf8(std::string_view s);  // an invalid byte decodes as itself (< 0x100)
std::string encode_utf8(const std::vector<uint32_t>& cps);

enum class Case { Upper, Lower, Title, Capitalize, JinjaTitle };
// Upper/Lower: every letter; Title: str.title(); Capitalize: str.capitalize(); JinjaTitle: Jinja's
// |title filter (each word, split at whitespace, - ( { [ <, starts upper case, the rest lower).
std::string change_case(std::string_view s, Case mode);
bool is_cased(uint32_t cp, bool upper);  // for str.isupper() / str.islower()

// str.strip(chars) / lstrip / rstrip; chars == nullopt strips whitespace.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
// str.split(sep, maxsplit) (sep == nullopt: runs of whitespace, empty pieces dropped); maxsplit < 0:
// no limit. An empty sep is the caller's Error.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
// str.replace(old, new, count); an empty `old` inserts `new` between code points, as Python does.
std::string replace(std::string_view s, std::string_view old, std::string_view with, int64_t count);

}  // namespace lineage::chat::jinja
