// Room io/: file formats and loading, nothing else: safetensors (single, sharded, the index), .npy,
// mapped pages and the SIGBUS guard for a file that shrinks under its mapping, load_model (this
// file), which reads a Hugging Face directory into a model and its tokenizer, and the reads under a
// memory budget (expert_stream.h, trunk_stream.h, stream_files.h). Uses model, tokenizer and what
// they use.
//
// Loads a Hugging Face model directory as published: config.json + safetensors (single or sharded)
// and, when present, the tokenizer files. Weights keep their stored dtype, mapped from the files or
// (WeightStorage::Owned) copied once into the engine's own memory.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "lineage/io/expert_stream.h"
#include "lineage/io/safetensors.h"
#include "lineage/tokenizer/tokenizer.h"
#include "lineage/model/model.h"

namespace lineage::io {

// A GGUF file's tokenizer.chat_template and the text of its bos / eos tokens (a directory's template
// is read by chat::ChatTemplate::from_model_dir).
struct EmbeddedChatTemplate {
  std::string source, where, bos_token, eos_token;
};

struct LoadedModel {
  model::Model model;
  std::shared_ptr<Checkpoint> checkpoint;   // keeps the mappings alive (null with owned weights)
  std::optional<lineage::tokenizer::Tokenizer> tokenizer;       // absent when the directory has no tokenizer files
  std::filesystem::path dir;  // the directory, or the GGUF file
  std::optional<EmbeddedChatTemplate> chat_template;  // a GGUF file's
  // Set by stream_experts (expert_stream.h) when the routed experts stream from disk.
  std::shared_ptr<ExpertStore> experts;
  StreamPlan stream_plan;
};

// Where the weights of a loaded model live.
//   Mapped (default): borrowed from the safetensors files' read-only mappings. Loading is instant and
//     processes share the page cache. On the development VM, decode from the mapping is up to a
//     third slower (GPT-2 124M: the [in, out] GEMVs over 16-bit weights read file-backed pages
//     slower than anonymous ones, huge or 4 KiB; docs/performance.md).
//   Owned (the CLI's --no-mmap, as in llama.cpp): each tensor copied once, in its stored dtype, into
//     2 MiB-aligned buffers advised for transparent huge pages, and the files unmapped. Slower to
//     load (one read of the files), the same resident size once loaded; decode about as fast as a
//     preset's.
enum class WeightStorage : uint8_t { Mapped, Owned };

// A GGUF file in place of the directory is read by load_gguf (gguf_model.h).
// Throws Error naming the file and field for a missing/malformed config.json, an unknown
// model_type, and (in one message) every missing tensor, every unexpected tensor and every tensor
// whose dtype or shape is wrong.
// `stream` (may be null): the memory budget; a model whose weights do not fit it streams its routed
// experts from the files (expert_stream.h), decided before any expert is read (their load-time checks
// and preparation then happen as each is read).
LoadedModel load_model(const std::filesystem::path& dir, bool with_tokenizer = true,
                       WeightStorage storage = WeightStorage::Mapped, const StreamOptions* stream = nullptr);

// The part of load_model after reading the files: the model `config` (a config.json's content;
// `config_where` names it in messages) describes, built against the checkpoint's tensors, changed by
// `adjust` (may be empty) before binding, bound (`where` names the checkpoint) and prepared for
// `storage`. dir and tokenizer are left for the caller.
LoadedModel load_checkpoint(const nlohmann::json& config, const std::string& config_where,
                            std::shared_ptr<Checkpoint> ckpt, const std::string& where, WeightStorage storage,
                            const std::function<void(model::Model&)>& adjust = {},
                            const StreamOptions* stream = nullptr);

// The family's skeleton from a config (config.json's content; `cfg_path` names it in messages):
// shapes and names, tensors empty, quantization applied. has_tensor answers for the checkpoint (or
// nothing); tensor_shape (may be empty) gives a stored tensor's shape, where a family reads it.
model::Model build_model_from_config(const nlohmann::json& cfg, const std::string& cfg_path,
                                     const std::function<bool(const std::string&)>& has_tensor,
                                     const std::function<Shape(const std::string&)>& tensor_shape);

// The model a directory's config.json describes, without weights (`lineage info` on a directory that
// holds only config.json): shapes and names, tensors empty. dtype: the config's "dtype" (or
// "torch_dtype") when it names one, the dtype the published weights are stored in.
struct Skeleton {
  model::Model model;
  std::optional<DType> dtype;
};
Skeleton load_skeleton(const std::filesystem::path& dir);
// The model the directory's config.json describes, its family's choices made against the tensors
// `ckpt` holds (prefixes, a tied head), without binding them (lineage quantize reads the names).
model::Model checkpoint_skeleton(const std::filesystem::path& dir, const Checkpoint& ckpt);
// Whether the directory holds safetensors weights (model.safetensors or its sharded index), or is a
// GGUF file.
bool has_weights(const std::filesystem::path& dir);

// Binds a model skeleton's tensors to a checkpoint (the part of load_model after the config).
void bind_weights(model::Model& m, const Checkpoint& ckpt, const std::string& where);

// Every bound MXFP4 block scale (….weight_scale, U8) against 255, E8M0's NaN: an Error naming the
// tensor, row and columns. load_model runs it after binding (it reads the scale tensors, 1/17 of
// the packed bytes).
void check_mxfp4_scales(model::Model& m, const std::string& where);

}  // namespace lineage::io
