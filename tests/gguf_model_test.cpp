// GGUF files as models, through the real entry points: a Hugging Face GPT-2 directory and the GGUF that
// mirrors it (written from the format's definition by reference/gguf_mirror.py, as llama.cpp's converter
// lays it out) give the same logits bit for bit, mapped and copied, and the same tokens; the tokenizer
// comes from the metadata. Damaged or foreign files are errors naming the file and the key or tensor.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/core/tensor.h"
#include "lineage/io/gguf.h"
#include "lineage/io/gguf_model.h"
#include "lineage/io/npy.h"
#include "lineage/tokenizer/tokenizer.h"
#include "lineage/tokenizer/tokenizer_test_support.h"
#include "test_support.h"

namespace lineage {
namespace gguf_model_test {
namespace {

namespace fs = std::filesystem;
using test::run_lineage;
using test::shell_quote;

// reference/gguf_mirror.py, once for all the mirrors (src, file name in the test's temp dir, options);
// the test fails when it does. Returns the files.
struct Mirror {
  fs::path src;
  std::string name, options;
};
std::vector<fs::path> mirror(const std::vector<Mirror>& jobs) {
  std::string cmd = "/usr/bin/python3 " + shell_quote((test::source_dir() / "reference" / "gguf_mirror.py").string());
  std::vector<fs::path> out;
  for (const Mirror& m : jobs) {
    out.push_back(test::temp_dir() / m.name);
    cmd += (out.size() > 1 ? " --next " : " ") + shell_quote(m.src.string()) + " " + shell_quote(out.back().string()) +
           " " + m.options;
  }
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return out;
}

Tensor logits(const fs::path& model, const std::string& tokens, const std::string& options) {
  const fs::path out = test::temp_dir() / "logits.npy";
  const auto r = run_lineage("logits --model " + shell_quote(model.string()) + " --tokens '" + tokens + "' --out " +
                             shell_quote(out.string()) + " --threads 2 " + options);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.exit_code == 0 ? io::load_npy(out) : Tensor();
}

void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_GT(a.numel(), 0) << what;
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), size_t(a.nbytes())), 0) << what << ": not bit for bit";
}

fs::path shipped() { return test::source_dir() / "models" / "kjv-gpt2"; }

// f32 with the reference's goldens (tied and untied heads), f16 (sharded) and the shipped
// bf16 model; whole, token by token and in chunks, both product modes. The GGUF holds GPT-2's matrices
// [out, in], as a directory's Conv1D ones are once copied (--no-mmap transposes them), and against that
// the logits are the same bits: copied, and mapped from a file whose tensors lie on 64-byte lines
// (general.alignment 64). The kernels start their vector loops on a cache line, so a mapped file of
// llama.cpp's 32-byte alignment sums in another order (to 1e-5 with exact products), as does a mapped
// directory (its [in, out] matrices take other kernels).
TEST(GgufModel, Gpt2MirrorGivesTheDirectorysLogitsBitForBit) {
  const std::vector<std::string> names = {"f32_gpt2_shapes", "f32_untied_lm_head", "f16_sharded", "kjv-gpt2"};
  std::vector<Mirror> jobs;
  const auto dir_of = [](const std::string& name) {
    return name == "kjv-gpt2" ? shipped() : test::testdata() / "gpt2" / name;
  };
  for (const std::string& name : names) {
    jobs.push_back({dir_of(name), name + ".gguf", ""});
    jobs.push_back({dir_of(name), name + "-64.gguf", "--alignment 64"});
  }
  const std::vector<fs::path> files = mirror(jobs);
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    SCOPED_TRACE(name);
    const bool ours = name == "kjv-gpt2", full = ours || i == 0;
    const fs::path dir = dir_of(name), gguf32 = files[2 * i], gguf64 = files[2 * i + 1];
    const std::string tokens = ours ? "11348 400 17 2036 2999 5 1001 77 9 11000 3" : test::golden_tokens_arg(dir);
    // Every option on the first checkpoint and the shipped one; the whole sequence on the others.
    const std::vector<std::string> option_sets =
        full ? std::vector<std::string>{"", "--chunk 1", "--bf16-exact --chunk 3"} : std::vector<std::string>{""};
    for (const std::string& options : option_sets) {
      SCOPED_TRACE(options);
      const Tensor want = logits(dir, tokens, options + " --no-mmap");
      expect_same_bits(logits(gguf32, tokens, options + " --no-mmap"), want, cat(name, " ", options, " --no-mmap"));
      expect_same_bits(logits(gguf64, tokens, options), want, cat(name, " ", options, " 64-byte alignment"));
      // (In the bf16 dot mode x is rounded to bf16: sums a last bit apart can round to a bf16 step apart.)
      if (ours && options.find("exact") == std::string::npos) continue;
      for (const fs::path& other : {gguf32, dir}) {
        const Tensor near = logits(other, tokens, options);
        ASSERT_EQ(near.shape(), want.shape());
        EXPECT_LE(test::rel_rms(near.data<float>(), want.data<float>(), want.numel()), 1e-5) << other;
      }
    }
    if (ours) continue;
    const Tensor golden = io::load_npy(dir / "golden" / "logits.npy");
    const Tensor exact = logits(gguf32, tokens, "--bf16-exact");
    ASSERT_EQ(exact.shape(), golden.shape());
    EXPECT_LE(test::rel_rms(exact.data<float>(), golden.data<float>(), golden.numel()), 1e-5);
  }
}

// Qwen3-Next (qwen3next), Qwen3.5 (qwen35), Qwen3.5-MoE (qwen35moe) and Kimi Linear (kimi-linear):
// the reference's checkpoints (f32 and bf16, the shapes llama.cpp loads and others; a dense layer; MTP
// and vision tensors the text model skips) and their mirrors. What the converter changed comes back:
// the RMSNorm multipliers exactly (x − 1, then 1 + that, gives x), Qwen3-Next's regrouped qkvz as flat
// row blocks, Qwen3.5's tiled value heads regrouped, Kimi's MLA kv_b_proj from k_b and v_b, the
// stacked experts; A_log only to within an ulp (stored as −exp(A_log)), so the logits match the
// directory's (copied) to 1e-6 rather than bit for bit, and the reference's golden to the tolerance
// the directory is held to.
TEST(GgufModel, HybridMirrorsGiveTheDirectorysLogits) {
  const std::vector<std::string> names = {"qwen3_next/f32_sharded", "qwen3_next/f32_dk_eq_dv", "qwen3_next/bf16_sharded",
                                          "qwen3_5/f32",            "qwen3_5/bf16",            "qwen3_5_moe/f32",
                                          "qwen3_5_moe/bf16_mtp_visual", "kimi_linear/f32", "kimi_linear/f32_heads_equal",
                                          "kimi_linear/bf16_sharded", "kimi_k3/mxfp4_routed", "kimi_k3/bf16_sharded",
                                          "kimi_k3/grouped", "kimi_k3/text_only"};
  std::vector<Mirror> jobs;
  for (size_t i = 0; i < names.size(); ++i) jobs.push_back({test::testdata() / names[i], cat("m", i, ".gguf"), ""});
  const std::vector<fs::path> files = mirror(jobs);
  for (size_t i = 0; i < names.size(); ++i) {
    SCOPED_TRACE(names[i]);
    const fs::path dir = test::testdata() / names[i];
    const std::string tokens = test::golden_tokens_arg(dir);
    // (K3's MXFP4 directories too: there the experts take the bf16 dot mode by default, ggml's MXFP4
    // blocks are always exact.)
    const bool bf16 = names[i].find("bf16") != std::string::npos || names[i].starts_with("kimi_k3"),
               full = i == 0 || i == 3 || i == 5 || i == 7 || i == 10;
    // K3: A_log's round trip through −exp(A_log) moves its lower-bound gate exp(A_log)·(f + dt_bias), and
    // its MXFP4 experts are GGUF blocks here, compressed-tensors pairs there (the same values, other
    // kernels): 1.0e-6 to 2.0e-6 measured.
    const double bound = names[i].starts_with("kimi_k3") ? 5e-6 : 1e-6;
    // Every mode on the first checkpoint of each family. The converter stores 1-D tensors F32, the
    // shared expert's gate [1, D] too: in the bf16 dot mode that gate's products are then exact where
    // a bf16 directory's gate rounds x (6e-3 apart), so bf16 checkpoints compare in exact products.
    std::vector<std::string> option_sets = {"--bf16-exact"};
    if (full) option_sets = {"--bf16-exact", "--bf16-exact --chunk 1", "--chunk 5"};
    for (const std::string& options : option_sets) {
      SCOPED_TRACE(options);
      if (bf16 && options.find("exact") == std::string::npos) continue;
      const Tensor want = logits(dir, tokens, options + " --no-mmap");
      for (const char* storage : {"", " --no-mmap"}) {
        const Tensor got = logits(files[i], tokens, options + storage);
        ASSERT_EQ(got.shape(), want.shape());
        EXPECT_LE(test::rel_rms(got.data<float>(), want.data<float>(), want.numel()), bound) << storage;
      }
    }
    const Tensor golden = io::load_npy(dir / "golden" / "logits.npy");
    const Tensor exact = logits(files[i], tokens, "--bf16-exact");
    ASSERT_EQ(exact.shape(), golden.shape());
    EXPECT_LE(test::rel_rms(exact.data<float>(), golden.data<float>(), golden.numel()), 1e-5);
  }
}

// The shipped model (bf16, its own 11,349-token BPE vocabulary) as a GGUF: the tokenizer read from
// tokenizer.ggml.* encodes and decodes as the directory's vocab.json + merges.txt do, and
// generation from a text prompt gives the same text.
TEST(GgufModel, ShippedModelsTokenizerAndGenerationFromTheMetadata) {
  const fs::path gguf = mirror({{shipped(), "kjv.gguf", ""}})[0];
  const std::string text = "In the beginning God created the heaven and the earth.\n\nAnd the earth was without "
                           "form, and void; <|endoftext|> Ünïcödé 12345 it's   spaced\ttabs";
  const auto dir_ids = run_lineage("tokenize --model " + shell_quote(shipped().string()) + " --text " + shell_quote(text));
  const auto gguf_ids = run_lineage("tokenize --model " + shell_quote(gguf.string()) + " --text " + shell_quote(text));
  ASSERT_EQ(dir_ids.exit_code, 0) << dir_ids.err;
  ASSERT_EQ(gguf_ids.exit_code, 0) << gguf_ids.err;
  EXPECT_EQ(gguf_ids.out, dir_ids.out);
  EXPECT_NE(dir_ids.out.find(" 11348 "), std::string::npos) << "<|endoftext|> is one special token: " << dir_ids.out;
  const auto back = run_lineage("detokenize --model " + shell_quote(gguf.string()) + " --tokens " + shell_quote(dir_ids.out));
  ASSERT_EQ(back.exit_code, 0) << back.err;
  EXPECT_EQ(back.out, text + "\n");
  const std::string gen = " --prompt 'And God said' --max-tokens 12 --temperature 0 --threads 2";
  const auto a = run_lineage("generate --model " + shell_quote(shipped().string()) + gen);
  const auto b = run_lineage("generate --model " + shell_quote(gguf.string()) + gen);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(b.out, a.out);
  EXPECT_GT(a.out.size(), std::string("And God said").size());
}

// A model in three files as llama.cpp's gguf-split writes it (the first named): the logits of the one
// file, bit for bit (64-byte alignment in both, so that every tensor lies on a line). A missing split,
// or a later split passed first, is an error naming it.
TEST(GgufModel, SplitFilesLoadAsOne) {
  const fs::path dir = test::testdata() / "gpt2" / "f32_gpt2_shapes";
  const std::vector<fs::path> files =
      mirror({{dir, "whole.gguf", "--alignment 64"}, {dir, "parts.gguf", "--alignment 64 --split 3"}});
  const fs::path first = files[1].parent_path() / "parts-00001-of-00003.gguf";
  const fs::path second = files[1].parent_path() / "parts-00002-of-00003.gguf";
  ASSERT_TRUE(fs::exists(first) && fs::exists(second));
  const std::string tokens = test::golden_tokens_arg(dir);
  for (const char* options : {"", "--chunk 1"})
    expect_same_bits(logits(first, tokens, options), logits(files[0], tokens, options), cat("split ", options));
  const auto later = run_lineage("logits --model " + shell_quote(second.string()) + " --tokens '1 2' --out " +
                                 shell_quote((test::temp_dir() / "x.npy").string()));
  EXPECT_NE(later.exit_code, 0);
  EXPECT_NE(later.err.find("split.no: 1; expected 0"), std::string::npos) << later.err;
  fs::remove(second);
  const auto missing = run_lineage("logits --model " + shell_quote(first.string()) + " --tokens '1 2' --out " +
                                   shell_quote((test::temp_dir() / "x.npy").string()));
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find(second.string() + ", does not exist"), std::string::npos) << missing.err;
}

// `lineage info` reads a GGUF file's header alone: each file cut after its tensor infos (the data gone;
// a split model's every file) prints what the whole file prints, the memory plan included, with the
// counts of the directory it mirrors: parameters in total, active and per layer, state per token and
// fixed. K3's except: llama.cpp's converter keeps the first num_heads values of A_log, which the
// directory stores with head_dim of them (the rest unused), so its KDA layers hold head_dim − num_heads
// fewer each. The weight bytes are the tensors' the header lists, the routed experts' those of the
// blk.N.*_exps tensors; a run that needs the data refuses the cut file, naming a tensor past its end.
TEST(GgufModel, InfoReadsTheHeaderAlone) {
  const std::vector<std::string> names = {"qwen3_5_moe/f32", "kimi_linear/f32", "kimi_k3/f32_heads_equal",
                                          "gpt2/f32_gpt2_shapes"};
  std::vector<Mirror> jobs;
  for (size_t i = 0; i < names.size(); ++i)
    jobs.push_back({test::testdata() / names[i], cat("h", i, ".gguf"), i == 3 ? "--split 2" : ""});
  const std::vector<fs::path> files = mirror(jobs);
  const auto info = [](const fs::path& model) {
    const auto r = run_lineage("info --json --context 100 --model " + shell_quote(model.string()));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    nlohmann::json j = r.exit_code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
    j["memory_plan"].erase("ram_available_bytes");  // what the machine has free at that moment
    return j;
  };
  for (size_t i = 0; i < names.size(); ++i) {
    SCOPED_TRACE(names[i]);
    std::vector<fs::path> parts = {files[i]};
    if (i == 3) parts = {files[i].parent_path() / "h3-00001-of-00002.gguf", files[i].parent_path() / "h3-00002-of-00002.gguf"};
    const fs::path cut_dir = test::temp_dir() / cat("cut", i);
    fs::create_directories(cut_dir);
    double tensor_bytes = 0, routed = 0;
    for (const fs::path& part : parts) {
      const io::GgufFile whole(part);
      for (const io::GgufTensor& t : whole.tensors()) {
        tensor_bytes += double(t.bytes);
        if (t.name.find("_exps.") != std::string::npos) routed += double(t.bytes);
      }
      ASSERT_LT(whole.data_offset(), fs::file_size(part));
      fs::copy_file(part, cut_dir / part.filename());
      fs::resize_file(cut_dir / part.filename(), whole.data_offset());
    }
    const nlohmann::json cut = info(cut_dir / parts[0].filename()), full = info(parts[0]),
                         dir = info(test::testdata() / names[i]);
    EXPECT_EQ(cut, full);
    EXPECT_EQ(cut["memory_plan"]["weight_bytes"].get<double>(), tensor_bytes);
    EXPECT_EQ(cut["memory_plan"]["routed_expert_bytes"].get<double>(), routed);
    EXPECT_EQ(routed > 0, i < 3);
    int64_t dropped = 0;  // per KDA layer
    if (names[i].starts_with("kimi_k3")) {
      const nlohmann::json c = nlohmann::json::parse(std::ifstream(test::testdata() / names[i] / "config.json"));
      dropped = c["text_config"]["linear_attn_config"]["head_dim"].get<int64_t>() -
                c["text_config"]["linear_attn_config"]["num_heads"].get<int64_t>();
      ASSERT_GT(dropped, 0);
    }
    int64_t dropped_total = 0;
    ASSERT_EQ(cut["layers"].size(), dir["layers"].size());
    for (size_t l = 0; l < dir["layers"].size(); ++l) {
      const bool kda = dir["layers"][l]["mixer"].get<std::string>().starts_with("Kimi Delta Attention");
      EXPECT_EQ(cut["layers"][l]["params"].get<int64_t>() + (kda ? dropped : 0), dir["layers"][l]["params"].get<int64_t>())
          << "layer " << l;
      dropped_total += kda ? dropped : 0;
      for (const char* k : {"mixer", "ffn", "state_bytes_per_token", "state_bytes_fixed"})
        EXPECT_EQ(cut["layers"][l][k], dir["layers"][l][k]) << "layer " << l << " " << k;
    }
    for (const char* k : {"params_total", "params_active"})
      EXPECT_EQ(cut[k].get<int64_t>() + dropped_total, dir[k].get<int64_t>()) << k;
    for (const char* k : {"n_layers", "vocab_size", "d_model", "state_bytes_per_token", "state_bytes_fixed", "state_bytes_at_context"})
      EXPECT_EQ(cut[k], dir[k]) << k;
    const auto run = run_lineage("logits --model " + shell_quote((cut_dir / parts[0].filename()).string()) +
                                 " --tokens '1 2' --out " + shell_quote((test::temp_dir() / "x.npy").string()));
    EXPECT_NE(run.exit_code, 0);
    EXPECT_NE(run.err.find("runs past the end of the data section"), std::string::npos) << run.err;
  }
}

// Kimi's tiktoken vocabulary as conversion/kimi_linear.py writes it into a GGUF (reference/gguf_mirror.py
// --vocab-only: each rank as its byte-level spelling, the merges derived from the ranks, pre-tokenizer
// "kimi-k2", the 256 special tokens as control tokens): read from the metadata, it encodes the
// tokenizer corpus as npm tiktoken does (with special tokens matched and as plain text) and decodes it
// back, and bos / eos come from the file.
TEST(GgufModel, KimiVocabularyFromTheMetadataEncodesAsTiktoken) {
  const auto ref = tokenizer::test::load_reference<tokenizer::test::Reference>("kimi_expected.json",
                                                                              [](const nlohmann::json&, auto&) {});
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  const fs::path gguf = test::temp_dir() / "kimi-vocab.gguf";
  const std::string cmd = "/usr/bin/python3 " +
                          shell_quote((test::source_dir() / "reference" / "gguf_mirror.py").string()) +
                          " --vocab-only " + shell_quote((ref.dir / "kimi").string()) + " " + shell_quote(gguf.string());
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::optional<tokenizer::Tokenizer> tok = io::gguf_tokenizer(io::GgufFile(gguf));
  ASSERT_TRUE(tok.has_value());
  const tokenizer::Tokenizer tiktoken = tokenizer::Tokenizer::load(ref.dir / "kimi");
  EXPECT_EQ(tok->bos_id(), tiktoken.bos_id());
  EXPECT_EQ(tok->eos_id(), tiktoken.eos_id());
  size_t failed = 0;
  std::string first;
  for (const tokenizer::test::Segment& seg : ref.segments) {
    std::string diff = tokenizer::test::compare_ids(*tok, seg, seg.ids, tok->encode(seg.text, true));
    const std::vector<int32_t>& ordinary = seg.ids_ordinary ? *seg.ids_ordinary : seg.ids;
    const std::string d = tokenizer::test::compare_ids(*tok, seg, ordinary, tok->encode(seg.text, false));
    if (!d.empty()) diff += "\n  (allow_special = false) " + d;
    if (tok->decode(seg.ids) != seg.text) diff += "\n  decode differs";
    if (!diff.empty() && ++failed <= 3) first += diff + "\n";
  }
  std::printf("[ tokenizer ] Kimi's vocabulary from GGUF metadata: %zu / %zu segments as tiktoken\n",
              ref.segments.size() - failed, ref.segments.size());
  EXPECT_EQ(failed, 0u) << first;
}

// Each damaged or foreign file: a non-zero exit and a message naming the file and what is wrong.
TEST(GgufModel, BadFilesNameTheKeyOrTensor) {
  const fs::path dir = test::testdata() / "gpt2" / "f32_gpt2_shapes";
  struct Case {
    std::string name, options;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {"arch", "--arch llama", {"general.architecture", "\"llama\"", "gpt2"}},
      {"extra", "--extra-tensor blk.0.attn_q_norm.weight", {"blk.0.attn_q_norm.weight", "not one lineage's gpt2 reads"}},
      {"iq4", "--type-of blk.0.ffn_up.weight=20", {"blk.0.ffn_up.weight", "IQ4_NL", "F32, F16, BF16, Q4_0", "Q6_K, MXFP4"}},
      {"no_layers", "--drop-key gpt2.block_count", {"gpt2.block_count", "no such key"}},
  };
  std::vector<Mirror> jobs;
  for (const Case& c : cases) jobs.push_back({dir, c.name + ".gguf", c.options});
  jobs.push_back({shipped(), "pre.gguf", "--pre llama-bpe"});
  const std::vector<fs::path> files = mirror(jobs);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(c.name);
    const fs::path& gguf = files[i];
    const auto r = run_lineage("logits --model " + shell_quote(gguf.string()) + " --tokens '1 2 3' --out " +
                               shell_quote((test::temp_dir() / "x.npy").string()));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find(gguf.string()), std::string::npos) << r.err;
    for (const std::string& s : c.says) EXPECT_NE(r.err.find(s), std::string::npos) << s << " in: " << r.err;
  }
  // An unknown pre-tokenizer, on the shipped model's vocabulary.
  const fs::path& pre = files.back();
  const auto r = run_lineage("tokenize --model " + shell_quote(pre.string()) + " --text hi");
  EXPECT_NE(r.exit_code, 0);
  for (const char* s : {"tokenizer.ggml.pre", "llama-bpe", "gpt-2"}) EXPECT_NE(r.err.find(s), std::string::npos) << r.err;
}

}  // namespace
}  // namespace gguf_model_test
}  // namespace lineage
