// The filters, tests, methods and global functions of the subset (docs/chat-templates.md lists
// them), with Jinja2's arguments and defaults and transformers' tojson (json.dumps with
// ensure_ascii=False). List and dict methods that mutate are refused, as transformers' immutable
// sandbox refuses them.
// Over 400 lines, one concept: a table of small functions, one per Jinja builtin.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <initializer_list>

#include "lineage/core/error.h"
#include "lineage/chat/eval.h"
#include "lineage/chat/text.h"

namespace lineage::chat::jinja {

namespace {

using K = Value::Kind;

// Binds positional and keyword arguments to parameter names, as a Python call would.
class Params {
 public:
  Params(Renderer& r, int line, std::string_view what, const CallArgs& args, std::initializer_list<std::string_view> names)
      : r_(r), line_(line), names_(names), given_(names.size(), nullptr) {
    if (args.positional.size() > names_.size())
      r.fail(line, cat(what, " takes at most ", names_.size(), " arguments, got ", args.positional.size()));
    for (size_t k = 0; k < args.positional.size(); ++k) given_[k] = &args.positional[k];
    for (const auto& [name, value] : args.named) {
      size_t k = 0;
      while (k < names_.size() && names_[k] != name) ++k;
      if (k == names_.size()) r.fail(line, cat(what, " has no argument '", name, "'"));
      if (given_[k]) r.fail(line, cat(what, " got argument '", name, "' twice"));
      given_[k] = &value;
    }
  }
  const Value* get(size_t k) const {
    const Value* v = given_[k];
    return v && !v->is(K::Undefined) ? v : nullptr;
  }
  bool flag(size_t k, bool fallback) const { return get(k) ? truthy(*get(k)) : fallback; }
  int64_t integer(size_t k, int64_t fallback) const {
    const Value* v = get(k);
    if (!v || v->is(K::None)) return fallback;
    if (v->is(K::Int)) return v->i;
    if (v->is(K::Bool)) return v->b;
    r_.fail(line_, cat("argument '", names_[k], "' must be an integer, found ", kind_name(v->kind)));
  }
  std::optional<std::string> text(size_t k) const {
    const Value* v = get(k);
    if (!v || v->is(K::None)) return std::nullopt;
    if (!v->is(K::String)) r_.fail(line_, cat("argument '", names_[k], "' must be a string, found ", kind_name(v->kind)));
    return v->s();
  }

 private:
  Renderer& r_;
  int line_;
  std::vector<std::string_view> names_;
  std::vector<const Value*> given_;
};

std::string str_of(const Value& v) { return v.is(K::String) ? v.s() : to_string(v); }

Value make_string(Renderer& r, std::string s, int line) {
  r.check_string(s.size(), line);
  return Value::string(std::move(s));
}

// The items a filter iterates: a list's items, a string's code points, a dict's keys.
std::vector<Value> elements(Renderer& r, const Value& v, int line, std::string_view what) {
  std::vector<Value> out;
  switch (v.kind) {
    case K::List: return v.list->items;
    case K::Dict:
      for (const auto& item : v.dict->items) out.push_back(Value::string(item.first));
      return out;
    case K::String: {
      const std::string& s = v.s();
      const std::vector<size_t> starts = code_point_starts(s);
      for (size_t k = 0; k < starts.size(); ++k)
        out.push_back(Value::string(s.substr(starts[k], (k + 1 < starts.size() ? starts[k + 1] : s.size()) - starts[k])));
      return out;
    }
    case K::Undefined: return out;
    default: r.fail(line, cat(what, " needs a list, string or dict, found ", kind_name(v.kind)));
  }
}

// Jinja's attribute lookup of map/selectattr/sort(attribute=...): "a.b" and "0" walk inside.
Value lookup_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t from = 0;
  for (;;) {
    const size_t dot = path.find('.', from);
    const std::string part = path.substr(from, dot == std::string::npos ? std::string::npos : dot - from);
    Value next;
    if (cur.is_mapping()) {
      if (const Value* found = cur.dict->find(part)) next = *found;
    } else if (cur.is(K::List) && !part.empty() && part.find_first_not_of("0123456789") == std::string::npos &&
               part.size() < 10) {
      const size_t k = size_t(std::atoi(part.c_str()));
      if (k < cur.list->items.size()) next = cur.list->items[k];
    }
    cur = next;
    if (dot == std::string::npos || cur.is(K::Undefined)) return cur;
    from = dot + 1;
  }
}

// Python's ordering for sort/min/max/dictsort (strings case-folded unless case_sensitive).
int order(Renderer& r, const Value& a, const Value& b, bool case_sensitive, int line) {
  const auto num = [](const Value& v) { return v.is(K::Int) || v.is(K::Float) || v.is(K::Bool); };
  if (num(a) && num(b)) {
    const double x = a.is(K::Float) ? a.f : double(a.is(K::Bool) ? a.b : a.i);
    const double y = b.is(K::Float) ? b.f : double(b.is(K::Bool) ? b.b : b.i);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is(K::String) && b.is(K::String)) {
    if (case_sensitive) return a.s().compare(b.s());
    return change_case(a.s(), Case::Lower).compare(change_case(b.s(), Case::Lower));
  }
  if (a.is(K::List) && b.is(K::List)) {
    const auto &x = a.list->items, &y = b.list->items;
    for (size_t k = 0; k < x.size() && k < y.size(); ++k)
      if (const int c = r.nested(line, [&] { return order(r, x[k], y[k], case_sensitive, line); })) return c;
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  if (a.is(K::None) && b.is(K::None)) return 0;
  r.fail(line, cat("cannot order ", kind_name(a.kind), " and ", kind_name(b.kind)));
}

Value sorted(Renderer& r, std::vector<Value> items, bool reverse, bool case_sensitive, const std::optional<std::string>& attr,
             int line) {
  r.step(line, int64_t(items.size()) * 4);
  const auto key = [&](const Value& v) { return attr ? lookup_path(v, *attr) : v; };
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    const int c = order(r, key(a), key(b), case_sensitive, line);
    return reverse ? c > 0 : c < 0;
  });
  return r.arena().list(std::move(items));
}

Value filter_tojson(Renderer& r, const Value& v, const CallArgs& args, int line) {
  const Params p(r, line, "tojson", args, {"indent", "ensure_ascii", "separators", "sort_keys"});
  JsonStyle style;
  if (p.get(0) && !p.get(0)->is(K::None)) {
    style.indent = int(std::clamp<int64_t>(p.integer(0, 0), 0, 64));
    style.item_sep = ",";
  }
  style.ensure_ascii = p.flag(1, false);
  style.sort_keys = p.flag(3, false);
  if (const Value* sep = p.get(2); sep && !sep->is(K::None)) {
    if (!sep->is(K::List) || sep->list->items.size() != 2 || !sep->list->items[0].is(K::String) ||
        !sep->list->items[1].is(K::String))
      r.fail(line, "tojson's separators must be a pair of strings, such as (',', ':')");
    style.item_sep = sep->list->items[0].s();
    style.key_sep = sep->list->items[1].s();
  }
  std::string out;
  try {
    to_json(v, style, out);
  } catch (const ValueTooDeep&) {
    r.fail(line, cat("tojson: the value nests more than ", kMaxValueDepth, " levels deep"));
  }
  return make_string(r, std::move(out), line);
}

Value filter_select(Renderer& r, const Value& v, const CallArgs& args, int line, bool by_attr, bool keep) {
  const char* what = by_attr ? (keep ? "selectattr" : "rejectattr") : (keep ? "select" : "reject");
  const size_t skip = by_attr ? 2 : 1;  // (attribute,) test name, then the test's arguments
  if (args.positional.size() < (by_attr ? 1u : 0u)) r.fail(line, cat(what, " needs an attribute name"));
  std::optional<std::string> attr;
  if (by_attr) {
    if (!args.positional[0].is(K::String)) r.fail(line, cat(what, "'s attribute must be a string"));
    attr = args.positional[0].s();
  }
  std::optional<std::string> test;
  if (args.positional.size() >= skip) {
    const Value& t = args.positional[skip - 1];
    if (!t.is(K::String) || !is_test(t.s())) r.fail(line, cat(what, ": unknown test ", str_of(t), " (the subset has: ", test_names(), ")"));
    test = t.s();
  }
  CallArgs test_args;
  for (size_t k = skip; k < args.positional.size(); ++k) test_args.positional.push_back(args.positional[k]);
  std::vector<Value> out;
  for (const Value& item : elements(r, v, line, what)) {
    const Value subject = attr ? lookup_path(item, *attr) : item;
    const bool pass = test ? r.nested(line, [&] { return apply_test(r, *test, subject, test_args, line); }) : truthy(subject);
    if (pass == keep) out.push_back(item);
    r.step(line);
  }
  return r.arena().list(std::move(out));
}

Value filter_map(Renderer& r, const Value& v, const CallArgs& args, int line) {
  std::vector<Value> out;
  const Value* attribute = nullptr;
  const Value* fallback = nullptr;
  for (const auto& [name, value] : args.named) {
    if (name == "attribute") attribute = &value;
    else if (name == "default") fallback = &value;
    else if (!args.positional.empty()) r.fail(line, cat("map has no argument '", name, "'"));
  }
  if (attribute) {
    const std::string path = str_of(*attribute);
    for (const Value& item : elements(r, v, line, "map")) {
      Value got = lookup_path(item, path);
      out.push_back(got.is(K::Undefined) && fallback ? *fallback : got);
    }
    return r.arena().list(std::move(out));
  }
  if (args.positional.empty() || !args.positional[0].is(K::String)) r.fail(line, "map needs a filter name or attribute=");
  const std::string filter = args.positional[0].s();
  if (!is_filter(filter)) r.fail(line, cat("map: unknown filter '", filter, "' (the subset has: ", filter_names(), ")"));
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.named = args.named;
  for (const Value& item : elements(r, v, line, "map"))
    out.push_back(r.nested(line, [&] { return apply_filter(r, filter, item, rest, line); }));
  return r.arena().list(std::move(out));
}

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// Jinja's |indent: every line but the first (and blank ones unless blank=true) gets `width` spaces.
std::string indent(std::string_view s, const std::string& pad, bool first, bool blank) {
  std::vector<std::string> lines;
  std::string text(s);
  text += '\n';
  size_t from = 0;
  while (from < text.size()) {
    size_t at = text.find_first_of("\r\n", from);
    lines.push_back(text.substr(from, at - from));
    from = at + (text[at] == '\r' && at + 1 < text.size() && text[at + 1] == '\n' ? 2 : 1);
  }
  std::string out = lines.empty() ? "" : lines[0];
  for (size_t k = 1; k < lines.size(); ++k) out += "\n" + (blank || !lines[k].empty() ? pad + lines[k] : lines[k]);
  return first ? pad + out : out;
}

Value filter_number(Renderer& r, const Value& v, const CallArgs& args, int line, bool want_int) {
  const Params p(r, line, want_int ? "int" : "float", args, {"default", "base"});
  const Value fallback = p.get(0) ? *p.get(0) : want_int ? Value::integer(0) : Value::real(0);
  double x = 0;
  if (v.is(K::Int) || v.is(K::Bool)) {
    x = double(v.is(K::Bool) ? v.b : v.i);
    if (want_int) return Value::integer(v.is(K::Bool) ? v.b : v.i);
  } else if (v.is(K::Float)) {
    x = v.f;
  } else if (v.is(K::String)) {
    const std::string t = strip(v.s(), std::nullopt, true, true);
    char* end = nullptr;
    if (want_int) {
      const long long base = p.integer(1, 10);
      if (base < 2 || base > 36) return fallback;
      errno = 0;
      const long long i = std::strtoll(t.c_str(), &end, int(base));
      if (!t.empty() && end == t.c_str() + t.size() && errno == 0) return Value::integer(i);
    }
    x = std::strtod(t.c_str(), &end);
    if (t.empty() || end != t.c_str() + t.size()) return fallback;
  } else {
    return fallback;
  }
  if (!want_int) return Value::real(x);
  if (!std::isfinite(x) || std::fabs(x) >= 9.2e18) return fallback;
  return Value::integer(int64_t(x));
}

}  // namespace

// The table of filters: what is_filter knows is exactly what apply_filter runs.
#define LINEAGE_FILTERS                                                                                           \
  "abs, capitalize, count, d, default, dictsort, e, escape, first, float, indent, int, items, join, last, length, " \
  "list, lower, map, max, min, reject, rejectattr, replace, reverse, round, safe, select, selectattr, sort, string, " \
  "sum, title, tojson, trim, unique, upper"

bool is_filter(std::string_view name) {
  static constexpr std::string_view kNames[] = {
      "abs", "capitalize", "count", "d", "default", "dictsort", "e", "escape", "first", "float", "indent", "int", "items",
      "join", "last", "length", "list", "lower", "map", "max", "min", "reject", "rejectattr", "replace", "reverse", "round",
      "safe", "select", "selectattr", "sort", "string", "sum", "title", "tojson", "trim", "unique", "upper"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

const char* filter_names() { return LINEAGE_FILTERS; }

Value apply_filter(Renderer& r, const std::string& name, const Value& v, const CallArgs& args, int line) {
  r.step(line);
  const auto no_args = [&] {
    if (!args.positional.empty() || !args.named.empty()) r.fail(line, cat("the filter '", name, "' takes no arguments"));
  };
  if (name == "tojson") return filter_tojson(r, v, args, line);
  if (name == "trim") {
    const Params p(r, line, "trim", args, {"chars"});
    return Value::string(strip(str_of(v), p.text(0), true, true));
  }
  if (name == "length" || name == "count") {
    no_args();
    switch (v.kind) {
      case K::String: return Value::integer(int64_t(code_point_starts(v.s()).size()));
      case K::List: return Value::integer(int64_t(v.list->items.size()));
      case K::Dict:
      case K::Namespace: return Value::integer(int64_t(v.dict->items.size()));
      case K::Undefined: return Value::integer(0);
      default: r.fail(line, cat("|", name, ": ", kind_name(v.kind), " has no length"));
    }
  }
  if (name == "default" || name == "d") {
    const Params p(r, line, name, args, {"default_value", "boolean"});
    const bool replace_it = v.is(K::Undefined) || (p.flag(1, false) && !truthy(v));
    if (!replace_it) return v;
    return args.positional.empty() && args.named.empty() ? Value::string("") : (p.get(0) ? *p.get(0) : Value::string(""));
  }
  if (name == "string") {
    no_args();
    return v.is(K::String) ? v : make_string(r, to_string(v), line);
  }
  if (name == "safe") {
    no_args();
    return v;
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    no_args();
    const Case mode = name == "upper" ? Case::Upper : name == "lower" ? Case::Lower : name == "title" ? Case::JinjaTitle : Case::Capitalize;
    return Value::string(change_case(str_of(v), mode));
  }
  if (name == "escape" || name == "e") {
    no_args();
    return make_string(r, html_escape(str_of(v)), line);
  }
  if (name == "replace") {
    const Params p(r, line, "replace", args, {"old", "new", "count"});
    if (!p.text(0) || !p.text(1)) r.fail(line, "replace needs the old and the new string");
    std::string out = replace(str_of(v), *p.text(0), *p.text(1), p.integer(2, -1));
    return make_string(r, std::move(out), line);
  }
  if (name == "join") {
    const Params p(r, line, "join", args, {"d", "attribute"});
    const std::string sep = p.text(0).value_or("");
    const std::optional<std::string> attr = p.get(1) ? std::optional<std::string>(str_of(*p.get(1))) : std::nullopt;
    std::string out;
    bool first = true;
    for (const Value& item : elements(r, v, line, "join")) {
      if (!first) out += sep;
      first = false;
      out += str_of(attr ? lookup_path(item, *attr) : item);
      r.check_string(out.size(), line);
    }
    return Value::string(std::move(out));
  }
  if (name == "first" || name == "last") {
    no_args();
    const std::vector<Value> items = elements(r, v, line, name);
    return items.empty() ? Value() : name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    no_args();
    return r.arena().list(elements(r, v, line, "list"));
  }
  if (name == "reverse") {
    no_args();
    std::vector<Value> items = elements(r, v, line, "reverse");
    std::reverse(items.begin(), items.end());
    if (!v.is(K::String)) return r.arena().list(std::move(items));
    std::string out;
    for (const Value& c : items) out += c.s();
    return Value::string(std::move(out));
  }
  if (name == "items") {
    no_args();
    if (v.is(K::Undefined)) return r.arena().list();
    if (!v.is_mapping()) r.fail(line, cat("|items needs a dict, found ", kind_name(v.kind)));
    std::vector<Value> out;
    for (const auto& [key, value] : v.dict->items) out.push_back(r.arena().list({Value::string(key), value}));
    return r.arena().list(std::move(out));
  }
  if (name == "dictsort") {
    const Params p(r, line, "dictsort", args, {"case_sensitive", "by", "reverse"});
    if (!v.is_mapping()) r.fail(line, cat("|dictsort needs a dict, found ", kind_name(v.kind)));
    const std::string by = p.text(1).value_or("key");
    if (by != "key" && by != "value") r.fail(line, "dictsort's by must be 'key' or 'value'");
    std::vector<Value> pairs;
    for (const auto& [key, value] : v.dict->items) pairs.push_back(r.arena().list({Value::string(key), value}));
    return sorted(r, std::move(pairs), p.flag(2, false), p.flag(0, false), std::string(by == "key" ? "0" : "1"), line);
  }
  if (name == "sort") {
    const Params p(r, line, "sort", args, {"reverse", "case_sensitive", "attribute"});
    const std::optional<std::string> attr = p.get(2) ? std::optional<std::string>(str_of(*p.get(2))) : std::nullopt;
    return sorted(r, elements(r, v, line, "sort"), p.flag(0, false), p.flag(1, false), attr, line);
  }
  if (name == "unique") {
    const Params p(r, line, "unique", args, {"case_sensitive", "attribute"});
    const std::optional<std::string> attr = p.get(1) ? std::optional<std::string>(str_of(*p.get(1))) : std::nullopt;
    std::vector<Value> out, keys;
    for (const Value& item : elements(r, v, line, "unique")) {
      Value key = attr ? lookup_path(item, *attr) : item;
      if (!p.flag(0, false) && key.is(K::String)) key = Value::string(change_case(key.s(), Case::Lower));
      bool seen = false;
      for (const Value& k : keys) seen = seen || equal(k, key);
      r.step(line, int64_t(keys.size()) / 8);
      if (!seen) {
        keys.push_back(key);
        out.push_back(item);
      }
    }
    return r.arena().list(std::move(out));
  }
  if (name == "min" || name == "max") {
    const Params p(r, line, name, args, {"case_sensitive", "attribute"});
    const std::optional<std::string> attr = p.get(1) ? std::optional<std::string>(str_of(*p.get(1))) : std::nullopt;
    const Value s = sorted(r, elements(r, v, line, name), name == "max", p.flag(0, false), attr, line);
    return s.list->items.empty() ? Value() : s.list->items.front();
  }
  if (name == "sum") {
    const Params p(r, line, "sum", args, {"attribute", "start"});
    Value total = p.get(1) ? *p.get(1) : Value::integer(0);
    const std::optional<std::string> attr = p.get(0) ? std::optional<std::string>(str_of(*p.get(0))) : std::nullopt;
    for (const Value& item : elements(r, v, line, "sum")) {
      const Value x = attr ? lookup_path(item, *attr) : item;
      const bool ints = (total.is(K::Int) || total.is(K::Bool)) && (x.is(K::Int) || x.is(K::Bool));
      if (!(total.is_number() || total.is(K::Bool)) || !(x.is_number() || x.is(K::Bool)))
        r.fail(line, cat("|sum: cannot add ", kind_name(total.kind), " and ", kind_name(x.kind)));
      if (ints) {
        int64_t out = 0;
        if (__builtin_add_overflow(total.is(K::Bool) ? total.b : total.i, x.is(K::Bool) ? x.b : x.i, &out))
          r.fail(line, "integer overflow in |sum");
        total = Value::integer(out);
      } else {
        total = Value::real((total.is(K::Bool) ? double(total.b) : total.as_double()) + (x.is(K::Bool) ? double(x.b) : x.as_double()));
      }
    }
    return total;
  }
  if (name == "abs") {
    no_args();
    if (v.is(K::Float)) return Value::real(std::fabs(v.f));
    if (v.is(K::Int) || v.is(K::Bool)) {
      const int64_t x = v.is(K::Bool) ? v.b : v.i;
      if (x == INT64_MIN) r.fail(line, "integer overflow in |abs");
      return Value::integer(x < 0 ? -x : x);
    }
    r.fail(line, cat("|abs needs a number, found ", kind_name(v.kind)));
  }
  if (name == "round") {
    const Params p(r, line, "round", args, {"precision", "method"});
    if (!v.is_number() && !v.is(K::Bool)) r.fail(line, cat("|round needs a number, found ", kind_name(v.kind)));
    const double x = v.is(K::Bool) ? double(v.b) : v.as_double();
    const double scale = std::pow(10.0, double(std::clamp<int64_t>(p.integer(0, 0), -300, 300)));
    const std::string method = p.text(1).value_or("common");
    double y = x * scale;
    if (method == "common") y = std::round(y);
    else if (method == "floor") y = std::floor(y);
    else if (method == "ceil") y = std::ceil(y);
    else r.fail(line, "round's method must be 'common', 'floor' or 'ceil'");
    return Value::real(y / scale);
  }
  if (name == "int" || name == "float") return filter_number(r, v, args, line, name == "int");
  if (name == "indent") {
    const Params p(r, line, "indent", args, {"width", "first", "blank"});
    std::string pad;
    if (p.get(0) && p.get(0)->is(K::String)) pad = p.get(0)->s();
    else pad.assign(size_t(std::clamp<int64_t>(p.integer(0, 4), 0, 4096)), ' ');
    return make_string(r, indent(str_of(v), pad, p.flag(1, false), p.flag(2, false)), line);
  }
  if (name == "map") return filter_map(r, v, args, line);
  if (name == "select" || name == "reject") return filter_select(r, v, args, line, false, name == "select");
  if (name == "selectattr" || name == "rejectattr") return filter_select(r, v, args, line, true, name == "selectattr");
  r.fail(line, cat("unknown filter '", name, "'"));
}

}  // namespace lineage::chat::jinja
