// `lineage study memory` as users run it: the tables, --json, the files of --out, and bad values.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_support.h"

namespace lineage {
namespace study_cli_test {
namespace {

namespace fs = std::filesystem;
using test::run_lineage;
using test::shell_quote;

constexpr const char* kSmall = "study memory --dims 16,32 --ratios 0.5,4 --trials 2 --seed 3";

TEST(StudyCli, PrintsTheTablesAndWritesSelfContainedFiles) {
  const fs::path dir = test::temp_dir() / "report";
  const auto r = run_lineage(std::string(kSmall) + " --out " + shell_quote(dir.string()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* s : {"capacity:", "repeated key:", "forgetting:", "accuracy", "newest acc", "cos(read, v2)",
                        "t to cos < 0.5", "per-channel decay", "kernels::delta_rule_recurrent"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  // One capacity row per rule, D and N/D: "additive ... 16 0.5 8 ...".
  int rows = 0;
  for (size_t at = r.out.find("\nadditive "); at != std::string::npos; at = r.out.find("\nadditive ", at + 1)) ++rows;
  EXPECT_EQ(rows, 2 * 2 + 2 * 3 + 2 * 3) << r.out;  // capacity, repeated key (3 M each), forgetting (3 keys each)
  EXPECT_NE(r.out.find("files written to " + dir.string()), std::string::npos);
  for (const char* f : {"memory.html", "memory.json", "memory_capacity.svg", "memory_newest.svg",
                        "memory_forgetting_d16.svg", "memory_forgetting_d32.svg"}) {
    EXPECT_TRUE(fs::is_regular_file(dir / f)) << f;
    EXPECT_NE(r.out.find((dir / f).string()), std::string::npos) << f;
  }
  const std::string svg = test::slurp(dir / "memory_capacity.svg");
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  const std::string html = test::slurp(dir / "memory.html");
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("Forgetting, D = 32"), std::string::npos);
  // Self-contained: nothing fetched from elsewhere (the SVG namespace is a name, not a fetch).
  for (const char* s : {"src=", "href=", "@import", "url(http"}) EXPECT_EQ(html.find(s), std::string::npos) << s;
  const auto j = nlohmann::json::parse(test::slurp(dir / "memory.json"));
  EXPECT_EQ(j["capacity"].size(), 4u * 2 * 2);
}

TEST(StudyCli, JsonIsCompleteAndTheSameForAnyThreadCount) {
  const auto one = run_lineage(std::string(kSmall) + " --json --threads 1");
  const auto two = run_lineage(std::string(kSmall) + " --json --threads 2");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  ASSERT_EQ(two.exit_code, 0) << two.err;
  auto a = nlohmann::json::parse(one.out), b = nlohmann::json::parse(two.out);
  ASSERT_EQ(a["capacity"].size(), 4u * 2 * 2);
  EXPECT_EQ(a["repeated_key"].size(), 4u * 2 * 3);
  EXPECT_EQ(a["forgetting"].size(), 4u * 2 * 3);
  EXPECT_EQ(a["config"]["trials"], 2);
  EXPECT_EQ(a["config"]["seed"], 3);
  for (const auto& c : a["capacity"]) {
    EXPECT_GE(c["accuracy"].get<double>(), 0.0);
    EXPECT_LE(c["accuracy"].get<double>(), 1.0);
    EXPECT_EQ(c["N"].get<int64_t>(), std::llround(c["ratio"].get<double>() * c["D"].get<double>()));
  }
  // The delta rule reads the newest value of a repeated key back exactly.
  for (const auto& r : a["repeated_key"]) {
    if (r["rule"] == "delta") {
      EXPECT_GT(r["cos_new"].get<double>(), 0.999) << r.dump();
    }
  }
  EXPECT_GT(a["seconds"].get<double>(), 0.0);
  a.erase("seconds"), b.erase("seconds");
  EXPECT_EQ(a, b);
}

TEST(StudyCli, BadValuesExitTwoNamingTheOption) {
  const struct {
    std::string args, expect;
  } cases[] = {
      {"study memory --dims 63", "--dims"},
      {"study memory --dims 16,abc", "--dims"},
      {"study memory --ratios 0", "--ratios"},
      {"study memory --ratios 1,x", "--ratios"},
      {"study memory --ratios 0.01 --dims 16", "--ratios"},
      {"study memory --trials 0", "--trials"},
      {"study memory --seed -1", "--seed"},
      {"study memory --dims 16 --ratios 1 --trials 1 --out /proc/no/such/dir", "--out"},
      {"study memory --frobnicate", "frobnicate"},
      {"study", "subcommand"},
  };
  for (const auto& c : cases) {
    const auto r = run_lineage(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << c.args;
  }
  const auto help = run_lineage("study memory --help");
  EXPECT_EQ(help.exit_code, 0);
  for (const char* s : {"--dims", "--ratios", "--trials", "--seed", "--json", "--out", "--threads"})
    EXPECT_NE(help.out.find(s), std::string::npos) << s;
}

}  // namespace
}  // namespace study_cli_test
}  // namespace lineage
