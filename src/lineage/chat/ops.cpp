// Operators, comparisons, attribute and item access, and slices, with Python's semantics where
// they decide a result (floor division and modulo follow the divisor's sign, 1 == 1.0, "a" < "b");
// integer overflow, division by zero and mixing types Python refuses are Errors, never a guess.
#include <cmath>
#include <limits>

#include "lineage/core/error.h"
#include "lineage/chat/eval.h"

namespace lineage::chat::jinja {

namespace {

bool integral(const Value& v) { return v.is(Value::Kind::Int) || v.is(Value::Kind::Bool); }
int64_t as_int(const Value& v) { return v.is(Value::Kind::Bool) ? int64_t(v.b) : v.i; }
bool numeric(const Value& v) { return integral(v) || v.is(Value::Kind::Float); }
double as_real(const Value& v) { return v.is(Value::Kind::Float) ? v.f : double(as_int(v)); }

std::string undefined_why(const Value& v) { return v.str ? cat(" (", *v.str, ")") : std::string(); }

// Python's slice.indices(): the positions start, start + step, ... before stop, clamped to [0, n).
std::vector<int64_t> slice_positions(int64_t n, const Value& start, const Value& stop, int64_t step) {
  const auto given = [](const Value& v) { return !v.is(Value::Kind::None) && !v.is(Value::Kind::Undefined); };
  int64_t lo, hi;
  if (step > 0) {
    const auto clamp = [n](int64_t x) { return x < 0 ? std::max<int64_t>(x + n, 0) : std::min(x, n); };
    lo = given(start) ? clamp(as_int(start)) : 0;
    hi = given(stop) ? clamp(as_int(stop)) : n;
  } else {
    const auto clamp = [n](int64_t x) { return x < 0 ? std::max<int64_t>(x + n, -1) : std::min(x, n - 1); };
    lo = given(start) ? clamp(as_int(start)) : n - 1;
    hi = given(stop) ? clamp(as_int(stop)) : -1;
  }
  std::vector<int64_t> positions;
  for (int64_t k = lo; step > 0 ? k < hi : k > hi;) {
    positions.push_back(k);
    if (__builtin_add_overflow(k, step, &k)) break;
  }
  return positions;
}

}  // namespace

Value Renderer::eval_binary(const Expr& e, const Value& l, const Value& r) {
  const std::string& op = e.name;
  const int line = e.line;
  using K = Value::Kind;
  if (op == "~") {
    std::string s = (l.is(K::String) ? l.s() : to_string(l)) + (r.is(K::String) ? r.s() : to_string(r));
    check_string(s.size(), line);
    return Value::string(std::move(s));
  }
  const auto type_error = [&]() -> Value {
    fail(line, cat("unsupported operand types for ", op, ": ", kind_name(l.kind), " and ", kind_name(r.kind)));
  };
  if (op == "+") {
    if (l.is(K::String) && r.is(K::String)) {
      check_string(l.s().size() + r.s().size(), line);
      return Value::string(l.s() + r.s());
    }
    if (l.is(K::List) && r.is(K::List)) {
      check_items(l.list->items.size() + r.list->items.size(), line);
      std::vector<Value> items = l.list->items;
      items.insert(items.end(), r.list->items.begin(), r.list->items.end());
      return arena_.list(std::move(items));
    }
  }
  if (op == "*" && (integral(l) || integral(r)) && !(numeric(l) && numeric(r))) {
    const Value& seq = integral(l) ? r : l;
    const int64_t times = std::max<int64_t>(0, as_int(integral(l) ? l : r));
    if (seq.is(K::String)) {
      if (!seq.s().empty() && times > limits_.max_bytes / int64_t(seq.s().size())) check_string(size_t(limits_.max_bytes) + 1, line);
      std::string s;
      for (int64_t k = 0; k < times; ++k) s += seq.s();
      check_string(s.size(), line);
      return Value::string(std::move(s));
    }
    if (seq.is(K::List)) {
      const size_t n = seq.list->items.size();
      if (n && times > limits_.max_items / int64_t(n)) check_items(size_t(limits_.max_items) + 1, line);
      check_items(n * size_t(times), line);
      std::vector<Value> items;
      for (int64_t k = 0; k < times; ++k) items.insert(items.end(), seq.list->items.begin(), seq.list->items.end());
      return arena_.list(std::move(items));
    }
    return type_error();
  }
  if (!numeric(l) || !numeric(r)) return type_error();
  if (integral(l) && integral(r) && op != "/") {
    const int64_t a = as_int(l), b = as_int(r);
    int64_t out = 0;
    if (op == "+" && !__builtin_add_overflow(a, b, &out)) return Value::integer(out);
    if (op == "-" && !__builtin_sub_overflow(a, b, &out)) return Value::integer(out);
    if (op == "*" && !__builtin_mul_overflow(a, b, &out)) return Value::integer(out);
    if (op == "//" || op == "%") {
      if (b == 0) fail(line, cat("integer division or modulo by zero (", op, ")"));
      if (b == -1) {
        if (op == "%") return Value::integer(0);
        if (a == std::numeric_limits<int64_t>::min()) fail(line, "integer overflow in //");
        return Value::integer(-a);
      }
      int64_t q = a / b, m = a % b;
      if (m != 0 && ((m < 0) != (b < 0))) {
        --q;
        m += b;
      }
      return Value::integer(op == "//" ? q : m);
    }
    if (op == "**" && b >= 0) {
      int64_t result = 1, base = a, exp = b;
      bool overflow = false;
      while (exp > 0 && !overflow) {
        if (exp & 1) overflow = __builtin_mul_overflow(result, base, &result);
        exp >>= 1;
        if (exp > 0 && !overflow) overflow = __builtin_mul_overflow(base, base, &base);
      }
      if (!overflow) return Value::integer(result);
    }
    if (op != "**" || b >= 0) fail(line, cat("integer overflow in ", op));
  }
  const double a = as_real(l), b = as_real(r);
  if (op == "+") return Value::real(a + b);
  if (op == "-") return Value::real(a - b);
  if (op == "*") return Value::real(a * b);
  if (b == 0 && (op == "/" || op == "//" || op == "%")) fail(line, cat("division by zero (", op, ")"));
  if (op == "/") return Value::real(a / b);
  if (op == "//") return Value::real(std::floor(a / b));
  if (op == "%") {
    double m = std::fmod(a, b);
    if (m != 0 && ((m < 0) != (b < 0))) m += b;
    return Value::real(m);
  }
  if (op == "**") {
    if (a == 0 && b < 0) fail(line, "0 cannot be raised to a negative power");
    if (a < 0 && b != std::floor(b)) fail(line, "a negative number raised to a fractional power is complex");
    return Value::real(std::pow(a, b));
  }
  return type_error();
}

bool Renderer::compare(const std::string& op, const Value& l, const Value& r, int line) {
  using K = Value::Kind;
  if (op == "==") return equal(l, r);
  if (op == "!=") return !equal(l, r);
  if (op == "in" || op == "not in") {
    bool found = false;
    switch (r.kind) {
      case K::String:
        if (!l.is(K::String)) fail(line, cat("'in <str>' needs a str on the left, found ", kind_name(l.kind)));
        found = r.s().find(l.s()) != std::string::npos;
        break;
      case K::List:
        for (const Value& item : r.list->items)
          if ((found = equal(l, item))) break;
        break;
      case K::Dict:
      case K::Namespace: found = l.is(K::String) && r.dict->find(l.s()) != nullptr; break;
      case K::Undefined: break;
      default: fail(line, cat("'", op, "' needs a str, list or dict on the right, found ", kind_name(r.kind)));
    }
    return op == "in" ? found : !found;
  }
  int order = 0;
  if (numeric(l) && numeric(r)) {
    if (integral(l) && integral(r)) order = as_int(l) < as_int(r) ? -1 : as_int(l) > as_int(r) ? 1 : 0;
    else order = as_real(l) < as_real(r) ? -1 : as_real(l) > as_real(r) ? 1 : 0;
    if (std::isnan(as_real(l)) || std::isnan(as_real(r))) return false;
  } else if (l.is(K::String) && r.is(K::String)) {
    order = l.s().compare(r.s());  // UTF-8 byte order is code point order, as Python compares
  } else {
    fail(line, cat("'", op, "' is not supported between ", kind_name(l.kind), " and ", kind_name(r.kind)));
  }
  if (op == "<") return order < 0;
  if (op == ">") return order > 0;
  if (op == "<=") return order <= 0;
  return order >= 0;
}

Value Renderer::get_attr(const Value& obj, const std::string& name, int line) {
  if (obj.is_mapping()) {
    if (const Value* v = obj.dict->find(name)) return *v;
  } else if (obj.is(Value::Kind::Undefined)) {
    fail(line, cat("cannot read attribute '", name, "' of an undefined value", undefined_why(obj)));
  }
  Value undefined;
  undefined.str = std::make_shared<const std::string>(cat(kind_name(obj.kind), " has no attribute '", name, "'"));
  return undefined;
}

Value Renderer::get_item(const Value& obj, const Value& key, int line) {
  using K = Value::Kind;
  if (obj.is(K::Undefined)) fail(line, cat("cannot index an undefined value", undefined_why(obj)));
  if ((obj.is(K::List) || obj.is(K::String)) && integral(key)) {
    int64_t k = as_int(key);
    if (obj.is(K::List)) {
      const int64_t n = int64_t(obj.list->items.size());
      if (k < 0) k += n;
      if (k >= 0 && k < n) return obj.list->items[size_t(k)];
    } else {
      const std::string& s = obj.s();
      const std::vector<size_t> starts = code_point_starts(s);
      const int64_t n = int64_t(starts.size());
      if (k < 0) k += n;
      if (k >= 0 && k < n) {
        const size_t b = starts[size_t(k)], end = k + 1 < n ? starts[size_t(k + 1)] : s.size();
        return Value::string(s.substr(b, end - b));
      }
    }
  } else if (obj.is_mapping() && key.is(K::String)) {
    if (const Value* v = obj.dict->find(key.s())) return *v;
  }
  Value undefined;
  undefined.str = std::make_shared<const std::string>(cat(kind_name(obj.kind), " has no item ",
                                                          key.is(K::String) ? cat("'", key.s(), "'") : to_string(key)));
  return undefined;
}

Value Renderer::slice(const Value& obj, const Value& start, const Value& stop, const Value& step, int line) {
  using K = Value::Kind;
  for (const Value* bound : {&start, &stop, &step})
    if (!bound->is(K::None) && !bound->is(K::Undefined) && !integral(*bound))
      fail(line, cat("slice bounds must be integers or none, found ", kind_name(bound->kind)));
  const int64_t by = step.is(K::None) || step.is(K::Undefined) ? 1 : as_int(step);
  if (by == 0) fail(line, "slice step cannot be zero");
  if (obj.is(K::List)) {
    const std::vector<int64_t> at = slice_positions(int64_t(obj.list->items.size()), start, stop, by);
    check_items(at.size(), line);
    std::vector<Value> items;
    items.reserve(at.size());
    for (int64_t k : at) items.push_back(obj.list->items[size_t(k)]);
    return arena_.list(std::move(items));
  }
  if (obj.is(K::String)) {
    const std::string& s = obj.s();
    const std::vector<size_t> starts = code_point_starts(s);
    std::string out;
    for (int64_t k : slice_positions(int64_t(starts.size()), start, stop, by)) {
      const size_t b = starts[size_t(k)], end = size_t(k) + 1 < starts.size() ? starts[size_t(k) + 1] : s.size();
      out.append(s, b, end - b);
    }
    check_string(out.size(), line);
    return Value::string(std::move(out));
  }
  if (obj.is(K::Undefined)) fail(line, cat("cannot slice an undefined value", undefined_why(obj)));
  fail(line, cat("cannot slice ", kind_name(obj.kind)));
}

}  // namespace lineage::chat::jinja
