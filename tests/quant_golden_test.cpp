// Quantized checkpoints (issue #37): the reference's tiny compressed-tensors and fp8 checkpoints of
// every format (reference/quant_goldens.py, the weights dequantized from their definition in
// float64) through the real loader; split invariance, batches bit for bit their lone rows, and
// damaged tensors and configs refused by name.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "batch_check.h"
#include "lineage/core/error.h"
#include "lineage/io/load_model.h"
#include "lineage/io/npy.h"
#include "lineage/kernels/linear.h"
#include "lineage/layers/common.h"
#include "lineage/runtime/session.h"
#include "test_support.h"

namespace lineage {
namespace quant_golden_test {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

json manifest(const fs::path& dir) {
  std::ifstream in(dir / "golden" / "manifest.json");
  return json::parse(in);
}

// The reference's cases, and those it expects lineage to refuse.
std::vector<fs::path> cases(bool refused = false) {
  std::vector<fs::path> v;
  const fs::path root = test::testdata() / "quant";
  if (fs::is_directory(root))
    for (const auto& e : fs::directory_iterator(root))
      if (fs::exists(e.path() / "golden" / "manifest.json") && manifest(e.path()).contains("expect_error") == refused)
        v.push_back(e.path());
  std::sort(v.begin(), v.end());
  return v;
}

std::vector<int32_t> tokens(const fs::path& dir) {
  const Tensor t = io::load_npy(dir / "golden" / "tokens.npy");
  return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
}

double rel_rms(const std::vector<float>& got, const Tensor& want) {
  return test::rel_rms(got.data(), want.data<float>(), want.numel());
}

// Every intermediate the reference records and the logits, the bf16 weights on the exact path (the
// goldens multiply the dequantized weights exactly), to 6× PyTorch's own f32 error as the other
// families' goldens; the bf16 dot default against the reference's logits with its rounded inputs.
TEST(GoldenQuant, EveryFormatMatchesTheDequantizedReference) {
  const auto all = cases();
  ASSERT_GE(all.size(), 11u) << "expected the reference's quantized cases under " << test::testdata() / "quant";
  for (const fs::path& dir : all) {
    SCOPED_TRACE(dir.string());
    io::LoadedModel lm = io::load_model(dir, false);
    lm.model.options.bf16_dot = false;
    const std::vector<int32_t> ids = tokens(dir);
    std::map<std::string, std::vector<float>> got;
    runtime::Session s(lm.model);
    s.set_trace(layers::Trace{[&](const std::string& name, const float* d, const Shape& shape) {
      got[name].assign(d, d + shape_numel(shape));
    }, ""});
    s.prefill(ids, true);
    const json m = manifest(dir);
    int compared = 0;
    for (const auto& item : m["intermediates"]) {
      const std::string name = item["name"];
      ASSERT_TRUE(got.count(name)) << name;
      const Tensor want = io::load_npy(dir / "golden" / item["file"].get<std::string>());
      const double tol = std::max(6 * item["f32_torch_rel_rms"].get<double>(), 2e-7);
      ASSERT_LE(rel_rms(got[name], want), tol) << "first diverging intermediate " << name;
      ++compared;
    }
    EXPECT_GE(compared, 12);
    if (fs::exists(dir / "golden" / "logits_bf16_dot.npy") && lineage::kernels::bf16_dot_available()) {
      io::LoadedModel dot = io::load_model(dir, false);
      runtime::Session d(dot.model);
      const auto span = d.prefill(ids, true);
      const std::vector<float> l(span.begin(), span.end());
      const Tensor want = io::load_npy(dir / "golden" / "logits_bf16_dot.npy");
      EXPECT_LE(rel_rms(l, want), 2e-3) << "bf16 dot default";
    }
  }
}

// Prefill in pieces (1 = decode, 3, 7) gives the whole prefill's logits; up to 8 sequences decoding
// together give each its lone bits (every quantized matrix is [out, in]: the rows GEMV), bf16 dot
// products and all.
TEST(GoldenQuant, SplitInvariantAndBatchedBitForBit) {
  for (const fs::path& dir : cases()) {
    SCOPED_TRACE(dir.string());
    io::LoadedModel lm = io::load_model(dir, false);
    // Exact products, as the other families' split checks (golden_test.cpp): bf16 dot products sum in
    // another order in a GEMM than in a GEMV (~1e-6), and these tiny MoEs route some tokens on
    // margins that small (the reference prints them), so an expert choice may flip with them.
    lm.model.options.bf16_dot = false;
    const std::vector<int32_t> ids = tokens(dir);
    runtime::Session whole(lm.model);
    const auto all_logits = whole.prefill(ids, true);
    const std::vector<float> ref(all_logits.begin(), all_logits.end());
    for (size_t piece : {size_t(1), size_t(3), size_t(7)}) {
      runtime::Session s(lm.model);
      std::vector<float> l;
      for (size_t i = 0; i < ids.size(); i += piece) {
        const size_t n = std::min(piece, ids.size() - i);
        const auto r = piece == 1 ? s.decode(ids[i]) : s.prefill(std::span<const int32_t>(ids.data() + i, n), true);
        l.insert(l.end(), r.begin(), r.end());
      }
      EXPECT_LE(test::rel_rms(l.data(), ref.data(), int64_t(ref.size())), 1e-5) << "pieces of " << piece;
    }
    lm.model.options.bf16_dot = true;
    test::expect_decode_together_bitwise(lm.model, 5);
  }
}

std::string load_error(const fs::path& dir) {
  try {
    io::load_model(dir, false);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A copy of case `name` whose tensors and config `edit` changes.
fs::path rewritten(const std::string& name, const std::function<void(std::map<std::string, Tensor>&, json&)>& edit) {
  const fs::path src = test::testdata() / "quant" / name;
  const fs::path dst = test::temp_dir() / ("quant_" + name);
  fs::create_directories(dst);
  io::Checkpoint ck = io::Checkpoint::open(src);
  std::map<std::string, Tensor> t;
  for (const auto& n : ck.names()) t[n] = ck.tensor(n).clone();
  std::ifstream in(src / "config.json");
  json c = json::parse(in);
  edit(t, c);
  std::vector<std::pair<std::string, Tensor>> list(t.begin(), t.end());
  test::write_safetensors(dst / "model.safetensors", list);
  std::ofstream(dst / "config.json") << c.dump(2);
  return dst;
}

void expect_refused(const fs::path& dir, std::initializer_list<std::string> pieces) {
  const std::string e = load_error(dir);
  ASSERT_FALSE(e.empty()) << "expected an Error loading " << dir;
  for (const std::string& p : pieces) EXPECT_NE(e.find(p), std::string::npos) << "lacks \"" << p << "\":\n" << e;
}

const std::string kDown = "model.layers.1.mlp.experts.3.down_proj.weight";

TEST(GoldenQuant, DamagedCheckpointsAreRefusedByName) {
  ASSERT_FALSE(cases().empty());
  for (const fs::path& dir : cases(true)) {  // the reference's own: activation order
    const json m = manifest(dir);
    expect_refused(dir, {m["expect_error"].get<std::string>(), "actorder", "config_groups.group_0"});
  }
  // A non-finite scale, found at every load.
  expect_refused(rewritten("w4a16_g32", [](auto& t, json&) {
                   static_cast<uint16_t*>(t[kDown + "_scale"].raw_mut())[3] = 0x7fc0;  // bf16 NaN
                 }),
                 {kDown + "_scale", "not finite", "config_groups.group_0"});
  // A scale of the wrong shape.
  expect_refused(rewritten("w4a16_g32", [](auto& t, json&) { t[kDown + "_scale"] = Tensor::zeros(DType::BF16, {64, 2}); }),
                 {kDown + "_scale", "shape [64, 2], expected [64, 1]"});
  // weight_shape that does not match.
  expect_refused(rewritten("w4a16_g32", [](auto& t, json&) { t[kDown + "_shape"].template data<int64_t>()[1] = 33; }),
                 {kDown + "_shape", "(64, 33), expected (64, 32)"});
  // The config quantizes a matrix the file stores in bf16 (ignore dropped from the config).
  expect_refused(rewritten("w4a16_g32", [](auto&, json& c) { c["quantization_config"]["ignore"] = json::array({"lm_head"}); }),
                 {"model.layers.0.mlp.gate.weight", "stored unquantized", "config_groups.group_0"});
  // The config leaves a matrix alone that the file stores packed.
  expect_refused(rewritten("w4a16_g32", [](auto&, json& c) {
                   c["quantization_config"]["ignore"].push_back("re:.*layers\\.1\\.mlp\\.experts\\.3\\.down_proj$");
                 }),
                 {kDown + "_packed", "stored quantized", "unquantized"});
  // Unknown format, strategy, bit width; a W4A4 preset's float activations are fine (ignored).
  expect_refused(rewritten("w4a16_g32", [](auto&, json& c) { c["quantization_config"]["config_groups"]["group_0"]["format"] = "marlin-24"; }),
                 {"\"marlin-24\" is not supported", "pack-quantized"});
  expect_refused(rewritten("w4a16_g32", [](auto&, json& c) {
                   c["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"] = "tensor_group";
                 }),
                 {"strategy", "\"group\" or \"channel\"", "tensor_group"});
  expect_refused(rewritten("w4a16_g32", [](auto&, json& c) {
                   c["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 3;
                 }),
                 {"num_bits", "4 or 8"});
  expect_refused(rewritten("w4a16_g32", [](auto&, json& c) { c["quantization_config"]["quant_method"] = "gptq"; }),
                 {"quant_method", "\"compressed-tensors\" or \"fp8\"", "gptq"});
  // FP8 codes with a block scale of the wrong dtype.
  expect_refused(rewritten("fp8_block", [](auto& t, json&) {
                   for (auto& [n, x] : t)
                     if (n == kDown + "_scale") x = Tensor::zeros(DType::I32, x.shape());
                 }),
                 {kDown + "_scale", "I32"});
}

}  // namespace
}  // namespace quant_golden_test
}  // namespace lineage
