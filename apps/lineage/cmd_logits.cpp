// lineage logits: float32 logits [T, vocab] to a .npy file, fed through the session in chunks.
#include <algorithm>

#include "common.h"
#include "ranks.h"
#include "lineage/core/error.h"
#include "lineage/io/npy.h"
#include "lineage/runtime/session.h"
#include "lineage/runtime/state_file.h"

namespace lineage::app {

void add_logits(CLI::App& app) {
  struct Opts {
    ModelSource src;
    std::string tokens, prompt, out;
    int64_t chunk = 0;
    std::string state_in, state_out;
  };
  static Opts o;
  auto* cmd = app.add_subcommand("logits", "write float32 logits [T, vocab] of a token sequence to a .npy file");
  add_model_options(*cmd, o.src, true);
  add_threads_option(*cmd);
  add_numerics_options(*cmd, o.src);
  add_token_options(*cmd, o.tokens, o.prompt);
  cmd->add_option("--out", o.out, "output .npy file")->required();
  cmd->add_option("--chunk", o.chunk, "feed the sequence in pieces of N tokens (1 = token-by-token decode)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--state-in", o.state_in,
                  "continue the sequence saved in this state file (--state-out): the tokens follow its last one");
  cmd->add_option("--state-out", o.state_out,
                  "write the sequence's whole state after the last token to this file (docs/state-files.md)");
  cmd->callback([] {
    if (o.tokens.empty() && o.prompt.empty()) throw Error("logits: one of --tokens or --prompt is required");
    state_files_on_one_rank("--state-in", o.state_in);
    state_files_on_one_rank("--state-out", o.state_out);
    io::LoadedModel m = load(o.src, !o.prompt.empty());
    runtime::Session s(m.model);
    if (!o.state_in.empty()) {
      const runtime::SavedState saved = runtime::load_state(o.state_in, m.model);
      s.restore(saved.state, saved.tokens);
    }
    // A continued sequence has its BOS already.
    const std::vector<int32_t> ids = input_ids(m, o.tokens, o.prompt, s.position() == 0, "logits");
    const int64_t T = int64_t(ids.size()), V = m.model.config.vocab_size;
    const int64_t chunk = o.chunk > 0 ? o.chunk : T;
    std::vector<float> all(size_t(T) * V);
    for (int64_t i = 0; i < T; i += chunk) {
      const int64_t n = std::min(chunk, T - i);
      const auto logits = s.prefill(std::span<const int32_t>(ids.data() + i, n), true);
      std::copy(logits.begin(), logits.end(), all.begin() + i * V);
    }
    if (!is_root()) return;  // under mpirun: every rank holds the same logits; rank 0 writes them
    io::save_npy(o.out, all.data(), {T, V});
    if (!o.state_out.empty())
      runtime::save_state(o.state_out, m.model,
                          {s.state().clone(), {s.tokens().begin(), s.tokens().end()},
                           {all.end() - V, all.end()}, std::nullopt, {}});
  });
}

}  // namespace lineage::app
