// Room chat/: the chat-template engine: a model's Jinja template lexed (lex), parsed (parse, ast),
// and evaluated over Jinja values (value, eval, ops, calls, builtins, text), and the rendering API
// of this file that `lineage chat` and the server call. Uses tokenizer (to encode a rendered chat)
// and core.
//
// Chat templates: a model's own Jinja `chat_template` (tokenizer_config.json or chat_template.jinja)
// rendered by a documented subset of Jinja (docs/chat-templates.md), byte-identical to
// @huggingface/jinja (the Jinja transformers.js applies templates with) on the templates of
// tests/chat_template/templates; a model without one gets render_plain_chat.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace lineage::tokenizer {
class Tokenizer;  // lineage/tokenizer/tokenizer.h
}

namespace lineage::chat {

struct ChatMessage {
  std::string role, content;
};

namespace jinja {
struct Program;  // ast.h
}

class ChatTemplate {
 public:
  // Bounds on one render, so that no template (a fuzzer's included) loops forever, recurses past the
  // stack or fills memory; each is an Error naming the template when reached.
  struct Limits {
    int64_t max_steps = 20'000'000;          // expressions evaluated + statements run + bytes built / 256
    int max_depth = 400;                     // nested evaluation (macro calls, nested expressions)
    int64_t max_bytes = int64_t(1) << 30;    // the longest string or output, in bytes
    int64_t max_items = int64_t(1) << 24;    // the longest list (range(), +, *)
  };

  // DIR/chat_template.jinja, else tokenizer_config.json's chat_template (a string, or a list of
  // {name, template} of which the one named "default" is taken), else nullopt (no template).
  // bos_token / eos_token come from tokenizer_config.json when it exists (a string or {"content": ...}).
  static std::optional<ChatTemplate> from_model_dir(const std::filesystem::path& dir);

  // Parses `source`; syntax outside the subset is an Error naming `where`, the line and the construct.
  ChatTemplate(std::string source, std::string where);
  // The same with the bos / eos token strings render() passes (a GGUF file's template and tokens).
  ChatTemplate(std::string source, std::string where, std::string bos_token, std::string eos_token);

  // Renders with messages = [{role, content}], add_generation_prompt, bos_token and eos_token (the
  // tokenizer's special-token strings); `tools` is left undefined.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const std::string& bos, const std::string& eos) const;
  // The same with the bos/eos strings read by from_model_dir (empty for a template built from source).
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  // Any variables, as transformers' apply_chat_template passes them: messages with tool_calls, tools,
  // documents, enable_thinking... Object key order is kept (it shows in tojson).
  std::string render_context(const nlohmann::ordered_json& variables) const;

  // Variables every render() passes besides messages, add_generation_prompt and the bos / eos
  // tokens, as transformers' apply_chat_template passes its keyword arguments: {"enable_thinking":
  // false} for Qwen3's and Qwen3.5's templates (`lineage chat --template-kwargs`). An object.
  void set_variables(nlohmann::ordered_json variables) { variables_ = std::move(variables); }
  const nlohmann::ordered_json& variables() const { return variables_; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  const std::string& source() const { return source_; }
  const std::string& where() const { return where_; }  // file (and field) the template came from
  void set_limits(const Limits& limits) { limits_ = limits; }

 private:
  std::string source_, where_, bos_token_, eos_token_;
  nlohmann::ordered_json variables_ = nlohmann::ordered_json::object();
  std::shared_ptr<const jinja::Program> program_;  // immutable once parsed; copies share it
  Limits limits_;
};

// The plain format for a model without a template (GPT-2): each message as "role: content\n\n",
// then "assistant:" when add_generation_prompt is set.
std::string render_plain_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt);

// A conversation's prompt ids: rendered with `tmpl` (which writes the BOS token itself where its
// model wants one), or with render_plain_chat when there is none, and then the tokenizer's BOS in
// front if it adds one.
std::vector<int32_t> encode_chat(const tokenizer::Tokenizer& tok, const ChatTemplate* tmpl, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt);

}  // namespace lineage::chat
