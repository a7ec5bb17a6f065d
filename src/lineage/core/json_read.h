// JSON from files we did not write (config.json, safetensors headers and indexes, tokenizer files):
// parsed with a nesting limit, so a hostile file cannot exhaust the stack in the parser, in the
// destructor or in an error message's rendering; every failure names the file.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace lineage {

// Deeper than any configuration or tokenizer file needs (tokenizer.json nests about 6 levels).
constexpr int kMaxJsonDepth = 64;

// Parses `text`; a syntax error or nesting deeper than kMaxJsonDepth is an Error that begins with `where`.
nlohmann::json parse_json(std::string_view text, const std::string& where);
// Reads and parses a whole file; a missing file, a directory or an unreadable file is an Error naming it.
nlohmann::json read_json_file(const std::filesystem::path& path);
// The whole file as bytes, with the same errors.
std::string read_file_text(const std::filesystem::path& path);

}  // namespace lineage
