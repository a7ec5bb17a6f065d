// Recursive-descent parser of the Jinja subset, with Jinja2's operator precedence (lowest first):
//   x if c else y | or | and | not | == != < > <= >= in, not in (chained) | + - | ~ | * / // % | **
//   | unary - + | postfix .a [i] [a:b:c] (args) | filters |f(args) and tests `is [not] t`.
// Over 400 lines, one concept: one grammar.
#include <algorithm>
#include <initializer_list>

#include "lineage/core/error.h"
#include "lineage/chat/ast.h"
#include "lineage/chat/lex.h"

namespace lineage::chat::jinja {

namespace {

// Deeper than any real template nests blocks or expressions; keeps a hostile one off the stack's end.
constexpr int kMaxNesting = 100;

// Statements outside the subset, named as such rather than "unknown".
constexpr std::string_view kUnsupported[] = {"call", "raw", "include", "import", "from", "extends", "block",
                                              "with", "autoescape", "do", "trans", "pluralize"};

class Parser {
 public:
  Parser(std::vector<Token> tokens, const std::string& where) : t_(std::move(tokens)), where_(where) {}

  Body parse_template() {
    std::string end;
    Body body = parse_body({}, end);
    return body;
  }

 private:
  struct Open {
    std::string name;
    int line;
  };

  class Nest {
   public:
    Nest(Parser& p, int line) : p_(p) {
      if (++p_.nesting_ > kMaxNesting) p_.fail(line, cat("nested more than ", kMaxNesting, " levels deep"));
    }
    ~Nest() { --p_.nesting_; }

   private:
    Parser& p_;
  };

  [[noreturn]] void fail(int line, const std::string& what) const { throw Error(cat(where_, ":", line, ": ", what)); }

  const Token& peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  const Token& next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }
  bool at_op(std::string_view op, size_t ahead = 0) const {
    return peek(ahead).kind == Token::Kind::Op && peek(ahead).text == op;
  }
  bool at_name(std::string_view name, size_t ahead = 0) const {
    return peek(ahead).kind == Token::Kind::Name && peek(ahead).text == name;
  }

  static std::string describe(const Token& t) {
    switch (t.kind) {
      case Token::Kind::Text: return "text";
      case Token::Kind::VarBegin: return "'{{'";
      case Token::Kind::VarEnd: return "'}}'";
      case Token::Kind::BlockBegin: return "'{%'";
      case Token::Kind::BlockEnd: return "'%}'";
      case Token::Kind::Name: return cat("'", t.text, "'");
      case Token::Kind::String: return "a string";
      case Token::Kind::Int:
      case Token::Kind::Float: return cat("the number ", t.text);
      case Token::Kind::Op: return cat("'", t.text, "'");
      case Token::Kind::End: return "the end of the template";
    }
    return "?";
  }

  void expect_op(std::string_view op, std::string_view context) {
    if (!at_op(op)) fail(peek().line, cat("expected '", op, "' ", context, ", found ", describe(peek())));
    next();
  }
  std::string expect_name(std::string_view context) {
    if (peek().kind != Token::Kind::Name) fail(peek().line, cat("expected a name ", context, ", found ", describe(peek())));
    return next().text;
  }
  void expect_block_end(std::string_view statement) {
    if (peek().kind != Token::Kind::BlockEnd)
      fail(peek().line, cat("expected '%}' to end {% ", statement, " %}, found ", describe(peek())));
    next();
  }

  // Statements up to (not past) one of `ends`; at the end `end` holds it and the parser stands on its
  // keyword (the '{%' consumed).
  Body parse_body(std::initializer_list<std::string_view> ends, std::string& end) {
    Body body;
    for (;;) {
      const Token& t = peek();
      if (t.kind == Token::Kind::End) {
        if (ends.size() != 0) {
          const Open& open = open_.back();
          fail(open.line, cat("{% ", open.name, " %} is never closed (expected {% ", *(ends.end() - 1), " %})"));
        }
        return body;
      }
      if (t.kind == Token::Kind::Text) {
        Node n = node(Node::Kind::Text, t.line);
        n.text = next().text;
        body.push_back(std::move(n));
      } else if (t.kind == Token::Kind::VarBegin) {
        next();
        Node n = node(Node::Kind::Output, t.line);
        n.expr = parse_tuple();
        if (peek().kind != Token::Kind::VarEnd) fail(peek().line, cat("expected '}}', found ", describe(peek())));
        next();
        body.push_back(std::move(n));
      } else if (t.kind == Token::Kind::BlockBegin) {
        const Token& kw = peek(1);
        for (std::string_view e : ends) {
          if (kw.kind == Token::Kind::Name && kw.text == e) {
            next();
            end = kw.text;
            return body;
          }
        }
        next();
        statement(body);
      } else {
        fail(t.line, cat("unexpected ", describe(t)));
      }
    }
  }

  void close(std::string_view keyword) {
    next();  // the end keyword
    if (keyword == "endmacro" && peek().kind == Token::Kind::Name) next();  // {% endmacro name %}
    expect_block_end(keyword);
  }

  void statement(Body& body) {
    const Token& kw = peek();
    if (kw.kind != Token::Kind::Name) fail(kw.line, cat("expected a statement after '{%', found ", describe(kw)));
    const std::string name = next().text;
    const int line = kw.line;
    Nest nest(*this, line);
    if (name == "if") return parse_if(body, line);
    if (name == "for") return parse_for(body, line);
    if (name == "set") return parse_set(body, line);
    if (name == "macro") return parse_macro(body, line);
    if (name == "filter") return parse_filter_block(body, line);
    if (name == "break" || name == "continue") {
      if (loops_ == 0) fail(line, cat("{% ", name, " %} outside a for loop"));
      expect_block_end(name);
      Node n = node(name == "break" ? Node::Kind::Break : Node::Kind::Continue, line);
      body.push_back(std::move(n));
      return;
    }
    if (name == "generation") {  // transformers' assistant-mask marker: renders its body unchanged
      expect_block_end(name);
      open_.push_back({name, line});
      std::string end;
      Body inner = parse_body({"endgeneration"}, end);
      open_.pop_back();
      close(end);
      for (Node& n : inner) body.push_back(std::move(n));
      return;
    }
    for (std::string_view u : kUnsupported)
      if (name == u) fail(line, cat("{% ", name, " %} is outside the supported Jinja subset (docs/chat-templates.md)"));
    if (name.rfind("end", 0) == 0 || name == "elif" || name == "else") {
      fail(line, open_.empty() ? cat("{% ", name, " %} without an open block")
                               : cat("{% ", name, " %} does not close {% ", open_.back().name, " %} opened at line ",
                                     open_.back().line));
    }
    fail(line, cat("unknown statement {% ", name, " %}"));
  }

  void parse_if(Body& body, int line) {
    Node n = node(Node::Kind::If, line);
    ExprPtr condition = parse_expression();
    expect_block_end("if");
    open_.push_back({"if", line});
    for (;;) {
      std::string end;
      Body branch = parse_body({"elif", "else", "endif"}, end);
      n.branches.push_back(IfBranch{std::move(condition), std::move(branch)});
      next();
      if (end == "elif") {
        condition = parse_expression();
        expect_block_end("elif");
        continue;
      }
      if (end == "else") {
        expect_block_end("else");
        n.else_body = parse_body({"endif"}, end);
        next();
      }
      expect_block_end(end);
      break;
    }
    open_.pop_back();
    body.push_back(std::move(n));
  }

  void parse_for(Body& body, int line) {
    Node n = node(Node::Kind::For, line);
    const bool paren = at_op("(");
    if (paren) next();
    n.targets.push_back(expect_name("after {% for"));
    while (at_op(",")) {
      next();
      n.targets.push_back(expect_name("in the for loop's targets"));
    }
    if (paren) expect_op(")", "after the for loop's targets");
    if (!at_name("in")) fail(peek().line, cat("expected 'in' in {% for %}, found ", describe(peek())));
    next();
    n.expr = parse_expression(false);
    if (at_name("if")) {
      next();
      n.condition = parse_expression();
    }
    if (at_name("recursive")) fail(peek().line, "recursive for loops are outside the supported Jinja subset");
    expect_block_end("for");
    open_.push_back({"for", line});
    ++loops_;
    std::string end;
    n.body = parse_body({"else", "endfor"}, end);
    --loops_;
    if (end == "else") {
      next();
      expect_block_end("else");
      n.else_body = parse_body({"endfor"}, end);
    }
    open_.pop_back();
    close(end);
    body.push_back(std::move(n));
  }

  void parse_set(Body& body, int line) {
    Node n = node(Node::Kind::Set, line);
    n.targets.push_back(expect_name("after {% set"));
    if (at_op(".")) {
      next();
      n.kind = Node::Kind::SetAttr;
      n.targets.push_back(expect_name("after '.' in {% set %}"));
    } else {
      while (at_op(",")) {
        next();
        n.targets.push_back(expect_name("in {% set %}'s targets"));
      }
    }
    if (at_op("=")) {
      next();
      n.expr = parse_tuple();
      expect_block_end("set");
    } else {
      if (n.kind != Node::Kind::Set || n.targets.size() != 1)
        fail(peek().line, cat("expected '=' in {% set %}, found ", describe(peek())));
      if (at_op("|")) fail(peek().line, "filters on {% set %} blocks are outside the supported Jinja subset");
      expect_block_end("set");
      n.kind = Node::Kind::SetBlock;
      open_.push_back({"set", line});
      std::string end;
      n.body = parse_body({"endset"}, end);
      open_.pop_back();
      close(end);
    }
    body.push_back(std::move(n));
  }

  void parse_macro(Body& body, int line) {
    auto def = std::make_unique<MacroDef>();
    def->line = line;
    def->name = expect_name("after {% macro");
    expect_op("(", "after the macro's name");
    while (!at_op(")")) {
      Param p;
      p.name = expect_name("for a macro parameter");
      if (at_op("=")) {
        next();
        p.default_value = parse_expression();
      } else if (!def->params.empty() && def->params.back().default_value) {
        fail(peek().line, cat("macro parameter '", p.name, "' without a default follows one with a default"));
      }
      def->params.push_back(std::move(p));
      if (!at_op(",")) break;
      next();
    }
    expect_op(")", "to end the macro's parameters");
    expect_block_end("macro");
    open_.push_back({"macro", line});
    const int loops = loops_;
    loops_ = 0;  // a break inside a macro cannot leave a loop around its call
    std::string end;
    def->body = parse_body({"endmacro"}, end);
    loops_ = loops;
    open_.pop_back();
    close(end);
    Node n = node(Node::Kind::Macro, line);
    n.macro = std::move(def);
    body.push_back(std::move(n));
  }

  void parse_filter_block(Body& body, int line) {
    Node n = node(Node::Kind::FilterBlock, line);
    n.expr = parse_filter(nullptr, line);
    if (at_op("|")) fail(peek().line, "chained filters on {% filter %} are outside the supported Jinja subset");
    expect_block_end("filter");
    open_.push_back({"filter", line});
    std::string end;
    n.body = parse_body({"endfilter"}, end);
    open_.pop_back();
    close(end);
    body.push_back(std::move(n));
  }

  // ---- expressions -------------------------------------------------------------------------------

  static Node node(Node::Kind kind, int line) {
    Node n;
    n.kind = kind;
    n.line = line;
    return n;
  }

  static ExprPtr make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // `a, b` without parentheses, as {{ }} and {% set %} take it.
  ExprPtr parse_tuple() {
    const int line = peek().line;
    ExprPtr first = parse_expression();
    if (!at_op(",")) return first;
    ExprPtr tuple = make(Expr::Kind::List, line);
    tuple->sub.push_back(std::move(first));
    while (at_op(",")) {
      next();
      if (peek().kind == Token::Kind::VarEnd || peek().kind == Token::Kind::BlockEnd) break;
      tuple->sub.push_back(parse_expression());
    }
    return tuple;
  }

  ExprPtr parse_expression(bool with_condition = true) {
    const int line = peek().line;
    Nest nest(*this, line);
    ExprPtr e = parse_or();
    while (with_condition && at_name("if")) {
      next();
      ExprPtr cond = make(Expr::Kind::Cond, line);
      cond->sub.push_back(parse_or());
      cond->sub.push_back(std::move(e));
      if (at_name("else")) {
        next();
        cond->sub.push_back(parse_expression());
      } else {
        cond->sub.push_back(nullptr);
      }
      e = std::move(cond);
    }
    return e;
  }

  ExprPtr binary(Expr::Kind kind, ExprPtr l, ExprPtr r, int line, std::string op = {}) {
    ExprPtr e = make(kind, line);
    e->name = std::move(op);
    e->sub.push_back(std::move(l));
    e->sub.push_back(std::move(r));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (at_name("or")) {
      const int line = next().line;
      e = binary(Expr::Kind::Or, std::move(e), parse_and(), line);
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (at_name("and")) {
      const int line = next().line;
      e = binary(Expr::Kind::And, std::move(e), parse_not(), line);
    }
    return e;
  }

  ExprPtr parse_not() {
    if (at_name("not")) {
      const int line = next().line;
      Nest nest(*this, line);
      ExprPtr e = make(Expr::Kind::Not, line);
      e->sub.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = peek().line;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    for (;;) {
      std::string op;
      if (peek().kind == Token::Kind::Op &&
          (at_op("==") || at_op("!=") || at_op("<") || at_op(">") || at_op("<=") || at_op(">="))) {
        op = next().text;
      } else if (at_name("in")) {
        next();
        op = "in";
      } else if (at_name("not") && at_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::Kind::Compare, line);
        cmp->sub.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->sub.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (at_op("+") || at_op("-")) {
      const Token& op = next();
      e = binary(Expr::Kind::Binary, std::move(e), parse_concat(), op.line, op.text);
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (at_op("~")) {
      const int line = next().line;
      e = binary(Expr::Kind::Binary, std::move(e), parse_math2(), line, "~");
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      const Token& op = next();
      e = binary(Expr::Kind::Binary, std::move(e), parse_pow(), op.line, op.text);
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (at_op("**")) {
      const int line = next().line;
      e = binary(Expr::Kind::Binary, std::move(e), parse_unary(true), line, "**");
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    const int line = peek().line;
    Nest nest(*this, line);
    ExprPtr e;
    if (at_op("-") || at_op("+")) {
      e = make(next().text == "-" ? Expr::Kind::Neg : Expr::Kind::Pos, line);
      e->sub.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (!with_filter) return e;
    for (;;) {
      if (at_op("|")) {
        const int filter_line = next().line;
        e = parse_filter(std::move(e), filter_line);
      } else if (at_name("is")) {
        e = parse_test(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    switch (t.kind) {
      case Token::Kind::Name: {
        next();
        ExprPtr e = make(Expr::Kind::Literal, t.line);
        if (t.text == "true" || t.text == "True") e->literal = Value::boolean(true);
        else if (t.text == "false" || t.text == "False") e->literal = Value::boolean(false);
        else if (t.text == "none" || t.text == "None") e->literal = Value::none();
        else {
          e->kind = Expr::Kind::Name;
          e->name = t.text;
        }
        return e;
      }
      case Token::Kind::String: {
        std::string s;
        while (peek().kind == Token::Kind::String) s += next().text;  // 'a' 'b' is 'ab', as in Python
        ExprPtr e = make(Expr::Kind::Literal, t.line);
        e->literal = Value::string(std::move(s));
        return e;
      }
      case Token::Kind::Int:
      case Token::Kind::Float: {
        next();
        ExprPtr e = make(Expr::Kind::Literal, t.line);
        e->literal = t.kind == Token::Kind::Int ? Value::integer(t.int_value) : Value::real(t.float_value);
        return e;
      }
      case Token::Kind::Op:
        if (t.text == "(") return parse_parenthesized();
        if (t.text == "[") return parse_list();
        if (t.text == "{") return parse_dict();
        break;
      default: break;
    }
    fail(t.line, cat("expected an expression, found ", describe(t)));
  }

  ExprPtr parse_parenthesized() {
    const int line = next().line;
    if (at_op(")")) {
      next();
      return make(Expr::Kind::List, line);  // () is the empty tuple
    }
    ExprPtr first = parse_expression();
    if (!at_op(",")) {
      expect_op(")", "to close '('");
      return first;
    }
    ExprPtr tuple = make(Expr::Kind::List, line);
    tuple->sub.push_back(std::move(first));
    while (at_op(",")) {
      next();
      if (at_op(")")) break;
      tuple->sub.push_back(parse_expression());
    }
    expect_op(")", "to close the tuple");
    return tuple;
  }

  ExprPtr parse_list() {
    const int line = next().line;
    ExprPtr list = make(Expr::Kind::List, line);
    while (!at_op("]")) {
      list->sub.push_back(parse_expression());
      if (!at_op(",")) break;
      next();
    }
    expect_op("]", "to close the list");
    return list;
  }

  ExprPtr parse_dict() {
    const int line = next().line;
    ExprPtr dict = make(Expr::Kind::Dict, line);
    while (!at_op("}")) {
      dict->sub.push_back(parse_expression());
      expect_op(":", "between a dict key and its value");
      dict->sub.push_back(parse_expression());
      if (!at_op(",")) break;
      next();
    }
    expect_op("}", "to close the dict");
    return dict;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      const int line = peek().line;
      if (at_op(".")) {
        next();
        if (peek().kind == Token::Kind::Int) {  // foo.0 is foo[0]
          ExprPtr item = make(Expr::Kind::Item, line);
          ExprPtr index = make(Expr::Kind::Literal, line);
          index->literal = Value::integer(next().int_value);
          item->sub.push_back(std::move(e));
          item->sub.push_back(std::move(index));
          e = std::move(item);
          continue;
        }
        ExprPtr attr = make(Expr::Kind::Attr, line);
        attr->name = expect_name("after '.'");
        attr->sub.push_back(std::move(e));
        e = std::move(attr);
      } else if (at_op("[")) {
        next();
        e = parse_subscript(std::move(e), line);
      } else if (at_op("(")) {
        ExprPtr call = make(Expr::Kind::Call, line);
        call->sub.push_back(std::move(e));
        call->args = parse_call_args();
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr object, int line) {
    ExprPtr start, stop, step;
    bool slice = false;
    if (!at_op(":")) start = parse_expression();
    if (at_op(":")) {
      slice = true;
      next();
      if (!at_op("]") && !at_op(":")) stop = parse_expression();
      if (at_op(":")) {
        next();
        if (!at_op("]")) step = parse_expression();
      }
    }
    expect_op("]", "to close the subscript");
    ExprPtr e = make(slice ? Expr::Kind::Slice : Expr::Kind::Item, line);
    e->sub.push_back(std::move(object));
    e->sub.push_back(std::move(start));
    if (slice) {
      e->sub.push_back(std::move(stop));
      e->sub.push_back(std::move(step));
    }
    return e;
  }

  std::vector<Arg> parse_call_args() {
    expect_op("(", "to start the arguments");
    std::vector<Arg> args;
    while (!at_op(")")) {
      if (at_op("*") || at_op("**")) fail(peek().line, "*args and **kwargs are outside the supported Jinja subset");
      Arg a;
      if (peek().kind == Token::Kind::Name && at_op("=", 1)) {
        a.name = next().text;
        next();
      } else if (!args.empty() && !args.back().name.empty()) {
        fail(peek().line, "a positional argument follows a keyword argument");
      }
      a.value = parse_expression();
      args.push_back(std::move(a));
      if (!at_op(",")) break;
      next();
    }
    expect_op(")", "to close the arguments");
    return args;
  }

  ExprPtr parse_filter(ExprPtr object, int line) {
    std::string name = expect_name("after '|'");
    while (at_op(".") && peek(1).kind == Token::Kind::Name) {
      next();
      name += "." + next().text;
    }
    if (!is_filter(name)) fail(line, cat("unknown filter '", name, "' (the subset has: ", filter_names(), ")"));
    ExprPtr e = make(Expr::Kind::Filter, line);
    e->name = std::move(name);
    e->sub.push_back(std::move(object));
    if (at_op("(")) e->args = parse_call_args();
    return e;
  }

  ExprPtr parse_test(ExprPtr object) {
    const int line = next().line;  // 'is'
    ExprPtr e = make(Expr::Kind::Test, line);
    if (at_name("not")) {
      next();
      e->negated = true;
    }
    e->name = expect_name("after 'is'");
    if (!is_test(e->name)) fail(line, cat("unknown test '", e->name, "' (the subset has: ", test_names(), ")"));
    e->sub.push_back(std::move(object));
    if (at_op("(")) {
      e->args = parse_call_args();
    } else {
      // One bare argument, as Jinja allows: `x is divisibleby 3`, `x is equalto 'a'`.
      const Token& t = peek();
      const bool starts = t.kind == Token::Kind::Name || t.kind == Token::Kind::String || t.kind == Token::Kind::Int ||
                          t.kind == Token::Kind::Float || at_op("[") || at_op("{");
      if (starts && !at_name("else") && !at_name("or") && !at_name("and") && !at_name("if") && !at_name("is")) {
        Arg a;
        a.value = parse_postfix(parse_primary());
        e->args.push_back(std::move(a));
      }
    }
    return e;
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  const std::string& where_;
  int nesting_ = 0;
  int loops_ = 0;
  std::vector<Open> open_;
};

}  // namespace

std::shared_ptr<const Program> parse_program(std::string_view source, const std::string& where) {
  auto program = std::make_shared<Program>();
  program->where = where;
  Parser parser(lex(source, where), program->where);
  program->body = parser.parse_template();
  return program;
}

}  // namespace lineage::chat::jinja
