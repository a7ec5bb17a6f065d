// lineage info: architecture, layer table, parameters, weight bytes and state cost.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <unordered_map>
#include <nlohmann/json.hpp>

#include "common.h"
#include "lineage/io/load_model.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/matrix.h"
#include "lineage/layers/common.h"
#include "lineage/model/archs/presets.h"
#include "lineage/model/model.h"
#include "lineage/model/residual.h"
#include "lineage/model/accounting.h"

namespace lineage::app {

namespace {

// /proc/meminfo's field in bytes (0 when unreadable).
double meminfo_bytes(const std::string& field) {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == field + ":") return kib * 1024.0;
  return 0;
}

// Where a model's memory goes at a context of N tokens, against this machine's RAM: the weights,
// every sequence's state, prefill's transient AttnRes sources, and when it does not all fit, how
// many bytes a decoded token must read from disk, with the weights other than the routed experts
// and the state resident and the rest of RAM caching experts (uniform routing: a token reads k of
// E experts of each MoE layer, the cached share of them from memory).
struct MemoryPlan {
  double ram = 0, weights = 0, routed = 0, routed_per_token = 0, state = 0, attn_res_per_token = 0;
  double stream_per_token = 0;
  bool fits = false, resident_fits = false;
};

MemoryPlan memory_plan(model::Model& m, const model::ParamCount& pc, size_t state_bytes, DType unallocated) {
  MemoryPlan p;
  p.ram = meminfo_bytes("MemAvailable");
  for (const auto& [dt, bytes] : pc.bytes_by_dtype) p.weights += double(bytes);
  std::unordered_map<const Tensor*, double> stored;  // every tensor's bytes as stored
  model::for_each_stored(m, unallocated, [&](const model::StoredTensor& s) { stored[&s.t] = double(s.bytes()); });
  for (auto& b : m.blocks) {
    const auto* moe = std::get_if<layers::Moe>(&b.ffn);
    if (!moe) continue;
    double bytes = 0;
    for (const auto& e : moe->weights.experts)
      for (const kernels::Matrix* w : {&e.weights.gate_proj, &e.weights.up_proj, &e.weights.down_proj})
        for (const Tensor* t : {&w->data, &w->scales, &w->zero_point, &w->global_scale, &w->weight_shape})
          if (stored.count(t)) bytes += stored.at(t);
    p.routed += bytes;
    p.routed_per_token += bytes * double(moe->config.top_k) / double(moe->config.n_experts);
  }
  p.state = double(state_bytes);
  if (m.config.residual == model::ResidualKind::BlockAttention)  // every finished block + the partial + the mix
    p.attn_res_per_token = double((2 * m.n_layers() + m.config.attn_res_block - 1) / m.config.attn_res_block + 2) *
                           double(m.config.d_model) * sizeof(float);
  p.fits = p.weights + p.state <= p.ram;
  const double resident = p.weights - p.routed + p.state;
  p.resident_fits = resident <= p.ram;
  if (!p.fits) {
    const double cached = p.routed > 0 ? std::clamp((p.ram - resident) / p.routed, 0.0, 1.0) : 0.0;
    p.stream_per_token = p.resident_fits ? p.routed_per_token * (1.0 - cached) : resident - p.ram + p.routed_per_token;
  }
  return p;
}

}  // namespace

void add_info(CLI::App& app) {
  struct Opts {
    ModelSource src;
    int64_t context = 0;
    bool json = false;
  };
  static Opts o;
  auto* cmd = app.add_subcommand("info", "architecture, layers, parameters and memory of a model");
  add_model_options(*cmd, o.src, true);
  add_threads_option(*cmd);
  add_numerics_options(*cmd, o.src);
  cmd->add_option("--context", o.context, "also report the state bytes after N tokens")->check(CLI::PositiveNumber);
  cmd->add_flag("--json", o.json, "print one JSON object");
  cmd->callback([] {
    // A preset's numbers follow from its shapes: no need to draw its random weights. So do those of
    // a directory that holds only config.json (a published config, weights not downloaded): counted
    // at the config's dtype.
    io::LoadedModel lm;
    DType unallocated = *dtype_from_user(o.src.weights_dtype);
    const bool config_only = o.src.preset.empty() && !o.src.dir.empty() && !io::has_weights(o.src.dir);
    if (config_only) {
      io::Skeleton s = io::load_skeleton(o.src.dir);
      lm.model = std::move(s.model);
      if (s.dtype) unallocated = *s.dtype;
      apply_options(o.src, lm.model);
    } else if (o.src.preset.empty()) {
      lm = load(o.src, false);
    } else {
      lm.model = model::preset_skeleton(o.src.preset), apply_options(o.src, lm.model);
    }
    model::Model& m = lm.model;
    const model::ParamCount pc = model::count_params(m, unallocated);
    const model::StateCost sc = model::state_cost(m);
    const int64_t context = o.context ? o.context : (m.config.max_positions ? m.config.max_positions : 4096);
    const size_t state_total = sc.fixed + sc.per_token * size_t(context);
    // Where a checkpoint's weights live (a preset's are drawn into owned memory when it runs).
    const char* storage = !o.src.preset.empty() ? "owned (preset, drawn when it runs)"
                          : config_only         ? "not present (counted from config.json at its dtype)"
                          : weights_mapped(m)   ? "mapped from the files (huge pages advised; --no-mmap copies them)"
                                                : "owned copy (2 MiB-aligned, huge pages advised; --no-mmap)";
    nlohmann::json layers = nlohmann::json::array();
    for (size_t i = 0; i < m.blocks.size(); ++i) {
      auto& b = m.blocks[i];
      int64_t params = 0;  // the values a matrix holds, whatever its stored format
      model::for_each_stored([&](const layers::TensorVisitor& v) { b.for_each_tensor("", v); }, unallocated,
                             [&](const model::StoredTensor& t) { params += t.params; });
      const auto cost = std::visit([](const auto& x) { return std::pair(x.state_bytes_per_token(), x.state_bytes_fixed()); }, b.mixer);
      layers.push_back({{"index", i},
                        {"mixer", std::visit([](const auto& x) { return x.describe(); }, b.mixer)},
                        {"ffn", std::visit([](const auto& x) { return x.describe(); }, b.ffn)},
                        {"params", params},
                        {"state_bytes_per_token", cost.first},
                        {"state_bytes_fixed", cost.second}});
    }
    const MemoryPlan plan = memory_plan(m, pc, state_total, unallocated);
    const bool bf16 = has_bf16_weights(pc);
    const kernels::KernelTable kt = kernels::kernel_table();
    const std::string gemm = kt.own_gemm ? "lineage AVX-512 tile" : "OpenBLAS";
    nlohmann::json by_dtype = nlohmann::json::object();
    for (const auto& [dt, bytes] : pc.bytes_by_dtype) by_dtype[std::string(dtype_name(dt))] = bytes;
    if (o.json) {
      const nlohmann::json j = {{"model_type", m.config.model_type},
                                {"description", m.config.description},
                                {"n_layers", m.n_layers()},
                                {"vocab_size", m.config.vocab_size},
                                {"d_model", m.config.d_model},
                                {"max_positions", m.config.max_positions},
                                {"params_total", pc.total},
                                {"params_active", pc.activated},
                                {"params_active_without_embedding", pc.activated - pc.embedding},
                                {"params_active_without_embedding_and_head", pc.activated - pc.embedding - pc.head},
                                {"weight_bytes_by_dtype", by_dtype},
                                {"weights_mapped", o.src.preset.empty() && !config_only && weights_mapped(m)},
                                {"bf16_dot", bf16 && bf16_dot(m)},
                                {"quantization", m.config.quantization},
                                {"quantization_unused", m.config.quantization_unused},
                                {"kernels", {{"isa", kt.isa}, {"gemm", gemm}, {"bf16_dot_available", kt.bf16_dot}}},
                                {"state_bytes_per_token", sc.per_token},
                                {"state_bytes_fixed", sc.fixed},
                                {"context", context},
                                {"state_bytes_at_context", state_total},
                                {"extra_params", m.config.extra_params},
                                {"extra_params_label", m.config.extra_params_label},
                                {"memory_plan",
                                 {{"ram_available_bytes", plan.ram},
                                  {"weight_bytes", plan.weights},
                                  {"routed_expert_bytes", plan.routed},
                                  {"routed_expert_bytes_per_token", plan.routed_per_token},
                                  {"state_bytes", plan.state},
                                  {"attn_res_prefill_bytes_per_token", plan.attn_res_per_token},
                                  {"fits", plan.fits},
                                  {"stream_bytes_per_token", plan.stream_per_token}}},
                                {"layers", layers}};
      std::printf("%s\n", j.dump(2).c_str());
      return;
    }
    std::printf("model_type     %s\n", m.config.model_type.c_str());
    std::printf("architecture   %s\n", m.config.description.c_str());
    std::printf("vocab / width  %lld / %lld\n", (long long)m.config.vocab_size, (long long)m.config.d_model);
    std::printf("context limit  %s\n", m.config.max_positions ? std::to_string(m.config.max_positions).c_str() : "none");
    std::printf("parameters     %lld total, %lld active per token", (long long)pc.total, (long long)pc.activated);
    if (pc.activated != pc.total)  // the vendors' other two conventions
      std::printf(" (%lld without the input embedding, %lld without it and the head)",
                  (long long)(pc.activated - pc.embedding), (long long)(pc.activated - pc.embedding - pc.head));
    std::printf("\n");
    if (m.config.extra_params)
      std::printf("also stored    %lld parameters: %s, not in the total\n", (long long)m.config.extra_params,
                  m.config.extra_params_label.c_str());
    for (const auto& [dt, bytes] : pc.bytes_by_dtype)
      std::printf("weights %-6s %s\n", std::string(dtype_name(dt)).c_str(), format_bytes(double(bytes)).c_str());
    if (!m.config.quantization.empty()) {
      std::printf("quantization   %s\n", m.config.quantization.c_str());
      for (const std::string& u : m.config.quantization_unused) std::printf("  not used     %s\n", u.c_str());
      std::printf("               every quantized weight decoded exactly ((code - zero) x scale) for f32 products\n");
    }
    std::printf("weights in     %s\n", storage);
    if (bf16) std::printf("bf16 weights   multiplied with %s\n", bf16_products_label(m).c_str());
    std::printf("kernels        %s GEMV, %s GEMM, bf16 dot products %s (LINEAGE_ISA=avx2|scalar narrows)\n", kt.isa,
                gemm.c_str(), kt.bf16_dot ? "available" : "unavailable");
    std::printf("state          %s per token + %s fixed per sequence; %s at %lld tokens\n",
                format_bytes(double(sc.per_token)).c_str(), format_bytes(double(sc.fixed)).c_str(),
                format_bytes(double(state_total)).c_str(), (long long)context);
    if (plan.attn_res_per_token > 0)
      std::printf("AttnRes        no state; a prefill holds %s per token of block sources while it runs\n",
                  format_bytes(plan.attn_res_per_token).c_str());
    std::printf("memory plan    weights %s + state %s at %lld tokens, %s available: ", format_bytes(plan.weights).c_str(),
                format_bytes(plan.state).c_str(), (long long)context, format_bytes(plan.ram).c_str());
    if (plan.fits) std::printf("fits in RAM\n");
    else if (plan.resident_fits)
      std::printf("does not fit; with all but the routed experts resident, %s per token stream from disk (of %s of "
                  "experts a token reads)\n", format_bytes(plan.stream_per_token).c_str(),
                  format_bytes(plan.routed_per_token).c_str());
    else
      std::printf("does not fit, not even without the routed experts; at least %s per token stream from disk\n",
                  format_bytes(plan.stream_per_token).c_str());
    std::printf("\n%5s  %-44s  %-34s  %12s  %12s  %12s\n", "layer", "token mixer", "channel mixer", "params",
                "state/token", "state fixed");
    for (const auto& l : layers)
      std::printf("%5d  %-44s  %-34s  %12lld  %12s  %12s\n", l["index"].get<int>(),
                  l["mixer"].get<std::string>().c_str(), l["ffn"].get<std::string>().c_str(),
                  (long long)l["params"].get<int64_t>(),
                  format_bytes(double(l["state_bytes_per_token"].get<size_t>())).c_str(),
                  format_bytes(double(l["state_bytes_fixed"].get<size_t>())).c_str());
  });
}

}  // namespace lineage::app
