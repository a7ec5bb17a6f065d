#include "lineage/io/load_model.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <nlohmann/json.hpp>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/core/hash.h"
#include "lineage/core/json_read.h"
#include "lineage/io/gguf_model.h"
#include "lineage/kernels/matrix.h"
#include "lineage/model/archs/arch.h"
#include "lineage/model/binding.h"
#include "lineage/model/forward.h"
#include "lineage/model/quantization.h"

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
  const bool fp = t == DType::F32 || t == DType::F16 || t == DType::BF16;
  // Quantized matrices' tensors (kernels/matrix.h, StoredQuant): prepare_quant checks each exactly.
  if (ends_with(param, ".weight_packed")) return t == DType::U8 || t == DType::I32;
  if (ends_with(param, ".weight_scale")) return t == DType::U8 || t == DType::F8_E4M3 || fp;
  if (ends_with(param, ".weight_zero_point") || ends_with(param, ".weight_shape")) return t == DType::I32 || t == DType::I64;
  if (ends_with(param, ".weight_global_scale") || ends_with(param, ".weight_scale_inv")) return fp;
  return fp;
}

// What a weight matrix "X.weight" may store beside (or as) X.weight: the quantized layouts' tensors
// (kernels/matrix.h, StoredQuant), suffixes of its name.
constexpr const char* kCompanions[] = {"", "_packed", "_scale", "_scale_inv", "_zero_point", "_shape", "_global_scale"};

// A block scale [ceil(rows / br), cols] of a matrix lineage splits by rows, as one row per matrix row
// (prepare_quant reads a block scale with a row per matrix row so): each part then takes its rows.
Tensor scale_rows(const Tensor& blocks, const kernels::StoredQuant& q, int64_t rows) {
  const int64_t br = q.block_rows > 0 ? q.block_rows : rows;
  if ((rows + br - 1) / br != blocks.dim(0)) return Tensor();  // the caller reports the shape
  Tensor out = Tensor::empty(blocks.dtype(), {rows, blocks.dim(1)});
  const size_t bytes = size_t(blocks.dim(1)) * dtype_size(blocks.dtype());
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(out.raw_mut()) + size_t(r) * bytes, static_cast<const char*>(blocks.raw()) + size_t(r / br) * bytes, bytes);
  return out;
}

// A quantized companion of a split matrix's part that is not cut by rows as its codes are: the zero
// points (packed along rows: the part's rows, rows_of_part(r) for its row r, unpacked and packed
// again), weight_shape (the whole tensor's, checked; the part gets its own), one scale for the whole
// tensor or NVFP4's global scale (shared). False after adding to `wrong`; `done` set when bound here,
// left empty when the companion is cut by rows as the codes are.
bool split_companion(const Checkpoint& ckpt, const std::string& stored, const std::string& companion,
                     const kernels::StoredQuant& q, int64_t total, int64_t part_rows,
                     const std::function<int64_t(int64_t)>& rows_of_part, std::vector<std::string>& wrong,
                     std::optional<Tensor>& done) {
  const TensorEntry& e = ckpt.entry(stored);
  if (companion == "_zero_point") {  // packed along rows: the part's rows unpacked and packed again
    const Tensor all = ckpt.tensor(stored);
    const int64_t bits = q.bits, words = (total * bits + 31) / 32;
    if (all.dtype() != DType::I32 || all.ndim() != 2 || all.dim(0) != words || (bits != 4 && bits != 8)) {
      wrong.push_back(cat(stored, ": shape ", shape_str(all.shape()), " ", dtype_name(all.dtype()), ", expected I32 [", words,
                          ", groups] (", q.origin, ")"));
      return false;
    }
    const int64_t groups = all.dim(1), mask = (int64_t(1) << bits) - 1;
    const auto* in = static_cast<const uint32_t*>(all.raw());
    Tensor part = Tensor::zeros(DType::I32, {(part_rows * bits + 31) / 32, groups});
    auto* out = static_cast<uint32_t*>(part.raw_mut());
    for (int64_t r = 0; r < part_rows; ++r) {
      const int64_t from = rows_of_part(r) * bits, to = r * bits;
      for (int64_t g = 0; g < groups; ++g)
        out[(to / 32) * groups + g] |= ((in[(from / 32) * groups + g] >> (from % 32)) & mask) << (to % 32);
    }
    done = std::move(part);
    return true;
  }
  if (companion == "_shape") {
    const Tensor st = ckpt.tensor(stored);
    const auto at = [&](int64_t i) {
      return st.dtype() == DType::I64 ? st.data<int64_t>()[i] : st.dtype() == DType::I32 ? int64_t(st.data<int32_t>()[i]) : -1;
    };
    if (st.numel() != 2 || at(0) != total) {
      wrong.push_back(cat(stored, ": expected (", total, ", columns) as I64 or I32, found ", shape_str(st.shape()), " ",
                          dtype_name(st.dtype())));
      return false;
    }
    Tensor own = Tensor::empty(DType::I64, {2});
    own.data<int64_t>()[0] = part_rows, own.data<int64_t>()[1] = at(1);
    done = std::move(own);
    return true;
  }
  if (companion == "_global_scale" || shape_numel(e.shape) == 1) done = ckpt.tensor(stored);
  return true;
}

}  // namespace

void bind_weights(model::Model& m, const Checkpoint& ckpt, const std::string& where) {
  const model::BindingTable& table = m.binding;
  std::vector<std::string> missing, wrong;
  // The FP8 matrices' `weight`s (F8_E4M3 codes), and the MXFP4 pairs' tensors and ggml's block rows (U8 only).
  std::set<std::string> bound, fp8, bytes;
  std::map<std::string, kernels::StoredQuant> quant_of;  // by the matrix's "….weight"
  m.for_each_tensor(layers::TensorVisitor::with_matrices([&](const std::string& name, kernels::Matrix& w) {
    using Kind = kernels::StoredQuant::Kind;
    if (w.quant.defined()) quant_of[name] = w.quant;
    if (w.quant.kind == Kind::Fp8 || w.quant.kind == Kind::HfFp8) fp8.insert(name);
    if (w.packed && !w.quant.defined()) bytes.insert({name + "_packed", name + "_scale"});
    if (w.quant.kind == Kind::Ggml) bytes.insert(name);  // ggml's blocks: rows of U8
  }));
  const auto dtype_ok = [&](DType t, const std::string& param) {
    if (bytes.count(param)) return t == DType::U8;
    return is_weight_dtype(t, param) || (t == DType::F8_E4M3 && fp8.count(param));
  };
  // A stored tensor checked against what the parameter expects; squeezed where the table allows.
  const auto check = [&](const std::string& param, const std::string& stored, const Shape& shape, bool squeeze,
                         Tensor& out) {
    const TensorEntry& e = ckpt.entry(stored);
    const std::string label = stored == param ? stored : cat(stored, " (for ", param, ")");
    if (!dtype_ok(e.dtype, param)) {
      wrong.push_back(cat(label, ": dtype ", dtype_name(e.dtype), ", expected ",
                          bytes.count(param) ? "U8" : ends_with(param, "_packed") || ends_with(param, "_scale") ? "U8, I32 or a float" : "F32, F16 or BF16"));
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
      if (en.shape != want || e >= en.shape[0] || !dtype_ok(en.dtype, name)) {
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
        // The part's matrix, or one of its quantized companions (kernels/matrix.h, StoredQuant).
        std::string stored, companion;
        for (const char* c : kCompanions) {
          stored = with_suffix(name, part + c, sp.stored + c);
          if (!stored.empty()) {
            companion = c;
            break;
          }
        }
        if (stored.empty() || !ckpt.has(stored)) {
          r0 += rows;
          continue;
        }
        bound.insert(stored);
        const TensorEntry& e = ckpt.entry(stored);
        const int64_t total = per_group * sp.groups;
        if (!companion.empty() && companion != "_packed") {
          std::optional<Tensor> done;
          const auto row_of = [&, r0 = r0, rows = rows](int64_t r) { return (r / rows) * per_group + r0 + r % rows; };
          if (!split_companion(ckpt, stored, companion, quant_of[name.substr(0, name.size() - companion.size())], total,
                               rows * sp.groups, row_of, wrong, done))
            return;
          if (done) {
            t = std::move(*done);
            return;
          }
        }
        const bool expanded = companion.starts_with("_scale") && e.shape.size() == 2 && e.shape[0] != total;
        const Tensor all = expanded ? scale_rows(ckpt.tensor(stored), quant_of[name.substr(0, name.size() - companion.size())], total)
                                    : ckpt.tensor(stored);
        if (all.ndim() == 0 || all.dim(0) != total || !dtype_ok(e.dtype, name)) {
          wrong.push_back(cat(stored, ": shape ", shape_str(e.shape), " ", dtype_name(e.dtype), ", expected ", total,
                              " rows (", sp.groups, " x ", per_group, ", split into its parts) of a float dtype"));
          return;
        }
        Shape part_shape = all.shape();
        part_shape[0] = rows * sp.groups;
        if (part_shape != shape && !expanded) {
          wrong.push_back(cat(stored, ": ", name, "'s rows, shape ", shape_str(part_shape), ", expected ", shape_str(shape)));
          return;
        }
        if (sp.groups == 1) {
          t = all.rows(r0, r0 + rows);
          return;
        }
        Tensor gathered = Tensor::empty(all.dtype(), part_shape);
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
    for (const auto& r : table.renames)
      for (const char* c : kCompanions) {  // a renamed matrix's quantized companions are renamed with it
        const std::string s = with_suffix(name, r.param + c, r.stored + c);
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

model::Model build_model_from_config(const nlohmann::json& cfg, const std::string& cfg_path,
                                     const std::function<bool(const std::string&)>& has_tensor,
                                     const std::function<Shape(const std::string&)>& tensor_shape) {
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
  const model::QuantPlan plan = model::parse_quantization(in.config);
  if (!plan.method.empty()) {
    m.config.quantization = plan.describe();
    m.config.quantization_unused = plan.ignored;
  }
  model::apply_quantization(m, plan, has_tensor, cfg_path);
  // The parsed document, dumped with sorted keys: whitespace and key order do not change it.
  m.config.config_hash = hash64(cfg.dump());
  return m;
}

bool has_weights(const fs::path& dir) {
  return is_gguf(dir) || fs::exists(dir / "model.safetensors") || fs::exists(dir / "model.safetensors.index.json");
}

model::Model checkpoint_skeleton(const fs::path& dir, const Checkpoint& ckpt) {
  const nlohmann::json cfg = read_config(dir);
  return build_model_from_config(
      cfg, (dir / "config.json").string(), [&](const std::string& n) { return ckpt.has(n); },
      [&](const std::string& n) { return ckpt.has(n) ? ckpt.entry(n).shape : Shape{}; });
}

Skeleton load_skeleton(const fs::path& dir) {
  const nlohmann::json cfg = read_config(dir);
  Skeleton s;
  s.model = build_model_from_config(cfg, (dir / "config.json").string(), [](const std::string&) { return false; }, {});
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

LoadedModel load_model(const fs::path& dir, bool with_tokenizer, WeightStorage storage, const StreamOptions* stream) {
  if (is_gguf(dir)) return load_gguf(dir, with_tokenizer, storage, stream);
  const nlohmann::json cfg = read_config(dir);
  auto ckpt = std::make_shared<Checkpoint>(Checkpoint::open(dir));
  LoadedModel out = load_checkpoint(cfg, (dir / "config.json").string(), ckpt, dir.string(), storage, {}, stream);
  out.dir = dir;
  if (with_tokenizer && (fs::exists(dir / "tokenizer.json") || fs::exists(dir / "vocab.json") ||
                         fs::exists(dir / "tiktoken.model")))
    out.tokenizer = lineage::tokenizer::Tokenizer::load(dir);
  return out;
}

LoadedModel load_checkpoint(const nlohmann::json& cfg, const std::string& cfg_path, std::shared_ptr<Checkpoint> ckpt,
                            const std::string& where, WeightStorage storage,
                            const std::function<void(model::Model&)>& adjust, const StreamOptions* stream) {
  LoadedModel out;
  out.model = build_model_from_config(
      cfg, cfg_path, [&](const std::string& n) { return ckpt->has(n); },
      [&](const std::string& n) { return ckpt->has(n) ? ckpt->entry(n).shape : Shape{}; });
  if (adjust) adjust(out.model);
  const int64_t held = checkpoint_layers(*ckpt, out.model.names.layer_prefix);
  if (held != out.model.n_layers())
    throw Error(cat(cfg_path, ": field \"", out.model.config.layers_field, "\": expected ", held, " (the checkpoint holds ",
                    held ? cat("layers ", out.model.names.layer_prefix, "0 .. ", out.model.names.layer_prefix, held - 1)
                         : cat("no tensor named ", out.model.names.layer_prefix, "N.*"),
                    "), found ", out.model.n_layers()));
  bind_weights(out.model, *ckpt, where);
  // Streamed experts leave the model here, before the checks and the preparation below read them.
  if (stream) out.experts = stream_experts(out.model, *stream, out.stream_plan);
  if (out.model.trunk && storage == WeightStorage::Owned)
    throw Error(cat(where, ": under --memory-budget ", stream->budget, " bytes its trunk streams layer by layer from the mapped "
                    "files, which --no-mmap would copy whole (", out.stream_plan.trunk.streamed_bytes,
                    " bytes): leave out --no-mmap"));
  check_mxfp4_scales(out.model, where);
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
    model::prepare_quantized(out.model, where);
    model::prepare(out.model, true);
  } else {
    model::prepare_quantized(out.model, where);
    model::prepare(out.model, false);
    out.checkpoint = ckpt;
  }
  return out;
}

}  // namespace lineage::io
