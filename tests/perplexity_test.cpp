// lineage perplexity through the command: the perplexity over windows against the PyTorch
// reference's (reference/perplexity.py, float64, the windows as llama.cpp's llama-perplexity cuts
// them), the KL-divergence statistics of two saved runs against numpy's over the same files, a run
// against itself (exactly no divergence), and bad input named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lineage/core/rng.h"
#include "test_support.h"

namespace lineage {
namespace perplexity_test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::shell_quote;

// 200 seeded ids below 256 as a .bin corpus.
fs::path corpus() {
  static const fs::path file = [] {
    const fs::path f = test::temp_dir() / "ids.bin";
    Rng r(11);
    std::vector<uint16_t> ids(200);
    for (auto& t : ids) t = uint16_t(r.next_u64() % 256);
    std::ofstream(f, std::ios::binary).write(reinterpret_cast<const char*>(ids.data()), std::streamsize(ids.size() * 2));
    return f;
  }();
  return file;
}

json run_json(const std::string& args) {
  const auto r = test::run_lineage("perplexity " + args + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.exit_code == 0 ? json::parse(r.out) : json();
}

json reference(const std::string& args) {
  const fs::path out = test::temp_dir() / "reference.json";
  const std::string cmd = "cd " + shell_quote((test::source_dir() / "reference").string()) +
                          " && /usr/bin/python3 perplexity.py " + args + " > " + shell_quote(out.string());
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return json::parse(test::slurp(out));
}

TEST(Perplexity, MatchesThePyTorchReference) {
  for (const char* model : {"gpt2/f32_tanh", "qwen3_next/f32_sharded", "kimi_linear/f32"}) {
    SCOPED_TRACE(model);
    const std::string dir = (test::testdata() / model).string();
    const json got = run_json("--model " + shell_quote(dir) + " --data " + shell_quote(corpus().string()) +
                              " --ctx 32 --chunks 3");
    const json want = reference(shell_quote(dir) + " " + shell_quote(corpus().string()) + " 32 3");
    EXPECT_EQ(got["windows"], 3);
    EXPECT_EQ(got["positions"], 3 * 15);
    EXPECT_EQ(got["positions"], want["positions"]);
    EXPECT_NEAR(got["ppl"].get<double>() / want["ppl"].get<double>(), 1.0, 1e-5);
    EXPECT_GT(got["ppl_error"].get<double>(), 0.0);
  }
}

// A bf16 checkpoint (the Qwen3-Next golden) multiplied with bf16 dot products (Q) against its exact
// products (the base): the statistics the command prints against numpy's from the same two saved
// files; the base against itself: no divergence at all.
TEST(Perplexity, KlDivergenceAgainstABaseRun) {
  const fs::path base = test::temp_dir() / "base.npy", q = test::temp_dir() / "q.npy";
  const std::string common = "--model " + shell_quote((test::testdata() / "qwen3_next" / "bf16_sharded").string()) +
                             " --data " + shell_quote(corpus().string()) + " --ctx 40 --chunks 4";
  const json b = run_json(common + " --bf16-exact --save-logits " + shell_quote(base.string()));
  ASSERT_TRUE(fs::exists(base.string() + ".json"));
  const json got = run_json(common + " --save-logits " + shell_quote(q.string()) + " --kld-base " + shell_quote(base.string()));
  ASSERT_TRUE(got.contains("kld"));
  const json& k = got["kld"];
  const json want = reference("--kld " + shell_quote(base.string()) + " " + shell_quote(q.string()) + " " +
                              shell_quote(corpus().string()) + " 40 4");
  for (const char* f : {"mean", "median", "p90", "p99", "max", "top1", "dp_mean", "dp_rms", "ppl_base", "ppl_q"})
    EXPECT_NEAR(k[f].get<double>(), want[f].get<double>(), 1e-6 * std::fabs(want[f].get<double>()) + 1e-12) << f;
  EXPECT_NEAR(k["ppl_base"].get<double>(), b["ppl"].get<double>(), 1e-9 * b["ppl"].get<double>());
  std::cout << "[ measured ] bf16 dot products against exact ones: mean KLD " << k["mean"] << ", top-1 " << k["top1"]
            << "\n";

  const json self = run_json(common + " --bf16-exact --kld-base " + shell_quote(base.string()));
  EXPECT_EQ(self["kld"]["mean"], 0.0);
  EXPECT_EQ(self["kld"]["max"], 0.0);
  EXPECT_EQ(self["kld"]["top1"], 1.0);
  EXPECT_EQ(self["kld"]["dp_rms"], 0.0);
}

TEST(Perplexity, BadInputIsNamed) {
  const std::string model = " --model " + shell_quote((test::testdata() / "qwen3_next" / "f32_sharded").string());
  const std::string data = model + " --data " + shell_quote(corpus().string());
  const fs::path base = test::temp_dir() / "b.npy";
  ASSERT_EQ(test::run_lineage("perplexity" + data + " --ctx 20 --chunks 2 --save-logits " +
                              shell_quote(base.string())).exit_code, 0);
  struct Case {
    std::string args, says;
  };
  for (const Case& c : {Case{"--ctx 2", "--ctx"}, Case{"--ctx 400", "fewer than one window"},
                        Case{"--ctx 24 --chunks 2 --kld-base " + shell_quote(base.string()), "\"ctx\""},
                        Case{"--ctx 20 --chunks 1 --kld-base " + shell_quote(base.string()), "\"windows\""},
                        Case{"--ctx 20 --chunks 2 --kld-base " + shell_quote(corpus().string()), ".json"}}) {
    const auto r = test::run_lineage("perplexity" + data + " " + c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << c.args << ": " << r.err;
  }
}

}  // namespace
}  // namespace perplexity_test
}  // namespace lineage
