// Splits a chat template into text and the tokens inside {{ }} and {% %} ({# #} comments dropped),
// applying Jinja's whitespace rules as transformers configures them: trim_blocks and lstrip_blocks
// on, "-" strips, "+" keeps, one trailing newline of the source dropped, CRLF read as LF.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lineage::chat::jinja {

struct Token {
  enum class Kind { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };
  Kind kind;
  std::string text;  // Text, Name, Op, String (unescaped)
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
};

// Ends with one Token::Kind::End. An unclosed tag, comment or string, a bad escape or a character
// no token starts with is an Error naming `where` and the line.
std::vector<Token> lex(std::string_view source, const std::string& where);

}  // namespace lineage::chat::jinja
