#include "lineage/chat/chat_template.h"

#include <system_error>

#include "lineage/core/error.h"
#include "lineage/chat/ast.h"
#include "lineage/chat/eval.h"
#include "lineage/core/json_read.h"
#include "lineage/tokenizer/tokenizer.h"

namespace lineage::chat {

namespace fs = std::filesystem;

namespace {

// bos_token / eos_token: a string, an AddedToken {"content": ...}, null or absent ("").
std::string special_token(const nlohmann::json& config, const std::string& key, const fs::path& path) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    const auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  throw Error(cat(path.string(), ": field ", key, " is ", it->type_name(),
                  "; expected a string or an object with a string \"content\""));
}

// tokenizer_config.json's chat_template: a string, or [{"name": ..., "template": ...}] of which
// transformers uses "default".
std::optional<std::pair<std::string, std::string>> config_template(const nlohmann::json& config, const fs::path& path) {
  const auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return std::make_pair(it->get<std::string>(), cat(path.string(), " field chat_template"));
  if (!it->is_array())
    throw Error(cat(path.string(), ": field chat_template is ", it->type_name(),
                    "; expected a string or a list of {\"name\", \"template\"}"));
  std::string names;
  for (size_t k = 0; k < it->size(); ++k) {
    const nlohmann::json& entry = (*it)[k];
    const auto name = entry.is_object() ? entry.find("name") : entry.end();
    const auto text = entry.is_object() ? entry.find("template") : entry.end();
    if (!entry.is_object() || name == entry.end() || !name->is_string() || text == entry.end() || !text->is_string())
      throw Error(cat(path.string(), ": field chat_template[", k, "] is not {\"name\": string, \"template\": string}"));
    if (name->get<std::string>() == "default")
      return std::make_pair(text->get<std::string>(), cat(path.string(), " field chat_template[", k, "] (\"default\")"));
    names += (names.empty() ? "" : ", ") + name->get<std::string>();
  }
  throw Error(cat(path.string(), ": field chat_template lists templates named ", names.empty() ? "(none)" : names,
                  " but none named \"default\"\nHINT: lineage renders the default template; rename one to \"default\""));
}

}  // namespace

std::optional<ChatTemplate> ChatTemplate::from_model_dir(const fs::path& dir) {
  std::error_code ec;
  const fs::path config_path = dir / "tokenizer_config.json";
  const fs::path jinja_path = dir / "chat_template.jinja";
  nlohmann::json config = nlohmann::json::object();
  const bool has_config = fs::exists(config_path, ec);
  if (has_config) {
    config = read_json_file(config_path);
    if (!config.is_object()) throw Error(cat(config_path.string(), ": is ", config.type_name(), "; expected a JSON object"));
  }
  std::optional<ChatTemplate> out;
  if (fs::exists(jinja_path, ec)) {
    out.emplace(read_file_text(jinja_path), jinja_path.string());
  } else if (has_config) {
    if (auto found = config_template(config, config_path)) out.emplace(std::move(found->first), std::move(found->second));
  }
  if (out && has_config) {
    out->bos_token_ = special_token(config, "bos_token", config_path);
    out->eos_token_ = special_token(config, "eos_token", config_path);
  }
  return out;
}

ChatTemplate::ChatTemplate(std::string source, std::string where)
    : source_(std::move(source)), where_(std::move(where)), program_(jinja::parse_program(source_, where_)) {}

ChatTemplate::ChatTemplate(std::string source, std::string where, std::string bos_token, std::string eos_token)
    : ChatTemplate(std::move(source), std::move(where)) {
  bos_token_ = std::move(bos_token);
  eos_token_ = std::move(eos_token);
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                 const std::string& bos, const std::string& eos) const {
  nlohmann::ordered_json variables = variables_;  // the extra ones first: the conversation's own win
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
  variables["messages"] = std::move(list);
  variables["add_generation_prompt"] = add_generation_prompt;
  variables["bos_token"] = bos;
  variables["eos_token"] = eos;
  return render_context(variables);
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  return render(messages, add_generation_prompt, bos_token_, eos_token_);
}

std::string ChatTemplate::render_context(const nlohmann::ordered_json& variables) const {
  jinja::Renderer renderer(*program_, limits_);
  return renderer.render(variables);
}

std::string render_plain_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out;
  for (const ChatMessage& m : messages) out += m.role + ": " + m.content + "\n\n";
  if (add_generation_prompt) out += "assistant:";
  return out;
}

std::vector<int32_t> encode_chat(const tokenizer::Tokenizer& tok, const ChatTemplate* tmpl, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) {
  if (tmpl) return tok.encode(tmpl->render(messages, add_generation_prompt));
  std::vector<int32_t> ids = tok.encode(render_plain_chat(messages, add_generation_prompt));
  if (tok.adds_bos() && tok.bos_id()) ids.insert(ids.begin(), *tok.bos_id());
  return ids;
}

}  // namespace lineage::chat
