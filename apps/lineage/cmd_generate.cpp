// lineage generate: prompt in, text streamed to stdout, a summary on stderr.
#include <cstdio>

#include "common.h"
#include "lineage/core/error.h"
#include "lineage/runtime/generate.h"

namespace lineage::app {

void add_generate(CLI::App& app) {
  struct Opts {
    ModelSource src;
    std::string prompt;
    int max_tokens = 64;
    float temperature = 0.8f, top_p = 1.0f;
    int top_k = 0;
    bool ignore_eos = false;
  };
  static Opts o;
  auto* cmd = app.add_subcommand("generate", "generate text from a prompt, streamed to stdout");
  add_model_options(*cmd, o.src, true);
  add_threads_option(*cmd);
  add_bf16_options(*cmd, o.src);
  cmd->add_option("--prompt", o.prompt, "prompt text")->required();
  cmd->add_option("--max-tokens", o.max_tokens, "tokens to generate at most")->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--temperature", o.temperature, "0 = greedy")->check(CLI::Range(0.0f, 100.0f));
  cmd->add_option("--top-k", o.top_k, "keep the k most likely tokens (0 = off)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", o.top_p, "nucleus sampling mass (1 = off)")->check(CLI::Range(0.0f, 1.0f));
  cmd->add_flag("--ignore-eos", o.ignore_eos, "do not stop at the end-of-sequence token");
  cmd->callback([] {
    io::LoadedModel m = load(o.src, true);
    const io::Tokenizer& tok = require_tokenizer(m, "generate");
    std::vector<int32_t> prompt = tok.encode(o.prompt);
    if (tok.adds_bos() && tok.bos_id()) prompt.insert(prompt.begin(), *tok.bos_id());
    runtime::GenerateOptions opt;
    opt.max_tokens = o.max_tokens;
    opt.sampling = {o.temperature, o.top_k, o.top_p, o.src.seed};
    if (!o.ignore_eos) opt.eos = m.model.config.eos_token_id ? m.model.config.eos_token_id : tok.eos_id();
    runtime::Session session(m.model);
    const auto st = runtime::generate(session, tok, prompt, opt, [](std::string_view text) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    });
    std::printf("\n");
    std::fprintf(stderr,
                 "lineage: prompt %lld tokens, generated %lld tokens%s; prefill %.1f tok/s, decode %.1f tok/s\n",
                 (long long)st.prompt_tokens, (long long)st.generated_tokens, st.stopped_at_eos ? " (stopped at EOS)" : "",
                 st.prompt_tokens / std::max(st.prefill_seconds, 1e-9),
                 st.generated_tokens > 1 ? (st.generated_tokens - 1) / std::max(st.decode_seconds, 1e-9) : 0.0);
  });
}

}  // namespace lineage::app
