#include "lineage/io/load_model.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <set>

#include "lineage/core/error.h"
#include "lineage/io/json_read.h"
#include "lineage/model/archs/arch.h"

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

void bind_weights(model::Model& m, const Checkpoint& ckpt, const std::string& where) {
  std::vector<std::string> missing, wrong;
  std::set<std::string> bound;
  m.for_each_tensor([&](const std::string& name, Tensor& t, const Shape& shape, layers::Init) {
    if (!ckpt.has(name)) {
      missing.push_back(cat(name, " ", shape_str(shape)));
      return;
    }
    bound.insert(name);
    const TensorEntry& e = ckpt.entry(name);
    if (e.dtype != DType::F32 && e.dtype != DType::F16 && e.dtype != DType::BF16)
      wrong.push_back(cat(name, ": dtype ", dtype_name(e.dtype), ", expected F32, F16 or BF16"));
    else if (e.shape != shape)
      wrong.push_back(cat(name, ": shape ", shape_str(e.shape), ", expected ", shape_str(shape)));
    else
      t = ckpt.tensor(name);
  });
  std::vector<std::string> unexpected;
  for (const auto& name : ckpt.names()) {
    if (bound.count(name)) continue;
    bool ignored = false;
    for (const auto& s : m.ignored_suffixes) ignored = ignored || ends_with(name, s);
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

LoadedModel load_model(const fs::path& dir, bool with_tokenizer, WeightStorage storage) {
  const nlohmann::json cfg = read_config(dir);
  const std::string cfg_path = (dir / "config.json").string();
  if (!cfg.contains("model_type") || !cfg["model_type"].is_string())
    throw Error(cat(cfg_path, ": field \"model_type\": expected a string naming the architecture (one of ",
                    model::known_model_types(), ")"));
  const std::string type = cfg["model_type"];
  const model::ArchBuilder* build = model::find_arch(type);
  if (!build)
    throw Error(cat(cfg_path, ": field \"model_type\": \"", type, "\" is not supported; expected one of ",
                    model::known_model_types()));
  auto ckpt = std::make_shared<Checkpoint>(Checkpoint::open(dir));
  LoadedModel out;
  out.model = (*build)(model::ArchInput{model::ConfigFields(cfg, cfg_path),
                                        [&](const std::string& n) { return ckpt->has(n); }});
  const int64_t held = checkpoint_layers(*ckpt, out.model.names.layer_prefix);
  if (held != out.model.n_layers())
    throw Error(cat(cfg_path, ": field \"", out.model.config.layers_field, "\": expected ", held, " (the checkpoint holds ",
                    held ? cat("layers ", out.model.names.layer_prefix, "0 .. ", out.model.names.layer_prefix, held - 1)
                         : cat("no tensor named ", out.model.names.layer_prefix, "N.*"),
                    "), found ", out.model.n_layers()));
  bind_weights(out.model, *ckpt, dir.string());
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
  if (with_tokenizer && (fs::exists(dir / "tokenizer.json") || fs::exists(dir / "vocab.json")))
    out.tokenizer = Tokenizer::load(dir);
  return out;
}

}  // namespace lineage::io
