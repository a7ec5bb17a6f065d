// The OpenAI-compatible request bodies `lineage serve` accepts (POST /v1/completions and
// /v1/chat/completions), checked field by field, and the error objects it answers with.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lineage/chat/chat_template.h"

namespace lineage::serve {

// An error as the OpenAI API reports it: HTTP status, and {"error": {"message", "type", "param",
// "code"}} in the body.
struct ApiError {
  int status = 400;
  std::string message, type = "invalid_request_error", param, code;
  std::string body() const;
};

struct CompletionRequest {
  bool chat = false;
  std::string model;
  std::string prompt;                         // /v1/completions: the text, or
  std::optional<std::vector<int32_t>> prompt_ids;  // the token ids (a prompt given as integers)
  std::vector<chat::ChatMessage> messages;      // /v1/chat/completions
  std::optional<int64_t> max_tokens;          // max_tokens (or max_completion_tokens); none: up to the context
  float temperature = 1.0f, top_p = 1.0f;     // OpenAI's defaults
  int top_k = 0;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;              // up to 4 sequences; the text ends before the first found
  bool stream = false, include_usage = false;  // stream_options.include_usage
  bool ignore_eos = false;                    // llama-server's: keep going past EOS
  bool return_progress = false;               // llama-server's: prefill progress events while streaming
  // Completions: `logprobs: N` (0..20), chat: `logprobs: true` with `top_logprobs: N`: each token's
  // log-probability and N alternatives; -1: none. `echo` (completions): the prompt's text before the
  // completion's, and with logprobs the prompt tokens' too (max_tokens 0 then allowed).
  int logprobs = -1;
  bool echo = false;
  int n = 1;  // samples of the prompt (1 .. 16), each with its own sampler stream; not streamed yet
  // Chat: `tools` (a list of {"type": "function", "function": {...}}, kept as sent; null: none) and
  // the messages as sent (assistant `tool_calls`, `tool` results), for a template that renders them;
  // tool_choice "none" drops the tools from the prompt, "auto" keeps them.
  nlohmann::ordered_json tools, raw_messages;
  // Chat: vLLM's `chat_template_kwargs` (an object of template variables: {"enable_thinking": false}).
  nlohmann::ordered_json template_kwargs;
  // tools given, a message with tool_calls or the tool role, or template kwargs: the messages as sent
  bool uses_tools() const;
};

// A tool call the model wrote, as OpenAI returns it: its function's name and arguments (a JSON text).
struct ToolCall {
  std::string name, arguments;
};
// The model's text split into what it said and the calls it made, in the tool-call syntaxes of the
// model families lineage runs: Qwen's (and Hermes') `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
// blocks, and Kimi's `<|tool_calls_section_begin|> <|tool_call_begin|>functions.NAME:IDX
// <|tool_call_argument_begin|>{...}<|tool_call_end|> ... <|tool_calls_section_end|>` section. A block
// whose JSON does not parse, or lacks a name, stays in the content as text.
struct ParsedReply {
  std::string content;  // the text outside the calls, trimmed
  std::vector<ToolCall> calls;
};
ParsedReply parse_tool_calls(const std::string& text);

// Parses a request body. Throws ApiError (400) for a body that is not a JSON object, a missing
// prompt or messages, a known field of the wrong type or out of range (naming the field), n other
// outside 1 .. 16, echo or n > 1 with stream (not streamed yet). Fields it does not know (frequency_penalty, user, ...) are ignored, as OpenAI clients send
// many; the ones that would change the result and cannot be honored are refused.
CompletionRequest parse_request(std::string_view body, bool chat);

// Holds back text that may be the start of a stop sequence until the next tokens tell, so a stream
// never shows a stop sequence or a piece of one.
class StopFilter {
 public:
  explicit StopFilter(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Appends text; returns what may be shown now. stopped() turns true once a stop sequence is
  // complete (the text before it is returned, nothing after).
  std::string push(std::string_view text);
  std::string flush();  // the held-back rest at the end (no stop sequence found)
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace lineage::serve
