// Reference chat-template renders for lineage's chat-template tests (a CTest fixture).
// Usage: node render_reference.mjs OUT_FILE
//   Renders every templates/*.jinja beside this script with @huggingface/jinja (the Jinja that
//   transformers.js applies chat templates with; node_modules here, from `npm ci`) over the
//   conversations below, and writes OUT_FILE: {reference, cases: [{template, name, context,
//   expected | error}]}. A case whose render throws keeps the reference's message as `error`:
//   lineage must refuse it too (raise_exception in Mixtral's template, for one).
import { existsSync, mkdirSync, readFileSync, readdirSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

function fail(message) {
  console.error(`render_reference: ${message}`);
  process.exit(1);
}

const here = dirname(fileURLToPath(import.meta.url));
const [outArg] = process.argv.slice(2);
if (!outArg) fail("usage: node render_reference.mjs OUT_FILE");
const outFile = resolve(outArg);

const pkgDir = join(here, "node_modules", "@huggingface", "jinja");
if (!existsSync(join(pkgDir, "package.json"))) {
  fail(`${pkgDir} is missing.\nHINT: run \`npm ci\` in ${here} first (scripts/install-deps.sh --test does).`);
}
const version = JSON.parse(readFileSync(join(pkgDir, "package.json"), "utf8")).version;
const { Template } = await import(pathToFileURL(join(pkgDir, "dist", "index.js")).href);

// The special tokens each family's tokenizer_config.json names (what ChatTemplate passes as
// bos_token / eos_token); templates not listed get <s> and </s>.
const kTokens = {
  "kimi-": ["[BOS]", "[EOS]"],
  "llama-3": ["<|begin_of_text|>", "<|eot_id|>"],
  "qwen": ["", "<|im_end|>"],
  "deepseek": ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"],
};
function tokensFor(template) {
  for (const [prefix, tokens] of Object.entries(kTokens)) if (template.startsWith(prefix)) return tokens;
  return ["<s>", "</s>"];
}

const sys = (content) => ({ role: "system", content });
const user = (content) => ({ role: "user", content });
const asst = (content) => ({ role: "assistant", content });

// Plain conversations: what `lineage chat` passes (role + string content).
const kConversations = {
  system_user: [sys("You are a helpful assistant."), user("Hello! Who are you?")],
  user_only: [user("What is 2 + 2?")],
  multi_turn: [
    sys("Answer briefly."),
    user("Name a prime number."),
    asst("7"),
    user("And an even one?"),
  ],
  no_system_multi_turn: [user("Hi"), asst("Hello, how can I help?"), user("Tell me a joke."), asst("Why did the chicken cross the road?")],
  unicode: [
    sys("Réponds en français, s'il te plaît."),
    user("日本語で「こんにちは」は？ Emoji: 😀🚀 — Ünïcödé, עברית, Ελληνικά"),
  ],
  special_characters: [
    user("Jinja must not run this: {{ messages }} {% if true %}x{% endif %} {# c #}"),
    asst('Quotes \' and " and a backslash \\ and <|im_end|> stay as text.'),
    user("Tabs\tand\nnewlines\n\n  and   spaces  "),
  ],
  whitespace_padding: [sys("  padded system  \n"), user("\n  padded user\t ")],
  think_tags: [user("Solve it."), asst("<think>\nreasoning here\n</think>\n\nThe answer is 4."), user("Thanks")],
};

// Richer contexts through ChatTemplate::render_context: tools, tool calls and results.
const kTools = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Get the weather for a city",
      parameters: {
        type: "object",
        properties: { city: { type: "string", description: "City name, e.g. Oslo" }, unit: { type: "string", enum: ["c", "f"] } },
        required: ["city"],
      },
    },
  },
];
// Tool-call arguments as a mapping (transformers' convention), or as a JSON string (OpenAI's) for
// the templates that concatenate them as text.
function toolConversation(stringArguments) {
  const args = { city: "Oslo", unit: "c" };
  return [
    user("Weather in Oslo?"),
    {
      role: "assistant",
      content: "",
      tool_calls: [{ id: "call12345", type: "function",
                     function: { name: "get_weather", arguments: stringArguments ? JSON.stringify(args) : args } }],
    },
    { role: "tool", tool_call_id: "call12345", name: "get_weather", content: '{"temp": -3, "sky": "snow"}' },
  ];
}
const kStringArguments = ["deepseek-"];

const templateDir = join(here, "templates");
const templates = readdirSync(templateDir).filter((f) => f.endsWith(".jinja")).sort();
if (templates.length === 0) fail(`no *.jinja files in ${templateDir}`);

const cases = [];
function addCase(template, source, name, context) {
  const entry = { template, name, context };
  try {
    entry.expected = new Template(source).render(context);
  } catch (e) {
    entry.error = String(e && e.message ? e.message : e);
  }
  cases.push(entry);
}

for (const template of templates) {
  const source = readFileSync(join(templateDir, template), "utf8");
  const [bos_token, eos_token] = tokensFor(template);
  for (const [name, messages] of Object.entries(kConversations)) {
    for (const add_generation_prompt of [true, false]) {
      addCase(template, source, `${name}/${add_generation_prompt ? "gen" : "nogen"}`,
              { messages, add_generation_prompt, bos_token, eos_token });
    }
  }
  // transformers' apply_chat_template keyword arguments: Qwen3's thinking switch (ignored elsewhere).
  for (const enable_thinking of [false, true]) {
    addCase(template, source, `thinking/${enable_thinking ? "on" : "off"}`, {
      enable_thinking, messages: kConversations.think_tags, add_generation_prompt: true, bos_token, eos_token,
    });
  }
  addCase(template, source, "tools/declared", {
    messages: kConversations.system_user, tools: kTools, add_generation_prompt: true, bos_token, eos_token,
  });
  addCase(template, source, "tools/call_and_result", {
    messages: toolConversation(kStringArguments.some((p) => template.startsWith(p))), tools: kTools, add_generation_prompt: true, bos_token, eos_token,
  });
}

mkdirSync(dirname(outFile), { recursive: true });
writeFileSync(outFile, JSON.stringify({ reference: `@huggingface/jinja ${version}`, cases }, null, 1) + "\n");
const errors = cases.filter((c) => c.error !== undefined).length;
console.log(`render_reference: ${cases.length} renders of ${templates.length} templates (${errors} refused) -> ${outFile}`);
