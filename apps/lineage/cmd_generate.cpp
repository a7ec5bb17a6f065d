// lineage generate: one prompt in, text streamed to stdout, a summary on stderr; or, with
// --prompts FILE, many prompts decoded together (continuous batching), one JSON line per prompt.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common.h"
#include "ranks.h"
#include "lineage/core/error.h"
#include "lineage/core/json_read.h"
#include "lineage/runtime/batch_generate.h"
#include "lineage/runtime/generate.h"
#include "lineage/runtime/state_file.h"

namespace lineage::app {

namespace {

struct GenerateOpts {
  ModelSource src;
  std::string prompt, prompts_file;
  int max_tokens = 64;
  float temperature = 0.8f, top_p = 1.0f;
  int top_k = 0;
  bool ignore_eos = false;
  int64_t batch = 8, ctx = 0;
  std::string state_in, state_out;
  bool seed_given = false;
};

std::vector<int32_t> encode_prompt(const tokenizer::Tokenizer& tok, const std::string& text) {
  std::vector<int32_t> ids = tok.encode(text);
  if (tok.adds_bos() && tok.bos_id()) ids.insert(ids.begin(), *tok.bos_id());
  return ids;
}

runtime::GenerateOptions default_options(const GenerateOpts& o, const io::LoadedModel& m, const tokenizer::Tokenizer& tok) {
  runtime::GenerateOptions opt;
  opt.max_tokens = o.max_tokens;
  opt.sampling = {o.temperature, o.top_k, o.top_p, o.src.seed};
  if (!o.ignore_eos) opt.eos = m.model.config.eos_token_id ? m.model.config.eos_token_id : tok.eos_id();
  return opt;
}

// One prompt per line, or JSON Lines: {"prompt": "...", "max_tokens": N, "temperature": T, "top_k": K,
// "top_p": P, "seed": S}, every key but "prompt" optional (the command line's values otherwise). A
// line that starts with '{' is JSON; blank lines are skipped.
std::vector<runtime::BatchRequest> read_prompts(const std::string& path, const tokenizer::Tokenizer& tok,
                                                const runtime::GenerateOptions& defaults) {
  const std::string text = read_file_text(path);
  std::vector<runtime::BatchRequest> out;
  size_t line_no = 0, begin = 0;
  while (begin <= text.size()) {
    const size_t end = std::min(text.find('\n', begin), text.size());
    std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) {
      if (end == text.size()) break;
      continue;
    }
    const std::string where = cat(path, ": line ", line_no);
    runtime::BatchRequest r;
    r.options = defaults;
    std::string prompt = line;
    if (line[line.find_first_not_of(" \t")] == '{') {
      const nlohmann::json j = parse_json(line, where);
      if (!j.is_object()) throw Error(cat(where, ": expected a JSON object"));
      for (const auto& item : j.items()) {  // not a structured binding: clang 14 cannot capture one
        const std::string key = item.key();
        const nlohmann::json& v = item.value();
        const auto field = [&](const char* what) { return cat(where, ": field \"", key, "\": expected ", what); };
        if (key == "prompt") {
          if (!v.is_string()) throw Error(field("a string"));
          prompt = v.get<std::string>();
        } else if (key == "max_tokens") {
          if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > (1 << 24))
            throw Error(cat(field("an integer in [1, 16777216]"), ", found ", v.dump()));
          r.options.max_tokens = v.get<int>();
        } else if (key == "temperature") {
          if (!v.is_number() || v.get<double>() < 0 || v.get<double>() > 100)
            throw Error(cat(field("a number in [0, 100]"), ", found ", v.dump()));
          r.options.sampling.temperature = v.get<float>();
        } else if (key == "top_k") {
          if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (1 << 24))
            throw Error(cat(field("an integer >= 0"), ", found ", v.dump()));
          r.options.sampling.top_k = v.get<int>();
        } else if (key == "top_p") {
          if (!v.is_number() || v.get<double>() < 0 || v.get<double>() > 1)
            throw Error(cat(field("a number in [0, 1]"), ", found ", v.dump()));
          r.options.sampling.top_p = v.get<float>();
        } else if (key == "seed") {
          if (!v.is_number_unsigned()) throw Error(cat(field("an integer >= 0"), ", found ", v.dump()));
          r.options.sampling.seed = v.get<uint64_t>();
        } else {
          throw Error(cat(where, ": unknown field \"", key,
                          "\"; expected prompt, max_tokens, temperature, top_k, top_p or seed"));
        }
      }
      if (!j.contains("prompt")) throw Error(cat(where, ": field \"prompt\" is missing"));
    }
    r.prompt = encode_prompt(tok, prompt);
    if (r.prompt.empty()) throw Error(cat(where, ": the prompt encodes to no tokens"));
    out.push_back(std::move(r));
    if (end == text.size()) break;
  }
  if (out.empty()) throw Error(cat(path, ": no prompts (one per line, or JSON Lines with \"prompt\")"));
  return out;
}

void run_many(const GenerateOpts& o) {
  io::LoadedModel m = load(o.src, true);
  const tokenizer::Tokenizer& tok = require_tokenizer(m, "generate");
  const std::vector<runtime::BatchRequest> requests = read_prompts(o.prompts_file, tok, default_options(o, m, tok));
  runtime::BatchOptions bo;
  bo.max_sequences = o.batch;
  bo.ctx = o.ctx;
  const auto st = runtime::generate_batch(m.model, requests, bo, [&](runtime::BatchResult&& r) {
    const nlohmann::json j = {{"index", r.index},
                              {"text", tok.decode(r.tokens)},
                              {"prompt_tokens", r.prompt_tokens},
                              {"generated_tokens", r.tokens.size()},
                              {"finish_reason", r.finish_reason}};
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    std::fflush(stdout);
  });
  std::fprintf(stderr,
               "lineage: %zu prompts, %lld prompt tokens, generated %lld tokens in %.2f s: %.1f tok/s aggregate "
               "(%lld steps, at most %lld sequences in one, --batch %lld)\n",
               requests.size(), (long long)st.prompt_tokens, (long long)st.generated_tokens, st.seconds,
               double(st.generated_tokens) / std::max(st.seconds, 1e-9), (long long)st.steps,
               (long long)st.most_together, (long long)o.batch);
}

void run_one(const GenerateOpts& o) {
  state_files_on_one_rank("--state-in", o.state_in);
  state_files_on_one_rank("--state-out", o.state_out);
  io::LoadedModel m = load(o.src, true);
  const tokenizer::Tokenizer& tok = require_tokenizer(m, "generate");
  runtime::Session session(m.model);
  runtime::GenerateOptions opt = default_options(o, m, tok);
  std::vector<float> logits;  // a state file's, to continue from without a prompt
  std::vector<int32_t> prompt;
  if (!o.state_in.empty()) {
    runtime::SavedState saved = runtime::load_state(o.state_in, m.model);
    session.restore(saved.state, saved.tokens);
    logits = std::move(saved.logits);
    // The saved sampler stream continues unless --seed asks for a new one.
    if (saved.rng && !o.seed_given) opt.rng = saved.rng;
    prompt = tok.encode(o.prompt);  // continues the sequence: no BOS
    if (prompt.empty() && logits.empty())
      throw Error(cat(o.state_in, ": holds no logits after its last token; pass --prompt to continue it"));
  } else {
    prompt = encode_prompt(tok, o.prompt);
  }
  opt.feed_last = !o.state_out.empty();
  const auto st = runtime::generate(session, tok, prompt, opt, [](std::string_view text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  }, logits);
  if (!o.state_out.empty())
    runtime::save_state(o.state_out, m.model,
                        {session.state().clone(), {session.tokens().begin(), session.tokens().end()}, st.last_logits,
                         st.rng, {}});
  std::printf("\n");
  std::fprintf(stderr,
               "lineage: prompt %lld tokens, generated %lld tokens%s; prefill %.1f tok/s, decode %.1f tok/s\n",
               (long long)st.prompt_tokens, (long long)st.generated_tokens, st.stopped_at_eos ? " (stopped at EOS)" : "",
               st.prompt_tokens / std::max(st.prefill_seconds, 1e-9),
               st.generated_tokens > 1 ? (st.generated_tokens - 1) / std::max(st.decode_seconds, 1e-9) : 0.0);
}

}  // namespace

void add_generate(CLI::App& app) {
  static GenerateOpts o;
  auto* cmd = app.add_subcommand("generate", "generate text from a prompt, streamed to stdout; or from many prompts "
                                             "decoded together (--prompts), one JSON line each");
  add_model_options(*cmd, o.src, true);
  add_threads_option(*cmd);
  add_numerics_options(*cmd, o.src);
  auto* one = cmd->add_option("--prompt", o.prompt, "prompt text");
  auto* many = cmd->add_option("--prompts", o.prompts_file,
                               "file of prompts, one per line, or JSON Lines with \"prompt\" and optional "
                               "max_tokens, temperature, top_k, top_p, seed; decoded together, one JSON line "
                               "each on stdout (index, text, prompt_tokens, generated_tokens, finish_reason)");
  one->excludes(many);
  many->excludes(one);
  cmd->add_option("--batch,--slots", o.batch,
                  "--prompts: sequences decoding together at most, the state pool's slots (default 8)")
      ->check(CLI::Range(int64_t(1), int64_t(4096)))
      ->needs(many);
  cmd->add_option("--ctx", o.ctx, "--prompts: positions per sequence allocated up front (default: grow on demand)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 31))
      ->needs(many);
  cmd->add_option("--max-tokens", o.max_tokens, "tokens to generate at most")->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--temperature", o.temperature, "0 = greedy")->check(CLI::Range(0.0f, 100.0f));
  cmd->add_option("--top-k", o.top_k, "keep the k most likely tokens (0 = off)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", o.top_p, "nucleus sampling mass (1 = off)")->check(CLI::Range(0.0f, 1.0f));
  cmd->add_flag("--ignore-eos", o.ignore_eos, "do not stop at the end-of-sequence token");
  auto* in = cmd->add_option("--state-in", o.state_in,
                             "continue the sequence saved in this state file (--state-out): --prompt, if given, "
                             "follows its last token; the saved sampler stream continues unless --seed is given");
  auto* out = cmd->add_option("--state-out", o.state_out,
                              "write the sequence's whole state (prompt and generated tokens) to this file at the end "
                              "(docs/state-files.md)");
  in->excludes(many);
  out->excludes(many);
  cmd->callback([cmd, one, many, in] {
    o.seed_given = cmd->count("--seed") > 0;
    if (!one->count() && !many->count() && !in->count())
      throw Error("generate needs --prompt TEXT, --prompts FILE or --state-in FILE");
    if (!o.prompts_file.empty()) run_many(o);
    else run_one(o);
  });
}

}  // namespace lineage::app
