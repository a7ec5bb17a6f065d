#include "batch_check.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <vector>

#include "lineage/core/rng.h"
#include "lineage/kernels/linear.h"
#include "lineage/model/archs/arch.h"
#include "lineage/model/archs/presets.h"
#include "lineage/model/forward.h"
#include "lineage/model/state_pool.h"
#include "lineage/model/workspace.h"
#include "test_support.h"

namespace lineage::test {

model::Model tiny_preset(const std::string& name, uint64_t seed) {
  for (const auto& p : model::presets()) {
    if (p.name != name) continue;
    nlohmann::json j = nlohmann::json::parse(p.config_json);
    const bool gpt2 = j["model_type"] == "gpt2";
    const nlohmann::json tiny =
        gpt2 ? nlohmann::json{{"vocab_size", 300}, {"n_positions", 64}, {"n_embd", 64}, {"n_layer", 2}, {"n_head", 2},
                              {"bos_token_id", 1}, {"eos_token_id", 2}}
             : nlohmann::json{{"vocab_size", 300}, {"hidden_size", 64}, {"num_hidden_layers", 2}, {"num_heads", 2},
                              {"intermediate_size", 128}, {"bos_token_id", 1}, {"eos_token_id", 2}};
    j.update(tiny);
    if (j.contains("head_dim")) j["head_dim"] = 32;
    if (j["model_type"] == "kimi_linear")  // KDA, MLA, KDA at width 64: MoE with a shared expert after the dense first layer
      j.update({{"num_hidden_layers", 3},
                {"linear_attn_config",
                 {{"kda_layers", {1, 3}}, {"full_attn_layers", {2}}, {"num_heads", 2}, {"head_dim", 32},
                  {"short_conv_kernel_size", 4}}},
                {"num_attention_heads", 2},
                {"num_key_value_heads", 2},
                {"kv_lora_rank", 32},
                {"qk_nope_head_dim", 16},
                {"qk_rope_head_dim", 8},
                {"v_head_dim", 16},
                {"num_experts", 4},
                {"num_experts_per_token", 2},
                {"moe_intermediate_size", 32}});
    if (j.contains("attn_res_block_size"))  // K3's fields: KDA, MLA, MLA; q-LoRA, latent experts, AttnRes blocks of 2
      j.update({{"linear_attn_config",
                 {{"kda_layers", {1}}, {"full_attn_layers", {2, 3}}, {"num_heads", 2}, {"head_dim", 32},
                  {"short_conv_kernel_size", 4}, {"gate_lower_bound", -5.0}, {"use_full_rank_gate", true}}},
                {"q_lora_rank", 24},
                {"routed_expert_hidden_size", 32},
                {"attn_res_block_size", 2}});
    if (j["model_type"] == "qwen3_next")  // GDN, attention (GQA 4 / 2, RoPE on 4 of 16 dims); MoE 4 top-2 + gated shared
      j.update({{"full_attention_interval", 2},
                {"num_attention_heads", 4},
                {"num_key_value_heads", 2},
                {"head_dim", 16},
                {"linear_num_key_heads", 2},
                {"linear_num_value_heads", 4},
                {"linear_key_head_dim", 16},
                {"linear_value_head_dim", 16},
                {"num_experts", 4},
                {"moe_intermediate_size", 32},
                {"shared_expert_intermediate_size", 32}});
    const model::ArchBuilder* build = model::find_arch(j["model_type"]);
    model::Model m = (*build)({model::ConfigFields(j, "tiny " + name), [](const std::string&) { return false; }});
    model::init_random(m, seed, DType::F32);
    model::prepare(m, true);  // owned, as make_preset's
    return m;
  }
  ADD_FAILURE() << "no preset " << name;
  return {};
}

namespace {

struct Seq {
  std::vector<int32_t> prompt, cont;  // the prompt, then the tokens fed one a step
  int join = 0;                       // the step it joins in
};

std::vector<Seq> make_seqs(const model::Model& m, int B, uint64_t seed) {
  std::vector<Seq> seqs(static_cast<size_t>(B));
  for (int b = 0; b < B; ++b) {
    Rng rng(seed * 1000 + uint64_t(b));
    Seq& s = seqs[size_t(b)];
    s.prompt.resize(size_t(1 + (7 * b + 3) % 11));
    s.cont.resize(size_t(2 + (5 * b) % 6));
    for (auto* v : {&s.prompt, &s.cont})
      for (int32_t& t : *v) t = int32_t(rng.uniform() * double(m.config.vocab_size - 1));
    s.join = (b % 3) * 2;
  }
  return seqs;
}

using Logits = std::vector<std::vector<std::vector<float>>>;  // [sequence][position][V]

// Each sequence alone: its prompt as one step, then one step per token.
Logits run_alone(const model::Model& m, const std::vector<Seq>& seqs) {
  const int64_t V = m.config.vocab_size;
  Logits out(seqs.size());
  model::StatePool pool(m);
  model::Workspace ws;
  layers::Step step;
  std::vector<float> logits;
  for (size_t b = 0; b < seqs.size(); ++b) {
    const int32_t slot = pool.acquire();
    const auto run = [&](std::span<const int32_t> toks) {
      step.clear();
      step.add(slot, pool.position(slot), toks);
      logits.resize(toks.size() * size_t(V));
      model::forward(m, step, pool, model::LogitRows::All, logits.data(), ws);
      out[b].emplace_back(logits.end() - V, logits.end());
    };
    run(seqs[b].prompt);
    for (const int32_t t : seqs[b].cont) run({&t, 1});
    pool.release(slot);
  }
  return out;
}

// All sequences through one pool: joining, decoding together, leaving.
Logits run_batched(const model::Model& m, const std::vector<Seq>& seqs) {
  const int64_t V = m.config.vocab_size;
  const size_t B = seqs.size();
  Logits out(B);
  model::StatePool pool(m);
  model::Workspace ws;
  layers::Step step;
  std::vector<float> logits;
  std::vector<int32_t> slot(B, -1);
  std::vector<size_t> fed(B, 0), order;  // cont tokens fed so far; the sequence of each step row
  size_t done = 0;
  for (int round = 0; done < B; ++round) {
    step.clear();
    order.clear();
    for (size_t b = 0; b < B; ++b) {
      const Seq& s = seqs[b];
      if (slot[b] < 0 && fed[b] == 0 && s.join == round) {
        slot[b] = pool.acquire();
        step.add(slot[b], 0, s.prompt);
        order.push_back(b);
      } else if (slot[b] >= 0) {
        step.add(slot[b], pool.position(slot[b]), {&s.cont[fed[b]], 1});
        ++fed[b];
        order.push_back(b);
      }
    }
    if (order.empty()) continue;
    logits.resize(size_t(step.n_tokens() * V));
    model::forward(m, step, pool, model::LogitRows::All, logits.data(), ws);
    for (size_t r = 0; r < order.size(); ++r) {
      const size_t b = order[r];
      const int64_t last = step.begin(int64_t(r)) + step.length(int64_t(r)) - 1;
      out[b].emplace_back(logits.begin() + last * V, logits.begin() + (last + 1) * V);
      if (fed[b] == seqs[b].cont.size()) {  // leaves: its slot goes to a later sequence
        pool.release(slot[b]);
        slot[b] = -1;
        fed[b] = SIZE_MAX / 2;
        ++done;
      }
    }
  }
  return out;
}

}  // namespace

double expect_batched_equals_alone(const model::Model& m, int B, double tol, uint64_t seed) {
  const std::vector<Seq> seqs = make_seqs(m, B, seed);
  const Logits alone = run_alone(m, seqs), batched = run_batched(m, seqs), again = run_batched(m, seqs);
  double worst = 0;
  for (size_t b = 0; b < seqs.size(); ++b) {
    EXPECT_EQ(batched[b].size(), 1 + seqs[b].cont.size()) << "sequence " << b;
    EXPECT_EQ(again[b], batched[b]) << "sequence " << b << ": a second batched run differs";
    for (size_t i = 0; i < std::min(batched[b].size(), alone[b].size()); ++i) {
      const auto& got = batched[b][i];
      const auto& want = alone[b][i];
      if (B == 1) {
        EXPECT_EQ(got, want) << "one sequence: position " << i;
      }
      const double e = rel_rms(got.data(), want.data(), int64_t(want.size()));
      worst = std::max(worst, e);
      EXPECT_LE(e, tol) << "B " << B << ", sequence " << b << " (prompt " << seqs[b].prompt.size() << ", joins at step "
                        << seqs[b].join << "), logits after " << seqs[b].prompt.size() + i << " tokens";
    }
  }
  return worst;
}

void expect_decode_together_bitwise(const model::Model& m, int B, uint64_t seed) {
  const std::vector<Seq> seqs = make_seqs(m, B, seed);
  const int64_t V = m.config.vocab_size;
  model::StatePool pool(m);
  model::Workspace ws;
  layers::Step step;
  std::vector<float> logits;
  std::vector<int32_t> slot;
  for (const Seq& s : seqs) {  // each prompt alone
    slot.push_back(pool.acquire());
    step.clear();
    step.add(slot.back(), 0, s.prompt);
    logits.resize(s.prompt.size() * size_t(V));
    model::forward(m, step, pool, model::LogitRows::All, logits.data(), ws);
  }
  const Logits alone = run_alone(m, seqs);
  for (size_t i = 0; i < 2; ++i) {  // the first two continuation tokens of all sequences together
    step.clear();
    for (size_t b = 0; b < seqs.size(); ++b) step.add(slot[b], pool.position(slot[b]), {&seqs[b].cont[i], 1});
    logits.resize(seqs.size() * size_t(V));
    model::forward(m, step, pool, model::LogitRows::Last, logits.data(), ws);
    for (size_t b = 0; b < seqs.size(); ++b) {
      const std::vector<float> got(logits.begin() + int64_t(b) * V, logits.begin() + int64_t(b + 1) * V);
      EXPECT_EQ(got, alone[b][i + 1]) << B << " sequences decoding together: sequence " << b << ", token " << i;
    }
  }
}

}  // namespace lineage::test
