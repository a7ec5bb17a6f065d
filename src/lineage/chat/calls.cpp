// Tests (`x is string`), methods (`s.startswith(p)`, `d.get(k)`) and the global functions of the
// subset: range, namespace, dict, raise_exception, strftime_now. Type tests follow Python's Jinja
// (a bool is a number, a dict is iterable); list and dict methods that mutate are refused, as
// transformers' immutable sandbox refuses them.
#include <algorithm>
#include <cctype>
#include <ctime>

#include "lineage/core/error.h"
#include "lineage/chat/eval.h"
#include "lineage/chat/text.h"

namespace lineage::chat::jinja {

namespace {

using K = Value::Kind;

#define LINEAGE_TESTS                                                                                               \
  "boolean, callable, defined, divisibleby, eq, equalto, even, false, float, ge, greaterthan, gt, in, integer, "   \
  "iterable, le, lessthan, lower, lt, mapping, ne, none, number, odd, sameas, sequence, string, true, undefined, " \
  "upper"

const Value& only_arg(Renderer& r, const std::string& name, const CallArgs& args, int line) {
  if (args.positional.size() != 1 || !args.named.empty()) r.fail(line, cat("the test '", name, "' takes one argument"));
  return args.positional[0];
}

void no_args(Renderer& r, std::string_view what, const CallArgs& args, int line) {
  if (!args.positional.empty() || !args.named.empty()) r.fail(line, cat(what, " takes no arguments"));
}

bool letters_all(const std::string& s, bool upper) {
  bool any = false;
  for (uint32_t c : decode_utf8(s)) {
    if (is_cased(c, !upper)) return false;  // a letter of the other case
    any = any || is_cased(c, upper);
  }
  return any;
}

// Positional argument k of a method, or nullopt when absent or none.
const Value* arg(const CallArgs& args, size_t k) {
  return k < args.positional.size() && !args.positional[k].is(K::None) && !args.positional[k].is(K::Undefined)
             ? &args.positional[k]
             : nullptr;
}

std::optional<std::string> string_arg(Renderer& r, const CallArgs& args, size_t k, std::string_view what, int line) {
  const Value* v = arg(args, k);
  if (!v) return std::nullopt;
  if (!v->is(K::String)) r.fail(line, cat(what, ": argument ", k + 1, " must be a string, found ", kind_name(v->kind)));
  return v->s();
}

Value string_method(Renderer& r, const Value& obj, const std::string& name, const CallArgs& args, int line) {
  const std::string& s = obj.s();
  const std::string what = cat("str.", name, "()");
  if (!args.named.empty()) r.fail(line, cat(what, " takes no keyword arguments in the subset"));
  if (name == "startswith" || name == "endswith") {
    const Value* p = arg(args, 0);
    if (!p || args.positional.size() > 1) r.fail(line, cat(what, " takes one argument (a string or a tuple of strings)"));
    std::vector<std::string> options;
    if (p->is(K::String)) options.push_back(p->s());
    else if (p->is(K::List))
      for (const Value& o : p->list->items) {
        if (!o.is(K::String)) r.fail(line, cat(what, ": the tuple must hold strings"));
        options.push_back(o.s());
      }
    else r.fail(line, cat(what, " needs a string or a tuple of strings, found ", kind_name(p->kind)));
    for (const std::string& o : options) {
      if (o.size() > s.size()) continue;
      if (name == "startswith" ? s.compare(0, o.size(), o) == 0 : s.compare(s.size() - o.size(), o.size(), o) == 0)
        return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    if (args.positional.size() > 1) r.fail(line, cat(what, " takes at most one argument"));
    return Value::string(strip(s, string_arg(r, args, 0, what, line), name != "rstrip", name != "lstrip"));
  }
  if (name == "split") {
    if (args.positional.size() > 2) r.fail(line, cat(what, " takes at most two arguments"));
    const std::optional<std::string> sep = string_arg(r, args, 0, what, line);
    if (sep && sep->empty()) r.fail(line, "str.split(): empty separator");
    const Value* max = arg(args, 1);
    if (max && !max->is(K::Int)) r.fail(line, "str.split(): maxsplit must be an integer");
    std::vector<Value> parts;
    for (std::string& part : split(s, sep, max ? max->i : -1)) parts.push_back(Value::string(std::move(part)));
    r.check_items(parts.size(), line);
    return r.arena().list(std::move(parts));
  }
  if (name == "replace") {
    const std::optional<std::string> old = string_arg(r, args, 0, what, line), with = string_arg(r, args, 1, what, line);
    if (!old || !with || args.positional.size() > 3) r.fail(line, "str.replace() takes (old, new[, count])");
    const Value* count = arg(args, 2);
    if (count && !count->is(K::Int)) r.fail(line, "str.replace(): count must be an integer");
    std::string out = replace(s, *old, *with, count ? count->i : -1);
    r.check_string(out.size(), line);
    return Value::string(std::move(out));
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    no_args(r, what, args, line);
    const Case mode = name == "upper" ? Case::Upper : name == "lower" ? Case::Lower : name == "title" ? Case::Title : Case::Capitalize;
    return Value::string(change_case(s, mode));
  }
  if (name == "isupper" || name == "islower") {
    no_args(r, what, args, line);
    return Value::boolean(letters_all(s, name == "isupper"));
  }
  if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum") {
    no_args(r, what, args, line);
    if (s.empty()) return Value::boolean(false);
    for (unsigned char c : s) {
      const bool ok = name == "isdigit"   ? (c >= '0' && c <= '9')
                      : name == "isspace" ? (c == ' ' || (c >= '\t' && c <= '\r'))
                      : name == "isalpha" ? std::isalpha(c) != 0
                                          : std::isalnum(c) != 0;
      if (!ok) return Value::boolean(false);  // ASCII classes only (docs/chat-templates.md)
    }
    return Value::boolean(true);
  }
  if (name == "find" || name == "count") {
    const std::optional<std::string> sub = string_arg(r, args, 0, what, line);
    if (!sub || args.positional.size() > 1) r.fail(line, cat(what, " takes one string argument"));
    if (name == "find") {
      const size_t at = s.find(*sub);
      return Value::integer(at == std::string::npos ? -1 : int64_t(code_point_starts(s.substr(0, at)).size()));
    }
    if (sub->empty()) return Value::integer(int64_t(code_point_starts(s).size()) + 1);
    int64_t n = 0;
    for (size_t at = s.find(*sub); at != std::string::npos; at = s.find(*sub, at + sub->size())) ++n;
    return Value::integer(n);
  }
  if (name == "join") {
    const Value* items = arg(args, 0);
    if (!items || args.positional.size() > 1 || !items->is(K::List)) r.fail(line, "str.join() takes one list of strings");
    std::string out;
    for (size_t k = 0; k < items->list->items.size(); ++k) {
      const Value& item = items->list->items[k];
      if (!item.is(K::String)) r.fail(line, cat("str.join(): item ", k, " is ", kind_name(item.kind), ", not str"));
      if (k) out += s;
      out += item.s();
      r.check_string(out.size(), line);
    }
    return Value::string(std::move(out));
  }
  r.fail(line, cat("str has no method '", name, "' in the subset (docs/chat-templates.md)"));
}

Value dict_method(Renderer& r, const Value& obj, const std::string& name, const CallArgs& args, int line) {
  const Dict& d = *obj.dict;
  if (name == "get") {
    if (args.positional.empty() || args.positional.size() > 2 || !args.named.empty())
      r.fail(line, "dict.get() takes (key[, default])");
    const Value& key = args.positional[0];
    const Value* found = key.is(K::String) ? d.find(key.s()) : nullptr;
    return found ? *found : args.positional.size() == 2 ? args.positional[1] : Value::none();
  }
  if (name == "items" || name == "keys" || name == "values") {
    no_args(r, cat("dict.", name, "()"), args, line);
    std::vector<Value> out;
    for (const auto& [key, value] : d.items) {
      if (name == "items") out.push_back(r.arena().list({Value::string(key), value}));
      else out.push_back(name == "keys" ? Value::string(key) : value);
    }
    r.step(line, int64_t(out.size() / 8));
    return r.arena().list(std::move(out));
  }
  return Value();  // not a dict method: the caller says so
}

}  // namespace

bool is_test(std::string_view name) {
  static constexpr std::string_view kNames[] = {
      "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "even", "false", "float", "ge", "greaterthan",
      "gt", "in", "integer", "iterable", "le", "lessthan", "lower", "lt", "mapping", "ne", "none", "number", "odd",
      "sameas", "sequence", "string", "true", "undefined", "upper"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

const char* test_names() { return LINEAGE_TESTS; }

bool apply_test(Renderer& r, const std::string& name, const Value& v, const CallArgs& args, int line) {
  r.step(line);
  const auto plain = [&] {
    if (!args.positional.empty() || !args.named.empty()) r.fail(line, cat("the test '", name, "' takes no arguments"));
  };
  const auto integral = [&](const Value& x) -> int64_t {
    if (x.is(K::Int)) return x.i;
    if (x.is(K::Bool)) return x.b;
    r.fail(line, cat("the test '", name, "' needs an integer, found ", kind_name(x.kind)));
  };
  if (name == "defined") return plain(), !v.is(K::Undefined);
  if (name == "undefined") return plain(), v.is(K::Undefined);
  if (name == "none") return plain(), v.is(K::None);
  if (name == "boolean") return plain(), v.is(K::Bool);
  if (name == "true") return plain(), v.is(K::Bool) && v.b;
  if (name == "false") return plain(), v.is(K::Bool) && !v.b;
  if (name == "integer") return plain(), v.is(K::Int);
  if (name == "float") return plain(), v.is(K::Float);
  if (name == "number") return plain(), v.is(K::Int) || v.is(K::Float) || v.is(K::Bool);
  if (name == "string") return plain(), v.is(K::String);
  if (name == "mapping") return plain(), v.is(K::Dict);
  if (name == "iterable") return plain(), v.is(K::String) || v.is(K::List) || v.is(K::Dict) || v.is(K::Undefined);
  if (name == "sequence") return plain(), v.is(K::String) || v.is(K::List) || v.is(K::Dict);
  if (name == "callable") return plain(), v.is(K::Macro);
  if (name == "lower" || name == "upper") return plain(), v.is(K::String) && letters_all(v.s(), name == "upper");
  if (name == "even" || name == "odd") {
    plain();
    return (integral(v) % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    const int64_t d = integral(only_arg(r, name, args, line));
    if (d == 0) r.fail(line, "divisibleby 0");
    return d == -1 || integral(v) % d == 0;
  }
  if (name == "sameas") {
    const Value& o = only_arg(r, name, args, line);
    if (v.kind != o.kind) return false;
    switch (v.kind) {
      case K::None:
      case K::Undefined: return true;
      case K::Bool: return v.b == o.b;
      case K::List: return v.list == o.list;
      case K::Dict:
      case K::Namespace: return v.dict == o.dict;
      case K::Macro: return v.macro == o.macro;
      default: return equal(v, o);
    }
  }
  static const std::pair<std::string_view, std::string_view> kComparisons[] = {
      {"eq", "=="}, {"equalto", "=="}, {"ne", "!="}, {"lt", "<"}, {"lessthan", "<"}, {"le", "<="},
      {"gt", ">"}, {"greaterthan", ">"}, {"ge", ">="}, {"in", "in"}};
  for (const auto& [test, op] : kComparisons) {
    if (name != test) continue;
    // Through the operators' code: `x is lt 3` is `x < 3`, `x is in xs` is `x in xs`.
    return r.compare(std::string(op), v, only_arg(r, name, args, line), line);
  }
  r.fail(line, cat("unknown test '", name, "'"));
}

Value call_method(Renderer& r, const Value& obj, const std::string& name, const CallArgs& args, int line) {
  r.step(line);
  if (obj.is(K::String)) return string_method(r, obj, name, args, line);
  if (obj.is(K::Dict)) {
    Value out = dict_method(r, obj, name, args, line);
    if (!out.is(K::Undefined)) return out;
    if (name == "update" || name == "pop" || name == "setdefault" || name == "clear" || name == "popitem")
      r.fail(line, cat("dict.", name, "() changes a dict; transformers renders templates in an immutable sandbox, "
                       "so only namespace() attributes can be set"));
  }
  if (obj.is(K::List)) {
    static constexpr std::string_view kMutating[] = {"append", "pop", "extend", "insert", "remove", "clear", "sort", "reverse"};
    if (std::find(std::begin(kMutating), std::end(kMutating), name) != std::end(kMutating))
      r.fail(line, cat("list.", name, "() changes a list; transformers renders templates in an immutable sandbox, "
                       "so a template cannot; build a new list with + instead"));
  }
  r.fail(line, cat(kind_name(obj.kind), " has no method '", name, "' in the subset (docs/chat-templates.md)"));
}

bool is_global(std::string_view name) {
  return name == "range" || name == "namespace" || name == "dict" || name == "raise_exception" || name == "strftime_now";
}

bool call_global(Renderer& r, const std::string& name, const CallArgs& args, int line, Value& result) {
  if (!is_global(name)) return false;
  r.step(line);
  if (name == "raise_exception") {
    const std::string message = args.positional.empty() ? "" : args.positional[0].is(K::String) ? args.positional[0].s()
                                                                                                : to_string(args.positional[0]);
    r.fail(line, cat("the template raised an exception: ", message));
  }
  if (name == "namespace" || name == "dict") {
    result = name == "namespace" ? r.arena().namespace_object() : r.arena().dict();
    if (args.positional.size() > 1 || (args.positional.size() == 1 && !args.positional[0].is_mapping()))
      r.fail(line, cat(name, "() takes keyword arguments (or one dict)"));
    if (args.positional.size() == 1)
      for (const auto& [key, value] : args.positional[0].dict->items) result.dict->set(key, value);
    for (const auto& [key, value] : args.named) result.dict->set(key, value);
    return true;
  }
  if (name == "range") {
    if (args.positional.empty() || args.positional.size() > 3 || !args.named.empty())
      r.fail(line, "range() takes (stop), (start, stop) or (start, stop, step)");
    int64_t bounds[3] = {0, 0, 1};
    for (size_t k = 0; k < args.positional.size(); ++k) {
      const Value& a = args.positional[k];
      if (!a.is(K::Int) && !a.is(K::Bool)) r.fail(line, cat("range() needs integers, found ", kind_name(a.kind)));
      bounds[args.positional.size() == 1 ? 1 : k] = a.is(K::Bool) ? a.b : a.i;
    }
    const int64_t start = bounds[0], stop = bounds[1], step = bounds[2];
    if (step == 0) r.fail(line, "range() step cannot be zero");
    const __int128 span = step > 0 ? __int128(stop) - start : __int128(start) - stop;
    const __int128 count = span <= 0 ? 0 : (span + (step > 0 ? step : -__int128(step)) - 1) / (step > 0 ? step : -__int128(step));
    if (count > __int128(INT64_MAX)) r.check_items(size_t(-1), line);
    r.check_items(size_t(count), line);
    std::vector<Value> items;
    items.reserve(size_t(count));
    for (int64_t k = 0; k < int64_t(count); ++k) items.push_back(Value::integer(int64_t(start + __int128(k) * step)));
    result = r.arena().list(std::move(items));
    return true;
  }
  // strftime_now(format): the local time, as transformers passes it (Llama 3.1+ templates date the prompt).
  if (args.positional.size() != 1 || !args.positional[0].is(K::String) || !args.named.empty())
    r.fail(line, "strftime_now() takes one format string");
  const std::string& format = args.positional[0].s();
  if (format.size() > 256) r.fail(line, "strftime_now(): the format is longer than 256 bytes");
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[1024];
  const size_t n = format.empty() ? 0 : std::strftime(buf, sizeof(buf), format.c_str(), &local);
  result = Value::string(std::string(buf, n));
  return true;
}

}  // namespace lineage::chat::jinja
