// lineage bench-train: training tokens/s (forward, backward, AdamW) next to the f32 peak FLOP/s
// measured in the same run, and, with --pytorch, PyTorch's on the same shapes (reference/bench_train.py).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common.h"
#include "lineage/core/error.h"
#include "lineage/core/rng.h"
#include "lineage/core/json_read.h"
#include "lineage/kernels/roofline.h"
#include "lineage/core/parallel.h"
#include "lineage/model/archs/presets.h"
#include "lineage/train/trainer.h"

namespace lineage::app {

namespace fs = std::filesystem;

namespace {

// GPT-2's shape for training benchmarks: 6 layers of 384, 6 heads, GPT-2's vocabulary.
constexpr const char* kDefaultConfig =
    R"({"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024, "n_embd": 384, "n_layer": 6, "n_head": 6})";

// Model FLOPs of one trained token: 6 per weight of every matrix product (forward 2, backward 4),
// the LM head included, plus softmax attention's q·k and p·v over an average causal context of
// (T + 1)/2, three times its forward.
double train_flops_per_token(model::Model& m, int64_t T) {
  double matmul = 0;
  m.for_each_tensor([&](const std::string& name, Tensor& t, const Shape&, layers::Init) {
    if (t.ndim() >= 2 && name != m.names.embed && name != m.names.pos_embed) matmul += double(t.numel());
  });
  matmul += double(m.config.vocab_size * m.config.d_model);
  double attention = 0;
  for (const model::Block& b : m.blocks)
    if (std::holds_alternative<layers::Attention>(b.mixer))
      attention += 3.0 * 4.0 * double(m.config.d_model) * double(T + 1) / 2.0;
  return 6.0 * matmul + attention;
}

}  // namespace

void add_bench_train(CLI::App& app) {
  struct Opts {
    std::string preset, config;
    int64_t batch = 8, seq_len = 512, steps = 5;
    bool pytorch = false, json = false;
  };
  static Opts o;
  auto* cmd = app.add_subcommand("bench-train", "training tokens/s next to the f32 peak measured in the same run "
                                                "(and PyTorch's, with --pytorch)");
  auto* preset = cmd->add_option("--preset", o.preset, "architecture preset (default: GPT-2 6 layers × 384)");
  cmd->add_option("--config", o.config, "a config.json to benchmark instead")->excludes(preset);
  cmd->add_option("--batch", o.batch, "sequences per step")->check(CLI::PositiveNumber);
  cmd->add_option("--seq-len", o.seq_len, "tokens per sequence")->check(CLI::PositiveNumber);
  cmd->add_option("--steps", o.steps, "timed steps (after one warm-up step)")->check(CLI::PositiveNumber);
  cmd->add_flag("--pytorch", o.pytorch, "also time PyTorch (Debian's python3-torch, /usr/bin/python3) on the same shapes");
  cmd->add_flag("--json", o.json, "one JSON object on stdout");
  add_threads_option(*cmd);
  cmd->callback([] {
    std::string config_json = kDefaultConfig, label = "gpt2 6x384";
    if (!o.preset.empty()) {
      label = o.preset;
      for (const auto& p : model::presets())
        if (p.name == o.preset) config_json = p.config_json;
    } else if (!o.config.empty()) {
      label = o.config;
      config_json = read_file_text(o.config);
    }
    const fs::path tmp = fs::temp_directory_path() / cat("lineage-bench-train-", getpid());
    fs::create_directories(tmp);
    std::ofstream(tmp / "config.json") << config_json;
    model::Model m;
    try {
      m = !o.preset.empty() ? model::preset_skeleton(o.preset) : io::load_skeleton(tmp).model;
    } catch (...) {
      fs::remove_all(tmp);
      throw;
    }
    const std::string why = train::untrainable_reason(m);
    if (!why.empty()) throw Error(cat(label, ": cannot train this ", m.config.model_type, " model: ", why));
    model::init_random(m, 1, DType::F32);
    train::to_trainable(m);
    const int threads = num_threads();
    const double peak = kernels::measure_peak_flops(DType::F32, threads);

    train::TrainConfig c;
    c.batch = o.batch, c.seq_len = o.seq_len, c.steps = o.steps + 1, c.warmup = 0, c.eval_every = 0;
    train::TokenData data;
    Rng rng(7);
    for (int64_t i = 0; i < 4 * o.batch * (o.seq_len + 1); ++i)
      data.train.push_back(int32_t(rng.next_u64() % uint64_t(m.config.vocab_size)));
    train::Trainer tr(m, c, std::move(data));
    tr.step();  // warm-up: buffers grown, pages touched
    double best = 1e30, total = 0;
    for (int64_t s = 0; s < o.steps; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      tr.step();
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::min(best, dt), total += dt;
    }
    const double tokens = double(o.batch * o.seq_len), tps = tokens / best, flops = train_flops_per_token(m, o.seq_len);
    const double achieved = tps * flops;

    double torch_tps = 0;
    std::string torch_version;
    if (o.pytorch) {
      std::ofstream(tmp / "config.json") << config_json;
      const std::string script = (fs::path(LINEAGE_SOURCE_DIR) / "reference" / "bench_train.py").string();
      const std::string command = cat("/usr/bin/python3 ", script, " ", (tmp / "config.json").string(), " --batch ",
                                      o.batch, " --seq-len ", o.seq_len, " --steps ", o.steps, " --threads ", threads,
                                      " > ", (tmp / "torch.json").string());
      if (std::system(command.c_str()) != 0) {
        fs::remove_all(tmp);
        throw Error(cat("--pytorch: ", script, " failed (it needs Debian's python3-torch)"));
      }
      const nlohmann::json r = read_json_file(tmp / "torch.json");
      torch_tps = r["tokens_per_s"].get<double>();
      torch_version = r["torch"].get<std::string>();
    }
    fs::remove_all(tmp);

    if (o.json) {
      nlohmann::json j = {{"model", label},          {"threads", threads},       {"batch", o.batch},
                          {"seq_len", o.seq_len},    {"tokens_per_s", tps},      {"mean_tokens_per_s", tokens * o.steps / total},
                          {"flops_per_token", flops}, {"achieved_flops", achieved}, {"peak_flops", peak},
                          {"peak_share", achieved / peak}};
      if (o.pytorch) j["pytorch_tokens_per_s"] = torch_tps, j["speedup_vs_pytorch"] = tps / torch_tps, j["torch"] = torch_version;
      std::printf("%s\n", j.dump().c_str());
      return;
    }
    std::printf("roofline: f32 peak %.1f GFLOP/s (%s), %d threads\n", peak / 1e9, kernels::peak_flops_kernel(DType::F32),
                threads);
    std::printf("%-28s %9s %11s %12s %11s %9s %12s %10s\n", "model", "tok/step", "train t/s", "MFLOP/token",
                "GFLOP/s", "% peak", "PyTorch t/s", "x PyTorch");
    std::printf("%-28s %9.0f %11.0f %12.1f %11.1f %8.1f%%", label.c_str(), tokens, tps, flops / 1e6, achieved / 1e9,
                100.0 * achieved / peak);
    if (o.pytorch) std::printf(" %12.0f %9.2fx\n", torch_tps, tps / torch_tps);
    else std::printf(" %12s %10s\n", "-", "-");
  });
}

}  // namespace lineage::app
