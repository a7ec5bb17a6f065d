#include "lineage/io/quantize.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "lineage/core/error.h"
#include "lineage/core/json_read.h"
#include "lineage/io/load_model.h"
#include "lineage/io/safetensors.h"
#include "lineage/layers/common.h"
#include "lineage/model/binding.h"
#include "lineage/model/quantization.h"

namespace lineage::io {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kSchemes[] = {"W4A16", "W4A16_ASYM", "W8A16", "FP8_BLOCK", "MXFP4", "NVFP4"};

bool is_int(RtnScheme s) { return s == RtnScheme::W4A16 || s == RtnScheme::W4A16_ASYM || s == RtnScheme::W8A16; }

// compressed-tensors' QuantizationArgs of the scheme's weights (and FP8_BLOCK's activations), every
// field it serializes.
json weight_args(RtnScheme s, int64_t group) {
  json w = {{"actorder", nullptr}, {"block_structure", nullptr}, {"dynamic", false}, {"group_size", nullptr},
            {"num_bits", 4}, {"observer", "minmax"}, {"observer_kwargs", json::object()}, {"scale_dtype", nullptr},
            {"strategy", "group"}, {"symmetric", true}, {"type", "int"}, {"zp_dtype", nullptr}};
  if (is_int(s)) {
    w["num_bits"] = s == RtnScheme::W8A16 ? 8 : 4;
    if (group) w["group_size"] = group;
    else w["strategy"] = "channel";
    if (s == RtnScheme::W4A16_ASYM) w["symmetric"] = false, w["zp_dtype"] = "torch.int8";
  } else if (s == RtnScheme::FP8_BLOCK) {
    w["num_bits"] = 8, w["type"] = "float", w["strategy"] = "block", w["block_structure"] = {128, 128};
  } else {
    w["type"] = "float";
    w["group_size"] = s == RtnScheme::MXFP4 ? 32 : 16;
    w["strategy"] = s == RtnScheme::MXFP4 ? "group" : "tensor_group";
    w["scale_dtype"] = s == RtnScheme::MXFP4 ? "torch.uint8" : "torch.float8_e4m3fn";
  }
  return w;
}

const char* format_of(RtnScheme s) {
  return is_int(s) ? "pack-quantized" : s == RtnScheme::FP8_BLOCK ? "float-quantized"
         : s == RtnScheme::MXFP4 ? "mxfp4-pack-quantized" : "nvfp4-pack-quantized";
}

json quantization_config(RtnScheme s, int64_t group, const std::vector<std::string>& ignore) {
  json inputs = nullptr;
  if (s == RtnScheme::FP8_BLOCK)
    inputs = {{"actorder", nullptr}, {"block_structure", nullptr}, {"dynamic", true}, {"group_size", 128},
              {"num_bits", 8}, {"observer", nullptr}, {"observer_kwargs", json::object()}, {"scale_dtype", nullptr},
              {"strategy", "group"}, {"symmetric", true}, {"type", "float"}, {"zp_dtype", nullptr}};
  json group0 = {{"format", format_of(s)}, {"input_activations", inputs}, {"output_activations", nullptr},
                 {"targets", {"Linear"}}, {"weights", weight_args(s, group)}};
  return {{"config_groups", {{"group_0", group0}}}, {"format", format_of(s)}, {"global_compression_ratio", nullptr},
          {"ignore", ignore}, {"kv_cache_scheme", nullptr}, {"quant_method", "compressed-tensors"},
          {"quantization_status", "compressed"}, {"transform_config", json::object()}, {"version", "0.18.0"}};
}

// Whether the module matches an ignore entry (exact name, or `re:` from the start of the name).
bool ignored(const std::string& module, const std::vector<model::QuantPlan::Pattern>& ignore) {
  for (const auto& p : ignore)
    if (p.kind != model::QuantPlan::Pattern::Kind::Class && p.matches(module)) return true;
  return false;
}

std::string module_of(const std::string& weight) { return weight.substr(0, weight.size() - std::string(".weight").size()); }

// The weight matrices of the model the checkpoint holds, by stored name (a tensor lineage splits into
// parts counted once), with whether the family stores it [in, out] (GPT-2's Conv1D).
std::map<std::string, bool> linear_weights(model::Model& m, const Checkpoint& ckpt) {
  std::map<std::string, bool> out;
  m.for_each_tensor(layers::TensorVisitor::with_matrices([&](const std::string& param, kernels::Matrix& w) {
    const std::string stored = model::stored_matrix(m.binding, param);
    if (stored.ends_with(".weight") && ckpt.has(stored) && ckpt.entry(stored).shape.size() == 2)
      out[stored] = w.layout == kernels::Layout::InOut;
  }));
  return out;
}

// The matrices of one module that share an NVFP4 global scale (compressed-tensors' fused sets: q/k/v,
// gate/up, w1/w3 of one parent), keyed by the parent and the set.
std::string fused_set(const std::string& weight) {
  static const std::regex kPattern(R"((.*)\.(q_proj|k_proj|v_proj|gate_proj|up_proj|w1|w3)\.weight$)");
  std::smatch m;
  if (!std::regex_match(weight, m, kPattern)) return "";
  const std::string part = m[2];
  const char* set = part == "gate_proj" || part == "up_proj" ? "gate_up" : part == "w1" || part == "w3" ? "w13" : "qkv";
  return m[1].str() + "/" + set;
}

void copy_side_files(const fs::path& in, const fs::path& out) {
  for (const auto& e : fs::directory_iterator(in)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || name == "config.json" || name.ends_with(".safetensors") ||
        name == "model.safetensors.index.json")
      continue;
    fs::copy_file(e.path(), out / name, fs::copy_options::overwrite_existing);
  }
}

// The input pages of a tensor dropped from this process's mapping once written (they stay in the page
// cache), so the resident set stays near one tensor.
void release(const Tensor& t) {
  if (!t.is_borrowed() || !t.nbytes()) return;
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE)), begin = reinterpret_cast<uintptr_t>(t.raw());
  const uintptr_t first = begin / page * page, last = (begin + t.nbytes() + page - 1) / page * page;
  madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

}  // namespace

RtnScheme parse_rtn_scheme(const std::string& name) {
  for (size_t i = 0; i < std::size(kSchemes); ++i)
    if (name == kSchemes[i]) return RtnScheme(i);
  if (name == "MXFP4A16") return RtnScheme::MXFP4;
  if (name == "NVFP4A16") return RtnScheme::NVFP4;
  std::string all;
  for (const char* s : kSchemes) all += (all.empty() ? "" : ", ") + std::string(s);
  throw Error(cat("--scheme: \"", name, "\" is not one of ", all));
}

std::string rtn_scheme_name(RtnScheme s) { return kSchemes[size_t(s)]; }

std::vector<std::string> default_ignore() {
  return {"lm_head",
          R"(re:.*embed_tokens$)",
          R"(re:.*mlp\.gate$)",
          R"(re:.*block_sparse_moe\.gate$)",
          R"(re:.*shared_expert_gate$)",
          R"(re:.*linear_attn\.in_proj_(ba|a|b)$)",
          R"(re:.*self_attn\.(f_a|f_b|g_a|g_b|b|a)_proj$)"};
}

QuantizeReport quantize_checkpoint(const fs::path& in, const fs::path& out, const QuantizeOptions& o) {
  const fs::path cfg_path = in / "config.json";
  if (!fs::exists(cfg_path)) throw Error(cat(cfg_path.string(), ": does not exist (quantize takes a model directory)"));
  json cfg = read_json_file(cfg_path);
  for (const json* level : {&cfg, cfg.contains("text_config") ? &cfg["text_config"] : nullptr})
    if (level && level->is_object() && level->contains("quantization_config") && !(*level)["quantization_config"].is_null())
      throw Error(cat(cfg_path.string(), ": field \"quantization_config\": the checkpoint is already quantized (",
                      (*level)["quantization_config"].value("quant_method", std::string("?")),
                      "); lineage quantize takes a float checkpoint"));
  if (fs::exists(out) && (!fs::is_directory(out) || !fs::is_empty(out)))
    throw Error(cat(out.string(), ": exists and is not an empty directory; quantize writes a new one"));
  if (is_int(o.scheme) && o.group && *o.group < 0) throw Error(cat("--group: ", *o.group, " is negative"));
  const Checkpoint ckpt = Checkpoint::open(in);
  model::Model m = checkpoint_skeleton(in, ckpt);
  const std::map<std::string, bool> linear = linear_weights(m, ckpt);

  QuantizeReport r;
  RtnArgs args{o.scheme, is_int(o.scheme) ? o.group.value_or(128) : 0, 0};
  r.ignore = o.ignore.empty() ? default_ignore() : o.ignore;
  std::vector<model::QuantPlan::Pattern> ignore;
  for (const std::string& e : r.ignore) ignore.push_back(model::QuantPlan::Pattern::parse(e, "--ignore"));
  if (std::find(r.ignore.begin(), r.ignore.end(), "lm_head") == r.ignore.end()) r.ignore.insert(r.ignore.begin(), "lm_head");
  std::set<std::string> chosen;
  for (const auto& [name, in_out] : linear) {
    if (ignored(module_of(name), ignore)) continue;
    const TensorEntry& e = ckpt.entry(name);
    const Shape shape = in_out ? Shape{e.shape[1], e.shape[0]} : e.shape;
    const std::string why = rtn_unfit(shape, e.dtype, args);
    if (!why.empty()) {
      r.unfit.push_back(cat(name, ": ", why));
      r.ignore.push_back(module_of(name));
      continue;
    }
    chosen.insert(name);
  }
  // NVFP4: each fused set's max |w| (its matrices share one global scale).
  std::map<std::string, double> set_amax;
  if (o.scheme == RtnScheme::NVFP4)
    for (const std::string& name : chosen)
      if (const std::string s = fused_set(name); !s.empty()) {
        const Tensor w = ckpt.tensor(name);
        set_amax[s] = std::max(set_amax[s], rtn_amax(w));
        release(w);
      }

  // The output's tensors in the input's order, each quantized one as its stored companions; shards cut
  // at shard_bytes.
  struct Out {
    std::string source;  // the input tensor
    std::vector<SafetensorsWriter::Layout> parts;
    size_t bytes = 0;
  };
  std::vector<Out> plan;
  for (const std::string& name : ckpt.names()) {
    const TensorEntry& e = ckpt.entry(name);
    Out t{name, {}, 0};
    if (chosen.count(name)) {
      const bool in_out = linear.at(name);
      const Shape shape = in_out ? Shape{e.shape[1], e.shape[0]} : e.shape;
      for (const RtnPart& p : rtn_layout(shape, e.dtype, args)) t.parts.push_back({module_of(name) + "." + p.suffix, p.dtype, p.shape});
    } else {
      t.parts.push_back({name, e.dtype, e.shape});
    }
    for (const auto& p : t.parts) t.bytes += size_t(shape_numel(p.shape)) * dtype_size(p.dtype);
    plan.push_back(std::move(t));
  }
  std::vector<std::vector<size_t>> shards(1);
  size_t in_shard = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (in_shard && in_shard + plan[i].bytes > o.shard_bytes) shards.emplace_back(), in_shard = 0;
    shards.back().push_back(i);
    in_shard += plan[i].bytes;
  }

  fs::create_directories(out);
  size_t total = 0, done = 0;
  for (const std::string& name : ckpt.names()) {
    const TensorEntry& e = ckpt.entry(name);
    total += size_t(shape_numel(e.shape)) * dtype_size(e.dtype);
  }
  json weight_map = json::object();
  for (size_t k = 0; k < shards.size(); ++k) {
    char sharded[64];
    std::snprintf(sharded, sizeof sharded, "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
    const std::string file = shards.size() == 1 ? "model.safetensors" : sharded;
    std::vector<SafetensorsWriter::Layout> layout;
    for (size_t i : shards[k])
      for (const auto& p : plan[i].parts) layout.push_back(p), weight_map[p.name] = file;
    SafetensorsWriter w(out / file, layout, {{"format", "pt"}});
    for (size_t i : shards[k]) {
      const Out& t = plan[i];
      const Tensor x = ckpt.tensor(t.source);
      if (chosen.count(t.source)) {
        RtnArgs a = args;
        if (const std::string s = fused_set(t.source); !s.empty() && set_amax.count(s)) a.nvfp4_amax = set_amax.at(s);
        const auto parts = rtn_quantize(linear.at(t.source) ? transposed(x) : x, a);
        for (size_t j = 0; j < parts.size(); ++j) w.write(t.parts[j].name, parts[j].second.raw(), parts[j].second.nbytes());
        ++r.quantized;
      } else {
        w.write(t.source, x.raw(), x.nbytes());
        if (linear.count(t.source)) ++r.kept;
      }
      r.bytes_out += t.bytes;
      done += x.nbytes();
      release(x);
      if (o.progress) o.progress(done, total);
    }
    w.close();
  }
  r.bytes_in = total;
  if (shards.size() > 1) {
    const json index = {{"metadata", {{"total_size", r.bytes_out}}}, {"weight_map", weight_map}};
    std::ofstream(out / "model.safetensors.index.json") << index.dump(2) << "\n";
  }
  cfg["quantization_config"] = quantization_config(o.scheme, args.group, r.ignore);
  std::ofstream(out / "config.json") << cfg.dump(2) << "\n";
  copy_side_files(in, out);
  return r;
}

}  // namespace lineage::io
