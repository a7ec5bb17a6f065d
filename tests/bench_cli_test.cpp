// `lineage bench` as scripts drive it: the JSON rows, their roofline arithmetic, and bad values.
// Each run draws a preset's random weights (~2 s) and measures the roofline (~1 s), so few runs.
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "lineage/kernels/linear.h"
#include "test_support.h"

namespace lineage {
namespace bench_cli_test {
namespace {

using test::run_lineage;

nlohmann::json run_bench_json(const std::string& args) {
  const auto r = run_lineage("bench " + args + " --json");
  EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.err;
  if (r.exit_code != 0) return nlohmann::json::array();
  return nlohmann::json::parse(r.out);
}

// Fields every row has, positive, and the share that follows from them.
void expect_row(const nlohmann::json& row, const std::string& model) {
  SCOPED_TRACE(row.dump());
  EXPECT_EQ(row["model"], model);
  EXPECT_EQ(row["weights_dtype"], "f32");
  EXPECT_EQ(row["threads"], 1);
  for (const char* key : {"tokens_per_s", "roofline_tokens_per_s", "roofline_share", "bandwidth_bytes_per_s",
                          "peak_flops"}) {
    ASSERT_TRUE(row.contains(key)) << key;
    EXPECT_GT(row[key].get<double>(), 0.0) << key;
  }
  ASSERT_TRUE(row.contains("tokens_per_s_stddev"));
  EXPECT_GE(row["tokens_per_s_stddev"].get<double>(), 0.0);
  const double share = row["tokens_per_s"].get<double>() / row["roofline_tokens_per_s"].get<double>();
  EXPECT_NEAR(row["roofline_share"].get<double>(), share, 1e-12 * share);
  const bool decode = row["test"].get<std::string>().rfind("tg", 0) == 0;
  const char* cost = decode ? "bytes_per_token" : "flops_per_token";
  ASSERT_TRUE(row.contains(cost)) << cost;
  EXPECT_GT(row[cost].get<double>(), 0.0);
  // The roofline is the ceiling divided by the cost of one token.
  const double ceiling = row[decode ? "bandwidth_bytes_per_s" : "peak_flops"].get<double>();
  EXPECT_NEAR(row["roofline_tokens_per_s"].get<double>(), ceiling / row[cost].get<double>(),
              1e-9 * row["roofline_tokens_per_s"].get<double>());
  EXPECT_FALSE(row["bf16_dot"].get<bool>());
  EXPECT_FALSE(row["weights_mapped"].get<bool>()) << "preset weights are owned";
  if (!decode) return;
  // Paired: each repetition against the bandwidth probed around it, never above the run's best.
  const auto samples = row["samples_tokens_per_s"].get<std::vector<double>>();
  const auto bandwidth = row["samples_bandwidth_bytes_per_s"].get<std::vector<double>>();
  ASSERT_EQ(samples.size(), bandwidth.size());
  const double bytes = row[cost].get<double>();
  double shares = 0, probes = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    EXPECT_GT(bandwidth[i], 0.0);
    EXPECT_LE(bandwidth[i], ceiling);
    shares += samples[i] / (bandwidth[i] / bytes);
    probes += bandwidth[i];
  }
  const double n = double(samples.size());
  EXPECT_NEAR(row["roofline_share_paired"].get<double>(), shares / n, 1e-9 * shares / n);
  EXPECT_NEAR(row["roofline_paired_tokens_per_s"].get<double>(), probes / n / bytes, 1e-9 * probes / n / bytes);
}

TEST(BenchCli, Gpt2RowsAndTheirRoofline) {
  const auto j = run_bench_json("--preset gpt2-124m --prompt 8 --gen 2 --depth 0,16 --repetitions 2 --threads 1");
  ASSERT_EQ(j.size(), 3u);
  for (const auto& row : j) expect_row(row, "gpt2-124m");
  EXPECT_EQ(j[0]["test"], "pp8");
  EXPECT_EQ(j[0]["depth"], 0);
  EXPECT_EQ(j[1]["test"], "tg2");
  EXPECT_EQ(j[1]["depth"], 0);
  EXPECT_EQ(j[2]["depth"], 16);
  // tg2 from empty: every weight once (tied head whole, one embedding and one position row) plus the
  // KV rows of a mean 1.5 positions attended.
  const double weights = 4.0 * (124439808.0 - 1024 * 768 + 768 + 768);
  EXPECT_DOUBLE_EQ(j[1]["bytes_per_token"].get<double>(), weights + 2 * 12 * 768 * 4 * 1.5);
  EXPECT_DOUBLE_EQ(j[2]["bytes_per_token"].get<double>(), weights + 2 * 12 * 768 * 4 * 17.5);
}

TEST(BenchCli, DeltaNetStateCostIsTheSameAtEveryDepth) {
  const auto j = run_bench_json("--preset deltanet --prompt 8 --gen 2 --depth 0,16 --repetitions 1 --threads 1");
  ASSERT_EQ(j.size(), 3u);
  for (const auto& row : j) expect_row(row, "deltanet");
  EXPECT_DOUBLE_EQ(j[1]["bytes_per_token"].get<double>(), j[2]["bytes_per_token"].get<double>());
  EXPECT_GT(j[1]["state_bytes_per_token"].get<double>(), 0.0);
}

// A checkpoint's weights stay mapped from its files, and the rows say so (the header too, with the
// share on 2 MiB pages); with --no-mmap they are the engine's own.
TEST(BenchCli, CheckpointWeightsAreReportedMapped) {
  const std::string dir = test::shell_quote((test::testdata() / "kda" / "f32").string());
  const auto j = run_bench_json("--model " + dir + " --prompt 4 --gen 2 --repetitions 1 --threads 1");
  ASSERT_EQ(j.size(), 2u);
  for (const auto& row : j) {  // how much of the file the kernel maps with 2 MiB entries is its choice
    EXPECT_TRUE(row["weights_mapped"].get<bool>()) << row.dump();
    const double share = row["weights_huge_page_share"].get<double>();
    EXPECT_GE(share, 0.0);
    EXPECT_LE(share, 1.0);
  }
  const auto text = run_lineage("bench --model " + dir + " --prompt 4 --gen 2 --repetitions 1 --threads 1");
  EXPECT_NE(text.out.find("mapped from files"), std::string::npos) << text.out;
  const auto owned = run_bench_json("--model " + dir + " --no-mmap --prompt 4 --gen 2 --repetitions 1 --threads 1");
  ASSERT_EQ(owned.size(), 2u);
  for (const auto& row : owned) {
    EXPECT_FALSE(row["weights_mapped"].get<bool>()) << row.dump();
    EXPECT_TRUE(row["weights_huge_page_share"].is_null()) << row.dump();
  }

}

// BF16 weights take bf16 dot products by default where the CPU has AVX512_BF16, exact f32 products
// with --bf16-exact (or on a CPU without), and the rows and the header say which.
TEST(BenchCli, Bf16ProductsAreReported) {
  const std::string dir = test::shell_quote((test::testdata() / "kda" / "bf16").string());
  const std::string args = "--model " + dir + " --prompt 4 --gen 2 --repetitions 1 --threads 1";
  const bool dot_here = kernels::bf16_dot_available();  // this process's default: whether the CPU can
  ::testing::Test::RecordProperty("bf16_branch", dot_here ? "bf16 dot products" : "exact f32 products");
  std::printf("bf16 branch: %s\n", dot_here ? "bf16 dot products" : "exact f32 products (no AVX512_BF16)");
  for (const auto& row : run_bench_json(args)) EXPECT_EQ(row["bf16_dot"].get<bool>(), dot_here) << row.dump();
  for (const auto& row : run_bench_json(args + " --bf16-exact")) EXPECT_FALSE(row["bf16_dot"].get<bool>()) << row.dump();
  const auto exact = run_lineage("bench " + args + " --bf16-exact");
  EXPECT_NE(exact.out.find("bf16 weights: exact f32 products"), std::string::npos) << exact.out;
  if (dot_here) {
    const auto dot = run_lineage("bench " + args);
    EXPECT_NE(dot.out.find("bf16 weights: bf16 dot products (--bf16-exact"), std::string::npos) << dot.out;
  }
}

// As llama-bench's -p 0 / -n 0: a zero skips that test and runs the other.
TEST(BenchCli, ZeroPromptOrGenSkipsThatTest) {
  const auto tg_only = run_bench_json("--preset deltanet --threads 1 --repetitions 1 --prompt 0 --gen 4 --depth 0,8");
  ASSERT_EQ(tg_only.size(), 2u) << tg_only.dump();
  EXPECT_EQ(tg_only[0]["test"], "tg4");
  EXPECT_EQ(tg_only[1]["depth"], 8);
  const auto pp_only = run_bench_json("--preset deltanet --threads 1 --repetitions 1 --prompt 16 --gen 0 --depth 0,8");
  ASSERT_EQ(pp_only.size(), 1u) << pp_only.dump();
  EXPECT_EQ(pp_only[0]["test"], "pp16");
  const auto text = run_lineage("bench --preset deltanet --threads 1 --repetitions 1 --prompt 0 --gen 2");
  EXPECT_EQ(text.exit_code, 0) << text.err;
  EXPECT_EQ(text.out.find(" pp"), std::string::npos) << text.out;  // no pp row
  EXPECT_NE(text.out.find("tg2"), std::string::npos) << text.out;
}

TEST(BenchCli, BadValuesExitTwo) {
  const struct {
    std::string args, expect;
  } cases[] = {
      {"bench --preset gpt2-124m --depth 1,x", "--depth"},
      {"bench --preset gpt2-124m --depth -4", "--depth"},
      {"bench --preset gpt2-124m --prompt 0 --gen 0", "leave no test to run"},
      {"bench --preset gpt2-124m --prompt -1", "--prompt"},
      {"bench --preset gpt2-124m --gen x", "--gen"},
      {"bench --preset gpt2-124m --repetitions 0", "--repetitions"},
      {"bench --preset gpt2-124m --prompt 2048", "context limit of 1024"},
      {"bench --preset gpt2-124m --depth 0,1000 --gen 32", "--depth 1000 + --gen 32 = 1032"},
      {"bench --preset gpt2-124m --depth 0,1000 --gen 32", "use depths up to 992 or --gen up to 24"},
      {"bench --preset gpt2-124m --depth 128 --gen 1500", "use --gen up to 896"},
      {"bench --preset gpt2-124m --depth 2000 --gen 1500", "at most 1024"},
      {"bench --preset gpt2-124m --bf16-dot --bf16-exact", "excludes"},
  };
  for (const auto& c : cases) {
    const auto r = run_lineage(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.args << "\nstderr: " << r.err;
  }
  const auto help = run_lineage("bench --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--threads"), std::string::npos);
  EXPECT_NE(help.out.find("--weights-dtype"), std::string::npos);
}

}  // namespace
}  // namespace bench_cli_test
}  // namespace lineage
