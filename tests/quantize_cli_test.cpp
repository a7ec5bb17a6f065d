// lineage quantize (issue #37 point 4): every scheme's output decoded by the independent reference
// (reference/compressed_tensors.py compare: llm-compressor's RTN from the spec) and equal to it bit for
// bit, loaded by lineage, and the quantization error ordered as it must be; bad input refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/io/load_model.h"
#include "lineage/io/npy.h"
#include "lineage/io/safetensors.h"
#include "lineage/kernels/linear.h"
#include "lineage/layers/step.h"
#include "lineage/runtime/session.h"
#include "batch_check.h"
#include "test_support.h"

namespace lineage {
namespace quantize_cli_test {
namespace {

namespace fs = std::filesystem;

// The float checkpoint the reference quantized into its w4a16_g32 case, and that case.
fs::path float_dir() { return test::testdata() / "quant" / "w4a16_g32" / "float"; }

const std::string kIgnore =
    " --ignore lm_head --ignore 're:.*embed_tokens$' --ignore 're:.*mlp\\.gate$' --ignore 're:.*shared_expert_gate$'";

// `python3 reference/compressed_tensors.py ARGS`: exit code and output.
std::pair<int, std::string> reference(const std::string& args) {
  const fs::path log = test::temp_dir() / "reference.log";
  const std::string cmd = "/usr/bin/python3 " + test::shell_quote((test::source_dir() / "reference" / "compressed_tensors.py").string()) +
                          " " + args + " > " + test::shell_quote(log.string()) + " 2>&1";
  const int rc = std::system(cmd.c_str());
  return {rc, test::slurp(log)};
}

std::vector<float> logits(const fs::path& dir, const std::vector<int32_t>& ids) {
  io::LoadedModel lm = io::load_model(dir, false);
  lm.model.options.bf16_dot = false;
  runtime::Session s(lm.model);
  const auto l = s.prefill(ids, true);
  return std::vector<float>(l.begin(), l.end());
}

// Mean KL divergence of the softmax of `q` from that of `p`, rows of `vocab`.
double mean_kld(const std::vector<float>& p, const std::vector<float>& q, int64_t vocab) {
  double sum = 0;
  const int64_t rows = int64_t(p.size()) / vocab;
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = p.data() + r * vocab;
    const float* b = q.data() + r * vocab;
    double ma = a[0], mb = b[0], za = 0, zb = 0;
    for (int64_t i = 0; i < vocab; ++i) ma = std::max(ma, double(a[i])), mb = std::max(mb, double(b[i]));
    for (int64_t i = 0; i < vocab; ++i) za += std::exp(a[i] - ma), zb += std::exp(b[i] - mb);
    for (int64_t i = 0; i < vocab; ++i) {
      const double lp = a[i] - ma - std::log(za), lq = b[i] - mb - std::log(zb);
      sum += std::exp(lp) * (lp - lq);
    }
  }
  return sum / double(rows);
}

TEST(QuantizeCli, EverySchemeIsTheReferencesBitForBitAndLoads) {
  ASSERT_TRUE(fs::exists(float_dir() / "config.json")) << "the reference's quant goldens are missing";
  const std::vector<std::pair<std::string, std::string>> schemes = {
      {"W4A16", "--group 32"}, {"W4A16_ASYM", "--group 32"}, {"W8A16", "--group 32"},
      {"FP8_BLOCK", ""},      {"MXFP4", ""},                {"NVFP4", ""}};
  const fs::path root = test::temp_dir();
  for (const auto& [scheme, group] : schemes) {
    SCOPED_TRACE(scheme);
    const fs::path out = root / scheme;
    const auto r = test::run_lineage("quantize " + test::shell_quote(float_dir().string()) + " " +
                                     test::shell_quote(out.string()) + " --scheme " + scheme + " " + group + kIgnore);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("quantized as " + scheme), std::string::npos) << r.out;
    const auto [rc, log] = reference("compare --input " + test::shell_quote(float_dir().string()) + " --output " +
                                     test::shell_quote(out.string()) + " --scheme " + scheme + " " + group + kIgnore);
    EXPECT_EQ(rc, 0) << log;
    EXPECT_NE(log.find("OK:"), std::string::npos) << log;
    const std::vector<float> l = logits(out, {1, 2, 3, 4, 5, 6, 7});
    for (float v : l) ASSERT_TRUE(std::isfinite(v));
  }
  // W4A16 at group 32 with the recipe's ignore list is the reference's own checkpoint, tensor by tensor.
  const fs::path ours = root / "W4A16";
  const io::Checkpoint a = io::Checkpoint::open(ours), b = io::Checkpoint::open(test::testdata() / "quant" / "w4a16_g32");
  for (const std::string& name : b.names()) {
    if (name.find("embed_tokens") != std::string::npos) continue;
    ASSERT_TRUE(a.has(name)) << name;
    const Tensor x = a.tensor(name), y = b.tensor(name);
    ASSERT_EQ(x.nbytes(), y.nbytes()) << name;
    EXPECT_EQ(std::memcmp(x.raw(), y.raw(), x.nbytes()), 0) << name;
  }
}

// The error each scheme adds, as KL divergence from the float model's logits on the golden tokens:
// int8 closer than int4 at group 32, group 32 closer than one scale a row; and a quantized model
// read back against its own dequantized reference (the golden) ≈ 0; int8 activations (--int8-dot)
// closer to the exact products than int4 per-channel weights to the float model.
TEST(QuantizeCli, ErrorsAreOrderedAsTheyMustBe) {
  const Tensor toks = io::load_npy(test::testdata() / "quant" / "w4a16_g32" / "golden" / "tokens.npy");
  const std::vector<int32_t> ids(toks.data<int32_t>(), toks.data<int32_t>() + toks.numel());
  const std::vector<float> base = logits(float_dir(), ids);
  const int64_t vocab = int64_t(base.size() / ids.size());
  const fs::path root = test::temp_dir();
  const auto kld = [&](const std::string& scheme, const std::string& group) {
    const fs::path out = root / ("kld_" + scheme + group);
    const auto r = test::run_lineage("quantize " + test::shell_quote(float_dir().string()) + " " +
                                     test::shell_quote(out.string()) + " --scheme " + scheme + " --group " + group + kIgnore);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return mean_kld(base, logits(out, ids), vocab);
  };
  const double w8 = kld("W8A16", "32"), w4 = kld("W4A16", "32"), channel = kld("W4A16", "0");
  std::printf("mean KLD from the float model: W8A16 g32 %.3g, W4A16 g32 %.3g, W4A16 per channel %.3g\n", w8, w4, channel);
  EXPECT_LT(w8, w4);
  EXPECT_LT(w4, channel);
  EXPECT_GT(w8, 0.0);
  const Tensor golden = io::load_npy(test::testdata() / "quant" / "w4a16_g32" / "golden" / "logits.npy");
  const std::vector<float> want(golden.data<float>(), golden.data<float>() + golden.numel());
  EXPECT_LT(mean_kld(want, logits(test::testdata() / "quant" / "w4a16_g32", ids), vocab), 1e-9);

  // --int8-dot (kernels::int8_dot_available) on W8A16 at group 64, whose matrices with 64 or more
  // inputs all run in the int8-activation mode: `lineage logits` with and without it differ (the mode
  // is on), and by less than int4 per-channel weights differ from the float model (x rounded to 1/254
  // of its block's largest |x| against weights rounded to 1/15 of their row's: the KL divergence, about
  // quadratic in the perturbation, must be far smaller).
  if (!kernels::int8_dot_available()) return;
  kld("W8A16", "64");
  const fs::path w8_g64 = root / "kld_W8A1664";
  std::string tokens;
  for (int32_t id : ids) tokens += std::to_string(id) + " ";
  const auto cli_logits = [&](const std::string& flag, const std::string& name) {
    const fs::path out = root / name;
    const auto r = test::run_lineage("logits --model " + test::shell_quote(w8_g64.string()) + " --bf16-exact --tokens '" + tokens +
                                     "' --out " + test::shell_quote(out.string()) + flag);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const Tensor t = io::load_npy(out);
    return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
  };
  const std::vector<float> exact = cli_logits("", "exact.npy"), int8 = cli_logits(" --int8-dot", "int8.npy");
  const double dot = mean_kld(exact, int8, vocab);
  std::printf("mean KLD of --int8-dot from the exact products (W8A16 g64): %.3g\n", dot);
  EXPECT_GT(dot, 0.0);
  EXPECT_LT(dot, channel);
}

// Kimi Linear quantized with the defaults (MLA's kv_b_proj included) as int4 and as MXFP4 (which the
// Kimi family otherwise marks for the routed experts only): MLA's absorbed form (W_UK decoded,
// W_UV row views of the codes) equals its explicit form (kv_b_proj's own GEMM), and decoding together
// gives each sequence its lone bits.
TEST(QuantizeCli, KimiLinearWithQuantizedMlaRunsBothForms) {
  const fs::path in = test::testdata() / "kimi_linear" / "bf16_sharded";
  ASSERT_TRUE(fs::exists(in / "config.json"));
  for (const std::string scheme : {"W4A16 --group 32", "MXFP4"}) {
    SCOPED_TRACE(scheme);
    const fs::path out = test::temp_dir() / "kimi";
    const auto r = test::run_lineage("quantize " + test::shell_quote(in.string()) + " " + test::shell_quote(out.string()) +
                                     " --scheme " + scheme);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::vector<int32_t> ids = {5, 17, 3, 99, 42, 7, 7, 1, 64, 23, 8};
    std::vector<std::vector<float>> by_path;
    for (const layers::MlaPath path : {layers::MlaPath::Explicit, layers::MlaPath::Absorbed}) {
      io::LoadedModel lm = io::load_model(out, false);
      lm.model.options.bf16_dot = false;
      lm.model.options.mla_path = path;
      runtime::Session s(lm.model);
      std::vector<float> all;
      for (const int32_t id : ids) {  // decode, where the absorbed form runs
        const auto l = s.decode(id);
        all.insert(all.end(), l.begin(), l.end());
      }
      by_path.push_back(all);
    }
    EXPECT_LE(test::rel_rms(by_path[1].data(), by_path[0].data(), int64_t(by_path[0].size())), 1e-5);
    const io::LoadedModel lm = io::load_model(out, false);
    test::expect_decode_together_bitwise(lm.model, 4);
  }
}

TEST(QuantizeCli, BadInputIsRefusedByName) {
  const auto run = [](const std::string& args) { return test::run_lineage("quantize " + args); };
  const std::string in = test::shell_quote(float_dir().string());
  auto r = run(test::shell_quote((test::testdata() / "quant" / "w4a16_g32").string()) + " " +
               test::shell_quote((test::temp_dir() / "again").string()) + " --scheme W4A16");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("already quantized"), std::string::npos) << r.err;
  r = run(in + " " + test::shell_quote((test::temp_dir() / "x").string()) + " --scheme W3A16");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("\"W3A16\" is not one of W4A16"), std::string::npos) << r.err;
  r = run(in + " " + test::shell_quote((test::temp_dir() / "y").string()) + " --scheme FP8_BLOCK --group 32");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--group"), std::string::npos) << r.err;
  r = run(in + " " + test::shell_quote((test::temp_dir() / "w").string()) + " --scheme W4A16 --ignore 're:(unclosed'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--ignore: \"re:(unclosed\" is not a regular expression"), std::string::npos) << r.err;
  r = run(in + " " + test::shell_quote((test::temp_dir() / "z").string()) + " --scheme W4A16 --group 24");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("multiple of 16"), std::string::npos) << r.err;
  // Training takes the float checkpoint.
  const fs::path bin = test::temp_dir() / "ids.bin";
  {
    std::FILE* f = std::fopen(bin.c_str(), "wb");
    for (uint16_t id = 0; id < 200; ++id) std::fwrite(&id, 2, 1, f);
    std::fclose(f);
  }
  r = test::run_lineage("train --model " + test::shell_quote((test::testdata() / "quant" / "w4a16_g32").string()) +
                        " --data " + test::shell_quote(bin.string()) + " --out " +
                        test::shell_quote((test::temp_dir() / "trained").string()) + " --steps 1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("quantized weights"), std::string::npos) << r.err;
  const fs::path full = test::temp_dir() / "full";
  fs::create_directories(full);
  std::FILE* f = std::fopen((full / "x").c_str(), "w");
  std::fclose(f);
  r = run(in + " " + test::shell_quote(full.string()) + " --scheme W4A16");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("not an empty directory"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace quantize_cli_test
}  // namespace lineage
