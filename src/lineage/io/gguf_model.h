// A GGUF file as a model: its architecture mapped back onto lineage's family
// (model/archs/gguf_map.h), its tensors bound where they lie in the mapping (or copied, with
// WeightStorage::Owned), and its tokenizer from the tokenizer.ggml.* keys.
#pragma once

#include <filesystem>

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
                      WeightStorage storage = WeightStorage::Mapped);

// The tokenizer the metadata describes; nothing for `no_vocab` or a file without tokenizer keys.
std::optional<tokenizer::Tokenizer> gguf_tokenizer(const GgufFile& file);

}  // namespace lineage::io
