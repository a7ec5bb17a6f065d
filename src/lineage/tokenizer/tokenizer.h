// Room tokenizer/: text to token ids and back, as the models' own tokenizer files say: byte-level
// BPE (vocab.json + merges.txt, tokenizer.json), SentencePiece-style BPE, tiktoken (Kimi), their
// pre-tokenizers and the generated Unicode tables (tools/gen_unicode_tables.mjs). Uses core only.
//
// Byte-pair-encoding tokenizers: GPT-2 byte-level BPE (vocab.json + merges.txt or tokenizer.json),
// matching js-tiktoken's "gpt2" encoding; SentencePiece-style BPE from tokenizer.json (Metaspace,
// byte fallback) as used by Llama / Mistral; and Kimi's tiktoken.model with its special tokens,
// matching tiktoken. Reference: openai/gpt-2 encoder.py, huggingface/tokenizers, openai/tiktoken.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lineage::tokenizer {

struct BpeModel;  // bpe_model.h

// A vocabulary given as tables, as a GGUF file's tokenizer.ggml.* keys hold it (io/ reads the file).
struct VocabTables {
  std::string source;               // for messages, e.g. "model.gguf"
  std::string model;                // tokenizer.ggml.model: "gpt2" (byte-level BPE)
  std::string pre;                  // tokenizer.ggml.pre: "gpt-2", "qwen2", "qwen35", "kimi-k2"
  std::vector<std::string> tokens;  // by id, as spelled in the vocabulary ("Ġthe")
  std::vector<int32_t> types;       // llama.cpp's token types by id (3 control, 4 user-defined); may be empty
  std::vector<std::string> merges;  // "a b", highest priority first
  std::optional<int32_t> bos, eos, pad;
  bool add_bos = false;
};
struct BpeCache;

class Tokenizer {
 public:
  // Loads from a Hugging Face model directory: tokenizer.json if present, else vocab.json + merges.txt,
  // else tiktoken.model (Kimi: its tokenizer_config.json names the 256 special tokens after the ranks).
  // tokenizer_config.json, when present, names the eos / bos (and, for tiktoken.model, pad) tokens.
  static Tokenizer load(const std::filesystem::path& model_dir);
  // GPT-2 layout: byte-level BPE with GPT-2's pre-tokenizer; <|endoftext|> (if in the vocab) is special.
  static Tokenizer from_vocab_merges(const std::filesystem::path& vocab_json, const std::filesystem::path& merges_txt);
  static Tokenizer from_tokenizer_json(const std::filesystem::path& tokenizer_json);
  // Control tokens (type 3) become special added tokens, user-defined ones (4) non-special ones, as
  // llama.cpp's converter wrote them from tokenizer.json. An unknown model or pre-tokenizer, a merge
  // of tokens not in the vocabulary, or an id out of range is an Error naming the source and key.
  static Tokenizer from_tables(const VocabTables& tables);

  // allow_special: when true, special added tokens such as <|endoftext|> in the text map to their id;
  // when false they are tokenized as ordinary text. Non-special added tokens always map to their id.
  // (All 256 special tokens of a tiktoken.model tokenizer are special, as tiktoken has them.)
  // Never adds BOS/EOS: callers prepend bos_id() where the model expects it (see adds_bos()).
  std::vector<int32_t> encode(std::string_view text, bool allow_special = true) const;
  // Raw bytes of the tokens joined (may be invalid UTF-8 mid-way), after the decoder's rules for the
  // start of the text (SentencePiece: the space the pre-tokenizer prepended is dropped). Byte-fallback
  // tokens <0xNN> give their byte. Throws Error on an id outside the vocabulary.
  std::string decode(std::span<const int32_t> ids) const;
  const std::string& token_bytes(int32_t id) const;  // the raw bytes a token stands for
  int32_t vocab_size() const;                        // max id + 1 over vocab and added tokens
  std::optional<int32_t> eos_id() const;             // <|endoftext|> for GPT-2 (or the tokenizer's eos)
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> pad_id() const;             // tiktoken.model tokenizers: tokenizer_config's pad_token
  // The post-processor (or tokenizer_config.json's add_bos_token) starts every sequence with bos_id().
  bool adds_bos() const;

 private:
  friend class StreamDecoder;
  explicit Tokenizer(std::shared_ptr<const BpeModel> model);
  const std::string& first_token_bytes(int32_t id) const;  // the bytes of `id` when it is decoded first
  std::shared_ptr<const BpeModel> model_;  // immutable after loading; copies share it
  std::shared_ptr<BpeCache> cache_;        // per-word BPE results (thread-safe); copies share it
};

// Streaming decode: push ids one by one, get back only complete UTF-8 characters; flush() at the end
// returns what is left (invalid trailing bytes replaced by U+FFFD). Byte sequences that can never
// become valid UTF-8 are replaced by U+FFFD as soon as that is known, so every returned string is
// valid UTF-8.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer);
  std::string push(int32_t id);
  std::string flush();

 private:
  Tokenizer tokenizer_;  // shares the immutable model
  std::string pending_;  // bytes not yet returned: at most one incomplete UTF-8 sequence after push
  int strip_left_;       // leading spaces still to drop (SentencePiece Strip decoder)
  bool first_ = true;    // the next id is the first one (Metaspace decoder)
};

}  // namespace lineage::tokenizer
