// Loaders for BPE tokenizers: GPT-2's vocab.json + merges.txt and Hugging Face tokenizer.json
// (model BPE; ByteLevel or Metaspace pre-tokenizer; Prepend/Replace normalizers; ByteLevel, Metaspace,
// Replace, ByteFallback, Fuse and Strip decoders). Anything else is rejected with the field named.
// Over 400 lines, one concept: reading the two BPE file formats, each component refused by name.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "lineage/core/error.h"
#include "lineage/core/json_read.h"
#include "lineage/tokenizer/bpe_model.h"
#include "lineage/tokenizer/tokenizer.h"

namespace lineage::tokenizer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kMaxTokenId = (1 << 24) - 1;  // guards against a typo allocating gigabytes
const char kEndOfText[] = "<|endoftext|>";

json read_json(const fs::path& path) { return read_json_file(path); }

// A short rendering of a JSON value for messages.
std::string found(const json& value) {
  if (value.is_null()) return "null";
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return cat(value.type_name(), " ", text);
}

[[noreturn]] void fail(const std::string& file, std::string_view field, std::string_view what, std::string_view expected) {
  throw Error(cat(file, ": field ", field, ": found ", what, "; expected ", expected));
}

const json& require(const json& object, const char* key, const std::string& file, const std::string& field) {
  const auto it = object.find(key);
  if (it == object.end()) fail(file, field, "no such field", "it to be present");
  return *it;
}

bool get_bool(const json& object, const char* key, bool fallback, const std::string& file, const std::string& field) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) fail(file, field, found(*it), "true or false");
  return it->get<bool>();
}

// A string field that may be absent or null (returns "") or a string.
std::string get_string(const json& object, const char* key, const std::string& file, const std::string& field) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return {};
  if (!it->is_string()) fail(file, field, found(*it), "a string");
  return it->get<std::string>();
}

int32_t token_id(const json& value, const std::string& file, const std::string& field) {
  if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > kMaxTokenId) {
    fail(file, field, found(value), cat("a token id, an integer in [0, ", kMaxTokenId, "]"));
  }
  return int32_t(value.get<int64_t>());
}

void ensure_id(BpeModel& m, int32_t id) {
  if (id >= m.vocab_size()) {
    m.token_bytes.resize(size_t(id) + 1);
    m.has_token.resize(size_t(id) + 1, 0);
  }
}

void load_vocab(BpeModel& m, const json& vocab, const std::string& file, const std::string& field) {
  if (!vocab.is_object()) fail(file, field, found(vocab), "an object mapping token strings to ids");
  StringMap<int32_t>& ids = m.symbol_ids;
  ids.reserve(vocab.size());
  std::vector<const std::string*> symbol_of;
  for (const auto& [symbol, value] : vocab.items()) {
    const int32_t id = token_id(value, file, cat(field, "[\"", symbol, "\"]"));
    if (size_t(id) >= symbol_of.size()) symbol_of.resize(size_t(id) + 1, nullptr);
    if (symbol_of[id] != nullptr) {
      fail(file, cat(field, "[\"", symbol, "\"]"), cat("id ", id, ", already used by \"", *symbol_of[id], "\""),
           "each id once");
    }
    const auto [it, inserted] = ids.emplace(symbol, id);
    symbol_of[id] = &it->first;
    ensure_id(m, id);
    m.has_token[id] = 1;
    m.token_bytes[id] = symbol;  // replaced by the decoded bytes once the decoder is known
  }
  if (ids.empty()) fail(file, field, "an empty vocabulary", "at least one token");
}

int32_t symbol_id(const BpeModel& m, std::string_view symbol, const std::string& file, std::string_view field,
                  std::string_view role) {
  const auto it = m.symbol_ids.find(symbol);
  if (it == m.symbol_ids.end()) {
    fail(file, field, cat(role, " \"", symbol, "\", which is not in the vocabulary"), "tokens of the vocabulary");
  }
  return it->second;
}

void add_merge(BpeModel& m, std::string_view left, std::string_view right, int32_t rank, const std::string& file,
               const std::string& field) {
  const int32_t a = symbol_id(m, left, file, field, "left token");
  const int32_t b = symbol_id(m, right, file, field, "right token");
  const int32_t merged = symbol_id(m, cat(left, right), file, field, "merged token");
  m.merges.try_emplace(merge_key(a, b), Merge{rank, merged});
}

void load_merges_txt(BpeModel& m, const fs::path& path) {
  const std::string text = read_file_text(path);
  const std::string file = path.string();
  size_t line_start = 0;
  int line_number = 0;
  int32_t rank = 0;
  while (line_start < text.size()) {
    size_t line_end = text.find('\n', line_start);
    if (line_end == std::string::npos) line_end = text.size();
    std::string_view line(text.data() + line_start, line_end - line_start);
    line_start = line_end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line_number == 1 && line.starts_with("#version")) continue;
    const size_t space = line.find(' ');
    if (line.empty() || space == 0 || space == std::string_view::npos || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos) {
      throw Error(cat(file, ":", line_number, ": merge line \"", line,
                      "\" does not have two parts; expected two tokens separated by one space"));
    }
    add_merge(m, line.substr(0, space), line.substr(space + 1), rank++, file, cat("line ", line_number));
  }
}

void load_merges_json(BpeModel& m, const json& merges, const std::string& file) {
  if (!merges.is_array()) fail(file, "model.merges", found(merges), "an array of \"a b\" strings or [a, b] pairs");
  m.merges.reserve(merges.size());
  int32_t rank = 0;
  for (const json& entry : merges) {
    const std::string field = cat("model.merges[", rank, "]");
    if (entry.is_string()) {
      const std::string& line = entry.get_ref<const std::string&>();
      const size_t space = line.find(' ');
      if (space == 0 || space == std::string::npos || space + 1 == line.size() ||
          line.find(' ', space + 1) != std::string::npos) {
        fail(file, field, found(entry), "two tokens separated by one space");
      }
      add_merge(m, std::string_view(line).substr(0, space), std::string_view(line).substr(space + 1), rank, file, field);
    } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string()) {
      add_merge(m, entry[0].get<std::string>(), entry[1].get<std::string>(), rank, file, field);
    } else {
      fail(file, field, found(entry), "\"a b\" or [\"a\", \"b\"]");
    }
    ++rank;
  }
}

// Byte-level: ids of the 256 one-byte symbols, and each token's bytes through the inverse table.
void setup_byte_level(BpeModel& m, const std::string& file, const std::string& field) {
  std::array<int, 512> byte_of;  // code point -> byte; GPT-2's table only uses code points < 324
  byte_of.fill(-1);
  for (int b = 0; b < 256; ++b) {
    const char32_t cp = byte_to_code_point(uint8_t(b));
    byte_of[cp] = b;
    std::string symbol;
    append_utf8(symbol, cp);
    const auto it = m.symbol_ids.find(symbol);
    if (it == m.symbol_ids.end()) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      fail(file, field, cat("no token \"", symbol, "\" for byte ", hex),
           "all 256 single-byte tokens of a byte-level BPE vocabulary");
    }
    m.byte_symbol_ids[b] = it->second;
  }
  for (const auto& [symbol, id] : m.symbol_ids) {
    std::string bytes;
    for (size_t i = 0; i < symbol.size();) {
      const int length = utf8_sequence_length(symbol, i);
      char32_t cp = 0;
      if (length > 0) {
        cp = uint8_t(symbol[i]) & (0x7F >> (length == 1 ? 0 : length));
        for (int k = 1; k < length; ++k) cp = (cp << 6) | (uint8_t(symbol[i + k]) & 0x3F);
      }
      // Characters outside GPT-2's table spell themselves, as in Hugging Face's ByteLevel decoder.
      if (length > 0 && cp < byte_of.size() && byte_of[cp] >= 0) {
        bytes.push_back(char(byte_of[cp]));
      } else {
        bytes.append(symbol, i, size_t(std::max(length, 1)));
      }
      i += size_t(std::max(length, 1));
    }
    m.token_bytes[id] = std::move(bytes);
  }
}

std::optional<int32_t> find_token(const BpeModel& m, std::string_view content) {
  for (const AddedToken& t : m.added_tokens) {
    if (t.content == content) return t.id;
  }
  const auto it = m.symbol_ids.find(content);
  if (it != m.symbol_ids.end()) return it->second;
  return std::nullopt;
}

// Without tokenizer_config.json, eos / bos are recognised by the names the common families use.
void guess_eos_bos(BpeModel& m) {
  for (const char* name : {kEndOfText, "</s>", "<|end_of_text|>", "<eos>"}) {
    if (!m.eos_id) m.eos_id = find_token(m, name);
  }
  for (const char* name : {"<s>", "<|begin_of_text|>", "<bos>"}) {
    if (!m.bos_id) m.bos_id = find_token(m, name);
  }
}

std::vector<AddedToken> parse_added_tokens(const json& root, const std::string& file, bool has_normalizer) {
  std::vector<AddedToken> tokens;
  const auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return tokens;
  if (!it->is_array()) fail(file, "added_tokens", found(*it), "an array");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& entry = (*it)[i];
    const std::string field = cat("added_tokens[", i, "]");
    if (!entry.is_object()) fail(file, field, found(entry), "an object");
    AddedToken t;
    t.id = token_id(require(entry, "id", file, field + ".id"), file, field + ".id");
    t.content = get_string(entry, "content", file, field + ".content");
    if (t.content.empty()) fail(file, field + ".content", "an empty or missing string", "the token's text");
    t.special = get_bool(entry, "special", false, file, field + ".special");
    t.lstrip = get_bool(entry, "lstrip", false, file, field + ".lstrip");
    t.rstrip = get_bool(entry, "rstrip", false, file, field + ".rstrip");
    if (get_bool(entry, "single_word", false, file, field + ".single_word")) {
      fail(file, field + ".single_word", "true", "false (single_word added tokens are not supported)");
    }
    // Added tokens are matched in the raw text; a normalizer that rewrote the text first would
    // change what matches, so that combination is refused rather than approximated.
    if (has_normalizer && get_bool(entry, "normalized", false, file, field + ".normalized")) {
      fail(file, field + ".normalized", "true together with a normalizer", "false (not supported)");
    }
    tokens.push_back(std::move(t));
  }
  return tokens;
}

TextRewrite parse_replace(const json& step, const std::string& file, const std::string& field) {
  const json& pattern = require(step, "pattern", file, field + ".pattern");
  const auto string_pattern = pattern.is_object() ? pattern.find("String") : pattern.end();
  if (!pattern.is_object() || string_pattern == pattern.end() || !string_pattern->is_string() ||
      string_pattern->get_ref<const std::string&>().empty()) {
    fail(file, field + ".pattern", found(pattern), "{\"String\": \"...\"} (regex patterns are not supported)");
  }
  return {TextRewrite::Kind::kReplace, string_pattern->get<std::string>(),
          get_string(step, "content", file, field + ".content")};
}

void parse_normalizer(BpeModel& m, const json& node, const std::string& file, const std::string& field) {
  if (node.is_null()) return;
  const std::string type = node.is_object() ? get_string(node, "type", file, field + ".type") : "";
  if (type == "Sequence") {
    const json& steps = require(node, "normalizers", file, field + ".normalizers");
    if (!steps.is_array()) fail(file, field + ".normalizers", found(steps), "an array");
    for (size_t i = 0; i < steps.size(); ++i) parse_normalizer(m, steps[i], file, cat(field, ".normalizers[", i, "]"));
  } else if (type == "Prepend") {
    m.normalizer.push_back({TextRewrite::Kind::kPrepend, "", get_string(node, "prepend", file, field + ".prepend")});
  } else if (type == "Replace") {
    m.normalizer.push_back(parse_replace(node, file, field));
  } else if (type == "NFC") {
    m.normalizer.push_back({TextRewrite::Kind::kNfc, "", ""});
  } else {
    fail(file, field, found(node), "null, Prepend, Replace, NFC or a Sequence of them");
  }
}

MetaspaceOptions parse_metaspace(const json& node, const std::string& file, const std::string& field) {
  MetaspaceOptions options;
  if (node.contains("replacement")) options.replacement = get_string(node, "replacement", file, field + ".replacement");
  if (options.replacement.empty()) fail(file, field + ".replacement", "an empty string", "one character");
  const std::string scheme = get_string(node, "prepend_scheme", file, field + ".prepend_scheme");
  if (scheme == "always") {
    options.prepend = MetaspaceOptions::Prepend::kAlways;
  } else if (scheme == "first") {
    options.prepend = MetaspaceOptions::Prepend::kFirst;
  } else if (scheme == "never") {
    options.prepend = MetaspaceOptions::Prepend::kNever;
  } else if (scheme.empty()) {  // files older than prepend_scheme
    const bool prefix = get_bool(node, "add_prefix_space", true, file, field + ".add_prefix_space");
    options.prepend = prefix ? MetaspaceOptions::Prepend::kAlways : MetaspaceOptions::Prepend::kNever;
  } else {
    fail(file, field + ".prepend_scheme", cat("\"", scheme, "\""), "\"always\", \"first\" or \"never\"");
  }
  options.split = get_bool(node, "split", true, file, field + ".split");
  return options;
}

void parse_pre_tokenizer(BpeModel& m, const json& node, const std::string& file) {
  const std::string field = "pre_tokenizer";
  m.mode = SymbolMode::kChars;
  if (node.is_null()) return;
  const std::string type = node.is_object() ? get_string(node, "type", file, field + ".type") : "";
  if (type == "ByteLevel") {
    m.mode = SymbolMode::kByteLevel;
    m.add_prefix_space = get_bool(node, "add_prefix_space", false, file, field + ".add_prefix_space");
    m.split = get_bool(node, "use_regex", true, file, field + ".use_regex") ? BpeModel::Split::kGpt2 : BpeModel::Split::kNone;
  } else if (type == "Sequence") {
    // Qwen2 .. Qwen3-Next: Split on Qwen2's pattern (Isolated), then ByteLevel without its own regex;
    // Qwen3.5 the same with its pattern.
    const std::string want = cat("[Split on Qwen2's pattern ", kQwen2Pattern, " or Qwen3.5's ", kQwen35Pattern,
                                 " (behavior Isolated), ByteLevel (use_regex false)] (other sequences are not supported)");
    const json& steps = require(node, "pretokenizers", file, field + ".pretokenizers");
    if (!steps.is_array() || steps.size() != 2 || !steps[0].is_object() || !steps[1].is_object())
      fail(file, field + ".pretokenizers", found(steps), want);
    const json& split = steps[0];
    const json& pattern = split.value("pattern", json());
    const json regex = pattern.is_object() ? pattern.value("Regex", json()) : json();
    const bool qwen2 = regex == kQwen2Pattern, qwen35 = regex == kQwen35Pattern;
    // Compared as JSON values: a field of another type is simply not the expected one.
    if (split.value("type", json()) != "Split" || !(qwen2 || qwen35) || split.value("behavior", json()) != "Isolated" ||
        (split.contains("invert") && split["invert"] != false))
      fail(file, field + ".pretokenizers[0]", found(split), want);
    if (steps[1].value("type", json()) != "ByteLevel" ||
        get_bool(steps[1], "use_regex", true, file, field + ".pretokenizers[1].use_regex"))
      fail(file, field + ".pretokenizers[1]", found(steps[1]), want);
    m.mode = SymbolMode::kByteLevel;
    m.add_prefix_space = get_bool(steps[1], "add_prefix_space", false, file, field + ".pretokenizers[1].add_prefix_space");
    m.split = qwen2 ? BpeModel::Split::kQwen2 : BpeModel::Split::kQwen35;
  } else if (type == "Metaspace") {
    m.metaspace = parse_metaspace(node, file, field);
  } else {
    fail(file, field, found(node), "null, ByteLevel, Metaspace or Qwen2's Sequence (others are not supported)");
  }
}

// One per-token step of a tokenizer.json decoder (Fuse and Strip act on the joined text instead).
struct DecodeStep {
  enum class Kind { kReplace, kByteFallback, kMetaspace } kind;
  TextRewrite rewrite;              // kReplace; kMetaspace: replacement -> " "
  bool drop_in_first_token = false;  // kMetaspace: the first token loses its replacements (prepend_scheme != never)
};

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// What a token decodes to, as Hugging Face's decoders do it token by token.
std::string decode_symbol(std::string text, const std::vector<DecodeStep>& steps, bool first_token) {
  for (const DecodeStep& step : steps) {
    if (step.kind == DecodeStep::Kind::kByteFallback) {
      if (text.size() == 6 && text.starts_with("<0x") && text[5] == '>' && hex_digit(text[3]) >= 0 && hex_digit(text[4]) >= 0) {
        text.assign(1, char(hex_digit(text[3]) * 16 + hex_digit(text[4])));
      }
    } else if (step.kind == DecodeStep::Kind::kMetaspace && first_token && step.drop_in_first_token) {
      replace_all(text, step.rewrite.pattern, "");
    } else {
      replace_all(text, step.rewrite.pattern, step.rewrite.content);
    }
  }
  return text;
}

// Fills token_bytes from the decoder: ByteLevel for byte-level models, otherwise a chain of
// Replace / ByteFallback / Metaspace applied token by token, and Fuse + Strip on the joined text.
void apply_decoder(BpeModel& m, const json& node, const std::string& file) {
  const std::string field = "decoder";
  const std::string type = node.is_object() ? get_string(node, "type", file, field + ".type") : "";
  if (m.mode == SymbolMode::kByteLevel) {
    if (type != "ByteLevel") fail(file, field, found(node), "ByteLevel, as the pre_tokenizer is ByteLevel");
    setup_byte_level(m, file, "model.vocab");
    return;
  }
  std::vector<std::pair<json, std::string>> nodes;  // (step, its field)
  if (type == "Sequence") {
    const json& list = require(node, "decoders", file, field + ".decoders");
    if (!list.is_array()) fail(file, field + ".decoders", found(list), "an array");
    for (size_t i = 0; i < list.size(); ++i) nodes.emplace_back(list[i], cat(field, ".decoders[", i, "]"));
  } else if (!node.is_null()) {
    nodes.emplace_back(node, field);
  }
  std::vector<DecodeStep> steps;
  bool fused = false;
  for (const auto& [step, step_field] : nodes) {
    const std::string step_type = step.is_object() ? get_string(step, "type", file, step_field + ".type") : "";
    if (fused && step_type != "Strip") fail(file, step_field, found(step), "only Strip after Fuse");
    if (step_type == "Replace") {
      steps.push_back({DecodeStep::Kind::kReplace, parse_replace(step, file, step_field)});
    } else if (step_type == "ByteFallback") {
      steps.push_back({DecodeStep::Kind::kByteFallback, {}});
    } else if (step_type == "Metaspace") {
      const MetaspaceOptions options = parse_metaspace(step, file, step_field);
      steps.push_back({DecodeStep::Kind::kMetaspace, {TextRewrite::Kind::kReplace, options.replacement, " "},
                       options.prepend != MetaspaceOptions::Prepend::kNever});
    } else if (step_type == "Fuse") {
      fused = true;
    } else if (step_type == "Strip") {
      const json& content = require(step, "content", file, step_field + ".content");
      const json& start = require(step, "start", file, step_field + ".start");
      const json& stop = require(step, "stop", file, step_field + ".stop");
      if (!fused || content != " " || !start.is_number_unsigned() || stop != 0) {
        fail(file, step_field, found(step), "Strip of \" \" with stop 0, after Fuse");
      }
      m.strip_leading_spaces = start.get<int>();
    } else {
      fail(file, step_field, found(step), "Replace, ByteFallback, Metaspace, Fuse or Strip");
    }
  }
  for (const auto& [symbol, id] : m.symbol_ids) {
    m.token_bytes[id] = decode_symbol(symbol, steps, false);
    std::string first = decode_symbol(symbol, steps, true);
    if (first != m.token_bytes[id]) m.first_token_bytes.emplace(id, std::move(first));
  }
}

void parse_bpe_options(BpeModel& m, const json& model, const std::string& file) {
  const auto dropout = model.find("dropout");
  if (dropout != model.end() && !dropout->is_null() && !(dropout->is_number() && dropout->get<double>() == 0.0)) {
    fail(file, "model.dropout", found(*dropout), "null (BPE dropout is not supported)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const std::string value = get_string(model, key, file, cat("model.", key));
    if (!value.empty()) fail(file, cat("model.", key), cat("\"", value, "\""), "null or \"\" (not supported)");
  }
  m.byte_fallback = get_bool(model, "byte_fallback", false, file, "model.byte_fallback");
  m.fuse_unk = get_bool(model, "fuse_unk", false, file, "model.fuse_unk");
  m.ignore_merges = get_bool(model, "ignore_merges", false, file, "model.ignore_merges");
  const std::string unk = get_string(model, "unk_token", file, "model.unk_token");
  if (!unk.empty()) m.unk_id = symbol_id(m, unk, file, "model.unk_token", "unk token");
  m.byte_fallback_ids.fill(-1);
  if (m.byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      const auto it = m.symbol_ids.find(std::string_view(name));
      if (it != m.symbol_ids.end()) m.byte_fallback_ids[b] = it->second;
    }
  }
}

// TemplateProcessing whose single-sequence template starts with a special token: that token is BOS.
void parse_post_processor(BpeModel& m, const json& root, const std::string& file) {
  const auto node = root.find("post_processor");
  if (node == root.end() || !node->is_object() || node->value("type", "") != "TemplateProcessing") return;
  const auto single = node->find("single");
  if (single == node->end() || !single->is_array() || single->empty()) return;
  const json& first = (*single)[0];
  if (!first.is_object() || !first.contains("SpecialToken")) return;
  const std::string name = get_string(first["SpecialToken"], "id", file, "post_processor.single[0].SpecialToken.id");
  const std::optional<int32_t> id = find_token(m, name);
  if (!id) fail(file, "post_processor.single[0].SpecialToken.id", cat("\"", name, "\""), "a token of the tokenizer");
  m.bos_id = id;
  m.adds_bos = true;
}

}  // namespace

void set_added_tokens(BpeModel& m, std::vector<AddedToken> tokens) {
  for (const AddedToken& t : tokens) {
    ensure_id(m, t.id);
    m.has_token[t.id] = 1;
    m.token_bytes[t.id] = t.content;
    m.added_first_byte[uint8_t(t.content[0])] = true;
  }
  std::stable_sort(tokens.begin(), tokens.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  m.added_tokens = std::move(tokens);
}

std::shared_ptr<BpeModel> load_vocab_merges(const fs::path& vocab_json, const fs::path& merges_txt) {
  auto m = std::make_shared<BpeModel>();
  m->source = cat(vocab_json.string(), " + ", merges_txt.string());
  m->mode = SymbolMode::kByteLevel;
  const json vocab = read_json(vocab_json);
  load_vocab(*m, vocab, vocab_json.string(), "(top level)");
  setup_byte_level(*m, vocab_json.string(), "(top level)");
  load_merges_txt(*m, merges_txt);
  if (const auto it = m->symbol_ids.find(std::string_view(kEndOfText)); it != m->symbol_ids.end()) {
    set_added_tokens(*m, {AddedToken{kEndOfText, it->second, true, false, false}});
    m->eos_id = it->second;
  }
  return m;
}

std::shared_ptr<BpeModel> load_tokenizer_json(const fs::path& tokenizer_json) {
  const std::string file = tokenizer_json.string();
  const json root = read_json(tokenizer_json);
  if (!root.is_object()) fail(file, "(top level)", found(root), "an object");
  auto m = std::make_shared<BpeModel>();
  m->source = file;
  const json& model = require(root, "model", file, "model");
  if (!model.is_object()) fail(file, "model", found(model), "an object");
  const std::string type = get_string(model, "type", file, "model.type");
  if (type != "BPE") fail(file, "model.type", cat("\"", type, "\""), "\"BPE\" (other models are not supported)");
  load_vocab(*m, require(model, "vocab", file, "model.vocab"), file, "model.vocab");
  load_merges_json(*m, require(model, "merges", file, "model.merges"), file);
  parse_bpe_options(*m, model, file);
  parse_normalizer(*m, root.value("normalizer", json()), file, "normalizer");
  parse_pre_tokenizer(*m, root.value("pre_tokenizer", json()), file);
  apply_decoder(*m, root.value("decoder", json()), file);
  set_added_tokens(*m, parse_added_tokens(root, file, !m->normalizer.empty()));
  parse_post_processor(*m, root, file);
  guess_eos_bos(*m);
  return m;
}

std::shared_ptr<BpeModel> load_vocab_tables(const VocabTables& v) {
  const std::string& file = v.source;
  if (v.model != "gpt2")
    fail(file, "tokenizer.ggml.model", cat("\"", v.model, "\""), "\"gpt2\" (byte-level BPE; other models are not supported)");
  auto m = std::make_shared<BpeModel>();
  m->source = file;
  m->mode = SymbolMode::kByteLevel;
  if (v.pre == "gpt-2") m->split = BpeModel::Split::kGpt2;
  else if (v.pre == "qwen2") m->split = BpeModel::Split::kQwen2;
  else if (v.pre == "qwen35") m->split = BpeModel::Split::kQwen35;
  else if (v.pre == "kimi-k2") m->split = BpeModel::Split::kKimi;
  else fail(file, "tokenizer.ggml.pre", cat("\"", v.pre, "\""), "one of \"gpt-2\", \"qwen2\", \"qwen35\", \"kimi-k2\"");
  if (v.tokens.empty()) fail(file, "tokenizer.ggml.tokens", "an empty vocabulary", "at least one token");
  if (int64_t(v.tokens.size()) > kMaxTokenId + 1)
    fail(file, "tokenizer.ggml.tokens", cat(v.tokens.size(), " tokens"), cat("at most ", kMaxTokenId + 1));
  if (!v.types.empty() && v.types.size() != v.tokens.size())
    fail(file, "tokenizer.ggml.token_type", cat(v.types.size(), " types"), cat("one per token (", v.tokens.size(), ")"));
  ensure_id(*m, int32_t(v.tokens.size() - 1));
  std::vector<AddedToken> added;
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const int32_t id = int32_t(i);
    m->has_token[i] = 1;
    m->token_bytes[i] = v.tokens[i];
    m->symbol_ids.try_emplace(v.tokens[i], id);  // a repeated spelling keeps its first id, as llama.cpp's map
    const int32_t type = v.types.empty() ? 1 : v.types[i];
    if ((type == 3 || type == 4) && !v.tokens[i].empty()) added.push_back(AddedToken{v.tokens[i], id, type == 3, false, false});
  }
  setup_byte_level(*m, file, "tokenizer.ggml.tokens");
  m->merges.reserve(v.merges.size());
  for (size_t r = 0; r < v.merges.size(); ++r) {
    const std::string& line = v.merges[r];
    const std::string field = cat("tokenizer.ggml.merges[", r, "]");
    const size_t space = line.find(' ');
    if (space == 0 || space == std::string::npos || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos)
      fail(file, field, cat("\"", line, "\""), "two tokens separated by one space");
    add_merge(*m, std::string_view(line).substr(0, space), std::string_view(line).substr(space + 1), int32_t(r), file, field);
  }
  set_added_tokens(*m, std::move(added));
  const auto id = [&](const std::optional<int32_t>& t, const char* key) -> std::optional<int32_t> {
    if (t && (*t < 0 || *t >= m->vocab_size()))
      fail(file, key, cat(*t), cat("a token id in [0, ", m->vocab_size(), ")"));
    return t;
  };
  m->bos_id = id(v.bos, "tokenizer.ggml.bos_token_id");
  m->eos_id = id(v.eos, "tokenizer.ggml.eos_token_id");
  m->pad_id = id(v.pad, "tokenizer.ggml.padding_token_id");
  m->adds_bos = v.add_bos && m->bos_id.has_value();
  return m;
}

void apply_tokenizer_config(BpeModel& m, const fs::path& config_json) {
  const std::string file = config_json.string();
  const json root = read_json(config_json);
  if (!root.is_object()) fail(file, "(top level)", found(root), "an object");
  for (const char* key : {"eos_token", "bos_token"}) {
    const auto it = root.find(key);
    if (it == root.end() || it->is_null()) continue;
    const json& name = it->is_object() ? require(*it, "content", file, cat(key, ".content")) : *it;
    if (!name.is_string()) fail(file, key, found(*it), "a token string or {\"content\": ...}");
    const std::optional<int32_t> id = find_token(m, name.get<std::string>());
    if (!id) fail(file, key, cat("\"", name.get<std::string>(), "\""), "a token of the tokenizer");
    (std::string_view(key) == "eos_token" ? m.eos_id : m.bos_id) = id;
  }
  m.adds_bos = get_bool(root, "add_bos_token", m.adds_bos, file, "add_bos_token");
}

}  // namespace lineage::tokenizer
