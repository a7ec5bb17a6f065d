// Runs a parsed chat template over variables: one Renderer per render, owning every value it
// creates (its Arena) and the budget of chat_template.h's Limits.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lineage/chat/chat_template.h"
#include "lineage/chat/ast.h"

namespace lineage::chat::jinja {

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
};

class Renderer {
 public:
  Renderer(const Program& program, const ChatTemplate::Limits& limits) : program_(program), limits_(limits) {}

  std::string render(const nlohmann::ordered_json& variables);

  Arena& arena() { return arena_; }
  [[noreturn]] void fail(int line, const std::string& what) const;
  void step(int line, int64_t n = 1);                   // charge the step budget
  void check_string(size_t bytes, int line);            // a string just built: size and cost
  void check_items(size_t items, int line);             // a list about to be built: size and cost
  Value call(const Value& callee, const CallArgs& args, int line, std::string_view name);
  bool compare(const std::string& op, const Value& l, const Value& r, int line);  // == != < > <= >= in, not in

  // Runs `f` one nesting level deeper (filters that apply filters or tests).
  template <class F>
  auto nested(int line, F f) {
    Depth depth(*this, line);
    return f();
  }

 private:
  enum class Flow { Normal, Break, Continue };

  class Depth {
   public:
    Depth(Renderer& r, int line) : r_(r) {
      if (++r_.depth_ > r_.limits_.max_depth)
        r_.fail(line, cat("rendering nested more than ", r_.limits_.max_depth,
                          " levels deep (a macro that calls itself without end?)"));
    }
    ~Depth() { --r_.depth_; }

   private:
    Renderer& r_;
  };

  Flow exec(const Body& body, Scope* scope, std::string& out);
  Flow exec_node(const Node& n, Scope* scope, std::string& out);
  Flow exec_for(const Node& n, Scope* scope, std::string& out);
  void assign(const std::vector<std::string>& targets, int line, Scope* scope, Value v);
  std::string render_body(const Body& body, Scope* scope);
  void append(std::string& out, std::string_view piece, int line);

  Value eval(const Expr& e, Scope* scope);
  Value eval_call(const Expr& e, Scope* scope);
  Value eval_binary(const Expr& e, const Value& l, const Value& r);
  CallArgs eval_args(const std::vector<Arg>& args, Scope* scope);
  Value get_attr(const Value& obj, const std::string& name, int line);
  Value get_item(const Value& obj, const Value& key, int line);
  Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step, int line);
  Value call_macro(const Macro& m, const CallArgs& args, int line);

  const Program& program_;
  ChatTemplate::Limits limits_;
  Arena arena_;
  int64_t steps_ = 0;
  int depth_ = 0;
};

// builtins.cpp
Value apply_filter(Renderer& r, const std::string& name, const Value& v, const CallArgs& args, int line);
bool apply_test(Renderer& r, const std::string& name, const Value& v, const CallArgs& args, int line);
Value call_method(Renderer& r, const Value& obj, const std::string& name, const CallArgs& args, int line);
// range, namespace, dict, raise_exception, strftime_now; false when `name` is none of them.
bool call_global(Renderer& r, const std::string& name, const CallArgs& args, int line, Value& result);
bool is_global(std::string_view name);

}  // namespace lineage::chat::jinja
