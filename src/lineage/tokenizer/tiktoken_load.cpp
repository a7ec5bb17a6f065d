// Loader for tiktoken.model tokenizers in Kimi's layout (moonshotai tokenization_kimi.py, used by
// Kimi-Linear and Kimi K2 / K3): the ranks of tiktoken.model (openai/tiktoken load.py
// load_tiktoken_bpe) and the 256 special tokens after them, named by tokenizer_config.json.
// Anything malformed is an Error naming the file, the line or field, and what was expected.
#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "lineage/core/error.h"
#include "lineage/tokenizer/bpe_model.h"
#include "lineage/core/json_read.h"

namespace lineage::tokenizer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Ids stay below 2^24 as in the other loaders, special tokens included.
constexpr int64_t kMaxRank = (int64_t(1) << 24) - 1 - kTiktokenSpecialTokens;
constexpr std::string_view kLineFormat = "\"<base64 token bytes> <rank>\"";

// A short rendering of file bytes for messages: control and non-ASCII bytes as \xNN.
std::string shown(std::string_view bytes) {
  std::string out;
  for (char ch : bytes.substr(0, 60)) {
    const auto b = uint8_t(ch);
    if (b >= 0x20 && b < 0x7F && b != '"' && b != '\\') {
      out.push_back(ch);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", b);
      out += hex;
    }
  }
  return bytes.size() > 60 ? out + "..." : out;
}

int base64_digit(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Standard base64 (RFC 4648: A-Z a-z 0-9 + /, '=' padding to a multiple of 4), as tiktoken.model
// files are written. Returns false for anything else, including bits set in the padding.
bool decode_base64(std::string_view in, std::string& out) {
  out.clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  const size_t pad = in.ends_with("==") ? 2 : in.ends_with('=') ? 1 : 0;
  uint32_t acc = 0;
  for (size_t i = 0; i < in.size() - pad; ++i) {
    const int d = base64_digit(in[i]);
    if (d < 0) return false;
    acc = (acc << 6) | uint32_t(d);
    if (i % 4 == 3) {
      out.push_back(char(acc >> 16));
      out.push_back(char(acc >> 8));
      out.push_back(char(acc));
      acc = 0;
    }
  }
  if (pad == 2) {
    if (acc & 0xF) return false;
    out.push_back(char(acc >> 4));
  } else if (pad == 1) {
    if (acc & 0x3) return false;
    out.push_back(char(acc >> 10));
    out.push_back(char(acc >> 2));
  }
  return true;
}

// The whitespace-separated fields of a line (load_tiktoken_bpe splits with str.split()).
std::vector<std::string_view> fields_of(std::string_view line) {
  std::vector<std::string_view> fields;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    const size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
    if (i > start) fields.push_back(line.substr(start, i - start));
  }
  return fields;
}

struct RankEntry {
  int32_t rank;
  int line;
};

[[noreturn]] void fail_line(const std::string& file, int line, std::string_view what, std::string_view expected) {
  throw Error(cat(file, ":", line, ": found ", what, "; expected ", expected));
}

// One "<base64 token bytes> <rank>" line: the token's bytes go to `bytes`, the rank is returned.
int32_t parse_rank_line(std::string_view line, int line_number, const std::string& file, std::string& bytes) {
  const std::vector<std::string_view> fields = fields_of(line);
  if (fields.size() != 2) {
    const char* noun = fields.size() == 1 ? " field" : " fields";
    fail_line(file, line_number, cat("line \"", shown(line), "\" with ", fields.size(), noun), cat("two fields, ", kLineFormat));
  }
  if (!decode_base64(fields[0], bytes)) {
    fail_line(file, line_number, cat("token \"", shown(fields[0]), "\", which is not valid base64"),
              "standard base64 (A-Z a-z 0-9 + /, '=' padding to a multiple of 4 characters)");
  }
  int64_t rank = 0;
  for (char c : fields[1]) {
    if (c < '0' || c > '9' || rank > kMaxRank) break;
    rank = rank * 10 + (c - '0');
  }
  if (rank > kMaxRank || fields[1].find_first_not_of("0123456789") != std::string_view::npos) {
    fail_line(file, line_number, cat("rank \"", shown(fields[1]), "\""), cat("a decimal integer in [0, ", kMaxRank, "]"));
  }
  return int32_t(rank);
}

// Reads tiktoken.model into ids = ranks. Ranks must be exactly 0..n-1: Kimi numbers the special
// tokens from n = the number of ranks, so a gap would give a special token a rank's id.
void load_ranks(BpeModel& m, const fs::path& path) {
  const std::string text = read_file_text(path);
  const std::string file = path.string();
  std::vector<RankEntry> entries;
  StringMap<int32_t> index_of;  // token bytes -> index in entries
  std::string bytes;
  int line_number = 0;
  for (size_t line_start = 0; line_start < text.size();) {
    size_t line_end = text.find('\n', line_start);
    if (line_end == std::string::npos) line_end = text.size();
    std::string_view line(text.data() + line_start, line_end - line_start);
    line_start = line_end + 1;
    ++line_number;
    if (line.ends_with('\r')) line.remove_suffix(1);
    if (line.empty()) continue;  // as load_tiktoken_bpe skips them
    const int32_t rank = parse_rank_line(line, line_number, file, bytes);
    const auto [it, inserted] = index_of.emplace(bytes, int32_t(entries.size()));
    if (!inserted) {
      const RankEntry& first = entries[it->second];
      fail_line(file, line_number, cat("token \"", shown(fields_of(line)[0]), "\" again (line ", first.line, ", rank ",
                                       first.rank, ")"), "each token once");
    }
    entries.push_back({rank, line_number});
  }
  const int32_t n = int32_t(entries.size());
  if (n == 0) throw Error(cat(file, ": no tokens; expected one ", kLineFormat, " line per token"));
  std::vector<int> line_of_rank(size_t(n), 0);
  for (const RankEntry& e : entries) {
    if (e.rank >= n) {
      fail_line(file, e.line, cat("rank ", e.rank, " with only ", n, " tokens in the file"),
                cat("the ranks 0..", n - 1, " without gaps (the special tokens take the ids from ", n, ")"));
    }
    if (line_of_rank[e.rank] != 0) {
      fail_line(file, e.line, cat("rank ", e.rank, " again (line ", line_of_rank[e.rank], ")"), "each rank once");
    }
    line_of_rank[e.rank] = e.line;
  }
  m.token_bytes.assign(size_t(n) + kTiktokenSpecialTokens, std::string());
  m.has_token.assign(size_t(n) + kTiktokenSpecialTokens, 1);
  for (auto& [token, index] : index_of) {
    index = entries[index].rank;
    m.token_bytes[index] = token;
  }
  m.symbol_ids = std::move(index_of);
  for (int b = 0; b < 256; ++b) {
    const char byte = char(b);
    if (m.symbol_ids.contains(std::string_view(&byte, 1))) continue;
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02X", b);
    throw Error(cat(file, ": no token for the byte ", hex, "; expected all 256 single-byte tokens ",
                    "(tiktoken starts every word from single bytes)"));
  }
}

// ---- tokenizer_config.json ----------------------------------------------------------------------

std::string found(const json& value) {
  if (value.is_null()) return "null";
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return cat(value.type_name(), " ", text);
}

[[noreturn]] void fail_field(const std::string& file, std::string_view field, std::string_view what,
                             std::string_view expected) {
  throw Error(cat(file, ": field ", field, ": found ", what, "; expected ", expected));
}

// The names of the special tokens, [kTiktokenSpecialTokens], for ids n, n+1, ...
std::vector<std::string> special_names(const json& root, int32_t n, const std::string& file) {
  std::vector<std::string> names(kTiktokenSpecialTokens);
  std::vector<bool> named(kTiktokenSpecialTokens, false);  // by added_tokens_decoder
  for (int32_t k = 0; k < kTiktokenSpecialTokens; ++k) names[k] = cat("<|reserved_token_", n + k, "|>");
  const auto decoder = root.find("added_tokens_decoder");
  if (decoder == root.end() || decoder->is_null()) return names;
  if (!decoder->is_object()) fail_field(file, "added_tokens_decoder", found(*decoder), "an object mapping ids to tokens");
  const std::string ids_expected = cat("an id in [", n, ", ", n + kTiktokenSpecialTokens, "): the ", kTiktokenSpecialTokens,
                                       " special tokens follow the ", n, " ranks of tiktoken.model");
  for (const auto& [key, entry] : decoder->items()) {
    const std::string field = cat("added_tokens_decoder[\"", key, "\"]");
    int64_t id = -1;
    if (!key.empty() && key.size() <= 9 && std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      id = std::stoll(key);
    }
    if (id < n || id >= int64_t(n) + kTiktokenSpecialTokens) fail_field(file, field, cat("the key \"", key, "\""), ids_expected);
    if (!entry.is_object()) fail_field(file, field, found(entry), "an object with \"content\"");
    const auto content = entry.find("content");
    if (content == entry.end() || !content->is_string() || content->get_ref<const std::string&>().empty()) {
      fail_field(file, field + ".content", content == entry.end() ? "no such field" : found(*content), "the token's text");
    }
    // Kimi's encode gives all 256 tokens to tiktoken as special tokens, so `special` does not
    // change how text encodes; it is still checked for being a flag.
    const auto special = entry.find("special");
    if (special != entry.end() && !special->is_boolean() && !special->is_null()) {
      fail_field(file, field + ".special", found(*special), "true or false");
    }
    names[id - n] = content->get<std::string>();
    named[id - n] = true;
  }
  StringMap<int32_t> id_of;
  for (int32_t k = 0; k < kTiktokenSpecialTokens; ++k) {
    const auto [it, inserted] = id_of.emplace(names[k], n + k);
    if (inserted) continue;
    // Name the entry of added_tokens_decoder, not a placeholder it collided with.
    const int32_t culprit = named[k] ? n + k : it->second, other = culprit == n + k ? it->second : n + k;
    fail_field(file, cat("added_tokens_decoder[\"", culprit, "\"].content"),
               cat("\"", names[k], "\", which also names id ", other), "each special token named once");
  }
  return names;
}

// bos_token / eos_token / pad_token: a string or {"content": ...}, the name of a special token.
// Absent, bos and eos default to "[BOS]" and "[EOS]" as in TikTokenTokenizer.__init__.
std::optional<int32_t> named_special(const BpeModel& m, const json& root, const char* key, const char* fallback,
                                     const std::string& file) {
  const auto it = root.find(key);
  std::string name;
  if (it == root.end()) {
    if (fallback == nullptr) return std::nullopt;
    name = fallback;
  } else if (it->is_null()) {
    return std::nullopt;
  } else {
    const json& content = it->is_object() ? it->value("content", json()) : *it;
    if (!content.is_string()) fail_field(file, key, found(*it), "a token string or {\"content\": ...}");
    name = content.get<std::string>();
  }
  for (const AddedToken& t : m.added_tokens) {
    if (t.content == name) return t.id;
  }
  if (it == root.end()) return std::nullopt;  // the default name is not one of this tokenizer's
  fail_field(file, key, cat("\"", name, "\""), cat("the name of one of the ", kTiktokenSpecialTokens,
                                                   " special tokens (added_tokens_decoder names them)"));
}

}  // namespace

std::shared_ptr<BpeModel> load_tiktoken(const fs::path& tiktoken_model, const fs::path& config_json) {
  auto m = std::make_shared<BpeModel>();
  m->source = tiktoken_model.string();
  m->mode = SymbolMode::kTiktoken;
  m->ignore_merges = true;  // tiktoken looks a whole word up before it merges
  load_ranks(*m, tiktoken_model);
  const int32_t n = m->vocab_size() - kTiktokenSpecialTokens;
  const std::string file = config_json.string();
  json root = json::object();
  if (!config_json.empty()) {
    m->source = cat(tiktoken_model.string(), " + ", file);
    root = read_json_file(config_json);
    if (!root.is_object()) fail_field(file, "(top level)", found(root), "an object");
  }
  const std::vector<std::string> names = special_names(root, n, file);
  std::vector<AddedToken> specials;
  for (int32_t k = 0; k < kTiktokenSpecialTokens; ++k) specials.push_back(AddedToken{names[k], n + k, true, false, false});
  set_added_tokens(*m, std::move(specials));
  m->bos_id = named_special(*m, root, "bos_token", "[BOS]", file);
  m->eos_id = named_special(*m, root, "eos_token", "[EOS]", file);
  m->pad_id = named_special(*m, root, "pad_token", nullptr, file);
  return m;
}

}  // namespace lineage::tokenizer
