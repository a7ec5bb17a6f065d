// lineage perplexity: llama.cpp's llama-perplexity over lineage's forward (runtime/perplexity.h):
// perplexity over windows of a text or .bin corpus; --save-logits writes the scored positions'
// log-softmax rows (a .npy, and beside it F.json naming the windows they came from);
// --kld-base compares this run with such a file: KL divergence, top-1 agreement, Δp.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common.h"
#include "lineage/core/error.h"
#include "lineage/core/hash.h"
#include "lineage/core/json_read.h"
#include "lineage/io/npy.h"
#include "lineage/runtime/perplexity.h"
#include "lineage/train/trainer.h"

namespace lineage::app {

namespace fs = std::filesystem;

namespace {

// The corpus as ids: a .bin of ids (lineage train's format), else UTF-8 text through the tokenizer.
std::vector<int32_t> read_ids(const std::string& file, const io::LoadedModel& m) {
  const std::string bytes = read_file_text(file);
  if (fs::path(file).extension() == ".bin") return train::decode_bin(bytes, m.model.config.vocab_size, file);
  return require_tokenizer(m, "--data (text)").encode(bytes);
}

// What identifies the scored positions of a run: the windows and their targets.
nlohmann::json run_identity(const runtime::PerplexityOptions& o, int64_t windows, int64_t vocab,
                            const std::vector<int32_t>& targets) {
  Hasher h;
  h.add(std::string_view(reinterpret_cast<const char*>(targets.data()), targets.size() * sizeof(int32_t)));
  return {{"ctx", o.ctx}, {"windows", windows}, {"vocab", vocab}, {"positions", int64_t(targets.size())},
          {"targets_hash", h.value()}};
}

// The saved base run's rows, checked against this run's windows field by field.
Tensor read_base(const std::string& file, const nlohmann::json& mine) {
  const fs::path meta = file + ".json";
  if (!fs::exists(meta))
    throw Error(cat(meta.string(), ": not found; expected the file `lineage perplexity --save-logits ", file,
                    "` writes beside the rows"));
  const nlohmann::json theirs = read_json_file(meta);
  for (const char* field : {"ctx", "windows", "vocab", "positions", "targets_hash"})
    if (!theirs.contains(field) || theirs[field] != mine[field])
      throw Error(cat(meta.string(), ": field \"", field, "\" is ", theirs.contains(field) ? theirs[field].dump() : "missing",
                      ", this run's is ", mine[field].dump(), " (the base must be run on the same data with the same ",
                      "--ctx and --chunks, by a model of the same vocabulary)"));
  Tensor rows = io::map_npy_f32(file);  // mapped: read a window at a time as the run reaches it
  const Shape want{mine["positions"].get<int64_t>(), mine["vocab"].get<int64_t>()};
  if (rows.dtype() != DType::F32 || rows.shape() != want)
    throw Error(cat(file, ": shape ", shape_str(rows.shape()), ", expected float32 ", shape_str(want)));
  return rows;
}

}  // namespace

void add_perplexity(CLI::App& app) {
  struct Opts {
    ModelSource src;
    std::string data, save, base;
    runtime::PerplexityOptions p;
    bool json = false;
  };
  static Opts o;
  auto* cmd = app.add_subcommand("perplexity", "perplexity over windows of a corpus, and the KL divergence against a base run");
  add_model_options(*cmd, o.src, true);
  add_threads_option(*cmd);
  add_numerics_options(*cmd, o.src);
  cmd->add_option("--data", o.data, "UTF-8 text, or a .bin of token ids (lineage train's format)")->required();
  cmd->add_option("--ctx", o.p.ctx, "tokens per window; the second half of each is scored (default 512)")
      ->check(CLI::Range(int64_t(4), int64_t(1) << 20));
  cmd->add_option("--chunks", o.p.max_windows, "score at most this many windows (default: all)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--save-logits", o.save, "write the scored log-softmax rows to this .npy (and F.json) for --kld-base");
  cmd->add_option("--kld-base", o.base, "compare with a base run's --save-logits file: KL divergence, top-1, delta p");
  cmd->add_flag("--json", o.json, "print one JSON object instead of the report");
  cmd->callback([] {
    io::LoadedModel m = load(o.src, fs::path(o.data).extension() != ".bin");
    const std::vector<int32_t> ids = read_ids(o.data, m);
    if (m.tokenizer && m.tokenizer->adds_bos()) o.p.bos = m.tokenizer->bos_id();
    const int64_t windows = runtime::window_count(int64_t(ids.size()), o.p), V = m.model.config.vocab_size;
    const int64_t per = runtime::scored_per_window(o.p.ctx);
    if (!o.json)
      std::printf("perplexity: %lld windows of %lld tokens, %lld scored in each (%lld of %zu tokens)\n",
                  (long long)windows, (long long)o.p.ctx, (long long)per, (long long)(windows * per), ids.size());
    // The base is checked against this run's windows before the run, not after it.
    const nlohmann::json identity = run_identity(o.p, windows, V, runtime::scored_targets(ids, o.p));
    const Tensor base = o.base.empty() ? Tensor() : read_base(o.base, identity);
    std::optional<io::NpyWriter> save;
    if (!o.save.empty()) save.emplace(o.save, Shape{windows * per, V});
    // Each window's rows compared with the base's as they come: no run is held whole.
    runtime::KlDivergence kl(V);
    const std::vector<int32_t> targets = runtime::scored_targets(ids, o.p);
    int64_t done_rows = 0;
    const runtime::PerplexityResult r = runtime::perplexity(
        m.model, ids, o.p,
        [&](std::span<const float> block) {
          if (save) save->write(block.data(), int64_t(block.size()));
          const int64_t n = int64_t(block.size()) / V;
          if (!o.base.empty())
            kl.add({base.data<float>() + done_rows * V, block.size()}, block,
                   {targets.data() + done_rows, size_t(n)});
          done_rows += n;
        },
        [&](int64_t w, int64_t n, double ppl) {  // llama-perplexity's running estimate
          if (o.json) return;
          std::printf("[%lld]%.4f%s", (long long)w, ppl, w == n ? "\n" : ",");
          std::fflush(stdout);
        });
    if (save) {
      save->close();
      std::ofstream meta(o.save + ".json");
      meta << identity.dump(2) << "\n";
      if (!meta) throw Error(cat(o.save, ".json: write failed"));
    }
    nlohmann::json out = {{"windows", r.windows}, {"ctx", o.p.ctx}, {"positions", int64_t(r.nll.size())},
                          {"ppl", r.ppl()}, {"ppl_error", r.ppl_error()}};
    if (!o.base.empty()) {
      const runtime::KlDivergence::Stats s = kl.stats();
      out["kld"] = {{"base", o.base},        {"ppl_base", s.ppl_base},     {"ppl_q", s.ppl_q},
                    {"ln_ratio", s.ln_ratio}, {"ln_ratio_error", s.ln_ratio_error},
                    {"nll_correlation", s.nll_correlation},
                    {"mean", s.kld_mean},     {"mean_error", s.kld_error},  {"median", s.kld_median},
                    {"p90", s.kld_p90},       {"p99", s.kld_p99},           {"p99_9", s.kld_p999},
                    {"max", s.kld_max},       {"top1", s.top1},             {"top1_error", s.top1_error},
                    {"dp_mean", s.dp_mean},   {"dp_rms", s.dp_rms},         {"dp_p1", s.dp_p1},
                    {"dp_p99", s.dp_p99}};
    }
    if (o.json) {
      std::printf("%s\n", out.dump(2).c_str());
      return;
    }
    std::printf("Final estimate: PPL = %.4f +/- %.4f\n", r.ppl(), r.ppl_error());
    if (!o.base.empty()) {
      const auto& k = out["kld"];
      const auto line = [](const char* what, double v) { std::printf("%-30s: %.6f\n", what, v); };
      std::printf("\n====== KL divergence against %s ======\n", o.base.c_str());
      line("Mean PPL(Q)", k["ppl_q"]);
      line("Mean PPL(base)", k["ppl_base"]);
      line("Cor(ln PPL(Q), ln PPL(base))", k["nll_correlation"]);
      std::printf("%-30s: %.6f +/- %.6f\n", "Mean ln(PPL(Q)/PPL(base))", k["ln_ratio"].get<double>(),
                  k["ln_ratio_error"].get<double>());
      std::printf("%-30s: %.6f +/- %.6f\n", "Mean KLD", k["mean"].get<double>(), k["mean_error"].get<double>());
      line("Maximum KLD", k["max"]);
      line("99.9%   KLD", k["p99_9"]);
      line("99.0%   KLD", k["p99"]);
      line("90.0%   KLD", k["p90"]);
      line("Median  KLD", k["median"]);
      std::printf("%-30s: %.3f +/- %.3f %%\n", "Same top p", 100 * k["top1"].get<double>(),
                  100 * k["top1_error"].get<double>());
      std::printf("%-30s: %.3f %%\n", "Mean    delta p", 100 * k["dp_mean"].get<double>());
      std::printf("%-30s: %.3f %%\n", "RMS     delta p", 100 * k["dp_rms"].get<double>());
      std::printf("%-30s: %.3f %%\n", " 1.0%   delta p", 100 * k["dp_p1"].get<double>());
      std::printf("%-30s: %.3f %%\n", "99.0%   delta p", 100 * k["dp_p99"].get<double>());
    }
  });
}

}  // namespace lineage::app
