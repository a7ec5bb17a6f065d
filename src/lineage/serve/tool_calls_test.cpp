// The tool calls a model writes, read back into OpenAI's tool_calls: Qwen's <tool_call> JSON blocks
// (one, several, with text around, arguments as an object or a string, an unclosed last block) and
// Kimi's tool-call section; what is not a call stays text.
#include <gtest/gtest.h>

#include <string>

#include "lineage/serve/openai.h"

namespace lineage::serve {
namespace tool_calls_test {
namespace {

TEST(ToolCalls, QwenBlocks) {
  const ParsedReply one = parse_tool_calls(
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>");
  ASSERT_EQ(one.calls.size(), 1u);
  EXPECT_EQ(one.calls[0].name, "get_weather");
  EXPECT_EQ(one.calls[0].arguments, "{\"city\":\"Paris\",\"days\":2}");
  EXPECT_EQ(one.content, "");

  const ParsedReply two = parse_tool_calls(
      "Let me look.\n<tool_call>\n{\"name\": \"a\", \"arguments\": \"{\\\"x\\\": 1}\"}\n</tool_call>\n"
      "<tool_call>{\"name\": \"b\"}</tool_call>\n<tool_call>{\"name\": \"c\", \"arguments\": {}}");
  ASSERT_EQ(two.calls.size(), 3u);
  EXPECT_EQ(two.calls[0].arguments, "{\"x\": 1}") << "a string is passed on as it is";
  EXPECT_EQ(two.calls[1].name, "b");
  EXPECT_EQ(two.calls[1].arguments, "{}");
  EXPECT_EQ(two.calls[2].name, "c") << "an unclosed last block still counts";
  EXPECT_EQ(two.content, "Let me look.");

  const ParsedReply text = parse_tool_calls("No call: <tool_call>not json</tool_call> and {\"name\": \"x\"}");
  EXPECT_TRUE(text.calls.empty());
  EXPECT_EQ(text.content, "No call: <tool_call>not json</tool_call> and {\"name\": \"x\"}");
  EXPECT_TRUE(parse_tool_calls("<tool_call>{\"arguments\": {}}</tool_call>").calls.empty()) << "no name";
}

TEST(ToolCalls, KimiSection) {
  const ParsedReply r = parse_tool_calls(
      "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
      "{\"city\": \"Paris\"}<|tool_call_end|><|tool_call_begin|>functions.search:1<|tool_call_argument_begin|>"
      "{\"q\": \"x\"}<|tool_call_end|><|tool_calls_section_end|>");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, "{\"city\": \"Paris\"}");
  EXPECT_EQ(r.calls[1].name, "search");
  EXPECT_EQ(r.content, "Checking.");
  const ParsedReply broken = parse_tool_calls(
      "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{oops<|tool_call_end|>");
  EXPECT_TRUE(broken.calls.empty());
}

}  // namespace
}  // namespace tool_calls_test
}  // namespace lineage::serve
