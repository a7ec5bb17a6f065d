// A GGUF file as a model: its architecture mapped back onto lineage's family
// (model/archs/gguf_map.h), its tensors bound where they lie in the mapping (or copied, with
// WeightStorage::Owned), and its tokenizer from the tokenizer.ggml.* keys.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "lineage/io/gguf.h"
#include "lineage/io/load_model.h"

namespace lineage::io {

// Whether `path` is a GGUF file (a regular file that starts with the magic "GGUF").
bool is_gguf(const std::filesystem::path& path);

// Throws Error naming the file and the key or tensor: an architecture lineage does not map (listing
// those it does), a missing or malformed key, a tensor the map does not read, a tensor type lineage
// does not compute on yet, a shape the family does not expect. A file whose vocabulary is
// `no_vocab` (llama.cpp's test models) loads without a tokenizer.
LoadedModel load_gguf(const std::filesystem::path& path, bool with_tokenizer = true,
                      WeightStorage storage = WeightStorage::Mapped, const StreamOptions* stream = nullptr);

// What `lineage info` reads of a GGUF file: its header alone (the tensor data may be absent, as in a
// file cut after its tensor infos). The model as load_gguf builds it before binding: shapes and
// names, tensors empty. Errors as load_gguf's, for what the header holds.
struct GgufHeaderModel {
  model::Model model;
  std::vector<std::pair<std::string, uint64_t>> bytes_by_type;  // ggml type name ("Q4_K") → bytes, every split
  std::vector<uint64_t> routed_expert_bytes;  // per layer (blk.N.), its routed experts' (llama.cpp's stacked *_exps)
};
GgufHeaderModel gguf_header_model(const std::filesystem::path& path);

// The tokenizer the metadata describes; nothing for `no_vocab` or a file without tokenizer keys.
std::optional<tokenizer::Tokenizer> gguf_tokenizer(const GgufFile& file);

}  // namespace lineage::io
