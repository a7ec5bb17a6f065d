// config.json of every checkpoint family through the real io::load_model. At start-up the harness
// writes one tiny valid checkpoint per variant below (the family's own builder names and shapes its
// tensors); an input's first byte picks the variant (bits 0-2; bit 3: owned instead of mapped
// weights) and the rest is the config.json loaded against that checkpoint. A model that loads runs
// a short prefill and one decode step, so a config that binds but misconfigures a layer shows too.
// A custom mutator edits one field of a config that parses, as often as libFuzzer mutates bytes.
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "fuzz_support.h"
#include "lineage/core/error.h"
#include "lineage/core/parallel.h"
#include "lineage/io/load_model.h"
#include "lineage/model/archs/arch.h"
#include "lineage/model/archs/presets.h"
#include "lineage/runtime/session.h"

using namespace lineage;
namespace fs = std::filesystem;

namespace {

struct Variant {
  const char* config;              // the valid config.json; the seeds are these (fuzz/corpus/fuzz_config/)
  std::set<std::string> present;   // names the builder's has_tensor answers yes to (prefix, separate head)
  DType dtype;
};

// Eight variants: bits 0-2 of the first byte ("0".."7" in the seeds).
const Variant kVariants[8] = {
    {R"({"model_type": "gpt2", "vocab_size": 40, "n_positions": 16, "n_embd": 8, "n_layer": 2, "n_head": 2,
 "layer_norm_epsilon": 1e-05, "activation_function": "gelu_new", "bos_token_id": 0, "eos_token_id": 0})",
     {}, DType::F32},
    {R"({"model_type": "gpt2", "vocab_size": 40, "n_positions": 16, "n_embd": 8, "n_layer": 1, "n_head": 4,
 "n_inner": 24, "activation_function": "gelu", "scale_attn_weights": false})",
     {"transformer.wte.weight", "lm_head.weight"}, DType::BF16},
    {R"({"model_type": "linear_attn", "vocab_size": 40, "hidden_size": 8, "num_hidden_layers": 2, "num_heads": 2,
 "intermediate_size": 16, "norm_eps": 1e-06})",
     {}, DType::F32},
    {R"({"model_type": "linear_attn", "vocab_size": 40, "hidden_size": 8, "num_hidden_layers": 1, "num_heads": 2,
 "feature_map": "elu", "norm_feature_map": true, "norm_q": true, "norm_k": true, "tie_word_embeddings": true,
 "hidden_ratio": 2})",
     {}, DType::F16},
    {R"({"model_type": "delta_net", "vocab_size": 40, "hidden_size": 8, "num_hidden_layers": 2, "num_heads": 2,
 "intermediate_size": 16, "use_gate": true, "conv_size": 3, "qk_norm": "l2", "use_beta": true})",
     {}, DType::F32},
    {R"({"model_type": "gated_deltanet", "vocab_size": 40, "hidden_size": 8, "num_hidden_layers": 2, "num_heads": 2,
 "num_v_heads": 4, "head_dim": 4, "expand_v": 2, "intermediate_size": 16, "allow_neg_eigval": true})",
     {}, DType::F32},
    {R"({"model_type": "gated_deltanet", "vocab_size": 40, "hidden_size": 8, "num_hidden_layers": 1, "num_heads": 2,
 "head_dim": 4, "expand_v": 1, "intermediate_size": 16, "lineage_delta_rule": false, "use_short_conv": false,
 "tie_word_embeddings": true})",
     {}, DType::BF16},
    {R"({"model_type": "kda", "vocab_size": 40, "hidden_size": 8, "num_hidden_layers": 2, "num_heads": 2,
 "head_dim": 4, "expand_v": 1, "intermediate_size": 16, "bos_token_id": 1, "eos_token_id": 2})",
     {}, DType::F32},
};

fs::path variant_dir(size_t i) { return fuzz::scratch_dir() / ("variant" + std::to_string(i)); }

// The checkpoint of a variant: its family's skeleton with seeded weights, as the family names them.
void write_checkpoint(size_t i) {
  const Variant& v = kVariants[i];
  const nlohmann::json cfg = nlohmann::json::parse(v.config);
  const model::ArchBuilder* build = model::find_arch(cfg.at("model_type").get<std::string>());
  if (!build) fuzz::violated(cat("variant ", i, ": unknown model_type"));
  model::Model m = (*build)({model::ConfigFields(cfg, "variant"), [&](const std::string& n) { return v.present.count(n) > 0; }});
  model::init_random(m, 1 + i, v.dtype);
  std::vector<std::pair<std::string, Tensor>> tensors;
  m.for_each_tensor([&](const std::string& name, Tensor& t, const Shape&, layers::Init) { tensors.emplace_back(name, t); });
  const fs::path dir = variant_dir(i);
  fs::create_directories(dir);
  fuzz::write_safetensors(dir / "model.safetensors", tensors);
}

void run(const fs::path& dir, io::WeightStorage storage) {
  const io::LoadedModel loaded = io::load_model(dir, false, storage);
  runtime::Session session(loaded.model);
  const int32_t tokens[] = {1, 2, 3, 5, 7};
  (void)session.prefill(tokens);
  (void)session.decode(11);
}

// Structure-aware mutations: most byte-level mutations of JSON only break its syntax, so half of the
// time one field of a config that parses is set to a value from this list (or removed), or the
// variant byte changes; otherwise libFuzzer mutates the bytes.
const char* const kKeys[] = {
    "model_type", "vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "layer_norm_epsilon",
    "activation_function", "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "bos_token_id", "eos_token_id",
    "hidden_size", "num_hidden_layers", "num_heads", "num_kv_heads", "num_v_heads", "head_dim", "expand_k", "expand_v",
    "intermediate_size", "hidden_ratio", "norm_eps", "tie_word_embeddings", "feature_map", "norm_feature_map",
    "norm_q", "norm_k", "tie_feature_map_qk", "elementwise_affine", "use_short_conv", "conv_size", "qk_activation",
    "qk_norm", "use_beta", "use_gate", "allow_neg_eigval", "lineage_delta_rule", "attn", "hidden_act", "lower_bound",
    "safe_gate", "attnres_block_size"};
const char* const kValues[] = {
    "0", "1", "2", "3", "4", "5", "8", "16", "24", "40", "-1", "2147483648", "4294967297", "9223372036854775807",
    "18446744073709551615", "1e308", "-1e308", "1e-45", "0.5", "1.5", "2.0", "0.0", "-0.0", "true", "false", "null",
    "\"\"", "\"gpt2\"", "\"kda\"", "\"linear_attn\"", "\"delta_net\"", "\"gated_deltanet\"", "\"swish\"",
    "\"silu\"", "\"elu\"", "\"relu\"", "\"identity\"", "\"elementwise_product\"", "\"gelu\"", "\"l2\"",
    "\"sum\"", "[]", "{}", "[1, 2]", "{\"a\": 1}"};

size_t mutate_config(uint8_t* data, size_t size, size_t max_size, std::minstd_rand& rng) {
  nlohmann::json j = nlohmann::json::parse(data + 1, data + size, nullptr, false);
  if (!j.is_object()) return 0;
  const unsigned what = rng() % 8;
  if (what == 0) {
    data[0] = uint8_t(rng());
    return size;
  }
  const std::string key = kKeys[rng() % std::size(kKeys)];
  if (what == 1) j.erase(key);
  else j[key] = nlohmann::json::parse(kValues[rng() % std::size(kValues)]);
  const std::string out = j.dump();
  if (out.size() + 1 > max_size) return 0;
  std::memcpy(data + 1, out.data(), out.size());
  return out.size() + 1;
}

}  // namespace

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  std::minstd_rand rng(seed);
  if (size > 1 && rng() % 2) {
    if (const size_t n = mutate_config(data, size, max_size, rng)) return n;
  }
  return LLVMFuzzerMutate(data, size, max_size);
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  set_num_threads(1);
  for (size_t i = 0; i < 8; ++i) {
    write_checkpoint(i);
    // The harness's own check: each variant's config loads and runs on its checkpoint.
    fuzz::write_file(variant_dir(i) / "config.json", kVariants[i].config);
    try {
      run(variant_dir(i), io::WeightStorage::Mapped);
    } catch (const Error& e) {
      fuzz::violated(cat("variant ", i, " does not load: ", e.what()));
    }
  }
  // LINEAGE_FUZZ_WRITE_SEEDS=<dir>: write the valid seeds ("<variant digit><config.json>") and stop.
  if (const char* out = std::getenv("LINEAGE_FUZZ_WRITE_SEEDS")) {
    for (size_t i = 0; i < 8; ++i)
      fuzz::write_file(fs::path(out) / ("variant" + std::to_string(i) + ".json"), std::to_string(i) + kVariants[i].config + "\n");
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const fs::path dir = variant_dir(data[0] & 7);
  fuzz::write_file(dir / "config.json", data + 1, size - 1);
  try {
    run(dir, data[0] & 8 ? io::WeightStorage::Owned : io::WeightStorage::Mapped);
  } catch (const Error& e) {
    fuzz::rejected(e);
  }
  return 0;
}
