// The GGUF reader through `lineage gguf`: files written from the format's definition by
// reference/gguf_writer.py (every metadata type, nested arrays, versions 2 and 3, a 64-byte
// alignment, plain and block-quantized tensors) read the same by lineage and by @huggingface/gguf
// (tests/gguf/reference_read.mjs), and each damaged file an error naming the file and the problem.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "test_support.h"

namespace lineage {
namespace gguf_test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::shell_quote;

const fs::path& files() {
  static const fs::path dir = [] {
    const fs::path d = test::temp_dir() / "gguf";
    const std::string cmd = "/usr/bin/python3 " + shell_quote((test::source_dir() / "reference" / "gguf_writer.py").string()) +
                            " " + shell_quote(d.string());
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return d;
  }();
  return dir;
}

json reference(const fs::path& file) {
  const fs::path out = test::temp_dir() / "gguf_reference.json";
  const std::string cmd = "cd " + shell_quote((test::source_dir() / "tests" / "gguf").string()) +
                          " && node reference_read.mjs " + shell_quote(file.string()) + " > " + shell_quote(out.string());
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd << " (npm ci in tests/gguf: scripts/install-deps.sh --test)";
  return json::parse(test::slurp(out));
}

// A JSON value as the reference prints it: 64-bit integers as decimal strings.
json as_reference(const json& v, const std::string& type) {
  if (v.is_array()) {
    json a = json::array();
    for (const auto& x : v) a.push_back(as_reference(x, type));
    return a;
  }
  if (type == "u64" || type == "i64") return v.is_number_unsigned() ? std::to_string(v.get<uint64_t>()) : std::to_string(v.get<int64_t>());
  return v;
}

TEST(Gguf, ReadsWhatHuggingFacesParserReads) {
  for (const char* name : {"kinds_v3.gguf", "aligned_v2.gguf"}) {
    SCOPED_TRACE(name);
    const fs::path file = files() / name;
    const auto r = test::run_lineage("gguf " + shell_quote(file.string()) + " --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json got = json::parse(r.out), want = reference(file);
    EXPECT_EQ(got["version"], want["metadata"]["version"]);
    EXPECT_EQ(got["metadata"].size() + 3, want["metadata"].size()) << "the reference adds version and the two counts";
    for (const auto& kv : got["metadata"]) {
      const std::string key = kv["key"];
      ASSERT_TRUE(want["metadata"].contains(key)) << key;
      const std::string type = kv.contains("element_type") ? kv["element_type"].get<std::string>() : kv["type"].get<std::string>();
      EXPECT_EQ(as_reference(kv["value"], type), want["metadata"][key]) << key;
    }
    ASSERT_EQ(got["tensors"].size(), want["tensors"].size());
    for (size_t i = 0; i < got["tensors"].size(); ++i) {
      const json &g = got["tensors"][i], &w = want["tensors"][i];
      EXPECT_EQ(g["name"], w["name"]);
      EXPECT_EQ(g["type_id"], w["type"]) << g["name"];
      EXPECT_EQ(as_reference(g["ne"], "u64"), w["ne"]) << g["name"];
      EXPECT_EQ(std::to_string(g["offset"].get<uint64_t>()), w["offset"]) << g["name"];
    }
    EXPECT_EQ(got["alignment"], std::string(name) == "aligned_v2.gguf" ? 64 : 32);
  }
  // The listing names the types and sizes.
  const auto text = test::run_lineage("gguf " + shell_quote((files() / "kinds_v3.gguf").string()));
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("GGUF v3, 17 metadata entries, 6 tensors"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("Q4_K"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("[3 x array] [1,-2,3], [], [7]"), std::string::npos) << "a nested array: " << text.out;
}

TEST(Gguf, DamagedFilesAreNamed) {
  std::ifstream list(files() / "bad" / "expected.txt");
  int cases = 0;
  for (std::string line; std::getline(list, line);) {
    const std::string name = line.substr(0, line.find('\t')), says = line.substr(line.find('\t') + 1);
    const fs::path file = files() / "bad" / (name + ".gguf");
    const auto r = test::run_lineage("gguf " + shell_quote(file.string()));
    EXPECT_EQ(r.exit_code, 2) << name << ": " << r.out;
    EXPECT_NE(r.err.find(file.string()), std::string::npos) << name << ": " << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << name << " should say \"" << says << "\": " << r.err;
    ++cases;
  }
  EXPECT_EQ(cases, 16);
}

}  // namespace
}  // namespace gguf_test
}  // namespace lineage
