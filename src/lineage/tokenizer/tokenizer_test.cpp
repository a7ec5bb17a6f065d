// Tokenizer tests. The bulk is parity with js-tiktoken's "gpt2" encoding over the corpus in
// tests/tokenizer/corpus, written to $LINEAGE_TESTDATA/tokenizer by tests/tokenizer/reference_tokenize.mjs.
#include "lineage/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <thread>

#include <nlohmann/json.hpp>

#include "lineage/core/error.h"
#include "lineage/tokenizer/bpe_model.h"
#include "lineage/tokenizer/tokenizer_test_support.h"
#include "lineage/tokenizer/unicode_tables.h"

namespace lineage::tokenizer {
namespace tokenizer_test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using namespace test;

struct Gpt2Reference : test::Reference {
  size_t corpus_bytes = 0;
  std::string unicode;  // the Unicode version of the node that ran the reference
};

// Loads $LINEAGE_TESTDATA/tokenizer/expected.json once. Missing data is a failure, not a skip.
const Gpt2Reference& reference() {
  static const Gpt2Reference ref = test::load_reference<Gpt2Reference>("expected.json", [](const json& j, Gpt2Reference& r) {
    r.corpus_bytes = j.at("corpus_bytes").get<size_t>();
    r.unicode = j.at("unicode").get<std::string>();
  });
  return ref;
}

#define REQUIRE_REFERENCE(ref) LINEAGE_REQUIRE_REFERENCE(ref, reference())

void expect_parity(const Tokenizer& tok, const std::string& label) {
  REQUIRE_REFERENCE(ref);
  size_t compared = 0, failed = 0, ordinary = 0;
  std::string first_failures;
  for (const Segment& seg : ref.segments) {
    std::string diff = compare_ids(tok, seg, seg.ids, tok.encode(seg.text, true));
    if (seg.ids_ordinary) {
      ++ordinary;
      const std::string d = compare_ids(tok, seg, *seg.ids_ordinary, tok.encode(seg.text, false));
      if (!d.empty()) diff += "\n  (allow_special = false) " + d;
    }
    ++compared;
    if (!diff.empty() && ++failed <= 3) first_failures += diff + "\n";
  }
  std::cout << "[ tokenizer ] " << label << ": " << compared - failed << " / " << compared
            << " segments identical to js-tiktoken gpt2 (" << ordinary << " also with allow_special = false), "
            << ref.corpus_bytes << " corpus bytes\n";
  if (ref.unicode != unicode::kUnicodeVersion) {
    std::cout << "[ tokenizer ] note: the reference ran on Unicode " << ref.unicode << ", the tables are Unicode "
              << unicode::kUnicodeVersion << "; rerun tools/gen_unicode_tables.mjs if characters new to either differ\n";
  }
  EXPECT_EQ(failed, 0u) << failed << " of " << compared << " segments differ; the first ones:\n" << first_failures;
}

Tokenizer gpt2_vocab_merges() {
  const fs::path dir = fs::path(reference().dir) / "gpt2";
  return Tokenizer::from_vocab_merges(dir / "vocab.json", dir / "merges.txt");
}

const Tokenizer& gpt2() {
  static const Tokenizer tok = gpt2_vocab_merges();
  return tok;
}

TEST(TokenizerGpt2, ParityVocabMerges) {
  REQUIRE_REFERENCE(ref);
  expect_parity(gpt2(), "vocab.json + merges.txt");
}

TEST(TokenizerGpt2, ParityTokenizerJson) {
  REQUIRE_REFERENCE(ref);
  expect_parity(Tokenizer::from_tokenizer_json(ref.dir / "gpt2_json" / "tokenizer.json"), "tokenizer.json");
}

TEST(TokenizerGpt2, ParityTokenizerJsonMergePairs) {
  REQUIRE_REFERENCE(ref);
  expect_parity(Tokenizer::from_tokenizer_json(ref.dir / "gpt2_json_pairs" / "tokenizer.json"),
                "tokenizer.json with [a, b] merges");
}

TEST(TokenizerGpt2, LoadPicksTheFilesOfAModelDirectory) {
  REQUIRE_REFERENCE(ref);
  for (const char* sub : {"gpt2", "gpt2_json"}) {
    const Tokenizer tok = Tokenizer::load(ref.dir / sub);
    EXPECT_EQ(tok.vocab_size(), 50257) << sub;
    EXPECT_EQ(tok.eos_id(), 50256) << sub;
    EXPECT_EQ(tok.encode("Hello world"), (std::vector<int32_t>{15496, 995})) << sub;
  }
  EXPECT_THROW(Tokenizer::load(ref.dir), Error);
}

// js-tiktoken maps a pre-token that is itself a token straight to it; merges-based BPE must agree
// for every such token of the vocabulary, or text holding that word would tokenize differently.
TEST(TokenizerGpt2, EveryOneWordTokenEncodesToItself) {
  REQUIRE_REFERENCE(ref);
  const Tokenizer& tok = gpt2();
  size_t checked = 0, failed = 0;
  std::vector<std::string_view> words;
  for (int32_t id = 0; id < 50256; ++id) {
    const std::string& bytes = tok.token_bytes(id);
    words.clear();
    split_gpt2(bytes, words);
    if (words.size() != 1) continue;
    ++checked;
    const std::vector<int32_t> ids = tok.encode(bytes, false);
    if (ids != std::vector<int32_t>{id} && ++failed <= 5) {
      ADD_FAILURE() << "token " << id << " \"" << visible(bytes) << "\" encodes to " << ids_around(ids, 0);
    }
  }
  EXPECT_EQ(failed, 0u) << "of " << checked;
  EXPECT_GT(checked, 50000u);
}

TEST(TokenizerGpt2, HandCheckedCases) {
  REQUIRE_REFERENCE(ref);
  const Tokenizer& tok = gpt2();
  EXPECT_EQ(tok.encode("hello world"), (std::vector<int32_t>{31373, 995}));  // js-tiktoken README
  EXPECT_EQ(tok.encode(""), std::vector<int32_t>{});
  EXPECT_EQ(tok.vocab_size(), 50257);
  EXPECT_EQ(tok.eos_id(), 50256);
  EXPECT_EQ(tok.bos_id(), std::nullopt);
  EXPECT_EQ(tok.token_bytes(995), " world");
  EXPECT_EQ(tok.token_bytes(50256), "<|endoftext|>");
}

TEST(TokenizerGpt2, SpecialTokensOnlyWhenAllowed) {
  REQUIRE_REFERENCE(ref);
  const Tokenizer& tok = gpt2();
  EXPECT_EQ(tok.encode("<|endoftext|>"), std::vector<int32_t>{50256});
  EXPECT_EQ(tok.encode("a<|endoftext|><|endoftext|>b"), (std::vector<int32_t>{64, 50256, 50256, 65}));
  const std::vector<int32_t> plain = tok.encode("<|endoftext|>", false);
  EXPECT_GT(plain.size(), 1u);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 50256), 0);
  EXPECT_EQ(tok.decode(plain), "<|endoftext|>");
  EXPECT_EQ(tok.encode("<|endoftext|", true), tok.encode("<|endoftext|", false));
  size_t with_special = 0;
  for (const Segment& seg : ref.segments) with_special += seg.ids_ordinary.has_value();
  EXPECT_GE(with_special, 10u) << "the corpus should hold <|endoftext|> in many segments";
}

TEST(TokenizerGpt2, DecodeInvertsEncode) {
  REQUIRE_REFERENCE(ref);
  // Byte-level BPE also carries bytes that are not UTF-8.
  test::expect_decode_inverts_encode(gpt2(), ref.segments, "\xFF\xFE a\xE2\x82 \x80\xC0\xAF\xED\xA0\x80 z\xF0\x9F\x98");
}

TEST(TokenizerGpt2, StreamDecodeEmitsWholeCharacters) {
  REQUIRE_REFERENCE(ref);
  test::expect_stream_decode_emits_whole_characters(gpt2(), ref.segments);
}

TEST(TokenizerGpt2, StreamDecodeReplacesInvalidBytes) {
  REQUIRE_REFERENCE(ref);
  const Tokenizer& tok = gpt2();
  const std::string fffd = "\xEF\xBF\xBD";
  auto stream_all = [&](std::string_view bytes) {
    StreamDecoder stream(tok);
    std::string out;
    for (int32_t id : tok.encode(bytes)) {
      const std::string piece = stream.push(id);
      EXPECT_TRUE(is_valid_utf8(piece));
      out += piece;
    }
    return out + stream.flush();
  };
  EXPECT_EQ(stream_all("a\xFF" "b"), "a" + fffd + "b");
  EXPECT_EQ(stream_all("x\xE2\x82"), "x" + fffd);            // incomplete at the end: one U+FFFD
  EXPECT_EQ(stream_all("\xE2\x82 y"), fffd + " y");          // truncated sequence, then text
  EXPECT_EQ(stream_all("\xED\xA0\x80"), fffd + fffd + fffd);  // surrogate: three maximal subparts
  EXPECT_EQ(stream_all("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
}

TEST(TokenizerGpt2, UnknownIdsThrow) {
  REQUIRE_REFERENCE(ref);
  const Tokenizer& tok = gpt2();
  for (int32_t id : {50257, -1, 1 << 30}) {
    try {
      const std::vector<int32_t> ids{31373, id};
      tok.decode(ids);
      ADD_FAILURE() << "decode accepted id " << id;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(id)), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("50257"), std::string::npos) << e.what();
    }
  }
  StreamDecoder stream(tok);
  EXPECT_THROW(stream.push(50257), Error);
}

TEST(TokenizerGpt2, ConcurrentEncodeMatches) {
  REQUIRE_REFERENCE(ref);
  const Tokenizer tok = gpt2_vocab_merges();  // a fresh cache that the threads fill together
  std::vector<size_t> failures(2, 0);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < failures.size(); ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < ref.segments.size() + t; ++i) {
        const Segment& seg = ref.segments[i % ref.segments.size()];
        failures[t] += tok.encode(seg.text) != seg.ids;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures[0] + failures[1], 0u);
}

TEST(TokenizerGpt2, EncodeSpeed) {
  REQUIRE_REFERENCE(ref);
  test::expect_encode_speed(gpt2_vocab_merges(), ref.segments, "");  // a fresh cache
}

TEST(TokenizerGpt2, PreTokenizerSplitsLikeTheRegex) {
  auto split = [](std::string_view text) {
    std::vector<std::string_view> words;
    split_gpt2(text, words);
    return std::vector<std::string>(words.begin(), words.end());
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(split("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(split("it's I'LL we'll 'x"), (V{"it", "'s", " I", "'", "LL", " we", "'ll", " '", "x"}));
  EXPECT_EQ(split("a  b"), (V{"a", " ", " b"}));
  EXPECT_EQ(split("a \n\tb"), (V{"a", " \n", "\t", "b"}));
  EXPECT_EQ(split("x   "), (V{"x", "   "}));
  EXPECT_EQ(split("12ab 3.5!!"), (V{"12", "ab", " 3", ".", "5", "!!"}));
  EXPECT_EQ(split("\xC2\xA0\xC2\xA0word"), (V{"\xC2\xA0", "\xC2\xA0", "word"}));  // U+00A0 is \s but not ' '
  EXPECT_EQ(split("\xFF\xFE" "a"), (V{"\xFF\xFE", "a"}));  // invalid bytes count as [^\s\p{L}\p{N}]
}

// ---- Malformed input -------------------------------------------------------------------------

// A byte-level vocabulary of the 256 one-byte symbols plus `extra`.
json byte_vocab(std::initializer_list<std::string> extra = {}) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    std::string symbol;
    append_utf8(symbol, byte_to_code_point(uint8_t(b)));
    vocab[symbol] = b;
  }
  int id = 256;
  for (const std::string& s : extra) vocab[s] = id++;
  return vocab;
}

TEST(TokenizerErrors, VocabMergesFiles) {
  TempDir dir;
  const fs::path vocab = dir.write("vocab.json", byte_vocab({"he", "hel"}).dump());
  const fs::path good_merges = dir.write("merges.txt", "#version: 0.2\nh e\nhe l\n");
  EXPECT_EQ(Tokenizer::from_vocab_merges(vocab, good_merges).encode("hel"), std::vector<int32_t>{257});

  expect_error([&] { Tokenizer::from_vocab_merges(dir.path / "nope.json", good_merges); }, {"nope.json", "cannot open"});
  expect_error([&] { Tokenizer::from_vocab_merges(vocab, dir.path / "nope.txt"); }, {"nope.txt", "cannot open"});
  const fs::path bad_json = dir.write("bad.json", "{\"a\": 1,");
  expect_error([&] { Tokenizer::from_vocab_merges(bad_json, good_merges); }, {"bad.json", "not valid JSON"});
  const fs::path array = dir.write("array.json", "[1, 2]");
  expect_error([&] { Tokenizer::from_vocab_merges(array, good_merges); }, {"array.json", "array", "expected an object"});
  const fs::path bad_id = dir.write("bad_id.json", "{\"a\": \"x\"}");
  expect_error([&] { Tokenizer::from_vocab_merges(bad_id, good_merges); }, {"bad_id.json", "[\"a\"]", "token id"});
  const fs::path no_bytes = dir.write("no_bytes.json", "{\"a\": 0}");
  expect_error([&] { Tokenizer::from_vocab_merges(no_bytes, good_merges); }, {"no_bytes.json", "byte 0x00", "256"});

  const fs::path three = dir.write("three.txt", "#version: 0.2\nh e\nhe l x\n");
  expect_error([&] { Tokenizer::from_vocab_merges(vocab, three); }, {"three.txt:3", "\"he l x\"", "two parts"});
  const fs::path one = dir.write("one.txt", "h e\nhel\n");
  expect_error([&] { Tokenizer::from_vocab_merges(vocab, one); }, {"one.txt:2", "\"hel\"", "two parts"});
  const fs::path blank = dir.write("blank.txt", "h e\n\nhe l\n");
  expect_error([&] { Tokenizer::from_vocab_merges(vocab, blank); }, {"blank.txt:2", "two parts"});
  const fs::path unknown = dir.write("unknown.txt", "h e\nq zz\n");
  expect_error([&] { Tokenizer::from_vocab_merges(vocab, unknown); }, {"unknown.txt", "line 2", "\"zz\"", "not in the vocabulary"});
  const fs::path unmerged = dir.write("unmerged.txt", "h e\nl l\n");
  expect_error([&] { Tokenizer::from_vocab_merges(vocab, unmerged); }, {"unmerged.txt", "line 2", "merged token \"ll\""});
}

json gpt2_like_tokenizer_json() {
  return json{{"version", "1.0"},
              {"added_tokens", json::array({{{"id", 258}, {"content", "<|endoftext|>"}, {"special", true}}})},
              {"normalizer", nullptr},
              {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
              {"decoder", {{"type", "ByteLevel"}}},
              {"model", {{"type", "BPE"}, {"vocab", byte_vocab({"he", "hel"})}, {"merges", json::array({"h e", "he l"})}}}};
}

TEST(TokenizerErrors, TokenizerJson) {
  TempDir dir;
  const fs::path good = dir.write("good.json", gpt2_like_tokenizer_json().dump());
  const Tokenizer tok = Tokenizer::from_tokenizer_json(good);
  EXPECT_EQ(tok.encode("hel<|endoftext|>"), (std::vector<int32_t>{257, 258}));
  EXPECT_EQ(tok.eos_id(), 258);

  auto broken = [&](const std::string& name, auto edit) {
    json j = gpt2_like_tokenizer_json();
    edit(j);
    return dir.write(name, j.dump());
  };
  const fs::path unigram = broken("unigram.json", [](json& j) { j["model"]["type"] = "Unigram"; });
  expect_error([&] { Tokenizer::from_tokenizer_json(unigram); }, {"unigram.json", "model.type", "\"Unigram\"", "\"BPE\""});
  const fs::path no_model = broken("no_model.json", [](json& j) { j.erase("model"); });
  expect_error([&] { Tokenizer::from_tokenizer_json(no_model); }, {"no_model.json", "field model"});
  const fs::path pre = broken("pre.json", [](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; });
  expect_error([&] { Tokenizer::from_tokenizer_json(pre); }, {"pre.json", "pre_tokenizer", "Whitespace", "ByteLevel"});
  const fs::path norm = broken("norm.json", [](json& j) { j["normalizer"] = {{"type", "NFKC"}}; });
  expect_error([&] { Tokenizer::from_tokenizer_json(norm); }, {"norm.json", "normalizer", "NFKC"});
  const fs::path vocab = broken("vocab.json", [](json& j) { j["model"]["vocab"] = json::array({"a"}); });
  expect_error([&] { Tokenizer::from_tokenizer_json(vocab); }, {"vocab.json", "model.vocab", "expected an object"});
  const fs::path merge = broken("merge.json", [](json& j) { j["model"]["merges"][1] = "he l x"; });
  expect_error([&] { Tokenizer::from_tokenizer_json(merge); }, {"merge.json", "model.merges[1]", "he l x"});
  const fs::path pair = broken("pair.json", [](json& j) { j["model"]["merges"][1] = json::array({"he"}); });
  expect_error([&] { Tokenizer::from_tokenizer_json(pair); }, {"pair.json", "model.merges[1]"});
  const fs::path unknown = broken("unknown.json", [](json& j) { j["model"]["merges"][0] = json::array({"h", "zz"}); });
  expect_error([&] { Tokenizer::from_tokenizer_json(unknown); }, {"unknown.json", "model.merges[0]", "\"zz\""});
  const fs::path added = broken("added.json", [](json& j) { j["added_tokens"][0]["id"] = "x"; });
  expect_error([&] { Tokenizer::from_tokenizer_json(added); }, {"added.json", "added_tokens[0].id"});
  const fs::path decoder = broken("decoder.json", [](json& j) { j["decoder"] = nullptr; });
  expect_error([&] { Tokenizer::from_tokenizer_json(decoder); }, {"decoder.json", "decoder", "ByteLevel"});
  const fs::path dropout = broken("dropout.json", [](json& j) { j["model"]["dropout"] = 0.1; });
  expect_error([&] { Tokenizer::from_tokenizer_json(dropout); }, {"dropout.json", "model.dropout"});
  const fs::path text = dir.write("text.json", "not json");
  expect_error([&] { Tokenizer::from_tokenizer_json(text); }, {"text.json", "not valid JSON"});
  expect_error([&] { Tokenizer::load(dir.path / "missing_dir"); }, {"missing_dir", "tokenizer.json", "merges.txt"});
}

TEST(TokenizerAddedTokens, StripAndSpecialFlags) {
  TempDir dir;
  json j = gpt2_like_tokenizer_json();
  j["added_tokens"].push_back({{"id", 259}, {"content", "<mask>"}, {"special", false}, {"lstrip", true}});
  j["added_tokens"].push_back({{"id", 260}, {"content", "<sep>"}, {"special", true}, {"lstrip", true}, {"rstrip", true}});
  const Tokenizer tok = Tokenizer::from_tokenizer_json(dir.write("tokenizer.json", j.dump()));
  EXPECT_EQ(tok.vocab_size(), 261);
  // Byte ids equal byte values in this vocabulary: 'a' 97, ' ' 32, 'b' 98.
  EXPECT_EQ(tok.encode("a <mask> b"), (std::vector<int32_t>{97, 259, 32, 98}));
  EXPECT_EQ(tok.encode("a <mask> b", false), (std::vector<int32_t>{97, 259, 32, 98}));  // not special
  EXPECT_EQ(tok.encode("a \t<sep>\n b"), (std::vector<int32_t>{97, 260, 98}));
  EXPECT_EQ(tok.encode("<sep>", false).size(), 5u);
}

TEST(TokenizerErrors, TokenizerConfigNamesUnknownToken) {
  TempDir dir;
  dir.write("tokenizer.json", gpt2_like_tokenizer_json().dump());
  dir.write("tokenizer_config.json", R"({"eos_token": {"content": "<|endoftext|>"}, "bos_token": "<|endoftext|>"})");
  const Tokenizer tok = Tokenizer::load(dir.path);
  EXPECT_EQ(tok.eos_id(), 258);
  EXPECT_EQ(tok.bos_id(), 258);
  dir.write("tokenizer_config.json", R"({"eos_token": "</s>"})");
  expect_error([&] { Tokenizer::load(dir.path); }, {"tokenizer_config.json", "eos_token", "\"</s>\""});
}

// ---- SentencePiece-style BPE (Llama / Mistral tokenizer.json) ----------------------------------

const std::string kSpace = "\xE2\x96\x81";  // U+2581

// <unk> <s> </s>, the 256 byte tokens, then a few pieces and merges spelling "hello world".
json llama_like_tokenizer_json(bool metaspace) {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  const std::vector<std::string> pieces = {kSpace, "h", "e", "l", "o", "w", "r", "d", kSpace + "h", "ll", kSpace + "he",
                                           "llo", kSpace + "hello", kSpace + "w", "or", kSpace + "wor", "ld", kSpace + "world"};
  for (size_t i = 0; i < pieces.size(); ++i) vocab[pieces[i]] = int(259 + i);
  const json merges = json::array({kSpace + " h", "l l", kSpace + "h e", "ll o", kSpace + "he llo", kSpace + " w", "o r",
                                   kSpace + "w or", "l d", kSpace + "wor ld"});
  json added = json::array();
  for (int id : {0, 1, 2}) {
    const char* names[] = {"<unk>", "<s>", "</s>"};
    added.push_back({{"id", id}, {"content", names[id]}, {"special", true}, {"normalized", false}});
  }
  json j = {{"version", "1.0"},
            {"added_tokens", added},
            {"post_processor",
             {{"type", "TemplateProcessing"},
              {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                      {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})}}},
            {"model",
             {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", "<unk>"}, {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr}, {"fuse_unk", true}, {"byte_fallback", true}, {"vocab", vocab},
              {"merges", merges}}}};
  // Llama 2 was converted with a Prepend + Replace normalizer; later conversions (legacy = false)
  // use a Metaspace pre-tokenizer that prepends only at the start of the text. Same decoder.
  if (metaspace) {
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", kSpace}, {"prepend_scheme", "first"}, {"split", false}};
  } else {
    j["normalizer"] = {{"type", "Sequence"},
                       {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", kSpace}},
                                                    {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}}})}};
    j["pre_tokenizer"] = nullptr;
  }
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
                                            {{"type", "ByteFallback"}},
                                            {{"type", "Fuse"}},
                                            {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  return j;
}

TEST(TokenizerSentencePiece, ByteFallbackMergesAndDecoders) {
  for (bool metaspace : {false, true}) {
    SCOPED_TRACE(metaspace ? "Metaspace pre-tokenizer" : "Prepend + Replace normalizer");
    TempDir dir;
    const Tokenizer tok = Tokenizer::from_tokenizer_json(dir.write("tokenizer.json", llama_like_tokenizer_json(metaspace).dump()));
    EXPECT_EQ(tok.vocab_size(), 259 + 18);
    EXPECT_EQ(tok.bos_id(), 1);
    EXPECT_EQ(tok.eos_id(), 2);
    EXPECT_TRUE(tok.adds_bos());
    EXPECT_EQ(tok.encode("hello world"), (std::vector<int32_t>{271, 276}));
    // U+2603 is not a piece: its three UTF-8 bytes fall back to <0xE2> <0x98> <0x83>.
    const std::vector<int32_t> snowman = tok.encode("hello \xE2\x98\x83");
    EXPECT_EQ(snowman, (std::vector<int32_t>{271, 259, 3 + 0xE2, 3 + 0x98, 3 + 0x83}));
    EXPECT_EQ(tok.decode(snowman), "hello \xE2\x98\x83");
    EXPECT_EQ(tok.token_bytes(3 + 0x41), "A");
    EXPECT_EQ(tok.token_bytes(276), " world");
    // The decoder strips the one space the pre-tokenizer prepended.
    EXPECT_EQ(tok.decode(tok.encode("world")), "world");
    // A leading space: the legacy normalizer prepends a second one; Metaspace sees "▁world" and
    // prepends nothing, so the decoder's strip loses it (as in Hugging Face tokenizers).
    EXPECT_EQ(tok.decode(tok.encode(" world")), metaspace ? "world" : " world");
    StreamDecoder stream(tok);
    EXPECT_EQ(stream.push(271), "hello");
    EXPECT_EQ(stream.push(3 + 0xE2), "");
    EXPECT_EQ(stream.push(3 + 0x98), "");
    EXPECT_EQ(stream.push(3 + 0x83), "\xE2\x98\x83");
    EXPECT_EQ(stream.flush(), "");
    // The Prepend normalizer runs per piece between added tokens; Metaspace "first" only at offset 0.
    const std::vector<int32_t> after_bos = tok.encode("<s>hello");
    if (metaspace) {
      EXPECT_EQ(after_bos, (std::vector<int32_t>{1, 260, 261, 270}));
      EXPECT_EQ(tok.decode(after_bos), "<s>hello");
    } else {
      EXPECT_EQ(after_bos, (std::vector<int32_t>{1, 271}));
      EXPECT_EQ(tok.decode(after_bos), "<s> hello");
    }
    EXPECT_EQ(tok.encode("<s>", false), (std::vector<int32_t>{259, 3 + '<', 3 + 's', 3 + '>'}));
  }
}

TEST(TokenizerSentencePiece, MetaspaceDecoderAndSplit) {
  TempDir dir;
  json j = llama_like_tokenizer_json(true);
  j["pre_tokenizer"]["split"] = true;
  j["pre_tokenizer"]["prepend_scheme"] = "always";
  j["decoder"] = {{"type", "Metaspace"}, {"replacement", kSpace}, {"prepend_scheme", "always"}, {"split", true}};
  // A merge across the word boundary, which split = true must keep from applying.
  j["model"]["vocab"]["d" + kSpace] = 277;
  json& merges = j["model"]["merges"];
  merges.insert(merges.begin(), "d " + kSpace);
  j["model"]["vocab"][kSpace + kSpace] = 278;
  const Tokenizer tok = Tokenizer::from_tokenizer_json(dir.write("tokenizer.json", j.dump()));
  EXPECT_EQ(tok.encode("world world"), (std::vector<int32_t>{276, 276}));
  EXPECT_EQ(tok.encode("<s>hello"), (std::vector<int32_t>{1, 271}));  // "always" prepends after added tokens too
  EXPECT_EQ(tok.decode(std::vector<int32_t>{276, 276}), "world world");
  EXPECT_EQ(tok.token_bytes(3 + 0x41), "<0x41>");  // no ByteFallback step in this decoder
  // The Metaspace decoder drops every replacement of the first token, not just one space.
  EXPECT_EQ(tok.token_bytes(278), "  ");
  EXPECT_EQ(tok.decode(std::vector<int32_t>{278, 276}), " world");
  EXPECT_EQ(tok.decode(std::vector<int32_t>{276, 278}), "world  ");
  StreamDecoder stream(tok);
  EXPECT_EQ(stream.push(278), "");
  EXPECT_EQ(stream.push(276), " world");
  j["pre_tokenizer"]["split"] = false;
  const Tokenizer unsplit = Tokenizer::from_tokenizer_json(dir.write("unsplit.json", j.dump()));
  EXPECT_EQ(unsplit.encode("world world"), (std::vector<int32_t>{274, 262, 277, 264, 273, 275}));
}

TEST(TokenizerSentencePiece, UnknownCharactersFuseIntoOneUnk) {
  TempDir dir;
  json j = llama_like_tokenizer_json(true);
  j["model"]["byte_fallback"] = false;
  const Tokenizer tok = Tokenizer::from_tokenizer_json(dir.write("tokenizer.json", j.dump()));
  EXPECT_EQ(tok.encode("hello \xE2\x98\x83\xE2\x98\x83" "d"), (std::vector<int32_t>{271, 259, 0, 266}));
  j["model"]["unk_token"] = nullptr;
  const Tokenizer strict = Tokenizer::from_tokenizer_json(dir.write("strict.json", j.dump()));
  expect_error([&] { strict.encode("\xE2\x98\x83"); }, {"strict.json", "\xE2\x98\x83", "not in the vocabulary"});
}

}  // namespace
}  // namespace tokenizer_test
}  // namespace lineage::tokenizer
