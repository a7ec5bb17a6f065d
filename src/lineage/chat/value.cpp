#include "lineage/chat/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace lineage::chat::jinja {

const std::string& Value::s() const {
  static const std::string empty;
  return kind == Kind::String && str ? *str : empty;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(std::string key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

const Value* Scope::find(std::string_view name) const {
  for (const Scope* scope = this; scope; scope = scope->parent)
    if (const Value* v = scope->vars.find(name)) return v;
  return nullptr;
}

Value Arena::list(std::vector<Value> items) {
  Value x;
  x.kind = Value::Kind::List;
  x.list = &lists_.emplace_back(List{std::move(items)});
  return x;
}

Value Arena::dict() {
  Value x;
  x.kind = Value::Kind::Dict;
  x.dict = &dicts_.emplace_back();
  return x;
}

Value Arena::namespace_object() {
  Value x = dict();
  x.kind = Value::Kind::Namespace;
  return x;
}

Value Arena::macro(const MacroDef* def, Scope* closure) {
  Value x;
  x.kind = Value::Kind::Macro;
  x.macro = &macros_.emplace_back(Macro{def, closure});
  return x;
}

Scope* Arena::scope(Scope* parent) {
  Scope& s = scopes_.emplace_back();
  s.parent = parent;
  return &s;
}

const char* kind_name(Value::Kind kind) {
  switch (kind) {
    case Value::Kind::Undefined: return "undefined";
    case Value::Kind::None: return "none";
    case Value::Kind::Bool: return "bool";
    case Value::Kind::Int: return "int";
    case Value::Kind::Float: return "float";
    case Value::Kind::String: return "str";
    case Value::Kind::List: return "list";
    case Value::Kind::Dict: return "dict";
    case Value::Kind::Namespace: return "namespace";
    case Value::Kind::Macro: return "macro";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return false;
    case Value::Kind::Bool: return v.b;
    case Value::Kind::Int: return v.i != 0;
    case Value::Kind::Float: return v.f != 0;
    case Value::Kind::String: return !v.s().empty();
    case Value::Kind::List: return !v.list->items.empty();
    case Value::Kind::Dict: return !v.dict->items.empty();
    case Value::Kind::Namespace:
    case Value::Kind::Macro: return true;
  }
  return false;
}

namespace {

bool equal_at(const Value& a, const Value& b, int depth) {
  using K = Value::Kind;
  if (depth > kMaxValueDepth) throw ValueTooDeep{};
  // Python: True == 1 and 1 == 1.0 (bool is an int).
  const auto numeric = [](const Value& v) { return v.is_number() || v.is(K::Bool); };
  if (numeric(a) && numeric(b)) {
    const auto as_int = [](const Value& v) { return v.is(K::Bool) ? int64_t(v.b) : v.i; };
    if (a.is(K::Float) || b.is(K::Float)) {
      const auto as_real = [&](const Value& v) { return v.is(K::Float) ? v.f : double(as_int(v)); };
      return as_real(a) == as_real(b);
    }
    return as_int(a) == as_int(b);
  }
  // @huggingface/jinja: an undefined value equals none.
  const auto nullish = [](const Value& v) { return v.is(K::None) || v.is(K::Undefined); };
  if (nullish(a) || nullish(b)) return nullish(a) && nullish(b);
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::String: return a.s() == b.s();
    case K::List: {
      const auto &x = a.list->items, &y = b.list->items;
      if (x.size() != y.size()) return false;
      for (size_t k = 0; k < x.size(); ++k)
        if (!equal_at(x[k], y[k], depth + 1)) return false;
      return true;
    }
    case K::Dict:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [key, value] : a.dict->items) {
        const Value* other = b.dict->find(key);
        if (!other || !equal_at(value, *other, depth + 1)) return false;
      }
      return true;
    case K::Namespace: return a.dict == b.dict;
    case K::Macro: return a.macro == b.macro;
    default: return false;
  }
}

}  // namespace

bool equal(const Value& a, const Value& b) { return equal_at(a, b, 0); }

std::string float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  // Shortest round-trip digits, then Python's layout: positional for exponents in [-4, 16).
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  const int exp = std::atoi(sci.c_str() + e + 1);
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits += c;
  std::string out;
  if (exp >= 16 || exp < -4) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += ebuf;
  } else if (exp >= 0) {
    if (digits.size() <= size_t(exp) + 1) {
      out = digits + std::string(size_t(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, size_t(exp) + 1) + "." + digits.substr(size_t(exp) + 1);
    }
  } else {
    out = "0." + std::string(size_t(-exp - 1), '0') + digits;
  }
  return negative ? "-" + out : out;
}

std::string to_string(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return "";
    case Value::Kind::Bool: return v.b ? "true" : "false";
    case Value::Kind::Int: return std::to_string(v.i);
    case Value::Kind::Float: return float_repr(v.f);
    case Value::Kind::String: return v.s();
    case Value::Kind::Macro: return "<macro>";
    default: {
      std::string out;
      to_json(v, JsonStyle{}, out);
      return out;
    }
  }
}

namespace {

void json_string(std::string_view s, bool ensure_ascii, std::string& out) {
  out += '"';
  const auto hex4 = [&out](uint32_t u) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), "\\u%04x", unsigned(u));
    out += buf;
  };
  for (size_t k = 0; k < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[k]);
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c == '\b') out += "\\b";
    else if (c == '\f') out += "\\f";
    else if (c < 0x20) hex4(c);
    else if (c < 0x80 || !ensure_ascii) {
      out += char(c);
      ++k;
      continue;
    } else {
      // Decode one code point for \uXXXX (a surrogate pair past the BMP), as json.dumps does.
      const int n = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
      uint32_t cp = n == 1 ? 0xFFFD : (c & (0x7F >> n));
      bool ok = n > 1 && k + size_t(n) <= s.size();
      for (int j = 1; ok && j < n; ++j) {
        const unsigned char d = static_cast<unsigned char>(s[k + size_t(j)]);
        ok = (d >> 6) == 2;
        cp = (cp << 6) | (d & 0x3F);
      }
      if (!ok) {
        hex4(0xFFFD);
        ++k;
        continue;
      }
      if (cp >= 0x10000) {
        hex4(0xD800 + ((cp - 0x10000) >> 10));
        hex4(0xDC00 + ((cp - 0x10000) & 0x3FF));
      } else {
        hex4(cp);
      }
      k += size_t(n);
      continue;
    }
    ++k;
  }
  out += '"';
}

void json_value(const Value& v, const JsonStyle& style, std::string& out, int depth) {
  if (depth > kMaxValueDepth) throw ValueTooDeep{};
  const auto newline = [&](int level) {
    if (style.indent < 0) return;
    out += '\n';
    out.append(size_t(style.indent) * size_t(level), ' ');
  };
  switch (v.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.b ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.i); return;
    case Value::Kind::Float:
      out += std::isfinite(v.f) ? float_repr(v.f) : (std::isnan(v.f) ? "NaN" : v.f < 0 ? "-Infinity" : "Infinity");
      return;
    case Value::Kind::String: json_string(v.s(), style.ensure_ascii, out); return;
    case Value::Kind::Macro: json_string("<macro>", false, out); return;
    case Value::Kind::List: {
      const auto& items = v.list->items;
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += style.item_sep;
        newline(depth + 1);
        json_value(items[k], style, out, depth + 1);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::Dict:
    case Value::Kind::Namespace: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : v.dict->items) items.push_back(&item);
      if (style.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += style.item_sep;
        newline(depth + 1);
        json_string(items[k]->first, style.ensure_ascii, out);
        out += style.key_sep;
        json_value(items[k]->second, style, out, depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    }
  }
}

Value from_json_at(const nlohmann::ordered_json& j, Arena& arena, int depth) {
  using T = nlohmann::ordered_json::value_t;
  if (depth > kMaxValueDepth) throw ValueTooDeep{};
  switch (j.type()) {
    case T::null: return Value::none();
    case T::boolean: return Value::boolean(j.get<bool>());
    case T::number_integer: return Value::integer(j.get<int64_t>());
    case T::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      return u <= uint64_t(INT64_MAX) ? Value::integer(int64_t(u)) : Value::real(double(u));
    }
    case T::number_float: return Value::real(j.get<double>());
    case T::string: return Value::string(j.get<std::string>());
    case T::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json_at(e, arena, depth + 1));
      return arena.list(std::move(items));
    }
    case T::object: {
      Value d = arena.dict();
      for (const auto& [k, e] : j.items()) d.dict->set(k, from_json_at(e, arena, depth + 1));
      return d;
    }
    default: return Value();  // binary and discarded values have no template meaning
  }
}

}  // namespace

void to_json(const Value& v, const JsonStyle& style, std::string& out) { json_value(v, style, out, 0); }

Value from_json(const nlohmann::ordered_json& j, Arena& arena) { return from_json_at(j, arena, 0); }

std::vector<size_t> code_point_starts(std::string_view s) {
  std::vector<size_t> starts;
  starts.reserve(s.size());
  for (size_t k = 0; k < s.size();) {
    starts.push_back(k);
    const unsigned char c = static_cast<unsigned char>(s[k]);
    size_t n = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (k + n > s.size()) n = 1;
    for (size_t j = 1; j < n; ++j)
      if ((static_cast<unsigned char>(s[k + j]) >> 6) != 2) n = 1;
    k += n;
  }
  return starts;
}


}  // namespace lineage::chat::jinja
