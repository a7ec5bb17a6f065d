// The values a chat template computes with: Python's types as Jinja sees them. Lists, dicts,
// namespaces, macros and scopes live in the render's Arena and are shared by pointer, as Python
// shares them by reference; a template can only mutate namespace attributes (transformers renders
// in an immutable sandbox), and since nothing is reference-counted a namespace that holds itself
// leaks nothing and nothing is freed recursively. Strings are UTF-8, measured in code points, and
// shared (immutable) between copies.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lineage::chat::jinja {

struct Value;
struct Dict;
struct List;
struct Scope;
struct MacroDef;  // ast.h

struct Macro {
  const MacroDef* def = nullptr;  // owned by the Program
  Scope* closure = nullptr;       // the scope the macro was defined in
};

struct Value {
  enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Macro };
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::shared_ptr<const std::string> str;  // shared: a copy of a long message costs nothing;
                                           // for Undefined, why ("'x' is undefined"), for errors
  jinja::List* list = nullptr;
  jinja::Dict* dict = nullptr;  // Dict and Namespace
  const jinja::Macro* macro = nullptr;

  static Value none() { return make(Kind::None); }
  static Value boolean(bool v) { Value x = make(Kind::Bool); x.b = v; return x; }
  static Value integer(int64_t v) { Value x = make(Kind::Int); x.i = v; return x; }
  static Value real(double v) { Value x = make(Kind::Float); x.f = v; return x; }
  static Value string(std::string v) {
    Value x = make(Kind::String);
    x.str = std::make_shared<const std::string>(std::move(v));
    return x;
  }

  bool is(Kind k) const { return kind == k; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float; }
  bool is_mapping() const { return kind == Kind::Dict || kind == Kind::Namespace; }
  double as_double() const { return kind == Kind::Int ? double(i) : f; }
  const std::string& s() const;  // the string ("" for any other kind)

 private:
  static Value make(Kind k) { Value x; x.kind = k; return x; }
};

struct List {
  std::vector<Value> items;
};

// Insertion-ordered string-keyed map (Python dicts keep insertion order, and tojson shows it).
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  void set(std::string key, Value value);  // replaces in place, else appends
};

// Variables of one block level; lookups walk to the parent.
struct Scope {
  Dict vars;
  Scope* parent = nullptr;
  const Value* find(std::string_view name) const;
};

// Owns every container of one render (deques keep addresses stable).
class Arena {
 public:
  Value list(std::vector<Value> items = {});
  Value dict();
  Value namespace_object();
  Value macro(const MacroDef* def, Scope* closure);
  Scope* scope(Scope* parent);
  int64_t containers() const { return int64_t(lists_.size() + dicts_.size()); }

 private:
  std::deque<List> lists_;
  std::deque<Dict> dicts_;
  std::deque<Macro> macros_;
  std::deque<Scope> scopes_;
};

// Thrown by the recursive helpers below past kMaxValueDepth levels; the renderer turns it into an
// Error naming the line.
struct ValueTooDeep {};
constexpr int kMaxValueDepth = 512;

const char* kind_name(Value::Kind kind);  // Python's type names: "str", "list", "dict", ...
bool truthy(const Value& v);
bool equal(const Value& a, const Value& b);  // Python ==: 1 == 1.0, lists and dicts by content
// How @huggingface/jinja prints a value: None and undefined as "", true/false, floats as Python
// repr, lists and dicts as one-line JSON with ", " and ": ".
std::string to_string(const Value& v);
std::string float_repr(double v);  // Python repr(): 1.0, 2.5, 1e+16

// json.dumps(v, ensure_ascii, indent, separators, sort_keys), transformers' tojson; undefined is null.
struct JsonStyle {
  int indent = -1;  // < 0: one line
  std::string item_sep = ", ", key_sep = ": ";
  bool ensure_ascii = false, sort_keys = false;
};
void to_json(const Value& v, const JsonStyle& style, std::string& out);

Value from_json(const nlohmann::ordered_json& j, Arena& arena);  // objects keep their key order

// Byte offset of each code point (an invalid byte counts as one, so nothing is ever dropped).
std::vector<size_t> code_point_starts(std::string_view s);

}  // namespace lineage::chat::jinja
