#include "lineage/io/load_model.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <nlohmann/json.hpp>
#include <functional>
#include <optional>
#include <set>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/core/hash.h"
#include "lineage/core/json_read.h"
#include "lineage/kernels/matrix.h"
#include "lineage/model/archs/arch.h"
#include "lineage/model/binding.h"
#include "lineage/model/forward.h"

namespace lineage::io {

namespace fs = std::filesystem;

namespace {

nlohmann::json read_config(const fs::path& dir) {
  const fs::path p = dir / "config.json";
  if (fs::exists(dir) && !fs::is_directory(dir))
    throw Error(cat(dir.string(), ": is a file; --model expects the model directory that holds config.json"));
  if (!fs::is_directory(dir)) throw Error(cat(dir.string(), ": model directory does not exist"));
  if (!fs::exists(p)) throw Error(cat(p.string(), ": does not exist (a model directory needs config.json)"));
  nlohmann::json j = read_json_file(p);
  if (!j.is_object()) throw Error(cat(p.string(), ": expected a JSON object, found ", j.type_name()));
  return j;
}

// The number of blocks the checkpoint holds: one more than the largest index after the layer prefix.
int64_t checkpoint_layers(const Checkpoint& ckpt, const std::string& prefix) {
  int64_t layers = 0;
  for (const auto& name : ckpt.names()) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    int64_t i = 0;
    size_t at = prefix.size();
    for (; at < name.size() && at < prefix.size() + 6 && std::isdigit(static_cast<unsigned char>(name[at])); ++at)
      i = i * 10 + (name[at] - '0');
    if (at > prefix.size() && at < name.size() && name[at] == '.') layers = std::max(layers, i + 1);
  }
  return layers;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

namespace {

// `name` with its suffix `from` replaced by `to`, or "" when it does not end in `from`.
std::string with_suffix(const std::string& name, const std::string& from, const std::string& to) {
  return ends_with(name, from) ? name.substr(0, name.size() - from.size()) + to : std::string();
}

Shape squeezed(const Shape& s) {
  Shape r;
  for (int64_t d : s)
    if (d != 1) r.push_back(d);
  return r;
}

// Floats, or U8 for the two halves of a packed matrix (layers/common.h, visit_matrix).
bool is_weight_dtype(DType t, const std::string& param) {
  if (ends_with(param, ".weight_packed") || ends_with(param, ".weight_scale")) return t == DType::U8;
  return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

}  // namespace

void bind_weights(model::Model& m, const Checkpoint& ckpt, const std::string& where) {
  const model::BindingTable& table = m.binding;
  std::vector<std::string> missing, wrong;
  std::set<std::string> bound;
  // A stored tensor checked against what the parameter expects; squeezed where the table allows.
  const auto check = [&](const std::string& param, const std::string& stored, const Shape& shape, bool squeeze,
                         Tensor& out) {
    const TensorEntry& e = ckpt.entry(stored);
    const std::string label = stored == param ? stored : cat(stored, " (for ", param, ")");
    if (!is_weight_dtype(e.dtype, param)) {
      wrong.push_back(cat(label, ": dtype ", dtype_name(e.dtype), ", expected ",
                          ends_with(param, "_packed") || ends_with(param, "_scale") ? "U8" : "F32, F16 or BF16"));
    } else if (e.shape == shape) {
      out = ckpt.tensor(stored);
    } else if (squeeze && squeezed(e.shape) == squeezed(shape)) {
      out = ckpt.tensor(stored).reshaped(shape);
    } else {
      wrong.push_back(cat(label, ": shape ", shape_str(e.shape), ", expected ", shape_str(shape)));
    }
  };
  m.for_each_tensor([&](const std::string& name, Tensor& t, const Shape& shape, layers::Init) {
    bool squeeze = false, optional = false;
    for (const auto& s : table.squeeze) squeeze = squeeze || ends_with(name, s);
    for (const auto& s : table.optional) optional = optional || ends_with(name, s);
    // A slice of a stacked tensor: expert e's rows of one part, a view.
    for (const auto& us : table.unstacks) {
      const std::optional<model::UnstackSlot> slot = model::unstack_slot(us, name);
      if (!slot) continue;
      const int64_t e = slot->expert, r0 = slot->row0, rows = us.parts[slot->part].second;
      int64_t per = 0;
      for (const auto& p : us.parts) per += p.second;
      const std::string& stored = slot->stored;
      if (!ckpt.has(stored)) continue;  // stored one tensor per expert instead
      bound.insert(stored);
      const TensorEntry& en = ckpt.entry(stored);
      Shape want = shape;
      want.insert(want.begin(), 0);
      want[0] = us.slices, want[1] = per;
      if (en.shape != want || e >= en.shape[0] || !is_weight_dtype(en.dtype, name)) {
        wrong.push_back(cat(stored, ": shape ", shape_str(en.shape), " ", dtype_name(en.dtype), ", expected ",
                            shape_str(want), " (experts, then each expert's rows) of a float dtype"));
        return;
      }
      Shape slice = en.shape;
      slice.erase(slice.begin());
      t = ckpt.tensor(stored).rows(e, e + 1).reshaped(slice).rows(r0, r0 + rows);
      return;
    }
    // A part of a split tensor: a view of its rows, or its rows of every group gathered.
    for (const auto& sp : table.splits) {
      int64_t r0 = 0, per_group = 0;
      for (const auto& p : sp.parts) per_group += p.second;
      for (const auto& [part, rows] : sp.parts) {
        const std::string stored = with_suffix(name, part, sp.stored);
        if (stored.empty() || !ckpt.has(stored)) {
          r0 += rows;
          continue;
        }
        bound.insert(stored);
        const TensorEntry& e = ckpt.entry(stored);
        const int64_t total = per_group * sp.groups;
        if (e.shape.empty() || e.shape[0] != total || !is_weight_dtype(e.dtype, name)) {
          wrong.push_back(cat(stored, ": shape ", shape_str(e.shape), " ", dtype_name(e.dtype), ", expected ", total,
                              " rows (", sp.groups, " x ", per_group, ", split into its parts) of a float dtype"));
          return;
        }
        Shape part_shape = e.shape;
        part_shape[0] = rows * sp.groups;
        if (part_shape != shape) {
          wrong.push_back(cat(stored, ": ", name, "'s rows, shape ", shape_str(part_shape), ", expected ", shape_str(shape)));
          return;
        }
        const Tensor all = ckpt.tensor(stored);
        if (sp.groups == 1) {
          t = all.rows(r0, r0 + rows);
          return;
        }
        Tensor gathered = Tensor::empty(all.dtype(), shape);
        const size_t bytes = all.rows(0, rows).nbytes();
        for (int64_t g = 0; g < sp.groups; ++g)
          std::memcpy(static_cast<char*>(gathered.raw_mut()) + size_t(g) * bytes,
                      all.rows(g * per_group + r0, g * per_group + r0 + rows).raw(), bytes);
        t = std::move(gathered);
        return;
      }
    }
    // Several stored tensors: their rows concatenated into one owned tensor.
    for (const auto& fu : table.fuses) {
      if (!ends_with(name, fu.param)) continue;
      std::vector<Tensor> parts;
      for (const auto& s : fu.stored) {
        const std::string stored = with_suffix(name, fu.param, s);
        if (!ckpt.has(stored)) {
          missing.push_back(cat(stored, " (part of ", name, " ", shape_str(shape), ")"));
          return;
        }
        bound.insert(stored);
        parts.push_back(ckpt.tensor(stored));
      }
      int64_t rows = 0;
      for (const Tensor& p : parts) rows += p.ndim() ? p.dim(0) : 0;
      Shape want_part = shape;
      for (const Tensor& p : parts) {
        want_part[0] = p.ndim() ? p.dim(0) : 0;
        if (p.dtype() != parts[0].dtype() || p.shape() != want_part || rows != shape[0]) {
          wrong.push_back(cat(name, ": its parts ", shape_str(p.shape()), " ", dtype_name(p.dtype()),
                              " do not stack into ", shape_str(shape)));
          return;
        }
      }
      Tensor fused = Tensor::empty(parts[0].dtype(), shape);
      size_t at = 0;
      for (const Tensor& p : parts) {
        std::memcpy(static_cast<char*>(fused.raw_mut()) + at, p.raw(), p.nbytes());
        at += p.nbytes();
      }
      t = std::move(fused);
      return;
    }
    std::string stored = name;
    for (const auto& r : table.renames) {
      const std::string s = with_suffix(name, r.param, r.stored);
      if (!s.empty() && ckpt.has(s)) stored = s;
    }
    if (!ckpt.has(stored)) {
      if (!optional) missing.push_back(cat(name, " ", shape_str(shape)));
      return;
    }
    bound.insert(stored);
    check(name, stored, shape, squeeze, t);
  });
  std::vector<std::string> unexpected;
  for (const auto& name : ckpt.names()) {
    if (bound.count(name)) continue;
    bool ignored = false;
    for (const auto& s : table.ignore_suffixes) ignored = ignored || ends_with(name, s);
    for (const auto& p : table.ignore_prefixes) ignored = ignored || name.compare(0, p.size(), p) == 0;
    if (!ignored) unexpected.push_back(name);
  }
  if (missing.empty() && unexpected.empty() && wrong.empty()) return;
  std::string msg = cat(where, ": the checkpoint does not match the ", m.config.model_type, " architecture in config.json");
  const auto list = [&](const char* what, const std::vector<std::string>& v) {
    if (v.empty()) return;
    msg += cat("\n  ", what, " (", v.size(), "):");
    for (size_t i = 0; i < v.size() && i < 20; ++i) msg += "\n    " + v[i];
    if (v.size() > 20) msg += cat("\n    ... and ", v.size() - 20, " more");
  };
  list("missing tensors", missing);
  list("unexpected tensors", unexpected);
  list("wrong dtype or shape", wrong);
  throw Error(msg);
}

void check_mxfp4_scales(model::Model& m, const std::string& where) {
  m.for_each_tensor([&](const std::string& name, Tensor& t, const Shape&, layers::Init) {
    if (!ends_with(name, ".weight_scale") || !t.defined()) return;
    const int64_t i = kernels::first_nan_scale(t), cols = t.ndim() == 2 ? t.dim(1) : 1;
    if (i < 0) return;
    throw Error(cat(where, ": tensor \"", name, "\" ", shape_str(t.shape()), ": the MXFP4 block scale of row ", i / cols,
                    ", columns ", 32 * (i % cols), " .. ", 32 * (i % cols) + 31,
                    " is 255, which E8M0 reserves for NaN (expected an exponent 0 .. 254); the checkpoint is damaged"));
  });
}

namespace {

// The family's skeleton from config.json; has_tensor answers for the checkpoint (or nothing).
model::Model build_from_config(const nlohmann::json& cfg, const std::string& cfg_path,
                               const std::function<bool(const std::string&)>& has_tensor,
                               const std::function<Shape(const std::string&)>& tensor_shape = {}) {
  if (!cfg.contains("model_type") || !cfg["model_type"].is_string())
    throw Error(cat(cfg_path, ": field \"model_type\": expected a string naming the architecture (one of ",
                    model::known_model_types(), ")"));
  const std::string type = cfg["model_type"];
  const model::ArchBuilder* build = model::find_arch(type);
  if (!build)
    throw Error(cat(cfg_path, ": field \"model_type\": \"", type, "\" is not supported; expected one of ",
                    model::known_model_types()));
  model::ArchInput in{model::ConfigFields(cfg, cfg_path), has_tensor};
  if (tensor_shape) in.tensor_shape = tensor_shape;
  model::Model m = (*build)(in);
  // The parsed document, dumped with sorted keys: whitespace and key order do not change it.
  m.config.config_hash = hash64(cfg.dump());
  return m;
}

}  // namespace

bool has_weights(const fs::path& dir) {
  return fs::exists(dir / "model.safetensors") || fs::exists(dir / "model.safetensors.index.json");
}

Skeleton load_skeleton(const fs::path& dir) {
  const nlohmann::json cfg = read_config(dir);
  Skeleton s;
  s.model = build_from_config(cfg, (dir / "config.json").string(), [](const std::string&) { return false; });
  // The top level's, else the text model's (Qwen3.5 keeps it in text_config only).
  std::vector<const nlohmann::json*> levels = {&cfg};
  if (cfg.contains("text_config") && cfg["text_config"].is_object()) levels.push_back(&cfg["text_config"]);
  for (const nlohmann::json* from : levels)
    for (const char* key : {"dtype", "torch_dtype"}) {
      if (s.dtype || !from->contains(key) || !(*from)[key].is_string()) continue;
      const std::string d = (*from)[key];
      if (d == "bfloat16") s.dtype = DType::BF16;
      else if (d == "float16") s.dtype = DType::F16;
      else if (d == "float32") s.dtype = DType::F32;
    }
  return s;
}

LoadedModel load_model(const fs::path& dir, bool with_tokenizer, WeightStorage storage) {
  const nlohmann::json cfg = read_config(dir);
  const std::string cfg_path = (dir / "config.json").string();
  auto ckpt = std::make_shared<Checkpoint>(Checkpoint::open(dir));
  LoadedModel out;
  out.model = build_from_config(
      cfg, cfg_path, [&](const std::string& n) { return ckpt->has(n); },
      [&](const std::string& n) { return ckpt->has(n) ? ckpt->entry(n).shape : Shape{}; });
  const int64_t held = checkpoint_layers(*ckpt, out.model.names.layer_prefix);
  if (held != out.model.n_layers())
    throw Error(cat(cfg_path, ": field \"", out.model.config.layers_field, "\": expected ", held, " (the checkpoint holds ",
                    held ? cat("layers ", out.model.names.layer_prefix, "0 .. ", out.model.names.layer_prefix, held - 1)
                         : cat("no tensor named ", out.model.names.layer_prefix, "N.*"),
                    "), found ", out.model.n_layers()));
  bind_weights(out.model, *ckpt, dir.string());
  check_mxfp4_scales(out.model, dir.string());
  // Owned: every tensor copied (Conv1D matrices then transposed for decode), and the mappings go
  // with `ckpt`, their last owner, at the return.
  if (storage == WeightStorage::Owned) {
    out.model.for_each_tensor([](const std::string&, Tensor& t, const Shape&, layers::Init) {
      if (!t.is_borrowed()) return;
      const Tensor mapped = t;
      t = mapped.clone();
      // Drop the copied pages from this process's mapping as we go (they stay in the page cache),
      // so loading peaks near one copy of the weights, not two.
      const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE)), begin = reinterpret_cast<uintptr_t>(mapped.raw());
      const uintptr_t first = begin / page * page, last = (begin + mapped.nbytes() + page - 1) / page * page;
      madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
    });
    model::prepare(out.model, true);
  } else {
    model::prepare(out.model, false);
    out.checkpoint = ckpt;
  }
  out.dir = dir;
  if (with_tokenizer && (fs::exists(dir / "tokenizer.json") || fs::exists(dir / "vocab.json") ||
                         fs::exists(dir / "tiktoken.model")))
    out.tokenizer = lineage::tokenizer::Tokenizer::load(dir);
  return out;
}

}  // namespace lineage::io
