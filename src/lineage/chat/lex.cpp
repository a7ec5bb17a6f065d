#include "lineage/chat/lex.h"

#include <cctype>
#include <limits>

#include "lineage/core/error.h"
#include "lineage/tokenizer/bpe_model.h"  // append_utf8

namespace lineage::chat::jinja {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// A string literal's escaped code point; a lone surrogate cannot be encoded.
void append_escaped(std::string& out, uint32_t cp) { tokenizer::append_utf8(out, cp >= 0xD800 && cp <= 0xDFFF ? 0xFFFD : cp); }

class Lexer {
 public:
  Lexer(std::string source, const std::string& where) : src_(std::move(source)), where_(where) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      const size_t open = find_open(pos_);
      const size_t text_end = open == std::string::npos ? src_.size() : open;
      std::string text = src_.substr(pos_, text_end - pos_);
      const int text_line = line_;
      advance_to(text_end);
      if (open == std::string::npos) {
        emit_text(std::move(text), text_line);
        break;
      }
      const char kind = src_[open + 1];
      const char marker = open + 2 < src_.size() ? src_[open + 2] : '\0';
      if (marker == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (kind != '{' && marker != '+') {
        lstrip_block(text);
      }
      emit_text(std::move(text), text_line);
      pos_ = open + 2 + (marker == '-' || marker == '+' ? 1 : 0);
      if (kind == '#') {
        comment(open);
      } else {
        tag(kind);
      }
    }
    out_.push_back(Token{Token::Kind::End, "", 0, 0, line_});
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail(int line, const std::string& what) const { throw Error(cat(where_, ":", line, ": ", what)); }

  size_t find_open(size_t from) const {
    for (size_t k = src_.find('{', from); k != std::string::npos; k = src_.find('{', k + 1)) {
      if (k + 1 < src_.size() && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    }
    return std::string::npos;
  }

  void advance_to(size_t to) {
    for (; pos_ < to; ++pos_)
      if (src_[pos_] == '\n') ++line_;
  }

  // lstrip_blocks: spaces and tabs between the start of a line and a block or comment tag go.
  void lstrip_block(std::string& text) const {
    const size_t nl = text.rfind('\n');
    const size_t start = nl == std::string::npos ? 0 : nl + 1;
    if (nl == std::string::npos && !line_starting_) return;
    for (size_t k = start; k < text.size(); ++k)
      if (text[k] != ' ' && text[k] != '\t') return;
    text.resize(start);
  }

  void emit_text(std::string text, int line) {
    if (!text.empty()) out_.push_back(Token{Token::Kind::Text, std::move(text), 0, 0, line});
  }

  // After a tag: "-" strips all following whitespace; trim_blocks drops one newline after %} and #}.
  void after_tag_end(bool strip, bool trim) {
    line_starting_ = false;
    if (strip) {
      const size_t from = pos_;
      while (pos_ < src_.size() && is_space(src_[pos_])) advance_to(pos_ + 1);
      line_starting_ = pos_ > from && src_[pos_ - 1] == '\n';
    } else if (trim && pos_ < src_.size() && src_[pos_] == '\n') {
      advance_to(pos_ + 1);
      line_starting_ = true;
    }
  }

  void comment(size_t open) {
    const int open_line = line_;
    const size_t close = src_.find("#}", pos_);
    if (close == std::string::npos) fail(open_line, "comment '{#' is never closed (expected '#}')");
    const bool strip = close > open + 2 && src_[close - 1] == '-';
    const bool keep = close > open + 2 && src_[close - 1] == '+';
    advance_to(close + 2);
    after_tag_end(strip, !keep);
  }

  void tag(char kind) {
    const int open_line = line_;
    const bool block = kind == '%';
    out_.push_back(Token{block ? Token::Kind::BlockBegin : Token::Kind::VarBegin, "", 0, 0, open_line});
    int depth = 0;  // brackets open: a "}}" inside {'a': {'b': 1}} does not end the tag
    for (;;) {
      while (pos_ < src_.size() && is_space(src_[pos_])) advance_to(pos_ + 1);
      if (pos_ >= src_.size())
        fail(open_line, cat(block ? "block tag '{%'" : "expression '{{'", " is never closed (expected '",
                            block ? "%}" : "}}", "')"));
      const std::string_view rest = std::string_view(src_).substr(pos_);
      const std::string_view close = block ? "%}" : "}}";
      if (block || depth == 0) {
        const bool strip = rest.size() > 2 && rest[0] == '-' && rest.substr(1, 2) == close;
        const bool keep = block && rest.size() > 2 && rest[0] == '+' && rest.substr(1, 2) == close;
        if (strip || keep || rest.substr(0, 2) == close) {
          out_.push_back(Token{block ? Token::Kind::BlockEnd : Token::Kind::VarEnd, "", 0, 0, line_});
          advance_to(pos_ + (strip || keep ? 3 : 2));
          after_tag_end(strip, block && !keep);
          return;
        }
      }
      token(depth);
    }
  }

  void token(int& depth) {
    const char c = src_[pos_];
    const int line = line_;
    if (is_name_start(c)) {
      size_t end = pos_;
      while (end < src_.size() && is_name_char(src_[end])) ++end;
      out_.push_back(Token{Token::Kind::Name, src_.substr(pos_, end - pos_), 0, 0, line});
      advance_to(end);
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      number();
    } else if (c == '\'' || c == '"') {
      string_literal();
    } else {
      static const char* const kTwo[] = {"**", "//", "==", "!=", "<=", ">="};
      for (const char* op : kTwo) {
        if (src_.compare(pos_, 2, op) == 0) {
          out_.push_back(Token{Token::Kind::Op, op, 0, 0, line});
          advance_to(pos_ + 2);
          return;
        }
      }
      if (std::string_view("+-*/%~<>=()[]{},.:|").find(c) == std::string_view::npos) {
        fail(line, c >= 0x20 && c < 0x7F ? cat("unexpected character '", c, "' in a tag")
                                         : cat("unexpected byte 0x", std::hex, int(static_cast<unsigned char>(c)), " in a tag"));
      }
      if (c == '(' || c == '[' || c == '{') ++depth;
      if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
      out_.push_back(Token{Token::Kind::Op, std::string(1, c), 0, 0, line});
      advance_to(pos_ + 1);
    }
  }

  // Jinja's integer and float literals: 42, 1_000, 3.14, 1e5, 2.5E-3.
  void number() {
    const int line = line_;
    std::string digits;
    size_t k = pos_;
    const auto take_digits = [&] {
      while (k < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[k])) ||
                                 (src_[k] == '_' && k + 1 < src_.size() && std::isdigit(static_cast<unsigned char>(src_[k + 1]))))) {
        if (src_[k] != '_') digits += src_[k];
        ++k;
      }
    };
    take_digits();
    bool is_float = false;
    if (k + 1 < src_.size() && src_[k] == '.' && std::isdigit(static_cast<unsigned char>(src_[k + 1]))) {
      is_float = true;
      digits += '.';
      ++k;
      take_digits();
    }
    if (k < src_.size() && (src_[k] == 'e' || src_[k] == 'E')) {
      size_t e = k + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      if (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) {
        is_float = true;
        digits += 'e';
        digits += src_.substr(k + 1, e - k - 1);
        k = e;
        take_digits();
      }
    }
    Token t{is_float ? Token::Kind::Float : Token::Kind::Int, digits, 0, 0, line};
    if (is_float) {
      t.float_value = std::strtod(digits.c_str(), nullptr);
    } else {
      for (char d : digits) {
        if (t.int_value > (std::numeric_limits<int64_t>::max() - (d - '0')) / 10)
          fail(line, cat("integer literal ", digits, " does not fit in 64 bits"));
        t.int_value = t.int_value * 10 + (d - '0');
      }
    }
    out_.push_back(std::move(t));
    advance_to(k);
  }

  // Python string escapes (Jinja decodes literals with unicode-escape); unknown ones stay as written.
  void string_literal() {
    const int line = line_;
    const char quote = src_[pos_];
    size_t k = pos_ + 1;
    std::string value;
    for (;;) {
      if (k >= src_.size()) fail(line, "string literal is never closed");
      const char c = src_[k];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++k;
        continue;
      }
      if (k + 1 >= src_.size()) fail(line, "string literal is never closed");
      const char e = src_[k + 1];
      k += 2;
      switch (e) {
        case '\n': break;
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case 'n': value += '\n'; break;
        case 't': value += '\t'; break;
        case 'r': value += '\r'; break;
        case 'a': value += '\a'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'v': value += '\v'; break;
        case 'x': case 'u': case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t j = 0; j < n; ++j) {
            const char h = k + j < src_.size() ? src_[k + j] : '\0';
            if (!std::isxdigit(static_cast<unsigned char>(h)))
              fail(line, cat("bad \\", e, " escape in a string literal: expected ", n, " hex digits"));
            cp = cp * 16 + uint32_t(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
            if (cp > 0x10FFFF) fail(line, "\\U escape past U+10FFFF in a string literal");
          }
          k += n;
          append_escaped(value, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = uint32_t(e - '0');
            for (int j = 0; j < 2 && k < src_.size() && src_[k] >= '0' && src_[k] <= '7'; ++j) cp = cp * 8 + uint32_t(src_[k++] - '0');
            append_escaped(value, cp);
          } else {
            value += '\\';
            value += e;
          }
      }
    }
    out_.push_back(Token{Token::Kind::String, std::move(value), 0, 0, line});
    advance_to(k + 1);
  }

  std::string src_;
  const std::string& where_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;  // the text now being read starts a line (for lstrip_blocks)
  std::vector<Token> out_;
};

}  // namespace

std::vector<Token> lex(std::string_view source, const std::string& where) {
  std::string text;
  text.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r' && k + 1 < source.size() && source[k + 1] == '\n') continue;
    text += source[k];
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();  // keep_trailing_newline=False
  return Lexer(std::move(text), where).run();
}

}  // namespace lineage::chat::jinja
