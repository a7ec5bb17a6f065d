// lineage chat: a multi-turn conversation in the terminal. The sequence's state stays in the session
// between turns, so each turn feeds only the tokens the history does not already hold; when the
// rendered history and the state part ways (a reply re-tokenized differently, a /load), the prefix
// cache resumes from the longest prefix it holds (KV rows cut exactly, recurrent layers from their
// nearest checkpoint) instead of from zero.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>

#include "common.h"
#include "lineage/core/error.h"
#include "lineage/core/text.h"
#include "lineage/chat/chat_template.h"
#include "lineage/model/state_pool.h"
#include "lineage/runtime/generate.h"
#include "lineage/serve/server.h"
#include "lineage/runtime/prefix_cache.h"
#include "lineage/runtime/state_file.h"
#include "lineage/serve/openai.h"

namespace lineage::app {

namespace {

struct ChatOpts {
  ModelSource src;
  std::string system;
  int max_tokens = 512;
  float temperature = 0.8f, top_p = 1.0f;
  int top_k = 0;
  std::vector<std::string> stop;
  std::string cache_bytes = "256M";
  int64_t checkpoint_every = 256;
  std::string load;
  std::string template_kwargs;
};

struct TurnStats {
  int64_t prompt = 0, reused = 0, generated = 0;
  double prefill_seconds = 0, decode_seconds = 0;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

class Chat {
 public:
  Chat(const io::LoadedModel& m, const ChatOpts& o)
      : m_(m),
        o_(o),
        tok_(require_tokenizer(m, "chat")),
        template_(serve::model_chat_template(m)),
        session_(m.model),
        cache_(m.model, {.budget_bytes = parse_bytes(o.cache_bytes, "--cache-bytes"), .checkpoint_every = o.checkpoint_every}),
        rng_(Rng(o.src.seed).snapshot()) {
    stops_ = o.stop;
    // Without a template the conversation is "role: content" paragraphs: a reply ends at the
    // paragraph's end, before the model writes the next turn itself.
    if (!template_ && stops_.empty()) stops_ = {"\n\n"};
    if (!o.system.empty()) messages_.push_back({"system", o.system});
    if (template_ && !o.template_kwargs.empty()) template_->set_variables(parse_template_kwargs(o.template_kwargs));
  }

  std::string describe() const {
    return cat(template_ ? "chat template from " + template_->where() : std::string("no chat template: plain role: content"),
               "; prefix cache up to ", o_.cache_bytes, " bytes");
  }

  void turn(const std::string& text) {
    messages_.push_back({"user", text});
    const std::vector<int32_t> ids = chat::encode_chat(tok_, template_ ? &*template_ : nullptr, messages_, true);
    TurnStats t;
    auto t0 = std::chrono::steady_clock::now();
    const std::vector<int32_t> todo = reuse(ids);
    t.reused = session_.position();
    t.prompt = t.reused + int64_t(todo.size());
    const int64_t ctx = m_.model.config.max_positions;
    if (ctx > 0 && t.prompt >= ctx) {
      // Nothing is fed past what the conversation already holds; the next turn starts from there.
      messages_.pop_back();
      throw Error(cat("the conversation has ", t.prompt, " tokens; the model's context holds ", ctx,
                      " (/reset starts a new one)"));
    }
    std::span<const float> logits = feed(todo);
    t.prefill_seconds = seconds_since(t0);

    runtime::GenerateOptions opt;
    opt.max_tokens = o_.max_tokens;
    opt.sampling = {o_.temperature, o_.top_k, o_.top_p, o_.src.seed};
    opt.rng = rng_;
    opt.eos = m_.model.config.eos_token_id ? m_.model.config.eos_token_id : tok_.eos_id();
    opt.feed_last = true;  // the state holds every token, EOS included, as the next render does
    serve::StopFilter filter(stops_);
    opt.stop = [&] { return filter.stopped(); };
    std::string reply;
    const auto show = [&](std::string_view s) {
      const std::string out = filter.stopped() ? std::string() : filter.push(s);
      reply += out;
      std::fwrite(out.data(), 1, out.size(), stdout);
      std::fflush(stdout);
    };
    const runtime::GenerateStats st = runtime::generate(session_, tok_, {}, opt, show, logits);
    if (!filter.stopped()) show(filter.flush());
    std::printf("\n");
    std::fflush(stdout);
    rng_ = st.rng;
    last_logits_ = st.last_logits;
    t.generated = st.generated_tokens;
    t.decode_seconds = st.decode_seconds;
    // A template's reply is kept as written, so that the next render gives back the tokens the
    // state holds; the plain format writes "assistant: " before it, and the reply's own leading
    // space would be a second one.
    messages_.push_back({"assistant", template_ ? reply : trim(reply)});
    // The turn's end is a checkpoint, and the whole sequence an entry of the cache (it folds the
    // previous turn's entry into this one), within the cache's budget.
    cache_.checkpoint(session_.state(), checkpoints_);
    cache_.commit(session_.tokens(), session_.state(), std::move(checkpoints_));
    checkpoints_ = {};
    last_ = t;
    const bool full = ctx > 0 && session_.position() >= ctx;
    std::fprintf(stderr, "[%lld tokens, %.1f tok/s; prompt %lld tokens, %lld of them already in the state%s]\n",
                 (long long)t.generated, rate(t.generated - 1, t.decode_seconds), (long long)t.prompt,
                 (long long)t.reused, full ? "; the context is full: /reset starts a new conversation" : "");
  }

  void reset() {
    messages_.clear();
    if (!o_.system.empty()) messages_.push_back({"system", o_.system});
    session_.reset();
    checkpoints_ = {};
    std::fprintf(stderr, "[a new conversation; the prefix cache keeps the old one's states]\n");
  }

  void save(const std::string& path) {
    nlohmann::json messages = nlohmann::json::array();
    for (const auto& m : messages_) messages.push_back({{"role", m.role}, {"content", m.content}});
    runtime::save_state(path, m_.model,
                        {session_.state().clone(),
                         {session_.tokens().begin(), session_.tokens().end()},
                         last_logits_,
                         rng_,
                         {{"messages", messages}}});
    std::fprintf(stderr, "[saved %zu messages, %lld tokens, %s of state to %s]\n", messages_.size(),
                 (long long)session_.position(), format_bytes(double(session_.state().bytes())).c_str(), path.c_str());
  }

  void load(const std::string& path) {
    runtime::SavedState saved = runtime::load_state(path, m_.model);
    std::vector<chat::ChatMessage> messages;
    const nlohmann::json& mj = saved.meta.is_object() && saved.meta.contains("messages") ? saved.meta["messages"]
                                                                                       : nlohmann::json();
    if (!mj.is_array())
      throw Error(cat(path, ": header field \"meta.messages\": expected the conversation (an array of {role, content}); "
                            "the file was not written by lineage chat's /save"));
    for (size_t i = 0; i < mj.size(); ++i) {
      const nlohmann::json& m = mj[i];
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") || !m["content"].is_string())
        throw Error(cat(path, ": header field \"meta.messages[", i, "]\": expected {\"role\": string, \"content\": string}"));
      messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    if (saved.tokens.size() != size_t(saved.state.position))
      throw Error(cat(path, ": holds no token ids; a chat needs them to continue"));
    session_.restore(saved.state, saved.tokens);
    messages_ = std::move(messages);
    last_logits_ = std::move(saved.logits);
    if (saved.rng) rng_ = *saved.rng;
    checkpoints_ = {};
    cache_.commit(session_.tokens(), session_.state(), {});
    std::fprintf(stderr, "[loaded %zu messages, %lld tokens from %s]\n", messages_.size(),
                 (long long)session_.position(), path.c_str());
    for (const auto& m : messages_) std::fprintf(stderr, "  %s: %s\n", m.role.c_str(), m.content.c_str());
  }

  void stats() const {
    const runtime::PrefixCacheStats& c = cache_.stats();
    std::fprintf(stderr,
                 "[conversation: %zu messages; state: %lld tokens, %s\n"
                 " last turn: prompt %lld tokens (%lld already in the state, %lld fed) in %.3f s, %.1f tok/s;"
                 " generated %lld tokens in %.3f s, %.1f tok/s\n"
                 " prefix cache: %lld entries, %s; %lld hits of %lld lookups, %lld tokens reused]\n",
                 messages_.size(), (long long)session_.position(), format_bytes(double(session_.state().bytes())).c_str(),
                 (long long)last_.prompt, (long long)last_.reused, (long long)(last_.prompt - last_.reused),
                 last_.prefill_seconds, rate(last_.prompt - last_.reused, last_.prefill_seconds),
                 (long long)last_.generated, last_.decode_seconds, rate(last_.generated - 1, last_.decode_seconds),
                 (long long)c.entries, format_bytes(double(c.bytes)).c_str(), (long long)c.hits, (long long)c.lookups,
                 (long long)c.cached_tokens);
  }

 private:
  static double rate(int64_t n, double s) { return n > 0 && s > 0 ? double(n) / s : 0.0; }

  // Brings the session to what it can keep of the conversation `ids` renders and returns the
  // tokens still to feed:
  //   the history the state holds starts `ids`: the rest of `ids`;
  //   else, when the rendered text starts with the text of the state's tokens (a reply that
  //   re-tokenizes differently from how it was generated): the rest of the text, tokenized, after
  //   the state's own tokens, as an interactive session appends its input;
  //   else (an edited history): the rest after the longest prefix the cache can resume.
  std::vector<int32_t> reuse(const std::vector<int32_t>& ids) {
    const std::span<const int32_t> have = session_.tokens();
    size_t c = 0;
    while (c < have.size() && c < ids.size() && have[c] == ids[c]) ++c;
    if (!have.empty() && c == have.size() && c < ids.size()) return {ids.begin() + ptrdiff_t(c), ids.end()};
    if (!have.empty()) {
      const std::string said = tok_.decode(have), text = render();
      if (text.size() > said.size() && text.compare(0, said.size(), said) == 0) {
        std::vector<int32_t> rest = tok_.encode(std::string_view(text).substr(said.size()));
        if (!rest.empty()) return rest;
      }
    }
    checkpoints_ = {};
    model::SequenceState s = m_.model.new_state();
    const int64_t n = cache_.restore(ids, s);
    if (n > 0) session_.restore(s, std::span(ids).first(size_t(n)));
    else session_.reset();
    return {ids.begin() + n, ids.end()};
  }

  // The conversation with the generation prompt, as text.
  std::string render() const {
    return template_ ? template_->render(messages_, true) : chat::render_plain_chat(messages_, true);
  }

  // Feeds `ids` (at least one), keeping a recurrent checkpoint at each multiple of
  // --checkpoint-every; returns the logits after the last.
  std::span<const float> feed(std::span<const int32_t> ids) {
    if (ids.empty()) throw Error("the conversation renders to no new tokens");
    std::span<const float> logits;
    const int64_t every = cache_.checkpoint_every();
    size_t i = 0;
    while (i < ids.size()) {
      size_t n = ids.size() - i;
      if (cache_.keeps_checkpoints()) {
        const int64_t pos = session_.position();
        n = std::min(n, size_t((pos / every + 1) * every - pos));
      }
      logits = session_.prefill(ids.subspan(i, n));
      i += n;
      if (cache_.wants_checkpoint(session_.position())) cache_.checkpoint(session_.state(), checkpoints_);
    }
    return logits;
  }

  const io::LoadedModel& m_;
  const ChatOpts& o_;
  const tokenizer::Tokenizer& tok_;
  std::optional<chat::ChatTemplate> template_;
  runtime::Session session_;
  runtime::PrefixCache cache_;
  runtime::PrefixCache::Checkpoints checkpoints_;  // this sequence's since the last commit
  std::vector<chat::ChatMessage> messages_;
  std::vector<std::string> stops_;
  Rng::Snapshot rng_;
  std::vector<float> last_logits_;
  TurnStats last_;
};

void run_chat(const ChatOpts& o) {
  io::LoadedModel m = load(o.src, true);
  Chat chat(m, o);
  if (!o.load.empty()) chat.load(o.load);
  const bool tty = isatty(0);
  std::fprintf(stderr, "lineage chat: %s (%s). /help for commands.\n",
               m.dir.empty() ? o.src.preset.c_str() : m.dir.c_str(), chat.describe().c_str());
  std::string line;
  while (true) {
    if (tty) std::fprintf(stderr, "> "), std::fflush(stderr);
    if (!std::getline(std::cin, line)) break;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (trim(line).empty()) continue;
    try {
      if (line[0] != '/') {
        chat.turn(line);
        continue;
      }
      const size_t sp = line.find(' ');
      const std::string cmd = line.substr(0, sp), arg = sp == std::string::npos ? "" : trim(line.substr(sp + 1));
      if (cmd == "/quit" || cmd == "/exit") break;
      if (cmd == "/reset") chat.reset();
      else if (cmd == "/stats") chat.stats();
      else if (cmd == "/save" || cmd == "/load") {
        if (arg.empty()) throw Error(cat(cmd, " needs a file name: ", cmd, " FILE"));
        cmd == "/save" ? chat.save(arg) : chat.load(arg);
      } else if (cmd == "/help") {
        std::fprintf(stderr,
                     "  /reset       start a new conversation\n"
                     "  /save FILE   write the conversation and its state to a state file\n"
                     "  /load FILE   continue a conversation saved with /save\n"
                     "  /stats       tokens, state bytes, tok/s of the last turn, the prefix cache\n"
                     "  /quit        leave (so does end of input)\n");
      } else {
        throw Error(cat("unknown command ", cmd, "; /help lists them"));
      }
    } catch (const Error& e) {
      // A bad command or file ends nothing: the conversation goes on.
      std::fprintf(stderr, "lineage: error: %s\n", e.what());
      if (!tty) throw;  // a script's input: its failure is the exit status
    }
  }
}

}  // namespace

void add_chat(CLI::App& app) {
  static ChatOpts o;
  auto* cmd = app.add_subcommand("chat", "a multi-turn conversation in the terminal, streamed, the state kept between "
                                         "turns; /reset, /save FILE, /load FILE, /stats, /help");
  add_model_options(*cmd, o.src, true);
  add_threads_option(*cmd);
  add_numerics_options(*cmd, o.src);
  cmd->add_option("--system", o.system, "a system message at the start of each conversation");
  cmd->add_option("--max-tokens", o.max_tokens, "tokens per reply at most (default 512)")->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--temperature", o.temperature, "0 = greedy (default 0.8)")->check(CLI::Range(0.0f, 100.0f));
  cmd->add_option("--top-k", o.top_k, "keep the k most likely tokens (0 = off)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", o.top_p, "nucleus sampling mass (1 = off)")->check(CLI::Range(0.0f, 1.0f));
  cmd->add_option("--stop", o.stop, "a reply ends before this text (repeatable; default without a chat template: a blank line)");
  cmd->add_option("--cache-bytes", o.cache_bytes, "prefix cache budget in bytes, or with K, M, G (default 256M; 0: off)");
  cmd->add_option("--checkpoint-every", o.checkpoint_every, "recurrent layers' checkpoint interval in tokens (default 256)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  cmd->add_option("--load", o.load, "continue a conversation saved with /save");
  cmd->add_option("--chat-template-kwargs", o.template_kwargs,
                  "variables for the chat template, a JSON object: '{\"enable_thinking\": false}' (Qwen3, Qwen3.5)");
  cmd->callback([] { run_chat(o); });
}

}  // namespace lineage::app
