// The `lineage` Python module: models (loaded or preset), sessions over them, their per-layer state
// as NumPy arrays, state files and generation (docs/python.md). A thin layer over io::load_model,
// runtime::Session, model::state_arrays, runtime::save_state / load_state and runtime::generate.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "lineage/core/dtype.h"
#include "lineage/core/error.h"
#include "lineage/core/parallel.h"
#include "lineage/io/expert_stream.h"
#include "lineage/io/load_model.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/threads.h"
#include "lineage/model/accounting.h"
#include "lineage/model/archs/presets.h"
#include "lineage/model/quantization.h"
#include "lineage/model/state_pool.h"
#include "lineage/runtime/generate.h"
#include "lineage/runtime/session.h"
#include "lineage/runtime/state_file.h"
#include "lineage/runtime/trace_record.h"

namespace py = pybind11;

namespace lineage::python {

namespace {

namespace fs = std::filesystem;

// A Python Model is a shared LoadedModel: every Session made from it holds a reference, since a
// runtime::Session borrows its model and must not outlive it. Presets have no checkpoint and no
// tokenizer (unless one is given); `source` names the directory or preset in messages.
struct ModelHandle {
  io::LoadedModel loaded;
  std::string source;

  const model::Model& model() const { return loaded.model; }
  const tokenizer::Tokenizer& tokenizer(const char* what) const {
    if (!loaded.tokenizer)
      throw Error(cat(source, ": ", what, " needs a tokenizer, and this model has none (a model directory "
                      "holds tokenizer.json, vocab.json + merges.txt or tiktoken.model; a preset takes "
                      "tokenizer=DIR)"));
    return *loaded.tokenizer;
  }
};
using ModelPtr = std::shared_ptr<ModelHandle>;

const char* kind_name(const model::TokenMixer& mixer) {
  return std::visit(
      [](const auto& m) -> const char* {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, layers::Attention> || std::is_same_v<T, layers::GatedAttention>) return "attention";
        else if constexpr (std::is_same_v<T, layers::Mla>) return "mla";
        else return "delta_rule";
      },
      mixer);
}

py::object optional_int(const std::optional<int32_t>& v) { return v ? py::object(py::int_(*v)) : py::none(); }

py::dict config_dict(const ModelHandle& h) {
  const model::ModelConfig& c = h.model().config;
  const model::StateCost cost = model::state_cost(h.model());
  py::dict d;
  d["model_type"] = c.model_type;
  d["description"] = c.description;
  d["vocab_size"] = c.vocab_size;
  d["d_model"] = c.d_model;
  d["n_layers"] = h.model().n_layers();
  d["max_positions"] = c.max_positions;  // 0: no limit (recurrent models)
  d["tied_lm_head"] = c.tied_lm_head;
  d["bos_token_id"] = optional_int(c.bos_token_id);
  d["eos_token_id"] = optional_int(c.eos_token_id);
  d["state_bytes_per_token"] = cost.per_token;
  d["state_bytes_fixed"] = cost.fixed;
  d["identity"] = model::identity(h.model()).str();
  return d;
}

// Logits as a fresh array ([V], or [T, V]): a copy, so the engine may reuse its buffer on the next call.
py::array_t<float> logits_array(std::span<const float> logits, int64_t rows, int64_t V, bool as_rows) {
  py::array_t<float> a = as_rows ? py::array_t<float>({rows, V}) : py::array_t<float>({V});
  std::memcpy(a.mutable_data(), logits.data(), logits.size() * sizeof(float));
  return a;
}

// Copies a strided view (StateArray: row-major shape, strides in elements) into contiguous `dst`.
void copy_strided(const float* src, const model::StateArray& a, size_t dim, float*& dst) {
  if (dim + 1 == a.shape.size()) {
    for (int64_t i = 0; i < a.shape[dim]; ++i) *dst++ = src[i * a.strides[dim]];
    return;
  }
  for (int64_t i = 0; i < a.shape[dim]; ++i) copy_strided(src + i * a.strides[dim], a, dim + 1, dst);
}

py::array_t<float> state_array(const model::StateArray& a) {
  py::array_t<float> out(a.shape);
  float* dst = out.mutable_data();
  if (a.data == nullptr || a.elements() == 0)
    std::fill(dst, dst + a.elements(), 0.0f);  // a cache that holds no position yet
  else
    copy_strided(a.data, a, 0, dst);
  return out;
}

// One sequence over a model. The engine's calls run without the GIL, so two Python threads may
// drive two sessions at once; one session used from two threads at once is refused (Error) rather
// than left to race on its buffers.
class PySession {
 public:
  explicit PySession(ModelPtr m) : model_(std::move(m)), session_(model_->model()) {}

  py::array_t<float> prefill(const std::vector<int32_t>& tokens, bool all_positions) {
    std::unique_lock lock = claim();
    std::span<const float> logits;
    {
      py::gil_scoped_release release;
      logits = session_.prefill(tokens, all_positions);
    }
    remember(logits, all_positions ? int64_t(tokens.size()) : 1, all_positions);
    return logits_array(logits, last_rows_, vocab(), all_positions);
  }

  py::array_t<float> decode(int32_t token) {
    std::unique_lock lock = claim();
    std::span<const float> logits;
    {
      py::gil_scoped_release release;
      logits = session_.decode(token);
    }
    remember(logits, 1, false);
    return logits_array(logits, 1, vocab(), false);
  }

  // The text generated, sampled from the last logits on: the prompt continues the session's
  // sequence (a text prompt on an empty session gets the tokenizer's BOS where it adds one). Every
  // sampled token, the EOS that stopped it included, is fed, so the state, tokens and logits
  // afterwards are those of the whole sequence and a saved state continues it.
  std::string generate(const std::variant<std::string, std::vector<int32_t>>& prompt, const runtime::GenerateOptions& opt) {
    std::unique_lock lock = claim();
    const tokenizer::Tokenizer& tok = model_->tokenizer("generate");
    std::vector<int32_t> ids;
    if (const auto* text = std::get_if<std::string>(&prompt)) {
      ids = tok.encode(*text);
      if (session_.position() == 0 && tok.adds_bos() && tok.bos_id()) ids.insert(ids.begin(), *tok.bos_id());
    } else {
      ids = std::get<std::vector<int32_t>>(prompt);
    }
    const std::span<const float> previous = last_token_logits();
    std::string text;
    runtime::GenerateStats st;
    {
      py::gil_scoped_release release;
      st = runtime::generate(session_, tok, ids, opt, [&](std::string_view piece) { text += piece; }, previous);
    }
    // Without last_logits the context limit stopped it before the last token was fed: the logits
    // after the session's last token are then not at hand.
    last_.clear();
    if (!st.last_logits.empty()) remember(st.last_logits, 1, false);
    return text;
  }

  int64_t position() const {
    std::unique_lock lock = claim();
    return session_.position();
  }
  std::vector<int32_t> tokens() const {
    std::unique_lock lock = claim();
    return {session_.tokens().begin(), session_.tokens().end()};
  }
  size_t state_bytes() const {
    std::unique_lock lock = claim();
    return session_.state().bytes();
  }

  void reset() {
    std::unique_lock lock = claim();
    session_.reset();
    last_.clear();
  }

  py::object logits() const {
    std::unique_lock lock = claim();
    if (last_.empty()) return py::none();
    return logits_array(last_, last_rows_, vocab(), last_as_rows_);
  }

  py::list state() {
    std::unique_lock lock = claim();
    // state_arrays hands out writable views (state files fill them); these are only read and copied.
    auto& s = const_cast<model::SequenceState&>(session_.state());
    const model::Model& m = model_->model();
    py::list out;
    for (size_t i = 0; i < m.blocks.size(); ++i) {
      py::dict arrays;
      for (const model::StateArray& a : model::state_arrays(m, s, i)) arrays[py::str(a.name)] = state_array(a);
      py::dict layer;
      layer["kind"] = kind_name(m.blocks[i].mixer);
      layer["arrays"] = arrays;
      out.append(layer);
    }
    return out;
  }

  void save(const fs::path& path) {
    std::unique_lock lock = claim();
    const std::span<const float> logits = last_token_logits();
    runtime::SavedState saved{session_.state().clone(),
                              {session_.tokens().begin(), session_.tokens().end()},
                              {logits.begin(), logits.end()},
                              std::nullopt,
                              {}};
    py::gil_scoped_release release;
    runtime::save_state(path, model_->model(), saved);
  }

  void load(const fs::path& path) {
    std::unique_lock lock = claim();
    runtime::SavedState saved;
    {
      py::gil_scoped_release release;
      saved = runtime::load_state(path, model_->model());
      session_.restore(saved.state, saved.tokens);
    }
    last_.clear();
    if (!saved.logits.empty()) remember(saved.logits, 1, false);
  }

  // lineage trace's recording of `prompt` from an empty sequence (runtime/trace_record.h), as NumPy
  // arrays; this session's own sequence is left as it was.
  py::dict trace(const std::variant<std::string, std::vector<int32_t>>& prompt, bool states) {
    std::unique_lock lock = claim();
    std::vector<int32_t> ids;
    if (const auto* text = std::get_if<std::string>(&prompt)) {
      const tokenizer::Tokenizer& tok = model_->tokenizer("trace");
      ids = tok.encode(*text);
      if (tok.adds_bos() && tok.bos_id()) ids.insert(ids.begin(), *tok.bos_id());
    } else {
      ids = std::get<std::vector<int32_t>>(prompt);
    }
    runtime::TraceOptions options;
    if (states) options.keep_state = [](int64_t, int64_t) { return true; };
    runtime::TraceRecording r;
    {
      py::gil_scoped_release release;
      r = runtime::record_trace(model_->model(), ids, options);
    }
    return trace_dict(r, states);
  }

  const ModelPtr& model() const { return model_; }

 private:
  static py::array_t<float> floats(const std::vector<float>& v, std::vector<int64_t> shape) {
    py::array_t<float> a(shape);
    std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(float));
    return a;
  }

  static py::dict trace_dict(const runtime::TraceRecording& r, bool states) {
    const int64_t T = int64_t(r.tokens.size());
    py::dict out;
    out["tokens"] = r.tokens;
    out["state_bytes"] = r.state_bytes;
    out["softmax_bytes"] = r.softmax_bytes;
    out["next_id"] = r.next_id;
    out["next_p"] = r.next_p;
    py::list layers;
    for (const runtime::TraceLayer& l : r.layers) {
      py::dict d;
      d["kind"] = l.kind;
      d["heads"] = l.heads;
      d["bytes_per_token"] = l.bytes_per_token;
      d["fixed_bytes"] = l.fixed_bytes;
      if (l.mixer == runtime::TraceMixer::DeltaRule) {
        const int64_t H = l.qk_heads, HV = l.heads, K = l.dk, V = l.dv;
        d["mixer"] = "delta_rule";
        d["erase"] = l.erase;
        d["gate"] = l.gate == 0 ? "none" : l.gate == 1 ? "head" : "channel";
        d["q"] = floats(l.q, {T, H, K});
        d["k"] = floats(l.k, {T, H, K});
        d["v"] = floats(l.v, {T, HV, V});
        d["beta"] = floats(l.beta, {T, HV});
        if (l.gate) d["log_decay"] = floats(l.log_decay, l.gate == 1 ? std::vector<int64_t>{T, HV} : std::vector<int64_t>{T, HV, K});
        d["read_out"] = floats(l.out, {T, HV, V});
        d["recalled"] = floats(l.recalled, {T, HV, V});
        d["norms"] = floats(l.norms, {T, HV, 5});
        d["residual"] = l.worst_residual;
        if (states) {
          py::array_t<float> S({T, HV, K, V});
          for (int64_t h = 0; h < HV; ++h)
            for (int64_t t = 0; t < T; ++t)
              std::memcpy(S.mutable_data() + (t * HV + h) * K * V, l.states.at(h).data() + t * K * V,
                          size_t(K * V) * sizeof(float));
          d["states"] = S;
          py::array_t<float> P({T, HV, int64_t(3), K, V});
          for (int64_t h = 0; h < HV; ++h)
            for (int64_t t = 0; t < T; ++t)
              std::memcpy(P.mutable_data() + (t * HV + h) * 3 * K * V, l.parts.at(h).data() + t * 3 * K * V,
                          size_t(3 * K * V) * sizeof(float));
          d["parts"] = P;
        }
      } else {
        d["mixer"] = l.mixer == runtime::TraceMixer::Mla ? "mla" : "attention";
        py::array_t<float> w({T, l.heads, T});  // token t's weights over keys 0 .. t, zeros after
        float* dst = w.mutable_data();
        std::fill(dst, dst + T * l.heads * T, 0.0f);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t h = 0; h < l.heads; ++h)
            std::memcpy(dst + (t * l.heads + h) * T, l.weights.data() + l.heads * t * (t + 1) / 2 + h * (t + 1),
                        size_t(t + 1) * sizeof(float));
        d["weights"] = w;
      }
      if (l.experts) {
        d["expert_ids"] = py::array_t<int32_t>(std::vector<int64_t>{T, l.top_k}, l.expert_ids.data());
        d["expert_weights"] = floats(l.expert_weights, {T, l.top_k});
      }
      if (l.attn_res_sources) d["attn_res"] = floats(l.attn_res, {T, l.attn_res_sources});
      if (l.mlp_res_sources) d["mlp_res"] = floats(l.mlp_res, {T, l.mlp_res_sources});
      layers.append(d);
    }
    out["layers"] = layers;
    return out;
  }

  int64_t vocab() const { return model_->model().config.vocab_size; }

  std::unique_lock<std::mutex> claim() const {
    std::unique_lock lock(busy_, std::try_to_lock);
    if (!lock.owns_lock()) throw Error("this Session is in use by another thread; give each thread its own Session");
    return lock;
  }

  void remember(std::span<const float> logits, int64_t rows, bool as_rows) {
    last_.assign(logits.begin(), logits.end());
    last_rows_ = rows;
    last_as_rows_ = as_rows;
  }

  // The distribution after the session's last token (the last row of what was last returned).
  std::span<const float> last_token_logits() const {
    if (last_.empty()) return {};
    return std::span<const float>(last_).subspan(last_.size() - size_t(vocab()));
  }

  ModelPtr model_;  // declared before session_, which borrows its model
  runtime::Session session_;
  std::vector<float> last_;  // the last logits returned: [last_rows_, V]
  int64_t last_rows_ = 0;
  bool last_as_rows_ = false;  // returned as [T, V] (prefill with all_positions)
  mutable std::mutex busy_;  // held by the call in progress (claim)
};

ModelPtr load(const fs::path& dir, bool mmap, bool int8_dot, bool bf16_exact, const std::optional<std::string>& budget,
              const std::string& expert_cache) {
  auto h = std::make_shared<ModelHandle>();
  {
    py::gil_scoped_release release;
    // As the CLI's --memory-budget / --expert-cache (docs/streaming.md).
    if (expert_cache != "global" && expert_cache != "per-layer")
      throw Error(cat("expert_cache \"", expert_cache, "\": expected \"global\" or \"per-layer\""));
    io::StreamOptions so;
    so.budget = budget ? io::parse_bytes(*budget, "memory_budget") : io::available_memory();
    so.policy = expert_cache == "per-layer" ? io::CachePolicy::PerLayer : io::CachePolicy::Global;
    h->loaded = io::load_model(dir, true, mmap ? io::WeightStorage::Mapped : io::WeightStorage::Owned,
                               so.budget > 0 ? &so : nullptr);
    const bool int8 = int8_dot && kernels::int8_dot_available();
    model::set_int8_dot(h->loaded.model, int8);
    if (h->loaded.experts) io::set_stream_int8_dot(*h->loaded.experts, int8);
    h->loaded.model.options.bf16_dot = !bf16_exact;
  }
  h->source = dir.string();
  return h;
}

ModelPtr preset(const std::string& name, uint64_t seed, const std::string& dtype,
                const std::optional<fs::path>& tokenizer) {
  const std::optional<DType> dt = dtype_from_user(dtype);
  if (!dt) throw Error(cat("preset dtype \"", dtype, "\": expected f32, f16 or bf16"));
  auto h = std::make_shared<ModelHandle>();
  {
    py::gil_scoped_release release;
    h->loaded.model = model::make_preset(name, seed, *dt);
    if (tokenizer) h->loaded.tokenizer = tokenizer::Tokenizer::load(*tokenizer);
  }
  h->source = cat("preset ", name);
  return h;
}

runtime::GenerateOptions generate_options(const ModelHandle& h, int max_tokens, float temperature, int top_k,
                                          float top_p, uint64_t seed, bool stop_at_eos) {
  if (max_tokens < 0) throw Error(cat("generate: max_tokens ", max_tokens, ": expected >= 0"));
  if (!(temperature >= 0)) throw Error(cat("generate: temperature ", temperature, ": expected >= 0"));
  if (top_k < 0) throw Error(cat("generate: top_k ", top_k, ": expected >= 0 (0 = off)"));
  if (!(top_p > 0 && top_p <= 1)) throw Error(cat("generate: top_p ", top_p, ": expected in (0, 1]"));
  runtime::GenerateOptions opt;
  opt.max_tokens = max_tokens;
  opt.sampling = {temperature, top_k, top_p, seed};
  opt.feed_last = true;
  // As the CLI: the config's EOS, else the tokenizer's.
  if (stop_at_eos) opt.eos = h.model().config.eos_token_id ? h.model().config.eos_token_id : h.tokenizer("generate").eos_id();
  return opt;
}

}  // namespace

}  // namespace lineage::python

PYBIND11_MODULE(lineage, m) {
  using namespace lineage;
  using namespace lineage::python;
  m.doc() = "lineage: a CPU inference engine for GPT-2, linear attention, DeltaNet, KDA and Kimi Linear";

  py::register_exception<Error>(m, "Error", PyExc_RuntimeError);
  // As the CLI does at start: all cores, OpenBLAS single-threaded inside the engine's threads.
  kernels::set_threads(0);
  m.def("set_threads", &kernels::set_threads, py::arg("n"), "Worker threads for every model (n <= 0: all cores).");
  m.def("num_threads", &num_threads);

  py::class_<ModelHandle, ModelPtr>(m, "Model", "A model: its weights, configuration and tokenizer, if any.")
      .def_static("load", &load, py::arg("dir"), py::arg("mmap") = true, py::arg("int8_dot") = false,
                  py::arg("bf16_exact") = false, py::arg("memory_budget") = std::nullopt,
                  py::arg("expert_cache") = "global",
                  "Loads a Hugging Face model directory (config.json, safetensors, tokenizer files). "
                  "mmap=False copies the weights into memory instead of mapping the files; int8_dot=True "
                  "multiplies int4 / int8 quantized weights with int8 activations where the CPU has "
                  "AVX512_VNNI (the CLI's --int8-dot; see int8_dot_available()); bf16_exact=True widens "
                  "BF16 and MXFP4 weights to f32 for exact products instead of the bf16 dot products "
                  "(x rounded to bf16) that run by default where the CPU has AVX512_BF16 (the CLI's "
                  "--bf16-exact; see bf16_dot_available()). memory_budget (\"8G\", bytes as a string; default: the "
                  "memory available) bounds the resident weights: a MoE model that does not fit reads its routed "
                  "experts from the files as the router chooses them, into an expert_cache (\"global\" or "
                  "\"per-layer\") of what the budget leaves (the CLI's --memory-budget; docs/streaming.md).")
      .def_static("bf16_dot_available", &kernels::bf16_dot_available,
                  "Whether this CPU runs the default bf16 dot products for BF16 and MXFP4 weights (AVX512_BF16).")
      .def_static("int8_dot_available", &kernels::int8_dot_available,
                  "Whether this CPU runs load(..., int8_dot=True)'s int8 activations (AVX512_VNNI).")
      .def_static("preset", &preset, py::arg("name"), py::arg("seed") = 0, py::arg("dtype") = "f32",
                  py::arg("tokenizer") = py::none(),
                  "A built-in architecture with seeded random weights; tokenizer: a directory of tokenizer files.")
      .def_static("presets", [] {
        py::dict d;
        for (const model::Preset& p : model::presets()) d[py::str(p.name)] = p.summary;
        return d;
      }, "Preset names and their one-line summaries.")
      .def_property_readonly("config", &config_dict)
      .def_property_readonly("layer_kinds", [](const ModelHandle& h) {
        std::vector<std::string> kinds;
        for (const model::Block& b : h.model().blocks) kinds.emplace_back(kind_name(b.mixer));
        return kinds;
      }, "\"attention\", \"mla\" or \"delta_rule\" per layer.")
      .def_property_readonly("has_tokenizer", [](const ModelHandle& h) { return h.loaded.tokenizer.has_value(); })
      .def("encode", [](const ModelHandle& h, const std::string& text, bool allow_special) {
        return h.tokenizer("encode").encode(text, allow_special);
      }, py::arg("text"), py::arg("allow_special") = true, "Token ids of text (no BOS added).")
      .def("decode", [](const ModelHandle& h, const std::vector<int32_t>& ids) {
        // The tokens' raw bytes may end mid-character; invalid UTF-8 becomes U+FFFD.
        const std::string bytes = h.tokenizer("decode").decode(ids);
        PyObject* text = PyUnicode_DecodeUTF8(bytes.data(), py::ssize_t(bytes.size()), "replace");
        if (!text) throw py::error_already_set();
        return py::reinterpret_steal<py::str>(text);
      }, py::arg("ids"))
      .def("__repr__", [](const ModelHandle& h) {
        const model::ModelConfig& c = h.model().config;
        return cat("<lineage.Model ", c.model_type, " from ", h.source, ": ", h.model().n_layers(), " layers, d_model ",
                   c.d_model, ", vocab ", c.vocab_size, ">");
      });

  py::class_<PySession>(m, "Session", "One sequence over a model: logits, state, state files, generation.")
      .def(py::init<ModelPtr>(), py::arg("model"))
      .def("prefill", &PySession::prefill, py::arg("tokens"), py::arg("all_positions") = false,
           "Feeds tokens; returns float32 logits of the last one [V], or of every one [T, V].")
      .def("decode", &PySession::decode, py::arg("token"), "Feeds one token; returns its logits [V].")
      .def("generate", [](PySession& s, const std::variant<std::string, std::vector<int32_t>>& prompt, int max_tokens,
                          float temperature, int top_k, float top_p, uint64_t seed, bool stop_at_eos) {
        return s.generate(prompt, generate_options(*s.model(), max_tokens, temperature, top_k, top_p, seed, stop_at_eos));
      }, py::arg("prompt"), py::arg("max_tokens") = 64, py::arg("temperature") = 0.0f, py::arg("top_k") = 0,
         py::arg("top_p") = 1.0f, py::arg("seed") = 0, py::arg("stop_at_eos") = true,
         "Generates text after the prompt (a string, or token ids as given); temperature 0 is greedy. "
         "The prompt continues the session's sequence; \"\" or [] continues from the last logits.")
      .def("trace", &PySession::trace, py::arg("prompt"), py::arg("states") = true,
           "Records a sequence (text or token ids) from an empty state, one decode step a token, as lineage "
           "trace does: per layer and token the softmax weights, or the delta rule's q, k, v, beta, decay, "
           "read-out, recalled S~^T k, the parts' norms and (states=True) the state after each token; the "
           "experts chosen; AttnRes weights. This session's own sequence is left as it was.")
      .def_property_readonly("position", &PySession::position)
      .def_property_readonly("tokens", &PySession::tokens)
      .def_property_readonly("logits", &PySession::logits, "The last logits returned (a copy), or None.")
      .def_property_readonly("state_bytes", &PySession::state_bytes)
      .def_property_readonly("model", &PySession::model)
      .def("state", &PySession::state,
           "Per layer {\"kind\", \"arrays\": {name: float32 copy}}: attention k, v [H, T, hd]; mla kv "
           "[T, kv_lora_rank + rope dims]; delta_rule S [HV, K, V] (with z [HV, K], conv_tail [W - 1, C]).")
      .def("reset", &PySession::reset)
      .def("save", &PySession::save, py::arg("path"), "Writes the state, tokens and last logits to a state file.")
      .def("load", &PySession::load, py::arg("path"), "Continues from a state file of this model.")
      .def("__repr__", [](const PySession& s) { return cat("<lineage.Session at position ", s.position(), ">"); });
}
