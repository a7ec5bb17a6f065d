#include "lineage/study/recall.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "lineage/core/error.h"
#include "lineage/core/rng.h"
#include "lineage/io/safetensors.h"
#include "lineage/model/binding.h"
#include "lineage/model/accounting.h"
#include "lineage/model/archs/arch.h"
#include "lineage/model/archs/presets.h"
#include "lineage/train/adamw.h"
#include "lineage/train/backprop.h"

namespace lineage::study {

namespace {

// Each row of the lineage at width d: the config.json that computes it (fla's field names for the
// delta-rule family, GPT-2's for softmax attention, Kimi Linear's and Qwen3.5's for the hybrids).
std::vector<std::pair<std::string, nlohmann::json>> arch_configs(const RecallConfig& c, int64_t positions) {
  const int64_t vocab = 1 + c.keys + c.values, hd = c.d_model / c.heads;
  const auto fla = [&](const std::string& type, nlohmann::json extra) {
    nlohmann::json j = {{"model_type", type},         {"vocab_size", vocab},     {"hidden_size", c.d_model},
                        {"num_hidden_layers", c.layers}, {"num_heads", c.heads},  {"intermediate_size", 4 * c.d_model},
                        {"norm_eps", 1e-6},           {"tie_word_embeddings", true}};
    if (extra.is_object()) j.update(extra);
    return j;
  };
  nlohmann::json hybrid;
  for (const model::Preset& p : model::presets())
    if (p.name == "kimi-linear") hybrid = nlohmann::json::parse(p.config_json);
  hybrid.erase("bos_token_id"), hybrid.erase("eos_token_id"), hybrid.erase("pad_token_id");
  hybrid.update({{"vocab_size", vocab}, {"hidden_size", c.d_model}, {"num_hidden_layers", 4},
                 {"num_attention_heads", c.heads}, {"num_key_value_heads", c.heads}, {"intermediate_size", 4 * c.d_model},
                 {"first_k_dense_replace", 4}, {"kv_lora_rank", c.d_model}, {"qk_nope_head_dim", hd},
                 {"qk_rope_head_dim", hd / 2}, {"v_head_dim", hd}});
  hybrid["linear_attn_config"].update({{"kda_layers", {1, 2, 3}}, {"full_attn_layers", {4}}, {"num_heads", c.heads},
                                       {"head_dim", hd}});
  // Qwen3.5 (dense) at this width: three Gated DeltaNet layers to one gated attention layer, as
  // published (zero-centred norms, q/k norms, a quarter of each head rotated, θ 1e7, the output gate),
  // key and value heads as the other rows, the attention's KV heads half its query heads (GQA).
  const nlohmann::json qwen35 = {
      {"model_type", "qwen3_5"}, {"vocab_size", vocab}, {"hidden_size", c.d_model}, {"num_hidden_layers", 4},
      {"layer_types", {"linear_attention", "linear_attention", "linear_attention", "full_attention"}},
      {"num_attention_heads", c.heads}, {"num_key_value_heads", std::max<int64_t>(1, c.heads / 2)},
      {"head_dim", hd}, {"attn_output_gate", true}, {"linear_num_key_heads", c.heads},
      {"linear_num_value_heads", c.heads}, {"linear_key_head_dim", hd}, {"linear_value_head_dim", hd},
      {"linear_conv_kernel_dim", 4}, {"intermediate_size", 4 * c.d_model}, {"hidden_act", "silu"},
      {"rms_norm_eps", 1e-6}, {"max_position_embeddings", positions}, {"tie_word_embeddings", true},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e7}, {"partial_rotary_factor", 0.25}}}};
  const auto gpt2 = [&](int64_t conv) {
    return nlohmann::json{{"model_type", "gpt2"}, {"vocab_size", vocab}, {"n_positions", positions},
                          {"n_embd", c.d_model},  {"n_layer", c.layers},   {"n_head", c.heads},
                          {"conv_size", conv}};
  };
  const nlohmann::json additive = {{"feature_map", "elu"}, {"norm_feature_map", true}};
  nlohmann::json additive_conv = additive;
  additive_conv["use_short_conv"] = true;
  // The delta-rule rows carry fla's short convolution; "+ conv" gives the softmax and additive rows
  // the same (lineage's conv_size / use_short_conv), so that the write rule is all that differs.
  std::vector<std::pair<std::string, nlohmann::json>> rows = {
      {"softmax attention", gpt2(0)},
      {"softmax attention + conv", gpt2(4)},
      {"linear attention", fla("linear_attn", additive)},
      {"linear attention + conv", fla("linear_attn", additive_conv)},
      {"DeltaNet", fla("delta_net", {})},
      {"Gated DeltaNet", fla("gated_deltanet", {{"head_dim", hd}, {"expand_v", 1.0}})},
      {"KDA", fla("kda", {{"head_dim", hd}, {"expand_v", 1.0}})},
      {"KDA/MLA 3:1 hybrid", hybrid},
      {"Qwen3.5 hybrid", qwen35},
  };
  // A row that --archs or --set names must exist.
  const auto find = [&](const std::string& option, const std::string& name) {
    const auto row = std::find_if(rows.begin(), rows.end(), [&](const auto& r) { return r.first == name; });
    if (row != rows.end()) return row;
    std::string known;
    for (const auto& r : rows) known += (known.empty() ? "" : ", ") + r.first;
    throw Error(cat(option, ": unknown row \"", name, "\"; expected one of: ", known));
  };
  for (const std::string& name : c.archs) find("--archs", name);
  for (const RecallOverride& o : c.overrides) {
    const auto row = find("--set", o.row);
    nlohmann::json value = nlohmann::json::parse(o.value, nullptr, false);
    if (value.is_discarded())
      throw Error(cat("--set ", o.row, ":", o.field, ": the value '", o.value,
                      "' is not JSON; expected e.g. false, 0.5, \"silu\" (quoted for a string)"));
    row->second[o.field] = std::move(value);
  }
  return rows;
}

model::Model build(const nlohmann::json& config, const std::string& name) {
  const std::string type = config["model_type"];
  const model::ArchBuilder* builder = model::find_arch(type);
  LINEAGE_CHECK(builder, "no builder for ", type);
  return (*builder)(model::ArchInput{model::ConfigFields(config, "study recall: " + name), [](const std::string&) { return false; }});
}

int64_t longest(const RecallConfig& c) { return 4 * *std::max_element(c.pairs.begin(), c.pairs.end()); }

}  // namespace

std::string recall_label(const RecallConfig& c, const std::string& row) {
  std::string set;
  for (const RecallOverride& o : c.overrides)
    if (o.row == row) set += (set.empty() ? "" : ", ") + o.field + "=" + o.value;
  return set.empty() ? row : row + " [" + set + "]";
}

std::vector<RecallArch> recall_archs(const RecallConfig& c) {
  std::vector<RecallArch> out;
  for (const auto& [name, config] : arch_configs(c, longest(c))) {
    const model::Model m = build(config, name);
    const std::string why = train::untrainable_reason(m);
    out.push_back({name, why.empty(), why});
  }
  return out;
}

void mqar_batch(int64_t count, int64_t pairs, int64_t keys, int64_t values, uint64_t seed, std::vector<int32_t>& inputs,
                std::vector<int32_t>& targets) {
  LINEAGE_CHECK(pairs <= keys, "MQAR needs distinct keys: ", pairs, " pairs from ", keys, " keys");
  const int64_t T = 4 * pairs;
  inputs.assign(size_t(count * T), 0);
  targets.assign(size_t(count * T), -1);
  Rng rng(seed);
  std::vector<int32_t> key(static_cast<size_t>(keys)), order(static_cast<size_t>(pairs));
  for (int64_t b = 0; b < count; ++b) {
    int32_t* in = inputs.data() + b * T;
    int32_t* tg = targets.data() + b * T;
    for (int64_t i = 0; i < keys; ++i) key[size_t(i)] = int32_t(1 + i);
    for (int64_t i = 0; i < pairs; ++i) std::swap(key[size_t(i)], key[size_t(i + int64_t(rng.next_u64() % uint64_t(keys - i)))]);
    std::vector<int32_t> value(static_cast<size_t>(pairs));
    for (int64_t i = 0; i < pairs; ++i) {
      value[size_t(i)] = int32_t(1 + keys + int64_t(rng.next_u64() % uint64_t(values)));
      in[2 * i] = key[size_t(i)], in[2 * i + 1] = value[size_t(i)];
      order[size_t(i)] = int32_t(i);
    }
    for (int64_t i = pairs - 1; i > 0; --i) std::swap(order[size_t(i)], order[size_t(rng.next_u64() % uint64_t(i + 1))]);
    // The second half: query j at position 2P + 2j (its key), the answer expected there.
    for (int64_t j = 0; j < pairs; ++j) {
      const int64_t at = 2 * pairs + 2 * j, i = order[size_t(j)];
      in[at] = key[size_t(i)];
      tg[at] = value[size_t(i)];
    }
  }
}

std::string recall_model_dir(const std::string& row, int64_t pairs) {
  std::string out;
  for (char ch : row) {
    if (std::isalnum(static_cast<unsigned char>(ch))) out += char(std::tolower(static_cast<unsigned char>(ch)));
    else if (!out.empty() && out.back() != '-') out += '-';
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return cat(out, "-p", pairs);
}

std::vector<int32_t> repeated_key_sequence(int64_t pairs, int64_t keys, int64_t values, uint64_t seed) {
  if (pairs < 2 || values < 2)
    throw Error(cat("a repeated-key sequence needs at least 2 pairs and 2 values (got ", pairs, " and ", values, ")"));
  std::vector<int32_t> in, tg;
  mqar_batch(1, pairs, keys, values, seed, in, tg);
  const int64_t last = 2 * (pairs - 1);
  const int32_t dropped = in[size_t(last)], first_value = in[1], v0 = int32_t(1 + keys);
  in[size_t(last)] = in[0];
  in[size_t(last + 1)] = v0 + int32_t((first_value - v0 + values / 2) % values);  // another value
  // The query of the key no longer written asks for the repeated one: it is asked for twice.
  for (int64_t q = 2 * pairs; q < 4 * pairs; q += 2)
    if (in[size_t(q)] == dropped) in[size_t(q)] = in[0];
  return in;
}

namespace {

void save_recall_model(const RecallConfig& c, const std::string& row, int64_t P, const nlohmann::json& config,
                       model::Model& m) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(c.save_dir) / recall_model_dir(row, P);
  fs::create_directories(dir);
  if (!(std::ofstream(dir / "config.json") << config.dump(2) << "\n"))
    throw Error(cat("study recall: cannot write ", (dir / "config.json").string()));
  std::vector<std::pair<std::string, Tensor>> params;
  m.for_each_tensor([&](const std::string& name, Tensor& t, const Shape&, layers::Init) {
    if (t.defined()) params.emplace_back(name, t);
  });
  io::save_safetensors(dir / "model.safetensors", model::stored_tensors(m.binding, params));
  const fs::path tokens_file = fs::path(c.save_dir) / cat("repeated-key-p", P, ".tokens");
  std::ofstream tokens(tokens_file);
  for (int32_t t : repeated_key_sequence(P, c.keys, c.values, ~c.seed)) tokens << t << ' ';
  tokens << '\n';
  if (!tokens.flush()) throw Error(cat("study recall: cannot write ", tokens_file.string()));
}

}  // namespace

std::vector<RecallRow> run_recall(const RecallConfig& c, const std::function<void(const RecallRow&)>& progress) {
  if (!c.save_dir.empty() && (c.values < 2 || *std::min_element(c.pairs.begin(), c.pairs.end()) < 2))
    throw Error("study recall --save-models: the repeated-key sequence written beside the models needs at least 2 "
                "pairs (--pairs) and 2 values (--values)");
  std::vector<RecallRow> rows;
  for (const auto& [name, config] : arch_configs(c, longest(c))) {
    if (!c.archs.empty() && std::find(c.archs.begin(), c.archs.end(), name) == c.archs.end()) continue;
    for (const int64_t P : c.pairs) {
      const auto t0 = std::chrono::steady_clock::now();
      model::Model m = build(config, name);
      if (!train::untrainable_reason(m).empty()) continue;
      model::init_random(m, c.seed, DType::F32);
      train::to_trainable(m);
      train::Backprop bp(m);
      std::vector<train::ParamRef> params = bp.params();
      if (c.decay_scale != 1.0) {  // A = exp(A_log) times the scale
        const float shift = float(std::log(c.decay_scale));
        for (const train::ParamRef& p : params)
          if (p.name.ends_with(".A_log")) std::for_each(p.value, p.value + p.n, [&](float& v) { v += shift; });
        bp.refresh();
      }
      train::AdamW opt(params);
      train::AdamWConfig adam;
      adam.weight_decay = 0.0;
      const int64_t T = 4 * P, batch = c.tokens_per_step > 0 ? std::max<int64_t>(1, c.tokens_per_step / T) : c.batch;
      std::vector<int32_t> inputs, targets;
      RecallRow row{recall_label(c, name), P, T, batch};
      for (int64_t s = 0; s < c.steps; ++s) {
        bp.zero_grads();
        mqar_batch(batch, P, c.keys, c.values, c.seed * 1000003 + uint64_t(s), inputs, targets);
        row.final_loss = bp.step(inputs, targets, batch, T, 1.0f / float(batch * P));
        const double norm = train::grad_norm(params);
        opt.step(params, adam, train::schedule_lr(s, c.steps, c.steps / 10, c.lr, c.lr / 10), norm > 1.0 ? float(1.0 / norm) : 1.0f);
        bp.refresh();
      }
      // Held-out sequences (another seed stream), argmax at every query position.
      mqar_batch(c.eval_sequences, P, c.keys, c.values, ~c.seed, inputs, targets);
      std::vector<int32_t> predicted;
      bp.predict(inputs, c.eval_sequences, T, predicted);
      int64_t right = 0;
      for (size_t i = 0; i < targets.size(); ++i) right += targets[i] >= 0 && predicted[i] == targets[i];
      row.accuracy = double(right) / double(c.eval_sequences * P);
      const model::StateCost cost = model::state_cost(m);
      row.state_bytes = cost.fixed + cost.per_token * size_t(T);
      row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!c.save_dir.empty()) save_recall_model(c, row.arch, P, config, m);
      rows.push_back(row);
      if (progress) progress(row);
    }
  }
  return rows;
}

}  // namespace lineage::study
