// lineage info: architecture, layer table, parameters, weight bytes and state cost.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <tuple>
#include <string>
#include <utility>
#include <variant>
#include <vector>
#include <unordered_map>
#include <unordered_set>
#include <nlohmann/json.hpp>

#include "common.h"
#include "lineage/io/gguf_model.h"
#include "lineage/io/load_model.h"
#include "lineage/io/trunk_stream.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/matrix.h"
#include "lineage/layers/common.h"
#include "lineage/model/archs/presets.h"
#include "lineage/model/model.h"
#include "lineage/model/residual.h"
#include "lineage/model/accounting.h"
#include "lineage/model/binding.h"
#include "lineage/core/error.h"

namespace lineage::app {

namespace {

// Where a model's memory goes at a context of N tokens, against this machine's RAM: the weights,
// every sequence's state, prefill's transient AttnRes sources, and when it does not all fit, how
// many bytes a decoded token must read from disk, with the weights other than the routed experts
// and the state resident and the rest of RAM caching experts (uniform routing: a token reads k of
// E experts of each MoE layer, the cached share of them from memory).
struct MemoryPlan {
  double ram = 0, weights = 0, routed = 0, routed_per_token = 0, state = 0, attn_res_per_token = 0;
  double stream_per_token = 0;
  double largest_expert = 0, minimum = 0;  // one routed expert's bytes; the smallest RAM (budget) that runs it
  bool fits = false, resident_fits = false, weights_only = false;
  // When not even the trunk fits with one expert: the trunk streamed layer by layer (io/trunk_stream.h),
  // holding at most `trunk_window` (two units: `window_units`) and reading `trunk_streamed` a token.
  bool trunk_fits = false;
  double trunk_window = 0, trunk_streamed = 0, trunk_pinned = 0;  // trunk_pinned: units held once read
  double minimum_window = 0;  // the window with none pinned (`window_units`), the minimum's
  std::string window_units;
};

// Each unit of a trunk streamed layer by layer (io/trunk_stream.h's numbering), its bytes as stored:
// the routed experts left out, the embedding counted as 0 (a step reads its rows).
std::vector<uint64_t> trunk_unit_bytes(model::Model& m, DType unallocated) {
  std::unordered_set<const Tensor*> routed;
  for (const model::Block& b : m.blocks)
    if (const auto* moe = std::get_if<layers::Moe>(&b.ffn))
      for (const auto& e : moe->weights.experts)
        for (const kernels::Matrix* w : {&e.weights.gate_proj, &e.weights.up_proj, &e.weights.down_proj})
          for (const Tensor* t : {&w->data, &w->scales, &w->zero_point, &w->global_scale, &w->weight_shape})
            routed.insert(t);
  std::unordered_map<const Tensor*, double> stored;
  model::for_each_stored(m, unallocated, [&](const model::StoredTensor& s) { stored[&s.t] = double(s.bytes()); });
  std::vector<uint64_t> out(2 * m.blocks.size() + 3, 0);
  io::for_each_trunk_tensor(m, [&](const std::string&, Tensor& t, const std::vector<size_t>& units) {
    if (routed.count(&t) || !stored.count(&t)) return;
    for (const size_t u : units) out[u] += uint64_t(stored.at(&t));
  });
  out[0] = 0;
  return out;
}

// Each layer's routed experts' bytes as stored (0 for a layer without).
std::vector<double> routed_bytes(model::Model& m, DType unallocated) {
  std::unordered_map<const Tensor*, double> stored;  // every tensor's bytes as stored
  model::for_each_stored(m, unallocated, [&](const model::StoredTensor& s) { stored[&s.t] = double(s.bytes()); });
  std::vector<double> out(m.blocks.size(), 0.0);
  for (size_t i = 0; i < m.blocks.size(); ++i) {
    const auto* moe = std::get_if<layers::Moe>(&m.blocks[i].ffn);
    if (!moe) continue;
    for (const auto& e : moe->weights.experts)
      for (const kernels::Matrix* w : {&e.weights.gate_proj, &e.weights.up_proj, &e.weights.down_proj})
        for (const Tensor* t : {&w->data, &w->scales, &w->zero_point, &w->global_scale, &w->weight_shape})
          if (stored.count(t)) out[i] += stored.at(t);
  }
  return out;
}

MemoryPlan memory_plan(const model::Model& m, double weight_bytes, const std::vector<double>& routed, size_t state_bytes,
                       double budget, bool weights_only, const std::vector<uint64_t>& trunk_units) {
  MemoryPlan p;
  p.ram = budget;
  p.weights_only = weights_only;
  p.weights = weight_bytes;
  for (size_t i = 0; i < m.blocks.size() && i < routed.size(); ++i) {
    const auto* moe = std::get_if<layers::Moe>(&m.blocks[i].ffn);
    if (!moe) continue;
    p.routed += routed[i];
    p.routed_per_token += routed[i] * double(moe->config.top_k) / double(moe->config.n_experts);
    p.largest_expert = std::max(p.largest_expert, routed[i] / double(moe->config.n_experts));
  }
  p.state = double(state_bytes);
  if (m.config.residual == model::ResidualKind::BlockAttention)  // every finished block + the partial + the mix
    p.attn_res_per_token = double((2 * m.n_layers() + m.config.attn_res_block - 1) / m.config.attn_res_block + 2) *
                           double(m.config.d_model) * sizeof(float);
  const double state = weights_only ? 0.0 : p.state;  // a --memory-budget bounds the weights; the state comes on top
  p.fits = p.weights + state <= p.ram;
  const double resident = p.weights - p.routed + state;
  p.resident_fits = resident + p.largest_expert <= p.ram;
  p.minimum = p.routed > 0 ? resident + p.largest_expert : p.weights + state;
  if (!p.fits) {
    const double cached = p.routed > 0 ? std::clamp((p.ram - resident) / p.routed, 0.0, 1.0) : 0.0;
    p.stream_per_token = p.resident_fits ? p.routed_per_token * (1.0 - cached) : resident - p.ram + p.routed_per_token;
  }
  if (!p.resident_fits && !trunk_units.empty()) {  // the trunk streamed layer by layer
    io::TrunkPlan t = io::trunk_plan(trunk_units);
    p.window_units = t.window_units, p.minimum_window = double(t.window_bytes);
    p.minimum = p.minimum_window + p.largest_expert + state;
    p.trunk_fits = p.minimum <= p.ram;
    if (p.trunk_fits) io::pin_units(t, uint64_t(p.ram - p.largest_expert - state));  // as the run plans it
    p.trunk_window = double(t.window_bytes), p.trunk_pinned = double(t.pinned_bytes);
    p.trunk_streamed = double(t.streamed_bytes);
    const double left = p.ram - p.trunk_window - p.trunk_pinned - state;
    const double cached = p.routed > 0 ? std::clamp(left / p.routed, 0.0, 1.0) : 0.0;
    if (p.trunk_fits) p.stream_per_token = p.trunk_streamed + p.routed_per_token * (1.0 - cached);
  }
  return p;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The tensors a checkpoint of m's family stores, in the model's order, as a writer of one would name
// and shape them (model::stored_tensors on shapes alone): renamed and unsqueezed, a split tensor's
// parts joined (rows: every part's rows of each group), experts a family stores stacked as one
// [E, rows, ...] tensor. A parameter the family stores fused from several tensors is an Error.
std::vector<std::tuple<std::string, DType, Shape>> stored_listing(model::Model& m, DType unallocated) {
  const model::BindingTable& b = m.binding;
  std::vector<std::tuple<std::string, DType, Shape>> out;
  std::set<std::string> seen;
  model::for_each_stored(m, unallocated, [&](const model::StoredTensor& t) {
    std::string name = t.name;
    Shape shape = t.shape;
    bool joined = false;
    for (const model::BindingTable::Fuse& f : b.fuses)
      if (ends_with(name, f.param))
        throw Error(cat("info --tensors: ", name, " is stored as several tensors joined (", f.stored.size(),
                        "); their shapes are not listed"));
    for (const model::BindingTable::Split& sp : b.splits)
      for (const auto& [suffix, rows] : sp.parts)
        if (!joined && ends_with(name, suffix)) {
          int64_t all_rows = 0;
          for (const auto& part : sp.parts) all_rows += part.second;
          name = name.substr(0, name.size() - suffix.size()) + sp.stored;
          shape[0] = all_rows * sp.groups;
          joined = true;
        }
    for (const model::BindingTable::Unstack& us : b.unstacks)
      if (const auto slot = joined || !us.stack_on_save ? std::nullopt : model::unstack_slot(us, name)) {
        int64_t rows = 0;
        for (const auto& part : us.parts) rows += part.second;
        Shape stacked = {us.slices, rows};
        stacked.insert(stacked.end(), shape.begin() + 1, shape.end());
        name = slot->stored, shape = stacked, joined = true;
      }
    if (!joined) name = model::stored_name(b, t.name), shape = model::stored_shape(b, t.name, t.shape);
    if (seen.insert(name).second) out.emplace_back(name, t.dtype, shape);
  });
  return out;
}

}  // namespace

void add_info(CLI::App& app) {
  struct Opts {
    ModelSource src;
    int64_t context = 0;
    int ranks = 0;
    bool json = false, tensors = false;
  };
  static Opts o;
  auto* cmd = app.add_subcommand("info", "architecture, layers, parameters and memory of a model");
  add_model_options(*cmd, o.src, true);
  add_threads_option(*cmd);
  add_numerics_options(*cmd, o.src);
  cmd->add_option("--context", o.context, "also report the state bytes after N tokens")->check(CLI::PositiveNumber);
  cmd->add_option("--ranks", o.ranks,
                  "also report each rank's share of the weights under `mpirun -np P` (tensor parallelism)")
      ->check(CLI::Range(1, 4096));
  cmd->add_flag("--json", o.json, "print one JSON object");
  cmd->add_flag("--tensors", o.tensors,
                "print every tensor the model reads as the checkpoint stores it instead: name, dtype, shape (a line "
                "each; with --json one array)");
  cmd->callback([] {
    // A preset's numbers follow from its shapes: no need to draw its random weights. So do those of
    // a directory that holds only config.json (a published config, weights not downloaded): counted
    // at the config's dtype.
    io::LoadedModel lm;
    DType unallocated = *dtype_from_user(o.src.weights_dtype);
    const bool config_only = o.src.preset.empty() && !o.src.dir.empty() && !io::has_weights(o.src.dir);
    // A GGUF file: its header alone (the metadata and tensor infos), its bytes as the file stores them.
    const bool gguf = o.src.preset.empty() && !o.src.dir.empty() && io::is_gguf(o.src.dir);
    std::vector<std::pair<std::string, uint64_t>> gguf_bytes;
    std::vector<double> gguf_routed;
    if (gguf) {
      io::GgufHeaderModel h = io::gguf_header_model(o.src.dir);
      lm.model = std::move(h.model);
      gguf_bytes = std::move(h.bytes_by_type);
      gguf_routed.assign(h.routed_expert_bytes.begin(), h.routed_expert_bytes.end());
      apply_options(o.src, lm.model);
    } else if (config_only) {
      io::Skeleton s = io::load_skeleton(o.src.dir);
      lm.model = std::move(s.model);
      if (s.dtype) unallocated = *s.dtype;
      apply_options(o.src, lm.model);
    } else if (o.src.preset.empty()) {
      lm = load(o.src, false, false);
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
                          : gguf                ? "the GGUF file's (counted from its header; mapped when it runs)"
                          : config_only         ? "not present (counted from config.json at its dtype)"
                          : weights_mapped(m)   ? "mapped from the files (huge pages advised; --no-mmap copies them)"
                                                : "owned copy (2 MiB-aligned, huge pages advised; --no-mmap)";
    if (o.tensors) {  // what a checkpoint of this config holds, as lineage binds it
      nlohmann::json all = nlohmann::json::array();
      for (const auto& [name, dtype, shape] : stored_listing(m, unallocated)) {
        if (o.json) all.push_back({{"name", name}, {"dtype", std::string(dtype_name(dtype))}, {"shape", shape}});
        else std::printf("%s %s %s\n", name.c_str(), std::string(dtype_name(dtype)).c_str(), shape_str(shape).c_str());
      }
      if (o.json) std::printf("%s\n", all.dump().c_str());
      return;
    }
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
    // The bytes as stored, by dtype (by ggml type for a GGUF file).
    std::vector<std::pair<std::string, double>> stored_bytes;
    for (const auto& [dt, bytes] : pc.bytes_by_dtype)
      if (!gguf) stored_bytes.emplace_back(dtype_name(dt), double(bytes));
    for (const auto& [type, bytes] : gguf_bytes) stored_bytes.emplace_back(type, double(bytes));
    double weight_bytes = 0;
    for (const auto& sb : stored_bytes) weight_bytes += sb.second;
    // Against --memory-budget (the weights' resident bytes), or what the machine has available.
    const bool budgeted = !o.src.memory_budget.empty();
    const double budget = budgeted ? double(io::parse_bytes(o.src.memory_budget, "--memory-budget"))
                                   : double(io::available_memory());
    const MemoryPlan plan =
        memory_plan(m, weight_bytes, gguf ? gguf_routed : routed_bytes(m, unallocated), state_total, budget, budgeted,
                    gguf ? std::vector<uint64_t>{} : trunk_unit_bytes(m, unallocated));
    const bool bf16 = gguf ? std::any_of(gguf_bytes.begin(), gguf_bytes.end(), [](const auto& t) { return t.first == "BF16"; })
                           : has_bf16_weights(pc);
    const kernels::KernelTable kt = kernels::kernel_table();
    const std::string gemm = kt.own_gemm ? "lineage AVX-512 tile" : "OpenBLAS";
    // Each rank's share under `mpirun -np P`: the split matrices' bytes over P (the largest share), the
    // rest whole. A GGUF file counted from its header has no matrices bound: its weights count whole.
    const auto [split_bytes, replicated_bytes] =
        gguf ? std::pair(0.0, weight_bytes) : split_and_replicated(m, unallocated, !o.src.preset.empty());
    const int P = std::max(o.ranks, 1);
    const double per_rank = replicated_bytes + std::ceil(split_bytes / P);
    nlohmann::json by_dtype = nlohmann::json::object();
    for (const auto& [type, bytes] : stored_bytes) by_dtype[type] = bytes;
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
                                {"weights_mapped", o.src.preset.empty() && !config_only && (gguf ? !o.src.no_mmap : weights_mapped(m))},
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
                                  {"budget_bytes", budgeted ? nlohmann::json(budget) : nlohmann::json()},
                                  {"minimum_budget_bytes", plan.minimum},
                                  {"trunk_streamed", !plan.resident_fits && plan.trunk_fits},
                                  {"trunk_window_bytes", plan.trunk_window},
                                  {"trunk_pinned_bytes", plan.trunk_pinned},
                                  {"stream_bytes_per_token", plan.stream_per_token}}},
                                {"ranks",
                                 {{"ranks", P},
                                  {"split_bytes", split_bytes},
                                  {"replicated_bytes", replicated_bytes},
                                  {"weight_bytes_per_rank", per_rank}}},
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
    for (const auto& [type, bytes] : stored_bytes)
      std::printf("weights %-6s %s\n", type.c_str(), format_bytes(bytes).c_str());
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
    if (budgeted)
      std::printf("memory plan    weights %s under a budget of %s (state %s at %lld tokens on top): ",
                  format_bytes(plan.weights).c_str(), format_bytes(plan.ram).c_str(), format_bytes(plan.state).c_str(),
                  (long long)context);
    else
      std::printf("memory plan    weights %s + state %s at %lld tokens, %s available: ", format_bytes(plan.weights).c_str(),
                  format_bytes(plan.state).c_str(), (long long)context, format_bytes(plan.ram).c_str());
    if (plan.fits) std::printf("fits in RAM\n");
    else if (plan.resident_fits)
      std::printf("does not fit; with all but the routed experts resident, %s per token stream from disk (of %s of "
                  "experts a token reads)\n", format_bytes(plan.stream_per_token).c_str(),
                  format_bytes(plan.routed_per_token).c_str());
    else if (plan.trunk_fits)
      std::printf("does not fit; with the trunk streamed layer by layer (%s of it held once read), %s per token stream "
                  "from disk%s\n", format_bytes(plan.trunk_pinned).c_str(), format_bytes(plan.stream_per_token).c_str(),
                  plan.routed > 0 ? cat(" (", format_bytes(plan.trunk_streamed), " of trunk, the rest experts)").c_str() : "");
    else
      std::printf("does not fit, not even with %s (the minimum is %s)\n",
                  gguf ? "one routed expert cached" : "the trunk streamed layer by layer", format_bytes(plan.minimum).c_str());
    if (!plan.fits && plan.resident_fits)
      std::printf("               experts stream from the files (--memory-budget; the minimum is %s: all but the routed "
                  "experts, and the largest one)\n", format_bytes(plan.minimum).c_str());
    if (!plan.resident_fits && plan.trunk_fits)
      std::printf("               the trunk streams from the files layer by layer (--memory-budget; the minimum is %s: "
                  "%s held at once, %s, one running and one read ahead%s)\n",
                  format_bytes(plan.minimum).c_str(), format_bytes(plan.minimum_window).c_str(), plan.window_units.c_str(),
                  plan.largest_expert > 0 ? ", and the largest expert" : "");
    if (o.ranks > 0)
      std::printf("ranks          %d: weights %s on each rank (%s split by output rows, 1/%d each; %s on every "
                  "rank: embeddings, norms, convolutions, matrices stored [in, out])\n",
                  P, format_bytes(per_rank).c_str(), format_bytes(split_bytes).c_str(), P,
                  format_bytes(replicated_bytes).c_str());
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
