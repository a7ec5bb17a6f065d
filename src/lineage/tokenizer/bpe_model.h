// Internal to the tokenizer: the loaded BPE model (immutable), the merge loop, the pre-tokenizers
// and the loaders. The public interface is tokenizer.h.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace lineage::tokenizer {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// How text maps onto the vocabulary's symbols.
enum class SymbolMode {
  kByteLevel,  // symbols spell bytes through GPT-2's byte-to-unicode table; BPE starts from one symbol per byte
  kChars,      // symbols are text; BPE starts from one symbol per UTF-8 character (then byte fallback, then unk)
  kTiktoken,   // symbols are raw bytes, id = rank (tiktoken.model); Kimi's pattern splits the text, and a
               // word is itself a token or goes through tiktoken_merge
};

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;  // whitespace before the token is absorbed into it
  bool rstrip = false;  // whitespace after the token is absorbed into it
};

// A normalizer step (tokenizer.json "Prepend" / "Replace" with a string pattern).
struct TextRewrite {
  enum class Kind { kPrepend, kReplace, kNfc } kind;  // kNfc: Unicode NFC (nfc.h)
  std::string pattern;  // kReplace: the string replaced
  std::string content;  // what is prepended / put in its place
};

// tokenizer.json pre_tokenizer "Metaspace": spaces become `replacement`, words start at a replacement.
struct MetaspaceOptions {
  enum class Prepend { kAlways, kFirst, kNever };
  std::string replacement = "\xE2\x96\x81";  // U+2581 '▁'
  Prepend prepend = Prepend::kAlways;
  bool split = true;
};

struct Merge {
  int32_t rank;  // line order in merges: lower merges first
  int32_t id;    // id of the merged symbol
};

inline uint64_t merge_key(int32_t left, int32_t right) {
  return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
}

struct BpeModel {
  std::string source;  // the file(s) it was loaded from, for messages
  SymbolMode mode = SymbolMode::kByteLevel;

  // Vocabulary, indexed by id, [vocab_size]. Ids absent from vocab and added tokens are holes.
  std::vector<std::string> token_bytes;  // raw bytes each token stands for (after the decoder)
  std::vector<uint8_t> has_token;        // 0 for a hole
  StringMap<int32_t> symbol_ids;         // vocab symbols as spelled in the file ("Ġthe", "▁the"; kTiktoken: raw bytes)
  std::unordered_map<uint64_t, Merge> merges;  // merge_key(left id, right id) -> merge
  bool ignore_merges = false;  // a word that is itself a symbol becomes that token without merging

  // kByteLevel
  std::array<int32_t, 256> byte_symbol_ids{};  // id of the one-byte symbol of each byte value
  // How byte-level text is cut into words before the merges: GPT-2's pattern (ByteLevel use_regex),
  // Qwen2's or Qwen3.5's (a Split before a ByteLevel without its own), or not at all.
  // kKimi: Kimi's pattern (split_kimi) before byte-level merges, as a GGUF file carries Kimi's tiktoken
  // vocabulary (tokenizer.ggml.pre "kimi-k2": the ranks as byte-level symbols, the merges derived from them).
  enum class Split : uint8_t { kNone, kGpt2, kQwen2, kQwen35, kKimi };
  Split split = Split::kGpt2;
  bool add_prefix_space = false;                // ByteLevel add_prefix_space

  // kChars
  std::vector<TextRewrite> normalizer;
  std::optional<MetaspaceOptions> metaspace;
  bool byte_fallback = false;
  std::array<int32_t, 256> byte_fallback_ids{};  // id of "<0xNN>" or -1
  std::optional<int32_t> unk_id;
  bool fuse_unk = false;

  std::vector<AddedToken> added_tokens;  // longest content first
  std::array<bool, 256> added_first_byte{};
  int strip_leading_spaces = 0;  // decoder Fuse + Strip: leading ' ' dropped from the decoded text
  // Decoder Metaspace: what a token decodes to when it is the first of the ids, where that differs.
  std::unordered_map<int32_t, std::string> first_token_bytes;
  std::optional<int32_t> eos_id;
  std::optional<int32_t> bos_id;
  std::optional<int32_t> pad_id;  // tiktoken.model tokenizers only (tokenizer_config.json pad_token)
  bool adds_bos = false;

  int32_t vocab_size() const { return int32_t(token_bytes.size()); }
};

// Per-word BPE results shared by copies of a Tokenizer; only words up to kMaxWordBytes are kept.
struct BpeCache {
  static constexpr size_t kMaxWordBytes = 256;
  static constexpr size_t kMaxEntries = 1 << 18;  // cleared when full
  std::mutex mutex;
  StringMap<std::vector<int32_t>> words;
};

// Applies the merges to `symbols` in place: repeatedly merge the adjacent pair of lowest rank,
// leftmost first, until no adjacent pair has a merge. O(n log n) in the number of symbols.
void bpe_merge(const std::unordered_map<uint64_t, Merge>& merges, std::vector<int32_t>& symbols);

// tiktoken's merge (openai/tiktoken src/lib.rs byte_pair_merge): `word` starts as one part per
// byte; repeatedly merge the adjacent pair whose concatenated bytes have the lowest rank in `ranks`,
// leftmost first, until no adjacent pair's bytes are a token. Appends the parts' ranks (their ids)
// to `ids`. Every single byte must be in `ranks`. O(n log n) in the bytes of the word.
void tiktoken_merge(const StringMap<int32_t>& ranks, std::string_view word, std::vector<int32_t>& ids);

// GPT-2's pre-tokenizer, the regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// as a scanner over UTF-8 (bytes that are not valid UTF-8 count as one [^\s\p{L}\p{N}] each).
// Appends the matches to `words`; they tile `text`.
void split_gpt2(std::string_view text, std::vector<std::string_view>& words);

// Qwen2's pre-tokenizer (tokenizer.json: a Split on this pattern, Isolated, before ByteLevel without
// its own regex; Qwen2 through Qwen3-Next), as transformers.js runs it on the ECMAScript engine:
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// as a scanner over UTF-8 with split_gpt2's classes; bytes that are not valid UTF-8 count as one
// [^\s\p{L}\p{N}] each. Appends the matches to `words`; they tile `text`.
inline constexpr const char* kQwen2Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
void split_qwen2(std::string_view text, std::vector<std::string_view>& words);

// Qwen3.5's pre-tokenizer: Qwen2's pattern with combining marks (\p{M}) joined to the letters' runs
// and taken out of the punctuation's,
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// as the same scanner (transformers.js on the ECMAScript engine is its reference).
inline constexpr const char* kQwen35Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
void split_qwen35(std::string_view text, std::vector<std::string_view>& words);

// Kimi's pre-tokenizer (moonshotai tokenization_kimi.py pat_str), run by tiktoken on the regex crate:
//   [\p{Han}]+
//   |[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//   |[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//   |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// as a scanner over UTF-8 with the regex crate's classes (unicode_tables_tiktoken.cpp); bytes that
// are not valid UTF-8 count as one [^\s\p{L}\p{N}] each. Appends the matches to `words`; they tile `text`.
void split_kimi(std::string_view text, std::vector<std::string_view>& words);

// Metaspace split with MergedWithNext: a new word starts at each `replacement`.
void split_before(std::string_view text, std::string_view replacement, std::vector<std::string_view>& words);

// Length of the UTF-8 sequence starting at text[i] if it is valid, else 0.
int utf8_sequence_length(std::string_view text, size_t i);

inline constexpr uint32_t kInvalidCodePoint = 0xFFFFFFFF;
struct CodePoint {
  uint32_t cp;  // kInvalidCodePoint for a byte that does not start a valid UTF-8 sequence
  int length;   // bytes: 1 for an invalid byte
};
CodePoint decode_utf8(std::string_view text, size_t i);  // the code point at text[i] (i < size)

bool is_unicode_space(std::string_view text, size_t i, int* length);  // ECMAScript \s at text[i]

// Replaces every occurrence of `pattern` (non-empty), left to right, without rescanning replacements.
void replace_all(std::string& text, std::string_view pattern, std::string_view content);

// GPT-2's byte-to-unicode table: byte b is spelled by code point byte_to_code_point(b).
char32_t byte_to_code_point(uint8_t b);
void append_utf8(std::string& out, char32_t cp);

// Gives each token (non-empty content) its id and bytes and keeps them longest first for matching.
void set_added_tokens(BpeModel& model, std::vector<AddedToken> tokens);

std::shared_ptr<BpeModel> load_vocab_merges(const std::filesystem::path& vocab_json,
                                             const std::filesystem::path& merges_txt);
std::shared_ptr<BpeModel> load_tokenizer_json(const std::filesystem::path& tokenizer_json);
struct VocabTables;  // tokenizer.h
std::shared_ptr<BpeModel> load_vocab_tables(const VocabTables& tables);
// Reads eos_token / bos_token / add_bos_token from a Hugging Face tokenizer_config.json.
void apply_tokenizer_config(BpeModel& model, const std::filesystem::path& config_json);

// Kimi's layout (tokenization_kimi.py): the n ranks of tiktoken.model ("<base64 bytes> <rank>" per
// line, ranks 0..n-1), then kTiktokenSpecialTokens special tokens with ids n..n+255, named by
// tokenizer_config.json's added_tokens_decoder or "<|reserved_token_{id}|>". `config_json` may be empty
// (no config: every special token keeps its placeholder name, no bos / eos / pad).
inline constexpr int32_t kTiktokenSpecialTokens = 256;
std::shared_ptr<BpeModel> load_tiktoken(const std::filesystem::path& tiktoken_model,
                                        const std::filesystem::path& config_json);

}  // namespace lineage::tokenizer
