// What every subcommand shares: where the model comes from (--model DIR or --preset NAME),
// --threads, and turning --tokens / --prompt into ids.
#pragma once

#include <CLI/CLI.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lineage/io/load_model.h"
#include "lineage/io/mapped_pages.h"
#include "lineage/model/model.h"
#include "lineage/model/accounting.h"

namespace lineage::app {

struct ModelSource {
  std::string dir, preset, tokenizer_dir;
  uint64_t seed = 0;
  std::string weights_dtype = "f32";
  bool no_mmap = false;  // --no-mmap: copy checkpoint weights into owned (huge-page) memory
  bool check_tensors = false;  // --check-tensors: scan every weight for NaN / Inf at load
  bool bf16_exact = false;     // --bf16-exact: BF16 weights widened to f32 (the model's Options::bf16_dot off)
  bool int8_dot = false;       // --int8-dot: int4 / int8 codes times int8 activations (model::set_int8_dot)
  std::string memory_budget;   // --memory-budget: the weights' resident bytes (default: MemAvailable)
  std::string expert_cache = "global";  // --expert-cache: global or per-layer
  std::string parallel = "tensor";      // --parallel: under mpirun, the routed experts split by rows or placed by rank
};

// Adds --model, --no-mmap, --check-tensors, --memory-budget, --expert-cache, --parallel (and --preset, --seed, --weights-dtype, --tokenizer when presets are
// allowed).
void add_model_options(CLI::App& cmd, ModelSource& src, bool allow_preset);
// Adds --threads N and applies it before the command runs.
void add_threads_option(CLI::App& cmd);
// The numerics options: --bf16-exact (BF16 weights widened to f32, exact products) and --bf16-dot
// (bf16 dot products, the default where the CPU has AVX512_BF16; given explicitly on a CPU without,
// says so on stderr and keeps the exact products), which exclude each other and set src.bf16_exact;
// --int8-dot (int4 and int8 codes multiplied with x quantized to int8 where the CPU has AVX512_VNNI,
// kernels::int8_dot_available; off by default), which sets src.int8_dot. load() turns them into the
// model's options.
void add_numerics_options(CLI::App& cmd, ModelSource& src);
// The model's options from the command line (--bf16-exact, --int8-dot); load() calls it.
void apply_options(const ModelSource& src, model::Model& m);
// Whether m's BF16 weights are multiplied with bf16 dot products (its option on and the CPU can).
bool bf16_dot(const model::Model& m);
// Whether any of the weights counted in pc is BF16.
bool has_bf16_weights(const model::ParamCount& pc);
// What this run multiplies BF16 weights with: "bf16 dot products (--bf16-exact: exact f32 products)"
// or "exact f32 products".
std::string bf16_products_label(const model::Model& m);

// The model src names, with its options applied; `stream`: under --memory-budget (default: the memory
// available) its routed experts stream from the files when the weights do not fit (io/expert_stream.h;
// `info` only plans).
io::LoadedModel load(const ModelSource& src, bool need_tokenizer, bool stream = true);
// Under tensor parallelism (mpirun, kernels/row_split.h): the bytes of the matrices whose output rows
// the ranks split (those stored [out, in], and an untied LM head), and the rest, which every rank
// holds whole (embeddings, norms, convolutions, matrices stored [in, out], matrices smaller than
// split_min_bytes(): ranks.h). `will_own`: the weights are
// not drawn yet and will be owned (a preset's skeleton), so every matrix will be [out, in].
std::pair<double, double> split_and_replicated(model::Model& m, DType unallocated, bool will_own = false);
// The model a subcommand uses when given neither --model nor --preset: $LINEAGE_MODEL, else the one
// lineage ships (models/kjv-gpt2 in the source tree, trained by scripts/train-kjv.sh), else "".
std::string default_model_dir();
// Whether any weight is borrowed from a checkpoint file's mapping.
bool weights_mapped(model::Model& m);
// io::mapped_pages of the mappings that hold m's borrowed weights.
io::MappedPages mapped_pages(model::Model& m);
// " mapped from files (N % of them on 2 MiB pages; --no-mmap copies them to huge pages)".
std::string mapped_label(const io::MappedPages& p);

// --chat-template-kwargs: a JSON object of chat-template variables ({"enable_thinking": false}), as
// llama-server takes them; anything else is an Error naming the flag. Empty text: none (null).
nlohmann::ordered_json parse_template_kwargs(const std::string& text);

// The whole string as a base-10 integer, or nothing (no partial parses, no exceptions).
std::optional<long long> parse_integer(const std::string& s);
// "268435456", "256M", "64K", "2G" → bytes (K, M, G are powers of 1024); anything else is an Error
// naming the flag.
size_t parse_bytes(const std::string& text, const std::string& flag);
// "12 5 7" → ids; a non-integer is an Error naming the flag.
std::vector<int32_t> parse_ids(const std::string& text, const std::string& flag);
// --tokens "ID ..." and --prompt TEXT, excluding each other (logits, trace).
void add_token_options(CLI::App& cmd, std::string& tokens, std::string& prompt);
// The ids they give: --tokens as written, or --prompt through the model's tokenizer with its BOS first
// where it adds one and `bos` is set. `command` names the caller in errors (neither given, no tokens).
std::vector<int32_t> input_ids(const io::LoadedModel& m, const std::string& tokens, const std::string& prompt, bool bos,
                               const std::string& command);
const tokenizer::Tokenizer& require_tokenizer(const io::LoadedModel& m, const std::string& why);
// The tokenizer of a model directory's files or of a GGUF file's metadata (an Error naming the file
// when it has none).
tokenizer::Tokenizer load_tokenizer(const std::filesystem::path& dir_or_gguf);

// The dtype that holds most of the model's parameter bytes (the one its roofline peak is taken for).
DType main_dtype(model::Model& m);

// Human-readable bytes: "1.50 MiB".
std::string format_bytes(double bytes);

// Seconds on the steady clock (differences time the benchmarks).
double steady_seconds();

// Registration of each subcommand (one file each).
void add_generate(CLI::App& app);
void add_logits(CLI::App& app);
void add_perplexity(CLI::App& app);
void add_gguf(CLI::App& app);
void add_quantize(CLI::App& app);
void add_tokenize(CLI::App& app);
void add_info(CLI::App& app);
void add_tour(CLI::App& app);
void add_bench(CLI::App& app);
void add_serve(CLI::App& app);
void add_bench_serve(CLI::App& app);
void add_chat(CLI::App& app);
void add_train(CLI::App& app);
void add_bench_train(CLI::App& app);
void add_study(CLI::App& app);
void add_trace(CLI::App& app);

}  // namespace lineage::app
