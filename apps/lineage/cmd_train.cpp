// lineage train: trains any model lineage can run the backward of, from a preset, a config.json or
// a checkpoint directory, on a text or .bin corpus; writes Hugging Face checkpoints (resumable) and
// the loss curve.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common.h"
#include "lineage/core/error.h"
#include "lineage/core/json_read.h"
#include "lineage/model/accounting.h"
#include "lineage/model/archs/presets.h"
#include "lineage/train/trainer.h"

namespace lineage::app {

namespace fs = std::filesystem;

namespace {

std::string duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  char buf[32];
  const auto t = int64_t(s + 0.5);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)(t / 3600), (long long)(t % 3600 / 60));
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)(t / 60), (long long)(t % 60));
  else std::snprintf(buf, sizeof buf, "%llds", (long long)t);
  return buf;
}

std::string progress_line(const train::LogRow& r, int64_t total, double tok_s, double eta, bool bar) {
  std::ostringstream s;
  s << "step " << r.step << "/" << total;
  if (bar) {
    const int width = 24, filled = int(double(width) * double(r.step) / double(total));
    s << " [" << std::string(size_t(filled), '#') << std::string(size_t(width - filled), '.') << "]";
  }
  char buf[160];
  std::snprintf(buf, sizeof buf, " loss %.4f", r.loss);
  s << buf;
  if (r.val_loss) std::snprintf(buf, sizeof buf, " val %.4f", *r.val_loss), s << buf;
  std::snprintf(buf, sizeof buf, " | lr %.2e | |g| %.3f | %.0f tok/s | ETA %s", r.lr, r.grad_norm, tok_s,
                duration(eta).c_str());
  s << buf;
  return s.str();
}

void check_trainable(const model::Model& m, const std::string& where) {
  const std::string why = train::untrainable_reason(m);
  if (!why.empty()) throw Error(cat(where, ": cannot train this ", m.config.model_type, " model: ", why));
}

}  // namespace

void add_train(CLI::App& app) {
  struct Opts {
    std::string preset, config, model, tokenizer, data, out, save_dtype = "f32";
    uint64_t seed = 1;
    double val_fraction = 0.1;
    int64_t log_every = 10;
    train::TrainConfig c;
  };
  static Opts o;
  auto* cmd = app.add_subcommand("train", "train a model (backward passes in C++) and write Hugging Face checkpoints");
  auto* preset = cmd->add_option("--preset", o.preset, "start from a built-in architecture with seeded random weights");
  auto* config = cmd->add_option("--config", o.config, "start from this config.json with seeded random weights");
  auto* model = cmd->add_option("--model", o.model,
                                "continue from a checkpoint directory (its optimizer state too, when it has one)");
  preset->excludes(config, model);
  config->excludes(model);
  cmd->add_option("--tokenizer", o.tokenizer, "tokenizer directory for text data (default: the --model directory's)");
  cmd->add_option("--data", o.data, "training corpus: UTF-8 text, or a .bin of uint16 token ids")->required();
  cmd->add_option("--out", o.out, "checkpoint directory to write")->required();
  cmd->add_option("--seed", o.seed, "seed of the initial weights and of the batches");
  cmd->add_option("--batch", o.c.batch, "sequences per micro-batch")->check(CLI::PositiveNumber);
  cmd->add_option("--seq-len", o.c.seq_len, "tokens per sequence")->check(CLI::PositiveNumber);
  cmd->add_option("--accum", o.c.accum, "micro-batches per optimizer step (gradient accumulation)")->check(CLI::PositiveNumber);
  cmd->add_option("--steps", o.c.steps, "optimizer steps of the whole run (the schedule's length)")->check(CLI::PositiveNumber);
  cmd->add_option("--warmup", o.c.warmup, "linear warm-up steps")->check(CLI::NonNegativeNumber);
  cmd->add_option("--lr", o.c.lr, "peak learning rate")->check(CLI::PositiveNumber);
  cmd->add_option("--min-lr", o.c.min_lr, "learning rate at the end of the cosine decay")->check(CLI::NonNegativeNumber);
  cmd->add_option("--weight-decay", o.c.adam.weight_decay, "AdamW weight decay (not on norms and biases)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--beta1", o.c.adam.beta1, "AdamW β1")->check(CLI::Range(0.0, 0.999999));
  cmd->add_option("--beta2", o.c.adam.beta2, "AdamW β2")->check(CLI::Range(0.0, 0.999999));
  cmd->add_option("--eps", o.c.adam.eps, "AdamW ε")->check(CLI::PositiveNumber);
  cmd->add_option("--grad-clip", o.c.grad_clip, "clip the global gradient norm to this (0: off)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--val-fraction", o.val_fraction, "held-out share of the corpus (its end)")->check(CLI::Range(0.0, 0.9));
  cmd->add_option("--eval-every", o.c.eval_every, "steps between held-out evaluations (0: at the end)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--eval-batches", o.c.eval_batches, "micro-batches per evaluation")->check(CLI::PositiveNumber);
  cmd->add_option("--save-every", o.c.save_every, "steps between checkpoints (0: at the end)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--save-dtype", o.save_dtype, "dtype of the saved weights")->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--log-every", o.log_every, "steps between progress lines when stderr is not a terminal")
      ->check(CLI::PositiveNumber);
  add_threads_option(*cmd);
  cmd->callback([] {
    if (o.preset.empty() && o.config.empty() && o.model.empty())
      throw Error("train: one of --preset, --config or --model is required");
    o.c.seed = o.seed;
    o.c.save_dtype = o.save_dtype == "bf16" ? DType::BF16 : DType::F32;
    if (o.c.warmup >= o.c.steps && o.c.steps > 1)
      throw Error(cat("--warmup: expected fewer than --steps (", o.c.steps, "), got ", o.c.warmup));
    const fs::path out = o.out;
    model::Model m;
    std::string config_json;
    std::optional<fs::path> tokenizer_dir;
    if (!o.tokenizer.empty()) tokenizer_dir = o.tokenizer;
    std::optional<io::LoadedModel> loaded;
    if (!o.preset.empty()) {
      m = model::preset_skeleton(o.preset);
      for (const auto& p : model::presets())
        if (p.name == o.preset) config_json = p.config_json;
      check_trainable(m, "--preset " + o.preset);
      model::init_random(m, o.seed, DType::F32);
    } else if (!o.config.empty()) {
      config_json = read_file_text(o.config);
      const fs::path tmp = fs::temp_directory_path() / cat("lineage-train-config-", getpid());
      fs::create_directories(tmp);
      std::ofstream(tmp / "config.json") << config_json;
      try {
        m = io::load_skeleton(tmp).model;
      } catch (const Error& e) {
        fs::remove_all(tmp);
        throw Error(cat(o.config, ": ", e.what()));
      }
      fs::remove_all(tmp);
      check_trainable(m, o.config);
      model::init_random(m, o.seed, DType::F32);
    } else {
      loaded = io::load_model(o.model, !tokenizer_dir.has_value(), io::WeightStorage::Mapped);
      m = std::move(loaded->model);
      check_trainable(m, o.model);
      config_json = read_file_text(fs::path(o.model) / "config.json");
      if (!tokenizer_dir && loaded->tokenizer) tokenizer_dir = o.model;
    }
    train::to_trainable(m);
    std::optional<tokenizer::Tokenizer> tok;
    if (tokenizer_dir) tok = tokenizer::Tokenizer::load(*tokenizer_dir);
    train::TokenData data = train::load_tokens(o.data, tok ? &*tok : nullptr, m.config.vocab_size, o.val_fraction,
                                               o.c.seq_len);
    if (data.val.empty()) o.c.eval_every = 0;
    const size_t n_train = data.train.size(), n_val = data.val.size();
    train::Trainer trainer(m, o.c, std::move(data));
    if (!o.model.empty() && fs::exists(fs::path(o.model) / "trainer_state.json")) {
      trainer.resume(o.model);
      if (trainer.steps_done() >= o.c.steps)
        throw Error(cat("--steps: the checkpoint in ", o.model, " has done ", trainer.steps_done(),
                        " steps already; ask for more"));
      std::fprintf(stderr, "resuming at step %lld of %lld\n", (long long)trainer.steps_done(), (long long)o.c.steps);
    }
    const model::ParamCount pc = model::count_params(m);
    std::fprintf(stderr, "training %s: %lld parameters, %lld train / %lld held-out tokens, %lld tokens a step\n",
                 m.config.model_type.c_str(), (long long)pc.total, (long long)n_train, (long long)n_val,
                 (long long)(o.c.batch * o.c.seq_len * o.c.accum));
    const bool tty = isatty(fileno(stderr));
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t first = trainer.steps_done();
    while (trainer.steps_done() < o.c.steps) {
      const train::LogRow r = trainer.step();
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double done = double(r.step - first), tok_s = done * double(o.c.batch * o.c.seq_len * o.c.accum) / secs;
      const double eta = secs / done * double(o.c.steps - r.step);
      const bool last = r.step == o.c.steps;
      if (tty) std::fprintf(stderr, "\r\033[K%s%s", progress_line(r, o.c.steps, tok_s, eta, true).c_str(), last ? "\n" : "");
      else if (last || r.val_loss || r.step % o.log_every == 0)
        std::fprintf(stderr, "%s\n", progress_line(r, o.c.steps, tok_s, eta, false).c_str());
      if (o.c.save_every > 0 && r.step % o.c.save_every == 0 && !last) trainer.save(out, config_json, tokenizer_dir);
    }
    trainer.save(out, config_json, tokenizer_dir);
    const train::LogRow& end = trainer.log().back();
    std::printf("trained %lld steps: loss %.4f", (long long)end.step, end.loss);
    if (end.val_loss) std::printf(", held-out loss %.4f (perplexity %.2f)", *end.val_loss, std::exp(*end.val_loss));
    std::printf("\ncheckpoint: %s (config.json, model.safetensors, optimizer state, loss.csv, loss.svg)\n",
                out.string().c_str());
  });
}

}  // namespace lineage::app
