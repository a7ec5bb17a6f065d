// Tokenizer: added-token splitting, normalization and pre-tokenization, per-word BPE with a cache,
// decode and streaming decode. The model itself is loaded by bpe_load.cpp.
#include "lineage/tokenizer/tokenizer.h"

#include <algorithm>
#include <mutex>

#include "lineage/core/error.h"
#include "lineage/tokenizer/bpe_model.h"
#include "lineage/tokenizer/nfc.h"

namespace lineage::tokenizer {
namespace {

namespace fs = std::filesystem;

// Start of the code point that ends just before text[end] (end > 0).
size_t previous_code_point(std::string_view text, size_t end) {
  size_t i = end - 1;
  while (i > 0 && end - i < 4 && (uint8_t(text[i]) & 0xC0) == 0x80) --i;
  return utf8_sequence_length(text, i) == int(end - i) ? i : end - 1;
}

// Leftmost-longest added token at text[i], or null. Special ones only when allowed.
const AddedToken* match_added(const BpeModel& m, std::string_view text, size_t i, bool allow_special) {
  for (const AddedToken& t : m.added_tokens) {
    if ((allow_special || !t.special) && text.substr(i).starts_with(t.content)) return &t;
  }
  return nullptr;
}

// Encodes one stretch of text that holds no added token. Holds the scratch it reuses per word.
class SegmentEncoder {
 public:
  SegmentEncoder(const BpeModel& model, BpeCache& cache, std::vector<int32_t>& out)
      : m_(model), cache_(cache), out_(out) {}

  void encode(std::string_view segment, bool at_text_start) {
    if (segment.empty()) return;
    std::string_view text = segment;
    if (!m_.normalizer.empty()) {
      buffer_.assign(segment);
      for (const TextRewrite& r : m_.normalizer) {
        if (r.kind == TextRewrite::Kind::kReplace) replace_all(buffer_, r.pattern, r.content);
        if (r.kind == TextRewrite::Kind::kPrepend && !buffer_.empty()) buffer_.insert(0, r.content);
        if (r.kind == TextRewrite::Kind::kNfc) buffer_ = nfc(buffer_);
      }
      text = buffer_;
    }
    words_.clear();
    if (m_.mode == SymbolMode::kByteLevel) {
      if (m_.add_prefix_space && !text.starts_with(' ')) {
        buffer_ = std::string(" ").append(text);
        text = buffer_;
      }
      if (m_.split == BpeModel::Split::kGpt2) split_gpt2(text, words_);
      else if (m_.split == BpeModel::Split::kQwen2) split_qwen2(text, words_);
      else if (m_.split == BpeModel::Split::kQwen35) split_qwen35(text, words_);
      else if (m_.split == BpeModel::Split::kKimi) split_kimi(text, words_);
      else words_.push_back(text);
    } else if (m_.mode == SymbolMode::kTiktoken) {
      split_kimi(text, words_);
    } else if (m_.metaspace) {
      metaspace(text, at_text_start);
    } else {
      words_.push_back(text);
    }
    for (std::string_view word : words_) encode_word(word);
  }

 private:
  void metaspace(std::string_view text, bool at_text_start) {
    const MetaspaceOptions& o = *m_.metaspace;
    std::string rewritten(text);
    replace_all(rewritten, " ", o.replacement);
    const bool prepend = o.prepend == MetaspaceOptions::Prepend::kAlways ||
                         (o.prepend == MetaspaceOptions::Prepend::kFirst && at_text_start);
    if (prepend && !rewritten.starts_with(o.replacement)) rewritten.insert(0, o.replacement);
    buffer_ = std::move(rewritten);
    if (o.split) {
      split_before(buffer_, o.replacement, words_);
    } else {
      words_.push_back(buffer_);
    }
  }

  void encode_word(std::string_view word) {
    const bool cacheable = word.size() <= BpeCache::kMaxWordBytes;
    if (cacheable) {
      std::lock_guard lock(cache_.mutex);
      const auto it = cache_.words.find(word);
      if (it != cache_.words.end()) {
        out_.insert(out_.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    symbols_.clear();
    if (!(m_.ignore_merges && whole_word(word))) {
      if (m_.mode == SymbolMode::kTiktoken) {
        tiktoken_merge(m_.symbol_ids, word, symbols_);
      } else {
        initial_symbols(word);
        bpe_merge(m_.merges, symbols_);
      }
    }
    out_.insert(out_.end(), symbols_.begin(), symbols_.end());
    if (cacheable) {
      std::lock_guard lock(cache_.mutex);
      if (cache_.words.size() >= BpeCache::kMaxEntries) cache_.words.clear();
      cache_.words.emplace(word, symbols_);
    }
  }

  // ignore_merges: a word that is a symbol of the vocabulary is that one token.
  bool whole_word(std::string_view word) {
    std::string spelled;
    if (m_.mode == SymbolMode::kByteLevel) {
      for (char b : word) append_utf8(spelled, byte_to_code_point(uint8_t(b)));
      word = spelled;
    }
    const auto it = m_.symbol_ids.find(word);
    if (it == m_.symbol_ids.end()) return false;
    symbols_.push_back(it->second);
    return true;
  }

  void initial_symbols(std::string_view word) {
    if (m_.mode == SymbolMode::kByteLevel) {
      for (char b : word) symbols_.push_back(m_.byte_symbol_ids[uint8_t(b)]);
      return;
    }
    bool last_was_unk = false;
    for (size_t i = 0; i < word.size();) {
      const size_t length = size_t(std::max(utf8_sequence_length(word, i), 1));
      const std::string_view ch = word.substr(i, length);
      i += length;
      if (const auto it = m_.symbol_ids.find(ch); it != m_.symbol_ids.end()) {
        symbols_.push_back(it->second);
        last_was_unk = false;
        continue;
      }
      if (m_.byte_fallback && std::all_of(ch.begin(), ch.end(), [&](char b) { return m_.byte_fallback_ids[uint8_t(b)] >= 0; })) {
        for (char b : ch) symbols_.push_back(m_.byte_fallback_ids[uint8_t(b)]);
        last_was_unk = false;
        continue;
      }
      if (!m_.unk_id) {
        throw Error(cat(m_.source, ": the text holds \"", ch, "\", which is not in the vocabulary, and the tokenizer has ",
                        "no byte fallback or unk_token for it"));
      }
      if (!(m_.fuse_unk && last_was_unk)) symbols_.push_back(*m_.unk_id);
      last_was_unk = true;
    }
  }

  const BpeModel& m_;
  BpeCache& cache_;
  std::vector<int32_t>& out_;
  std::string buffer_;
  std::vector<std::string_view> words_;
  std::vector<int32_t> symbols_;
};

// Bytes of text[i...] that form the start of a well-formed UTF-8 sequence (0 for a byte that
// cannot start one); *need is the length of the full sequence.
int valid_prefix(std::string_view text, size_t i, int* need) {
  const auto b0 = uint8_t(text[i]);
  uint8_t lo = 0x80, hi = 0xBF;
  if (b0 < 0x80) {
    *need = 1;
  } else if (b0 >= 0xC2 && b0 <= 0xDF) {
    *need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    *need = 3;
    lo = b0 == 0xE0 ? 0xA0 : 0x80;
    hi = b0 == 0xED ? 0x9F : 0xBF;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    *need = 4;
    lo = b0 == 0xF0 ? 0x90 : 0x80;
    hi = b0 == 0xF4 ? 0x8F : 0xBF;
  } else {
    *need = 1;
    return 0;
  }
  int k = 1;
  for (; k < *need && i + k < text.size(); ++k) {
    const auto b = uint8_t(text[i + k]);
    if (k == 1 ? (b < lo || b > hi) : (b & 0xC0) != 0x80) break;
  }
  return k;
}

constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

// Moves the longest well-formed prefix of `pending` to the returned string, replacing each maximal
// ill-formed subpart by U+FFFD (Unicode 15, section 3.9). An incomplete sequence at the end stays in
// `pending` unless `final`.
std::string take_utf8(std::string& pending, bool final) {
  std::string out;
  size_t i = 0;
  while (i < pending.size()) {
    int need = 1;
    const int have = valid_prefix(pending, i, &need);
    if (have == need) {
      out.append(pending, i, size_t(need));
      i += size_t(need);
    } else if (!final && have > 0 && i + size_t(have) == pending.size()) {
      break;  // may still complete
    } else {
      out.append(kReplacementCharacter);
      i += size_t(std::max(have, 1));
    }
  }
  pending.erase(0, i);
  return out;
}

}  // namespace

Tokenizer::Tokenizer(std::shared_ptr<const BpeModel> model)
    : model_(std::move(model)), cache_(std::make_shared<BpeCache>()) {}

Tokenizer Tokenizer::load(const fs::path& model_dir) {
  std::shared_ptr<BpeModel> model;
  if (fs::exists(model_dir / "tokenizer.json")) {
    model = load_tokenizer_json(model_dir / "tokenizer.json");
  } else if (fs::exists(model_dir / "vocab.json") && fs::exists(model_dir / "merges.txt")) {
    model = load_vocab_merges(model_dir / "vocab.json", model_dir / "merges.txt");
  } else if (fs::exists(model_dir / "tiktoken.model")) {
    // Kimi's layout: tokenizer_config.json names the special tokens, so it is part of the tokenizer.
    const fs::path config = model_dir / "tokenizer_config.json";
    return Tokenizer(load_tiktoken(model_dir / "tiktoken.model", fs::exists(config) ? config : fs::path()));
  } else {
    throw Error(cat(model_dir.string(), ": no tokenizer found; expected tokenizer.json, vocab.json and merges.txt, ",
                    "or tiktoken.model (with tokenizer_config.json) in this directory"));
  }
  if (fs::exists(model_dir / "tokenizer_config.json")) apply_tokenizer_config(*model, model_dir / "tokenizer_config.json");
  return Tokenizer(std::move(model));
}

Tokenizer Tokenizer::from_vocab_merges(const fs::path& vocab_json, const fs::path& merges_txt) {
  return Tokenizer(load_vocab_merges(vocab_json, merges_txt));
}

Tokenizer Tokenizer::from_tables(const VocabTables& tables) { return Tokenizer(load_vocab_tables(tables)); }

Tokenizer Tokenizer::from_tokenizer_json(const fs::path& tokenizer_json) {
  return Tokenizer(load_tokenizer_json(tokenizer_json));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  const BpeModel& m = *model_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  SegmentEncoder encoder(m, *cache_, ids);
  size_t segment_start = 0;
  for (size_t i = 0; i < text.size();) {
    const AddedToken* token = m.added_first_byte[uint8_t(text[i])] ? match_added(m, text, i, allow_special) : nullptr;
    if (token == nullptr) {
      ++i;
      continue;
    }
    size_t begin = i;
    size_t end = i + token->content.size();
    int length = 0;
    while (token->lstrip && begin > segment_start) {
      const size_t prev = previous_code_point(text, begin);
      if (prev < segment_start || !is_unicode_space(text, prev, &length)) break;
      begin = prev;
    }
    while (token->rstrip && end < text.size() && is_unicode_space(text, end, &length)) end += size_t(length);
    encoder.encode(text.substr(segment_start, begin - segment_start), segment_start == 0);
    ids.push_back(token->id);
    segment_start = i = end;
  }
  encoder.encode(text.substr(segment_start), segment_start == 0);
  return ids;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  const BpeModel& m = *model_;
  if (id < 0 || id >= m.vocab_size()) {
    throw Error(cat("token id ", id, " is out of range: the tokenizer (", m.source, ") has vocab_size ", m.vocab_size(),
                    ", so ids must be in [0, ", m.vocab_size() - 1, "]"));
  }
  if (!m.has_token[id]) {
    throw Error(cat("token id ", id, " is not assigned to any token in ", m.source, " (vocab_size ", m.vocab_size(), ")"));
  }
  return m.token_bytes[id];
}

const std::string& Tokenizer::first_token_bytes(int32_t id) const {
  const std::string& bytes = token_bytes(id);
  const auto it = model_->first_token_bytes.find(id);
  return it == model_->first_token_bytes.end() ? bytes : it->second;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) out += i == 0 ? first_token_bytes(ids[i]) : token_bytes(ids[i]);
  size_t strip = 0;
  while (strip < size_t(model_->strip_leading_spaces) && strip < out.size() && out[strip] == ' ') ++strip;
  out.erase(0, strip);
  return out;
}

int32_t Tokenizer::vocab_size() const { return model_->vocab_size(); }
std::optional<int32_t> Tokenizer::eos_id() const { return model_->eos_id; }
std::optional<int32_t> Tokenizer::bos_id() const { return model_->bos_id; }
std::optional<int32_t> Tokenizer::pad_id() const { return model_->pad_id; }
bool Tokenizer::adds_bos() const { return model_->adds_bos; }

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer)
    : tokenizer_(tokenizer), strip_left_(tokenizer.model_->strip_leading_spaces) {}

std::string StreamDecoder::push(int32_t id) {
  pending_ += first_ ? tokenizer_.first_token_bytes(id) : tokenizer_.token_bytes(id);
  first_ = false;
  while (strip_left_ > 0 && !pending_.empty()) {
    if (pending_[0] != ' ') {
      strip_left_ = 0;
      break;
    }
    pending_.erase(0, 1);
    --strip_left_;
  }
  return take_utf8(pending_, false);
}

std::string StreamDecoder::flush() { return take_utf8(pending_, true); }

}  // namespace lineage::tokenizer
