// Kimi's tokenizer as the reference for lineage's tiktoken.model loader (run by reference_tokenize.mjs):
// npm tiktoken, the Rust tiktoken compiled to WASM, built from a real large rank file (o200k_base),
// the pre-tokenization pattern of moonshotai's tokenization_kimi.py and Kimi-style special tokens
// (ids n..n+255 after the n ranks, as TikTokenTokenizer numbers them).
// Writes OUT_DIR/kimi/{tiktoken.model,tokenizer_config.json} and OUT_DIR/kimi_expected.json.
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

// tokenization_kimi.py TikTokenTokenizer.pat_str.
export const kKimiPattern = [
  String.raw`[\p{Han}]+`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`\p{N}{1,3}`,
  String.raw` ?[^\s\p{L}\p{N}]+[\r\n]*`,
  String.raw`\s*[\r\n]+`,
  String.raw`\s+(?!\S)`,
  String.raw`\s+`,
].join("|");

const kReservedSpecialTokens = 256;
// The named special tokens of Kimi K2's tokenizer_config.json, by offset from n; special: false
// marks the ones that file has as non-special added tokens (tiktoken treats all 256 alike).
const kNamed = [
  [0, "[BOS]"], [1, "[EOS]"], [2, "<|im_end|>"], [3, "<|im_user|>"], [4, "<|im_assistant|>"],
  [6, "<|start_header_id|>"], [7, "<|end_header_id|>"], [9, "[EOT]"], [10, "<|im_system|>"],
  [11, "<|tool_calls_section_begin|>", false], [12, "<|tool_calls_section_end|>", false],
  [13, "<|tool_call_begin|>", false], [14, "<|tool_call_argument_begin|>", false], [15, "<|tool_call_end|>", false],
  [17, "<|im_middle|>"], [254, "[UNK]"], [255, "[PAD]"],
];

// o200k_base.json's bpe_ranks: lines of "<name> <first rank> <base64 token> <base64 token> ...",
// the tokens taking consecutive ranks. Returns tiktoken.model text: "<base64 token> <rank>" lines.
function toTiktokenModel(bpeRanks) {
  const lines = [];
  for (const line of bpeRanks.split("\n")) {
    if (line.length === 0) continue;
    const [, first, ...tokens] = line.split(" ");
    tokens.forEach((token, i) => lines.push(`${token} ${Number(first) + i}`));
  }
  return lines.join("\n") + "\n";
}

// Texts with the special tokens of this rank file, whose reserved names depend on n.
function specialTexts(n, names) {
  const reserved = (k) => `<|reserved_token_${n + k}|>`;
  return [
    `${names[0]}${reserved(5)}x${names[255]}`,
    `${reserved(100)} 中文 ${reserved(100)}${reserved(101)}\n${reserved(253)}`,
    `not special: <|reserved_token_${n - 1}|> <|reserved_token_${n + kReservedSpecialTokens}|> <|reserved_token_${n}| ${reserved(16)}`,
    `${names[10]}system${names[17]}Kimi${names[2]}${names[3]}user${names[17]}DON'T 你好${names[2]}${names[4]}assistant${names[17]}`,
    `${names[11]}${names[13]}functions.get_weather:0${names[14]}{"city": "北京"}${names[15]}${names[12]}${names[9]}`,
  ];
}

export function writeKimiReference({ require, modules, corpus, outDir }) {
  const { Tiktoken } = require("tiktoken/lite");
  const o200k = require("tiktoken/encoders/o200k_base.json");
  const version = JSON.parse(readFileSync(join(modules, "tiktoken", "package.json"), "utf8")).version;

  const modelDir = join(outDir, "kimi");
  mkdirSync(modelDir, { recursive: true });
  const tiktokenModel = toTiktokenModel(o200k.bpe_ranks);
  writeFileSync(join(modelDir, "tiktoken.model"), tiktokenModel);
  const n = tiktokenModel.split("\n").filter((line) => line.length > 0).length;

  const names = Array.from({ length: kReservedSpecialTokens }, (_, k) => `<|reserved_token_${n + k}|>`);
  const decoder = {};
  for (const [k, content, special = true] of kNamed) {
    names[k] = content;
    decoder[String(n + k)] = { content, lstrip: false, normalized: false, rstrip: false, single_word: false, special };
  }
  // As Kimi's file, with pad_token in the {"content": ...} form HF also writes.
  const config = {
    added_tokens_decoder: decoder,
    additional_special_tokens: ["<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|start_header_id|>",
                                "<|end_header_id|>", "[EOT]", "<|im_system|>", "<|im_middle|>"],
    bos_token: "[BOS]",
    clean_up_tokenization_spaces: false,
    eos_token: "[EOS]",
    model_max_length: 1048576,
    pad_token: { content: "[PAD]", lstrip: false, normalized: false, rstrip: false, single_word: false, special: true },
    tokenizer_class: "TikTokenTokenizer",
    unk_token: "[UNK]",
  };
  writeFileSync(join(modelDir, "tokenizer_config.json"), JSON.stringify(config, null, 2));

  // The reference reads the very tiktoken.model file lineage loads.
  const specials = Object.fromEntries(names.map((name, k) => [name, n + k]));
  const enc = new Tiktoken(readFileSync(join(modelDir, "tiktoken.model"), "utf8"), specials, kKimiPattern);
  const texts = [
    ...corpus,
    ...specialTexts(n, names).map((text, index) => ({ file: "kimi_specials", index, text })),
  ];
  const segments = texts.map(({ file, index, text }) => {
    // allowed_special "all" is Kimi's encode(allow_special_tokens=True); ([], []) its False: every
    // special token's text is ordinary text.
    const entry = { file, index, text, ids: Array.from(enc.encode(text, "all")) };
    const ordinary = Array.from(enc.encode(text, [], []));
    if (ordinary.length !== entry.ids.length || ordinary.some((id, i) => id !== entry.ids[i])) entry.ids_ordinary = ordinary;
    return entry;
  });
  enc.free();

  writeFileSync(
    join(outDir, "kimi_expected.json"),
    JSON.stringify({
      reference: `npm tiktoken ${version} (Rust tiktoken in WASM), o200k_base ranks, Kimi's pat_str and special tokens`,
      n_ranks: n,
      bos_id: n, eos_id: n + 1, pad_id: n + 255,
      segments,
    }),
  );
  return { segments: segments.length, tokens: segments.reduce((s, e) => s + e.ids.length, 0) };
}
