#include "lineage/model/quantization.h"

#include <cctype>
#include <cstdint>
#include <string>

#include "lineage/core/error.h"
#include "lineage/model/model.h"

namespace lineage::model {

namespace {

using Stored = kernels::StoredQuant;

std::string module_of(const std::string& weight) {
  return weight.ends_with(".weight") ? weight.substr(0, weight.size() - 7) : weight;
}

QuantPlan::Pattern pattern(const std::string& text, const ConfigFields& where, const std::string& field, bool substring) {
  if (substring) return QuantPlan::Pattern{text, QuantPlan::Pattern::Kind::Substring, {}};
  try {
    return QuantPlan::Pattern::parse(text, field);
  } catch (const Error& e) {
    where.fail(field, e.what());
  }
}

std::vector<QuantPlan::Pattern> patterns(const ConfigFields& c, const std::string& key, bool substring = false) {
  std::vector<QuantPlan::Pattern> v;
  if (!c.has(key)) return v;
  const nlohmann::json& a = c.json()[key];
  if (!a.is_array()) c.fail(key, "a list of strings");
  for (const auto& e : a) {
    if (!e.is_string()) c.fail(key, "a list of strings");
    v.push_back(pattern(e.get<std::string>(), c, key, substring));
  }
  return v;
}

// A group's weights (compressed-tensors QuantizationArgs) in the format `format`.
void read_weights(const ConfigFields& w, const std::string& format, QuantPlan::Group& g) {
  const int64_t bits = w.integer("num_bits", 8, 64);
  const std::string type = w.string("type", "int");
  const std::string strategy = w.string("strategy", "tensor");
  if (w.has("actorder")) {
    const std::string order = w.json()["actorder"].is_string() ? w.json()["actorder"].get<std::string>() : "?";
    w.fail("actorder", cat("null: activation order (columns permuted by weight_g_idx, as GPTQ's \"", order,
                           "\" writes them) is not supported; quantize without actorder"));
  }
  if (w.has("dynamic") && !(w.json()["dynamic"].is_boolean() && !w.json()["dynamic"].get<bool>()))
    w.fail("dynamic", "false (weights quantized once, stored in the checkpoint)");
  Stored& s = g.stored;
  s.origin = g.field;
  if (format == "pack-quantized") {
    if (type != "int") w.fail("type", "\"int\" (pack-quantized holds integer codes)");
    if (bits != 4 && bits != 8) w.fail("num_bits", "4 or 8 (lineage's pack-quantized kernels)");
    s.kind = Stored::Kind::PackedInt, s.bits = int(bits), s.symmetric = w.boolean("symmetric", true);
    if (strategy == "group") s.group = w.integer("group_size", limits::kWidth);
    else if (strategy != "channel") w.fail("strategy", "\"group\" or \"channel\" for pack-quantized weights");
  } else if (format == "float-quantized") {
    if (type != "float" || bits != 8) w.fail("num_bits", "8 with type \"float\" (FP8 E4M3)");
    if (!w.boolean("symmetric", true)) w.fail("symmetric", "true (FP8 weights have no zero point)");
    s.kind = Stored::Kind::Fp8;
    if (strategy == "channel") {
      s.block_rows = s.block_cols = 0;
    } else if (strategy == "tensor") {
      s.block_rows = s.block_cols = -1;
    } else if (strategy == "block") {
      const nlohmann::json& b = w.json().value("block_structure", nlohmann::json());
      if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer() || b[0].get<int64_t>() < 1 ||
          b[1].get<int64_t>() < 1)
        w.fail("block_structure", "two positive integers [rows, columns]");
      s.block_rows = b[0].get<int64_t>(), s.block_cols = b[1].get<int64_t>();
    } else {
      w.fail("strategy", "\"channel\", \"block\" or \"tensor\" for float-quantized weights");
    }
  } else if (format == "nvfp4-pack-quantized") {
    if (type != "float" || bits != 4 || w.integer("group_size", 16, limits::kWidth) != 16)
      w.fail("group_size", "16 with 4-bit float weights (NVFP4)");
    s.kind = Stored::Kind::Nvfp4;
  } else if (format == "mxfp4-pack-quantized") {
    if (type != "float" || bits != 4 || w.integer("group_size", 32, limits::kWidth) != 32)
      w.fail("group_size", "32 with 4-bit float weights (MXFP4)");
    g.mxfp4 = true;
  } else {
    throw Error(cat(w.file(), ": format \"", format,
                    "\" is not supported; lineage reads pack-quantized (int4, int8), float-quantized (FP8), "
                    "nvfp4-pack-quantized and mxfp4-pack-quantized"));
  }
}

// "float8 dynamic group 128": an activation scheme's type, width, strategy and whether it is dynamic.
std::string activation_scheme(const nlohmann::json& a) {
  const auto text = [&](const char* k) { return a.contains(k) && a[k].is_string() ? a[k].get<std::string>() : std::string(); };
  std::string s = text("type") + (a.contains("num_bits") && a["num_bits"].is_number_integer() ? std::to_string(a["num_bits"].get<int>()) : "");
  if (a.contains("dynamic") && a["dynamic"] != false) s += " dynamic";
  if (!text("strategy").empty()) s += " per " + text("strategy");
  if (a.contains("group_size") && a["group_size"].is_number_integer()) s += " of " + std::to_string(a["group_size"].get<int>());
  return s;
}

void parse_compressed_tensors(const ConfigFields& q, QuantPlan& plan) {
  const std::string format = q.string("format", "");
  if (!q.has("config_groups")) {
    if (format == "mxfp4-pack-quantized") {
      plan.family_decides = true;
      return;
    }
    q.fail("config_groups", cat("an object of quantization groups (targets and weights) for format \"", format,
                                "\" (only K3's mxfp4-pack-quantized experts are found without them)"));
  }
  const nlohmann::json& groups = q.json()["config_groups"];
  if (!groups.is_object() || groups.empty()) q.fail("config_groups", "an object of quantization groups");
  for (const auto& [name, g] : groups.items()) {
    const std::string field = cat(q.file(), ".config_groups.", name);
    if (!g.is_object()) throw Error(cat(field, ": expected an object with targets and weights"));
    const ConfigFields gc(g, field);
    QuantPlan::Group group;
    group.field = field;
    group.targets = patterns(gc, "targets");
    if (group.targets.empty()) gc.fail("targets", "a non-empty list of module patterns");
    if (!gc.has("weights") || !g["weights"].is_object()) gc.fail("weights", "the weights' quantization arguments");
    const std::string fmt = gc.string("format", format == "mixed-precision" ? "" : format);
    if (fmt.empty()) gc.fail("format", "the group's format (the model's is \"mixed-precision\")");
    read_weights(ConfigFields(g["weights"], field + ".weights"), fmt, group);
    for (const char* act : {"input_activations", "output_activations"})
      if (gc.has(act))
        plan.ignored.push_back(cat(name, ".", act, " (", activation_scheme(g[act]),
                                   "): a GPU engine's; lineage keeps activations in f32"));
    plan.groups.push_back(std::move(group));
  }
  plan.ignore = patterns(q, "ignore");
  if (q.has("kv_cache_scheme"))
    plan.ignored.push_back(cat("kv_cache_scheme ", q.json()["kv_cache_scheme"].dump(), ": the cache stays f32"));
}

// transformers' FineGrainedFP8 ("fp8"): every Linear outside modules_to_not_convert (substrings of the
// module name; lm_head always) in F8_E4M3 with weight_scale_inv blocks.
void parse_fp8(const ConfigFields& q, QuantPlan& plan) {
  if (q.string("fmt", "e4m3") != "e4m3") q.fail("fmt", "\"e4m3\"");
  const nlohmann::json& b = q.json().value("weight_block_size", nlohmann::json());
  if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer() || b[0].get<int64_t>() < 1 ||
      b[1].get<int64_t>() < 1)
    q.fail("weight_block_size", "two positive integers [rows, columns]");
  QuantPlan::Group g;
  g.field = q.file();
  g.targets.push_back(QuantPlan::Pattern{"Linear", QuantPlan::Pattern::Kind::Class, {}});
  g.stored.kind = Stored::Kind::HfFp8, g.stored.origin = q.file();
  g.stored.block_rows = b[0].get<int64_t>(), g.stored.block_cols = b[1].get<int64_t>();
  plan.groups.push_back(std::move(g));
  plan.ignore = patterns(q, "modules_to_not_convert", true);
  plan.ignore.push_back(QuantPlan::Pattern{"lm_head", QuantPlan::Pattern::Kind::Substring, {}});
  if (q.has("activation_scheme"))
    plan.ignored.push_back(cat("activation_scheme \"", q.string("activation_scheme", ""),
                               "\": a GPU engine's activations; lineage keeps them in f32"));
}

std::string stored_name(const Stored& s) {
  switch (s.kind) {
    case Stored::Kind::PackedInt: return cat("int", s.bits, s.group ? cat(" group ", s.group) : " per channel", s.symmetric ? "" : " asymmetric");
    case Stored::Kind::Fp8:
    case Stored::Kind::HfFp8:
      return cat("FP8 E4M3", s.block_rows < 0 ? " per tensor" : s.block_rows == 0 ? " per channel" : cat(" blocks ", s.block_rows, "x", s.block_cols));
    case Stored::Kind::Nvfp4: return "NVFP4";
    case Stored::Kind::Ggml: return kernels::ggml_block_info(s.ggml).name;
    case Stored::Kind::None: break;
  }
  return "none";
}

}  // namespace

QuantPlan::Pattern QuantPlan::Pattern::parse(const std::string& text, const std::string& field) {
  Pattern p;
  p.text = text;
  if (text.starts_with("re:")) {
    p.kind = Kind::Regex;
    try {
      p.re = std::regex(text.substr(3), std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw Error(cat(field, ": \"", text, "\" is not a regular expression after \"re:\" (", e.what(), ")"));
    }
  } else if (text == "Linear") {
    p.kind = Kind::Class;
  } else if (!text.empty() && std::isupper(static_cast<unsigned char>(text[0])) && text.find('.') == std::string::npos) {
    throw Error(cat(field, ": module names, \"re:\" patterns or the class \"Linear\" (lineage matches no other class; \"",
                    text, "\" names one)"));
  }
  return p;
}

bool QuantPlan::Pattern::matches(const std::string& module) const {
  switch (kind) {
    case Kind::Name: return module == text;
    case Kind::Regex: return std::regex_search(module, re, std::regex_constants::match_continuous);
    case Kind::Class: return true;
    case Kind::Substring: return module.find(text) != std::string::npos;
  }
  return false;
}

const QuantPlan::Group* QuantPlan::group_for(const std::string& module) const {
  for (const Pattern& p : ignore)
    if (p.matches(module)) return nullptr;
  // A name or pattern is more specific than a class: it wins whichever group comes first.
  for (const bool by_class : {false, true})
    for (const Group& g : groups)
      for (const Pattern& p : g.targets)
        if ((p.kind == Pattern::Kind::Class) == by_class && p.matches(module)) return &g;
  return nullptr;
}

std::string QuantPlan::describe() const {
  if (family_decides) return "compressed-tensors mxfp4-pack-quantized (the routed experts the checkpoint stores packed)";
  std::string s = method;
  for (const Group& g : groups) {
    std::string targets;
    for (const Pattern& p : g.targets) targets += (targets.empty() ? "" : ", ") + p.text;
    s += cat("; ", g.mxfp4 ? std::string("MXFP4") : stored_name(g.stored), " (", targets, ")");
  }
  if (!ignore.empty()) {
    std::string names;
    for (const Pattern& p : ignore) names += (names.empty() ? "" : ", ") + p.text;
    s += cat("; not quantized: ", names);
  }
  return s;
}

QuantPlan parse_quantization(const ConfigFields& cfg) {
  QuantPlan plan;
  // At the top level, or the text model's (K3 keeps it in text_config).
  const nlohmann::json* at = cfg.has("quantization_config") ? &cfg.json()["quantization_config"] : nullptr;
  std::string file = cfg.file() + ", quantization_config";
  if (!at && cfg.has("text_config") && cfg.json()["text_config"].is_object() &&
      cfg.json()["text_config"].contains("quantization_config") && !cfg.json()["text_config"]["quantization_config"].is_null()) {
    at = &cfg.json()["text_config"]["quantization_config"];
    file = cfg.file() + ", text_config.quantization_config";
  }
  if (!at) return plan;
  if (!at->is_object()) throw Error(cat(file, ": expected an object"));
  const ConfigFields q(*at, file);
  plan.method = q.string("quant_method", "");
  if (plan.method == "compressed-tensors") parse_compressed_tensors(q, plan);
  else if (plan.method == "fp8") parse_fp8(q, plan);
  else q.fail("quant_method", "\"compressed-tensors\" or \"fp8\" (transformers' block FP8)");
  return plan;
}

void apply_quantization(Model& m, const QuantPlan& plan, const std::function<bool(const std::string&)>& has_tensor,
                        const std::string& where) {
  if (m.config.family_packs_mxfp4) {
    // Kimi's MXFP4: the family marked the routed experts; any other matrix the files store packed (what
    // lineage quantize --scheme MXFP4 writes) is packed too.
    if (!has_tensor) return;
    m.for_each_tensor(layers::TensorVisitor::with_matrices([&](const std::string& param, kernels::Matrix& w) {
      if (!has_tensor(stored_matrix(m.binding, param) + "_packed")) return;
      w.packed = true;
      w.layout = kernels::Layout::OutIn;
    }));
    return;
  }
  if (plan.empty()) return;
  const auto mark = [&](const std::string& param, kernels::Matrix& w) {
    const std::string name = stored_matrix(m.binding, param);  // the checkpoint's, as the config names it
    const QuantPlan::Group* g = plan.group_for(module_of(name));
    w.quant = g && !g->mxfp4 ? g->stored : Stored{};
    w.packed = g && g->mxfp4;
    // Quantized layouts are [out, in] whatever the family stores in float (GPT-2's Conv1D [in, out]).
    if (w.packed || w.quant.defined()) w.layout = kernels::Layout::OutIn;
    if (!has_tensor) return;
    const bool stored_packed = has_tensor(name + "_packed"), stored_plain = has_tensor(name);
    const bool stored_fp8 = stored_plain && (has_tensor(name + "_scale") || has_tensor(name + "_scale_inv"));
    const bool quantized = w.packed || w.quant.defined();
    const bool wants_plain = w.quant.kind == Stored::Kind::Fp8 || w.quant.kind == Stored::Kind::HfFp8;
    if (quantized && !(wants_plain ? stored_fp8 : stored_packed) && (stored_plain || stored_packed))
      throw Error(cat(where, ": tensor \"", name, "\" is stored ", stored_packed ? "packed" : "unquantized", ", but ",
                      g->field, " quantizes it as ", g->mxfp4 ? "MXFP4" : stored_name(g->stored), " (expected ",
                      wants_plain ? name + " and " + name + "_scale" : name + "_packed", ")"));
    if (!quantized && (stored_packed || stored_fp8))
      throw Error(cat(where, ": tensor \"", name, "_packed\" or \"", name, "_scale\" is stored quantized, but ",
                      "quantization_config leaves module \"", module_of(name), "\" unquantized (no config_groups ",
                      "target matches it, or ignore names it)"));
  };
  m.for_each_tensor(layers::TensorVisitor::with_matrices(mark));
}

void prepare_quantized(Model& m, const std::string& where) {
  m.for_each_tensor(layers::TensorVisitor::with_matrices([&](const std::string& name, kernels::Matrix& w) {
    if (!w.quant.defined() || w.streamed) return;
    try {
      kernels::prepare_quant(w, name);
    } catch (const Error& e) {
      throw Error(cat(where, ": ", e.what()));
    }
  }));
}

int64_t set_int8_dot(Model& m, bool on) {
  int64_t integer = 0;
  m.for_each_tensor(layers::TensorVisitor::with_matrices([&](const std::string&, kernels::Matrix& w) {
    if (!w.quant.defined() || !w.qw.q) return;
    w.qw.int8_dot = on;
    integer += w.qw.codes == kernels::QuantCodes::Int4 || w.qw.codes == kernels::QuantCodes::Int8;
  }));
  return integer;
}

}  // namespace lineage::model
