// The parsed form of a chat template: statements (Node) holding expressions (Expr), each with the
// source line it came from, so every error at render time names that line.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lineage/chat/value.h"

namespace lineage::chat::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Arg {
  std::string name;  // empty: positional
  ExprPtr value;
};

struct Expr {
  enum class Kind {
    Literal,  // literal (a scalar; list and dict literals are List / Dict)
    Name,     // name
    Attr,     // sub[0].name
    Item,     // sub[0][sub[1]]
    Slice,    // sub[0][sub[1]:sub[2]:sub[3]], each bound may be null
    Call,     // sub[0](args)
    Filter,   // sub[0] | name(args)
    Test,     // sub[0] is [not] name(args)
    Neg,      // -sub[0]
    Pos,      // +sub[0]
    Not,      // not sub[0]
    Binary,   // sub[0] name sub[1], name one of + - * / // % ** ~
    Compare,  // sub[0] ops[0] sub[1] ops[1] sub[2] ... (chained as in Python)
    And,      // sub[0] and sub[1]
    Or,       // sub[0] or sub[1]
    Cond,     // sub[1] if sub[0] else sub[2] (sub[2] may be null: undefined)
    List,     // [sub...] and tuples (a, b)
    Dict,     // {sub[0]: sub[1], sub[2]: sub[3], ...}
  };
  Kind kind = Kind::Literal;
  int line = 0;
  Value literal;
  std::string name;
  std::vector<ExprPtr> sub;
  std::vector<Arg> args;
  std::vector<std::string> ops;
  bool negated = false;
};

struct Node;
using Body = std::vector<Node>;

struct Param {
  std::string name;
  ExprPtr default_value;  // null: required (undefined when not passed, as in Jinja)
};

struct MacroDef {
  std::string name;
  std::vector<Param> params;
  Body body;
  int line = 0;
};

struct IfBranch {
  ExprPtr condition;
  Body body;
};

struct Node {
  enum class Kind {
    Text,         // text
    Output,       // {{ expr }}
    If,           // branches, else_body
    For,          // for targets in expr [if condition]: body [else: else_body]
    Set,          // set targets = expr (several targets unpack a sequence)
    SetAttr,      // set targets[0].targets[1] = expr (namespaces only)
    SetBlock,     // set targets[0]: body rendered to a string
    Macro,        // macro
    Break,
    Continue,
    FilterBlock,  // filter expr (a Filter whose sub[0] is null): body
  };
  Kind kind = Kind::Text;
  int line = 0;
  std::string text;
  ExprPtr expr, condition;
  std::vector<std::string> targets;
  std::vector<IfBranch> branches;
  Body body, else_body;
  std::unique_ptr<MacroDef> macro;
};

struct Program {
  Body body;
  std::string where;  // the template's file (and field), for every error message
};

// Parses `source` (parse.cpp); an Error names `where`, the line and the construct.
std::shared_ptr<const Program> parse_program(std::string_view source, const std::string& where);

// Filters and tests the subset knows (builtins.cpp), checked while parsing.
bool is_filter(std::string_view name);
bool is_test(std::string_view name);
const char* filter_names();
const char* test_names();

}  // namespace lineage::chat::jinja
