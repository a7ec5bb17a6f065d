// `lineage quantize`: a float Hugging Face checkpoint written as a compressed-tensors one (config.json
// with its quantization_config, sharded safetensors with an index, the tokenizer and chat template
// files copied), tensor by tensor, so memory stays near one tensor beyond the mapped input. The codes
// and scales are llm-compressor's data-free RTN presets bit for bit (rtn.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "lineage/io/rtn.h"

namespace lineage::io {

struct QuantizeOptions {
  RtnScheme scheme = RtnScheme::W4A16;
  std::optional<int64_t> group;     // int schemes: columns per scale (0: per channel); default 128
  std::vector<std::string> ignore;  // compressed-tensors ignore entries; empty: default_ignore()
  size_t shard_bytes = size_t(4) << 30;
  // Called after each tensor: bytes of the input read so far, of all.
  std::function<void(size_t done, size_t total)> progress = {};
};

struct QuantizeReport {
  int64_t quantized = 0, kept = 0;            // weight matrices
  size_t bytes_in = 0, bytes_out = 0;
  std::vector<std::string> ignore;            // as written to quantization_config
  std::vector<std::string> unfit;             // matrices left unquantized because the scheme cannot take them
};

// "W4A16", "W4A16_ASYM", "W8A16", "FP8_BLOCK", "MXFP4", "NVFP4" (compressed-tensors' MXFP4A16 and
// NVFP4A16: weights only); an Error listing them otherwise.
RtnScheme parse_rtn_scheme(const std::string& name);
std::string rtn_scheme_name(RtnScheme s);

// What is left unquantized when no --ignore is given: the LM head, routers and gates (Qwen's and
// Kimi's MoE routers, shared-expert gates, Gated DeltaNet's β/α and KDA's decay and gate projections).
// Embeddings, norms, A_log, dt_bias and short convolutions are no Linear and never quantized.
std::vector<std::string> default_ignore();

// Throws Error naming the file for an input that is already quantized, not a float checkpoint, or an
// output directory that exists and is not empty.
QuantizeReport quantize_checkpoint(const std::filesystem::path& in, const std::filesystem::path& out,
                                   const QuantizeOptions& o);

}  // namespace lineage::io
