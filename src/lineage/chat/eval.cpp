// Statements and expressions with Jinja2's semantics: a for loop has its own scope (its sets do not
// leak out, and persist from one iteration to the next), if blocks do not; macros see the scope
// they were defined in as it is when they run; `and`/`or` return an operand; comparisons chain.
#include <cmath>
#include <limits>

#include "lineage/core/error.h"
#include "lineage/chat/eval.h"

namespace lineage::chat::jinja {

void Renderer::fail(int line, const std::string& what) const {
  throw Error(cat(program_.where, ":", line, ": ", what));
}

void Renderer::step(int line, int64_t n) {
  steps_ += n;
  if (steps_ > limits_.max_steps)
    fail(line, cat("the render took more than ", limits_.max_steps, " steps (a loop that does not end?)"));
}

void Renderer::check_string(size_t bytes, int line) {
  if (int64_t(bytes) > limits_.max_bytes)
    fail(line, cat("a string of ", bytes, " bytes is longer than the limit of ", limits_.max_bytes));
  step(line, int64_t(bytes / 256));
}

void Renderer::check_items(size_t items, int line) {
  if (int64_t(items) > limits_.max_items)
    fail(line, cat("a list of ", items, " items is longer than the limit of ", limits_.max_items));
  step(line, int64_t(items / 8));
}

std::string Renderer::render(const nlohmann::ordered_json& variables) {
  Scope* root = arena_.scope(nullptr);
  try {
    if (!variables.is_object()) fail(0, "the variables of a render must be a JSON object");
    for (const auto& [name, value] : variables.items()) root->vars.set(name, from_json(value, arena_));
  } catch (const ValueTooDeep&) {
    fail(0, cat("the variables nest more than ", kMaxValueDepth, " levels deep"));
  }
  std::string out;
  exec(program_.body, root, out);
  return out;
}

void Renderer::append(std::string& out, std::string_view piece, int line) {
  out += piece;
  check_string(out.size(), line);
}

std::string Renderer::render_body(const Body& body, Scope* scope) {
  std::string out;
  exec(body, scope, out);
  return out;
}

Renderer::Flow Renderer::exec(const Body& body, Scope* scope, std::string& out) {
  for (const Node& n : body) {
    const Flow flow = exec_node(n, scope, out);
    if (flow != Flow::Normal) return flow;
  }
  return Flow::Normal;
}

Renderer::Flow Renderer::exec_node(const Node& n, Scope* scope, std::string& out) {
  Depth depth(*this, n.line);
  step(n.line);
  switch (n.kind) {
    case Node::Kind::Text: append(out, n.text, n.line); return Flow::Normal;
    case Node::Kind::Output: {
      const Value v = eval(*n.expr, scope);
      try {
        append(out, v.is(Value::Kind::String) ? v.s() : to_string(v), n.line);
      } catch (const ValueTooDeep&) {
        fail(n.line, cat("a value nests more than ", kMaxValueDepth, " levels deep"));
      }
      return Flow::Normal;
    }
    case Node::Kind::If:
      for (const IfBranch& b : n.branches)
        if (truthy(eval(*b.condition, scope))) return exec(b.body, scope, out);
      return exec(n.else_body, scope, out);
    case Node::Kind::For: return exec_for(n, scope, out);
    case Node::Kind::Set: assign(n.targets, n.line, scope, eval(*n.expr, scope)); return Flow::Normal;
    case Node::Kind::SetAttr: {
      const Value* target = scope->find(n.targets[0]);
      if (!target || !target->is(Value::Kind::Namespace))
        fail(n.line, cat("{% set ", n.targets[0], ".", n.targets[1], " %}: '", n.targets[0], "' is ",
                         target ? kind_name(target->kind) : "undefined", "; only a namespace() takes attributes"));
      target->dict->set(n.targets[1], eval(*n.expr, scope));
      return Flow::Normal;
    }
    case Node::Kind::SetBlock: {
      std::string text = render_body(n.body, arena_.scope(scope));
      scope->vars.set(n.targets[0], Value::string(std::move(text)));
      return Flow::Normal;
    }
    case Node::Kind::Macro:
      step(n.line, 4);
      scope->vars.set(n.macro->name, arena_.macro(n.macro.get(), scope));
      return Flow::Normal;
    case Node::Kind::Break: return Flow::Break;
    case Node::Kind::Continue: return Flow::Continue;
    case Node::Kind::FilterBlock: {
      const Value body = Value::string(render_body(n.body, arena_.scope(scope)));
      const Value v = apply_filter(*this, n.expr->name, body, eval_args(n.expr->args, scope), n.line);
      append(out, v.is(Value::Kind::String) ? v.s() : to_string(v), n.line);
      return Flow::Normal;
    }
  }
  return Flow::Normal;
}

void Renderer::assign(const std::vector<std::string>& targets, int line, Scope* scope, Value v) {
  if (targets.size() == 1) {
    scope->vars.set(targets[0], std::move(v));
    return;
  }
  if (!v.is(Value::Kind::List) || v.list->items.size() != targets.size())
    fail(line, cat("cannot unpack ", v.is(Value::Kind::List) ? cat(v.list->items.size(), " items") : kind_name(v.kind),
                   " into ", targets.size(), " names"));
  for (size_t k = 0; k < targets.size(); ++k) scope->vars.set(targets[k], v.list->items[k]);
}

Renderer::Flow Renderer::exec_for(const Node& n, Scope* scope, std::string& out) {
  const Value iterable = eval(*n.expr, scope);
  std::vector<Value> items;
  switch (iterable.kind) {
    case Value::Kind::List: items = iterable.list->items; break;
    case Value::Kind::Dict:
      for (const auto& item : iterable.dict->items) items.push_back(Value::string(item.first));
      break;
    case Value::Kind::String: {
      const std::string& s = iterable.s();
      const std::vector<size_t> starts = code_point_starts(s);
      for (size_t k = 0; k < starts.size(); ++k)
        items.push_back(Value::string(s.substr(starts[k], (k + 1 < starts.size() ? starts[k + 1] : s.size()) - starts[k])));
      break;
    }
    case Value::Kind::Undefined: break;  // Jinja iterates an undefined value as empty
    default: fail(n.line, cat("cannot loop over ", kind_name(iterable.kind)));
  }
  step(n.line, int64_t(items.size() / 8));
  Scope* loop_scope = arena_.scope(scope);
  const auto bind = [&](const Value& item) { assign(n.targets, n.line, loop_scope, item); };
  if (n.condition) {  // {% for x in xs if cond %}: loop.* counts only the items kept
    std::vector<Value> kept;
    for (const Value& item : items) {
      bind(item);
      if (truthy(eval(*n.condition, loop_scope))) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) return exec(n.else_body, scope, out);
  const int64_t length = int64_t(items.size());
  for (int64_t k = 0; k < length; ++k) {
    bind(items[size_t(k)]);
    Value loop = arena_.dict();
    Dict& d = *loop.dict;
    d.set("index", Value::integer(k + 1));
    d.set("index0", Value::integer(k));
    d.set("revindex", Value::integer(length - k));
    d.set("revindex0", Value::integer(length - k - 1));
    d.set("first", Value::boolean(k == 0));
    d.set("last", Value::boolean(k == length - 1));
    d.set("length", Value::integer(length));
    d.set("depth", Value::integer(1));
    d.set("depth0", Value::integer(0));
    d.set("previtem", k > 0 ? items[size_t(k - 1)] : Value());
    d.set("nextitem", k + 1 < length ? items[size_t(k + 1)] : Value());
    loop_scope->vars.set("loop", std::move(loop));
    step(n.line, 4);
    if (exec(n.body, loop_scope, out) == Flow::Break) break;
  }
  return Flow::Normal;
}

CallArgs Renderer::eval_args(const std::vector<Arg>& args, Scope* scope) {
  CallArgs out;
  for (const Arg& a : args) {
    if (a.name.empty()) out.positional.push_back(eval(*a.value, scope));
    else out.named.emplace_back(a.name, eval(*a.value, scope));
  }
  return out;
}

Value Renderer::eval(const Expr& e, Scope* scope) {
  Depth depth(*this, e.line);
  step(e.line);
  using K = Expr::Kind;
  switch (e.kind) {
    case K::Literal: return e.literal;
    case K::Name: {
      if (const Value* v = scope->find(e.name)) return *v;
      Value undefined;
      undefined.str = std::make_shared<const std::string>(cat("'", e.name, "' is undefined"));
      return undefined;
    }
    case K::Attr: return get_attr(eval(*e.sub[0], scope), e.name, e.line);
    case K::Item: {
      const Value obj = eval(*e.sub[0], scope);
      return get_item(obj, eval(*e.sub[1], scope), e.line);
    }
    case K::Slice: {
      const Value obj = eval(*e.sub[0], scope);
      const auto bound = [&](size_t k) { return e.sub[k] ? eval(*e.sub[k], scope) : Value::none(); };
      const Value a = bound(1), b = bound(2), c = bound(3);
      return slice(obj, a, b, c, e.line);
    }
    case K::Call: return eval_call(e, scope);
    case K::Filter: {
      const Value v = eval(*e.sub[0], scope);
      return apply_filter(*this, e.name, v, eval_args(e.args, scope), e.line);
    }
    case K::Test: {
      const Value v = eval(*e.sub[0], scope);
      return Value::boolean(apply_test(*this, e.name, v, eval_args(e.args, scope), e.line) != e.negated);
    }
    case K::Neg:
    case K::Pos: {
      const Value v = eval(*e.sub[0], scope);
      if (v.is(Value::Kind::Float)) return Value::real(e.kind == K::Neg ? -v.f : v.f);
      if (v.is(Value::Kind::Int) || v.is(Value::Kind::Bool)) {
        const int64_t x = v.is(Value::Kind::Bool) ? int64_t(v.b) : v.i;
        if (e.kind == K::Pos) return Value::integer(x);
        if (x == std::numeric_limits<int64_t>::min()) fail(e.line, "integer overflow in unary '-'");
        return Value::integer(-x);
      }
      fail(e.line, cat("bad operand type for unary '", e.kind == K::Neg ? "-" : "+", "': ", kind_name(v.kind)));
    }
    case K::Not: return Value::boolean(!truthy(eval(*e.sub[0], scope)));
    case K::Binary: {
      const Value l = eval(*e.sub[0], scope);
      const Value r = eval(*e.sub[1], scope);
      return eval_binary(e, l, r);
    }
    case K::Compare: {
      Value left = eval(*e.sub[0], scope);
      for (size_t k = 0; k < e.ops.size(); ++k) {
        Value right = eval(*e.sub[k + 1], scope);
        if (!compare(e.ops[k], left, right, e.line)) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case K::And: {
      Value l = eval(*e.sub[0], scope);
      return truthy(l) ? eval(*e.sub[1], scope) : l;
    }
    case K::Or: {
      Value l = eval(*e.sub[0], scope);
      return truthy(l) ? l : eval(*e.sub[1], scope);
    }
    case K::Cond:
      if (truthy(eval(*e.sub[0], scope))) return eval(*e.sub[1], scope);
      return e.sub[2] ? eval(*e.sub[2], scope) : Value();
    case K::List: {
      std::vector<Value> items;
      items.reserve(e.sub.size());
      for (const ExprPtr& item : e.sub) items.push_back(eval(*item, scope));
      step(e.line, 4);
      return arena_.list(std::move(items));
    }
    case K::Dict: {
      Value d = arena_.dict();
      for (size_t k = 0; k + 1 < e.sub.size(); k += 2) {
        const Value key = eval(*e.sub[k], scope);
        if (!key.is(Value::Kind::String)) fail(e.line, cat("dict keys must be strings, found ", kind_name(key.kind)));
        d.dict->set(key.s(), eval(*e.sub[k + 1], scope));
      }
      step(e.line, 4);
      return d;
    }
  }
  return Value();
}

Value Renderer::eval_call(const Expr& e, Scope* scope) {
  const Expr& callee = *e.sub[0];
  if (callee.kind == Expr::Kind::Attr) {  // obj.name(args): a macro stored in a dict, else a method
    const Value obj = eval(*callee.sub[0], scope);
    if (obj.is(Value::Kind::Undefined))
      fail(e.line, cat("cannot call '", callee.name, "' on an undefined value (", obj.str ? *obj.str : "", ")"));
    if (obj.is_mapping())
      if (const Value* member = obj.dict->find(callee.name); member && member->is(Value::Kind::Macro))
        return call(*member, eval_args(e.args, scope), e.line, callee.name);
    return call_method(*this, obj, callee.name, eval_args(e.args, scope), e.line);
  }
  if (callee.kind == Expr::Kind::Name) {
    if (const Value* v = scope->find(callee.name)) return call(*v, eval_args(e.args, scope), e.line, callee.name);
    Value result;
    if (call_global(*this, callee.name, eval_args(e.args, scope), e.line, result)) return result;
    fail(e.line, cat("'", callee.name, "' is undefined, so it cannot be called"));
  }
  const Value v = eval(callee, scope);
  return call(v, eval_args(e.args, scope), e.line, "the expression");
}

Value Renderer::call(const Value& callee, const CallArgs& args, int line, std::string_view name) {
  if (!callee.is(Value::Kind::Macro)) fail(line, cat("'", name, "' is ", kind_name(callee.kind), ", not a macro: it cannot be called"));
  return call_macro(*callee.macro, args, line);
}

Value Renderer::call_macro(const Macro& m, const CallArgs& args, int line) {
  Depth depth(*this, line);
  const MacroDef& def = *m.def;
  if (args.positional.size() > def.params.size())
    fail(line, cat("macro '", def.name, "' takes at most ", def.params.size(), " arguments, got ", args.positional.size()));
  Scope* s = arena_.scope(m.closure);
  std::vector<const Value*> given(def.params.size(), nullptr);
  for (size_t k = 0; k < args.positional.size(); ++k) given[k] = &args.positional[k];
  for (const auto& [name, value] : args.named) {
    size_t k = 0;
    while (k < def.params.size() && def.params[k].name != name) ++k;
    if (k == def.params.size()) fail(line, cat("macro '", def.name, "' has no parameter '", name, "'"));
    if (given[k]) fail(line, cat("macro '", def.name, "' got parameter '", name, "' twice"));
    given[k] = &value;
  }
  for (size_t k = 0; k < def.params.size(); ++k) {
    const Param& p = def.params[k];
    s->vars.set(p.name, given[k] ? *given[k] : p.default_value ? eval(*p.default_value, s) : Value());
  }
  return Value::string(render_body(def.body, s));
}

}  // namespace lineage::chat::jinja
