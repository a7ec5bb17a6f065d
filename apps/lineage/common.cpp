#include "common.h"
#include "ranks.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <variant>

#include "lineage/core/error.h"
#include "lineage/core/rng.h"
#include "lineage/io/expert_stream.h"
#include "lineage/io/gguf_model.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/matrix.h"
#include "lineage/layers/common.h"
#include "lineage/kernels/threads.h"
#include "lineage/model/archs/presets.h"
#include "lineage/model/model.h"
#include "lineage/model/accounting.h"
#include "lineage/model/quantization.h"

namespace lineage::app {

namespace {

// Each subcommand's model source, so that parsing can fill in the default model (add_threads_option's
// parse-complete callback, which every subcommand with model options has).
std::map<const CLI::App*, ModelSource*>& model_sources() {
  static std::map<const CLI::App*, ModelSource*> sources;
  return sources;
}

}  // namespace

std::string default_model_dir() {
  if (const char* env = std::getenv("LINEAGE_MODEL"); env && *env) return env;
#ifdef LINEAGE_DEFAULT_MODEL_DIR
  if (std::filesystem::exists(std::filesystem::path(LINEAGE_DEFAULT_MODEL_DIR) / "config.json"))
    return LINEAGE_DEFAULT_MODEL_DIR;
#endif
  return "";
}

void add_model_options(CLI::App& cmd, ModelSource& src, bool allow_preset) {
  model_sources()[&cmd] = &src;
  auto* model = cmd.add_option("--model", src.dir,
                               "Hugging Face model directory (config.json + safetensors) or a GGUF file; default: "
                               "the model lineage ships (models/kjv-gpt2, or $LINEAGE_MODEL)");
  cmd.add_flag("--no-mmap", src.no_mmap,
               "copy the checkpoint's weights into the engine's own memory (huge pages; GPT-2's Conv1D matrices "
               "transposed to [out, in]) instead of mapping the files: slower to load, faster decode")
      ->needs(model);
  cmd.add_flag("--check-tensors", src.check_tensors,
               "scan every weight once at load for NaN or Inf and name the first tensor that holds one");
  cmd.add_option("--memory-budget", src.memory_budget,
                 "bytes the weights may hold resident (K, M, G, T: powers of 1024; default: the memory available). "
                 "A model that does not fit keeps its trunk resident and reads its routed experts from the files "
                 "as the router chooses them, into an expert cache of what the budget leaves; a trunk that does "
                 "not fit either streams a sublayer at a time");
  cmd.add_option("--expert-cache", src.expert_cache, "the streamed experts' cache: one LRU over all layers, or split "
                                                      "evenly per layer")
      ->check(CLI::IsMember({"global", "per-layer"}));
  cmd.add_option("--parallel", src.parallel,
                 "under mpirun: tensor (every matrix split by output rows, each routed expert too; the default) or "
                 "expert (the routed experts placed by rank, each run whole by its rank; the rest split by rows)")
      ->check(CLI::IsMember({"tensor", "expert"}));
  if (!allow_preset) {
    model->required();
    return;
  }
  auto* preset = cmd.add_option("--preset", src.preset, "built-in architecture with seeded random weights: " +
                                                            model::preset_names());
  model->excludes(preset);
  preset->excludes(model);
  cmd.add_option("--seed", src.seed, "seed of the preset's random weights (and of sampling)");
  cmd.add_option("--weights-dtype", src.weights_dtype, "storage dtype of preset weights: f32, f16 or bf16")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  cmd.add_option("--tokenizer", src.tokenizer_dir, "directory with tokenizer files (for --prompt with --preset)");
}

void add_threads_option(CLI::App& cmd) {
  static int threads = 0;
  cmd.add_option("--threads", threads, "worker threads (default: all cores)")->check(CLI::Range(1, 1024));
  cmd.preparse_callback([](size_t) { kernels::set_threads(0); });
  cmd.parse_complete_callback([&cmd] {
    kernels::set_threads(threads);
    const auto it = model_sources().find(&cmd);
    if (it != model_sources().end() && it->second->dir.empty() && it->second->preset.empty())
      it->second->dir = default_model_dir();
  });
}

namespace {

// A flag asking for a faster product the CPU may lack (`feature`): sets `field` to `value`, and says on
// stderr where the exact products run instead.
std::function<void()> fast_products(const char* flag, const char* feature, bool available, bool& field, bool value) {
  return [=, &field] {
    field = value;
    if (!available)
      std::fprintf(stderr, "lineage: %s: this CPU (or LINEAGE_ISA) has no %s; using exact f32 products\n", flag, feature);
  };
}

}  // namespace

void add_numerics_options(CLI::App& cmd, ModelSource& src) {
  // Flag callbacks, not the subcommand's parse callbacks: those belong to add_threads_option.
  CLI::Option* dot = cmd.add_flag_callback(
      "--bf16-dot", fast_products("--bf16-dot", "AVX512_BF16", kernels::bf16_dot_available(), src.bf16_exact, false),
      "BF16 and MXFP4 weights: round activations to bf16 and multiply with vdpbf16ps, in decode and prefill "
      "alike (~1.7e-3 relative error per product, as llama.cpp does for bf16 weights; MXFP4's values are exact "
      "in bf16); the default where the CPU has AVX512_BF16");
  CLI::Option* exact = cmd.add_flag_callback(
      "--bf16-exact", [&src] { src.bf16_exact = true; },
      "BF16 and MXFP4 weights: widen to f32 and multiply with f32 FMAs (the stored weights' exact products; "
      "about half the bf16 dot products' arithmetic rate, and MXFP4's decode 1.3x slower)");
  dot->excludes(exact);
  cmd.add_flag_callback(
      "--int8-dot", fast_products("--int8-dot", "AVX512_VNNI", kernels::int8_dot_available(), src.int8_dot, true),
      "quantized int4 / int8 weights: quantize activations to int8 per 32 values and multiply with vpdpbusd "
      "(as llama.cpp does for its integer formats; error measured in docs/quantization.md); off by default: "
      "every weight decoded to f32, exact products");
}

bool has_bf16_weights(const model::ParamCount& pc) {
  return std::any_of(pc.bytes_by_dtype.begin(), pc.bytes_by_dtype.end(),
                     [](const auto& d) { return d.first == DType::BF16 && d.second; });
}

bool bf16_dot(const model::Model& m) { return m.options.bf16_dot && kernels::bf16_dot_available(); }

std::string bf16_products_label(const model::Model& m) {
  return bf16_dot(m) ? "bf16 dot products (--bf16-exact: exact f32 products)" : "exact f32 products";
}

void apply_options(const ModelSource& src, model::Model& m) {
  m.options.bf16_dot = !src.bf16_exact;
  model::set_int8_dot(m, src.int8_dot && kernels::int8_dot_available());
}

tokenizer::Tokenizer load_tokenizer(const std::filesystem::path& dir_or_gguf) {
  if (!io::is_gguf(dir_or_gguf)) return tokenizer::Tokenizer::load(dir_or_gguf);
  std::optional<tokenizer::Tokenizer> t = io::gguf_tokenizer(io::GgufFile(dir_or_gguf));
  if (!t) throw Error(cat(dir_or_gguf.string(), ": no vocabulary (tokenizer.ggml.model is absent or no_vocab)"));
  return std::move(*t);
}

io::LoadedModel load(const ModelSource& src, bool need_tokenizer, bool stream) {
  if (src.dir.empty() && src.preset.empty())
    throw Error("one of --model DIR or --preset NAME is required (the default model, models/kjv-gpt2, is not there)");
  // Under the memory budget: the routed experts stream from the files when the weights do not fit.
  io::StreamOptions so;
  so.budget = src.memory_budget.empty() ? io::available_memory() : io::parse_bytes(src.memory_budget, "--memory-budget");
  so.policy = src.expert_cache == "per-layer" ? io::CachePolicy::PerLayer : io::CachePolicy::Global;
  if (ranks().size() > 1) {  // each rank maps only its rows (release_unowned), which the trunk's units do not know
    so.trunk = false;
    so.no_trunk_stream = "across ranks (mpirun): give each rank a budget its share of the trunk fits in";
  }
  const bool streams = stream && so.budget > 0;
  set_parallel(src.parallel);
  io::LoadedModel m;
  if (!src.dir.empty()) {
    m = io::load_model(src.dir, need_tokenizer, src.no_mmap ? io::WeightStorage::Owned : io::WeightStorage::Mapped,
                       streams ? &so : nullptr);
  } else {
    m.model = model::make_preset(src.preset, src.seed, *dtype_from_user(src.weights_dtype));
    if (!src.tokenizer_dir.empty()) m.tokenizer = load_tokenizer(src.tokenizer_dir);
    if (streams) m.experts = io::stream_experts(m.model, so, m.stream_plan);  // a preset's are owned: fits, or an Error
  }
  if (src.check_tensors) model::check_tensors_finite(m.model, src.dir.empty() ? "--preset " + src.preset : src.dir);
  apply_options(src, m.model);
  release_unowned(m.model);  // under mpirun: a rank maps only the rows it reads
  if (m.experts) io::set_stream_int8_dot(*m.experts, src.int8_dot && kernels::int8_dot_available());
  return m;
}

bool weights_mapped(model::Model& m) {
  bool mapped = false;
  m.for_each_tensor([&](const std::string&, Tensor& t, const Shape&, layers::Init) { mapped = mapped || t.is_borrowed(); });
  return mapped;
}

io::MappedPages mapped_pages(model::Model& m) {
  std::vector<uintptr_t> at;
  m.for_each_tensor([&](const std::string&, Tensor& t, const Shape&, layers::Init) {
    if (t.is_borrowed() && t.raw()) at.push_back(reinterpret_cast<uintptr_t>(t.raw()));
  });
  std::sort(at.begin(), at.end());
  return io::mapped_pages(at);
}

std::string mapped_label(const io::MappedPages& p) {
  if (!p.resident) return " mapped from files (--no-mmap copies them to huge pages)";
  return cat(" mapped from files (", int(std::lround(100.0 * double(p.huge) / double(p.resident))),
             " % of them on 2 MiB pages; --no-mmap copies them to huge pages)");
}

nlohmann::ordered_json parse_template_kwargs(const std::string& text) {
  if (text.empty()) return nullptr;
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw Error(cat("--chat-template-kwargs: '", text, "' is not a JSON object; expected e.g. '{\"enable_thinking\": false}'"));
  return j;
}

std::optional<long long> parse_integer(const std::string& s) {
  size_t used = 0;
  try {
    const long long v = std::stoll(s, &used);
    if (used == s.size()) return v;
  } catch (...) {
  }
  return std::nullopt;
}

DType main_dtype(model::Model& m) {
  const model::ParamCount pc = model::count_params(m);
  DType best = DType::F32;
  size_t most = 0;
  for (const auto& [dt, bytes] : pc.bytes_by_dtype)
    if (bytes > most) most = bytes, best = dt;
  return best;
}

size_t parse_bytes(const std::string& text, const std::string& flag) {
  std::string digits = text;
  double unit = 1;
  if (!digits.empty() && std::string("KMGkmg").find(digits.back()) != std::string::npos) {
    const char c = char(std::toupper(digits.back()));
    unit = c == 'K' ? 1024.0 : c == 'M' ? 1024.0 * 1024 : 1024.0 * 1024 * 1024;
    digits.pop_back();
  }
  const auto v = parse_integer(digits);
  if (!v || *v < 0 || double(*v) * unit > 1e15)
    throw Error(cat(flag, ": \"", text, "\" is not a size (expected bytes as an integer >= 0, or with K, M or G: 256M)"));
  return size_t(double(*v) * unit);
}

std::vector<int32_t> parse_ids(const std::string& text, const std::string& flag) {
  std::vector<int32_t> ids;
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    const auto v = parse_integer(word);
    if (!v || *v < 0 || *v > INT32_MAX)
      throw Error(cat(flag, ": \"", word, "\" is not a token id (expected non-negative integers separated by spaces)"));
    ids.push_back(int32_t(*v));
  }
  if (ids.empty()) throw Error(cat(flag, ": expected at least one token id"));
  return ids;
}

void add_token_options(CLI::App& cmd, std::string& tokens, std::string& prompt) {
  auto* t = cmd.add_option("--tokens", tokens, "token ids separated by spaces");
  auto* p = cmd.add_option("--prompt", prompt, "text, tokenized with the model's tokenizer");
  t->excludes(p);
}

std::vector<int32_t> input_ids(const io::LoadedModel& m, const std::string& tokens, const std::string& prompt, bool bos,
                               const std::string& command) {
  if (tokens.empty() && prompt.empty()) throw Error(command + ": one of --tokens or --prompt is required");
  std::vector<int32_t> ids;
  if (!tokens.empty()) {
    ids = parse_ids(tokens, "--tokens");
  } else {
    const tokenizer::Tokenizer& tok = require_tokenizer(m, "--prompt");
    ids = tok.encode(prompt);
    if (bos && tok.adds_bos() && tok.bos_id()) ids.insert(ids.begin(), *tok.bos_id());
  }
  if (ids.empty()) throw Error(command + ": the prompt encodes to no tokens");
  return ids;
}

const tokenizer::Tokenizer& require_tokenizer(const io::LoadedModel& m, const std::string& why) {
  if (!m.tokenizer)
    throw Error(cat(why, " needs a tokenizer, but ",
                    m.dir.empty() ? std::string("a preset has none (pass --tokenizer DIR)")
                                  : m.dir.string() + " has no tokenizer.json, vocab.json + merges.txt or tiktoken.model"));
  return *m.tokenizer;
}

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", b, units[u]);
  return buf;
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::pair<double, double> split_and_replicated(model::Model& m, DType unallocated, bool will_own) {
  std::map<const Tensor*, double> stored;
  model::for_each_stored(m, unallocated, [&](const model::StoredTensor& t) { stored[&t.t] += double(t.bytes()); });
  const auto bytes_of = [&](const Tensor& t) {
    const auto it = stored.find(&t);
    return it == stored.end() ? 0.0 : it->second;
  };
  const double min_bytes = double(split_min_bytes());
  std::set<const Tensor*> split;
  const layers::MatrixVisitor rows = [&](kernels::Matrix& w) {
    if ((w.layout == kernels::Layout::OutIn || will_own) && bytes_of(w.data) + bytes_of(w.scales) >= min_bytes)
      split.insert({&w.data, &w.scales});
  };
  for (model::Block& b : m.blocks) {
    std::visit([&](auto& mixer) { mixer.for_each_matrix(rows); }, b.mixer);
    std::visit([&](auto& ffn) { ffn.for_each_matrix(rows); }, b.ffn);
  }
  if (!m.config.tied_lm_head && bytes_of(m.lm_head) >= min_bytes) split.insert(&m.lm_head);
  double split_bytes = 0, replicated = 0;
  for (const auto& [t, bytes] : stored) (split.count(t) ? split_bytes : replicated) += bytes;
  return {split_bytes, replicated};
}

}  // namespace lineage::app
