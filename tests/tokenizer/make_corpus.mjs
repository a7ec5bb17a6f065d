// Builds tests/tokenizer/corpus/*.txt, the text the tokenizer parity tests (GPT-2, Kimi) run over.
// Usage: node make_corpus.mjs   (run once on a Debian machine; the output is committed, so the
// sources below only need to exist where it is regenerated). Deterministic for the same sources.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

// Keep in step with reference_tokenize.mjs.
const kSegmentDelimiter = "\n=== lineage-tokenizer-segment ===\n";
const here = dirname(fileURLToPath(import.meta.url));
const outDir = join(here, "corpus");

// mulberry32: small seeded generator, so the corpus does not change between runs.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const pick = (r, xs) => xs[Math.floor(r() * xs.length)];
const int = (r, lo, hi) => lo + Math.floor(r() * (hi - lo + 1));

// Cuts text into ~target-byte segments at line ends; the segments concatenate to the text.
function chunk(text, target) {
  const out = [];
  let start = 0;
  while (start < text.length) {
    let end = Math.min(text.length, start + target);
    const nl = text.indexOf("\n", end);
    end = nl < 0 ? text.length : nl + 1;
    out.push(text.slice(start, end));
    start = end;
  }
  return out;
}

function readSource(path) {
  if (!existsSync(path)) throw new Error(`make_corpus: source ${path} is missing on this machine`);
  return readFileSync(path, "utf8").replaceAll(kSegmentDelimiter, "\n");
}

function writeCorpus(name, segments) {
  for (const s of segments) {
    if (s.includes(kSegmentDelimiter)) throw new Error(`make_corpus: a ${name} segment holds the delimiter`);
  }
  const text = segments.join(kSegmentDelimiter);
  writeFileSync(join(outDir, name), text);
  console.log(`${name}: ${segments.length} segments, ${Buffer.byteLength(text)} bytes`);
}

// English prose: licences and documentation shipped with Debian.
function prose() {
  const sources = [
    "/usr/share/common-licenses/GPL-3",
    "/usr/share/common-licenses/Apache-2.0",
    "/usr/share/common-licenses/MPL-2.0",
    "/usr/share/common-licenses/Artistic",
    "/usr/share/common-licenses/LGPL-2.1",
    "/usr/share/common-licenses/GFDL-1.3",
    "/usr/share/common-licenses/BSD",
    "/usr/share/doc/dpkg/spec/triggers.txt",
    "/usr/share/doc/dpkg/spec/rootless-builds.txt",
    "/usr/share/doc/base-files/README.FHS",
  ];
  return sources.flatMap((p) => chunk(readSource(p), 2500));
}

// Code: C and C++ headers, Python modules, shell scripts (tabs, indentation, operators).
function code() {
  const sources = [
    "/usr/include/stdio.h",
    "/usr/include/string.h",
    "/usr/include/c++/12/bits/stl_pair.h",
    "/usr/lib/python3.11/textwrap.py",
    "/usr/lib/python3.11/json/decoder.py",
    "/usr/lib/python3.11/shlex.py",
    "/usr/lib/python3.11/calendar.py",
    "/usr/bin/bzgrep",
    "/usr/bin/bashbug",
  ];
  return sources.flatMap((p) => chunk(readSource(p), 2500));
}

// Scripts other than Latin: the Chinese seed worklog plus seeded sentences from word lists.
const kWords = {
  ru: "привет мир это пример текста который мы используем для проверки токенизатора Москва Россия большой маленький красивый город река время человек работа слово жизнь день рука год".split(" "),
  el: "καλημέρα κόσμε αυτό είναι ένα παράδειγμα κειμένου Αθήνα θάλασσα ήλιος άνθρωπος χρόνος λόγος ψυχή φως νερό ουρανός Ελλάδα".split(" "),
  ar: "مرحبا بالعالم هذا مثال على نص عربي القاهرة كتاب مدرسة بيت شمس قمر ماء سماء الحياة العلم الوقت اللغة".split(" "),
  he: "שלום עולם זהו טקסט לדוגמה ירושלים ספר בית שמש ירח מים שמיים חיים זמן שפה אהבה".split(" "),
  hi: "नमस्ते दुनिया यह एक उदाहरण पाठ है भारत दिल्ली किताब घर सूरज चाँद पानी आकाश जीवन समय भाषा प्यार".split(" "),
  ko: "안녕하세요 세계 이것은 예시 텍스트입니다 서울 한국 책 집 해 달 물 하늘 생활 시간 언어 사랑".split(" "),
  ja: ["こんにちは", "世界", "これは", "日本語の", "例文です", "東京", "本", "家", "太陽", "月", "水", "空", "カタカナ", "テスト", "ひらがな", "漢字"],
  th: ["สวัสดี", "ชาวโลก", "นี่คือ", "ตัวอย่าง", "ข้อความ", "ภาษาไทย", "กรุงเทพ", "หนังสือ", "บ้าน", "น้ำ", "ท้องฟ้า", "เวลา"],
  zh: ["你好", "世界", "这是", "一个", "例子", "北京", "上海", "模型", "注意力", "线性", "缓存", "状态", "参数"],
  de: "Größe Straße Übung Äpfel Öl über schön Mädchen Fußgängerzone Donaudampfschifffahrt".split(" "),
  vi: "Tiếng Việt người nước thời gian ngôn ngữ Hà Nội xin chào thế giới".split(" "),
};
const kSpaced = new Set(["ru", "el", "ar", "he", "hi", "ko", "de", "vi"]);
const kStops = { zh: ["。", "，", "！", "？"], ja: ["。", "、", "！"], ar: [".", "،", "؟"], hi: ["।", ",", "?"], th: [" ", ""] };
const kDigits = ["٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９", "0123456789", "๐๑๒๓๔๕๖๗๘๙"];

function sentence(r, lang) {
  const words = Array.from({ length: int(r, 3, 12) }, () => pick(r, kWords[lang]));
  if (r() < 0.3) words.splice(int(r, 0, words.length), 0, Array.from({ length: int(r, 1, 5) }, () => pick(r, [...pick(r, kDigits)])).join(""));
  const sep = kSpaced.has(lang) ? " " : "";
  const stops = kStops[lang] ?? [".", ",", "!", "?", ";"];
  let s = words.join(sep) + pick(r, stops);
  if (r() < 0.5) s = s[0].toUpperCase() + s.slice(1);
  return s;
}

function multilingual() {
  const r = rng(20240601);
  const segments = chunk(readSource(join(here, "../../../shared/seeds/002_f428ab2214203eac.txt")), 2000);
  const langs = Object.keys(kWords);
  for (let i = 0; i < 40; i++) {
    const lines = [];
    for (let n = int(r, 5, 25); n > 0; n--) {
      const mix = r() < 0.2;
      const lang = pick(r, langs);
      lines.push(mix ? `${sentence(r, lang)} ${sentence(r, pick(r, langs))} (${sentence(r, "de")})` : sentence(r, lang));
    }
    segments.push(lines.join(pick(r, ["\n", " ", "\n\n", "  "])) + pick(r, ["", "\n"]));
  }
  return segments;
}

// Hand-written cases for every branch of the GPT-2 pre-tokenizer and its Unicode classes.
const kEdgeCases = [
  "Hello world",
  "hello world",
  " hello world ",
  "I'm sure you'll see they've said it's John's and we'd do what they're doing.",
  "I'M SURE YOU'LL SEE THEY'VE SAID IT'S JOHN'S AND WE'D DO WHAT THEY'RE DOING.",
  "It'S a mix: 'S 'T 'RE 'VE 'M 'LL 'D vs 's 't 're 've 'm 'll 'd, and ''s '''ll 'x 'sx 's's",
  "don't won't can't shan't y'all o'clock rock'n'roll O'Neil 'tis 'twas ' s '\ns 'ss 'lll",
  "curly apostrophes: it’s don’t they’re ‘quoted’ «guillemets» „low“",
  "Numbers: 0 1 12 123 1234 12345 123456789012345678901234567890 3.14159 -2.5e-10 1,000,000 $1,234.56 50% 0x1F 0b1010 1e9",
  "Dates: 2024-01-15 15/01/2024 01.15.2024 12:30:45 2024-01-15T12:30:45Z Mon, 15 Jan 2024 12:30:45 +0100",
  "Ordinals and mixed: 1st 2nd 3rd 4th 21st a1b2c3 x86_64 utf8 v1.2.3-rc.4+build.5 ISO8601 A4 3D 4K",
  "Other numerals: ½ ¾ ² ³ ¹ ⁴ ₁₂ Ⅻ ⅻ Ⅳ ① ⑳ ٣٤٥ ۱۲۳ ४५६ ０１２ ౧౨ 〇 一二三",
  "Punctuation runs: !!! ??? ... ,,, ;;; ::: --- ___ === +++ *** ### $$$ %%% ^^^ &&& ||| ~~~ ``` ''' \"\"\" ((( ))) [[[ ]]] {{{ }}} <<< >>> /// \\\\\\",
  "Mixed punctuation: ?!.,;:-_=+*#$%^&|~`'\"()[]{}<>/\\ a-b a_b a.b a/b a\\b a@b.c #tag @user ~/path ../up ./here",
  "Operators: a+=b; c->d; e::f; g<<=h; i>>>j; k!==l; m===n; o&&p||q; r?.s ?? t; u**v; w//x; y:=z; => -> <= >= != ==",
  "tabs\tbetween\twords\t\tand\t\t\ttrailing\t",
  "spaces  between   words    and     trailing     ",
  "   leading spaces",
  "\n\nleading newlines",
  "trailing newlines\n\n\n",
  "windows\r\nline\r\nendings\r\n\r\n",
  "old mac\rline\rendings\r",
  "vertical\vtab and form\ffeed \v\f mixed",
  "mixed \t \n \r\n \t\t  \n  x",
  "no-break\u00a0space\u00a0\u00a0two and ideographic\u3000space\u3000\u3000x",
  "unicode spaces:\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a|\u202f|\u205f|\u1680|",
  "line\u2028separator and paragraph\u2029separator",
  "byte order mark \ufeffinside and at\ufeff\ufeff the end\ufeff",
  "not spaces in ECMAScript: next line \u0085 zero width \u200b joiner \u200d non-joiner \u200c mongolian \u180e word joiner \u2060",
  "space then other: ( ) [ ] ' \" !? ¿¡ — – … · • ° § ¶ † ‡",
  "space before number 1 and space before letter a and space before emoji 😀 and space before mark \u0301x",
  "   \n   \n\t\n  ",
  " ",
  "  ",
  "\n",
  "\t",
  "a",
  "'",
  "'s",
  " 's",
  "x  ",
  "x \n",
  "Emoji: 😀 😃 😄 😁 😆 🙂 🙃 😉 👍 👍🏻 👍🏼 👍🏽 👍🏾 👍🏿 🤷‍♀️ 🤷🏽‍♂️ 👨‍👩‍👧‍👦 👩‍❤️‍💋‍👨 🏳️‍🌈 🏴‍☠️ 🇯🇵 🇺🇸 🇪🇺 1️⃣ #️⃣ ©️ ®️ ™️ ❤️ ✨🔥💯",
  "Emoji glued:😀😀😀abc😀123😀   😀\n😀\t😀",
  "Combining: e\u0301 a\u0300 o\u0308 n\u0303 c\u0327 u\u030a i\u0302\u0323 Z\u0351\u0308\u034c\u0352\u0306a\u0314\u0350l\u0346g\u0357o\u0300\u0301\u0302\u0303",
  "Precomposed vs decomposed: é é ñ ñ Å Å ǅ ǈ ǋ ﬁ ﬂ ß ẞ İ ı",
  "Hangul jamo: \u1100\u1161\u11a8 \u1112\u1161\u11ab and syllables 각 한",
  "Mathematical: ∀x∈ℝ: x² ≥ 0, ∑ᵢ aᵢ = ∫₀¹ f(x) dx, √2 ≈ 1.41421356, ∞ ≠ ℵ₀, 𝔸𝔹ℂ 𝒜ℬ𝒞 𝐀𝐁𝐂",
  "Currency: $ € £ ¥ ₹ ₽ ₩ ₿ ¢ 100€ €100 ¥500 ₹1,00,000",
  "Box drawing: ┌─┬─┐ │ │ │ ├─┼─┤ └─┴─┘ ░▒▓█ ■□▪▫",
  "Private use and rare: \ue000 \uf8ff \u{f0000} \u{10fffd} \u{1d11e} \u{1f9ea} \u{20000}\u{2a6d6} \u{31350}",
  "Specials inside: a<|endoftext|>b",
  "<|endoftext|>",
  "<|endoftext|><|endoftext|>",
  " <|endoftext|> ",
  "text before\n<|endoftext|>\ntext after",
  "almost special: <|endoftext| <|endoftext|>> <<|endoftext|> <|endofline|> <|ENDOFTEXT|> <| endoftext |>",
  "<|endoftext|>The next document starts here.\n\n<|endoftext|>",
  "Story one ends.<|endoftext|>Story two begins'll 's <|endoftext|>   <|endoftext|>\t<|endoftext|>\n",
  "URLs: https://example.com/path?query=1&b=2#frag http://a.b/c_d-e~f user@example.org ftp://x.y:21/z",
  "JSON: {\"name\": \"lineage\", \"version\": [0, 1, 0], \"ok\": true, \"nested\": {\"a\": null, \"b\": -1.5e+3}}",
  "Markdown: # Title\n\n## Subtitle\n\n- item *one*\n- item **two**\n  1. nested `code`\n\n> quote\n\n```cpp\nint main() { return 0; }\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n",
  "HTML: <div class=\"x\" id='y'>Hello&nbsp;&amp;&lt;world&gt;</div><br/><!-- comment -->",
  "ALL CAPS SHOUTING AND CamelCaseWords and snake_case_words and kebab-case-words and SCREAMING_SNAKE_CASE",
  // Kimi's pattern (tiktoken): case-insensitive contractions, Han runs, the letter categories, marks.
  "Mixed-case contractions: DON'T Don't dOn'T I'M i'M YOU'RE you'Re WE'VE we'vE SHE'LL she'lL HE'D he'D IT'S it'S",
  "Contraction edges: rock'N'roll O'NEIL 'S'T 'Re 'vE l'\u017f it'\u017f x'\u017ft '\u017f ABC'\u017f 'K 'SS a''s",
  "Han and kana: 東京タワーは333メートルです。日本語とカタカナ、ひらがな々〆〇；中文，标点！“引号”《书名》",
  "Han next to others: 中文abc ABC中文 a中b 中1中 中 文 〇一二三 々々 ⺀⺁ 㐀 \u{20000}x \u{2ebf0} 'll中 中's",
  "Korean and kana runs: 한국어 문장입니다. 한글과English와漢字 ハングル カタカナーー ｶﾀｶﾅ ㄱㄴㄷ",
  "Titlecase and modifier letters: ǅemal ǈubljana ǋ ʰʲʷ ˈstress ᴬᴮ ǅǅǅ aʰb ʰA Aʰ ǅA ǅa ᾈ ᾈa",
  "Marks: e\u0301cole E\u0301COLE \u0301start x\u0300\u0301\u0302y \u0301\u0301 \u0301A A\u0301B हिन्दी ภาษาไทย Z\u0351a",
  "Digit runs: 1 12 123 1234 12345 123456 1234567 ٣٤٥٦٧ １２３４５ 1٢3４5 x1234y 12ab34",
  "Lines: a\n\nb \n\n c\r\n\r\nd \t\n\t e\n \n f \u0085g\u0085 \u2028h x!!\n\ny ?\r\n",
  "Kimi chat: <|im_system|>system<|im_middle|>You are Kimi.<|im_end|><|im_user|>user<|im_middle|>你好！DON'T<|im_end|><|im_assistant|>assistant<|im_middle|>",
  "[BOS]Hello world[EOS] [EOT] <|tool_calls_section_begin|><|tool_call_begin|>f<|tool_call_end|><|tool_calls_section_end|>",
  "Almost Kimi specials: [BOS [EOS]] [[BOS]] <|im_end| <|IM_END|> <|im_end|>> [bos] [EOS][EOS]",
];

function longRuns() {
  return [
    " ".repeat(700),
    " ".repeat(300) + "x" + " ".repeat(300),
    "\n".repeat(200) + "end",
    "\t".repeat(64) + "x\t",
    "a".repeat(500),
    "ab".repeat(250),
    "=".repeat(300),
    "-".repeat(80) + "\n" + "#".repeat(80) + "\n",
    "😀".repeat(100),
    "中".repeat(300),
    "漢字かなカナ".repeat(40),
    "1234567890".repeat(40),
    "Supercalifragilisticexpialidocious".repeat(10),
    "pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism floccinaucinihilipilification",
  ];
}

// Random strings over a pool of characters from every class the pre-tokenizer distinguishes.
const kPool = [
  ..."abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
  ..."0123456789",
  ..."'''''sstlmdrevSTLMDREV",
  ..."     \t\n\r\v\f",
  "\u00a0", "\u3000", "\u2028", "\u2029", "\ufeff", "\u0085", "\u200b", "\u200d", "\u2003", "\u202f",
  ..."!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~",
  ..."éñüßøåçÆŒ",
  ..."中文日本語한국어ไทยعربيעבריתहिंदीРусскийΕλληνικά",
  ..."½²³Ⅻ①٣४０",
  "\u0301", "\u0308", "\u20e3", "\ufe0f",
  "😀", "👍", "🏽", "👨", "👩", "🇯", "🇵", "❤", "𝔸", "\u{20000}",
  "<|endoftext|>",
];

function fuzz() {
  const r = rng(1234567);
  const segments = [];
  for (let i = 0; i < 150; i++) {
    const n = int(r, 50, 400);
    let s = "";
    for (let k = 0; k < n; k++) {
      // Bias towards runs of one kind so that long matches and backtracking both happen.
      const c = pick(r, kPool);
      s += r() < 0.2 ? c.repeat(int(r, 2, 6)) : c;
    }
    segments.push(s);
  }
  return segments;
}

// Random strings over the classes Kimi's pattern tells apart (after fuzz(), which stays as it was).
const kKimiPool = [
  ..."abcxyzABCXYZ", ..."0123456789", ..."''''sStTmMdDrReEvVlL", "\u017f",
  ..."   \t\n\r\n", "\u0085", "\u00a0", "\u3000", "\u2028",
  ..."中文漢字東京", ..."ひらがなカタカナー", ..."한국어", ..."ǅǈʰʲˈ", "\u0301", "\u0308", "\u3005", "\u3007",
  ..."!?.,;:-_()[]<>|", ..."。，！？「」", "😀", "\u{20000}",
  "[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_middle|>",
];

function fuzzKimi() {
  const r = rng(7654321);
  const segments = [];
  for (let i = 0; i < 60; i++) {
    const n = int(r, 30, 300);
    let s = "";
    for (let k = 0; k < n; k++) {
      const c = pick(r, kKimiPool);
      s += r() < 0.25 ? c.repeat(int(r, 2, 5)) : c;
    }
    segments.push(s);
  }
  return segments;
}

mkdirSync(outDir, { recursive: true });
writeCorpus("prose.txt", prose());
writeCorpus("code.txt", code());
writeCorpus("multilingual.txt", multilingual());
writeCorpus("edge_cases.txt", [...kEdgeCases, ...longRuns()]);
writeCorpus("fuzz.txt", [...fuzz(), ...fuzzKimi()]);
