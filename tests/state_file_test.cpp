// State files (runtime/state_file.h, `--state-out` / `--state-in`): a saved sequence continues bit
// for bit as if it had never stopped, on every kind of layer state; anything but a state of this
// model in this version is an error that names the file and the mismatch.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "lineage/core/error.h"
#include "lineage/core/hash.h"
#include "lineage/io/load_model.h"
#include "lineage/io/npy.h"
#include "lineage/runtime/generate.h"
#include "lineage/runtime/session.h"
#include "lineage/runtime/state_file.h"
#include "test_support.h"

namespace lineage {
namespace state_file_test {
namespace {

namespace fs = std::filesystem;
using test::run_lineage;
using test::shell_quote;
using test::slurp;

std::vector<int32_t> ids(int64_t n, int64_t vocab, int64_t salt) {
  std::vector<int32_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(int32_t((i * 7 + salt * 13 + 3) % vocab));
  return v;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Every layer kind: softmax attention (GPT-2), the delta rule with a conv tail and the normalizer,
// KDA + MLA (Kimi Linear), K3 (MXFP4 experts, gated MLA, Block Attention Residuals), and Qwen's
// Gated DeltaNet with grouped value heads + gated attention whose cache holds only the KV heads.
class StateFile : public ::testing::TestWithParam<const char*> {};

TEST_P(StateFile, ContinuesBitForBitAfterSaveAndLoad) {
  const io::LoadedModel lm = io::load_model(test::testdata() / GetParam(), false);
  const model::Model& m = lm.model;
  const int64_t V = m.config.vocab_size;
  const std::vector<int32_t> a = ids(11, V, 1), b = ids(6, V, 2);

  runtime::Session whole(m);
  const auto la = whole.prefill(a);
  const std::vector<float> last_a(la.begin(), la.end());
  const fs::path file = test::temp_dir() / "s.state";
  runtime::save_state(file, m, {whole.state().clone(), {whole.tokens().begin(), whole.tokens().end()}, last_a, {}, {}});
  const auto lb = whole.prefill(b, true);
  const std::vector<float> want(lb.begin(), lb.end());

  const runtime::SavedState saved = runtime::load_state(file, m);
  EXPECT_EQ(saved.state.position, int64_t(a.size()));
  EXPECT_EQ(saved.tokens, a);
  EXPECT_EQ(saved.logits, last_a);
  EXPECT_FALSE(saved.rng);
  runtime::Session resumed(m);
  resumed.restore(saved.state, saved.tokens);
  const size_t bytes_a = resumed.state().bytes();
  const auto got = resumed.prefill(b, true);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float))) << "not bit-identical";
  EXPECT_EQ(resumed.tokens().size(), a.size() + b.size());
  EXPECT_EQ(resumed.state().bytes(), whole.state().bytes());
  EXPECT_GT(bytes_a, 0u);

  // The file of the resumed session equals the file of the session that never stopped.
  const fs::path f1 = test::temp_dir() / "1.state", f2 = test::temp_dir() / "2.state";
  runtime::save_state(f1, m, {whole.state().clone(), {whole.tokens().begin(), whole.tokens().end()}, {}, {}, {}});
  runtime::save_state(f2, m, {resumed.state().clone(), {resumed.tokens().begin(), resumed.tokens().end()}, {}, {}, {}});
  EXPECT_TRUE(slurp(f1) == slurp(f2));
}

INSTANTIATE_TEST_SUITE_P(Kinds, StateFile,
                         ::testing::Values("gpt2/f32_defaults", "gpt2/f32_conv", "linear_attn/f32_elu_normalized",
                                           "delta_net/f32", "kimi_linear/f32", "kimi_k3/mxfp4_routed",
                                           "qwen3_next/f32_sharded", "qwen3_5_moe/f32"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

// What a file holds is checked before anything is used: another model, a cut or changed byte, a
// version from elsewhere, a header that lies about sizes.
TEST(StateFileErrors, NameTheFileAndTheMismatch) {
  const io::LoadedModel gpt2 = io::load_model(test::testdata() / "gpt2/f32_defaults", false);
  // The same tensors under another config.json (another epsilon): another model.
  const fs::path copy = test::temp_dir();
  fs::copy(test::testdata() / "gpt2/f32_defaults", copy, fs::copy_options::recursive);
  nlohmann::json cfg = nlohmann::json::parse(slurp(copy / "config.json"));
  cfg["layer_norm_epsilon"] = 1e-3;
  test::write_text(copy / "config.json", cfg.dump());
  const io::LoadedModel other = io::load_model(copy, false);
  const io::LoadedModel kda = io::load_model(test::testdata() / "kda/f32", false);
  runtime::Session s(gpt2.model);
  const auto l = s.prefill(ids(9, gpt2.model.config.vocab_size, 0));
  const std::string good = runtime::encode_state(
      gpt2.model, {s.state().clone(), {s.tokens().begin(), s.tokens().end()}, {l.begin(), l.end()}, Rng::Snapshot{7, 0.5f, true}, {}});
  const auto decode = [&](const model::Model& m, std::string bytes) {
    return error_of([&] { runtime::decode_state(m, bytes, "x.state"); });
  };
  EXPECT_EQ(decode(gpt2.model, good), "(no error)");
  const runtime::SavedState back = runtime::decode_state(gpt2.model, good, "x.state");
  ASSERT_TRUE(back.rng);
  EXPECT_EQ(back.rng->state, 7u);
  EXPECT_EQ(back.rng->spare, 0.5f);

  EXPECT_NE(decode(kda.model, good).find("x.state: a state of another model"), std::string::npos) << decode(kda.model, good);
  EXPECT_NE(decode(kda.model, good).find("another architecture"), std::string::npos);
  EXPECT_NE(decode(other.model, good).find("(another config.json)"), std::string::npos) << decode(other.model, good);

  EXPECT_NE(decode(gpt2.model, good.substr(0, good.size() - 100)).find("x.state: truncated"), std::string::npos);
  EXPECT_NE(decode(gpt2.model, good.substr(0, 30)).find("x.state: truncated"), std::string::npos)
      << decode(gpt2.model, good.substr(0, 30));
  std::string flipped = good;
  flipped[flipped.size() - 200] ^= 0x10;  // a bit of the last layer's values
  EXPECT_NE(decode(gpt2.model, flipped).find("x.state: checksum mismatch"), std::string::npos) << decode(gpt2.model, flipped);
  std::string version = good;
  version[8] = 2;
  EXPECT_NE(decode(gpt2.model, version).find("x.state: state file version 2; this lineage reads version 1"),
            std::string::npos) << decode(gpt2.model, version);
  EXPECT_NE(decode(gpt2.model, "GGUF and more bytes than that").find("not a lineage state file"), std::string::npos);
  EXPECT_NE(decode(gpt2.model, good + "x").find("the file holds"), std::string::npos);

  // A header that lies (re-checksummed, so only the layout check can catch it): a position that does
  // not match the arrays' shapes.
  const uint64_t hlen = [&] {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(good[16 + size_t(i)]);
    return v;
  }();
  nlohmann::json header = nlohmann::json::parse(good.substr(24, hlen));
  header["position"] = 8;
  header["tokens"]["count"] = 8;
  std::string h2 = header.dump();
  h2.resize(hlen, ' ');  // the same length keeps every offset
  std::string lying = good.substr(0, 24) + h2 + good.substr(24 + hlen, good.size() - 24 - hlen - 8);
  const uint64_t sum = Hasher().add(lying.data(), lying.size()).value();
  for (int i = 0; i < 8; ++i) lying.push_back(char(sum >> (8 * i)));
  EXPECT_NE(decode(gpt2.model, lying).find("layer 0: array \"k\" F32 [3, 9, 16]; expected \"k\" F32 [3, 8, 16] (position 8)"),
            std::string::npos) << decode(gpt2.model, lying);

  EXPECT_NE(error_of([&] { runtime::load_state(test::temp_dir() / "none.state", gpt2.model); }).find("does not exist"),
            std::string::npos);
}

// Through the command line: logits continue bit-identically from --state-in, and generation split in
// two runs leaves the same state file (tokens, caches, logits, sampler stream) as one run.
TEST(StateFileCli, LogitsAndGenerateContinueExactly) {
  const fs::path dir = test::testdata() / "kimi_linear/f32", tmp = test::temp_dir();
  const std::string m = " --model " + shell_quote(dir.string());
  const auto p = [&](const char* name) { return shell_quote((tmp / name).string()); };
  ASSERT_EQ(run_lineage("logits" + m + " --tokens '1 2 3 4 5 6 7 8 9' --chunk 5 --out " + p("all.npy")).exit_code, 0);
  auto r = run_lineage("logits" + m + " --tokens '1 2 3 4 5' --out " + p("a.npy") + " --state-out " + p("a.state"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_lineage("logits" + m + " --tokens '6 7 8 9' --state-in " + p("a.state") + " --out " + p("b.npy"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Tensor all = io::load_npy(tmp / "all.npy"), b = io::load_npy(tmp / "b.npy");
  const int64_t V = all.dim(1);
  ASSERT_EQ(b.dim(0), 4);
  EXPECT_EQ(0, std::memcmp(all.data<float>() + 5 * V, b.data<float>(), size_t(4 * V) * 4));

  r = run_lineage("logits --model " + shell_quote((test::testdata() / "kda/f32").string()) + " --tokens 1 --state-in " +
                  p("a.state") + " --out " + p("c.npy"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("a.state: a state of another model"), std::string::npos) << r.err;

  const fs::path gdir = test::tiny_model_with_tokenizer();
  // Sampled (temperature 0.9): the second run continues the saved random stream (no --seed).
  const std::string g = "generate --model " + shell_quote(gdir.string()) + " --temperature 0.9 --ignore-eos";
  r = run_lineage(g + " --seed 5 --prompt 'The cat sat' --max-tokens 8 --state-out " + p("one.state"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_lineage(g + " --seed 5 --prompt 'The cat sat' --max-tokens 3 --state-out " + p("half.state"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_lineage(g + " --state-in " + p("half.state") + " --max-tokens 5 --state-out " + p("two.state"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(slurp(tmp / "one.state") == slurp(tmp / "two.state")) << "3 + 5 tokens differ from 8 in one run";
  const io::LoadedModel lm = io::load_model(gdir);
  const runtime::SavedState one = runtime::load_state(tmp / "one.state", lm.model);
  EXPECT_EQ(one.tokens.size(), lm.tokenizer->encode("The cat sat").size() + 8);
}

}  // namespace
}  // namespace state_file_test
}  // namespace lineage
