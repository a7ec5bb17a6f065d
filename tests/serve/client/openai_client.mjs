// The official OpenAI client (npm `openai`, pinned in package.json) against a running `lineage serve`:
// what a user of the client does, checked call by call; exits non-zero on the first failure.
// Usage: node openai_client.mjs BASE_URL API_KEY   (run by tests/serve/test_client.py)
import assert from "node:assert/strict";
import OpenAI from "openai";

const [baseURL, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const step = (what) => console.log(`openai_client: ${what}`);

// A wrong key: the client's AuthenticationError (401).
step("a wrong key");
await assert.rejects(new OpenAI({ baseURL, apiKey: apiKey + "x", maxRetries: 0 }).models.list(),
                     (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);

step("models");
const models = await client.models.list();
const model = models.data[0].id;
assert.ok(model);

step("completions");
const c = await client.completions.create({ model, prompt: "The weather today", max_tokens: 5, temperature: 0 });
assert.equal(typeof c.choices[0].text, "string");
assert.ok(c.usage.completion_tokens >= 1 && c.usage.completion_tokens <= 5, "at most max_tokens");
assert.ok(["length", "stop"].includes(c.choices[0].finish_reason));

step("completions with logprobs and echo");
const e = await client.completions.create({ model, prompt: "The weather today", max_tokens: 2, temperature: 0,
                                           logprobs: 2, echo: true });
const lp = e.choices[0].logprobs;
assert.equal(lp.tokens.length, e.usage.prompt_tokens + e.usage.completion_tokens);
assert.equal(lp.token_logprobs[0], null);
assert.ok(lp.token_logprobs.slice(1).every((v) => typeof v === "number" && v <= 0));
assert.ok(e.choices[0].text.startsWith("The weather today"));

step("chat");
const messages = [{ role: "user", content: "Say something." }];
const chat = await client.chat.completions.create({ model, messages, max_tokens: 4, temperature: 0 });
assert.equal(chat.choices[0].message.role, "assistant");
assert.equal(typeof chat.choices[0].message.content, "string");

step("chat streamed, with usage");
const stream = await client.chat.completions.create({ model, messages, max_tokens: 4, temperature: 0, stream: true,
                                                      stream_options: { include_usage: true } });
let streamed = "", usage = null, finish = null;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  for (const ch of chunk.choices) {
    streamed += ch.delta?.content ?? "";
    finish = ch.finish_reason ?? finish;
  }
}
assert.equal(streamed, chat.choices[0].message.content, "the stream spells what the plain reply says");
assert.equal(usage.completion_tokens, chat.usage.completion_tokens);
assert.ok(finish);

step("chat logprobs");
const l = await client.chat.completions.create({ model, messages, max_tokens: 3, temperature: 0, logprobs: true,
                                                top_logprobs: 2 });
assert.equal(l.choices[0].logprobs.content.length, l.usage.completion_tokens);
assert.equal(l.choices[0].logprobs.content[0].top_logprobs.length, 2);

step("tools");
const tools = [{ type: "function", function: { name: "get_weather", description: "The weather in a city",
                                               parameters: { type: "object", properties: { city: { type: "string" } } } } }];
const t = await client.chat.completions.create({ model, messages, tools, max_tokens: 4, temperature: 0 });
assert.ok(["length", "stop", "tool_calls"].includes(t.choices[0].finish_reason));
assert.ok(t.usage.prompt_tokens > chat.usage.prompt_tokens, "the tools are in the prompt");
await assert.rejects(client.chat.completions.create({ model, messages, tools, tool_choice: "required", max_tokens: 2 }),
                     (err) => err instanceof OpenAI.BadRequestError && err.param === "tool_choice");

step("a bad request");
await assert.rejects(client.completions.create({ model, prompt: "x", max_tokens: 2, logprobs: 99 }),
                     (err) => err instanceof OpenAI.BadRequestError && err.param === "logprobs");
console.log("openai_client: every call as expected");
