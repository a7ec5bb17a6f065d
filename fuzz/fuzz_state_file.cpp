// A state file through runtime::decode_state, for two models from config.json alone (skeletons): a
// tiny GPT-2 (KV caches) and a tiny Kimi Linear (KDA's S and conv tails, an MLA latent cache).
// The input's first bytes choose how the rest is used:
//   byte 0 % 3 = 0: the rest is the whole file;
//              1: a valid file of that model and position, patched by the rest (u16 offset, u8 value
//                 triples), its checksum recomputed when byte 0 & 0x80, so the header's and the
//                 sections' checks are reached, not only the checksum's;
//              2: a valid file whose JSON header is changed by the rest: merged into it when the
//                 rest is a JSON object (RFC 7386: {"position": 9}, {"tokens": {"offset": 1e9}}),
//                 replaced by it otherwise; lengths, padding and the checksum fixed up, so every
//                 header field, offset and size is the fuzzer's.
//   byte 1 % 2: the model; byte 2 % 5: the position of the valid file.
// Decoding may refuse with an Error; it must not crash, leak or allocate more than the file holds.
// What it accepts must have the model's shapes, and encode back to a file that decodes the same.
#include <cstring>
#include <nlohmann/json.hpp>

#include "fuzz_support.h"
#include "lineage/core/hash.h"
#include "lineage/io/load_model.h"
#include "lineage/model/state_pool.h"
#include "lineage/runtime/state_file.h"

using namespace lineage;

namespace {

constexpr const char* kConfigs[2] = {
    R"({"model_type":"gpt2","vocab_size":64,"n_positions":32,"n_embd":16,"n_layer":2,"n_head":2})",
    R"({"bos_token_id":250,"eos_token_id":252,"first_k_dense_replace":1,"head_dim":16,"hidden_act":"silu",
        "hidden_size":64,"intermediate_size":96,"kv_lora_rank":32,"linear_attn_config":{"full_attn_layers":[4],
        "head_dim":16,"kda_layers":[1,2,3],"num_heads":2,"short_conv_kernel_size":4},"mla_use_nope":true,
        "model_type":"kimi_linear","moe_intermediate_size":32,"moe_layer_freq":1,"moe_renormalize":true,
        "moe_router_activation_func":"sigmoid","num_attention_heads":4,"num_expert_group":1,"num_experts":8,
        "num_experts_per_token":2,"num_hidden_layers":4,"num_key_value_heads":4,"num_nextn_predict_layers":0,
        "num_shared_experts":1,"pad_token_id":255,"q_lora_rank":null,"qk_nope_head_dim":16,"qk_rope_head_dim":8,
        "rms_norm_eps":1e-05,"rope_scaling":null,"rope_theta":10000.0,"routed_scaling_factor":2.446,
        "tie_word_embeddings":false,"topk_group":1,"use_grouped_topk":true,"v_head_dim":16,"vocab_size":256})"};

model::Model& model_of(int which) {
  static std::vector<model::Model> models = [] {
    std::vector<model::Model> out;
    for (int i = 0; i < 2; ++i) {
      const auto dir = fuzz::scratch_dir() / cat("model", i);
      std::filesystem::create_directories(dir);
      fuzz::write_file(dir / "config.json", kConfigs[i]);
      out.push_back(std::move(io::load_skeleton(dir).model));
    }
    return out;
  }();
  return models[size_t(which)];
}

// A valid file: `position` tokens, every state array and the logits filled with made-up values.
std::string valid_file(model::Model& m, int64_t position) {
  runtime::SavedState s;
  s.state = m.new_state(position);
  model::set_length(m, s.state, position);
  s.state.position = position;
  float v = 0.25f;
  for (size_t l = 0; l < s.state.layers.size(); ++l)
    for (const model::StateArray& a : model::state_arrays(m, s.state, l))
      for (int64_t i = 0; i < a.elements(); ++i) a.data[i] = (v = v * 1.5f > 100 ? -v / 7 : v * 1.5f);
  for (int64_t i = 0; i < position; ++i) s.tokens.push_back(int32_t(i * 7 % m.config.vocab_size));
  if (position > 0) s.logits.assign(size_t(m.config.vocab_size), 0.5f);
  if (position % 2) s.rng = Rng(uint64_t(position)).snapshot();
  return runtime::encode_state(m, s);
}

void put_u64(std::string& s, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) s[at + size_t(i)] = char(v >> (8 * i));
}
uint64_t get_u64(const std::string& s, size_t at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(uint8_t(s[at + size_t(i)])) << (8 * i);
  return v;
}
void fix_checksum(std::string& s) {
  if (s.size() >= 8) put_u64(s, s.size() - 8, hash64(std::string_view(s).substr(0, s.size() - 8)));
}
size_t round64(size_t n) { return (n + 63) / 64 * 64; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const int mode = data[0] % 3;
  model::Model& m = model_of(data[1] % 2);
  const std::string_view rest(reinterpret_cast<const char*>(data) + 3, size - 3);
  std::string file;
  if (mode == 0) {
    file = rest;
  } else {
    file = valid_file(m, data[2] % 5);
    if (mode == 1) {
      for (size_t i = 0; i + 3 <= rest.size(); i += 3) {
        const size_t at = (uint8_t(rest[i]) | size_t(uint8_t(rest[i + 1])) << 8) % file.size();
        file[at] = rest[i + 2];
      }
      if (data[0] & 0x80) fix_checksum(file);
    } else {
      // 24 fixed bytes, the header, padding to 64, the payload, the checksum.
      const size_t old_header = size_t(get_u64(file, 16));
      const size_t payload_at = round64(24 + old_header);
      const std::string payload = file.substr(payload_at, file.size() - 8 - payload_at);
      std::string header(rest);
      nlohmann::json patch = nlohmann::json::parse(rest, nullptr, false);
      if (!patch.is_discarded() && patch.is_object()) {
        nlohmann::json h = nlohmann::json::parse(file.substr(24, old_header));
        h.merge_patch(patch);
        header = h.dump();
      }
      std::string out = file.substr(0, 24);
      put_u64(out, 16, header.size());
      out += header;
      out.resize(round64(out.size()), '\0');
      out += payload;
      out.resize(out.size() + 8, '\0');
      fix_checksum(out);
      file = std::move(out);
    }
  }
  std::optional<runtime::SavedState> got = fuzz::load_or_reject([&] { return runtime::decode_state(m, file, "fuzz.state"); });
  if (!got) return 0;
  const runtime::SavedState& s = *got;
  if (s.state.position < 0) fuzz::violated(cat("accepted position ", s.state.position));
  if (!s.tokens.empty() && int64_t(s.tokens.size()) != s.state.position)
    fuzz::violated(cat(s.tokens.size(), " tokens for position ", s.state.position));
  if (!s.logits.empty() && int64_t(s.logits.size()) != m.config.vocab_size)
    fuzz::violated(cat(s.logits.size(), " logits for a vocabulary of ", m.config.vocab_size));
  if (s.state.layers.size() != size_t(m.n_layers())) fuzz::violated("a state with the wrong number of layers");
  if (s.state.bytes() > file.size()) fuzz::violated(cat("a state of ", s.state.bytes(), " bytes from a file of ", file.size()));
  // What was accepted encodes to a file that decodes to the same encoding.
  const std::string again = runtime::encode_state(m, s);
  try {
    const runtime::SavedState back = runtime::decode_state(m, again, "again.state");
    if (runtime::encode_state(m, back) != again) fuzz::violated("encode → decode → encode changed the file");
  } catch (const Error& e) {
    fuzz::violated(cat("decode_state rejects what encode_state wrote: ", e.what()));
  }
  return 0;
}
