#include "lineage/model/archs/presets.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "lineage/core/error.h"
#include "lineage/core/parallel.h"
#include "lineage/core/rng.h"
#include "lineage/model/archs/arch.h"

namespace lineage::model {

namespace {

std::string gpt2_config(int layers, int heads, int width) {
  return nlohmann::json{{"model_type", "gpt2"}, {"vocab_size", 50257}, {"n_positions", 1024},
                        {"n_embd", width},      {"n_layer", layers},     {"n_head", heads},
                        {"n_inner", nullptr},   {"activation_function", "gelu_new"},
                        {"layer_norm_epsilon", 1e-5}, {"bos_token_id", 50256}, {"eos_token_id", 50256}}
      .dump();
}

uint64_t hash_name(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

}  // namespace

const std::vector<Preset>& presets() {
  static const std::vector<Preset> p = {
      {"gpt2-124m", "GPT-2 small shape (12 layers, 768 wide, 12 heads)", gpt2_config(12, 12, 768), true},
      {"gpt2-medium", "GPT-2 medium shape (24 layers, 1024 wide, 16 heads)", gpt2_config(24, 16, 1024)},
      {"gpt2-large", "GPT-2 large shape (36 layers, 1280 wide, 20 heads)", gpt2_config(36, 20, 1280)},
      {"gpt2-xl", "GPT-2 XL shape (48 layers, 1600 wide, 25 heads)", gpt2_config(48, 25, 1600)},
  };
  return p;
}

std::string preset_names() {
  std::string s;
  for (const auto& p : presets()) s += (s.empty() ? "" : ", ") + p.name;
  return s;
}

void init_random(Model& m, uint64_t seed, DType dtype) {
  // Each block of a tensor has its own stream, so the values do not depend on the thread count.
  constexpr int64_t kBlock = 1 << 16;
  m.for_each_tensor([&](const std::string& name, Tensor& t, const Shape& shape, layers::Init init) {
    Tensor f = Tensor::empty(DType::F32, shape);
    float* d = f.data<float>();
    const uint64_t stream = seed ^ hash_name(name);
    const int64_t n = f.numel();
    parallel_for((n + kBlock - 1) / kBlock, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        Rng rng(stream + uint64_t(b) * 0x9e3779b97f4a7c15ull);
        for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i)
          d[i] = init == layers::Init::Ones ? 1.0f : init == layers::Init::Zeros ? 0.0f : 0.02f * rng.normal();
      }
    });
    t = dtype == DType::F32 ? std::move(f) : convert(f, dtype);
  });
}

Model preset_skeleton(const std::string& name) {
  for (const auto& p : presets()) {
    if (p.name != name) continue;
    const nlohmann::json j = nlohmann::json::parse(p.config_json);
    const std::string type = j["model_type"];
    const ArchBuilder* build = find_arch(type);
    LINEAGE_CHECK(build, "preset ", name, " names unknown model_type ", type);
    return (*build)(ArchInput{ConfigFields(j, "preset " + name), [](const std::string&) { return false; }});
  }
  throw Error(cat("unknown preset \"", name, "\"; expected one of: ", preset_names()));
}

Model make_preset(const std::string& name, uint64_t seed, DType dtype) {
  Model m = preset_skeleton(name);
  init_random(m, seed, dtype);
  return m;
}

}  // namespace lineage::model
