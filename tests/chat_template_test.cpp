// Chat templates. The bulk is parity with @huggingface/jinja: every template of
// tests/chat_template/templates over the conversations of render_reference.mjs, whose renders the
// `reference_chat_templates` fixture writes to $LINEAGE_TESTDATA/chat_template/expected.json. The
// rest: the model-directory lookup, the plain fallback, whitespace rules, and errors that name the line.
#include "lineage/chat/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "lineage/core/error.h"
#include "test_support.h"

namespace lineage::chat {
namespace chat_template_test {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

fs::path template_dir() { return lineage::test::source_dir() / "tests" / "chat_template" / "templates"; }

// The message of the Error `f` throws ("" and a test failure when it throws none).
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an Error";
  return "";
}

std::string render(const std::string& source, const ordered_json& variables = ordered_json::object()) {
  return ChatTemplate(source, "test.jinja").render_context(variables);
}

TEST(ChatTemplate, RendersByteIdenticalToHuggingfaceJinja) {
  const fs::path path = lineage::test::testdata() / "chat_template" / "expected.json";
  ASSERT_TRUE(fs::exists(path)) << path << " is missing: run the reference_chat_templates fixture (ctest -R chat)";
  const ordered_json expected = ordered_json::parse(read_text(path));
  std::map<std::string, ChatTemplate> templates;
  std::map<std::string, std::pair<int, int>> passed;  // template -> (passed, cases)
  for (const ordered_json& c : expected.at("cases")) {
    const std::string name = c.at("template").get<std::string>();
    if (!templates.count(name)) templates.emplace(name, ChatTemplate(read_text(template_dir() / name), name));
    const ChatTemplate& t = templates.at(name);
    const std::string label = name + " " + c.at("name").get<std::string>();
    auto& [ok, total] = passed[name];
    ++total;
    if (c.contains("expected")) {
      std::string got;
      try {
        got = t.render_context(c.at("context"));
      } catch (const Error& e) {
        ADD_FAILURE() << label << ": lineage refused what the reference renders: " << e.what();
        continue;
      }
      EXPECT_EQ(got, c.at("expected").get<std::string>()) << label;
      ok += got == c.at("expected").get<std::string>();
    } else {
      // The reference refuses: so must lineage; a raise_exception must carry the template's words.
      const std::string error = error_of([&] { (void)t.render_context(c.at("context")); });
      if (error.find("raised an exception") != std::string::npos) {
        EXPECT_NE(error.find(c.at("error").get<std::string>()), std::string::npos) << label << ": " << error;
      }
      ok += !error.empty();
    }
  }
  EXPECT_GE(templates.size(), 10u);
  for (const auto& [name, counts] : passed) std::cout << "  " << name << ": " << counts.first << "/" << counts.second << "\n";
}

TEST(ChatTemplate, EveryStoredTemplateParses) {
  int n = 0;
  for (const auto& entry : fs::directory_iterator(template_dir())) {
    if (entry.path().extension() != ".jinja") continue;
    EXPECT_NO_THROW(ChatTemplate(read_text(entry.path()), entry.path().filename().string())) << entry.path();
    ++n;
  }
  EXPECT_GE(n, 10);
}

TEST(ChatTemplate, KimiFormatFromMessages) {
  const ChatTemplate t(read_text(template_dir() / "kimi-k2-instruct.jinja"), "kimi-k2-instruct.jinja");
  const std::vector<ChatMessage> messages = {{"system", "Be brief."}, {"user", "Hi"}};
  EXPECT_EQ(t.render(messages, true, "[BOS]", "[EOS]"),
            "<|im_system|>system<|im_middle|>Be brief.<|im_end|><|im_user|>user<|im_middle|>Hi<|im_end|>"
            "<|im_assistant|>assistant<|im_middle|>");
  EXPECT_EQ(t.render(messages, false, "", ""),
            "<|im_system|>system<|im_middle|>Be brief.<|im_end|><|im_user|>user<|im_middle|>Hi<|im_end|>");
}

TEST(ChatTemplate, FromModelDirReadsTheConfigTemplateAndTokens) {
  const fs::path dir = lineage::test::temp_dir();
  EXPECT_FALSE(ChatTemplate::from_model_dir(dir).has_value());  // no files at all
  lineage::test::write_text(dir / "tokenizer_config.json", R"({"bos_token": "<s>", "eos_token": {"content": "</s>", "lstrip": false}})");
  EXPECT_FALSE(ChatTemplate::from_model_dir(dir).has_value());  // a config without a template (GPT-2)

  lineage::test::write_text(dir / "tokenizer_config.json",
                   R"({"chat_template": "{{ bos_token }}{% for m in messages %}{{ m.role }}={{ m.content }};{% endfor %}{{ eos_token }}",
                       "bos_token": "<s>", "eos_token": {"__type": "AddedToken", "content": "</s>"}})");
  std::optional<ChatTemplate> t = ChatTemplate::from_model_dir(dir);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->bos_token(), "<s>");
  EXPECT_EQ(t->eos_token(), "</s>");
  EXPECT_NE(t->where().find("tokenizer_config.json field chat_template"), std::string::npos) << t->where();
  EXPECT_EQ(t->render({{"user", "hi"}}, true), "<s>user=hi;</s>");

  lineage::test::write_text(dir / "tokenizer_config.json",
                   R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ bos_token }}"}],
                       "bos_token": null})");
  t = ChatTemplate::from_model_dir(dir);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->render({}, false), "D");
  EXPECT_EQ(t->bos_token(), "");

  // chat_template.jinja (newer checkpoints) wins over the config's field; the tokens still come from the config.
  lineage::test::write_text(dir / "chat_template.jinja", "J{{ eos_token }}\n");
  lineage::test::write_text(dir / "tokenizer_config.json", R"({"chat_template": "C", "eos_token": "<|im_end|>"})");
  t = ChatTemplate::from_model_dir(dir);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->render({}, false), "J<|im_end|>");
  EXPECT_NE(t->where().find("chat_template.jinja"), std::string::npos);
}

TEST(ChatTemplate, FromModelDirErrorsNameTheFileAndField) {
  const fs::path dir = lineage::test::temp_dir();
  lineage::test::write_text(dir / "tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "T"}]})");
  std::string e = error_of([&] { (void)ChatTemplate::from_model_dir(dir); });
  EXPECT_NE(e.find("tokenizer_config.json"), std::string::npos) << e;
  EXPECT_NE(e.find("chat_template"), std::string::npos) << e;
  EXPECT_NE(e.find("\"default\""), std::string::npos) << e;
  EXPECT_NE(e.find("tool_use"), std::string::npos) << e;

  lineage::test::write_text(dir / "tokenizer_config.json", R"({"chat_template": 7})");
  e = error_of([&] { (void)ChatTemplate::from_model_dir(dir); });
  EXPECT_NE(e.find("field chat_template is number"), std::string::npos) << e;

  lineage::test::write_text(dir / "tokenizer_config.json", R"({"chat_template": "x", "bos_token": 3})");
  e = error_of([&] { (void)ChatTemplate::from_model_dir(dir); });
  EXPECT_NE(e.find("field bos_token"), std::string::npos) << e;

  lineage::test::write_text(dir / "tokenizer_config.json", R"({"chat_template": "line one\n{{ x | nope }}"})");
  e = error_of([&] { (void)ChatTemplate::from_model_dir(dir); });
  EXPECT_NE(e.find("tokenizer_config.json field chat_template:2: unknown filter 'nope'"), std::string::npos) << e;
}

TEST(ChatTemplate, PlainFormatForModelsWithoutATemplate) {
  const std::vector<ChatMessage> messages = {{"system", "Be kind."}, {"user", "Hello"}, {"assistant", "Hi!"}};
  EXPECT_EQ(render_plain_chat(messages, false), "system: Be kind.\n\nuser: Hello\n\nassistant: Hi!\n\n");
  EXPECT_EQ(render_plain_chat({{"user", "Hello"}}, true), "user: Hello\n\nassistant:");
  EXPECT_EQ(render_plain_chat({}, true), "assistant:");
}

TEST(ChatTemplate, WhitespaceRulesOfTransformers) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: indentation before one goes.
  EXPECT_EQ(render("{% if true %}\nX\n  {% endif %}\nY"), "X\nY");
  EXPECT_EQ(render("  {{ 'x' }}\n  {# c #}\nz"), "  x\nz");  // {{ }} is not lstripped
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(render("a\n  {%+ if true %}b{% endif +%}\nc"), "a\n  b\nc");
  EXPECT_EQ(render("a\n"), "a");        // one trailing newline of the source is dropped
  EXPECT_EQ(render("a\n\n"), "a\n");
  EXPECT_EQ(render("{% if true %}\r\nx\r\n{% endif %}"), "x\n");  // CRLF reads as LF
  EXPECT_EQ(render("{{ '}}' }}{{ {'a': {'b': 1}}['a']['b'] }}"), "}}1");
}

TEST(ChatTemplate, ExpressionsFollowJinja) {
  const ordered_json vars = {{"messages", {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "yo"}}}}};
  EXPECT_EQ(render("{{ messages[::-1][0].role }} {{ messages|length - 1 }} {{ messages[1:]|map(attribute='content')|join }}", vars),
            "assistant 1 yo");
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 3 / 2 }} {{ 2 ** 10 }} {{ 1 < 2 < 3 }} {{ 'a' ~ 1 }}"),
            "3 -4 2 1.5 1024 true a1");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in range(5) if i is odd %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"),
            "4");
  EXPECT_EQ(render("{% for k, v in {'b': 1, 'a': 2}.items() %}{{ loop.index }}{{ k }}{{ v }}{% endfor %}"), "1b12a2");
  EXPECT_EQ(render("{% macro m(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(1, b=2) }}"), "[1B][12]");
  EXPECT_EQ(render("{{ '  x  '.strip() }}|{{ 'a,b'.split(',')|length }}|{{ 'héllo'|length }}|{{ 'héllo'|upper }}"),
            "x|2|5|HÉLLO");
  EXPECT_EQ(render("{{ {'b': [1, 'x'], 'a': none}|tojson }}|{{ 'é'|tojson }}|{{ 'é'|tojson(ensure_ascii=true) }}"),
            "{\"b\": [1, \"x\"], \"a\": null}|\"é\"|\"\\u00e9\"");
  EXPECT_EQ(render("{{ [{'a': 1}]|tojson(indent=2) }}"), "[\n  {\n    \"a\": 1\n  }\n]");
  EXPECT_EQ(render("{{ x is defined }} {{ none is none }} {{ 'a' is string }} {{ {} is mapping }} {{ x|default('d') }}"),
            "false true true true d");
}

TEST(ChatTemplate, ErrorsNameTheTemplateAndLine) {
  std::string e = error_of([] { ChatTemplate("line 1\n{{ messages | frobnicate }}", "model/chat_template.jinja"); });
  EXPECT_NE(e.find("model/chat_template.jinja:2: unknown filter 'frobnicate'"), std::string::npos) << e;

  e = error_of([] { ChatTemplate("a\n\n{% for m in messages %}\n{{ m }}", "t.jinja"); });
  EXPECT_NE(e.find("t.jinja:3: {% for %} is never closed (expected {% endfor %})"), std::string::npos) << e;

  e = error_of([] { ChatTemplate("{% if x %}\n{% endfor %}", "t.jinja"); });
  EXPECT_NE(e.find("t.jinja:2: {% endfor %} does not close {% if %} opened at line 1"), std::string::npos) << e;

  e = error_of([] { ChatTemplate("\n{% include 'other.jinja' %}", "t.jinja"); });
  EXPECT_NE(e.find("t.jinja:2: {% include %} is outside the supported Jinja subset"), std::string::npos) << e;

  e = error_of([] { ChatTemplate("{{ x is prime }}", "t.jinja"); });
  EXPECT_NE(e.find("t.jinja:1: unknown test 'prime'"), std::string::npos) << e;

  e = error_of([] { ChatTemplate("{{ 'open", "t.jinja"); });
  EXPECT_NE(e.find("t.jinja:1: string literal is never closed"), std::string::npos) << e;

  e = error_of([] {
    (void)render("{% for m in messages %}\n{% if m.role != 'user' %}\n{{ raise_exception('Only user turns, got ' + m.role) }}"
                 "{% endif %}{% endfor %}",
                 {{"messages", {{{"role", "user"}, {"content", "a"}}, {{"role", "tool"}, {"content", "b"}}}}});
  });
  EXPECT_NE(e.find("test.jinja:3: the template raised an exception: Only user turns, got tool"), std::string::npos) << e;

  e = error_of([] { (void)render("ok\n\n{{ tools[0].name }}"); });
  EXPECT_NE(e.find("test.jinja:3: cannot index an undefined value ('tools' is undefined)"), std::string::npos) << e;

  e = error_of([] { (void)render("{% set l = [] %}\n{% set _ = l.append(1) %}"); });
  EXPECT_NE(e.find("test.jinja:2: list.append() changes a list"), std::string::npos) << e;

  e = error_of([] { (void)render("{{ 'a' + 1 }}"); });
  EXPECT_NE(e.find("unsupported operand types for +: str and int"), std::string::npos) << e;
}

TEST(ChatTemplate, LimitsStopRunawayTemplates) {
  ChatTemplate loop("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", "t.jinja");
  ChatTemplate::Limits limits;
  limits.max_steps = 100000;
  loop.set_limits(limits);
  std::string e = error_of([&] { (void)loop.render_context(ordered_json::object()); });
  EXPECT_NE(e.find("t.jinja:1: the render took more than 100000 steps"), std::string::npos) << e;

  const ChatTemplate recursion("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}\n{{ f(0) }}", "t.jinja");
  e = error_of([&] { (void)recursion.render_context(ordered_json::object()); });
  EXPECT_NE(e.find("levels deep"), std::string::npos) << e;

  ChatTemplate doubling("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                        "t.jinja");
  limits = ChatTemplate::Limits{};
  limits.max_bytes = 1 << 20;
  doubling.set_limits(limits);
  e = error_of([&] { (void)doubling.render_context(ordered_json::object()); });
  EXPECT_NE(e.find("longer than the limit of 1048576"), std::string::npos) << e;

  // A namespace that holds itself is fine to build (nothing is reference-counted) but not to print.
  const ChatTemplate cycle("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns.me.me is defined }}{{ ns|tojson }}", "t.jinja");
  e = error_of([&] { (void)cycle.render_context(ordered_json::object()); });
  EXPECT_NE(e.find("levels deep"), std::string::npos) << e;
}

}  // namespace
}  // namespace chat_template_test
}  // namespace lineage::chat
