#include "test_support.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace lineage::test {

namespace fs = std::filesystem;

namespace {
std::string env_or_fail(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) {
    ADD_FAILURE() << "environment variable " << name << " is not set; run the tests through ctest";
    return "";
  }
  return v;
}

}  // namespace

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

fs::path testdata() {
  const fs::path p = env_or_fail("LINEAGE_TESTDATA");
  if (!fs::is_directory(p)) ADD_FAILURE() << "test data directory " << p << " is missing (reference fixtures failed?)";
  return p;
}

std::string lineage_bin() { return env_or_fail("LINEAGE_BIN"); }
fs::path source_dir() { return env_or_fail("LINEAGE_SOURCE"); }

fs::path temp_dir() {
  static std::atomic<int> counter{0};
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "test";
  for (auto& c : name) if (c == '/') c = '_';
  const fs::path p = fs::temp_directory_path() /
                     ("lineage_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

double rel_rms(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

int64_t worst_index(const float* a, const float* b, int64_t n) {
  int64_t w = 0;
  double best = -1;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (d > best) best = d, w = i;
  }
  return w;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

RunResult run_lineage(const std::string& args) {
  const fs::path dir = temp_dir();
  const std::string cmd = shell_quote(lineage_bin()) + " " + args + " >" + shell_quote((dir / "out").string()) +
                          " 2>" + shell_quote((dir / "err").string()) + " </dev/null";
  const int status = std::system(cmd.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(dir / "out");
  r.err = slurp(dir / "err");
  fs::remove_all(dir);
  return r;
}

}  // namespace lineage::test

#include <nlohmann/json.hpp>

#include "lineage/core/error.h"
#include "lineage/io/load_model.h"
#include "lineage/io/npy.h"
#include "lineage/io/safetensors.h"
#include "lineage/model/archs/arch.h"
#include "lineage/model/archs/presets.h"

namespace lineage::test {

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

void write_raw_safetensors(const fs::path& path, const std::string& header, const std::string& data,
                           int64_t header_len_override) {
  std::string h = header;
  while (h.size() % 8) h += ' ';
  const uint64_t len = header_len_override >= 0 ? uint64_t(header_len_override) : h.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << h << data;
}

void write_safetensors(const fs::path& path, const std::vector<std::pair<std::string, Tensor>>& tensors) {
  io::save_safetensors(path, tensors);
}

fs::path tiny_gpt2_dir(DType dtype, const std::function<void(std::vector<std::pair<std::string, Tensor>>&)>& edit) {
  const nlohmann::json cfg = {{"model_type", "gpt2"}, {"vocab_size", 50}, {"n_positions", 32}, {"n_embd", 16},
                              {"n_layer", 2},         {"n_head", 2},      {"layer_norm_epsilon", 1e-5}};
  model::Model m = model::build_gpt2({model::ConfigFields(cfg, "tiny"), [](const std::string&) { return false; }});
  model::init_random(m, 1, dtype);
  std::vector<std::pair<std::string, Tensor>> tensors;
  m.for_each_tensor([&](const std::string& name, Tensor& t, const Shape&, layers::Init) { tensors.emplace_back(name, t); });
  if (edit) edit(tensors);
  const fs::path dir = temp_dir();
  write_text(dir / "config.json", cfg.dump(2));
  write_safetensors(dir / "model.safetensors", tensors);
  return dir;
}

fs::path tiny_model_with_tokenizer(const std::function<void(nlohmann::json&)>& edit_config,
                                   const std::function<void(TensorList&)>& edit_tensors) {
  const fs::path dir = temp_dir();
  const fs::path tok = testdata() / "tokenizer" / "gpt2";
  fs::copy_file(tok / "vocab.json", dir / "vocab.json");
  fs::copy_file(tok / "merges.txt", dir / "merges.txt");
  nlohmann::json cfg = {{"model_type", "gpt2"}, {"vocab_size", 50257}, {"n_positions", 64}, {"n_embd", 16},
                        {"n_layer", 1},         {"n_head", 2},         {"eos_token_id", 50256}};
  if (edit_config) edit_config(cfg);
  write_text(dir / "config.json", cfg.dump());
  model::Model m = model::build_gpt2({model::ConfigFields(cfg, "tiny"), [](const std::string&) { return false; }});
  model::init_random(m, 11, DType::F32);
  TensorList tensors;
  m.for_each_tensor([&](const std::string& n, Tensor& t, const Shape&, layers::Init) { tensors.emplace_back(n, t); });
  if (edit_tensors) edit_tensors(tensors);
  write_safetensors(dir / "model.safetensors", tensors);
  return dir;
}

fs::path write_config(const nlohmann::json& config) {
  const fs::path dir = temp_dir();
  std::ofstream(dir / "config.json") << config.dump();
  return dir;
}

void expect_config_error(const nlohmann::json& config, std::initializer_list<std::string> pieces) {
  const fs::path dir = write_config(config);
  try {
    io::load_skeleton(dir);
    ADD_FAILURE() << "expected an Error for " << config.dump().substr(0, 200);
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find((dir / "config.json").string()), std::string::npos) << msg;
    for (const auto& p : pieces) EXPECT_NE(msg.find(p), std::string::npos) << "message lacks \"" << p << "\":\n" << msg;
  }
  const auto r = run_lineage("info --model " + shell_quote(dir.string()));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(*pieces.begin()), std::string::npos) << r.err;
}

std::string golden_tokens_arg(const std::filesystem::path& dir) {
  const Tensor t = io::load_npy(dir / "golden" / "tokens.npy");
  std::string s;
  for (int64_t i = 0; i < t.numel(); ++i) s += (i ? " " : "") + std::to_string(t.data<int32_t>()[i]);
  return s;
}

}  // namespace lineage::test
