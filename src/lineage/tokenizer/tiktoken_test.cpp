// Tests of the tiktoken.model tokenizer (Kimi's layout). The bulk is parity with npm tiktoken (the
// Rust tiktoken in WASM) built from o200k_base's ranks with Kimi's pattern and special tokens, over
// the corpus in tests/tokenizer/corpus, written to $LINEAGE_TESTDATA/tokenizer by
// tests/tokenizer/kimi_reference.mjs; then hand-checked splits and merges, and malformed files.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <iostream>

#include <nlohmann/json.hpp>

#include "lineage/core/error.h"
#include "lineage/tokenizer/bpe_model.h"
#include "lineage/tokenizer/tokenizer.h"
#include "lineage/tokenizer/tokenizer_test_support.h"
#include "lineage/tokenizer/unicode_tables.h"

namespace lineage::tokenizer {
namespace tiktoken_test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using namespace test;

struct KimiReference : test::Reference {
  fs::path model_dir;
  std::string reference;
  int32_t n_ranks = 0;
};

// Loads $LINEAGE_TESTDATA/tokenizer/kimi_expected.json once. Missing data is a failure, not a skip.
const KimiReference& kimi_reference() {
  static const KimiReference ref = [] {
    KimiReference r = test::load_reference<KimiReference>("kimi_expected.json", [](const json& j, KimiReference& k) {
      k.reference = j.at("reference").get<std::string>();
      k.n_ranks = j.at("n_ranks").get<int32_t>();
    });
    if (!r.dir.empty()) r.model_dir = r.dir / "kimi";
    return r;
  }();
  return ref;
}

#define REQUIRE_KIMI_REFERENCE(ref) LINEAGE_REQUIRE_REFERENCE(ref, kimi_reference())

const Tokenizer& kimi() {
  static const Tokenizer tok = Tokenizer::load(kimi_reference().model_dir);
  return tok;
}

TEST(TokenizerKimi, ParityWithTiktoken) {
  REQUIRE_KIMI_REFERENCE(ref);
  const Tokenizer& tok = kimi();
  size_t failed = 0, ordinary = 0, bytes = 0;
  std::string first_failures;
  for (const Segment& seg : ref.segments) {
    bytes += seg.text.size();
    std::string diff = compare_ids(tok, seg, seg.ids, tok.encode(seg.text, true));
    const std::vector<int32_t>& want_ordinary = seg.ids_ordinary ? *seg.ids_ordinary : seg.ids;
    ordinary += seg.ids_ordinary.has_value();
    const std::string d = compare_ids(tok, seg, want_ordinary, tok.encode(seg.text, false));
    if (!d.empty()) diff += "\n  (allow_special = false) " + d;
    if (!diff.empty() && ++failed <= 3) first_failures += diff + "\n";
  }
  std::cout << "[ tokenizer ] tiktoken.model: " << ref.segments.size() - failed << " / " << ref.segments.size()
            << " segments identical to " << ref.reference << " with and without special tokens (" << ordinary
            << " hold special tokens), " << bytes << " bytes; Unicode tables from " << unicode::kTiktokenTablesSource << "\n";
  EXPECT_EQ(failed, 0u) << failed << " of " << ref.segments.size() << " segments differ; the first ones:\n" << first_failures;
  EXPECT_GE(ordinary, 10u) << "the corpus should hold Kimi's special tokens in many segments";
}

TEST(TokenizerKimi, LoadsTheModelDirectory) {
  REQUIRE_KIMI_REFERENCE(ref);
  const Tokenizer& tok = kimi();
  const int32_t n = ref.n_ranks;
  EXPECT_EQ(tok.vocab_size(), n + 256);
  EXPECT_EQ(tok.bos_id(), n);
  EXPECT_EQ(tok.eos_id(), n + 1);
  EXPECT_EQ(tok.pad_id(), n + 255);  // {"content": "[PAD]", ...}
  EXPECT_FALSE(tok.adds_bos());
  EXPECT_EQ(tok.token_bytes(n), "[BOS]");
  EXPECT_EQ(tok.token_bytes(n + 17), "<|im_middle|>");
  EXPECT_EQ(tok.token_bytes(n + 5), cat("<|reserved_token_", n + 5, "|>"));
  EXPECT_EQ(tok.token_bytes(0), "!");  // o200k_base: rank 0 is "!"
  EXPECT_THROW(tok.token_bytes(n + 256), Error);
}

TEST(TokenizerKimi, SpecialTokensOnlyWhenAllowed) {
  REQUIRE_KIMI_REFERENCE(ref);
  const Tokenizer& tok = kimi();
  const int32_t n = ref.n_ranks;
  const std::vector<int32_t> ids = tok.encode("[BOS]<|im_user|>hi<|im_end|>[EOS]");
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids.front(), n);
  EXPECT_EQ(ids[1], n + 3);
  EXPECT_EQ(ids[ids.size() - 2], n + 2);
  EXPECT_EQ(ids.back(), n + 1);
  // Tokens the config marks "special": false are special to tiktoken all the same.
  EXPECT_EQ(tok.encode("<|tool_call_begin|>"), std::vector<int32_t>{n + 13});
  const std::string reserved = cat("<|reserved_token_", n + 100, "|>");
  EXPECT_EQ(tok.encode(reserved), std::vector<int32_t>{n + 100});
  for (const std::string& text : {std::string("[BOS]<|im_end|>"), reserved}) {
    const std::vector<int32_t> plain = tok.encode(text, false);
    EXPECT_GT(plain.size(), 1u);
    EXPECT_TRUE(std::all_of(plain.begin(), plain.end(), [&](int32_t id) { return id < n; })) << text;
    EXPECT_EQ(tok.decode(plain), text);
  }
}

TEST(TokenizerKimi, DecodeInvertsEncode) {
  REQUIRE_KIMI_REFERENCE(ref);
  // Every byte is a token, so bytes that are not UTF-8 come back too.
  test::expect_decode_inverts_encode(kimi(), ref.segments, "\xFF\xFE a\xE2\x82 \x80\xC0\xAF\xED\xA0\x80 z\xF0\x9F\x98 \xE4\xB8");
}

TEST(TokenizerKimi, StreamDecodeEmitsWholeCharacters) {
  REQUIRE_KIMI_REFERENCE(ref);
  test::expect_stream_decode_emits_whole_characters(kimi(), ref.segments);
}

TEST(TokenizerKimi, EncodeSpeed) {
  REQUIRE_KIMI_REFERENCE(ref);
  const auto t0 = std::chrono::steady_clock::now();
  const Tokenizer tok = Tokenizer::load(ref.model_dir);  // a fresh cache
  const auto t1 = std::chrono::steady_clock::now();
  test::expect_encode_speed(tok, ref.segments,
                            cat("tiktoken.model: load ", std::chrono::duration<double, std::milli>(t1 - t0).count(), " ms; "));
}

// ---- Kimi's pattern and tiktoken's merge, by hand ------------------------------------------------

std::vector<std::string> split(std::string_view text) {
  std::vector<std::string_view> words;
  split_kimi(text, words);
  return std::vector<std::string>(words.begin(), words.end());
}

TEST(TokenizerKimi, PreTokenizerSplitsLikeThePattern) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split("Hello world"), (V{"Hello", " world"}));
  // Contractions belong to the word before them, in any case; U+017F folds to 's'.
  EXPECT_EQ(split("DON'T don't I'M it's"), (V{"DON'T", " don't", " I'M", " it's"}));
  EXPECT_EQ(split("it'\xC5\xBF x'Sx"), (V{"it'\xC5\xBF", " x'S", "x"}));
  // Upper-case runs end where a lower-case letter takes over: U* gives back its last letter.
  EXPECT_EQ(split("HTTPServer helloWORLD"), (V{"HTTPServer", " hello", "WORLD"}));
  // Han is its own run; a space before it is a word of its own.
  EXPECT_EQ(split("\xE4\xB8\xAD\xE6\x96\x87" "abc \xE4\xB8\xAD"), (V{"\xE4\xB8\xAD\xE6\x96\x87", "abc", " ", "\xE4\xB8\xAD"}));
  // Kana (Lo) is a letter, not Han: it joins the word after a space.
  EXPECT_EQ(split(" \xE3\x81\x8B\xE3\x81\xAA"), (V{" \xE3\x81\x8B\xE3\x81\xAA"}));
  EXPECT_EQ(split("12345 x1"), (V{"123", "45", " x", "1"}));
  EXPECT_EQ(split(" !!\n\nx"), (V{" !!\n\n", "x"}));
  // \s*[\r\n]+ ends at the last line break of a white-space run; \s+(?!\S) leaves one space.
  EXPECT_EQ(split("a \n \n  b"), (V{"a", " \n \n", " ", " b"}));
  EXPECT_EQ(split("x   "), (V{"x", "   "}));
  EXPECT_EQ(split("a\tb"), (V{"a", "\tb"}));
  // A mark leads the word it precedes; alone, it is a word of [\p{M}].
  EXPECT_EQ(split("\xCC\x81x \xCC\x81"), (V{"\xCC\x81x", " \xCC\x81"}));
  EXPECT_EQ(split("\xFF\xFE" "a"), (V{"\xFF\xFE", "a"}));  // invalid bytes count as [^\s\p{L}\p{N}]
}

// 256 single-byte tokens (rank = byte), then `extra` at ranks 256, 257, ...
std::string tiny_tiktoken_model(std::initializer_list<std::string> extra = {}) {
  static const char kDigits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  auto base64 = [](std::string_view bytes) {
    std::string out;
    for (size_t i = 0; i < bytes.size(); i += 3) {
      uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
      if (i + 1 < bytes.size()) v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
      if (i + 2 < bytes.size()) v |= uint8_t(bytes[i + 2]);
      out += kDigits[v >> 18];
      out += kDigits[(v >> 12) & 63];
      out += i + 1 < bytes.size() ? kDigits[(v >> 6) & 63] : '=';
      out += i + 2 < bytes.size() ? kDigits[v & 63] : '=';
    }
    return out;
  };
  std::string text;
  for (int b = 0; b < 256; ++b) text += cat(base64(std::string(1, char(b))), " ", b, "\n");
  int rank = 256;
  for (const std::string& token : extra) text += cat(base64(token), " ", rank++, "\n");
  return text;
}

TEST(TokenizerKimi, MergesLowestRankLeftmostFirst) {
  TempDir dir;
  // "bc" ranks below "ab", so "abcd" merges b+c first, then a+bc; "aa" ties go leftmost.
  dir.write("tiktoken.model", tiny_tiktoken_model({"bc", "ab", "abc", "cd", "aa", "aaa", "xyz"}));
  const Tokenizer tok = Tokenizer::load(dir.path);
  EXPECT_EQ(tok.vocab_size(), 263 + 256);
  EXPECT_EQ(tok.encode("abcd"), (std::vector<int32_t>{258, 'd'}));
  EXPECT_EQ(tok.encode("abc"), std::vector<int32_t>{258});
  EXPECT_EQ(tok.encode("aaaa"), (std::vector<int32_t>{260, 260}));
  EXPECT_EQ(tok.encode("aaaaa"), (std::vector<int32_t>{260, 261}));  // aa a a a -> aa aa a -> aa aaa
  // tiktoken looks a whole word up first: "xyz" is a token no merge reaches.
  EXPECT_EQ(tok.encode("xyz"), std::vector<int32_t>{262});
  EXPECT_EQ(tok.encode("xyzw"), (std::vector<int32_t>{'x', 'y', 'z', 'w'}));
  // No tokenizer_config.json: placeholder names, no bos / eos / pad.
  EXPECT_EQ(tok.bos_id(), std::nullopt);
  EXPECT_EQ(tok.eos_id(), std::nullopt);
  EXPECT_EQ(tok.pad_id(), std::nullopt);
  EXPECT_EQ(tok.encode("<|reserved_token_263|>"), std::vector<int32_t>{263});
  EXPECT_EQ(tok.encode("<|reserved_token_518|>"), std::vector<int32_t>{518});
}

TEST(TokenizerKimi, TokenizerJsonComesFirst) {
  REQUIRE_KIMI_REFERENCE(ref);
  TempDir dir;
  dir.write("tiktoken.model", tiny_tiktoken_model());
  fs::copy_file(ref.model_dir.parent_path() / "gpt2_json" / "tokenizer.json", dir.path / "tokenizer.json");
  EXPECT_EQ(Tokenizer::load(dir.path).vocab_size(), 50257);
}

// ---- Malformed files -----------------------------------------------------------------------------

TEST(TokenizerKimiErrors, TiktokenModel) {
  const std::string good = tiny_tiktoken_model({"ab"});
  auto load_with = [](std::string text) {
    return [text = std::move(text)] {
      TempDir dir;
      dir.write("tiktoken.model", text);
      Tokenizer::load(dir.path);
    };
  };
  load_with(good)();
  // Line 258 is the one after the 256 bytes and "ab".
  expect_error(load_with(good + "YWJj\n"), {"tiktoken.model:258", "\"YWJj\" with 1 field;", "two fields", "<rank>"});
  expect_error(load_with(good + "YWJj 257 9\n"), {"tiktoken.model:258", "with 3 fields"});
  expect_error(load_with(good + "YW*j 257\n"), {"tiktoken.model:258", "\"YW*j\"", "not valid base64"});
  expect_error(load_with(good + "YWJ 257\n"), {"tiktoken.model:258", "not valid base64"});
  expect_error(load_with(good + "YWJj x1\n"), {"tiktoken.model:258", "rank \"x1\"", "decimal integer"});
  expect_error(load_with(good + "YWJj -1\n"), {"tiktoken.model:258", "rank \"-1\""});
  expect_error(load_with(good + "YWJj 99999999999999999999\n"), {"tiktoken.model:258", "decimal integer"});
  expect_error(load_with(good + "YWJj 256\n"), {"tiktoken.model:258", "rank 256 again (line 257)", "each rank once"});
  expect_error(load_with(good + "YWI= 300\n"), {"tiktoken.model:258", "\"YWI=\" again (line 257, rank 256)"});
  expect_error(load_with(good + "YWJj 300\n"), {"tiktoken.model:258", "rank 300 with only 258 tokens", "without gaps"});
  expect_error(load_with(""), {"tiktoken.model", "no tokens"});
  std::string no_x = good;  // rank 120 goes to "abc" instead of "x"
  no_x.replace(no_x.find("eA== 120\n"), 9, "YWJj 120\n");
  expect_error(load_with(no_x), {"tiktoken.model", "byte 0x78", "256 single-byte"});
  expect_error(load_with(std::string("\x01\x02\xFF 0\n")), {"tiktoken.model:1", "\\x01\\x02\\xFF", "not valid base64"});
  // Windows line ends and blank lines are fine, as for load_tiktoken_bpe.
  std::string crlf;
  for (char c : good) crlf += c == '\n' ? std::string("\r\n\n") : std::string(1, c);
  load_with(crlf)();
}

TEST(TokenizerKimiErrors, TokenizerConfig) {
  TempDir dir;
  dir.write("tiktoken.model", tiny_tiktoken_model({"ab"}));  // n = 257: specials 257..512
  auto config = [&](const std::string& text) { dir.write("tokenizer_config.json", text); };
  auto load = [&] { return Tokenizer::load(dir.path); };
  const std::string decoder = R"("added_tokens_decoder": {"257": {"content": "[BOS]", "special": true},
                                                           "258": {"content": "[EOS]"}, "300": {"content": "<x>"}})";
  config("{" + decoder + R"(, "bos_token": "[BOS]", "eos_token": {"content": "[EOS]"}, "pad_token": "<x>"})");
  const Tokenizer tok = load();
  EXPECT_EQ(tok.bos_id(), 257);
  EXPECT_EQ(tok.eos_id(), 258);
  EXPECT_EQ(tok.pad_id(), 300);
  EXPECT_EQ(tok.encode("ab<x>"), (std::vector<int32_t>{256, 300}));
  config("{" + decoder + "}");  // bos and eos default to "[BOS]" and "[EOS]", as in tokenization_kimi.py
  EXPECT_EQ(load().bos_id(), 257);
  EXPECT_EQ(load().pad_id(), std::nullopt);

  config("[1]");
  expect_error(load, {"tokenizer_config.json", "(top level)", "expected an object"});
  config("{\"bos_token\": ");
  expect_error(load, {"tokenizer_config.json", "not valid JSON"});
  config(R"({"added_tokens_decoder": [1]})");
  expect_error(load, {"tokenizer_config.json", "field added_tokens_decoder", "an object mapping ids"});
  config(R"({"added_tokens_decoder": {"x1": {"content": "a"}}})");
  expect_error(load, {"added_tokens_decoder[\"x1\"]", "the key \"x1\"", "[257, 513)"});
  config(R"({"added_tokens_decoder": {"42": {"content": "a"}}})");
  expect_error(load, {"added_tokens_decoder[\"42\"]", "[257, 513)", "follow the 257 ranks"});
  config(R"({"added_tokens_decoder": {"513": {"content": "a"}}})");
  expect_error(load, {"added_tokens_decoder[\"513\"]", "[257, 513)"});
  config(R"({"added_tokens_decoder": {"300": "a"}})");
  expect_error(load, {"added_tokens_decoder[\"300\"]", "string \"a\"", "\"content\""});
  config(R"({"added_tokens_decoder": {"300": {"special": true}}})");
  expect_error(load, {"added_tokens_decoder[\"300\"].content", "no such field", "the token's text"});
  config(R"({"added_tokens_decoder": {"300": {"content": ""}}})");
  expect_error(load, {"added_tokens_decoder[\"300\"].content", "the token's text"});
  config(R"({"added_tokens_decoder": {"300": {"content": "a", "special": "yes"}}})");
  expect_error(load, {"added_tokens_decoder[\"300\"].special", "true or false"});
  config(R"({"added_tokens_decoder": {"300": {"content": "<a>"}, "301": {"content": "<a>"}}})");
  expect_error(load, {"added_tokens_decoder[\"301\"].content", "\"<a>\", which also names id 300", "named once"});
  config(R"({"added_tokens_decoder": {"300": {"content": "<|reserved_token_301|>"}}})");
  expect_error(load, {"added_tokens_decoder[\"300\"].content", "which also names id 301"});
  config("{" + decoder + R"(, "bos_token": "<s>"})");
  expect_error(load, {"tokenizer_config.json", "field bos_token", "\"<s>\"", "one of the 256 special tokens"});
  config("{" + decoder + R"(, "eos_token": 5})");
  expect_error(load, {"field eos_token", "number 5", "a token string or {\"content\": ...}"});
  config("{" + decoder + R"(, "pad_token": {"id": 3}})");
  expect_error(load, {"field pad_token", "a token string or {\"content\": ...}"});
  config("{" + decoder + R"(, "pad_token": "ab"})");  // a rank, not a special token
  expect_error(load, {"field pad_token", "\"ab\""});
}

TEST(TokenizerKimiErrors, MissingFilesNameTheTiktokenLayout) {
  TempDir dir;
  expect_error([&] { Tokenizer::load(dir.path); }, {"tokenizer.json", "merges.txt", "tiktoken.model"});
  fs::create_directory(dir.path / "tiktoken.model");
  expect_error([&] { Tokenizer::load(dir.path); }, {"tiktoken.model", "is a directory"});
}

}  // namespace
}  // namespace tiktoken_test
}  // namespace lineage::tokenizer
