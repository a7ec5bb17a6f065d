// lineage and llama.cpp on the same GGUF files: llama.cpp's own logits (tools/llama_logits.cpp,
// compiled against the llama.cpp that scripts/install-llama-cpp.sh builds in ~/.cache/lineage) next
// to lineage's, on GGUF mirrors (reference/gguf_mirror.py) of the reference's checkpoints, and on the
// block-quantized files its llama-quantize makes of them.
// GPT-2 is held to the PyTorch reference (Cli and GgufModel tests); against llama.cpp the gap is
// printed and bounded: llama.cpp's CPU GELU reads an f16 table, which puts its f32 path about 3e-4
// from an exact f32 reference, and a wrong mapping (a transposed matrix, a missed bias, the wrong
// GELU) is off by far more. Skipped, saying how to build it, where llama-logits is not built.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/core/tensor.h"
#include "lineage/io/gguf.h"
#include "lineage/io/npy.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/ref/ref.h"
#include "test_support.h"

namespace lineage {
namespace gguf_llama_test {
namespace {

namespace fs = std::filesystem;
using test::run_lineage;
using test::shell_quote;

fs::path llama_logits() {
  if (const char* p = std::getenv("LINEAGE_LLAMA_LOGITS")) return p;
  const char* cache = std::getenv("LINEAGE_CACHE");
  const char* home = std::getenv("HOME");
  const fs::path root = cache ? fs::path(cache) : fs::path(home ? home : "/root") / ".cache" / "lineage";
  return root / "llama.cpp" / "build" / "lineage-peers" / "llama-logits";
}

std::string not_built(const fs::path& tool) {
  return tool.string() + " is not built: scripts/install-llama-cpp.sh --tests (which scripts/install-deps.sh --test "
                         "runs) builds llama.cpp and it, about 4 minutes the first time";
}

double top1_agreement(const Tensor& a, const Tensor& b) {
  const int64_t rows = a.dim(0), cols = a.dim(1);
  int64_t same = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = a.data<float>() + r * cols;
    const float* y = b.data<float>() + r * cols;
    int64_t ix = 0, iy = 0;
    for (int64_t c = 1; c < cols; ++c) {
      if (x[c] > x[ix]) ix = c;
      if (y[c] > y[iy]) iy = c;
    }
    same += ix == iy;
  }
  return double(same) / double(rows);
}

TEST(GgufLlama, Gpt2LogitsNextToLlamaCppsOnTheSameFile) {
  const fs::path tool = llama_logits();
  if (!fs::exists(tool))
    GTEST_SKIP() << not_built(tool);
  for (const char* name : {"f32_gpt2_shapes", "f32_untied_lm_head", "f32_tanh"}) {
    SCOPED_TRACE(name);
    const fs::path dir = test::testdata() / "gpt2" / name, gguf = test::temp_dir() / (std::string(name) + ".gguf");
    const std::string mirror = "/usr/bin/python3 " +
                               shell_quote((test::source_dir() / "reference" / "gguf_mirror.py").string()) + " " +
                               shell_quote(dir.string()) + " " + shell_quote(gguf.string());
    ASSERT_EQ(std::system(mirror.c_str()), 0) << mirror;
    const std::string tokens = test::golden_tokens_arg(dir);
    const fs::path ours = test::temp_dir() / "lineage.npy";
    const auto r = run_lineage("logits --model " + shell_quote(gguf.string()) + " --tokens '" + tokens + "' --out " +
                               shell_quote(ours.string()) + " --threads 2");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const Tensor mine = io::load_npy(ours), golden = io::load_npy(dir / "golden" / "logits.npy");
    for (const char* chunk : {"0", "1"}) {
      const fs::path theirs = test::temp_dir() / "llama.npy";
      const std::string cmd = shell_quote(tool.string()) + " " + shell_quote(gguf.string()) + " " +
                              shell_quote(theirs.string()) + " " + tokens + " --chunk " + chunk + " --threads 2";
      ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
      const Tensor llama = io::load_npy(theirs);
      ASSERT_EQ(llama.shape(), mine.shape());
      const double gap = test::rel_rms(mine.data<float>(), llama.data<float>(), mine.numel());
      const double llama_to_ref = test::rel_rms(llama.data<float>(), golden.data<float>(), golden.numel());
      const double lineage_to_ref = test::rel_rms(mine.data<float>(), golden.data<float>(), golden.numel());
      const double top1 = top1_agreement(mine, llama);
      std::printf("[ gpt2 %s, llama.cpp --chunk %s ] lineage vs llama.cpp %.3g, llama.cpp vs PyTorch %.3g, lineage vs "
                  "PyTorch %.3g (relative RMS); top-1 agreement %.3f\n",
                  name, chunk, gap, llama_to_ref, lineage_to_ref, top1);
      EXPECT_LE(gap, 1e-3);
      EXPECT_LE(lineage_to_ref, 1e-5);
      EXPECT_GE(top1, 0.98);
    }
  }
}

// Qwen3-Next, Qwen3.5, Qwen3.5-MoE, Kimi Linear and Kimi K3 (F32 experts: llama.cpp multiplies MXFP4
// with 8-bit activations) on llama.cpp's f32 CPU path, which is f32 throughout: the mirrors of the reference's checkpoints in the shapes llama.cpp loads (dk = dv; as
// many KDA as MLA heads), whole and token by token, within the 1e-4 of lineage, and both near
// the PyTorch golden.
TEST(GgufLlama, HybridLogitsNextToLlamaCppsOnTheSameFile) {
  const fs::path tool = llama_logits();
  if (!fs::exists(tool))
    GTEST_SKIP() << not_built(tool);
  const std::vector<std::string> names = {"qwen3_next/f32_dk_eq_dv", "qwen3_5/f32_dk_eq_dv", "qwen3_5_moe/f32_dk_eq_dv",
                                          "kimi_linear/f32_heads_equal", "kimi_k3/f32_heads_equal"};
  const fs::path tmp = test::temp_dir();
  std::string mirror = "/usr/bin/python3 " + shell_quote((test::source_dir() / "reference" / "gguf_mirror.py").string());
  for (size_t i = 0; i < names.size(); ++i)
    mirror += (i ? " --next " : " ") + shell_quote((test::testdata() / names[i]).string()) + " " +
              shell_quote((tmp / cat("q", i, ".gguf")).string());
  ASSERT_EQ(std::system(mirror.c_str()), 0) << mirror;
  for (size_t i = 0; i < names.size(); ++i) {
    SCOPED_TRACE(names[i]);
    const fs::path dir = test::testdata() / names[i], gguf = tmp / cat("q", i, ".gguf");
    const std::string tokens = test::golden_tokens_arg(dir);
    const Tensor golden = io::load_npy(dir / "golden" / "logits.npy");
    for (const char* chunk : {"0", "1"}) {
      const fs::path ours = tmp / "lineage.npy", theirs = tmp / "llama.npy";
      const auto r = run_lineage("logits --model " + shell_quote(gguf.string()) + " --tokens '" + tokens + "' --out " +
                                 shell_quote(ours.string()) + " --threads 2 --chunk " + (chunk[0] == '0' ? "64" : "1"));
      ASSERT_EQ(r.exit_code, 0) << r.err;
      const std::string cmd = shell_quote(tool.string()) + " " + shell_quote(gguf.string()) + " " +
                              shell_quote(theirs.string()) + " " + tokens + " --chunk " + chunk + " --threads 2";
      ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
      const Tensor mine = io::load_npy(ours), llama = io::load_npy(theirs);
      ASSERT_EQ(llama.shape(), mine.shape());
      const double gap = test::rel_rms(mine.data<float>(), llama.data<float>(), mine.numel());
      const double llama_to_ref = test::rel_rms(llama.data<float>(), golden.data<float>(), golden.numel());
      const double lineage_to_ref = test::rel_rms(mine.data<float>(), golden.data<float>(), golden.numel());
      std::printf("[ %s, --chunk %s ] lineage vs llama.cpp %.3g, llama.cpp vs PyTorch %.3g, lineage vs PyTorch %.3g "
                  "(relative RMS); top-1 agreement %.3f\n",
                  names[i].c_str(), chunk, gap, llama_to_ref, lineage_to_ref, top1_agreement(mine, llama));
      EXPECT_LE(gap, 1e-4);
      EXPECT_LE(lineage_to_ref, 1e-5);
      EXPECT_LE(llama_to_ref, 1e-4);
    }
  }
}

// reference/gguf_mirror.py's split files (as gguf-split writes them) are what llama.cpp reads too:
// its logits on the three files equal its logits on the one.
TEST(GgufLlama, LlamaCppReadsTheMirrorsSplitFiles) {
  const fs::path tool = llama_logits();
  if (!fs::exists(tool))
    GTEST_SKIP() << not_built(tool);
  const fs::path dir = test::testdata() / "gpt2" / "f32_gpt2_shapes", out = test::temp_dir();
  const std::string mirror = "/usr/bin/python3 " +
                             shell_quote((test::source_dir() / "reference" / "gguf_mirror.py").string()) + " " +
                             shell_quote(dir.string()) + " " + shell_quote((out / "whole.gguf").string()) + " --next " +
                             shell_quote(dir.string()) + " " + shell_quote((out / "parts.gguf").string()) + " --split 3";
  ASSERT_EQ(std::system(mirror.c_str()), 0) << mirror;
  const std::string tokens = test::golden_tokens_arg(dir);
  Tensor got[2];
  const char* files[2] = {"whole.gguf", "parts-00001-of-00003.gguf"};
  for (int i = 0; i < 2; ++i) {
    const fs::path npy = out / (std::to_string(i) + ".npy");
    const std::string cmd = shell_quote(tool.string()) + " " + shell_quote((out / files[i]).string()) + " " +
                            shell_quote(npy.string()) + " " + tokens + " --threads 2";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    got[i] = io::load_npy(npy);
  }
  ASSERT_EQ(got[0].shape(), got[1].shape());
  EXPECT_EQ(test::rel_rms(got[1].data<float>(), got[0].data<float>(), got[0].numel()), 0.0);
}

fs::path llama_quantize() { return llama_logits().parent_path().parent_path() / "bin" / "llama-quantize"; }

// Per row of logits: KL(p_b || p_a) of their softmaxes.
std::vector<double> kld_rows(const Tensor& a, const Tensor& b) {
  const int64_t rows = a.dim(0), cols = a.dim(1);
  std::vector<double> out;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = a.data<float>() + r * cols;
    const float* y = b.data<float>() + r * cols;
    double mx = x[0], my = y[0], sx = 0, sy = 0, k = 0;
    for (int64_t c = 1; c < cols; ++c) mx = std::max(mx, double(x[c])), my = std::max(my, double(y[c]));
    for (int64_t c = 0; c < cols; ++c) sx += std::exp(x[c] - mx), sy += std::exp(y[c] - my);
    for (int64_t c = 0; c < cols; ++c) {
      const double lx = x[c] - mx - std::log(sx), ly = y[c] - my - std::log(sy);
      k += std::exp(ly) * (ly - lx);
    }
    out.push_back(k);
  }
  return out;
}

// ggml's block formats on files llama-quantize writes from the mirrors of two checkpoints whose widths
// are whole 256-value blocks (GPT-2 and Qwen3.5-MoE), between them every format lineage computes on:
// - every block tensor's values as ref::ggml_decode_row decodes them equal, bit for bit, the f32 that
//   `llama-quantize --allow-requantize Q.gguf F.gguf F32` writes for it (ggml's dequantize_row_*);
// - `lineage info` counts the quantized file's parameters as the directory's, in total and per layer;
// - lineage's logits on the quantized file (the exact path: those values, f32 products) are within
//   1e-4 of its logits on that f32 file, whole and token by token;
// - llama.cpp's own logits on the quantized file, which multiply 8-bit activations, are reported
//   (median KLD and top-1 agreement to lineage's); the bound asserted is a guard against gross failure
//   (a misdecoded format moves these random models' logits by a KLD of 0.05 to 0.5).
TEST(GgufLlama, BlockFormatsOnFilesLlamaQuantizeWrites) {
  const fs::path tool = llama_logits(), quantize = llama_quantize();
  if (!fs::exists(tool) || !fs::exists(quantize))
    GTEST_SKIP() << not_built(fs::exists(tool) ? quantize : tool);
  struct Case {
    const char* model;
    std::vector<const char*> types;
  };
  const Case cases[] = {{"gpt2/f32_width256", {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_M"}},
                        {"qwen3_5_moe/f32_width256", {"Q4_K_M", "Q5_K_M", "Q6_K", "MXFP4_MOE"}}};
  const fs::path tmp = test::temp_dir();
  std::set<std::string> seen;  // the block formats the files held
  for (const Case& c : cases) {
    const fs::path dir = test::testdata() / c.model, f32 = tmp / "model.gguf";
    const std::string mirror = "/usr/bin/python3 " +
                               shell_quote((test::source_dir() / "reference" / "gguf_mirror.py").string()) + " " +
                               shell_quote(dir.string()) + " " + shell_quote(f32.string());
    ASSERT_EQ(std::system(mirror.c_str()), 0) << mirror;
    const std::string tokens = test::golden_tokens_arg(dir);
    for (const char* type : c.types) {
      SCOPED_TRACE(std::string(c.model) + " " + type);
      const fs::path q = tmp / cat(type, ".gguf"), back = tmp / cat(type, "-f32.gguf");
      const std::string make = shell_quote(quantize.string()) + " " + shell_quote(f32.string()) + " " +
                               shell_quote(q.string()) + " " + type + " > /dev/null 2>&1 && " +
                               shell_quote(quantize.string()) + " --allow-requantize " + shell_quote(q.string()) + " " +
                               shell_quote(back.string()) + " F32 > /dev/null 2>&1";
      ASSERT_EQ(std::system(make.c_str()), 0) << make;
      // The decoded values.
      const io::GgufFile quantized(q), decoded(back);
      int64_t blocks = 0;
      for (const io::GgufTensor& t : quantized.tensors()) {
        const kernels::GgmlBlockInfo* b = kernels::ggml_block_of_type(t.type);
        if (!b) continue;
        seen.insert(b->name);
        const io::GgufTensor* f = nullptr;
        for (const io::GgufTensor& u : decoded.tensors())
          if (u.name == t.name) f = &u;
        ASSERT_TRUE(f && f->type == 0 && f->ne == t.ne) << t.name;
        const int64_t n = t.ne[0], rows = int64_t(t.bytes) / (n / b->values * b->bytes);
        std::vector<float> row(static_cast<size_t>(n));
        for (int64_t r = 0; r < rows; ++r) {
          kernels::ref::ggml_decode_row(b->block, quantized.data(t) + r * (n / b->values * b->bytes), n, row.data());
          ASSERT_EQ(std::memcmp(row.data(), decoded.data(*f) + r * n * 4, size_t(n) * 4), 0)
              << t.name << " (" << b->name << ") row " << r;
        }
        ++blocks;
      }
      EXPECT_GT(blocks, 0);
      // `lineage info` counts the quantized file's parameters as the directory's: totals and every layer.
      const auto info = [&](const fs::path& p) {
        const auto r = run_lineage("info --json --model " + shell_quote(p.string()));
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return nlohmann::json::parse(r.out);
      };
      const nlohmann::json qi = info(q), di = info(dir);
      for (const char* k : {"params_total", "params_active", "params_active_without_embedding_and_head"})
        EXPECT_EQ(qi[k], di[k]) << k;
      ASSERT_EQ(qi["layers"].size(), di["layers"].size());
      for (size_t l = 0; l < di["layers"].size(); ++l) EXPECT_EQ(qi["layers"][l]["params"], di["layers"][l]["params"]) << "layer " << l;
      for (const char* chunk : {"64", "1"}) {
        Tensor got[2];
        const fs::path files[2] = {q, back};
        for (int i = 0; i < 2; ++i) {
          const fs::path npy = tmp / cat("lineage", i, ".npy");
          const auto r = run_lineage("logits --model " + shell_quote(files[i].string()) + " --tokens '" + tokens +
                                     "' --out " + shell_quote(npy.string()) + " --threads 2 --chunk " + chunk);
          ASSERT_EQ(r.exit_code, 0) << r.err;
          got[i] = io::load_npy(npy);
        }
        EXPECT_LE(test::rel_rms(got[0].data<float>(), got[1].data<float>(), got[0].numel()), 1e-4) << "--chunk " << chunk;
        if (chunk[0] == '1') continue;
        const fs::path theirs = tmp / "llama.npy";
        const std::string cmd = shell_quote(tool.string()) + " " + shell_quote(q.string()) + " " +
                                shell_quote(theirs.string()) + " " + tokens + " --threads 2";
        ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
        const Tensor llama = io::load_npy(theirs);
        ASSERT_EQ(llama.shape(), got[0].shape());
        std::vector<double> k = kld_rows(got[0], llama);
        std::sort(k.begin(), k.end());
        const double median = k[k.size() / 2], top1 = top1_agreement(got[0], llama);
        std::printf("[ %s %s ] lineage (exact) vs llama.cpp (8-bit activations): median KLD %.3g, top-1 agreement "
                    "%.3f; vs its own run of the f32 file %.3g (relative RMS)\n",
                    c.model, type, median, top1, test::rel_rms(got[0].data<float>(), got[1].data<float>(), got[0].numel()));
        EXPECT_LE(median, 0.02);
        // Streamed from the file (--memory-budget at its minimum: every step evicts), the experts'
        // blocks read into the cache give the same bits.
        if (std::string(c.model).find("moe") == std::string::npos) continue;
        const fs::path npy = tmp / "streamed.npy";
        const auto base = "logits --model " + shell_quote(q.string()) + " --tokens '" + tokens + "' --out " +
                          shell_quote(npy.string()) + " --threads 2 --chunk 64 --memory-budget ";
        const auto low = run_lineage(base + "1");
        const size_t at = low.err.find("minimum, ");
        ASSERT_NE(at, std::string::npos) << low.err;
        const auto streamed = run_lineage(base + std::to_string(std::stoull(low.err.substr(at + 9))));
        ASSERT_EQ(streamed.exit_code, 0) << streamed.err;
        const Tensor s = io::load_npy(npy);
        ASSERT_EQ(s.shape(), got[0].shape());
        EXPECT_EQ(std::memcmp(s.raw(), got[0].raw(), size_t(s.nbytes())), 0) << type << ": streamed, not bit for bit";
      }
    }
  }
  for (const kernels::GgmlBlockInfo& b : kernels::ggml_blocks())
    EXPECT_TRUE(seen.count(b.name)) << b.name << " was in none of the files";
}

}  // namespace
}  // namespace gguf_llama_test
}  // namespace lineage
