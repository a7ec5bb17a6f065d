// Loads a Hugging Face model directory as published: config.json + safetensors (single or sharded)
// and, when present, the tokenizer files. Weights stay mapped in their stored dtype.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>

#include "lineage/io/safetensors.h"
#include "lineage/io/tokenizer.h"
#include "lineage/model/model.h"

namespace lineage::io {

struct LoadedModel {
  model::Model model;
  std::shared_ptr<Checkpoint> checkpoint;   // keeps the mappings alive
  std::optional<Tokenizer> tokenizer;       // absent when the directory has no tokenizer files
  std::filesystem::path dir;
};

// Throws Error naming the file and field for a missing/malformed config.json, an unknown
// model_type, and (in one message) every missing tensor, every unexpected tensor and every tensor
// whose dtype or shape is wrong.
LoadedModel load_model(const std::filesystem::path& dir, bool with_tokenizer = true);

// Binds a model skeleton's tensors to a checkpoint (the part of load_model after the config).
void bind_weights(model::Model& m, const Checkpoint& ckpt, const std::string& where);

}  // namespace lineage::io
