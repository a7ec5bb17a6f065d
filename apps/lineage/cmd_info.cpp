// lineage info: architecture, layer table, parameters, weight bytes and state cost.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common.h"
#include "lineage/io/load_model.h"
#include "lineage/kernels/linear.h"
#include "lineage/model/archs/presets.h"
#include "lineage/model/model.h"

namespace lineage::app {

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
  add_bf16_options(*cmd, o.src);
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
      int64_t params = 0;
      b.for_each_tensor(
          "", [&](const std::string&, Tensor&, const Shape& s, layers::Init) { params += shape_numel(s); });
      const auto cost = std::visit([](const auto& x) { return std::pair(x.state_bytes_per_token(), x.state_bytes_fixed()); }, b.mixer);
      layers.push_back({{"index", i},
                        {"mixer", std::visit([](const auto& x) { return x.describe(); }, b.mixer)},
                        {"ffn", std::visit([](const auto& x) { return x.describe(); }, b.ffn)},
                        {"params", params},
                        {"state_bytes_per_token", cost.first},
                        {"state_bytes_fixed", cost.second}});
    }
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
                                {"kernels", {{"isa", kt.isa}, {"gemm", gemm}, {"bf16_dot_available", kt.bf16_dot}}},
                                {"state_bytes_per_token", sc.per_token},
                                {"state_bytes_fixed", sc.fixed},
                                {"context", context},
                                {"state_bytes_at_context", state_total},
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
    for (const auto& [dt, bytes] : pc.bytes_by_dtype)
      std::printf("weights %-6s %s\n", std::string(dtype_name(dt)).c_str(), format_bytes(double(bytes)).c_str());
    std::printf("weights in     %s\n", storage);
    if (bf16) std::printf("bf16 weights   multiplied with %s\n", bf16_products_label(m).c_str());
    std::printf("kernels        %s GEMV, %s GEMM, bf16 dot products %s (LINEAGE_ISA=avx2|scalar narrows)\n", kt.isa,
                gemm.c_str(), kt.bf16_dot ? "available" : "unavailable");
    std::printf("state          %s per token + %s fixed per sequence; %s at %lld tokens\n",
                format_bytes(double(sc.per_token)).c_str(), format_bytes(double(sc.fixed)).c_str(),
                format_bytes(double(state_total)).c_str(), (long long)context);
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
